//! One connection shared by every calling thread: requests are written under a lock,
//! responses are read by whichever waiting caller is the *leader* (leader/follower).
//!
//! ```text
//!  caller A ─┐ write (writer lock)            ┌─ table (mutex): slots, leader flag
//!  caller B ─┘                                │   slot: ids, state, condvar, copy buffer
//!                                             │
//!  A finds no leader → becomes leader: reader lock, read(2), frame, parse, route by id
//!     its own response: handled on its own tape — no copy, no hand-off
//!     B's response: copied into B's slot, B's condvar notified; B parses it itself
//!  A done → leader flag cleared, one waiting slot's condvar notified: B leads next
//! ```
//!
//! A lone caller therefore reads its own response on its own thread: no cross-thread
//! wake-up (about 35 µs on a machine where the round trip itself costs 7 µs).

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use simd_json::{Node, StaticNode};

use super::address::Address;
use super::error::{Failure, ServerError};
use super::subscription::{Notification, SubId};
use super::{http, json_text, server_error, write_call, Error, Numbering, Options, Violation};
use crate::codec::raw::RawCtx;
use crate::codec::request::MAX_BUDGET_MS;
use crate::codec::response::{error_object, validate_response, Body};
use crate::codec::tape::{elements, members};
use crate::codec::{Id, LineDecoder};
use crate::engine::Scratch;
use crate::transport::websocket::{self, ClientFrame, WsDecoder, WsEvent};

/// Bytes asked of each read(2).
const READ_CHUNK: usize = 64 * 1024;

/// The longest a pong (a few bytes) may take to write.
const PONG_WRITE: Duration = Duration::from_secs(5);

/// A connection with nothing in flight and no write for this long is checked, before
/// the next request is written, for a close by the peer (servers drop idle keep-alive
/// connections; ringrpc's after 300 s). The check is one non-blocking recv(2): on every
/// call of a lone caller it would add a syscall to a round trip of two (about 7 µs);
/// behind this threshold it costs at most ten a second per connection. Server idle
/// timeouts are seconds or more, and a close racing with the write can never be ruled
/// out anyway.
const IDLE_CHECK_AFTER: Duration = Duration::from_millis(100);

/// A connected stream socket.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Self::Tcp(s) => Self::Tcp(s.try_clone()?),
            Self::Unix(s) => Self::Unix(s.try_clone()?),
        })
    }

    fn fd(&self) -> RawFd {
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        }
    }

    fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(Some(t)),
            Self::Unix(s) => s.set_read_timeout(Some(t)),
        }
    }

    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_write_timeout(Some(t)),
            Self::Unix(s) => s.set_write_timeout(Some(t)),
        }
    }

    /// Whether the peer has closed the connection, learned without blocking or
    /// consuming anything: a peek returning end of stream or an error. Unread data
    /// means it is (as far as can be told) open.
    fn peer_closed(&self) -> bool {
        let sock = match self {
            Self::Tcp(s) => socket2::SockRef::from(s),
            Self::Unix(s) => socket2::SockRef::from(s),
        };
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
        match sock.recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
            Ok(n) => n == 0,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        }
    }

    fn shutdown(&self) {
        let _ = match self {
            Self::Tcp(s) => s.shutdown(Shutdown::Both),
            Self::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(b),
            Self::Unix(s) => s.write(b),
        }
    }

    /// Writes all of `b` by `deadline`. `SO_SNDTIMEO` bounds each write(2) alone, so
    /// it is set to what is left of the deadline, before the first write and again
    /// after a partial one (a peer reading slowly could otherwise stretch the write
    /// without end). `timeout` is the value in force: it is re-set only when far from
    /// what is left, so a lone caller with one timeout for every call pays no
    /// setsockopt. An error comes with whether any byte had been written.
    fn write_all_within(
        &mut self,
        mut b: &[u8],
        deadline: Instant,
        timeout: &mut Duration,
    ) -> Result<(), WriteError> {
        let mut written = false;
        let r = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(io::ErrorKind::TimedOut.into());
            }
            // Zero would mean no timeout at all.
            let left = left.max(Duration::from_millis(1));
            if *timeout > left + Duration::from_millis(1) || *timeout < left / 2 {
                if let Err(e) = self.set_write_timeout(left) {
                    break Err(e);
                }
                *timeout = left;
            }
            match self.write(b) {
                Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    b = &b[n..];
                    written = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
            if b.is_empty() {
                break Ok(());
            }
        };
        r.map_err(|error| WriteError { error, written })
    }
}

/// A failed write of one request.
struct WriteError {
    error: io::Error,
    /// Some of the request reached the kernel (so perhaps the server).
    written: bool,
}

/// How requests and responses are delimited.
enum Framing {
    Line,
    /// WebSocket: each request one masked text message, each answer one message.
    Ws,
    Http {
        authority: String,
        path: String,
        /// The token sent as `Authorization: Bearer` with every request.
        bearer: Option<String>,
    },
}

/// What the writer owns: the socket's writing side and reused buffers.
struct Writer {
    /// The `SO_SNDTIMEO` in force.
    timeout: Duration,
    stream: Stream,
    /// The request (or batch) text.
    body: Vec<u8>,
    /// HTTP: head and body together, so one write sends both.
    out: Vec<u8>,
    /// When the last request was written (or the connection made).
    last_write: Instant,
    /// WebSocket: the state of the masking keys' generator.
    mask: u64,
}

/// The writer and how many callers wait for it.
struct WriterSlot {
    writer: Option<Writer>,
    /// Callers blocked on `writer_free`: notified only if there are any, since a
    /// notify is a syscall even when no one waits.
    waiting: u32,
}

/// The writer, taken out of its slot; put back (and a waiting caller woken) on drop,
/// also when the caller's params serializer panics.
struct WriterGuard<'a> {
    conn: &'a Conn,
    writer: Option<Writer>,
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        {
            let mut slot = lock(&self.conn.writer);
            slot.writer = self.writer.take();
            if slot.waiting > 0 {
                self.conn.writer_free.notify_one();
            }
        }
        // Queued by a reader that found the writer taken (by this guard's holder, or
        // another whose check came before the queueing): written now, so that they
        // do not wait for the next request. (`flush_control` clears the flag before
        // anything else, so the guard it takes does not come back here.)
        if self.conn.unsubs_pending.load(Ordering::Acquire) && !self.conn.is_dead() {
            self.conn.flush_control();
        }
    }
}

