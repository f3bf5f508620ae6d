//! One HTTP/1.1 POST of a JSON-RPC body over a fresh connection, for the socket tests:
//! the answer's status, header fields (names lowercased) and JSON body.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// An HTTP answer: status, header fields (lowercased names), body (`Null` if empty).
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Answer {
    /// The first header field named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// POSTs `body` to `addr` with extra `headers` (`Connection: close`), within 10 s.
pub fn post(addr: SocketAddr, headers: &[(&str, &str)], body: &Value) -> Answer {
    post_raw(addr, headers, &serde_json::to_vec(body).unwrap())
}

/// As [`post`], with the body's bytes as given (invalid JSON included).
pub fn post_raw(addr: SocketAddr, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    post_on(TcpStream::connect(addr).unwrap(), headers, body)
}

/// As [`post_raw`], on a connection made by the caller (say, from a chosen source
/// address).
pub fn post_on(mut s: TcpStream, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = format!(
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let mut hs = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut hs);
    let Ok(httparse::Status::Complete(at)) = resp.parse(&raw) else {
        panic!("not an HTTP response: {}", super::show(&raw));
    };
    let headers = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let body = if raw.len() > at {
        serde_json::from_slice(&raw[at..]).unwrap_or_else(|e| panic!("{e}: {}", super::show(&raw)))
    } else {
        Value::Null
    };
    Answer {
        status: resp.code.unwrap_or(0),
        headers,
        body,
    }
}
