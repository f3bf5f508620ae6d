//! Subscriptions forwarded upstream, shared: every local subscription with the same
//! canonical subscribe call (method and params, as `share::write_key` writes them) is
//! served by one upstream subscription on one upstream connection (a lane, shared with
//! calls).
//!
//! ```text
//!  client ── subscribe (a deferred subscription: its handler gets a `Subscribing`)
//!    │ reactor, table locked: the call's canonical key
//!    │   an upstream subscription with that key is live → accepted at once, its Sink kept
//!    │   one is being opened → waits for its answer
//!    │   none → the subscribe goes upstream under a private id (Reply::Sub), opening
//!    ▼
//!  upstream thread ── its answer: every waiter accepted (or given the upstream's error
//!    as it came); a notification {"subscription":UPID,"result":R} → R's bytes to every
//!    local Sink (each its own bounded queue); a local subscription ended (Sink::on_close
//!    → `closed`, a wake) and it was the last → unsubscribe upstream; the connection lost
//!    → every local subscription on it ends with an error (`upstream_unavailable`)
//! ```
//!
//! Lock order: the table, then a lane's queue, then a sink's own lock. A sink's close
//! hook takes only `closed` (it may run inside a send, with the table held).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use simd_json::{Node, StaticNode};
use slab::Slab;

use super::lane::{Deadline, Reply, MAX_CALLS};
use super::share::{write_key, Answer};
use super::{later, write_tail, Shared};
use crate::codec::raw::RawCtx;
use crate::codec::tape::members;
use crate::codec::Params;
use crate::dispatch::subscription::{Sink, Subscribing, SubscriptionConfig};
use crate::error::{Reason, RpcError};
use crate::serializer::json::write_str;

/// A subscription the proxy forwards (`--subscription SUBSCRIBE:NOTIFICATION:UNSUBSCRIBE`).
#[derive(Clone, Debug)]
pub(crate) struct Kind {
    pub(crate) subscribe: Box<str>,
    pub(crate) notification: Box<str>,
    pub(crate) unsubscribe: Box<str>,
    /// The group its subscribe method routes to (an index into the proxy's groups).
    pub(crate) group: usize,
}

/// Timed-out subscribe calls remembered at most, so that an answer coming after all is
/// unsubscribed upstream instead of leaving a subscription nobody reads.
const MAX_ORPHANS: usize = 1024;

/// The proxy's subscriptions.
pub(crate) struct Subs {
    pub(crate) kinds: Vec<Kind>,
    /// Each local subscription's queue and lag policy.
    pub(crate) config: SubscriptionConfig,
    table: Mutex<Table>,
    /// Entries (slab key, uid) one of whose local subscriptions ended.
    closed: Mutex<Vec<(usize, u64)>>,
    has_closed: AtomicBool,
    /// Subscribe calls waiting for an upstream's answer (the sweep skips the table when
    /// there are none).
    waiting: AtomicUsize,
    /// Entries in `Table::orphans`.
    orphans: AtomicUsize,
    /// The proxy, for the close hooks (which must not keep it alive).
    me: Weak<Shared>,
    /// Notifications read from upstreams for a live subscription.
    pub(crate) received: AtomicU64,
    /// Their copies given to local subscriptions.
    pub(crate) delivered: AtomicU64,
}

struct Table {
    /// Canonical subscribe call → entry.
    by_key: HashMap<Arc<[u8]>, usize>,
    entries: Slab<Entry>,
    /// Per lane: the notification method, a 0xff byte and the upstream's subscription
    /// id (its JSON text) → the live entry.
    by_upstream: Vec<HashMap<Box<[u8]>, usize>>,
    orphans: VecDeque<Orphan>,
    next_uid: u64,
    /// Reused for looking up `by_upstream`.
    probe: Vec<u8>,
    /// Where notifications' results are copied once, to be shared by every client
    /// subscription they go to (see [`share`]).
    pool: BytesMut,
}

/// One upstream subscription and the local ones it serves.
struct Entry {
    /// Tells this entry from a later one in the same slab slot.
    uid: u64,
    key: Arc<[u8]>,
    kind: usize,
    lane: usize,
    state: State,
}

enum State {
    /// The subscribe is upstream under private id `id`; `waiters` wait for its answer.
    Opening { id: u64, waiters: Vec<Subscribing> },
    /// Live upstream, serving `sinks`. `note` is its `by_upstream` key: the
    /// notification method, 0xff, then from `id_at` on the upstream's subscription id
    /// (its JSON text).
    Open {
        note: Box<[u8]>,
        id_at: usize,
        sinks: Vec<Sink>,
    },
}

