//! The memory for the store's index tables: small ones on the heap; a shard's largest,
//! for a large store, in one mapping shared by all the shards and advised for huge
//! pages.
//!
//! Why: a claim reads its index line at random (a line for each group of counted ids),
//! and a full 64 MiB store's index is 16 MiB. With 4 KiB pages nearly every such read
//! misses the TLB, and in a server the page walk itself misses the cache (the store's
//! ring, written in order, and the socket buffers push the page tables out), so the
//! fetch ahead of the line (`MemoryStore::prefetch`) waits for its walk: ~5 % of a
//! server's time at 64 MiB sat on that one instruction (`perf record -e cpu-clock`),
//! and a random fetch in a 1 GiB table costs ~110 ns with 4 KiB pages against ~12 with
//! 2 MiB ones on this VM (docs/PERFORMANCE.md, stop 36). In 2 MiB pages the index's
//! translations are a few TLB entries.
//!
//! The shards' tables grow by doubling, each on its own, to a largest size known from
//! the byte bound ([`largest`]). Each shard is given, up front, its share of one
//! mapping of all of them (untouched, so holding no memory until used); its table
//! moves there when it reaches that size ([`Shares::take`]). The mapping is advised
//! for huge pages only once every share is in use (and out of them before, even where
//! THP is `always`): a share of a store under 128 MiB is
//! less than a huge page, and one shard's first write into a huge page would make its
//! neighbours' shares resident while they still hold their tables on the heap, memory
//! the byte bound does not count. Until then, and if some shard never fills, the
//! tables are in base pages, as on the heap; after it, the kernel's `khugepaged` puts
//! them in huge pages in the background (seconds).

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use spin::mutex::SpinMutex;

/// A huge page (x86-64 and aarch64 Linux with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// The least mapping worth making: one huge page for all the shards' tables (smaller
/// indexes stay in the CPU's caches, and a smaller mapping would not fill a huge page).
const MIN_MAPPING: usize = HUGE_PAGE;

/// The size an index table of a shard holding at most `live` entries grows to and
/// stops at: it doubles while its live entries fill more than half of it (see
/// `Shard::rebuild`), from 16 places.
pub(super) fn largest(live: usize) -> usize {
    live.saturating_add(1)
        .saturating_mul(2)
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .max(16)
}

/// An anonymous private mapping of the shards' largest tables, unmapped when dropped:
/// the store drops it after its shards, whose tables may be in it.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// The shares' range: aligned to huge pages, a whole number of them.
    start: NonNull<u8>,
    bytes: usize,
}

// SAFETY: a `Mapping` is only an address range to unmap; the memory in it is reached
// through `Table`s, each a disjoint part used by one owner at a time.
unsafe impl Send for Mapping {}
// SAFETY: as above (nothing is read or written through a shared `Mapping`).
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are those mmap returned, unmapped once, here, after
        // every table in it (see the type's comment).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A shard's part of a [`Mapping`], waiting to be its largest index table.
struct Share {
    ptr: NonNull<u64>,
    len: usize,
}

// SAFETY: a share is its shard's alone (see `Table`).
unsafe impl Send for Share {}

