//! Checking answers: the fast path (bytes compared with the expected spelling) and the
//! general one (parsed in place with serde_json).

use std::fmt;
use std::time::Instant;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::drivers::Track;
use super::plan::Plan;
use super::stats::{Problem, Stats};
use super::workload::{Expect, ECHO_PARAMS, ID_DIGITS};

/// One JSON-RPC response, borrowed from the frame. A member that is present (even as
/// `null`) is `Some`.
#[derive(Deserialize)]
pub(crate) struct Resp<'a> {
    #[serde(borrow, default)]
    pub(crate) jsonrpc: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(crate) id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(crate) result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(crate) error: Option<&'a RawValue>,
}

pub(crate) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Walks a batch answer element by element, without collecting it.
pub(crate) struct Elements<'f, F>(&'f mut F);

impl<'de, F: FnMut(Resp<'de>)> Visitor<'de> for Elements<'_, F> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of JSON-RPC responses")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0;
        while let Some(r) = seq.next_element::<Resp<'de>>()? {
            (self.0)(r);
            n += 1;
        }
        Ok(n)
    }
}

/// Calls `f` on each response in `frame` (one object or a batch array); returns how many,
/// or the parse error.
pub(crate) fn each_response<'de>(
    frame: &'de [u8],
    mut f: impl FnMut(Resp<'de>),
) -> Result<usize, String> {
    let first = frame
        .iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    let mut de = serde_json::Deserializer::from_slice(frame);
    let r = match first {
        Some(b'[') => de.deserialize_seq(Elements(&mut f)),
        Some(b'{') => Resp::deserialize(&mut de).map(|r| {
            f(r);
            1
        }),
        _ => return Err("not a JSON object or array".into()),
    };
    r.and_then(|n| de.end().map(|()| n))
        .map_err(|e| e.to_string())
}

/// Whether `result` is what the call should have answered.
pub(crate) fn result_ok(expect: Expect, result: &RawValue, plan: &Plan) -> bool {
    let text = result.get();
    match expect {
        Expect::Int(v) => serde_json::from_str::<i64>(text).is_ok_and(|r| r == v),
        Expect::Pong => str_is(text, "pong"),
        Expect::GetData => serde_json::from_str::<(&RawValue, i64)>(text)
            .is_ok_and(|(s, n)| n == 5 && str_is(s.get(), "hello")),
        Expect::Null => text == "null",
        Expect::Any => true,
        Expect::AnyInt => serde_json::from_str::<i64>(text).is_ok(),
        Expect::Value(i) => plan.expected.get(i as usize).is_some_and(|want| {
            serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v == *want)
        }),
        Expect::Echo => {
            text.as_bytes() == ECHO_PARAMS.as_bytes()
                || serde_json::from_str::<serde_json::Value>(text)
                    .is_ok_and(|v| v == plan.echo_value)
        }
    }
}

/// Whether the JSON text `text` is the string `want`; borrowed (no allocation) unless it
/// has escapes.
pub(crate) fn str_is(text: &str, want: &str) -> bool {
    match serde_json::from_str::<&str>(text) {
        Ok(s) => s == want,
        Err(_) => serde_json::from_str::<String>(text).is_ok_and(|s| s == want),
    }
}

/// An id as loadgen writes them: exactly `ID_DIGITS` digits.
pub(crate) fn parse_id(raw: &RawValue) -> Option<u64> {
    let b = raw.get().as_bytes();
    if b.len() != ID_DIGITS || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

pub(crate) fn put_id(dst: &mut [u8], mut v: u64) {
    for d in dst[..ID_DIGITS].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// The start of an answer, on one line, for a diagnostic.
pub(crate) fn snippet(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(160)])
        .escape_debug()
        .to_string();
    if b.len() > 160 {
        s + "…"
    } else {
        s
    }
}

