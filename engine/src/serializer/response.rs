//! Response envelopes written into the caller's output buffer, and the bounded
//! [`ResultWriter`] handlers write their results through.
//!
//! A response is `{"jsonrpc":"2.0","id":ID,"result":R}` or
//! `{"jsonrpc":"2.0","id":ID,"error":{"code":C,"message":M[,"data":D]}}`. The id prefix
//! is written first, then either the result or — after truncating back to the prefix —
//! the error, so `result` and `error` can never both appear.

use std::fmt;
use std::io;

use super::json::{escape_into, write_id, write_str, write_value, EscapeWriter};
use crate::codec::{Id, Params};
use crate::error::{Reason, RpcError};

/// Writes `{"jsonrpc":"2.0","id":ID,` — the part shared by results and errors.
#[inline]
pub(crate) fn write_prefix(out: &mut Vec<u8>, id: Id<'_>) {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    write_id(out, id);
    out.push(b',');
}

/// Writes the `"error":{...}}` tail after a prefix.
pub(crate) fn write_error_tail(
    out: &mut Vec<u8>,
    code: i32,
    message: fmt::Arguments<'_>,
    data: Option<&str>,
) {
    write_code_and_message(out, code, message);
    if let Some(data) = data {
        out.extend_from_slice(br#","data":"#);
        out.extend_from_slice(data.as_bytes());
    }
    out.extend_from_slice(b"}}");
}

/// Writes the `"error":{...}}` tail of an error the engine made: `reason`'s code, the
/// message, and `"data":{"reason":"…"}` (with `"retryAfterMs":N` when given). The data
/// is static text and an integer: nothing is allocated or formatted for it.
#[cold]
pub(crate) fn write_reason_tail(
    out: &mut Vec<u8>,
    reason: Reason,
    message: fmt::Arguments<'_>,
    retry_after_ms: Option<u64>,
) {
    write_code_and_message(out, reason.code().code(), message);
    out.extend_from_slice(br#","data":"#);
    let data = reason.data_json();
    match retry_after_ms {
        None => out.extend_from_slice(data.as_bytes()),
        Some(ms) => {
            // The static `{"reason":"…"` without its closing brace, then the hint.
            out.extend_from_slice(data.strip_suffix('}').unwrap_or(data).as_bytes());
            out.extend_from_slice(br#","retryAfterMs":"#);
            out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
            out.push(b'}');
        }
    }
    out.extend_from_slice(b"}}");
}

/// Writes `"error":{"code":C,"message":"M"` (still open for `data`).
fn write_code_and_message(out: &mut Vec<u8>, code: i32, message: fmt::Arguments<'_>) {
    out.extend_from_slice(br#""error":{"code":"#);
    out.extend_from_slice(itoa::Buffer::new().format(code).as_bytes());
    out.extend_from_slice(br#","message":""#);
    match message.as_str() {
        Some(s) => escape_into(out, s.as_bytes()),
        // Only a formatting impl of our own could fail here, and none does.
        None => {
            let _ = fmt::write(&mut EscapeWriter(out), message);
        }
    }
    out.push(b'"');
}

/// Writes a whole error response the engine made, with `reason`'s code and data and a
/// formatted message.
#[cold]
pub(crate) fn write_error(
    out: &mut Vec<u8>,
    id: Id<'_>,
    reason: Reason,
    message: fmt::Arguments<'_>,
) {
    write_prefix(out, id);
    write_reason_tail(out, reason, message, None);
}

/// Writes a whole error response for a handler's [`RpcError`].
#[cold]
pub(crate) fn write_rpc_error(out: &mut Vec<u8>, id: Id<'_>, e: &RpcError) {
    write_prefix(out, id);
    write_error_tail(out, e.code(), format_args!("{}", e.message()), e.data());
}

/// Where a handler writes its result: straight into the response, bounded by
/// `max_response_bytes`.
///
/// A raw method writes exactly one JSON value with one of the `write_*` methods; if it
/// writes nothing, the result is `null`.
pub struct ResultWriter<'o> {
    out: &'o mut Vec<u8>,
    /// Absolute length of `out` the reply may not pass.
    limit: usize,
    start: usize,
}

impl<'o> ResultWriter<'o> {
    pub(crate) fn new(out: &'o mut Vec<u8>, limit: usize) -> Self {
        let start = out.len();
        Self { out, limit, start }
    }

    /// Whether a value has been written.
    pub fn is_written(&self) -> bool {
        self.out.len() > self.start
    }

    fn begin(&self) -> Result<(), RpcError> {
        if self.is_written() {
            return Err(RpcError::new(
                Reason::InternalError,
                "Internal error: the method wrote more than one result",
            ));
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), RpcError> {
        if self.out.len() > self.limit {
            self.out.truncate(self.start);
            return Err(RpcError::new(
                Reason::ResponseTooLarge,
                "Response too large",
            ));
        }
        Ok(())
    }

    /// Serializes `value` with serde as the result.
    ///
    /// # Errors
    ///
    /// `-32603` if `value` fails to serialize; `-32002` if it would pass
    /// `max_response_bytes` (detected while writing, not after).
    pub fn write<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RpcError> {
        self.begin()?;
        let limit = self.limit;
        let r = serde_json::to_writer(
            Bounded {
                out: &mut *self.out,
                limit,
            },
            value,
        );
        if let Err(e) = r {
            let too_large = e.is_io();
            self.out.truncate(self.start);
            if too_large {
                return Err(RpcError::new(
                    Reason::ResponseTooLarge,
                    "Response too large",
                ));
            }
            return Err(RpcError::new(
                Reason::InternalError,
                format!("Internal error: result did not serialize: {e}"),
            ));
        }
        Ok(())
    }

    /// Writes the request's params back as the result (an `echo`): their original text,
    /// copied verbatim from the frame (see [`Params::raw_json`]), with no intermediate
    /// value and no re-encoding. Absent params are written as `null`.
    pub fn write_params(&mut self, params: &Params<'_>) -> Result<(), RpcError> {
        self.begin()?;
        match (params.raw_json(), params.nodes()) {
            (Some(text), _) => self.out.extend_from_slice(text),
            // Not reached for frames the engine parsed; kept so a mismatch degrades to
            // re-encoding from the tape rather than to a wrong answer.
            (None, Some(nodes)) => write_value(self.out, nodes),
            (None, None) => self.out.extend_from_slice(b"null"),
        }
        self.check()
    }

    /// Writes a string result.
    pub fn write_str(&mut self, s: &str) -> Result<(), RpcError> {
        self.begin()?;
        write_str(self.out, s);
        self.check()
    }

    /// Writes an integer result.
    pub fn write_i64(&mut self, v: i64) -> Result<(), RpcError> {
        self.begin()?;
        self.out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self.check()
    }

    /// Writes pre-serialized JSON text as the result.
    ///
    /// The caller vouches that `json` is one valid JSON value; it is copied as is.
    pub fn write_raw_json(&mut self, json: &[u8]) -> Result<(), RpcError> {
        self.begin()?;
        self.out.extend_from_slice(json);
        self.check()
    }
}

/// An `io::Write` into the output buffer that fails once the reply passes its bound, so
/// an oversized result is cut off while it is being written.
struct Bounded<'o> {
    out: &'o mut Vec<u8>,
    limit: usize,
}

impl io::Write for Bounded<'_> {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.out.len() + buf.len() > self.limit {
            return Err(io::ErrorKind::WriteZero.into());
        }
        self.out.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_are_written_with_their_reason() {
        let mut out = Vec::new();
        write_error(
            &mut out,
            Id::UInt(1),
            Reason::MethodNotFound,
            format_args!("Method not found: {}", "a\"b"),
        );
        assert_eq!(
            out,
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found: a\"b","data":{"reason":"method_not_found"}}}"#
        );
        out.clear();
        write_prefix(&mut out, Id::Null);
        write_reason_tail(&mut out, Reason::RateLimited, format_args!("L"), Some(250));
        assert_eq!(
            out,
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32005,"message":"L","data":{"reason":"rate_limited","retryAfterMs":250}}}"#
        );
        out.clear();
        write_rpc_error(&mut out, Id::UInt(2), &RpcError::relay(-32005, "up", None));
        assert_eq!(
            out,
            br#"{"jsonrpc":"2.0","id":2,"error":{"code":-32005,"message":"up"}}"#
        );
    }
}
