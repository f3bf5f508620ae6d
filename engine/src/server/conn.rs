//! One connection's state: its socket, decoder, buffers, and the answers it still owes,
//! in request order.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mio::net::{TcpStream, UnixStream};

use super::pending::{Pending, Slot};
use crate::codec::LineDecoder;
use crate::dispatch::context::Connection;
use crate::dispatch::subscription::{SinkClosed, SubState};
use crate::guard::Session;
use crate::transport::http::HttpDecoder;
use crate::transport::websocket::WsDecoder;

/// A connected stream socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn fd(&self) -> RawFd {
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }

    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
        }
    }

    fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Self::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        }
    }

    pub(crate) fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Self::Tcp(s) => s,
            Self::Unix(s) => s,
        }
    }
}

/// How a connection's bytes are framed.
pub(crate) enum Decoder {
    Line(LineDecoder),
    Http(Box<HttpDecoder>),
    /// After a WebSocket handshake on the HTTP listener.
    Ws(WsDecoder),
}

/// The most answers a connection may owe (pending or waiting their turn) before the
/// server stops reading from it.
pub(crate) const MAX_SLOTS: usize = 1024;

/// Counts a connection as open (across all reactors) for as long as it lives.
pub(crate) struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    pub(crate) fn new(open: Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        Self(open)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The longest a connection the server closes keeps discarding the peer's input.
pub(crate) const LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// One client connection.
pub(crate) struct Conn {
    /// Transport, peer and id, for call contexts.
    pub(crate) info: Connection,
    /// Who authenticated on the connection (with a guard set).
    pub(crate) session: Session,
    pub(crate) stream: Stream,
    pub(crate) decoder: Decoder,
    pub(crate) generation: u64,
    pub(crate) rbuf: BytesMut,
    pub(crate) out: Vec<u8>,
    /// Bytes of `out` already written to the socket.
    pub(crate) written: usize,
    /// Bytes written since the metrics last took the count.
    sent: usize,
    /// Bytes written in all (wraps): whether output moved between two sweeps.
    flushed: usize,
    /// Output owed and not moving: `flushed` when first seen so, and when.
    stalled: Option<(usize, Instant)>,
    /// Answers owed after everything in `out`, in request order.
    pub(crate) slots: VecDeque<Slot>,
    pub(crate) next_slot: u64,
    pub(crate) last_active: Instant,
    /// Since when part of a request has been waiting for the rest (`None`: between
    /// requests).
    pub(crate) partial_since: Option<Instant>,
    /// No more requests will be read (peer closed its side, `Connection: close`, a
    /// fatal framing error, or shutdown).
    pub(crate) read_closed: bool,
    /// The socket failed: drop the connection without writing more.
    pub(crate) broken: bool,
    /// The peer closed its sending side (read returned end of stream).
    pub(crate) peer_eof: bool,
    /// An event reported the peer's close (or an error): reads go on to the end of
    /// stream, instead of stopping at a short read.
    pub(crate) hup: bool,
    /// Bytes may wait in the socket: set by a readiness event, cleared by a read that
    /// emptied it (a new edge comes for later bytes). A connection whose answer was
    /// given later is driven again then, and would otherwise try a read that finds
    /// nothing: a read(2) per deferred answer (every proxied call at depth 1).
    pub(crate) unread: bool,
    /// Closing gracefully: our side is shut down and unread input is discarded until
    /// the peer closes or this passes (see [`Conn::finished`]).
    pub(crate) linger_until: Option<Instant>,
    /// Complete requests wait in `rbuf`: decoding stopped at the output high-water
    /// mark (or at [`MAX_SLOTS`]) and resumes once the output drains.
    pub(crate) held: bool,
    /// The subscriptions opened on this connection (ended when it goes).
    pub(crate) subs: RefCell<Vec<Arc<SubState>>>,
    /// Subscriptions with notifications left for when the output drains.
    pub(crate) push_waiting: Vec<Arc<SubState>>,
    /// A subscriber's liveness check: when the WebSocket Ping went unanswered so far.
    pub(crate) ping_sent: Option<Instant>,
    /// TCP keepalive was turned on (once the connection subscribed).
    pub(crate) keepalive: bool,
    _open: OpenGuard,
}

impl Drop for Conn {
    fn drop(&mut self) {
        for sub in self.subs.get_mut().drain(..) {
            sub.end(SinkClosed::ConnectionClosed);
        }
    }
}

impl Conn {
    pub(crate) fn new(
        info: Connection,
        stream: Stream,
        decoder: Decoder,
        generation: u64,
        open: OpenGuard,
    ) -> Self {
        Self {
            info,
            session: Session::new(),
            stream,
            decoder,
            generation,
            rbuf: BytesMut::new(),
            out: Vec::new(),
            written: 0,
            sent: 0,
            flushed: 0,
            stalled: None,
            slots: VecDeque::new(),
            next_slot: 0,
            last_active: Instant::now(),
            partial_since: None,
            read_closed: false,
            broken: false,
            peer_eof: false,
            hup: false,
            unread: true,
            linger_until: None,
            held: false,
            subs: RefCell::new(Vec::new()),
            push_waiting: Vec::new(),
            ping_sent: None,
            keepalive: false,
            _open: open,
        }
    }

    /// The bytes written since the last call (for the metrics).
    pub(crate) fn take_sent(&mut self) -> usize {
        std::mem::take(&mut self.sent)
    }

    /// Output held for the peer, in bytes: unsent bytes plus answers waiting behind a
    /// call still on the pool. (Iterates the slots, which are few — reading stops at
    /// [`MAX_SLOTS`] — and usually none.)
    pub(crate) fn backlog(&self) -> usize {
        let waiting: usize = self.slots.iter().map(|s| s.buf.len()).sum();
        self.out.len() - self.written + waiting
    }

    /// Whether the connection may read more requests: under the output high-water
    /// mark, and not too many answers owed.
    pub(crate) fn may_read(&self, high_water: usize) -> bool {
        !self.read_closed && self.may_answer(high_water)
    }

    /// Whether more requests may be answered now (the output is under the high-water
    /// mark and not too many answers are owed); also bounds what one read can produce.
    pub(crate) fn may_answer(&self, high_water: usize) -> bool {
        !self.broken && self.slots.len() < MAX_SLOTS && self.backlog() <= high_water
    }

    /// Moves ready slots at the front of the queue into the output.
    pub(crate) fn release_ready(&mut self, pending: &Pending) {
        while self.slots.front().is_some_and(|s| s.ready) {
            if let Some(slot) = self.slots.pop_front() {
                self.out.extend_from_slice(&slot.buf);
                pending.recycle(slot);
            }
        }
    }

    /// Writes as much output as the socket takes.
    pub(crate) fn flush(&mut self) {
        while self.written < self.out.len() {
            match self.stream.write(&self.out[self.written..]) {
                Ok(0) => {
                    self.broken = true;
                    return;
                }
                Ok(n) => {
                    self.written += n;
                    self.sent += n;
                    self.flushed = self.flushed.wrapping_add(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.broken = true;
                    return;
                }
            }
        }
        self.out.clear();
        self.written = 0;
        // A quiet connection gives its buffers back (idle connections cost little).
        if self.out.capacity() > 64 * 1024 {
            self.out = Vec::new();
        }
    }

    /// Notes whether a request is partly received, to time out slow senders.
    pub(crate) fn track_partial(&mut self, now: Instant) {
        let partial = !self.rbuf.is_empty()
            || match &self.decoder {
                Decoder::Line(_) => false,
                Decoder::Http(d) => !d.is_idle(),
                Decoder::Ws(d) => d.mid_message(),
            };
        if !partial || self.read_closed || self.held {
            // (Held requests wait on the server, not on the client.)
            self.partial_since = None;
        } else if self.partial_since.is_none() && self.slots.len() < MAX_SLOTS {
            // (While the server itself holds reading back, the pause is not the
            // client's; see `may_read`.)
            self.partial_since = Some(now);
        }
    }

    /// Whether the peer has taken none of the output owed it for longer than `limit`
    /// (it stopped reading), as seen at `now`. Called once a sweep: output first seen
    /// owed and not moving starts the clock, any byte written stops it.
    pub(crate) fn stalled_past(&mut self, now: Instant, limit: Duration) -> bool {
        if self.written >= self.out.len() {
            self.stalled = None;
            return false;
        }
        match self.stalled {
            Some((at, since)) if at == self.flushed => now.duration_since(since) > limit,
            _ => {
                self.stalled = Some((self.flushed, now));
                false
            }
        }
    }

    /// Whether everything owed has been written (and no received request waits).
    pub(crate) fn idle(&self) -> bool {
        self.slots.is_empty() && self.written == self.out.len() && !self.held
    }

    /// Whether the connection is finished and can be dropped.
    ///
    /// When the server ends a connection the peer is still sending on (a `413`, a
    /// `Connection: close` with more pipelined, a slow sender), closing at once with
    /// unread input makes the kernel send a reset, which can destroy the last answer
    /// before the peer reads it. So the server first shuts down its sending side and
    /// discards input until the peer closes, for at most [`LINGER`].
    pub(crate) fn finished(&mut self) -> bool {
        if self.broken {
            return true;
        }
        if !(self.read_closed && self.idle()) {
            return false;
        }
        if self.peer_eof {
            return true;
        }
        match self.linger_until {
            None => {
                if self.stream.shutdown_write().is_err() {
                    return true;
                }
                self.linger_until = Some(Instant::now() + LINGER);
                self.rbuf = BytesMut::new();
                self.discard_input();
                self.peer_eof || self.broken
            }
            Some(until) => {
                self.discard_input();
                self.peer_eof || self.broken || Instant::now() >= until
            }
        }
    }

    /// Reads and drops whatever the peer sends (while lingering).
    pub(crate) fn discard_input(&mut self) {
        let mut sink = [0u8; 4096];
        loop {
            match self.stream.read(&mut sink) {
                Ok(0) => {
                    self.peer_eof = true;
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.broken = true;
                    return;
                }
            }
        }
    }
}
