//! Calls answered later: the one owner of their life cycle on a reactor.
//!
//! ```text
//!  frame ──Engine::handle_split(…, Sink)──▶ inline answers written at once
//!                 │ blocking call: Elem{Pool(range)}      deferred method: Elem{Responder}
//!                 ▼                                        │ handler gets a Responder
//!          Slot{elements, deadline, batch array so far}    │ (Tag: conn, slot, element)
//!                 │ submit: Job → pool (≤ batch_concurrency) │
//!                 ▼                                        ▼
//!          worker: Engine::handle ──▶ ReplyTo::complete(tag, answer) ◀── Responder::respond
//!                                        │ channel + one wake per batch of completions
//!                                        ▼
//!          reactor: complete() puts each answer into its slot (BatchWriter: commas,
//!          -32002 budget); expire() answers -32001 at the deadline; a late answer is
//!          dropped; when no element is left, finish() frames the slot for its transport
//! ```
//!
//! A slot is one request frame whose answer is not complete yet; the connection keeps
//! its slots in request order ([`super::conn::Conn::slots`]) and releases each once it
//! is ready and every earlier one has gone.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::pool::{Job, Pool};
use super::scrape::{self, Refused, Scraper};
use crate::codec::Id;
use crate::config::ServerConfig;
use crate::dedup::Digest;
use crate::dispatch::context::{Connection, Transport};
use crate::dispatch::hooks::{Answered, Hooks};
use crate::dispatch::responder::{Complete, Responder, Tag};
use crate::engine::{Deferrals, Engine, OwnedId, Split};
use crate::error::{ErrorCode, Reason};
use crate::guard::rate::Limited;
use crate::metrics::{Event, Inflight, Local};
use crate::serializer::batch::{BatchWriter, Late};
use crate::serializer::response::write_error;
use crate::trace::Trace;
use crate::transport::http::{self, Reply, ServerHeaders};
use crate::transport::websocket;

/// Buffers kept for answers given later (pool and responders), per reactor.
const SPARE_ANSWERS: usize = 1024;

/// Completions queued for a reactor before further ones go to the overflow list. The
/// queue is a fixed array (crossbeam's bounded channel), so a completion allocates
/// nothing; an unbounded channel would allocate a block every 31 messages.
const COMPLETIONS: usize = 4096;

/// A finished call: its answer (a response object; empty for a notification) and the
/// answer's error code (`None`: a result).
pub(crate) struct Done {
    pub(crate) tag: Tag,
    pub(crate) reply: Vec<u8>,
    pub(crate) code: Option<i32>,
}

/// Where answers given later go back to: a reactor's completion queue and its waker.
pub(crate) struct ReplyTo {
    done: Sender<Done>,
    /// Completions that found the queue full: they wait here, so a completing thread
    /// never blocks (it may be an async runtime's worker).
    overflow: Mutex<Vec<Done>>,
    /// Whether `overflow` may hold something (read without taking its lock).
    overflowed: AtomicBool,
    waker: Arc<mio::Waker>,
    /// Set by the first completion since the reactor last drained the queue: later ones
    /// do not wake it again (one wake-up per batch of completions).
    woken: AtomicBool,
    /// Answer buffers given back by the reactor, for the next answers.
    spare: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
}

impl ReplyTo {
    /// A queue waking `waker`; the receiving end for the reactor.
    pub(crate) fn new(waker: Arc<mio::Waker>) -> (Arc<Self>, Receiver<Done>) {
        let (done, rx) = crossbeam_channel::bounded(COMPLETIONS);
        let reply_to = Self {
            done,
            overflow: Mutex::new(Vec::new()),
            overflowed: AtomicBool::new(false),
            waker,
            woken: AtomicBool::new(false),
            spare: crossbeam_channel::bounded(SPARE_ANSWERS),
        };
        (Arc::new(reply_to), rx)
    }

    /// Gives an answer's buffer back for reuse.
    fn recycle(&self, mut buf: Vec<u8>) {
        if buf.capacity() > 0 && buf.capacity() <= 64 * 1024 {
            buf.clear();
            let _ = self.spare.0.try_send(buf);
        }
    }
}

impl Complete for ReplyTo {
    fn buffer(&self) -> Vec<u8> {
        self.spare.1.try_recv().unwrap_or_default()
    }

