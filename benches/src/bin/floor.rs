//! The echo floor: the cheapest server the socket path allows, as the lower bound on
//! what any JSON-RPC server can cost on this machine.
//!
//! ```text
//! cargo run --release -p benches --bin floor -- [--tcp 127.0.0.1:7800] [--http 127.0.0.1:7801]
//!     [--no-tcp] [--no-http] [--threads 1] [--reply fixed|id]
//! ```
//!
//! Every newline-terminated, non-empty line on the TCP port is answered with the fixed
//! line `{"jsonrpc":"2.0","id":1,"result":19}`; every HTTP/1.1 request on the HTTP port
//! with a fixed `200 OK` (`Content-Type: application/json`, that body, keep-alive). No
//! JSON is parsed: TCP only counts newlines; HTTP finds the end of the head, reads
//! `Content-Length` with a minimal scan and skips the body. Point `loadgen --no-verify`
//! at it.
//!
//! `--reply id` answers `{"jsonrpc":"2.0","id":ID,"result":19}` instead, ID being the
//! request's own id bytes copied as they came, for a client that matches answers by id
//! (a proxy with private ids; `loadgen` verifying `subtract`, whose result is 19). The
//! id is found by one cheap scan, not a parse: the top-level object's `"id"` member
//! (members of nested objects and strings are stepped over), whose value is copied
//! when it is a number, a string (escapes copied as they are) or `null`; any other
//! value, or a message that is not an object (a batch, garbage), is answered with
//! `"id":null`. A message without an `"id"` member is a notification: no answer on
//! TCP, `204 No Content` on HTTP. Here a TCP line or an HTTP body split across reads is
//! kept until it is complete (a copy, only then).
//!
//! Lean on purpose: one `mio` poll per thread, edge-triggered, each connection read until
//! `WouldBlock` into one buffer per thread (a connection keeps bytes only when an HTTP
//! head is split across reads), and all the responses that one readiness event produced
//! written with one `write` call. `--threads N` runs N pollers; one accept loop hands
//! the connections out in turn. Prints `listening tcp ADDR` / `listening http ADDR` (the
//! bound addresses, so port 0 works) once bound.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use clap::Parser;
use memchr::memmem;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

/// The fixed answer on TCP.
const TCP_RESPONSE: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":19}\n";
/// The fixed answer on HTTP: the same body (36 bytes), without the newline.
const HTTP_RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":19}";
/// `--reply id`: the answer's bytes before the id...
const ID_PREFIX: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":";
/// ...and after it.
const ID_SUFFIX: &[u8] = b",\"result\":19}";
/// `--reply id`: the answer to an HTTP notification.
const HTTP_NO_CONTENT: &[u8] = b"HTTP/1.1 204 No Content\r\n\r\n";
/// `--reply id`: the longest TCP line or HTTP body kept while it arrives.
const MAX_MESSAGE: usize = 1024 * 1024;

/// Read buffer per thread.
const READ_BUF: usize = 256 * 1024;
/// Pending output past which a connection stops being read until it drains (a client
/// that pipelines without reading cannot grow the server without bound).
const HIGH_WATER: usize = 4 * 1024 * 1024;
/// The longest HTTP head accepted.
const MAX_HEAD: usize = 64 * 1024;

const TCP_LISTENER: Token = Token(0);
const HTTP_LISTENER: Token = Token(1);
const WAKER: Token = Token(2);
const FIRST_CONN: usize = 3;

#[derive(Parser)]
#[command(about = "Fixed-answer TCP/HTTP server: the socket path's floor")]
struct Args {
    /// Newline-delimited TCP address (port 0 picks a free port; the bound one is printed).
    #[arg(long, default_value = "127.0.0.1:7800")]
    tcp: SocketAddr,
    /// HTTP/1.1 address.
    #[arg(long, default_value = "127.0.0.1:7801")]
    http: SocketAddr,
    /// Do not listen on TCP.
    #[arg(long)]
    no_tcp: bool,
    /// Do not listen on HTTP.
    #[arg(long)]
    no_http: bool,
    /// Poller threads; with more than one, an accept loop hands connections out in turn.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// `fixed`: always `"id":1`; `id`: the request's own id (see the top of floor.rs).
    #[arg(long, value_enum, default_value_t = Reply::Fixed)]
    reply: Reply,
}

/// What the answers' id is.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Reply {
    /// Always 1: no byte of the request is looked at.
    Fixed,
    /// The request's own id bytes.
    Id,
}

/// Accepted connections on their way to a poller.
type Handoff = Sender<(TcpStream, Kind)>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tcp,
    Http,
}

