//! A blocking JSON-RPC 2.0 client: TCP, Unix sockets or HTTP/1.1 keep-alive, one API;
//! calls pipelined from many threads on one connection; batches; timeouts; retries of
//! idempotent calls with the same id.
//!
//! The client shares the server's JSON machinery: requests are written by the
//! serializer (string escaping, itoa, serde for params), and responses are parsed in
//! place by simd-json into a reused [`Scratch`](crate::Scratch)-style tape and read with
//! the same serde `Deserializer` that handlers' params use, so `&str` results borrow
//! the response (see [`Client::call_with`]).
//!
//! **Threads.** A [`Client`] is `Send + Sync`: share it by reference or in an `Arc`.
//! Calls from several threads are pipelined on its one connection and matched by id.
//! Whichever waiting caller finds no one reading becomes the reader (the *leader*) and
//! hands other callers' responses to them, so a lone caller never waits for another
//! thread to wake it. [`Client::start`] pipelines from one thread.
//!
//! **Failures.** Every failure is an [`Error`] variant. A dropped connection fails the
//! calls in flight ([`Error::Closed`]) and the next call reconnects. Calls made with
//! [`Client::call_idempotent`] are retried under [`Options::retry`], resending the same
//! id (and over HTTP the same `Idempotency-Key`) so a server can de-duplicate; a
//! `-32042 In progress` answer (the first attempt still runs) is waited out.
//!
//! **Authentication.** With [`Options::token`], HTTP requests carry
//! `Authorization: Bearer TOKEN`, and on TCP and Unix sockets every new connection
//! (reconnects included) is authenticated with an `rpc.auth` call before any other call
//! is written on it. A refused token is the server's error, [`Error::Server`] with code
//! `-32040`.
//!
//! ```
//! use ringrpc::client::{Client, Error};
//! use ringrpc::{demo, server::Server, Config};
//!
//! // A server to talk to (any JSON-RPC 2.0 server will do).
//! let mut server = Server::new(demo::engine(Config::default()))?;
//! let addr = server.listen_tcp("127.0.0.1:0")?;
//! let stop = server.handle();
//! let running = std::thread::spawn(move || server.run());
//!
//! let client = Client::connect(&format!("tcp://{addr}"))?;
//! let sum: i64 = client.call("add", [2, 3])?;
//! assert_eq!(sum, 5);
//! client.notify("update", [1, 2, 3])?;
//! match client.call::<i64, _>("foobar", ()) {
//!     Err(Error::Server(e)) => assert_eq!(e.code, -32601),
//!     other => panic!("{other:?}"),
//! }
//!
//! let mut batch = client.batch();
//! let a = batch.call("subtract", [42, 23])?;
//! batch.notify("notify_hello", [7])?;
//! let b = batch.call("get_data", ())?;
//! let mut replies = batch.send()?;
//! assert_eq!(replies.get::<i64>(a)?, 19);
//! assert_eq!(replies.get::<(String, i64)>(b)?, ("hello".to_owned(), 5));
//!
//! stop.shutdown();
//! running.join().unwrap()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod address;
mod batch;
mod conn;
mod error;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
pub(crate) mod http;
mod subscription;

pub use batch::{Batch, BatchKey, BatchReply};
pub use error::{Error, ServerError, Violation};
pub use subscription::{Notification, Subscription};

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use simd_json::Node;

use crate::codec::de::TapeDe;
use crate::codec::raw::RawCtx;
use crate::codec::response::{validate_response, Body};
use crate::codec::Id;
use crate::config::defaults;
use crate::serializer::request::{insert_meta, write_request};
use address::Address;
use conn::{Carry, Conn, SendError, Ticket, WriteRequest};

/// Connection and call settings, with chainable setters.
///
/// `Debug` does not show the token (only whether one is set).
#[derive(Clone)]
pub struct Options {
    connect_timeout: Duration,
    timeout: Duration,
    retry: Retry,
    max_response_bytes: usize,
    max_depth: usize,
    token: Option<String>,
    send_deadline: bool,
    subscription_queue: usize,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: `{:?}` of options (or of a client) ends up in logs.
        f.debug_struct("Options")
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("max_depth", &self.max_depth)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("send_deadline", &self.send_deadline)
            .field("subscription_queue", &self.subscription_queue)
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            retry: Retry::default(),
            max_response_bytes: defaults::DEFAULT_MAX_RESPONSE_BYTES,
            max_depth: defaults::DEFAULT_MAX_DEPTH,
            token: None,
            send_deadline: true,
            subscription_queue: 1024,
        }
    }
}

