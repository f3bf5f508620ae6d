//! The in-memory de-duplication store: answers by key, bounded in bytes, each kept for
//! a TTL.
//!
//! Sharded by key (a mutex per shard, so reactors and workers rarely meet). Each shard
//! keeps its entries in a ring of slots in insertion order, numbered by a running
//! sequence number: with one TTL for all, the oldest entry is always the first to
//! expire, and also the one evicted when the shard is over its share of the byte bound.
//! The map only points a key at its slot's number (16 bytes a bucket, so probes touch
//! little memory), and a claim hands that number back, so storing the answer after the
//! call needs no second map probe. Answer buffers of evicted entries are kept for reuse,
//! so a store in steady state allocates nothing per call.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::RandomState;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rustc_hash::FxHashMap;

use simd_json::{Node, StaticNode};

use super::{write_replay, Claim, Digest, Store};
use crate::codec::Id;
use crate::Params;

/// Shards: a power of two, enough that two reactors and a few workers rarely contend.
const SHARDS: usize = 16;

/// What an entry costs besides its answer: the map slot, the ring slot, the buffer.
pub(crate) const ENTRY_OVERHEAD: usize = 96;

/// Spare answer buffers kept per shard.
const SPARE: usize = 64;

/// The least capacity of an answer buffer: with capacities rounded up to a power of two,
/// a reused buffer fits answers somewhat longer than the one it was made for (a counter
/// gaining a digit), instead of growing again.
const MIN_ANSWER: usize = 32;

/// Where a slot's call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The call runs.
    Running,
    /// Answered: the answer's code (its tail is in the slot's buffer).
    Done(Option<i32>),
    /// Released or replaced: no key points here any more; it only waits to be popped
    /// (and still counts its overhead, as it holds ring memory until then).
    Gone,
}

struct Slot {
    /// The key's first 64 bits (see [`key_bits`]).
    key: u64,
    fp: Digest,
    /// When it may be dropped (nanoseconds since the store's epoch).
    expires: u64,
    state: State,
    /// The answer's tail when [`State::Done`]; else empty.
    answer: Vec<u8>,
}

#[derive(Default)]
struct Shard {
    /// Key bits → the sequence number of its slot.
    map: FxHashMap<u64, u64>,
    /// Slots in insertion order; `slots[i]` has sequence number `head + i`.
    slots: VecDeque<Slot>,
    /// The sequence number of `slots[0]`.
    head: u64,
    /// Bytes held: answers plus [`ENTRY_OVERHEAD`] per slot.
    bytes: usize,
    spare: Vec<Vec<u8>>,
}

/// Answers in memory.
pub(crate) struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Each shard's share of the byte bound.
    max_bytes: usize,
    ttl_ns: u64,
    /// [`coarse_now_ns`] at creation.
    epoch: u64,
    /// A randomly seeded hasher (foldhash, hashbrown's): a caller cannot aim a key at
    /// another caller's without knowing the seed.
    seed: RandomState,
}

impl MemoryStore {
    /// A store of at most `max_bytes`, entries kept for `ttl`.
    pub(crate) fn new(max_bytes: usize, ttl: Duration) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            max_bytes: (max_bytes / SHARDS).max(ENTRY_OVERHEAD * 4),
            ttl_ns: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
            epoch: coarse_now_ns(),
            seed: RandomState::default(),
        }
    }

    /// Now, to the few milliseconds a TTL of minutes needs: the kernel's coarse
    /// monotonic clock is read without a timer read (~5 ns instead of ~20).
    fn now(&self) -> u64 {
        coarse_now_ns().saturating_sub(self.epoch)
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Shard> {
        // The top bits pick the shard (the map's hasher mixes all of them for its slot).
        // They must be bits the digest sets: the memory store's digests fill 64 of 128.
        let i = (key >> (64 - SHARDS.trailing_zeros())) as usize;
        // A panic while holding the lock leaves consistent data (every step below
        // leaves the shard whole): still usable.
        self.shards[i % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Entries held now, in all shards (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap().map.len())
            .sum()
    }

    /// Bytes held now, in all shards (for tests).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().bytes).sum()
    }

    /// Entries held now, per shard (for tests).
    #[cfg(test)]
    fn spread(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap().map.len())
            .collect()
    }
}

impl Shard {
    /// The sequence number the next pushed slot gets.
    fn next_seq(&self) -> u64 {
        self.head + self.slots.len() as u64
    }

