//! The duration buckets, kept in the clock's raw ticks so a call is bucketed without
//! converting its duration (one subtraction and, for fast calls, one comparison).

/// The upper bounds of the duration histogram, in seconds: 1 µs to 10 s, 1-2.5-5 steps.
pub(crate) const DURATION_BOUNDS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets per duration histogram: the bounds, then `+Inf`.
pub(crate) const DURATION_BUCKETS: usize = DURATION_BOUNDS.len() + 1;

/// The upper bounds of the batch size histogram (elements per batch).
pub(crate) const BATCH_BOUNDS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Buckets of the batch size histogram: the bounds, then `+Inf`.
pub(crate) const BATCH_BUCKETS: usize = BATCH_BOUNDS.len() + 1;

/// The bucket of a batch of `len` elements.
#[inline]
pub(crate) fn batch_bucket(len: usize) -> usize {
    // Bounds are powers of two: the bucket is the bit length of len - 1.
    let bits = usize::BITS - len.saturating_sub(1).leading_zeros();
    (bits as usize).min(BATCH_BUCKETS - 1)
}

/// The clock, and the duration bounds in its ticks.
#[derive(Clone, Debug)]
pub(crate) struct Ticks {
    clock: quanta::Clock,
    /// `DURATION_BOUNDS` in ticks: a duration of `t` ticks is in the first bucket whose
    /// bound is `>= t`.
    bounds: [u64; DURATION_BOUNDS.len()],
    /// Nanoseconds per tick.
    ns_per_tick: f64,
}

impl Ticks {
    /// Calibrates the clock (once per process, inside `quanta`) and converts the bounds.
    pub(crate) fn new() -> Self {
        let clock = quanta::Clock::new();
        // `delta_as_nanos(0, t)` is monotonic in t: the bound in ticks is the largest t
        // not over it, found by bisection.
        let mut bounds = [0u64; DURATION_BOUNDS.len()];
        for (b, secs) in bounds.iter_mut().zip(DURATION_BOUNDS) {
            let ns = (secs * 1e9).round() as u64;
            let (mut lo, mut hi) = (0u64, ns.saturating_mul(64).max(64));
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if clock.delta_as_nanos(0, mid) <= ns {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            *b = lo;
        }
        let big = 1u64 << 40;
        let ns_per_tick = clock.delta_as_nanos(0, big) as f64 / big as f64;
        Self {
            clock,
            bounds,
            ns_per_tick,
        }
    }

    /// Now, in raw ticks (the TSC where it is invariant: ~8 ns, against ~20 ns for
    /// `Instant::now`).
    #[inline(always)]
    pub(crate) fn now(&self) -> u64 {
        self.clock.raw()
    }

    /// The bucket of a duration of `ticks`.
    #[inline(always)]
    pub(crate) fn bucket(&self, ticks: u64) -> usize {
        // Most calls answered inline fall in the first bucket: a linear scan from the
        // bottom is one comparison for them.
        let mut i = 0;
        while i < self.bounds.len() && ticks > self.bounds[i] {
            i += 1;
        }
        i
    }

    /// `d` in ticks.
    pub(crate) fn ticks_of(&self, d: std::time::Duration) -> u64 {
        (d.as_nanos() as f64 / self.ns_per_tick) as u64
    }

    /// `ticks` in seconds.
    pub(crate) fn seconds(&self, ticks: u64) -> f64 {
        ticks as f64 * self.ns_per_tick / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_fall_in_their_buckets() {
        let t = Ticks::new();
        let b = |us: u64| t.bucket(t.ticks_of(Duration::from_micros(us)));
        assert_eq!(b(0), 0);
        assert_eq!(b(1), 0, "a bound is inclusive (le)");
        assert_eq!(b(2), 1);
        assert_eq!(b(3), 2);
        assert_eq!(b(1_000), 9);
        assert_eq!(b(1_001), 10);
        assert_eq!(b(10_000_000), 21);
        assert_eq!(b(10_000_001), 22, "past 10 s: +Inf");
        let secs = t.seconds(t.ticks_of(Duration::from_millis(1500)));
        assert!((secs - 1.5).abs() < 1e-6, "{secs}");
    }

    #[test]
    fn batches_fall_in_their_buckets() {
        let cases = [
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (1024, 10),
            (1025, 11),
        ];
        for (len, bucket) in cases {
            assert_eq!(batch_bucket(len), bucket, "{len}");
            assert!(len as f64 <= BATCH_BOUNDS.get(bucket).copied().unwrap_or(f64::MAX));
        }
        assert_eq!(batch_bucket(1 << 20), BATCH_BUCKETS - 1);
    }
}