/// How one answer was found to be.
pub(crate) enum Answer<'a> {
    /// The fast path matched the expected result.
    Checked,
    Result(&'a RawValue),
    Error(&'a RawValue),
}

/// The fast path's shape of an answer: `{"jsonrpc":"2.0","id":ID,"result":RESULT}`, as
/// compact encoders write it (jsonrpsee, ringrpc, serde_json).
pub(crate) const FAST_HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
pub(crate) const FAST_MID: &[u8] = br#","result":"#;

/// The fast path: when `frame` is exactly one answer, or a batch of them, of the shape
/// above, each with an id in flight and the expected result in its compact spelling,
/// records the ids (and where their digits are) in `seen` and returns `true`. Anything
/// else (whitespace, another member order, an error, a wrong result) returns `false` and
/// leaves the frame to serde_json. Reads the state only.
pub(crate) fn fast_answers(
    frame: &[u8],
    track: &Track,
    plan: &Plan,
    seen: &mut Vec<(u64, usize)>,
) -> bool {
    seen.clear();
    let batch = frame.first() == Some(&b'[');
    let mut p = usize::from(batch);
    loop {
        let Some(rest) = frame.get(p..) else {
            return false;
        };
        if !rest.starts_with(FAST_HEAD) {
            return false;
        }
        let at = p + FAST_HEAD.len();
        let Some(digits) = frame.get(at..at + ID_DIGITS) else {
            return false;
        };
        if !digits.iter().all(u8::is_ascii_digit) {
            return false;
        }
        let id = digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        let Some(slot) = track.slot_of(id) else {
            return false;
        };
        let template = track.msgs[slot / plan.per].template as usize;
        let call = &plan.templates[template].calls[slot % plan.per];
        let q = at + ID_DIGITS;
        let Some(rest) = frame.get(q..) else {
            return false;
        };
        let canon = &call.canon;
        // The result's length, once it is the expected one.
        let len = if let Expect::AnyInt = call.expect {
            match rest.strip_prefix(FAST_MID).map(int_len) {
                Some(n) if n > 0 => n,
                _ => return false,
            }
        } else if rest.starts_with(FAST_MID) && rest[FAST_MID.len()..].starts_with(canon) {
            canon.len()
        } else {
            return false;
        };
        if rest.get(FAST_MID.len() + len) != Some(&b'}') {
            return false;
        }
        if seen.len() == seen.capacity() {
            return false;
        }
        seen.push((id, at));
        p = q + FAST_MID.len() + len + 1;
        match (batch, frame.get(p)) {
            (false, None) => return true,
            (true, Some(b',')) => p += 1,
            (true, Some(b']')) => return p + 1 == frame.len(),
            _ => return false,
        }
    }
}

/// The length of the JSON integer at the start of `b` that surely fits an `i64` (an
/// optional `-`, then `0` or up to 18 digits not starting with `0`); 0 if there is none.
pub(crate) fn int_len(b: &[u8]) -> usize {
    let sign = usize::from(b.first() == Some(&b'-'));
    let digits = b[sign..]
        .iter()
        .take(19)
        .take_while(|d| d.is_ascii_digit())
        .count();
    match (digits, b.get(sign)) {
        (1, _) => sign + 1,
        (2..=18, Some(d)) if *d != b'0' => sign + digits,
        _ => 0,
    }
}

/// Checks one answer frame (a response or a batch of them). With `only` (HTTP), every
/// id must belong to that message, which the caller completes; otherwise (TCP) a message
/// is completed here when its last call is answered.
pub(crate) fn verify_frame(
    track: &mut Track,
    conn: usize,
    frame: &[u8],
    only: Option<usize>,
    now: Instant,
    plan: &Plan,
    stats: &mut Stats,
) {
    let mut seen = std::mem::take(&mut track.seen);
    let fast = fast_answers(frame, track, plan, &mut seen);
    if fast {
        for &(id, at) in &seen {
            let text = std::str::from_utf8(&frame[at..at + ID_DIGITS]).unwrap_or("?");
            answer(
                track,
                conn,
                Some(id),
                text,
                Answer::Checked,
                only,
                now,
                plan,
                stats,
            );
        }
    }
    track.seen = seen;
    if fast {
        return;
    }
    let parsed = each_response(frame, |r| {
        if r.jsonrpc != Some("2.0") || r.id.is_none() || r.result.is_some() == r.error.is_some() {
            let s = snippet(frame);
            stats.problem(
                Problem::BadResponse,
                1,
                conn,
                format_args!("not a JSON-RPC 2.0 response: {s}"),
            );
            return;
        }
        let ans = match (r.result, r.error) {
            (Some(result), _) => Answer::Result(result),
            (None, Some(e)) => Answer::Error(e),
            (None, None) => return,
        };
        let id = r.id.and_then(parse_id);
        let text = r.id.map(RawValue::get).unwrap_or("");
        answer(track, conn, id, text, ans, only, now, plan, stats);
    });
    match parsed {
        Ok(0) => {
            let s = snippet(frame);
            stats.problem(
                Problem::BadResponse,
                1,
                conn,
                format_args!("an empty batch answer: {s}"),
            );
        }
        Ok(_) => {}
        Err(e) => {
            let s = snippet(frame);
            stats.problem(
                Problem::BadFrame,
                1,
                conn,
                format_args!("unparsable answer ({e}): {s}"),
            );
        }
    }
}

/// Takes one answer (id `id`, spelled `text`) off the calls in flight and checks it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn answer(
    track: &mut Track,
    conn: usize,
    id: Option<u64>,
    text: &str,
    ans: Answer<'_>,
    only: Option<usize>,
    now: Instant,
    plan: &Plan,
    stats: &mut Stats,
) {
    let per = plan.per;
    let Some(slot) = id.and_then(|id| track.slot_of(id)) else {
        let hint = if text == "1" {
            " (a server with a fixed answer needs --no-verify)"
        } else {
            ""
        };
        stats.problem(
            Problem::UnknownId,
            1,
            conn,
            format_args!("id {text} is not in flight (unknown or answered twice){hint}"),
        );
        if let Answer::Error(e) = ans {
            rpc_error(stats, conn, e, "");
        }
        return;
    };
    let m = slot / per;
    if only.is_some_and(|o| o != m) {
        stats.problem(
            Problem::UnknownId,
            1,
            conn,
            format_args!("id {text} belongs to another message in flight"),
        );
        return;
    }
    track.calls[slot] = 0;
    let template = track.msgs[m].template as usize;
    match ans {
        Answer::Checked => {}
        Answer::Error(e) => rpc_error(stats, conn, e, text),
        Answer::Result(result) => {
            let expect = plan.templates[template].calls[slot % per].expect;
            if !result_ok(expect, result, plan) {
                stats.problem(
                    Problem::WrongResult,
                    1,
                    conn,
                    format_args!("id {text}: result {} (expected {expect:?})", result.get()),
                );
            }
        }
    }
    track.msgs[m].remaining -= 1;
    if only.is_none() && track.msgs[m].remaining == 0 {
        track.complete(m, now, plan, stats);
    }
}

/// Counts a JSON-RPC error answer, by its code.
fn rpc_error(stats: &mut Stats, conn: usize, error: &RawValue, id: &str) {
    #[derive(Deserialize)]
    struct Code {
        code: i64,
    }
    let code = serde_json::from_str::<Code>(error.get())
        .ok()
        .map(|c| c.code);
    *stats.error_codes.entry(code).or_default() += 1;
    stats.problem(
        Problem::RpcError,
        1,
        conn,
        format_args!("id {id}: {}", error.get()),
    );
}

#[cfg(test)]
mod tests {
    use super::int_len;

    #[test]
    fn int_len_takes_json_integers_that_fit() {
        for (text, len) in [
            ("0}", 1),
            ("-7}", 2),
            ("123456789012345678}", 18),
            ("-42,", 3),
            ("01}", 0),
            ("-}", 0),
            ("}", 0),
            ("", 0),
            ("1234567890123456789}", 0),
            ("\"1\"}", 0),
        ] {
            assert_eq!(int_len(text.as_bytes()), len, "{text}");
        }
    }
}
