//! Hooks: code run before every call and after its answer, for every call and every
//! batch element, on every path (inline, worker pool, deferred, the no-I/O API).
//!
//! Set once on the engine ([`Engine::with_hooks`]) before serving. Without hooks the
//! engine builds no context and reads no clock for them: one branch per call.
//!
//! [`Engine::with_hooks`]: crate::Engine::with_hooks

use std::time::Duration;

use crate::codec::Params;
use crate::dispatch::context::Context;
use crate::error::RpcError;

/// What ran around every call. Both methods have empty defaults; implement the ones
/// needed. They run on the thread handling the call (a reactor, or for the answer of
/// a call answered later, the reactor that owns its connection), so keep them short.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use ringrpc::{Answered, Config, Context, Engine, Hooks, Params, Registry, RpcError};
///
/// #[derive(Default)]
/// struct Audit { calls: AtomicU64, errors: AtomicU64 }
///
/// impl Hooks for Audit {
///     fn before(&self, ctx: &Context<'_>, _params: &Params<'_>) -> Result<(), RpcError> {
///         if ctx.method().starts_with("admin.") {
///             return Err(RpcError::invalid_params("admin methods are off"));
///         }
///         Ok(())
///     }
///     fn after(&self, answered: &Answered<'_>) {
///         self.calls.fetch_add(1, Ordering::Relaxed);
///         if answered.error_code().is_some() {
///             self.errors.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// let mut methods = Registry::builder();
/// methods.method("add", |p: Params<'_>| -> Result<i64, RpcError> {
///     let [a, b]: [i64; 2] = p.parse()?;
///     Ok(a + b)
/// })?;
/// let engine = Engine::new(methods.freeze(), Config::default()).with_hooks(Audit::default());
/// let mut out = Vec::new();
/// let _ = engine.handle(
///     br#"[{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1},
///          {"jsonrpc":"2.0","method":"admin.reset","id":2}]"#,
///     &mut engine.scratch(),
///     &mut out,
/// );
/// assert!(String::from_utf8_lossy(&out).contains("admin methods are off"));
/// # Ok::<(), ringrpc::RegisterError>(())
/// ```
pub trait Hooks: Send + Sync + 'static {
    /// Runs before the call's handler, with its context and params. An error rejects
    /// the call: it is answered with that error (a notification: not at all) and the
    /// handler does not run. May set the call's identity ([`Context::set_identity`]).
    fn before(&self, ctx: &Context<'_>, params: &Params<'_>) -> Result<(), RpcError> {
        let _ = (ctx, params);
        Ok(())
    }

    /// Runs once the call is answered (a notification: once its handler ran), with its
    /// method, outcome and duration.
    fn after(&self, answered: &Answered<'_>) {
        let _ = answered;
    }
}

/// A call's outcome, for [`Hooks::after`].
#[derive(Clone, Copy, Debug)]
pub struct Answered<'a> {
    pub(crate) method: &'a str,
    pub(crate) code: Option<i32>,
    pub(crate) elapsed: Duration,
    pub(crate) notification: bool,
}

impl<'a> Answered<'a> {
    /// The method called.
    pub fn method(&self) -> &'a str {
        self.method
    }

    /// The error code answered; `None` for a result.
    pub fn error_code(&self) -> Option<i32> {
        self.code
    }

    /// From the start of handling the call (after its frame was parsed) to its answer.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Whether the call was a notification (no answer was sent).
    pub fn is_notification(&self) -> bool {
        self.notification
    }
}