    fn complete(&self, tag: Tag, reply: Vec<u8>, code: Option<i32>) {
        // A reactor that is gone no longer wants the answer.
        let done = Done { tag, reply, code };
        let queued = match self.done.try_send(done) {
            Ok(()) => true,
            Err(TrySendError::Full(done)) => {
                self.overflow
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(done);
                self.overflowed.store(true, Ordering::Release);
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        };
        if queued && !self.woken.swap(true, Ordering::AcqRel) {
            let _ = self.waker.wake();
        }
    }
}

/// What an element of a slot is waiting for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Work {
    /// A blocking call: its bytes in the slot's frame, for the pool, and its
    /// de-duplication key (claimed on the worker).
    Pool(Range<usize>, Option<Digest>),
    /// A deferred method's call (this many bytes in the frame): its responder answers.
    Responder(usize),
    /// `GET /metrics` (`head`: a `HEAD` request): the slot's one element, rendered by
    /// the [`Scraper`]'s thread. Not a call: nothing is counted, logged or hooked.
    Scrape { head: bool },
}

/// A call of a slot answered later.
pub(crate) struct Elem {
    pub(crate) work: Work,
    /// `None` for a notification.
    pub(crate) id: Option<OwnedId>,
    pub(crate) state: ElemState,
    /// The method, kept for the after hook (only when hooks are set).
    method: Option<Box<str>>,
    /// The method's metric index.
    metric: u32,
    /// When it is answered `-32001` if not answered: the earlier of `request_timeout`
    /// and the caller's budget.
    deadline: Option<Instant>,
    /// A batch element's place: its offset in the array written inline.
    at: u32,
    /// A batch element's answer, once given: its range in the slot's `late`.
    answer: Range<u32>,
    /// The call's own trace (`params._meta.traceparent`), if not the frame's: what its
    /// access-log line names.
    trace: Option<crate::trace::TraceId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ElemState {
    /// Waiting for a place on the pool (`batch_concurrency`).
    Queued,
    /// On the pool, or with its responder.
    Running,
    Done,
}

/// An answer the connection owes, in request order. Either ready (its final bytes, framed
/// for the transport, are in `buf`) or waiting for elements answered later.
pub(crate) struct Slot {
    pub(crate) id: u64,
    pub(crate) ready: bool,
    /// HTTP: how to head this answer (keep-alive, CORS origin); `None` on line transports.
    pub(crate) http: Option<Reply>,
    /// A batch's array, open, while elements are pending; `None` for a single call.
    batch: Option<BatchWriter>,
    /// Ready: the framed bytes. Waiting: the JSON so far (a batch's array, unclosed,
    /// with the answers written inline).
    pub(crate) buf: Vec<u8>,
    /// A batch's answers given later, each put in its element's place at the end.
    late: Vec<u8>,
    /// The request's bytes, for pool jobs (empty when none go to the pool).
    frame: Bytes,
    elems: Vec<Elem>,
    /// Elements not yet done.
    remaining: usize,
    /// Elements on the pool now.
    on_pool: usize,
    /// When the frame was handled (for the after hook's durations).
    started: Instant,
    /// The connection, for pool jobs' contexts.
    conn: Connection,
    /// Its elements still in flight, for the metrics (given up if the slot is dropped).
    inflight: Option<Inflight>,
    /// The frame's trace: its pool calls' contexts see it, its HTTP answer names it.
    trace: Option<Trace>,
    /// The caller's identity, for the access log (only when it is on).
    identity: Option<Arc<str>>,
    /// The connection's key and generation, to submit queued elements when some expire.
    key: usize,
    generation: u64,
    /// Timers set for this slot (one per distinct deadline of its calls).
    timers: u32,
}

impl Slot {
    /// A slot whose final bytes are already known.
    pub(crate) fn ready(id: u64, buf: Vec<u8>) -> Self {
        Self {
            ready: true,
            buf,
            ..Self::blank(id)
        }
    }

    /// Slot `id` with nothing in it yet: not ready, no elements, no buffers.
    fn blank(id: u64) -> Self {
        Self {
            id,
            ready: false,
            http: None,
            batch: None,
            buf: Vec::new(),
            late: Vec::new(),
            frame: Bytes::new(),
            elems: Vec::new(),
            remaining: 0,
            on_pool: 0,
            started: Instant::now(),
            conn: Connection::EMBEDDED,
            inflight: None,
            trace: None,
            identity: None,
            key: 0,
            generation: 0,
            timers: 0,
        }
    }

