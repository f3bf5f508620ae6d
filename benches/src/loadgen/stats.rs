//! Counters and latency histograms, per thread, merged at the end.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

#[derive(Clone, Copy)]
pub(crate) enum Problem {
    // Errors.
    Closed,
    Io,
    Stalled,
    Unanswered,
    BadFrame,
    BadResponse,
    RpcError,
    HttpStatus,
    // Mismatches.
    UnknownId,
    WrongResult,
    Missing,
}

pub(crate) const PROBLEMS: [(&str, bool); 11] = [
    ("closed_by_server", false),
    ("io", false),
    ("stalled", false),
    ("unanswered", false),
    ("bad_frame", false),
    ("bad_response", false),
    ("rpc_error", false),
    ("http_status", false),
    ("unknown_id", true),
    ("wrong_result", true),
    ("missing_answer", true),
];

/// Diagnostics printed per thread before going quiet.
pub(crate) const MAX_REPORTS: u32 = 8;

pub(crate) struct Stats {
    /// Measured messages written / completely answered, and their calls answered.
    pub(crate) requests: u64,
    pub(crate) responses: u64,
    pub(crate) elements: u64,
    /// All messages answered, warm-up included (for the progress line).
    pub(crate) all_responses: u64,
    pub(crate) problems: [u64; PROBLEMS.len()],
    /// Latency from each message's due time (ns).
    pub(crate) hist: Histogram<u64>,
    /// Open loop: latency from each message's actual write (ns), what a closed-loop tool
    /// would report for the same run.
    pub(crate) service: Histogram<u64>,
    /// Latency per label (the method of single requests, `batch`, or a workload line's
    /// name), indexed as `Plan::labels`.
    pub(crate) by_label: Vec<Histogram<u64>>,
    /// JSON-RPC error answers by their `code` (`None`: no integer code).
    pub(crate) error_codes: BTreeMap<Option<i64>, u64>,
    /// Messages of notifications only, written (measured): nothing answers them.
    pub(crate) notifications: u64,
    pub(crate) last_done: Option<Instant>,
    pub(crate) reports: u32,
    pub(crate) thread: usize,
    /// The highest id generation a message slot reached (the next run starts above).
    pub(crate) max_gen: u64,
}

impl Stats {
    pub(crate) fn new(thread: usize, labels: usize) -> Stats {
        Stats {
            requests: 0,
            responses: 0,
            elements: 0,
            all_responses: 0,
            problems: [0; PROBLEMS.len()],
            // 1 ns to 100 s, 3 significant digits; allocated once.
            hist: histogram(),
            service: histogram(),
            by_label: (0..labels).map(|_| histogram()).collect(),
            error_codes: BTreeMap::new(),
            notifications: 0,
            last_done: None,
            reports: 0,
            thread,
            max_gen: 0,
        }
    }

    /// Records one measured latency, overall and under its label.
    pub(crate) fn record(&mut self, label: usize, d: Duration) {
        let ns = nanos(d);
        self.hist.saturating_record(ns);
        if let Some(h) = self.by_label.get_mut(label) {
            h.saturating_record(ns);
        }
    }

    /// Records one measured service time (open loop).
    pub(crate) fn record_service(&mut self, d: Duration) {
        self.service.saturating_record(nanos(d));
    }

    pub(crate) fn problem(&mut self, p: Problem, n: u64, conn: usize, what: fmt::Arguments<'_>) {
        if n == 0 {
            return;
        }
        self.problems[p as usize] += n;
        if self.reports < MAX_REPORTS {
            eprintln!(
                "loadgen: connection {conn}: {}: {what}",
                PROBLEMS[p as usize].0
            );
        } else if self.reports == MAX_REPORTS {
            eprintln!(
                "loadgen: thread {}: further problems are counted, not printed",
                self.thread
            );
        }
        self.reports = self.reports.saturating_add(1);
    }

    pub(crate) fn errors(&self) -> u64 {
        PROBLEMS
            .iter()
            .zip(&self.problems)
            .filter(|(p, _)| !p.1)
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn mismatches(&self) -> u64 {
        PROBLEMS
            .iter()
            .zip(&self.problems)
            .filter(|(p, _)| p.1)
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn merge(&mut self, o: &Stats) {
        self.requests += o.requests;
        self.responses += o.responses;
        self.elements += o.elements;
        self.all_responses += o.all_responses;
        for (a, b) in self.problems.iter_mut().zip(&o.problems) {
            *a += b;
        }
        let _ = self.hist.add(&o.hist);
        let _ = self.service.add(&o.service);
        for (a, b) in self.by_label.iter_mut().zip(&o.by_label) {
            let _ = a.add(b);
        }
        for (code, n) in &o.error_codes {
            *self.error_codes.entry(*code).or_default() += n;
        }
        self.notifications += o.notifications;
        self.last_done = self.last_done.max(o.last_done);
        self.max_gen = self.max_gen.max(o.max_gen);
    }
}

/// 1 ns to 100 s, 3 significant digits; allocated once.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).expect("a 3-digit histogram"))
}

/// A latency as the histograms record it: nanoseconds, at least 1.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}
