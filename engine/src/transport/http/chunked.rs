//! Chunked bodies (RFC 9112 §7.1): one decoder, resumable across reads and de-chunking
//! in place in the read buffer, for the server's requests ([`Strictness::Strict`]) and
//! the client's responses ([`Strictness::Lenient`]).

use bytes::{Buf, BytesMut};

use crate::dispatch::context::trim_ows;

/// The longest chunk-size line the server accepts (hex size, extensions and CRLF), in
/// bytes.
pub(crate) const MAX_CHUNK_LINE: usize = 4096;

/// How strictly chunked framing is read. A server reading requests refuses what a proxy
/// in front of it might frame differently (request smuggling); a client reading
/// responses accepts what servers send, as it always has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strictness {
    /// The server's rules (see the [module docs](super)): every line ends in CRLF (a
    /// bare CR or LF is refused); a size is `1*HEXDIG`, overflow checked, then optional
    /// whitespace and `;` extensions without control characters. A line is refused as
    /// soon as it cannot fit its bound, before its syntax is looked at, and the empty line
    /// that ends the trailers counts toward theirs.
    Strict,
    /// The client's rules: a size line as httparse reads it (at most 16 hex digits,
    /// possibly none; spaces or tabs after them; an extension may hold any byte but CR,
    /// a bare LF included; CRLF at the end), its syntax checked before its bound; a
    /// trailer line ends in LF, with or without CR, and may hold anything. An unfinished
    /// line is refused only once its bytes pass the bound; the empty line that ends the
    /// trailers is not counted.
    // Only the client reads leniently.
    #[cfg_attr(not(feature = "client"), allow(dead_code))]
    Lenient,
}

/// The bounds a chunked body is read within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkLimits {
    /// The most body bytes, after de-chunking.
    pub(crate) max_body: usize,
    /// The longest chunk-size line, its line ending included.
    pub(crate) max_line: usize,
    /// The most trailer-section bytes.
    pub(crate) max_trailers: usize,
    /// The most bytes on the wire, framing included, checked on all that has arrived
    /// until the body is complete (`usize::MAX` for none beyond the others).
    pub(crate) max_wire: usize,
}

/// Why a chunked body was refused; each side maps these to its own errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkError {
    /// A chunk-size line that breaks the rules.
    Size,
    /// Chunk data not followed by CRLF.
    DataEnd,
    /// A trailer line with a bare CR or LF (strict only).
    Trailer,
    /// A chunk-size line longer than `max_line`.
    LineTooLong,
    /// A chunk that would take the body past `max_body`.
    BodyTooLarge,
    /// Trailers past `max_trailers`.
    TrailersTooLarge,
    /// Wire bytes past `max_wire`.
    WireTooLarge,
}

/// De-chunking state. The body is gathered in place at the front of the read buffer,
/// behind the `kept` bytes the caller keeps there (the server's request head; none for
/// the client):
///
/// ```text
///  buf: [ kept: ..kept ][ de-chunked body: kept..out ][ consumed framing: out..pos ][ unread: pos.. ]
/// ```
///
/// While no body byte has arrived, consumed framing is dropped with `advance` (O(1);
/// kept bytes are first moved up over it, once), so the first chunk's data never moves;
/// after that, each later chunk's data is moved down to `out` once as it arrives.
/// Between calls the consumed framing is squeezed out whenever it (with the kept bytes)
/// is at least as long as the unread tail, so kept bytes and framing together never
/// hold more than one line.
#[derive(Debug)]
pub(crate) struct Chunked {
    strictness: Strictness,
    phase: Phase,
    /// Bytes at the front of the buffer that are not the body's but stay in front of
    /// it, and come back with it.
    kept: usize,
    /// Invariant: `kept <= out <= pos <= buf.len()`.
    out: usize,
    /// Where the unread bytes start in the buffer (the client's tests read it).
    pub(crate) pos: usize,
    /// Bytes of the line starting at `pos` already searched for `\n`.
    scanned: usize,
    /// Trailer-section bytes so far.
    trailers: usize,
    /// Framing bytes taken out of the buffer so far: `dropped + pos` wire bytes have
    /// been consumed, whatever was squeezed out.
    dropped: usize,
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
    /// A decoder for a body whose first byte is at the front of the buffer.
    // Only the client's bodies start at the front (the server keeps its heads).
    #[cfg_attr(not(feature = "client"), allow(dead_code))]
    pub(crate) fn new(strictness: Strictness) -> Self {
        Self::after(strictness, 0)
    }

