//! Subscriptions: server push over a connection that can carry it (WebSocket, TCP,
//! Unix, stdio). A subscribe call answers a subscription id and hands its handler a
//! [`Sink`]; the sink pushes notifications from any thread:
//!
//! ```text
//! {"jsonrpc":"2.0","method":NOTIFICATION,"params":{"subscription":ID,"result":VALUE}}
//! ```
//!
//! ```text
//!  producer (any thread) ── Sink::send: the notification written into a buffer, queued
//!        │                   on its subscription (bounded), scheduled once
//!        ▼ PushQueue: ready subscriptions + the reactor's waker (one wake per batch)
//!  reactor ── writes queued notifications into the connection's output, framed for
//!             its transport, while the output is under the high-water mark; the rest
//!             waits in the subscription's queue until the peer reads
//! ```
//!
//! A subscription's queue is bounded: when the peer reads too slowly, the oldest
//! notifications are dropped and a `lagged` notification counts them
//! ([`Lagging::DropOldest`], the default), or the subscription is ended with an error
//! notification ([`Lagging::Close`]). Neither the producer nor the reactor ever waits.
//!
//! On stdio the loop reading stdin plays the reactor's part: it waits on stdin and the
//! queue's waker together, and writes notifications between answers. Its writes to
//! stdout block while the peer does not read; the producers still never wait.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::dispatch::responder::Responder;
use crate::error::{Reason, RpcError};
use crate::serializer::json::write_str;
use crate::serializer::response::write_error_tail;

/// Numbers subscriptions, process-wide (so an id names one subscription on a server).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Notification buffers a subscription keeps for reuse at most, and the largest kept
/// (a burst of large notifications leaves little behind).
const SPARES: usize = 16;
const SPARE_MAX: usize = 4096;

/// What a subscription does when its peer reads too slowly and its queue is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lagging {
    /// Drop the oldest notifications; before the next one delivered, a notification
    /// `{"subscription":ID,"lagged":N}` counts the `N` dropped.
    DropOldest,
    /// End the subscription: the peer gets a notification
    /// `{"subscription":ID,"error":{…}}` (code -32000, reason `lagged`), and the sink
    /// refuses further sends ([`SinkClosed::Lagged`]).
    Close,
}

/// A subscription's queue and what to do when it is full
/// ([`RegistryBuilder::subscription_with`](crate::RegistryBuilder::subscription_with)).
#[derive(Clone, Copy, Debug)]
pub struct SubscriptionConfig {
    /// Notifications queued per subscription at most while the peer does not read
    /// (default 1024).
    pub capacity: usize,
    /// When the queue is full (default [`Lagging::DropOldest`]).
    pub lagging: Lagging,
    /// Subscriptions of this method one connection may hold at once (default 1024):
    /// one more is answered `-32005` with reason `subscription_limit`.
    pub max_per_connection: usize,
}

impl Default for SubscriptionConfig {
    fn default() -> Self {
        Self {
            capacity: 1024,
            lagging: Lagging::DropOldest,
            max_per_connection: 1024,
        }
    }
}

/// Why a [`Sink`] takes no more notifications.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SinkClosed {
    /// The peer called the unsubscribe method.
    #[error("the subscription was cancelled by its client")]
    Unsubscribed,
    /// The connection closed (or the server is stopping).
    #[error("the subscription's connection closed")]
    ConnectionClosed,
    /// The peer read too slowly under [`Lagging::Close`].
    #[error("the subscription was ended: its client read too slowly")]
    Lagged,
    /// The server ended it ([`Sink::close`]).
    #[error("the subscription was ended by the server")]
    Closed,
    /// The identity that opened it is no longer authenticated (its key was revoked by
    /// a reload); found within a second, or at the connection's next call. The peer
    /// gets an error notification (-32040, reason `unauthenticated`).
    #[error("the subscription's identity lost its credentials")]
    Revoked,
    /// A deferred subscribe ([`Subscribing`]) was accepted after the call's deadline:
    /// its caller was answered `-32001` instead, and nothing was opened.
    #[error("the subscribe call was accepted after its deadline")]
    TimedOut,
}

/// Where one subscription's notifications go: a handle for the producer, `Send` and
/// `'static`, to keep on any thread. Dropping it does not end the subscription (the
/// peer unsubscribes, or its connection closes); [`Sink::close`] does.
#[derive(Clone, Debug)]
pub struct Sink {
    sub: Arc<SubState>,
}