    /// Adds element `i`'s answer: a batch's is kept for its place in the array.
    /// Returns the code and length of what was written instead when a batch's budget
    /// cut the answer to -32002 (`None`: written as it was, or nothing).
    fn push_answer(&mut self, i: usize, answer: &[u8], id: Option<Id<'_>>) -> Option<(i32, usize)> {
        match &mut self.batch {
            Some(batch) => {
                let used = self.buf.len() + self.late.len();
                let start = self.late.len();
                let pushed = batch.push_late(&mut self.late, used, answer, id);
                if pushed != Late::Skipped {
                    if let Some(e) = self.elems.get_mut(i) {
                        e.answer = to_u32(start)..to_u32(self.late.len());
                    }
                }
                match pushed {
                    Late::Cut { code, len } => Some((code, len)),
                    Late::Pushed | Late::Skipped => None,
                }
            }
            None => {
                self.buf.extend_from_slice(answer);
                None
            }
        }
    }
}

/// The engine's [`Deferrals`] on the server: blocking calls and deferred methods'
/// calls become elements of the slot the frame will get.
pub(crate) struct Sink<'p> {
    elems: &'p mut Vec<Elem>,
    /// What every frame's sink shares (one pointer, not five fields set per frame).
    fixed: &'p Fixed,
    tag: Tag,
    /// When the frame was taken up: read on first need (budgets count from it, and the
    /// durations of calls answered later), kept in [`Pending`] for the slot.
    taken_at: &'p std::cell::Cell<Option<Instant>>,
    /// Calls answered at once, and how many of them a rate limit refused.
    answered: u32,
    limited: u32,
    /// The longest wait a rate limit asked of them.
    retry_after: Option<Limited>,
    transport: Transport,
    /// The next call's own trace (see [`Deferrals::call_trace`]).
    call_trace: Option<crate::trace::TraceId>,
}

/// What the sinks of a reactor's frames share, set once.
struct Fixed {
    reply_to: Arc<ReplyTo>,
    timeout: Option<Duration>,
    max_response_bytes: usize,
    /// Hooks or the access log are set: keep each call's method for them.
    keep_methods: bool,
    /// This reactor's metrics shard, if metrics are on.
    local: Option<Local>,
}

impl<'p> Sink<'p> {
    /// Where the frame's calls are counted, if metrics are on: the engine's straight
    /// path counts there itself ([`Engine::handle_split_counted`]), as `outcome` would.
    pub(crate) fn counted_in(&self) -> Option<&'p Local> {
        self.fixed.local.as_ref()
    }

    /// If every call of the frame was answered at once and refused by a rate limit:
    /// the longest wait asked (an HTTP request then gets 429 with `Retry-After`).
    pub(crate) fn all_limited(&self) -> Option<Limited> {
        if self.limited > 0 && self.limited == self.answered && self.elems.is_empty() {
            self.retry_after
        } else {
            None
        }
    }

    fn method(&self, method: &str) -> Option<Box<str>> {
        self.fixed.keep_methods.then(|| method.into())
    }
}

/// Offsets within one answer (bounded by `max_response_bytes`, far below 4 GiB).
fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Deferrals for Sink<'_> {
    fn placed(&mut self, at: usize) {
        if let Some(e) = self.elems.last_mut() {
            e.at = to_u32(at);
        }
    }

    fn blocking(
        &mut self,
        range: Range<usize>,
        id: Option<Id<'_>>,
        method: &str,
        metric: u32,
        dedup: Option<Digest>,
        deadline: Option<Instant>,
    ) -> bool {
        let method = self.method(method);
        self.elems.push(Elem {
            work: Work::Pool(range, dedup),
            id: id.map(OwnedId::from),
            state: ElemState::Queued,
            method,
            metric,
            deadline,
            at: u32::MAX,
            answer: 0..0,
            trace: self.call_trace.take(),
        });
        true
    }

    fn responder(
        &mut self,
        id: Id<'_>,
        method: &str,
        metric: u32,
        bytes: usize,
        deadline: Option<Instant>,
    ) -> Responder {
        let element = u32::try_from(self.elems.len()).unwrap_or(u32::MAX);
        let method = self.method(method);
        self.elems.push(Elem {
            work: Work::Responder(bytes),
            id: Some(OwnedId::from(id)),
            state: ElemState::Running,
            method,
            metric,
            deadline,
            at: u32::MAX,
            answer: 0..0,
            trace: self.call_trace.take(),
        });
        let tag = Tag {
            element,
            ..self.tag
        };
        let target: Arc<dyn Complete> = self.fixed.reply_to.clone();
        Responder::new(
            target,
            tag,
            OwnedId::from(id),
            self.fixed.max_response_bytes,
        )
    }

    fn taken_at(&mut self) -> Instant {
        match self.taken_at.get() {
            Some(t) => t,
            None => {
                let t = Instant::now();
                self.taken_at.set(Some(t));
                t
            }
        }
    }

    fn call_trace(&mut self, trace: Option<crate::trace::TraceId>) {
        self.call_trace = trace;
    }

    fn deadline(&mut self, budget: Option<u32>) -> Option<Instant> {
        crate::engine::deadline_of(self.taken_at(), self.fixed.timeout, budget)
    }

    fn answered(&mut self, _out: &mut Vec<u8>) -> Option<Option<i32>> {
        None
    }

    #[inline]
    fn outcome(&mut self, metric: u32, code: Option<i32>) {
        self.answered += 1;
        if code == Some(crate::error::LIMIT_EXCEEDED) {
            self.limited += 1;
        }
        if let Some(l) = &self.fixed.local {
            l.call(metric, self.transport, code);
        }
    }

    fn local(&self) -> Option<&Local> {
        self.fixed.local.as_ref()
    }

    fn limited(&mut self, limited: Limited) {
        self.retry_after = self.retry_after.max(Some(limited));
    }
}

