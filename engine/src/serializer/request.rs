//! Request envelopes for the client, written into a reused buffer with the same
//! escaping and number writers as responses; typed params go through serde_json's
//! `Serializer`, exactly as typed results do in `ResultWriter::write`.

use super::json::{write_id, write_str};
use crate::codec::Id;

/// Why params could not be written.
#[derive(Debug)]
pub(crate) enum ParamsError {
    /// serde failed (a map with non-string keys, a failing `Serialize` impl…).
    Serialize(serde_json::Error),
    /// The params serialized to a scalar: JSON-RPC only allows an array or an object.
    NotStructured,
}

impl std::fmt::Display for ParamsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Serialize(e) => write!(f, "did not serialize: {e}"),
            Self::NotStructured => {
                f.write_str("must serialize to an array or an object (or to null for none)")
            }
        }
    }
}

/// Appends `{"jsonrpc":"2.0","id":ID,"method":M,"params":P}` to `out`; without an id
/// it is a notification, and params that serialize to `null` (`()`, `None`) are left
/// out. On error `out` is truncated back to where it was. Returns where the params'
/// `{` is in `out` when they are an object (where [`insert_meta`] may add `_meta`).
///
/// The request is always one line: newlines in the params text (possible only as
/// whitespace between tokens, e.g. in a pretty-printed `RawValue`; JSON strings cannot
/// hold a raw newline) become spaces, so they cannot split a newline-delimited frame.
pub(crate) fn write_request<P: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    id: Option<Id<'_>>,
    method: &str,
    params: &P,
) -> Result<Option<usize>, ParamsError> {
    let start = out.len();
    out.extend_from_slice(br#"{"jsonrpc":"2.0","#);
    if let Some(id) = id {
        out.extend_from_slice(br#""id":"#);
        write_id(out, id);
        out.push(b',');
    }
    out.extend_from_slice(br#""method":"#);
    write_str(out, method);
    let mark = out.len();
    out.extend_from_slice(br#","params":"#);
    let value = out.len();
    if let Err(e) = serde_json::to_writer(&mut *out, params) {
        out.truncate(start);
        return Err(ParamsError::Serialize(e));
    }
    let open = match out.get(value) {
        Some(b'[' | b'{') => {
            let params = &mut out[value..];
            let mut at = 0;
            while let Some(i) = memchr::memchr2(b'\n', b'\r', &params[at..]) {
                params[at + i] = b' ';
                at += i + 1;
            }
            (params[0] == b'{').then_some(value)
        }
        Some(b'n') => {
            out.truncate(mark);
            None
        }
        _ => {
            out.truncate(start);
            return Err(ParamsError::NotStructured);
        }
    };
    out.push(b'}');
    Ok(open)
}

/// The most `_meta` text [`meta_text`] writes: `"_meta":{"timeoutMs":` (21 bytes),
/// 20 digits, `},`.
const META_MAX: usize = 21 + 20 + 2;

/// `"_meta":{"timeoutMs":MS}` (and a `,` when members follow it) into a stack buffer;
/// its length.
fn meta_text(ms: u64, more: bool, buf: &mut [u8; META_MAX]) -> usize {
    let mut len = 0;
    let mut put = |b: &[u8]| {
        buf[len..len + b.len()].copy_from_slice(b);
        len += b.len();
    };
    put(br#""_meta":{"timeoutMs":"#);
    put(itoa::Buffer::new().format(ms).as_bytes());
    put(if more { b"}," } else { b"}" });
    len
}

/// Whether `_meta` can be added to the params object `params` (its text, `{` first):
/// not if the text holds `"_meta"` anywhere, since a second `_meta` member would be
/// refused by strict readers (and a nested or quoted one is not worth telling apart).
pub(crate) fn meta_fits(params: &[u8]) -> bool {
    memchr::memmem::find(params, br#""_meta""#).is_none()
}

/// Whether the object whose text after its `{` is `rest` has members: its first byte
/// that is not whitespace is not `}` (raw params may be `{ }`).
fn has_members(rest: &[u8]) -> bool {
    rest.iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|&b| b != b'}')
}

/// Adds `"_meta":{"timeoutMs":MS}` as the first member of the params object whose `{`
/// is at `open` in `out` (as [`write_request`] returned), unless [`meta_fits`] says no.
/// No allocation beyond `out`'s own growth.
pub(crate) fn insert_meta(out: &mut Vec<u8>, open: usize, ms: u64) {
    if !out.get(open..).is_some_and(meta_fits) {
        return;
    }
    let more = has_members(&out[open + 1..]);
    let mut buf = [0; META_MAX];
    let len = meta_text(ms, more, &mut buf);
    out.splice(open + 1..open + 1, buf[..len].iter().copied());
}

/// Appends `part`, one request [`write_request`] wrote whose params object opens at
/// `open` in it, with `_meta` added as [`insert_meta`] would.
pub(crate) fn extend_with_meta(out: &mut Vec<u8>, part: &[u8], open: Option<usize>, ms: u64) {
    match open.filter(|&at| part.get(at..).is_some_and(meta_fits)) {
        Some(at) => {
            let more = has_members(&part[at + 1..]);
            let mut buf = [0; META_MAX];
            let len = meta_text(ms, more, &mut buf);
            out.extend_from_slice(&part[..=at]);
            out.extend_from_slice(&buf[..len]);
            out.extend_from_slice(&part[at + 1..]);
        }
        None => out.extend_from_slice(part),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_notifications() {
        let mut out = Vec::new();
        write_request(&mut out, Some(Id::UInt(7)), "a\"b", &[2, 3]).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":7,"method":"a\"b","params":[2,3]}"#
        );
        out.clear();
        write_request(&mut out, None, "n", &()).unwrap();
        assert_eq!(out, br#"{"jsonrpc":"2.0","method":"n"}"#);
        out.clear();
        let named = serde_json::json!({"minuend": 42});
        write_request(&mut out, Some(Id::Str("x")), "s", &named).unwrap();
        assert_eq!(
            out,
            br#"{"jsonrpc":"2.0","id":"x","method":"s","params":{"minuend":42}}"#
        );
        out.clear();
        out.extend_from_slice(b"keep");
        assert!(matches!(
            write_request(&mut out, None, "n", &5),
            Err(ParamsError::NotStructured)
        ));
        assert_eq!(out, b"keep");
    }

    #[test]
    fn meta_into_an_empty_object_with_spaces_adds_no_comma() {
        // Raw params (a `RawValue`) keep their whitespace.
        let mut out = br#"{"params":{ 	 }}"#.to_vec();
        insert_meta(&mut out, 10, 0);
        assert_eq!(out, br#"{"params":{"_meta":{"timeoutMs":0} 	 }}"#);
        let mut out = Vec::new();
        extend_with_meta(&mut out, br#"{"params":{ "a":1}}"#, Some(10), 7);
        assert_eq!(out, br#"{"params":{"_meta":{"timeoutMs":7}, "a":1}}"#);
    }

    #[test]
    fn meta_goes_first_into_object_params_only() {
        let with = |params: &serde_json::Value, ms| {
            let mut out = b"x".to_vec();
            let open = write_request(&mut out, Some(Id::UInt(1)), "m", params).unwrap();
            if let Some(open) = open {
                insert_meta(&mut out, open, ms);
            }
            let mut part = Vec::new();
            let open = write_request(&mut part, Some(Id::UInt(1)), "m", params).unwrap();
            let mut batch = b"x".to_vec();
            extend_with_meta(&mut batch, &part, open, ms);
            assert_eq!(out, batch);
            String::from_utf8(out[1..].to_vec()).unwrap()
        };
        assert_eq!(
            with(&serde_json::json!({"a": 1}), 250),
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"timeoutMs":250},"a":1}}"#
        );
        assert_eq!(
            with(&serde_json::json!({}), 0),
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"timeoutMs":0}}}"#
        );
        assert_eq!(
            with(&serde_json::json!({"_meta": {"progressToken": 1}}), 5),
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"progressToken":1}}}"#
        );
        assert_eq!(
            with(&serde_json::json!([1, {"a": 2}]), 5),
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1,{"a":2}]}"#
        );
        assert_eq!(
            with(&serde_json::Value::Null, 5),
            r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#
        );
        assert_eq!(
            with(&serde_json::json!({"b": "}"}), u64::MAX),
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"_meta":{"timeoutMs":18446744073709551615},"b":"}"}}"#
        );
    }
}