impl Sink {
    /// The subscription's id (what the subscribe call answered).
    pub fn id(&self) -> u64 {
        self.sub.id
    }

    /// Pushes a notification whose `result` is `value` (serialized with serde).
    ///
    /// # Errors
    ///
    /// The subscription has ended; no notification is sent.
    pub fn send<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), SinkClosed> {
        self.sub.push(|out| {
            // Serializing into a Vec cannot fail on I/O; a value serde cannot represent
            // (a map with non-string keys) is sent as null.
            let at = out.len();
            if serde_json::to_writer(&mut *out, value).is_err() {
                out.truncate(at);
                out.extend_from_slice(b"null");
            }
        })
    }

    /// Pushes a notification whose `result` is `json`, which must be one JSON value
    /// (written as given: the caller vouches for it).
    ///
    /// # Errors
    ///
    /// As [`Sink::send`].
    pub fn send_raw(&self, json: &[u8]) -> Result<(), SinkClosed> {
        self.sub.push(|out| out.extend_from_slice(json))
    }

    /// As [`Sink::send_raw`], with a result shared by many subscriptions: only a
    /// reference is queued (the proxy's fan-out).
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) fn send_shared(&self, json: &bytes::Bytes) -> Result<(), SinkClosed> {
        self.sub.push_shared(json)
    }

    /// Whether the subscription has ended (and why).
    pub fn closed(&self) -> Option<SinkClosed> {
        self.sub.lock().closed
    }

    /// Ends the subscription from the server's side: no more notifications are sent
    /// (those queued are still delivered, then `{"subscription":ID,"closed":true}`).
    pub fn close(&self) {
        self.sub.end(SinkClosed::Closed);
    }

    /// Ends the subscription from the server's side with an error: after what is
    /// queued, the peer gets `{"subscription":ID,"error":{…}}` with `e`'s code, message
    /// and data, and nothing more. As [`Sink::close`] otherwise.
    pub fn close_with_error(&self, e: &RpcError) {
        let mut tail = Vec::with_capacity(128);
        write_error_tail(
            &mut tail,
            e.code(),
            format_args!("{}", e.message()),
            e.data(),
        );
        tail.push(b'}');
        self.sub
            .end_with(SinkClosed::Closed, Some(CloseNote::Error(tail.into())));
    }

    /// As [`Sink::close_with_error`], with `object`, a whole error object the caller
    /// vouches for (valid JSON, `{"code": …, "message": …}`), written as given: a proxy
    /// relaying an upstream's error notification without decoding it.
    pub fn close_with_raw_error(&self, object: &[u8]) {
        let mut tail = Vec::with_capacity(object.len() + 16);
        tail.extend_from_slice(br#""error":"#);
        tail.extend_from_slice(object);
        tail.extend_from_slice(b"}}");
        self.sub
            .end_with(SinkClosed::Closed, Some(CloseNote::Error(tail.into())));
    }

    /// Tells the peer that `n` notifications were lost here, after those already
    /// sent: a `{"subscription":ID,"lagged":N}` notification in its place among them
    /// (a proxy relaying an upstream's `lagged` count; it takes a place in the queue,
    /// and if it is dropped from a full queue its count goes into the next `lagged`).
    ///
    /// # Errors
    ///
    /// The subscription has ended.
    pub fn missed(&self, n: u64) -> Result<(), SinkClosed> {
        let mut st = self.sub.lock();
        if n == 0 {
            return st.closed.map_or(Ok(()), Err);
        }
        // Next to another count not yet sent: one notification for both.
        if st.closed.is_none() {
            if let Some(Item::Lagged(k)) = st.items.back_mut() {
                *k = k.saturating_add(n);
                return Ok(());
            }
        }
        self.sub.enqueue(st, Item::Lagged(n))
    }

    /// Runs `f` once, when the subscription ends, with the reason (at once, here, if it
    /// has ended already). A producer with nothing to send learns of an unsubscribe or
    /// a closed connection without waiting for its next [`Sink::send`] to fail.
    ///
    /// `f` runs on the thread that ends the subscription — the server's event loop for
    /// an unsubscribe call or a closed connection, a producer's for [`Sink::close`] or
    /// [`Lagging::Close`] — with no lock of the sink held: keep it short (hand the news
    /// to the producer's thread). A later `on_close` replaces an earlier one that has
    /// not run.
    pub fn on_close(&self, f: impl FnOnce(SinkClosed) + Send + 'static) {
        let mut st = self.sub.lock();
        match st.closed {
            Some(why) => {
                drop(st);
                f(why);
            }
            None => st.on_close = Some(OnClose(Box::new(f))),
        }
    }
}

