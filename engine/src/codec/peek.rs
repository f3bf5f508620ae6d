//! A request's id read off its raw bytes before they are parsed: a hint, for work that
//! may start early (the de-duplication store's line of the call's key, fetched while
//! the request before it runs: see `Engine::prefetch_frame`).
//!
//! Only where clients put it, looked at in place, never searched for (it is read ahead of
//! every call on a connection whose calls are being de-duplicated, so it must cost
//! little): the first member after `"jsonrpc":"2.0"` or alone (`{"id":7,…`), or the
//! last (`…,"id":7}`).
//! It can be wrong (a value simd-json would refuse, a member of another object), so
//! nothing may depend on it but speed: a wrong id only fetches a line no call needs.

use super::Id;

/// How far into the buffer the end of the next line is looked for: a longer request is
/// simply not hinted.
const WINDOW: usize = 512;

/// The id the next line of `buf` (one JSON-RPC request, raw; the line need not be
/// whole) most likely has, if it is an integer, a string without escapes, or `null`,
/// and its member comes first or last. `len` is a guess of the line's length (the
/// line before it had that length: pipelined requests are alike), taken when a line
/// break follows it; otherwise the line's end is searched for.
#[inline]
pub(crate) fn id(buf: &[u8], len: usize) -> Option<Id<'_>> {
    let window = buf.get(..WINDOW).unwrap_or(buf);
    // The first member first: where this crate's client and jsonrpsee put the id, and
    // read without finding the line's end.
    first(window).or_else(|| {
        let line = match window.get(len) {
            Some(b'\n' | b'\r') => window.get(..len)?,
            _ => match memchr::memchr(b'\n', window) {
                Some(nl) => window.get(..nl)?,
                None => window,
            },
        };
        compact(line).or_else(|| last(line))
    })
}

/// [`last`]'s usual case, read in fewer steps: `…"id":DIGITS}` with nothing between
/// (how compact writers end a request). Anything else is left to [`last`].
#[inline(always)]
fn compact(line: &[u8]) -> Option<Id<'static>> {
    let [rest @ .., b'0'..=b'9', b'}'] = line else {
        return None;
    };
    let end = rest.len() + 1;
    let start = digits_before(line, end)?;
    if line.get(start.checked_sub(5)?..start)? != b"\"id\":" {
        return None;
    }
    // Up to 16 digits as the one or two words that end where they do, the bytes
    // before them masked to zeros (read as leading `0`s).
    let low = |n: usize| !0u64 << ((8 - n) * 8);
    let before = |back: usize| end.checked_sub(back).and_then(|at| word(line, at));
    let n = end - start;
    let words = match n {
        1..=8 => before(8).map(|w| eight(w & low(n))),
        9..=16 => before(16)
            .zip(before(8))
            .map(|(hi, lo)| eight(hi & low(n - 8)) * 100_000_000 + eight(lo)),
        _ => None,
    };
    match words {
        Some(v) => Some(Id::UInt(v)),
        None => value(line.get(start..end)?).map(Id::UInt),
    }
}

/// The value of a last member `"id":VALUE}` of `line`.
fn last(line: &[u8]) -> Option<Id<'_>> {
    let line = line.trim_ascii_end().strip_suffix(b"}")?.trim_ascii_end();
    // Where the value starts, and for an integer where its digits start. Slice patterns
    // and words, not iterator chains over bytes: every de-duplicated call's hint pays
    // this.
    let (at, digits) = match line {
        [body @ .., b'"'] => (memchr::memrchr2(b'"', b'\\', body)?, None),
        [.., b'n', b'u', b'l', b'l'] => (line.len() - 4, None),
        _ => {
            let start = digits_before(line, line.len())?;
            match line.get(..start) {
                Some([.., b'-']) => (start - 1, Some(start)),
                _ => (start, Some(start)),
            }
        }
    };
    let (before, value) = line.split_at_checked(at)?;
    let before = before.trim_ascii_end().strip_suffix(b":")?.trim_ascii_end();
    before.strip_suffix(b"\"id\"")?;
    match digits {
        // The digits run to the line's end: whole, and found already.
        Some(start) if start < line.len() => signed(start > at, self::value(line.get(start..)?)?),
        Some(_) => None,
        None => scalar(value),
    }
}

