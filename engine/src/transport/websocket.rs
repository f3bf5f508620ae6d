//! WebSocket (RFC 6455) on the HTTP listener: the handshake's answer, the frames a
//! client sends (decoded off the connection's read buffer, unmasked in place, so a
//! message that came in one frame reaches the engine without a copy), and the frames
//! the server writes (each answer one unfragmented text message).
//!
//! Why not `tungstenite`: its protocol layer owns the stream and hands each message
//! over as a buffer of its own (an allocation and a copy per message); the framing is
//! small, and here it shares the read buffer, limits and backpressure of the other
//! transports. Measured (`benches/benches/ws_framing.rs`): reading a 60-byte request
//! and framing a 40-byte answer costs 36–43 ns here against 108–129 ns through
//! tungstenite 0.27's `WebSocket` (2.9–3.0×). The decoder is fuzzed for
//! split-invariance (`fuzz/`).

use bytes::{Buf, BytesMut};
use sha1::{Digest, Sha1};

/// The GUID the handshake's accept key is made with (RFC 6455 §1.3).
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Opcodes (RFC 6455 §5.2).
const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// Close codes the server sends (RFC 6455 §7.4.1).
pub(crate) const PROTOCOL_ERROR: u16 = 1002;
pub(crate) const GOING_AWAY: u16 = 1001;
pub(crate) const INVALID_DATA: u16 = 1007;
pub(crate) const POLICY: u16 = 1008;

/// Whether `key` (a `Sec-WebSocket-Key` value) is what RFC 6455 §4.1 asks: 16 bytes,
/// base64-encoded (24 characters).
pub(crate) fn valid_key(key: &[u8]) -> bool {
    use base64::Engine as _;
    key.len() == 24
        && base64::engine::general_purpose::STANDARD
            .decode(key)
            .is_ok_and(|k| k.len() == 16)
}

/// Appends the `101 Switching Protocols` answer to a handshake with `key`.
pub(crate) fn write_switch(out: &mut Vec<u8>, key: &[u8]) {
    let accept = accept_value(key);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Accept: ",
    );
    out.extend_from_slice(&accept);
    out.extend_from_slice(b"\r\n\r\n");
}

/// Room left for a text frame's header before an answer written in place: the
/// 2-byte header of a payload under 126 bytes (most answers); a longer one moves its
/// payload up by 2 or 8 bytes when the frame is finished.
const ROOM: usize = 2;

/// Starts a text message at the end of `out`; its payload follows, then
/// [`finish_message`] with the mark returned.
pub(crate) fn begin_message(out: &mut Vec<u8>) -> usize {
    let mark = out.len();
    out.extend_from_slice(&[0; ROOM]);
    mark
}

/// Ends the message begun at `mark`: writes its header.
pub(crate) fn finish_message(out: &mut Vec<u8>, mark: usize) {
    let len = out.len() - mark - ROOM;
    let mut header = [0u8; 10];
    let n = frame_header(&mut header, TEXT, len);
    if n > ROOM {
        // Moved up: rare (answers of 126 bytes or more), and a memmove of the payload.
        out.splice(mark..mark, header[..n - ROOM].iter().copied());
    }
    out[mark..mark + n].copy_from_slice(&header[..n]);
}

/// Appends a whole text message holding `payload`.
pub(crate) fn write_message(out: &mut Vec<u8>, payload: &[u8]) {
    write_frame(out, TEXT, payload);
}

/// What a client sends: a text message, or a pong answering a ping.
#[cfg_attr(not(feature = "client"), allow(dead_code))]
#[derive(Clone, Copy)]
pub(crate) enum ClientFrame {
    Text,
    Pong,
}

/// Appends a client's frame holding `payload`, masked with `mask` (a client must mask
/// every frame, RFC 6455 §5.3).
#[cfg_attr(not(feature = "client"), allow(dead_code))]
pub(crate) fn write_masked(out: &mut Vec<u8>, kind: ClientFrame, payload: &[u8], mask: [u8; 4]) {
    let opcode = match kind {
        ClientFrame::Text => TEXT,
        ClientFrame::Pong => PONG,
    };
    let mut header = [0u8; 10];
    let n = frame_header(&mut header, opcode, payload.len());
    header[1] |= 0x80;
    out.extend_from_slice(&header[..n]);
    out.extend_from_slice(&mask);
    let at = out.len();
    out.extend_from_slice(payload);
    unmask(&mut out[at..], mask);
}