/// A subscribe call answered later ([`RegistryBuilder::deferred_subscription`]): its
/// handler accepts it — the call answers the subscription's id and the [`Sink`] is
/// handed over — or rejects it with an error, from any thread, once it knows (a proxy,
/// once its upstream has answered).
///
/// The sink is not reachable before [`Subscribing::accept`], so nothing can be pushed
/// for a subscription that is then refused, and the id's answer always precedes the
/// first notification. Dropped unanswered, the call is answered `-32603` and nothing is
/// opened.
///
/// The server does not time a deferred subscribe out itself (an answer it gave at the
/// deadline could cross an accept given at the same moment, leaving a subscription its
/// caller was told had failed). The handler answers by the call's deadline
/// ([`Subscribing::deadline`]); an accept given after it answers `-32001` and opens
/// nothing ([`SinkClosed::TimedOut`]). A handler that never answers holds that
/// connection's later answers back: answer every call.
///
/// [`RegistryBuilder::deferred_subscription`]: crate::RegistryBuilder::deferred_subscription
#[must_use = "a subscribe dropped unanswered answers -32603"]
pub struct Subscribing {
    sink: Option<Sink>,
    responder: Option<Responder>,
    deadline: Option<std::time::Instant>,
}

impl std::fmt::Debug for Subscribing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscribing")
            .field("id", &self.id())
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Subscribing {
    pub(crate) fn new(
        sink: Sink,
        responder: Responder,
        deadline: Option<std::time::Instant>,
    ) -> Self {
        Self {
            sink: Some(sink),
            responder: Some(responder),
            deadline,
        }
    }

    /// The id the subscription will have if accepted.
    pub fn id(&self) -> u64 {
        self.sink.as_ref().map_or(0, Sink::id)
    }

    /// When the subscribe call must be answered by (`request_timeout`, or the caller's
    /// shorter budget); `None`: no deadline.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.deadline
    }

    /// Whether the subscription has ended already (its connection closed) — accepting
    /// it would open nothing.
    pub fn closed(&self) -> Option<SinkClosed> {
        self.sink.as_ref().and_then(Sink::closed)
    }

    /// Answers the subscribe call with the subscription's id and hands over its sink:
    /// notifications sent from now on follow the answer.
    ///
    /// # Errors
    ///
    /// The subscription has ended already (its connection closed: nothing is
    /// answered), or the call's deadline has passed: it is answered `-32001` and
    /// nothing is opened ([`SinkClosed::TimedOut`]).
    pub fn accept(mut self) -> Result<Sink, SinkClosed> {
        let (Some(sink), Some(responder)) = (self.sink.take(), self.responder.take()) else {
            return Err(SinkClosed::Closed);
        };
        if let Some(why) = sink.closed() {
            // Its connection is gone: the answer would go nowhere either.
            responder.respond_raw(itoa::Buffer::new().format(sink.id()).as_bytes());
            return Err(why);
        }
        if self
            .deadline
            .is_some_and(|at| std::time::Instant::now() >= at)
        {
            sink.sub.end(SinkClosed::TimedOut);
            responder.error(RpcError::new(
                Reason::DeadlineExceeded,
                "Request timed out: the subscription was not confirmed by the call's deadline",
            ));
            return Err(SinkClosed::TimedOut);
        }
        responder.respond_raw(itoa::Buffer::new().format(sink.id()).as_bytes());
        Ok(sink)
    }

    /// Answers the subscribe call with `e`; nothing is opened.
    pub fn reject(mut self, e: RpcError) {
        self.forget();
        if let Some(r) = self.responder.take() {
            r.error(e);
        }
    }

    /// Answers the subscribe call with `object`, a whole error object the caller
    /// vouches for (see [`Responder::relay_error`]), copied as is; nothing is opened.
    pub fn relay_error(mut self, code: i32, object: &[u8]) {
        self.forget();
        if let Some(r) = self.responder.take() {
            r.relay_error(code, object);
        }
    }

    /// Ends the subscription that was never opened (nothing is told the peer).
    fn forget(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink.sub.end(SinkClosed::Unsubscribed);
        }
    }
}

impl Drop for Subscribing {
    fn drop(&mut self) {
        // The responder, dropped after this, answers -32603.
        self.forget();
    }
}