    /// A decoder for a body that starts after `kept` bytes at the front of the buffer
    /// (a request's head): they stay in front of the body, and [`Chunked::decode`]
    /// returns them with it.
    pub(crate) fn after(strictness: Strictness, kept: usize) -> Self {
        Self {
            strictness,
            phase: Phase::Size,
            kept,
            out: kept,
            pos: kept,
            scanned: 0,
            trailers: 0,
            dropped: 0,
        }
    }

    /// Advances through what `buf` holds. `Ok(Some(body))` once the body is complete:
    /// split off the front of `buf` (no copy), the kept bytes then the body, its framing
    /// dropped, whatever follows left in `buf`. `Ok(None)`: more bytes are needed (the
    /// progress is kept).
    ///
    /// Cost: each byte is looked at once, except a lenient size line, which httparse
    /// reads again on each call until it is complete (at most `max_line` bytes).
    pub(crate) fn decode(
        &mut self,
        buf: &mut BytesMut,
        limits: &ChunkLimits,
    ) -> Result<Option<BytesMut>, ChunkError> {
        let done = self.run(buf, limits)?;
        // On the wire bytes consumed once complete, on all that has arrived before: the
        // verdict does not depend on how the bytes were split into reads.
        let seen = if done { self.pos } else { buf.len() };
        if self.dropped.saturating_add(seen - self.kept) > limits.max_wire {
            return Err(ChunkError::WireTooLarge);
        }
        if !done {
            return Ok(None);
        }
        let body = buf.split_to(self.out);
        buf.advance(self.pos - self.out);
        Ok(Some(body))
    }

    /// Advances through what `buf` holds; `Ok(true)` when the body is complete: it is
    /// `buf[kept..out]`, and the framing up to `pos` follows it.
    fn run(&mut self, buf: &mut BytesMut, limits: &ChunkLimits) -> Result<bool, ChunkError> {
        loop {
            match self.phase {
                Phase::Size => {
                    let Some((next, size)) = self.size_line(buf, limits.max_line)? else {
                        break;
                    };
                    let budget = limits.max_body.saturating_sub(self.out - self.kept);
                    let size = usize::try_from(size)
                        .ok()
                        .filter(|&size| size <= budget)
                        .ok_or(ChunkError::BodyTooLarge)?;
                    self.pos = next;
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
                    if self.out == self.kept && self.pos != self.kept {
                        // The first data: the framing before it goes, and the kept
                        // bytes (the server's head, at most `max_head_bytes`) move up
                        // over it rather than the data down.
                        let gap = self.pos - self.kept;
                        buf.copy_within(..self.kept, gap);
                        buf.advance(gap);
                        self.dropped += gap;
                        self.pos = self.kept;
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
                        return Err(ChunkError::DataEnd);
                    }
                    self.pos += 2;
                    self.phase = Phase::Size;
                }
                Phase::Trailers => {
                    let budget = limits.max_trailers.saturating_sub(self.trailers);
                    let Some((next, empty)) = self.trailer_line(buf, budget)? else {
                        break;
                    };
                    self.trailers += next - self.pos;
                    self.pos = next;
                    if empty {
                        return Ok(true);
                    }
                }
            }
        }
        self.compact(buf);
        Ok(false)
    }