impl Options {
    /// How long connecting may take (default 5 s); past it, [`Error::ConnectTimeout`].
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t.max(Duration::from_millis(1));
        self
    }

    /// Each call's deadline, counted from when the call starts (default 30 s). It bounds
    /// the whole call: waiting for another caller's write or reconnect, reconnecting
    /// (with the connect timeout, whichever ends first), writing and reading. Past it,
    /// [`Error::ConnectTimeout`], [`Error::WriteTimeout`] or [`Error::ReadTimeout`]. Each
    /// retry of [`Client::call_idempotent`] has a deadline of its own.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t.max(Duration::from_millis(1));
        self
    }

    /// How [`Client::call_idempotent`] retries.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The largest response accepted (default 8 MiB); a larger one is a protocol
    /// violation and the connection is dropped. Over HTTP this bounds the body; a
    /// chunked body's framing (chunk sizes, extensions, trailers) may take as much
    /// again, plus 16 KiB.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// The deepest nesting accepted in a response (default 64).
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth;
        self
    }

    /// Authenticates with `token` (a key's token or a JWT). Over HTTP every request
    /// carries `Authorization: Bearer TOKEN` (so the token must be visible ASCII, else
    /// [`Error::Token`] at connect). On TCP and Unix sockets each new connection,
    /// reconnects included, first calls `rpc.auth` with `{"token": TOKEN}` and is used
    /// only once that succeeded, within the connect timeout; a server that refuses the
    /// token (or does not authenticate at all) fails the connect, or the call that
    /// reconnected, with its error ([`Error::Server`], code `-32040`, or `-32601`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Notifications kept per [`Subscription`] while its owner does not take them
    /// (default 1024, at least 1): past it the oldest are dropped, and the next one
    /// delivered counts them ([`Notification::missed_before`]). Memory stays bounded
    /// while other callers read the connection and a subscription's owner does not.
    pub fn subscription_queue(mut self, n: usize) -> Self {
        self.subscription_queue = n.max(1);
        self
    }

    /// Whether calls tell the server how long the client will wait for them (default
    /// on), so that it does not start work whose answer nobody will read and times the
    /// call out when the client would. Every call and batch carries the time left when
    /// it is written, in whole milliseconds: over HTTP as the `RPC-Timeout-Ms` header,
    /// on TCP and Unix sockets as `"_meta": {"timeoutMs": N}`, added as the first member
    /// of params that are an object. Params that are an array or absent, or an object
    /// that holds `"_meta"` already, are sent unchanged (no budget): adding an object
    /// where a method takes none, or a second `_meta`, could break the call.
    /// Notifications carry none (nobody waits for them).
    ///
    /// The time left is that of the call's [`Options::timeout`]; for
    /// [`Client::call_idempotent`] it is that of the whole call, retries included (a
    /// retry can still take the first attempt's answer from a de-duplicating server):
    /// `max_elapsed` of [`Options::retry`] plus the timeout, from the first attempt, so
    /// it shrinks with every retry. See docs/PROTOCOL.md, "Deadlines".
    pub fn send_deadline(mut self, on: bool) -> Self {
        self.send_deadline = on;
        self
    }
}

/// Retries for idempotent calls: exponential backoff with jitter, capped in attempts
/// and in total time.
///
/// The n-th retry waits a random time between half and all of
/// `min(max_backoff, initial_backoff · 2ⁿ⁻¹)` ("equal jitter": many clients failing
/// together do not retry together). No retry starts once `max_elapsed` would be passed.
/// Only transient errors are retried ([`Error::is_transient`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    max_elapsed: Duration,
}

impl Default for Retry {
    /// 4 attempts, backoff from 10 ms up to 1 s, 10 s in all.
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
            max_elapsed: Duration::from_secs(10),
        }
    }
}

impl Retry {
    /// At most `n` attempts in all (1: no retry).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// The backoff before the first retry, doubled for each further one.
    pub fn initial_backoff(mut self, t: Duration) -> Self {
        self.initial_backoff = t;
        self
    }

    /// The longest backoff.
    pub fn max_backoff(mut self, t: Duration) -> Self {
        self.max_backoff = t;
        self
    }

    /// The time from the first attempt after which no retry is started. It also bounds
    /// the waits for a call the server reports still running (`-32042`).
    pub fn max_elapsed(mut self, t: Duration) -> Self {
        self.max_elapsed = t;
        self
    }

    /// The pause before retry number `retry` (1-based), jittered by `random`.
    fn backoff(&self, retry: u32, random: u64) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << (retry - 1).min(20));
        let cap = exp.min(self.max_backoff).as_nanos() as u64;
        Duration::from_nanos(cap / 2 + random % (cap / 2 + 1))
    }
}