/// A reactor's calls answered later: the pool it submits to, its completion queue and
/// the deadlines of its slots.
/// Buffers and element lists of slots already answered, kept for the next slots: a
/// call answered later (pool, responder, proxy) allocates nothing in steady state.
#[derive(Default)]
pub(crate) struct Spares {
    bufs: Vec<Vec<u8>>,
    elems: Vec<Vec<Elem>>,
}

/// Slots' buffers kept per reactor (a burst of more answers allocates, then settles).
const SPARE_SLOTS: usize = 256;
/// Larger buffers are freed rather than kept: one huge answer must not pin memory.
const SPARE_BUF_MAX: usize = 64 * 1024;

impl Spares {
    fn buf(&mut self) -> Vec<u8> {
        self.bufs.pop().unwrap_or_default()
    }

    fn keep_buf(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() > 0 && buf.capacity() <= SPARE_BUF_MAX && self.bufs.len() < SPARE_SLOTS {
            buf.clear();
            self.bufs.push(buf);
        }
    }

    fn keep_elems(&mut self, mut elems: Vec<Elem>) {
        if elems.capacity() > 0 && elems.capacity() <= 1024 && self.elems.len() < SPARE_SLOTS {
            elems.clear();
            self.elems.push(elems);
        }
    }
}

pub(crate) struct Pending {
    /// Reused buffers (a `RefCell`: the reactor's thread alone uses them, from methods
    /// that otherwise only read).
    spares: std::cell::RefCell<Spares>,
    pool: Arc<Pool>,
    /// Where `GET /metrics` is rendered (`None`: metrics off, or its thread could not
    /// be started, and scrapes are rendered on the reactor).
    scraper: Option<Arc<Scraper>>,
    /// The completion queue's sender, the limits, the metrics shard.
    fixed: Fixed,
    done: Receiver<Done>,
    /// (deadline, connection, generation, slot)
    timers: BinaryHeap<Reverse<(Instant, usize, u64, u64)>>,
    /// Timers in `timers` whose slot was answered before them: they wait there until
    /// their deadline, so under load they are most of the heap (30 s of calls); past
    /// half of it the heap is compacted (see [`Pending::compact`]).
    dead_timers: std::cell::Cell<usize>,
    /// The elements of the frame being answered (reused between frames).
    elems: Vec<Elem>,
    /// When the frame being answered was taken up, once a sink has read it (see
    /// [`Sink`]): where its calls answered later are timed from.
    taken_at: std::cell::Cell<Option<Instant>>,
    batch_concurrency: usize,
    hooks: Option<Arc<dyn Hooks>>,
    access_log: Option<Arc<crate::access_log::AccessLog>>,
}

/// What [`Pending::complete`] found for a completion.
pub(crate) enum Completed {
    /// The answer went into slot `slot` of connection `conn`, which may now have
    /// answers ready.
    Into { conn: usize },
    /// Nobody wants it any more (answered at the deadline, connection gone).
    Dropped,
}

impl Pending {
    /// The bookkeeping for a reactor woken by `waker`, submitting to `pool` and
    /// `scraper`.
    pub(crate) fn new(
        pool: Arc<Pool>,
        scraper: Option<Arc<Scraper>>,
        waker: Arc<mio::Waker>,
        engine: &Engine,
        settings: &ServerConfig,
    ) -> Self {
        let config = engine.config();
        let (reply_to, done) = ReplyTo::new(waker);
        Self {
            spares: std::cell::RefCell::default(),
            pool,
            scraper,
            fixed: Fixed {
                reply_to,
                timeout: config.request_timeout,
                max_response_bytes: config.max_response_bytes,
                keep_methods: engine.hooks().is_some() || engine.access_log().is_some(),
                local: engine.metrics().map(crate::metrics::Metrics::claim),
            },
            done,
            timers: BinaryHeap::new(),
            dead_timers: std::cell::Cell::new(0),
            elems: Vec::new(),
            taken_at: std::cell::Cell::new(None),
            batch_concurrency: settings.batch_concurrency,
            hooks: engine.hooks().cloned(),
            access_log: engine.access_log().cloned(),
        }
    }

    /// An empty buffer for a slot's JSON (one a finished slot gave back, if any).
    pub(crate) fn spare_buf(&self) -> Vec<u8> {
        self.spares.borrow_mut().buf()
    }

