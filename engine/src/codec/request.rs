//! Borrowed views of a parsed request, and the envelope rules that make one.
//!
//! The simd-json tape holds one `Node` per JSON value in document order; a container's
//! node records how many nodes follow it. A [`Request`] is validated in one pass over the
//! object's members and afterwards only points into the tape (and, through it, into the
//! frame): nothing is copied.

use simd_json::{Node, StaticNode};

use super::de::{AbsentDe, TapeDe};
use super::raw::RawCtx;
use super::tape::{as_id, members, span, Id};
use crate::error::RpcError;

/// The largest caller's budget taken, in milliseconds (2³¹ − 1, about 24.8 days).
/// Larger values are ignored like any other unusable one: no caller means them, and
/// they keep deadline arithmetic far from overflow.
pub(crate) const MAX_BUDGET_MS: u32 = i32::MAX as u32;

/// A caller's budget written as text (the `RPC-Timeout-Ms` header): ASCII digits only,
/// at most [`MAX_BUDGET_MS`]; anything else is no budget (ignored, not refused).
pub(crate) fn budget_from_text(text: &[u8]) -> Option<u32> {
    // Ten digits hold every accepted value; the bound also keeps the sum from overflowing.
    if text.is_empty() || text.len() > 10 {
        return None;
    }
    let mut ms: u64 = 0;
    for &b in text {
        if !b.is_ascii_digit() {
            return None;
        }
        ms = ms * 10 + u64::from(b - b'0');
    }
    u32::try_from(ms).ok().filter(|&ms| ms <= MAX_BUDGET_MS)
}

/// The params of a call: absent, an array or an object, borrowed from the parsed frame.
///
/// [`Params::parse`] deserializes them with serde; `&'a str` fields borrow the frame.
/// A struct accepts both the positional (`[42, 23]`) and the named
/// (`{"minuend": 42, "subtrahend": 23}`) form; names match case-sensitively.
#[derive(Clone, Copy, Debug)]
pub struct Params<'a> {
    /// The params value's nodes (its whole span), or `None` when absent.
    nodes: Option<&'a [Node<'a>]>,
    /// Where to find the params' original text.
    raw: RawCtx<'a>,
}

impl<'a> Params<'a> {
    pub(crate) fn new(nodes: Option<&'a [Node<'a>]>, raw: RawCtx<'a>) -> Self {
        Self { nodes, raw }
    }

    /// Where the params' original text is found.
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) fn raw(&self) -> RawCtx<'a> {
        self.raw
    }

    /// The params exactly as they were sent (an array or object, whitespace and escapes
    /// included), borrowed from the frame; `None` when absent. For forwarding params
    /// without re-encoding them. Cost: a walk of the tape up to and through the params.
    pub fn raw_json(&self) -> Option<&'a [u8]> {
        self.raw.container_text(self.nodes?)
    }

    /// Deserializes the params into `T`. Absent params deserialize as `null` for
    /// `Option`/`()`, as `[]` for sequences and as `{}` for structs and maps.
    ///
    /// # Errors
    ///
    /// `-32602 Invalid params`, with serde's account of what does not fit (a missing
    /// field, a wrong type, a wrong length).
    pub fn parse<T: serde::Deserialize<'a>>(&self) -> Result<T, RpcError> {
        let r = match self.nodes {
            Some(nodes) => T::deserialize(TapeDe::new(nodes)),
            None => T::deserialize(AbsentDe),
        };
        r.map_err(RpcError::invalid_params)
    }

    /// Whether the request had no `params` member.
    pub fn is_absent(&self) -> bool {
        self.nodes.is_none()
    }

    /// Whether the params are positional (an array).
    pub fn is_array(&self) -> bool {
        matches!(self.nodes, Some([Node::Array { .. }, ..]))
    }

    /// Whether the params are named (an object).
    pub fn is_object(&self) -> bool {
        matches!(self.nodes, Some([Node::Object { .. }, ..]))
    }

    /// Number of elements (array) or members (object); 0 when absent.
    pub fn len(&self) -> usize {
        match self.nodes {
            Some([Node::Array { len, .. } | Node::Object { len, .. }, ..]) => *len,
            _ => 0,
        }
    }

    /// Whether there are no params at all (absent, `[]` or `{}`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn nodes(&self) -> Option<&'a [Node<'a>]> {
        self.nodes
    }

    /// The caller's budget sent as `params._meta.timeoutMs`, in milliseconds: an
    /// integer in `0..=MAX_BUDGET_MS`; any other value, or none, is no budget.
    ///
    /// Cost: nothing unless the params are an object; then one look at each top-level
    /// key (a length compare first), and at `_meta`'s own keys if it is there.
    #[inline]
    pub(crate) fn budget_ms(&self) -> Option<u32> {
        timeout_ms(self.meta()?)
    }

    /// The value of `params._meta` (object params only), where callers put what is
    /// about the call rather than for the method (MCP's convention): `timeoutMs`,
    /// `traceparent`.
    #[inline]
    pub(crate) fn meta(&self) -> Option<&'a [Node<'a>]> {
        meta_value(self.nodes?)
    }

    /// `params._meta.traceparent`, if it is a string.
    pub(crate) fn meta_traceparent(&self) -> Option<&'a str> {
        let (_, value) = members(self.meta()?)
            .filter_map(Result::ok)
            .find(|(key, _)| *key == "traceparent")?;
        match value.first()? {
            Node::String(s) => Some(s),
            _ => None,
        }
    }
}