/// A function run when a subscription ends ([`Sink::on_close`]).
struct OnClose(Box<dyn FnOnce(SinkClosed) + Send>);

impl std::fmt::Debug for OnClose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnClose")
    }
}

/// One subscription, shared by its sink, the reactor and the connection's list.
#[derive(Debug)]
pub(crate) struct SubState {
    pub(crate) id: u64,
    /// The connection it lives on (the reactor's key and generation).
    pub(crate) conn: (usize, u64),
    /// `{"jsonrpc":"2.0","method":M,"params":{"subscription":ID,` — every notification's
    /// beginning, written once.
    prefix: Box<[u8]>,
    /// Its notification method (subscriptions are counted per method).
    method: Box<str>,
    queue: Arc<PushQueue>,
    config: SubscriptionConfig,
    state: Mutex<Inner>,
}

/// How a subscription the server ended tells its peer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum CloseNote {
    /// `"error"` with reason `lagged`.
    Lagged,
    /// `"closed":true`.
    Closed,
    /// `"error"` -32040 with reason `unauthenticated`.
    Revoked,
    /// `"error":{…}`: the notification's text after its prefix, closing braces included.
    Error(Box<[u8]>),
}

/// A notification queued: whole, or (a result shared by many subscriptions, the
/// notification written around it when delivered) its `result` text alone.
#[derive(Debug)]
enum Item {
    Whole(Vec<u8>),
    Result(bytes::Bytes),
    /// `N` lost at this place ([`Sink::missed`]): a `lagged` notification.
    Lagged(u64),
}

#[derive(Debug, Default)]
struct Inner {
    /// Notifications, oldest first.
    items: VecDeque<Item>,
    /// Dropped since the last delivery (under [`Lagging::DropOldest`]).
    dropped: u64,
    /// On the reactor's ready list (or waiting for the output to drain).
    scheduled: bool,
    closed: Option<SinkClosed>,
    /// The notification that ends the subscription, still to be delivered after
    /// what is queued: its error under [`Lagging::Close`], or `closed` after
    /// [`Sink::close`].
    close_note: Option<CloseNote>,
    spare: Vec<Vec<u8>>,
    /// Run once when it ends ([`Sink::on_close`]).
    on_close: Option<OnClose>,
}

impl SubState {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(self: &Arc<Self>, result: impl FnOnce(&mut Vec<u8>)) -> Result<(), SinkClosed> {
        // The notification is written outside the lock (the reactor takes it too: a
        // slow serializer must not hold the reactor up), into a spare buffer.
        let mut out = {
            let mut st = self.lock();
            if let Some(why) = st.closed {
                return Err(why);
            }
            st.spare.pop().unwrap_or_default()
        };
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(br#""result":"#);
        result(&mut out);
        out.extend_from_slice(b"}}");
        self.enqueue(self.lock(), Item::Whole(out))
    }

    /// Queues a notification whose `result` is `json` (one JSON value, shared with other
    /// subscriptions: only a reference is queued, and the notification is written
    /// around it when delivered, into a buffer reused there). A proxy's fan-out: no
    /// copy nor allocation per subscription.
    pub(crate) fn push_shared(self: &Arc<Self>, json: &bytes::Bytes) -> Result<(), SinkClosed> {
        self.enqueue(self.lock(), Item::Result(json.clone()))
    }

    /// Queues `item` (the oldest dropped, or the subscription ended, when full).
    fn enqueue(
        self: &Arc<Self>,
        mut st: MutexGuard<'_, Inner>,
        item: Item,
    ) -> Result<(), SinkClosed> {
        if let Some(why) = st.closed {
            return Err(why);
        }
        if st.items.len() >= self.config.capacity {
            match self.config.lagging {
                Lagging::DropOldest => {
                    let lost = match st.items.pop_front() {
                        Some(Item::Whole(old)) => {
                            keep_spare(&mut st, old);
                            1
                        }
                        Some(Item::Lagged(k)) => k,
                        Some(Item::Result(_)) | None => 1,
                    };
                    st.dropped = st.dropped.saturating_add(lost);
                }
                Lagging::Close => {
                    st.closed = Some(SinkClosed::Lagged);
                    st.close_note = Some(CloseNote::Lagged);
                    self.schedule(&mut st);
                    let hook = st.on_close.take();
                    drop(st);
                    if let Some(OnClose(f)) = hook {
                        f(SinkClosed::Lagged);
                    }
                    return Err(SinkClosed::Lagged);
                }
            }
        }
        st.items.push_back(item);
        self.schedule(&mut st);
        Ok(())
    }