impl State {
    /// An open subscription's upstream id.
    fn upstream_id(&self) -> &[u8] {
        match self {
            Self::Open { note, id_at, .. } => note.get(*id_at..).unwrap_or_default(),
            Self::Opening { .. } => &[],
        }
    }
}

/// A subscribe call that timed out: its answer may still come.
struct Orphan {
    lane: usize,
    id: u64,
    kind: usize,
}

/// What an upstream's notification says.
enum Note<'a> {
    Result(&'a [u8]),
    Lagged(u64),
    Error(&'a [u8]),
    Closed,
}

impl Table {
    /// Forgets entry `e` (and its keys).
    fn remove(&mut self, e: usize) -> Option<Entry> {
        let en = self.entries.try_remove(e)?;
        if self.by_key.get(&en.key) == Some(&e) {
            self.by_key.remove(&en.key);
        }
        if let State::Open { note, .. } = &en.state {
            if let Some(map) = self.by_upstream.get_mut(en.lane) {
                if map.get(note) == Some(&e) {
                    map.remove(note);
                }
            }
        }
        Some(en)
    }
}

/// Bytes of the result pool taken at a time.
const POOL: usize = 64 * 1024;

/// A copy of `text` every client subscription can hold a reference to. Results are
/// copied one after another into `pool`'s buffer, which is used again from its start
/// once every result in it has been delivered (or dropped): in steady state no
/// allocation per notification, only one per `POOL` bytes held by slow clients'
/// queues. Large results get a buffer of their own.
fn share(pool: &mut BytesMut, text: &[u8]) -> Bytes {
    if text.len() > POOL / 4 {
        return Bytes::copy_from_slice(text);
    }
    if pool.capacity() - pool.len() < text.len() {
        // Reclaims the buffer if nothing in it is still referenced.
        pool.reserve(POOL);
    }
    pool.extend_from_slice(text);
    pool.split().freeze()
}

/// The `by_upstream` key of a subscription: its notification method, 0xff, its id.
fn upstream_key(out: &mut Vec<u8>, notification: &str, id: &[u8]) {
    out.clear();
    out.extend_from_slice(notification.as_bytes());
    out.push(0xff);
    out.extend_from_slice(id);
}

impl Subs {
    pub(crate) fn new(
        kinds: Vec<Kind>,
        config: SubscriptionConfig,
        lanes: usize,
        me: Weak<Shared>,
    ) -> Self {
        Self {
            kinds,
            config,
            table: Mutex::new(Table {
                by_key: HashMap::new(),
                entries: Slab::new(),
                by_upstream: vec![HashMap::new(); lanes],
                orphans: VecDeque::new(),
                next_uid: 1,
                probe: Vec::new(),
                pool: BytesMut::new(),
            }),
            closed: Mutex::new(Vec::new()),
            has_closed: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            orphans: AtomicUsize::new(0),
            me,
            received: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A client's subscribe call of kind `k` (on its reactor): joins the live upstream
    /// subscription with the same canonical call, or the one being opened, or opens one.
    pub(crate) fn subscribe(&self, shared: &Shared, k: usize, params: &Params<'_>, s: Subscribing) {
        let Some(kind) = self.kinds.get(k) else {
            return s.reject(RpcError::new(
                Reason::InternalError,
                "Internal error: no such subscription",
            ));
        };
        let mut key = Vec::with_capacity(64);
        write_key(
            &mut key,
            &kind.subscribe,
            params.nodes(),
            Some(params.raw()),
        );
        let mut t = self.lock();
        if let Some(&e) = t.by_key.get(key.as_slice()) {
            let en = &mut t.entries[e];
            match &mut en.state {
                State::Open { sinks, .. } => {
                    if let Ok(sink) = s.accept() {
                        self.watch(&sink, e, en.uid);
                        sinks.push(sink);
                    }
                }
                State::Opening { waiters, .. } => {
                    waiters.push(s);
                    self.waiting.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        let group = &shared.groups[kind.group];
        let Some(i) = shared.pick(group, None) else {
            drop(t);
            return s.reject(RpcError::new(
                Reason::UpstreamUnavailable,
                format!(
                    "Server busy: no upstream of group `{}` is reachable",
                    group.name
                ),
            ));
        };
        let lane = &shared.lanes[i];
        let e = t.entries.vacant_key();
        let uid = t.next_uid;
        t.next_uid += 1;
        let id = {
            let mut q = lane.lock();
            if q.calls.len() >= MAX_CALLS {
                drop(q);
                drop(t);
                return s.reject(RpcError::new(
                    Reason::ServerBusy,
                    "Server busy: too many calls in flight on the upstream connection",
                ));
            }
            let id = q.next_id();
            q.request(None, Some(id), |out| {
                write_tail(out, &kind.subscribe, params)
            });
            let now = Instant::now();
            let deadline = Deadline {
                at: later(now, shared.timeout),
                callers: false,
            };
            q.park(
                id,
                (now, deadline),
                Reply::Sub { entry: e, uid },
                (None, false),
            );
            lane.outstanding.fetch_add(1, Ordering::Relaxed);
            lane.has_out.store(true, Ordering::SeqCst);
            id
        };
        let key: Arc<[u8]> = key.into();
        t.by_key.insert(Arc::clone(&key), e);
        t.entries.insert(Entry {
            uid,
            key,
            kind: k,
            lane: i,
            state: State::Opening {
                id,
                waiters: vec![s],
            },
        });
        self.waiting.fetch_add(1, Ordering::Relaxed);
        drop(t);
        shared.wake();
    }

    /// Has the upstream thread told when `sink` (of entry `e`, `uid`) ends.
    fn watch(&self, sink: &Sink, e: usize, uid: u64) {
        let me = Weak::clone(&self.me);
        sink.on_close(move |_| {
            if let Some(shared) = me.upgrade() {
                shared.subs.ended(e, uid);
                shared.wake();
            }
        });
    }

    /// A local subscription of entry `e` ended (any thread; takes only `closed`).
    fn ended(&self, e: usize, uid: u64) {
        self.closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((e, uid));
        self.has_closed.store(true, Ordering::Release);
    }

    /// The upstream's answer to the subscribe of entry `e` (upstream thread).
    pub(crate) fn answered(&self, shared: &Shared, e: usize, uid: u64, answer: &Answer<'_>) {
        let mut t = self.lock();
        let (lane, k, id, waiters) = {
            let Some(en) = t.entries.get_mut(e).filter(|en| en.uid == uid) else {
                return;
            };
            let State::Opening { id, waiters } = &mut en.state else {
                return;
            };
            (en.lane, en.kind, *id, std::mem::take(waiters))
        };
        self.waiting.fetch_sub(waiters.len(), Ordering::Relaxed);
        let kind = &self.kinds[k];
        match answer {
            Answer::Result(text) => {
                let mut sinks = Vec::with_capacity(waiters.len());
                for w in waiters {
                    if let Ok(sink) = w.accept() {
                        self.watch(&sink, e, uid);
                        sinks.push(sink);
                    }
                }
                if sinks.is_empty() {
                    // Everyone who asked went away meanwhile.
                    t.remove(e);
                    return unsubscribe(shared, lane, &kind.unsubscribe, text);
                }
                let mut note = Vec::with_capacity(kind.notification.len() + 1 + text.len());
                upstream_key(&mut note, &kind.notification, text);
                let note: Box<[u8]> = note.into();
                if t.by_upstream[lane].insert(note.clone(), e).is_some() {
                    tracing::warn!(
                        "proxy: upstream {} gave subscription id {} twice; the older one \
                         gets no more notifications",
                        shared.upstreams[shared.lanes[lane].upstream].url,
                        String::from_utf8_lossy(text)
                    );
                }
                t.entries[e].state = State::Open {
                    note,
                    id_at: kind.notification.len() + 1,
                    sinks,
                };
            }
            Answer::Relayed(code, object) => {
                t.remove(e);
                drop(t);
                for w in waiters {
                    w.relay_error(*code, object);
                }
            }
            Answer::Error(err) => {
                t.remove(e);
                // A timeout's answer may still come: it is unsubscribed if it does.
                if t.orphans.len() >= MAX_ORPHANS {
                    t.orphans.pop_front();
                } else {
                    self.orphans.fetch_add(1, Ordering::Relaxed);
                }
                t.orphans.push_back(Orphan { lane, id, kind: k });
                drop(t);
                for w in waiters {
                    w.reject((*err).clone());
                }
            }
        }
    }

    /// An answer on lane `lane` for private id `id`, which no call waits for: if it is
    /// a timed-out subscribe's success, that subscription is unsubscribed.
    pub(crate) fn late<'a>(
        &self,
        shared: &Shared,
        lane: usize,
        id: u64,
        result: impl FnOnce() -> Option<&'a [u8]>,
    ) {
        if self.orphans.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut t = self.lock();
        let Some(at) = t.orphans.iter().position(|o| o.lane == lane && o.id == id) else {
            return;
        };
        let Some(o) = t.orphans.remove(at) else {
            return;
        };
        self.orphans.fetch_sub(1, Ordering::Relaxed);
        if let Some(text) = result() {
            unsubscribe(shared, lane, &self.kinds[o.kind].unsubscribe, text);
        }
    }

    /// A notification read on lane `lane` (upstream thread): its result goes to every
    /// local subscription of the upstream subscription it names.
    pub(crate) fn notify(&self, shared: &Shared, lane: usize, raw: RawCtx<'_>, nodes: &[Node<'_>]) {
        let mut method = None;
        let mut params = None;
        for (k, v) in members(nodes).filter_map(Result::ok) {
            match (k, v.first()) {
                ("method", Some(Node::String(m))) => method = Some(*m),
                ("params", _) => params = Some(v),
                _ => {}
            }
        }
        let (Some(method), Some(params)) = (method, params) else {
            return;
        };
        let mut sub = None;
        let mut note = None;
        for (k, v) in members(params).filter_map(Result::ok) {
            match k {
                "subscription" => sub = raw.value_text(v),
                "result" => note = raw.value_text(v).map(Note::Result),
                "lagged" => {
                    if let Some(Node::Static(StaticNode::U64(n))) = v.first() {
                        note = Some(Note::Lagged(*n));
                    }
                }
                "error" => note = raw.value_text(v).map(Note::Error),
                "closed" => note = Some(Note::Closed),
                _ => {}
            }
        }
        let (Some(sub), Some(note)) = (sub, note) else {
            tracing::debug!("proxy: an upstream sent a notification of no subscription; dropped");
            return;
        };
        let mut t = self.lock();
        let mut probe = std::mem::take(&mut t.probe);
        upstream_key(&mut probe, method, sub);
        let found = t
            .by_upstream
            .get(lane)
            .and_then(|m| m.get(probe.as_slice()));
        let Some(&e) = found else {
            // Not a live subscription (one unsubscribed a moment ago): dropped.
            t.probe = probe;
            return;
        };
        t.probe = probe;
        // What is left to do once the entry is no longer borrowed: forget it, and
        // unsubscribe it upstream (an upstream that ended it needs no unsubscribe).
        let shared_text = match note {
            Note::Result(text) => Some(share(&mut t.pool, text)),
            _ => None,
        };
        let (forget, unsubscribe_id) = {
            let Some(en) = t.entries.get_mut(e) else {
                return;
            };
            let state = &mut en.state;
            let State::Open { sinks, .. } = state else {
                return;
            };
            match note {
                Note::Result(_) => {
                    self.received.fetch_add(1, Ordering::Relaxed);
                    let mut gone = false;
                    if let Some(text) = &shared_text {
                        for s in sinks.iter() {
                            gone |= s.send_shared(text).is_err();
                        }
                    }
                    self.delivered
                        .fetch_add(sinks.len() as u64, Ordering::Relaxed);
                    if gone {
                        sinks.retain(|s| s.closed().is_none());
                    }
                    let last = sinks.is_empty();
                    (last, last.then(|| state.upstream_id().to_vec()))
                }
                Note::Lagged(n) => {
                    for s in sinks.iter() {
                        let _ = s.missed(n);
                    }
                    (false, None)
                }
                Note::Error(object) => {
                    // The upstream ended it: so does every local one, with its error.
                    for s in sinks.iter() {
                        s.close_with_raw_error(object);
                    }
                    (true, None)
                }
                Note::Closed => {
                    for s in sinks.iter() {
                        s.close();
                    }
                    (true, None)
                }
            }
        };
        if forget {
            if let Some(en) = t.remove(e) {
                if let Some(upstream_id) = unsubscribe_id {
                    unsubscribe(shared, lane, &self.kinds[en.kind].unsubscribe, &upstream_id);
                }
            }
        }
    }

    /// Forgets the local subscriptions that ended; an upstream subscription left with
    /// none is unsubscribed (upstream thread, each turn).
    pub(crate) fn reap(&self, shared: &Shared) {
        if !self.has_closed.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut list = std::mem::take(
            &mut *self
                .closed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        list.sort_unstable();
        list.dedup();
        let mut t = self.lock();
        for (e, uid) in list {
            let Some(en) = t.entries.get_mut(e).filter(|en| en.uid == uid) else {
                continue;
            };
            let State::Open { sinks, .. } = &mut en.state else {
                continue;
            };
            sinks.retain(|s| s.closed().is_none());
            if sinks.is_empty() {
                if let Some(en) = t.remove(e) {
                    let method = &self.kinds[en.kind].unsubscribe;
                    unsubscribe(shared, en.lane, method, en.state.upstream_id());
                }
            }
        }
    }

    /// Lane `lane`'s connection is gone (`why`): every local subscription it served
    /// ends with an error notification; nothing is resubscribed (a client could miss
    /// notifications without knowing).
    pub(crate) fn lost(&self, lane: usize, why: &str) {
        let mut t = self.lock();
        t.orphans.retain(|o| o.lane != lane);
        self.orphans.store(t.orphans.len(), Ordering::Relaxed);
        let Some(map) = t.by_upstream.get_mut(lane) else {
            return;
        };
        if map.is_empty() {
            return;
        }
        let live: Vec<usize> = map.drain().map(|(_, e)| e).collect();
        let err = RpcError::new(
            Reason::UpstreamUnavailable,
            format!("Server busy: {why}; the subscription ended (subscribe again)"),
        );
        for e in live {
            if let Some(Entry {
                state: State::Open { sinks, .. },
                ..
            }) = t.remove(e)
            {
                for s in sinks {
                    s.close_with_error(&err);
                }
            }
        }
    }

    /// Answers the waiting subscribe calls whose deadline has passed by `now`
    /// (upstream thread, each tick).
    pub(crate) fn sweep(&self, now: Instant) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut expired = Vec::new();
        let mut t = self.lock();
        for (_, en) in t.entries.iter_mut() {
            let State::Opening { waiters, .. } = &mut en.state else {
                continue;
            };
            let mut i = 0;
            while i < waiters.len() {
                if waiters[i].deadline().is_some_and(|at| at <= now) {
                    expired.push(waiters.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        drop(t);
        self.waiting.fetch_sub(expired.len(), Ordering::Relaxed);
        for w in expired {
            w.reject(RpcError::new(
                Reason::UpstreamTimeout,
                "Request timed out: the upstream did not answer the subscribe within the \
                 call's deadline",
            ));
        }
    }

    /// Writes the subscription metrics.
    pub(crate) fn render(&self, shared: &Shared, out: &mut String) {
        use std::fmt::Write as _;
        let mut open = vec![0usize; shared.upstreams.len()];
        let mut local = 0usize;
        {
            let t = self.lock();
            for (_, en) in &t.entries {
                match &en.state {
                    State::Open { sinks, .. } => {
                        if let Some(n) = open.get_mut(shared.lanes[en.lane].upstream) {
                            *n += 1;
                        }
                        local += sinks.len();
                    }
                    State::Opening { waiters, .. } => local += waiters.len(),
                }
            }
        }
        out.push_str(
            "# HELP ringrpc_proxy_subscriptions Upstream subscriptions open, by upstream (each serves every client subscription with the same call).\n\
             # TYPE ringrpc_proxy_subscriptions gauge\n",
        );
        for (u, n) in open.iter().enumerate() {
            let url = shared.upstreams[u]
                .url
                .replace('\\', "\\\\")
                .replace('"', "\\\"");
            let _ = writeln!(out, "ringrpc_proxy_subscriptions{{upstream=\"{url}\"}} {n}");
        }
        let _ = write!(
            out,
            "# HELP ringrpc_proxy_subscribers Client subscriptions served by upstream subscriptions (or waiting for one).\n\
             # TYPE ringrpc_proxy_subscribers gauge\n\
             ringrpc_proxy_subscribers {local}\n\
             # HELP ringrpc_proxy_notifications_total Notifications read from upstreams for a live subscription.\n\
             # TYPE ringrpc_proxy_notifications_total counter\n\
             ringrpc_proxy_notifications_total {}\n\
             # HELP ringrpc_proxy_notifications_delivered_total Their copies queued for client subscriptions.\n\
             # TYPE ringrpc_proxy_notifications_delivered_total counter\n\
             ringrpc_proxy_notifications_delivered_total {}\n",
            self.received.load(Ordering::Relaxed),
            self.delivered.load(Ordering::Relaxed),
        );
    }
}

/// Writes an unsubscribe of upstream subscription `upstream_id` on lane `lane`. Its
/// answer comes for no call and is dropped.
fn unsubscribe(shared: &Shared, lane: usize, method: &str, upstream_id: &[u8]) {
    let lane = &shared.lanes[lane];
    {
        let mut q = lane.lock();
        let id = q.next_id();
        q.request(None, Some(id), |out| {
            out.extend_from_slice(br#""method":"#);
            write_str(out, method);
            out.extend_from_slice(br#","params":["#);
            out.extend_from_slice(upstream_id);
            out.extend_from_slice(b"]}\n");
        });
        lane.has_out.store(true, Ordering::SeqCst);
    }
    shared.wake();
}
