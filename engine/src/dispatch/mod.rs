//! Dispatch: runs one validated request's handler and writes its response.

pub(crate) mod context;
pub(crate) mod hooks;
pub(crate) mod registry;
pub(crate) mod responder;
pub(crate) mod subscription;

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::codec::request::Request;
use crate::codec::Id;
use crate::error::{ErrorCode, Reason, RpcError};
use crate::serializer::response::{write_error, write_prefix, write_reason_tail, write_rpc_error};
use crate::serializer::ResultWriter;
use context::{Context, Source};
use registry::{Entry, Handler};

/// What [`dispatch`] did: whether it wrote an answer, and the answer's error code
/// (`None`: a result, or a notification that ran without failing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dispatched {
    pub(crate) wrote: bool,
    pub(crate) code: Option<i32>,
    /// Where in `out` the answer's part after its id (`"result":…}` or `"error":…}`)
    /// starts, once it wrote one: a result and an error for the same id share their
    /// prefix, so it is known before the handler runs (what de-duplication stores).
    pub(crate) tail: usize,
}

/// Runs `req` with `entry` (its method's registration, `None` if there is none) and
/// appends its response to `out`, unless it is a notification. `limit` is the absolute
/// length `out` may reach with a result in it; `max` is the configured
/// `max_response_bytes`, named in the error when a result passes `limit`. `ctx` is the
/// call's context if one was built already (for hooks); context-aware handlers get it,
/// or one built from `source`.
///
/// A panicking handler becomes `-32603` for this call only.
#[inline]
pub(crate) fn dispatch(
    entry: Option<&Entry>,
    req: Request<'_>,
    ctx: Option<&Context<'_>>,
    source: &Source<'_>,
    out: &mut Vec<u8>,
    limit: usize,
    max: usize,
) -> Dispatched {
    let Some(entry) = entry else {
        return not_found(req, out);
    };
    let id = req.id.unwrap_or(Id::Null);
    let (start, tail) = begin_result(out, id);
    let ran = catch_unwind(AssertUnwindSafe(|| match &entry.handler {
        Handler::Call(f) => {
            let mut w = ResultWriter::new(out, limit);
            let r = f(req.params, &mut w);
            null_if_unwritten(r, &mut w)
        }
        Handler::CallCtx(f) => {
            let built;
            let ctx = match ctx {
                Some(ctx) => ctx,
                None => {
                    built = Context::new(*source, req.method, req.id, None);
                    &built
                }
            };
            let mut w = ResultWriter::new(out, limit);
            let r = f(ctx, req.params, &mut w);
            null_if_unwritten(r, &mut w)
        }
        Handler::Notify(f) => f(req.params).map(|()| out.extend_from_slice(b"null")),
        // The engine runs deferred methods itself (they need a responder).
        Handler::Deferred(_) => Err(not_plain()),
    }));
    finish(ran, req, id, (start, tail), out, max)
}

/// [`dispatch`] for the straight path: a plain method (`Call` or `Notify`, or none),
/// no context. Smaller, so it is inlined into the engine's hot loop; the answers are
/// byte for byte those of [`dispatch`]. (Having `dispatch` hand plain methods to it
/// instead of repeating their arms cost the hot path ~30 instructions per request.)
#[inline]
pub(crate) fn dispatch_plain(
    entry: Option<&Entry>,
    req: Request<'_>,
    out: &mut Vec<u8>,
    limit: usize,
    max: usize,
) -> Dispatched {
    let Some(entry) = entry else {
        return not_found(req, out);
    };
    let id = req.id.unwrap_or(Id::Null);
    let (start, tail) = begin_result(out, id);
    let ran = catch_unwind(AssertUnwindSafe(|| match &entry.handler {
        Handler::Call(f) => {
            let mut w = ResultWriter::new(out, limit);
            let r = f(req.params, &mut w);
            null_if_unwritten(r, &mut w)
        }
        Handler::Notify(f) => f(req.params).map(|()| out.extend_from_slice(b"null")),
        // Never reached: the engine sends only plain methods here.
        Handler::CallCtx(_) | Handler::Deferred(_) => Err(not_plain()),
    }));
    finish(ran, req, id, (start, tail), out, max)
}

