//! Writes the Redis store could not make when a call ended (Redis down, unreachable or
//! too slow just then), made again in the background until they succeed or their
//! claim's marker has expired.
//!
//! Without them, an answer that could not be stored left its claim's marker in Redis
//! until the TTL: retries were told "in progress" for up to the whole TTL, and after it
//! could run the call a second time. With them, once Redis answers again the answer is
//! stored (or a released claim's marker deleted), and the next retry gets it.
//!
//! One thread per store, started by the first failed write, waiting on a condition
//! variable while there is nothing to do. A write is a compare-and-set on its own
//! claim's marker (see [`super::redis`]), so making it late, or twice, cannot touch
//! another claim. When Redis cannot be reached the oldest write is tried again, backing
//! off; when Redis answers one write with an error (out of memory, a key of the wrong
//! type), that write goes to the back, so it does not hold up the others, and the thread
//! backs off only once a whole round has failed. Bounded: [`MAX_WRITES`] writes and
//! [`MAX_BYTES`] (answers with their keys); past that the oldest, the nearest to
//! expiring anyway, are dropped. At a server's graceful shutdown (a deploy's restart)
//! the writes waiting, and one being made, are tried at once, and again every
//! [`FIRST_BACKOFF`], for up to [`FLUSH_ON_DROP`] before the server returns
//! ([`Retries::flush`]), and so again when the store is dropped; those still waiting
//! then are counted in a warning, and are lost if the process ends, as are any when it
//! is killed.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Client, Connection};

use super::redis::{Write, CONNECT_TIMEOUT, IO_TIMEOUT};

/// Writes kept waiting at most.
const MAX_WRITES: usize = 65_536;

/// Bytes of answers kept waiting at most.
const MAX_BYTES: usize = 16 << 20;

/// The first wait after a failed attempt; it doubles up to [`MAX_BACKOFF`], and starts
/// again after a success.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long a flush (a server's shutdown, the store's drop) waits for the writes still
/// waiting to be made.
const FLUSH_ON_DROP: Duration = Duration::from_secs(2);

/// How often a warning about writes given up may be logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A failed write, waiting.
struct Waiting {
    write: Write,
    /// Not tried before this (see [`Retries::push_later`]).
    due: Instant,
    /// After this its marker has expired: nothing is left to write. (Counted from the
    /// failed write, not the claim: later than the real expiry by the call's run, which
    /// only costs attempts that change nothing.)
    until: Instant,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// The answers' bytes in `waiting`.
    bytes: usize,
    /// The thread is to stop: a flush ([`Retries::flush`]) or the store's drop. It
    /// stops once the writes are made or `flush_until` has passed.
    closed: bool,
    /// Set with `closed` when writes were waiting or one was being made: until when
    /// they are tried.
    flush_until: Option<Instant>,
    /// For good: the store is dropped.
    dropped: bool,
    started: bool,
    /// The thread has returned.
    stopped: bool,
    /// A write is being made (taken out of `waiting`, not back yet).
    in_flight: bool,
    /// Writes dropped (queue full) or given up (expired) since the last warning.
    lost: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    client: Client,
    ttl: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A plain queue: a panic elsewhere cannot leave it inconsistent.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits on `wake` with `q`, for at most `left` (`None`: until woken).
    fn wait<'a>(&self, q: MutexGuard<'a, Queue>, left: Option<Duration>) -> MutexGuard<'a, Queue> {
        match left {
            Some(left) => self
                .wake
                .wait_timeout(q, left)
                .map_or_else(|p| p.into_inner().0, |(q, _)| q),
            None => self.wake.wait(q).unwrap_or_else(|p| p.into_inner()),
        }
    }
}

/// The store's retried writes (see the module docs).
pub(super) struct Retries {
    shared: Arc<Shared>,
}

impl Retries {
    /// Retries for a store talking to `client`, whose markers live for `ttl`.
    pub(super) fn new(client: Client, ttl: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                wake: Condvar::new(),
                client,
                ttl,
            }),
        }
    }

    /// Makes `write` again later: it just failed.
    pub(super) fn push(&self, write: Write) {
        self.push_later(write, Duration::ZERO);
    }

    /// Makes `write` (again) in `delay` at the earliest, and until it succeeds. (A
    /// release after a claim whose reply timed out: if Redis was stalled, the release
    /// may have run before the claim's `SET`, and found nothing to delete.)
    pub(super) fn push_later(&self, write: Write, delay: Duration) {
        let mut q = self.shared.lock();
        if q.dropped {
            return;
        }
        if write.bytes() > MAX_BYTES {
            // Alone over the bound: dropped, rather than every write before it.
            q.lost += 1;
            return;
        }
        let now = Instant::now();
        // (A TTL too long for the clock never ends: the bounds still hold.)
        let far = |d: Duration| now.checked_add(d).unwrap_or(now + MAX_BACKOFF);
        q.bytes += write.bytes();
        q.waiting.push_back(Waiting {
            write,
            due: far(delay),
            until: far(self.shared.ttl.max(delay)),
        });
        while q.waiting.len() > MAX_WRITES || q.bytes > MAX_BYTES {
            let Some(old) = q.waiting.pop_front() else {
                break;
            };
            q.bytes -= old.write.bytes();
            q.lost += 1;
        }
        start(&self.shared, &mut q);
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Writes waiting now (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shared.lock().waiting.len()
    }
}

