//! What is reported: the progress line's shared counters and the JSON summary.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::OnceLock;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

/// What a worker publishes for the progress line.
#[derive(Default)]
pub(crate) struct Progress {
    pub(crate) responses: AtomicU64,
    pub(crate) problems: AtomicU64,
    pub(crate) done: AtomicBool,
}

pub(crate) static START: OnceLock<Instant> = OnceLock::new();

/// The JSON summary, in this order.
#[derive(Serialize)]
pub(crate) struct Summary<'a> {
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
    pub(crate) target: &'a str,
    pub(crate) mix: &'a str,
    pub(crate) verify: bool,
    pub(crate) warmup_s: f64,
    pub(crate) elements: u64,
    /// Errors and mismatches by kind.
    pub(crate) problems: std::collections::BTreeMap<&'static str, u64>,
    /// Open loop: the messages per second asked for, and the latency from each message's
    /// actual write (what a closed-loop tool would have reported); `latency_us` is then
    /// measured from each message's due time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) service_us: Option<Latency>,
}

#[derive(Serialize)]
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
