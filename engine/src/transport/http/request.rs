//! Request decoding: [`HttpDecoder`] turns the front of a connection's read buffer into
//! [`HttpEvent`]s, deciding from each head what to do with the request and its body.

use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::sync::Arc;

use bytes::{Buf, BytesMut};

use super::chunked::{ChunkError, ChunkLimits, Chunked, Strictness};
use super::fields::{request_path, Fields};
use super::{Cors, Origin, Reply, MAX_CHUNK_LINE};
use crate::config::defaults::{DEFAULT_MAX_HEAD_BYTES, DEFAULT_MAX_REQUEST_BYTES};
use crate::config::{Config, ServerConfig};
use crate::dispatch::context::trim_ows;
use crate::dispatch::context::Known;
use crate::trace::Trace;

/// Default [`HttpLimits::max_headers`]: 64.
pub(crate) const DEFAULT_MAX_HEADERS: usize = 64;
/// The largest [`HttpLimits::max_headers`] honoured: the header slots live, uninitialised
/// and so free, on the stack (32 bytes each).
pub(crate) const MAX_HEADERS_CEILING: usize = 256;
/// The path of the health check, `GET` only.
pub(crate) const HEALTH_PATH: &str = "/health";
/// The path of the metrics, `GET` only (when served).
pub(crate) const METRICS_PATH: &str = "/metrics";

/// The HTTP transport's limits and route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HttpLimits {
    /// The path JSON-RPC requests are POSTed to (default `/`).
    pub(crate) path: Cow<'static, str>,
    /// The largest request head, request line to the empty line inclusive (default
    /// 8 KiB, `DEFAULT_MAX_HEAD_BYTES`); a larger head is 431. Also bounds a chunked body's
    /// trailer section.
    pub(crate) max_head_bytes: usize,
    /// The largest body, after de-chunking (default: [`Config`]'s `max_request_bytes`);
    /// a larger one is 413.
    pub(crate) max_body_bytes: usize,
    /// The most header fields accepted (default [`DEFAULT_MAX_HEADERS`], at most
    /// [`MAX_HEADERS_CEILING`]); more is 431.
    pub(crate) max_headers: usize,
    /// The origins browsers may call from (CORS), if any.
    pub(crate) cors: Option<Arc<Cors>>,
    /// JSON-RPC is served at `path` (not on a metrics-only listener).
    pub(crate) rpc: bool,
    /// `GET /metrics` is served.
    pub(crate) metrics: bool,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            path: Cow::Borrowed("/"),
            max_head_bytes: DEFAULT_MAX_HEAD_BYTES,
            max_body_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            cors: None,
            rpc: true,
            metrics: false,
        }
    }
}

impl HttpLimits {
    /// The limits the settings set: the engine's `max_request_bytes` (as
    /// `max_body_bytes`), the server's `http_path` and `max_head_bytes`, and `cors`;
    /// `max_headers` keeps its default.
    pub(crate) fn from_config(
        config: &Config,
        settings: &ServerConfig,
        cors: Option<Arc<Cors>>,
    ) -> Self {
        Self {
            path: Cow::Owned(settings.http_path.clone()),
            max_head_bytes: settings.max_head_bytes,
            max_body_bytes: config.request_limit(),
            max_headers: DEFAULT_MAX_HEADERS,
            cors,
            rpc: true,
            metrics: false,
        }
    }

    /// A chunked body's bounds: `max_body_bytes`, [`MAX_CHUNK_LINE`] per size line and
    /// `max_head_bytes` of trailers. None on the framing as a whole: the decoder holds
    /// at most one line of it (see the module's security bound).
    fn chunk_limits(&self) -> ChunkLimits {
        ChunkLimits {
            max_body: self.max_body_bytes,
            max_line: MAX_CHUNK_LINE,
            max_trailers: self.max_head_bytes,
            max_wire: usize::MAX,
        }
    }
}

/// Why a request was refused. Small and `Copy`; [`HttpError::status`] is the status to
/// answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HttpError {
    /// 400: httparse rejected the request line or a header.
    #[error("malformed request head: {0}")]
    Malformed(httparse::Error),
    /// 505: a well-formed `HTTP/x.y` version whose major version is not 1.
    #[error("only HTTP/1.x is served")]
    Version,
    /// 400: an HTTP/1.1 request without exactly one `Host`, or several in HTTP/1.0.
    #[error("an HTTP/1.1 request needs exactly one Host header")]
    Host,
    /// 400: a `Content-Length` that is not a decimal number of at most 64 bits.
    #[error("Content-Length is not a decimal number of at most 64 bits")]
    ContentLength,
    /// 400: `Content-Length` values that differ.
    #[error("conflicting Content-Length values")]
    ConflictingLengths,
    /// 400: both `Content-Length` and `Transfer-Encoding`.
    #[error("a request may not carry both Content-Length and Transfer-Encoding")]
    LengthAndChunked,
    /// 400: `Transfer-Encoding` whose final coding is not `chunked`, or `chunked` twice.
    #[error("Transfer-Encoding does not end in a single chunked")]
    NotChunked,
    /// 400: `Transfer-Encoding` in an HTTP/1.0 request.
    #[error("Transfer-Encoding in an HTTP/1.0 request")]
    ChunkedHttp10,
    /// 501: a transfer coding other than `chunked` (such as `gzip, chunked`).
    #[error("only the chunked transfer coding is supported")]
    TransferCoding,
    /// 400: bad chunked framing (size, extension, or a missing CRLF).
    #[error("malformed chunked body")]
    Chunk,
    /// 404: neither the JSON-RPC path nor the health check.
    #[error("no such path (JSON-RPC is POSTed to the configured path; GET /health, GET /metrics)")]
    NotFound,
    /// 405: the path exists but not for this method.
    #[error("this path takes {allow}")]
    Method {
        /// The `Allow` header's value.
        allow: &'static str,
    },
    /// 411: a POST with neither `Content-Length` nor `Transfer-Encoding`.
    #[error("a POST needs Content-Length or Transfer-Encoding: chunked")]
    LengthRequired,
    /// 413: the body is longer than `max_body_bytes`.
    #[error("the request body is larger than the server's limit (max_request_bytes)")]
    BodyTooLarge,
    /// 415: a Content-Type other than the JSON ones accepted.
    #[error(
        "Content-Type must be application/json (or application/json-rpc, application/jsonrequest)"
    )]
    MediaType,
    /// 415: a `Content-Encoding` other than `identity`; answered with
    /// `Accept-Encoding: identity`.
    #[error("the body must not be compressed: Content-Encoding identity only")]
    ContentEncoding,
    /// 403: a CORS preflight from an origin that is not allowed (or without `Origin`).
    #[error("CORS: the Origin is not allowed to call this server (--cors-origin)")]
    Origin,
    /// 431: the head is longer than `max_head_bytes`.
    #[error("the request head is larger than the server's limit (max_head_bytes)")]
    HeadTooLarge,
    /// 431: more than `max_headers` header fields.
    #[error("too many header fields")]
    TooManyHeaders,
    /// 431: a chunked body's trailer section is longer than `max_head_bytes`.
    #[error("the chunked trailer section is larger than the server's limit (max_head_bytes)")]
    TrailersTooLarge,
    /// 400: a WebSocket handshake that breaks RFC 6455 §4.2.1.
    #[error("bad WebSocket handshake: {0}")]
    Handshake(&'static str),
    /// 426: a WebSocket handshake for a version other than 13; answered with
    /// `Sec-WebSocket-Version: 13`.
    #[error("only WebSocket version 13 is served")]
    WebSocketVersion,
}

impl HttpError {
    /// The HTTP status to answer with.
    pub(crate) const fn status(self) -> u16 {
        match self {
            Self::Malformed(_)
            | Self::Host
            | Self::ContentLength
            | Self::ConflictingLengths
            | Self::LengthAndChunked
            | Self::NotChunked
            | Self::ChunkedHttp10
            | Self::Chunk
            | Self::Handshake(_) => 400,
            Self::Origin => 403,
            Self::NotFound => 404,
            Self::Method { .. } => 405,
            Self::LengthRequired => 411,
            Self::BodyTooLarge => 413,
            Self::MediaType | Self::ContentEncoding => 415,
            Self::HeadTooLarge | Self::TooManyHeaders | Self::TrailersTooLarge => 431,
            Self::WebSocketVersion => 426,
            Self::TransferCoding => 501,
            Self::Version => 505,
        }
    }

    /// The header the refusal must carry: `Allow` for a 405, `Accept-Encoding` for an
    /// encoded body.
    pub(crate) const fn header(self) -> Option<(&'static str, &'static str)> {
        match self {
            Self::Method { allow } => Some(("Allow", allow)),
            Self::ContentEncoding => Some(("Accept-Encoding", "identity")),
            Self::WebSocketVersion => Some(("Sec-WebSocket-Version", "13")),
            _ => None,
        }
    }
}

/// The refusal for bad chunked framing: 413 and 431 for the bounds, 400 for the rest (a
/// size line over [`MAX_CHUNK_LINE`] included).
fn chunk_error(e: ChunkError) -> HttpError {
    match e {
        ChunkError::BodyTooLarge => HttpError::BodyTooLarge,
        ChunkError::TrailersTooLarge => HttpError::TrailersTooLarge,
        ChunkError::Size | ChunkError::DataEnd | ChunkError::Trailer | ChunkError::LineTooLong => {
            HttpError::Chunk
        }
        // Not reached: the server sets no wire bound (`chunk_limits`).
        ChunkError::WireTooLarge => HttpError::BodyTooLarge,
    }
}

