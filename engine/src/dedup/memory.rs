//! The in-memory de-duplication store: answers by key, bounded in bytes, each kept for
//! a TTL.
//!
//! Sharded by key (a mutex per shard, so reactors and workers rarely meet). Each shard
//! keeps its entries in insertion order: with one TTL for all, the oldest entry is
//! always the first to expire, and also the one evicted when the shard is over its
//! share of the byte bound. Answer buffers of evicted entries are kept for reuse, so a
//! store in steady state allocates nothing per call.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::RandomState;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rustc_hash::FxHashMap;

use super::{write_replay, Claim, Digest, Store};
use crate::codec::Id;

/// Shards: a power of two, enough that two reactors and a few workers rarely contend.
const SHARDS: usize = 16;

/// What an entry costs besides its answer: the map slot, the order slot, the buffer.
pub(crate) const ENTRY_OVERHEAD: usize = 96;

/// Spare answer buffers kept per shard.
const SPARE: usize = 64;

struct Entry {
    fp: Digest,
    /// When it may be dropped (nanoseconds since the store's epoch).
    expires: u64,
    /// `None` while the call runs; then its answer's tail and code.
    done: Option<(Vec<u8>, Option<i32>)>,
}

#[derive(Default)]
struct Shard {
    map: FxHashMap<u128, Entry>,
    /// Keys in insertion order, with the expiry they were inserted with.
    order: VecDeque<(u128, u64)>,
    /// Bytes held: answers plus [`ENTRY_OVERHEAD`] per entry.
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

    fn shard(&self, key: u128) -> MutexGuard<'_, Shard> {
        // The low bits pick the map slot; the high ones pick the shard.
        let i = (key >> 120) as usize % SHARDS;
        // A panic while holding the lock leaves consistent data (every step below
        // leaves the shard whole): still usable.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
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
}

impl Shard {
    /// Drops entries from the front of the order while they have expired or the shard
    /// is over `max_bytes`. A running call's entry is never dropped: it goes to the
    /// back, to be looked at again later.
    fn trim(&mut self, now: u64, ttl_ns: u64, max_bytes: usize) {
        let mut looked = 0;
        while let Some(&(key, expires)) = self.order.front() {
            let over = self.bytes > max_bytes;
            if !over && expires > now {
                break;
            }
            // Each entry is looked at once per trim: a shard full of running calls
            // cannot spin here.
            looked += 1;
            if looked > self.order.len() {
                break;
            }
            self.order.pop_front();
            let Some(entry) = self.map.get_mut(&key) else {
                continue;
            };
            if entry.expires != expires {
                // A stale order slot: the key was reinserted since.
                continue;
            }
            if entry.done.is_none() {
                let later = now.saturating_add(ttl_ns);
                entry.expires = later;
                self.order.push_back((key, later));
                continue;
            }
            if let Some(entry) = self.map.remove(&key) {
                self.free(entry);
            }
        }
    }

