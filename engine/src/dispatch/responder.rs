//! [`Responder`]: the answer to a call, given later, from any thread.
//!
//! A method registered with [`RegistryBuilder::deferred_method`] returns at once and
//! answers through its `Responder` when its work is done — from a timer, another
//! thread, or an async runtime's task. The responder writes the whole response object
//! into a buffer borrowed from its destination (reused, so no allocation in steady
//! state) and hands it over; the destination (the server's completion queue, or the
//! caller of [`Engine::handle`]) puts it where it belongs.
//!
//! [`RegistryBuilder::deferred_method`]: crate::RegistryBuilder::deferred_method
//! [`Engine::handle`]: crate::Engine::handle

use std::sync::Arc;
use std::time::Instant;

use crate::dedup::Ticket;
use crate::dispatch::hooks::{Answered, Hooks};
use crate::dispatch::too_large;
use crate::engine::OwnedId;
use crate::error::{ErrorCode, Reason, RpcError};
use crate::serializer::response::{write_error, write_prefix, write_rpc_error};
use crate::serializer::ResultWriter;

/// Where a completion goes, opaque to the engine: the server packs a connection, a
/// request slot and a batch element into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tag {
    pub(crate) conn: usize,
    pub(crate) generation: u64,
    pub(crate) slot: u64,
    pub(crate) element: u32,
}

/// The destination of answers given later: the server's per-reactor completion queue,
/// or the engine's own waiter for [`Engine::handle`](crate::Engine::handle).
pub(crate) trait Complete: Send + Sync {
    /// An empty buffer to write an answer into (one given back earlier, if any).
    fn buffer(&self) -> Vec<u8>;
    /// The answer for `tag`: a whole response object, and its error code (`None`: a
    /// result).
    fn complete(&self, tag: Tag, answer: Vec<u8>, code: Option<i32>);
    /// Whether the caller waits for the answer on the thread that runs the handler
    /// ([`Engine::handle`](crate::Engine::handle)): nothing sent for the call may wait
    /// for that thread to go on (the end of a reactor's turn, of a batch).
    #[cfg(feature = "proxy")]
    fn waits_here(&self) -> bool {
        false
    }
}

/// The answer to one call of a deferred method, to be given once, from any thread.
///
/// Consumed by answering, so a call cannot be answered twice. Rules:
/// - dropped unanswered, it answers `-32603` saying so;
/// - answered after the call's deadline (`request_timeout`, when the caller already got
///   `-32001`), the answer is dropped;
/// - for a notification, every answer is dropped.
///
/// ```
/// use ringrpc::{Config, Engine, Registry};
///
/// let mut methods = Registry::builder();
/// methods.deferred_method("later", |_ctx, params, responder| {
///     let n: u64 = match params.parse::<[u64; 1]>() {
///         Ok([n]) => n,
///         Err(e) => return responder.error(e),
///     };
///     // Owned values move to another thread; the responder answers from there.
///     std::thread::spawn(move || responder.respond(Ok::<_, ringrpc::RpcError>(n * 2)));
/// })?;
/// let engine = Engine::new(methods.freeze(), Config::default());
/// let mut out = Vec::new();
/// let frame = br#"{"jsonrpc":"2.0","method":"later","params":[21],"id":1}"#;
/// // The no-I/O API waits for the answer.
/// let _ = engine.handle(frame, &mut engine.scratch(), &mut out);
/// assert_eq!(out, br#"{"jsonrpc":"2.0","id":1,"result":42}"#);
/// # Ok::<(), ringrpc::RegisterError>(())
/// ```
///
/// Answering consumes the responder, so a second answer does not compile:
///
/// ```compile_fail
/// fn twice(r: ringrpc::Responder) {
///     r.respond(Ok::<_, ringrpc::RpcError>(1));
///     r.respond(Ok::<_, ringrpc::RpcError>(2)); // error: use of moved value
/// }
/// ```
#[must_use = "a responder dropped unanswered answers -32603"]
pub struct Responder {
    bound: Option<Bound>,
    /// A notification's responder with hooks set: the after hook learns its outcome.
    hooked: Option<Hooked>,
}

struct Hooked {
    hooks: Arc<dyn Hooks>,
    method: Box<str>,
    started: Instant,
}

impl Hooked {
    fn after(self, code: Option<i32>) {
        self.hooks.after(&Answered {
            method: &self.method,
            code,
            elapsed: self.started.elapsed(),
            notification: true,
        });
    }
}

struct Bound {
    target: Arc<dyn Complete>,
    tag: Tag,
    id: OwnedId,
    /// `max_response_bytes`.
    max: usize,
    /// The call was claimed for de-duplication: its answer is stored when given.
    ticket: Option<Ticket>,
}

impl Bound {
    /// Hands the answer over (storing it first for de-duplication).
    fn complete(self, out: Vec<u8>, code: Option<i32>) {
        if let Some(t) = &self.ticket {
            t.finish(&out, code);
        }
        self.target.complete(self.tag, out, code);
    }
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("id", &self.bound.as_ref().map(|b| &b.id))
            .finish_non_exhaustive()
    }
}