struct Conn {
    stream: TcpStream,
    kind: Kind,
    reply: Reply,
    /// TCP: the current line has bytes (so its newline gets an answer).
    line_open: bool,
    /// HTTP: body bytes still to skip.
    skip: usize,
    /// HTTP: a head (with `--reply id`, a head and body) split across reads, kept until
    /// its end arrives. TCP with `--reply id`: the start of a line.
    carry: Vec<u8>,
    /// Responses not yet written, from `wpos` on.
    out: Vec<u8>,
    wpos: usize,
    /// Reading stopped at `HIGH_WATER`; resumes once `out` drains.
    paused: bool,
}

enum Step {
    Open,
    Close,
}

struct Worker {
    poll: Poll,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    buf: Vec<u8>,
    head_end: memmem::Finder<'static>,
    incoming: Option<Receiver<(TcpStream, Kind)>>,
    tcp: Option<TcpListener>,
    http: Option<TcpListener>,
    reply: Reply,
}

impl Worker {
    fn new(poll: Poll, reply: Reply) -> Worker {
        Worker {
            poll,
            reply,
            conns: Vec::new(),
            free: Vec::new(),
            buf: vec![0; READ_BUF],
            head_end: memmem::Finder::new(b"\r\n\r\n"),
            incoming: None,
            tcp: None,
            http: None,
        }
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            if let Err(e) = self.poll.poll(&mut events, None) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for ev in events.iter() {
                match ev.token() {
                    TCP_LISTENER => self.accept(Kind::Tcp),
                    HTTP_LISTENER => self.accept(Kind::Http),
                    WAKER => self.take_incoming(),
                    Token(t) => {
                        let i = t - FIRST_CONN;
                        let step = match self.conns.get_mut(i) {
                            Some(Some(c)) => {
                                let mut step = Step::Open;
                                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                                    step = c.on_readable(&mut self.buf, &self.head_end);
                                }
                                if let Step::Open = step {
                                    step = c.flush(&mut self.buf, &self.head_end);
                                }
                                step
                            }
                            _ => continue,
                        };
                        if let Step::Close = step {
                            self.close(i);
                        }
                    }
                }
            }
        }
    }

    fn accept(&mut self, kind: Kind) {
        loop {
            let listener = match kind {
                Kind::Tcp => self.tcp.as_ref(),
                Kind::Http => self.http.as_ref(),
            };
            let Some(listener) = listener else { return };
            match listener.accept() {
                Ok((stream, _)) => self.add(stream, kind),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ECONNABORTED, EMFILE and the like: drop this one, keep serving.
                Err(e) => {
                    eprintln!("floor: accept: {e}");
                    return;
                }
            }
        }
    }

    fn take_incoming(&mut self) {
        let mut got = Vec::new();
        if let Some(rx) = &self.incoming {
            while let Ok(x) = rx.try_recv() {
                got.push(x);
            }
        }
        for (stream, kind) in got {
            self.add(stream, kind);
        }
    }

    fn add(&mut self, mut stream: TcpStream, kind: Kind) {
        let _ = stream.set_nodelay(true);
        let i = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(i + FIRST_CONN), interest)
        {
            eprintln!("floor: register: {e}");
            self.free.push(i);
            return;
        }
        self.conns[i] = Some(Conn {
            stream,
            kind,
            reply: self.reply,
            line_open: false,
            skip: 0,
            carry: Vec::new(),
            out: Vec::with_capacity(64 * 1024),
            wpos: 0,
            paused: false,
        });
    }

    fn close(&mut self, i: usize) {
        if let Some(mut c) = self.conns[i].take() {
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.free.push(i);
        }
    }
}