    /// Takes back the buffers of a slot whose answer went into the output.
    pub(crate) fn recycle(&self, slot: Slot) {
        let mut spares = self.spares.borrow_mut();
        spares.keep_buf(slot.late);
        spares.keep_buf(slot.buf);
        spares.keep_elems(slot.elems);
    }

    /// This reactor's metrics shard, if metrics are on.
    pub(crate) fn metrics(&self) -> Option<&Local> {
        self.fixed.local.as_ref()
    }

    /// The sink for a frame of connection `conn` that will get slot `slot` if anything
    /// is left for later.
    pub(crate) fn sink(
        &mut self,
        conn: usize,
        generation: u64,
        slot: u64,
        transport: Transport,
    ) -> Sink<'_> {
        self.elems.clear();
        self.taken_at.set(None);
        Sink {
            elems: &mut self.elems,
            fixed: &self.fixed,
            tag: Tag {
                conn,
                generation,
                slot,
                element: 0,
            },
            taken_at: &self.taken_at,
            answered: 0,
            limited: 0,
            retry_after: None,
            transport,
            call_trace: None,
        }
    }

    /// The slot for a frame the engine left calls of (`split` is not `Done`), with the
    /// JSON written so far (`json`: a batch's open array, or nothing). Submits its pool
    /// calls and sets a timer for each deadline the sink gave its calls. The slot may
    /// be ready at once (every call refused for a full queue).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        &mut self,
        info: &Connection,
        conn: usize,
        generation: u64,
        id: u64,
        split: Split,
        json: Vec<u8>,
        frame: &[u8],
        http: Option<Reply>,
        trace: Option<Trace>,
        identity: Option<Arc<str>>,
        headers: &ServerHeaders,
    ) -> Slot {
        let spare = self.spares.get_mut().elems.pop().unwrap_or_default();
        let elems = std::mem::replace(&mut self.elems, spare);
        let has_pool = elems.iter().any(|e| matches!(e.work, Work::Pool(..)));
        let batch = match split {
            Split::Batch(b) => Some(b.moved_to(0)),
            Split::Single | Split::Done(_) => None,
        };
        let remaining = elems.len();
        let mut slot = Slot {
            id,
            ready: false,
            http,
            late: if batch.is_some() {
                self.spares.get_mut().buf()
            } else {
                Vec::new()
            },
            batch,
            buf: json,
            // A copy: a shared slice would keep the whole read buffer alive while the
            // call waits for the pool. The copy is small next to a blocking call.
            frame: if has_pool {
                Bytes::copy_from_slice(frame)
            } else {
                Bytes::new()
            },
            elems,
            remaining,
            on_pool: 0,
            // From when the frame was taken up (its calls' deadlines count from it too),
            // not from now, after all its inline work.
            started: self.taken_at.get().unwrap_or_else(Instant::now),
            conn: *info,
            inflight: self.fixed.local.as_ref().map(|l| l.inflight(remaining)),
            trace,
            identity: identity.filter(|_| self.access_log.is_some()),
            key: conn,
            generation,
            timers: 0,
        };
        self.submit(&mut slot, conn, generation);
        if slot.remaining == 0 {
            finish(&mut slot, headers, &mut self.spares.borrow_mut());
        } else {
            // Only calls still pending get a timer: the heap holds no dead entries for
            // calls answered at once (e.g. "server busy"). A frame's calls share one
            // deadline unless their budgets differ: one timer per distinct deadline.
            let mut last = None;
            for e in slot.elems.iter().filter(|e| e.state != ElemState::Done) {
                if let Some(at) = e.deadline.filter(|&at| last != Some(at)) {
                    self.timers.push(Reverse((at, conn, generation, id)));
                    slot.timers += 1;
                    last = Some(at);
                }
            }
        }
        slot
    }

    /// The slot for `GET /metrics` on connection `conn` (`(id, reply, head)`: its slot
    /// number, how to head the answer, whether it is `HEAD`), its text queued for the
    /// [`Scraper`]'s thread, answered `503` at [`scrape::deadline`] for the scraper's
    /// `timeout`. `Err` when it cannot be queued: too many scrapes wait (`Full`: answer
    /// `503`), or there is no thread (`Gone`: render here).
    pub(crate) fn scrape(
        &mut self,
        conn: usize,
        generation: u64,
        (id, reply, head): (u64, Reply, bool),
        timeout: Option<Duration>,
    ) -> Result<Slot, Refused> {
        let scraper = self.scraper.as_ref().ok_or(Refused::Gone)?;
        let tag = Tag {
            conn,
            generation,
            slot: id,
            element: 0,
        };
        scraper.submit(tag, Arc::clone(&self.fixed.reply_to))?;
        let deadline = Instant::now() + scrape::deadline(timeout);
        self.timers.push(Reverse((deadline, conn, generation, id)));
        let mut elems = self.spares.get_mut().elems.pop().unwrap_or_default();
        elems.push(Elem {
            work: Work::Scrape { head },
            id: None,
            state: ElemState::Running,
            method: None,
            metric: 0,
            deadline: Some(deadline),
            at: 0,
            answer: 0..0,
            trace: None,
        });
        Ok(Slot {
            http: Some(reply),
            elems,
            remaining: 1,
            key: conn,
            generation,
            timers: 1,
            ..Slot::blank(id)
        })
    }

    /// Sends queued elements of `slot` to the pool, up to `batch_concurrency` at once. A
    /// full queue answers the element `-32000 Server busy` at once.
    fn submit(&self, slot: &mut Slot, conn: usize, generation: u64) {
        for i in 0..slot.elems.len() {
            if slot.on_pool >= self.batch_concurrency {
                break;
            }
            let Work::Pool(range, dedup) = &slot.elems[i].work else {
                continue;
            };
            if slot.elems[i].state != ElemState::Queued {
                continue;
            }
            let job = Job {
                conn: slot.conn,
                frame: slot.frame.slice(range.clone()),
                tag: Tag {
                    conn,
                    generation,
                    slot: slot.id,
                    element: i as u32,
                },
                reply_to: Arc::clone(&self.fixed.reply_to),
                deadline: slot.elems[i].deadline,
                dedup: *dedup,
                trace: slot.trace,
            };
            match self.pool.try_submit(job) {
                Ok(()) => {
                    slot.elems[i].state = ElemState::Running;
                    slot.on_pool += 1;
                }
                Err(_full) => {
                    slot.elems[i].state = ElemState::Done;
                    slot.remaining -= 1;
                    let mut err = Vec::new();
                    if let Some(id) = &slot.elems[i].id {
                        write_error(
                            &mut err,
                            id.as_id(),
                            Reason::ServerBusy,
                            format_args!("Server busy: the work queue is full, try again"),
                        );
                    }
                    self.settle(slot, i, &err, Some(ErrorCode::ServerBusy.code()));
                }
            }
        }
    }

    /// Sets the wake-up flag: completions from now on do not wake the reactor, until
    /// [`Pending::rearm`]. For the reactor's own thread, which drains the completions
    /// later in the same turn (rearming first, so none given meanwhile by another
    /// thread is missed).
    pub(crate) fn hold_wakes(&self) {
        self.fixed.reply_to.woken.store(true, Ordering::SeqCst);
    }

    /// Clears the wake-up flag: completions from now on wake the reactor again. Call
    /// before draining the completions.
    pub(crate) fn rearm(&self) {
        self.fixed.reply_to.woken.store(false, Ordering::Release);
    }

    /// The next completion, if any.
    pub(crate) fn next_done(&self) -> Option<Done> {
        if let Ok(done) = self.done.try_recv() {
            return Some(done);
        }
        let r = &self.fixed.reply_to;
        if !r.overflowed.load(Ordering::Acquire) {
            return None;
        }
        let mut overflow = r
            .overflow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let done = overflow.pop();
        if overflow.is_empty() {
            r.overflowed.store(false, Ordering::Release);
        }
        done
    }

    /// Puts `done` into its slot, found by `find` (the connection's slot of that id,
    /// still waiting, if the connection with that generation still exists).
    pub(crate) fn complete<'s>(
        &self,
        done: Done,
        find: impl FnOnce(usize, u64, u64) -> Option<&'s mut Slot>,
        headers: &ServerHeaders,
    ) -> Completed {
        let Tag {
            conn,
            generation,
            slot,
            element,
        } = done.tag;
        let Some(s) = find(conn, generation, slot) else {
            self.fixed.reply_to.recycle(done.reply);
            return Completed::Dropped;
        };
        let Some(e) = s.elems.get_mut(element as usize) else {
            self.fixed.reply_to.recycle(done.reply);
            return Completed::Dropped;
        };
        if e.state != ElemState::Running {
            self.fixed.reply_to.recycle(done.reply);
            return Completed::Dropped;
        }
        e.state = ElemState::Done;
        if let Work::Scrape { head } = e.work {
            self.dead_timers
                .set(self.dead_timers.get() + s.timers as usize);
            let text = match done.code {
                None => Ok(done.reply.as_slice()),
                Some(_) => Err(http::ScrapeFailed::Failed),
            };
            self.scraped(s, head, headers, text);
            self.fixed.reply_to.recycle(done.reply);
            return Completed::Into { conn };
        }
        if matches!(e.work, Work::Pool(..)) {
            s.on_pool -= 1;
        }
        s.remaining -= 1;
        self.settle(s, element as usize, &done.reply, done.code);
        self.fixed.reply_to.recycle(done.reply);
        self.submit(s, conn, generation);
        if s.remaining == 0 {
            self.dead_timers
                .set(self.dead_timers.get() + s.timers as usize);
            finish(s, headers, &mut self.spares.borrow_mut());
        }
        Completed::Into { conn }
    }

    /// The next slot whose deadline has passed by `now`: (connection, generation, slot).
    pub(crate) fn next_expired(&mut self, now: Instant) -> Option<(usize, u64, u64)> {
        match self.timers.peek() {
            Some(Reverse((at, ..))) if *at <= now => {
                let Reverse((_, conn, generation, slot)) = self.timers.pop()?;
                Some((conn, generation, slot))
            }
            _ => None,
        }
    }

    /// Whether most timers belong to slots already answered (see
    /// [`Pending::compact`]).
    pub(crate) fn needs_compaction(&self) -> bool {
        let dead = self.dead_timers.get();
        dead >= 1024 && dead * 2 >= self.timers.len()
    }

    /// Drops the timers of slots no longer waiting (`waiting(conn, generation, slot)`
    /// says which still are): linear in the heap, after at least as many answers, so
    /// the heap stays within twice the calls in flight.
    pub(crate) fn compact(&mut self, waiting: impl Fn(usize, u64, u64) -> bool) {
        self.timers
            .retain(|Reverse((_, conn, generation, slot))| waiting(*conn, *generation, *slot));
        self.dead_timers.set(0);
    }

    /// The earliest deadline, if any.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, ..))| *at)
    }

    /// Answers every element of `slot` still pending whose deadline has passed
    /// `-32001 Request timed out` (their late answers will be dropped); finishes the
    /// slot if none is left, else submits its queued calls in their place.
    pub(crate) fn expire(&self, slot: &mut Slot, headers: &ServerHeaders) {
        if slot.ready {
            return;
        }
        let now = Instant::now();
        if let Some(&Elem {
            work: Work::Scrape { head },
            deadline: Some(at),
            ..
        }) = slot.elems.first()
        {
            if at <= now {
                self.scraped(slot, head, headers, Err(http::ScrapeFailed::TimedOut));
            }
            return;
        }
        for i in 0..slot.elems.len() {
            if slot.elems[i].state == ElemState::Done {
                continue;
            }
            // Calls with a later deadline (another budget) wait for their own timer.
            if slot.elems[i].deadline.is_none_or(|at| at > now) {
                continue;
            }
            if let (Work::Pool(..), ElemState::Running) = (&slot.elems[i].work, slot.elems[i].state)
            {
                slot.on_pool -= 1;
            }
            slot.remaining -= 1;
            slot.elems[i].state = ElemState::Done;
            if let Some(l) = &self.fixed.local {
                l.event(Event::DeadlineExceeded);
            }
            let mut err = Vec::new();
            if let Some(id) = &slot.elems[i].id {
                write_error(
                    &mut err,
                    id.as_id(),
                    Reason::DeadlineExceeded,
                    format_args!(
                        "Request timed out: no result {}",
                        crate::dispatch::Within(self.fixed.timeout)
                    ),
                );
            }
            self.settle(slot, i, &err, Some(ErrorCode::RequestTimeout.code()));
        }
        if slot.remaining > 0 {
            self.submit(slot, slot.key, slot.generation);
        }
        if slot.remaining == 0 {
            finish(slot, headers, &mut self.spares.borrow_mut());
        }
    }
}

