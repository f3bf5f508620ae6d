//! The in-memory de-duplication store: answers by key, bounded in bytes, each kept for
//! a TTL.
//!
//! Sharded by key (a mutex per shard, so reactors and workers rarely meet). Each shard
//! keeps its entries in a ring of slots in insertion order, numbered by a running
//! sequence number: with one TTL for all, the oldest entry is always the first to
//! expire, and also the one evicted when the shard is over its share of the byte bound.
//! A compact index (8 bytes an entry, see [`Index`]) points a key at its slot's number,
//! and a claim hands that number back, so storing the answer after the call needs no
//! second lookup. Short answers live in their slot; longer ones in buffers kept for
//! reuse after eviction, so a store in steady state allocates nothing per call.
//!
//! Memory touched per call, for a store larger than the CPU's caches: the index (2-4
//! MiB for 16 MiB of entries, so it stays in the last-level cache) once, at random (the
//! new key's line: an evicted entry's is not touched, it goes stale in place; a
//! counted id's line is shared with the other three of its group, see [`grouped`]), and the
//! ring at its front, fetched ahead (see [`Shard::prefetch_evictions`]). The ring is
//! sized to the bound, so a full shard's new slot goes where the one evicted just
//! before it was: one line, not two (cachegrind at 16 MiB: 2.96 → 1.92 last-level
//! misses a call). In a server, for a store of 4 MiB or more, the index line (with the
//! one after it, which a quarter to a third of the probes reach) and the shard's header are
//! fetched ahead too, a call early: while the current call runs, the reactor guesses
//! the next line's id (a client counting its calls) or peeks at it
//! ([`MemoryStore::prefetch`], through `Engine::prefetch_frame`).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use foldhash::fast::RandomState;
use simd_json::{Node, StaticNode};
use spin::mutex::{SpinMutex, SpinMutexGuard};

use super::table::{self, Shares, Table};
use super::{write_replay, Claim, Digest, Identity, Store};
use crate::codec::Id;
use crate::hash::fold;
use crate::Params;

/// Shards: a power of two, enough that two reactors and a few workers rarely contend.
const SHARDS: usize = 16;

/// What an entry is counted as besides an answer in a buffer of its own: its ring slot
/// (64 bytes, an answer kept in it included), its index entry and the index's slack
/// (24-32 bytes an entry). So a shard whose answers all fit their slots holds a fixed
/// number of entries, which its ring is sized to (see [`MemoryStore::slots`]).
pub(crate) const ENTRY_OVERHEAD: usize = 96;

/// Stale entries [`Shard::clean_run`] deletes at most in one run; the rest wait for a
/// rebuild. (With 8, a 64 MiB store under `incr` kept so many that its index stayed
/// near its rebuild mark, three quarters full, against two thirds with 64 or with no
/// limit.)
const CLEAN_HOLES: usize = 64;

/// Spare answer buffers kept per shard at most (counted in its bytes: memory held).
const SPARE: usize = 64;

/// The least capacity of an answer buffer: with capacities rounded up to a power of two,
/// a reused buffer fits answers somewhat longer than the one it was made for (a counter
/// gaining a digit), instead of growing again.
const MIN_ANSWER: usize = 32;

/// The longest answer tail kept in its slot: what fits beside the slot's other fields
/// in one 64-byte cache line (`"result":` and a number of up to 20 digits does).
const INLINE: usize = 30;

/// Where a slot's call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The call runs.
    Running,
    /// Answered: the answer's code (its tail is in the slot's [`Answer`]).
    Done(Option<i32>),
    /// Released or replaced: no key points here any more; it only waits to be popped
    /// (and still counts its overhead, as it holds ring memory until then).
    Gone,
}

/// A stored answer's tail.
enum Answer {
    /// Short (a counter's `"result":5}`): in the slot itself, so evicting it touches no
    /// other memory.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// Longer: a buffer, kept for reuse when evicted.
    Heap(Vec<u8>),
}

impl Answer {
    const EMPTY: Self = Self::Inline {
        len: 0,
        bytes: [0; INLINE],
    };

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            Self::Heap(buf) => buf,
        }
    }
}

/// One cache line: the ring's two ends are all a call touches of it.
#[repr(align(64))]
struct Slot {
    /// The key's first 64 bits (see [`key_bits`]).
    key: u64,
    /// The fingerprint's first 64 bits: all the memory store's digests fill.
    fp: u64,
    /// When it may be dropped (nanoseconds since the store's epoch).
    expires: u64,
    state: State,
    /// The answer's tail when [`State::Done`]; else empty.
    answer: Answer,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

impl Slot {
    /// A place in the ring holding no entry.
    const VACANT: Self = Self {
        key: 0,
        fp: 0,
        expires: 0,
        state: State::Gone,
        answer: Answer::EMPTY,
    };
}

/// A queue of slots in one buffer (a `VecDeque` that also shows where its next slot
/// goes, to fetch that line ahead of time).
#[derive(Default)]
struct Ring {
    /// The `i`-th oldest slot is at `front + i`, less the buffer's length past its end;
    /// the places after the newest hold what was there (see [`Ring::skip_front`]).
    buf: Vec<Slot>,
    front: usize,
    len: usize,
}

impl Ring {
    fn len(&self) -> usize {
        self.len
    }

    /// The place of the `i`-th oldest slot (or, past the newest, of the next ones), for
    /// `i` up to the buffer's length.
    #[inline(always)]
    fn place(&self, i: usize) -> usize {
        // `front` is below the buffer's length and `i` at most that: one subtraction
        // wraps it (the buffer's length need not be a power of two).
        let at = self.front + i;
        at - if at >= self.buf.len() {
            self.buf.len()
        } else {
            0
        }
    }

