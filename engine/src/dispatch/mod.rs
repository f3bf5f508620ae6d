//! Dispatch: runs one validated request's handler and writes its response.

pub(crate) mod context;
pub(crate) mod registry;
pub(crate) mod responder;

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::codec::request::Request;
use crate::codec::Id;
use crate::error::{ErrorCode, RpcError};
use crate::serializer::response::{write_error, write_prefix, write_rpc_error};
use crate::serializer::ResultWriter;
use context::{Context, Source};
use registry::{Entry, Handler};

/// Runs `req` with `entry` (its method's registration, `None` if there is none) and
/// appends its response to `out`, unless it is a notification. `limit` is the absolute length `out` may reach with a result in it; `max` is the
/// configured `max_response_bytes`, named in the error when a result passes `limit`.
///
/// Returns whether a response was written. A panicking handler becomes `-32603` for
/// this call only.
pub(crate) fn dispatch(
    entry: Option<&Entry>,
    req: Request<'_>,
    source: &Source<'_>,
    out: &mut Vec<u8>,
    limit: usize,
    max: usize,
) -> bool {
    let Some(entry) = entry else {
        if let Some(id) = req.id {
            write_error(
                out,
                id,
                ErrorCode::MethodNotFound,
                format_args!("Method not found: {}", req.method),
            );
            return true;
        }
        return false;
    };
    let start = out.len();
    let id = req.id.unwrap_or(Id::Null);
    write_prefix(out, id);
    out.extend_from_slice(br#""result":"#);
    let ran = catch_unwind(AssertUnwindSafe(|| match &entry.handler {
        Handler::Call(f) => {
            let mut w = ResultWriter::new(out, limit);
            let r = f(req.params, &mut w);
            match r {
                Ok(()) if !w.is_written() => w.write_raw_json(b"null"),
                other => other,
            }
        }
        Handler::CallCtx(f) => {
            let ctx = Context {
                source: *source,
                method: req.method,
                id: req.id,
                deadline: None,
            };
            let mut w = ResultWriter::new(out, limit);
            let r = f(&ctx, req.params, &mut w);
            match r {
                Ok(()) if !w.is_written() => w.write_raw_json(b"null"),
                other => other,
            }
        }
        Handler::Notify(f) => f(req.params).map(|()| out.extend_from_slice(b"null")),
        // The engine runs deferred methods itself (they need a responder).
        Handler::Deferred(_) => Err(RpcError::new(
            ErrorCode::InternalError,
            "Internal error: a deferred method was dispatched inline",
        )),
    }));
    if req.id.is_none() {
        // A notification: whatever happened, nothing is sent.
        out.truncate(start);
        return false;
    }
    match ran {
        Ok(Ok(())) => out.push(b'}'),
        Ok(Err(e)) => {
            let e = if e.error_code() == ErrorCode::ResponseTooLarge {
                too_large(max)
            } else {
                e
            };
            out.truncate(start);
            write_rpc_error(out, id, &e);
        }
        Err(_panic) => {
            out.truncate(start);
            write_error(
                out,
                id,
                ErrorCode::InternalError,
                format_args!("Internal error: the method `{}` panicked", req.method),
            );
        }
    }
    true
}

/// The `-32002` error for a reply that would pass `max_response_bytes` (`max`).
#[cold]
pub(crate) fn too_large(max: usize) -> RpcError {
    RpcError::new(
        ErrorCode::ResponseTooLarge,
        format!("Response too large: the reply would exceed max_response_bytes ({max} bytes)"),
    )
}
