//! Metrics: counters and histograms per thread on plain atomics, merged when scraped,
//! and written in the Prometheus text format (0.0.4).
//!
//! Each thread that answers calls writes to a shard of its own (a reactor claims one
//! when it starts; any other thread through a thread-local claim), so a count is a load
//! and a store, never a locked instruction or a shared cache line. A scrape adds the
//! shards up. Method labels are the registered names, fixed when the engine is built:
//! any other name is counted as `method="unknown"`, so callers cannot grow the series.
//!
//! ```
//! use ringrpc::{demo, Config, Engine};
//!
//! let engine = Engine::new(demo::registry(), Config::default());
//! let (mut scratch, mut out) = (engine.scratch(), Vec::new());
//! engine.handle(br#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#, &mut scratch, &mut out);
//! let text = engine.metrics().expect("on by default").render();
//! assert!(text.contains(r#"ringrpc_requests_total{method="add",transport="embedded",code="0"} 1"#));
//! ```

pub(crate) mod histogram;
mod process;

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::dispatch::context::Transport;
use histogram::{Ticks, BATCH_BOUNDS, BATCH_BUCKETS, DURATION_BOUNDS, DURATION_BUCKETS};

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Transports, as label values, in [`Transport::index`] order.
const TRANSPORTS: [Transport; 6] = [
    Transport::Tcp,
    Transport::Unix,
    Transport::Http,
    Transport::Stdio,
    Transport::WebSocket,
    Transport::Embedded,
];

/// Calls held until the flush: `calls` answered one after another with the same method
/// index, transport and error code, counted as one run (a pipelined read is mostly
/// one method: counting each call on its own cost ~25 instructions a call).
#[derive(Clone, Copy)]
struct Held {
    method: u32,
    transport: Transport,
    code: Option<i32>,
    calls: u32,
}

impl Held {
    /// No calls.
    const NONE: Self = Self {
        method: 0,
        transport: Transport::Embedded,
        code: None,
        calls: 0,
    };

    /// Method, transport and code as two words, compared at once.
    #[inline(always)]
    fn key(&self) -> (u64, i64) {
        (
            u64::from(self.method) | (self.transport.index() as u64) << 32,
            // Outside `i32`: no code.
            self.code.map_or(i64::MIN, i64::from),
        )
    }
}

/// Calls a [`Local`] holds until it counts them (a flush comes at least this often).
const PENDING: usize = 512;

/// Code slots per (method, transport): 0 is success, the last is every code past the
/// table's capacity (`code="other"`).
const CODES: usize = 32;
const OTHER: usize = CODES - 1;
/// An empty code slot.
const EMPTY: i64 = i64::MIN;

/// The codes the engine itself sends, given slots up front.
const ENGINE_CODES: [i32; 13] = [
    crate::error::PARSE_ERROR,
    crate::error::INVALID_REQUEST,
    crate::error::METHOD_NOT_FOUND,
    crate::error::INVALID_PARAMS,
    crate::error::INTERNAL_ERROR,
    crate::error::SERVER_BUSY,
    crate::error::REQUEST_TIMEOUT,
    crate::error::RESPONSE_TOO_LARGE,
    crate::error::LIMIT_EXCEEDED,
    crate::error::UNAUTHENTICATED,
    crate::error::PERMISSION_DENIED,
    crate::error::IN_PROGRESS,
    crate::error::FINGERPRINT_MISMATCH,
];

/// Events counted on their own (also visible by code in `ringrpc_requests_total`, but
/// operators alert on these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A caller's credentials were missing or refused (HTTP 401, `-32040`).
    AuthFailure,
    /// A call refused by a rate limit (`-32005`).
    RateLimited,
    /// A retried call answered from the de-duplication store.
    DedupReplay,
    /// A call answered `-32001` because its deadline passed.
    DeadlineExceeded,
    /// An HTTP request answered with an error status before any call was read.
    HttpRefused,
    /// A connection closed as soon as accepted: `max_connections` were open.
    ConnectionRefused,
}