impl Pending {
    /// Makes scrape `slot` ready: its metrics' `text`, or why there are none, headed
    /// with this reactor's current lines.
    fn scraped(
        &self,
        slot: &mut Slot,
        head: bool,
        headers: &ServerHeaders,
        text: Result<&[u8], http::ScrapeFailed>,
    ) {
        let mut spares = self.spares.borrow_mut();
        let mut out = spares.buf();
        if let Some(reply) = slot.http {
            match text {
                Ok(text) => http::write_metrics(&mut out, reply, headers, head, text),
                Err(why) => http::write_metrics_failed(&mut out, why, reply, headers, head),
            }
        }
        spares.keep_buf(std::mem::replace(&mut slot.buf, out));
        spares.keep_elems(std::mem::take(&mut slot.elems));
        slot.remaining = 0;
        slot.ready = true;
    }

    /// Puts element `i`'s answer (`code`'s; empty for a notification) into its slot, and
    /// counts, logs and hooks it as what the client gets: the -32002 written in its
    /// place if the batch's budget cut it.
    fn settle(&self, slot: &mut Slot, i: usize, answer: &[u8], code: Option<i32>) {
        let id = slot.elems.get(i).and_then(|e| e.id.clone());
        let (code, bytes) = slot
            .push_answer(i, answer, id.as_ref().map(OwnedId::as_id))
            .map_or((code, answer.len()), |(c, len)| (Some(c), len));
        self.after(slot, i, code, bytes);
    }

