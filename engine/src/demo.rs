//! The demo method set shared by every example, test and bench: the specification's
//! section 7 methods plus a few for measuring.
//!
//! | method | params | result |
//! | --- | --- | --- |
//! | `subtract` | `[minuend, subtrahend]` or `{"minuend", "subtrahend"}` | the difference |
//! | `sum` | an array of integers | their sum |
//! | `get_data` | none | `["hello", 5]` |
//! | `ping` | none | `"pong"` |
//! | `echo` | anything | the params, as sent |
//! | `add` | `[a, b]` | `a + b` |
//! | `sleep` | `{"ms": N}` (N ≤ 60000) | `null`, after N ms (blocking: the server runs it on the worker pool) |
//! | `delay` | `[ms]` (ms ≤ 60000) | `null`, after ms, answered by a [`Responder`] from a timer thread: no thread waits meanwhile |
//! | `whoami` | none | `{"transport": "tcp", "peer": "127.0.0.1:50312"}`, plus `"user_agent"` when the HTTP request had one, `"identity"` when the caller authenticated and `"trace_id"` when the call is traced |
//! | `incr` | `[n]` (default 1) | adds `n` to the engine's counter, answers the new value; marked for de-duplication ([`crate::dedup`]), so a retried call does not add twice |
//! | `get_counter` | none | the counter's value |
//! | `update`, `notify_hello`, `notify_sum` | anything | notifications: no answer |
//! | `subscribe_ticks` | `[interval_ms]` (0.001 ≤ interval_ms ≤ 60000; fractions for measuring push) | a subscription id; then notifications `tick` with `{"subscription": ID, "result": N}`, N = 0, 1, 2, … every interval (WebSocket, TCP, Unix, stdio) |
//! | `unsubscribe_ticks` | `[ID]` | `true` (`false` for an id that is not the connection's); no `tick` of it follows |
//!
//! Integers are `i64`; overflow is answered with `-32602`. `foobar` does not exist.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{
    Config, Context, Engine, Params, Registry, RegistryBuilder, Responder, RpcError, Sink,
};

/// The longest `sleep` accepted, in milliseconds.
pub const MAX_SLEEP_MS: u64 = 60_000;

#[derive(Deserialize)]
struct Subtract {
    minuend: i64,
    subtrahend: i64,
}

#[derive(Deserialize)]
struct Sleep {
    ms: u64,
}

fn overflow() -> RpcError {
    RpcError::invalid_params("the result overflows a 64-bit signed integer")
}

/// A builder holding the demo methods, for adding more before freezing.
pub fn builder() -> RegistryBuilder {
    let mut b = core_builder();
    // One counter per registry built: two servers in one process count apart.
    let counter = Arc::new(AtomicI64::new(0));
    let read = Arc::clone(&counter);
    let r = (|| -> Result<(), crate::RegisterError> {
        b.dedup_method("incr", move |p: Params<'_>| {
            let n = if p.is_absent() || p.is_empty() {
                1
            } else {
                let [n]: [i64; 1] = p.parse()?;
                n
            };
            let old = counter
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_add(n))
                .map_err(|_| overflow())?;
            Ok(old + n)
        })?
        .method(
            "get_counter",
            move |_p: Params<'_>| -> Result<i64, RpcError> { Ok(read.load(Ordering::SeqCst)) },
        )?
        .deferred_method("delay", delay)?
        .subscription(
            "subscribe_ticks",
            "tick",
            "unsubscribe_ticks",
            |_ctx: &Context<'_>, p: Params<'_>, sink: Sink| {
                let [ms]: [f64; 1] = p.parse()?;
                if !(0.001..=MAX_SLEEP_MS as f64).contains(&ms) {
                    return Err(RpcError::invalid_params(format_args!(
                        "`interval_ms` must be 0.001 to {MAX_SLEEP_MS}"
                    )));
                }
                let every = Duration::from_secs_f64(ms / 1000.0);
                timer().at(Instant::now() + every, Job::Tick { sink, every, n: 0 });
                Ok(())
            },
        )?
        .method_with_ctx("whoami", |ctx: &Context<'_>, _p: Params<'_>| {
            Ok(Whoami {
                transport: ctx.connection().transport().as_str(),
                peer: ctx.connection().peer().to_string(),
                user_agent: ctx
                    .headers()
                    .and_then(|h| h.get("user-agent"))
                    .map(|v| String::from_utf8_lossy(v).into_owned()),
                identity: ctx.identity().map(str::to_owned),
                trace_id: ctx.trace().map(|t| t.trace_id().to_string()),
            })
        })?;
        Ok(())
    })();
    // The names above are fixed, distinct and unreserved.
    debug_assert!(r.is_ok());
    b
}

#[derive(Serialize)]
struct Whoami {
    transport: &'static str,
    peer: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    identity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
}