    /// The running slot of `key` claimed with `fp`: at `seq` (the claim's number) or,
    /// if it moved since (see [`Shard::trim`]), wherever the map says.
    fn running(&mut self, seq: u64, key: u64, fp: &Digest) -> Option<u64> {
        let is = |s: &Slot| s.key == key && s.fp == *fp && s.state == State::Running;
        if self.get(seq).is_some_and(is) {
            return Some(seq);
        }
        let moved = *self.map.get(&key)?;
        self.get(moved).is_some_and(is).then_some(moved)
    }

    fn get(&self, seq: u64) -> Option<&Slot> {
        self.slots
            .get(usize::try_from(seq.checked_sub(self.head)?).ok()?)
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Slot> {
        self.slots
            .get_mut(usize::try_from(seq.checked_sub(self.head)?).ok()?)
    }

    /// Drops slots from the front while they have expired, are gone, or the shard is
    /// over `max_bytes`. A running call's slot is never dropped: it goes to the back
    /// (with a new number, which its map entry follows), to be looked at again later.
    fn trim(&mut self, now: u64, ttl_ns: u64, max_bytes: usize) {
        // Each slot is looked at once per trim: a shard full of running calls cannot
        // spin here.
        let mut budget = self.slots.len();
        while budget > 0 {
            match self.slots.front() {
                Some(s) if self.bytes > max_bytes || s.expires <= now || s.state == State::Gone => {
                }
                _ => break,
            }
            budget -= 1;
            let Some(mut slot) = self.slots.pop_front() else {
                break;
            };
            let seq = self.head;
            self.head += 1;
            match slot.state {
                State::Gone => self.bytes = self.bytes.saturating_sub(ENTRY_OVERHEAD),
                State::Running => {
                    let back = self.next_seq();
                    if let Some(at) = self.map.get_mut(&slot.key) {
                        if *at == seq {
                            *at = back;
                        }
                    }
                    slot.expires = now.saturating_add(ttl_ns);
                    self.slots.push_back(slot);
                }
                State::Done(_) => {
                    // One probe: removed only if it still points here.
                    if let Entry::Occupied(at) = self.map.entry(slot.key) {
                        if *at.get() == seq {
                            at.remove();
                        }
                    }
                    self.bytes = self.bytes.saturating_sub(ENTRY_OVERHEAD);
                    self.recycle(std::mem::take(&mut slot.answer));
                }
            }
        }
    }

    /// Takes back an answer buffer: its bytes no longer count, its memory is reused.
    fn recycle(&mut self, buf: Vec<u8>) {
        self.bytes = self.bytes.saturating_sub(buf.len());
        if self.spare.len() < SPARE && buf.capacity() > 0 {
            self.spare.push(buf);
        }
    }
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds (its resolution is the kernel's tick, 1-4 ms).
fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration; the clock id
    // is a constant Linux has had since 2.6.32. On failure `ts` stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// The bits of a key the memory store uses: the 64 its digests fill.
fn key_bits(d: &Digest) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

impl MemoryStore {
    fn finish_digest(h: &impl Hasher) -> Digest {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&h.finish().to_le_bytes());
        d
    }
}

impl Store for MemoryStore {
    fn digest(&self, parts: &[&[u8]]) -> Digest {
        // 64 bits under a random seed: keys and fingerprints are compared together, so
        // a wrong replay needs both to collide (2^-128 for a caller who cannot see the
        // seed), and a key alone colliding (a -32043 for an innocent call) is about
        // 2^-64 per stored entry. One hash run each, not two.
        // Each part is written as its length (gathered in foldhash's 128-bit sponge,
        // nearly free), then its bytes: no copy into a buffer first.
        let mut h = self.seed.build_hasher();
        for p in parts {
            h.write_usize(p.len());
            h.write(p);
        }
        Self::finish_digest(&h)
    }

    fn id_digest(&self, who: &str, id: Id<'_>) -> Digest {
        // The id typed, as numbers, not as text (no formatting): 1, "1" and 1.0 differ;
        // 1 read as signed or unsigned does not. `usize::MAX` first, a length no part
        // of [`Store::digest`] has: these keys and those never meet.
        let mut h = self.seed.build_hasher();
        h.write_usize(usize::MAX);
        h.write_usize(who.len());
        h.write(who.as_bytes());
        match id {
            Id::Null => h.write_u8(0),
            Id::Str(s) => {
                h.write_u8(1);
                h.write_usize(s.len());
                h.write(s.as_bytes());
            }
            Id::Int(i) => {
                h.write_u8(2);
                h.write_u128(i128::from(i).cast_unsigned());
            }
            Id::UInt(u) => {
                h.write_u8(2);
                h.write_u128(u128::from(u));
            }
            Id::Float(f) => {
                h.write_u8(3);
                h.write_u64(f.to_bits());
            }
        }
        Self::finish_digest(&h)
    }

    fn fingerprint(&self, method: &str, params: &Params<'_>) -> Digest {
        // The params as parsed (the tape's values, typed and length-prefixed), not their
        // raw bytes: finding those is a walk of the whole request's tape, several times
        // this hash's cost. Params that differ only in whitespace, escapes or the
        // spelling of a number (`1e2` / `100.0`) are the same to the handler and here;
        // any other difference (a value, a type, a key, the order) is a mismatch.
        // `usize::MAX - 1` first: never a [`Store::digest`] or an id key.
        let mut h = self.seed.build_hasher();
        h.write_usize(usize::MAX - 1);
        h.write_usize(method.len());
        h.write(method.as_bytes());
        let Some(nodes) = params.nodes() else {
            h.write_u8(0);
            return Self::finish_digest(&h);
        };
        for node in nodes {
            match *node {
                Node::String(s) => {
                    h.write_u8(1);
                    h.write_usize(s.len());
                    h.write(s.as_bytes());
                }
                Node::Array { len, .. } => {
                    h.write_u8(2);
                    h.write_usize(len);
                }
                Node::Object { len, .. } => {
                    h.write_u8(3);
                    h.write_usize(len);
                }
                Node::Static(StaticNode::Null) => h.write_u8(4),
                Node::Static(StaticNode::Bool(b)) => h.write_u8(5 + u8::from(b)),
                // 1 read as signed or unsigned is one number, as for ids.
                Node::Static(StaticNode::I64(i)) => {
                    h.write_u8(7);
                    h.write_u128(i128::from(i).cast_unsigned());
                }
                Node::Static(StaticNode::U64(u)) => {
                    h.write_u8(7);
                    h.write_u128(u128::from(u));
                }
                Node::Static(StaticNode::F64(f)) => {
                    h.write_u8(8);
                    h.write_u64(f.to_bits());
                }
            }
        }
        Self::finish_digest(&h)
    }

    fn claim(&self, key: &Digest, fp: &Digest, id: Id<'_>, out: &mut Vec<u8>) -> Claim {
        let now = self.now();
        let k = key_bits(key);
        let mut guard = self.shard(k);
        let shard = &mut *guard;
        shard.trim(now, self.ttl_ns, self.max_bytes);
        let seq = shard.next_seq();
        // One probe: the new claim goes into the map slot found.
        match shard.map.entry(k) {
            Entry::Occupied(mut at) => {
                let old = *at.get();
                let i = usize::try_from(old.wrapping_sub(shard.head)).unwrap_or(usize::MAX);
                if let Some(slot) = shard.slots.get_mut(i) {
                    if slot.state == State::Running || slot.expires > now {
                        return match (slot.state, slot.fp == *fp) {
                            (_, false) => Claim::Mismatch,
                            (State::Done(code), true) => {
                                write_replay(out, id, &slot.answer);
                                Claim::Replayed(code)
                            }
                            (_, true) => Claim::InProgress,
                        };
                    }
                    // Expired but not trimmed yet (it is not at the front): its slot is
                    // given up, the key claimed anew at the back.
                    slot.state = State::Gone;
                    let buf = std::mem::take(&mut slot.answer);
                    at.insert(seq);
                    shard.recycle(buf);
                } else {
                    at.insert(seq);
                }
            }
            Entry::Vacant(at) => {
                at.insert(seq);
            }
        }
        shard.slots.push_back(Slot {
            key: k,
            fp: *fp,
            expires: now.saturating_add(self.ttl_ns),
            state: State::Running,
            answer: Vec::new(),
        });
        shard.bytes += ENTRY_OVERHEAD;
        Claim::Run(seq)
    }

    fn finish(&self, key: &Digest, fp: &Digest, slot: u64, tail: &[u8], code: Option<i32>) {
        let k = key_bits(key);
        let mut guard = self.shard(k);
        let shard = &mut *guard;
        let Some(seq) = shard.running(slot, k, fp) else {
            return;
        };
        let mut buf = shard.spare.pop().unwrap_or_default();
        buf.clear();
        buf.reserve(tail.len().next_power_of_two().max(MIN_ANSWER));
        buf.extend_from_slice(tail);
        shard.bytes += buf.len();
        let Some(s) = shard.get_mut(seq) else {
            return;
        };
        s.answer = buf;
        s.state = State::Done(code);
        // Only the byte bound can be newly passed here (expiry is the claims' business),
        // so the clock is not read: the claim's time (its expiry less the TTL) serves,
        // older by the call's duration, which only makes this trim drop less.
        let claimed = s.expires.saturating_sub(self.ttl_ns);
        if shard.bytes > self.max_bytes {
            shard.trim(claimed, self.ttl_ns, self.max_bytes);
        }
    }

    fn release(&self, key: &Digest, fp: &Digest, slot: u64) {
        let k = key_bits(key);
        let mut guard = self.shard(k);
        let shard = &mut *guard;
        let Some(seq) = shard.running(slot, k, fp) else {
            return;
        };
        shard.map.remove(&k);
        if seq + 1 == shard.next_seq() {
            // The newest slot (the usual case: refused right after its claim): popped.
            shard.slots.pop_back();
            shard.bytes = shard.bytes.saturating_sub(ENTRY_OVERHEAD);
        } else if let Some(s) = shard.get_mut(seq) {
            s.state = State::Gone;
        }
    }

    fn remote(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(max: usize, ttl_ms: u64) -> MemoryStore {
        MemoryStore::new(max, Duration::from_millis(ttl_ms))
    }

    /// The slot of a claim that runs.
    fn run(claim: Claim) -> u64 {
        match claim {
            Claim::Run(slot) => slot,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn claim_finish_replay_mismatch() {
        let s = store(1 << 20, 60_000);
        let (k, fp, other) = (s.digest(&[b"a"]), s.digest(&[b"f"]), s.digest(&[b"g"]));
        let mut out = Vec::new();
        let slot = run(s.claim(&k, &fp, Id::Int(1), &mut out));
        assert_eq!(s.claim(&k, &fp, Id::Int(1), &mut out), Claim::InProgress);
        assert_eq!(s.claim(&k, &other, Id::Int(1), &mut out), Claim::Mismatch);
        assert!(out.is_empty());
        // A finish with another fingerprint (not this claim's) changes nothing.
        s.finish(&k, &other, slot, br#""result":4}"#, None);
        assert_eq!(s.claim(&k, &fp, Id::Int(1), &mut out), Claim::InProgress);
        s.finish(&k, &fp, slot, br#""result":5}"#, None);
        assert_eq!(
            s.claim(&k, &fp, Id::Int(2), &mut out),
            Claim::Replayed(None)
        );
        assert_eq!(out, br#"{"jsonrpc":"2.0","id":2,"result":5}"#);
        assert_eq!(s.claim(&k, &other, Id::Int(1), &mut out), Claim::Mismatch);
        // A second finish (a late duplicate) changes nothing.
        s.finish(&k, &fp, slot, br#""result":6}"#, None);
        out.clear();
        assert_eq!(
            s.claim(&k, &fp, Id::Int(3), &mut out),
            Claim::Replayed(None)
        );
        assert!(out.ends_with(br#""result":5}"#));
    }

    #[test]
    fn release_frees_only_a_running_claim() {
        let s = store(1 << 20, 60_000);
        let (k, fp) = (s.digest(&[b"k"]), s.digest(&[b"f"]));
        let mut out = Vec::new();
        let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
        s.release(&k, &fp, slot);
        assert_eq!(s.len(), 0);
        assert_eq!(s.bytes(), 0);
        let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
        s.finish(&k, &fp, slot, b"x}", None);
        s.release(&k, &fp, slot);
        assert_eq!(s.len(), 1, "a finished answer stays");
    }

    #[test]
    fn released_slots_behind_newer_ones_stay_counted_until_dropped() {
        // All keys in one shard's worth of bytes: a release that is not the newest slot
        // leaves it behind, still counted (it holds memory), and trimmed in turn.
        let max = ENTRY_OVERHEAD * 4 * SHARDS;
        let s = store(max, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        for i in 0..10_000u32 {
            let (a, b) = (
                s.digest(&[b"a", &i.to_le_bytes()]),
                s.digest(&[b"b", &i.to_le_bytes()]),
            );
            let sa = run(s.claim(&a, &fp, Id::Null, &mut out));
            let sb = run(s.claim(&b, &fp, Id::Null, &mut out));
            s.release(&a, &fp, sa);
            s.finish(&b, &fp, sb, b"x}", None);
            assert!(
                s.bytes() <= max + SHARDS * (2 + ENTRY_OVERHEAD),
                "{}",
                s.bytes()
            );
        }
        assert!(s.bytes() <= max, "{} bytes held", s.bytes());
    }

    #[test]
    fn a_running_call_moved_by_trim_is_still_finished() {
        // A shard over its bound moves a running call's slot to the back (new number):
        // its finish, with the claim's old number, still lands.
        let max = ENTRY_OVERHEAD * 4 * SHARDS;
        let s = store(max, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        let long = s.digest(&[b"long"]);
        let slot = run(s.claim(&long, &fp, Id::Null, &mut out));
        for i in 0..1_000u32 {
            let k = s.digest(&[&i.to_le_bytes()]);
            let sk = run(s.claim(&k, &fp, Id::Null, &mut out));
            s.finish(&k, &fp, sk, &[b'x'; 100], None);
        }
        assert_eq!(s.claim(&long, &fp, Id::Null, &mut out), Claim::InProgress);
        s.finish(&long, &fp, slot, b"7}", None);
        out.clear();
        assert_eq!(
            s.claim(&long, &fp, Id::Int(1), &mut out),
            Claim::Replayed(None)
        );
        assert!(out.ends_with(b"7}"));
    }

    #[test]
    fn entries_expire_after_the_ttl_but_running_calls_stay() {
        let s = store(1 << 20, 30);
        let (a, b, fp) = (s.digest(&[b"a"]), s.digest(&[b"b"]), s.digest(&[b"f"]));
        let mut out = Vec::new();
        let sa = run(s.claim(&a, &fp, Id::Null, &mut out));
        s.finish(&a, &fp, sa, b"x}", None);
        let sb = run(s.claim(&b, &fp, Id::Null, &mut out));
        std::thread::sleep(Duration::from_millis(60));
        // `a` expired: a new call; `b` still runs (a call past its deadline stays in
        // progress until its handler finishes).
        run(s.claim(&a, &fp, Id::Null, &mut out));
        assert_eq!(s.claim(&b, &fp, Id::Null, &mut out), Claim::InProgress);
        s.finish(&b, &fp, sb, b"y}", Some(-32001));
        out.clear();
        assert_eq!(
            s.claim(&b, &fp, Id::Null, &mut out),
            Claim::Replayed(Some(-32001))
        );
    }

    #[test]
    fn bounded_in_bytes_oldest_evicted_first() {
        let max = 64 * 1024;
        let s = store(max, 600_000);
        let fp = s.digest(&[b"f"]);
        let answer = vec![b'x'; 200];
        let mut out = Vec::new();
        let keys: Vec<Digest> = (0..10_000u32)
            .map(|i| s.digest(&[&i.to_le_bytes()]))
            .collect();
        for k in &keys {
            let slot = run(s.claim(k, &fp, Id::Null, &mut out));
            s.finish(k, &fp, slot, &answer, None);
            assert!(s.bytes() <= max + SHARDS * (answer.len() + ENTRY_OVERHEAD));
        }
        assert!(s.bytes() <= max, "{} bytes held", s.bytes());
        // The whole bound is used, not one shard's share of it.
        let held = s.len();
        assert!(
            held * (answer.len() + ENTRY_OVERHEAD) > max / 2,
            "{held} entries held"
        );
        // The newest are still there; the oldest were evicted.
        out.clear();
        assert_eq!(
            s.claim(&keys[9_999], &fp, Id::Null, &mut out),
            Claim::Replayed(None)
        );
        run(s.claim(&keys[0], &fp, Id::Null, &mut out));
    }

    #[test]
    fn keys_spread_over_every_shard() {
        let s = store(1 << 20, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        for i in 0..1_600u32 {
            let k = s.id_digest("app", Id::UInt(u64::from(i)));
            run(s.claim(&k, &fp, Id::Null, &mut out));
        }
        let spread = s.spread();
        assert!(spread.iter().all(|&n| n > 50), "{spread:?}");
    }

    #[test]
    fn id_keys_are_typed() {
        let s = store(1 << 20, 600_000);
        let keys = [
            s.id_digest("app", Id::Null),
            s.id_digest("app", Id::Str("1")),
            s.id_digest("app", Id::UInt(1)),
            s.id_digest("app", Id::Float(1.0)),
            s.id_digest("app", Id::Int(-1)),
            s.id_digest("ap", Id::Str("p1")),
            s.id_digest("app", Id::Str("")),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // 1 read as signed or unsigned is the same id.
        assert_eq!(
            s.id_digest("app", Id::Int(1)),
            s.id_digest("app", Id::UInt(1))
        );
        // Never a key of another kind (an Idempotency-Key's parts).
        assert_ne!(s.id_digest("", Id::Null), s.digest(&[]));
        assert_ne!(s.digest(&[b"ab", b"c"]), s.digest(&[b"a", b"bc"]));
    }
}
