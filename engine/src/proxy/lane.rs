//! One upstream connection's side shared between the threads that forward calls (the
//! server's reactors, running the fallback route) and the upstream thread that owns
//! the socket: the bytes waiting to be written and the calls waiting for an answer.
//! (A reactor's own lanes, see `upstream::OnReactor`, are written and read by that
//! reactor alone: the same steps on one thread, with nothing to wake.)
//!
//! ```text
//!  reactor ── forward: lock, append the request to `out`, park the Responder
//!             under a private id, unlock, wake the upstream thread (once per batch)
//!  upstream thread ── takes `out` (a swap), writes it; reads answers, takes each
//!             call back by its id, completes its Responder (outside the lock)
//! ```

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use slab::Slab;

use crate::dispatch::responder::Responder;

/// Bits of a private id that name the call's slab key; the bits above them count
/// calls, so an answer for a call that was already answered or timed out (a stale or
/// duplicated id) never matches the call that reused its key.
const KEY_BITS: u32 = 24;
/// Private ids stay below 2^53, exact in every JSON implementation (JavaScript's
/// numbers included).
const SEQ_MASK: u64 = (1 << (53 - KEY_BITS)) - 1;
/// Calls in flight on one upstream connection at most (the slab keys that fit).
pub(crate) const MAX_CALLS: usize = 1 << KEY_BITS;

/// A call written (or about to be) upstream, waiting for its answer.
pub(crate) struct Call {
    /// The private id it was sent with.
    id: u64,
    /// When the proxy stops waiting and answers `upstream_timeout`.
    pub(crate) deadline: Deadline,
    /// Where the answer goes: the client's call (with its shared-answer key).
    pub(crate) reply: Reply,
    /// A copy of it was sent to another upstream (hedging), or it is that copy.
    pub(crate) hedged: bool,
    /// For a call of an idempotent method: what it takes to send it again elsewhere.
    pub(crate) retry: Option<Retry>,
    /// When it was forwarded.
    pub(crate) sent: Instant,
    /// When its bytes were taken for the upstream socket.
    pub(crate) taken: Option<Instant>,
}

/// When the proxy stops waiting for a call's answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    pub(crate) at: Instant,
    /// It is the caller's budget (`RPC-Timeout-Ms`, `_meta.timeoutMs`), shorter than
    /// the proxy's upstream timeout: its passing says nothing of the upstream's health
    /// (it does not count towards the circuit breaker).
    pub(crate) callers: bool,
}

/// Who a call's answer goes to: its own caller, or — once the call is hedged — a cell
/// its copies share, answered by the first answer to come (or by the error of the last
/// copy to fail).
// `Own` is every call's, `Shared` only a hedged one's: boxing `Own` to even them out
// would allocate per call.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Reply {
    Own(Responder, Option<Keyed>),
    Shared(Arc<Hedge>),
    /// A forwarded subscribe: its answer goes to the subscription table's entry `entry`
    /// (`uid` tells it from a later entry in the same slot).
    Sub {
        entry: usize,
        uid: u64,
    },
}

/// The caller of a hedged call, and how many of its copies are still out.
pub(crate) struct Hedge {
    caller: Mutex<Option<(Responder, Option<Keyed>)>>,
    copies: AtomicUsize,
}

impl Hedge {
    /// A cell for the caller of `reply` (which must be `Own`), with `copies` copies out.
    pub(crate) fn new(reply: Reply, copies: usize) -> Arc<Self> {
        let caller = match reply {
            Reply::Own(r, k) => Some((r, k)),
            Reply::Shared(_) | Reply::Sub { .. } => None,
        };
        Arc::new(Self {
            caller: Mutex::new(caller),
            copies: AtomicUsize::new(copies),
        })
    }