/// A call's result, borrowed from the response (see [`Client::call_with`]).
#[derive(Clone, Copy, Debug)]
pub struct Reply<'a> {
    pub(crate) nodes: &'a [Node<'a>],
    pub(crate) raw: RawCtx<'a>,
}

impl<'a> Reply<'a> {
    /// Deserializes the result; `&'a str` fields borrow the response.
    ///
    /// # Errors
    ///
    /// [`Error::Decode`] with serde's account of what does not fit.
    pub fn parse<T: Deserialize<'a>>(&self) -> Result<T, Error> {
        T::deserialize(TapeDe::new(self.nodes)).map_err(|e| Error::Decode(e.to_string()))
    }

    /// The result as JSON text: the server's own bytes for an array or object,
    /// re-encoded for a scalar (strings with their escapes decoded and re-applied).
    pub fn raw_json(&self) -> Cow<'a, [u8]> {
        json_text(self.raw, self.nodes)
    }
}

/// A value's JSON text: its original bytes when it is a container, else re-encoded.
fn json_text<'a>(raw: RawCtx<'a>, nodes: &'a [Node<'a>]) -> Cow<'a, [u8]> {
    match raw.container_text(nodes) {
        Some(text) => Cow::Borrowed(text),
        None => {
            let mut out = Vec::new();
            crate::serializer::json::write_value(&mut out, nodes);
            Cow::Owned(out)
        }
    }
}

/// The error object of a response, owned.
#[cold]
pub(crate) fn server_error<'a>(
    raw: RawCtx<'a>,
    code: i32,
    message: &str,
    data: Option<&'a [Node<'a>]>,
) -> Error {
    let data = data.map(|d| String::from_utf8_lossy(&json_text(raw, d)).into_owned());
    Error::Server(ServerError {
        code,
        message: message.to_owned(),
        data,
    })
}

/// How a client names its requests: ids counted from a random start, and the prefix of
/// its `Idempotency-Key`s. Shared with its connections, which route by id.
#[derive(Debug)]
pub(crate) struct Numbering {
    /// The next id: ids at or above it were never sent.
    next: AtomicU64,
    /// The first id: ids below it were never sent by this client either.
    first: u64,
    /// 16 random hex digits: `Idempotency-Key: <prefix>-<id>`.
    key_prefix: [u8; 16],
}

/// The lowest first id (2³²) and the bound on first ids (2⁵²): a start drawn between
/// them leaves 2⁵² calls before ids pass 2⁵³, the largest integer a double holds
/// exactly, so servers that read ids as doubles echo them unchanged.
const FIRST_ID_MIN: u64 = 1 << 32;
const FIRST_ID_END: u64 = 1 << 52;

impl Numbering {
    fn new() -> Self {
        let first = FIRST_ID_MIN + random_u64() % (FIRST_ID_END - FIRST_ID_MIN);
        let mut key_prefix = [0u8; 16];
        let r = random_u64();
        for (i, b) in key_prefix.iter_mut().enumerate() {
            *b = b"0123456789abcdef"[(r >> (60 - 4 * i)) as usize & 0xf];
        }
        Self {
            next: AtomicU64::new(first),
            first,
            key_prefix,
        }
    }

    /// Takes `n` fresh ids; returns the first.
    pub(crate) fn take(&self, n: u64) -> u64 {
        self.next.fetch_add(n, Ordering::Relaxed)
    }

    /// Whether `id` was handed out by this client (so an answer to it is expected or
    /// late, not foreign).
    pub(crate) fn issued(&self, id: u64) -> bool {
        (self.first..self.next.load(Ordering::Acquire)).contains(&id)
    }

    /// The `Idempotency-Key` prefix (ASCII hex).
    pub(crate) fn key_prefix(&self) -> &[u8] {
        &self.key_prefix
    }
}

/// 64 random bits from std alone: a new `RandomState` (keyed from the OS's randomness
/// once per thread, then stepped for each new one) hashing the time, the process id and
/// a process-wide counter, so two clients differ within a process and across processes.
fn random_u64() -> u64 {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// Connects and, with a token on TCP or a Unix socket, authenticates: the connection
/// is handed out only once `rpc.auth` succeeded on it. Both end at `deadline`.
fn open(
    address: &Address,
    options: &Options,
    numbering: &Arc<Numbering>,
    deadline: Instant,
) -> Result<Conn, Error> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::ConnectTimeout);
    }
    let conn = Conn::connect(address, options, left, Arc::clone(numbering))?;
    // HTTP sends the token with every request instead.
    if let (Some(token), Address::Tcp(_) | Address::Unix(_)) = (&options.token, address) {
        authenticate(&conn, numbering, token, deadline)?;
    }
    Ok(conn)
}

