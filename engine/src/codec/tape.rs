//! Walks of the simd-json tape: a value's span, an id node, an array's elements and an
//! object's members.
//!
//! The tape holds one `Node` per JSON value in document order. A container's node
//! records `len` (its elements or members) and `count` (how many nodes follow it, nested
//! ones included); an object's member is its key's `String` node followed by the value's
//! nodes. Every walk of that layout lives here, so the request and response rules, the
//! deserializer, the serializer and the client skip nested values the same way.
//!
//! The walks never index past the slice they are given: a container that claims more
//! nodes than are there (simd-json never builds one) yields short or empty values, which
//! the callers reject, instead of a panic.

use simd_json::{Node, StaticNode};

/// A request id, borrowed from the frame; echoed with the same type and value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Id<'a> {
    /// `"id": null` (a request, not a notification), or the id of an answer whose
    /// request's id could not be read.
    Null,
    /// A string id (escapes already decoded).
    Str(&'a str),
    /// A negative integer id.
    Int(i64),
    /// A non-negative integer id.
    UInt(u64),
    /// A fractional id (the specification discourages them, but they are echoed).
    Float(f64),
}

/// How many tape nodes the value starting at `node` spans (itself included).
#[inline]
pub(crate) fn span(node: &Node<'_>) -> usize {
    match node {
        Node::Object { count, .. } | Node::Array { count, .. } => count + 1,
        _ => 1,
    }
}

/// Splits `rest` into the value at its front (its span, or what is left of it) and the
/// nodes after it.
#[inline]
fn split_value<'a>(rest: &'a [Node<'a>]) -> (&'a [Node<'a>], &'a [Node<'a>]) {
    // `min` keeps a span longer than the slice from panicking in `split_at`.
    let n = rest.first().map_or(0, span).min(rest.len());
    rest.split_at(n)
}

/// Reads a scalar tape node as an id, if it can be one.
pub(crate) fn as_id<'a>(node: &Node<'a>) -> Option<Id<'a>> {
    Some(match *node {
        Node::String(s) => Id::Str(s),
        Node::Static(StaticNode::Null) => Id::Null,
        Node::Static(StaticNode::I64(i)) if i < 0 => Id::Int(i),
        Node::Static(StaticNode::I64(i)) => Id::UInt(i as u64),
        Node::Static(StaticNode::U64(u)) => Id::UInt(u),
        Node::Static(StaticNode::F64(f)) => Id::Float(f),
        _ => return None,
    })
}

/// The elements of the array whose nodes are `nodes` (its head, then its span); none
/// when `nodes` is not an array.
#[inline]
pub(crate) fn elements<'a>(nodes: &'a [Node<'a>]) -> Elements<'a> {
    match nodes {
        [Node::Array { len, .. }, rest @ ..] => Elements { rest, left: *len },
        _ => Elements { rest: &[], left: 0 },
    }
}

/// An array's elements, each as the nodes of its whole span. Yields exactly the array's
/// `len` items; on a tape shorter than the array claims, the last ones are empty.
#[derive(Clone, Debug)]
pub(crate) struct Elements<'a> {
    /// The nodes from the next element on.
    rest: &'a [Node<'a>],
    /// Elements not yet yielded.
    left: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = &'a [Node<'a>];

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (value, rest) = split_value(self.rest);
        self.rest = rest;
        Some(value)
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Elements<'_> {}

/// The members of the object whose nodes are `nodes` (its head, then its span); none
/// when `nodes` is not an object.
#[inline]
pub(crate) fn members<'a>(nodes: &'a [Node<'a>]) -> Members<'a> {
    match nodes {
        [Node::Object { len, .. }, rest @ ..] => Members { rest, left: *len },
        _ => Members { rest: &[], left: 0 },
    }
}

/// A member whose key is not a string node (or is missing): the tape does not hold the
/// object its head claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Malformed;

/// An object's members: `(key, value nodes)`, the value as the nodes of its whole span.
/// Yields exactly the object's `len` items. A key without a value node yields an empty
/// value, which callers that need one reject.
#[derive(Clone, Debug)]
pub(crate) struct Members<'a> {
    /// The nodes from the next member's key on.
    rest: &'a [Node<'a>],
    /// Members not yet yielded.
    left: usize,
}

