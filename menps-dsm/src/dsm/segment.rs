//! Segments: their views, windows and per-block tables.
//!
//! A segment of `size` bytes with blocks of `block_size` bytes has, in every
//! process:
//!
//! - the **system view**: this process's part of the `data` window, always
//!   read-write for the runtime (the others read it only by fast read, and
//!   under the fixed home policy);
//! - the **application view**: the same pages mapped a second time at the
//!   segment's fixed DSM address, where each block's protection follows its
//!   state (none / read / read-write);
//! - the **twin**: this process's part of the `twin` window, the base
//!   version of the blocks it writes, and of the blocks it released last
//!   the version it published, which the others read (under the block's
//!   lock);
//! - the **meta** window: per block, the queue-lock word and the
//!   lock-associated data (LAD) slot;
//! - a local table of block entries (state, timestamps, fast-release
//!   counters), allocated lazily in chunks, each behind a mutex of the
//!   threading library (resolution may park the holder).

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use ct_sync::{Mutex, MutexGuard};
use ct_worker::UltItf;

use crate::com::{Communicator, WindowId};

use super::error::{DsmError, DsmResult};
use super::layout::{self, MAX_BLOCKS_PER_SEGMENT};

/// State of a block in one process (Endo 2020 §3.5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum BlockState {
    /// No valid copy and no local changes (no access).
    #[default]
    InvalidClean,
    /// No valid copy, local changes pending (no access; merged at the next
    /// release — "two-way merging").
    InvalidDirty,
    /// A valid copy, no local changes (read-only).
    ReadonlyClean,
    /// A valid copy with local changes pending against the twin (read-only).
    ReadonlyDirty,
    /// Being written (read-write); the twin is the base version.
    Writable,
    /// Read-write and never protected (call stacks); invalidation merges in
    /// place.
    Pinned,
    /// A write-shared pin (see `BlockMeta::shared_pin`) whose copy an
    /// acquire found stale and, rather than merge the new version in place
    /// then, made inaccessible (no access; local changes may be pending):
    /// its next access merges the latest version in place and pins it
    /// again, so an acquire after which this process does not touch the
    /// block costs no read and no merge.
    PinnedStale,
}

impl BlockState {
    /// Whether the application view allows reads.
    pub fn readable(self) -> bool {
        !matches!(
            self,
            BlockState::InvalidClean | BlockState::InvalidDirty | BlockState::PinnedStale
        )
    }

    /// Whether local changes may be pending.
    pub fn dirty(self) -> bool {
        matches!(
            self,
            BlockState::InvalidDirty
                | BlockState::ReadonlyDirty
                | BlockState::Writable
                | BlockState::Pinned
                | BlockState::PinnedStale
        )
    }

    /// Whether the application view allows writes.
    pub fn writable(self) -> bool {
        matches!(self, BlockState::Writable | BlockState::Pinned)
    }

    /// The protection of the application view.
    pub fn prot(self) -> libc::c_int {
        if self.writable() {
            libc::PROT_READ | libc::PROT_WRITE
        } else if self.readable() {
            libc::PROT_READ
        } else {
            libc::PROT_NONE
        }
    }
}