/// What the leader owns while it reads.
struct Reader {
    stream: Stream,
    buf: BytesMut,
    lines: LineDecoder,
    /// HTTP: the response being decoded, kept across reads.
    http: http::Decoder,
    /// WebSocket: the server's frames.
    ws: WsDecoder,
    scratch: Scratch,
    /// The read timeout currently set on the socket.
    timeout: Option<Duration>,
    eof: bool,
}

/// A waiting call (or batch) and where its response goes.
struct Slot {
    /// The request ids it waits for (several for a batch); empty when free.
    ids: Range<u64>,
    state: State,
    /// Its owner is blocked on `cv` (in `wait`): only such a slot can be handed the
    /// reading. A registered call not yet waited for (`Client::start`) is not.
    parked: bool,
    /// A subscribe call: a successful answer registers its subscription as it is
    /// routed, before any notification read after it.
    subscribe: bool,
    /// A subscribe call's unsubscribe method: if the call is given up before its
    /// answer comes, the subscription that answer opens is closed (`Table::orphans`).
    unsubscribe: Option<String>,
    /// Arc so a waiter can hold it while the table's guard is moved into `wait`.
    cv: Arc<Condvar>,
    /// Where the leader copies a response for this slot, and the scratch its owner
    /// parses it with; taken out by the owner while parsing (no lock held).
    parse: Option<Box<Delivery>>,
}

struct Delivery {
    frame: Vec<u8>,
    scratch: Scratch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Waiting,
    /// A response is in `parse.frame`.
    Ready,
    /// The leader is handling this slot's response itself.
    Taken,
    Failed(Failure),
}

/// Shared bookkeeping, under one short-held mutex.
struct Table {
    slots: Vec<Slot>,
    /// Someone is (or is about to be) reading.
    leader: bool,
    failed: Option<Failure>,
    /// HTTP: for each request written and not yet answered, in order, the first id of
    /// the call it belongs to (`None` for notifications). HTTP answers in order, so
    /// this attributes status errors and id-less error objects.
    http: VecDeque<Option<u64>>,
    /// WebSocket: the payload of a ping not yet answered (the reader cannot write: the
    /// pong goes before the next request).
    pong: Option<BytesMut>,
    /// Open subscriptions (looked up by a scan: a connection holds few).
    subs: Vec<Sub>,
    /// Names subscriptions for their owners (`Sub::token`).
    next_token: u64,
    /// Notifications queued per subscription at most.
    sub_capacity: usize,
    /// Subscribe calls given up before their answer (a timeout): the first id and the
    /// unsubscribe method. The subscription a late answer opens is closed at once, so
    /// that the server does not push for ever to a client that drops what it pushes.
    /// At most `MAX_ORPHANS` (the oldest go: a server that never answers them).
    orphans: VecDeque<(u64, String)>,
    /// Unsubscribe calls to write for orphaned subscriptions (see `Conn::flush_control`).
    unsubs: Vec<(SubId, String)>,
}

/// Subscribe calls given up and still remembered, per connection.
const MAX_ORPHANS: usize = 64;

/// A subscription's notifications, queued until its owner takes them.
struct Sub {
    id: SubId,
    token: u64,
    /// Taken by the subscribe call that opened it.
    claimed: bool,
    items: VecDeque<Notification>,
    /// Lost since the last notification queued (the server's `lagged` counts).
    missed: u64,
    /// The server ended it: with its error, or `None` for a plain close.
    end: Option<Option<ServerError>>,
    /// Its owner waits on `cv` (in `next_note`).
    parked: bool,
    cv: Arc<Condvar>,
}

/// What waiting for a subscription's notification came to.
pub(crate) enum NoteWait {
    Item(Notification),
    /// The server ended the subscription (with its error, if any).
    Ended(Option<ServerError>),
    /// The connection failed.
    Failed(Error),
    TimedOut,
}

/// What a server's notification (`method`, no `id`) says of a subscription.
pub(crate) enum Note<'a> {
    Result(&'a [Node<'a>]),
    Lagged(u64),
    Error(Error),
    Closed,
}

/// A registered call: its slot and first id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    slot: usize,
    id: u64,
}

/// Writes a request into the buffer given; the `Option<u64>` is the budget to add to
/// object params as `_meta` (line transports; `None` over HTTP or when none is sent).
pub(crate) type WriteRequest<'a> = dyn FnMut(&mut Vec<u8>, Option<u64>) -> Result<(), Error> + 'a;

/// What a request carries beyond its bytes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Carry {
    /// Over HTTP, an `Idempotency-Key` naming the call by its first id.
    pub(crate) idempotent: bool,
    /// When the caller stops waiting for any answer: what is left of it when the
    /// request is written goes with it as the call's budget (`None`: no budget sent).
    pub(crate) until: Option<Instant>,
    /// A subscribe call (see `Slot::subscribe`).
    pub(crate) subscribe: bool,
}

/// What is left until `until`, in whole milliseconds (rounded down: a server never
/// gets more time than the caller will wait), at most what a server takes.
fn budget_ms(until: Instant) -> u64 {
    let left = until.saturating_duration_since(Instant::now()).as_millis();
    let max = u64::from(MAX_BUDGET_MS);
    u64::try_from(left).map_or(max, |ms| ms.min(max))
}

/// Why a send did not happen.
pub(crate) enum SendError {
    /// The connection had already failed, or failed before any of the request was
    /// written: nothing was sent (safe to resend).
    Dead(Error),
    /// The request may be partly written, or could not be encoded.
    Failed(Error),
}

/// Where a response frame goes.
enum Route {
    Mine,
    Delivered,
    Ignored,
    /// The late answer of a subscribe call given up: its unsubscribe is queued.
    Orphaned,
}

/// One connection.
pub(crate) struct Conn {
    framing: Framing,
    /// The writer, taken out by the caller writing (`None` meanwhile). Not a plain
    /// mutex: a caller waits for it only until its deadline (`writer_free`).
    writer: Mutex<WriterSlot>,
    writer_free: Condvar,
    reader: Mutex<Reader>,
    table: Mutex<Table>,
    /// Set once the connection has failed, read without a lock by `Client`.
    dead: AtomicBool,
    /// Whether a notification was ever sent on it: an error with a `null` id may then be
    /// its answer (a line over the server's size limit), not a waiting call's.
    notified: AtomicBool,
    /// `Table::unsubs` is not empty: whoever puts the writer back writes them (one
    /// load per request otherwise).
    unsubs_pending: AtomicBool,
    /// A handle on the socket to shut it down from any thread.
    control: Stream,
    /// The client's ids: which were sent, and its `Idempotency-Key` prefix.
    ids: Arc<Numbering>,
    max_response: usize,
    max_depth: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data half-updated in a
    // way that matters more than failing the call, so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// An I/O error on the connection: the peer closing it (reset, broken pipe) is
/// [`Failure::Closed`], on the read side as on the write side.
fn io_failure(e: &io::Error) -> Failure {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::NotConnected => Failure::Closed,
        kind => Failure::Io(kind),
    }
}