impl Conn {
    /// Reads until `WouldBlock` (or until too much output is pending), queueing one
    /// response per request.
    fn on_readable(&mut self, buf: &mut [u8], head_end: &memmem::Finder<'_>) -> Step {
        if self.paused {
            return Step::Open;
        }
        loop {
            match self.stream.read(buf) {
                Ok(0) => return Step::Close,
                Ok(n) => {
                    let ok = match (self.kind, self.reply) {
                        (Kind::Tcp, Reply::Fixed) => {
                            self.lines(&buf[..n]);
                            true
                        }
                        (Kind::Tcp, Reply::Id) => self.lines_id(&buf[..n]),
                        (Kind::Http, _) => self.http(&buf[..n], head_end),
                    };
                    if !ok {
                        return Step::Close;
                    }
                    if self.out.len() - self.wpos >= HIGH_WATER {
                        self.paused = true;
                        return Step::Open;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Open,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Close,
            }
        }
    }

    /// One response per newline that ends a non-empty line.
    fn lines(&mut self, data: &[u8]) {
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', data) {
            if nl > start || self.line_open {
                self.out.extend_from_slice(TCP_RESPONSE);
            }
            self.line_open = false;
            start = nl + 1;
        }
        if start < data.len() {
            self.line_open = true;
        }
    }

    /// `--reply id`: one response per non-empty line, with its id. Returns `false` on a
    /// line longer than `MAX_MESSAGE`.
    fn lines_id(&mut self, data: &[u8]) -> bool {
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', data) {
            if self.carry.is_empty() {
                answer_line(&mut self.out, &data[start..nl]);
            } else {
                self.carry.extend_from_slice(&data[start..nl]);
                answer_line(&mut self.out, &self.carry);
                self.carry.clear();
            }
            start = nl + 1;
        }
        self.carry.extend_from_slice(&data[start..]);
        self.carry.len() <= MAX_MESSAGE
    }

    /// One response per complete request (head, then `Content-Length` body bytes).
    /// Returns `false` on a head (or with `--reply id`, head and body) too long to be one.
    fn http(&mut self, data: &[u8], head_end: &memmem::Finder<'_>) -> bool {
        if self.carry.is_empty() {
            let (used, ok) = self.requests(data, head_end);
            if ok && used < data.len() {
                self.carry.extend_from_slice(&data[used..]);
            }
            ok && self.carry.len() <= self.max_carry()
        } else {
            // A split head: join it with the new bytes (rare; the carry keeps its capacity).
            let mut carry = std::mem::take(&mut self.carry);
            carry.extend_from_slice(data);
            let (used, ok) = self.requests(&carry, head_end);
            carry.drain(..used);
            self.carry = carry;
            ok && self.carry.len() <= self.max_carry()
        }
    }

    /// The most HTTP bytes kept for an incomplete request.
    fn max_carry(&self) -> usize {
        match self.reply {
            Reply::Fixed => MAX_HEAD,
            Reply::Id => MAX_HEAD + MAX_MESSAGE,
        }
    }

    /// Answers every complete request in `data`; returns how many bytes were consumed
    /// (the rest is the start of a head) and whether the input was acceptable.
    fn requests(&mut self, data: &[u8], head_end: &memmem::Finder<'_>) -> (usize, bool) {
        let mut i = 0;
        loop {
            if self.skip > 0 {
                let k = self.skip.min(data.len() - i);
                i += k;
                self.skip -= k;
                if self.skip > 0 {
                    return (i, true);
                }
            }
            if i == data.len() {
                return (i, true);
            }
            let Some(end) = head_end.find(&data[i..]) else {
                return (i, true);
            };
            let head = &data[i..i + end + 4];
            let Some(len) = content_length(head) else {
                return (i, false);
            };
            if self.reply == Reply::Id {
                let body_at = i + end + 4;
                if len > MAX_MESSAGE {
                    return (i, false);
                }
                if data.len() - body_at < len {
                    // The body is still arriving: keep the whole request for next time.
                    return (i, true);
                }
                answer_http(&mut self.out, &data[body_at..body_at + len]);
                i = body_at + len;
                continue;
            }
            self.out.extend_from_slice(HTTP_RESPONSE);
            i += end + 4;
            self.skip = len;
        }
    }

    /// Writes everything pending in one call (more only if the kernel took part of it).
    fn flush(&mut self, buf: &mut [u8], head_end: &memmem::Finder<'_>) -> Step {
        while self.wpos < self.out.len() {
            match self.stream.write(&self.out[self.wpos..]) {
                Ok(0) => return Step::Close,
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Open,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Close,
            }
        }
        self.out.clear();
        self.wpos = 0;
        if self.paused {
            // Edge-triggered: bytes that arrived while paused raised no new event.
            self.paused = false;
            if let Step::Close = self.on_readable(buf, head_end) {
                return Step::Close;
            }
            return self.flush(buf, head_end);
        }
        Step::Open
    }
}

/// `--reply id`: the TCP answer to one line (none for a notification or a blank line).
fn answer_line(out: &mut Vec<u8>, line: &[u8]) {
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    if let Some(id) = find_id(line) {
        out.extend_from_slice(ID_PREFIX);
        out.extend_from_slice(id);
        out.extend_from_slice(ID_SUFFIX);
        out.push(b'\n');
    }
}