impl Drop for Retries {
    fn drop(&mut self) {
        self.stop(true);
    }
}

impl Retries {
    /// Makes the writes waiting now (and one being made): tries them at once, and again
    /// every [`FIRST_BACKOFF`], for up to [`FLUSH_ON_DROP`], returning as soon as they
    /// are made; a write held back on purpose (see [`Retries::push_later`]) is not
    /// made before its time. Those still waiting then are counted in a warning and
    /// kept, retried on as before (by a thread started again at once, if this one
    /// stopped). Called by a server's
    /// graceful shutdown (through `Engine::flush_dedup`), where other threads may still
    /// hold the engine, so that its drop may come only at the process's exit.
    pub(super) fn flush(&self) {
        self.stop(false);
    }

    /// [`Retries::flush`], then, unless `dropped`, the retries ready to start again.
    fn stop(&self, dropped: bool) {
        let mut q = self.shared.lock();
        if q.dropped {
            return;
        }
        q.dropped = dropped;
        q.closed = true;
        if q.started && !q.stopped && (q.in_flight || !q.waiting.is_empty()) {
            // Tried now, should Redis answer: otherwise these claims' markers would
            // tell retries "in progress" until their TTL.
            let end = Instant::now() + FLUSH_ON_DROP;
            q.flush_until = Some(end);
            self.shared.wake.notify_all();
            // (Also ended by another flush's end, which reopened: see below.)
            while !q.stopped && q.closed {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                q = self.shared.wait(q, Some(left));
            }
        }
        let left = q.waiting.len() + usize::from(q.in_flight);
        if left > 0 || q.lost > 0 {
            tracing::warn!(
                waiting = left,
                lost = q.lost,
                dropped,
                "de-duplication: answers not stored in Redis as the server stops (or the \
                 store is dropped, and with it the writes still waiting); retries of \
                 those calls may run them again once their markers expire"
            );
            q.lost = 0;
        }
        if !dropped {
            // Ready again: a thread still making its last write goes on as the retry
            // thread; a stopped one is started anew, at once if writes wait.
            q.closed = false;
            q.flush_until = None;
            if q.stopped {
                q.started = false;
                q.stopped = false;
                if !q.waiting.is_empty() {
                    start(&self.shared, &mut q);
                }
            }
        }
        drop(q);
        self.shared.wake.notify_all();
    }
}

/// Starts the retry thread unless it runs. (Without a thread, the writes wait for the
/// next push to try again.)
fn start(shared: &Arc<Shared>, q: &mut Queue) {
    if q.started {
        return;
    }
    let shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("ringrpc-dedup-retry".into())
        .spawn(move || {
            let _exit = Exit(&shared);
            run(&shared);
        });
    q.started = spawned.is_ok();
}

/// Marks the retry thread's end should it panic (a bug: nothing it calls should), so
/// that the next push starts another and a flush does not wait for it; the write it
/// was making is counted lost.
struct Exit<'a>(&'a Shared);

impl Drop for Exit<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut q = self.0.lock();
        if std::mem::take(&mut q.in_flight) {
            q.lost += 1;
        }
        if q.closed {
            q.stopped = true;
        } else {
            q.started = false;
        }
        drop(q);
        self.0.wake.notify_all();
    }
}

