//! Connections to the server under test, written by hand so that every byte sent is the
//! case's own (no client library normalizes a malformed frame away).
//!
//! Every connection is a [`Pipe`]: a writer thread executing a script of writes and
//! pauses (so a server that stops reading never blocks the runner), and a reader thread
//! forwarding what arrives; the runner waits on the reader with deadlines, so a server
//! that hangs fails the case instead of stalling the run. On top of it, three framings:
//! newline-delimited JSON (TCP, Unix, stdio), WebSocket messages, and HTTP/1.1 POSTs.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// How the server is reached.
#[derive(Clone, Debug)]
pub enum Target {
    /// HTTP/1.1 POSTs to `path` on `addr` (`host:port`).
    Http { addr: String, path: String },
    /// WebSocket messages, the handshake a GET of `path` on `addr`.
    Ws { addr: String, path: String },
    /// Newline-delimited JSON over TCP.
    Tcp(String),
    /// Newline-delimited JSON over a Unix stream socket.
    Unix(PathBuf),
    /// Newline-delimited JSON on a child process's stdin/stdout (program and arguments).
    Stdio(Vec<String>),
}

/// The transport kinds, for choosing which cases apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// HTTP/1.1.
    Http,
    /// WebSocket.
    Ws,
    /// TCP, newline-delimited.
    Tcp,
    /// Unix socket, newline-delimited.
    Unix,
    /// A child process's stdin/stdout, newline-delimited.
    Stdio,
}

impl Kind {
    /// Newline-delimited framing (TCP, Unix, stdio).
    pub fn ndjson(self) -> bool {
        matches!(self, Kind::Tcp | Kind::Unix | Kind::Stdio)
    }

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Http => "http",
            Kind::Ws => "ws",
            Kind::Tcp => "tcp",
            Kind::Unix => "unix",
            Kind::Stdio => "stdio",
        }
    }
}