/// The local entry of a block (all zeros = initial).
#[derive(Debug, Default)]
pub(crate) struct BlockMeta {
    pub state: BlockState,
    /// Rank + 1 of the process whose copy is the latest we know of (from a
    /// write notice or our last transaction); 0 = the initial data, which
    /// every process has.
    pub home: u32,
    /// Write timestamp of our copy's version.
    pub cur_wr: u64,
    /// Read timestamp (lease end) of our copy.
    pub cur_rd: u64,
    /// Transactions in a row that found no local write.
    pub wr_count: u32,
    /// Fast releases since the last transaction.
    pub fast_rel_count: u32,
    /// Fast releases allowed before the next transaction (0 = 1).
    pub fast_rel_threshold: u32,
    /// Releases in a row that found the writable block unchanged since
    /// the previous one (and so announced nothing).
    pub idle_releases: u32,
    /// Idle releases in a row after which the block is protected and
    /// leaves the write set, once it has adapted (0: not yet, the start
    /// value applies; see `Space::fast_release`).
    pub idle_limit: u8,
    /// This process's release count (`Space::release_count`) when idle
    /// releases last protected the block, if no write has faulted since
    /// (0: none).
    pub idled_at: u32,
    /// Our last transaction left us the last writer (our copy is the
    /// latest version and our LAD slot describes it): fast release may
    /// apply while the lock stays here.
    pub written_last: bool,
    /// Write timestamp of the version our twin holds, where a transaction,
    /// a fast release or a write fault made the twin exactly that version
    /// (0: not known). Versions of a block have strictly increasing write
    /// timestamps, so if the block's LAD names this version while its
    /// lock is here, our twin is the latest version, and a release may
    /// publish our changes on top of it without reading another process's
    /// copy (see `Space::fast_release`). Whatever changes the twin
    /// otherwise either resets it or makes a newer version (an atomic on
    /// the block), which the LAD then names instead.
    pub twin_wr: u64,
    /// Listed in the write set.
    pub in_write_set: bool,
    /// Listed in the read set.
    pub in_read_set: bool,
    /// The next miss must take the global lock (the copy was dropped
    /// because the memory changed hands, e.g. reused by the heap).
    pub force_tx: bool,
    /// A read miss found this copy dropped as stale (invalidated while
    /// readable) since the last miss: the block is read again after each
    /// invalidation, and the next read miss makes it *hot*.
    pub dropped: bool,
    /// Acquires left that refresh this (hot) copy in place instead of
    /// dropping it (see `Space::refresh`): a stale copy is fetched anew at
    /// the acquire, without a fault. 0: dropped as usual.
    pub refreshes: u8,
    /// Listed for refresh by the acquire in progress (kept readable until
    /// it is refreshed).
    pub refresh_pending: bool,
    /// Pins outstanding ([`Space::pin`](super::space) counts them: a
    /// stack's pin by the worker entering its thread may come before the
    /// unpin by the worker that left it).
    pub pins: u32,
    /// An acquire found this copy stale because another process wrote the
    /// block, since this process's last write fault on it.
    pub remote_write_seen: bool,
    /// Write faults in a row that each followed another process's write:
    /// the processes write the block in turn (false sharing, or data handed
    /// from phase to phase).
    pub contended_writes: u8,
    /// Pinned by the DSM because the processes write it in turn (see
    /// `Space::start_write`), not by a caller of `Space::pin`: it stays
    /// writable and is merged in place, until idle releases unpin it.
    pub shared_pin: bool,
    /// Of a write-shared pin: acquires left that merge a stale copy in
    /// place at once rather than defer the merge to the next access (see
    /// `Space::defers_refresh`).
    pub eager_refreshes: u16,
    /// Of a write-shared pin: deferred merges in a row that ended in an
    /// access without having saved a merge (no second write notice came
    /// first, so deferring only added a fault); each makes the next spell
    /// of eager merges twice as long.
    pub eager_spells: u8,
    /// Of a [`BlockState::PinnedStale`] copy: another write notice came
    /// since it became stale, so deferring its merge saved one.
    pub stale_saved: bool,
    /// Of a [`BlockState::PinnedStale`] copy: a release found it equal to
    /// its twin since it became stale. Nothing writes it until it is merged
    /// (its application view is inaccessible; the runtime's atomics change
    /// copy and twin alike), so later releases need not compare it again.
    pub stale_unchanged: bool,
    /// Pages of a partly fetched copy (`DsmConfig::partial_reads`) not
    /// fetched: bit `k` is page `k` of the block. A readable copy is
    /// readable only on the pages whose bit is clear (the others stay
    /// `PROT_NONE`); an invalid one keeps the bits, so that its next miss
    /// takes the block's lock rather than trust the pages we lack. 0 once
    /// a read or merge made the copy whole (a dirty copy always is).
    pub missing: u64,
    /// Dirty tracking (see [`super::dirty`]): every page of this copy that
    /// the tracker has kept write-protected since it last protected it
    /// (none written since) holds the same bytes as the twin. Taking the
    /// entry's lock clears it ([`BlockEntry::lock`]: the taker may change
    /// the copy or the twin through the system view, which the tracker
    /// does not see), except for a release fence, which clears it where its
    /// scan reports a page of the block written. A release, a write fault or
    /// a write-ahead then sets it where it makes or finds the copy equal to
    /// its twin. (Another process's atomic on our copy writes
    /// the same word into the twin.) So a release whose scan covered the
    /// block and found none of its pages written knows it unchanged without
    /// comparing.
    pub armed: bool,
}

