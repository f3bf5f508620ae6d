//! A scripted peer's moves (newline-delimited, and reading HTTP requests), for tests that
//! play the server by hand.
#![allow(dead_code)] // each test binary uses some of it

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;

use serde_json::Value;

/// A one-connection-at-a-time TCP server running `script` for each accepted connection
/// (numbered from 0) until it returns false.
pub fn scripted(
    script: impl Fn(usize, BufReader<TcpStream>) -> bool + Send + 'static,
) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        for (n, s) in l.incoming().enumerate() {
            if !script(n, BufReader::new(s.unwrap())) {
                return;
            }
        }
    });
    (addr, t)
}

/// Reads one request line; `None` at end of stream or on an error.
pub fn read_request(r: &mut BufReader<TcpStream>) -> Option<Value> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(serde_json::from_str(&line).unwrap()),
    }
}

/// Writes `v` as one line.
pub fn answer(r: &mut BufReader<TcpStream>, v: &Value) {
    let mut s = serde_json::to_vec(v).unwrap();
    s.push(b'\n');
    r.get_mut().write_all(&s).unwrap();
}

/// Reads one HTTP request (head and Content-Length body).
pub fn read_http(r: &mut BufReader<TcpStream>) -> Option<Value> {
    let mut len = 0;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(serde_json::from_slice(&body).unwrap())
}
