//! Chunked bodies (RFC 9112 §7.1), de-chunked in place in the read buffer.

use bytes::{Buf, BytesMut};

use super::fields::trim;
use super::request::RpcMeta;
use super::{HttpError, MAX_CHUNK_LINE};

/// De-chunking state. The body is gathered in place at the front of the read buffer:
///
/// ```text
///  buf: [ de-chunked body: ..out ][ consumed framing: out..pos ][ unread: pos.. ]
/// ```
///
/// While `out` is 0, consumed framing is dropped with `advance` (O(1)), so the first
/// chunk's data never moves; after that, each later chunk's data is moved down to `out`
/// once as it arrives. Between calls the consumed framing is squeezed out whenever it
/// is at least as long as the unread tail, so it never holds more than one line.
#[derive(Debug)]
pub(super) struct Chunked {
    phase: Phase,
    /// Invariant: `out <= pos <= buf.len()`.
    out: usize,
    pub(super) pos: usize,
    /// Bytes of the line starting at `pos` already searched for `\n`.
    scanned: usize,
    /// Trailer-section bytes so far.
    trailers: usize,
    pub(super) meta: RpcMeta,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// A chunk-size line.
    Size,
    /// `left` more bytes of chunk data.
    Data { left: usize },
    /// The CRLF after chunk data.
    DataEnd,
    /// Trailer lines, up to an empty one.
    Trailers,
}

impl Chunked {
    pub(super) fn new(meta: RpcMeta) -> Self {
        Self {
            phase: Phase::Size,
            out: 0,
            pos: 0,
            scanned: 0,
            trailers: 0,
            meta,
        }
    }

    /// Advances through what `buf` holds. `Ok(Some(len))` when the body is complete:
    /// it is `buf[..len]`, and the framing up to `self.pos` follows it.
    pub(super) fn run(
        &mut self,
        buf: &mut BytesMut,
        max_body: usize,
        max_trailers: usize,
    ) -> Result<Option<usize>, HttpError> {
        loop {
            match self.phase {
                Phase::Size => {
                    let Some(cr) = self.line(buf, MAX_CHUNK_LINE, HttpError::Chunk)? else {
                        break;
                    };
                    let size = chunk_size(&buf[self.pos..cr], max_body - self.out)?;
                    self.pos = cr + 2;
                    self.phase = match size {
                        0 => Phase::Trailers,
                        left => Phase::Data { left },
                    };
                }
                Phase::Data { left } => {
                    let n = left.min(buf.len() - self.pos);
                    if n == 0 {
                        break;
                    }
                    if self.out == 0 {
                        buf.advance(self.pos);
                        self.pos = 0;
                    } else if self.out != self.pos {
                        buf.copy_within(self.pos..self.pos + n, self.out);
                    }
                    self.out += n;
                    self.pos += n;
                    self.phase = match left - n {
                        0 => Phase::DataEnd,
                        left => Phase::Data { left },
                    };
                }
                Phase::DataEnd => {
                    let Some(crlf) = buf.get(self.pos..self.pos + 2) else {
                        break;
                    };
                    if crlf != b"\r\n" {
                        return Err(HttpError::Chunk);
                    }
                    self.pos += 2;
                    self.phase = Phase::Size;
                }
                Phase::Trailers => {
                    let budget = max_trailers.saturating_sub(self.trailers);
                    let Some(cr) = self.line(buf, budget, HttpError::TrailersTooLarge)? else {
                        break;
                    };
                    let empty = cr == self.pos;
                    self.trailers += cr + 2 - self.pos;
                    self.pos = cr + 2;
                    if empty {
                        return Ok(Some(self.out));
                    }
                }
            }
        }
        self.compact(buf);
        Ok(None)
    }