impl BlockMeta {
    /// Turns a partial copy (see [`BlockMeta::missing`]) into an invalid
    /// one whose next miss reads the whole block anew, under its lock.
    pub fn forget_partial(&mut self) {
        self.state = BlockState::InvalidClean;
        self.missing = 0;
        self.force_tx = true;
    }
}

/// Most pages of a block that a partial read tracks ([`BlockMeta::missing`]).
pub(crate) const PARTIAL_MAX_PAGES: usize = 64;

/// The entry lock of a block and what it guards.
pub(crate) struct BlockEntry<U: UltItf>(Mutex<BlockMeta, U>);

impl<U: UltItf> BlockEntry<U> {
    fn new() -> Self {
        BlockEntry(Mutex::new_in(BlockMeta::default()))
    }

    /// Takes the entry lock; the caller may change the copy or its twin,
    /// so what a dirty scan knew of the block is forgotten
    /// ([`BlockMeta::armed`]).
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, BlockMeta, U> {
        let mut m = self.0.lock();
        m.armed = false;
        m
    }

    /// [`BlockEntry::lock`] without waiting: `None` if it is held.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, BlockMeta, U>> {
        let mut m = self.0.try_lock()?;
        m.armed = false;
        Some(m)
    }

    /// Takes the entry lock for a release fence, which keeps
    /// [`BlockMeta::armed`] up to date itself.
    #[inline]
    pub fn lock_for_release(&self) -> MutexGuard<'_, BlockMeta, U> {
        self.0.lock()
    }
}

const CHUNK_SHIFT: usize = 10;
const CHUNK: usize = 1 << CHUNK_SHIFT;

/// Bytes per block in the meta window: the lock word at 0, the LAD at 8.
pub(crate) const META_BYTES: usize = 64;
/// Offset of the LAD in a block's meta slot.
pub(crate) const LAD_OFF: usize = 8;

/// The lock-associated data of a block: who holds the latest version and
/// its interval (and, for the directory policy, the sharers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Lad {
    /// Rank + 1 of the last writer (0: nobody wrote yet).
    pub last_writer: u64,
    /// Write timestamp of the latest version.
    pub wr: u64,
    /// Largest read timestamp handed out for it.
    pub rd: u64,
    /// Sharer bit set (directory policy).
    pub sharers: u64,
}

impl Lad {
    pub const BYTES: usize = 32;

    pub fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..8].copy_from_slice(&self.last_writer.to_le_bytes());
        b[8..16].copy_from_slice(&self.wr.to_le_bytes());
        b[16..24].copy_from_slice(&self.rd.to_le_bytes());
        b[24..32].copy_from_slice(&self.sharers.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> DsmResult<Self> {
        if b.len() != Self::BYTES {
            return Err(DsmError::Misuse(format!(
                "block lock hand-off of {} bytes instead of {} (internal error)",
                b.len(),
                Self::BYTES
            )));
        }
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Lad {
            last_writer: u(0),
            wr: u(8),
            rd: u(16),
            sharers: u(24),
        })
    }
}

/// The fresh windows of a segment being created, for its `fill` step.
pub(crate) struct Fresh {
    /// This process's system view (`size` bytes, zero).
    pub data: *mut u8,
    /// This process's twins (`size` bytes, zero).
    pub twin: *mut u8,
    /// The data window (to read another process's system view).
    pub data_win: WindowId,
    /// Size of the segment.
    pub size: usize,
}