    fn get(&self, i: usize) -> Option<&Slot> {
        if i < self.len {
            self.buf.get(self.place(i))
        } else {
            None
        }
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Slot> {
        if i < self.len {
            let at = self.place(i);
            self.buf.get_mut(at)
        } else {
            None
        }
    }

    fn front(&self) -> Option<&Slot> {
        // (`front` is always a place in the buffer: no wrap to compute.)
        if self.len > 0 {
            self.buf.get(self.front)
        } else {
            None
        }
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &Slot> {
        (0..self.len).filter_map(|i| self.get(i))
    }

    fn front_mut(&mut self) -> Option<&mut Slot> {
        if self.len > 0 {
            self.buf.get_mut(self.front)
        } else {
            None
        }
    }

    /// Drops the oldest slot without moving it: its place keeps what it held until a
    /// newer slot is written there (only what needs no dropping: see [`Shard::trim`]).
    fn skip_front(&mut self) {
        if self.len > 0 {
            self.front = self.place(1);
            self.len -= 1;
        }
    }

    fn pop_front(&mut self) -> Option<Slot> {
        let slot = std::mem::replace(self.get_mut(0)?, Slot::VACANT);
        self.front = self.place(1);
        self.len -= 1;
        Some(slot)
    }

    fn pop_back(&mut self) -> Option<Slot> {
        let slot = std::mem::replace(self.get_mut(self.len.checked_sub(1)?)?, Slot::VACANT);
        self.len -= 1;
        Some(slot)
    }

    /// Pushes `slot` at the back; when the buffer is full it grows, up to `cap` slots
    /// (0: doubling). A shard's `cap` is [`MemoryStore::slots`].
    #[inline]
    fn push_back(&mut self, slot: Slot, cap: usize) {
        if self.len == self.buf.len() {
            self.grow(cap);
        }
        let at = self.place(self.len);
        if let Some(to) = self.buf.get_mut(at) {
            *to = slot;
            self.len += 1;
        }
    }

    /// Twice the room up to `cap` slots (past it only when a push finds it full of
    /// running calls), the slots moved to the new buffer's start (while the store
    /// fills, or when running calls fill it).
    #[cold]
    #[inline(never)]
    fn grow(&mut self, cap: usize) {
        let twice = (self.buf.len() * 2).max(16);
        let size = if self.buf.len() < cap {
            twice.min(cap)
        } else {
            twice
        };
        let mut buf = Vec::with_capacity(size);
        for i in 0..self.len {
            let at = self.place(i);
            buf.push(std::mem::replace(&mut self.buf[at], Slot::VACANT));
        }
        buf.resize_with(size, || Slot::VACANT);
        self.buf = buf;
        self.front = 0;
    }
}

/// Asks the CPU to bring `p`'s cache line in, without waiting for it: a hint, which
/// changes nothing the program sees.
#[inline(always)]
fn prefetch<T>(p: &T) {
    prefetch_addr(std::ptr::from_ref(p).cast());
}

/// [`prefetch`] of any address, even one no longer allocated (a [`Hint`] read while
/// its table is replaced): the address is not dereferenced.
#[inline(always)]
fn prefetch_addr(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` reads no memory the program sees and never faults, whatever
    // the address; SSE, its target feature, is in x86_64's baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// A shard's index: key → the sequence number of its slot.
///
/// Open addressing with linear probing over 8-byte entries: the key's low 31 bits with
/// the top bit set (so an entry is never 0, an empty place) above the low 32 bits of the
/// slot's number. A shard of a 16 MiB store (~11,000 entries) has an index of 256 KiB
/// (live entries fill at most half of it after a rebuild, live and stale ones at most
/// three quarters; ~24 bytes an entry, within [`ENTRY_OVERHEAD`] with its slot), where a
/// hash map of full keys and numbers with its control bytes took ~280 KiB, and a probe
/// reads one cache line instead of two. A tag match is confirmed against the
/// key in the slot (a wrong match, about 2^-17 per probe, costs one more read, never a
/// wrong answer). A released claim's entry is deleted by shifting the entries after it
/// back; an evicted one's is left stale (see [`Shard`]).
#[derive(Default)]
struct Index {
    /// Empty, or a power of two long, at most three quarters full (live and stale
    /// entries together: see [`Shard`]). At its largest, in a large store, in huge
    /// pages (see [`table`]).
    table: Table,
    /// Places not empty: live entries and stale ones.
    len: usize,
}

/// An index entry's tag for `key`; its home place is the tag's low bits.
fn tag(key: u64) -> u32 {
    (key as u32) | 1 << 31
}

fn entry(tag: u32, seq: u64) -> u64 {
    u64::from(tag) << 32 | (seq & u64::from(u32::MAX))
}

fn entry_tag(e: u64) -> u32 {
    (e >> 32) as u32
}

impl Index {
    fn mask(&self) -> usize {
        self.table.len().wrapping_sub(1)
    }

    /// Where `key`'s probe starts.
    fn home(&self, tag: u32) -> usize {
        tag as usize & self.mask()
    }

    /// Puts an entry in the first empty place from its home (the key is not present).
    fn put(&mut self, e: u64) {
        let mask = self.mask();
        let mut at = self.home(entry_tag(e));
        while self.table[at] != 0 {
            at = (at + 1) & mask;
        }
        self.table[at] = e;
        self.len += 1;
    }

    /// Puts entry `e` at place `at`, an empty place or a stale entry's (already
    /// counted); whether it was a stale entry's.
    #[inline]
    fn take(&mut self, at: usize, e: u64) -> bool {
        let Some(place) = self.table.get_mut(at) else {
            return false;
        };
        let stale = *place != 0;
        self.len += usize::from(!stale);
        *place = e;
        stale
    }

    /// The place of entry `e`, if present.
    fn position(&self, e: u64) -> Option<usize> {
        if self.table.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut at = self.home(entry_tag(e));
        loop {
            match self.table[at] {
                0 => return None,
                x if x == e => return Some(at),
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Empties place `at`, moving later entries of its run back into the hole when their
    /// home allows it.
    fn delete(&mut self, at: usize) {
        let mask = self.mask();
        let mut hole = at;
        let mut next = at;
        loop {
            next = (next + 1) & mask;
            let e = self.table[next];
            if e == 0 {
                break;
            }
            // `e` may fill the hole unless its home lies after the hole (cyclically, up
            // to its own place).
            let home = self.home(entry_tag(e));
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.table[hole] = e;
                hole = next;
            }
        }
        self.table[hole] = 0;
        self.len -= 1;
    }

    /// Removes the entry of `key` at slot `seq`; whether it was there.
    fn remove(&mut self, key: u64, seq: u64) -> bool {
        match self.position(entry(tag(key), seq)) {
            Some(at) => {
                self.delete(at);
                true
            }
            None => false,
        }
    }
}

#[derive(Default)]
struct Shard {
    index: Index,
    /// Slots in insertion order; `slots[i]` has sequence number `head + i`. Every slot
    /// not [`State::Gone`] has one index entry, and no other slot in the ring has any.
    /// An evicted slot's entry is not removed: it goes stale (its number is before
    /// `head`, see [`Shard::stale`]), lookups pass over it as over another key's, a
    /// claim's insertion takes its place when its probe meets it and then deletes the
    /// others its probe passed ([`Shard::clean_run`]), and rebuilds drop those left. So
    /// an eviction touches only the ring.
    slots: Ring,
    /// The sequence number of `slots[0]`.
    head: u64,
    /// `head` at the index's last rebuild: a stale entry's 32-bit number must not come
    /// round to a live slot's, so the index is rebuilt before `head` moves 2^31 on.
    rebuilt_at: u64,
    /// Rebuilds so far (for tests).
    #[cfg(test)]
    rebuilds: usize,
    /// Bytes held: [`ENTRY_OVERHEAD`] per slot, plus the capacity of every answer
    /// buffer, an answer's or a spare one.
    bytes: usize,
    spare: Vec<Vec<u8>>,
}

/// A shard behind its lock, on lines of its own (its lock and the fields a call reads
/// are its first two lines, fetched ahead by [`MemoryStore::prefetch`]).
///
/// A spin lock (a try, then spinning on reads, then yielding, then short sleeps): a
/// claim or a finish holds it for a few hundred instructions, and its release is a
/// plain store, where a futex mutex's is a locked instruction. Two of those a
/// de-duplicated call: ~16 ns of its cost in a server (TCP 16x64 `incr` at 64 KiB,
/// 2.105 -> 2.178 M calls/s; docs/PERFORMANCE.md, stop 34).
#[repr(align(64))]
#[derive(Default)]
struct Locked(SpinMutex<Shard>);

impl Locked {
    /// The shard, locked.
    #[inline(always)]
    fn lock(&self) -> SpinMutexGuard<'_, Shard> {
        match self.0.try_lock() {
            Some(g) => g,
            None => self.wait(),
        }
    }

    /// [`Locked::lock`] when another thread holds it: spins on reads a while (a claim
    /// holds it for well under a microsecond), then yields its time, in case the
    /// holder was preempted, and past that sleeps in growing steps: a rare long hold
    /// (an index rebuild, ~0.8 ms at 64 MiB; a trim after a TTL's worth of idleness)
    /// should not have waiters burn a CPU the holder may need.
    #[cold]
    #[inline(never)]
    fn wait(&self) -> SpinMutexGuard<'_, Shard> {
        const SPINS: u32 = 128;
        const YIELDS: u32 = 64;
        let mut tries = 0u32;
        loop {
            if !self.0.is_locked() {
                if let Some(g) = self.0.try_lock() {
                    return g;
                }
            }
            tries = tries.saturating_add(1);
            if tries <= SPINS {
                std::hint::spin_loop();
            } else if tries <= SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                // 50 µs, doubling to 800: a waiter wakes a few times during a rebuild,
                // rarely during a long hold.
                let doublings = (tries - SPINS - YIELDS - 1).min(4);
                std::thread::sleep(Duration::from_micros(50 << doublings));
            }
        }
    }
}

// Two lines, both fetched ahead (tests add a counter to the shard).
#[cfg(not(test))]
const _: () = assert!(std::mem::size_of::<Locked>() == 128);

/// Where a shard's index is, readable without its lock, so that a call can fetch its
/// index line ahead of the claim ([`MemoryStore::prefetch`]): set under the lock when
/// the table is replaced. A stale value only fetches a useless line.
#[derive(Default)]
struct Hint {
    table: AtomicPtr<u64>,
    mask: AtomicUsize,
}

/// Answers in memory.
pub(crate) struct MemoryStore {
    shards: Box<[Locked]>,
    /// Where each shard's index goes when it reaches its largest size, in a large store
    /// (see [`table`]); taken then, under the shard's lock. Declared after `shards`, so
    /// dropped after their tables.
    shares: Shares,
    /// Each shard's index's place ([`Hint`]), together on a few lines every call reads.
    hints: Box<[Hint; SHARDS]>,
    /// Each shard's share of the byte bound, less one slot (see [`MemoryStore::new`]).
    max_bytes: usize,
    /// The length each shard's ring grows to and stops at: one more than the entries
    /// its byte bound holds, so that once full a claim's new slot goes where the slot
    /// evicted just before it was, a line the eviction has just read (see [`Shard`]).
    /// Only a push that finds the ring full of running calls (never evicted) grows it
    /// further, and the ring then keeps that size: the most calls it held running.
    slots: usize,
    ttl_ns: u64,
    /// [`coarse_now_ns`] at creation.
    epoch: u64,
    /// The hash's random seeds: a caller cannot aim a key at another caller's without
    /// knowing them.
    seeds: Seeds,
}

impl MemoryStore {
    /// A store of at most `max_bytes`, entries kept for `ttl`. What is held stays
    /// within the bound (rings, indexes and answer buffers, spare ones included), save
    /// the running calls a full shard cannot evict.
    pub(crate) fn new(max_bytes: usize, ttl: Duration) -> Self {
        // Less one slot: the ring has one more than its entries (see `slots`), and an
        // entry's index share is at most 32 bytes, so the tables stay within the
        // shard's share.
        let max_bytes = (max_bytes / SHARDS).max(ENTRY_OVERHEAD * 4) - std::mem::size_of::<Slot>();
        let slots = max_bytes / ENTRY_OVERHEAD + 1;
        // A shard holds at most one entry fewer than its ring's slots.
        Self {
            shards: (0..SHARDS).map(|_| Locked::default()).collect(),
            shares: Shares::new(SHARDS, table::largest(slots - 1)),
            hints: Box::default(),
            max_bytes,
            slots,
            ttl_ns: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
            epoch: coarse_now_ns(),
            seeds: Seeds::process(),
        }
    }

    /// Now, to the few milliseconds a TTL of minutes needs: the kernel's coarse
    /// monotonic clock is read without a timer read (~5 ns instead of ~20).
    fn now(&self) -> u64 {
        coarse_now_ns().saturating_sub(self.epoch)
    }

    /// The shard of `key`: the top bits pick it (the index uses the low ones). They must
    /// be bits the digest sets: the memory store's digests fill 64 of 128.
    #[inline(always)]
    fn shard_of(key: u64) -> usize {
        (key >> (64 - SHARDS.trailing_zeros())) as usize % SHARDS
    }

    fn shard(&self, key: u64) -> SpinMutexGuard<'_, Shard> {
        // (A panic while holding the lock leaves consistent data: every step below
        // leaves the shard whole.)
        self.shards[Self::shard_of(key)].lock()
    }

    /// Fetches, without waiting, the lines a claim of `key` reads first: its shard's
    /// lock and header, and its index line with the one after it (a probe from a home
    /// near its line's end runs on into the next: a quarter of the probes of a full
    /// 64 MiB store, whose index is two thirds full, live and stale entries about
    /// alike, with keys at random; fetching it too, +1.5-4 % calls/s. With counted ids,
    /// whose homes cluster, a third of the claims run on, and a group's first a line
    /// further in a quarter of its claims: fetching a third line too gained nothing,
    /// docs/PERFORMANCE.md, stop 33). Called by the reactor for the next line's
    /// call while the current one runs (`Engine::prefetch_frame`), so that the fetch
    /// overlaps a whole call's work: in a server, where the socket work evicts the
    /// store between calls, the index line alone is an L3 or memory access with a TLB
    /// miss (docs/PERFORMANCE.md, stop 29: ~150 ns a call at 64 MiB).
    #[inline(always)]
    pub(crate) fn prefetch(&self, key: &Digest) {
        let k = key_bits(key);
        let i = Self::shard_of(k);
        if let Some(s) = self.shards.get(i) {
            prefetch(s);
            // The header's second line.
            prefetch_addr(std::ptr::from_ref(s).cast::<u8>().wrapping_add(64));
        }
        if let Some(h) = self.hints.get(i) {
            let table = h.table.load(Ordering::Relaxed);
            if !table.is_null() {
                let mask = h.mask.load(Ordering::Relaxed);
                let home = tag(k) as usize & mask;
                prefetch_addr(table.wrapping_add(home).cast::<u8>());
                // Eight places on: in the next line, whatever the table's alignment (a
                // probe past the table's end goes on at its start).
                prefetch_addr(table.wrapping_add((home + 8) & mask).cast::<u8>());
            }
        }
    }

    /// Entries held now, in all shards (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().live()).sum()
    }

    /// Bytes held now, in all shards (for tests).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }

    /// Entries held now, per shard (for tests).
    #[cfg(test)]
    fn spread(&self) -> Vec<usize> {
        self.shards.iter().map(|s| s.lock().live()).collect()
    }
}

impl Shard {
    /// Entries held (for tests).
    #[cfg(test)]
    fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.state != State::Gone).count()
    }

    /// The sequence number the next pushed slot gets.
    fn next_seq(&self) -> u64 {
        self.head + self.slots.len() as u64
    }

    /// The slot of `key`: its index place and number.
    fn find(&self, key: u64) -> Option<(usize, u64)> {
        if self.index.table.is_empty() {
            return None;
        }
        self.probe(key).ok()
    }

    /// Index entry `e`'s slot as an offset in the ring, from the entry's low 32 bits (the
    /// ring is never 2^32 slots long): past the ring's end for a stale entry.
    #[inline(always)]
    fn offset(&self, e: u64) -> usize {
        (e as u32).wrapping_sub(self.head as u32) as usize
    }

    /// Whether index entry `e` is stale: its slot was evicted (its number is before
    /// `head`).
    #[inline(always)]
    fn stale(&self, e: u64) -> bool {
        self.offset(e) >= self.slots.len()
    }

    /// `key`'s index place and slot number, or the place where its entry goes (the first
    /// stale place on its probe, else the empty place that ended it) with the empty
    /// place that ended the probe (see [`Shard::clean_run`]). One probe for a
    /// claim's lookup and insertion both (the key is in no place after the empty one,
    /// and a stale place before it may be taken: lookups pass over any entry but an
    /// empty place). The table must not be empty.
    #[inline]
    fn probe(&self, key: u64) -> Result<(usize, u64), (usize, usize)> {
        let tag = tag(key);
        let mask = self.index.mask();
        let mut at = self.index.home(tag);
        let mut free = None;
        loop {
            let e = *self.index.table.get(at).ok_or((at, at))?;
            if e == 0 {
                return Err((free.unwrap_or(at), at));
            }
            let offset = self.offset(e);
            if offset >= self.slots.len() {
                free.get_or_insert(at);
            } else if entry_tag(e) == tag && self.slots.get(offset).is_some_and(|s| s.key == key) {
                return Ok((at, self.head + offset as u64));
            }
            at = (at + 1) & mask;
        }
    }

    /// Deletes the stale entries after place `at` up to place `end`: a claim took `at`
    /// (a stale entry's) and its probe passed them on its way to `end`, the empty place
    /// that ended it, so their lines are in the cache. Stale entries are so deleted
    /// nearly as fast as evictions make them, and the index is rebuilt for them far
    /// less often (6-9 times less in the store's churn test, never in a server at 4,
    /// 16 or 64 MiB under `incr`): a rebuild is a pass over the whole table, ~0.8 ms for a
    /// shard of a 64 MiB store, a pause every call waiting behind it saw (p99 1.4 ms
    /// against 0.7 without them: docs/PERFORMANCE.md, stop 31).
    ///
    /// One pass over the run, where deleting the entries one by one ([`Index::delete`]
    /// shifting the rest of the run back each time) walked it once per stale entry: in
    /// a server at 64 MiB under `incr`, ~7.5 places looked at a claim, against ~1.9
    /// (docs/PERFORMANCE.md, stop 37). Each stale entry leaves a hole; each later entry
    /// moves back into the earliest hole at or after its home, leaving its place a
    /// hole. So no entry is left with a hole between its home and its place (a hole
    /// appears only where the walk is, after every entry already passed), and `end`
    /// stays empty, as do the holes left at the end. Past [`CLEAN_HOLES`] open holes, a
    /// stale entry is kept as a live one is (a rebuild drops it).
    #[inline]
    fn clean_run(&mut self, at: usize, end: usize) {
        // Holes not refilled yet, in the walk's order (the earliest first): places as
        // `u32`, so that zeroing the array is a few stores, not a call of `memset`
        // (a table of more places is not cleaned: a rebuild drops its stale entries).
        if u32::try_from(self.index.mask()).is_err() {
            return;
        }
        let mut holes = [0u32; CLEAN_HOLES];
        let mut open = 0;
        let mask = self.index.mask();
        let mut j = (at + 1) & mask;
        while j != end {
            let Some(&e) = self.index.table.get(j) else {
                return;
            };
            if open < CLEAN_HOLES && self.stale(e) {
                self.index.table[j] = 0;
                self.index.len -= 1;
                holes[open] = j as u32;
                open += 1;
            } else if open > 0 {
                // Holes nearer `j` than `e`'s home are after it, allowed to `e`.
                let reach = j.wrapping_sub(self.index.home(entry_tag(e))) & mask;
                let open_holes = &holes[..open];
                if let Some(i) = open_holes
                    .iter()
                    .position(|&h| j.wrapping_sub(h as usize) & mask <= reach)
                {
                    self.index.table[holes[i] as usize] = e;
                    self.index.table[j] = 0;
                    holes.copy_within(i + 1..open, i);
                    holes[open - 1] = j as u32;
                }
            }
            j = (j + 1) & mask;
        }
    }

    /// Room in the index for one more entry: when it would be over three quarters full
    /// (stale entries counted), it is rebuilt without them, twice as large if the live
    /// ones fill more than half of it, so that a quarter of it fills before the next
    /// rebuild. Also rebuilt when `head` has moved 2^31 since the last rebuild, so that
    /// no stale number comes round to a live one (see [`Shard::stale`]). Returns
    /// whether it rebuilt the index (which may have moved: see [`Hint`]).
    #[inline]
    fn reserve(&mut self, share: impl FnOnce(usize) -> Option<Table>) -> bool {
        let rebuild = (self.index.len + 1) * 4 > self.index.table.len() * 3
            || self.head.wrapping_sub(self.rebuilt_at) > 1 << 31;
        if rebuild {
            self.rebuild(share);
        }
        rebuild
    }

    #[cold]
    #[inline(never)]
    fn rebuild(&mut self, share: impl FnOnce(usize) -> Option<Table>) {
        #[cfg(test)]
        {
            self.rebuilds += 1;
        }
        let size = self.index.table.len();
        // A place empty before the pass: no entry's probe crosses it (there is one: the
        // table is at most three quarters full).
        if let Some(start) = self.index.table.iter().position(|&e| e == 0) {
            // In place, in one pass (no second table to keep or allocate): every entry
            // taken out in order from `start`, a stale one dropped, a live one put back,
            // so that each lands between its home and where it was (every place there
            // was passed already).
            let mask = self.index.mask();
            self.index.len = 0;
            for i in 1..=size {
                let at = (start + i) & mask;
                let e = std::mem::take(&mut self.index.table[at]);
                if e != 0 && !self.stale(e) {
                    self.index.put(e);
                }
            }
        }
        if (self.index.len + 1) * 2 > size {
            // Grown (only while the store grows): a new table, the entries put in.
            let n = (size * 2).max(16);
            let new = share(n).unwrap_or_else(|| Table::zeroed(n));
            let old = std::mem::replace(&mut self.index.table, new);
            self.index.len = 0;
            for &e in old.iter() {
                if e != 0 && !self.stale(e) {
                    self.index.put(e);
                }
            }
        }
        self.rebuilt_at = self.head;
    }

    /// Fetches, without waiting, what this shard's next eviction will touch: the slot
    /// after the next to evict (the next was fetched by the eviction before; evicting
    /// touches no index line, see [`Shard`]; the place of the next slot is fetched by
    /// the claim that fills the one before). By the shard's next call (about a
    /// sixteenth of the calls later) it has arrived. Measured: `claim_16m` 462-484 ns
    /// with, 511-555 without, `claim_64k` unchanged (docs/PERFORMANCE.md).
    fn prefetch_evictions(&self) {
        if let Some(s) = self.slots.get(1) {
            prefetch(s);
        }
    }

    /// The running slot of `key` claimed with `fp`: at `seq` (the claim's number) or,
    /// if it moved since (see [`Shard::trim`]), wherever the index says. Its number and
    /// its place in the ring's buffer (to reach it again without the number's checks).
    #[inline]
    fn running(&self, seq: u64, key: u64, fp: u64) -> Option<(u64, usize)> {
        self.running_at(seq, key, fp)
            .or_else(|| self.moved(key, fp))
    }

    /// [`Shard::running`] for a slot not where its claim put it.
    #[cold]
    #[inline(never)]
    fn moved(&self, key: u64, fp: u64) -> Option<(u64, usize)> {
        let (_, moved) = self.find(key)?;
        self.running_at(moved, key, fp)
    }

    /// Slot `seq`, with its place in the ring's buffer, if it holds `key`'s running
    /// call claimed with `fp`.
    #[inline(always)]
    fn running_at(&self, seq: u64, key: u64, fp: u64) -> Option<(u64, usize)> {
        let at = self
            .slots
            .place(self.offset_of(seq).filter(|&i| i < self.slots.len())?);
        let s = self.slots.buf.get(at)?;
        (s.key == key && s.fp == fp && s.state == State::Running).then_some((seq, at))
    }

    /// Where slot `seq` is from the ring's front (past its end: not held).
    fn offset_of(&self, seq: u64) -> Option<usize> {
        usize::try_from(seq.checked_sub(self.head)?).ok()
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Slot> {
        self.slots.get_mut(self.offset_of(seq)?)
    }

    /// Drops slots from the front while they have expired, are gone, or the shard is
    /// over `max_bytes`. A running call's slot is never dropped: it goes to the back
    /// (with a new number, which its index entry follows), to be looked at again later.
    #[inline]
    fn trim(&mut self, now: u64, ttl_ns: u64, max_bytes: usize) {
        // Most calls have nothing to drop: that is seen here, without a call.
        let keep = |s: &Slot| s.expires > now && s.state != State::Gone;
        if self.bytes <= max_bytes && self.slots.front().is_none_or(keep) {
            return;
        }
        self.drop_front(now, ttl_ns, max_bytes);
    }

    /// [`Shard::trim`]'s work, once there is some.
    #[inline(never)]
    fn drop_front(&mut self, now: u64, ttl_ns: u64, max_bytes: usize) {
        // Each slot is looked at once per trim: a shard full of running calls cannot
        // spin here.
        let mut budget = self.slots.len();
        while budget > 0 {
            self.shed_spares(max_bytes, true);
            let seq = self.head;
            let Some(s) = self.slots.front_mut() else {
                break;
            };
            if self.bytes <= max_bytes && s.expires > now && s.state != State::Gone {
                break;
            }
            budget -= 1;
            match s.state {
                State::Gone => {
                    self.bytes = self.bytes.saturating_sub(ENTRY_OVERHEAD);
                    self.slots.skip_front();
                }
                State::Running => {
                    let Some(mut slot) = self.slots.pop_front() else {
                        break;
                    };
                    self.head += 1;
                    let back = self.next_seq();
                    if let Some(at) = self.index.position(entry(tag(slot.key), seq)) {
                        self.index.table[at] = entry(tag(slot.key), back);
                    }
                    slot.expires = now.saturating_add(ttl_ns);
                    // (Never grows: a slot was just popped.)
                    self.slots.push_back(slot, 0);
                    continue;
                }
                State::Done(_) => {
                    // Left where it is (the place is overwritten by a later slot): an
                    // answer in the slot needs nothing, a buffer is taken out for reuse.
                    let buf = match &mut s.answer {
                        Answer::Inline { .. } => None,
                        Answer::Heap(buf) => Some(std::mem::take(buf)),
                    };
                    // Its index entry goes stale as `head` passes it.
                    self.slots.skip_front();
                    self.bytes = self.bytes.saturating_sub(ENTRY_OVERHEAD);
                    if let Some(buf) = buf {
                        self.keep_spare(buf);
                    }
                }
            }
            self.head += 1;
        }
        // (The last slot's buffer may have gone spare.)
        self.shed_spares(max_bytes, false);
        self.prefetch_evictions();
    }

    /// Lets spare buffers go while the shard is over `max_bytes`, before any answer;
    /// with `keep_one`, all but one that holds no more than the oldest entry does, which
    /// is worth an eviction: a steady flow of long answers reuses it, where freeing it
    /// would cost an allocation a call.
    fn shed_spares(&mut self, max_bytes: usize, keep_one: bool) {
        while self.bytes > max_bytes {
            if keep_one {
                let front = self.slots.front().map_or(0, |s| match &s.answer {
                    Answer::Heap(buf) => ENTRY_OVERHEAD + buf.capacity(),
                    Answer::Inline { .. } => ENTRY_OVERHEAD,
                });
                if self.spares_kept(front) {
                    return;
                }
            }
            let Some(buf) = self.spare.pop() else {
                return;
            };
            self.bytes = self.bytes.saturating_sub(buf.capacity());
        }
    }

    /// Whether the spare buffers are kept over evicting an entry of `front` bytes: when
    /// there are none, or one that holds no more (see [`Shard::shed_spares`]).
    #[inline(always)]
    fn spares_kept(&self, front: usize) -> bool {
        match self.spare.as_slice() {
            [] => true,
            [one] => one.capacity() <= front,
            _ => false,
        }
    }

    /// The usual eviction of a full shard, without [`Shard::drop_front`]'s loop: the
    /// oldest slot answered, its answer in the slot, and dropping it alone brings the
    /// shard back within `max_bytes`. Whether it did (else the loop decides).
    #[inline(always)]
    fn evict_one(&mut self, max_bytes: usize) -> bool {
        let Some(s) = self.slots.front() else {
            return false;
        };
        // Unless a spare buffer would go first (see `Shard::shed_spares`).
        let (State::Done(_), Answer::Inline { .. }, true) =
            (s.state, &s.answer, self.spares_kept(ENTRY_OVERHEAD))
        else {
            return false;
        };
        let bytes = self.bytes.saturating_sub(ENTRY_OVERHEAD);
        if bytes > max_bytes {
            return false;
        }
        // Left where it is, as in `drop_front`; its index entry goes stale.
        self.slots.skip_front();
        self.head += 1;
        self.bytes = bytes;
        self.prefetch_evictions();
        true
    }

    /// Takes back an answer: a buffer is kept for reuse (see [`Shard::keep_spare`]).
    fn recycle(&mut self, answer: Answer) {
        if let Answer::Heap(buf) = answer {
            self.keep_spare(buf);
        }
    }

    /// Keeps an answer's buffer for the next long answer (still counted in `bytes`: it
    /// is memory held), or frees it when [`SPARE`] are kept already.
    fn keep_spare(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARE && buf.capacity() > 0 {
            self.spare.push(buf);
        } else {
            self.bytes = self.bytes.saturating_sub(buf.capacity());
        }
    }

    /// Stores `tail` as the answer of the running slot at place `at` of the ring's
    /// buffer: in the slot if short, else in a (reused) buffer.
    fn store_answer(&mut self, at: usize, tail: &[u8]) -> Option<&mut Slot> {
        let buf = if tail.len() > INLINE {
            let mut buf = self.spare.pop().unwrap_or_default();
            // A spare's capacity was counted already; what the buffer holds now counts.
            let had = buf.capacity();
            buf.clear();
            buf.reserve(tail.len().next_power_of_two().max(MIN_ANSWER));
            buf.extend_from_slice(tail);
            self.bytes = self.bytes.saturating_sub(had) + buf.capacity();
            Some(buf)
        } else {
            None
        };
        let s = self.slots.buf.get_mut(at)?;
        match (buf, &mut s.answer) {
            (Some(buf), answer) => *answer = Answer::Heap(buf),
            // A running slot's answer is the empty inline one: written in place.
            (None, Answer::Inline { len, bytes }) => {
                if let Some(to) = bytes.get_mut(..tail.len()) {
                    to.copy_from_slice(tail);
                    *len = tail.len() as u8;
                }
            }
            // (Never a buffer: not kept, so as not to count it twice.)
            (None, answer) => {
                let mut bytes = [0; INLINE];
                if let Some(to) = bytes.get_mut(..tail.len()) {
                    to.copy_from_slice(tail);
                }
                let len = tail.len() as u8;
                *answer = Answer::Inline { len, bytes };
            }
        }
        Some(s)
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
    // Time since boot: never negative, and 2^64 ns is 584 years, so plain arithmetic.
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The bits of a key or fingerprint the memory store uses: the 64 its digests fill.
fn key_bits(d: &Digest) -> u64 {
    *d as u64
}

/// The digest whose [`key_bits`] are `k` (the rest zero): how the memory store's
/// hashes become digests.
#[inline(always)]
fn digest_of(k: u64) -> Digest {
    Digest::from(k)
}

/// The store's seeded hash: a word at a time through one folded multiply by a secret odd
/// multiplier, from a secret start, as foldhash's own hasher does, without its 128-bit
/// sponge and per-write bookkeeping (every input here is whole words, or bytes behind
/// their length). A caller that cannot see the seeds cannot aim keys at another's.
#[derive(Clone, Copy)]
struct Seeds {
    /// The start.
    start: u64,
    /// The multiplier of each word (odd).
    mul: u64,
    /// The multiplier of the final round (odd).
    last: u64,
}

impl Seeds {
    /// This process's seeds, drawn once: every store hashes alike, so that an identity's
    /// part of its id keys is hashed once, when it authenticates ([`identity_state`]),
    /// not per call. Still secret (random per process).
    fn process() -> Self {
        static SEEDS: OnceLock<Seeds> = OnceLock::new();
        *SEEDS.get_or_init(|| {
            // foldhash's per-process random seed, hashed: three secret words.
            let r = RandomState::default();
            Self {
                start: r.hash_one(1u64),
                mul: r.hash_one(2u64) | 1,
                last: r.hash_one(3u64) | 1,
            }
        })
    }

    #[inline(always)]
    fn hasher(&self) -> Mix {
        Mix {
            acc: self.start,
            mul: self.mul,
            last: self.last,
        }
    }
}

/// A running [`Seeds`] hash.
struct Mix {
    acc: u64,
    mul: u64,
    last: u64,
}

impl Mix {
    #[inline(always)]
    fn word(&mut self, w: u64) {
        self.acc = fold(self.acc ^ w, self.mul);
    }

    /// `bytes`, 8 at a time, the last 1-7 as one word: the caller writes the length
    /// first, and for a given length the word says which bytes they were (for 4-7
    /// bytes, the first four and the last four, which overlap; for 1-3, the first, the
    /// middle and the last). No copy of a variable length (a call of `memcpy`).
    #[inline(always)]
    fn bytes(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            if let Ok(w) = <[u8; 8]>::try_from(w) {
                self.word(u64::from_le_bytes(w));
            }
        }
        let rest = words.remainder();
        let n = rest.len();
        let four = |at: usize| {
            rest.get(at..at + 4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map_or(0, |b| u64::from(u32::from_le_bytes(b)))
        };
        let byte = |at: usize| rest.get(at).map_or(0, |&b| u64::from(b));
        if n >= 4 {
            self.word(four(0) | four(n - 4) << 32);
        } else if n > 0 {
            self.word(byte(0) | byte(n / 2) << 8 | byte(n - 1) << 16);
        }
    }

    /// A length-prefixed string with a kind tag in the prefix's low byte (lengths are far
    /// below 2^56).
    #[inline(always)]
    fn tagged_bytes(&mut self, tag: u8, bytes: &[u8]) {
        self.word((bytes.len() as u64) << 8 | u64::from(tag));
        self.bytes(bytes);
    }

    /// The digest: the memory store fills its first 64 bits.
    #[inline(always)]
    fn digest(&self) -> Digest {
        digest_of(fold(self.acc, self.last))
    }
}

/// The hash state after an id key's identity part ([`ID_KEY`] and the identity's
/// length, then its bytes): [`Store::id_digest`] of the memory store goes on from here,
/// so that an identity is hashed once ([`Identity::new`]), not per call. [`ID_KEY`]
/// first: these keys and [`Store::digest`]'s never meet.
pub(crate) fn identity_state(name: &str) -> u64 {
    tagged_state(ID_KEY, name)
}

/// The hash state after a fingerprint's method part ([`FINGERPRINT`] and the name's
/// length, then its bytes): [`Store::fingerprint`] of the memory store goes on from
/// here, so that a registered method's name is hashed once, when the registry is frozen,
/// not per call.
pub(crate) fn method_state(name: &str) -> u64 {
    tagged_state(FINGERPRINT, name)
}

/// The hash state after `tag` with `name`'s length, then `name`'s bytes, under the
/// process's seeds.
fn tagged_state(tag: u64, name: &str) -> u64 {
    let mut h = Seeds::process().hasher();
    h.word(tag | name.len() as u64);
    h.bytes(name.as_bytes());
    h.acc
}

/// The first words of the three kinds of digests, told apart: a [`Store::digest`] starts
/// with its first part's length (far below 2^48), an id key and a fingerprint with
/// these marks in the top 16 bits (and their first part's length below).
const ID_KEY: u64 = 0xffff << 48;
const FINGERPRINT: u64 = 0xfffe << 48;

/// Tags of typed numbers (ids and params): a non-negative integer is one number
/// whether read as signed or unsigned; a negative one has its own tag, so -1 and
/// `u64::MAX` differ.
const NON_NEGATIVE: u64 = 7;
const NEGATIVE: u64 = 9;
const FLOAT: u64 = 8;

impl Mix {
    #[inline(always)]
    fn int(&mut self, i: i64) {
        self.word(if i < 0 { NEGATIVE } else { NON_NEGATIVE });
        self.word(i as u64);
    }
}

/// Consecutive non-negative integer ids keyed as a group: one hash for the group, the id's
/// low bits in the key's low bits (see [`grouped`]).
const GROUP_BITS: u32 = 2;

/// Whether non-negative integer ids `a` and `b` are keyed in one group (see [`grouped`]).
#[inline(always)]
pub(crate) fn same_group(a: u64, b: u64) -> bool {
    a >> GROUP_BITS == b >> GROUP_BITS
}

/// The key of a non-negative integer id `u` from `h`, the identity's hash state: the
/// group's hash (`u` without its low [`GROUP_BITS`] bits) with those bits in place of
/// its own low ones. Clients number their calls in order (a counter, as the ringrpc
/// client, jsonrpsee and most others do), so the calls of a group come close together
/// and their keys share a shard and a stretch of its index: adjacent places, one line
/// (or two) fetched for four claims instead of one line each, at random, for every
/// claim. With groups of four, a store of 16 MiB in a loop costs ~140-146 → ~102-110 ns
/// a call, though probes run longer (four homes together cluster: a full store's live
/// entries ~2.2 places from their homes against ~0.5 with keys at random; groups of
/// eight, 4.5, gained no more: docs/PERFORMANCE.md, stop 33). Keys keep 62
/// bits of hash: an innocent key's collision (a -32043) is still ~2^-62 per entry, and
/// a wrong replay also needs the fingerprint's 64 to collide. A caller choosing its ids
/// can place at most four keys together, as a counter does anyway: the groups' places
/// are still secret, random.
#[inline(always)]
fn grouped(mut h: Mix, u: u64) -> Digest {
    const LANES: u64 = (1 << GROUP_BITS) - 1;
    h.word(NON_NEGATIVE);
    h.word(u >> GROUP_BITS);
    digest_of((fold(h.acc, h.last) & !LANES) | (u & LANES))
}

impl Store for MemoryStore {
    fn digest(&self, parts: &[&[u8]]) -> Digest {
        // 64 bits under a random seed: keys and fingerprints are compared together, so
        // a wrong replay needs both to collide (2^-128 for a caller who cannot see the
        // seed), and a key alone colliding (a -32043 for an innocent call) is about
        // 2^-64 per stored entry. One hash run each, not two.
        // Each part is written as its length, then its bytes: no copy into a buffer.
        let mut h = self.seeds.hasher();
        for p in parts {
            h.tagged_bytes(0, p);
        }
        h.digest()
    }

    fn id_digest(&self, who: &Identity<'_>, id: Id<'_>) -> Digest {
        // The identity's part hashed when it authenticated ([`identity_state`]), then
        // the id typed, as numbers, not as text (no formatting): 1, "1" and 1.0 differ;
        // 1 read as signed or unsigned does not.
        let mut h = self.seeds.hasher();
        h.acc = who.state;
        match id {
            Id::Null => h.word(0),
            Id::Str(s) => h.tagged_bytes(1, s.as_bytes()),
            Id::Int(i) if i >= 0 => return grouped(h, i as u64),
            Id::Int(i) => h.int(i),
            Id::UInt(u) => return grouped(h, u),
            Id::Float(f) => {
                h.word(FLOAT);
                h.word(f.to_bits());
            }
        }
        h.digest()
    }

    // Inlined into the engine's one caller, whatever else (tests) calls it: out of line
    // it costs ~38 more per call (callgrind).
    #[inline(always)]
    fn fingerprint(&self, method: &str, named: Option<u64>, params: &Params<'_>) -> Digest {
        // The params as parsed (the tape's values, typed and length-prefixed), not their
        // raw bytes: finding those is a walk of the whole request's tape, several times
        // this hash's cost. Params that differ only in whitespace, escapes or the
        // spelling of a number (`1e2` / `100.0`) are the same to the handler and here;
        // any other difference (a value, a type, a key, the order) is a mismatch.
        // Each value's encoding says how many words follow it, so a sequence of values
        // is read back one way only.
        // The method's part hashed when it was registered ([`method_state`]), if it
        // was (not a fallback's: it serves many names).
        let mut h = self.seeds.hasher();
        h.acc = named.unwrap_or_else(|| method_state(method));
        let Some(nodes) = params.nodes() else {
            h.word(0);
            return h.digest();
        };
        for node in nodes {
            match *node {
                Node::String(s) => h.tagged_bytes(1, s.as_bytes()),
                Node::Array { len, .. } => h.word((len as u64) << 8 | 2),
                Node::Object { len, .. } => h.word((len as u64) << 8 | 3),
                Node::Static(StaticNode::Null) => h.word(4),
                Node::Static(StaticNode::Bool(b)) => h.word(5 + u64::from(b)),
                // 1 read as signed or unsigned is one number, as for ids.
                Node::Static(StaticNode::I64(i)) => h.int(i),
                Node::Static(StaticNode::U64(u)) => {
                    h.word(NON_NEGATIVE);
                    h.word(u);
                }
                Node::Static(StaticNode::F64(f)) => {
                    h.word(FLOAT);
                    h.word(f.to_bits());
                }
            }
        }
        h.digest()
    }

    fn claim(&self, key: &Digest, fp: &Digest, id: Id<'_>, out: &mut Vec<u8>) -> Claim {
        let now = self.now();
        let (k, fp) = (key_bits(key), key_bits(fp));
        let mut guard = self.shard(k);
        let shard = &mut *guard;
        shard.trim(now, self.ttl_ns, self.max_bytes);
        if shard.reserve(|n| self.shares.take(Self::shard_of(k), n)) {
            if let Some(h) = self.hints.get(Self::shard_of(k)) {
                h.table
                    .store(shard.index.table.as_mut_ptr(), Ordering::Relaxed);
                h.mask.store(shard.index.mask(), Ordering::Relaxed);
            }
        }
        let seq = shard.next_seq();
        let mut clean = None;
        match shard.probe(k) {
            Ok((at, old)) => {
                if let Some(slot) = shard.get_mut(old) {
                    if slot.state == State::Running || slot.expires > now {
                        return match (slot.state, slot.fp == fp) {
                            (_, false) => Claim::Mismatch,
                            (State::Done(code), true) => {
                                write_replay(out, id, slot.answer.as_slice());
                                Claim::Replayed(code)
                            }
                            (_, true) => Claim::InProgress,
                        };
                    }
                    // Expired but not trimmed yet (it is not at the front): its slot is
                    // given up, the key claimed anew at the back (the same index entry,
                    // the new number).
                    slot.state = State::Gone;
                    let answer = std::mem::replace(&mut slot.answer, Answer::EMPTY);
                    shard.recycle(answer);
                }
                shard.index.table[at] = entry(tag(k), seq);
            }
            Err((at, end)) => {
                if shard.index.take(at, entry(tag(k), seq)) {
                    clean = Some((at, end));
                }
            }
        }
        shard.slots.push_back(
            Slot {
                key: k,
                fp,
                expires: now.saturating_add(self.ttl_ns),
                state: State::Running,
                answer: Answer::EMPTY,
            },
            self.slots,
        );
        if let Some((at, end)) = clean {
            shard.clean_run(at, end);
        }
        shard.bytes += ENTRY_OVERHEAD;
        if let Some(s) = shard.slots.buf.get(shard.slots.place(shard.slots.len())) {
            prefetch(s);
        }
        Claim::Run(seq)
    }

    fn finish(&self, key: &Digest, fp: &Digest, slot: u64, tail: &[u8], code: Option<i32>) {
        let k = key_bits(key);
        let mut guard = self.shard(k);
        let shard = &mut *guard;
        let Some((_, at)) = shard.running(slot, k, key_bits(fp)) else {
            return;
        };
        let Some(s) = shard.store_answer(at, tail) else {
            return;
        };
        s.state = State::Done(code);
        // Only the byte bound can be newly passed here (expiry is the claims' business),
        // so the clock is not read: the claim's time (its expiry less the TTL) serves,
        // older by the call's duration, which only makes this trim drop less.
        let claimed = s.expires.saturating_sub(self.ttl_ns);
        if shard.bytes > self.max_bytes && !shard.evict_one(self.max_bytes) {
            shard.drop_front(claimed, self.ttl_ns, self.max_bytes);
        }
    }

    fn release(&self, key: &Digest, fp: &Digest, slot: u64) {
        let k = key_bits(key);
        let mut guard = self.shard(k);
        let shard = &mut *guard;
        let Some((seq, _)) = shard.running(slot, k, key_bits(fp)) else {
            return;
        };
        shard.index.remove(k, seq);
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

    /// The index's places not empty (what its `len` must count).
    fn places(index: &Index) -> usize {
        index.table.iter().filter(|&&e| e != 0).count()
    }

    /// Whether every entry, live or stale, is reached from its home without an empty
    /// place between (what linear probing needs of deletions).
    fn reachable(index: &Index) -> bool {
        let mask = index.mask();
        (0..index.table.len()).all(|at| {
            let e = index.table[at];
            let home = index.home(entry_tag(e));
            e == 0 || (0..at.wrapping_sub(home) & mask).all(|d| index.table[(home + d) & mask] != 0)
        })
    }

    /// The next number of a xorshift sequence from `r` (the tests' deterministic
    /// randomness).
    fn xorshift(r: &mut u64) -> u64 {
        *r ^= *r << 13;
        *r ^= *r >> 7;
        *r ^= *r << 17;
        *r
    }

    /// The slot of a claim that runs.
    fn run(claim: Claim) -> u64 {
        match claim {
            Claim::Run(slot) => slot,
            other => panic!("{other:?}"),
        }
    }

    /// What [`MemoryStore::prefetch`] reads without the lock follows every move of a
    /// shard's index (else the prefetch fetches a freed table's line: no harm, no gain).
    #[test]
    fn hints_follow_the_indexes() {
        let s = store(1 << 20, 60_000);
        let mut out = Vec::new();
        for i in 0..20_000u32 {
            let (k, fp) = (s.digest(&[&i.to_le_bytes()]), s.digest(&[b"f"]));
            let slot = run(s.claim(&k, &fp, Id::Int(1), &mut out));
            s.finish(&k, &fp, slot, br#""result":1}"#, None);
            s.prefetch(&k);
        }
        for (shard, hint) in s.shards.iter().zip(s.hints.iter()) {
            let mut shard = shard.lock();
            assert!(shard.index.table.len() > 16);
            assert_eq!(
                hint.table.load(Ordering::Relaxed),
                shard.index.table.as_mut_ptr()
            );
            assert_eq!(hint.mask.load(Ordering::Relaxed), shard.index.mask());
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
    fn answers_of_every_short_length_replay_whole() {
        // Every length an answer is kept in its slot at, and a few kept in a buffer,
        // each replayed byte for byte.
        let s = store(1 << 20, 60_000);
        let fp = s.digest(&[b"f"]);
        for n in 0..=INLINE + 10 {
            let tail: Vec<u8> = (0..n).map(|i| b'a' + (i * 7 % 26) as u8).collect();
            let k = s.digest(&[b"k", &n.to_le_bytes()]);
            let mut out = Vec::new();
            let slot = run(s.claim(&k, &fp, Id::Int(1), &mut out));
            s.finish(&k, &fp, slot, &tail, None);
            assert_eq!(
                s.claim(&k, &fp, Id::Int(2), &mut out),
                Claim::Replayed(None)
            );
            let mut want = br#"{"jsonrpc":"2.0","id":2,"#.to_vec();
            want.extend_from_slice(&tail);
            assert_eq!(out, want, "length {n}");
        }
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

    /// Answer buffers count their capacity, spare ones too: after long answers, then
    /// longer ones than a shard holds, then short ones, what a shard counts is what it
    /// holds, and it stays within the bound (a spare buffer is let go before any
    /// answer is).
    #[test]
    fn answer_buffers_count_what_they_hold() {
        let s = store(1 << 20, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        let mut i = 0u32;
        for len in [40, 3_000, 100_000, 500, 31, 10] {
            let answer = vec![b'x'; len];
            for _ in 0..2_000 {
                let k = s.digest(&[&i.to_le_bytes()]);
                i += 1;
                let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
                s.finish(&k, &fp, slot, &answer, None);
            }
            for shard in s.shards.iter() {
                let shard = shard.lock();
                let answers: usize = shard
                    .slots
                    .iter()
                    .map(|slot| match &slot.answer {
                        Answer::Heap(buf) => buf.capacity(),
                        Answer::Inline { .. } => 0,
                    })
                    .sum();
                let spare: usize = shard.spare.iter().map(Vec::capacity).sum();
                let held = shard.slots.len() * ENTRY_OVERHEAD + answers + spare;
                assert_eq!(shard.bytes, held, "answers of {len}");
                assert!(shard.bytes <= s.max_bytes, "answers of {len}: {held}");
            }
        }
        // The last ones are replayed whole.
        out.clear();
        let k = s.digest(&[&(i - 1).to_le_bytes()]);
        assert_eq!(
            s.claim(&k, &fp, Id::Int(1), &mut out),
            Claim::Replayed(None)
        );
        assert!(out.ends_with(&[b'x'; 10]));
    }

    /// Running calls are never evicted: more of them than a shard's ring is sized for
    /// grow it past its size (the places no longer meet, nothing else changes), and
    /// all are answered and replayed; then the bound holds again.
    #[test]
    fn running_calls_outgrow_the_rings_size() {
        let max = ENTRY_OVERHEAD * 4 * SHARDS;
        let s = store(max, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        let keys: Vec<Digest> = (0..400u32).map(|i| s.digest(&[&i.to_le_bytes()])).collect();
        let slots: Vec<u64> = keys
            .iter()
            .map(|k| run(s.claim(k, &fp, Id::Null, &mut out)))
            .collect();
        assert!(s
            .shards
            .iter()
            .any(|sh| sh.lock().slots.buf.len() > s.slots));
        for (i, (k, slot)) in keys.iter().zip(&slots).enumerate() {
            assert_eq!(
                s.claim(k, &fp, Id::Null, &mut out),
                Claim::InProgress,
                "{i}"
            );
            s.finish(k, &fp, *slot, format!("{i}}}").as_bytes(), None);
        }
        // Each finish dropped what the bound no longer held: the last ones are kept.
        for (i, k) in keys.iter().enumerate().skip(396) {
            out.clear();
            assert_eq!(s.claim(k, &fp, Id::Int(1), &mut out), Claim::Replayed(None));
            assert!(out.ends_with(format!(",{i}}}").as_bytes()), "{i}");
        }
        assert!(s.bytes() <= max, "{} bytes held", s.bytes());
        for i in 400..2_000u32 {
            let k = s.digest(&[&i.to_le_bytes()]);
            let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
            s.finish(&k, &fp, slot, b"1}", None);
            assert!(s.bytes() <= max, "{} bytes held", s.bytes());
        }
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

    /// Answers kept in their slots cost no bytes of their own: a full shard holds its
    /// share of the bound in entries, its ring's buffer stops one slot past them (so that
    /// a claim's new slot takes the place of the one evicted just before it), and the
    /// memory the store holds (rings and indexes) stays within the bound.
    #[test]
    fn short_answers_fill_a_ring_sized_to_the_bound() {
        let answer = br#""result":1234567890}"#;
        // The second: a power of two of entries a shard, where a rebuild doubles the
        // index to 32 bytes an entry.
        for max in [1 << 20, (96 * 1024 + 32) * SHARDS] {
            let s = store(max, 600_000);
            let fp = s.digest(&[b"f"]);
            let mut out = Vec::new();
            for i in 0..(max / ENTRY_OVERHEAD * 2) as u32 {
                let k = s.digest(&[&i.to_le_bytes()]);
                let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
                s.finish(&k, &fp, slot, answer, None);
            }
            for shard in s.shards.iter() {
                let mut shard = shard.lock();
                assert_eq!(shard.live(), s.max_bytes / ENTRY_OVERHEAD);
                assert_eq!(shard.live() + 1, s.slots);
                assert_eq!(shard.bytes, shard.live() * ENTRY_OVERHEAD);
                assert_eq!(shard.slots.buf.len(), s.slots);
                // The largest index this many entries have (as after a rebuild).
                shard.rebuild(|_| None);
                let memory = shard.slots.buf.len() * std::mem::size_of::<Slot>()
                    + shard.index.table.len() * std::mem::size_of::<u64>();
                assert!(memory <= max / SHARDS, "{memory} bytes of tables");
            }
        }
        let s = store(1 << 20, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        for i in 0..100_000u32 {
            let k = s.digest(&[&i.to_le_bytes()]);
            let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
            s.finish(&k, &fp, slot, answer, None);
        }
        // A claim fills the ring's buffer without growing it: its slot is where the
        // last eviction was, the place before the front.
        for i in 100_000..100_100u32 {
            let k = s.digest(&[&i.to_le_bytes()]);
            let shard = MemoryStore::shard_of(key_bits(&k));
            let (size, evicted) = {
                let shard = s.shards[shard].lock();
                let size = shard.slots.buf.len();
                assert_eq!(shard.slots.len(), size - 1);
                (size, (shard.slots.front + size - 1) % size)
            };
            let seq = run(s.claim(&k, &fp, Id::Null, &mut out));
            {
                let shard = s.shards[shard].lock();
                assert_eq!(shard.slots.buf.len(), size);
                let at = shard.slots.place((seq - shard.head) as usize);
                assert_eq!(at, evicted);
                assert_eq!(shard.slots.buf[at].key, key_bits(&k));
            }
            s.finish(&k, &fp, seq, answer, None);
            out.clear();
            assert_eq!(s.claim(&k, &fp, Id::Null, &mut out), Claim::Replayed(None));
        }
    }

    /// Evictions leave their index entries stale: under churn every held entry is still
    /// found at its slot, evicted keys are not, the index counts its places right and
    /// stays bounded (stale places taken by insertions, deleted by claims, or dropped by
    /// rebuilds, which claims' deletions make rare).
    #[test]
    fn evicted_entries_go_stale_and_the_index_stays_bounded() {
        let max = 64 * 1024;
        let s = store(max, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        let keys: Vec<Digest> = (0..100_000u32)
            .map(|i| s.digest(&[&i.to_le_bytes()]))
            .collect();
        for (i, k) in keys.iter().enumerate() {
            if i == 20_000 {
                // Full: from here on rebuilds are for stale entries.
                for shard in s.shards.iter() {
                    shard.lock().rebuilds = 0;
                }
            }
            let slot = run(s.claim(k, &fp, Id::Null, &mut out));
            s.finish(k, &fp, slot, b"1}", None);
            if let Some(before) = i.checked_sub(1).map(|j| &keys[j]) {
                out.clear();
                assert_eq!(
                    s.claim(before, &fp, Id::Null, &mut out),
                    Claim::Replayed(None),
                    "{i}"
                );
            }
        }
        let (mut held, mut rebuilds) = (0, 0);
        for shard in s.shards.iter() {
            let shard = shard.lock();
            rebuilds += shard.rebuilds;
            assert_eq!(shard.index.len, places(&shard.index));
            for (i, slot) in shard.slots.iter().enumerate() {
                assert_ne!(slot.state, State::Gone);
                assert_eq!(
                    shard.find(slot.key).map(|f| f.1),
                    Some(shard.head + i as u64)
                );
            }
            held += shard.live();
            let table = shard.index.table.len();
            assert!(shard.index.len * 4 <= table * 3);
            assert!(
                table <= 4 * shard.live().next_power_of_two().max(16),
                "{table}"
            );
        }
        assert!(held > 300, "{held}");
        // Claims delete stale entries (`Shard::clean_run`): 100-150 rebuilds in all
        // shards once full, where ~930 came without.
        assert!(rebuilds <= 300, "{rebuilds} rebuilds");
        // Evicted keys are not found: they run anew.
        for k in &keys[..1_000] {
            run(s.claim(k, &fp, Id::Null, &mut out));
        }
    }

    /// The index against a model, with keys made to collide: many with one home, runs
    /// that wrap around the table's end, keys whose tags are equal (told apart by the
    /// slot), deletions anywhere in a run.
    #[test]
    fn index_finds_every_key_through_collisions_and_deletions() {
        let mut shard = Shard::default();
        let mut alive: Vec<Option<u64>> = vec![None; 48];
        let key = |i: usize| {
            let i = i as u64;
            // Low bits 61..=63, 0, 1 (homes about the end of any table), and keys i and
            // i + 24 with equal low 32 bits.
            ((i % 24) << 8) | ((61 + i % 5) % 64) | ((i / 24 + 1) << 40)
        };
        let mut r = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000 {
            let i = (xorshift(&mut r) % alive.len() as u64) as usize;
            let k = key(i);
            match alive[i].take() {
                Some(seq) => {
                    assert!(shard.index.remove(k, seq), "step {step}");
                    if let Some(s) = shard.get_mut(seq) {
                        s.state = State::Gone;
                    }
                }
                None => {
                    shard.reserve(|_| None);
                    let seq = shard.next_seq();
                    assert_eq!(shard.find(k), None, "step {step}");
                    shard.index.put(entry(tag(k), seq));
                    shard.slots.push_back(
                        Slot {
                            key: k,
                            fp: 0,
                            expires: u64::MAX,
                            state: State::Running,
                            answer: Answer::EMPTY,
                        },
                        0,
                    );
                    alive[i] = Some(seq);
                }
            }
            // Gone slots popped from the front, as claims do.
            shard.trim(0, 0, usize::MAX);
            // Rebuilt now and then (in place, the runs wrapping round the end).
            if step % 7 == 0 {
                shard.rebuild(|_| None);
            }
            for (j, want) in alive.iter().enumerate() {
                assert_eq!(
                    shard.find(key(j)).map(|f| f.1),
                    *want,
                    "step {step}, key {j}"
                );
            }
            assert_eq!(shard.index.len, alive.iter().flatten().count());
        }
        assert!(
            shard.index.table.len() <= 128,
            "{}",
            shard.index.table.len()
        );
    }

    /// Claims delete the stale entries of the runs they probe: the index against a
    /// model under evictions, with keys made to collide (as above), and far fewer
    /// rebuilds than without (none here, against 41 and 69).
    #[test]
    fn claims_delete_stale_entries_from_colliding_runs() {
        // A third of the keys with homes about the table's end, as above; the others
        // spread, so that stale entries are also left off the runs claims probe.
        let key = |i: u64| {
            let home = match i % 3 {
                0 => (61 + i / 3 % 5) % 64,
                _ => i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40,
            };
            home & 0xff_ffff | ((i + 1) << 32)
        };
        for cap in [24, 40] {
            let mut rebuilds = [0; 2];
            for clean in [false, true] {
                let mut shard = Shard::default();
                // The keys held, oldest first, with their slots' numbers.
                let mut held = std::collections::VecDeque::new();
                for i in 0..20_000u64 {
                    if i == 1_000 {
                        // Full, grown: from here on rebuilds are for stale entries.
                        shard.rebuilds = 0;
                    }
                    let k = key(i);
                    shard.reserve(|_| None);
                    let seq = shard.next_seq();
                    let (at, end) = shard.probe(k).expect_err("a new key");
                    let stale = shard.index.take(at, entry(tag(k), seq));
                    shard.slots.push_back(
                        Slot {
                            key: k,
                            fp: 0,
                            expires: u64::MAX,
                            state: State::Done(None),
                            answer: Answer::EMPTY,
                        },
                        0,
                    );
                    if stale && clean {
                        shard.clean_run(at, end);
                    }
                    held.push_back((k, seq));
                    // Full at `cap`: the oldest evicted, its entry left stale, as
                    // `evict_one` does.
                    if held.len() > cap {
                        held.pop_front();
                        shard.slots.skip_front();
                        shard.head += 1;
                    }
                    let ctx = format!("cap {cap}, clean {clean}, step {i}");
                    for &(k, seq) in &held {
                        assert_eq!(shard.find(k).map(|f| f.1), Some(seq), "{ctx}");
                    }
                    let evicted = key(i.saturating_sub(cap as u64));
                    if i >= cap as u64 && !held.iter().any(|h| h.0 == evicted) {
                        assert_eq!(shard.find(evicted), None, "{ctx}");
                    }
                    assert_eq!(shard.index.len, places(&shard.index), "{ctx}");
                    assert!(reachable(&shard.index), "{ctx}");
                }
                rebuilds[usize::from(clean)] = shard.rebuilds;
            }
            let [without, with] = rebuilds;
            assert!(
                with * 4 <= without,
                "cap {cap}: {with} rebuilds, {without} without"
            );
        }
    }

    /// `Shard::clean_run` on small tables of clustered keys, most of them stale, with
    /// runs that wrap past the table's end and hold more stale entries than
    /// [`CLEAN_HOLES`]: every entry stays reachable, every live key is found, and the
    /// stale entries of the run are deleted, up to the cap. (Written by a review.)
    #[test]
    fn cleaning_a_run_keeps_the_index_whole() {
        let mut r = 0x1234_5678_9abc_def1u64;
        let mut longest = 0;
        for trial in 0..20_000u64 {
            let size = [16usize, 64, 256][trial as usize % 3];
            let mut shard = Shard::default();
            shard.index.table = Table::zeroed(size);
            shard.head = 1 << 20;
            let n = xorshift(&mut r) as usize % (size * 3 / 4) + 1;
            // Homes in a window from `base`, which may wrap past the end.
            let window = (xorshift(&mut r) as usize % size).max(1);
            let base = xorshift(&mut r) as usize % size;
            let home = |r: &mut u64| ((base + xorshift(r) as usize % window) % size) as u64;
            let running = |key| Slot {
                key,
                fp: 0,
                expires: u64::MAX,
                state: State::Running,
                answer: Answer::EMPTY,
            };
            let (mut live, mut stale_seq) = (Vec::new(), shard.head - 1);
            for i in 0..n as u64 {
                let key = home(&mut r) | (i + 1) << 32 | trial << 48;
                if xorshift(&mut r).is_multiple_of(4) {
                    let seq = shard.next_seq();
                    shard.slots.push_back(running(key), 0);
                    shard.index.put(entry(tag(key), seq));
                    live.push((key, seq));
                } else {
                    shard.index.put(entry(tag(key), stale_seq));
                    stale_seq -= 1;
                }
            }
            let key = home(&mut r) | 0xffff << 32;
            let (at, end) = shard.probe(key).expect_err("a new key");
            let mask = shard.index.mask();
            let stale = |sh: &Shard, e: u64| e != 0 && sh.stale(e);
            let all_stale = |sh: &Shard| sh.index.table.iter().filter(|&&e| stale(sh, e)).count();
            let in_run = (1..end.wrapping_sub(at) & mask)
                .filter(|d| stale(&shard, shard.index.table[(at + d) & mask]))
                .count();
            let before = all_stale(&shard);
            let seq = shard.next_seq();
            let took_stale = shard.index.take(at, entry(tag(key), seq));
            shard.slots.push_back(running(key), 0);
            live.push((key, seq));
            if took_stale {
                longest = longest.max(in_run);
                shard.clean_run(at, end);
                let after = all_stale(&shard);
                assert_eq!(after, before - 1 - in_run.min(CLEAN_HOLES), "trial {trial}");
            }
            assert!(reachable(&shard.index), "trial {trial}");
            assert_eq!(shard.index.len, places(&shard.index), "trial {trial}");
            for &(k, s) in &live {
                assert_eq!(shard.find(k).map(|f| f.1), Some(s), "trial {trial}");
            }
        }
        assert!(longest > CLEAN_HOLES, "the cap was reached: {longest}");
    }

    #[test]
    fn long_and_short_answers_replay_whole() {
        let s = store(1 << 20, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        for len in [0, 1, INLINE - 1, INLINE, INLINE + 1, 300] {
            let k = s.digest(&[&len.to_le_bytes()]);
            let tail: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
            s.finish(&k, &fp, slot, &tail, Some(7));
            out.clear();
            assert_eq!(
                s.claim(&k, &fp, Id::Int(1), &mut out),
                Claim::Replayed(Some(7))
            );
            assert!(
                out.ends_with(&tail) && out.len() == r#"{"jsonrpc":"2.0","id":1,"#.len() + len,
                "{len}"
            );
        }
    }

    #[test]
    fn keys_spread_over_every_shard() {
        let s = store(1 << 20, 600_000);
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        // (Distinct groups: a group's keys share a shard, see `grouped`.)
        for i in 0..1_600u32 {
            let k = s.id_digest(&Identity::new("app"), Id::UInt(u64::from(i) << GROUP_BITS));
            run(s.claim(&k, &fp, Id::Null, &mut out));
        }
        let spread = s.spread();
        assert!(spread.iter().all(|&n| n > 50), "{spread:?}");
    }

    /// CPU time this thread has used.
    fn thread_cpu() -> Duration {
        // SAFETY: `usage` is a valid, writable rusage for the call's duration.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_THREAD is Linux's, for the calling thread.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(rc, 0);
        let t = |tv: libc::timeval| {
            Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64)
        };
        t(usage.ru_utime) + t(usage.ru_stime)
    }

    /// A waiter behind a long hold (an index rebuild's kind, made long: 300 ms) sleeps
    /// rather than spinning or yielding all along: it uses a small part of the hold's
    /// time (8-9 ms here, the sleeps' wake-ups; the yielding loop it replaced used all
    /// of it when a CPU was free).
    #[test]
    fn a_long_hold_is_waited_for_asleep() {
        let store = store(1 << 20, 60_000);
        let held = store.shards[0].lock();
        let used = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let before = thread_cpu();
                drop(store.shards[0].lock());
                thread_cpu() - before
            });
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
            waiter.join().unwrap()
        });
        assert!(
            used < Duration::from_millis(75),
            "waiting used {used:?} of CPU"
        );
    }

    /// Threads claiming and finishing in one shard at once (four on however many CPUs,
    /// so that holders are preempted and waiters yield): each call's retry replays its
    /// own answer, never another's, nothing is refused, and the shard stays whole.
    #[test]
    fn threads_contending_for_one_shard() {
        const THREADS: u64 = 4;
        const CALLS: u64 = 20_000;
        // 1 MiB a shard: ~10,000 entries, evicted throughout the run.
        let s = store(16 << 20, 600_000);
        let replayed = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (s, replayed) = (&s, &replayed);
                scope.spawn(move || {
                    let mut out = Vec::new();
                    let mut r = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    for i in 0..CALLS {
                        // The top bits clear: shard 0 (see `MemoryStore::shard_of`).
                        let k = digest_of(xorshift(&mut r) >> 4);
                        let fp = digest_of(t << 32 | i);
                        let slot = run(s.claim(&k, &fp, Id::UInt(i), &mut out));
                        let answer = format!(r#""result":[{t},{i}]}}"#);
                        s.finish(&k, &fp, slot, answer.as_bytes(), None);
                        out.clear();
                        match s.claim(&k, &fp, Id::UInt(i), &mut out) {
                            Claim::Replayed(None) => {
                                assert!(out.ends_with(answer.as_bytes()), "{t} {i}");
                                replayed.fetch_add(1, Ordering::Relaxed);
                            }
                            // Evicted between the two by the others' calls.
                            Claim::Run(slot) => s.release(&k, &fp, slot),
                            other => panic!("{t} {i}: {other:?}"),
                        }
                    }
                });
            }
        });
        let replayed = replayed.load(Ordering::Relaxed);
        assert!(replayed > THREADS * CALLS * 9 / 10, "{replayed}");
        check_shard(&s.shards[0].lock(), &s.hints[0], "after");
        assert_eq!(s.spread()[1..].iter().sum::<usize>(), 0);
    }

    /// An identity's part of its keys is hashed once, when it authenticates, under the
    /// process's seeds: a state kept since then keys as the name hashed now does, in any
    /// store of the process (a retry on another connection, or another engine sharing
    /// nothing, finds the same key).
    #[test]
    fn an_identity_hashed_once_keys_as_its_name_does() {
        let (a, b) = (store(1 << 20, 600_000), store(1 << 20, 600_000));
        let kept = Identity {
            name: "app",
            state: identity_state("app"),
        };
        for id in [
            Id::Null,
            Id::Int(7),
            Id::UInt(7),
            Id::Str("7"),
            Id::Float(7.5),
        ] {
            assert_eq!(
                a.id_digest(&kept, id),
                b.id_digest(&Identity::new("app"), id)
            );
            assert_ne!(
                a.id_digest(&kept, id),
                a.id_digest(&Identity::new("app2"), id)
            );
        }
    }

    /// A registered method's name is hashed once, when the registry is frozen: a
    /// fingerprint from that state is the one from the name hashed per call (a
    /// fallback's), in any store of the process; another name's is not.
    #[test]
    fn a_method_hashed_once_fingerprints_as_its_name_does() {
        let (a, b) = (store(1 << 20, 600_000), store(1 << 20, 600_000));
        // `[1, "x"]` as the tape holds it (the memory store's fingerprint reads only that).
        let nodes = [
            Node::Array { len: 2, count: 2 },
            Node::Static(StaticNode::I64(1)),
            Node::String("x"),
        ];
        let raw = crate::codec::raw::RawCtx {
            frame: b"",
            structurals: &[],
            root: &nodes,
        };
        for params in [Params::new(Some(&nodes), raw), Params::new(None, raw)] {
            let kept = Some(method_state("incr"));
            assert_eq!(
                a.fingerprint("incr", kept, &params),
                b.fingerprint("incr", None, &params)
            );
            assert_ne!(
                a.fingerprint("incr", kept, &params),
                a.fingerprint("incr2", None, &params)
            );
        }
    }

    #[test]
    fn id_keys_are_typed() {
        let s = store(1 << 20, 600_000);
        let keys = [
            s.id_digest(&Identity::new("app"), Id::Null),
            s.id_digest(&Identity::new("app"), Id::Str("1")),
            s.id_digest(&Identity::new("app"), Id::UInt(1)),
            s.id_digest(&Identity::new("app"), Id::Float(1.0)),
            s.id_digest(&Identity::new("app"), Id::Int(-1)),
            s.id_digest(&Identity::new("ap"), Id::Str("p1")),
            s.id_digest(&Identity::new("app"), Id::Str("")),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // 1 read as signed or unsigned is the same id.
        assert_eq!(
            s.id_digest(&Identity::new("app"), Id::Int(1)),
            s.id_digest(&Identity::new("app"), Id::UInt(1))
        );
        // Never a key of another kind (an Idempotency-Key's parts).
        assert_ne!(s.id_digest(&Identity::new(""), Id::Null), s.digest(&[]));
        assert_ne!(s.digest(&[b"ab", b"c"]), s.digest(&[b"a", b"bc"]));
    }

    /// Everything a shard promises, checked whole: its count of index places, its hint,
    /// every entry reachable from its home (no empty place between), one entry per
    /// live slot, with the slot's tag, and every held key found at its slot.
    fn check_shard(sh: &Shard, hint: &Hint, ctx: &str) {
        let t = &sh.index.table;
        let n = t.len();
        let nonempty = places(&sh.index);
        assert_eq!(sh.index.len, nonempty, "{ctx}: len");
        if n == 0 {
            assert_eq!(sh.live(), 0, "{ctx}");
            return;
        }
        assert_eq!(
            hint.table.load(Ordering::Relaxed),
            t.as_ptr() as *mut u64,
            "{ctx}: hint"
        );
        assert_eq!(hint.mask.load(Ordering::Relaxed), n - 1, "{ctx}: hint mask");
        assert!(nonempty * 4 <= n * 3, "{ctx}: full");
        let mask = n - 1;
        for p in 0..n {
            let e = t[p];
            if e == 0 {
                continue;
            }
            let mut q = sh.index.home(entry_tag(e));
            while q != p {
                assert_ne!(t[q], 0, "{ctx}: entry at {p} unreachable from its home");
                q = (q + 1) & mask;
            }
        }
        let mut seen = vec![false; sh.slots.len()];
        for &e in t.iter() {
            if e == 0 || sh.stale(e) {
                continue;
            }
            let off = sh.offset(e);
            let slot = sh.slots.get(off).unwrap();
            assert_ne!(slot.state, State::Gone, "{ctx}: live entry at a gone slot");
            assert_eq!(tag(slot.key), entry_tag(e), "{ctx}: tag");
            assert!(!seen[off], "{ctx}: two entries for one slot");
            seen[off] = true;
        }
        let mut keys = std::collections::HashSet::new();
        for (i, slot) in sh.slots.iter().enumerate() {
            if slot.state != State::Gone {
                assert!(seen[i], "{ctx}: slot {i} without entry");
                assert!(keys.insert(slot.key), "{ctx}: key held twice");
                assert_eq!(
                    sh.find(slot.key).map(|f| f.1),
                    Some(sh.head + i as u64),
                    "{ctx}: find"
                );
            }
        }
    }

    /// What the model knows of a key.
    #[derive(Clone, Debug)]
    enum M {
        Absent,
        Running {
            fp: u64,
            slot: u64,
        },
        Done {
            fp: u64,
            answer: Vec<u8>,
            code: Option<i32>,
            at: u64,
        },
    }

    /// The store against a model, through its own calls (`claim`, `finish`, `release`)
    /// in one shard: keys whose homes collide about the end of 64- and 128-place
    /// tables, equal tags, wrong fingerprints, four byte bounds, up to 12 calls running
    /// at once (moved to the back by trims), the clock jumping past TTLs, numbers about
    /// 2^32 and a rebuild forced by the 2^31 rule. After every step the shard is
    /// checked whole ([`check_shard`]); every answer is what the model allows: a running
    /// key in progress or a mismatch, a released key run anew, a replay with the stored
    /// answer and code, never after its TTL. (Written by a review of `Shard::clean_run`.)
    #[test]
    fn store_against_a_model_with_colliding_keys() {
        let dig = digest_of;
        let mix = |x: u64| {
            let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let nk = 160usize;
        let key = |i: usize| -> u64 {
            let i = i as u64;
            let low = match i % 4 {
                0 => (61 + (i / 4) % 5) % 64,
                1 => (125 + (i / 4) % 6) % 128,
                _ => mix(i) & 0xffff_ffff,
            };
            // shard 0: top 4 bits clear
            low | (((i + 1) << 32) & 0x0fff_ffff_0000_0000)
        };
        let (seeds, steps): (u64, usize) = (12, 10_000);
        let ttl_ms = 10_000u64;
        let ttl = ttl_ms * 1_000_000;
        for seed in 0..seeds {
            let per_shard = [384usize, 96 * 12, 96 * 30, 96 * 60][(seed % 4) as usize];
            let mut s = store(per_shard * SHARDS, ttl_ms);
            let start = match seed % 3 {
                0 => 0u64,
                1 => (1u64 << 32) - 300,
                _ => (3u64 << 32) - 7,
            };
            {
                let mut sh = s.shards[0].lock();
                sh.head = start;
                sh.rebuilt_at = if seed % 6 == 5 {
                    start.wrapping_sub((1 << 31) - 40)
                } else {
                    start
                };
            }
            let mut r = 0x2545_f491_4f6c_dd1du64 ^ mix(seed);
            let mut rnd = move || xorshift(&mut r);
            let mut model = vec![M::Absent; nk];
            let mut out = Vec::new();
            let fp_of = |i: usize| mix(i as u64 + 1_000_000);
            for step in 0..steps {
                let ctx = format!("seed {seed}, step {step}");
                let op = rnd() % 100;
                let running: Vec<usize> = (0..nk)
                    .filter(|&i| matches!(model[i], M::Running { .. }))
                    .collect();
                if op < 3 {
                    let d = [
                        1_000_000u64,
                        100_000_000,
                        3_000_000_000,
                        8_000_000_000,
                        11_000_000_000,
                    ][(rnd() % 5) as usize];
                    s.epoch -= d;
                } else if op < 30 && !running.is_empty() {
                    let i = running[(rnd() % running.len() as u64) as usize];
                    let M::Running { fp, slot } = model[i].clone() else {
                        unreachable!()
                    };
                    let len = [2usize, 10, 29, 30, 31, 50][(rnd() % 6) as usize];
                    let answer: Vec<u8> = (0..len)
                        .map(|j| b'a' + ((j as u64 + step as u64) % 26) as u8)
                        .collect();
                    let code = if rnd() % 2 == 0 {
                        None
                    } else {
                        Some(step as i32)
                    };
                    s.finish(&dig(key(i)), &dig(fp), slot, &answer, code);
                    model[i] = M::Done {
                        fp,
                        answer,
                        code,
                        at: s.now(),
                    };
                } else if op < 36 && !running.is_empty() {
                    let i = running[(rnd() % running.len() as u64) as usize];
                    let M::Running { fp, slot } = model[i].clone() else {
                        unreachable!()
                    };
                    s.release(&dig(key(i)), &dig(fp), slot);
                    model[i] = M::Absent;
                } else {
                    if running.len() > 12 {
                        continue;
                    }
                    let i = (rnd() % nk as u64) as usize;
                    let fp = if rnd() % 20 == 0 {
                        fp_of(i) ^ 1
                    } else {
                        fp_of(i)
                    };
                    let before = s.now();
                    out.clear();
                    let c = s.claim(&dig(key(i)), &dig(fp), Id::Null, &mut out);
                    match (&model[i], c) {
                        (M::Absent, Claim::Run(slot)) => model[i] = M::Running { fp, slot },
                        (M::Running { fp: f0, .. }, Claim::InProgress) if *f0 == fp => {}
                        (M::Running { fp: f0, .. }, Claim::Mismatch) if *f0 != fp => {}
                        // Evicted or expired.
                        (M::Done { .. }, Claim::Run(slot)) => model[i] = M::Running { fp, slot },
                        (
                            M::Done {
                                fp: f0,
                                answer,
                                code,
                                at,
                            },
                            Claim::Replayed(c2),
                        ) if *f0 == fp => {
                            assert!(before <= at + ttl, "{ctx}: replayed after expiry");
                            assert_eq!(*code, c2, "{ctx}");
                            assert!(out.ends_with(answer), "{ctx}: answer");
                        }
                        (M::Done { fp: f0, at, .. }, Claim::Mismatch) if *f0 != fp => {
                            assert!(before <= at + ttl, "{ctx}: mismatch after expiry");
                        }
                        (m, c) => panic!("{ctx}: key {i} model {m:?} claim {c:?}"),
                    }
                }
                let sh = s.shards[0].lock();
                check_shard(&sh, &s.hints[0], &ctx);
            }
        }
    }

    /// Counted ids are keyed in groups of four (`grouped`): one group's keys differ, share
    /// a shard and have adjacent homes, whatever the index's size; the next group's are
    /// elsewhere; an id read as signed or unsigned keys alike; negative, string and
    /// float ids are not grouped.
    #[test]
    fn counted_ids_are_keyed_in_groups() {
        let s = store(1 << 20, 600_000);
        let who = Identity::new("app");
        let key = |id: Id<'_>| key_bits(&s.id_digest(&who, id));
        let mut r = 0x5eed_u64;
        for round in 0..200 {
            let base = if round < 100 {
                (xorshift(&mut r) >> 1) & !3
            } else {
                u64::from(round as u32) * 4
            };
            let keys: Vec<u64> = (0..4).map(|l| key(Id::UInt(base + l))).collect();
            for (l, &k) in keys.iter().enumerate() {
                assert_eq!(k & 3, l as u64);
                assert_eq!(k >> 2, keys[0] >> 2, "one group's hash");
                assert_eq!(MemoryStore::shard_of(k), MemoryStore::shard_of(keys[0]));
                for mask in [63usize, 1023, (1 << 17) - 1] {
                    assert_eq!(tag(k) as usize & mask, (tag(keys[0]) as usize & mask) + l);
                }
                if let Ok(i) = i64::try_from(base + l as u64) {
                    assert_eq!(key(Id::Int(i)), k, "signed or unsigned");
                }
            }
            assert_ne!(key(Id::UInt(base + 4)) >> 2, keys[0] >> 2, "the next group");
        }
        let apart = |a: u64, b: u64| a >> 2 != b >> 2;
        assert!(apart(key(Id::Int(-1)), key(Id::Int(-2))));
        assert!(apart(key(Id::Str("4")), key(Id::Str("5"))));
        assert!(apart(key(Id::Float(4.0)), key(Id::Float(5.0))));
        assert_ne!(key(Id::Int(4)), key(Id::Str("4")));
        assert_ne!(key(Id::Int(4)), key(Id::Float(4.0)));
        assert_ne!(key(Id::Int(-4)), key(Id::UInt(4)));
        assert_ne!(key(Id::UInt(u64::MAX)), key(Id::Int(-1)));
    }

    /// A large store's shards' indexes, at their largest, are in its mapping (advised for
    /// huge pages) and work there as on the heap; a small store makes no mapping.
    #[test]
    #[cfg_attr(miri, ignore)] // no mmap under Miri: the tables stay on the heap
    fn a_full_large_stores_indexes_are_in_its_mapping() {
        let small = store(1 << 20, 600_000);
        assert!(!small.shares.mapped());
        let s = store(16 << 20, 600_000);
        assert!(s.shares.mapped());
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        let n = 250_000u32;
        for i in 0..n {
            let k = s.digest(&[&i.to_le_bytes()]);
            let slot = run(s.claim(&k, &fp, Id::Null, &mut out));
            s.finish(&k, &fp, slot, br#""result":1}"#, None);
        }
        for (i, (sh, hint)) in s.shards.iter().zip(s.hints.iter()).enumerate() {
            let sh = sh.lock();
            check_shard(&sh, hint, "mapped");
            assert!(sh.index.table.mapped(), "shard {i}");
            assert_eq!(
                sh.index.table.len(),
                table::largest(s.slots - 1),
                "shard {i}"
            );
        }
        assert!(s.shares.all_taken());
        for i in n - 5_000..n {
            out.clear();
            let k = s.digest(&[&i.to_le_bytes()]);
            let c = s.claim(&k, &fp, Id::UInt(u64::from(i)), &mut out);
            assert!(matches!(c, Claim::Replayed(None)), "key {i}: {c:?}");
        }
        drop(s);
    }

    /// A full store under counted ids, as a client's connections send them (blocks of
    /// 64 from each of 16 connections): every shard stays whole ([`check_shard`]), the
    /// entries held are the newest, each found and replayed, and the index's probes
    /// stay short although four homes come together (live entries ~0.5 places from
    /// their homes on average with keys at random, ~2.3 here with groups of four; groups
    /// of eight, 4.3, fail the bound).
    #[test]
    fn counted_ids_keep_a_full_store_whole() {
        let s = store(1 << 21, 600_000);
        let who = Identity::new("app");
        let fp = s.digest(&[b"f"]);
        let mut out = Vec::new();
        // Call `i` from connection `i % 16`, its `k`-th: ids of a connection in blocks of
        // 64 a round (as the loadgen numbers them), connections interleaved call by call.
        let id = |i: u64| {
            let (conn, k) = (i % 16, i / 16);
            1_000_000_000 + k / 64 * 1024 + conn * 64 + k % 64
        };
        let n = 200_000u64;
        for i in 0..n {
            let k = s.id_digest(&who, Id::UInt(id(i)));
            let Claim::Run(slot) = s.claim(&k, &fp, Id::Null, &mut out) else {
                panic!("call {i} not run");
            };
            s.finish(&k, &fp, slot, br#""result":1}"#, None);
        }
        let (mut live, mut off_home) = (0usize, 0usize);
        for (sh, hint) in s.shards.iter().zip(s.hints.iter()) {
            let sh = sh.lock();
            check_shard(&sh, hint, "counted ids");
            let mask = sh.index.mask();
            for (at, &e) in sh.index.table.iter().enumerate() {
                if e != 0 && !sh.stale(e) {
                    live += 1;
                    off_home += at.wrapping_sub(sh.index.home(entry_tag(e))) & mask;
                }
            }
        }
        let held = s.len();
        assert_eq!(live, held);
        assert!(held > 20_000, "{held} held");
        let mean = off_home as f64 / live as f64;
        assert!(mean < 4.0, "live entries {mean:.2} places from their homes");
        // The newest calls are held (shards evict at their own pace: a margin).
        for i in n - 5_000..n {
            out.clear();
            let k = s.id_digest(&who, Id::UInt(id(i)));
            let c = s.claim(&k, &fp, Id::UInt(id(i)), &mut out);
            assert!(matches!(c, Claim::Replayed(None)), "call {i}: {c:?}");
            assert!(out.ends_with(br#""result":1}"#));
        }
    }
}