impl Target {
    /// Reads `http://HOST:PORT/PATH`, `ws://HOST:PORT/PATH`, `tcp://HOST:PORT`,
    /// `unix:///PATH` or `stdio:COMMAND ARGS…` (`extra` arguments are appended to the
    /// command's).
    pub fn parse(url: &str, extra: &[String]) -> Result<Target, String> {
        let split_http = |rest: &str| -> Result<(String, String), String> {
            let (addr, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            if addr.is_empty() {
                return Err(format!("no HOST:PORT in {url}"));
            }
            Ok((addr.to_string(), path.to_string()))
        };
        let t = if let Some(rest) = url.strip_prefix("http://") {
            let (addr, path) = split_http(rest)?;
            Target::Http { addr, path }
        } else if let Some(rest) = url.strip_prefix("ws://") {
            let (addr, path) = split_http(rest)?;
            Target::Ws { addr, path }
        } else if let Some(rest) = url.strip_prefix("tcp://") {
            Target::Tcp(rest.trim_end_matches('/').to_string())
        } else if let Some(rest) = url.strip_prefix("unix://") {
            Target::Unix(PathBuf::from(rest))
        } else if let Some(rest) = url.strip_prefix("stdio:") {
            let mut argv: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            argv.extend(extra.iter().cloned());
            if argv.is_empty() {
                return Err("stdio: needs a command".into());
            }
            Target::Stdio(argv)
        } else {
            return Err(format!(
                "unsupported URL {url:?} (http://, ws://, tcp://, unix:// or stdio:COMMAND)"
            ));
        };
        if !extra.is_empty() && !matches!(t, Target::Stdio(_)) {
            return Err(format!("unexpected arguments after the URL: {extra:?}"));
        }
        Ok(t)
    }

    /// The transport kind.
    pub fn kind(&self) -> Kind {
        match self {
            Target::Http { .. } => Kind::Http,
            Target::Ws { .. } => Kind::Ws,
            Target::Tcp(_) => Kind::Tcp,
            Target::Unix(_) => Kind::Unix,
            Target::Stdio(_) => Kind::Stdio,
        }
    }
}

/// A step of a writer thread's script.
pub enum Op {
    /// Write these bytes (all of them).
    Write(Vec<u8>),
    /// Wait this long before the next step.
    Pause(Duration),
}

/// What a connection's threads report.
enum Event {
    Data(Vec<u8>),
    Eof,
    ReadError(String),
    WriteError(String),
}

/// What to do to end a connection.
enum Closer {
    Tcp(TcpStream),
    Unix(UnixStream),
    Child(Child),
}

/// A byte stream to the server with a writer and a reader thread.
pub struct Pipe {
    ops: Option<Sender<Op>>,
    events: Receiver<Event>,
    /// Bytes received and not consumed yet.
    pub buf: Vec<u8>,
    /// The reader saw the end of the stream (or an error, kept in `error`).
    pub eof: bool,
    /// A read or write error, if one happened.
    pub error: Option<String>,
    closer: Option<Closer>,
}

impl Pipe {
    fn start<R, W>(reader: R, writer: W, closer: Closer) -> Pipe
    where
        R: Read + Send + 'static,
        W: Write + Send + 'static,
    {
        let (ev_tx, events) = channel();
        let (ops, op_rx) = channel::<Op>();
        let tx = ev_tx.clone();
        let mut reader = reader;
        std::thread::spawn(move || {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut chunk) {
                    Ok(0) => {
                        let _ = tx.send(Event::Eof);
                        return;
                    }
                    Ok(n) => {
                        if tx.send(Event::Data(chunk[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.send(Event::ReadError(e.to_string()));
                        return;
                    }
                }
            }
        });
        let mut writer = writer;
        std::thread::spawn(move || {
            let mut failed = false;
            for op in op_rx {
                match op {
                    Op::Write(bytes) if !failed => {
                        if let Err(e) = writer.write_all(&bytes).and_then(|()| writer.flush()) {
                            failed = true;
                            let _ = ev_tx.send(Event::WriteError(e.to_string()));
                        }
                    }
                    Op::Write(_) => {}
                    Op::Pause(d) => std::thread::sleep(d),
                }
            }
            // Dropping `writer` here closes a child's stdin.
        });
        Pipe {
            ops: Some(ops),
            events,
            buf: Vec::new(),
            eof: false,
            error: None,
            closer: Some(closer),
        }
    }

    /// Queues a script for the writer thread; returns at once.
    pub fn script(&mut self, ops: Vec<Op>) {
        if let Some(tx) = &self.ops {
            for op in ops {
                let _ = tx.send(op);
            }
        }
    }

    /// Queues `bytes` for writing.
    pub fn write(&mut self, bytes: Vec<u8>) {
        self.script(vec![Op::Write(bytes)]);
    }

    /// Waits until more bytes arrive (true), the stream ends or `deadline` passes
    /// (false).
    pub fn fill(&mut self, deadline: Instant) -> bool {
        if self.eof {
            return false;
        }
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(wait) {
                Ok(Event::Data(d)) => {
                    self.buf.extend_from_slice(&d);
                    // Take whatever else is already there, too.
                    while let Ok(ev) = self.events.try_recv() {
                        if !self.take(ev) {
                            break;
                        }
                    }
                    return true;
                }
                Ok(ev) => {
                    if !self.take(ev) {
                        return false;
                    }
                }
                Err(RecvTimeoutError::Timeout) => return false,
                Err(RecvTimeoutError::Disconnected) => {
                    self.eof = true;
                    return false;
                }
            }
        }
    }