impl Fresh {
    /// Copies `img` (at most `size` bytes) into the system view and the
    /// twin.
    pub fn copy_image(&self, img: &[u8]) -> DsmResult<()> {
        if img.len() > self.size {
            return Err(DsmError::InvalidArgument(format!(
                "initial image of {} bytes is larger than the segment ({})",
                img.len(),
                self.size
            )));
        }
        // SAFETY: the system view and twin are this process's fresh window
        // parts of `size` bytes; nobody accesses them yet (the segment is not
        // published, and remote processes only access blocks after a lock
        // hand-off, which follows creation).
        unsafe {
            core::ptr::copy_nonoverlapping(img.as_ptr(), self.data, img.len());
            core::ptr::copy_nonoverlapping(img.as_ptr(), self.twin, img.len());
        }
        Ok(())
    }
}

/// A segment as one process sees it.
pub(crate) struct Segment<U: UltItf> {
    pub id: usize,
    /// First address of the application view.
    pub base: usize,
    pub size: usize,
    pub block_size: usize,
    pub block_shift: u32,
    pub nblocks: usize,
    pub data_win: WindowId,
    pub twin_win: WindowId,
    pub meta_win: WindowId,
    /// This process's system view.
    pub data: *mut u8,
    /// This process's twins.
    pub twin: *mut u8,
    /// Whether the application view stays mapped at shutdown
    /// ([`Segment::retire`]).
    pub keep: bool,
    /// Whether the dirty tracker records writes to the application view
    /// (see [`super::dirty`]).
    pub tracked: bool,
    /// The sequential-miss detector of prefetching.
    pub seq: SeqDetector,
    chunks: Box<[AtomicPtr<BlockEntry<U>>]>,
}

/// Sequential-miss detection for prefetching, per segment: a read miss at
/// the block right after the last fetched run (or one further: the block
/// between may have been readable, a fixed home's own block) continues the
/// run; the first continuation fetches [`PREFETCH_FIRST_BYTES`] ahead (at
/// least one block, at most the cap), every further one doubles the window
/// up to the cap; any other miss resets it — except a miss at the block
/// where the last run that continued began, which resumes that run at the
/// first window: a loop that reads an array again after each barrier (whose
/// acquire dropped it) misses first where it began last time, and fetched
/// only that block, then waited for a second miss before the window
/// opened (two more round trips across hosts). (Relaxed atomics: a hint —
/// concurrent misses at worst reset the run.)
#[derive(Debug, Default)]
pub(crate) struct SeqDetector {
    /// Index + 1 of the block after the last run fetched (0: none yet).
    next: AtomicUsize,
    /// Blocks the last miss of the run fetched ahead.
    window: AtomicUsize,
    /// Index + 1 of the block whose miss began the current run (0: none).
    begin: AtomicUsize,
    /// Index + 1 of the block where the last run that continued began (0:
    /// none).
    resume: AtomicUsize,
}

/// What the first sequential miss of a run fetches ahead of itself, in
/// bytes (rounded down to whole blocks, at least one; at most the cap,
/// `MENPS_DSM_PREFETCH`, whose default it equals): two misses in a row
/// already make a run worth the whole window. Across hosts every miss costs
/// a fault and two round trips (some 200–300 µs over TCP; it was three when
/// this was measured), more than moving 256 KiB; starting at 32 KiB and doubling, a 1 MiB read of 32 KiB blocks
/// across 2 simulated hosts moved 190–250 MB/s, starting here 370 MB/s. A
/// pair of neighbouring misses that is no run costs at most this much
/// extra transfer.
pub(crate) const PREFETCH_FIRST_BYTES: usize = 256 * 1024;