/// An integer id: `n`, or `-n`.
#[inline]
fn signed(negative: bool, n: u64) -> Option<Id<'static>> {
    match (negative, n) {
        (false, n) | (true, n @ 0) => Some(Id::UInt(n)),
        (true, n) => Some(Id::Int(0i64.checked_sub_unsigned(n)?)),
    }
}

/// The value of a first member `{"id":VALUE,` of `line`, or of the member after
/// `"jsonrpc":"2.0"`.
fn first(line: &[u8]) -> Option<Id<'_>> {
    let rest = line
        .strip_prefix(br#"{"jsonrpc":"2.0","id":"#)
        .or_else(|| line.strip_prefix(br#"{"id":"#))?;
    scalar(rest)
}

/// The id at the start of `s` (a string's opening quote included).
fn scalar(s: &[u8]) -> Option<Id<'_>> {
    match s {
        [b'"', body @ ..] => {
            let end = memchr::memchr2(b'"', b'\\', body)?;
            if body.get(end) != Some(&b'"') {
                return None;
            }
            std::str::from_utf8(body.get(..end)?).ok().map(Id::Str)
        }
        [b'n', b'u', b'l', b'l', ..] => Some(Id::Null),
        [b'-', digits @ ..] => signed(true, integer(digits)?),
        [b'0'..=b'9', ..] => integer(s).map(Id::UInt),
        _ => None,
    }
}

/// The most digits a `u64` has.
const MAX_DIGITS: usize = 20;

/// The digits at the start of `s` as a `u64`, if they are a whole integer (not followed
/// by a fraction, an exponent or a letter) and fit.
#[inline]
fn integer(s: &[u8]) -> Option<u64> {
    let end = digits_after(s)?;
    let whole = end > 0
        && !s
            .get(end)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'.');
    if !whole {
        return None;
    }
    value(s.get(..end)?)
}

