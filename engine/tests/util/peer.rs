//! A scripted newline-delimited peer's two moves, for tests that play the server by hand.

use std::io::{BufRead, BufReader, Write};
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
