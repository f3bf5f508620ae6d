//! A request's id read off its raw bytes before they are parsed: a hint, for work that
//! may start early (the de-duplication store's line of the call's key, fetched while
//! the request before it runs: see `Engine::prefetch_frame`).
//!
//! Only where clients put it, looked at in place, never searched for (it is read ahead of
//! every call on a connection whose calls are being de-duplicated, so it must cost
//! little): the last member (`…,"id":7}`), or the first after `"jsonrpc":"2.0"` or
//! alone (`{"id":7,…`).
//! It can be wrong (a value simd-json would refuse, a member of another object), so
//! nothing may depend on it but speed: a wrong id only fetches a line no call needs.

use super::Id;

/// How far into the buffer the end of the next line is looked for: a longer request is
/// simply not hinted.
const WINDOW: usize = 512;

/// The id the next line of `buf` (one JSON-RPC request, raw; the line need not be
/// whole) most likely has, if it is an integer, a string without escapes, or `null`,
/// and its member comes last or first.
#[inline]
pub(crate) fn id(buf: &[u8]) -> Option<Id<'_>> {
    let window = buf.get(..WINDOW).unwrap_or(buf);
    let line = match memchr::memchr(b'\n', window) {
        Some(nl) => window.get(..nl)?,
        None => window,
    };
    last(line).or_else(|| first(line))
}

/// The value of a last member `"id":VALUE}` of `line`.
fn last(line: &[u8]) -> Option<Id<'_>> {
    let line = line.trim_ascii_end().strip_suffix(b"}")?.trim_ascii_end();
    let (value, before) = match line.last()? {
        b'"' => {
            let body = line.get(..line.len() - 1)?;
            let open = memchr::memrchr2(b'"', b'\\', body)?;
            (line.get(open..)?, body.get(..open)?)
        }
        _ => {
            let n = line
                .iter()
                .rev()
                .take_while(|b| b.is_ascii_alphanumeric() || **b == b'-')
                .count();
            let at = line.len() - n;
            (line.get(at..)?, line.get(..at)?)
        }
    };
    let before = before.trim_ascii_end().strip_suffix(b":")?.trim_ascii_end();
    before.strip_suffix(b"\"id\"")?;
    scalar(value)
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
    match *s.first()? {
        b'"' => {
            let body = s.get(1..)?;
            let end = memchr::memchr2(b'"', b'\\', body)?;
            if body.get(end) != Some(&b'"') {
                return None;
            }
            std::str::from_utf8(body.get(..end)?).ok().map(Id::Str)
        }
        b'n' => s.starts_with(b"null").then_some(Id::Null),
        b'-' => match integer(s.get(1..)?)? {
            0 => Some(Id::UInt(0)),
            n => Some(Id::Int(0i64.checked_sub_unsigned(n)?)),
        },
        b'0'..=b'9' => integer(s).map(Id::UInt),
        _ => None,
    }
}

/// The digits at the start of `s` as a `u64`, if they are a whole integer (not followed
/// by a fraction, an exponent or a letter) and fit.
fn integer(s: &[u8]) -> Option<u64> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0
        || s.get(digits)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'.')
    {
        return None;
    }
    s.get(..digits)?.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
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
        ];
        for (frame, want) in cases {
            assert_eq!(id(frame.as_bytes()), *want, "{frame}");
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
            assert_eq!(id(frame.as_bytes()), None, "{frame}");
        }
        // A line longer than the window: not hinted.
        let long = format!(
            r#"{{"method":"incr","params":["{}"],"id":1}}"#,
            "x".repeat(WINDOW)
        );
        assert_eq!(id(long.as_bytes()), None);
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
                let _ = id(&r[..cut]);
                let _ = id(&r[cut..]);
            }
            for at in 0..r.len() {
                for b in [b'"', b'\\', b'}', b'\n', b'-', b'9', 0xff] {
                    let mut v = r.to_vec();
                    v[at] = b;
                    let _ = id(&v);
                }
            }
        }
    }
}