/// Calls `rpc.auth` on a fresh connection and waits for its answer. Running out of time
/// is a connect timeout: the connection was never usable.
#[cold]
fn authenticate(
    conn: &Conn,
    numbering: &Numbering,
    token: &str,
    deadline: Instant,
) -> Result<(), Error> {
    #[derive(Serialize)]
    struct Auth<'a> {
        token: &'a str,
    }
    let as_connect = |e: Error| match e {
        Error::WriteTimeout | Error::ReadTimeout => Error::ConnectTimeout,
        e => e,
    };
    let id = numbering.take(1);
    let params = Auth { token };
    // No budget: authenticating is part of connecting, not a call of the caller's.
    let mut write = |buf: &mut Vec<u8>, _: Option<u64>| {
        encode(write_request(buf, Some(Id::UInt(id)), "rpc.auth", &params)).map(drop)
    };
    let ticket = match conn.send(id..id + 1, true, Carry::default(), deadline, &mut write) {
        Ok(Some(ticket)) => ticket,
        Ok(None) => return Err(Error::Protocol(Violation::MissingResponse)),
        Err(SendError::Dead(e) | SendError::Failed(e)) => return Err(as_connect(e)),
    };
    // Any result will do: the server answers `{"identity": NAME}`, or an error.
    let mut f = Some(|_: Reply<'_>| Ok(()));
    wait_single(conn, ticket, id, deadline, &mut f).map_err(as_connect)
}

/// Reads the reply to the single call `id`.
fn single_reply<T>(
    raw: RawCtx<'_>,
    id: u64,
    f: impl FnOnce(Reply<'_>) -> Result<T, Error>,
) -> Result<T, Error> {
    let r = match raw.root.first() {
        Some(Node::Object { .. }) => validate_response(raw.root).map_err(Error::Protocol)?,
        _ => return Err(Error::Protocol(Violation::Mismatched)),
    };
    match (r.id, r.body) {
        (Id::UInt(u), Body::Result(nodes)) if u == id => f(Reply { nodes, raw }),
        (
            Id::UInt(_) | Id::Null,
            Body::Error {
                code,
                message,
                data,
            },
        ) => Err(server_error(raw, code, message, data)),
        _ => Err(Error::Protocol(Violation::Mismatched)),
    }
}

/// A JSON-RPC 2.0 client on one connection; see the [module docs](self).
///
/// Cost per call in steady state: one write and (for a lone caller) one read system
/// call, one parse of the response, no heap allocation for plain or borrowed params
/// and results.
///
/// **Ids.** A client numbers its calls from a random start between 2³² and 2⁵², one
/// more for each call, and never sends an id twice except on purpose (a retry of
/// [`Client::call_idempotent`]). A server that de-duplicates by (identity, id) then
/// does not take one process's call for a retry of another's when both authenticate as
/// the same identity, as it would if both counted from 1. The limit: starts are random,
/// not coordinated, so two clients making `n` calls each send a common id with a
/// probability of about `2n / 2⁵²` (one in 2 million for a billion calls each), for
/// each pair of clients; it matters only when both are the same identity and the
/// common id is reused within the server's de-duplication TTL. Ids stay integers below
/// 2⁵³, which servers that read ids as doubles echo exactly. Over HTTP an idempotent
/// call also sends `Idempotency-Key: <16 random hex digits of this client>-<id>`.
pub struct Client {
    address: Address,
    options: Options,
    link: Mutex<Link>,
    /// Notified when a connection attempt ends.
    connected: Condvar,
    /// The ids: they only grow, so one is never reused on any connection of this
    /// client (except on purpose, by a retry).
    ids: Arc<Numbering>,
}

/// The client's connection, and whether a caller is making a new one.
struct Link {
    conn: Option<Arc<Conn>>,
    /// A caller is connecting, without holding the lock: others wait on `connected`,
    /// each only until its own deadline.
    connecting: bool,
}

/// Clears `Link::connecting` however the connect attempt ends.
struct Connecting<'a>(&'a Client);