/// `delay [ms]`: answered by the timer thread after `ms`.
fn delay(_ctx: &Context<'_>, p: Params<'_>, responder: Responder) {
    let [ms]: [u64; 1] = match p.parse() {
        Ok(ms) => ms,
        Err(e) => return responder.error(e),
    };
    if ms > MAX_SLEEP_MS {
        return responder.error(RpcError::invalid_params(format_args!(
            "`ms` must be at most {MAX_SLEEP_MS}"
        )));
    }
    timer().after(Duration::from_millis(ms), responder);
}

/// What the timer does when its time comes.
enum Job {
    /// Answers a `delay` call.
    Answer(Responder),
    /// Sends tick `n` of a `subscribe_ticks` subscription, and the next one `every`
    /// later (counted from when this one was due: no drift), until it ends.
    Tick { sink: Sink, every: Duration, n: u64 },
}

/// One thread answering `delay` calls and sending ticks when their time comes.
struct Timer {
    due: Mutex<BinaryHeap<Reverse<Due>>>,
    changed: Condvar,
}

/// A job to do at `at` (`seq` breaks ties in arrival order).
struct Due {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The demo timer, started on first use.
fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            due: Mutex::new(BinaryHeap::new()),
            changed: Condvar::new(),
        }));
        // If the thread cannot start, calls wait in the heap until their deadline
        // (-32001): the server stays up.
        let _ = std::thread::Builder::new()
            .name("ringrpc-demo-timer".into())
            .spawn(move || t.run());
        t
    })
}

impl Timer {
    fn after(&self, wait: Duration, responder: Responder) {
        self.at(Instant::now() + wait, Job::Answer(responder));
    }

    fn at(&self, at: Instant, job: Job) {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().push(Reverse(Due { at, seq, job }));
        self.changed.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BinaryHeap<Reverse<Due>>> {
        self.due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn run(&self) {
        let mut due = self.lock();
        loop {
            let now = Instant::now();
            let mut ready = Vec::new();
            while due.peek().is_some_and(|Reverse(d)| d.at <= now) {
                if let Some(Reverse(d)) = due.pop() {
                    ready.push((d.at, d.job));
                }
            }
            if !ready.is_empty() {
                // Done outside the lock: completing or sending wakes a reactor.
                drop(due);
                for (at, job) in ready {
                    match job {
                        Job::Answer(r) => r.respond(Ok(())),
                        Job::Tick { sink, every, n } => {
                            if sink.send(&n).is_ok() {
                                self.at(
                                    at + every,
                                    Job::Tick {
                                        sink,
                                        every,
                                        n: n + 1,
                                    },
                                );
                            }
                        }
                    }
                }
                due = self.lock();
                continue;
            }
            due = match due.peek().map(|Reverse(d)| d.at) {
                Some(at) => {
                    self.changed
                        .wait_timeout(due, at.saturating_duration_since(now))
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(due)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            };
        }
    }
}

/// The demo methods without the ones answered later or reading the call's context
/// (`delay`, `whoami`): what the fuzzers' reference models.
pub fn core_builder() -> RegistryBuilder {
    let mut b = Registry::builder();
    let r = (|| -> Result<(), crate::RegisterError> {
        b.method("subtract", |p: Params<'_>| {
            let s: Subtract = p.parse()?;
            s.minuend.checked_sub(s.subtrahend).ok_or_else(overflow)
        })?
        .method("sum", |p: Params<'_>| {
            let v: Vec<i64> = p.parse()?;
            v.iter()
                .try_fold(0i64, |acc, x| acc.checked_add(*x))
                .ok_or_else(overflow)
        })?
        .method("add", |p: Params<'_>| {
            let [a, b]: [i64; 2] = p.parse()?;
            a.checked_add(b).ok_or_else(overflow)
        })?
        .method("get_data", |_p: Params<'_>| Ok(("hello", 5)))?
        .raw_method("ping", |_p, out| out.write_str("pong"))?
        .raw_method("echo", |p, out| out.write_params(&p))?
        .blocking_method("sleep", |p: Params<'_>| {
            let s: Sleep = p.parse()?;
            if s.ms > MAX_SLEEP_MS {
                return Err(RpcError::invalid_params(format_args!(
                    "`ms` must be at most {MAX_SLEEP_MS}"
                )));
            }
            std::thread::sleep(Duration::from_millis(s.ms));
            Ok(())
        })?
        .notification("update", |_p| Ok(()))?
        .notification("notify_hello", |_p| Ok(()))?
        .notification("notify_sum", |_p| Ok(()))?;
        Ok(())
    })();
    // The names above are fixed, distinct and unreserved.
    debug_assert!(r.is_ok());
    b
}

/// The frozen demo registry.
pub fn registry() -> Registry {
    builder().freeze()
}

/// An engine serving the demo methods under `config`.
pub fn engine(config: Config) -> Engine {
    Engine::new(registry(), config)
}