const EVENTS: [(Event, &str, &str); 6] = [
    (
        Event::AuthFailure,
        "ringrpc_auth_failures_total",
        "Requests and calls refused for missing or unknown credentials.",
    ),
    (
        Event::RateLimited,
        "ringrpc_rate_limited_total",
        "Calls refused by a rate limit.",
    ),
    (
        Event::DedupReplay,
        "ringrpc_dedup_replays_total",
        "Retried calls answered from the de-duplication store.",
    ),
    (
        Event::DeadlineExceeded,
        "ringrpc_deadline_exceeded_total",
        "Calls answered -32001 because their deadline passed.",
    ),
    (
        Event::HttpRefused,
        "ringrpc_http_refused_total",
        "HTTP requests answered with an error status before any call was read (400, 403, 404, 405, 408, 411, 413, 415, 426, 431).",
    ),
    (
        Event::ConnectionRefused,
        "ringrpc_connections_refused_total",
        "Connections closed as soon as accepted because max_connections were open.",
    ),
];

/// The label of method slot `i` of `names` past the registered ones.
const UNKNOWN: &str = "unknown";
const FALLBACK: &str = "fallback";

/// One thread's counters. Written by one thread only (the [`Local`] that claimed it),
/// read by scrapes: relaxed loads and stores, no read-modify-write.
#[derive(Debug)]
pub(crate) struct Shard {
    /// Calls answered with a result, by (method, transport, duration bucket): one
    /// count per call is both its `ringrpc_requests_total` and its histogram bucket.
    ok: Box<[AtomicU64]>,
    /// Calls answered with an error, by (method, transport, code slot).
    errors: Box<[AtomicU64]>,
    /// Their duration buckets, by (method, bucket).
    error_buckets: Box<[AtomicU64]>,
    /// Per method, the sum of durations in ticks.
    sums: Box<[AtomicU64]>,
    /// The batch size buckets, then the sum of sizes.
    batch: [AtomicU64; BATCH_BUCKETS + 1],
    received: [AtomicU64; TRANSPORTS.len()],
    sent: [AtomicU64; TRANSPORTS.len()],
    events: [AtomicU64; EVENTS.len()],
    /// Gauges: what this thread opened minus what it closed.
    connections: [AtomicI64; TRANSPORTS.len()],
}

/// Adds `n` to a counter only this thread writes: a load and a store, no locked
/// instruction.
#[inline(always)]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

#[inline(always)]
fn shift(g: &AtomicI64, n: i64) {
    g.store(g.load(Relaxed).wrapping_add(n), Relaxed);
}

impl Shard {
    fn new(methods: usize) -> Self {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        Self {
            ok: zeros(methods * TRANSPORTS.len() * DURATION_BUCKETS),
            errors: zeros(methods * TRANSPORTS.len() * CODES),
            error_buckets: zeros(methods * DURATION_BUCKETS),
            sums: zeros(methods),
            batch: Default::default(),
            received: Default::default(),
            sent: Default::default(),
            events: Default::default(),
            connections: Default::default(),
        }
    }
}

/// A server's work queue length, `None` once the server stopped.
type QueueLen = Box<dyn Fn() -> Option<usize> + Send + Sync>;
/// A part of the scrape rendered elsewhere.
type Section = Box<dyn Fn(&mut String) + Send + Sync>;

/// What the shards and the scrape share.
struct Shared {
    /// Tells the registries of several engines apart in a thread's claims.
    id: u64,
    /// Method labels: the registered names in metric-index order, then `unknown` and
    /// `fallback`.
    names: Box<[Box<str>]>,
    /// The code of each slot (slot 0, success, and `OTHER` stay `EMPTY`).
    codes: [AtomicI64; CODES],
    /// The clock, calibrated on first use (~1 ms, up to 200 ms on a loaded machine,
    /// once per process), so an engine without metrics never pays it.
    ticks: OnceLock<Ticks>,
    /// Every shard made, claimed or free.
    shards: Mutex<Vec<Arc<Shard>>>,
    /// Shards whose thread let them go, for the next claim.
    free: Mutex<Vec<Arc<Shard>>>,
    /// Calls taken for later and not answered yet (changed only off the inline path,
    /// where a shared atomic costs nothing next to the hand-off).
    inflight: AtomicI64,
    /// Counters kept elsewhere (the access log's dropped lines): name, help, value.
    counters: Mutex<Vec<(&'static str, &'static str, Arc<AtomicU64>)>>,
    /// Queue lengths to report as `ringrpc_pool_queue_depth` (one per running server;
    /// `None` once it stopped).
    queues: Mutex<Vec<QueueLen>>,
    /// Families rendered by other parts (the proxy's histograms).
    sections: Mutex<Vec<Section>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("methods", &self.names.len())
            .finish_non_exhaustive()
    }
}