/// Writes `{"jsonrpc":"2.0","id":ID,"result":` and returns where the answer starts
/// and where its part after the id does.
#[inline(always)]
fn begin_result(out: &mut Vec<u8>, id: Id<'_>) -> (usize, usize) {
    let start = out.len();
    write_prefix(out, id);
    let tail = out.len();
    out.extend_from_slice(br#""result":"#);
    (start, tail)
}

/// A handler that wrote nothing answered `null`.
#[inline(always)]
fn null_if_unwritten(r: Result<(), RpcError>, w: &mut ResultWriter<'_>) -> Result<(), RpcError> {
    match r {
        Ok(()) if !w.is_written() => w.write_raw_json(b"null"),
        other => other,
    }
}

/// `-32601` for a call to a method that is not registered.
#[cold]
fn not_found(req: Request<'_>, out: &mut Vec<u8>) -> Dispatched {
    let code = Some(ErrorCode::MethodNotFound.code());
    if let Some(id) = req.id {
        write_prefix(out, id);
        let tail = out.len();
        write_reason_tail(
            out,
            Reason::MethodNotFound,
            format_args!("Method not found: {}", req.method),
            None,
        );
        return Dispatched {
            wrote: true,
            code,
            tail,
        };
    }
    Dispatched {
        wrote: false,
        code,
        tail: out.len(),
    }
}

#[cold]
fn not_plain() -> RpcError {
    RpcError::new(
        Reason::InternalError,
        "Internal error: a deferred method was dispatched inline",
    )
}

/// The end of a dispatch: the answer's closing brace, or its error in place of the
/// result; nothing for a notification. Always inlined: shared by both dispatchers, it
/// would otherwise be called out of line on the hot path (+30 instructions per call).
#[inline(always)]
fn finish(
    ran: std::thread::Result<Result<(), RpcError>>,
    req: Request<'_>,
    id: Id<'_>,
    (start, tail): (usize, usize),
    out: &mut Vec<u8>,
    max: usize,
) -> Dispatched {
    let code = match &ran {
        Ok(Ok(())) => None,
        Ok(Err(e)) if e.error_code() == ErrorCode::ResponseTooLarge => {
            Some(ErrorCode::ResponseTooLarge.code())
        }
        Ok(Err(e)) => Some(e.code()),
        Err(_panic) => Some(ErrorCode::InternalError.code()),
    };
    if req.id.is_none() {
        // A notification: whatever happened, nothing is sent.
        out.truncate(start);
        return Dispatched {
            wrote: false,
            code,
            tail: start,
        };
    }
    match ran {
        Ok(Ok(())) => out.push(b'}'),
        // Rewritten from `start` with the same prefix: `tail` stays where it was.
        Ok(Err(e)) => failed(e, id, start, out, max),
        Err(_panic) => panicked(req.method, id, start, out),
    }
    Dispatched {
        wrote: true,
        code,
        tail,
    }
}

#[cold]
fn failed(e: RpcError, id: Id<'_>, start: usize, out: &mut Vec<u8>, max: usize) {
    let e = if e.error_code() == ErrorCode::ResponseTooLarge {
        too_large(max)
    } else {
        e
    };
    out.truncate(start);
    write_rpc_error(out, id, &e);
}

#[cold]
fn panicked(method: &str, id: Id<'_>, start: usize, out: &mut Vec<u8>) {
    out.truncate(start);
    write_error(
        out,
        id,
        Reason::InternalError,
        format_args!("Internal error: the method `{method}` panicked"),
    );
}

/// What a -32001's message says the call missed: the server's `request_timeout`
/// (`Some`) or a shorter budget of its caller's, or, with no server timeout, the
/// caller's budget alone.
pub(crate) struct Within(pub(crate) Option<std::time::Duration>);

impl std::fmt::Display for Within {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(t) => write!(
                f,
                "by its deadline (request_timeout {} ms, or the caller's shorter budget)",
                t.as_millis()
            ),
            None => f.write_str("within the caller's budget"),
        }
    }
}

/// The `-32002` error for a reply that would pass `max_response_bytes` (`max`).
#[cold]
pub(crate) fn too_large(max: usize) -> RpcError {
    RpcError::new(
        Reason::ResponseTooLarge,
        format!("Response too large: the reply would exceed max_response_bytes ({max} bytes)"),
    )
}

#[cfg(test)]
mod tests {
    use super::Within;
    use std::time::Duration;

    #[test]
    fn a_timeout_message_names_the_limit_that_applied() {
        assert_eq!(
            Within(Some(Duration::from_millis(250))).to_string(),
            "by its deadline (request_timeout 250 ms, or the caller's shorter budget)"
        );
        // No server timeout: only the caller's budget (it said "request_timeout 0 ms").
        assert_eq!(Within(None).to_string(), "within the caller's budget");
    }
}