/// [`Params::meta`]: a plain walk of the top-level keys (a length test rejects almost
/// every other key at once).
#[inline]
fn meta_value<'a>(nodes: &'a [Node<'a>]) -> Option<&'a [Node<'a>]> {
    let [Node::Object { len, .. }, rest @ ..] = nodes else {
        return None;
    };
    let mut at = 0;
    for _ in 0..*len {
        let Some(Node::String(key)) = rest.get(at) else {
            return None;
        };
        let value = rest.get(at + 1..)?;
        if key.len() == 5 && *key == "_meta" {
            return Some(value);
        }
        at += 1 + value.first().map_or(1, span);
    }
    None
}

/// `timeoutMs` of the `_meta` value whose nodes are `meta`.
#[cold]
fn timeout_ms<'a>(meta: &'a [Node<'a>]) -> Option<u32> {
    let (_, value) = members(meta)
        .filter_map(Result::ok)
        .find(|(key, _)| *key == "timeoutMs")?;
    let ms = match value.first()? {
        Node::Static(StaticNode::U64(u)) => *u,
        Node::Static(StaticNode::I64(i)) => u64::try_from(*i).ok()?,
        // Fractions, strings, negatives: not a budget.
        _ => return None,
    };
    u32::try_from(ms).ok().filter(|&ms| ms <= MAX_BUDGET_MS)
}

/// A request object that passed every envelope rule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    pub(crate) params: Params<'a>,
    /// `None` for a notification.
    pub(crate) id: Option<Id<'a>>,
}

/// Why an element is not a valid request, and the id to answer with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Invalid<'a> {
    pub(crate) id: Id<'a>,
    pub(crate) reason: &'static str,
}

