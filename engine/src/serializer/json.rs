//! JSON text writing straight into an output buffer: escaped strings, ids, and whole
//! values re-emitted from the tape (no DOM in between).

use std::fmt;

use simd_json::{Node, StaticNode};

use crate::codec::tape::{elements, members};
use crate::codec::Id;

/// For each byte: 0 = copy as is, otherwise the escape to write (`b'u'` = `\u00XX`).
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Writes the body of a JSON string (no quotes), escaping what must be escaped.
#[inline]
pub(crate) fn escape_into(out: &mut Vec<u8>, s: &[u8]) {
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let esc = ESCAPE[b as usize];
        if esc == 0 {
            continue;
        }
        out.extend_from_slice(&s[start..i]);
        if esc == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xf) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', esc]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
}

/// Writes `s` as a quoted, escaped JSON string.
#[inline]
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    escape_into(out, s.as_bytes());
    out.push(b'"');
}

/// Writes an `f64` as JSON; non-finite values (which JSON cannot hold) become `null`.
#[inline]
pub(crate) fn write_f64(out: &mut Vec<u8>, f: f64) {
    if f.is_finite() {
        out.extend_from_slice(ryu::Buffer::new().format_finite(f).as_bytes());
    } else {
        out.extend_from_slice(b"null");
    }
}

/// Writes an id with the same JSON type and value it arrived with.
#[inline]
pub(crate) fn write_id(out: &mut Vec<u8>, id: Id<'_>) {
    match id {
        Id::Null => out.extend_from_slice(b"null"),
        Id::Str(s) => write_str(out, s),
        Id::Int(i) => out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes()),
        Id::UInt(u) => out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes()),
        Id::Float(f) => write_f64(out, f),
    }
}

/// Re-emits the value spanning `nodes` as compact JSON. Recursion is bounded by the
/// parser's depth limit.
pub(crate) fn write_value(out: &mut Vec<u8>, nodes: &[Node<'_>]) {
    let Some(head) = nodes.first() else { return };
    match *head {
        Node::String(s) => write_str(out, s),
        Node::Static(StaticNode::Null) => out.extend_from_slice(b"null"),
        Node::Static(StaticNode::Bool(true)) => out.extend_from_slice(b"true"),
        Node::Static(StaticNode::Bool(false)) => out.extend_from_slice(b"false"),
        Node::Static(StaticNode::I64(i)) => {
            out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes())
        }
        Node::Static(StaticNode::U64(u)) => {
            out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes())
        }
        Node::Static(StaticNode::F64(f)) => write_f64(out, f),
        #[allow(unreachable_patterns)]
        Node::Static(_) => out.extend_from_slice(b"null"),
        Node::Array { .. } => {
            out.push(b'[');
            for (i, element) in elements(nodes).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, element);
            }
            out.push(b']');
        }
        Node::Object { .. } => {
            out.push(b'{');
            for (i, member) in members(nodes).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let Ok((k, value)) = member else {
                    break;
                };
                write_str(out, k);
                out.push(b':');
                write_value(out, value);
            }
            out.push(b'}');
        }
    }
}

/// A `fmt::Write` that escapes what it is given as the body of a JSON string, so error
/// messages can be formatted straight into the reply without a temporary `String`.
pub(crate) struct EscapeWriter<'o>(pub(crate) &'o mut Vec<u8>);

impl fmt::Write for EscapeWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escape_into(self.0, s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_agree_with_serde_json() {
        for s in [
            "",
            "plain",
            "q\"b\\s/",
            "\u{0}\u{1f}\n\r\t\u{8}\u{c}",
            "é✓😀",
            "\u{7f}",
        ] {
            let mut out = Vec::new();
            write_str(&mut out, s);
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn ids_keep_type_and_value() {
        let cases: [(Id<'_>, &str); 6] = [
            (Id::Null, "null"),
            (Id::Str("a\"b"), r#""a\"b""#),
            (Id::Int(i64::MIN), "-9223372036854775808"),
            (Id::UInt(u64::MAX), "18446744073709551615"),
            (Id::Float(1.5), "1.5"),
            (Id::Float(-0.25e-7), "-2.5e-8"),
        ];
        for (id, want) in cases {
            let mut out = Vec::new();
            write_id(&mut out, id);
            assert_eq!(std::str::from_utf8(&out).unwrap(), want);
        }
    }
}