impl Conn {
    /// Connects to `addr` within `connect_timeout`.
    pub(crate) fn connect(
        addr: &Address,
        opts: &Options,
        connect_timeout: Duration,
        ids: Arc<Numbering>,
    ) -> Result<Self, Error> {
        // WebSocket: bytes the server sent right after its handshake answer.
        let mut early = BytesMut::new();
        let (stream, framing) = match addr {
            Address::Tcp(hp) => (Stream::Tcp(tcp(hp, connect_timeout)?), Framing::Line),
            Address::Unix(path) => (
                // A local socket connects at once or fails: no timeout is needed.
                Stream::Unix(UnixStream::connect(path).map_err(Error::Connect)?),
                Framing::Line,
            ),
            Address::Http { authority, path } => (
                Stream::Tcp(tcp(authority, connect_timeout)?),
                Framing::Http {
                    authority: authority.clone(),
                    path: path.clone(),
                    bearer: opts.token.clone(),
                },
            ),
            Address::Ws { authority, path } => {
                let mut s = tcp(authority, connect_timeout)?;
                let rest = ws_handshake(&mut s, authority, path, opts, connect_timeout)?;
                early = rest;
                (Stream::Tcp(s), Framing::Ws)
            }
        };
        stream
            .set_write_timeout(opts.timeout)
            .map_err(Error::Connect)?;
        let reader = stream.try_clone().map_err(Error::Connect)?;
        let control = stream.try_clone().map_err(Error::Connect)?;
        Ok(Self {
            framing,
            writer: Mutex::new(WriterSlot {
                writer: Some(Writer {
                    timeout: opts.timeout,
                    stream,
                    body: Vec::with_capacity(1024),
                    out: Vec::new(),
                    last_write: Instant::now(),
                    mask: seed(),
                }),
                waiting: 0,
            }),
            writer_free: Condvar::new(),
            reader: Mutex::new(Reader {
                stream: reader,
                buf: {
                    let mut buf = BytesMut::with_capacity(READ_CHUNK.max(early.len()));
                    buf.extend_from_slice(&early);
                    buf
                },
                lines: LineDecoder::new(opts.max_response_bytes),
                http: http::Decoder::default(),
                ws: WsDecoder::client(opts.max_response_bytes),
                scratch: Scratch::with_max_depth(opts.max_depth),
                timeout: None,
                eof: false,
            }),
            table: Mutex::new(Table {
                slots: Vec::new(),
                leader: false,
                failed: None,
                http: VecDeque::new(),
                pong: None,
                subs: Vec::new(),
                next_token: 0,
                sub_capacity: opts.subscription_queue,
                orphans: VecDeque::new(),
                unsubs: Vec::new(),
            }),
            dead: AtomicBool::new(false),
            notified: AtomicBool::new(false),
            unsubs_pending: AtomicBool::new(false),
            control,
            ids,
            max_response: opts.max_response_bytes,
            max_depth: opts.max_depth,
        })
    }

    /// Whether the connection has failed (a new one is needed).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Writes one request (or batch) produced by `write`; with `reply`, registers a
    /// slot for the ids `ids` first, so the response cannot arrive before it.
    /// Waiting for the writer, and writing, end at `deadline` (`Error::WriteTimeout`;
    /// when nothing was written yet, the connection stays usable). `carry`: over HTTP,
    /// an `Idempotency-Key` naming the call by `ids.start` and the budget as
    /// `RPC-Timeout-Ms`; on line transports the budget is handed to `write`, for the
    /// `_meta` of object params.
    pub(crate) fn send(
        &self,
        ids: Range<u64>,
        reply: bool,
        carry: Carry,
        deadline: Instant,
        write: &mut WriteRequest<'_>,
    ) -> Result<Option<Ticket>, SendError> {
        let mut guard = self
            .take_writer(deadline)
            .ok_or(SendError::Failed(Error::WriteTimeout))?;
        let Some(w) = guard.writer.as_mut() else {
            // Never: `take_writer` returns a guard holding the writer.
            return Err(SendError::Failed(Error::WriteTimeout));
        };
        w.body.clear();
        // Measured once the writer is ours, just before writing: what waiting for it
        // took is not promised to the server.
        let budget = carry.until.map(budget_ms);
        let meta = match self.framing {
            Framing::Line | Framing::Ws => budget,
            Framing::Http { .. } => None,
        };
        write(&mut w.body, meta).map_err(SendError::Failed)?;
        let bytes: &[u8] = match &self.framing {
            Framing::Line => {
                w.body.push(b'\n');
                &w.body
            }
            Framing::Ws => {
                w.out.clear();
                if let Some(ping) = lock(&self.table).pong.take() {
                    let mask = next_mask(&mut w.mask);
                    websocket::write_masked(&mut w.out, ClientFrame::Pong, &ping, mask);
                }
                let mask = next_mask(&mut w.mask);
                websocket::write_masked(&mut w.out, ClientFrame::Text, &w.body, mask);
                &w.out
            }
            Framing::Http {
                authority,
                path,
                bearer,
            } => {
                let extra = http::Extra {
                    bearer: bearer.as_deref(),
                    idempotency_key: carry.idempotent.then(|| (self.ids.key_prefix(), ids.start)),
                    timeout_ms: budget,
                };
                w.out.clear();
                http::write_head(&mut w.out, path, authority, extra, w.body.len());
                w.out.extend_from_slice(&w.body);
                &w.out
            }
        };
        // Only a connection that has been idle is checked, so a busy one pays no
        // syscall; see `IDLE_CHECK_AFTER`.
        let now = Instant::now();
        let idle = now.duration_since(w.last_write) >= IDLE_CHECK_AFTER;
        w.last_write = now;
        if idle && self.nothing_in_flight() && w.stream.peer_closed() {
            self.fail(Failure::Closed);
            return Err(SendError::Dead(Error::Closed));
        }
        if now >= deadline {
            // Spent waiting for the writer: nothing is sent, the connection is fine.
            return Err(SendError::Failed(Error::WriteTimeout));
        }
        let ticket = {
            let mut t = lock(&self.table);
            if let Some(f) = t.failed {
                return Err(SendError::Dead(f.error()));
            }
            if let Framing::Http { .. } = self.framing {
                t.http.push_back(reply.then_some(ids.start));
            }
            if !reply {
                self.notified.store(true, Ordering::Relaxed);
            }
            reply.then(|| Ticket {
                slot: self.register(&mut t, ids.clone(), carry.subscribe),
                id: ids.start,
            })
        };
        if let Err(WriteError { error, written }) =
            w.stream.write_all_within(bytes, deadline, &mut w.timeout)
        {
            let f = if is_timeout(&error) {
                Failure::WriteTimeout
            } else {
                io_failure(&error)
            };
            self.fail(f);
            if let Some(ticket) = ticket {
                self.release(ticket);
            }
            // The peer closed (or reset) the connection, and write(2) failed before the
            // kernel took a single byte of this request: the server cannot have seen
            // it, so sending it on a new connection is safe even for a call that is not
            // idempotent. (Once part of it is written, it is not.)
            if f == Failure::Closed && !written {
                return Err(SendError::Dead(f.error()));
            }
            return Err(SendError::Failed(f.error()));
        }
        Ok(ticket)
    }

