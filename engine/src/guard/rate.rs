//! Rate limits: GCRA buckets per identity and a bounded table per peer address.
//!
//! GCRA (the generic cell rate algorithm) is a token bucket stored as one number, the
//! *theoretical arrival time* (TAT): the instant at which the bucket would be full again.
//! A call of cost `n` moves the TAT `n` emission intervals later (starting from `now` if
//! the TAT is in the past); it is allowed if the new TAT is at most `burst` intervals
//! after `now`. A refused call changes nothing. One `u64` per bucket, no timer, no refill
//! loop: a [`Bucket`] is a single `AtomicU64`, and a [`PeerLimiter`] is a bounded map of
//! TATs.
//!
//! Times are nanoseconds from [`now_ns`]; tests pass a synthetic clock instead.

// The server wires these in separately; until then only the tests use them.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// Addresses a [`PeerLimiter`] remembers by default (its tables then take at most
/// about 6.5 MB: 2 × 65,536 entries of 24 bytes, in hash tables at most half full).
pub(crate) const DEFAULT_PEER_CAPACITY: usize = 65_536;

/// Shards of a [`PeerLimiter`]: enough that two or more reactors rarely meet on one lock.
const SHARDS: usize = 16;

/// The longest a full bucket may take to refill (100 years), so TAT arithmetic has room.
const MAX_TOLERANCE_NS: f64 = 100.0 * 365.25 * 86_400.0 * 1e9;

/// Monotonic nanoseconds since a process-wide epoch (the first call). From the CPU's
/// time-stamp counter where it is invariant (`quanta`, calibrated once per process:
/// ~8 ns a read here), else from the monotonic clock: `Instant::now` and its
/// conversion were ~20 ns, half of what a rate-limited call cost.
pub(crate) fn now_ns() -> u64 {
    static CLOCK: OnceLock<(quanta::Clock, u64)> = OnceLock::new();
    let (clock, epoch) = CLOCK.get_or_init(|| {
        let clock = quanta::Clock::new();
        let epoch = clock.raw();
        (clock, epoch)
    });
    clock.delta_as_nanos(*epoch, clock.raw())
}

/// A limit that cannot be built: a bad `RATE[:BURST]` spec or out-of-range numbers.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum RateError {
    /// The spec (0) is not `RATE` or `RATE:BURST`, for the reason (1).
    #[error("{0:?}: {1} (expected RATE or RATE:BURST, e.g. \"100\" or \"0.5:1\")")]
    Syntax(String, &'static str),
    /// Calls per second not finite, not above 0, or above one per nanosecond.
    #[error("rate {0} is out of range: calls per second must be above 0 and at most 1000000000")]
    RateRange(f64),
    /// A burst of 0 would refuse every call.
    #[error("burst must be at least 1")]
    BurstZero,
    /// The rate (0) with the burst (1): a full bucket would take over 100 years to refill.
    #[error(
        "rate {0}/s with burst {1} is too slow: the bucket would take over 100 years to refill"
    )]
    TooSlow(f64, u32),
}

/// A limit: `rate` calls per second sustained, `burst` calls at once.
///
/// Kept as GCRA's two intervals, in whole nanoseconds (so a rate whose interval is not a
/// whole number of nanoseconds is rounded to the nearest one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rate {
    /// The interval one unit of cost occupies: 1 s / rate.
    emission_ns: u64,
    /// How far ahead of now the TAT may run: `burst` intervals (a full bucket's depth).
    tolerance_ns: u64,
}

impl Rate {
    /// A limit of `per_second` calls per second (finite, above 0, at most 10⁹) and
    /// `burst` calls at once (at least 1).
    pub(crate) fn new(per_second: f64, burst: u32) -> Result<Self, RateError> {
        if !(per_second > 0.0 && per_second <= 1e9) {
            return Err(RateError::RateRange(per_second));
        }
        if burst == 0 {
            return Err(RateError::BurstZero);
        }
        // At most 1e9 calls per second, so the interval rounds to at least 1 ns.
        let emission = (1e9 / per_second).round();
        if emission * f64::from(burst) > MAX_TOLERANCE_NS {
            return Err(RateError::TooSlow(per_second, burst));
        }
        // In range (checked above), so the casts and the product are exact.
        let emission_ns = emission as u64;
        Ok(Self {
            emission_ns,
            tolerance_ns: emission_ns * u64::from(burst),
        })
    }