    /// The chunk-size line at `pos`: where the next line starts, and the size (not yet
    /// checked against the body's bound). `Ok(None)` if it has not all arrived.
    fn size_line(
        &mut self,
        buf: &[u8],
        max_line: usize,
    ) -> Result<Option<(usize, u64)>, ChunkError> {
        match self.strictness {
            Strictness::Strict => {
                let Some(cr) = self.crlf_line(buf, max_line, ChunkError::LineTooLong)? else {
                    return Ok(None);
                };
                let size = chunk_size(&buf[self.pos..cr])?;
                Ok(Some((cr + 2, size)))
            }
            // httparse's rules, which the client has always read sizes by: its lenience
            // (a bare LF inside an extension, no digits at all) is not the strict
            // grammar's with a switch, so it stays httparse's own.
            Strictness::Lenient => {
                let raw = &buf[self.pos..];
                match httparse::parse_chunk_size(raw) {
                    Ok(httparse::Status::Complete((used, size))) if used <= max_line => {
                        Ok(Some((self.pos + used, size)))
                    }
                    Ok(httparse::Status::Partial) if raw.len() <= max_line => Ok(None),
                    Ok(_) => Err(ChunkError::LineTooLong),
                    Err(_) => Err(ChunkError::Size),
                }
            }
        }
    }

    /// The trailer line at `pos`: where the next line starts, and whether it was the
    /// empty line that ends the body. `Ok(None)` if it has not all arrived. `budget`:
    /// the trailer bytes still allowed.
    fn trailer_line(
        &mut self,
        buf: &[u8],
        budget: usize,
    ) -> Result<Option<(usize, bool)>, ChunkError> {
        match self.strictness {
            Strictness::Strict => {
                let Some(cr) = self.crlf_line(buf, budget, ChunkError::TrailersTooLarge)? else {
                    return Ok(None);
                };
                Ok(Some((cr + 2, cr == self.pos)))
            }
            Strictness::Lenient => {
                let Some(lf) = self.find_lf(buf, budget, ChunkError::TrailersTooLarge)? else {
                    return Ok(None);
                };
                let line = &buf[self.pos..lf];
                let empty = line.is_empty() || line == b"\r";
                if !empty && lf + 1 - self.pos > budget {
                    return Err(ChunkError::TrailersTooLarge);
                }
                Ok(Some((lf + 1, empty)))
            }
        }
    }

    /// Finds the CRLF ending the line at `pos` (strict): `Ok(Some(index of its \r))`,
    /// `Ok(None)` if it has not all arrived. A line (CRLF included) longer than `limit`
    /// is `too_long`; a bare LF or a bare CR is malformed: [`ChunkError::Size`] in a
    /// size line, [`ChunkError::Trailer`] in a trailer.
    fn crlf_line(
        &mut self,
        buf: &[u8],
        limit: usize,
        too_long: ChunkError,
    ) -> Result<Option<usize>, ChunkError> {
        let malformed = match self.phase {
            Phase::Trailers => ChunkError::Trailer,
            _ => ChunkError::Size,
        };
        let Some(lf) = self.find_lf(buf, limit, too_long)? else {
            return Ok(None);
        };
        if lf + 1 - self.pos > limit {
            return Err(too_long);
        }
        let cr = match lf.checked_sub(1) {
            Some(cr) if cr >= self.pos && buf.get(cr) == Some(&b'\r') => cr,
            _ => return Err(malformed),
        };
        if memchr::memchr(b'\r', &buf[self.pos..cr]).is_some() {
            return Err(malformed);
        }
        Ok(Some(cr))
    }

    /// Finds the first `\n` at or after `pos`, resuming the search where the last call
    /// stopped. `Ok(None)` if none has arrived, unless the line is already over `limit`
    /// (CRLF included): then `too_long`.
    fn find_lf(
        &mut self,
        buf: &[u8],
        limit: usize,
        too_long: ChunkError,
    ) -> Result<Option<usize>, ChunkError> {
        let from = self.pos + self.scanned;
        if let Some(i) = buf.get(from..).and_then(|rest| memchr::memchr(b'\n', rest)) {
            self.scanned = 0;
            return Ok(Some(from + i));
        }
        self.scanned = buf.len() - self.pos;
        let over = match self.strictness {
            // Even if the next byte were the `\n`, the line would be over the limit.
            Strictness::Strict => self.scanned >= limit,
            // Only once the bytes themselves are over it (one byte later).
            Strictness::Lenient => self.scanned > limit,
        };
        if over {
            Err(too_long)
        } else {
            Ok(None)
        }
    }