    /// Writes what the reader could not (it never waits for the writer): the pong to a
    /// ping waiting in the table, and the unsubscribe calls of orphaned subscriptions.
    /// Only if the writer is free; else its holder writes them when it puts the writer
    /// back (the pong goes before its next request). A server that pings a silent
    /// subscriber closes it if no pong comes: a client that only reads notifications
    /// must not wait for a request to answer.
    fn flush_control(&self) {
        let Some(mut guard) = self.take_writer(Instant::now()) else {
            return;
        };
        let Some(w) = guard.writer.as_mut() else {
            return;
        };
        let (ping, unsubs) = {
            let mut t = lock(&self.table);
            // Cleared first: a failed connection writes nothing more, and keeping the
            // flag would have every guard's drop come back here.
            self.unsubs_pending.store(false, Ordering::Release);
            if t.failed.is_some() {
                return;
            }
            (t.pong.take(), std::mem::take(&mut t.unsubs))
        };
        if ping.is_none() && unsubs.is_empty() {
            return;
        }
        w.out.clear();
        if let Some(ping) = ping {
            let mask = next_mask(&mut w.mask);
            websocket::write_masked(&mut w.out, ClientFrame::Pong, &ping, mask);
        }
        for (sub, method) in &unsubs {
            // Its answer is ignored when it comes: the id is issued, and no slot waits.
            let id = self.ids.take(1);
            w.body.clear();
            if write_call(&mut w.body, Some(Id::UInt(id)), method, &[sub], None).is_err() {
                continue;
            }
            match self.framing {
                Framing::Ws => {
                    let mask = next_mask(&mut w.mask);
                    websocket::write_masked(&mut w.out, ClientFrame::Text, &w.body, mask);
                }
                // Subscriptions are refused over HTTP: never queued there.
                Framing::Line | Framing::Http { .. } => {
                    w.out.extend_from_slice(&w.body);
                    w.out.push(b'\n');
                }
            }
        }
        let deadline = Instant::now() + PONG_WRITE;
        let Writer {
            stream,
            out,
            timeout,
            ..
        } = w;
        if let Err(WriteError { error, .. }) = stream.write_all_within(out, deadline, timeout) {
            self.fail(if is_timeout(&error) {
                Failure::WriteTimeout
            } else {
                io_failure(&error)
            });
        }
    }