    /// The burst a limit gets when none is given: the rate rounded up, at least 1.
    pub(crate) fn default_burst(per_second: f64) -> u32 {
        // `as` saturates (and maps NaN to 0); `new` rejects such rates anyway.
        (per_second.ceil() as u32).max(1)
    }

    /// Parses `RATE` or `RATE:BURST` (`"100"`, `"0.5:1"`, `"1000:2000"`): RATE calls per
    /// second (a decimal number), BURST a whole number; without BURST, [`Self::default_burst`].
    pub(crate) fn parse(spec: &str) -> Result<Self, RateError> {
        let syntax = |why| RateError::Syntax(spec.to_owned(), why);
        let (rate, burst) = spec
            .split_once(':')
            .map_or((spec, None), |(r, b)| (r, Some(b)));
        let per_second: f64 = rate.parse().map_err(|_| syntax("RATE is not a number"))?;
        let burst = match burst {
            Some(b) => b
                .parse::<u32>()
                .map_err(|_| syntax("BURST is not a whole number from 1 to 4294967295"))?,
            None => Self::default_burst(per_second),
        };
        Self::new(per_second, burst)
    }

    /// Calls allowed at once: the largest cost that can ever pass. A method weighted more
    /// would always be refused, so configuration should check weights against this.
    pub(crate) fn burst(&self) -> u32 {
        u32::try_from(self.tolerance_ns / self.emission_ns).unwrap_or(u32::MAX)
    }

    /// GCRA for one charge: the new TAT if a call of `cost` (0 counts as 1) passes at
    /// `now`, or how long until it would. Pure, so [`Bucket`] and [`PeerLimiter`] share it.
    ///
    /// A cost above the burst can never pass; it is refused with the time until the
    /// bucket is full, the best that could be done (see [`Self::burst`]).
    fn admit(&self, tat: u64, now: u64, cost: u32) -> Result<u64, Limited> {
        // Saturating: a huge cost just becomes "never", never a wrapped, passing TAT.
        let work = u64::from(cost.max(1)).saturating_mul(self.emission_ns);
        let new_tat = tat.max(now).saturating_add(work);
        let allowed_until = now.saturating_add(self.tolerance_ns);
        if new_tat <= allowed_until {
            return Ok(new_tat);
        }
        let wait = if work > self.tolerance_ns {
            tat.saturating_sub(now)
        } else {
            new_tat - allowed_until
        };
        Err(Limited {
            retry_after_ns: wait.max(1),
        })
    }
}

/// Refused: how long until this call would be allowed (at least 1 ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Limited {
    /// Nanoseconds until the same call would pass, if nothing else is charged meanwhile.
    pub(crate) retry_after_ns: u64,
}

impl Limited {
    /// The wait in milliseconds, rounded up, at least 1 (for a JSON-RPC error's data).
    pub(crate) fn retry_after_ms(&self) -> u64 {
        self.retry_after_ns.div_ceil(1_000_000).max(1)
    }

    /// The wait in seconds, rounded up, at least 1 (for HTTP's `Retry-After`).
    pub(crate) fn retry_after_secs(&self) -> u64 {
        self.retry_after_ns.div_ceil(1_000_000_000).max(1)
    }
}

/// One bucket (per identity): lock-free, its TAT in an `AtomicU64` updated with
/// `compare_exchange`, so any number of threads may charge it at once.
///
/// A new bucket is full (TAT 0, never after [`now_ns`]).
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    /// The theoretical arrival time, in [`now_ns`] nanoseconds.
    tat: AtomicU64,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Charges a call of `cost` (0 counts as 1) at `now`; a refused call consumes nothing.
    pub(crate) fn charge(&self, rate: &Rate, now_ns: u64, cost: u32) -> Result<(), Limited> {
        // Relaxed suffices: the TAT is the whole state, and one atomic's modification
        // order already makes every successful exchange see the one before it.
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let new_tat = rate.admit(tat, now_ns, cost)?;
            match self
                .tat
                .compare_exchange_weak(tat, new_tat, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }
}