/// `Sec-WebSocket-Accept` for `key`, as the server must answer it.
#[cfg_attr(not(feature = "client"), allow(dead_code))]
pub(crate) fn accept_value(key: &[u8]) -> [u8; 28] {
    use base64::Engine as _;
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(GUID);
    let mut accept = [0u8; 28];
    let _ = base64::engine::general_purpose::STANDARD.encode_slice(sha.finalize(), &mut accept);
    accept
}

/// Appends a ping (the server asking a silent peer whether it is still there).
pub(crate) fn write_ping(out: &mut Vec<u8>, payload: &[u8]) {
    write_frame(out, PING, payload);
}

/// Appends a pong answering a ping with `payload`.
pub(crate) fn write_pong(out: &mut Vec<u8>, payload: &[u8]) {
    write_frame(out, PONG, payload);
}

/// Appends a Close frame with `code` (none: an empty Close) and `reason`.
pub(crate) fn write_close(out: &mut Vec<u8>, code: Option<u16>, reason: &str) {
    let mut payload = [0u8; 125];
    let n = match code {
        None => 0,
        Some(code) => {
            payload[..2].copy_from_slice(&code.to_be_bytes());
            let reason = &reason.as_bytes()[..reason.len().min(123)];
            payload[2..2 + reason.len()].copy_from_slice(reason);
            2 + reason.len()
        }
    };
    write_frame(out, CLOSE, &payload[..n]);
}

fn write_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    let mut header = [0u8; 10];
    let n = frame_header(&mut header, opcode, payload.len());
    out.extend_from_slice(&header[..n]);
    out.extend_from_slice(payload);
}