impl Responder {
    /// A responder answering `id` to `target` under `tag`.
    pub(crate) fn new(target: Arc<dyn Complete>, tag: Tag, id: OwnedId, max: usize) -> Self {
        Self {
            bound: Some(Bound {
                target,
                tag,
                id,
                max,
                ticket: None,
            }),
            hooked: None,
        }
    }

    /// A responder whose answers go nowhere (a notification's).
    /// Stores the answer under `ticket` when it is given (a call claimed for
    /// de-duplication).
    pub(crate) fn set_ticket(&mut self, ticket: Ticket) {
        if let Some(b) = &mut self.bound {
            b.ticket = Some(ticket);
        }
    }

    pub(crate) fn detached() -> Self {
        Self {
            bound: None,
            hooked: None,
        }
    }

    /// A notification's responder whose outcome goes to `hooks`' after hook.
    pub(crate) fn hooked(hooks: Arc<dyn Hooks>, method: &str, started: Instant) -> Self {
        Self {
            bound: None,
            hooked: Some(Hooked {
                hooks,
                method: method.into(),
                started,
            }),
        }
    }

    /// Whether the call is a notification (its answer will be dropped).
    pub fn is_notification(&self) -> bool {
        self.bound.is_none()
    }

    /// Whether the caller waits for the answer on this thread (see
    /// [`Complete::waits_here`]).
    #[cfg(feature = "proxy")]
    pub(crate) fn waited_here(&self) -> bool {
        self.bound.as_ref().is_some_and(|b| b.target.waits_here())
    }

    /// Answers with `result` serialized by serde, or with the error.
    pub fn respond<T: serde::Serialize>(self, result: Result<T, RpcError>) {
        match result {
            Ok(value) => self.answer(|w| w.write(&value)),
            Err(e) => self.error(e),
        }
    }

    /// Answers with `json`, one JSON value the caller vouches for, copied as is (a proxy
    /// relaying an upstream's result).
    pub fn respond_raw(self, json: &[u8]) {
        self.answer(|w| w.write_raw_json(json));
    }

    /// Answers with an error object (any code: see [`RpcError::relay`]).
    pub fn error(mut self, e: RpcError) {
        if let Some(h) = self.hooked.take() {
            h.after(Some(e.code()));
        }
        if let Some(b) = self.bound.take() {
            let mut out = b.target.buffer();
            write_rpc_error(&mut out, b.id.as_id(), &e);
            b.complete(out, Some(e.code()));
        }
    }

    /// Answers with `object`, a whole error object the caller vouches for (valid JSON,
    /// `{"code": code, "message": …}`), copied as is: a proxy relaying an upstream's
    /// error without decoding it. `code` is its code, for hooks and metrics.
    pub fn relay_error(mut self, code: i32, object: &[u8]) {
        if let Some(h) = self.hooked.take() {
            h.after(Some(code));
        }
        let Some(b) = self.bound.take() else {
            return;
        };
        let mut out = b.target.buffer();
        if object.len() > b.max {
            let e = too_large(b.max);
            write_rpc_error(&mut out, b.id.as_id(), &e);
            return b.complete(out, Some(e.code()));
        }
        write_prefix(&mut out, b.id.as_id());
        out.extend_from_slice(br#""error":"#);
        out.extend_from_slice(object);
        out.push(b'}');
        b.complete(out, Some(code));
    }

    fn answer(mut self, write: impl FnOnce(&mut ResultWriter<'_>) -> Result<(), RpcError>) {
        if let Some(h) = self.hooked.take() {
            h.after(None);
        }
        let Some(b) = self.bound.take() else {
            return;
        };
        let mut out = b.target.buffer();
        write_prefix(&mut out, b.id.as_id());
        out.extend_from_slice(br#""result":"#);
        let start = out.len();
        let limit = start.saturating_add(b.max);
        let written = write(&mut ResultWriter::new(&mut out, limit));
        let code = match written {
            Ok(()) => {
                if out.len() == start {
                    out.extend_from_slice(b"null");
                }
                out.push(b'}');
                None
            }
            Err(e) => {
                let e = if e.error_code() == ErrorCode::ResponseTooLarge {
                    too_large(b.max)
                } else {
                    e
                };
                out.clear();
                write_rpc_error(&mut out, b.id.as_id(), &e);
                Some(e.code())
            }
        };
        b.complete(out, code);
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(h) = self.hooked.take() {
            h.after(Some(ErrorCode::InternalError.code()));
        }
        if let Some(b) = self.bound.take() {
            let mut out = b.target.buffer();
            write_error(
                &mut out,
                b.id.as_id(),
                Reason::InternalError,
                format_args!(
                    "Internal error: the method gave no answer (its responder was dropped, \
                     or it panicked)"
                ),
            );
            b.complete(out, Some(ErrorCode::InternalError.code()));
        }
    }
}