/// A mapping with one part of `len` zeroed `u64`s for each of `n` shards, aligned to
/// huge pages, and those parts; `None` if the parts together are under a huge page, or
/// the mapping fails (the tables then stay on the heap). The mapping must outlive the
/// tables made of the parts.
fn map(n: usize, len: usize) -> Option<(Mapping, Vec<Share>)> {
    if cfg!(miri) {
        return None;
    }
    let bytes = n
        .checked_mul(len)?
        .checked_mul(std::mem::size_of::<u64>())?;
    if bytes < MIN_MAPPING {
        return None;
    }
    // Room to align the start: a mapping's address is only page-aligned.
    let map_len = bytes.checked_add(HUGE_PAGE)?;
    // SAFETY: a new anonymous private mapping at an address of the kernel's choosing
    // touches no memory of the program; its pages read as zero until written.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let skip = (p as usize).wrapping_neg() % HUGE_PAGE;
    // SAFETY: `skip` < HUGE_PAGE, so `skip + bytes <= map_len`: within the mapping.
    let start = unsafe { p.cast::<u8>().add(skip) };
    let mapping = Mapping {
        ptr: NonNull::new(p.cast::<u8>())?,
        len: map_len,
        start: NonNull::new(start)?,
        bytes,
    };
    // Not in huge pages before every part is in use, even where THP is `always` (which
    // would give a part's first write its whole huge page, neighbours' parts included):
    // `Shares::take` advises them then.
    // SAFETY: the range is within the mapping; advice changes no contents.
    unsafe {
        libc::madvise(start.cast(), bytes, libc::MADV_NOHUGEPAGE);
    }
    let start = start.cast::<u64>();
    let parts = (0..n)
        .filter_map(|i| {
            // SAFETY: part `i` is `[i * len, (i + 1) * len)` of the `n * len` entries:
            // within the range, and no two parts overlap. The start is aligned to a
            // huge page, so to `u64`.
            let ptr = unsafe { start.add(i * len) };
            Some(Share {
                ptr: NonNull::new(ptr)?,
                len,
            })
        })
        .collect();
    Some((mapping, parts))
}

/// The shards' shares of one mapping, if the store is large enough for one (see the
/// module's comment).
#[derive(Default)]
pub(super) struct Shares {
    parts: Box<[SpinMutex<Option<Share>>]>,
    /// Parts taken so far.
    taken: AtomicUsize,
    /// Declared last: dropped after nothing, but the store holding this drops its
    /// shards (and their tables) first.
    mapping: Option<Mapping>,
}

impl Shares {
    /// A part of `len` entries for each of `n` shards, or none (see [`map`]).
    pub(super) fn new(n: usize, len: usize) -> Self {
        match map(n, len) {
            Some((mapping, parts)) => Self {
                parts: parts.into_iter().map(|p| SpinMutex::new(Some(p))).collect(),
                taken: AtomicUsize::new(0),
                mapping: Some(mapping),
            },
            None => Self::default(),
        }
    }

    /// Shard `i`'s part as a table of `len` entries, if it has one of that length not
    /// taken yet. Taking the last part advises the mapping for huge pages.
    pub(super) fn take(&self, i: usize, len: usize) -> Option<Table> {
        let share = self.parts.get(i)?.lock().take_if(|s| s.len == len)?;
        if self.taken.fetch_add(1, Ordering::AcqRel) + 1 == self.parts.len() {
            if let Some(m) = &self.mapping {
                // A hint: without transparent huge pages (or refused) the tables work
                // the same in base pages. Only now is every share in use.
                // SAFETY: the shares' range is within the mapping; advice changes no
                // contents.
                unsafe {
                    libc::madvise(m.start.as_ptr().cast(), m.bytes, libc::MADV_HUGEPAGE);
                }
            }
        }
        Some(Table {
            ptr: share.ptr,
            len: share.len,
            mapped: true,
        })
    }

    /// Whether there is a mapping (for tests).
    #[cfg(test)]
    pub(super) fn mapped(&self) -> bool {
        self.mapping.is_some()
    }

    /// Whether every part was taken (for tests).
    #[cfg(test)]
    pub(super) fn all_taken(&self) -> bool {
        self.parts.iter().all(|p| p.lock().is_none())
    }
}

/// An index table: a slice of `u64`s, zeroed when made, on the heap or in a [`Share`]
/// (24 bytes, as a `Vec`: a shard's header is two cache lines).
pub(super) struct Table {
    ptr: NonNull<u64>,
    len: usize,
    /// In a [`Mapping`] (which frees it), not a boxed slice of its own.
    mapped: bool,
}

// SAFETY: a `Table` owns its slice alone (a boxed slice, or its shard's part of a
// mapping that outlives it): it is a `Box<[u64]>` for sending and sharing.
unsafe impl Send for Table {}
// SAFETY: as above: `&Table` only reads the slice.
unsafe impl Sync for Table {}