/// An engine's metrics: what [`Engine::metrics`](crate::Engine::metrics) returns, for a
/// host application to serve on an endpoint of its own.
#[derive(Clone, Debug)]
pub struct Metrics {
    shared: Arc<Shared>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Metrics {
    /// Metrics for the registered methods `names`, in metric-index order.
    pub(crate) fn new(names: Vec<Box<str>>) -> Self {
        let mut names = names;
        names.push(UNKNOWN.into());
        names.push(FALLBACK.into());
        let codes: [AtomicI64; CODES] = std::array::from_fn(|_| AtomicI64::new(EMPTY));
        for (slot, code) in codes[1..].iter().zip(ENGINE_CODES) {
            slot.store(i64::from(code), Relaxed);
        }
        Self {
            shared: Arc::new(Shared {
                id: NEXT_ID.fetch_add(1, Relaxed),
                names: names.into_boxed_slice(),
                codes,
                ticks: OnceLock::new(),
                shards: Mutex::new(Vec::new()),
                free: Mutex::new(Vec::new()),
                inflight: AtomicI64::new(0),
                counters: Mutex::new(Vec::new()),
                queues: Mutex::new(Vec::new()),
                sections: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The metric index of calls to unregistered methods.
    pub(crate) fn unknown(methods: usize) -> u32 {
        u32::try_from(methods).unwrap_or(u32::MAX)
    }

    /// The metric index of calls the fallback answers.
    pub(crate) fn fallback(methods: usize) -> u32 {
        Self::unknown(methods).saturating_add(1)
    }

    /// A shard for the calling thread to write alone, until the [`Local`] is dropped.
    pub(crate) fn claim(&self) -> Local {
        let s = &self.shared;
        let reused = s.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let shard = reused.unwrap_or_else(|| {
            let shard = Arc::new(Shard::new(s.names.len()));
            s.shards
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Arc::clone(&shard));
            shard
        });
        let ticks = s.ticks.get_or_init(Ticks::new).clone();
        Local {
            shard,
            mark: Cell::new(ticks.now()),
            pending: (0..PENDING).map(|_| Cell::new(Held::NONE)).collect(),
            held: Cell::new(0),
            run: Cell::new(Held::NONE),
            run_key: Cell::new(Held::NONE.key()),
            run_calls: Cell::new(0),
            ticks,
            methods: s.names.len(),
            shared: Arc::clone(s),
        }
    }

    /// Runs `f` with the calling thread's claim (made on first use, kept while the
    /// thread lives: for embedders calling the engine from threads of their own).
    pub(crate) fn with_local<R>(&self, f: impl FnOnce(&Local) -> R) -> R {
        /// Claims kept per thread, across engines; the oldest is let go past this.
        const KEPT: usize = 4;
        thread_local! {
            static CLAIMS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
        }
        let f = Cell::new(Some(f));
        let run = |l: &Local| f.take().map(|f| f(l));
        let done = CLAIMS.try_with(|claims| {
            // Nested (a handler calling the engine): the claim is in use, take another.
            let Ok(mut claims) = claims.try_borrow_mut() else {
                return None;
            };
            let i = match claims.iter().position(|l| l.shared.id == self.shared.id) {
                Some(i) => i,
                None => {
                    if claims.len() >= KEPT {
                        claims.remove(0);
                    }
                    claims.push(self.claim());
                    claims.len() - 1
                }
            };
            run(&claims[i])
        });
        match done {
            Ok(Some(r)) => r,
            _ => run(&self.claim()).unwrap_or_else(|| unreachable!("f runs once")),
        }
    }

    /// Reports a counter kept elsewhere in every scrape.
    pub(crate) fn add_counter(
        &self,
        name: &'static str,
        help: &'static str,
        value: Arc<AtomicU64>,
    ) {
        let mut counters = self
            .shared
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counters.retain(|(n, ..)| *n != name);
        counters.push((name, help, value));
    }

    /// Reports the length of a server's work queue in every scrape, while `len` returns
    /// `Some`.
    pub(crate) fn add_queue(&self, len: impl Fn() -> Option<usize> + Send + Sync + 'static) {
        self.shared
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(len));
    }

    /// Renders `section` (whole metric families, with their HELP and TYPE lines) into
    /// every scrape.
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) fn add_section(&self, section: impl Fn(&mut String) + Send + Sync + 'static) {
        self.shared
            .sections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(section));
    }

    /// The metrics now, in the Prometheus text exposition format 0.0.4 (serve it with
    /// [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let s = &self.shared;
        let shards: Vec<Arc<Shard>> = s
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let sum = |f: &dyn Fn(&Shard) -> u64| shards.iter().map(|sh| f(sh)).sum::<u64>();
        let gauge = |f: &dyn Fn(&Shard) -> i64| shards.iter().map(|sh| f(sh)).sum::<i64>();
        let mut out = String::with_capacity(4096);

        head(&mut out, "ringrpc_requests_total", "counter", "Calls answered (each batch element, notifications included), by method, transport and JSON-RPC error code (\"0\": a result).");
        let codes: Vec<i64> = s.codes.iter().map(|c| c.load(Relaxed)).collect();
        for (m, name) in s.names.iter().enumerate() {
            for (t, transport) in TRANSPORTS.iter().enumerate() {
                for (slot, code) in codes.iter().enumerate() {
                    let n = match slot {
                        0 => {
                            let at = (m * TRANSPORTS.len() + t) * DURATION_BUCKETS;
                            sum(&|sh| {
                                sh.ok[at..at + DURATION_BUCKETS]
                                    .iter()
                                    .map(|c| c.load(Relaxed))
                                    .sum()
                            })
                        }
                        _ => {
                            let i = (m * TRANSPORTS.len() + t) * CODES + slot;
                            sum(&|sh| sh.errors[i].load(Relaxed))
                        }
                    };
                    // A slot being claimed as this scrape read the codes (counted, its
                    // code not yet seen here): shown by the next scrape.
                    if n == 0 || (slot != 0 && slot != OTHER && *code == EMPTY) {
                        continue;
                    }
                    out.push_str("ringrpc_requests_total{method=\"");
                    escape(&mut out, name);
                    let _ = write!(out, "\",transport=\"{}\",code=\"", transport.as_str());
                    match slot {
                        0 => out.push('0'),
                        OTHER => out.push_str("other"),
                        _ => {
                            let _ = write!(out, "{code}");
                        }
                    }
                    let _ = writeln!(out, "\"}} {n}");
                }
            }
        }

        let name = "ringrpc_request_duration_seconds";
        head(&mut out, name, "histogram", "Time from reading a call to its answer, by method (a call answered inline: from the read, or the end of the call before it in the same read, to its answer; a call answered later: from when its frame was taken up).");
        for (m, method) in s.names.iter().enumerate() {
            let buckets: Vec<u64> = (0..DURATION_BUCKETS)
                .map(|b| {
                    sum(&|sh| {
                        let ok: u64 = (0..TRANSPORTS.len())
                            .map(|t| {
                                sh.ok[(m * TRANSPORTS.len() + t) * DURATION_BUCKETS + b]
                                    .load(Relaxed)
                            })
                            .sum();
                        ok + sh.error_buckets[m * DURATION_BUCKETS + b].load(Relaxed)
                    })
                })
                .collect();
            let count: u64 = buckets.iter().sum();
            if count == 0 {
                continue;
            }
            let ticks = sum(&|sh| sh.sums[m].load(Relaxed));
            let mut label = String::from("method=\"");
            escape(&mut label, method);
            label.push('"');
            histogram(
                &mut out,
                name,
                &label,
                &DURATION_BOUNDS,
                &buckets,
                s.ticks.get_or_init(Ticks::new).seconds(ticks),
            );
        }

        let name = "ringrpc_batch_size";
        head(&mut out, name, "histogram", "Elements per batch.");
        let buckets: Vec<u64> = (0..BATCH_BUCKETS)
            .map(|b| sum(&|sh| sh.batch[b].load(Relaxed)))
            .collect();
        let total = sum(&|sh| sh.batch[BATCH_BUCKETS].load(Relaxed));
        histogram(&mut out, name, "", &BATCH_BOUNDS, &buckets, total as f64);

        head(
            &mut out,
            "ringrpc_inflight_calls",
            "gauge",
            "Calls read and not yet answered (on the pool, or waiting for a responder).",
        );
        let _ = writeln!(
            out,
            "ringrpc_inflight_calls {}",
            s.inflight.load(Relaxed).max(0)
        );
        head(
            &mut out,
            "ringrpc_connections",
            "gauge",
            "Open connections, by transport.",
        );
        for (t, transport) in TRANSPORTS.iter().enumerate().take(5) {
            let n = gauge(&|sh| sh.connections[t].load(Relaxed)).max(0);
            let _ = writeln!(
                out,
                "ringrpc_connections{{transport=\"{}\"}} {n}",
                transport.as_str()
            );
        }
        head(
            &mut out,
            "ringrpc_pool_queue_depth",
            "gauge",
            "Blocking calls waiting for a worker.",
        );
        let depth: usize = s
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|q| q())
            .sum();
        let _ = writeln!(out, "ringrpc_pool_queue_depth {depth}");
        for (name, help, pick) in [
            (
                "ringrpc_bytes_received_total",
                "Bytes read from clients, by transport.",
                true,
            ),
            (
                "ringrpc_bytes_sent_total",
                "Bytes written to clients, by transport.",
                false,
            ),
        ] {
            head(&mut out, name, "counter", help);
            for (t, transport) in TRANSPORTS.iter().enumerate().take(5) {
                let n = sum(&|sh| if pick { &sh.received } else { &sh.sent }[t].load(Relaxed));
                let _ = writeln!(out, "{name}{{transport=\"{}\"}} {n}", transport.as_str());
            }
        }
        for (i, (_, name, help)) in EVENTS.iter().enumerate() {
            head(&mut out, name, "counter", help);
            let _ = writeln!(out, "{name} {}", sum(&|sh| sh.events[i].load(Relaxed)));
        }
        for (name, help, value) in s
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            head(&mut out, name, "counter", help);
            let _ = writeln!(out, "{name} {}", value.load(Relaxed));
        }
        for section in s
            .sections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            section(&mut out);
        }
        process::encode(&mut out);
        out
    }
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Writes one histogram's series (`buckets` not cumulative; the last is `+Inf`).
fn histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    bounds: &[f64],
    buckets: &[u64],
    sum: f64,
) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut acc = 0u64;
    for (i, n) in buckets.iter().enumerate() {
        acc += n;
        match bounds.get(i) {
            Some(le) => {
                let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le:?}\"}} {acc}");
            }
            None => {
                let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {acc}");
            }
        }
    }
    let braces = |out: &mut String| {
        if !labels.is_empty() {
            let _ = write!(out, "{{{labels}}}");
        }
    };
    out.push_str(name);
    out.push_str("_sum");
    braces(out);
    let _ = writeln!(out, " {sum:?}");
    out.push_str(name);
    out.push_str("_count");
    braces(out);
    let _ = writeln!(out, " {acc}");
}

