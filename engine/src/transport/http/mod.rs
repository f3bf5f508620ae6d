//! JSON-RPC over HTTP/1.1: a server-side codec with no I/O, driven by an event loop.
//!
//! [`HttpDecoder::decode`] turns the front of a connection's read buffer into
//! [`HttpEvent`]s; the `write_*` functions append responses to the caller's reused output
//! buffer. Neither allocates per request once the buffers have grown.
//!
//! ```text
//!  read buffer (BytesMut)
//!  ┌───────────────────────┬────────────────────┬───────────────
//!  │ head: httparse reads  │ body               │ next pipelined
//!  │ it in place; it stays │                    │ request …
//!  │ in front of the body  │                    │
//!  └───────────────────────┴────────────────────┴───────────────
//!   ◀── split_to (O(1), no copy): HttpEvent::Rpc ──▶
//!       (other heads are advanced past)
//!
//!  chunked body, de-chunked in place:   [size\r\n][data][\r\n][size;ext\r\n][data]…
//!          the head moves up over it ◀─  dropped   stays    moved down once (copy_within)
//!
//!  out (Vec<u8>):  … previous responses │ head │ JSON body written by the engine │
//!                                        ▲ begin_json_response reserves room here;
//!                                          finish_json_response fills it and slides the
//!                                          body down over the unused part (one memmove)
//! ```
//!
//! # Protocol decisions
//!
//! - **Routes.** `POST` to [`HttpLimits::path`] is JSON-RPC; `GET /health` is the health
//!   check. The path is compared byte for byte, query string excluded; an absolute-form
//!   target (`http://host/path`) is reduced to its path. Any other path is 404; another
//!   method on a known path is 405 with `Allow`. A `GET` on the JSON-RPC path with
//!   `Upgrade: websocket` is a WebSocket handshake ([`HttpEvent::Upgrade`], checked as
//!   RFC 6455 §4.2.1 asks; the connection then leaves HTTP: see `transport::websocket`).
//! - **Content-Type.** `application/json`, `application/json-rpc` or
//!   `application/jsonrequest` (what jsonrpc4j and older clients send), case-insensitive,
//!   with any parameters (`; charset=utf-8`). A request *without* Content-Type is
//!   accepted: many hand-written and minimal clients omit it, and the body is parsed as
//!   JSON either way. Anything else is 415: a form type would let a cross-site page POST
//!   without a CORS preflight.
//! - **Content-Encoding.** Only `identity` (or none): a compressed body is 415 with
//!   `Accept-Encoding: identity` (RFC 9110 §15.5.16), rather than -32700 for bytes that
//!   were never JSON.
//! - **Versions.** `HTTP/1.0` and `HTTP/1.1`; any other `HTTP/1.x` is served as 1.1
//!   (RFC 9110 §2.5: a recipient treats a higher minor version as the highest it
//!   supports). Other major versions are 505.
//! - **CORS** (opt-in, [`Cors`]). With allowed origins configured, `OPTIONS` on the
//!   JSON-RPC path is a preflight: 204 with the `Access-Control-*` headers for an
//!   allowed `Origin`, 403 for any other; every response to a request from an allowed
//!   origin carries `Access-Control-Allow-Origin`. Without it, `OPTIONS` is 405.
//! - **Response headers.** Every response but `100 Continue` carries `Date` (RFC 9110
//!   §6.6.1; formatted once a second, see [`ServerHeaders`]); keep-alive responses carry
//!   `Keep-Alive: timeout=N` with the server's idle timeout, so clients stop reusing a
//!   connection before the server closes it.
//! - **Body framing** (RFC 9112 §6). `Content-Length` (also a list of identical values,
//!   or repeated identical headers) or `Transfer-Encoding: chunked`. Both at once is 400
//!   (request smuggling); differing lengths are 400; a `Transfer-Encoding` whose final
//!   coding is not `chunked` (or that names `chunked` twice) is 400, since the body's
//!   length cannot be known; `chunked` after another coding (`gzip, chunked`) is 501
//!   Not Implemented, as RFC 9112 §6.1 says for codings the server does not understand;
//!   any `Transfer-Encoding` in an HTTP/1.0 request is 400. A POST with neither header
//!   is 411.
//! - **Chunked bodies** are de-chunked in place in the read buffer: the first chunk's
//!   data never moves (the framing before it is dropped with an O(1) advance), later
//!   chunks' data is moved down once with `copy_within`. Chunk lines must end in CRLF;
//!   extensions are allowed and ignored; sizes are hex with overflow checked; trailers
//!   are read and ignored, up to `max_head_bytes` in all.
//! - **Line endings in the head** are CRLF or bare LF, as httparse accepts; in chunked
//!   framing only CRLF is accepted (bare LF there is a known smuggling vector).
//! - **Host.** An HTTP/1.1 request must carry exactly one `Host` (RFC 9112 §3.2), else 400.
//! - **Keep-alive.** HTTP/1.1 stays open unless `Connection: close`; HTTP/1.0 closes
//!   unless `Connection: keep-alive`. After a request that closes, later bytes are ignored.
//! - **Expect: 100-continue** (HTTP/1.1 only; other expectations are ignored): once the
//!   head is accepted, [`HttpEvent::Continue`] is emitted before the body — even if the
//!   body has already arrived, so the events do not depend on how the stream was split.
//!   A refused head gets its error status without 100, and the connection closes (the
//!   client may or may not send the body); so does a request the server refuses on
//!   that event (a missing or bad credential: 401).
//! - **Errors.** Every refusal is an [`HttpEvent::Reject`] carrying an [`HttpError`]. When
//!   the refused request's body can be skipped safely (a `Content-Length` within
//!   `max_body_bytes`, no 100-continue pending), it is discarded as it arrives and the
//!   connection stays usable; otherwise `close` is set.
//!
//! # The security bound
//!
//! The decoder never holds more than `max_head_bytes` of an unfinished head (a longer one
//! is 431 as soon as the excess arrives), never more than `max_body_bytes` of body (a
//! longer `Content-Length` is 413 before any body byte is read; a chunked body is 413
//! as soon as a chunk size would pass the limit), and at most one chunk line
//! (`MAX_CHUNK_LINE`) or `max_head_bytes` of trailers beyond that while de-chunking.
//! A JSON-RPC request's head stays in front of its body until both are complete; while
//! de-chunking, consumed framing is squeezed out as soon as it and the head together are
//! as long as the unread line, so the buffer still holds at most the body and two lines,
//! or the head, the body and one line.
//!
//! # Files
//!
//! As hyper's `proto/h1`: `request.rs` decodes requests ([`HttpDecoder`]), `fields.rs`
//! reads their header fields (and holds the CORS policy), `chunked.rs` de-chunks bodies
//! (the client's response decoder uses it too, with lenient rules), `response.rs` writes
//! answers.

pub(crate) mod chunked;
mod fields;
mod request;
mod response;
#[cfg(test)]
mod testing;

// The names the rest of the crate uses (the server, the fuzz checks); the files here
// share them through these too.
pub(crate) use chunked::MAX_CHUNK_LINE;
pub(crate) use fields::{Cors, Origin};
pub(crate) use request::{HttpDecoder, HttpError, HttpEvent, HttpLimits};
pub(crate) use response::{
    begin_json_response, begin_json_response_traced, cancel_json_response, close_after_last,
    finish_json_response, finish_json_response_traced, write_continue, write_head, write_health,
    write_json_status, write_metrics, write_metrics_failed, write_no_content, write_preflight,
    write_refusal, write_status, JsonResponse, Reply, ScrapeFailed, ServerHeaders,
};