impl SeqDetector {
    /// A read miss at block `idx`: how many blocks after it to fetch, at
    /// least `first` when it continues a run, at most `cap` (and at most
    /// `room`, the blocks left in the segment).
    pub fn on_miss(&self, idx: usize, first: usize, cap: usize, room: usize) -> usize {
        let next = self.next.load(Ordering::Relaxed);
        let sequential = next != 0 && (next..=next + 1).contains(&(idx + 1));
        let w = if sequential {
            // The run continues: where it began, a later one resumes.
            self.resume
                .store(self.begin.load(Ordering::Relaxed), Ordering::Relaxed);
            (self.window.load(Ordering::Relaxed) * 2).max(first.max(1))
        } else {
            self.begin.store(idx + 1, Ordering::Relaxed);
            if self.resume.load(Ordering::Relaxed) == idx + 1 {
                first.max(1)
            } else {
                0
            }
        };
        let w = w.min(cap).min(room);
        self.window.store(w, Ordering::Relaxed);
        self.next.store(idx + w + 2, Ordering::Relaxed);
        w
    }

    /// A miss at block `idx` that completes a partial copy past the page
    /// it first fetched (see `BlockMeta::missing`): the start of a run,
    /// which fetches one block ahead (at most `cap` and `room`, as in
    /// [`SeqDetector::on_miss`]); a miss right after it continues the run.
    pub fn on_onward_miss(&self, idx: usize, cap: usize, room: usize) -> usize {
        let w = cap.min(room).min(1);
        self.window.store(w, Ordering::Relaxed);
        self.next.store(idx + w + 2, Ordering::Relaxed);
        w
    }

    /// The run was cut short after `fetched` of the blocks ahead of the
    /// miss at `idx` (one was busy or not fetchable): the next sequential
    /// miss is right after them.
    pub fn cut(&self, idx: usize, fetched: usize) {
        self.next.store(idx + fetched + 2, Ordering::Relaxed);
    }
}

// SAFETY: the raw pointers are addresses of shared mappings that live as long
// as the segment; every access through them follows the DSM protocol (block
// entries' mutexes, the global block locks).
unsafe impl<U: UltItf> Send for Segment<U> {}
// SAFETY: as above.
unsafe impl<U: UltItf> Sync for Segment<U> {}

impl<U: UltItf> Segment<U> {
    /// Creates segment `id` collectively at `base`: the three windows, the
    /// application view (inaccessible: every block starts `InvalidClean`).
    ///
    /// `fill` writes the initial contents (the same in every process once
    /// it returns everywhere) into the fresh system view and twin, before
    /// the application view replaces whatever was mapped at `base`.
    pub fn create<C: Communicator>(
        com: &C,
        id: usize,
        base: usize,
        size: usize,
        block_size: usize,
        fill: impl FnOnce(&Fresh) -> DsmResult<()>,
    ) -> DsmResult<Self> {
        super::config::check_block_size(block_size)?;
        if size == 0 || !size.is_multiple_of(block_size) {
            return Err(DsmError::InvalidArgument(format!(
                "segment size {size} must be a positive multiple of the block size {block_size}"
            )));
        }
        let nblocks = size / block_size;
        if nblocks > MAX_BLOCKS_PER_SEGMENT {
            return Err(DsmError::InvalidArgument(format!(
                "a segment of {size} bytes has {nblocks} blocks of {block_size} bytes; at most \
                 {MAX_BLOCKS_PER_SEGMENT} are allowed (use larger blocks)"
            )));
        }
        let data_win = com.create_window(size)?;
        let twin_win = com.create_window(size)?;
        let meta_win = com.create_window(nblocks * META_BYTES)?;
        let data = com.local_window(data_win)?.as_ptr();
        let twin = com.local_window(twin_win)?.as_ptr();
        // The application view aliases the system view's pages (below), which
        // every backend's windows allow (see `Windows`); a backend that broke
        // the rule would make mremap fail less clearly.
        if !(data as usize).is_multiple_of(crate::sys::page_size()) {
            return Err(DsmError::AddressSpace(format!(
                "the communication backend gave segment {id} a data window at {data:p}, which \
                 is not page-aligned: the DSM needs window parts that are page-aligned shared \
                 mappings (see `com::Windows`)"
            )));
        }
        fill(&Fresh {
            data,
            twin,
            data_win,
            size,
        })?;
        // The application view: the system view's pages again, at `base`.
        // SAFETY: mremap with old_size 0 duplicates a shared mapping (the
        // window part is MAP_SHARED); MREMAP_FIXED places it over our own
        // reservation at `base`, which no Rust object occupies.
        let p = unsafe {
            libc::mremap(
                data.cast(),
                0,
                size,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                base as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DsmError::AddressSpace(format!(
                "cannot map the application view of segment {id} at {base:#x}: {} (the \
                 communication backend's windows must be shared mappings)",
                std::io::Error::last_os_error()
            )));
        }
        layout::protect(base, size, libc::PROT_NONE)?;
        let nchunks = nblocks.div_ceil(CHUNK);
        let chunks = (0..nchunks)
            .map(|_| AtomicPtr::new(core::ptr::null_mut()))
            .collect();
        Ok(Segment {
            id,
            base,
            size,
            block_size,
            block_shift: block_size.trailing_zeros(),
            nblocks,
            data_win,
            twin_win,
            meta_win,
            data,
            twin,
            keep: false,
            tracked: false,
            seq: SeqDetector::default(),
            chunks,
        })
    }