/// A label value: `\`, `"` and newlines escaped.
fn escape(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A thread's claim on a shard: what records. Not `Sync` (each shard has one writer);
/// the shard goes back to the free list when the claim is dropped.
pub(crate) struct Local {
    shard: Arc<Shard>,
    /// A copy of the shared clock: read without an indirection.
    ticks: Ticks,
    /// Method labels (the registered ones, `unknown`, `fallback`).
    methods: usize,
    shared: Arc<Shared>,
    /// When the calls being answered were read (ticks).
    mark: Cell<u64>,
    /// Calls answered since the last flush: (method, transport, code); `held` of them.
    pending: Box<[Cell<Held>]>,
    held: Cell<usize>,
    /// The run of calls being held, not yet in `pending` (kept apart: adding a call to
    /// it is two compares and a store, no index): its method, transport and code (its
    /// `calls` are `run_calls`), the same as a key, and how many (0: none).
    run: Cell<Held>,
    run_key: Cell<(u64, i64)>,
    run_calls: Cell<u32>,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("methods", &self.methods)
            .finish_non_exhaustive()
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.shared
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&self.shard));
    }
}

impl Local {
    /// Bytes were read (a reactor), or a frame is handed to the engine (an embedder):
    /// the next call's time counts from here.
    #[inline(always)]
    pub(crate) fn start(&self) {
        self.mark.set(self.ticks.now());
    }