/// Eight bytes of `s` from `at`, as a little-endian word (the first byte lowest).
#[inline(always)]
fn word(s: &[u8], at: usize) -> Option<u64> {
    let b = s.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The high bit of every byte.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that is not an ASCII digit (no carries between
/// bytes: each byte's low seven bits are compared on their own).
#[inline(always)]
fn non_digits(w: u64) -> u64 {
    let low = w & !HIGH;
    let at_least_0 = low + 0x5050_5050_5050_5050; // high bit set: byte >= b'0'
    let past_9 = low + 0x4646_4646_4646_4646; // high bit set: byte > b'9'
    (w | !at_least_0 | past_9) & HIGH
}

/// The value of eight ASCII digits, the first in the lowest byte (the usual
/// three-multiply reduction: pairs, then fours, then the eight).
#[inline(always)]
fn eight(w: u64) -> u64 {
    let v = w & 0x0f0f_0f0f_0f0f_0f0f;
    let v = (v.wrapping_mul(10) + (v >> 8)) & 0x00ff_00ff_00ff_00ff;
    let v = (v.wrapping_mul(100) + (v >> 16)) & 0x0000_ffff_0000_ffff;
    (v.wrapping_mul(10_000) + (v >> 32)) & 0xffff_ffff
}

/// How many ASCII digits `s` starts with, if at most [`MAX_DIGITS`] (counted a word
/// at a time where `s` is long enough).
#[inline]
fn digits_after(s: &[u8]) -> Option<usize> {
    let mut n = 0;
    while n <= MAX_DIGITS {
        let Some(w) = word(s, n) else {
            // The last few bytes, one at a time.
            let more = s
                .get(n..)?
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            return (n + more <= MAX_DIGITS).then_some(n + more);
        };
        match non_digits(w) {
            0 => n += 8,
            m => return Some(n + (m.trailing_zeros() / 8) as usize).filter(|n| *n <= MAX_DIGITS),
        }
    }
    None
}

/// Where the run of ASCII digits ending at `end` of `s` starts, if it is at most
/// [`MAX_DIGITS`] long.
#[inline]
fn digits_before(s: &[u8], end: usize) -> Option<usize> {
    let mut at = end;
    while end - at <= MAX_DIGITS {
        let Some(w) = at.checked_sub(8).and_then(|from| word(s, from)) else {
            // The first few bytes, one at a time.
            let mut head = s.get(..at)?;
            while let [rest @ .., b'0'..=b'9'] = head {
                head = rest;
            }
            return (end - head.len() <= MAX_DIGITS).then_some(head.len());
        };
        match non_digits(w) {
            0 => at -= 8,
            m => {
                let start = at - (m.leading_zeros() / 8) as usize;
                return (end - start <= MAX_DIGITS).then_some(start);
            }
        }
    }
    None
}

/// The value of `digits` (ASCII digits only, at most [`MAX_DIGITS`]), if it fits a
/// `u64`: the first `len % 8` one at a time, then eight at a time.
#[inline]
fn value(digits: &[u8]) -> Option<u64> {
    let (head, groups) = digits.split_at(digits.len() % 8);
    // At most seven digits: no overflow.
    let mut n = head
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d.wrapping_sub(b'0')));
    for g in groups.chunks_exact(8) {
        let w = u64::from_le_bytes(g.try_into().ok()?);
        n = n.checked_mul(100_000_000)?.checked_add(eight(w))?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_ids_requests_have() {
        let cases: &[(&str, Option<Id<'_>>)] = &[
            (
                r#"{"jsonrpc":"2.0","method":"incr","params":[1],"id":7}"#,
                Some(Id::UInt(7)),
            ),
            (
                concat!(
                    r#"{"jsonrpc":"2.0","method":"incr","params":[1],"id":7}"#,
                    "\r\n{\"id\":8}"
                ),
                Some(Id::UInt(7)),
            ),
            (r#"{"method":"incr", "id" : -12 } "#, Some(Id::Int(-12))),
            (r#"{"method":"incr","id":"a-1"}"#, Some(Id::Str("a-1"))),
            (r#"{"method":"incr","id":null}"#, Some(Id::Null)),
            (
                r#"{"jsonrpc":"2.0","id":"x","method":"incr","params":[1]}"#,
                Some(Id::Str("x")),
            ),
            (r#"{"id":5,"method":"incr"}"#, Some(Id::UInt(5))),
            (r#"{"id":18446744073709551615}"#, Some(Id::UInt(u64::MAX))),
            (r#"{"id":-9223372036854775808}"#, Some(Id::Int(i64::MIN))),
            (r#"{"id":-0}"#, Some(Id::UInt(0))),
            (r#"{"a":1,"id":5}"#, Some(Id::UInt(5))),
            (r#"{"id":5}"#, Some(Id::UInt(5))),
            (r#"{,"id":-5}"#, Some(Id::Int(-5))),
            (r#"{"m":"x","id":12345678}"#, Some(Id::UInt(12_345_678))),
            (r#"{"m":"x","id":x12345678}"#, None),
            (r#"{"m":"x","id":1.12345678}"#, None),
        ];
        for (frame, want) in cases {
            assert_eq!(id(frame.as_bytes(), 0), *want, "{frame}");
            // The line's length guessed right (the end taken without a search), or wrong
            // (searched for): the same id.
            let line = frame.split(['\r', '\n']).next().unwrap_or_default();
            for len in [line.len(), line.len() + 1, 3, 10_000] {
                assert_eq!(id(frame.as_bytes(), len), *want, "{frame} {len}");
            }
            // The short way reads what the long one does, when it reads anything.
            if let Some(short) = compact(line.as_bytes()) {
                assert_eq!(Some(short), last(line.as_bytes()), "{frame}");
            }
        }
    }

    /// Integers of every length, both places, both signs: the same value as Rust's own
    /// parse, and none past what a `u64` (or an `i64`, negative) holds.
    #[test]
    fn reads_integers_of_every_length() {
        let mut values = vec![0u64, 7, 10, 99, 1_000_000_007, u64::MAX, u64::MAX - 1];
        values.extend((0..20).map(|k| 10u64.pow(k)));
        values.extend((1..20).map(|k| 10u64.pow(k) - 1));
        values.extend((1..20).map(|k| 10u64.pow(k) + 7));
        for v in values {
            for frame in [
                format!(r#"{{"jsonrpc":"2.0","method":"incr","params":[1],"id":{v}}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{v},"method":"incr"}}"#),
            ] {
                assert_eq!(id(frame.as_bytes(), 0), Some(Id::UInt(v)), "{frame}");
                if frame.ends_with(&format!(":{v}}}")) {
                    assert_eq!(compact(frame.as_bytes()), Some(Id::UInt(v)), "{frame}");
                }
                let negative = frame.replace(&format!(":{v}"), &format!(":-{v}"));
                let want = match i64::try_from(v) {
                    Ok(0) => Some(Id::UInt(0)),
                    Ok(i) => Some(Id::Int(-i)),
                    Err(_) => None,
                };
                assert_eq!(id(negative.as_bytes(), 0), want, "{negative}");
            }
        }
        // Past u64: 2^64 and 21 digits.
        for v in [
            "18446744073709551616",
            "100000000000000000000",
            "99999999999999999999",
        ] {
            let frame = format!(r#"{{"id":{v},"method":"incr"}}"#);
            assert_eq!(id(frame.as_bytes(), 0), None, "{frame}");
            let frame = format!(r#"{{"method":"incr","id":{v}}}"#);
            assert_eq!(id(frame.as_bytes(), 0), None, "{frame}");
        }
    }

    /// The word-at-a-time digit test against the byte one, for every byte in every
    /// place among digits and among non-digits; and the eight-digit value.
    #[test]
    fn words_agree_with_bytes() {
        for b in 0..=255u8 {
            for at in 0..8 {
                for fill in [b'7', b'x', 0xff, b'0', b'9', b'/', b':'] {
                    let mut bytes = [fill; 8];
                    bytes[at] = b;
                    let m = non_digits(u64::from_le_bytes(bytes));
                    for (i, byte) in bytes.iter().enumerate() {
                        let flagged = m >> (i * 8 + 7) & 1 == 1;
                        assert_eq!(flagged, !byte.is_ascii_digit(), "{bytes:?} at {i}");
                    }
                }
            }
        }
        for v in [0u64, 1, 12_345_678, 99_999_999, 10_000_000, 87_654_321] {
            let text = format!("{v:08}");
            let w = u64::from_le_bytes(text.as_bytes().try_into().unwrap());
            assert_eq!(eight(w), v);
        }
    }

    #[test]
    fn gives_up_on_what_it_cannot_read_cheaply() {
        for frame in [
            r#"{"method":"incr"}"#,
            r#"{"method":"incr","id":7,"params":[1]}"#,
            r#"{"id":1.5}"#,
            r#"{"id":1e3}"#,
            r#"{"id":"a\"b"}"#,
            r#"{"id":"a\\"}"#,
            r#"{"id":"unterminated"#,
            r#"{"id":18446744073709551616}"#,
            r#"{"id":-9223372036854775809}"#,
            r#"{"id":true}"#,
            r#"{"id":-}"#,
            r#"{"xid":1}"#,
            r#"{"id""#,
            r#"{"id":"#,
            "",
            "}",
        ] {
            assert_eq!(id(frame.as_bytes(), 0), None, "{frame}");
        }
        // A line longer than the window: not hinted.
        let long = format!(
            r#"{{"method":"incr","params":["{}"],"id":1}}"#,
            "x".repeat(WINDOW)
        );
        assert_eq!(id(long.as_bytes(), 0), None);
    }

    /// Whatever the bytes (any cut of a request, any byte changed): no panic.
    #[test]
    fn any_bytes_are_safe() {
        let requests = [
            r#"{"jsonrpc":"2.0","method":"incr","params":[1],"id":"k-7"}"#,
            r#"{"jsonrpc":"2.0","id":-42,"method":"incr"}"#,
        ];
        for r in requests {
            let r = r.as_bytes();
            for cut in 0..=r.len() {
                for len in [0, cut, r.len(), r.len() + 1, 7, 9, 600] {
                    let _ = id(&r[..cut], len);
                    let _ = id(&r[cut..], len);
                }
            }
            for at in 0..r.len() {
                for b in [b'"', b'\\', b'}', b'\n', b'-', b'9', 0xff] {
                    let mut v = r.to_vec();
                    v[at] = b;
                    let _ = id(&v, 0);
                }
            }
        }
    }
}
