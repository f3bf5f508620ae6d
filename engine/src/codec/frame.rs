//! Newline-delimited framing: splits frames off a connection's read buffer without copying.

use bytes::{Buf, BytesMut};

use crate::error::FrameError;

/// Splits newline-delimited JSON frames off a `BytesMut` read buffer.
///
/// A frame ends at `\n`; a `\r` before it is dropped, and frames that hold nothing but
/// whitespace (blank lines) are skipped. Complete frames are [`split_to`] off the front of
/// the buffer — O(1), no copy — so once every frame handed out is dropped,
/// `BytesMut::reserve` reuses the same allocation (the buffer acts as a ring).
///
/// The decoder remembers how far it has searched, so feeding a frame one byte at a time
/// costs O(n) in total, not O(n²).
///
/// **The security bound.** A frame longer than `max_frame` bytes (not counting its line
/// terminator) is never buffered whole: as soon as more than `max_frame` bytes are pending
/// without a newline, they are dropped, [`FrameError::TooLarge`] is returned once, and the
/// rest of that line is discarded as it arrives. So the buffer never holds more than
/// `max_frame + 1` bytes plus one read's worth.
///
/// [`split_to`]: BytesMut::split_to
///
/// ```
/// use bytes::BytesMut;
/// use ringrpc::LineDecoder;
///
/// let mut dec = LineDecoder::new(1024);
/// let mut buf = BytesMut::from(&b"{\"a\":1}\r\n\n{\"b\""[..]);
/// assert_eq!(&dec.decode(&mut buf).unwrap().unwrap()[..], b"{\"a\":1}");
/// assert_eq!(dec.decode(&mut buf).unwrap(), None); // the rest is a partial frame
/// buf.extend_from_slice(b":2}\n");
/// assert_eq!(&dec.decode(&mut buf).unwrap().unwrap()[..], b"{\"b\":2}");
/// ```
#[derive(Debug)]
pub struct LineDecoder {
    max_frame: usize,
    /// Bytes at the front of the buffer already searched for `\n` (none found).
    scanned: usize,
    /// Inside an oversized line: drop bytes up to and including the next `\n`.
    discarding: bool,
}

impl LineDecoder {
    /// A decoder that accepts frames of at most `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame,
            scanned: 0,
            discarding: false,
        }
    }

    /// Takes the next complete, non-blank frame off the front of `buf`.
    ///
    /// Returns `Ok(None)` when `buf` holds no complete frame (read more bytes and call
    /// again), and `Err(FrameError::TooLarge)` once per oversized frame; after an error
    /// simply call again. The frame excludes its `\n` / `\r\n` terminator.
    ///
    /// Cost: O(new bytes) per call, using `memchr`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        loop {
            if self.discarding {
                match memchr::memchr(b'\n', buf) {
                    Some(nl) => {
                        buf.advance(nl + 1);
                        self.discarding = false;
                    }
                    None => {
                        buf.clear();
                        return Ok(None);
                    }
                }
            }
            let Some(found) = memchr::memchr(b'\n', &buf[self.scanned..]) else {
                self.scanned = buf.len();
                // One byte of slack: a `\r` that may yet be followed by `\n`.
                if buf.len() > self.max_frame + 1
                    || (buf.len() == self.max_frame + 1 && buf[self.max_frame] != b'\r')
                {
                    buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                    return Err(self.too_large());
                }
                return Ok(None);
            };
            let nl = self.scanned + found;
            self.scanned = 0;
            let mut frame = buf.split_to(nl + 1);
            frame.truncate(nl);
            if frame.last() == Some(&b'\r') {
                frame.truncate(nl - 1);
            }
            if frame.len() > self.max_frame {
                return Err(self.too_large());
            }
            if frame.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
                continue;
            }
            return Ok(Some(frame));
        }
    }

    #[cold]
    fn too_large(&self) -> FrameError {
        FrameError::TooLarge {
            limit: self.max_frame,
        }
    }

    /// Bytes the decoder is still dropping because they belong to an oversized frame.
    pub fn is_discarding(&self) -> bool {
        self.discarding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(dec: &mut LineDecoder, buf: &mut BytesMut) -> Vec<Result<Vec<u8>, FrameError>> {
        let mut out = Vec::new();
        loop {
            match dec.decode(buf) {
                Ok(Some(f)) => out.push(Ok(f.to_vec())),
                Ok(None) => return out,
                Err(e) => out.push(Err(e)),
            }
        }
    }

    #[test]
    fn splits_lf_crlf_and_skips_blank_lines() {
        let mut dec = LineDecoder::new(100);
        let mut buf = BytesMut::from(&b"a\r\n\n  \r\nb\nc"[..]);
        let got = frames(&mut dec, &mut buf);
        assert_eq!(got, vec![Ok(b"a".to_vec()), Ok(b"b".to_vec())]);
        assert_eq!(&buf[..], b"c");
    }

    #[test]
    fn byte_at_a_time_gives_the_same_frames() {
        let input = b"{\"x\":1}\r\n\n[1,2]\nzz\n";
        let mut dec = LineDecoder::new(100);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for &b in input {
            buf.extend_from_slice(&[b]);
            got.extend(frames(&mut dec, &mut buf));
        }
        let want: Vec<Result<Vec<u8>, FrameError>> = vec![
            Ok(b"{\"x\":1}".to_vec()),
            Ok(b"[1,2]".to_vec()),
            Ok(b"zz".to_vec()),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn oversized_frame_is_discarded_without_buffering() {
        let mut dec = LineDecoder::new(4);
        let mut buf = BytesMut::new();
        let e = Err(FrameError::TooLarge { limit: 4 });
        buf.extend_from_slice(b"abcdef");
        assert_eq!(frames(&mut dec, &mut buf), vec![e]);
        assert!(buf.is_empty());
        buf.extend_from_slice(b"ghijkl");
        assert_eq!(frames(&mut dec, &mut buf), vec![]);
        assert!(buf.is_empty() && dec.is_discarding());
        buf.extend_from_slice(b"mn\nok\n");
        assert_eq!(frames(&mut dec, &mut buf), vec![Ok(b"ok".to_vec())]);
    }

    #[test]
    fn limit_is_exact() {
        let mut dec = LineDecoder::new(4);
        let mut buf = BytesMut::from(&b"abcd\r\nabcd\nabcde\nx\n"[..]);
        let e = Err(FrameError::TooLarge { limit: 4 });
        let want = vec![
            Ok(b"abcd".to_vec()),
            Ok(b"abcd".to_vec()),
            e,
            Ok(b"x".to_vec()),
        ];
        assert_eq!(frames(&mut dec, &mut buf), want);
        // Pending bytes: exactly the limit plus a `\r` is still a possible frame.
        let mut buf = BytesMut::from(&b"abcd\r"[..]);
        assert_eq!(frames(&mut dec, &mut buf), vec![]);
        buf.extend_from_slice(b"\n");
        assert_eq!(frames(&mut dec, &mut buf), vec![Ok(b"abcd".to_vec())]);
    }
}