    /// Drops consumed framing so the buffer holds the kept bytes and the body, and
    /// besides them at most two lines: the unread tail, and framing (with the kept
    /// bytes) shorter than it.
    fn compact(&mut self, buf: &mut BytesMut) {
        let gap = self.pos - self.out;
        if gap == 0 {
            return;
        }
        if self.out == 0 {
            buf.advance(gap);
            self.dropped += gap;
            self.pos = 0;
            return;
        }
        let tail = buf.len() - self.pos;
        // The kept bytes count with the framing: the buffer's bound (one body and two
        // lines) must hold with them too. The copy is still amortized: at most the
        // tail, once per call that consumed a line.
        if gap + self.kept >= tail {
            buf.copy_within(self.pos.., self.out);
            buf.truncate(self.out + tail);
            self.dropped += gap;
            self.pos = self.out;
        }
    }
}

/// A strict chunk-size line without its CRLF: `1*HEXDIG [ BWS ";" chunk-ext ]`, the
/// size overflow checked; extensions are ignored but may not hold control characters.
fn chunk_size(line: &[u8]) -> Result<u64, ChunkError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ChunkError::Size);
    }
    let size = line[..digits].iter().try_fold(0u64, |n, &b| {
        let d = char::from(b).to_digit(16).unwrap_or_default();
        n.checked_mul(16)
            .and_then(|n| n.checked_add(u64::from(d)))
            .ok_or(ChunkError::Size)
    })?;
    let ext = &line[digits..];
    if !ext.is_empty() {
        let ext = trim_ows(ext);
        let ctl = |b: &u8| (*b < 0x20 && *b != b'\t') || *b == 0x7f;
        if ext.first() != Some(&b';') || ext.iter().any(ctl) {
            return Err(ChunkError::Size);
        }
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::testing::{body_and_base, BODY, CHUNKED_HEAD};

    #[test]
    fn chunked_body_is_gathered_in_place() {
        // One chunk: its data does not move.
        let one = format!("{CHUNKED_HEAD}28\r\n{BODY}\r\n0\r\n\r\n");
        let (body, base) = body_and_base(one.as_bytes());
        assert_eq!(&body[..], BODY.as_bytes());
        assert_eq!(body.as_ptr() as usize, base + CHUNKED_HEAD.len() + 4);
        // The head moved up over the size line, in front of the data.
        assert_eq!(body.head(), CHUNKED_HEAD.as_bytes());
        assert_eq!(body.head().as_ptr() as usize, base + 4);
        // Several: gathered at the first chunk's place, in the same allocation.
        let (a, b) = BODY.split_at(10);
        let many = format!("{CHUNKED_HEAD}a;x=1\r\n{a}\r\n1E\r\n{b}\r\n0\r\nT: 1\r\n\r\n");
        let (body, base) = body_and_base(many.as_bytes());
        assert_eq!(&body[..], BODY.as_bytes());
        assert_eq!(body.as_ptr() as usize, base + CHUNKED_HEAD.len() + 7);
        assert_eq!(body.head(), CHUNKED_HEAD.as_bytes());
    }

    const LIMITS: ChunkLimits = ChunkLimits {
        max_body: 1024,
        max_line: 20,
        max_trailers: 16,
        max_wire: usize::MAX,
    };

    type Verdict = Result<Option<Vec<u8>>, ChunkError>;

    /// Feeds `input` (a body's framing, perhaps then `-rest`) in pieces of `step` bytes,
    /// as reads would: the first body or error, else `Ok(None)`; and what is left in the
    /// buffer.
    fn feed(s: Strictness, limits: &ChunkLimits, input: &[u8], step: usize) -> (Verdict, Vec<u8>) {
        let mut chunked = Chunked::new(s);
        let mut buf = BytesMut::new();
        for piece in input.chunks(step) {
            buf.extend_from_slice(piece);
            match chunked.decode(&mut buf, limits) {
                Ok(None) => {}
                Ok(Some(body)) => return (Ok(Some(body.to_vec())), buf.to_vec()),
                Err(e) => return (Err(e), buf.to_vec()),
            }
        }
        (Ok(None), buf.to_vec())
    }

    fn body(b: &str) -> Verdict {
        Ok(Some(b.as_bytes().to_vec()))
    }

    /// Each difference between the two settings, and what they share; every verdict the
    /// same fed whole and a byte at a time.
    #[test]
    fn strict_and_lenient() {
        use ChunkError::*;
        let cases: [(&str, Verdict, Verdict); 20] = [
            // Shared: extensions ignored, trailers skipped, data CRLF required.
            (
                "2;a=b\r\n[]\r\n1 ; c\r\n1\r\n0\r\nT: v\r\n\r\n-rest",
                body("[]1"),
                body("[]1"),
            ),
            ("2\r\n[]\n0\r\n\r\n", Err(DataEnd), Err(DataEnd)),
            ("zz\r\n", Err(Size), Err(Size)),
            ("2\n[]\r\n0\r\n\r\n", Err(Size), Err(Size)),
            ("2\r\r\n", Err(Size), Err(Size)),
            ("10000000000000000\r\n", Err(Size), Err(Size)),
            ("401\r\n", Err(BodyTooLarge), Err(BodyTooLarge)),
            (
                "2;aaaaaaaaaaaaaaaaa\r\n[]\r\n0\r\n\r\n",
                Err(LineTooLong),
                Err(LineTooLong),
            ),
            (
                "2;aaaaaaaaaaaaaaaa\r\n[]\r\n0\r\n\r\n",
                body("[]"),
                body("[]"),
            ),
            (
                "0\r\nA: bbbbbbbbbbbb\r\n",
                Err(TrailersTooLarge),
                Err(TrailersTooLarge),
            ),
            // Refused only strictly: whitespace without an extension, control characters
            // in one, a bare LF in one, no digits; a bare LF or CR in a trailer.
            ("2 \r\n[]\r\n0\r\n\r\n", Err(Size), body("[]")),
            ("2;\x01\r\n[]\r\n0\r\n\r\n", Err(Size), body("[]")),
            ("2;a\nb\r\n[]\r\n0\r\n\r\n", Err(Size), body("[]")),
            ("\r\nT: v\r\n\r\n", Err(Size), body("")),
            ("0\r\nA: b\n\r\n", Err(Trailer), body("")),
            ("0\r\nA: \rb\r\n\r\n", Err(Trailer), body("")),
            ("0\r\n\n", Err(Trailer), body("")),
            // Refused only leniently: more than 16 hex digits, even if zeros.
            (
                "00000000000000002\r\n[]\r\n0\r\n\r\n",
                body("[]"),
                Err(Size),
            ),
            // A line over its bound: strict looks no further, lenient finds the bare CR.
            ("2;\raaaaaaaaaaaaaaaaaaa\r\n", Err(LineTooLong), Err(Size)),
            // The empty line ending the trailers counts toward their bound only strictly.
            (
                "0\r\nA: bbbbbbbbbb\r\n\r\n",
                Err(TrailersTooLarge),
                body(""),
            ),
        ];
        for (input, strict, lenient) in cases {
            for (s, want) in [
                (Strictness::Strict, &strict),
                (Strictness::Lenient, &lenient),
            ] {
                for step in [input.len(), 1] {
                    let (got, rest) = feed(s, &LIMITS, input.as_bytes(), step);
                    assert_eq!(&got, want, "{input:?} {s:?} step {step}");
                    if step > 1 && input.ends_with("-rest") {
                        assert_eq!(rest, b"-rest", "{input:?} {s:?} step {step}");
                    }
                }
            }
        }
    }

    /// An unfinished line is refused strictly as soon as it cannot fit its bound,
    /// leniently once its bytes pass it.
    #[test]
    fn unfinished_lines_over_the_bound() {
        let line = "2;aaaaaaaaaaaaaaaaaa"; // 20 bytes, no line end yet
        let strict = feed(Strictness::Strict, &LIMITS, line.as_bytes(), 1).0;
        assert_eq!(strict, Err(ChunkError::LineTooLong));
        let lenient = feed(Strictness::Lenient, &LIMITS, line.as_bytes(), 1).0;
        assert_eq!(lenient, Ok(None));
        let over = format!("{line}a");
        let lenient = feed(Strictness::Lenient, &LIMITS, over.as_bytes(), 1).0;
        assert_eq!(lenient, Err(ChunkError::LineTooLong));
    }

    /// The wire bound (the client's) counts framing already squeezed out of the buffer:
    /// on all that has arrived until the body is complete, on what it took after.
    #[test]
    fn the_wire_bound_counts_every_byte() {
        let input = "1;aaaa\r\nx\r\n1;bbbb\r\ny\r\n0\r\n\r\n"; // 27 bytes
        for s in [Strictness::Strict, Strictness::Lenient] {
            for step in [input.len(), 1] {
                let bound = |max_wire| ChunkLimits { max_wire, ..LIMITS };
                let (got, _) = feed(s, &bound(27), input.as_bytes(), step);
                assert_eq!(got, body("xy"), "{s:?} step {step}");
                let (got, _) = feed(s, &bound(26), input.as_bytes(), step);
                assert_eq!(got, Err(ChunkError::WireTooLarge), "{s:?} step {step}");
            }
            // What follows the body is not counted once it is complete.
            let more = format!("{input}-rest");
            let bound = ChunkLimits {
                max_wire: 27,
                ..LIMITS
            };
            let (got, rest) = feed(s, &bound, more.as_bytes(), more.len());
            assert_eq!((got, &rest[..]), (body("xy"), &b"-rest"[..]));
        }
    }

    /// Kept bytes stay in front of the body and come back with it; the first chunk's
    /// data still does not move (the kept bytes move up over its size line instead);
    /// and consumed framing is squeezed out once it and the kept bytes together are as
    /// long as the unread tail, so they cannot add a line to what the buffer holds.
    #[test]
    fn kept_bytes_stay_in_front_and_count_with_the_framing() {
        const KEPT: &[u8] = b"HEAD:12345";
        // (Room for all of it: the buffer does not move when more arrives.)
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(b"HEAD:123452\r\n[]\r\n3;eeeeeeee");
        let base = buf.as_ptr() as usize;
        let mut chunked = Chunked::after(Strictness::Strict, KEPT.len());
        assert_eq!(chunked.decode(&mut buf, &LIMITS), Ok(None));
        // The size line dropped (advance, kept bytes moved up), the data in place; then
        // the data's CRLF (2 bytes) with the 10 kept bytes outweighs the 10-byte tail,
        // so it went too: kept bytes, body, tail.
        assert_eq!(&buf[..], b"HEAD:12345[]3;eeeeeeee");
        assert_eq!(buf.as_ptr() as usize, base + 3);
        buf.extend_from_slice(b"\r\nabc\r\n0\r\n\r\n-rest");
        let got = chunked.decode(&mut buf, &LIMITS);
        let Ok(Some(both)) = got else {
            panic!("{got:?}");
        };
        assert_eq!(&both[..], b"HEAD:12345[]abc");
        assert_eq!(both.as_ptr() as usize, base + 3);
        assert_eq!(&buf[..], b"-rest");
        // The body's bound does not count the kept bytes.
        let mut buf = BytesMut::from(&b"HEAD:12345400\r\n"[..]);
        let got = Chunked::after(Strictness::Strict, KEPT.len()).decode(&mut buf, &LIMITS);
        assert_eq!(got, Ok(None));
    }

    /// Either way the first chunk's data stays where it arrived.
    #[test]
    fn the_first_chunk_stays_in_place_either_way() {
        for s in [Strictness::Strict, Strictness::Lenient] {
            let mut buf = BytesMut::from(&b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"[..]);
            let base = buf.as_ptr() as usize;
            let got = Chunked::new(s).decode(&mut buf, &LIMITS);
            let Ok(Some(body)) = got else {
                panic!("{got:?}");
            };
            assert_eq!(
                (&body[..], body.as_ptr() as usize),
                (&b"hello world"[..], base + 3)
            );
        }
    }
}