/// A JSON-RPC POST as received: its head (request line, header lines, empty line) and
/// right behind it its body, in one piece split off the read buffer without copying.
/// Dereferences to the body. Dropping it lets the buffer reuse the space.
///
/// One piece, not two: the head stays in the buffer while the body arrives, so handing
/// it to [`Headers`](crate::dispatch::context::Headers) costs no second split (and no
/// second reference count to drop) per request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RpcRequest {
    /// The head, then the body.
    bytes: BytesMut,
    /// Where the body starts: the head's length.
    body_at: usize,
}

impl RpcRequest {
    /// The caller's trace, from the head's first valid `traceparent` field (W3C Trace
    /// Context), with a new span for the server.
    pub(crate) fn trace(&self) -> Option<Trace> {
        crate::dispatch::context::Headers::new(self.head())
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("traceparent"))
            .find_map(|(_, value)| Trace::from_traceparent(value))
    }

    /// The request's head as received: request line, header lines, the empty line.
    pub(crate) fn head(&self) -> &[u8] {
        &self.bytes[..self.body_at]
    }

    /// The body: as sent (`Content-Length`), or de-chunked in place (chunked).
    pub(crate) fn body(&self) -> &[u8] {
        &self.bytes[self.body_at..]
    }
}

impl Deref for RpcRequest {
    type Target = [u8];

    /// The body.
    fn deref(&self) -> &[u8] {
        self.body()
    }
}

/// What the front of the read buffer held.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HttpEvent {
    /// A complete JSON-RPC POST.
    Rpc {
        /// The body, with the request's head in front of it ([`RpcRequest::head`], for
        /// [`Headers`](crate::dispatch::context::Headers)).
        body: RpcRequest,
        /// Whether to keep the connection open after answering (HTTP/1.1 unless
        /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`; if not, the
        /// decoder ignores anything after this request), and the CORS origin.
        reply: Reply,
        /// The head has a `traceparent` field ([`RpcRequest::trace`] reads it).
        traced: bool,
        /// The caller's budget from the first `RPC-Timeout-Ms`, in milliseconds.
        budget: Option<u32>,
        /// Where the fields the engine reads on every request are in the head.
        known: Known,
    },
    /// `GET /health`: answer with [`write_health`](super::write_health).
    Health {
        /// As for [`HttpEvent::Rpc`]; not kept alive when the request had a body that
        /// cannot be skipped safely.
        reply: Reply,
        /// The request was `HEAD`: answer without a body.
        head: bool,
    },
    /// `GET /metrics` (when served): answer with the metrics' text.
    Metrics {
        /// As for [`HttpEvent::Health`].
        reply: Reply,
        /// The request was `HEAD`: answer without a body.
        head: bool,
        /// How long the scraper waits for the answer, when it says
        /// (`X-Prometheus-Scrape-Timeout-Seconds`, which Prometheus sends).
        timeout: Option<std::time::Duration>,
    },
    /// A CORS preflight (`OPTIONS` on the JSON-RPC path) from an allowed origin: answer
    /// with [`write_preflight`](super::write_preflight).
    Preflight {
        /// As for [`HttpEvent::Health`].
        reply: Reply,
    },
    /// A WebSocket handshake (`GET` on the JSON-RPC path with `Upgrade: websocket`),
    /// valid: answer `101 Switching Protocols`
    /// ([`write_switch`](crate::transport::websocket::write_switch)) and decode what
    /// follows as WebSocket frames. This decoder is done.
    Upgrade {
        /// The `Sec-WebSocket-Key`.
        key: [u8; 24],
        /// The request's head (for the guard's `Authorization` check).
        head: bytes::Bytes,
        /// For a refusal (never kept alive: what follows is not HTTP).
        reply: Reply,
    },
    /// The client sent `Expect: 100-continue` and the head is acceptable: write
    /// [`write_continue`](super::write_continue) now (or refuse the request: a bad
    /// credential); the body follows, and then [`HttpEvent::Rpc`]. Emitted at most
    /// once per request.
    Continue {
        /// The head's length: it is at the front of the buffer until the body comes.
        head: usize,
        /// For a refusal instead of the 100.
        reply: Reply,
    },
    /// Not a JSON-RPC request: answer with [`write_status`](super::write_status).
    Reject {
        /// The status to answer with (`error.status()`).
        status: u16,
        /// Close the connection after answering. If false, the request's body is being
        /// skipped and the next request will be decoded.
        close: bool,
        /// The header the refusal carries (`error.header()`).
        header: Option<(&'static str, &'static str)>,
        /// The CORS origin of the request.
        origin: Origin,
        /// Why, for logs.
        error: HttpError,
        /// The request was `HEAD`: answer without a body.
        head: bool,
    },
}

/// Whether `origin` (`scheme://host[:port]`) names `host` (a `Host` field's value).
fn same_site(origin: &[u8], host: &[u8]) -> bool {
    let Some(at) = origin.windows(3).position(|w| w == b"://") else {
        return false;
    };
    let authority = &origin[at + 3..];
    !host.is_empty() && authority.eq_ignore_ascii_case(host)
}

/// A WebSocket handshake's key, if the handshake is valid (RFC 6455 §4.2.1): HTTP/1.1,
/// `Connection: upgrade`, no body, a key of 16 base64-encoded bytes, version 13.
fn websocket_key(f: &Fields<'_>, http11: bool, body: Framing) -> Result<[u8; 24], HttpError> {
    if !http11 {
        return Err(HttpError::Handshake("WebSocket needs HTTP/1.1"));
    }
    if !f.upgrade {
        return Err(HttpError::Handshake("Connection must include upgrade"));
    }
    if !matches!(body, Framing::None | Framing::Length(0)) {
        return Err(HttpError::Handshake("a handshake has no body"));
    }
    if f.ws_version != Some(b"13") {
        return Err(HttpError::WebSocketVersion);
    }
    match f.ws_key {
        Some(k) if crate::transport::websocket::valid_key(k) => {
            let mut key = [0u8; 24];
            key.copy_from_slice(k);
            Ok(key)
        }
        _ => Err(HttpError::Handshake(
            "Sec-WebSocket-Key must be 16 bytes in base64",
        )),
    }
}

/// Decodes HTTP/1.1 requests off the front of a connection's read buffer.
///
/// One per connection. See the [module docs](self) for the protocol decisions and the
/// memory bound.
#[derive(Debug)]
pub(crate) struct HttpDecoder {
    limits: HttpLimits,
    state: State,
    /// httparse calls so far, for the test that heads are not re-parsed per read.
    #[cfg(test)]
    parses: usize,
}

#[derive(Debug)]
enum State {
    /// Waiting for a request head at the front of the buffer.
    Head {
        /// Bytes at the front already searched for the empty line that ends the head
        /// (none found there). Always `<= max_head_bytes`.
        scanned: usize,
        /// httparse has been tried on this head already. It is tried once on whatever
        /// is there at first (usually the whole head: one parse, no scan); after that
        /// only once the end has been found, so a slow head costs O(n), not O(n²).
        attempted: bool,
    },
    /// A `Content-Length` body of `len` (`<= max_body_bytes`) bytes, after the head
    /// (`meta.head` bytes at the front of the buffer).
    Body { len: usize, meta: RpcMeta },
    /// A chunked body, after the head (kept by `chunked`).
    Chunked { chunked: Chunked, meta: RpcMeta },
    /// Discarding `left` bytes of a refused request's body.
    Skip { left: usize },
    /// The connection is finishing: everything that arrives is dropped.
    Closed,
}

impl State {
    /// Waiting for a new head. A function, not a `const`: a `const` of this size is
    /// copied whole from a constant with `memcpy` at each use (a call per request,
    /// ~30 instructions, in callgrind), where this writes only the variant's fields.
    #[inline]
    const fn head() -> Self {
        Self::Head {
            scanned: 0,
            attempted: false,
        }
    }
}

/// What an accepted JSON-RPC request carries from its head to its [`HttpEvent::Rpc`].
#[derive(Clone, Copy, Debug)]
struct RpcMeta {
    reply: Reply,
    traced: bool,
    budget: Option<u32>,
    known: Known,
    /// The head's length: it stays at the front of the buffer, before the body, until
    /// the two are split off together.
    head: usize,
}

/// How a request's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// Neither `Content-Length` nor `Transfer-Encoding`: no body.
    None,
    Length(u64),
    Chunked,
}

/// What to do with a request, decided from its head alone.
#[derive(Debug)]
enum Plan {
    Rpc {
        body: Framing,
        expect: bool,
        meta: RpcMeta,
    },
    /// `GET /health`, `GET /metrics`, or a CORS preflight from an allowed origin.
    Health {
        body: Framing,
        expect: bool,
        reply: Reply,
        head: bool,
        probe: Probe,
        /// A scrape's `X-Prometheus-Scrape-Timeout-Seconds`.
        timeout: Option<std::time::Duration>,
    },
    Refuse {
        error: HttpError,
        body: Framing,
        expect: bool,
        reply: Reply,
        head: bool,
    },
    /// A valid WebSocket handshake whose head is `head` bytes long.
    Upgrade {
        key: [u8; 24],
        head: usize,
        reply: Reply,
    },
}

