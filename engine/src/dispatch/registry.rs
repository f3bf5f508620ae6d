//! The method registry: built before serving, then frozen into an immutable table that
//! the hot path reads without locks.

use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::codec::Params;
use crate::dispatch::context::Context;
use crate::dispatch::responder::Responder;
use crate::dispatch::subscription::{PushTo, Sink, SinkClosed, Subscribing, SubscriptionConfig};
use crate::error::{Reason, RegisterError, RpcError};
use crate::serializer::ResultWriter;
use crate::server::attach::Attach;

type CallFn = dyn Fn(Params<'_>, &mut ResultWriter<'_>) -> Result<(), RpcError> + Send + Sync;
type CtxCallFn =
    dyn Fn(&Context<'_>, Params<'_>, &mut ResultWriter<'_>) -> Result<(), RpcError> + Send + Sync;
type NotifyFn = dyn Fn(Params<'_>) -> Result<(), RpcError> + Send + Sync;
type DeferredFn = dyn Fn(&Context<'_>, Params<'_>, Responder) + Send + Sync;

/// A registered handler. Typed methods are wrapped into `Call` or `CallCtx` at
/// registration, so the dispatcher matches on four kinds only.
pub(crate) enum Handler {
    /// Answers calls; when notified, runs and its result is dropped.
    Call(Box<CallFn>),
    /// As `Call`, with the call's context (built only for these).
    CallCtx(Box<CtxCallFn>),
    /// A notification handler; when called with an id, the answer is `null`.
    Notify(Box<NotifyFn>),
    /// Answers later through a [`Responder`], from any thread.
    Deferred(Box<DeferredFn>),
}

/// A registered method: its handler, and whether it may block (then the server runs it
/// on the worker pool, never on a thread doing I/O).
pub(crate) struct Entry {
    pub(crate) handler: Handler,
    pub(crate) blocking: bool,
    /// Retried calls are de-duplicated (with a store set on the engine).
    pub(crate) dedup: bool,
    /// The memory de-duplication store's hash of the method's name, made when frozen
    /// (`crate::dedup::memory::method_state`); `None` for the fallback (many names)
    /// and methods not de-duplicated.
    pub(crate) dedup_name: Option<u64>,
    /// Its index among the metrics' method labels (set when frozen).
    pub(crate) metric: u32,
    /// A deferred handler that answers by the call's deadline itself (a deferred
    /// subscribe): the server does not answer it `-32001` (see [`Subscribing`]).
    pub(crate) untimed: bool,
    /// [`Entry::plain`]'s answer, worked out when frozen: one test per call, not three.
    plain: bool,
}

impl Entry {
    fn new(handler: Handler) -> Self {
        Self {
            handler,
            blocking: false,
            dedup: false,
            dedup_name: None,
            metric: 0,
            untimed: false,
            plain: false,
        }
    }

    /// Answered here and now with nothing around it: the engine's straight path (as
    /// frozen).
    #[inline(always)]
    pub(crate) fn is_plain(&self) -> bool {
        self.plain
    }

    /// Sets [`Entry::is_plain`] from what the entry now is (done when frozen).
    fn freeze(&mut self) {
        self.plain = !self.blocking
            && !self.dedup
            && matches!(self.handler, Handler::Call(_) | Handler::Notify(_));
    }
}

/// Collects methods; [`RegistryBuilder::freeze`] turns it into a [`Registry`].
///
/// ```
/// use ringrpc::{Params, Registry, RpcError};
///
/// let mut methods = Registry::builder();
/// methods
///     .method("add", |p: Params<'_>| -> Result<i64, RpcError> {
///         let (a, b): (i64, i64) = p.parse()?;
///         Ok(a + b)
///     })?
///     .raw_method("echo", |p, out| out.write_params(&p))?
///     .notification("log", |_p| Ok(()))?;
/// let registry = methods.freeze();
/// assert_eq!(registry.len(), 3);
/// # Ok::<(), ringrpc::RegisterError>(())
/// ```
#[derive(Default)]
pub struct RegistryBuilder {
    methods: FxHashMap<Box<str>, Entry>,
    fallback: Option<Entry>,
    /// Run in every server reactor's loop (a proxy's own upstream connections).
    attachments: Vec<Arc<dyn Attach>>,
}

impl RegistryBuilder {
    fn insert(&mut self, name: &str, handler: Handler) -> Result<&mut Self, RegisterError> {
        if name.starts_with("rpc.") {
            return Err(RegisterError::Reserved(name.to_owned()));
        }
        if self.methods.contains_key(name) {
            return Err(RegisterError::Duplicate(name.to_owned()));
        }
        self.methods.insert(name.into(), Entry::new(handler));
        Ok(self)
    }

    /// Registers a typed method that may block (sleep, disk, a lock held long): the
    /// server runs it on the worker pool under `request_timeout`, never on a thread
    /// doing I/O. Otherwise as [`RegistryBuilder::method`].
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`].
    pub fn blocking_method<R, F>(&mut self, name: &str, f: F) -> Result<&mut Self, RegisterError>
    where
        R: serde::Serialize,
        F: Fn(Params<'_>) -> Result<R, RpcError> + Send + Sync + 'static,
    {
        self.method(name, f)?;
        if let Some(e) = self.methods.get_mut(name) {
            e.blocking = true;
        }
        Ok(self)
    }

    /// Marks the registered method `name` (of any kind) for de-duplication of retried
    /// calls: with a store set on the engine ([`Engine::with_dedup`]), a retry of a call
    /// (same key: identity and id, or `Idempotency-Key`) replays the first answer
    /// instead of running again. For methods that change state; see
    /// [`dedup`](crate::dedup).
    ///
    /// # Errors
    ///
    /// [`RegisterError::Unknown`] if no method `name` is registered.
    ///
    /// [`Engine::with_dedup`]: crate::Engine::with_dedup
    pub fn dedup(&mut self, name: &str) -> Result<&mut Self, RegisterError> {
        let entry = self
            .methods
            .get_mut(name)
            .ok_or_else(|| RegisterError::Unknown(name.to_owned()))?;
        entry.dedup = true;
        Ok(self)
    }

    /// Registers a typed method marked for de-duplication: [`RegistryBuilder::method`]
    /// then [`RegistryBuilder::dedup`].
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`].
    pub fn dedup_method<R, F>(&mut self, name: &str, f: F) -> Result<&mut Self, RegisterError>
    where
        R: serde::Serialize,
        F: Fn(Params<'_>) -> Result<R, RpcError> + Send + Sync + 'static,
    {
        self.method(name, f)?.dedup(name)
    }

    /// Registers a typed method: `f` reads its params with [`Params::parse`] (borrowing
    /// from the frame) and returns a serde-serializable result, which is written straight
    /// into the response.
    ///
    /// # Errors
    ///
    /// [`RegisterError`] for a duplicate name or a reserved `rpc.` name.
    pub fn method<R, F>(&mut self, name: &str, f: F) -> Result<&mut Self, RegisterError>
    where
        R: serde::Serialize,
        F: Fn(Params<'_>) -> Result<R, RpcError> + Send + Sync + 'static,
    {
        self.insert(
            name,
            Handler::Call(Box::new(move |p, out| out.write(&f(p)?))),
        )
    }

    /// Registers a typed method that also reads the call's [`Context`] (transport, peer,
    /// HTTP headers, id, method). Otherwise as [`RegistryBuilder::method`]; plain methods
    /// pay nothing for contexts.
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`].
    pub fn method_with_ctx<R, F>(&mut self, name: &str, f: F) -> Result<&mut Self, RegisterError>
    where
        R: serde::Serialize,
        F: Fn(&Context<'_>, Params<'_>) -> Result<R, RpcError> + Send + Sync + 'static,
    {
        self.insert(
            name,
            Handler::CallCtx(Box::new(move |ctx, p, out| out.write(&f(ctx, p)?))),
        )
    }

    /// Registers a method answered later: `f` runs on the thread that read the call
    /// (keep it short: start the work and return) and answers through the
    /// [`Responder`], from any thread, whenever the work is done — without holding a
    /// thread meanwhile. The params are borrowed from the frame for the length of the
    /// call: parse what the work needs into owned values before returning.
    ///
    /// The server answers `-32001` if the responder has not answered by the call's
    /// deadline ([`Context::deadline`]: `request_timeout`, or the caller's budget if
    /// shorter), and `-32603` if it is dropped unanswered.
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`].
    pub fn deferred_method<F>(&mut self, name: &str, f: F) -> Result<&mut Self, RegisterError>
    where
        F: Fn(&Context<'_>, Params<'_>, Responder) + Send + Sync + 'static,
    {
        self.insert(name, Handler::Deferred(Box::new(f)))
    }

    /// Sets the route for every method not registered (what a proxy needs): `f` answers
    /// inline, and finds the called name in [`Context::method`]. Without a fallback an
    /// unknown method is `-32601`.
    pub fn fallback<F>(&mut self, f: F) -> &mut Self
    where
        F: Fn(&Context<'_>, Params<'_>, &mut ResultWriter<'_>) -> Result<(), RpcError>
            + Send
            + Sync
            + 'static,
    {
        self.fallback = Some(Entry::new(Handler::CallCtx(Box::new(f))));
        self
    }

    /// As [`RegistryBuilder::fallback`], answered later through a [`Responder`] (a proxy
    /// forwarding the call upstream), as for [`RegistryBuilder::deferred_method`].
    pub fn deferred_fallback<F>(&mut self, f: F) -> &mut Self
    where
        F: Fn(&Context<'_>, Params<'_>, Responder) + Send + Sync + 'static,
    {
        self.fallback = Some(Entry::new(Handler::Deferred(Box::new(f))));
        self
    }

    /// Registers a raw method: `f` gets the borrowed params and writes its result JSON
    /// directly into the response through the [`ResultWriter`].
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`].
    pub fn raw_method<F>(&mut self, name: &str, f: F) -> Result<&mut Self, RegisterError>
    where
        F: Fn(Params<'_>, &mut ResultWriter<'_>) -> Result<(), RpcError> + Send + Sync + 'static,
    {
        self.insert(name, Handler::Call(Box::new(f)))
    }

    /// Registers a notification handler. Notifications are never answered, so its errors
    /// are dropped; if a client calls it with an id, the answer is `null` or its error.
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`].
    pub fn notification<F>(&mut self, name: &str, f: F) -> Result<&mut Self, RegisterError>
    where
        F: Fn(Params<'_>) -> Result<(), RpcError> + Send + Sync + 'static,
    {
        self.insert(name, Handler::Notify(Box::new(f)))
    }

    /// Registers a subscription: `subscribe` opens one, `unsubscribe` (params `[ID]`)
    /// ends it, and its notifications are calls to `notification`:
    /// `{"jsonrpc":"2.0","method":NOTIFICATION,"params":{"subscription":ID,"result":…}}`.
    ///
    /// The subscribe call runs `f` with a [`Sink`] (keep it, or move it to any thread,
    /// to push with [`Sink::send`]); when `f` returns `Ok`, the call answers the
    /// subscription's id, always before its first notification. `f` returning an
    /// error ends the subscription and answers that error. The unsubscribe call
    /// answers `true`, and nothing of that subscription follows; `false` for an id that
    /// is not one of the connection's subscriptions. A closing connection ends its
    /// subscriptions; a sink then refuses sends ([`SinkClosed`]).
    ///
    /// Subscriptions need a connection that carries notifications: WebSocket, TCP, Unix
    /// or stdio. Over HTTP (or the no-I/O API) the subscribe call is answered `-32601`
    /// with reason `push_unsupported`. Queues and lagging: [`SubscriptionConfig::default`]
    /// (see [`RegistryBuilder::subscription_with`]).
    ///
    /// ```
    /// use ringrpc::{Config, Context, Engine, Params, Registry, Sink};
    ///
    /// let mut methods = Registry::builder();
    /// methods.subscription("subscribe_prices", "price", "unsubscribe_prices",
    ///     |_ctx: &Context<'_>, _p: Params<'_>, sink: Sink| {
    ///         std::thread::spawn(move || {
    ///             // Until the client unsubscribes or goes away.
    ///             while sink.send(&42.5).is_ok() {
    ///                 std::thread::sleep(std::time::Duration::from_millis(100));
    ///             }
    ///         });
    ///         Ok(())
    ///     })?;
    /// let engine = Engine::new(methods.freeze(), Config::default());
    /// // Served over WebSocket, TCP, Unix or stdio it pushes; the no-I/O API cannot.
    /// let mut out = Vec::new();
    /// let _ = engine.handle(br#"{"jsonrpc":"2.0","method":"subscribe_prices","id":1}"#,
    ///     &mut engine.scratch(), &mut out);
    /// assert!(String::from_utf8(out).unwrap().contains("push_unsupported"));
    /// # Ok::<(), ringrpc::RegisterError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`], for either name.
    pub fn subscription<F>(
        &mut self,
        subscribe: &str,
        notification: &str,
        unsubscribe: &str,
        f: F,
    ) -> Result<&mut Self, RegisterError>
    where
        F: Fn(&Context<'_>, Params<'_>, Sink) -> Result<(), RpcError> + Send + Sync + 'static,
    {
        let config = SubscriptionConfig::default();
        self.subscription_with(subscribe, notification, unsubscribe, config, f)
    }

    /// As [`RegistryBuilder::subscription`], with each subscription's queue bound and
    /// what happens when a client reads too slowly to keep it under the bound.
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`], for either name.
    pub fn subscription_with<F>(
        &mut self,
        subscribe: &str,
        notification: &str,
        unsubscribe: &str,
        config: SubscriptionConfig,
        f: F,
    ) -> Result<&mut Self, RegisterError>
    where
        F: Fn(&Context<'_>, Params<'_>, Sink) -> Result<(), RpcError> + Send + Sync + 'static,
    {
        if self.methods.contains_key(unsubscribe) || subscribe == unsubscribe {
            return Err(RegisterError::Duplicate(unsubscribe.to_owned()));
        }
        let notification: Box<str> = notification.into();
        let open = move |ctx: &Context<'_>, params: Params<'_>, out: &mut ResultWriter<'_>| {
            let (push, sink) = open_subscription(ctx, &notification, config)?;
            let id = sink.id();
            // A panicking handler opens nothing (the engine answers -32603).
            let ran =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(ctx, params, sink)));
            match ran {
                Ok(Ok(())) => out.write(&id),
                Ok(Err(e)) => {
                    push.close(id, SinkClosed::Unsubscribed);
                    Err(e)
                }
                Err(panic) => {
                    push.close(id, SinkClosed::Unsubscribed);
                    std::panic::resume_unwind(panic)
                }
            }
        };
        self.insert(subscribe, Handler::CallCtx(Box::new(open)))?;
        self.insert(unsubscribe, Handler::CallCtx(Box::new(unsubscribe_call)))
    }

    /// Registers a subscription whose subscribe call is answered later: `f` gets a
    /// [`Subscribing`] and, from any thread, accepts it (the call answers the
    /// subscription's id and `f` gets its [`Sink`]) or rejects it with an error (the
    /// call answers that error, and nothing is opened) — a proxy, once its upstream has
    /// answered the subscription it forwarded. Otherwise as
    /// [`RegistryBuilder::subscription_with`]: the unsubscribe method, the limits, the
    /// transports that can carry it.
    ///
    /// The id's answer always precedes the subscription's first notification (the sink
    /// is handed over by the accept). The server does not answer the call `-32001` at
    /// its deadline: the handler answers by [`Subscribing::deadline`] (an accept after
    /// it answers `-32001` and opens nothing).
    ///
    /// ```
    /// use ringrpc::{Context, Params, Registry, Subscribing};
    ///
    /// let mut methods = Registry::builder();
    /// methods.deferred_subscription("subscribe_feed", "feed", "unsubscribe_feed",
    ///     Default::default(),
    ///     |_ctx: &Context<'_>, _p: Params<'_>, s: Subscribing| {
    ///         std::thread::spawn(move || {
    ///             // ... once the feed is known to exist:
    ///             if let Ok(sink) = s.accept() {
    ///                 while sink.send(&"news").is_ok() {
    ///                     std::thread::sleep(std::time::Duration::from_millis(100));
    ///                 }
    ///             }
    ///         });
    ///     })?;
    /// # Ok::<(), ringrpc::RegisterError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::method`], for either name.
    pub fn deferred_subscription<F>(
        &mut self,
        subscribe: &str,
        notification: &str,
        unsubscribe: &str,
        config: SubscriptionConfig,
        f: F,
    ) -> Result<&mut Self, RegisterError>
    where
        F: Fn(&Context<'_>, Params<'_>, Subscribing) + Send + Sync + 'static,
    {
        if self.methods.contains_key(unsubscribe) || subscribe == unsubscribe {
            return Err(RegisterError::Duplicate(unsubscribe.to_owned()));
        }
        let notification: Box<str> = notification.into();
        let open = move |ctx: &Context<'_>, params: Params<'_>, responder: Responder| {
            // Refused as `subscription` refuses (a call sent as a notification gets no
            // answer; the after hook sees the error).
            let sink = match open_subscription(ctx, &notification, config) {
                Ok((_, sink)) => sink,
                Err(e) => return responder.error(e),
            };
            // A panic drops the `Subscribing` while unwinding: nothing is opened, and
            // the call is answered -32603.
            f(
                ctx,
                params,
                Subscribing::new(sink, responder, ctx.deadline()),
            );
        };
        self.insert(subscribe, Handler::Deferred(Box::new(open)))?;
        if let Some(e) = self.methods.get_mut(subscribe) {
            e.untimed = true;
        }
        self.insert(unsubscribe, Handler::CallCtx(Box::new(unsubscribe_call)))
    }

    /// Has every server reactor run `a` in its loop (see [`crate::server::attach`]).
    #[cfg(feature = "proxy")]
    pub(crate) fn attach(&mut self, a: Arc<dyn Attach>) -> &mut Self {
        self.attachments.push(a);
        self
    }

    /// Freezes the methods into an immutable [`Registry`].
    pub fn freeze(self) -> Registry {
        let (mut methods, mut fallback) = (self.methods, self.fallback);
        let attachments = self.attachments;
        // Metric indices in name order: a scrape lists methods alphabetically.
        let mut names: Vec<Box<str>> = methods.keys().cloned().collect();
        names.sort_unstable();
        for (i, name) in names.iter().enumerate() {
            if let Some(e) = methods.get_mut(name) {
                e.metric = u32::try_from(i).unwrap_or(u32::MAX);
                e.dedup_name = e.dedup.then(|| crate::dedup::method_state(name));
                e.freeze();
            }
        }
        if let Some(f) = &mut fallback {
            f.metric = crate::metrics::Metrics::fallback(names.len());
            f.freeze();
        }
        Registry {
            methods,
            fallback,
            names,
            attachments,
        }
    }
}

/// The frozen method table: read-only, `Send + Sync`, looked up with one hash of the
/// method name and no locks.
pub struct Registry {
    methods: FxHashMap<Box<str>, Entry>,
    fallback: Option<Entry>,
    /// The method names in metric-index order.
    names: Vec<Box<str>>,
    attachments: Vec<Arc<dyn Attach>>,
}

impl Registry {
    /// Starts building a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// The method's entry, or the fallback's; `None`: method not found.
    #[inline]
    pub(crate) fn get(&self, name: &str) -> Option<&Entry> {
        self.methods.get(name).or(self.fallback.as_ref())
    }

    /// The method names in metric-index order.
    pub(crate) fn names(&self) -> &[Box<str>] {
        &self.names
    }

    /// What every server reactor runs in its loop.
    pub(crate) fn attachments(&self) -> &[Arc<dyn Attach>] {
        &self.attachments
    }

    /// Whether `name` is registered and marked for de-duplication.
    pub fn is_dedup(&self, name: &str) -> bool {
        self.methods.get(name).is_some_and(|e| e.dedup)
    }

    /// Whether `name` is registered as blocking.
    pub fn is_blocking(&self, name: &str) -> bool {
        self.methods.get(name).is_some_and(|e| e.blocking)
    }

    /// Whether `name` is registered (the fallback aside).
    pub fn contains(&self, name: &str) -> bool {
        self.methods.contains_key(name)
    }

    /// Number of registered methods.
    pub fn len(&self) -> usize {
        self.methods.len()
    }

    /// Whether no method is registered.
    pub fn is_empty(&self) -> bool {
        self.methods.is_empty()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.methods.keys()).finish()
    }
}

/// Opens a subscription for the subscribe call in `ctx` (the checks both kinds of
/// subscription make), or says why not: a transport that cannot carry notifications
/// (`push_unsupported`), a call sent as a notification (its id could never be known, so
/// it could never be unsubscribed; nothing is answered either way), or the
/// connection's limit reached (`subscription_limit`).
fn open_subscription<'a>(
    ctx: &Context<'a>,
    notification: &str,
    config: SubscriptionConfig,
) -> Result<(PushTo<'a>, Sink), RpcError> {
    let Some(push) = ctx.push() else {
        return Err(RpcError::new(
            Reason::PushUnsupported,
            format!(
                "Method not found: {} is a subscription, and this transport cannot \
                 carry its notifications (use WebSocket, TCP, Unix or stdio)",
                ctx.method()
            ),
        ));
    };
    if ctx.id().is_none() {
        return Err(RpcError::invalid_params(
            "a subscription needs an id: sent as a notification, none is opened",
        ));
    }
    let Some(sink) = push.open(notification, config) else {
        return Err(RpcError::new(
            Reason::SubscriptionLimit,
            format!(
                "Limit exceeded: this connection holds {} subscriptions to {} already \
                 (unsubscribe some first)",
                config.max_per_connection,
                ctx.method()
            ),
        ));
    };
    Ok((push, sink))
}

/// Every subscription's unsubscribe method: `[ID]` → whether the connection held it.
fn unsubscribe_call(
    ctx: &Context<'_>,
    params: Params<'_>,
    out: &mut ResultWriter<'_>,
) -> Result<(), RpcError> {
    let (id,): (u64,) = params.parse()?;
    let closed = ctx
        .push()
        .is_some_and(|p| p.close(id, SinkClosed::Unsubscribed));
    out.write(&closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_reserved_and_duplicate_names() {
        let mut b = Registry::builder();
        b.notification("a", |_| Ok(())).unwrap();
        assert_eq!(
            b.notification("a", |_| Ok(())).err(),
            Some(RegisterError::Duplicate("a".into()))
        );
        assert_eq!(
            b.notification("rpc.discover", |_| Ok(())).err(),
            Some(RegisterError::Reserved("rpc.discover".into()))
        );
        assert!(b.notification("rpcx", |_| Ok(())).is_ok());
        let r = b.freeze();
        assert!(r.contains("a") && r.contains("rpcx") && !r.contains("rpc.discover"));
    }
}
