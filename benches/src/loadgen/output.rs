//! What is reported: the live progress line, the JSON summary of a run, the comparison
//! table and the `--json` file.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::plan::Plan;
use super::stats::{Stats, PROBLEMS};
use super::Args;

/// What a worker publishes for the progress line.
#[derive(Default)]
pub(crate) struct Progress {
    pub(crate) responses: AtomicU64,
    pub(crate) problems: AtomicU64,
    /// The p99 of the thread's measured latencies so far (ns), refreshed each second.
    pub(crate) p99_ns: AtomicU64,
    pub(crate) done: AtomicBool,
}

/// Prints the progress line once a second on stderr while a run lasts, when stderr is
/// a terminal (rewritten in place); quiet otherwise, so logs and pipes get only the
/// summary.
pub(crate) fn watch(progress: &[Arc<Progress>], start: Instant, plan: &Plan, name: &str) {
    let live = std::io::stderr().is_terminal();
    let mut tick = 1u64;
    let mut last = 0u64;
    while !progress.iter().all(|p| p.done.load(Ordering::SeqCst)) {
        let due = start + Duration::from_secs(tick);
        let now = Instant::now();
        if now < due {
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
            continue;
        }
        tick += 1;
        let total: u64 = progress
            .iter()
            .map(|p| p.responses.load(Ordering::Relaxed))
            .sum();
        if !live {
            last = total;
            continue;
        }
        let problems: u64 = progress
            .iter()
            .map(|p| p.problems.load(Ordering::Relaxed))
            .sum();
        // The threads' largest: an upper bound of the run's p99 so far.
        let p99 = progress
            .iter()
            .map(|p| p.p99_ns.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        let phase = if due <= start + plan.warmup {
            "  (warm-up)"
        } else {
            ""
        };
        eprint!(
            "\r\x1b[K{name} [{:>6.1}s] {:>9} msg/s  errors {problems}  p99 {}{phase}",
            now.duration_since(start).as_secs_f64(),
            total - last,
            human_ns(p99)
        );
        last = total;
    }
    if live && tick > 1 {
        eprint!("\r\x1b[K");
    }
}

/// `850 µs`, `12.3 ms`, `1.20 s`.
pub(crate) fn human_ns(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// The JSON summary of a run, in this order (the first fields are the ones the scripts
/// in benches/scripts/ read).
#[derive(Serialize, Clone)]
pub(crate) struct Summary {
    pub(crate) transport: &'static str,
    pub(crate) connections: usize,
    pub(crate) depth: usize,
    pub(crate) batch: usize,
    pub(crate) threads: usize,
    pub(crate) duration_s: f64,
    /// Measured messages written and completely answered (a batch is one).
    pub(crate) requests: u64,
    pub(crate) responses: u64,
    pub(crate) errors: u64,
    pub(crate) mismatches: u64,
    /// Answered messages per second.
    pub(crate) rps: f64,
    /// Answered calls per second (= rps without batches).
    pub(crate) elements_per_s: f64,
    pub(crate) latency_us: Latency,
    pub(crate) target: String,
    pub(crate) mix: String,
    pub(crate) verify: bool,
    pub(crate) warmup_s: f64,
    pub(crate) elements: u64,
    /// Errors and mismatches by kind.
    pub(crate) problems: BTreeMap<&'static str, u64>,
    /// Open loop: the messages per second asked for, and the latency from each message's
    /// actual write (what a closed-loop tool would have reported); `latency_us` is then
    /// measured from each message's due time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) service_us: Option<Latency>,
    /// Latency by label: the method of single requests, `batch`, or a workload line's
    /// `name`.
    pub(crate) methods: BTreeMap<String, Method>,
    /// JSON-RPC error answers by code (`"none"`: an error without an integer code).
    pub(crate) error_codes: BTreeMap<String, u64>,
    /// Messages of notifications only, written during the measured time.
    pub(crate) notifications: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) workload: Option<String>,
}

/// One label's figures.
#[derive(Serialize, Clone)]
pub(crate) struct Method {
    /// Measured messages answered.
    pub(crate) count: u64,
    pub(crate) latency_us: Latency,
}

#[derive(Serialize, Clone, Copy)]
pub(crate) struct Latency {
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
    pub(crate) mean: f64,
}

impl Latency {
    /// The figures of `h` (nanoseconds) in microseconds, to 0.1 µs; zeros when empty.
    pub(crate) fn of(h: &Histogram<u64>) -> Latency {
        let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
        if h.is_empty() {
            return Latency {
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p999: 0.0,
                max: 0.0,
                mean: 0.0,
            };
        }
        let q = |x: f64| us(h.value_at_quantile(x));
        Latency {
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: us(h.max()),
            mean: (h.mean() / 100.0).round() / 10.0,
        }
    }
}

/// The summary of `stats`, measured over `duration_s`.
pub(crate) fn summarize(
    args: &Args,
    plan: &Plan,
    stats: &Stats,
    duration_s: f64,
    threads: usize,
) -> Summary {
    let per_s = |n: u64| {
        if duration_s > 0.0 {
            (n as f64 / duration_s).round()
        } else {
            0.0
        }
    };
    Summary {
        transport: plan.transport.name(),
        connections: args.connections,
        depth: args.depth,
        batch: args.batch,
        threads,
        duration_s: (duration_s * 1000.0).round() / 1000.0,
        requests: stats.requests,
        responses: stats.responses,
        errors: stats.errors(),
        mismatches: stats.mismatches(),
        rps: per_s(stats.responses),
        elements_per_s: per_s(stats.elements),
        latency_us: Latency::of(&stats.hist),
        target: plan.target.clone(),
        mix: if args.workload.is_some() {
            String::new()
        } else {
            args.mix.clone()
        },
        verify: plan.verify,
        warmup_s: plan.warmup.as_secs_f64(),
        elements: stats.elements,
        problems: PROBLEMS
            .iter()
            .zip(&stats.problems)
            .filter(|(_, &n)| n > 0)
            .map(|(p, &n)| (p.0, n))
            .collect(),
        rate: plan.rate,
        service_us: plan.rate.map(|_| Latency::of(&stats.service)),
        methods: plan
            .labels
            .iter()
            .zip(&stats.by_label)
            .filter(|(_, h)| !h.is_empty())
            .map(|(l, h)| {
                (
                    l.clone(),
                    Method {
                        count: h.len(),
                        latency_us: Latency::of(h),
                    },
                )
            })
            .collect(),
        error_codes: stats
            .error_codes
            .iter()
            .map(|(c, n)| (c.map_or_else(|| "none".to_string(), |c| c.to_string()), *n))
            .collect(),
        notifications: stats.notifications,
        workload: args
            .workload
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned()),
    }
}

