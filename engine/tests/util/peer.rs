//! A scripted peer's moves (newline-delimited, and reading HTTP requests), for tests that
//! play the server by hand.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use serde_json::Value;

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