    /// Whether `addr` is inside the segment.
    #[inline]
    pub fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.base) < self.size
    }

    /// Block index of `addr` (inside the segment).
    #[inline]
    pub fn index_of(&self, addr: usize) -> usize {
        (addr - self.base) >> self.block_shift
    }

    /// Application address of block `idx`.
    #[inline]
    pub fn app(&self, idx: usize) -> usize {
        self.base + (idx << self.block_shift)
    }

    /// Byte offset of block `idx` in the data and twin windows.
    #[inline]
    pub fn offset(&self, idx: usize) -> u64 {
        (idx << self.block_shift) as u64
    }

    /// This process's system-view copy of block `idx`.
    #[inline]
    pub fn sys(&self, idx: usize) -> *mut u8 {
        // SAFETY: idx < nblocks, so the offset is inside the window part.
        unsafe { self.data.add(idx << self.block_shift) }
    }

    /// This process's twin of block `idx`.
    #[inline]
    pub fn twin_of(&self, idx: usize) -> *mut u8 {
        // SAFETY: as for `sys`.
        unsafe { self.twin.add(idx << self.block_shift) }
    }

    /// Offset of block `idx`'s lock word in the meta window.
    #[inline]
    pub fn meta_off(&self, idx: usize) -> u64 {
        (idx * META_BYTES) as u64
    }

    /// The local entry of block `idx` (allocated on first use).
    pub fn entry(&self, idx: usize) -> &BlockEntry<U> {
        debug_assert!(idx < self.nblocks);
        let slot = &self.chunks[idx >> CHUNK_SHIFT];
        let mut p = slot.load(Ordering::Acquire);
        if p.is_null() {
            let fresh: Box<[BlockEntry<U>]> = (0..CHUNK).map(|_| BlockEntry::new()).collect();
            let fresh = Box::into_raw(fresh) as *mut BlockEntry<U>;
            match slot.compare_exchange(
                core::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => p = fresh,
                Err(winner) => {
                    // SAFETY: `fresh` was never published; rebuild the boxed
                    // slice it came from to free it.
                    drop(unsafe {
                        Box::from_raw(core::ptr::slice_from_raw_parts_mut(fresh, CHUNK))
                    });
                    p = winner;
                }
            }
        }
        // SAFETY: a published chunk holds CHUNK entries and lives until the
        // segment is dropped; `&self` borrows the segment.
        unsafe { &*p.add(idx & (CHUNK - 1)) }
    }

    /// Ends the application view (at shutdown). A segment whose memory the
    /// program may still hold (`keep`: the heap, adopted ranges) stays
    /// mapped, read-write, holding this process's copy: the view aliases
    /// this process's own window pages, which the mapping keeps alive after
    /// the window is gone. Any other segment becomes an inaccessible
    /// reservation again.
    pub fn retire(&self) {
        if self.keep {
            // If this fails the range stays as the protocol left it.
            let _ = layout::protect(self.base, self.size, libc::PROT_READ | libc::PROT_WRITE);
            return;
        }
        // SAFETY: replaces our own application view with an inaccessible
        // reservation, as `layout::reserve` made it.
        unsafe {
            libc::mmap(
                self.base as *mut libc::c_void,
                self.size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            );
        }
    }
}