/// Validates the value spanning `nodes` as a Request object.
///
/// One pass over the members. Unknown members are ignored (the specification does not
/// forbid them); a repeated member is invalid. When the request is invalid but its id
/// was readable, that id is kept for the answer; otherwise the answer's id is `null`.
pub(crate) fn validate<'a>(
    nodes: &'a [Node<'a>],
    raw: RawCtx<'a>,
) -> Result<Request<'a>, Invalid<'a>> {
    let invalid = |id, reason| Err(Invalid { id, reason });
    let Some(Node::Object { .. }) = nodes.first() else {
        return invalid(Id::Null, "Invalid Request: not a JSON-RPC request object");
    };
    let mut version: Option<bool> = None;
    let mut method: Option<Option<&'a str>> = None;
    let mut params: Option<Option<&'a [Node<'a>]>> = None;
    let mut id: Option<Option<Id<'a>>> = None;
    let mut dup = false;
    for member in members(nodes) {
        let Ok((key, value_nodes @ [value, ..])) = member else {
            return invalid(Id::Null, "Invalid Request: malformed object");
        };
        let slot_taken = match key {
            "jsonrpc" => version
                .replace(matches!(value, Node::String("2.0")))
                .is_some(),
            "method" => method
                .replace(match *value {
                    Node::String(m) => Some(m),
                    _ => None,
                })
                .is_some(),
            "params" => params
                .replace(match value {
                    Node::Array { .. } | Node::Object { .. } => Some(value_nodes),
                    _ => None,
                })
                .is_some(),
            "id" => id.replace(as_id(value)).is_some(),
            _ => false,
        };
        dup |= slot_taken;
    }
    // The id first: every other error is answered with it when it is readable.
    let answer_id = match id {
        Some(Some(id)) => id,
        Some(None) => {
            return invalid(
                Id::Null,
                "Invalid Request: `id` must be a string, a number or null",
            )
        }
        None => Id::Null,
    };
    if dup {
        return invalid(
            answer_id,
            "Invalid Request: a member appears more than once",
        );
    }
    match version {
        Some(true) => {}
        Some(false) => {
            return invalid(
                answer_id,
                "Invalid Request: `jsonrpc` must be exactly \"2.0\"",
            )
        }
        None => return invalid(answer_id, "Invalid Request: missing `\"jsonrpc\": \"2.0\"`"),
    }
    let method = match method {
        Some(Some(m)) => m,
        Some(None) => return invalid(answer_id, "Invalid Request: `method` must be a string"),
        None => return invalid(answer_id, "Invalid Request: missing `method`"),
    };
    let params = match params {
        Some(Some(p)) => Some(p),
        Some(None) => {
            return invalid(
                answer_id,
                "Invalid Request: `params` must be an array or an object",
            )
        }
        None => None,
    };
    Ok(Request {
        method,
        params: Params::new(params, raw),
        id: id.flatten(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use simd_json::{Buffers, Tape};

    fn check(
        json: &str,
    ) -> Result<(String, Option<Id<'static>>, bool), (Id<'static>, &'static str)> {
        let mut bytes = json.as_bytes().to_vec();
        let bytes: &'static mut [u8] = Box::leak(bytes.as_mut_slice().to_vec().into_boxed_slice());
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape(bytes, &mut Buffers::default(), &mut tape).unwrap();
        let tape: &'static Tape<'static> = Box::leak(Box::new(tape));
        let raw = RawCtx {
            frame: b"",
            structurals: &[],
            root: &tape.0,
        };
        match validate(&tape.0, raw) {
            Ok(r) => Ok((r.method.to_string(), r.id, r.params.is_absent())),
            Err(e) => Err((e.id, e.reason)),
        }
    }

    /// The budget of `params` (a JSON text).
    fn budget_of(params: &str) -> Option<u32> {
        let mut bytes = params.as_bytes().to_vec();
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape(&mut bytes, &mut Buffers::default(), &mut tape).unwrap();
        let raw = RawCtx {
            frame: b"",
            structurals: &[],
            root: &tape.0,
        };
        Params::new(Some(&tape.0), raw).budget_ms()
    }

    #[test]
    fn budgets_are_read_from_meta_of_object_params_only() {
        assert_eq!(budget_of(r#"{"_meta":{"timeoutMs":250}}"#), Some(250));
        assert_eq!(
            budget_of(r#"{"a":[{"_meta":1}],"_meta":{"x":{"timeoutMs":1},"timeoutMs":0}}"#),
            Some(0)
        );
        // The first `_meta` is the one read, as serde's maps keep the first too.
        assert_eq!(
            budget_of(r#"{"_meta":{"timeoutMs":5},"_meta":{"timeoutMs":9}}"#),
            Some(5)
        );
        assert_eq!(
            budget_of(r#"{"_meta":{"timeoutMs":2147483647}}"#),
            Some(MAX_BUDGET_MS)
        );
        // As the fuzzing reference reads it: an integer literal, zero.
        assert_eq!(budget_of(r#"{"_meta":{"timeoutMs":-0}}"#), Some(0));
        for ignored in [
            r#"[{"_meta":{"timeoutMs":1}}]"#,
            r#"{}"#,
            r#"{"meta":{"timeoutMs":1}}"#,
            r#"{"_meta":{"timeout":1}}"#,
            r#"{"_meta":[1]}"#,
            r#"{"_meta":{"timeoutMs":-1}}"#,
            r#"{"_meta":{"timeoutMs":1.5}}"#,
            r#"{"_meta":{"timeoutMs":1e3}}"#,
            r#"{"_meta":{"timeoutMs":"100"}}"#,
            r#"{"_meta":{"timeoutMs":null}}"#,
            r#"{"_meta":{"timeoutMs":2147483648}}"#,
            r#"{"_meta":{"timeoutMs":18446744073709551616}}"#,
        ] {
            assert_eq!(budget_of(ignored), None, "{ignored}");
        }
    }

    #[test]
    fn budget_text_is_digits_within_bounds() {
        assert_eq!(budget_from_text(b"0"), Some(0));
        assert_eq!(budget_from_text(b"0030"), Some(30));
        assert_eq!(budget_from_text(b"2147483647"), Some(MAX_BUDGET_MS));
        for bad in [
            &b""[..],
            b"-1",
            b"1.0",
            b" 1",
            b"2147483648",
            b"12345678901",
            b"1x",
        ] {
            assert_eq!(budget_from_text(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn envelope_rules() {
        let ok = |j: &str| check(j).unwrap_or_else(|e| panic!("{j}: {e:?}"));
        let bad = |j: &str| check(j).expect_err(j);
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","method":"a","id":1}"#).1,
            Some(Id::UInt(1))
        );
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","method":"a","id":null}"#).1,
            Some(Id::Null)
        );
        assert_eq!(ok(r#"{"jsonrpc":"2.0","method":"a"}"#).1, None);
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","method":"a","id":-5}"#).1,
            Some(Id::Int(-5))
        );
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","method":"a","id":"x\"y"}"#).1,
            Some(Id::Str("x\"y"))
        );
        assert_eq!(
            ok(r#"{"method":"a\u0062","jsonrpc":"2.0","extra":[1,{}],"params":{}}"#).0,
            "ab"
        );
        assert_eq!(bad(r#"{"method":"a","id":1}"#).0, Id::UInt(1));
        assert_eq!(
            bad(r#"{"jsonrpc":"2.1","method":"a","id":1}"#).0,
            Id::UInt(1)
        );
        assert_eq!(bad(r#"{"jsonrpc":2.0,"method":"a"}"#).0, Id::Null);
        assert_eq!(
            bad(r#"{"jsonrpc":"2.0","method":1,"params":"bar"}"#).0,
            Id::Null
        );
        assert_eq!(
            bad(r#"{"jsonrpc":"2.0","method":"a","params":"bar","id":"q"}"#).0,
            Id::Str("q")
        );
        assert_eq!(
            bad(r#"{"jsonrpc":"2.0","method":"a","params":null}"#).0,
            Id::Null
        );
        assert_eq!(bad(r#"{"jsonrpc":"2.0","method":"a","id":{}}"#).0, Id::Null);
        assert_eq!(
            bad(r#"{"jsonrpc":"2.0","method":"a","id":[1]}"#).0,
            Id::Null
        );
        assert_eq!(
            bad(r#"{"jsonrpc":"2.0","method":"a","id":true}"#).0,
            Id::Null
        );
        assert_eq!(
            bad(r#"{"jsonrpc":"2.0","method":"a","method":"b","id":2}"#).0,
            Id::UInt(2)
        );
        assert_eq!(bad(r#"{"foo":"boo"}"#).0, Id::Null);
        assert_eq!(bad(r#"[1]"#).0, Id::Null);
        assert_eq!(bad(r#""x""#).0, Id::Null);
    }
}