/// Writes an unmasked, final frame's header for `len` payload bytes; its length.
fn frame_header(header: &mut [u8; 10], opcode: u8, len: usize) -> usize {
    header[0] = 0x80 | opcode;
    if len < 126 {
        header[1] = len as u8;
        2
    } else if let Ok(len) = u16::try_from(len) {
        header[1] = 126;
        header[2..4].copy_from_slice(&len.to_be_bytes());
        4
    } else {
        header[1] = 127;
        header[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    }
}

/// What the decoder found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WsEvent {
    /// A whole data message (text or binary), unmasked: one JSON-RPC request or batch.
    Message(BytesMut),
    /// A message over the size limit: its bytes are skipped as they arrive; answer it
    /// with an error.
    TooLarge,
    /// A ping: answer a pong with this payload.
    Ping(BytesMut),
    /// The peer's Close, with its status code if it sent one: echo it, then close.
    /// Nothing after it is decoded.
    Close(Option<u16>),
    /// The peer broke the protocol: close with this code and reason. Nothing after it
    /// is decoded.
    Fail(u16, &'static str),
}

/// Decodes a client's frames off the front of a connection's read buffer.
#[derive(Debug)]
pub(crate) struct WsDecoder {
    max_message: usize,
    /// Frames come from a client (masked, as they must be) or, for the client's own
    /// decoder, from a server (never masked).
    from_client: bool,
    /// A fragmented message being put together (its frames' payloads, unmasked), and
    /// whether it is text.
    partial: Option<(BytesMut, bool)>,
    /// Payload bytes of an oversized frame still to skip.
    skip: u64,
    /// Inside an oversized fragmented message: its later frames are skipped too.
    dropping: bool,
    /// A Close was read or the protocol broken: nothing more is decoded.
    done: bool,
}

impl WsDecoder {
    /// A server's decoder (of a client's frames) for messages of at most `max_message`
    /// bytes.
    pub(crate) fn new(max_message: usize) -> Self {
        Self::with(max_message, true)
    }

    /// A client's decoder (of a server's frames).
    #[cfg_attr(not(feature = "client"), allow(dead_code))]
    pub(crate) fn client(max_message: usize) -> Self {
        Self::with(max_message, false)
    }

    fn with(max_message: usize, from_client: bool) -> Self {
        Self {
            max_message,
            from_client,
            partial: None,
            skip: 0,
            dropping: false,
            done: false,
        }
    }

    /// Whether a message is partly read (beyond what the read buffer holds).
    pub(crate) fn mid_message(&self) -> bool {
        !self.done && (self.partial.is_some() || self.dropping || self.skip > 0)
    }

    /// Takes the next event off the front of `buf`; `None`: more bytes are needed (or
    /// the connection is done: see [`WsEvent::Close`]).
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Option<WsEvent> {
        loop {
            if self.done {
                buf.clear();
                return None;
            }
            if self.skip > 0 {
                let n = usize::try_from(self.skip)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                buf.advance(n);
                self.skip -= n as u64;
                if self.skip > 0 {
                    return None;
                }
            }
            let (&b0, &b1) = (buf.first()?, buf.get(1)?);
            let fin = b0 & 0x80 != 0;
            let opcode = b0 & 0x0F;
            if b0 & 0x70 != 0 {
                return Some(self.fail(
                    PROTOCOL_ERROR,
                    "reserved bits set (no extension was agreed)",
                ));
            }
            let masked = b1 & 0x80 != 0;
            if masked != self.from_client {
                return Some(self.fail(
                    PROTOCOL_ERROR,
                    if self.from_client {
                        "a client's frames must be masked"
                    } else {
                        "a server's frames must not be masked"
                    },
                ));
            }
            let (len, at) = match b1 & 0x7F {
                126 => (
                    u64::from(u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?])),
                    4,
                ),
                127 => {
                    let bytes: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
                    let len = u64::from_be_bytes(bytes);
                    if len >> 63 != 0 {
                        return Some(
                            self.fail(PROTOCOL_ERROR, "a payload length with its top bit set"),
                        );
                    }
                    (len, 10)
                }
                n => (u64::from(n), 2),
            };
            let head = if masked { at + 4 } else { at };
            let control = opcode & 0x8 != 0;
            match opcode {
                CONTINUATION | TEXT | BINARY | CLOSE | PING | PONG => {}
                _ => return Some(self.fail(PROTOCOL_ERROR, "an unknown opcode")),
            }
            if control && (!fin || len > 125) {
                return Some(self.fail(
                    PROTOCOL_ERROR,
                    "a control frame fragmented or over 125 bytes",
                ));
            }
            let in_message = self.partial.is_some() || self.dropping;
            if opcode == CONTINUATION && !in_message {
                return Some(
                    self.fail(PROTOCOL_ERROR, "a continuation frame with no message begun"),
                );
            }
            if (opcode == TEXT || opcode == BINARY) && in_message {
                return Some(self.fail(PROTOCOL_ERROR, "a new message before the last one ended"));
            }
            if !control {
                let so_far = self.partial.as_ref().map_or(0, |(p, _)| p.len() as u64);
                if self.dropping || len.saturating_add(so_far) > self.max_message as u64 {
                    if buf.len() < head {
                        return None;
                    }
                    // Skipped as it arrives: memory stays bounded whatever the peer sends.
                    buf.advance(head);
                    self.skip = len;
                    let first = !self.dropping;
                    self.partial = None;
                    self.dropping = !fin;
                    if first {
                        return Some(WsEvent::TooLarge);
                    }
                    continue;
                }
            }
            // Under `max_message` (or 125): fits a usize.
            let len = len as usize;
            if buf.len() < head + len {
                // The rest of the frame, in one allocation rather than read by read.
                buf.reserve(head + len - buf.len());
                return None;
            }
            let mask = masked.then(|| [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
            buf.advance(head);
            let mut payload = buf.split_to(len);
            if let Some(mask) = mask {
                unmask(&mut payload, mask);
            }
            match opcode {
                PING => return Some(WsEvent::Ping(payload)),
                PONG => continue,
                CLOSE => return Some(self.close(&payload)),
                _ => {}
            }
            let message = match self.partial.take() {
                None if fin => (payload, opcode == TEXT),
                None => {
                    self.partial = Some((payload, opcode == TEXT));
                    continue;
                }
                Some((mut whole, text)) => {
                    whole.extend_from_slice(&payload);
                    if !fin {
                        self.partial = Some((whole, text));
                        continue;
                    }
                    (whole, text)
                }
            };
            let (message, text) = message;
            if text && std::str::from_utf8(&message).is_err() {
                return Some(self.fail(INVALID_DATA, "a text message that is not UTF-8"));
            }
            return Some(WsEvent::Message(message));
        }
    }

    /// The peer's Close frame with `payload`: its code, or a failure if it is malformed.
    fn close(&mut self, payload: &[u8]) -> WsEvent {
        self.done = true;
        match payload {
            [] => WsEvent::Close(None),
            [_] => WsEvent::Fail(PROTOCOL_ERROR, "a Close frame with a 1-byte payload"),
            [a, b, reason @ ..] => {
                let code = u16::from_be_bytes([*a, *b]);
                // RFC 6455 §7.4: codes a peer may send.
                // (1012–1014 are registered with IANA since RFC 6455.)
                let valid = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
                if !valid {
                    WsEvent::Fail(PROTOCOL_ERROR, "a Close frame with an invalid code")
                } else if std::str::from_utf8(reason).is_err() {
                    WsEvent::Fail(INVALID_DATA, "a Close frame's reason that is not UTF-8")
                } else {
                    WsEvent::Close(Some(code))
                }
            }
        }
    }

    fn fail(&mut self, code: u16, why: &'static str) -> WsEvent {
        self.done = true;
        WsEvent::Fail(code, why)
    }
}

/// XORs `payload` with the frame's masking key (RFC 6455 §5.3), eight bytes at a time.
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let wide = u64::from_ne_bytes([
        mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3],
    ]);
    let mut chunks = payload.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(word) ^ wide).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's frame: masked with `mask`.
    fn frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut f = vec![u8::from(fin) << 7 | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xFFFF => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    fn all(dec: &mut WsDecoder, bytes: &[u8]) -> Vec<WsEvent> {
        let mut buf = BytesMut::from(bytes);
        std::iter::from_fn(|| dec.decode(&mut buf)).collect()
    }

    #[test]
    fn the_accept_key_is_the_rfcs() {
        // RFC 6455 §1.3's example.
        let mut out = Vec::new();
        write_switch(&mut out, b"dGhlIHNhbXBsZSBub25jZQ==");
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            "{text}"
        );
        assert!(valid_key(b"dGhlIHNhbXBsZSBub25jZQ=="));
        assert!(!valid_key(b"dGhlIHNhbXBsZSBub25jZQ"));
        assert!(!valid_key(b"not base64 at all!!!!!!="));
    }

    #[test]
    fn messages_whole_fragmented_and_split_anywhere() {
        let long = "x".repeat(70_000);
        let mut stream = Vec::new();
        stream.extend(frame(true, TEXT, br#"{"a":1}"#, [1, 2, 3, 4]));
        stream.extend(frame(false, TEXT, b"[1,", [9, 8, 7, 6]));
        stream.extend(frame(true, PING, b"hi", [5, 5, 5, 5]));
        stream.extend(frame(false, CONTINUATION, b"2", [0, 0, 0, 0]));
        stream.extend(frame(true, CONTINUATION, b"]", [1, 1, 1, 1]));
        stream.extend(frame(true, PONG, b"", [1, 1, 1, 1]));
        stream.extend(frame(
            true,
            BINARY,
            long.as_bytes(),
            [0xA0, 0x0B, 0xC0, 0x0D],
        ));
        stream.extend(frame(true, CLOSE, &1000u16.to_be_bytes(), [3, 3, 3, 3]));
        let want = vec![
            WsEvent::Message(BytesMut::from(&br#"{"a":1}"#[..])),
            WsEvent::Ping(BytesMut::from(&b"hi"[..])),
            WsEvent::Message(BytesMut::from(&b"[1,2]"[..])),
            WsEvent::Message(BytesMut::from(long.as_bytes())),
            WsEvent::Close(Some(1000)),
        ];
        assert_eq!(all(&mut WsDecoder::new(100_000), &stream), want);
        // The same events whatever the reads' sizes.
        for step in [1, 2, 3, 7, 100, 4096] {
            let mut dec = WsDecoder::new(100_000);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in stream.chunks(step) {
                buf.extend_from_slice(piece);
                got.extend(std::iter::from_fn(|| dec.decode(&mut buf)));
            }
            assert_eq!(got, want, "step {step}");
        }
    }

    #[test]
    fn oversized_messages_are_skipped_and_the_next_one_read() {
        let mut stream = frame(true, TEXT, &[b' '; 300], [1, 2, 3, 4]);
        stream.extend(frame(false, TEXT, &[b' '; 60], [1, 2, 3, 4]));
        stream.extend(frame(false, CONTINUATION, &[b' '; 60], [1, 2, 3, 4]));
        stream.extend(frame(true, CONTINUATION, &[b' '; 60], [1, 2, 3, 4]));
        stream.extend(frame(true, TEXT, b"[]", [1, 2, 3, 4]));
        for step in [1, 5, 1000] {
            let mut dec = WsDecoder::new(100);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in stream.chunks(step) {
                buf.extend_from_slice(piece);
                got.extend(std::iter::from_fn(|| dec.decode(&mut buf)));
                assert!(buf.len() <= 100 + 14 + step, "bounded");
            }
            assert_eq!(
                got,
                vec![
                    WsEvent::TooLarge,
                    WsEvent::TooLarge,
                    WsEvent::Message(BytesMut::from(&b"[]"[..]))
                ],
                "step {step}"
            );
        }
    }

    #[test]
    fn protocol_violations_fail_the_connection() {
        let cases: Vec<(Vec<u8>, u16)> = vec![
            // Not masked.
            (vec![0x81, 0x01, b'x'], PROTOCOL_ERROR),
            // A reserved bit.
            (
                [vec![0xC1], frame(true, TEXT, b"x", [1; 4])[1..].to_vec()].concat(),
                PROTOCOL_ERROR,
            ),
            (frame(true, 0x3, b"x", [1; 4]), PROTOCOL_ERROR),
            (frame(false, PING, b"x", [1; 4]), PROTOCOL_ERROR),
            (frame(true, PING, &[0; 126], [1; 4]), PROTOCOL_ERROR),
            (frame(true, CONTINUATION, b"x", [1; 4]), PROTOCOL_ERROR),
            (
                [
                    frame(false, TEXT, b"x", [1; 4]),
                    frame(true, TEXT, b"y", [1; 4]),
                ]
                .concat(),
                PROTOCOL_ERROR,
            ),
            (frame(true, TEXT, &[0xFF, 0xFE], [1; 4]), INVALID_DATA),
            (frame(true, CLOSE, &[3], [1; 4]), PROTOCOL_ERROR),
            (
                frame(true, CLOSE, &999u16.to_be_bytes(), [1; 4]),
                PROTOCOL_ERROR,
            ),
            (
                frame(true, CLOSE, &[0x03, 0xE8, 0xFF], [1; 4]),
                INVALID_DATA,
            ),
        ];
        for (bytes, code) in cases {
            let got = all(&mut WsDecoder::new(1000), &bytes);
            assert!(
                matches!(got.as_slice(), [WsEvent::Fail(c, _)] if *c == code),
                "{bytes:?}: {got:?}"
            );
        }
        // Binary data need not be UTF-8; nothing is read after a Close.
        let mut stream = frame(true, BINARY, &[0xFF], [1; 4]);
        stream.extend(frame(true, CLOSE, b"", [1; 4]));
        stream.extend(frame(true, TEXT, b"[]", [1; 4]));
        assert_eq!(
            all(&mut WsDecoder::new(1000), &stream),
            vec![
                WsEvent::Message(BytesMut::from(&[0xFF][..])),
                WsEvent::Close(None)
            ]
        );
    }

    /// 1012 (Service Restart), 1013 (Try Again Later) and 1014 (Bad Gateway) are
    /// registered close codes (IANA WebSocket Close Code Number Registry) that proxies
    /// and servers send; a peer closing with one gets a 1002 protocol error back.
    #[test]
    fn registered_close_codes_1012_to_1014_are_accepted() {
        for code in [1012u16, 1013, 1014] {
            let got = all(
                &mut WsDecoder::new(1000),
                &frame(true, CLOSE, &code.to_be_bytes(), [1; 4]),
            );
            assert_eq!(got, vec![WsEvent::Close(Some(code))], "{code}");
        }
    }

    #[test]
    fn answers_are_framed_in_place() {
        for len in [0, 1, 125, 126, 65_535, 65_536, 70_000] {
            let mut out = b"before".to_vec();
            let mark = begin_message(&mut out);
            out.extend(std::iter::repeat_n(b'a', len));
            finish_message(&mut out, mark);
            let mut want = b"before".to_vec();
            write_message(&mut want, &vec![b'a'; len]);
            assert_eq!(out, want, "{len}");
            let header = &want[6..];
            match len {
                0..=125 => assert_eq!(header[..2], [0x81, len as u8]),
                126..=65_535 => assert_eq!(header[..2], [0x81, 126]),
                _ => assert_eq!(header[..2], [0x81, 127]),
            }
        }
    }
}
