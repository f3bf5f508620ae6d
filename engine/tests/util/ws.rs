//! WebSocket frames as a client writes them and as the server's are read, for the
//! WebSocket tests (hand-written: a library would not send the broken ones).
#![allow(dead_code)]

/// A key from RFC 6455's example; its accept value is `s3pPLMBiTxaQ9kYGzzhZRbK+xOo=`.
pub const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// A handshake request for `/` with `extra` header lines.
pub fn handshake(extra: &str) -> String {
    format!(
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

/// A client's frame (masked).
pub fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
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

/// The server frame at the front of `b`, if whole: ((opcode, payload range), its
/// length). Server frames are final and unmasked.
pub fn server_frame(b: &[u8]) -> Option<((u8, std::ops::Range<usize>), usize)> {
    let (b0, b1) = (*b.first()?, *b.get(1)?);
    assert_eq!(b0 & 0x80, 0x80, "final frames only");
    assert_eq!(b1 & 0x80, 0, "a server's frames are not masked");
    let (len, at) = match b1 & 0x7f {
        126 => (u16::from_be_bytes([*b.get(2)?, *b.get(3)?]) as usize, 4),
        127 => (
            u64::from_be_bytes(b.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    b.get(at..at + len)?;
    Some(((b0 & 0x0f, at..at + len), at + len))
}
