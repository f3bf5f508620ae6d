//! Responses: status lines and reason phrases, the server's own header lines
//! ([`ServerHeaders`]), and the `write_*` functions that append answers to a
//! connection's output buffer.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Cors, HttpError, Origin};
use crate::trace::Trace;

/// How an answer is to be headed, decided by its request: kept alive or not, and the
/// CORS origin it goes to. Stored with an answer that is computed later.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reply {
    /// `Connection: keep-alive` (with `Keep-Alive: timeout=N`) rather than `close`.
    pub(crate) keep_alive: bool,
    /// Whom `Access-Control-Allow-Origin` names, if anyone.
    pub(crate) origin: Origin,
}

impl Reply {
    /// A reply that keeps (or not) the connection, with no CORS headers.
    pub(crate) const fn plain(keep_alive: bool) -> Self {
        Self {
            keep_alive,
            origin: Origin::None,
        }
    }
}

/// `Date: <IMF-fixdate>\r\n`: always this long.
const DATE_LINE_LEN: usize = 37;
/// `Keep-Alive: timeout=N\r\n` at its longest (N of 20 digits).
const KEEP_ALIVE_MAX: usize = b"Keep-Alive: timeout=".len() + 20 + 2;

/// The header lines the server adds to every response on a reactor: `Date`,
/// `Keep-Alive: timeout=N` and the CORS lines. One per reactor thread; [`refresh`]
/// it once per event-loop turn (a clock read; the date is formatted again only when
/// the second changes).
///
/// [`refresh`]: ServerHeaders::refresh
#[derive(Debug)]
pub(crate) struct ServerHeaders {
    date: [u8; DATE_LINE_LEN],
    /// Seconds since the epoch `date` shows.
    date_secs: u64,
    /// `Keep-Alive: timeout=N\r\n`, or empty without an idle timeout.
    keep_alive: Box<[u8]>,
    /// The whole end of a head without CORS lines, kept alive or closing: `Date`,
    /// `Connection` (and `Keep-Alive`), the empty line. Rebuilt with the date, so a
    /// response's head costs one copy for all of them.
    tail_keep: Vec<u8>,
    tail_close: Vec<u8>,
    cors: Option<Arc<Cors>>,
}

impl ServerHeaders {
    /// The lines for a server closing idle connections after `idle_timeout` (rounded
    /// down to whole seconds), with the CORS policy `cors`; the date is set to now.
    pub(crate) fn new(idle_timeout: Option<Duration>, cors: Option<Arc<Cors>>) -> Self {
        let keep_alive = match idle_timeout {
            Some(t) => format!("Keep-Alive: timeout={}\r\n", t.as_secs()).into_bytes(),
            None => Vec::new(),
        };
        let mut h = Self {
            date: [0; DATE_LINE_LEN],
            date_secs: u64::MAX,
            keep_alive: keep_alive.into_boxed_slice(),
            tail_keep: Vec::new(),
            tail_close: Vec::new(),
            cors,
        };
        h.refresh(SystemTime::now());
        h
    }

    /// Sets the date to `now`, formatting it only if the second changed.
    pub(crate) fn refresh(&mut self, now: SystemTime) {
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if secs == self.date_secs {
            return;
        }
        self.date_secs = secs;
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let mut line = &mut self.date[..];
        // Never fails: an IMF-fixdate is 29 bytes, for any time httpdate accepts (years
        // up to 9999; a clock past that shows the epoch rather than nothing).
        let date = httpdate::HttpDate::from(at);
        if std::io::Write::write_fmt(&mut line, format_args!("Date: {date}\r\n")).is_err() {
            self.date = *b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n";
        }
        // (The same capacity every second: no allocation after the first.)
        self.tail_keep.clear();
        self.tail_keep.extend_from_slice(&self.date);
        self.tail_keep.extend_from_slice(CONNECTION_KEEP_ALIVE);
        self.tail_keep.extend_from_slice(&self.keep_alive);
        self.tail_keep.extend_from_slice(b"\r\n");
        self.tail_close.clear();
        self.tail_close.extend_from_slice(&self.date);
        self.tail_close.extend_from_slice(CONNECTION_CLOSE);
    }

    /// The `Date` line now in force.
    #[cfg(test)]
    pub(crate) fn date_line(&self) -> &[u8] {
        &self.date
    }

