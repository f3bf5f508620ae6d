//! The call context: who is calling and how, for handlers that ask for it.
//!
//! A [`Context`] is borrowed for the length of one handler call and costs nothing to
//! handlers that do not ask for it: it is built on the stack from what the transport
//! already holds (the [`Connection`], set up once per connection, and the HTTP request's
//! head, still in the read buffer) and the request being dispatched.

use std::cell::OnceCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::codec::Id;
use crate::dispatch::subscription::PushTo;
use crate::guard::Session;
use crate::trace::Trace;

/// How a request arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// Newline-delimited JSON over TCP.
    Tcp,
    /// Newline-delimited JSON over a Unix domain socket.
    Unix,
    /// JSON-RPC over HTTP/1.1.
    Http,
    /// Newline-delimited JSON on stdin/stdout.
    Stdio,
    /// JSON-RPC over WebSocket (RFC 6455): one request or batch per message, on the HTTP
    /// listener's path after an `Upgrade: websocket`.
    WebSocket,
    /// No transport of ringrpc's: the frame was handed to [`Engine::handle`] by an
    /// embedder.
    ///
    /// [`Engine::handle`]: crate::Engine::handle
    Embedded,
}

impl Transport {
    /// `"tcp"`, `"unix"`, `"http"`, `"stdio"`, `"ws"` or `"embedded"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Unix => "unix",
            Self::Http => "http",
            Self::Stdio => "stdio",
            Self::WebSocket => "ws",
            Self::Embedded => "embedded",
        }
    }

    /// Its position in the metrics' per-transport arrays.
    #[inline(always)]
    pub(crate) fn index(self) -> usize {
        match self {
            Self::Tcp => 0,
            Self::Unix => 1,
            Self::Http => 2,
            Self::Stdio => 3,
            Self::WebSocket => 4,
            Self::Embedded => 5,
        }
    }
}

/// The other end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Peer {
    /// Unknown (stdio, or an embedder that did not say).
    Unknown,
    /// A TCP peer's address, as the socket reports it.
    Ip(SocketAddr),
    /// A Unix-socket peer's credentials (`SO_PEERCRED`) at connect time.
    Unix {
        /// The peer's process id.
        pid: i32,
        /// The peer's user id.
        uid: u32,
        /// The peer's group id.
        gid: u32,
    },
}

impl std::fmt::Display for Peer {
    /// `ADDR:PORT` for IP peers, `pid=P uid=U gid=G` for Unix peers, `unknown` otherwise.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unknown => f.write_str("unknown"),
            Self::Ip(addr) => write!(f, "{addr}"),
            Self::Unix { pid, uid, gid } => write!(f, "pid={pid} uid={uid} gid={gid}"),
        }
    }
}

/// What is known of a connection for as long as it lives: its transport, its peer and
/// an id unique within the process. The server makes one per accepted connection; an
/// embedder makes its own ([`Connection::new`]) or uses [`Connection::EMBEDDED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Connection {
    transport: Transport,
    peer: Peer,
    id: u64,
}

impl Connection {
    /// What [`Engine::handle`](crate::Engine::handle) assumes: an embedded caller, peer
    /// unknown, connection id 0.
    pub const EMBEDDED: Self = Self::new(Transport::Embedded, Peer::Unknown, 0);

    /// A connection of `transport` from `peer`, known as `id`.
    pub const fn new(transport: Transport, peer: Peer, id: u64) -> Self {
        Self {
            transport,
            peer,
            id,
        }
    }

    /// How the connection's requests arrive.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Who is at the other end.
    pub fn peer(&self) -> Peer {
        self.peer
    }

    /// The connection's id: unique among the connections a server accepted (they are
    /// numbered from 1); 0 for [`Connection::EMBEDDED`].
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// An HTTP request's header fields, borrowed from its head in the read buffer (not
/// copied). Lookups scan the head, so they cost only when a handler asks; the two
/// fields the engine itself reads on every request are found by the decoder
/// (`Known`).
#[derive(Clone, Copy)]
pub struct Headers<'a> {
    /// The whole head: request line, header lines, the empty line. httparse accepted it,
    /// so every header line is `name ":" value`.
    head: &'a [u8],
    /// Where the decoder found the fields the engine reads itself, if it did.
    known: Option<Known>,
}

/// Where the first `Authorization` and the first `Idempotency-Key` field's values
/// (trimmed) are in a request head, as offsets from its start: found by the HTTP
/// decoder while it read the head (httparse hands it every field), so that the guard
/// and de-duplication, which read them on every request, do not scan the head again
/// (~700 instructions a lookup, each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Known {
    pub(crate) authorization: Option<(usize, usize)>,
    pub(crate) idempotency_key: Option<(usize, usize)>,
}

