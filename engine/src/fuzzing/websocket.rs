//! The `websocket` target: the WebSocket frame reader, whole vs cut vs byte by byte.

use bytes::BytesMut;

use super::{pieces, split_input};
use crate::transport::websocket::{WsDecoder, WsEvent};

/// Fuzz target `websocket`: `data` is `[config][n][n cut offsets, u16 LE][stream]` (see
/// [`split_input`]); odd selectors give a small message limit (16..=143 bytes), so the
/// oversize paths run. The stream fed to the frame reader whole, cut at the offsets,
/// and one byte at a time must give the same events; its buffer stays within one frame
/// of the limit; no message passes the limit; nothing follows a Close or a failure.
pub fn check_websocket(data: &[u8]) {
    let (sel, cuts, stream) = split_input(data);
    let max = if sel & 1 == 0 {
        1 << 20
    } else {
        16 + usize::from(sel >> 1)
    };
    let whole = feed(max, [stream]);
    let split = feed(max, pieces(stream, &cuts));
    let bytes = feed(max, stream.chunks(1));
    assert_eq!(
        whole, split,
        "WebSocket events depend on the split {cuts:?}"
    );
    assert_eq!(
        whole, bytes,
        "WebSocket events differ fed one byte at a time"
    );
    let mut ended = false;
    for e in &whole {
        assert!(!ended, "an event after a Close or a failure: {whole:?}");
        match e {
            WsEvent::Message(m) => assert!(m.len() <= max, "a message of {} bytes", m.len()),
            WsEvent::Ping(p) => assert!(p.len() <= 125),
            WsEvent::Close(_) | WsEvent::Fail(..) => ended = true,
            WsEvent::TooLarge => {}
        }
    }
}

fn feed<'p>(max: usize, pieces: impl IntoIterator<Item = &'p [u8]>) -> Vec<WsEvent> {
    // A frame's header (14 bytes at most) and payload: the limit, or 125 for a control.
    let bound = max.max(125) + 14;
    let mut dec = WsDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        while let Some(e) = dec.decode(&mut buf) {
            events.push(e);
        }
        assert!(
            buf.len() <= bound + piece.len(),
            "the frame reader holds {} bytes, bound {bound} + {}",
            buf.len(),
            piece.len()
        );
    }
    events
}

/// For the `ws_framing` bench (not a fuzz target): the server's framing work on every
/// message in `buf`, through the code the reactor runs — each frame decoded off the
/// buffer (header, unmasking in place, the UTF-8 check) and split off, then `answer`
/// written as a text message into `out` in place (room for the header reserved first,
/// the header written after). Returns the messages handled.
pub fn frame_all(buf: &mut BytesMut, out: &mut Vec<u8>, answer: &[u8]) -> usize {
    use crate::transport::websocket::{begin_message, finish_message};
    let mut dec = WsDecoder::new(1 << 20);
    let mut n = 0;
    while let Some(event) = dec.decode(buf) {
        if let WsEvent::Message(request) = event {
            std::hint::black_box(&request);
            let mark = begin_message(out);
            out.extend_from_slice(answer);
            finish_message(out, mark);
            n += 1;
        }
    }
    n
}