impl Drop for Connecting<'_> {
    fn drop(&mut self) {
        lock(&self.0.link).connecting = false;
        self.0.connected.notify_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.address)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to `url` (`tcp://host:port`, `unix:///path`, `http://host[:port][/path]`
    /// or `ws://host[:port][/path]`) with default [`Options`]. Over WebSocket, a token
    /// goes as `Authorization: Bearer` on the handshake. Notifications a server pushes
    /// are read as [`Client::subscribe`]'s; others are ignored.
    ///
    /// # Errors
    ///
    /// [`Error::Address`], [`Error::ConnectTimeout`] or [`Error::Connect`]; with a
    /// token ([`Options::token`]), [`Error::Token`], or on TCP and Unix sockets the
    /// server's refusal of it ([`Error::Server`]).
    pub fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, Options::default())
    }

    /// Connects to `url` with `options`.
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub fn connect_with(url: &str, options: Options) -> Result<Self, Error> {
        let address = Address::parse(url)?;
        if let (Address::Http { .. } | Address::Ws { .. }, Some(token)) = (&address, &options.token)
        {
            check_header_token(token)?;
        }
        let ids = Arc::new(Numbering::new());
        let deadline = Instant::now() + options.connect_timeout;
        let conn = open(&address, &options, &ids, deadline)?;
        Ok(Self {
            address,
            options,
            link: Mutex::new(Link {
                conn: Some(Arc::new(conn)),
                connecting: false,
            }),
            connected: Condvar::new(),
            ids,
        })
    }

    /// The live connection, reconnecting if the last one failed; waiting for another
    /// caller's reconnect, or connecting, ends at `deadline` (`Error::ConnectTimeout`).
    fn conn(&self, deadline: Instant) -> Result<Arc<Conn>, Error> {
        let mut link = lock(&self.link);
        loop {
            if let Some(conn) = link.conn.as_ref().filter(|c| !c.is_dead()) {
                return Ok(Arc::clone(conn));
            }
            if !link.connecting {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::ConnectTimeout);
            }
            link = self
                .connected
                .wait_timeout(link, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        link.conn = None;
        link.connecting = true;
        drop(link);
        let connecting = Connecting(self);
        let deadline = deadline.min(Instant::now() + self.options.connect_timeout);
        let conn = Arc::new(open(&self.address, &self.options, &self.ids, deadline)?);
        lock(&self.link).conn = Some(Arc::clone(&conn));
        drop(connecting);
        Ok(conn)
    }

    /// Takes `n` fresh ids.
    fn next_ids(&self, n: u64) -> u64 {
        self.ids.take(n)
    }

    /// Calls `method` and deserializes its result. `params` must serialize to an array
    /// or an object, or to `null` (`()`, `None`) for none. Not retried.
    ///
    /// # Errors
    ///
    /// [`Error::Server`] with the server's error object; the transport, protocol and
    /// type errors of [`Error`].
    pub fn call<R: DeserializeOwned, P: Serialize>(
        &self,
        method: &str,
        params: P,
    ) -> Result<R, Error> {
        self.run(method, &params, false, |r| r.parse())
    }

    /// Like [`Client::call`], for a call that is safe to repeat: transient failures are
    /// retried under [`Options::retry`], reconnecting if needed and resending the same
    /// id; over HTTP every attempt carries the same `Idempotency-Key`. A `-32042 In
    /// progress` answer (a de-duplicating server still runs the first attempt) is
    /// waited out: the call is resent after the answer's `retryAfterMs` (at least 1 ms,
    /// at most what is left of [`Retry::max_elapsed`]); such resends do not count as
    /// attempts, since nothing ran again (with `max_attempts(1)` nothing is resent).
    ///
    /// # Errors
    ///
    /// The last attempt's error.
    pub fn call_idempotent<R: DeserializeOwned, P: Serialize>(
        &self,
        method: &str,
        params: P,
    ) -> Result<R, Error> {
        self.run(method, &params, true, |r| r.parse())
    }

    /// Calls `method` and hands the result, borrowed from the response, to `f`: for
    /// `&str` results or raw JSON ([`Reply::raw_json`]) without a copy. Not retried.
    ///
    /// # Errors
    ///
    /// As [`Client::call`], and whatever `f` returns.
    pub fn call_with<P: Serialize, T>(
        &self,
        method: &str,
        params: P,
        f: impl FnOnce(Reply<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.run(method, &params, false, f)
    }

    /// Sends a notification: no id, no answer, so success means only that it was
    /// written.
    ///
    /// # Errors
    ///
    /// Transport errors and [`Error::Encode`].
    pub fn notify<P: Serialize>(&self, method: &str, params: P) -> Result<(), Error> {
        let deadline = Instant::now() + self.options.timeout;
        let mut write =
            |buf: &mut Vec<u8>, _: Option<u64>| write_call(buf, None, method, &params, None);
        self.send(0..0, false, Carry::default(), deadline, &mut write)
            .map(|_| ())
    }

    /// Sends a call without waiting for its answer, for pipelining from one thread:
    /// start several, then [`Pending::wait`] for each (in any order). The call's
    /// deadline runs from now.
    ///
    /// # Errors
    ///
    /// Transport errors and [`Error::Encode`].
    pub fn start<P: Serialize>(&self, method: &str, params: P) -> Result<Pending<'_>, Error> {
        let id = self.next_ids(1);
        let deadline = Instant::now() + self.options.timeout;
        let mut write = |buf: &mut Vec<u8>, meta: Option<u64>| {
            write_call(buf, Some(Id::UInt(id)), method, &params, meta)
        };
        let (conn, ticket) =
            self.send(id..id + 1, true, self.carry(deadline), deadline, &mut write)?;
        Ok(Pending {
            conn,
            ticket,
            id,
            deadline,
            _client: PhantomData,
        })
    }

    /// Calls the subscription method `method` and returns the subscription it opened:
    /// an iterator of the notifications the server pushes for it
    /// (`{"method":…,"params":{"subscription":ID,"result":…}}`, the convention of
    /// ringrpc, geth and jsonrpsee). `unsubscribe` is the method that ends it, called
    /// with `[ID]` when the subscription is dropped or
    /// [`Subscription::unsubscribe`]d. Needs a connection the server can push on:
    /// `tcp://`, `unix://` or `ws://`. Not retried. If the call times out, the
    /// subscription its late answer opens is unsubscribed as soon as that answer is
    /// read (by any later call or subscription on the connection).
    ///
    /// ```
    /// use ringrpc::client::Client;
    /// use ringrpc::{demo, server::Server, Config};
    ///
    /// let mut server = Server::new(demo::engine(Config::default()))?;
    /// let addr = server.listen_tcp("127.0.0.1:0")?;
    /// let stop = server.handle();
    /// let running = std::thread::spawn(move || server.run());
    ///
    /// let client = Client::connect(&format!("tcp://{addr}"))?;
    /// let ticks = client.subscribe("subscribe_ticks", [1], "unsubscribe_ticks")?;
    /// let counts: Vec<u64> = ticks.take(3).map(|n| n?.parse()).collect::<Result<_, _>>()?;
    /// assert_eq!(counts, [0, 1, 2]); // the demo counts from 0
    /// // Dropped: unsubscribed.
    ///
    /// stop.shutdown();
    /// running.join().unwrap()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::PushUnsupported`] for an `http://` client; as [`Client::call`]
    /// otherwise; [`Error::Decode`] if the answer is not a subscription id (a string or
    /// a number), [`Error::Protocol`] if it is one already open on the connection.
    pub fn subscribe<P: Serialize>(
        &self,
        method: &str,
        params: P,
        unsubscribe: &str,
    ) -> Result<Subscription<'_>, Error> {
        if let Address::Http { .. } = self.address {
            return Err(Error::PushUnsupported);
        }
        let id = self.next_ids(1);
        let deadline = Instant::now() + self.options.timeout;
        let mut write = |buf: &mut Vec<u8>, meta: Option<u64>| {
            write_call(buf, Some(Id::UInt(id)), method, &params, meta)
        };
        let carry = Carry {
            subscribe: true,
            ..self.carry(deadline)
        };
        let (conn, ticket) = self.send(id..id + 1, true, carry, deadline, &mut write)?;
        let Some(ticket) = ticket else {
            return Err(Error::Protocol(Violation::MissingResponse));
        };
        // Given up before the answer comes (a timeout), the subscription it opens is
        // closed when that answer is read: the server does not push for nothing.
        conn.unsubscribe_if_given_up(ticket, unsubscribe);
        let mut f = Some(|r: Reply<'_>| {
            subscription::SubId::of(r.nodes.first()).ok_or_else(|| {
                Error::Decode("the subscription id is neither a string nor a number".into())
            })
        });
        let sub = wait_single(&conn, ticket, id, deadline, &mut f)?;
        let Some(token) = conn.claim(&sub) else {
            return Err(Error::Protocol(Violation::SubscriptionInUse));
        };
        Ok(Subscription::new(self, conn, token, sub, unsubscribe))
    }

    /// A batch builder: calls and notifications sent together as one JSON array.
    pub fn batch(&self) -> Batch<'_> {
        Batch::new(self)
    }

    /// What a call that ends at `until` carries: its budget, unless turned off
    /// ([`Options::send_deadline`]).
    pub(crate) fn carry(&self, until: Instant) -> Carry {
        Carry {
            idempotent: false,
            until: self.options.send_deadline.then_some(until),
            subscribe: false,
        }
    }

    /// Sends on the live connection; a connection found dead before anything was
    /// written is replaced once. Every wait (for a reconnect, the writer, the write)
    /// ends at `deadline`, the call's one deadline. `carry`: the `Idempotency-Key` and
    /// the budget (see [`Conn::send`]).
    pub(crate) fn send(
        &self,
        ids: std::ops::Range<u64>,
        reply: bool,
        carry: Carry,
        deadline: Instant,
        write: &mut WriteRequest<'_>,
    ) -> Result<(Arc<Conn>, Option<Ticket>), Error> {
        let mut reconnected = false;
        loop {
            let conn = self.conn(deadline)?;
            match conn.send(ids.clone(), reply, carry, deadline, write) {
                Ok(t) => return Ok((conn, t)),
                Err(SendError::Dead(_)) if !reconnected => reconnected = true,
                Err(SendError::Dead(e) | SendError::Failed(e)) => return Err(e),
            }
        }
    }

    /// One call, with retries if `idempotent`.
    fn run<P: Serialize + ?Sized, T>(
        &self,
        method: &str,
        params: &P,
        idempotent: bool,
        f: impl FnOnce(Reply<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let id = self.next_ids(1);
        let started = Instant::now();
        // A retried call's answer may come to any of its attempts (a de-duplicating
        // server replays it), so the budget is the whole call's: the last retry starts
        // by `max_elapsed` and waits a timeout.
        let retry = &self.options.retry;
        let until = (idempotent && retry.max_attempts > 1)
            .then(|| started + retry.max_elapsed + self.options.timeout);
        let mut f = Some(f);
        let mut attempt = 1;
        let mut random = 0;
        loop {
            let r = self.attempt(id, method, params, idempotent, until, &mut f);
            let e = match r {
                Err(e) if idempotent && retry.max_attempts > 1 => e,
                r => return r,
            };
            let elapsed = started.elapsed();
            let pause = if let Some(wait) = in_progress(&e) {
                // The first attempt still runs: ask again when the server suggests,
                // within the time left. Nothing ran again, so no attempt is spent.
                let left = retry.max_elapsed.saturating_sub(elapsed);
                if left.is_zero() {
                    return Err(e);
                }
                wait.unwrap_or(retry.initial_backoff)
                    .min(left)
                    .max(Duration::from_millis(1))
            } else if e.is_transient() && attempt < retry.max_attempts {
                if random == 0 {
                    // A per-process random seed from std, mixed with the id.
                    let mut h = RandomState::new().build_hasher();
                    h.write_u64(id);
                    random = h.finish() | 1;
                }
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                let pause = retry.backoff(attempt, random);
                if elapsed + pause > retry.max_elapsed {
                    return Err(e);
                }
                attempt += 1;
                pause
            } else {
                return Err(e);
            };
            std::thread::sleep(pause);
        }
    }

    /// Sends call `id` and waits for its reply. `until`: when the whole call ends, if
    /// later than this attempt (retried calls), for its budget.
    fn attempt<P: Serialize + ?Sized, T, F: FnOnce(Reply<'_>) -> Result<T, Error>>(
        &self,
        id: u64,
        method: &str,
        params: &P,
        idempotent: bool,
        until: Option<Instant>,
        f: &mut Option<F>,
    ) -> Result<T, Error> {
        let deadline = Instant::now() + self.options.timeout;
        let mut write = |buf: &mut Vec<u8>, meta: Option<u64>| {
            write_call(buf, Some(Id::UInt(id)), method, params, meta)
        };
        let carry = Carry {
            idempotent,
            ..self.carry(until.map_or(deadline, |u| u.max(deadline)))
        };
        let (conn, ticket) = self.send(id..id + 1, true, carry, deadline, &mut write)?;
        let Some(ticket) = ticket else {
            return Err(Error::Protocol(Violation::MissingResponse));
        };
        wait_single(&conn, ticket, id, deadline, f)
    }
}