    /// Puts the subscription on the reactor's ready list, once.
    fn schedule(self: &Arc<Self>, st: &mut Inner) {
        if !st.scheduled {
            st.scheduled = true;
            self.queue.ready(Arc::clone(self));
        }
    }

    /// Ends the subscription (the first reason given stands). Cancelled by its client,
    /// or with its connection gone, what is still queued is dropped: nothing follows
    /// the unsubscribe call's answer. Ended by the server (`Closed`), the peer is told
    /// (`"closed":true`), after what is still queued.
    pub(crate) fn end(self: &Arc<Self>, why: SinkClosed) {
        self.end_with(why, Some(CloseNote::Closed));
    }

    /// As [`SubState::end`]; ended by the server, the peer is told with `note`.
    fn end_with(self: &Arc<Self>, why: SinkClosed, note: Option<CloseNote>) {
        let mut st = self.lock();
        let first = st.closed.is_none();
        st.closed.get_or_insert(why);
        match why {
            SinkClosed::Unsubscribed | SinkClosed::ConnectionClosed | SinkClosed::TimedOut => {
                st.items.clear();
                st.dropped = 0;
                st.close_note = None;
            }
            SinkClosed::Revoked => {
                // Nothing more for an identity that lost its credentials, but the
                // peer is told why its subscription ended.
                st.items.clear();
                st.dropped = 0;
                st.close_note = first.then_some(CloseNote::Revoked);
                if first {
                    self.schedule(&mut st);
                }
            }
            SinkClosed::Closed if first => {
                st.close_note = note;
                self.schedule(&mut st);
            }
            SinkClosed::Closed | SinkClosed::Lagged => {}
        }
        let hook = if first { st.on_close.take() } else { None };
        drop(st);
        if let Some(OnClose(f)) = hook {
            f(why);
        }
    }

    /// Whether it has ended and has nothing left to deliver.
    pub(crate) fn finished(&self) -> bool {
        let st = self.lock();
        st.closed.is_some() && st.items.is_empty() && st.close_note.is_none()
    }

