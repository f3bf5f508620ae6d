//! The time a forwarded call spends in the proxy and upstream, for the metrics: from
//! the forward (the reactor handing the call over) to its bytes being taken for the
//! upstream socket (`send`), and from then to its answer being read (`upstream`: the
//! network and the upstream server). The server's own `ringrpc_request_duration_seconds`
//! for `method="fallback"` covers the whole call (read → answer ready), so what the
//! proxy adds is that, less `upstream`.
//!
//! Written by the upstream thread alone (relaxed load + store, no locked instruction),
//! read by scrapes.

use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::metrics::histogram::{DURATION_BOUNDS, DURATION_BUCKETS};

/// One duration histogram.
struct Hist {
    buckets: [AtomicU64; DURATION_BUCKETS],
    sum_ns: AtomicU64,
}

impl Hist {
    fn new() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Counts `d` (one writer: a plain load and store).
    fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let b = DURATION_BOUNDS
            .iter()
            .position(|&bound| s <= bound)
            .unwrap_or(DURATION_BOUNDS.len());
        let bump = |a: &AtomicU64, n: u64| a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
        bump(&self.buckets[b], 1);
        bump(
            &self.sum_ns,
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        );
    }

    fn render(&self, out: &mut String, name: &str, label: &str) {
        let mut total = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            total += b.load(Relaxed);
            match DURATION_BOUNDS.get(i) {
                Some(le) => {
                    let _ = writeln!(out, "{name}_bucket{{{label},le=\"{le:?}\"}} {total}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {total}");
                }
            }
        }
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{label}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{label}}} {total}");
    }
}

/// The histograms of one upstream.
struct Upstream {
    send: Hist,
    upstream: Hist,
}

/// Every upstream's histograms.
pub(crate) struct Timings {
    upstreams: Vec<Upstream>,
}

impl Timings {
    /// Histograms for `n` upstreams.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            upstreams: (0..n)
                .map(|_| Upstream {
                    send: Hist::new(),
                    upstream: Hist::new(),
                })
                .collect(),
        }
    }

    /// A call to upstream `u` waited `send` to be written and `upstream` for its answer.
    pub(crate) fn observe(&self, u: usize, send: Duration, upstream: Duration) {
        if let Some(h) = self.upstreams.get(u) {
            h.send.observe(send);
            h.upstream.observe(upstream);
        }
    }

    /// Adds upstream `u`'s counts of upstream times, per bucket (not cumulative), to
    /// `into`.
    pub(crate) fn add_upstream_counts(&self, u: usize, into: &mut [u64; DURATION_BUCKETS]) {
        if let Some(h) = self.upstreams.get(u) {
            for (sum, b) in into.iter_mut().zip(&h.upstream.buckets) {
                *sum = sum.wrapping_add(b.load(Relaxed));
            }
        }
    }

    /// Both histograms of every upstream (named by `urls`), in the Prometheus text format.
    pub(crate) fn render(&self, urls: &[&str], out: &mut String) {
        for (name, help, pick) in [
            (
                "ringrpc_proxy_send_seconds",
                "Forwarded calls: from the forward to their bytes being taken for the upstream socket, by upstream.",
                true,
            ),
            (
                "ringrpc_proxy_upstream_seconds",
                "Forwarded calls: from their bytes being taken for the upstream socket to their answer being read (network and upstream), by upstream.",
                false,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (h, url) in self.upstreams.iter().zip(urls) {
                let label = format!("upstream=\"{}\"", url.replace('\\', "\\\\").replace('"', "\\\""));
                let hist = if pick { &h.send } else { &h.upstream };
                hist.render(out, name, &label);
            }
        }
    }
}

/// The `q` quantile (0 to 1) of the durations counted in `counts` (per bucket, not
/// cumulative), interpolated linearly within its bucket; `None` with fewer than `min`
/// of them. In the last bucket (over 10 s) it is its lower bound.
pub(crate) fn quantile(counts: &[u64; DURATION_BUCKETS], q: f64, min: u64) -> Option<Duration> {
    let total: u64 = counts.iter().sum();
    if total < min.max(1) {
        return None;
    }
    // The rank of the observation wanted, 1-based.
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut below = 0;
    for (b, &n) in counts.iter().enumerate() {
        if below + n >= rank {
            let low = if b == 0 { 0.0 } else { DURATION_BOUNDS[b - 1] };
            let Some(&high) = DURATION_BOUNDS.get(b) else {
                return Some(Duration::from_secs_f64(low));
            };
            let within = (rank - below) as f64 / n as f64;
            return Some(Duration::from_secs_f64(low + (high - low) * within));
        }
        below += n;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let mut c = [0u64; DURATION_BUCKETS];
        assert_eq!(quantile(&c, 0.5, 1), None);
        // 100 answers in (1 ms, 2.5 ms], 100 in (2.5 ms, 5 ms].
        let b1 = DURATION_BOUNDS.iter().position(|&b| b == 2.5e-3).unwrap();
        c[b1] = 100;
        c[b1 + 1] = 100;
        assert_eq!(quantile(&c, 0.5, 201), None, "too few");
        let at = |q| quantile(&c, q, 20).unwrap().as_secs_f64();
        assert!((at(0.5) - 2.5e-3).abs() < 1e-9, "{}", at(0.5));
        assert!((at(0.25) - 1.75e-3).abs() < 1e-9, "{}", at(0.25));
        assert!((at(1.0) - 5e-3).abs() < 1e-9, "{}", at(1.0));
        assert!(
            (at(0.0) - (1e-3 + 1.5e-3 / 100.0)).abs() < 1e-9,
            "{}",
            at(0.0)
        );
        // Beyond the last bound: its lower bound.
        let mut slow = [0u64; DURATION_BUCKETS];
        slow[DURATION_BUCKETS - 1] = 30;
        assert_eq!(quantile(&slow, 0.9, 20), Some(Duration::from_secs(10)));
    }

    #[test]
    fn observations_land_in_cumulative_buckets() {
        let t = Timings::new(1);
        t.observe(0, Duration::from_micros(3), Duration::from_millis(20));
        t.observe(0, Duration::from_micros(3), Duration::from_secs(20));
        let mut out = String::new();
        t.render(&["tcp://a:1"], &mut out);
        assert!(
            out.contains("ringrpc_proxy_send_seconds_bucket{upstream=\"tcp://a:1\",le=\"5e-6\"} 2"),
            "{out}"
        );
        assert!(
            out.contains(
                "ringrpc_proxy_upstream_seconds_bucket{upstream=\"tcp://a:1\",le=\"0.025\"} 1"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "ringrpc_proxy_upstream_seconds_bucket{upstream=\"tcp://a:1\",le=\"+Inf\"} 2"
            ),
            "{out}"
        );
        assert!(
            out.contains("ringrpc_proxy_upstream_seconds_count{upstream=\"tcp://a:1\"} 2"),
            "{out}"
        );
    }
}