impl Known {
    /// Where `value`, a slice of `head`, lies in it.
    pub(crate) fn span(head: &[u8], value: &[u8]) -> Option<(usize, usize)> {
        // Addresses compared, not dereferenced: `value` was sliced from `head`.
        let start = (value.as_ptr() as usize).checked_sub(head.as_ptr() as usize)?;
        let end = start.checked_add(value.len())?;
        (end <= head.len()).then_some((start, end))
    }
}

impl<'a> Headers<'a> {
    /// The fields of `head`, a request head the HTTP decoder accepted.
    pub(crate) fn new(head: &'a [u8]) -> Self {
        Self { head, known: None }
    }

    /// The fields of `head`, with the engine's own fields where the decoder found them.
    pub(crate) fn decoded(head: &'a [u8], known: Known) -> Self {
        Self {
            head,
            known: Some(known),
        }
    }

    fn at(&self, span: Option<(usize, usize)>) -> Option<&'a [u8]> {
        let (start, end) = span?;
        self.head.get(start..end)
    }

    /// The first `Authorization` field.
    pub(crate) fn authorization(&self) -> Option<&'a [u8]> {
        match self.known {
            Some(k) => self.at(k.authorization),
            None => self.get("authorization"),
        }
    }

    /// The first `Idempotency-Key` field.
    pub(crate) fn idempotency_key(&self) -> Option<&'a [u8]> {
        match self.known {
            Some(k) => self.at(k.idempotency_key),
            None => self.get("idempotency-key"),
        }
    }

    /// Every header field in order, name and value (without surrounding whitespace).
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        Lines::of(self.head).filter_map(|line| {
            let colon = memchr::memchr(b':', line)?;
            let name = std::str::from_utf8(line.get(..colon)?).ok()?;
            Some((name, trim_ows(line.get(colon + 1..)?)))
        })
    }

    /// The first field named `name` (case-insensitive), if any.
    ///
    /// A walk of the head's lines that compares a line's name only when its length
    /// matches, instead of splitting every line into name and value as
    /// [`Headers::iter`] does (~1,100 instructions a lookup on a head of four fields).
    /// The two fields the engine reads on every request do not come here when the
    /// decoder found them (`Known`).
    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        let name = name.as_bytes();
        // A header line is `name ":" value` (httparse accepted it), so a name holding a
        // colon matches nothing.
        if name.is_empty() || memchr::memchr(b':', name).is_some() {
            return None;
        }
        Lines::of(self.head).find_map(|line| match line.split_at_checked(name.len()) {
            Some((n, [b':', value @ ..])) if n.eq_ignore_ascii_case(name) => Some(trim_ows(value)),
            _ => None,
        })
    }

    /// The first field named `name` as text, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&'a str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The caller's budget in milliseconds from `RPC-Timeout-Ms` (its first field), if
    /// that holds a usable one (see docs/PROTOCOL.md, "Deadlines").
    pub(crate) fn budget_ms(&self) -> Option<u32> {
        crate::codec::request::budget_from_text(self.get("rpc-timeout-ms")?)
    }
}

impl std::fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(n, v)| (n, String::from_utf8_lossy(v))))
            .finish()
    }
}

/// The header lines of a request head: after the request line, up to the empty line,
/// without their line ends.
struct Lines<'a>(&'a [u8]);

impl<'a> Lines<'a> {
    fn of(head: &'a [u8]) -> Self {
        let after_request_line = memchr::memchr(b'\n', head).and_then(|nl| head.get(nl + 1..));
        Self(after_request_line.unwrap_or_default())
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let end = memchr::memchr(b'\n', self.0).unwrap_or(self.0.len());
        let (line, rest) = self.0.split_at_checked(end)?;
        self.0 = rest.get(1..).unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            // The empty line ends the head (or nothing is left): no more fields.
            self.0 = &[];
            return None;
        }
        Some(line)
    }
}

/// `v` without leading and trailing spaces and tabs (HTTP's OWS): header values here,
/// and in the HTTP decoder.
pub(crate) fn trim_ows(v: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = v.iter().position(|b| !is_ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !is_ows(b)).map_or(start, |i| i + 1);
    &v[start..end]
}

/// Where a frame came from, as its caller tells the engine: the connection, and for
/// HTTP the request's header fields. See [`Engine::handle_from`].
///
/// [`Engine::handle_from`]: crate::Engine::handle_from
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    pub(crate) conn: &'a Connection,
    pub(crate) headers: Option<Headers<'a>>,
    /// The connection's authentication, when a [`Guard`](crate::guard::Guard) is set.
    pub(crate) session: Option<&'a Session>,
    /// The trace the frame's calls belong to, if any.
    pub(crate) trace: Option<&'a Trace>,
    /// The caller's `RPC-Timeout-Ms` budget when the transport read it already
    /// (`None`: look in `headers` if there are any).
    pub(crate) header_budget: Option<Option<u32>>,
    /// Where notifications go, on a connection that can carry them.
    pub(crate) push: Option<PushTo<'a>>,
}