/// The scrape timeout a scraper sends (`X-Prometheus-Scrape-Timeout-Seconds: 10`, in
/// seconds, fractions allowed), if it sends one that is a positive number.
fn scrape_timeout(headers: &[httparse::Header<'_>]) -> Option<std::time::Duration> {
    let h = headers.iter().find(|h| {
        h.name
            .eq_ignore_ascii_case("x-prometheus-scrape-timeout-seconds")
    })?;
    let secs: f64 = std::str::from_utf8(trim_ows(h.value)).ok()?.parse().ok()?;
    std::time::Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
}

/// Which of the answers without a JSON-RPC body a [`Plan::Health`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    Health,
    Metrics,
    Preflight,
}

enum Step {
    Event(HttpEvent),
    NeedMore,
    /// The state changed; go on decoding.
    Next,
}

impl HttpDecoder {
    /// A decoder enforcing `limits`.
    pub(crate) fn new(limits: HttpLimits) -> Self {
        Self {
            limits,
            state: State::head(),
            #[cfg(test)]
            parses: 0,
        }
    }

    #[cfg(test)]
    /// The limits in force.
    pub(crate) fn limits(&self) -> &HttpLimits {
        &self.limits
    }

    /// True between requests: no part of a request has been consumed (bytes of the next
    /// head may still be waiting in the buffer). An idle-timeout can close silently
    /// when this holds and the buffer is empty, and answer 408 otherwise.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(
            self.state,
            State::Head {
                scanned: 0,
                attempted: false
            }
        )
    }

    #[cfg(test)]
    /// True once a request or refusal has said the connection closes: the caller writes
    /// the last response and closes; the decoder drops anything more that arrives.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// The next event from the front of `buf`, or `None` when more bytes are needed.
    ///
    /// After an event call again: a pipelined request may already be in `buf`. Consumed
    /// bytes are removed from `buf`'s front (bodies with `split_to`, O(1)); unfinished
    /// ones stay for the next call.
    ///
    /// Cost: O(new bytes) per call — one httparse parse per head in the usual case where
    /// the head arrives whole, a `memchr` scan otherwise; no heap allocation.
    #[must_use]
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Option<HttpEvent> {
        loop {
            let step = match &mut self.state {
                State::Head { scanned, attempted } => {
                    let (scanned, attempted) = (*scanned, *attempted);
                    self.head(buf, scanned, attempted)
                }
                State::Body { len, meta } => {
                    let end = meta.head.saturating_add(*len);
                    if buf.len() < end {
                        return None;
                    }
                    let meta = *meta;
                    let bytes = buf.split_to(end);
                    Step::Event(self.rpc(bytes, meta))
                }
                State::Chunked { chunked, meta } => {
                    match chunked.decode(buf, &self.limits.chunk_limits()) {
                        Ok(None) => Step::NeedMore,
                        Ok(Some(bytes)) => {
                            let meta = *meta;
                            Step::Event(self.rpc(bytes, meta))
                        }
                        Err(e) => Step::Event(self.refuse_and_close(buf, chunk_error(e))),
                    }
                }
                State::Skip { left } => {
                    let n = (*left).min(buf.len());
                    buf.advance(n);
                    *left -= n;
                    if *left > 0 {
                        return None;
                    }
                    self.state = State::head();
                    Step::Next
                }
                State::Closed => {
                    buf.clear();
                    Step::NeedMore
                }
            };
            match step {
                Step::Event(e) => return Some(e),
                Step::NeedMore => return None,
                Step::Next => {}
            }
        }
    }

    /// The event for a request whose head and body are `bytes`.
    fn rpc(&mut self, bytes: BytesMut, meta: RpcMeta) -> HttpEvent {
        self.state = if meta.reply.keep_alive {
            State::head()
        } else {
            State::Closed
        };
        HttpEvent::Rpc {
            body: RpcRequest {
                bytes,
                body_at: meta.head,
            },
            reply: meta.reply,
            traced: meta.traced,
            budget: meta.budget,
            known: meta.known,
        }
    }

    #[cold]
    fn refuse_and_close(&mut self, buf: &mut BytesMut, error: HttpError) -> HttpEvent {
        self.state = State::Closed;
        buf.clear();
        HttpEvent::Reject {
            status: error.status(),
            close: true,
            header: error.header(),
            origin: Origin::None,
            error,
            head: false,
        }
    }

    fn head(&mut self, buf: &mut BytesMut, scanned: usize, attempted: bool) -> Step {
        if scanned == 0 {
            // RFC 9112 §2.2: ignore empty lines before the request line (some clients
            // send a CRLF after a POST body).
            loop {
                match buf.first() {
                    Some(b'\n') => buf.advance(1),
                    Some(b'\r') => match buf.get(1) {
                        Some(b'\n') => buf.advance(2),
                        Some(_) => break,
                        None => return Step::NeedMore,
                    },
                    _ => break,
                }
            }
        }
        if buf.is_empty() {
            return Step::NeedMore;
        }
        let max_head = self.limits.max_head_bytes;
        let window = buf.len().min(max_head);
        if !attempted {
            // The fast path: the whole head arrived in one read.
            if let Some(step) = self.parse_head(buf, window, false) {
                return step;
            }
        }
        match find_head_end(&buf[..window], scanned) {
            Ok(end) => match self.parse_head(buf, end, true) {
                Some(step) => step,
                None => Step::Event(
                    self.refuse_and_close(buf, HttpError::Malformed(httparse::Error::NewLine)),
                ),
            },
            Err(scanned) => {
                if buf.len() > max_head {
                    return Step::Event(self.refuse_and_close(buf, HttpError::HeadTooLarge));
                }
                self.state = State::Head {
                    scanned,
                    attempted: true,
                };
                Step::NeedMore
            }
        }
    }

    /// Parses `buf[..end]`. With `complete` false (the first try, end of head not yet
    /// known), anything but a complete head returns `None` and is decided later, once
    /// the head's end is found, so that the outcome does not depend on how the stream
    /// was split.
    fn parse_head(&mut self, buf: &mut BytesMut, end: usize, complete: bool) -> Option<Step> {
        let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS_CEILING];
        let slots = &mut slots[..self.limits.max_headers.min(MAX_HEADERS_CEILING)];
        let mut req = httparse::Request::new(&mut []);
        let parsed = req.parse_with_uninit_headers(&buf[..end], slots);
        #[cfg(test)]
        {
            self.parses += 1;
        }
        let plan = match parsed {
            Ok(httparse::Status::Complete(len)) => {
                let plan = self.plan(&req, &buf[..len]);
                // A JSON-RPC request's head stays in front of its body, for `Headers`,
                // and a handshake's goes with its event; any other head is done with.
                if !matches!(plan, Ok(Plan::Rpc { .. } | Plan::Upgrade { .. })) {
                    buf.advance(len);
                }
                plan
            }
            _ if !complete => {
                self.state = State::Head {
                    scanned: 0,
                    attempted: true,
                };
                return None;
            }
            Ok(httparse::Status::Partial) => return None,
            Err(httparse::Error::TooManyHeaders) => Err(HttpError::TooManyHeaders),
            Err(httparse::Error::Version) => match http_version_at(&buf[..end]) {
                Some(at) if buf[at..at + 2] == *b"1." => {
                    // `HTTP/1.x`, x > 1 (httparse knows only 1.0 and 1.1): served as 1.1,
                    // by making it read so. The head is consumed either way.
                    buf[at + 2] = b'1';
                    return self.parse_head(buf, end, complete);
                }
                Some(_) => Err(HttpError::Version),
                None => Err(HttpError::Malformed(httparse::Error::Version)),
            },
            Err(e) => Err(HttpError::Malformed(e)),
        };
        self.state = State::head();
        Some(match plan {
            Ok(plan) => self.start(buf, plan),
            Err(e) => Step::Event(self.refuse_and_close(buf, e)),
        })
    }

    /// Reads the head's fields (`head_len` bytes in all) and decides what to do with the
    /// request.
    fn plan(&self, req: &httparse::Request<'_, '_>, head_bytes: &[u8]) -> Result<Plan, HttpError> {
        let head_len = head_bytes.len();
        let http11 = match req.version {
            Some(1) => true,
            Some(0) => false,
            _ => return Err(HttpError::Version),
        };
        let mut f = Fields::default();
        for header in req.headers.iter() {
            f.add(header.name.as_bytes(), trim_ows(header.value))?;
        }
        if f.hosts > 1 || (http11 && f.hosts == 0) {
            return Err(HttpError::Host);
        }
        let body = if f.te {
            if f.length.is_some() {
                return Err(HttpError::LengthAndChunked);
            }
            if !http11 {
                return Err(HttpError::ChunkedHttp10);
            }
            if !f.te_chunked_last || f.te_chunked > 1 {
                return Err(HttpError::NotChunked);
            }
            if f.te_other {
                return Err(HttpError::TransferCoding);
            }
            Framing::Chunked
        } else {
            match f.length {
                Some(n) => Framing::Length(n),
                None => Framing::None,
            }
        };
        let keep_alive = !f.close && (http11 || f.keep_alive);
        // RFC 9110 §10.1.1: a 100-continue expectation in HTTP/1.0 is ignored.
        let expect = http11 && f.expect;
        let cors = self.limits.cors.as_deref();
        let origin = match (cors, f.origin) {
            (Some(cors), Some(value)) => cors.check(value),
            _ => Origin::None,
        };
        let reply = Reply { keep_alive, origin };

        let method = req.method.unwrap_or_default();
        // A response to HEAD carries the headers a GET would get, but never a body.
        let head = method == "HEAD";
        let path = request_path(req.path.unwrap_or_default());
        let is_rpc = self.limits.rpc && path == self.limits.path;
        let is_health = path == HEALTH_PATH;
        let is_metrics = self.limits.metrics && path == METRICS_PATH;
        let refuse = |error| Plan::Refuse {
            error,
            body,
            expect,
            reply,
            head,
        };
        if is_rpc && method == "POST" {
            let error = match body {
                Framing::None => Some(HttpError::LengthRequired),
                Framing::Length(n) if n > self.limits.max_body_bytes as u64 => {
                    Some(HttpError::BodyTooLarge)
                }
                _ if f.not_json => Some(HttpError::MediaType),
                _ if f.encoded => Some(HttpError::ContentEncoding),
                _ => None,
            };
            return Ok(match error {
                None => Plan::Rpc {
                    body,
                    expect,
                    meta: RpcMeta {
                        reply,
                        traced: f.traced,
                        budget: f.budget.flatten(),
                        known: Known {
                            authorization: f.authorization.and_then(|v| Known::span(head_bytes, v)),
                            idempotency_key: f
                                .idempotency_key
                                .and_then(|v| Known::span(head_bytes, v)),
                        },
                        head: head_len,
                    },
                },
                Some(error) => refuse(error),
            });
        }
        let preflight = is_rpc && cors.is_some() && method == "OPTIONS";
        if preflight && !origin.allowed() {
            return Ok(refuse(HttpError::Origin));
        }
        if is_rpc && method == "GET" && f.websocket {
            // A page's scripts may open a WebSocket to any site, and read what comes
            // back (no CORS for WebSocket): a page of another origin may not
            // (cross-site hijacking). With CORS origins configured, those are the
            // pages allowed; without, only the server's own (the `Origin` names the
            // `Host`). Clients that are not browsers send no `Origin`.
            let foreign = match (cors, f.origin) {
                (Some(_), _) => origin == Origin::Refused,
                (None, Some(o)) => !same_site(o, f.host.unwrap_or_default()),
                (None, None) => false,
            };
            if foreign {
                return Ok(refuse(HttpError::Origin));
            }
            return Ok(match websocket_key(&f, http11, body) {
                Ok(key) => Plan::Upgrade {
                    key,
                    head: head_len,
                    reply: Reply {
                        keep_alive: false,
                        origin,
                    },
                },
                Err(error) => refuse(error),
            });
        }
        let get = method == "GET" || head;
        if preflight || ((is_health || is_metrics) && get) {
            let probe = match (preflight, is_metrics) {
                (true, _) => Probe::Preflight,
                (false, true) => Probe::Metrics,
                (false, false) => Probe::Health,
            };
            // Looked for in scrapes' heads alone (no field of other requests is compared
            // with this name).
            let timeout = (probe == Probe::Metrics)
                .then(|| scrape_timeout(req.headers))
                .flatten();
            return Ok(Plan::Health {
                body,
                expect,
                reply,
                head,
                probe,
                timeout,
            });
        }
        let error = match (is_rpc, is_health || is_metrics, cors.is_some()) {
            (true, true, false) => HttpError::Method {
                allow: "GET, HEAD, POST",
            },
            (true, true, true) => HttpError::Method {
                allow: "GET, HEAD, POST, OPTIONS",
            },
            (true, false, false) => HttpError::Method { allow: "POST" },
            (true, false, true) => HttpError::Method {
                allow: "POST, OPTIONS",
            },
            (false, true, _) => HttpError::Method { allow: "GET, HEAD" },
            (false, false, _) => HttpError::NotFound,
        };
        Ok(refuse(error))
    }

    /// Sets the state for the request's body and returns what to tell the caller now.
    fn start(&mut self, buf: &mut BytesMut, plan: Plan) -> Step {
        match plan {
            Plan::Upgrade { key, head, reply } => {
                // What follows the head is WebSocket's, not this decoder's.
                self.state = State::Closed;
                let head = buf.split_to(head).freeze();
                Step::Event(HttpEvent::Upgrade { key, head, reply })
            }
            Plan::Rpc { body, expect, meta } => {
                self.state = match body {
                    Framing::Chunked => State::Chunked {
                        chunked: Chunked::after(Strictness::Strict, meta.head),
                        meta,
                    },
                    // `plan` checked the length against `max_body_bytes`, a usize.
                    Framing::Length(n) => State::Body {
                        len: usize::try_from(n).unwrap_or(usize::MAX),
                        meta,
                    },
                    Framing::None => State::Body { len: 0, meta },
                };
                if expect && !matches!(body, Framing::Length(0) | Framing::None) {
                    Step::Event(HttpEvent::Continue {
                        head: meta.head,
                        reply: meta.reply,
                    })
                } else {
                    Step::Next
                }
            }
            Plan::Health {
                body,
                expect,
                mut reply,
                head,
                probe,
                timeout,
            } => {
                reply.keep_alive = reply.keep_alive && self.skip_body(body, expect);
                if !reply.keep_alive {
                    self.state = State::Closed;
                }
                Step::Event(match probe {
                    Probe::Preflight => HttpEvent::Preflight { reply },
                    Probe::Metrics => HttpEvent::Metrics {
                        reply,
                        head,
                        timeout,
                    },
                    Probe::Health => HttpEvent::Health { reply, head },
                })
            }
            Plan::Refuse {
                error,
                body,
                expect,
                reply,
                head,
            } => {
                if reply.keep_alive && self.skip_body(body, expect) {
                    Step::Event(HttpEvent::Reject {
                        status: error.status(),
                        close: false,
                        header: error.header(),
                        origin: reply.origin,
                        error,
                        head,
                    })
                } else {
                    let mut ev = self.refuse_and_close(buf, error);
                    if let HttpEvent::Reject {
                        head: h, origin: o, ..
                    } = &mut ev
                    {
                        (*h, *o) = (head, reply.origin);
                    }
                    Step::Event(ev)
                }
            }
        }
    }

    /// Arranges to discard a body the caller does not want, if that is safe: a known
    /// length within `max_body_bytes` and no 100-continue outstanding (the client may
    /// or may not send a body it was not invited to send).
    fn skip_body(&mut self, body: Framing, expect: bool) -> bool {
        match body {
            Framing::None | Framing::Length(0) => {
                self.state = State::head();
                true
            }
            Framing::Length(n) if !expect && n <= self.limits.max_body_bytes as u64 => {
                self.state = State::Skip {
                    left: usize::try_from(n).unwrap_or(usize::MAX),
                };
                true
            }
            _ => false,
        }
    }
}

