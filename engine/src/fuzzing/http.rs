//! The `http` target: the HTTP/1.1 request reader, whole vs cut vs byte by byte,
//! bounded, and closing when it says so.

use bytes::BytesMut;

use super::{pieces, split_input};
use crate::transport::http::{
    Cors, HttpDecoder, HttpError, HttpEvent, HttpLimits, Origin, Reply, MAX_CHUNK_LINE,
};

/// Fuzz target `http`: `data` is `[limits][n][n cut offsets][stream]` (see
/// [`split_input`]). The HTTP/1.1 request reader must give the same events (with the
/// same errors) fed whole, cut at the offsets and one byte at a time; hold no more than
/// its documented bound; emit nothing after an event that closes; and keep bodies within
/// `max_body_bytes`.
pub fn check_http(data: &[u8]) {
    let (sel, cuts, stream) = split_input(data);
    let limits = http_limits(sel);
    let whole = feed_http(&limits, [stream]);
    let split = feed_http(&limits, pieces(stream, &cuts));
    let bytes = feed_http(&limits, stream.chunks(1));
    assert_eq!(whole, split, "HTTP events depend on the split {cuts:?}");
    assert_eq!(whole, bytes, "HTTP events differ fed one byte at a time");
    let mut closed = false;
    let mut continued = false;
    for ev in &whole {
        assert!(!closed, "HTTP event after the connection closed: {whole:?}");
        match ev {
            Ev::Rpc(body, reply, _) => {
                assert!(
                    body.len() <= limits.max_body_bytes,
                    "body of {} bytes passes max_body_bytes",
                    body.len()
                );
                closed = !reply.keep_alive;
                continued = false;
            }
            Ev::Health(reply, _) | Ev::Preflight(reply) => {
                assert!(
                    limits.cors.is_some() || matches!(ev, Ev::Health(..)),
                    "a preflight answered without CORS configured"
                );
                closed = !reply.keep_alive;
            }
            Ev::Metrics(reply, _) => {
                assert!(limits.metrics, "metrics answered where they are not served");
                closed = !reply.keep_alive;
            }
            Ev::Continue => {
                assert!(!continued, "two 100-continue for one request: {whole:?}");
                continued = true;
            }
            Ev::Upgrade(key, head, reply) => {
                // What follows the handshake is not HTTP: nothing more is decoded.
                assert!(crate::transport::websocket::valid_key(key), "{key:?}");
                assert!(head.ends_with(b"\r\n\r\n"), "not a whole head: {head:?}");
                assert!(!reply.keep_alive);
                closed = true;
            }
            Ev::Reject(status, close, header, error, _, _) => {
                assert_eq!((*status, *header), (error.status(), error.header()));
                closed = *close;
                continued = false;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------

/// An [`HttpEvent`] with owned, comparable fields.
#[derive(Debug, PartialEq)]
enum Ev {
    Rpc(Vec<u8>, Reply, Option<String>),
    Health(Reply, bool),
    Metrics(Reply, bool),
    Preflight(Reply),
    Continue,
    Upgrade([u8; 24], Vec<u8>, Reply),
    Reject(
        u16,
        bool,
        Option<(&'static str, &'static str)>,
        HttpError,
        bool,
        Origin,
    ),
}

fn http_limits(sel: u8) -> HttpLimits {
    let limits =
        |path: &'static str, max_head_bytes, max_body_bytes, max_headers, cors: &[&str]| {
            let cors: Vec<String> = cors.iter().map(|o| (*o).to_owned()).collect();
            HttpLimits {
                path: path.into(),
                max_head_bytes,
                max_body_bytes,
                max_headers,
                cors: Cors::new(&cors).unwrap_or_default(),
                rpc: true,
                metrics: max_headers > 4,
            }
        };
    match sel % 4 {
        0 => HttpLimits::default(),
        1 => limits("/", 64, 16, 4, &[]),
        2 => limits("/rpc", 128, 64, 8, &["http://a.example"]),
        _ => limits("/", 96, 1 << 20, 2, &["*", "http://b.example:8080"]),
    }
}

fn feed_http<'p>(limits: &HttpLimits, pieces: impl IntoIterator<Item = &'p [u8]>) -> Vec<Ev> {
    // The module's security bound: body, plus a head or a chunk line and trailers.
    let bound = limits.max_body_bytes + 2 * limits.max_head_bytes.max(MAX_CHUNK_LINE);
    let mut dec = HttpDecoder::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        while let Some(e) = dec.decode(&mut buf) {
            events.push(match e {
                HttpEvent::Rpc {
                    body,
                    reply,
                    traced,
                    ..
                } => Ev::Rpc(
                    body.to_vec(),
                    reply,
                    traced
                        .then(|| body.trace())
                        .flatten()
                        .map(|t| t.trace_id().to_string()),
                ),
                HttpEvent::Health { reply, head } => Ev::Health(reply, head),
                HttpEvent::Metrics { reply, head, .. } => Ev::Metrics(reply, head),
                HttpEvent::Preflight { reply } => Ev::Preflight(reply),
                HttpEvent::Continue { .. } => Ev::Continue,
                HttpEvent::Upgrade { key, head, reply } => Ev::Upgrade(key, head.to_vec(), reply),
                HttpEvent::Reject {
                    status,
                    close,
                    header,
                    error,
                    head,
                    origin,
                } => Ev::Reject(status, close, header, error, head, origin),
            });
        }
        assert!(
            buf.len() <= bound + piece.len(),
            "the HTTP decoder holds {} bytes, bound {bound} + {}",
            buf.len(),
            piece.len()
        );
    }
    events
}