impl Default for Table {
    fn default() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
            mapped: false,
        }
    }
}

impl Table {
    /// `n` zeroed entries on the heap.
    pub(super) fn zeroed(n: usize) -> Self {
        let boxed: Box<[u64]> = vec![0; n].into_boxed_slice();
        let len = boxed.len();
        match NonNull::new(Box::into_raw(boxed).cast::<u64>()) {
            Some(ptr) => Self {
                ptr,
                len,
                mapped: false,
            },
            // Never: `Box::into_raw` gives no null.
            None => Self::default(),
        }
    }

    /// Whether it is in a mapping advised for huge pages (for tests).
    #[cfg(test)]
    pub(super) fn mapped(&self) -> bool {
        self.mapped
    }
}

impl Deref for Table {
    type Target = [u64];

    #[inline(always)]
    fn deref(&self) -> &[u64] {
        // SAFETY: `ptr` is `len` initialized `u64`s (a boxed slice's, or a share's,
        // zeroed by the mapping) owned by this table while it lives (see `Send`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Table {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u64] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        if self.mapped {
            // Outgrown (a shard full of running calls): its pages are given back, since
            // nothing uses them again and the bound no longer counts them. A part
            // smaller than a huge page is first taken out of huge pages, or
            // `khugepaged` would fill it again with its neighbours' page. (When the
            // store goes, before its mapping is unmapped, this is a few syscalls.)
            let (p, bytes) = (
                self.ptr.as_ptr().cast(),
                self.len * std::mem::size_of::<u64>(),
            );
            // SAFETY: this table's own part of a live mapping (see `Shares`), not read
            // or written again; the advice only changes how its pages are held, and
            // `MADV_DONTNEED` drops them.
            unsafe {
                if bytes % HUGE_PAGE != 0 {
                    libc::madvise(p, bytes, libc::MADV_NOHUGEPAGE);
                }
                libc::madvise(p, bytes, libc::MADV_DONTNEED);
            }
        } else if self.len > 0 {
            // SAFETY: `ptr` and `len` are the boxed slice `zeroed` gave up, taken back
            // once, here.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.len,
                ))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_is_where_doubling_stops() {
        // The index doubles while (live + 1) * 2 > its size.
        for live in [0, 1, 7, 8, 100, 43_690, 43_691, 65_535] {
            let mut size = 16;
            while (live + 1) * 2 > size {
                size *= 2;
            }
            assert_eq!(largest(live), size, "{live}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)] // no mmap under Miri: `Shares::new` makes none
    fn shares_are_zeroed_disjoint_and_aligned() {
        assert!(
            !Shares::new(16, 1024).mapped(),
            "128 KiB: not worth a mapping"
        );
        let shares = Shares::new(4, 1 << 16);
        assert!(shares.mapped(), "a 2 MiB mapping");
        assert!(
            shares.take(0, 1 << 15).is_none(),
            "a part of another length"
        );
        let mut tables: Vec<Table> = (0..4).filter_map(|i| shares.take(i, 1 << 16)).collect();
        assert_eq!(tables.len(), 4);
        assert!(shares.take(0, 1 << 16).is_none(), "taken once");
        assert!(shares.all_taken());
        assert_eq!(tables[0].as_ptr() as usize % HUGE_PAGE, 0);
        for (i, t) in tables.iter_mut().enumerate() {
            assert_eq!(t.len(), 1 << 16);
            assert!(t.iter().all(|&e| e == 0));
            t.fill(i as u64 + 1);
        }
        // Each part is its own: dropping a table touches none of the others.
        let last = tables.pop().expect("four");
        drop(tables);
        assert!(last.iter().all(|&e| e == 4));
        drop(last);
        drop(shares);
        let heap = Table::zeroed(10);
        assert!(!heap.mapped() && heap.iter().all(|&e| e == 0));
        assert!(Table::default().is_empty());
    }
}