    /// Applies one event; false once the stream has ended.
    fn take(&mut self, ev: Event) -> bool {
        match ev {
            Event::Data(d) => {
                self.buf.extend_from_slice(&d);
                true
            }
            Event::Eof => {
                self.eof = true;
                false
            }
            Event::ReadError(e) => {
                self.error.get_or_insert(format!("read: {e}"));
                self.eof = true;
                false
            }
            // The reader goes on: the server's answer may still come (a server that
            // refuses a long request before reading it all answers, then closes).
            Event::WriteError(e) => {
                self.error.get_or_insert(format!("write: {e}"));
                true
            }
        }
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.ops = None;
        match self.closer.take() {
            Some(Closer::Tcp(s)) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Some(Closer::Unix(s)) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Some(Closer::Child(mut c)) => {
                // Its stdin closes when the writer thread ends; give it a moment to exit
                // on its own, as a stdio server does at the end of its input.
                let until = Instant::now() + Duration::from_millis(500);
                while Instant::now() < until {
                    if let Ok(Some(_)) = c.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
            None => {}
        }
    }
}

/// Opens a raw byte stream to `target` (for HTTP and WebSocket, the TCP connection
/// before any handshake).
pub fn open(target: &Target, timeout: Duration) -> Result<Pipe, String> {
    match target {
        Target::Http { addr, .. } | Target::Ws { addr, .. } | Target::Tcp(addr) => {
            let sa = addr
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {addr}: {e}"))?
                .next()
                .ok_or_else(|| format!("{addr} resolves to nothing"))?;
            let s = TcpStream::connect_timeout(&sa, timeout)
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            // Each write its own segment: the byte-by-byte cases mean it.
            let _ = s.set_nodelay(true);
            let r = s.try_clone().map_err(|e| e.to_string())?;
            let w = s.try_clone().map_err(|e| e.to_string())?;
            Ok(Pipe::start(r, w, Closer::Tcp(s)))
        }
        Target::Unix(path) => {
            let s = UnixStream::connect(path)
                .map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
            let r = s.try_clone().map_err(|e| e.to_string())?;
            let w = s.try_clone().map_err(|e| e.to_string())?;
            Ok(Pipe::start(r, w, Closer::Unix(s)))
        }
        Target::Stdio(argv) => {
            let mut child = Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err("the child has no stdin/stdout pipes".into());
            };
            Ok(Pipe::start(stdout, stdin, Closer::Child(child)))
        }
    }
}

/// What the next read of a framed connection gave.
pub enum Next {
    /// One message (a line without its end, a WebSocket message, an HTTP body).
    Msg(Vec<u8>),
    /// The connection ended; for WebSocket, with the Close frame's code if any.
    Closed(Option<u16>),
    /// Nothing more before the deadline.
    Timeout,
}

/// The next non-blank line (its `\n` and a `\r` before it removed).
pub fn next_line(p: &mut Pipe, deadline: Instant) -> Next {
    let mut from = 0;
    loop {
        if let Some(i) = memchr::memchr(b'\n', &p.buf[from..]) {
            let end = from + i;
            let mut line: Vec<u8> = p.buf.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
                from = 0;
                continue;
            }
            return Next::Msg(line);
        }
        from = p.buf.len();
        if !p.fill(deadline) {
            if p.eof {
                // An unterminated last line is still an answer.
                if p.buf.iter().any(|b| !b.is_ascii_whitespace()) {
                    return Next::Msg(std::mem::take(&mut p.buf));
                }
                return Next::Closed(None);
            }
            return Next::Timeout;
        }
    }
}

/// The RFC 6455 example key and its accept value: a fixed key is as good as a random
/// one for a client that opens one connection at a time.
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const WS_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// Opens a WebSocket: the handshake, checked.
pub fn ws_open(addr: &str, path: &str, p: &mut Pipe, timeout: Duration) -> Result<(), String> {
    p.write(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .into_bytes(),
    );
    let deadline = Instant::now() + timeout;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&p.buf) {
            Ok(httparse::Status::Complete(n)) => {
                if resp.code != Some(101) {
                    return Err(format!(
                        "the WebSocket handshake was answered {:?}",
                        resp.code
                    ));
                }
                let accept = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("sec-websocket-accept"))
                    .map(|h| String::from_utf8_lossy(h.value).trim().to_string());
                if accept.as_deref() != Some(WS_ACCEPT) {
                    return Err(format!("bad Sec-WebSocket-Accept: {accept:?}"));
                }
                p.buf.drain(..n);
                return Ok(());
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(format!("bad handshake answer: {e}")),
        }
        if !p.fill(deadline) {
            return Err("no handshake answer".into());
        }
    }
}

/// A client's frame: final, masked (RFC 6455 §5.3: every client frame is).
pub fn ws_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x5a, 0x0f, 0xc3, 0x91];
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// The next WebSocket message (text or binary, fragments joined); pings are answered.
pub fn next_ws(p: &mut Pipe, deadline: Instant) -> Next {
    let mut message: Option<Vec<u8>> = None;
    loop {
        // One whole frame at the front of the buffer?
        let frame = (|| {
            let (b0, b1) = (*p.buf.first()?, *p.buf.get(1)?);
            let (len, at) = match b1 & 0x7f {
                126 => (
                    u16::from_be_bytes([*p.buf.get(2)?, *p.buf.get(3)?]) as usize,
                    4,
                ),
                127 => (
                    u64::from_be_bytes(p.buf.get(2..10)?.try_into().ok()?) as usize,
                    10,
                ),
                n => (n as usize, 2usize),
            };
            let masked = b1 & 0x80 != 0;
            let body = at + if masked { 4 } else { 0 };
            let end = body.checked_add(len)?;
            p.buf.get(..end)?;
            let mut payload = p.buf[body..end].to_vec();
            if masked {
                let key = [p.buf[at], p.buf[at + 1], p.buf[at + 2], p.buf[at + 3]];
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= key[i % 4];
                }
            }
            Some((b0 & 0x80 != 0, b0 & 0x0f, payload, end))
        })();
        match frame {
            Some((fin, opcode, payload, used)) => {
                p.buf.drain(..used);
                match opcode {
                    0x8 => {
                        let code = payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]]));
                        return Next::Closed(code);
                    }
                    0x9 => p.write(ws_frame(0xA, &payload)),
                    0xA => {}
                    0x0..=0x2 => {
                        message
                            .get_or_insert_with(Vec::new)
                            .extend_from_slice(&payload);
                        if fin {
                            return Next::Msg(message.take().unwrap_or_default());
                        }
                    }
                    _ => {}
                }
            }
            None => {
                if !p.fill(deadline) {
                    return if p.eof {
                        Next::Closed(None)
                    } else {
                        Next::Timeout
                    };
                }
            }
        }
    }
}