impl<'a> Source<'a> {
    /// A frame from `conn` (no HTTP headers).
    pub const fn new(conn: &'a Connection) -> Self {
        Self {
            conn,
            headers: None,
            session: None,
            trace: None,
            header_budget: None,
            push: None,
        }
    }

    /// An HTTP request's body from `conn`, with the request's head (request line and
    /// header lines, as received).
    pub fn http(conn: &'a Connection, head: &'a [u8]) -> Self {
        Self::http_headers(conn, Headers::new(head))
    }

    /// [`Source::http`] with the head's fields as the decoder found them.
    pub(crate) fn http_headers(conn: &'a Connection, headers: Headers<'a>) -> Self {
        Self {
            conn,
            headers: Some(headers),
            session: None,
            trace: None,
            header_budget: None,
            push: None,
        }
    }

    /// The same source, on a connection whose authentication `session` keeps (one
    /// [`Session`] per connection; see [`Guard`](crate::guard::Guard)).
    pub fn with_session(self, session: &'a Session) -> Self {
        Self {
            session: Some(session),
            ..self
        }
    }

    /// The same source, its calls part of `trace` (say, continued from the caller's
    /// `traceparent` with [`Trace::from_traceparent`]): their contexts expose it, and
    /// sampled ones run in a `tracing` span.
    pub fn with_trace(self, trace: &'a Trace) -> Self {
        Self {
            trace: Some(trace),
            ..self
        }
    }

    /// [`Source::with_trace`] when there is a trace (one copy of the source, not two).
    #[inline]
    pub(crate) fn with_trace_if(self, trace: Option<&'a Trace>) -> Self {
        Self { trace, ..self }
    }

    /// The same source, with the `RPC-Timeout-Ms` budget the transport read while
    /// parsing the head (so the engine need not look for it again).
    pub(crate) fn with_header_budget(self, budget: Option<u32>) -> Self {
        Self {
            header_budget: Some(budget),
            ..self
        }
    }

    /// The same source, on a connection that carries notifications to `push`.
    pub(crate) fn with_push(self, push: PushTo<'a>) -> Self {
        Self {
            push: Some(push),
            ..self
        }
    }

    /// The caller's budget from `RPC-Timeout-Ms`, in milliseconds.
    #[inline]
    pub(crate) fn header_budget(&self) -> Option<u32> {
        match self.header_budget {
            Some(known) => known,
            None => self.headers.and_then(|h| h.budget_ms()),
        }
    }

    /// Whether the frame's calls are traced and sampled (they take the path that makes
    /// spans).
    #[inline(always)]
    pub(crate) fn sampled(&self) -> bool {
        self.trace.is_some_and(Trace::is_sampled)
    }
}

impl Source<'static> {
    /// [`Connection::EMBEDDED`], no headers: what [`Source::default`] is, as a constant
    /// (`&Source::EMBEDDED` is a reference to one made at compile time).
    pub(crate) const EMBEDDED: Self = Self::new(&Connection::EMBEDDED);
}

impl Default for Source<'static> {
    /// [`Connection::EMBEDDED`], no headers.
    fn default() -> Self {
        Self::EMBEDDED
    }
}

/// What a context-aware handler knows of its call: the connection it came on, the HTTP
/// request's headers, the request's method and id, and its deadline.
///
/// ```
/// use ringrpc::{Config, Engine, Params, Registry, RpcError};
///
/// let mut methods = Registry::builder();
/// methods.method_with_ctx("who", |ctx, _p: Params<'_>| -> Result<String, RpcError> {
///     Ok(format!("{} via {}", ctx.method(), ctx.connection().transport().as_str()))
/// })?;
/// let engine = Engine::new(methods.freeze(), Config::default());
/// let mut out = Vec::new();
/// let _ = engine.handle(br#"{"jsonrpc":"2.0","method":"who","id":1}"#, &mut engine.scratch(), &mut out);
/// assert_eq!(out, br#"{"jsonrpc":"2.0","id":1,"result":"who via embedded"}"#);
/// # Ok::<(), ringrpc::RegisterError>(())
/// ```
#[derive(Debug)]
pub struct Context<'a> {
    source: Source<'a>,
    method: &'a str,
    id: Option<Id<'a>>,
    deadline: Option<Instant>,
    identity: OnceCell<Arc<str>>,
}