    /// A call to the method of metric index `method`, answered now with `code` (`None`:
    /// a result). Counted at the next [`Local::flush`], with the time from the last
    /// [`Local::start`] to then: the calls answered from one read leave in one write
    /// when it is done, so that is when each of their answers is ready. (Reading the
    /// clock per call instead cost ~16 ns a call, 4–5 % of a pipelined request.)
    #[inline(always)]
    pub(crate) fn call(&self, method: u32, transport: Transport, code: Option<i32>) {
        let held = Held {
            method,
            transport,
            code,
            calls: 1,
        };
        let key = held.key();
        let calls = self.run_calls.get();
        // The same as the call before: one more in its run. (An empty run that matches
        // becomes a run of one.)
        if self.run_key.get() == key && calls < u32::MAX {
            self.run_calls.set(calls + 1);
            return;
        }
        self.hold();
        self.run.set(held);
        self.run_key.set(key);
        self.run_calls.set(1);
    }

    /// Puts the run being held into `pending`; if that is full (a read of thousands of
    /// calls, mixed), counts everything held now instead.
    #[inline(never)]
    fn hold(&self) {
        let calls = self.run_calls.get();
        if calls == 0 {
            return;
        }
        let run = Held {
            calls,
            ..self.run.get()
        };
        let n = self.held.get();
        match self.pending.get(n) {
            Some(slot) => {
                slot.set(run);
                self.held.set(n + 1);
            }
            None => self.flush(),
        }
    }

