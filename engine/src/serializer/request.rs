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
/// out. On error `out` is truncated back to where it was.
///
/// The request is always one line: newlines in the params text (possible only as
/// whitespace between tokens, e.g. in a pretty-printed `RawValue`; JSON strings cannot
/// hold a raw newline) become spaces, so they cannot split a newline-delimited frame.
pub(crate) fn write_request<P: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    id: Option<Id<'_>>,
    method: &str,
    params: &P,
) -> Result<(), ParamsError> {
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
    match out.get(value) {
        Some(b'[' | b'{') => {
            let params = &mut out[value..];
            let mut at = 0;
            while let Some(i) = memchr::memchr2(b'\n', b'\r', &params[at..]) {
                params[at + i] = b' ';
                at += i + 1;
            }
        }
        Some(b'n') => out.truncate(mark),
        _ => {
            out.truncate(start);
            return Err(ParamsError::NotStructured);
        }
    }
    out.push(b'}');
    Ok(())
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
}
