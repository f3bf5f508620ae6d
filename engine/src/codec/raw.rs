//! Raw byte ranges of parsed values, recovered from simd-json's structural indexes.
//!
//! Stage 1 of simd-json records the offset of every structural character: the first
//! byte of each value (`{`, `[`, `"`, a digit or `-`, `t`/`f`/`n`) and every `:`, `,`,
//! `}` and `]`. The tape has one node per value, in the same order. Walking the tape
//! while counting the structurals each node implies maps a node to the offset where its
//! value starts and, for a container, where its closing bracket is. Because the engine
//! parses a copy and leaves the frame untouched, that range of the frame is the value's
//! exact original text — re-emitting it is one `memcpy`, with no re-encoding.

use simd_json::Node;

/// What is needed to find a value's original bytes: the untouched frame, its
/// structural indexes, and the whole tape they belong to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawCtx<'a> {
    pub(crate) frame: &'a [u8],
    pub(crate) structurals: &'a [u32],
    pub(crate) root: &'a [Node<'a>],
}

/// Walks the value at node `i` (whose first structural is `s`), looking for node
/// `target`. `Err(s)` is the structural where `target` starts; `Ok` gives the node and
/// structural just past the value. Recursion is bounded by the parser's depth limit.
fn walk(nodes: &[Node<'_>], i: usize, s: usize, target: usize) -> Result<(usize, usize), usize> {
    if i == target {
        return Err(s);
    }
    match nodes.get(i) {
        Some(&Node::Array { len, .. }) => {
            let (mut i, mut s) = (i + 1, s + 1);
            for k in 0..len {
                s += usize::from(k > 0); // ','
                (i, s) = walk(nodes, i, s, target)?;
            }
            Ok((i, s + 1)) // ']'
        }
        Some(&Node::Object { len, .. }) => {
            let (mut i, mut s) = (i + 1, s + 1);
            for k in 0..len {
                s += usize::from(k > 0); // ','
                                         // The key node and its string, then ':'.
                (i, s) = (i + 1, s + 2);
                (i, s) = walk(nodes, i, s, target)?;
            }
            Ok((i, s + 1)) // '}'
        }
        _ => Ok((i + 1, s + 1)),
    }
}

impl<'a> RawCtx<'a> {
    /// The original text of the container whose nodes are `value` (a subslice of
    /// `root`), or `None` if it is not a container of this tape or the indexes do not
    /// line up (then the caller re-emits from the tape instead).
    pub(crate) fn container_text(&self, value: &'a [Node<'a>]) -> Option<&'a [u8]> {
        self.container_range(value).and_then(|r| self.frame.get(r))
    }

    /// The original text of any value of this tape (`value` a subslice of `root`):
    /// a container's as [`RawCtx::container_text`]; a scalar's runs from its first byte
    /// to the next structural character (the `,`, `}` or `]` after it, or the frame's
    /// end), less trailing whitespace. `None` if the indexes do not line up.
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) fn value_text(&self, value: &'a [Node<'a>]) -> Option<&'a [u8]> {
        match value.first()? {
            Node::Array { .. } | Node::Object { .. } => self.container_text(value),
            first => {
                let text = self.scalar_text_at(self.structural_of(value)?)?;
                let fits = match (first, text.first()) {
                    (Node::String(_), Some(b'"')) => text.len() >= 2 && text.ends_with(b"\""),
                    (Node::Static(simd_json::StaticNode::Null), Some(b'n'))
                    | (Node::Static(simd_json::StaticNode::Bool(_)), Some(b't' | b'f')) => true,
                    (Node::Static(_), Some(c)) => *c == b'-' || c.is_ascii_digit(),
                    _ => false,
                };
                fits.then_some(text)
            }
        }
    }

    /// The index (into `structurals`) of the first structural of `value`, a subslice of
    /// `root`; `None` if it is not one.
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) fn structural_of(&self, value: &'a [Node<'a>]) -> Option<usize> {
        let offset = (value.as_ptr() as usize).checked_sub(self.root.as_ptr() as usize)?;
        walk(self.root, 0, 0, offset / std::mem::size_of::<Node<'_>>()).err()
    }

    /// The text of the scalar whose first structural is number `s`: from its first
    /// byte to the next structural, less trailing whitespace.
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) fn scalar_text_at(&self, s: usize) -> Option<&'a [u8]> {
        let a = *self.structurals.get(s)? as usize;
        let b = self
            .structurals
            .get(s + 1)
            .map_or(self.frame.len(), |&b| b as usize);
        Some(self.frame.get(a..b.max(a))?.trim_ascii_end())
    }

    /// The byte range of [`RawCtx::container_text`] within the frame.
    pub(crate) fn container_range(&self, value: &'a [Node<'a>]) -> Option<std::ops::Range<usize>> {
        let offset = (value.as_ptr() as usize).checked_sub(self.root.as_ptr() as usize)?;
        let target = offset / std::mem::size_of::<Node<'_>>();
        let start = match walk(self.root, 0, 0, target) {
            Err(s) => s,
            Ok(_) => return None,
        };
        let end = match walk(self.root, target, start, usize::MAX) {
            Ok((_, after)) => after - 1,
            Err(_) => return None,
        };
        let (a, b) = (
            *self.structurals.get(start)? as usize,
            *self.structurals.get(end)? as usize,
        );
        let text = self.frame.get(a..=b)?;
        match (text.first(), text.last(), value.first()) {
            (Some(b'['), Some(b']'), Some(Node::Array { .. }))
            | (Some(b'{'), Some(b'}'), Some(Node::Object { .. })) => Some(a..b + 1),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use simd_json::{Buffers, Tape, INPUT_PADDING};

    /// Parses `frame` (a copy of it) and runs `f` over its `RawCtx`.
    fn with_ctx<R>(frame: &[u8], f: impl FnOnce(RawCtx<'_>) -> R) -> R {
        let mut copy = frame.to_vec();
        copy.resize(frame.len() + INPUT_PADDING, b' ');
        let mut buffers = Buffers::default();
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape_padded(&mut copy, frame.len(), &mut buffers, &mut tape).unwrap();
        f(RawCtx {
            frame,
            structurals: buffers.structural_indexes(),
            root: &tape.0,
        })
    }

    /// Every container in `json` maps back to exactly its own text.
    fn check(json: &str) {
        with_ctx(json.as_bytes(), |ctx| check_ctx(ctx, json));
    }

    fn check_ctx(ctx: RawCtx<'_>, json: &str) {
        let tape = ctx.root;
        let mut containers = 0;
        for (i, node) in tape.iter().enumerate() {
            if let Node::Array { count, .. } | Node::Object { count, .. } = node {
                let text = ctx.container_text(&tape[i..i + count + 1]).unwrap();
                let want: serde_json::Value = serde_json::from_slice(text).unwrap();
                let text = String::from_utf8_lossy(text);
                // The range parses to the same value the tape holds.
                let mut out = Vec::new();
                crate::serializer::json::write_value(&mut out, &tape[i..i + count + 1]);
                let got: serde_json::Value = serde_json::from_slice(&out).unwrap();
                assert_eq!(got, want, "{text}");
                containers += 1;
            }
        }
        assert!(containers > 0, "{json}");
    }

    #[test]
    fn containers_map_to_their_own_text() {
        check(
            r#" {"a" : [1, -2.5e3,"x\ny", true,null,{}], "b":{"c":"d\"}"}, "e": [[],[[]],{"f":[{}]}]} "#,
        );
        check(r#"[1,[2,[3,[4]]],{"k":"v"},"\u00e9",[]]"#);
        check(r#"{"jsonrpc":"2.0","method":"echo","params":{"x":[1,2,{"y":"}]"}]},"id":1}"#);
        check("[ {} , [ ] , { \"a\" : { } } ]");
    }

    /// Parses `frame` and gives the text `value_text` finds for each value that is not
    /// an object's key, in tape order.
    fn value_texts(frame: &[u8]) -> Vec<String> {
        with_ctx(frame, value_texts_of)
    }

    fn value_texts_of(ctx: RawCtx<'_>) -> Vec<String> {
        let mut texts = Vec::new();
        // Walk values only: an object's members are (key, value) pairs, and keys are
        // skipped by stepping over them.
        fn visit(ctx: &RawCtx<'_>, nodes: &[Node<'_>], i: usize, texts: &mut Vec<String>) -> usize {
            let span = crate::codec::tape::span(&nodes[i]);
            let text = ctx
                .value_text(&ctx.root[i..i + span])
                .expect("a value's text");
            texts.push(String::from_utf8(text.to_vec()).unwrap());
            let mut k = i + 1;
            match nodes[i] {
                Node::Array { len, .. } => {
                    for _ in 0..len {
                        k = visit(ctx, nodes, k, texts);
                    }
                }
                Node::Object { len, .. } => {
                    for _ in 0..len {
                        k = visit(ctx, nodes, k + 1, texts);
                    }
                }
                _ => {}
            }
            k
        }
        visit(&ctx, ctx.root, 0, &mut texts);
        texts
    }

    /// Every value, scalars included, maps back to exactly its own text.
    #[test]
    fn every_value_maps_to_its_own_text() {
        let json = r#" {"a" : [1 , -2.5e3,"x\ny\"" ,true,null,{}], "b":"\u00e9" , "c": false} "#;
        let texts = value_texts(json.as_bytes());
        assert_eq!(
            texts[1..],
            [
                r#"[1 , -2.5e3,"x\ny\"" ,true,null,{}]"#,
                "1",
                "-2.5e3",
                r#""x\ny\"""#,
                "true",
                "null",
                "{}",
                r#""\u00e9""#,
                "false"
            ]
        );
        // A lone scalar is the whole frame, trimmed.
        assert_eq!(value_texts(b" 12 "), ["12"]);
        assert_eq!(value_texts(br#" "a,b" "#), [r#""a,b""#]);
    }

    #[test]
    fn foreign_slices_are_rejected() {
        let frame = br#"[1,2]"#;
        let mut copy = frame.to_vec();
        copy.resize(frame.len() + INPUT_PADDING, b' ');
        let mut buffers = Buffers::default();
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape_padded(&mut copy, frame.len(), &mut buffers, &mut tape).unwrap();
        let other = [Node::Array { len: 0, count: 0 }];
        let ctx = RawCtx {
            frame,
            structurals: buffers.structural_indexes(),
            root: &tape.0,
        };
        assert_eq!(ctx.container_text(&tape.0), Some(&frame[..]));
        assert_eq!(ctx.container_text(&other), None);
        assert_eq!(ctx.container_text(&tape.0[1..2]), None); // a scalar
    }
}