    /// The CORS lines for `origin`.
    fn cors_lines(&self, origin: Origin) -> &[u8] {
        self.cors.as_deref().map_or(&[], |c| c.lines(origin))
    }

    /// The CORS lines' length in a head for `reply` (0 without CORS).
    fn cors_len(&self, reply: Reply) -> usize {
        self.cors_lines(reply.origin).len()
    }

    /// Appends `Date`, the CORS lines, `Connection` (with `Keep-Alive` when kept alive)
    /// and the empty line that ends the head.
    fn finish_head(&self, out: &mut Vec<u8>, reply: Reply) {
        self.put_tail(reply, |part| out.extend_from_slice(part));
    }

    /// The end of a head for `reply`: the cached tail when it names no CORS origin.
    fn tail(&self, reply: Reply) -> &[u8] {
        match (reply.keep_alive, self.cors_lines(reply.origin).is_empty()) {
            (true, true) => &self.tail_keep,
            (false, true) => &self.tail_close,
            // Not reached: callers with CORS lines write the parts (see `put_tail`).
            _ => &[],
        }
    }

    /// Writes the end of a head for `reply` through `put`: one cached piece, or with
    /// CORS lines, the parts.
    fn put_tail(&self, reply: Reply, mut put: impl FnMut(&[u8])) {
        let cors = self.cors_lines(reply.origin);
        if cors.is_empty() {
            put(self.tail(reply));
            return;
        }
        put(&self.date);
        put(cors);
        if reply.keep_alive {
            put(CONNECTION_KEEP_ALIVE);
            put(&self.keep_alive);
            put(b"\r\n");
        } else {
            put(CONNECTION_CLOSE);
        }
    }
}

/// The reason phrase for `status` (RFC 9110 names), or `""` for codes not listed.
pub(crate) const fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

const CONNECTION_KEEP_ALIVE: &[u8] = b"Connection: keep-alive\r\n";
const CONNECTION_CLOSE: &[u8] = b"Connection: close\r\n\r\n";