    /// Counts the calls answered since the last flush, each with the time since the
    /// last [`Local::start`]: once per socket read on a reactor, once per frame for an
    /// embedder.
    #[inline]
    pub(crate) fn flush(&self) {
        let n = self.held.replace(0);
        let calls = self.run_calls.replace(0);
        if n == 0 && calls == 0 {
            return;
        }
        let took = self.ticks.now().saturating_sub(self.mark.get());
        // One duration for all of them: one bucket.
        let b = self.ticks.bucket(took);
        for slot in self.pending.iter().take(n) {
            let h = slot.get();
            self.count(h.method, h.transport, h.code, took, b, u64::from(h.calls));
        }
        // (Apart, not chained on: the chain cost HTTP's one call a read ~60
        // instructions.)
        if calls > 0 {
            let h = self.run.get();
            self.count(h.method, h.transport, h.code, took, b, u64::from(calls));
        }
    }

    /// A call answered later, `took` after it was read.
    pub(crate) fn call_took(
        &self,
        method: u32,
        transport: Transport,
        code: Option<i32>,
        took: std::time::Duration,
    ) {
        let ticks = self.ticks.ticks_of(took);
        self.record(method, transport, code, ticks);
    }

    /// Counts a call: a result is one count (its method, transport and duration bucket
    /// together) and the duration's sum; an error is counted by code, out of line.
    fn record(&self, method: u32, transport: Transport, code: Option<i32>, ticks: u64) {
        self.count(method, transport, code, ticks, self.ticks.bucket(ticks), 1);
    }

    /// [`Local::record`] for `calls` calls that each took `ticks`, the duration's
    /// bucket `b` known.
    #[inline(always)]
    fn count(
        &self,
        method: u32,
        transport: Transport,
        code: Option<i32>,
        ticks: u64,
        b: usize,
        calls: u64,
    ) {
        // Past the registered methods (and `unknown`, `fallback`): `unknown`.
        let m = match method as usize {
            m if m < self.methods => m,
            _ => self.methods - 2,
        };
        match code {
            None => {
                let i = (m * TRANSPORTS.len() + transport.index()) * DURATION_BUCKETS + b;
                if let Some(c) = self.shard.ok.get(i) {
                    bump(c, calls);
                }
            }
            Some(code) => self.error(m, transport, code, b, calls),
        }
        if let Some(s) = self.shard.sums.get(m) {
            bump(s, ticks.wrapping_mul(calls));
        }
    }

    /// [`Local::record`] for `calls` calls answered with error `code`.
    #[cold]
    fn error(&self, m: usize, transport: Transport, code: i32, bucket: usize, calls: u64) {
        let slot = self.code_slot(code);
        let i = (m * TRANSPORTS.len() + transport.index()) * CODES + slot;
        if let Some(c) = self.shard.errors.get(i) {
            bump(c, calls);
        }
        if let Some(c) = self.shard.error_buckets.get(m * DURATION_BUCKETS + bucket) {
            bump(c, calls);
        }
    }

    /// The slot of error `code`: found, or given the first empty one, or `OTHER`.
    #[cold]
    fn code_slot(&self, code: i32) -> usize {
        let code = i64::from(code);
        let codes = &self.shared.codes;
        for (i, slot) in codes.iter().enumerate().take(OTHER).skip(1) {
            let mut seen = slot.load(Relaxed);
            if seen == EMPTY {
                // Threads race for empty slots: the loser looks again at what won.
                seen = match slot.compare_exchange(EMPTY, code, Relaxed, Relaxed) {
                    Ok(_) => return i,
                    Err(now) => now,
                };
            }
            if seen == code {
                return i;
            }
        }
        OTHER
    }

    /// A batch of `len` elements.
    #[inline]
    pub(crate) fn batch(&self, len: usize) {
        bump(&self.shard.batch[histogram::batch_bucket(len)], 1);
        bump(&self.shard.batch[BATCH_BUCKETS], len as u64);
    }

