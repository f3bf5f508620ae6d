//! A newline-delimited JSON-RPC connection for the socket tests: one request line out,
//! one answer line back, checked to be a well-formed JSON-RPC reply.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// The longest a read or write may block.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A newline-delimited connection.
pub struct Line<S: Read + Write> {
    r: BufReader<S>,
}

impl Line<TcpStream> {
    /// Connects to `addr`.
    pub fn tcp(addr: SocketAddr) -> Self {
        Self::from_tcp(TcpStream::connect(addr).unwrap())
    }

    /// Uses `s`, a connected socket (say, bound to a chosen source address).
    pub fn from_tcp(s: TcpStream) -> Self {
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        Self {
            r: BufReader::new(s),
        }
    }
}

impl Line<UnixStream> {
    /// Connects to the Unix socket at `path`.
    pub fn unix(path: &Path) -> Self {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        Self {
            r: BufReader::new(s),
        }
    }
}

impl<S: Read + Write> Line<S> {
    /// Sends `text` as one line, as it is (for requests whose exact bytes matter).
    pub fn send(&mut self, text: &str) {
        self.r
            .get_mut()
            .write_all(format!("{text}\n").as_bytes())
            .unwrap();
    }

    /// The next line the peer sent, without its line end.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        assert!(self.r.read_line(&mut line).unwrap() > 0, "closed");
        line.trim_end().to_owned()
    }

    /// The next line, parsed (an answer or a notification, unchecked).
    pub fn next(&mut self) -> Value {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// Sends `request` as one line and returns the answer line, which must be a
    /// well-formed JSON-RPC reply.
    pub fn call(&mut self, request: &Value) -> Value {
        let mut line = serde_json::to_vec(request).unwrap();
        line.push(b'\n');
        self.r.get_mut().write_all(&line).unwrap();
        let mut answer = String::new();
        self.r.read_line(&mut answer).unwrap();
        super::check_reply(answer.as_bytes()).unwrap_or_else(|e| panic!("{request}: {e}"))
    }
}