/// The thread: takes the oldest write, makes it, and after a failure waits (backing
/// off) before trying again, on a connection of its own.
fn run(shared: &Shared) {
    let mut conn: Option<Connection> = None;
    let mut backoff = FIRST_BACKOFF;
    let mut warned: Option<Instant> = None;
    // Writes Redis refused in a row (each sent to the back): a whole round of them
    // backs off.
    let mut refused = 0;
    loop {
        let next = {
            let mut q = shared.lock();
            let next = loop {
                let now = Instant::now();
                // In a flush (see `Retries::flush`), until when the writes left are
                // made, each at its time; past it, or closed with none, the thread
                // stops. Outside a flush, no end.
                let end = match (q.closed, q.flush_until) {
                    (false, _) => None,
                    (true, Some(end)) if now < end => Some(end),
                    (true, _) => break None,
                };
                if !q.closed && q.lost > 0 && warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    tracing::warn!(
                        lost = q.lost,
                        "de-duplication: answers not stored in Redis (it stayed unreachable \
                         past their TTL, or too many waited); retries of those calls may run them again"
                    );
                    q.lost = 0;
                    warned = Some(Instant::now());
                }
                match (q.waiting.front().map(|w| w.due), end) {
                    (Some(due), _) if due <= now => {
                        let Some(w) = q.waiting.pop_front() else {
                            continue;
                        };
                        q.bytes -= w.write.bytes();
                        q.in_flight = true;
                        break Some(w);
                    }
                    // Not due yet (a release held back a moment): waited for, unless
                    // the flush ends first.
                    (Some(due), end) if end.is_none_or(|end| due < end) => {
                        q = shared.wait(q, Some(due.saturating_duration_since(now)));
                    }
                    (None, None) => q = shared.wait(q, None),
                    _ => break None,
                }
            };
            let Some(next) = next else {
                q.stopped = true;
                shared.wake.notify_all();
                return;
            };
            next
        };
        if Instant::now() >= next.until {
            let mut q = shared.lock();
            q.lost += 1;
            q.in_flight = false;
            continue;
        }
        let outcome = match conn.take().map_or_else(|| connect(&shared.client), Ok) {
            Ok(mut c) => match next.write.run(&mut c) {
                Ok(()) => {
                    conn = Some(c);
                    Ok(())
                }
                // Redis answered, with an error: the connection is fine, the write is
                // not (for now).
                Err(e) if !e.is_io_error() && !e.is_unrecoverable_error() => {
                    conn = Some(c);
                    Err(true)
                }
                // The connection's state is unknown: dropped.
                Err(_) => Err(false),
            },
            Err(_) => Err(false),
        };
        let Err(answered) = outcome else {
            shared.lock().in_flight = false;
            backoff = FIRST_BACKOFF;
            refused = 0;
            continue;
        };
        let mut q = shared.lock();
        q.in_flight = false;
        q.bytes += next.write.bytes();
        let round = if answered {
            // Redis refused it: to the back, so as not to hold up the others.
            refused += 1;
            q.waiting.push_back(next);
            refused >= q.waiting.len()
        } else {
            // Redis unreachable: the oldest is tried again first.
            q.waiting.push_front(next);
            true
        };
        if !round {
            continue;
        }
        refused = 0;
        // Woken early only by a flush (a push notifies, but the wait goes on), which
        // then tries at once; the flush's own waits are the first backoff's.
        let flushing = q.closed;
        let until = match (flushing, q.flush_until) {
            (true, Some(end)) => (Instant::now() + FIRST_BACKOFF).min(end),
            (true, None) => Instant::now(),
            (false, _) => Instant::now() + backoff,
        };
        while flushing || !q.closed {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = shared.wait(q, Some(left));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn connect(client: &Client) -> redis::RedisResult<Connection> {
    let conn = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_waiting_are_bounded_in_number_and_bytes() {
        // Port 1 on loopback refuses at once: every attempt fails.
        let client = Client::open("redis://127.0.0.1:1/").unwrap();
        let retries = Retries::new(client.clone(), Duration::from_secs(60));
        for n in 0..MAX_WRITES as u64 + 1000 {
            retries.push(Write::sample(n, 1));
        }
        // (One may be out, being tried.)
        let len = retries.len();
        assert!((MAX_WRITES - 1..=MAX_WRITES).contains(&len), "{len}");
        let retries = Retries::new(client, Duration::from_secs(60));
        for n in 0..40 {
            retries.push(Write::sample(n, 1 << 20));
        }
        let len = retries.len();
        assert!((14..=15).contains(&len), "{len} of 1 MiB each");
        // One write over the bound alone is dropped, not every write before it.
        retries.push(Write::sample(99, MAX_BYTES));
        assert_eq!(retries.len(), len);
    }

    #[test]
    fn a_ttl_past_the_clocks_range_does_not_panic() {
        let client = Client::open("redis://127.0.0.1:1/").unwrap();
        let retries = Retries::new(client, Duration::MAX);
        retries.push(Write::sample(1, 1));
        retries.push_later(Write::sample(2, 1), Duration::MAX);
        assert!(retries.len() >= 1);
    }
}
