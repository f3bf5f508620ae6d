//! The echo floor: the cheapest server the socket path allows, as the lower bound on
//! what any JSON-RPC server can cost on this machine.
//!
//! ```text
//! cargo run --release -p benches --bin floor -- [--tcp 127.0.0.1:7800] [--http 127.0.0.1:7801]
//!     [--no-tcp] [--no-http] [--threads 1]
//! ```
//!
//! Every newline-terminated, non-empty line on the TCP port is answered with the fixed
//! line `{"jsonrpc":"2.0","id":1,"result":19}`; every HTTP/1.1 request on the HTTP port
//! with a fixed `200 OK` (`Content-Type: application/json`, that body, keep-alive). No
//! JSON is parsed: TCP only counts newlines; HTTP finds the end of the head, reads
//! `Content-Length` with a minimal scan and skips the body. Point `loadgen --no-verify`
//! at it.
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
    /// TCP: the current line has bytes (so its newline gets an answer).
    line_open: bool,
    /// HTTP: body bytes still to skip.
    skip: usize,
    /// HTTP: a head split across reads, kept until its end arrives.
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
}

impl Worker {
    fn new(poll: Poll) -> Worker {
        Worker {
            poll,
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
                    let ok = match self.kind {
                        Kind::Tcp => {
                            self.lines(&buf[..n]);
                            true
                        }
                        Kind::Http => self.http(&buf[..n], head_end),
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

    /// One response per complete request (head, then `Content-Length` body bytes).
    /// Returns `false` on a head too long to be one.
    fn http(&mut self, data: &[u8], head_end: &memmem::Finder<'_>) -> bool {
        if self.carry.is_empty() {
            let (used, ok) = self.requests(data, head_end);
            if ok && used < data.len() {
                self.carry.extend_from_slice(&data[used..]);
            }
            ok && self.carry.len() <= MAX_HEAD
        } else {
            // A split head: join it with the new bytes (rare; the carry keeps its capacity).
            let mut carry = std::mem::take(&mut self.carry);
            carry.extend_from_slice(data);
            let (used, ok) = self.requests(&carry, head_end);
            carry.drain(..used);
            self.carry = carry;
            ok && self.carry.len() <= MAX_HEAD
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
        let mut w = Worker::new(Poll::new()?);
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
        let mut w = Worker::new(poll);
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