/// The key `ip` is limited under, as an IPv6 address's two halves: IPv4 whole (in its
/// IPv4-mapped form, so a mapped address counts as its IPv4 one), IPv6 by its /64 prefix
/// (low half 0; one host usually owns a whole /64, so per-address limits would be
/// trivially bypassed). They never collide: a mapped address's low half holds `ffff`.
fn key(ip: IpAddr) -> (u64, u64) {
    let bits = match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u128::from(v4.to_ipv6_mapped()),
            None => u128::from(v6) >> 64 << 64,
        },
    };
    ((bits >> 64) as u64, bits as u64)
}

/// Hashes keys with a per-limiter random seed (a folded 128-bit multiply, as foldhash
/// does): fast, and peers choosing their source addresses cannot aim them all at one
/// hash slot as they could with an unseeded hash such as FxHash. It is its own builder.
#[derive(Clone, Copy)]
struct Seeded {
    /// The secret multiplier.
    seed: u64,
    /// The running hash.
    hash: u64,
}

impl BuildHasher for Seeded {
    type Hasher = Self;
    fn build_hasher(&self) -> Self {
        *self
    }
}

impl Hasher for Seeded {
    fn write(&mut self, bytes: &[u8]) {
        // Only for completeness: keys hash as two `write_u64`s.
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }
    fn write_u64(&mut self, word: u64) {
        self.hash = crate::hash::fold(self.hash ^ word, self.seed | 1);
    }
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// One shard's TATs, in two generations: see [`PeerLimiter`].
struct Shard {
    /// Entries touched in this generation.
    current: HashMap<(u64, u64), u64, Seeded>,
    /// The generation before; its entries move to `current` when touched.
    previous: HashMap<(u64, u64), u64, Seeded>,
}

/// A shard alone on its cache lines, so reactors locking neighbouring shards do not
/// contend through false sharing.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// Buckets per peer address (anonymous callers), bounded in memory however many source
/// addresses a flood brings (governor issue #171 is the bug avoided).
///
/// Sixteen shards, picked by a hash of the address, each a mutex around two maps of TATs
/// (`current` and `previous`). A charge looks in `current`, then in `previous` (moving the
/// entry over). When `current` reaches its share of the capacity, its idle entries (TAT
/// ≤ now: a full bucket carries no information) are dropped; if that frees less than
/// half, `previous` is cleared and the two swap, reusing the allocation. So steady state
/// allocates nothing, each charge costs O(1) amortized, and [`Self::len`] never exceeds
/// `2 × max(capacity, 16)`.
///
/// An address is forgotten only if its shard sees `capacity / 16` new addresses while it
/// is not charged; it then starts again with a full bucket. An address charged more often
/// than that, such as a limited one still hammering, stays limited.
pub(crate) struct PeerLimiter {
    /// The limit every address gets.
    rate: Rate,
    /// The most entries one shard's `current` holds.
    shard_capacity: usize,
    /// The shards' hasher, also used to pick the shard.
    hasher: Seeded,
    /// The shards.
    shards: [Padded; SHARDS],
}

impl PeerLimiter {
    /// The limit every address gets.
    pub(crate) fn rate(&self) -> Rate {
        self.rate
    }

    /// A limiter giving each address `rate`, remembering about `capacity` addresses
    /// ([`DEFAULT_PEER_CAPACITY`] is a good default) and at most twice that.
    pub(crate) fn new(rate: Rate, capacity: usize) -> Self {
        // std's RandomState is randomly keyed per process (and per instance).
        let random = std::collections::hash_map::RandomState::new();
        let hasher = Seeded {
            seed: random.hash_one(1_u8),
            hash: random.hash_one(2_u8),
        };
        Self {
            rate,
            shard_capacity: (capacity / SHARDS).max(1),
            hasher,
            shards: std::array::from_fn(|_| {
                Padded(Mutex::new(Shard {
                    current: HashMap::with_hasher(hasher),
                    previous: HashMap::with_hasher(hasher),
                }))
            }),
        }
    }

    /// Charges a call of `cost` (0 counts as 1) from `ip` at `now`; a refused call
    /// consumes nothing.
    pub(crate) fn charge(&self, ip: IpAddr, now_ns: u64, cost: u32) -> Result<(), Limited> {
        let key = key(ip);
        let mut shard = self.shard(key);
        if let Some(tat) = shard.current.get_mut(&key) {
            *tat = self.rate.admit(*tat, now_ns, cost)?;
            return Ok(());
        }
        let old = shard.previous.remove(&key).unwrap_or(0);
        let verdict = self.rate.admit(old, now_ns, cost);
        let tat = *verdict.as_ref().unwrap_or(&old);
        if tat > now_ns {
            // Only a bucket that is not full is worth remembering.
            self.make_room(&mut shard, now_ns);
            shard.current.insert(key, tat);
        }
        verdict.map(|_| ())
    }