impl<'a> Iterator for Members<'a> {
    type Item = Result<(&'a str, &'a [Node<'a>]), Malformed>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match self.rest {
            [Node::String(key), tail @ ..] => {
                let (value, rest) = split_value(tail);
                self.rest = rest;
                Some(Ok((key, value)))
            }
            _ => Some(Err(Malformed)),
        }
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Members<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use simd_json::{Buffers, Tape};

    fn with_tape<R>(json: &str, f: impl for<'a> FnOnce(&'a [Node<'a>]) -> R) -> R {
        let mut bytes = json.as_bytes().to_vec();
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape(&mut bytes, &mut Buffers::default(), &mut tape).unwrap();
        f(&tape.0)
    }

    #[test]
    fn spans_cover_nested_values() {
        with_tape(r#"[1,[2,{"a":[3]}],{},"x"]"#, |n| {
            assert_eq!(span(&n[0]), n.len());
            let lens: Vec<usize> = elements(n).map(<[Node<'_>]>::len).collect();
            assert_eq!(lens, [1, 6, 1, 1]);
            assert_eq!(elements(n).len(), 4);
        });
    }

    #[test]
    fn members_skip_nested_values() {
        with_tape(r#"{"a":{"b":[1,2]},"c":null,"d":[]}"#, |n| {
            let got: Vec<(&str, usize)> = members(n)
                .map(|m| m.map(|(k, v)| (k, v.len())).unwrap())
                .collect();
            assert_eq!(got, [("a", 5), ("c", 1), ("d", 1)]);
            assert_eq!(members(n).len(), 3);
        });
    }

    #[test]
    fn other_values_have_no_elements_or_members() {
        with_tape(r#"{"a":1}"#, |n| assert_eq!(elements(n).count(), 0));
        with_tape("[1]", |n| assert_eq!(members(n).count(), 0));
        with_tape(r#""s""#, |n| {
            assert_eq!((elements(n).count(), members(n).count()), (0, 0));
        });
        assert_eq!(elements(&[]).count(), 0);
    }

    #[test]
    fn a_short_tape_yields_short_values_not_panics() {
        // Heads that claim more than follows them (simd-json never builds these).
        let arr = [
            Node::Array { len: 3, count: 9 },
            Node::Array { len: 1, count: 5 },
            Node::Static(StaticNode::Null),
        ];
        let lens: Vec<usize> = elements(&arr).map(<[Node<'_>]>::len).collect();
        assert_eq!(lens, [2, 0, 0]);
        let obj = [
            Node::Object { len: 3, count: 9 },
            Node::String("k"),
            Node::Static(StaticNode::Null),
            Node::String("v"),
        ];
        let got: Vec<_> = members(&obj)
            .map(|m| m.map(|(k, v)| (k, v.len())))
            .collect();
        assert_eq!(got, [Ok(("k", 1)), Ok(("v", 0)), Err(Malformed)]);
        let obj = [
            Node::Object { len: 1, count: 1 },
            Node::Static(StaticNode::Null),
        ];
        assert_eq!(members(&obj).next(), Some(Err(Malformed)));
    }

    #[test]
    fn ids_are_scalars() {
        with_tape(
            r#"["a",null,-1,1,18446744073709551615,1.5,true,[],{}]"#,
            |n| {
                let ids: Vec<_> = elements(n).map(|e| as_id(&e[0])).collect();
                assert_eq!(
                    ids,
                    [
                        Some(Id::Str("a")),
                        Some(Id::Null),
                        Some(Id::Int(-1)),
                        Some(Id::UInt(1)),
                        Some(Id::UInt(u64::MAX)),
                        Some(Id::Float(1.5)),
                        None,
                        None,
                        None,
                    ]
                );
            },
        );
    }
}