impl<'a> Context<'a> {
    pub(crate) fn new(
        source: Source<'a>,
        method: &'a str,
        id: Option<Id<'a>>,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            source,
            method,
            id,
            deadline,
            identity: match source.session.and_then(Session::identity) {
                Some(who) => OnceCell::from(who),
                None => OnceCell::new(),
            },
        }
    }

    /// Where subscriptions opened by this call send their notifications (`None` on a
    /// transport that cannot push: HTTP, the no-I/O API).
    pub(crate) fn push(&self) -> Option<PushTo<'a>> {
        self.source.push
    }

    /// Who the caller is: the identity the engine's [`Guard`](crate::guard::Guard)
    /// authenticated, or as a [`Hooks::before`](crate::Hooks::before) hook established
    /// it; `None` for an anonymous caller.
    pub fn identity(&self) -> Option<&str> {
        self.identity.get().map(|s| &**s)
    }

    /// Sets the caller's identity for the rest of the call (its handler sees it). Set
    /// once: returns false, changing nothing, if it was set already.
    pub fn set_identity(&self, identity: impl Into<Arc<str>>) -> bool {
        self.identity.set(identity.into()).is_ok()
    }

    /// The connection the call came on.
    pub fn connection(&self) -> &'a Connection {
        self.source.conn
    }

    /// The HTTP request's header fields (`None` on other transports).
    pub fn headers(&self) -> Option<Headers<'a>> {
        self.source.headers
    }

    /// The method called (for a fallback route, the name that was not registered).
    pub fn method(&self) -> &'a str {
        self.method
    }

    /// The request's id; `None` for a notification.
    pub fn id(&self) -> Option<Id<'a>> {
        self.id
    }

    /// The trace the call belongs to: the caller's (an HTTP `traceparent`), or one
    /// started for a sampled call; `None` if it is not traced.
    pub fn trace(&self) -> Option<&'a Trace> {
        self.source.trace
    }

    /// When the server answers `-32001` if the call has not been answered: the earlier
    /// of `request_timeout` and the caller's own budget (`RPC-Timeout-Ms`, or
    /// `params._meta.timeoutMs`; see docs/PROTOCOL.md, "Deadlines"), both counted from
    /// when the request was taken up. Set for calls answered later (pool and deferred
    /// methods) and, when the caller sent a budget, for calls answered at once too;
    /// `None` when neither applies.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_from_the_head() {
        let head =
            b"POST / HTTP/1.1\r\nHost: x\r\nUser-Agent:  curl/8.0 \r\nx-a: 1\nX-A: 2\r\n\r\n";
        let h = Headers::new(head);
        assert_eq!(h.get("user-agent"), Some(&b"curl/8.0"[..]));
        assert_eq!(h.get_str("X-A"), Some("1"));
        assert_eq!(h.get("missing"), None);
        assert_eq!(h.iter().count(), 4);
    }

    /// `get` against a search of `iter` (the plain reading of the fields), for names of
    /// every kind: present in any case, absent, prefixes and extensions of present
    /// names, with colons, empty; heads with bare `\n` line ends, no fields, or fields
    /// after the empty line (not fields).
    #[test]
    fn get_finds_what_iter_lists() {
        let heads: [&[u8]; 5] = [
            b"POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nIdempotency-Key:k-1\r\n\r\n",
            b"POST / HTTP/1.1\nhost:x\nauthorization:  a b \n\n",
            b"POST / HTTP/1.1\r\n\r\nHost: after-the-end\r\n",
            b"POST / HTTP/1.1\r\nX-Empty:\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
            b"POST / HTTP/1.1",
        ];
        let names = [
            "host",
            "HOST",
            "authorization",
            "Authorization",
            "idempotency-key",
            "idempotency-ke",
            "idempotency-keys",
            "x-empty",
            "x-a",
            "x",
            "",
            "host:",
            "a:b",
            "missing",
        ];
        for head in heads {
            let h = Headers::new(head);
            for name in names {
                let want = h
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v);
                assert_eq!(
                    h.get(name),
                    want,
                    "{name:?} in {:?}",
                    String::from_utf8_lossy(head)
                );
            }
        }
        let h = Headers::new(heads[2]);
        assert_eq!(h.iter().count(), 0);
        assert_eq!(Headers::new(heads[3]).get("x-empty"), Some(&b""[..]));
    }

    #[test]
    fn the_budget_header_is_digits_within_bounds() {
        let budget = |v: &str| {
            let head = format!("POST / HTTP/1.1\r\nHost: x\r\nRPC-Timeout-Ms: {v}\r\n\r\n");
            Headers::new(head.as_bytes()).budget_ms()
        };
        assert_eq!(budget("250"), Some(250));
        assert_eq!(budget(" 0 "), Some(0));
        assert_eq!(budget("2147483647"), Some(2_147_483_647));
        for ignored in [
            "",
            "-1",
            "1.5",
            "1e3",
            "+5",
            "0x10",
            "2147483648",
            "99999999999",
        ] {
            assert_eq!(budget(ignored), None, "{ignored:?}");
        }
        let none = Headers::new(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(none.budget_ms(), None);
    }
}