/// `--reply id`: the HTTP answer to one body.
fn answer_http(out: &mut Vec<u8>, body: &[u8]) {
    let Some(id) = find_id(body) else {
        out.extend_from_slice(HTTP_NO_CONTENT);
        return;
    };
    let len = ID_PREFIX.len() + id.len() + ID_SUFFIX.len();
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    );
    out.extend_from_slice(ID_PREFIX);
    out.extend_from_slice(id);
    out.extend_from_slice(ID_SUFFIX);
}

/// The id to answer `msg` with: the bytes of its top-level `"id"` member's value when
/// that is a number, a string or `null`; `null` for any other value or a message that
/// is not an object; `None` when the object has no `"id"` member (a notification).
///
/// A scan, not a parse: it tracks only string state and nesting depth, so an `"id"`
/// inside params or inside a string is not mistaken for the request's. It does not
/// validate anything else (a floor, not a server).
fn find_id(msg: &[u8]) -> Option<&[u8]> {
    const NULL: &[u8] = b"null";
    let start = msg.iter().position(|b| !b.is_ascii_whitespace());
    if start.map(|s| msg[s]) != Some(b'{') {
        return Some(NULL);
    }
    let mut i = start.unwrap_or(0);
    let mut depth = 0usize;
    // In the top-level object, whether the next string is a member's name.
    let mut expect_key = false;
    while i < msg.len() {
        match msg[i] {
            b'"' => {
                let Some(end) = string_end(msg, i) else {
                    return Some(NULL);
                };
                let key = depth == 1 && expect_key;
                expect_key = false;
                if key && &msg[i..end] == b"\"id\"" {
                    return Some(id_value(msg, end).unwrap_or(NULL));
                }
                i = end;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return None;
                }
            }
            b',' if depth == 1 => expect_key = true,
            _ => {}
        }
        if depth == 1 && msg[i] == b'{' {
            expect_key = true;
        }
        i += 1;
    }
    // Cut short: no answer could be right, so answer as for an unknown id.
    Some(NULL)
}