fn status_line(out: &mut Vec<u8>, status: u16) {
    debug_assert!((100..1000).contains(&status), "status {status}");
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a response head: status line, `extra_headers`, `Content-Length` (left out
/// for 1xx, 204 and 304, which must not carry it), then the server's lines (`Date`,
/// CORS, `Connection`, `Keep-Alive`) and the empty line. The caller then appends
/// `content_length` bytes of body.
///
/// `extra_headers` are trusted (not from the peer): names and values must not contain
/// CR or LF. For `100 Continue` use [`write_continue`].
pub(crate) fn write_head(
    out: &mut Vec<u8>,
    status: u16,
    content_length: usize,
    reply: Reply,
    server: &ServerHeaders,
    extra_headers: &[(&str, &str)],
) {
    status_line(out, status);
    for (name, value) in extra_headers {
        debug_assert!(!name.contains(['\r', '\n']) && !value.contains(['\r', '\n']));
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !(status < 200 || status == 204 || status == 304) {
        out.extend_from_slice(b"Content-Length: ");
        out.extend_from_slice(itoa::Buffer::new().format(content_length).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    server.finish_head(out, reply);
}

/// Appends `HTTP/1.1 100 Continue` (the answer to
/// [`HttpEvent::Continue`](super::HttpEvent::Continue)). No `Date`: RFC 9110 §6.6.1
/// leaves it optional on 1xx.
pub(crate) fn write_continue(out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
}

/// Appends `204 No Content`: the answer when a POST held only notifications.
pub(crate) fn write_no_content(out: &mut Vec<u8>, reply: Reply, server: &ServerHeaders) {
    write_head(out, 204, 0, reply, server, &[]);
}

/// The preflight's fixed `Access-Control-*` lines (besides the origin). Browsers may
/// cache the answer for `Max-Age` seconds: 7200, Chromium's cap.
const PREFLIGHT_HEADERS: [(&str, &str); 3] = [
    ("Access-Control-Allow-Methods", "POST, OPTIONS"),
    // The request headers the server reads, and `tracestate`, which tracing clients
    // send with `traceparent` (a browser's call with any other fails its preflight).
    (
        "Access-Control-Allow-Headers",
        "Content-Type, Authorization, Idempotency-Key, RPC-Timeout-Ms, traceparent, tracestate",
    ),
    ("Access-Control-Max-Age", "7200"),
];

/// Appends `204 No Content` answering a CORS preflight
/// ([`HttpEvent::Preflight`](super::HttpEvent::Preflight)).
pub(crate) fn write_preflight(out: &mut Vec<u8>, reply: Reply, server: &ServerHeaders) {
    write_head(out, 204, 0, reply, server, &PREFLIGHT_HEADERS);
}

/// Appends a response with a short `text/plain` body: its reason phrase (say, `408
/// Request Timeout`).
pub(crate) fn write_status(
    out: &mut Vec<u8>,
    status: u16,
    reply: Reply,
    server: &ServerHeaders,
    head: bool,
) {
    write_text(
        out,
        status,
        reply,
        server,
        None,
        head,
        reason(status).as_bytes(),
    );
}

/// Appends the answer to a refused request
/// ([`HttpEvent::Reject`](super::HttpEvent::Reject)): the error's status, the header it
/// must carry (a 405's `Allow`), and a `text/plain` body that says what was wrong: `415
/// Unsupported Media Type: Content-Type is not application/json`.
pub(crate) fn write_refusal(
    out: &mut Vec<u8>,
    error: HttpError,
    reply: Reply,
    server: &ServerHeaders,
    head: bool,
) {
    let status = error.status();
    // On the stack: every message is short (a longer one would be cut, not lost).
    const ROOM: usize = 256;
    let mut text = [0u8; ROOM];
    let mut rest = &mut text[..];
    let _ = std::io::Write::write_fmt(&mut rest, format_args!("{}: {error}", reason(status)));
    let len = ROOM - rest.len();
    write_text(
        out,
        status,
        reply,
        server,
        error.header(),
        head,
        &text[..len],
    );
}

/// Appends `status` with `text` and a newline as its `text/plain` body (none for
/// `HEAD`), and `header` when given.
fn write_text(
    out: &mut Vec<u8>,
    status: u16,
    reply: Reply,
    server: &ServerHeaders,
    header: Option<(&str, &str)>,
    head: bool,
    text: &[u8],
) {
    let body_len = text.len() + 1;
    let content_type = ("Content-Type", "text/plain; charset=utf-8");
    match header {
        Some(h) => write_head(out, status, body_len, reply, server, &[content_type, h]),
        None => write_head(out, status, body_len, reply, server, &[content_type]),
    }
    if !head {
        out.extend_from_slice(text);
        out.push(b'\n');
    }
}

/// Why a scrape got no metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScrapeFailed {
    /// Too many scrapes wait already: `503` with `Retry-After: 1`.
    Busy,
    /// Rendering did not end within its time: `503`.
    TimedOut,
    /// Rendering failed (panicked): `500`.
    Failed,
}

/// Appends the answer to a scrape that got no metrics, with a `text/plain` body that
/// says why (none for `HEAD`).
pub(crate) fn write_metrics_failed(
    out: &mut Vec<u8>,
    why: ScrapeFailed,
    reply: Reply,
    server: &ServerHeaders,
    head: bool,
) {
    let (status, header, text): (u16, _, &[u8]) = match why {
        ScrapeFailed::Busy => (
            503,
            Some(("Retry-After", "1")),
            b"Service Unavailable: too many scrapes of /metrics at once, try again",
        ),
        ScrapeFailed::TimedOut => (
            503,
            None,
            b"Service Unavailable: the metrics were not rendered in time",
        ),
        ScrapeFailed::Failed => (
            500,
            None,
            b"Internal Server Error: the metrics could not be rendered",
        ),
    };
    write_text(out, status, reply, server, header, head, text);
}

/// Appends `200 OK` with the metrics' `text` (no body for `HEAD`).
pub(crate) fn write_metrics(
    out: &mut Vec<u8>,
    reply: Reply,
    server: &ServerHeaders,
    head: bool,
    text: &[u8],
) {
    let content_type = ("Content-Type", crate::metrics::CONTENT_TYPE);
    write_head(out, 200, text.len(), reply, server, &[content_type]);
    if !head {
        out.extend_from_slice(text);
    }
}

/// Appends a response with a JSON `body` and a status other than 200 (a JSON-RPC
/// error answered with an HTTP status too: 401, 429), with `extra` header lines.
pub(crate) fn write_json_status(
    out: &mut Vec<u8>,
    status: u16,
    reply: Reply,
    server: &ServerHeaders,
    extra: &[(&str, &str)],
    body: &[u8],
) {
    let mut headers: [(&str, &str); 3] = [("Content-Type", "application/json"); 3];
    let n = extra.len().min(2);
    headers[1..=n].copy_from_slice(&extra[..n]);
    write_head(out, status, body.len(), reply, server, &headers[..=n]);
    out.extend_from_slice(body);
}

/// The health check's body.
pub(crate) const HEALTH_BODY: &[u8] = br#"{"status":"ok"}"#;

/// Appends `200 OK` with the body `{"status":"ok"}`.
pub(crate) fn write_health(out: &mut Vec<u8>, reply: Reply, server: &ServerHeaders, head: bool) {
    let mark = begin_json_response(out, reply, server);
    out.extend_from_slice(HEALTH_BODY);
    finish_json_response(out, mark, reply, server);
    if head {
        out.truncate(out.len() - HEALTH_BODY.len());
    }
}

const JSON_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ";
/// Room for the longest 200 JSON head without CORS lines: 20 digits, `Date`,
/// `keep-alive` and the longest `Keep-Alive`.
const JSON_HEAD_ROOM: usize =
    JSON_HEAD.len() + 20 + 2 + DATE_LINE_LEN + CONNECTION_KEEP_ALIVE.len() + KEEP_ALIVE_MAX + 2;

/// Where a JSON response started in the output buffer; from [`begin_json_response`].
#[derive(Debug)]
#[must_use = "finish the response with finish_json_response or cancel_json_response"]
pub(crate) struct JsonResponse {
    start: usize,
    /// Bytes reserved for the head.
    room: usize,
}

/// Starts a `200 OK` JSON response to a request answered as `reply` says: reserves room
/// for its head at the end of `out`. Append the JSON body to `out`, then call
/// [`finish_json_response`] with the same `reply`.
///
/// Cost: `out` grows by a fixed ~190 bytes, more with CORS lines (no allocation once it
/// has grown to fit).
#[inline]
pub(crate) fn begin_json_response(
    out: &mut Vec<u8>,
    reply: Reply,
    server: &ServerHeaders,
) -> JsonResponse {
    let start = out.len();
    let cors = server.cors_len(reply);
    if cors > 0 {
        return begin_with_cors(out, cors);
    }
    // A room of constant size: zeroed inline, where a size known only at run time costs
    // a `memset` call (~25 instructions per response in callgrind).
    out.extend_from_slice(&[0; JSON_HEAD_ROOM]);
    JsonResponse {
        start,
        room: JSON_HEAD_ROOM,
    }
}

/// [`begin_json_response`] with `cors` bytes of CORS lines to make room for. Out of
/// line, so that the common case is small enough to be inlined into the answering code
/// (callgrind: ~23 instructions less per response).
#[cold]
#[inline(never)]
fn begin_with_cors(out: &mut Vec<u8>, cors: usize) -> JsonResponse {
    let start = out.len();
    let room = JSON_HEAD_ROOM + cors;
    out.resize(start + room, 0);
    JsonResponse { start, room }
}

/// `traceparent: ` + a version-00 value + CRLF.
const TRACE_LINE_LEN: usize = 13 + 55 + 2;

/// [`begin_json_response`] for an answer that will carry a `traceparent` line
/// ([`finish_json_response_traced`]).
#[cold]
pub(crate) fn begin_json_response_traced(
    out: &mut Vec<u8>,
    reply: Reply,
    server: &ServerHeaders,
) -> JsonResponse {
    let start = out.len();
    let room = JSON_HEAD_ROOM + server.cors_len(reply) + TRACE_LINE_LEN;
    out.resize(start + room, 0);
    JsonResponse { start, room }
}

/// [`finish_json_response`] with a `traceparent` line naming `trace`'s server span, for
/// a response begun with [`begin_json_response_traced`].
#[cold]
pub(crate) fn finish_json_response_traced(
    out: &mut Vec<u8>,
    mark: JsonResponse,
    reply: Reply,
    server: &ServerHeaders,
    trace: &Trace,
) {
    let body_start = mark.start + mark.room;
    let body_len = out.len() - body_start;
    let mut head = HeadWriter {
        room: &mut out[mark.start..body_start],
        at: 0,
    };
    let mut digits = itoa::Buffer::new();
    head.put(JSON_HEAD);
    head.put(digits.format(body_len).as_bytes());
    head.put(b"\r\n");
    head.put(b"traceparent: ");
    head.put(&trace.traceparent_bytes());
    head.put(b"\r\n");
    server.put_tail(reply, |part| head.put(part));
    let at = mark.start + head.at;
    out.copy_within(body_start.., at);
    out.truncate(at + body_len);
}

/// Completes a response begun with [`begin_json_response`]: writes `HTTP/1.1 200 OK`,
/// `Content-Type: application/json`, `Content-Length` (everything appended since) and
/// the server's lines into the reserved room, then slides the body down over the
/// unused room.
///
/// Cost: one `copy_within` of the body (just written, so in cache); no allocation.
pub(crate) fn finish_json_response(
    out: &mut Vec<u8>,
    mark: JsonResponse,
    reply: Reply,
    server: &ServerHeaders,
) {
    // Kept apart from the traced variant: sharing one body with an optional line cost
    // the common case ~40 instructions per response (callgrind).
    let body_start = mark.start + mark.room;
    let body_len = out.len() - body_start;
    // The head is built in the reserved room (truncating `out` to its start keeps the
    // capacity, and the body beyond is copied out first only if the head could reach
    // it, which the reserved room rules out).
    let mut head = HeadWriter {
        room: &mut out[mark.start..body_start],
        at: 0,
    };
    let mut digits = itoa::Buffer::new();
    head.put(JSON_HEAD);
    head.put(digits.format(body_len).as_bytes());
    head.put(b"\r\n");
    server.put_tail(reply, |part| head.put(part));
    let at = mark.start + head.at;
    out.copy_within(body_start.., at);
    out.truncate(at + body_len);
}

/// Writes a head into room reserved for it (never past its end: the room was sized
/// for the longest head).
struct HeadWriter<'a> {
    room: &'a mut [u8],
    at: usize,
}

impl HeadWriter<'_> {
    fn put(&mut self, part: &[u8]) {
        debug_assert!(
            self.at + part.len() <= self.room.len(),
            "head room too small"
        );
        // Sliced by the part's own length, so a constant part (`JSON_HEAD`, CRLF) is
        // copied inline rather than by a `memcpy` call. (A part that did not fit would
        // be left out; the room rules that out.)
        if let Some(room) = self.room.get_mut(self.at..self.at + part.len()) {
            room.copy_from_slice(part);
            self.at += part.len();
        }
    }
}

/// Turns the last response in `out[from..]` into the connection's last: its
/// `Connection: keep-alive` (and the `Keep-Alive` line after it) becomes
/// `Connection: close` (the server is shutting down). Returns whether one was found
/// there (not if its head was already sent).
///
/// The search is safe from false matches: a JSON body cannot hold a raw CR LF inside
/// a string, and `Connection:` is not JSON outside one.
pub(crate) fn close_after_last(out: &mut Vec<u8>, from: usize) -> bool {
    const KEEP: &[u8] = b"\r\nConnection: keep-alive\r\n";
    let Some(at) = out
        .get(from..)
        .and_then(|tail| memchr::memmem::rfind(tail, KEEP))
    else {
        return false;
    };
    let at = from + at + 2;
    let Some(end) = memchr::memmem::find(&out[at..], b"\r\n\r\n") else {
        return false;
    };
    out.splice(at..at + end + 4, CONNECTION_CLOSE.iter().copied());
    true
}

/// Abandons a response begun with [`begin_json_response`] (say, the POST held only
/// notifications: answer [`write_no_content`] instead).
pub(crate) fn cancel_json_response(out: &mut Vec<u8>, mark: JsonResponse) {
    out.truncate(mark.start);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::testing::{CLOSE, KEEP};

    /// A second the tests format: `Sun, 09 Sep 2001 01:46:40 GMT`.
    const BILLENNIUM: u64 = 1_000_000_000;
    const DATE: &str = "Date: Sun, 09 Sep 2001 01:46:40 GMT\r\n";

    /// Server headers at [`BILLENNIUM`], idle timeout 5.9 s, CORS for `origins`.
    fn headers(origins: &[&str]) -> ServerHeaders {
        let origins: Vec<String> = origins.iter().map(|o| (*o).to_owned()).collect();
        let mut h = ServerHeaders::new(
            Some(Duration::from_millis(5900)),
            Cors::new(&origins).unwrap(),
        );
        h.refresh(SystemTime::UNIX_EPOCH + Duration::from_secs(BILLENNIUM));
        h
    }

    #[test]
    fn close_after_last_marks_only_the_last_unsent_response() {
        let h = headers(&[]);
        let mut out = Vec::new();
        write_no_content(&mut out, KEEP, &h);
        let m = begin_json_response(&mut out, KEEP, &h);
        out.extend_from_slice(br#"{"jsonrpc":"2.0","id":1,"result":"Connection: keep-alive"}"#);
        finish_json_response(&mut out, m, KEEP, &h);
        let first = out.iter().position(|&b| b == b'\n').unwrap_or(0);
        assert!(close_after_last(&mut out, first));
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with(&format!(
            "HTTP/1.1 204 No Content\r\n{DATE}Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n"
        )));
        assert!(
            text.contains(&format!("{DATE}Connection: close\r\n\r\n{{")),
            "{text}"
        );
        assert!(
            text.ends_with(r#""result":"Connection: keep-alive"}"#),
            "{text}"
        );
        // The last head already sent: nothing to change.
        let len = out.len();
        assert!(!close_after_last(&mut out, len - 10));
    }

    // --- Responses ---

    /// Parses one response off `bytes` with httparse: status, headers, body.
    fn parse_response(bytes: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>, usize) {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut res = httparse::Response::new(&mut headers);
        let head = match res.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!("{other:?} in {:?}", String::from_utf8_lossy(bytes)),
        };
        let fields: Vec<(String, String)> = res
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        let len = fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse().unwrap());
        let status = res.code.unwrap();
        let reason = res.reason.unwrap();
        assert_eq!(reason, super::reason(status), "reason for {status}");
        (status, fields, bytes[head..head + len].to_vec(), head + len)
    }

    #[test]
    fn exact_responses() {
        let h = headers(&[]);
        let text = |out: &[u8]| String::from_utf8_lossy(out).into_owned();
        let keep = format!("{DATE}Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n");
        let close = format!("{DATE}Connection: close\r\n\r\n");
        let mut out = Vec::new();
        write_health(&mut out, KEEP, &h, false);
        assert_eq!(
            text(&out),
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n{keep}{{\"status\":\"ok\"}}")
        );
        out.clear();
        // HEAD: the same head, no body.
        write_health(&mut out, KEEP, &h, true);
        assert_eq!(
            text(&out),
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n{keep}"
            )
        );
        out.clear();
        write_refusal(
            &mut out,
            HttpError::Method { allow: "POST" },
            KEEP,
            &h,
            true,
        );
        assert!(out.ends_with(b"\r\n\r\n"), "{}", text(&out));
        out.clear();
        write_no_content(&mut out, CLOSE, &h);
        assert_eq!(text(&out), format!("HTTP/1.1 204 No Content\r\n{close}"));
        out.clear();
        write_refusal(
            &mut out,
            HttpError::Method { allow: "POST" },
            KEEP,
            &h,
            false,
        );
        assert_eq!(
            text(&out),
            format!("HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nAllow: POST\r\nContent-Length: 41\r\n{keep}Method Not Allowed: this path takes POST\n")
        );
        out.clear();
        write_status(&mut out, 408, CLOSE, &h, false);
        assert_eq!(
            text(&out),
            format!("HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 16\r\n{close}Request Timeout\n")
        );
        out.clear();
        write_refusal(&mut out, HttpError::ContentEncoding, CLOSE, &h, false);
        let (status, fields, body, _) = parse_response(&out);
        assert_eq!(status, 415);
        assert!(fields
            .iter()
            .any(|f| f.0 == "Accept-Encoding" && f.1 == "identity"));
        assert_eq!(
            text(&body),
            "Unsupported Media Type: the body must not be compressed: Content-Encoding identity only\n"
        );
        out.clear();
        write_continue(&mut out);
        assert_eq!(out, b"HTTP/1.1 100 Continue\r\n\r\n");
        out.clear();
        write_head(
            &mut out,
            200,
            2,
            CLOSE,
            &h,
            &[("Content-Type", "application/json")],
        );
        out.extend_from_slice(b"{}");
        assert_eq!(
            text(&out),
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n{close}{{}}")
        );
        // No idle timeout: no Keep-Alive line.
        let mut h = ServerHeaders::new(None, None);
        h.refresh(SystemTime::UNIX_EPOCH + Duration::from_secs(BILLENNIUM));
        out.clear();
        write_no_content(&mut out, KEEP, &h);
        assert_eq!(
            text(&out),
            format!("HTTP/1.1 204 No Content\r\n{DATE}Connection: keep-alive\r\n\r\n")
        );
    }

    #[test]
    fn the_date_is_formatted_only_when_the_second_changes() {
        let mut h = headers(&[]);
        assert_eq!(h.date_line(), DATE.as_bytes());
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(BILLENNIUM);
        h.refresh(at + Duration::from_millis(999));
        assert_eq!(h.date_line(), DATE.as_bytes());
        h.refresh(at + Duration::from_secs(86_400 + 3661));
        assert_eq!(h.date_line(), b"Date: Mon, 10 Sep 2001 02:47:41 GMT\r\n");
        // A clock before the epoch shows the epoch.
        h.refresh(SystemTime::UNIX_EPOCH - Duration::from_secs(5));
        assert_eq!(h.date_line(), b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n");
    }

    #[test]
    fn cors_headers() {
        let h = headers(&["https://app.example", "http://localhost:3000"]);
        let cors = h.cors.clone().unwrap();
        assert_eq!(cors.check(b"http://localhost:3000"), Origin::Listed(1));
        assert_eq!(cors.check(b"https://evil.example"), Origin::Refused);
        assert_eq!(cors.check(b"https://app.example/"), Origin::Refused);
        let reply = Reply {
            keep_alive: true,
            origin: Origin::Listed(0),
        };
        let mut out = Vec::new();
        let m = begin_json_response(&mut out, reply, &h);
        out.extend_from_slice(b"{}");
        finish_json_response(&mut out, m, reply, &h);
        let (_, fields, body, _) = parse_response(&out);
        assert_eq!(body, b"{}");
        let has = |n: &str, v: &str| fields.iter().any(|f| f.0 == n && f.1 == v);
        assert!(
            has("Access-Control-Allow-Origin", "https://app.example"),
            "{fields:?}"
        );
        assert!(has("Vary", "Origin"), "{fields:?}");
        out.clear();
        write_preflight(&mut out, reply, &h);
        let (status, fields, _, len) = parse_response(&out);
        assert_eq!((status, len), (204, out.len()));
        let has = |n: &str, v: &str| fields.iter().any(|f| f.0 == n && f.1 == v);
        assert!(has("Access-Control-Allow-Methods", "POST, OPTIONS"));
        assert!(has(
            "Access-Control-Allow-Headers",
            "Content-Type, Authorization, Idempotency-Key, RPC-Timeout-Ms, traceparent, tracestate"
        ));
        assert!(has("Access-Control-Max-Age", "7200"));
        assert!(!fields.iter().any(|f| f.0 == "Content-Length"));
        // `*`: any origin, named as `*`, no Vary.
        let any = headers(&["*"]);
        let cors = any.cors.clone().unwrap();
        assert_eq!(cors.check(b"https://whoever.example"), Origin::Any);
        out.clear();
        let reply = Reply {
            keep_alive: false,
            origin: Origin::Any,
        };
        write_no_content(&mut out, reply, &any);
        let (_, fields, _, _) = parse_response(&out);
        assert!(fields
            .iter()
            .any(|f| f.0 == "Access-Control-Allow-Origin" && f.1 == "*"));
        assert!(!fields.iter().any(|f| f.0 == "Vary"));
        // Origins that would break a header line are refused.
        for bad in ["", "http://a\r\nX: y", "http://a b"] {
            assert_eq!(Cors::new(&[bad.to_owned()]), Err(bad.to_owned()));
        }
        assert_eq!(Cors::new(&[]), Ok(None));
    }

    #[test]
    fn every_refusal_has_a_well_formed_response() {
        let errors = [
            HttpError::Malformed(httparse::Error::Token),
            HttpError::Version,
            HttpError::Host,
            HttpError::ContentLength,
            HttpError::ConflictingLengths,
            HttpError::LengthAndChunked,
            HttpError::NotChunked,
            HttpError::ChunkedHttp10,
            HttpError::TransferCoding,
            HttpError::Chunk,
            HttpError::NotFound,
            HttpError::Method { allow: "GET" },
            HttpError::LengthRequired,
            HttpError::BodyTooLarge,
            HttpError::MediaType,
            HttpError::ContentEncoding,
            HttpError::Origin,
            HttpError::HeadTooLarge,
            HttpError::TooManyHeaders,
            HttpError::TrailersTooLarge,
        ];
        let want_reasons = [
            (400, "Bad Request"),
            (403, "Forbidden"),
            (404, "Not Found"),
            (405, "Method Not Allowed"),
            (411, "Length Required"),
            (413, "Content Too Large"),
            (415, "Unsupported Media Type"),
            (431, "Request Header Fields Too Large"),
            (501, "Not Implemented"),
            (505, "HTTP Version Not Supported"),
        ];
        let h = headers(&[]);
        for e in errors {
            let status = e.status();
            let want = want_reasons.iter().find(|(s, _)| *s == status);
            assert_eq!(want.map(|w| w.1), Some(reason(status)), "{e}");
            for keep_alive in [false, true] {
                let mut out = b"previous".to_vec();
                write_refusal(&mut out, e, Reply::plain(keep_alive), &h, false);
                let (got, fields, body, len) = parse_response(&out[8..]);
                assert_eq!((got, len), (status, out.len() - 8));
                assert_eq!(body, format!("{}: {e}\n", reason(status)).as_bytes());
                let has = |n: &str, v: &str| fields.iter().any(|f| f.0 == n && f.1 == v);
                assert!(has(
                    "Connection",
                    if keep_alive { "keep-alive" } else { "close" }
                ));
                assert!(fields.iter().any(|f| f.0 == "Date"));
                match e.header() {
                    Some((n, v)) => assert!(has(n, v), "{e}: {fields:?}"),
                    None => assert!(!fields.iter().any(|f| f.0 == "Allow")),
                }
            }
        }
    }

    #[test]
    fn json_responses_get_the_right_length_after_earlier_output() {
        let h = headers(&["http://a.example"]);
        let mut out = Vec::new();
        write_continue(&mut out);
        let mut want_bodies = Vec::new();
        for len in [0, 1, 9, 10, 99, 100, 12345] {
            let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            // Begun for one reply, finished for another: at most the room reserved.
            let reply = Reply {
                keep_alive: len % 2 == 0,
                origin: Origin::None,
            };
            let room_for = Reply {
                keep_alive: true,
                origin: Origin::Listed(0),
            };
            let mark = begin_json_response(&mut out, room_for, &h);
            out.extend_from_slice(&body);
            finish_json_response(&mut out, mark, reply, &h);
            want_bodies.push(body);
            // An abandoned response leaves nothing behind.
            let mark = begin_json_response(&mut out, reply, &h);
            out.extend_from_slice(b"[1,2,3]");
            cancel_json_response(&mut out, mark);
        }
        let mut rest = &out[b"HTTP/1.1 100 Continue\r\n\r\n".len()..];
        for (i, want) in want_bodies.iter().enumerate() {
            let (status, fields, body, len) = parse_response(rest);
            assert_eq!((status, &body), (200, want));
            let mut want_fields: Vec<(String, String)> = vec![
                ("Content-Type".into(), "application/json".into()),
                ("Content-Length".into(), want.len().to_string()),
                ("Date".into(), "Sun, 09 Sep 2001 01:46:40 GMT".into()),
            ];
            if want.len() % 2 == 0 {
                want_fields.push(("Connection".into(), "keep-alive".into()));
                want_fields.push(("Keep-Alive".into(), "timeout=5".into()));
            } else {
                want_fields.push(("Connection".into(), "close".into()));
            }
            assert_eq!(fields, want_fields, "response {i}");
            rest = &rest[len..];
        }
        assert!(rest.is_empty());
    }
}