/// Where the head ends: the index just past the first empty line (`\n\n` or `\n\r\n`)
/// in `head`, searching the `\n`s from `from` on. `Err(n)`: no end in `head`, and the
/// next search may start at `n`. The request line cannot be empty (leading empty lines
/// were dropped), so an empty line here always ends the head.
fn find_head_end(head: &[u8], from: usize) -> Result<usize, usize> {
    let mut at = from;
    while let Some(i) = head.get(at..).and_then(|rest| memchr::memchr(b'\n', rest)) {
        let lf = at + i;
        let before = lf.checked_sub(1).and_then(|j| head.get(j));
        let two_before = lf.checked_sub(2).and_then(|j| head.get(j));
        if before == Some(&b'\n') || (before == Some(&b'\r') && two_before == Some(&b'\n')) {
            return Ok(lf + 1);
        }
        at = lf + 1;
    }
    Err(head.len())
}

/// After httparse's version error: if the request line (complete, ended by LF) is
/// well-formed with a real `HTTP/d.d` version, where its `d.d` starts in `head`.
/// Otherwise the line is garbage (400), not an unsupported version (505).
fn http_version_at(head: &[u8]) -> Option<usize> {
    let len = memchr::memchr(b'\n', head)?;
    let line = &head[..len];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|&b| b == b' ');
    let (Some(_method), Some(_target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    matches!(version, [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
        if major.is_ascii_digit() && minor.is_ascii_digit())
    .then(|| line.len() - 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::testing::{body_and_base, BODY, CHUNKED_HEAD, KEEP};
    use proptest::prelude::*;

    /// An event with owned, comparable fields.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Ev {
        Rpc(Vec<u8>, bool, Option<String>),
        Health(bool),
        Metrics(bool),
        Preflight(Reply),
        Continue,
        Upgrade([u8; 24], Vec<u8>),
        Reject(u16, bool, Option<(&'static str, &'static str)>),
    }

    fn owned(e: HttpEvent) -> Ev {
        match e {
            HttpEvent::Rpc {
                body,
                reply,
                traced,
                ..
            } => {
                assert_whole_head(body.head());
                Ev::Rpc(
                    body.to_vec(),
                    reply.keep_alive,
                    traced
                        .then(|| body.trace())
                        .flatten()
                        .map(|t| t.trace_id().to_string()),
                )
            }
            HttpEvent::Health { reply, .. } => Ev::Health(reply.keep_alive),
            HttpEvent::Metrics { reply, .. } => Ev::Metrics(reply.keep_alive),
            HttpEvent::Preflight { reply } => Ev::Preflight(reply),
            HttpEvent::Continue { .. } => Ev::Continue,
            HttpEvent::Upgrade { key, head, .. } => Ev::Upgrade(key, head.to_vec()),
            HttpEvent::Reject {
                status,
                close,
                header,
                error,
                ..
            } => {
                assert_eq!((status, header), (error.status(), error.header()));
                Ev::Reject(status, close, header)
            }
        }
    }

    /// Every Rpc event's head is a POST's whole head, exactly (whatever the framing of
    /// its body and however the bytes arrived): httparse reads it to its last byte.
    fn assert_whole_head(head: &[u8]) {
        let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS_CEILING];
        let parsed = httparse::Request::new(&mut fields).parse(head);
        assert_eq!(
            parsed,
            Ok(httparse::Status::Complete(head.len())),
            "{:?}",
            String::from_utf8_lossy(head)
        );
        assert!(head.starts_with(b"POST "), "{head:?}");
    }

    fn rpc(body: &str) -> Ev {
        Ev::Rpc(body.as_bytes().to_vec(), true, None)
    }

    fn rej(status: u16, close: bool) -> Ev {
        Ev::Reject(status, close, None)
    }

    /// The most a decoder may hold between calls (see the module's security bound).
    fn bound(l: &HttpLimits) -> usize {
        l.max_body_bytes + 2 * l.max_head_bytes.max(MAX_CHUNK_LINE)
    }

    /// Feeds `pieces` in turn, decoding everything after each, and checks the memory
    /// bound whenever the decoder asks for more (for pieces of one byte, that is the
    /// decoder's own bound). Each event comes with its [`HttpError`], if a refusal.
    fn feed_full<'a>(
        limits: &HttpLimits,
        pieces: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<(Ev, Option<HttpError>)> {
        let mut dec = HttpDecoder::new(limits.clone());
        let mut buf = BytesMut::new();
        let mut events = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            while let Some(e) = dec.decode(&mut buf) {
                let error = match e {
                    HttpEvent::Reject { error, .. } => Some(error),
                    _ => None,
                };
                events.push((owned(e), error));
            }
            assert!(
                buf.len() <= bound(limits) + piece.len(),
                "holding {} bytes",
                buf.len()
            );
        }
        events
    }

    fn feed<'a>(limits: &HttpLimits, pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<Ev> {
        feed_full(limits, pieces).into_iter().map(|e| e.0).collect()
    }

    fn at_once(limits: &HttpLimits, input: &[u8]) -> Vec<Ev> {
        feed(limits, [input])
    }

    fn bytewise(limits: &HttpLimits, input: &[u8]) -> Vec<Ev> {
        feed(limits, input.chunks(1))
    }

    /// `input` cut into pieces of the sizes in `cuts` (cycled).
    fn pieces<'a>(input: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut pieces = Vec::new();
        let mut rest = input;
        let mut sizes = cuts.iter().cycle();
        while !rest.is_empty() {
            let n = sizes
                .next()
                .copied()
                .unwrap_or(rest.len())
                .clamp(1, rest.len());
            let (piece, tail) = rest.split_at(n);
            pieces.push(piece);
            rest = tail;
        }
        pieces
    }

    fn split(limits: &HttpLimits, input: &[u8], cuts: &[usize]) -> Vec<Ev> {
        feed(limits, pieces(input, cuts))
    }

    /// Asserts that every way of feeding `input` gives the same events and errors.
    fn assert_split_invariant(limits: &HttpLimits, input: &[u8], cuts: &[usize]) {
        let whole = feed_full(limits, [input]);
        assert_eq!(
            feed_full(limits, pieces(input, cuts)),
            whole,
            "split {cuts:?}"
        );
        assert_eq!(feed_full(limits, input.chunks(1)), whole, "byte at a time");
    }

    fn post_with(headers: &str, body: &str) -> String {
        format!(
            "POST / HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    fn post(body: &str) -> String {
        post_with("Content-Type: application/json\r\n", body)
    }

    /// A trailer field line of exactly `len` bytes, CRLF excluded.
    fn trailer(len: usize) -> String {
        format!("A: {}", "b".repeat(len - 3))
    }

    const GET_HEALTH: &str = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

    struct Case {
        name: &'static str,
        limits: HttpLimits,
        input: Vec<u8>,
        want: Vec<Ev>,
    }

    fn case(name: &'static str, input: impl Into<Vec<u8>>, want: Vec<Ev>) -> Case {
        Case {
            name,
            limits: HttpLimits::default(),
            input: input.into(),
            want,
        }
    }

    fn small(
        name: &'static str,
        limits: HttpLimits,
        input: impl Into<Vec<u8>>,
        want: Vec<Ev>,
    ) -> Case {
        Case {
            name,
            limits,
            input: input.into(),
            want,
        }
    }

    fn limits(max_head_bytes: usize, max_body_bytes: usize, max_headers: usize) -> HttpLimits {
        HttpLimits {
            max_head_bytes,
            max_body_bytes,
            max_headers,
            ..HttpLimits::default()
        }
    }

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    fn cases() -> Vec<Case> {
        let next = post(BODY);
        let then = |first: &str| format!("{first}{next}");
        let head_of = |body: &str| post(body).len() - body.len();
        vec![
            // --- JSON-RPC requests and keep-alive rules ---
            case("post", post(BODY), vec![rpc(BODY)]),
            case(
                "empty body",
                then(&post("")),
                vec![rpc(""), rpc(BODY)],
            ),
            case(
                "traceparent",
                post_with(&format!("traceparent:  {TRACEPARENT} \r\n"), "{}"),
                vec![Ev::Rpc(b"{}".to_vec(), true, Some(TRACE_ID.into()))],
            ),
            case(
                "traceparent: the first valid one wins",
                post_with(
                    &format!("Traceparent: nonsense\r\ntraceparent: {TRACEPARENT}\r\nTRACEPARENT: {}\r\n", TRACEPARENT.replace("4bf9", "0000")),
                    "{}",
                ),
                vec![Ev::Rpc(b"{}".to_vec(), true, Some(TRACE_ID.into()))],
            ),
            case(
                "traceparent not valid is ignored",
                post_with(&format!("traceparent: {}\r\n", TRACEPARENT.to_uppercase()), "{}")
                    + &post_with("traceparent: 00-0-0-01\r\n", "{}"),
                vec![rpc("{}"), rpc("{}")],
            ),
            case(
                "1.1 close: later requests ignored",
                then(&post_with("Connection: close\r\n", "[]")),
                vec![Ev::Rpc(b"[]".to_vec(), false, None)],
            ),
            case(
                "1.1 connection list, any case",
                post_with("Connection: Upgrade, CLOSE\r\n", "[]"),
                vec![Ev::Rpc(b"[]".to_vec(), false, None)],
            ),
            case(
                "1.0 closes by default",
                then("POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\n[]"),
                vec![Ev::Rpc(b"[]".to_vec(), false, None)],
            ),
            case(
                "1.0 keep-alive",
                then("POST / HTTP/1.0\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\n[]"),
                vec![rpc("[]"), rpc(BODY)],
            ),
            case(
                "1.0 keep-alive and close: close wins",
                "POST / HTTP/1.0\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\n[]",
                vec![Ev::Rpc(b"[]".to_vec(), false, None)],
            ),
            case(
                "pipelined",
                format!("{next}{GET_HEALTH}{}{next}", post("[1]")),
                vec![rpc(BODY), Ev::Health(true), rpc("[1]"), rpc(BODY)],
            ),
            case(
                "leading empty lines are ignored",
                format!("\r\n\n\r\n{next}\r\n{next}"),
                vec![rpc(BODY), rpc(BODY)],
            ),
            case(
                "bare LF line endings in the head",
                "POST / HTTP/1.1\nHost: x\nContent-Length: 2\n\n[]",
                vec![rpc("[]")],
            ),
            case(
                "query string and absolute form",
                "POST /?a=b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]\
                 POST HTTP://x:80/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]\
                 POST https://x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]",
                vec![rpc("[]"), rpc("[]"), rpc("[]")],
            ),
            case(
                "Content-Type with parameters, any case; missing is accepted",
                post_with("Content-Type: Application/JSON ; charset=utf-8\r\n", "[]")
                    + &post_with("", "[]"),
                vec![rpc("[]"), rpc("[]")],
            ),
            case(
                "identical Content-Lengths",
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2, 2\r\n\r\n[]",
                vec![rpc("[]")],
            ),
            // --- health ---
            case("health", GET_HEALTH, vec![Ev::Health(true)]),
            case(
                "health 1.0, query string",
                "GET /health?full=1 HTTP/1.0\r\n\r\n",
                vec![Ev::Health(false)],
            ),
            case(
                "health with a body: skipped",
                then("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"),
                vec![Ev::Health(true), rpc(BODY)],
            ),
            case(
                "health with a chunked body: close",
                then("GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                vec![Ev::Health(false)],
            ),
            // --- chunked ---
            case(
                "chunked with extensions and trailers",
                then(
                    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
                     5;foo=bar\r\nhello\r\n6 ; x=\"y;z\"\r\n world\r\nA\r\n0123456789\r\n\
                     0;last\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
                ),
                vec![rpc("hello world0123456789"), rpc(BODY)],
            ),
            case(
                "chunked, Transfer-Encoding any case",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
                vec![rpc("[]")],
            ),
            case(
                "chunked empty body",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                vec![rpc("")],
            ),
            // --- Expect: 100-continue ---
            case(
                "expect continue",
                then(&post_with("Expect: 100-continue\r\n", BODY)),
                vec![Ev::Continue, rpc(BODY), rpc(BODY)],
            ),
            case(
                "expect continue, chunked",
                "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
                vec![Ev::Continue, rpc("[]")],
            ),
            case(
                "expect continue with no body: no 100",
                post_with("Expect: 100-continue\r\n", ""),
                vec![rpc("")],
            ),
            case(
                "expect continue in 1.0 is ignored",
                "POST / HTTP/1.0\r\nExpect: 100-continue\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n[]",
                vec![rpc("[]")],
            ),
            case(
                "expect continue refused: no 100, close",
                post_with("Expect: 100-continue\r\nContent-Type: text/plain\r\n", BODY),
                vec![rej(415, true)],
            ),
            // --- 400 ---
            case("bad request line", "GARBAGE\r\n\r\n", vec![rej(400, true)]),
            case(
                "bad request line: bad target",
                "POST / / HTTP/1.1\r\nHost: x\r\n\r\n",
                vec![rej(400, true)],
            ),
            case("bad header", "GET / HTTP/1.1\r\nHost x\r\n\r\n", vec![rej(400, true)]),
            case(
                "bare CR in head",
                "GET / HTTP/1.1\r\nHost: x\r\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "not an HTTP version",
                "GET / HTTX/1.1\r\nHost: x\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "missing Host in 1.1",
                "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]",
                vec![rej(400, true)],
            ),
            case(
                "two Hosts",
                "POST / HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 2\r\n\r\n[]",
                vec![rej(400, true)],
            ),
            case(
                "Content-Length and Transfer-Encoding",
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "Content-Length not a number",
                post_with("", "").replace("Length: 0", "Length: 0x1"),
                vec![rej(400, true)],
            ),
            case(
                "Content-Length negative",
                post_with("", "").replace("Length: 0", "Length: -1"),
                vec![rej(400, true)],
            ),
            case(
                "Content-Length empty",
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "Content-Length overflow",
                post_with("", "").replace("Length: 0", "Length: 18446744073709551616"),
                vec![rej(400, true)],
            ),
            case(
                "Content-Length list that differs",
                post_with("", "").replace("Length: 0", "Length: 0, 1"),
                vec![rej(400, true)],
            ),
            case(
                "duplicate differing Content-Length",
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n[]",
                vec![rej(400, true)],
            ),
            case(
                "Transfer-Encoding not ending in chunked",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "Transfer-Encoding identity",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunked twice",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "Transfer-Encoding in 1.0",
                "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk size not hex",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk size with 0x",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n[]\r\n0\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk size overflow",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk data without CRLF",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]xx0\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk line with bare LF",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\n[]\r\n0\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk extension with a bare CR",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;a\rb\r\n[]\r\n0\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk size with trailing space and no extension",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\n[]\r\n0\r\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "trailer with bare LF",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nA: b\n\r\n",
                vec![rej(400, true)],
            ),
            case(
                "chunk line at its limit",
                format!(
                    "{CHUNKED_HEAD}2;{}\r\n[]\r\n0\r\n\r\n",
                    "e".repeat(MAX_CHUNK_LINE - 4)
                ),
                vec![rpc("[]")],
            ),
            small(
                "chunk lines at their limit behind a head at its limit",
                limits(64, 16, 8),
                {
                    let line = |size: &str| format!("{size};{}\r\n", "e".repeat(MAX_CHUNK_LINE - 4));
                    format!(
                        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX: yyy\r\n\r\n{}[1\r\n{},2\r\n{}]\r\n0\r\n\r\n",
                        line("2"),
                        line("2"),
                        line("1")
                    )
                },
                vec![rpc("[1,2]")],
            ),
            case(
                "chunk line too long",
                format!(
                    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;{}\r\n[]\r\n0\r\n\r\n",
                    "e".repeat(MAX_CHUNK_LINE)
                ),
                vec![rej(400, true)],
            ),
            // --- 404, 405, 411, 413, 415 ---
            case(
                "404, body skipped",
                then("POST /rpc HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n[1,]"),
                vec![rej(404, false), rpc(BODY)],
            ),
            case(
                "404 with a chunked body: close",
                then("POST /rpc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                vec![rej(404, true)],
            ),
            case(
                "404 on 1.0 closes",
                then("GET /x HTTP/1.0\r\n\r\n"),
                vec![rej(404, true)],
            ),
            case(
                "405 GET on the rpc path",
                then("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
                vec![Ev::Reject(405, false, Some(("Allow", "POST"))), rpc(BODY)],
            ),
            case(
                "405 POST on health",
                then("POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"),
                vec![Ev::Reject(405, false, Some(("Allow", "GET, HEAD"))), rpc(BODY)],
            ),
            case(
                "HEAD on health: answered like GET, without a body",
                "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
                vec![Ev::Health(true)],
            ),
            case(
                "405 HEAD on the RPC path",
                "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n",
                vec![Ev::Reject(405, false, Some(("Allow", "POST")))],
            ),
            case(
                "411",
                then("POST / HTTP/1.1\r\nHost: x\r\n\r\n"),
                vec![rej(411, false), rpc(BODY)],
            ),
            case(
                "411 on 1.0 closes",
                "POST / HTTP/1.0\r\n\r\n[]",
                vec![rej(411, true)],
            ),
            case(
                "413 Content-Length over the limit, not read",
                then(&post_with("", "").replace("Length: 0", "Length: 1048577")),
                vec![rej(413, true)],
            ),
            case(
                "415, body skipped",
                then(&post_with("Content-Type: text/plain\r\n", BODY)),
                vec![rej(415, false), rpc(BODY)],
            ),
            case(
                "the other JSON-RPC content types, with parameters",
                post_with("Content-Type: application/json-rpc\r\n", BODY)
                    + &post_with("content-type: Application/JSONRequest; charset=utf-8\r\n", BODY)
                    + &post_with("Content-Type: application/json ; charset=UTF-8\r\n", BODY),
                vec![rpc(BODY), rpc(BODY), rpc(BODY)],
            ),
            case(
                "415 application/json-seq",
                post_with("Content-Type: application/json-seq\r\n", BODY),
                vec![rej(415, false)],
            ),
            case(
                "415 Content-Encoding gzip, body skipped",
                then(&post_with("Content-Encoding: gzip\r\n", "\x1f\u{8b}\x08")),
                vec![
                    Ev::Reject(415, false, Some(("Accept-Encoding", "identity"))),
                    rpc(BODY),
                ],
            ),
            case(
                "415 identity then br",
                post_with("Content-Encoding: identity, br\r\n", BODY),
                vec![Ev::Reject(415, false, Some(("Accept-Encoding", "identity")))],
            ),
            case(
                "Content-Encoding identity is no coding",
                post_with("Content-Encoding: Identity\r\n", BODY),
                vec![rpc(BODY)],
            ),
            case(
                "415 one of two Content-Types",
                post_with(
                    "Content-Type: application/json\r\nContent-Type: text/html\r\n",
                    BODY,
                ),
                vec![rej(415, false)],
            ),
            case(
                "415 empty Content-Type",
                post_with("Content-Type:\r\n", BODY),
                vec![rej(415, false)],
            ),
            // --- 501, 505 ---
            case(
                "501 gzip, chunked",
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                vec![rej(501, true)],
            ),
            case("505 HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", vec![rej(505, true)]),
            case("505 HTTP/3.0", "POST / HTTP/3.0\r\n\r\n", vec![rej(505, true)]),
            case(
                "HTTP/1.2 and 1.9 are served as 1.1",
                then(&post(BODY).replace("HTTP/1.1", "HTTP/1.2"))
                    .replace("HTTP/1.1", "HTTP/1.9"),
                vec![rpc(BODY), rpc(BODY)],
            ),
            case(
                "HTTP/1.2 needs Host, as 1.1 does",
                "POST / HTTP/1.2\r\nContent-Length: 2\r\n\r\n[]",
                vec![rej(400, true)],
            ),
            case("after a close, nothing", then("\x00\r\n\r\n"), vec![rej(400, true)]),
            // --- limits, exact ---
            small(
                "head exactly max_head_bytes",
                limits(head_of("[]"), 1 << 20, 64),
                post("[]") + &post("[]"),
                vec![rpc("[]"), rpc("[]")],
            ),
            small(
                "head one over max_head_bytes",
                limits(head_of("[]") - 1, 1 << 20, 64),
                post("[]"),
                vec![rej(431, true)],
            ),
            small(
                "body exactly max_body_bytes",
                limits(8192, 2, 64),
                post("[]"),
                vec![rpc("[]")],
            ),
            small(
                "body one over max_body_bytes",
                limits(8192, 2, 64),
                post("[1]"),
                vec![rej(413, true)],
            ),
            small(
                "chunked body exactly max_body_bytes",
                limits(8192, 5, 64),
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[1\r\n3\r\n,2]\r\n0\r\n\r\n",
                vec![rpc("[1,2]")],
            ),
            small(
                "chunked body one over max_body_bytes",
                limits(8192, 4, 64),
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[1\r\n3\r\n,2]\r\n0\r\n\r\n",
                vec![rej(413, true)],
            ),
            small(
                "chunk size far over max_body_bytes",
                limits(8192, 4, 64),
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffff\r\n",
                vec![rej(413, true)],
            ),
            small(
                "headers exactly max_headers",
                limits(8192, 64, 3),
                post("[]"),
                vec![rpc("[]")],
            ),
            small(
                "headers one over max_headers",
                limits(8192, 64, 2),
                post("[]"),
                vec![rej(431, true)],
            ),
            small(
                "trailers exactly max_head_bytes",
                limits(CHUNKED_HEAD.len(), 64, 64),
                format!("{CHUNKED_HEAD}0\r\n{}\r\n\r\n", trailer(CHUNKED_HEAD.len() - 4)),
                vec![rpc("")],
            ),
            small(
                "trailers one over max_head_bytes",
                limits(CHUNKED_HEAD.len(), 64, 64),
                format!("{CHUNKED_HEAD}0\r\n{}\r\n\r\n", trailer(CHUNKED_HEAD.len() - 3)),
                vec![rej(431, true)],
            ),
            small(
                "a refused body at max_body_bytes is skipped",
                limits(8192, 4, 64),
                "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcdPOST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]",
                vec![rej(404, false), rpc("[]")],
            ),
            small(
                "a refused body over max_body_bytes closes",
                limits(8192, 4, 64),
                "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde",
                vec![rej(404, true)],
            ),
        ]
    }

    #[test]
    fn table() {
        for c in cases() {
            let got = at_once(&c.limits, &c.input);
            assert_eq!(got, c.want, "{} (all at once)", c.name);
            let got = bytewise(&c.limits, &c.input);
            assert_eq!(got, c.want, "{} (byte at a time)", c.name);
            assert_split_invariant(&c.limits, &c.input, &[7, 1, 30]);
        }
    }

    // --- Real clients' bytes (captured from curl 7.88.1 and python-requests 2.34.2) ---

    /// `curl -H 'Content-Type: application/json' -d '{...}' http://127.0.0.1:18777/`
    const CURL_POST: &[u8] = b"POST / HTTP/1.1\r\nHost: 127.0.0.1:18777\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1}";
    /// `curl http://127.0.0.1:18777/health`
    const CURL_HEALTH: &[u8] =
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:18777\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n";
    /// `requests.post(url, json={...})`
    const REQUESTS_POST: &[u8] = b"POST / HTTP/1.1\r\nHost: 127.0.0.1:18777\r\nUser-Agent: python-requests/2.34.2\r\nAccept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\nContent-Length: 45\r\nContent-Type: application/json\r\n\r\n{\"jsonrpc\": \"2.0\", \"method\": \"ping\", \"id\": 1}";
    /// `requests.post(url, data=iter([...two pieces...]), headers={content-type})`
    const REQUESTS_CHUNKED: &[u8] = b"POST / HTTP/1.1\r\nHost: 127.0.0.1:18777\r\nUser-Agent: python-requests/2.34.2\r\nAccept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n{\"jsonrpc\":\"2.0\",\r\n17\r\n\"method\":\"ping\",\"id\":2}\r\n0\r\n\r\n";
    /// `curl --data-binary @huge.json` with a body over 1 MiB: curl 7.88 adds
    /// `Expect: 100-continue` only past 1 MiB (not past 1 KiB, as older curls did).
    const CURL_EXPECT_HEAD: &[u8] = b"POST / HTTP/1.1\r\nHost: 127.0.0.1:18778\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: 1048647\r\nExpect: 100-continue\r\n\r\n";
    /// `curl -H 'Expect: 100-continue' -d @big.json` (1161-byte body).
    const CURL_EXPECT_FORCED_HEAD: &[u8] = b"POST / HTTP/1.1\r\nHost: 127.0.0.1:18778\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\nExpect: 100-continue\r\nContent-Type: application/json\r\nContent-Length: 1161\r\n\r\n";

    fn big_body(n: usize) -> Vec<u8> {
        format!(
            r#"{{"jsonrpc": "2.0", "method": "echo", "params": ["{}"], "id": 1}}"#,
            "x".repeat(n)
        )
        .into_bytes()
    }

    #[test]
    fn real_clients() {
        let l = HttpLimits::default();
        let body = |raw: &[u8]| raw[raw.len() - 40..].to_vec();
        let all = [CURL_POST, CURL_HEALTH, REQUESTS_POST, REQUESTS_CHUNKED].concat();
        let want = vec![
            Ev::Rpc(body(CURL_POST), true, None),
            Ev::Health(true),
            Ev::Rpc(
                REQUESTS_POST[REQUESTS_POST.len() - 45..].to_vec(),
                true,
                None,
            ),
            rpc(r#"{"jsonrpc":"2.0","method":"ping","id":2}"#),
        ];
        assert_eq!(at_once(&l, &all), want);
        assert_eq!(bytewise(&l, &all), want);

        // Over 1 MiB: with the default limit, 413 at once, without 100 Continue.
        let huge = [CURL_EXPECT_HEAD, &big_body(1024 * 1024 + 10)].concat();
        assert_eq!(huge.len() - CURL_EXPECT_HEAD.len(), 1048647);
        assert_eq!(at_once(&l, CURL_EXPECT_HEAD), vec![rej(413, true)]);
        // With room for it: 100 Continue, then the body.
        let roomy = limits(8192, 2 << 20, 64);
        assert_eq!(
            split(&roomy, &huge, &[CURL_EXPECT_HEAD.len(), 65536]),
            vec![
                Ev::Continue,
                Ev::Rpc(huge[CURL_EXPECT_HEAD.len()..].to_vec(), true, None)
            ]
        );
        let forced = [CURL_EXPECT_FORCED_HEAD, &big_body(1100)].concat();
        assert_eq!(forced.len() - CURL_EXPECT_FORCED_HEAD.len(), 1161);
        let want = vec![Ev::Continue, Ev::Rpc(big_body(1100), true, None)];
        assert_eq!(at_once(&l, &forced), want);
        assert_eq!(bytewise(&l, &forced), want);
    }

    // --- Zero copy and in-place de-chunking ---

    #[test]
    fn content_length_body_is_split_off_without_copying() {
        let req = post(BODY);
        let (body, base) = body_and_base(req.as_bytes());
        assert_eq!(&body[..], BODY.as_bytes());
        assert_eq!(body.as_ptr() as usize, base + req.len() - BODY.len());
        // The head too, in front of it: one piece.
        assert_eq!(body.head(), &req.as_bytes()[..req.len() - BODY.len()]);
        assert_eq!(body.head().as_ptr() as usize, base);
    }

    #[test]
    fn slow_head_is_parsed_at_most_twice() {
        let l = HttpLimits::default();
        let mut head = String::from("POST / HTTP/1.1\r\nHost: x\r\n");
        while head.len() < 8000 {
            head.push_str(&format!("X-Padding: {}\r\n", "a".repeat(200)));
        }
        head.push_str("Content-Length: 2\r\n\r\n[]");
        let mut dec = HttpDecoder::new(l);
        let mut buf = BytesMut::new();
        let mut events = Vec::new();
        for b in head.as_bytes() {
            buf.extend_from_slice(&[*b]);
            events.extend(std::iter::from_fn(|| dec.decode(&mut buf)).map(owned));
        }
        assert_eq!(events, vec![rpc("[]")]);
        assert!(dec.parses <= 2, "{} parses", dec.parses);
        // Whole: exactly one.
        let mut dec = HttpDecoder::new(HttpLimits::default());
        let mut buf = BytesMut::from(head.as_bytes());
        assert_eq!(dec.decode(&mut buf).map(owned), Some(rpc("[]")));
        assert_eq!(dec.parses, 1);
    }

    #[test]
    fn oversized_head_is_refused_as_soon_as_it_passes_the_limit() {
        let l = limits(100, 100, 64);
        let mut dec = HttpDecoder::new(l);
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nX: "[..]);
        assert!(dec.decode(&mut buf).is_none());
        buf.extend_from_slice(&[b'a'; 81]);
        assert_eq!(buf.len(), 100);
        assert!(dec.decode(&mut buf).is_none());
        buf.extend_from_slice(b"a");
        assert_eq!(dec.decode(&mut buf).map(owned), Some(rej(431, true)));
        assert!(buf.is_empty() && dec.is_closed());
        buf.extend_from_slice(GET_HEALTH.as_bytes());
        assert!(dec.decode(&mut buf).is_none() && buf.is_empty());
    }

    /// The fields the decoder finds for the engine (`Known`) are what a scan of the
    /// head finds: first of several, any case, trimmed, absent; with `Content-Length`
    /// and chunked bodies (whose head moves over the first size line), each request
    /// fed whole and a byte at a time.
    #[test]
    fn known_fields_agree_with_a_scan() {
        use crate::dispatch::context::Headers;
        let heads = [
            "Host: x\r\nAuthorization: Bearer t-1\r\nIdempotency-Key: k-1\r\n",
            "Host: x\r\nauthorization:Bearer t\r\nAUTHORIZATION: second\r\n",
            "Host: x\r\nIdempotency-Key:\t  spaced \t\r\nidempotency-key: second\r\n",
            "Host: x\r\nX-Authorization: no\r\nIdempotency-Keys: no\r\n",
            "Host: x\r\nIdempotency-Key:\r\n",
            "Host: x\r\n",
        ];
        let bodies = [
            "Content-Length: 2\r\n\r\n[]",
            "Transfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
        ];
        for fields in heads {
            for body in bodies {
                let request = format!("POST / HTTP/1.1\r\n{fields}{body}");
                for step in [request.len(), 1] {
                    let mut dec = HttpDecoder::new(HttpLimits::default());
                    let mut buf = BytesMut::new();
                    let mut event = None;
                    for piece in request.as_bytes().chunks(step) {
                        buf.extend_from_slice(piece);
                        if let Some(e) = dec.decode(&mut buf) {
                            event = Some(e);
                        }
                    }
                    let Some(HttpEvent::Rpc { body, known, .. }) = event else {
                        panic!("no request decoded from {request:?}");
                    };
                    let decoded = Headers::decoded(body.head(), known);
                    let scanned = Headers::new(body.head());
                    assert_eq!(
                        decoded.authorization(),
                        scanned.authorization(),
                        "{request:?}"
                    );
                    assert_eq!(
                        decoded.idempotency_key(),
                        scanned.idempotency_key(),
                        "{request:?}"
                    );
                    assert_eq!(scanned.authorization(), scanned.get("Authorization"));
                }
            }
        }
    }

    #[test]
    fn idle_and_closed() {
        let mut dec = HttpDecoder::new(HttpLimits::default());
        let mut buf = BytesMut::from(&b"GET /hea"[..]);
        assert!(dec.is_idle());
        assert!(dec.decode(&mut buf).is_none());
        assert!(!dec.is_idle());
        buf.extend_from_slice(b"lth HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_eq!(dec.decode(&mut buf).map(owned), Some(Ev::Health(false)));
        assert!(dec.is_closed());
    }

    #[test]
    fn a_scrape_carries_its_scrapers_timeout_when_it_is_a_positive_number() {
        let scrape = |field: &str| {
            let mut dec = HttpDecoder::new(HttpLimits {
                metrics: true,
                ..HttpLimits::default()
            });
            let head = format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{field}\r\n");
            let mut buf = BytesMut::from(head.as_bytes());
            match dec.decode(&mut buf) {
                Some(HttpEvent::Metrics { timeout, .. }) => timeout,
                other => panic!("{field:?}: {other:?}"),
            }
        };
        let secs = |s: f64| Some(std::time::Duration::from_secs_f64(s));
        assert_eq!(scrape(""), None);
        assert_eq!(
            scrape("X-Prometheus-Scrape-Timeout-Seconds: 10\r\n"),
            secs(10.0)
        );
        assert_eq!(
            scrape("x-prometheus-scrape-timeout-seconds:  2.5 \r\n"),
            secs(2.5)
        );
        for bad in ["ten", "", "0", "-1", "NaN", "inf"] {
            let field = format!("X-Prometheus-Scrape-Timeout-Seconds: {bad}\r\n");
            assert_eq!(scrape(&field), None, "{bad:?}");
        }
    }

    #[test]
    fn cors_preflights_and_origins() {
        let origins = ["http://a.example".to_owned()];
        let limits = HttpLimits {
            cors: Cors::new(&origins).unwrap(),
            ..HttpLimits::default()
        };
        let preflight = |origin: &str| {
            format!(
                "OPTIONS / HTTP/1.1\r\nHost: x\r\n{origin}Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type\r\n\r\n"
            )
        };
        let listed = Reply {
            keep_alive: true,
            origin: Origin::Listed(0),
        };
        let input = preflight("Origin: http://a.example\r\n")
            + &preflight("Origin: http://b.example\r\n")
            + &preflight("")
            + "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
            + &post_with("Origin: http://a.example\r\n", "[]")
            + &post_with("Origin: http://b.example\r\n", "[]");
        let mut dec = HttpDecoder::new(limits.clone());
        let mut buf = BytesMut::from(input.as_bytes());
        let mut events = Vec::new();
        while let Some(e) = dec.decode(&mut buf) {
            events.push(e);
        }
        let [a, b, none, get, post_a, post_b] = &events[..] else {
            panic!("{events:?}");
        };
        assert_eq!(*a, HttpEvent::Preflight { reply: listed });
        for refused in [b, none] {
            assert!(
                matches!(
                    refused,
                    HttpEvent::Reject {
                        status: 403,
                        close: false,
                        ..
                    }
                ),
                "{refused:?}"
            );
        }
        assert!(
            matches!(
                get,
                HttpEvent::Reject {
                    status: 405,
                    header: Some(("Allow", "POST, OPTIONS")),
                    ..
                }
            ),
            "{get:?}"
        );
        assert!(matches!(post_a, HttpEvent::Rpc { reply, .. } if *reply == listed));
        let refused = Reply {
            keep_alive: true,
            origin: Origin::Refused,
        };
        assert!(matches!(post_b, HttpEvent::Rpc { reply, .. } if *reply == refused));
        // Without CORS, OPTIONS is 405 and Origin is ignored.
        let mut dec = HttpDecoder::new(HttpLimits::default());
        let mut buf = BytesMut::from(
            (preflight("Origin: http://a.example\r\n")
                + &post_with("Origin: http://a.example\r\n", "[]"))
                .as_bytes(),
        );
        assert_eq!(
            dec.decode(&mut buf).map(owned),
            Some(Ev::Reject(405, false, Some(("Allow", "POST"))))
        );
        assert!(
            matches!(dec.decode(&mut buf), Some(HttpEvent::Rpc { reply, .. }) if reply == KEEP)
        );
    }

    #[test]
    fn limits_from_config() {
        let config = Config::default().max_request_bytes(1234);
        let l = HttpLimits::from_config(&config, &ServerConfig::default(), None);
        assert_eq!(HttpDecoder::new(l.clone()).limits(), &l);
        assert_eq!(l.max_body_bytes, 1234);
        assert_eq!(l.max_headers, DEFAULT_MAX_HEADERS);
        assert_eq!(HttpLimits::default().path, "/");
    }

    // --- Split-point invariance ---

    /// One request of a generated stream, with the events it must produce. All keep
    /// the connection open, so a stream of them decodes to the concatenated events.
    fn request() -> impl Strategy<Value = (Vec<u8>, Vec<Ev>)> {
        let body = proptest::collection::vec(any::<u8>(), 0..80);
        let chunks = proptest::collection::vec((1usize..20, any::<bool>()), 1..6);
        prop_oneof![
            body.clone().prop_map(|b| {
                let mut req = format!(
                    "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .into_bytes();
                req.extend_from_slice(&b);
                (req, vec![Ev::Rpc(b, true, None)])
            }),
            (body.clone(), chunks, any::<bool>()).prop_map(|(b, sizes, trailers)| {
                let mut req = CHUNKED_HEAD.as_bytes().to_vec();
                let mut rest = &b[..];
                for (size, ext) in sizes.iter().cycle() {
                    if rest.is_empty() {
                        break;
                    }
                    let (chunk, tail) = rest.split_at((*size).min(rest.len()));
                    let ext = if *ext { ";a=\"b\"" } else { "" };
                    req.extend_from_slice(format!("{:X}{ext}\r\n", chunk.len()).as_bytes());
                    req.extend_from_slice(chunk);
                    req.extend_from_slice(b"\r\n");
                    rest = tail;
                }
                req.extend_from_slice(b"0\r\n");
                if trailers {
                    req.extend_from_slice(b"X-Sum: 1\r\nY: 2\r\n");
                }
                req.extend_from_slice(b"\r\n");
                (req, vec![Ev::Rpc(b, true, None)])
            }),
            body.clone().prop_map(|b| {
                let mut req = format!(
                    "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .into_bytes();
                req.extend_from_slice(&b);
                let mut want = if b.is_empty() { vec![] } else { vec![Ev::Continue] };
                want.push(Ev::Rpc(b, true, Some("4bf92f3577b34da6a3ce929d0e0e4736".into())));
                (req, want)
            }),
            Just((GET_HEALTH.as_bytes().to_vec(), vec![Ev::Health(true)])),
            Just((b"\r\n".to_vec(), vec![])),
            body.clone().prop_map(|b| {
                let mut req = format!(
                    "PUT /nope HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .into_bytes();
                req.extend_from_slice(&b);
                (req, vec![rej(404, false)])
            }),
            body.prop_map(|b| {
                let mut req = format!(
                    "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                )
                .into_bytes();
                req.extend_from_slice(&b);
                (req, vec![rej(415, false)])
            }),
        ]
    }

    fn stream() -> impl Strategy<Value = (Vec<u8>, Vec<Ev>)> {
        proptest::collection::vec(request(), 1..6).prop_map(|reqs| {
            let mut input = Vec::new();
            let mut want = Vec::new();
            for (bytes, events) in reqs {
                input.extend(bytes);
                want.extend(events);
            }
            (input, want)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_split_gives_the_same_events(
            (input, want) in stream(),
            cuts in proptest::collection::vec(1usize..64, 1..16),
        ) {
            let l = HttpLimits::default();
            prop_assert_eq!(&at_once(&l, &input), &want);
            assert_split_invariant(&l, &input, &cuts);
        }

        /// Damaged streams: whatever the decoder makes of them, it makes the same of
        /// every split, never panics and never holds more than its bound.
        #[test]
        fn damaged_streams_split_the_same(
            (mut input, _) in stream(),
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cuts in proptest::collection::vec(1usize..64, 1..16),
            small_limits in any::<bool>(),
        ) {
            for (at, byte) in damage {
                let i = at.index(input.len());
                input[i] = byte;
            }
            let l = if small_limits { limits(64, 32, 4) } else { HttpLimits::default() };
            assert_split_invariant(&l, &input, &cuts);
        }

        #[test]
        fn arbitrary_bytes_split_the_same(
            input in proptest::collection::vec(any::<u8>(), 0..512),
            cuts in proptest::collection::vec(1usize..64, 1..16),
        ) {
            assert_split_invariant(&limits(64, 32, 4), &input, &cuts);
        }
    }
}