    /// Takes the writer, waiting for it at most until `deadline`.
    fn take_writer(&self, deadline: Instant) -> Option<WriterGuard<'_>> {
        let mut slot = lock(&self.writer);
        loop {
            if let Some(w) = slot.writer.take() {
                return Some(WriterGuard {
                    conn: self,
                    writer: Some(w),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            slot.waiting += 1;
            slot = self
                .writer_free
                .wait_timeout(slot, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            slot.waiting -= 1;
        }
    }

    /// No call is registered: none waits for a response, none has one to read.
    fn nothing_in_flight(&self) -> bool {
        lock(&self.table)
            .slots
            .iter()
            .all(|s| s.state == State::Free)
    }

    /// Takes a free slot (growing the table on first use) for `ids`.
    fn register(&self, t: &mut Table, ids: Range<u64>, subscribe: bool) -> usize {
        let i = match t.slots.iter().position(|s| s.state == State::Free) {
            Some(i) => i,
            None => {
                t.slots.push(Slot {
                    ids: 0..0,
                    state: State::Free,
                    parked: false,
                    subscribe: false,
                    unsubscribe: None,
                    cv: Arc::new(Condvar::new()),
                    parse: Some(Box::new(Delivery {
                        frame: Vec::new(),
                        scratch: Scratch::with_max_depth(self.max_depth),
                    })),
                });
                t.slots.len() - 1
            }
        };
        t.slots[i].ids = ids;
        t.slots[i].state = State::Waiting;
        t.slots[i].subscribe = subscribe;
        t.slots[i].unsubscribe = None;
        i
    }

    /// Names the method that closes the subscription `ticket`'s subscribe call opens,
    /// should the call be given up before its answer comes (see `Table::orphans`).
    pub(crate) fn unsubscribe_if_given_up(&self, ticket: Ticket, method: &str) {
        let mut t = lock(&self.table);
        if let Some(s) = t.slots.get_mut(ticket.slot) {
            if s.ids.start == ticket.id && s.state == State::Waiting {
                s.unsubscribe = Some(method.to_owned());
            }
        }
    }

    /// Frees a slot whose owner is done with it (or gave up), passing the reading on if
    /// no one else holds it.
    pub(crate) fn release(&self, ticket: Ticket) {
        let mut t = lock(&self.table);
        free(&mut t, ticket);
        if !t.leader {
            wake_next(&t);
        }
    }

    /// Waits for the response to `ticket` until `deadline`, and runs `on_reply` over
    /// the parsed reply (the whole frame: an object, or a batch's array). The slot is
    /// released in every case.
    pub(crate) fn wait(
        &self,
        ticket: Ticket,
        deadline: Instant,
        on_reply: &mut dyn FnMut(RawCtx<'_>),
    ) -> Result<(), Error> {
        let mut t = lock(&self.table);
        loop {
            let slot = &mut t.slots[ticket.slot];
            match slot.state {
                State::Ready => {
                    let Some(d) = slot.parse.take() else {
                        // Never: `parse` is only taken here, by the slot's owner.
                        free(&mut t, ticket);
                        return Err(Error::Protocol(Violation::MissingResponse));
                    };
                    drop(t);
                    // Gives the buffers back and frees the slot however this ends,
                    // also when the caller's code run by `on_reply` panics.
                    let mut back = HandBack {
                        conn: self,
                        ticket,
                        delivery: None,
                    };
                    let Delivery { frame, scratch } = &mut **back.delivery.insert(d);
                    return scratch.parse(frame, |raw| match raw {
                        Ok(raw) => {
                            on_reply(raw);
                            Ok(())
                        }
                        // The leader parsed these very bytes already.
                        Err(_) => Err(Error::Protocol(Violation::BadJson)),
                    });
                }
                State::Failed(f) => {
                    free(&mut t, ticket);
                    if !t.leader {
                        wake_next(&t);
                    }
                    return Err(f.error());
                }
                State::Waiting | State::Taken | State::Free => {}
            }
            if !t.leader {
                t.leader = true;
                drop(t);
                return self.lead(ticket, deadline, on_reply, None);
            }
            let now = Instant::now();
            if now >= deadline {
                free(&mut t, ticket);
                return Err(Error::ReadTimeout);
            }
            let cv = Arc::clone(&t.slots[ticket.slot].cv);
            t.slots[ticket.slot].parked = true;
            t = cv
                .wait_timeout(t, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            t.slots[ticket.slot].parked = false;
        }
    }

    /// Reads as the leader until `ticket`'s response has been handled (with `note`,
    /// until subscription `note` has something for its owner), the deadline passes or
    /// the connection fails; then hands the reading to another waiter.
    fn lead(
        &self,
        ticket: Ticket,
        deadline: Instant,
        on_reply: &mut dyn FnMut(RawCtx<'_>),
        note: Option<u64>,
    ) -> Result<(), Error> {
        // Declared before the reader's guard, so dropped after it: the reading is
        // handed on however this returns, also when the caller's own code run by
        // `on_reply` (its result closure, a `Deserialize` impl) panics.
        let _abdicate = Abdicate { conn: self, ticket };
        let mut r = lock(&self.reader);
        let mut done: Option<Result<(), Error>> = None;
        loop {
            // Complete frames first (no syscall); once done, only those already here,
            // so the next leader finds them delivered.
            match self.next_frame(&mut r, ticket, on_reply) {
                Ok(Some(mine)) => {
                    if mine || note.is_some_and(|token| self.note_ready(token)) {
                        done = Some(Ok(()));
                    }
                    continue;
                }
                Ok(None) => {}
                Err(f) => {
                    self.fail(f);
                    done.get_or_insert(Err(f.error()));
                }
            }
            if done.is_none() {
                if let State::Failed(f) = self.state(ticket) {
                    done = Some(Err(f.error()));
                } else if let (Some(_), Some(f)) = (note, lock(&self.table).failed) {
                    done = Some(Err(f.error()));
                }
            }
            if let Some(result) = done {
                return result;
            }
            if r.eof {
                self.fail(Failure::Closed);
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                done = Some(Err(Error::ReadTimeout));
                continue;
            }
            if let Err(e) = self.read(&mut r, deadline - now) {
                let f = io_failure(&e);
                self.fail(f);
                done = Some(Err(f.error()));
            }
        }
    }

    fn state(&self, ticket: Ticket) -> State {
        lock(&self.table)
            .slots
            .get(ticket.slot)
            .map_or(State::Waiting, |s| s.state)
    }

    /// Waits until `deadline` for subscription `token`'s next notification, reading
    /// the connection itself when no one else does.
    pub(crate) fn next_note(&self, token: u64, deadline: Instant) -> NoteWait {
        let mut t = lock(&self.table);
        loop {
            // Returning without reading: if no one reads, the next waiter is woken to
            // (this one may have been woken to read, and the others wait on it).
            let done = |t: &Table, w: NoteWait| {
                if !t.leader {
                    wake_next(t);
                }
                w
            };
            let Some(i) = t.subs.iter().position(|s| s.token == token) else {
                return done(&t, NoteWait::Ended(None));
            };
            let sub = &mut t.subs[i];
            if let Some(n) = sub.items.pop_front() {
                return done(&t, NoteWait::Item(n));
            }
            if let Some(end) = sub.end.take() {
                return done(&t, NoteWait::Ended(end));
            }
            if let Some(f) = t.failed {
                return NoteWait::Failed(f.error());
            }
            let now = Instant::now();
            if now >= deadline {
                return done(&t, NoteWait::TimedOut);
            }
            if !t.leader {
                t.leader = true;
                drop(t);
                // What the reading came to is found in the table.
                let _ = self.lead(NO_TICKET, deadline, &mut |_| {}, Some(token));
                t = lock(&self.table);
                continue;
            }
            let cv = Arc::clone(&t.subs[i].cv);
            t.subs[i].parked = true;
            t = cv
                .wait_timeout(t, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if let Some(s) = t.subs.iter_mut().find(|s| s.token == token) {
                s.parked = false;
            }
        }
    }

    /// Whether subscription `token` has something for its owner (or is gone).
    fn note_ready(&self, token: u64) -> bool {
        let t = lock(&self.table);
        t.subs
            .iter()
            .find(|s| s.token == token)
            .is_none_or(|s| !s.items.is_empty() || s.end.is_some())
    }

    /// Takes the subscription `id` registered when its subscribe call's answer was
    /// routed; `None` if there is none to take (the server answered an id already in
    /// use on this connection).
    pub(crate) fn claim(&self, id: &SubId) -> Option<u64> {
        let mut t = lock(&self.table);
        let sub = t.subs.iter_mut().find(|s| !s.claimed && s.id == *id)?;
        sub.claimed = true;
        Some(sub.token)
    }

    /// Drops subscription `token` and what it has queued: its notifications are
    /// ignored from now on.
    pub(crate) fn forget(&self, token: u64) {
        let mut t = lock(&self.table);
        if let Some(i) = t.subs.iter().position(|s| s.token == token) {
            t.subs.swap_remove(i);
        }
    }

    /// One read(2) with at most `left` to wait. EOF sets `r.eof`; a timeout returns Ok.
    fn read(&self, r: &mut Reader, left: Duration) -> io::Result<()> {
        // A setsockopt per call only when the timeout set is far from what is left:
        // with one timeout for every call, it is set once.
        let left = left.max(Duration::from_millis(1));
        let set = match r.timeout {
            Some(t) => t > left + Duration::from_millis(1) || t < left / 2,
            None => true,
        };
        if set {
            r.stream.set_read_timeout(left)?;
            r.timeout = Some(left);
        }
        match crate::transport::io::read_into(r.stream.fd(), &mut r.buf, READ_CHUNK) {
            Ok(0) => {
                r.eof = true;
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes one complete frame (line or HTTP response) off the read buffer and routes
    /// it. `Ok(None)`: no complete frame; `Ok(Some(mine))`: one was routed, `mine` if it
    /// was the leader's own. `Err`: the connection can no longer be trusted.
    fn next_frame(
        &self,
        r: &mut Reader,
        me: Ticket,
        on_reply: &mut dyn FnMut(RawCtx<'_>),
    ) -> Result<Option<bool>, Failure> {
        let Reader {
            buf,
            lines,
            http,
            ws,
            scratch,
            eof,
            ..
        } = r;
        match self.framing {
            Framing::Line => match lines.decode(buf) {
                Ok(Some(frame)) => self.route(scratch, &frame, None, me, on_reply).map(Some),
                Ok(None) => Ok(None),
                Err(_) => Err(Failure::Protocol(Violation::TooLarge)),
            },
            Framing::Ws => loop {
                let v = |why| Err(Failure::Protocol(Violation::WebSocket(why)));
                return match ws.decode(buf) {
                    None if *eof => Err(Failure::Closed),
                    None => Ok(None),
                    Some(WsEvent::Message(frame)) => {
                        self.route(scratch, &frame, None, me, on_reply).map(Some)
                    }
                    Some(WsEvent::Ping(payload)) => {
                        lock(&self.table).pong = Some(payload);
                        self.flush_control();
                        continue;
                    }
                    Some(WsEvent::TooLarge) => Err(Failure::Protocol(Violation::TooLarge)),
                    Some(WsEvent::Close(_)) => v("the server closed the WebSocket"),
                    Some(WsEvent::Fail(_, why)) => v(why),
                };
            },
            Framing::Http { .. } => {
                let reply = http
                    .decode(buf, self.max_response, *eof)
                    .map_err(Failure::Protocol)?;
                let Some(reply) = reply else {
                    return Ok(None);
                };
                let owner = lock(&self.table).http.pop_front();
                let Some(owner) = owner else {
                    // An answer to no request.
                    return Err(Failure::Protocol(Violation::UnknownId));
                };
                let mut mine = false;
                if owner.is_none() {
                    // The answer to a notification (or all-notification batch): nothing
                    // waits for it, whatever it holds (jsonrpsee sends `null`).
                } else if reply.status == 200 && !reply.body.trim_ascii().is_empty() {
                    mine = self.route(scratch, &reply.body, owner, me, on_reply)?;
                } else if !matches!(reply.status, 200 | 204) && error_answer(scratch, &reply.body) {
                    // An error status with the JSON-RPC error the server meant (401 with
                    // `-32040`, 429 with `-32005`): that error is the call's answer.
                    mine = self.route(scratch, &reply.body, owner, me, on_reply)?;
                } else if let Some(id) = owner {
                    // 204 / empty for a call, or an error status: that call fails.
                    let v = match reply.status {
                        200 | 204 => Violation::MissingResponse,
                        s => Violation::HttpStatus(s),
                    };
                    self.fail_id(id, Failure::Protocol(v));
                }
                if reply.close {
                    self.fail(Failure::Closed);
                }
                Ok(Some(mine))
            }
        }
    }

    /// Parses a response frame and hands it to the slot waiting for its id: handled in
    /// place if it is the leader's own, else copied to the slot and its owner woken.
    /// `owner`: the id HTTP's ordering attributes the frame to.
    fn route(
        &self,
        scratch: &mut Scratch,
        frame: &[u8],
        owner: Option<u64>,
        me: Ticket,
        on_reply: &mut dyn FnMut(RawCtx<'_>),
    ) -> Result<bool, Failure> {
        scratch.parse(frame, |raw| {
            let raw = raw.map_err(|_| Failure::Protocol(Violation::BadJson))?;
            if let Some(note) = notification(raw) {
                if let Some((sub, note)) = note {
                    self.deliver_note(sub, note, raw);
                }
                return Ok(false);
            }
            let id = match frame_id(raw.root)? {
                Some(id) => Some(id),
                None => owner,
            };
            match self.deliver(id, frame, raw.root, me)? {
                Route::Mine => {
                    on_reply(raw);
                    Ok(true)
                }
                Route::Orphaned => {
                    // Set before the writer is tried: if it is taken, its holder sees
                    // the flag when it puts it back.
                    self.unsubs_pending.store(true, Ordering::Release);
                    self.flush_control();
                    Ok(false)
                }
                Route::Delivered | Route::Ignored => Ok(false),
            }
        })
    }

    /// Queues a notification on the subscription it names (ignored if none).
    fn deliver_note<'a>(&self, sub: &'a Node<'a>, note: Note<'a>, raw: RawCtx<'a>) {
        let mut t = lock(&self.table);
        let cap = t.sub_capacity;
        let Some(s) = t.subs.iter_mut().find(|s| s.id.is(sub)) else {
            return;
        };
        if s.end.is_some() {
            return;
        }
        match note {
            Note::Result(value) => {
                s.items.push_back(Notification {
                    result: json_text(raw, value).into_owned(),
                    missed: std::mem::take(&mut s.missed),
                });
                if s.items.len() > cap {
                    // The owner reads too slowly: the oldest goes, counted by the next.
                    if let Some(old) = s.items.pop_front() {
                        let lost = old.missed.saturating_add(1);
                        if let Some(next) = s.items.front_mut() {
                            next.missed = next.missed.saturating_add(lost);
                        }
                    }
                }
            }
            Note::Lagged(n) => s.missed = s.missed.saturating_add(n),
            Note::Error(Error::Server(e)) => s.end = Some(Some(e)),
            Note::Error(_) | Note::Closed => s.end = Some(None),
        }
        if s.parked {
            s.cv.notify_one();
        }
    }

    /// Finds the slot for `id` (`None`: the frame carries only `null` ids); a
    /// subscribe call's successful answer registers its subscription.
    fn deliver(
        &self,
        id: Option<u64>,
        frame: &[u8],
        root: &[Node<'_>],
        me: Ticket,
    ) -> Result<Route, Failure> {
        let mut t = lock(&self.table);
        let slot = match id {
            Some(id) => {
                let found = t.slots.iter().position(|s| s.ids.contains(&id));
                match found {
                    Some(i) => i,
                    // Sent, but its caller gave up (timeout) or it was answered already.
                    None if self.ids.issued(id) => return Ok(orphan_answered(&mut t, id, root)),
                    None => return Err(Failure::Protocol(Violation::UnknownId)),
                }
            }
            None => {
                // An id-less error on a stream (a request the server could not read):
                // it is a call's only when one call is waiting and no notification was
                // ever sent here (whose error it could be). Else it names no one: it is
                // dropped, and the other callers get their own answers (the call it was
                // for, if any, times out: its outcome is not known, where a wrong
                // error would say it did not run).
                let mut waiting = t
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.state == State::Waiting);
                match (waiting.next(), waiting.next()) {
                    (Some((i, _)), None) if !self.notified.load(Ordering::Relaxed) => i,
                    _ => return Ok(Route::Ignored),
                }
            }
        };
        let s = &mut t.slots[slot];
        if s.state != State::Waiting {
            return Ok(Route::Ignored);
        }
        if s.subscribe {
            register_sub(&mut t, root);
        }
        let s = &mut t.slots[slot];
        if slot == me.slot {
            s.state = State::Taken;
            return Ok(Route::Mine);
        }
        if let Some(d) = s.parse.as_mut() {
            d.frame.clear();
            d.frame.extend_from_slice(frame);
        }
        s.state = State::Ready;
        s.cv.notify_one();
        Ok(Route::Delivered)
    }

    /// Fails the call waiting for `id` alone.
    fn fail_id(&self, id: u64, f: Failure) {
        let mut t = lock(&self.table);
        if let Some(s) = t
            .slots
            .iter_mut()
            .find(|s| s.ids.contains(&id) && s.state == State::Waiting)
        {
            s.state = State::Failed(f);
            s.cv.notify_one();
        }
    }

    /// Marks the connection failed: every waiting call gets `f`, later sends are
    /// refused, and the socket is shut down (unblocking a writer stuck in write(2)).
    pub(crate) fn fail(&self, f: Failure) {
        let mut t = lock(&self.table);
        if t.failed.is_none() {
            t.failed = Some(f);
            self.dead.store(true, Ordering::Release);
            self.control.shutdown();
        }
        let f = t.failed.unwrap_or(f);
        for s in t.slots.iter_mut().filter(|s| s.state == State::Waiting) {
            s.state = State::Failed(f);
            s.cv.notify_one();
        }
        for s in t.subs.iter().filter(|s| s.parked) {
            s.cv.notify_one();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.control.shutdown();
    }
}

/// Ends a leader's turn: clears the leader flag, frees its slot and wakes a waiting
/// call to lead next.
struct Abdicate<'a> {
    conn: &'a Conn,
    ticket: Ticket,
}

impl Drop for Abdicate<'_> {
    fn drop(&mut self) {
        let mut t = lock(&self.conn.table);
        t.leader = false;
        free(&mut t, self.ticket);
        wake_next(&t);
    }
}

/// A response handed to its owner, being parsed: on drop, the slot's buffers are
/// put back and the slot freed.
struct HandBack<'a> {
    conn: &'a Conn,
    ticket: Ticket,
    delivery: Option<Box<Delivery>>,
}

impl Drop for HandBack<'_> {
    fn drop(&mut self) {
        let mut t = lock(&self.conn.table);
        t.slots[self.ticket.slot].parse = self.delivery.take();
        free(&mut t, self.ticket);
    }
}

/// Frees `ticket`'s slot if it still belongs to it. A subscribe call given up before
/// its answer (still `Waiting`) is remembered as an orphan.
fn free(t: &mut Table, ticket: Ticket) {
    let Some(s) = t.slots.get_mut(ticket.slot) else {
        return;
    };
    if s.ids.start == ticket.id {
        let unanswered = s.state == State::Waiting;
        s.ids = 0..0;
        s.state = State::Free;
        if let (true, Some(method)) = (unanswered, s.unsubscribe.take()) {
            if t.failed.is_none() {
                if t.orphans.len() == MAX_ORPHANS {
                    t.orphans.pop_front();
                }
                t.orphans.push_back((ticket.id, method));
            }
        }
    }
}

/// A late answer to issued id `id`: if it is an orphaned subscribe call's and opened a
/// subscription, that subscription's unsubscribe is queued.
fn orphan_answered(t: &mut Table, id: u64, root: &[Node<'_>]) -> Route {
    let Some(i) = t.orphans.iter().position(|(o, _)| *o == id) else {
        return Route::Ignored;
    };
    let Some((_, method)) = t.orphans.remove(i) else {
        return Route::Ignored;
    };
    // An id already open here is another caller's subscription (the server answered a
    // taken id): not closed on this one's behalf.
    let Some(sub) = opened_sub(t, root) else {
        return Route::Ignored;
    };
    t.unsubs.push((sub, method));
    Route::Orphaned
}

/// The subscription a subscribe call's answer (`root`) opens: its result, if a string
/// or a number and not already an open subscription's id on this connection.
fn opened_sub(t: &Table, root: &[Node<'_>]) -> Option<SubId> {
    let Body::Result(value) = validate_response(root).ok()?.body else {
        return None;
    };
    SubId::of(value.first()).filter(|id| !t.subs.iter().any(|s| s.id == *id))
}

/// Wakes one call blocked in `wait` so that it becomes the leader. A call registered
/// but not waiting yet needs no wake-up: it finds no leader when it comes to wait.
fn wake_next(t: &Table) {
    if let Some(s) = t
        .slots
        .iter()
        .find(|s| s.state == State::Waiting && s.parked)
    {
        s.cv.notify_one();
    } else if let Some(s) = t.subs.iter().find(|s| s.parked) {
        s.cv.notify_one();
    }
}

/// Leads for a subscription's owner: a ticket of no slot.
const NO_TICKET: Ticket = Ticket {
    slot: usize::MAX,
    id: 0,
};

/// Registers the subscription a subscribe call's answer (`root`) opened ([`opened_sub`]).
fn register_sub(t: &mut Table, root: &[Node<'_>]) {
    let Some(id) = opened_sub(t, root) else {
        return;
    };
    t.next_token += 1;
    let token = t.next_token;
    t.subs.push(Sub {
        id,
        token,
        claimed: false,
        items: VecDeque::new(),
        missed: 0,
        end: None,
        parked: false,
        cv: Arc::new(Condvar::new()),
    });
}

/// A server's notification (an object with a `method` and no `id`): `Some(Some(_))`
/// for one of a subscription (params holding `subscription` and one of `result`,
/// `lagged`, `error` or `closed`), `Some(None)` for any other (ignored). `None` for
/// what is not a notification (responses).
#[allow(clippy::option_option)]
pub(crate) fn notification<'a>(raw: RawCtx<'a>) -> Option<Option<(&'a Node<'a>, Note<'a>)>> {
    let root = raw.root;
    if !matches!(root.first(), Some(Node::Object { .. })) {
        return None;
    }
    let (mut method, mut params) = (false, None);
    for m in members(root) {
        match m.ok()? {
            ("id", _) => return None,
            ("method", [Node::String(_)]) => method = true,
            ("params", value @ [Node::Object { .. }, ..]) => params = Some(value),
            _ => {}
        }
    }
    if !method {
        return None;
    }
    Some(params.and_then(|p| subscription_note(raw, p)))
}

/// What a notification's params object says of a subscription.
fn subscription_note<'a>(
    raw: RawCtx<'a>,
    params: &'a [Node<'a>],
) -> Option<(&'a Node<'a>, Note<'a>)> {
    let (mut sub, mut note) = (None, None);
    for m in members(params) {
        match m.ok()? {
            ("subscription", [id @ (Node::String(_) | Node::Static(_))]) => sub = Some(id),
            ("result", value @ [_, ..]) => note = Some(Note::Result(value)),
            ("lagged", [Node::Static(StaticNode::U64(n))]) => note = Some(Note::Lagged(*n)),
            ("lagged", [Node::Static(StaticNode::I64(n))]) if *n >= 0 => {
                note = Some(Note::Lagged(n.unsigned_abs()));
            }
            ("error", value @ [_, ..]) => {
                note = Some(Note::Error(match error_object(value) {
                    Ok(Body::Error {
                        code,
                        message,
                        data,
                    }) => server_error(raw, code, message, data),
                    _ => Error::Protocol(Violation::BadErrorObject),
                }));
            }
            ("closed", [Node::Static(StaticNode::Bool(true))]) => note = Some(Note::Closed),
            _ => {}
        }
    }
    Some((sub?, note?))
}

/// The id a reply frame is routed by: a response's id, or a batch's first integer id.
/// `None` when there are only `null` ids (id-less errors).
pub(crate) fn frame_id(root: &[Node<'_>]) -> Result<Option<u64>, Failure> {
    let bad = |v| Err(Failure::Protocol(v));
    match root.first() {
        Some(Node::Object { .. }) => match validate_response(root) {
            Ok(r) => match r.id {
                Id::UInt(u) => Ok(Some(u)),
                Id::Null => Ok(None),
                _ => bad(Violation::UnknownId),
            },
            Err(v) => bad(v),
        },
        Some(&Node::Array { len, .. }) if len > 0 => {
            let mut found = None;
            for elem in elements(root) {
                // Elements are checked one by one by the batch's owner.
                if let Ok(r) = validate_response(elem) {
                    match r.id {
                        Id::UInt(u) => {
                            found = Some(u);
                            break;
                        }
                        Id::Null => {}
                        _ => return bad(Violation::UnknownId),
                    }
                }
            }
            Ok(found)
        }
        _ => bad(Violation::NotAResponse),
    }
}

/// Whether an HTTP error status's body is JSON-RPC error answers: one error object, or
/// a batch of them. Anything else (a proxy's HTML page, a result) leaves the status as
/// the call's error.
#[cold]
fn error_answer(scratch: &mut Scratch, body: &[u8]) -> bool {
    let is_error = |node: &[Node<'_>]| {
        validate_response(node).is_ok_and(|r| matches!(r.body, Body::Error { .. }))
    };
    scratch.parse(body, |raw| match raw {
        Ok(raw) => match raw.root.first() {
            Some(Node::Object { .. }) => is_error(raw.root),
            Some(&Node::Array { len, .. }) if len > 0 => elements(raw.root).all(is_error),
            _ => false,
        },
        Err(_) => false,
    })
}

/// Connects over TCP to `host:port`, trying each resolved address.
/// A random 64-bit seed (std's hasher keys are drawn from the OS, fresh per process and
/// different per `RandomState`).
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9e37_79b9_7f4a_7c15);
    h.finish() | 1
}

/// The next masking key (xorshift64*: unpredictable enough to keep caches and
/// intermediaries from seeing the payload's bytes, which is what masking is for).
fn next_mask(state: &mut u64) -> [u8; 4] {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
    [
        (v >> 32) as u8,
        (v >> 40) as u8,
        (v >> 48) as u8,
        (v >> 56) as u8,
    ]
}

/// The WebSocket opening handshake on `s` (blocking, within `timeout`): checks the
/// `101` and its `Sec-WebSocket-Accept`; returns any bytes read past the answer's head.
fn ws_handshake(
    s: &mut TcpStream,
    authority: &str,
    path: &str,
    opts: &Options,
    timeout: Duration,
) -> Result<BytesMut, Error> {
    use base64::Engine as _;
    use std::io::Read;
    let refused = |why| Error::Protocol(Violation::WebSocket(why));
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&seed().to_le_bytes());
    raw[8..].copy_from_slice(&seed().to_le_bytes());
    let key = base64::engine::general_purpose::STANDARD.encode(raw);
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    );
    if let Some(token) = &opts.token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    s.set_read_timeout(Some(timeout)).map_err(Error::Connect)?;
    s.set_write_timeout(Some(timeout)).map_err(Error::Connect)?;
    s.write_all(request.as_bytes()).map_err(Error::Connect)?;
    let mut got = BytesMut::with_capacity(1024);
    let end = loop {
        if let Some(i) = memchr::memmem::find(&got, b"\r\n\r\n") {
            break i + 4;
        }
        if got.len() > 16 * 1024 {
            return Err(refused("the handshake's answer is too long"));
        }
        let mut chunk = [0u8; 1024];
        match s.read(&mut chunk) {
            Ok(0) => return Err(refused("the server closed during the handshake")),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) => return Err(Error::ConnectTimeout),
            Err(e) => return Err(Error::Connect(e)),
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    if !matches!(resp.parse(&got[..end]), Ok(httparse::Status::Complete(_))) {
        return Err(refused("a malformed handshake answer"));
    }
    if resp.code != Some(101) {
        return Err(Error::Protocol(Violation::HttpStatus(
            resp.code.unwrap_or(0),
        )));
    }
    let accept = websocket::accept_value(key.as_bytes());
    let accepted = resp
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("sec-websocket-accept") && h.value == accept);
    if !accepted {
        return Err(refused("a wrong Sec-WebSocket-Accept"));
    }
    s.set_read_timeout(None).map_err(Error::Connect)?;
    let _ = got.split_to(end);
    Ok(got)
}

fn tcp(host_port: &str, timeout: Duration) -> Result<TcpStream, Error> {
    let addrs = host_port.to_socket_addrs().map_err(Error::Connect)?;
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                // Requests are small and latency is the point: no Nagle delay.
                s.set_nodelay(true).map_err(Error::Connect)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if is_timeout(&e) => Error::ConnectTimeout,
        Some(e) => Error::Connect(e),
        None => Error::Connect(io::Error::new(
            io::ErrorKind::NotFound,
            "the host name resolved to no address",
        )),
    })
}