    /// Element `i` of `slot` was answered with `code` in `bytes_out` bytes: counts it,
    /// logs it, runs the after hook.
    fn after(&self, slot: &mut Slot, i: usize, code: Option<i32>, bytes_out: usize) {
        if let Some(f) = &mut slot.inflight {
            f.done();
        }
        if let (Some(l), Some(e)) = (&self.fixed.local, slot.elems.get(i)) {
            l.call_took(
                e.metric,
                slot.conn.transport(),
                code,
                slot.started.elapsed(),
            );
        }
        if let (Some(log), Some(e)) = (&self.access_log, slot.elems.get(i)) {
            log.log(&crate::access_log::Entry {
                conn: &slot.conn,
                identity: slot.identity.as_deref(),
                method: e.method.as_deref().unwrap_or_default(),
                id: e.id.as_ref().map(OwnedId::as_id),
                code,
                took: slot.started.elapsed(),
                bytes_in: match &e.work {
                    Work::Pool(range, _) => range.len(),
                    Work::Responder(bytes) => *bytes,
                    Work::Scrape { .. } => 0,
                },
                bytes_out,
                trace: e.trace.or_else(|| slot.trace.map(|t| t.trace_id())),
            });
        }
        let (Some(hooks), Some(e)) = (&self.hooks, slot.elems.get(i)) else {
            return;
        };
        hooks.after(&Answered {
            method: e.method.as_deref().unwrap_or_default(),
            code,
            elapsed: slot.started.elapsed(),
            notification: e.id.is_none(),
        });
    }
}