/// For a `-32042 In progress` answer, the wait it asks for (`None`: no hint).
fn in_progress(e: &Error) -> Option<Option<Duration>> {
    match e {
        Error::Server(s) if s.code == crate::codes::IN_PROGRESS => Some(s.retry_after()),
        _ => None,
    }
}

/// Checks that a token can be sent as `Authorization: Bearer TOKEN`: visible ASCII
/// only, since a space or a line break would end the header (or start another one).
fn check_header_token(token: &str) -> Result<(), Error> {
    if token.is_empty() {
        return Err(Error::Token("empty"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Token(
            "an HTTP header takes visible ASCII only (no spaces or control characters)",
        ));
    }
    Ok(())
}

/// Waits for the reply to call `id` and reads it with `f` (taken only on a result).
fn wait_single<T, F: FnOnce(Reply<'_>) -> Result<T, Error>>(
    conn: &Conn,
    ticket: Ticket,
    id: u64,
    deadline: Instant,
    f: &mut Option<F>,
) -> Result<T, Error> {
    let mut out = None;
    conn.wait(ticket, deadline, &mut |raw| {
        out = Some(single_reply(raw, id, |reply| match f.take() {
            Some(f) => f(reply),
            None => Err(Error::Protocol(Violation::Mismatched)),
        }));
    })?;
    out.unwrap_or(Err(Error::Protocol(Violation::MissingResponse)))
}

/// Maps a params-writing failure to [`Error::Encode`].
fn encode<T>(r: Result<T, crate::serializer::request::ParamsError>) -> Result<T, Error> {
    r.map_err(|e| Error::Encode(e.to_string()))
}

/// Writes a call with `meta`, its budget, added to object params (see
/// [`Options::send_deadline`]).
fn write_call<P: Serialize + ?Sized>(
    buf: &mut Vec<u8>,
    id: Option<Id<'_>>,
    method: &str,
    params: &P,
    meta: Option<u64>,
) -> Result<(), Error> {
    let open = encode(write_request(buf, id, method, params))?;
    if let (Some(open), Some(ms)) = (open, meta) {
        insert_meta(buf, open, ms);
    }
    Ok(())
}

/// A call sent by [`Client::start`] whose answer has not been collected yet. Dropping
/// it abandons the call (its answer is discarded when it comes).
#[must_use = "a started call's answer is only read by `wait`"]
pub struct Pending<'c> {
    conn: Arc<Conn>,
    ticket: Option<Ticket>,
    id: u64,
    deadline: Instant,
    _client: PhantomData<&'c Client>,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("id", &self.id).finish()
    }
}