/// An HTTP/1.1 POST of `body` to `path`.
pub fn http_request(addr: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// One HTTP response.
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The body (de-chunked).
    pub body: Vec<u8>,
    /// The server said `Connection: close` (or spoke HTTP/1.0 without keep-alive).
    pub close: bool,
}

/// What reading an HTTP response gave.
pub enum HttpNext {
    /// A whole response.
    Response(HttpResponse),
    /// The connection ended first.
    Closed,
    /// Nothing whole before the deadline.
    Timeout,
    /// Not HTTP.
    Bad(String),
}

/// The next final (non-1xx) response on `p`.
pub fn next_http(p: &mut Pipe, deadline: Instant) -> HttpNext {
    loop {
        match parse_http(&p.buf, p.eof) {
            Ok(Some((resp, used))) => {
                p.buf.drain(..used);
                if (100..200).contains(&resp.status) {
                    continue;
                }
                return HttpNext::Response(resp);
            }
            Ok(None) => {}
            Err(e) => return HttpNext::Bad(e),
        }
        if !p.fill(deadline) {
            if p.eof {
                // A body delimited by the end of the connection is whole now.
                if let Ok(Some((resp, used))) = parse_http(&p.buf, true) {
                    p.buf.drain(..used);
                    return HttpNext::Response(resp);
                }
                return HttpNext::Closed;
            }
            return HttpNext::Timeout;
        }
    }
}

/// A whole response at the front of `b` and its length; `None` if more is needed.
fn parse_http(b: &[u8], eof: bool) -> Result<Option<(HttpResponse, usize)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(b) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("not an HTTP response ({e})")),
    };
    let status = resp.code.unwrap_or(0);
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    let connection = header("connection").unwrap_or_default();
    let close = connection.contains("close")
        || (resp.version == Some(0) && !connection.contains("keep-alive"));
    let rest = &b[head..];
    if status == 204 || status == 304 || (100..200).contains(&status) {
        return Ok(Some((
            HttpResponse {
                status,
                body: Vec::new(),
                close,
            },
            head,
        )));
    }
    if header("transfer-encoding").is_some_and(|te| te.contains("chunked")) {
        let mut body = Vec::new();
        let mut at = 0;
        loop {
            let Some(eol) = memchr::memmem::find(&rest[at..], b"\r\n") else {
                return Ok(None);
            };
            let size_text = String::from_utf8_lossy(&rest[at..at + eol]).to_string();
            let size_hex = size_text.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16)
                .map_err(|_| format!("bad chunk size {size_text:?}"))?;
            at += eol + 2;
            if size == 0 {
                // Trailers end with an empty line.
                let Some(end) = memchr::memmem::find(&rest[at..], b"\r\n") else {
                    return Ok(None);
                };
                if end == 0 {
                    at += 2;
                } else {
                    let Some(end) = memchr::memmem::find(&rest[at..], b"\r\n\r\n") else {
                        return Ok(None);
                    };
                    at += end + 4;
                }
                return Ok(Some((
                    HttpResponse {
                        status,
                        body,
                        close,
                    },
                    head + at,
                )));
            }
            if rest.len() < at + size + 2 {
                return Ok(None);
            }
            body.extend_from_slice(&rest[at..at + size]);
            at += size + 2;
        }
    }
    if let Some(len) = header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| format!("bad Content-Length {len:?}"))?;
        if rest.len() < len {
            return Ok(None);
        }
        return Ok(Some((
            HttpResponse {
                status,
                body: rest[..len].to_vec(),
                close,
            },
            head + len,
        )));
    }
    // No length: the body runs to the end of the connection.
    if eof {
        return Ok(Some((
            HttpResponse {
                status,
                body: rest.to_vec(),
                close: true,
            },
            b.len(),
        )));
    }
    Ok(None)
}
