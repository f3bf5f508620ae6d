//! Borrowed views of a parsed request, and the envelope rules that make one.
//!
//! The simd-json tape holds one `Node` per JSON value in document order; a container's
//! node records how many nodes follow it. A [`Request`] is validated in one pass over the
//! object's members and afterwards only points into the tape (and, through it, into the
//! frame): nothing is copied.

use simd_json::Node;

use super::de::{AbsentDe, TapeDe};
use super::raw::RawCtx;
use super::tape::{as_id, members, Id};
use crate::error::RpcError;

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