    fn free(&mut self, entry: Entry) {
        self.bytes = self.bytes.saturating_sub(ENTRY_OVERHEAD);
        if let Some((buf, _)) = entry.done {
            self.bytes = self.bytes.saturating_sub(buf.len());
            if self.spare.len() < SPARE {
                self.spare.push(buf);
            }
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

fn as_u128(d: &Digest) -> u128 {
    u128::from_le_bytes(*d)
}

impl Store for MemoryStore {
    fn digest(&self, parts: &[&[u8]]) -> Digest {
        // 64 bits under a random seed: keys and fingerprints are compared together, so
        // a wrong replay needs both to collide (2^-128 for a caller who cannot see the
        // seed), and a key alone colliding (a -32043 for an innocent call) is about
        // 2^-64 per stored entry. One hash run each, not two.
        // Short inputs (keys, small params) are gathered on the stack and hashed in one
        // write: foldhash is fastest on one slice, not on many small writes.
        let mut buf = [0u8; 128];
        let mut n = 0;
        let mut h = self.seed.build_hasher();
        for p in parts {
            let len = (p.len() as u32).to_le_bytes();
            if n + 4 + p.len() <= buf.len() {
                buf[n..n + 4].copy_from_slice(&len);
                buf[n + 4..n + 4 + p.len()].copy_from_slice(p);
                n += 4 + p.len();
            } else {
                h.write(&buf[..n]);
                n = 0;
                h.write(&len);
                h.write(p);
            }
        }
        h.write(&buf[..n]);
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&h.finish().to_le_bytes());
        d
    }

    fn claim(&self, key: &Digest, fp: &Digest, id: Id<'_>, out: &mut Vec<u8>) -> Claim {
        let now = self.now();
        let k = as_u128(key);
        let mut shard = self.shard(k);
        shard.trim(now, self.ttl_ns, self.max_bytes);
        let expires = now.saturating_add(self.ttl_ns);
        let fresh = Entry {
            fp: *fp,
            expires,
            done: None,
        };
        // One lookup: the new claim goes into the slot found.
        match shard.map.entry(k) {
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                let entry = slot.get();
                if entry.expires > now || entry.done.is_none() {
                    return match (&entry.done, entry.fp == *fp) {
                        (_, false) => Claim::Mismatch,
                        (None, true) => Claim::InProgress,
                        (Some((tail, code)), true) => {
                            write_replay(out, id, tail);
                            Claim::Replayed(*code)
                        }
                    };
                }
                // Expired but not trimmed yet (it is not at the front): replaced.
                let old = std::mem::replace(slot.get_mut(), fresh);
                shard.free(old);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(fresh);
            }
        }
        shard.order.push_back((k, expires));
        shard.bytes += ENTRY_OVERHEAD;
        Claim::Run
    }

    fn finish(&self, key: &Digest, fp: &Digest, tail: &[u8], code: Option<i32>) {
        let now = self.now();
        let k = as_u128(key);
        let mut shard = self.shard(k);
        let mut buf = shard.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(tail);
        let Some(entry) = shard.map.get_mut(&k) else {
            shard.spare.push(buf);
            return;
        };
        if entry.fp != *fp || entry.done.is_some() {
            shard.spare.push(buf);
            return;
        }
        let len = buf.len();
        entry.done = Some((buf, code));
        shard.bytes += len;
        shard.trim(now, self.ttl_ns, self.max_bytes);
    }

    fn release(&self, key: &Digest, fp: &Digest) {
        let k = as_u128(key);
        let mut shard = self.shard(k);
        if shard
            .map
            .get(&k)
            .is_some_and(|e| e.fp == *fp && e.done.is_none())
        {
            if let Some(entry) = shard.map.remove(&k) {
                shard.free(entry);
            }
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

    #[test]
    fn claim_finish_replay_mismatch() {
        let s = store(1 << 20, 60_000);
        let (k, fp, other) = (s.digest(&[b"a"]), s.digest(&[b"f"]), s.digest(&[b"g"]));
        let mut out = Vec::new();
        assert_eq!(s.claim(&k, &fp, Id::Int(1), &mut out), Claim::Run);
        assert_eq!(s.claim(&k, &fp, Id::Int(1), &mut out), Claim::InProgress);
        assert_eq!(s.claim(&k, &other, Id::Int(1), &mut out), Claim::Mismatch);
        assert!(out.is_empty());
        s.finish(&k, &fp, br#""result":5}"#, None);
        assert_eq!(
            s.claim(&k, &fp, Id::Int(2), &mut out),
            Claim::Replayed(None)
        );
        assert_eq!(out, br#"{"jsonrpc":"2.0","id":2,"result":5}"#);
        assert_eq!(s.claim(&k, &other, Id::Int(1), &mut out), Claim::Mismatch);
        // A second finish (a late duplicate) changes nothing.
        s.finish(&k, &fp, br#""result":6}"#, None);
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
        assert_eq!(s.claim(&k, &fp, Id::Null, &mut out), Claim::Run);
        s.release(&k, &fp);
        assert_eq!(s.len(), 0);
        assert_eq!(s.bytes(), 0);
        assert_eq!(s.claim(&k, &fp, Id::Null, &mut out), Claim::Run);
        s.finish(&k, &fp, b"x}", None);
        s.release(&k, &fp);
        assert_eq!(s.len(), 1, "a finished answer stays");
    }

    #[test]
    fn entries_expire_after_the_ttl_but_running_calls_stay() {
        let s = store(1 << 20, 30);
        let (a, b, fp) = (s.digest(&[b"a"]), s.digest(&[b"b"]), s.digest(&[b"f"]));
        let mut out = Vec::new();
        assert_eq!(s.claim(&a, &fp, Id::Null, &mut out), Claim::Run);
        s.finish(&a, &fp, b"x}", None);
        assert_eq!(s.claim(&b, &fp, Id::Null, &mut out), Claim::Run);
        std::thread::sleep(Duration::from_millis(60));
        // `a` expired: a new call; `b` still runs (a call past its deadline stays in
        // progress until its handler finishes).
        assert_eq!(s.claim(&a, &fp, Id::Null, &mut out), Claim::Run);
        assert_eq!(s.claim(&b, &fp, Id::Null, &mut out), Claim::InProgress);
        s.finish(&b, &fp, b"y}", Some(-32001));
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
            assert_eq!(s.claim(k, &fp, Id::Null, &mut out), Claim::Run);
            s.finish(k, &fp, &answer, None);
            assert!(s.bytes() <= max + SHARDS * (answer.len() + ENTRY_OVERHEAD));
        }
        assert!(s.bytes() <= max, "{} bytes held", s.bytes());
        // The newest are still there; the oldest were evicted.
        out.clear();
        assert_eq!(
            s.claim(&keys[9_999], &fp, Id::Null, &mut out),
            Claim::Replayed(None)
        );
        assert_eq!(s.claim(&keys[0], &fp, Id::Null, &mut out), Claim::Run);
    }
}