impl Pending<'_> {
    /// Waits for the answer (until the call's deadline) and deserializes the result.
    ///
    /// # Errors
    ///
    /// As [`Client::call`].
    pub fn wait<R: DeserializeOwned>(mut self) -> Result<R, Error> {
        let Some(ticket) = self.ticket.take() else {
            return Err(Error::Protocol(Violation::MissingResponse));
        };
        let mut f = Some(|r: Reply<'_>| r.parse::<R>());
        wait_single(&self.conn, ticket, self.id, self.deadline, &mut f)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.conn.release(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_jitters_and_caps() {
        let r = Retry::default()
            .initial_backoff(Duration::from_millis(10))
            .max_backoff(Duration::from_millis(50));
        for random in [0, 1, 12345, u64::MAX] {
            let b1 = r.backoff(1, random);
            assert!((Duration::from_millis(5)..=Duration::from_millis(10)).contains(&b1));
            let b2 = r.backoff(2, random);
            assert!((Duration::from_millis(10)..=Duration::from_millis(20)).contains(&b2));
            let b9 = r.backoff(9, random);
            assert!((Duration::from_millis(25)..=Duration::from_millis(50)).contains(&b9));
        }
        assert_ne!(r.backoff(3, 1), r.backoff(3, 7));
    }

    #[test]
    fn numbering_starts_at_random_within_bounds() {
        let a = Numbering::new();
        let b = Numbering::new();
        for n in [&a, &b] {
            assert!((FIRST_ID_MIN..FIRST_ID_END).contains(&n.first));
            assert!(n.key_prefix().iter().all(u8::is_ascii_hexdigit));
        }
        assert_ne!(a.first, b.first);
        assert_ne!(a.key_prefix(), b.key_prefix());
        // Only ids handed out count as this client's.
        assert!(!a.issued(a.first));
        let id = a.take(2);
        assert_eq!(id, a.first);
        assert!(a.issued(id) && a.issued(id + 1) && !a.issued(id + 2));
        assert!(!a.issued(1) && !a.issued(id - 1));
    }

    #[test]
    fn header_tokens_are_visible_ascii() {
        assert!(check_header_token("abc.DEF-123_~+/=").is_ok());
        for bad in ["", "a b", "a\r\nX-Evil: 1", "é", "a\tb"] {
            assert!(
                matches!(check_header_token(bad), Err(Error::Token(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn options_debug_redacts_the_token() {
        let o = Options::default().token("s3cret-token");
        let shown = format!("{o:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        assert!(format!("{:?}", Options::default()).contains("token: None"));
    }
}