impl<U: UltItf> Drop for Segment<U> {
    fn drop(&mut self) {
        for c in self.chunks.iter() {
            let p = c.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: every published chunk came from a boxed slice of
                // CHUNK entries; we own the segment exclusively here.
                drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(p, CHUNK)) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SeqDetector;

    /// Feeds `s` read misses `(block, first window, cap, room)` and checks
    /// that each fetches `want` blocks ahead.
    fn misses(s: &SeqDetector, steps: &[(usize, usize, usize, usize, usize)]) {
        for (k, &(idx, first, cap, room, want)) in steps.iter().enumerate() {
            assert_eq!(s.on_miss(idx, first, cap, room), want, "miss {k}, at {idx}");
        }
    }

    #[test]
    fn a_run_starts_at_the_first_window_and_doubles_to_the_cap() {
        // A first miss fetches nothing ahead; the next block continues the
        // run with the first window, then each continuation doubles it, up
        // to the cap and the blocks left in the segment; a miss elsewhere
        // resets the run.
        let s = SeqDetector::default();
        misses(
            &s,
            &[
                (0, 8, 64, 1000, 0),
                (1, 8, 64, 1000, 8),
                (10, 8, 64, 1000, 16),
                (27, 8, 64, 1000, 32),
                (60, 8, 64, 1000, 64),
                (125, 8, 64, 1000, 64),
                (190, 8, 64, 5, 5),
                (500, 8, 64, 1000, 0),
                (501, 8, 64, 1000, 8),
            ],
        );
    }

    #[test]
    fn a_miss_where_the_last_run_began_resumes_it_at_the_first_window() {
        let s = SeqDetector::default();
        misses(
            &s,
            &[
                (100, 8, 64, 1000, 0),
                (101, 8, 64, 1000, 8),
                (110, 8, 64, 1000, 16),
                // The array read again from its start: the first window at
                // once, then the run goes on doubling.
                (100, 8, 64, 1000, 8),
                (109, 8, 64, 1000, 16),
                // Elsewhere: a reset, and lone misses (no continuation) do
                // not replace the run to resume.
                (300, 8, 64, 1000, 0),
                (700, 8, 64, 1000, 0),
                (300, 8, 64, 1000, 0),
                (100, 8, 64, 1000, 8),
            ],
        );
        // A run that began with a partial read and went on through its
        // block: resumed too, never past the cap or the segment's end.
        let t = SeqDetector::default();
        misses(&t, &[(0, 8, 64, 1000, 0)]);
        assert_eq!(t.on_onward_miss(0, 64, 1000), 1);
        misses(
            &t,
            &[(2, 8, 64, 1000, 8), (0, 8, 64, 1000, 8), (0, 8, 4, 3, 3)],
        );
        // Nothing with prefetch off.
        misses(
            &SeqDetector::default(),
            &[(5, 8, 0, 100, 0), (6, 8, 0, 100, 0), (5, 8, 0, 100, 0)],
        );
    }

    #[test]
    fn large_blocks_start_at_one_and_the_cap_wins_over_the_first_window() {
        misses(
            &SeqDetector::default(),
            &[(0, 0, 8, 100, 0), (1, 0, 8, 100, 1), (3, 0, 8, 100, 2)],
        );
        misses(
            &SeqDetector::default(),
            &[(0, 8, 4, 100, 0), (1, 8, 4, 100, 4)],
        );
        // Prefetch off (cap 0): never anything ahead.
        misses(
            &SeqDetector::default(),
            &[(0, 8, 0, 100, 0), (1, 8, 0, 100, 0)],
        );
    }
}