/// The latency percentile curve of `h` (µs by percentile), HdrHistogram style: points
/// dense towards the tail, up to the largest value.
pub(crate) fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut points: Vec<(f64, f64)> = h
        .iter_quantiles(5)
        .map(|v| {
            (
                v.quantile_iterated_to(),
                v.value_iterated_to() as f64 / 1000.0,
            )
        })
        .filter(|(q, _)| *q < 1.0)
        .collect();
    points.push((1.0, h.max() as f64 / 1000.0));
    points
}

/// Each server's figures divided by the first's.
#[derive(Serialize)]
pub(crate) struct Ratios {
    pub(crate) name: String,
    pub(crate) to: String,
    pub(crate) rps: f64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
}

/// The ratios of every server after the first to the first (empty with one server).
pub(crate) fn ratios(servers: &[(&str, &Summary)]) -> Vec<Ratios> {
    let Some((first, base)) = servers.first() else {
        return Vec::new();
    };
    let r = |a: f64, b: f64| {
        if b > 0.0 {
            (a / b * 1000.0).round() / 1000.0
        } else {
            0.0
        }
    };
    servers[1..]
        .iter()
        .map(|(name, s)| Ratios {
            name: name.to_string(),
            to: first.to_string(),
            rps: r(s.rps, base.rps),
            p50: r(s.latency_us.p50, base.latency_us.p50),
            p90: r(s.latency_us.p90, base.latency_us.p90),
            p99: r(s.latency_us.p99, base.latency_us.p99),
            p999: r(s.latency_us.p999, base.latency_us.p999),
            max: r(s.latency_us.max, base.latency_us.max),
        })
        .collect()
}

/// The comparison table: one row per server, then the ratios to the first.
pub(crate) fn table(servers: &[(&str, &Summary)], open_loop: bool) -> String {
    use std::fmt::Write;
    let names = servers.iter().map(|(n, _)| n.chars().count());
    let width = names
        .clone()
        .chain(names.skip(1).map(|n| n + 3 + servers[0].0.chars().count()))
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = String::new();
    let ms = |us: f64| format!("{:.3}", us / 1000.0);
    let _ = writeln!(
        out,
        "{:<width$}  {:>10}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>7}  {:>7}",
        "server", "msg/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "errors", "wrong"
    );
    for (name, s) in servers {
        let l = &s.latency_us;
        let _ = writeln!(
            out,
            "{name:<width$}  {:>10}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>7}  {:>7}",
            s.rps,
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            ms(l.max),
            s.errors,
            s.mismatches
        );
    }
    for r in ratios(servers) {
        let x = |v: f64| format!("{v:.2}x");
        let _ = writeln!(
            out,
            "{:<width$}  {:>10}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}",
            format!("{} / {}", r.name, r.to),
            x(r.rps),
            x(r.p50),
            x(r.p90),
            x(r.p99),
            x(r.p999),
            x(r.max)
        );
    }
    if open_loop {
        out.push_str("(open loop: latency from each message's due time)\n");
    }
    out
}