    /// An event.
    #[cold]
    pub(crate) fn event(&self, e: Event) {
        if let Some(i) = EVENTS.iter().position(|(x, ..)| *x == e) {
            bump(&self.shard.events[i], 1);
        }
    }

    /// `n` bytes read from a client.
    #[inline]
    pub(crate) fn received(&self, transport: Transport, n: usize) {
        bump(&self.shard.received[transport.index()], n as u64);
    }

    /// `n` bytes written to a client.
    #[inline]
    pub(crate) fn sent(&self, transport: Transport, n: usize) {
        bump(&self.shard.sent[transport.index()], n as u64);
    }

    /// A connection opened (`+1`) or closed (`-1`).
    pub(crate) fn connections(&self, transport: Transport, delta: i64) {
        shift(&self.shard.connections[transport.index()], delta);
    }

    /// `n` calls taken for later: in flight until [`Inflight::done`] or the
    /// [`Inflight`] is dropped (their connection closed).
    pub(crate) fn inflight(&self, n: usize) -> Inflight {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.shared.inflight.fetch_add(n, Relaxed);
        Inflight {
            shared: Arc::clone(&self.shared),
            left: n,
        }
    }
}

/// Calls of one frame answered later, counted in `ringrpc_inflight_calls` until they
/// are answered or given up.
pub(crate) struct Inflight {
    shared: Arc<Shared>,
    left: i64,
}

impl Inflight {
    /// One of them was answered.
    pub(crate) fn done(&mut self) {
        if self.left > 0 {
            self.left -= 1;
            self.shared.inflight.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.shared.inflight.fetch_sub(self.left, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(vec!["add".into(), "a\"b".into()])
    }

    fn line<'t>(text: &'t str, prefix: &str) -> Option<&'t str> {
        text.lines()
            .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
    }