    /// Gives back one unit charged to `ip` (for limits charged before it is known
    /// whether a call counts: an authentication, charged as if it failed, so that
    /// attempts made at once cannot overdraw the bucket, and refunded if it succeeded).
    pub(crate) fn refund(&self, ip: IpAddr) {
        let key = key(ip);
        let mut shard = self.shard(key);
        if let Some(tat) = shard.current.get_mut(&key) {
            *tat = tat.saturating_sub(self.rate.emission_ns);
        }
    }

    /// The shard of `key`, locked.
    fn shard(&self, key: (u64, u64)) -> MutexGuard<'_, Shard> {
        // Bits 32..36: hashbrown places by the low bits and tags by the top seven.
        let shard = (self.hasher.hash_one(key) >> 32) as usize % SHARDS;
        lock(&self.shards[shard].0)
    }

    /// Makes room for one entry in `current`: drop idle entries, or start a generation.
    fn make_room(&self, shard: &mut Shard, now_ns: u64) {
        if shard.current.len() < self.shard_capacity {
            return;
        }
        shard.current.retain(|_, tat| *tat > now_ns);
        // Less than half freed: retaining again soon would cost O(n) per few inserts.
        if shard.current.len() >= self.shard_capacity / 2 {
            shard.previous.clear();
            std::mem::swap(&mut shard.current, &mut shard.previous);
        }
    }

    /// Addresses (or /64s) remembered now, in both generations (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let shard = lock(&s.0);
                shard.current.len() + shard.previous.len()
            })
            .sum()
    }
}