    /// Writes what is queued into `out` (each notification framed by `frame`) while
    /// `room()` allows; returns whether everything was written (if not, the
    /// subscription stays scheduled: call again once the output drains).
    pub(crate) fn deliver(
        &self,
        out: &mut Vec<u8>,
        mut frame: impl FnMut(&mut Vec<u8>, &[u8]),
        room: impl Fn(&Vec<u8>) -> bool,
    ) -> bool {
        let mut st = self.lock();
        if st.dropped > 0 && room(out) {
            let mut note = st.spare.pop().unwrap_or_default();
            note.extend_from_slice(&self.prefix);
            let _ = write!(note, r#""lagged":{}}}}}"#, st.dropped);
            frame(out, &note);
            keep_spare(&mut st, note);
            st.dropped = 0;
        }
        while room(out) {
            let Some(item) = st.items.pop_front() else {
                break;
            };
            let whole = match item {
                Item::Whole(whole) => whole,
                Item::Result(json) => {
                    let mut whole = st.spare.pop().unwrap_or_default();
                    whole.extend_from_slice(&self.prefix);
                    whole.extend_from_slice(br#""result":"#);
                    whole.extend_from_slice(&json);
                    whole.extend_from_slice(b"}}");
                    whole
                }
                Item::Lagged(n) => {
                    let mut whole = st.spare.pop().unwrap_or_default();
                    whole.extend_from_slice(&self.prefix);
                    let _ = write!(whole, r#""lagged":{n}}}}}"#);
                    whole
                }
            };
            frame(out, &whole);
            keep_spare(&mut st, whole);
        }
        if st.items.is_empty() && st.close_note.is_some() && room(out) {
            let mut note = Vec::with_capacity(self.prefix.len() + 200);
            note.extend_from_slice(&self.prefix);
            match st.close_note.take() {
                Some(CloseNote::Lagged) => note.extend_from_slice(
                    br#""error":{"code":-32000,"message":"Server busy: the subscription was ended, its client reads too slowly","data":{"reason":"lagged"}}}}"#,
                ),
                Some(CloseNote::Revoked) => note.extend_from_slice(
                    br#""error":{"code":-32040,"message":"Unauthenticated: the subscription's credentials were revoked","data":{"reason":"unauthenticated"}}}}"#,
                ),
                Some(CloseNote::Error(tail)) => note.extend_from_slice(&tail),
                _ => note.extend_from_slice(br#""closed":true}}"#),
            }
            frame(out, &note);
        }
        let done = st.items.is_empty() && st.close_note.is_none() && st.dropped == 0;
        st.scheduled = !done;
        done
    }
}

fn keep_spare(st: &mut Inner, mut buf: Vec<u8>) {
    if st.spare.len() < SPARES && buf.capacity() <= SPARE_MAX {
        buf.clear();
        st.spare.push(buf);
    }
}

/// A reactor's subscriptions with notifications to deliver, and its waker.
#[derive(Debug)]
pub(crate) struct PushQueue {
    ready: Mutex<Vec<Arc<SubState>>>,
    /// Set by the first subscription scheduled since the reactor last looked.
    woken: AtomicBool,
    waker: Arc<mio::Waker>,
}

impl PushQueue {
    /// A queue waking `waker`.
    pub(crate) fn new(waker: Arc<mio::Waker>) -> Arc<Self> {
        Arc::new(Self {
            ready: Mutex::new(Vec::new()),
            woken: AtomicBool::new(false),
            waker,
        })
    }

    fn ready(&self, sub: Arc<SubState>) {
        self.ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(sub);
        if !self.woken.swap(true, Ordering::AcqRel) {
            let _ = self.waker.wake();
        }
    }

    /// Swaps the ready list into `into` (empty, reused) and clears the wake-up flag.
    pub(crate) fn take(&self, into: &mut Vec<Arc<SubState>>) {
        self.woken.store(false, Ordering::Release);
        std::mem::swap(
            &mut *self
                .ready
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            into,
        );
    }
}

/// A connection that can carry notifications, as its calls' [`Source`] sees it: the
/// reactor's queue, the connection's key, and its subscriptions.
///
/// [`Source`]: crate::dispatch::context::Source
#[derive(Clone, Copy, Debug)]
pub(crate) struct PushTo<'a> {
    pub(crate) queue: &'a Arc<PushQueue>,
    pub(crate) conn: (usize, u64),
    pub(crate) subs: &'a RefCell<Vec<Arc<SubState>>>,
}

impl PushTo<'_> {
    /// Opens a subscription whose notifications are calls to `method`; `None` if the
    /// connection holds `config.max_per_connection` of them already.
    pub(crate) fn open(&self, method: &str, config: SubscriptionConfig) -> Option<Sink> {
        {
            let mut subs = self.subs.borrow_mut();
            // Subscriptions ended by their producer are forgotten here, not one by one.
            subs.retain(|s| !s.finished());
            let held = subs.iter().filter(|s| *s.method == *method).count();
            if held >= config.max_per_connection {
                return None;
            }
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let mut prefix = Vec::with_capacity(method.len() + 64);
        prefix.extend_from_slice(br#"{"jsonrpc":"2.0","method":"#);
        write_str(&mut prefix, method);
        prefix.extend_from_slice(br#","params":{"subscription":"#);
        prefix.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
        prefix.push(b',');
        let sub = Arc::new(SubState {
            id,
            conn: self.conn,
            prefix: prefix.into(),
            method: method.into(),
            queue: Arc::clone(self.queue),
            config: SubscriptionConfig {
                capacity: config.capacity.max(1),
                ..config
            },
            state: Mutex::new(Inner::default()),
        });
        self.subs.borrow_mut().push(Arc::clone(&sub));
        Some(Sink { sub })
    }

    /// Ends every subscription of this connection.
    pub(crate) fn close_all(&self, why: SinkClosed) {
        // Taken out first: an `on_close` hook runs with the list not borrowed.
        let subs = std::mem::take(&mut *self.subs.borrow_mut());
        for sub in subs {
            sub.end(why);
        }
    }

    /// Ends subscription `id` of this connection; whether it was one.
    pub(crate) fn close(&self, id: u64, why: SinkClosed) -> bool {
        let mut subs = self.subs.borrow_mut();
        match subs.iter().position(|s| s.id == id) {
            Some(i) => {
                let sub = subs.swap_remove(i);
                drop(subs);
                // A deferred subscribe refused (or accepted too late) was never the
                // peer's: it is forgotten here, and was not open.
                let opened = !matches!(
                    sub.lock().closed,
                    Some(SinkClosed::Unsubscribed | SinkClosed::TimedOut)
                );
                sub.end(why);
                opened
            }
            None => false,
        }
    }
}