/// All elements are done: frames the slot's final bytes for its transport.
fn finish(slot: &mut Slot, headers: &ServerHeaders, spares: &mut Spares) {
    let mut json = std::mem::take(&mut slot.buf);
    if let Some(batch) = slot.batch.take() {
        // Every answer in its element's place (only notifications: nothing at all,
        // never `[]`).
        let mut array = spares.buf();
        let places = slot.elems.iter().map(|e| {
            (
                e.at as usize,
                e.answer.start as usize..e.answer.end as usize,
            )
        });
        let _ = batch.assemble(&json, &slot.late, places, &mut array);
        spares.keep_buf(std::mem::replace(&mut json, array));
        spares.keep_buf(std::mem::take(&mut slot.late));
    }
    if slot.http.is_none() {
        // A line: the JSON itself, ended; a WebSocket message: framed.
        if slot.conn.transport() == Transport::WebSocket {
            if !json.is_empty() {
                let mut framed = spares.buf();
                websocket::write_message(&mut framed, &json);
                spares.keep_buf(std::mem::replace(&mut json, framed));
            }
        } else if !json.is_empty() {
            json.push(b'\n');
        }
        slot.buf = json;
        slot.ready = true;
        slot.frame = Bytes::new();
        spares.keep_elems(std::mem::take(&mut slot.elems));
        return;
    }
    let mut out = spares.buf();
    out.reserve(json.len() + 256);
    match slot.http {
        None => {}
        Some(reply) if json.is_empty() => http::write_no_content(&mut out, reply, headers),
        Some(reply) => match &slot.trace {
            None => {
                let m = http::begin_json_response(&mut out, reply, headers);
                out.extend_from_slice(&json);
                http::finish_json_response(&mut out, m, reply, headers);
            }
            Some(t) => {
                let m = http::begin_json_response_traced(&mut out, reply, headers);
                out.extend_from_slice(&json);
                http::finish_json_response_traced(&mut out, m, reply, headers, t);
            }
        },
    }
    slot.buf = out;
    slot.ready = true;
    slot.frame = Bytes::new();
    spares.keep_buf(json);
    spares.keep_elems(std::mem::take(&mut slot.elems));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{demo, Config};

    #[test]
    fn completions_past_the_queue_wait_in_the_overflow_and_none_is_lost() {
        let engine = Arc::new(demo::engine(Config::default()));
        let pool = Arc::new(Pool::start(Arc::clone(&engine), 1, 1).unwrap());
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let pending = Pending::new(pool, None, waker, &engine, &ServerConfig::default());
        let n = COMPLETIONS + 1000;
        let completer = Arc::clone(&pending.fixed.reply_to);
        let t = std::thread::spawn(move || {
            for i in 0..n {
                let tag = Tag {
                    conn: i,
                    generation: 0,
                    slot: 0,
                    element: 0,
                };
                completer.complete(tag, vec![b'x'], None);
            }
        });
        t.join().unwrap();
        let mut seen = vec![false; n];
        while let Some(done) = pending.next_done() {
            assert!(!std::mem::replace(&mut seen[done.tag.conn], true));
        }
        assert!(seen.iter().all(|s| *s), "a completion was lost");
        assert!(!pending.fixed.reply_to.overflowed.load(Ordering::Acquire));
    }
}