/// Locks a shard. A panic while one was held cannot leave it inconsistent (each step is
/// one map operation), so a poisoned lock is used as it is.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const MS: u64 = 1_000_000;

    #[test]
    fn the_clock_is_monotonic_and_keeps_real_time() {
        let (a, started) = (now_ns(), std::time::Instant::now());
        let b = now_ns();
        assert!(b >= a);
        std::thread::sleep(std::time::Duration::from_millis(30));
        let (c, took) = (now_ns(), started.elapsed());
        // The counter is calibrated against the monotonic clock: within 10 % of it.
        let took = u64::try_from(took.as_nanos()).unwrap();
        assert!(
            c - a >= took * 9 / 10 && c - a <= took * 11 / 10 + MS,
            "{} vs {took}",
            c - a
        );
    }

    fn wait(r: Result<(), Limited>) -> u64 {
        r.expect_err("should be limited").retry_after_ns
    }

    #[test]
    fn gcra_is_exact() {
        let (rate, b) = (Rate::new(10.0, 5).unwrap(), Bucket::new());
        for _ in 0..5 {
            assert_eq!(b.charge(&rate, 0, 1), Ok(()));
        }
        assert_eq!(wait(b.charge(&rate, 0, 1)), 100 * MS);
        // Refused charges consume nothing: the answer does not change.
        assert_eq!(wait(b.charge(&rate, 0, 1)), 100 * MS);
        assert_eq!(wait(b.charge(&rate, 99 * MS, 1)), MS);
        assert_eq!(b.charge(&rate, 100 * MS, 1), Ok(()));
        assert_eq!(wait(b.charge(&rate, 100 * MS, 1)), 100 * MS);
        // Idle for long: full again, never more than full.
        for _ in 0..5 {
            assert_eq!(b.charge(&rate, 10_000 * MS, 1), Ok(()));
        }
        assert!(b.charge(&rate, 10_000 * MS, 1).is_err());
    }

    #[test]
    fn costs() {
        let (rate, b) = (Rate::new(10.0, 5).unwrap(), Bucket::new());
        assert_eq!(b.charge(&rate, 0, 3), Ok(()));
        // 3 of 5 used: a cost of 3 waits for one cell (100 ms), consuming nothing.
        assert_eq!(wait(b.charge(&rate, 0, 3)), 100 * MS);
        assert_eq!(b.charge(&rate, 0, 2), Ok(()));
        assert_eq!(wait(b.charge(&rate, 0, 0)), 100 * MS, "cost 0 counts as 1");
        assert_eq!(b.charge(&rate, 300 * MS, 3), Ok(()));
        // Above the burst: never possible; refused with the time until full.
        assert_eq!(wait(b.charge(&rate, 300 * MS, 6)), 500 * MS);
        assert_eq!(wait(b.charge(&rate, 10_000 * MS, 6)), 1);
        assert_eq!(wait(b.charge(&rate, 10_000 * MS, u32::MAX)), 1);
        assert_eq!(b.charge(&rate, 10_000 * MS, 5), Ok(()));
        assert_eq!(rate.burst(), 5);
    }

    #[test]
    fn retry_after_rounds_up_and_now_runs() {
        let l = |ns| Limited { retry_after_ns: ns };
        assert_eq!((l(1).retry_after_ms(), l(1).retry_after_secs()), (1, 1));
        assert_eq!((l(MS).retry_after_ms(), l(MS + 1).retry_after_ms()), (1, 2));
        let s = 1_000 * MS;
        assert_eq!(
            (l(s).retry_after_secs(), l(s + 1).retry_after_secs()),
            (1, 2)
        );
        let a = now_ns();
        assert!(a <= now_ns());
    }

    #[test]
    fn parse() {
        let r = |per_second, burst| Ok(Rate::new(per_second, burst).unwrap());
        assert_eq!(Rate::parse("100"), r(100.0, 100));
        assert_eq!(Rate::parse("0.5:1"), r(0.5, 1));
        assert_eq!(Rate::parse("0.5"), r(0.5, 1));
        assert_eq!(Rate::parse("2.5"), r(2.5, 3));
        assert_eq!(Rate::parse("1000:2000"), r(1000.0, 2000));
        assert_eq!(Rate::parse("1e9:1"), r(1e9, 1));
        let half = Rate::parse("0.5:1").unwrap();
        assert_eq!(
            (half.emission_ns, half.tolerance_ns),
            (2_000 * MS, 2_000 * MS)
        );

        for bad in [
            "", "abc", ":5", "10:", "10:x", "10:-1", "10:1.5", "1:2:3", " 10", "10/s",
        ] {
            assert!(
                matches!(Rate::parse(bad), Err(RateError::Syntax(..))),
                "{bad:?}"
            );
        }
        assert_eq!(
            Rate::parse("10:x").unwrap_err().to_string(),
            "\"10:x\": BURST is not a whole number from 1 to 4294967295 \
             (expected RATE or RATE:BURST, e.g. \"100\" or \"0.5:1\")"
        );
        assert_eq!(Rate::parse("10:0"), Err(RateError::BurstZero));
        for bad in ["0", "-1", "inf", "nan", "2e9", "-0.5:1"] {
            assert!(
                matches!(Rate::parse(bad), Err(RateError::RateRange(_))),
                "{bad}"
            );
        }
        assert_eq!(
            Rate::parse("0").unwrap_err().to_string(),
            "rate 0 is out of range: calls per second must be above 0 and at most 1000000000"
        );
        assert_eq!(Rate::parse("1e-12"), Err(RateError::TooSlow(1e-12, 1)));
        assert_eq!(
            Rate::parse("1e-6:4000"),
            Err(RateError::TooSlow(1e-6, 4000))
        );
    }

    #[test]
    fn bucket_from_four_threads_is_exact() {
        // 10/s, burst 50, a synthetic clock stepping 100 ms: after `step` steps exactly
        // 50 + step calls have passed (burst + rate x elapsed), however the threads race.
        let (rate, bucket) = (Rate::new(10.0, 50).unwrap(), Bucket::new());
        let passed = AtomicU64::new(0);
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for step in 0..20 {
                        barrier.wait();
                        for _ in 0..100 {
                            if bucket.charge(&rate, step * 100 * MS, 1).is_ok() {
                                passed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        barrier.wait();
                        assert_eq!(passed.load(Ordering::Relaxed), 50 + step);
                    }
                });
            }
        });
    }

    fn v4(n: u32) -> IpAddr {
        Ipv4Addr::from(n).into()
    }

    #[test]
    fn peer_table_is_bounded_under_a_flood() {
        let peers = PeerLimiter::new(Rate::new(1.0, 1).unwrap(), 10_000);
        let base = u32::from(Ipv4Addr::new(127, 0, 0, 0));
        for i in 0..100_000 {
            // Every address's first call passes (a new address is a full bucket).
            assert_eq!(peers.charge(v4(base + i), 0, 1), Ok(()), "{i}");
            // The bound: 16 shards, each two generations of at most 10_000 / 16 = 625.
            assert!(peers.len() <= 2 * 10_000, "{i}: {}", peers.len());
        }
        assert!(peers.len() > 10_000);
    }

    #[test]
    fn a_refund_gives_one_back() {
        let l = PeerLimiter::new(Rate::new(10.0, 2).unwrap(), 64);
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!((l.charge(ip, 0, 1), l.charge(ip, 0, 1)), (Ok(()), Ok(())));
        assert_eq!(wait(l.charge(ip, 0, 1)), 100 * MS);
        l.refund(ip);
        assert_eq!(l.charge(ip, 0, 1), Ok(()));
        assert_eq!(wait(l.charge(ip, 40 * MS, 1)), 60 * MS);
        // Refunds never fill a bucket past full, nor touch another address's.
        for _ in 0..5 {
            l.refund(ip);
        }
        l.refund(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!((l.charge(ip, 0, 1), l.charge(ip, 0, 1)), (Ok(()), Ok(())));
        assert_eq!(wait(l.charge(ip, 0, 1)), 100 * MS);
    }

    #[test]
    fn full_buckets_are_not_kept() {
        let peers = PeerLimiter::new(Rate::new(1.0, 2).unwrap(), 16);
        let ip = v4(0x0a00_0001);
        assert_eq!(peers.charge(ip, 0, 1), Ok(()));
        assert_eq!(peers.len(), 1);
        // Refused at a full bucket (cost above burst): nothing to remember.
        assert_eq!(wait(peers.charge(v4(0x0a00_0002), 0, 3)), 1);
        assert_eq!(peers.len(), 1);
        // A flood one second apart: each earlier entry is idle by the next, and dropped
        // when a shard fills instead of forcing a new generation.
        let peers = PeerLimiter::new(Rate::new(1.0, 1).unwrap(), 16 * 4);
        for i in 0..1_000 {
            assert_eq!(peers.charge(v4(i), u64::from(i) * 1_000 * MS, 1), Ok(()));
        }
        assert!(peers.len() <= 16 * 4, "{}", peers.len());
    }

    #[test]
    fn a_limited_address_stays_limited_during_a_flood() {
        let peers = PeerLimiter::new(Rate::new(1.0, 3).unwrap(), 1_000);
        let hot = v4(0xc000_0201);
        for _ in 0..3 {
            assert_eq!(peers.charge(hot, 0, 1), Ok(()));
        }
        let base = u32::from(Ipv4Addr::new(127, 0, 0, 0));
        for i in 0..50_000 {
            assert_eq!(peers.charge(v4(base + i), 0, 1), Ok(()));
            // Hit once per 20 new addresses, well within a shard's share (1_000 / 16).
            if i % 20 == 0 {
                assert!(peers.charge(hot, 0, 1).is_err(), "{i}");
            }
        }
    }

    #[test]
    fn ipv6_by_64_and_v4_mapped() {
        let peers = PeerLimiter::new(Rate::new(1.0, 2).unwrap(), DEFAULT_PEER_CAPACITY);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(peers.charge(ip("2001:db8:1:2::1"), 0, 1), Ok(()));
        assert_eq!(
            peers.charge(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), 0, 1),
            Ok(())
        );
        assert!(peers.charge(ip("2001:db8:1:2::1"), 0, 1).is_err());
        assert_eq!(peers.charge(ip("2001:db8:1:3::1"), 0, 2), Ok(()));

        assert_eq!(peers.charge(ip("203.0.113.7"), 0, 1), Ok(()));
        assert_eq!(peers.charge(ip("::ffff:203.0.113.7"), 0, 1), Ok(()));
        assert!(peers.charge(ip("203.0.113.7"), 0, 1).is_err());
        // Neighbouring IPv4 addresses are separate peers, and not ::1's ::/64.
        assert_eq!(peers.charge(ip("203.0.113.8"), 0, 2), Ok(()));
        assert_eq!(peers.charge(Ipv6Addr::LOCALHOST.into(), 0, 2), Ok(()));
        assert_eq!(peers.len(), 5);
    }
}