    /// One copy fewer is out (it could not be sent).
    pub(crate) fn forget_one(&self) {
        self.copies.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Reply {
    /// The caller to answer with this copy's outcome, if it is the one that answers:
    /// any answer from upstream wins; an `error` of the proxy's own only when no other
    /// copy is still out (it may yet be answered).
    pub(crate) fn take(self, error: bool) -> Option<(Responder, Option<Keyed>)> {
        match self {
            Self::Own(r, k) => Some((r, k)),
            // Answered through the subscription table (`Shared::finish`), never here.
            Self::Sub { .. } => None,
            Self::Shared(cell) => {
                let last = cell.copies.fetch_sub(1, Ordering::AcqRel) == 1;
                if error && !last {
                    return None;
                }
                cell.caller
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take()
            }
        }
    }
}

/// A call whose answer is shared: waiting identical calls, or the response cache.
pub(crate) struct Keyed {
    /// The call's canonical text (see `share::write_key`).
    pub(crate) key: std::sync::Arc<[u8]>,
    /// Identical calls may be waiting on it (it is in the in-flight table).
    pub(crate) coalesced: bool,
    /// How long its result is cached, if it is.
    pub(crate) ttl: Option<std::time::Duration>,
}

/// An idempotent call's request, kept to resend it on another upstream of its group if
/// its connection fails before the answer.
pub(crate) struct Retry {
    /// Its group (an index into the proxy's groups).
    pub(crate) group: usize,
    /// The request after its id: `"method":M,"params":P}` and the newline.
    pub(crate) tail: Vec<u8>,
    /// Times it was sent.
    pub(crate) attempts: u8,
}

/// A hedged call's copy, to be sent on another upstream of its group.
pub(crate) struct Copy {
    pub(crate) group: usize,
    pub(crate) tail: Vec<u8>,
    pub(crate) sent: Instant,
    pub(crate) deadline: Deadline,
    pub(crate) cell: Arc<Hedge>,
}

/// What [`Lane::queue`] guards.
pub(crate) struct Queue {
    /// Requests written by forwarding threads, not yet taken by the upstream thread.
    pub(crate) out: Vec<u8>,
    /// Calls waiting for an answer, by slab key (the low bits of their id).
    pub(crate) calls: Slab<Call>,
    /// Counts calls, for the high bits of ids.
    seq: u64,
    /// Buffers for idempotent calls' requests, given back when they are answered.
    tails: Vec<Vec<u8>>,
    /// Calls parked since the upstream thread last took `out` (their slab keys).
    fresh: Vec<usize>,
    /// HTTP: requests in `out` (not yet taken), the last entries of `fifo`.
    untaken: usize,
    /// HTTP upstreams: the request head up to its `Content-Length` value.
    http_head: Option<Box<[u8]>>,
    /// HTTP upstreams: the requests written, in order: HTTP/1.1 answers come in that
    /// order, whatever their bodies say.
    pub(crate) fifo: VecDeque<Sent>,
    /// The sub-batch being written at the end of `out`, if any.
    open: Option<Open>,
    /// HTTP: emptied member lists of answered sub-batches, for reuse.
    spare_members: Vec<Vec<u64>>,
}

/// An HTTP request written upstream, as its answer will be matched.
#[derive(Debug)]
pub(crate) enum Sent {
    /// A request for the call with this private id (0: a notification).
    One(u64),
    /// A sub-batch: the private ids of its calls (not its notifications).
    Batch(Vec<u64>),
}

/// A sub-batch being written: the elements of one client batch that go to this lane,
/// sent upstream as one batch request (see `sub_batch`).
struct Open {
    /// The client batch it belongs to.
    owner: u64,
    mark: Mark,
    /// Where its `[` is in `out`.
    bracket: usize,
    /// Elements written so far.
    count: usize,
}

/// Room for the `Content-Length` value, filled in once the body is written (digits,
/// then spaces: trailing whitespace around a field value is optional whitespace).
const LENGTH_FIELD: usize = 10;

/// Where a request being written started, for [`Queue::end`].
pub(crate) struct Mark {
    /// HTTP: where the `Content-Length` value and the body start.
    http: Option<(usize, usize)>,
}

/// Request buffers kept per lane at most, and the largest kept.
const SPARE_TAILS: usize = 1024;
const SPARE_TAIL_MAX: usize = 64 * 1024;

impl Queue {
    /// The private id for the next call, whose key will be `calls.vacant_key()`.
    pub(crate) fn next_id(&mut self) -> u64 {
        // Never 0 (after the count wraps): id 0 would be a notification's.
        self.seq = ((self.seq + 1) & SEQ_MASK).max(1);
        (self.seq << KEY_BITS) | self.calls.vacant_key() as u64
    }

    /// Parks `responder` under `id` (from [`Queue::next_id`], nothing inserted since).
    pub(crate) fn park(
        &mut self,
        id: u64,
        (sent, deadline): (Instant, Deadline),
        reply: Reply,
        (retry, hedged): (Option<Retry>, bool),
    ) {
        let key = self.calls.insert(Call {
            id,
            deadline,
            reply,
            hedged,
            retry,
            sent,
            taken: None,
        });
        self.fresh.push(key);
    }

    /// Takes back the call sent with `id`, if it still waits; its request buffer, if
    /// it kept one, goes back to the spares (it is answered: no resending).
    pub(crate) fn take(&mut self, id: u64) -> Option<Call> {
        let key = (id & ((1 << KEY_BITS) - 1)) as usize;
        match self.calls.get(key) {
            Some(call) if call.id == id => {
                let mut call = self.calls.remove(key);
                if let Some(r) = call.retry.take() {
                    self.keep_tail(r.tail);
                }
                Some(call)
            }
            _ => None,
        }
    }

    /// The bytes queued were taken for the socket `now`: the calls they carry note it.
    pub(crate) fn taken(&mut self, now: Instant) {
        self.untaken = 0;
        for k in self.fresh.drain(..) {
            if let Some(c) = self.calls.get_mut(k) {
                c.taken.get_or_insert(now);
            }
        }
    }

    /// An empty buffer for an idempotent call's request.
    pub(crate) fn tail(&mut self) -> Vec<u8> {
        self.tails.pop().unwrap_or_default()
    }

    /// Gives a request buffer back.
    pub(crate) fn keep_tail(&mut self, mut tail: Vec<u8>) {
        if tail.capacity() <= SPARE_TAIL_MAX && self.tails.len() < SPARE_TAILS {
            tail.clear();
            self.tails.push(tail);
        }
    }

    /// Starts a request: the HTTP head (for an HTTP upstream) and `{"jsonrpc":"2.0",`
    /// with `"id":ID,` unless it is a notification. The rest (see `write_tail`) follows
    /// in `out`, then [`Queue::end`].
    /// A sub-batch being written is closed first.
    pub(crate) fn begin(&mut self, id: Option<u64>) -> Mark {
        self.close();
        let mark = self.head(Sent::One(id.unwrap_or(0)));
        self.envelope(id);
        mark
    }

    /// For an HTTP upstream, the request head (its length left blank) and `sent` in
    /// the fifo.
    fn head(&mut self, sent: Sent) -> Mark {
        let http = self.http_head.as_deref().map(|head| {
            self.out.extend_from_slice(head);
            let length = self.out.len();
            self.out.extend_from_slice(&[b' '; LENGTH_FIELD]);
            self.out.extend_from_slice(b"\r\n\r\n");
            (length, self.out.len())
        });
        if http.is_some() {
            self.fifo.push_back(sent);
            self.untaken += 1;
        }
        Mark { http }
    }

    /// `{"jsonrpc":"2.0",` and `"id":ID,` unless it is a notification.
    fn envelope(&mut self, id: Option<u64>) {
        self.out.extend_from_slice(br#"{"jsonrpc":"2.0","#);
        if let Some(id) = id {
            self.out.extend_from_slice(br#""id":"#);
            self.out
                .extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
            self.out.push(b',');
        }
    }

    /// Starts an element of client batch `owner` (its tail follows, then
    /// [`Queue::end_element`]): after the batch's previous element if the sub-batch
    /// it opened here is still open and has fewer than `max` elements; else in a new
    /// sub-batch (closing any other first).
    pub(crate) fn begin_element(&mut self, owner: u64, id: Option<u64>, max: usize) {
        let joins = matches!(&self.open, Some(o) if o.owner == owner && o.count < max);
        if joins {
            self.out.push(b',');
        } else {
            self.close();
            let sent = Sent::Batch(self.spare_members.pop().unwrap_or_default());
            let mark = self.head(sent);
            let bracket = self.out.len();
            self.out.push(b'[');
            self.open = Some(Open {
                owner,
                mark,
                bracket,
                count: 0,
            });
        }
        if let Some(open) = self.open.as_mut() {
            open.count += 1;
        }
        if let (Some(id), true) = (id, self.http_head.is_some()) {
            // The sub-batch is the last request in the fifo: nothing else is written
            // while it is open.
            if let Some(Sent::Batch(members)) = self.fifo.back_mut() {
                members.push(id);
            }
        }
        self.envelope(id);
    }

    /// Ends an element begun by [`Queue::begin_element`]: its tail's newline goes.
    pub(crate) fn end_element(&mut self) {
        if self.out.last() == Some(&b'\n') {
            self.out.pop();
        }
    }

    /// Closes the open sub-batch, if any: `]` and the newline (a sub-batch of one
    /// element goes as a plain request: its `[` becomes a space), and over HTTP the
    /// body's length.
    pub(crate) fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        if open.count == 1 {
            self.out[open.bracket] = b' ';
        } else {
            self.out.push(b']');
        }
        self.out.push(b'\n');
        self.end(open.mark);
    }

    /// Whether sub-batch `owner` is open here.
    pub(crate) fn is_open(&self, owner: u64) -> bool {
        matches!(&self.open, Some(o) if o.owner == owner)
    }

    /// HTTP: the oldest request written and not yet answered, which the response just
    /// read answers (`None`: none was written; the response answers nothing).
    pub(crate) fn answered(&mut self) -> Option<Sent> {
        if self.fifo.len() <= self.untaken {
            return None;
        }
        self.fifo.pop_front()
    }

    /// Gives back the member list of an answered HTTP sub-batch.
    pub(crate) fn keep_members(&mut self, mut members: Vec<u64>) {
        if self.spare_members.len() < SPARE_TAILS && members.capacity() <= SPARE_TAIL_MAX {
            members.clear();
            self.spare_members.push(members);
        }
    }

    /// Ends the request begun at `mark` (whose tail ends with a newline): over HTTP the
    /// newline goes and the body's length is filled in.
    pub(crate) fn end(&mut self, mark: Mark) {
        if let Some((length, body)) = mark.http {
            if self.out.last() == Some(&b'\n') {
                self.out.pop();
            }
            let mut digits = itoa::Buffer::new();
            let n = digits.format(self.out.len() - body).as_bytes();
            self.out[length..length + n.len()].copy_from_slice(n);
        }
    }

    /// Writes a whole request for `id` whose tail (from `"method"` on, with its
    /// newline) is `tail`.
    pub(crate) fn write(&mut self, id: u64, tail: &[u8]) {
        self.request(None, Some(id), |out| out.extend_from_slice(tail));
    }

    /// Writes a request for `id` (`None`: a notification) whose tail `tail` writes:
    /// on its own, or with `batch` = (owner, max) as an element of a sub-batch (see
    /// [`Queue::begin_element`]).
    pub(crate) fn request(
        &mut self,
        batch: Option<(u64, usize)>,
        id: Option<u64>,
        tail: impl FnOnce(&mut Vec<u8>),
    ) {
        match batch {
            Some((owner, max)) => {
                self.begin_element(owner, id, max);
                tail(&mut self.out);
                self.end_element();
            }
            None => {
                let mark = self.begin(id);
                tail(&mut self.out);
                self.end(mark);
            }
        }
    }
}

/// The shared half of one upstream connection.
pub(crate) struct Lane {
    /// Which upstream (an index into the proxy's upstream list) it connects to.
    pub(crate) upstream: usize,
    queue: Mutex<Queue>,
    /// Bytes wait in `out` to be taken (read without the lock by the upstream thread).
    /// A client batch's sub-batch sets it only at the batch's end (see
    /// [`Lane::mark_out`]).
    pub(crate) has_out: AtomicBool,
    /// Calls parked and not yet answered: least-outstanding balancing reads it without
    /// taking the lock.
    pub(crate) outstanding: AtomicUsize,
    /// Whether calls may be sent here: false while the connection is down.
    pub(crate) up: AtomicBool,
    /// The most elements of a client batch sent here in one batch request (1: each on
    /// its own).
    pub(crate) batch_max: usize,
}

impl Lane {
    /// Notes that a request was written to `out`, unless it is an element of a client
    /// batch (`in_batch`): the batch's end does that (`sub_batch::Scope`), so that the
    /// upstream thread, woken meanwhile for anything else, does not take and send a
    /// sub-batch half written. (Anything else written to the lane closes the
    /// sub-batch and sets the flag itself.)
    pub(crate) fn mark_out(&self, in_batch: bool) {
        if !in_batch {
            self.has_out.store(true, Ordering::SeqCst);
        }
    }

    /// A lane to upstream `upstream`, up (its first connection is being made); for an
    /// HTTP upstream, `http_head` is its request head up to the `Content-Length` value;
    /// sub-batches of at most `batch_max` elements.
    pub(crate) fn new(upstream: usize, http_head: Option<Box<[u8]>>, batch_max: usize) -> Self {
        Self {
            upstream,
            queue: Mutex::new(Queue {
                out: Vec::with_capacity(64 * 1024),
                calls: Slab::with_capacity(1024),
                seq: 0,
                tails: Vec::new(),
                fresh: Vec::new(),
                untaken: 0,
                http_head,
                fifo: VecDeque::new(),
                open: None,
                spare_members: Vec::new(),
            }),
            has_out: AtomicBool::new(false),
            outstanding: AtomicUsize::new(0),
            up: AtomicBool::new(true),
            batch_max,
        }
    }

    /// The queue, locked. A thread that panicked holding it left it consistent (every
    /// change under the lock is a single push or remove), so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes back the call sent with `id`, if it still waits.
    pub(crate) fn take(&self, id: u64) -> Option<Call> {
        let call = self.lock().take(id);
        if call.is_some() {
            self.outstanding.fetch_sub(1, Ordering::Relaxed);
        }
        call
    }

    /// Takes every waiting call whose deadline is at or before `now` into `into`.
    pub(crate) fn expired(&self, now: Instant, keys: &mut Vec<usize>, into: &mut Vec<Call>) {
        let mut q = self.lock();
        keys.clear();
        keys.extend(
            q.calls
                .iter()
                .filter(|(_, c)| c.deadline.at <= now)
                .map(|(k, _)| k),
        );
        for &k in keys.iter() {
            let mut call = q.calls.remove(k);
            if let Some(r) = call.retry.take() {
                q.keep_tail(r.tail);
            }
            into.push(call);
        }
        drop(q);
        self.outstanding.fetch_sub(keys.len(), Ordering::Relaxed);
    }

    /// Takes the waiting calls whose bytes were taken for the socket into `into` (the
    /// connection they were written on is gone); the others stay, with their bytes,
    /// for the next connection: they were never written.
    pub(crate) fn drain_written(&self, keys: &mut Vec<usize>, into: &mut Vec<Call>) {
        let mut q = self.lock();
        keys.clear();
        keys.extend(
            q.calls
                .iter()
                .filter(|(_, c)| c.taken.is_some())
                .map(|(k, _)| k),
        );
        for &k in keys.iter() {
            into.push(q.calls.remove(k));
        }
        let written = q.fifo.len() - q.untaken.min(q.fifo.len());
        q.fifo.drain(..written);
        drop(q);
        self.outstanding.fetch_sub(keys.len(), Ordering::Relaxed);
    }

    /// Hedges the waiting idempotent calls sent at or before `cutoff` that are not
    /// hedged yet (at most `budget` of them): each gets a shared reply, and what it
    /// takes to send a copy goes into `into`: (group, request tail, sent, deadline,
    /// the shared cell).
    pub(crate) fn hedge(&self, cutoff: Instant, budget: usize, into: &mut Vec<Copy>) {
        let mut q = self.lock();
        for (_, c) in q.calls.iter_mut() {
            if into.len() >= budget {
                break;
            }
            let Some(retry) = &c.retry else { continue };
            if c.hedged || c.sent > cutoff {
                continue;
            }
            c.hedged = true;
            let own = std::mem::replace(&mut c.reply, Reply::Own(Responder::detached(), None));
            let cell = Hedge::new(own, 2);
            c.reply = Reply::Shared(Arc::clone(&cell));
            into.push(Copy {
                group: retry.group,
                tail: retry.tail.clone(),
                sent: c.sent,
                deadline: c.deadline,
                cell,
            });
        }
    }

    /// Takes every waiting call into `into` and drops the bytes not yet taken (the
    /// connection is gone: they will never be written on it).
    pub(crate) fn drain(&self, into: &mut Vec<Call>) {
        let mut q = self.lock();
        q.out.clear();
        q.open = None;
        q.fifo.clear();
        q.fresh.clear();
        q.untaken = 0;
        let n = q.calls.len();
        into.extend(q.calls.drain());
        drop(q);
        self.has_out.store(false, Ordering::Relaxed);
        self.outstanding.fetch_sub(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_call_once() {
        let lane = Lane::new(0, None, 1);
        let now = Instant::now();
        let due = Deadline {
            at: now,
            callers: false,
        };
        let mut q = lane.lock();
        let a = q.next_id();
        q.park(
            a,
            (now, due),
            Reply::Own(Responder::detached(), None),
            (None, false),
        );
        let b = q.next_id();
        q.park(
            b,
            (now, due),
            Reply::Own(Responder::detached(), None),
            (None, false),
        );
        assert_ne!(a, b);
        assert!(a < 1 << 53 && b < 1 << 53);
        assert!(q.take(a).is_some());
        assert!(q.take(a).is_none(), "answered twice");
        // The freed key is reused under a new id: the old id still does not match.
        let c = q.next_id();
        q.park(
            c,
            (now, due),
            Reply::Own(Responder::detached(), None),
            (None, false),
        );
        assert_eq!(c & ((1 << KEY_BITS) - 1), a & ((1 << KEY_BITS) - 1));
        assert!(q.take(a).is_none());
        assert!(q.take(c).is_some());
        assert!(q.take(b).is_some());
        // Where the count wraps, ids go on from 1: 0 is a notification's.
        q.seq = SEQ_MASK;
        let wrapped = q.next_id();
        assert_eq!(wrapped >> KEY_BITS, 1);
        assert_ne!(wrapped, 0);
    }
}