/// The index just past the string that opens at `msg[at]` (a `"`), stepping over
/// escapes; `None` when it does not close.
fn string_end(msg: &[u8], at: usize) -> Option<usize> {
    let mut j = at + 1;
    while j < msg.len() {
        match msg[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The value after a member name ending at `at` (`: VALUE`), when it is a number, a
/// string or `null`.
fn id_value(msg: &[u8], at: usize) -> Option<&[u8]> {
    let mut i = at;
    while msg.get(i)?.is_ascii_whitespace() {
        i += 1;
    }
    if msg[i] != b':' {
        return None;
    }
    i += 1;
    while msg.get(i)?.is_ascii_whitespace() {
        i += 1;
    }
    let end = match msg[i] {
        b'"' => string_end(msg, i)?,
        b'-' | b'0'..=b'9' => {
            let mut j = i + 1;
            while j < msg.len() && matches!(msg[j], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
            {
                j += 1;
            }
            j
        }
        b'n' if msg[i..].starts_with(b"null") => i + 4,
        _ => return None,
    };
    Some(&msg[i..end])
}

/// `Content-Length` from a request head (0 when absent); `None` when it is not a number.
fn content_length(head: &[u8]) -> Option<usize> {
    const NAME: &[u8] = b"content-length:";
    let mut rest = head;
    while let Some(nl) = memchr::memchr(b'\n', rest) {
        let line = &rest[..nl];
        rest = &rest[nl + 1..];
        if line.len() > NAME.len()
            && matches!(line[0], b'c' | b'C')
            && line[..NAME.len()].eq_ignore_ascii_case(NAME)
        {
            let mut n: usize = 0;
            let mut digits = 0;
            for &b in &line[NAME.len()..] {
                match b {
                    b'0'..=b'9' => {
                        n = n.checked_mul(10)?.checked_add((b - b'0') as usize)?;
                        digits += 1;
                    }
                    b' ' | b'\t' | b'\r' if digits == 0 => {}
                    b' ' | b'\t' | b'\r' => break,
                    _ => return None,
                }
            }
            return (digits > 0).then_some(n);
        }
    }
    Some(0)
}

fn bind(addr: SocketAddr, kind: &str) -> io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {kind} {addr}: {e}")))?;
    l.set_nonblocking(true)?;
    println!("listening {kind} {}", l.local_addr()?);
    Ok(l)
}

fn run(args: &Args) -> io::Result<()> {
    let tcp = if args.no_tcp {
        None
    } else {
        Some(bind(args.tcp, "tcp")?)
    };
    let http = if args.no_http {
        None
    } else {
        Some(bind(args.http, "http")?)
    };
    if tcp.is_none() && http.is_none() {
        return Err(io::Error::other(
            "nothing to serve (--no-tcp and --no-http)",
        ));
    }
    if args.threads <= 1 {
        let mut w = Worker::new(Poll::new()?, args.reply);
        w.tcp = tcp.map(TcpListener::from_std);
        w.http = http.map(TcpListener::from_std);
        if let Some(l) = &mut w.tcp {
            w.poll
                .registry()
                .register(l, TCP_LISTENER, Interest::READABLE)?;
        }
        if let Some(l) = &mut w.http {
            w.poll
                .registry()
                .register(l, HTTP_LISTENER, Interest::READABLE)?;
        }
        return w.run();
    }

    // Several pollers: this thread accepts and deals the connections out in turn.
    let mut outs: Vec<(Handoff, Arc<Waker>)> = Vec::new();
    for n in 0..args.threads {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (tx, rx) = mpsc::channel();
        let mut w = Worker::new(poll, args.reply);
        w.incoming = Some(rx);
        std::thread::Builder::new()
            .name(format!("floor-{n}"))
            .spawn(move || {
                if let Err(e) = w.run() {
                    eprintln!("floor: poller {n}: {e}");
                    std::process::exit(1);
                }
            })?;
        outs.push((tx, waker));
    }
    let mut poll = Poll::new()?;
    let mut listeners = Vec::new();
    for (l, token, kind) in [
        (tcp, TCP_LISTENER, Kind::Tcp),
        (http, HTTP_LISTENER, Kind::Http),
    ] {
        if let Some(l) = l {
            let mut l = TcpListener::from_std(l);
            poll.registry()
                .register(&mut l, token, Interest::READABLE)?;
            listeners.push((token, l, kind));
        }
    }
    let mut events = Events::with_capacity(64);
    let mut next = 0;
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for ev in events.iter() {
            let Some((_, l, kind)) = listeners.iter().find(|(t, _, _)| *t == ev.token()) else {
                continue;
            };
            loop {
                match l.accept() {
                    Ok((s, _)) => {
                        let (tx, waker) = &outs[next % outs.len()];
                        next += 1;
                        if tx.send((s, *kind)).is_ok() {
                            waker.wake()?;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        eprintln!("floor: accept: {e}");
                        break;
                    }
                }
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(msg: &str) -> Option<&str> {
        find_id(msg.as_bytes()).map(|b| std::str::from_utf8(b).expect("utf-8"))
    }

    #[test]
    fn finds_the_top_level_id() {
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"m","id":1000000001}"#),
            Some("1000000001")
        );
        assert_eq!(id(r#"{"id":-1.5e3,"method":"m"}"#), Some("-1.5e3"));
        assert_eq!(id(r#"{ "id" : "a\"b" , "method":"m"}"#), Some(r#""a\"b""#));
        assert_eq!(id(r#"{"method":"m","id":null}"#), Some("null"));
        assert_eq!(id("  {\"id\":7}\r"), Some("7"));
    }

    #[test]
    fn steps_over_nested_members_and_strings() {
        let msg = r#"{"params":{"id":1,"x":["id",{"id":2}]},"method":"id","id":3}"#;
        assert_eq!(id(msg), Some("3"));
        // A value that is the string "id" is not a member name.
        assert_eq!(id(r#"{"method":"id","x":"id","id":"k"}"#), Some(r#""k""#));
    }

    #[test]
    fn notifications_and_odd_messages() {
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"m","params":{"id":1}}"#),
            None
        );
        assert_eq!(id(r#"[{"id":1}]"#), Some("null"));
        assert_eq!(id(r#"{"id":{"a":1}}"#), Some("null"));
        assert_eq!(id(r#"{"id":true}"#), Some("null"));
        assert_eq!(id(r#"{"id":"unterminated"#), Some("null"));
        assert_eq!(id("garbage"), Some("null"));
        assert_eq!(id(r#"{"id":"#), Some("null"));
    }

    #[test]
    fn answers() {
        let mut out = Vec::new();
        answer_line(&mut out, br#"{"id":"x","method":"m"}"#);
        answer_line(&mut out, b"  ");
        answer_line(&mut out, br#"{"method":"m"}"#);
        assert_eq!(out, b"{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"result\":19}\n");
        out.clear();
        answer_http(&mut out, br#"{"id":12,"method":"m"}"#);
        let body = r#"{"jsonrpc":"2.0","id":12,"result":19}"#;
        let want = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(String::from_utf8_lossy(&out), want);
        out.clear();
        answer_http(&mut out, br#"{"method":"m"}"#);
        assert_eq!(out, HTTP_NO_CONTENT);
    }
}
