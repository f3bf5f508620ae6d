//! Test helpers shared by the HTTP files' tests.

use bytes::BytesMut;

use super::request::RpcRequest;
use super::{HttpDecoder, HttpEvent, HttpLimits, Reply};

/// A chunked POST's head.
pub(super) const CHUNKED_HEAD: &str =
    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";

/// A JSON-RPC call.
pub(super) const BODY: &str = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;

/// Kept alive, no CORS.
pub(super) const KEEP: Reply = Reply::plain(true);
/// Closing, no CORS.
pub(super) const CLOSE: Reply = Reply::plain(false);

/// Decodes `input` in one buffer and returns the one Rpc request (head and body) and
/// where the buffer's bytes started.
pub(super) fn body_and_base(input: &[u8]) -> (RpcRequest, usize) {
    let mut dec = HttpDecoder::new(HttpLimits::default());
    let mut buf = BytesMut::from(input);
    let base = buf.as_ptr() as usize;
    match dec.decode(&mut buf) {
        Some(HttpEvent::Rpc { body, .. }) => (body, base),
        other => panic!("{other:?}"),
    }
}