    #[test]
    fn counts_merge_across_threads_and_claims() {
        let m = metrics();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.with_local(|l| {
                            l.start();
                            l.call(0, Transport::Tcp, None);
                            l.flush();
                        });
                    }
                    let l = m.claim();
                    l.call(0, Transport::Tcp, Some(-32602));
                    l.call(7, Transport::Http, Some(42));
                    l.flush();
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no panic");
        }
        let text = m.render();
        let ok = r#"ringrpc_requests_total{method="add",transport="tcp",code="0"}"#;
        assert_eq!(line(&text, ok), Some(&*format!("{ok} 4000")), "{text}");
        let bad = r#"ringrpc_requests_total{method="add",transport="tcp",code="-32602"}"#;
        assert_eq!(line(&text, bad), Some(&*format!("{bad} 4")), "{text}");
        // An index past the registered methods is `unknown`.
        let unknown = r#"ringrpc_requests_total{method="unknown",transport="http",code="42"}"#;
        assert_eq!(
            line(&text, unknown),
            Some(&*format!("{unknown} 4")),
            "{text}"
        );
        let count = r#"ringrpc_request_duration_seconds_count{method="add"}"#;
        assert_eq!(line(&text, count), Some(&*format!("{count} 4004")));
        let inf = r#"ringrpc_request_duration_seconds_bucket{method="add",le="+Inf"}"#;
        assert_eq!(line(&text, inf), Some(&*format!("{inf} 4004")));
        // Shards are reused, not made per thread.
        assert!(m.shared.shards.lock().map(|s| s.len()).unwrap_or(0) <= 8);
    }

    #[test]
    fn a_read_of_more_calls_than_are_held_counts_them_all() {
        let m = metrics();
        let l = m.claim();
        l.start();
        for _ in 0..PENDING * 3 + 7 {
            l.call(0, Transport::Tcp, None);
        }
        l.flush();
        l.flush();
        let text = m.render();
        let ok = r#"ringrpc_requests_total{method="add",transport="tcp",code="0"}"#;
        assert_eq!(line(&text, ok), Some(&*format!("{ok} {}", PENDING * 3 + 7)));
    }

    #[test]
    fn runs_of_like_calls_and_mixed_reads_past_the_slots_count_exactly() {
        let m = metrics();
        let l = m.claim();
        l.start();
        // Alternating methods: every call a run of its own, past the held slots (so
        // counted mid-read).
        for i in 0..PENDING * 2 + 5 {
            l.call(u32::from(i % 2 == 1), Transport::Tcp, None);
        }
        // Long runs, broken by another code, and an index past the methods.
        for _ in 0..1000 {
            l.call(0, Transport::Http, None);
        }
        l.call(0, Transport::Http, Some(-32602));
        l.call(0, Transport::Http, None);
        l.call(9, Transport::Http, None);
        l.flush();
        l.flush();
        let text = m.render();
        let tcp = r#"ringrpc_requests_total{method="add",transport="tcp",code="0"}"#;
        assert_eq!(line(&text, tcp), Some(&*format!("{tcp} {}", PENDING + 3)));
        let http = r#"ringrpc_requests_total{method="add",transport="http",code="0"}"#;
        assert_eq!(line(&text, http), Some(&*format!("{http} 1001")), "{text}");
        let bad = r#"ringrpc_requests_total{method="add",transport="http",code="-32602"}"#;
        assert_eq!(line(&text, bad), Some(&*format!("{bad} 1")), "{text}");
        let unknown = r#"ringrpc_requests_total{method="unknown",transport="http",code="0"}"#;
        assert_eq!(line(&text, unknown), Some(&*format!("{unknown} 1")));
        let count = r#"ringrpc_request_duration_seconds_count{method="add"}"#;
        let all = PENDING + 3 + 1002;
        assert_eq!(line(&text, count), Some(&*format!("{count} {all}")));
    }

    #[test]
    fn codes_past_the_table_are_other() {
        let m = metrics();
        let l = m.claim();
        for code in 1..100 {
            l.call(0, Transport::Unix, Some(code));
        }
        l.flush();
        let text = m.render();
        let other = r#"ringrpc_requests_total{method="add",transport="unix",code="other"}"#;
        // 32 slots: success, 13 engine codes, other: 17 left for application codes.
        assert_eq!(
            line(&text, other),
            Some(&*format!("{other} {}", 99 - 17)),
            "{text}"
        );
        let one = r#"ringrpc_requests_total{method="add",transport="unix",code="1"}"#;
        assert_eq!(line(&text, one), Some(&*format!("{one} 1")));
    }

    #[test]
    fn labels_are_escaped_and_histograms_cumulative() {
        let m = metrics();
        let l = m.claim();
        l.call_took(
            1,
            Transport::Stdio,
            None,
            std::time::Duration::from_micros(3),
        );
        l.call_took(
            1,
            Transport::Stdio,
            None,
            std::time::Duration::from_secs(20),
        );
        l.batch(3);
        l.batch(1000);
        let text = m.render();
        let b = r#"ringrpc_request_duration_seconds_bucket{method="a\"b",le="5e-6"}"#;
        assert_eq!(line(&text, b), Some(&*format!("{b} 1")), "{text}");
        let b = r#"ringrpc_request_duration_seconds_bucket{method="a\"b",le="10.0"}"#;
        assert_eq!(line(&text, b), Some(&*format!("{b} 1")), "{text}");
        let sum = r#"ringrpc_request_duration_seconds_sum{method="a\"b"}"#;
        let v: f64 = line(&text, sum).expect("sum")[sum.len() + 1..]
            .parse()
            .expect("f64");
        assert!((v - 20.000003).abs() < 1e-3, "{v}");
        assert!(
            text.contains("ringrpc_batch_size_bucket{le=\"4.0\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("ringrpc_batch_size_bucket{le=\"1024.0\"} 2\n"));
        assert!(text.contains("ringrpc_batch_size_sum 1003.0\n"));
        assert!(text.contains("ringrpc_batch_size_count 2\n"));
    }

    #[test]
    fn gauges_and_events() {
        let m = metrics();
        let a = m.claim();
        let b = m.claim();
        a.connections(Transport::Http, 1);
        a.connections(Transport::Http, 1);
        b.connections(Transport::Http, -1);
        let mut three = a.inflight(3);
        three.done();
        let gone = b.inflight(5);
        drop(gone);
        a.event(Event::RateLimited);
        b.event(Event::RateLimited);
        a.received(Transport::Tcp, 10);
        b.sent(Transport::Tcp, 7);
        m.add_queue(|| Some(5));
        m.add_queue(|| None);
        let text = m.render();
        for want in [
            "ringrpc_connections{transport=\"http\"} 1\n",
            "ringrpc_inflight_calls 2\n",
            "ringrpc_rate_limited_total 2\n",
            "ringrpc_auth_failures_total 0\n",
            "ringrpc_bytes_received_total{transport=\"tcp\"} 10\n",
            "ringrpc_bytes_sent_total{transport=\"tcp\"} 7\n",
            "ringrpc_pool_queue_depth 5\n",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }
}