    /// Finds the CRLF ending the line at `pos`: `Ok(Some(index of its \r))`, `Ok(None)`
    /// if it has not all arrived. A line (CRLF included) longer than `limit`, a bare LF
    /// or a bare CR is an error.
    fn line(
        &mut self,
        buf: &[u8],
        limit: usize,
        too_long: HttpError,
    ) -> Result<Option<usize>, HttpError> {
        let from = self.pos + self.scanned;
        let Some(i) = buf.get(from..).and_then(|rest| memchr::memchr(b'\n', rest)) else {
            self.scanned = buf.len() - self.pos;
            // Even if the next byte were the `\n`, the line would be over the limit.
            return if self.scanned >= limit {
                Err(too_long)
            } else {
                Ok(None)
            };
        };
        let lf = from + i;
        self.scanned = 0;
        if lf + 1 - self.pos > limit {
            return Err(too_long);
        }
        let cr = match lf.checked_sub(1) {
            Some(cr) if cr >= self.pos && buf.get(cr) == Some(&b'\r') => cr,
            _ => return Err(HttpError::Chunk),
        };
        if memchr::memchr(b'\r', &buf[self.pos..cr]).is_some() {
            return Err(HttpError::Chunk);
        }
        Ok(Some(cr))
    }

    /// Drops consumed framing so the buffer holds the body, at most one line of framing
    /// and the unread tail.
    fn compact(&mut self, buf: &mut BytesMut) {
        let gap = self.pos - self.out;
        if gap == 0 {
            return;
        }
        if self.out == 0 {
            buf.advance(gap);
            self.pos = 0;
            return;
        }
        let tail = buf.len() - self.pos;
        if gap >= tail {
            buf.copy_within(self.pos.., self.out);
            buf.truncate(self.out + tail);
            self.pos = self.out;
        }
    }
}

/// A chunk-size line without its CRLF: `1*HEXDIG [ BWS ";" chunk-ext ]`. The size must
/// fit in `budget` (the body bytes still allowed), else 413; extensions are ignored
/// but may not hold control characters.
fn chunk_size(line: &[u8], budget: usize) -> Result<usize, HttpError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(HttpError::Chunk);
    }
    let size = line[..digits].iter().try_fold(0u64, |n, &b| {
        let d = char::from(b).to_digit(16).unwrap_or_default();
        n.checked_mul(16)
            .and_then(|n| n.checked_add(u64::from(d)))
            .ok_or(HttpError::Chunk)
    })?;
    let ext = &line[digits..];
    if !ext.is_empty() {
        let ext = trim(ext);
        let ctl = |b: &u8| (*b < 0x20 && *b != b'\t') || *b == 0x7f;
        if ext.first() != Some(&b';') || ext.iter().any(ctl) {
            return Err(HttpError::Chunk);
        }
    }
    usize::try_from(size)
        .ok()
        .filter(|&size| size <= budget)
        .ok_or(HttpError::BodyTooLarge)
}

#[cfg(test)]
mod tests {
    use crate::transport::http::testing::{body_and_base, BODY, CHUNKED_HEAD};

    #[test]
    fn chunked_body_is_gathered_in_place() {
        // One chunk: its data does not move.
        let one = format!("{CHUNKED_HEAD}28\r\n{BODY}\r\n0\r\n\r\n");
        let (body, base) = body_and_base(one.as_bytes());
        assert_eq!(&body[..], BODY.as_bytes());
        assert_eq!(body.as_ptr() as usize, base + CHUNKED_HEAD.len() + 4);
        // Several: gathered at the first chunk's place, in the same allocation.
        let (a, b) = BODY.split_at(10);
        let many = format!("{CHUNKED_HEAD}a;x=1\r\n{a}\r\n1E\r\n{b}\r\n0\r\nT: 1\r\n\r\n");
        let (body, base) = body_and_base(many.as_bytes());
        assert_eq!(&body[..], BODY.as_bytes());
        assert_eq!(body.as_ptr() as usize, base + CHUNKED_HEAD.len() + 7);
    }
}
