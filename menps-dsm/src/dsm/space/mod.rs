//! The protocol core: block upgrades on faults, transactions, fast release,
//! invalidation, and the read and write sets (Endo 2020 §3.4–3.5).
//!
//! Every operation on a block runs under the block's local entry mutex,
//! which serialises the threads of this process; transactions also take the
//! block's global lock ([`super::qlock`]), which serialises processes and
//! tells where the latest version is.

use core::cmp::Reverse;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::collections::BinaryHeap;

use ct_sync::{Mutex, MutexGuard};
use ct_worker::UltItf;

use crate::com::{Communicator, Tag, WindowId};

use super::allocator::RuntimeGuard;
use super::config::{DsmConfig, InvalidationPolicy, RaceAction, WriterPolicy};
use super::diff;
use super::dirty::DirtyTracker;
use super::error::{DsmError, DsmResult, RaceReport};
use super::layout::{self, MAX_SEGMENTS};
use super::memory::map::{self, AddressMap, Region, RegionKind, Request};
use super::qlock::LockSite;
use super::segment::{BlockMeta, BlockState, PARTIAL_MAX_PAGES, PREFETCH_FIRST_BYTES, Segment};
use super::signature::Signature;
use super::sync::SyncState;

mod acquire;
mod directory;
mod live;
mod release;
mod transaction;

use live::StackLive;

/// Tags with the top bit set are the DSM's.
pub(crate) const DSM_TAG_BIT: Tag = 0x8000_0000;

/// Write sets (and lists of write notices) at least this large are
/// processed in parallel, on user-level threads.
const PARALLEL_RELEASE_MIN: usize = 64;
/// The same, on OS threads: creating them costs tens of microseconds each
/// and takes processors from the program's own threads (on 2 cores, 64
/// blocks released serially took 0.1 ms, in parallel 1–3 ms).
const PARALLEL_RELEASE_MIN_OS: usize = 4096;

/// The parallel threshold for the threading library `U`.
const fn parallel_min<U: UltItf>() -> usize {
    if U::CHEAP_SPAWN {
        PARALLEL_RELEASE_MIN
    } else {
        PARALLEL_RELEASE_MIN_OS
    }
}

/// How many tasks a release or an acquire splits `items` blocks (or write
/// notices) into on threads of `U`, for a job of `nprocs` processes (1:
/// none, the caller does it all). On user-level threads, up to four per
/// worker: they cost little and balance the load. On OS threads, one per
/// processor that this process's share of the host leaves it (the host's
/// processors divided among the job's processes, as if all ran there;
/// across hosts that undercounts): each costs a thread's creation, competes
/// with the other processes for the processors, and takes the memory-map
/// lock for its `mprotect` calls. (Seven helper threads per release, on 2
/// processors shared by 2 processes, made the multigrid kernel at class W
/// a quarter slower than releasing serially.)
fn parallel_tasks<U: UltItf>(items: usize, nprocs: usize) -> usize {
    if items < parallel_min::<U>() {
        return 1;
    }
    if U::CHEAP_SPAWN {
        match U::num_workers() {
            0 | 1 => 1,
            w => (w * 4).min(items / (PARALLEL_RELEASE_MIN / 4)).max(2),
        }
    } else {
        (U::num_workers() / nprocs.max(1)).max(1)
    }
}

/// Slots of a directory invalidation queue.
const INVAL_CAP: usize = 4096;
/// Header bytes of an invalidation queue (the tail counter at 0).
const INVAL_HEADER: usize = 64;

/// An atomic operation applied to a DSM word inside a transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AtomicOp {
    Load,
    Store(u64),
    FetchAdd(u64),
    CompareExchange(u64, u64),
}

/// The initial contents of a new region.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Init<'a> {
    /// Zeros.
    Zero,
    /// These bytes (the same in every process), then zeros.
    Image(&'a [u8]),
    /// What process 0 has at the region's address now (adopted ranges).
    FromRoot,
}

/// Why a transaction runs.
#[derive(Debug, Clone, Copy)]
enum TxKind {
    /// A read miss whose lease expired (or without fast read).
    Read,
    /// A read miss that fetches only this page of the block (a partial
    /// read, see `BlockMeta::missing`): as [`TxKind::Read`] otherwise.
    ReadPage(usize),
    /// A read of an invalid block ahead of a sequential miss: as
    /// [`TxKind::Read`], but the caller sets the protection.
    Prefetch,
    /// A release of a dirty block; `clean`: this fence's dirty scan found
    /// none of its pages written (see `Space::unchanged_since_release`).
    Release { clean: bool },
    /// An invalidated pinned block, merged in place.
    PinnedRefresh,
    /// A stale pinned block ([`BlockState::PinnedStale`]) merged in place
    /// at its access: as [`TxKind::PinnedRefresh`], but the caller sets the
    /// protection.
    StaleRefresh,
    /// An atomic operation on the word at this offset of the block.
    Atomic(usize, AtomicOp),
}

/// Counters of protocol events in this process. The times (`*_ns`) are
/// measured only when the DSM prints its counters at the end
/// ([`DsmConfig::print_stats`](crate::dsm::DsmConfig), `MENPS_STATS`), and
/// stay 0 otherwise: a clock read costs tens of nanoseconds on a virtual
/// machine, and a barrier takes about ten.
#[derive(Debug, Default)]
pub struct Stats {
    /// Whether the times are measured.
    timing: bool,
    /// Read faults resolved.
    pub read_faults: AtomicUsize,
    /// Write faults resolved.
    pub write_faults: AtomicUsize,
    /// Transactions (global lock taken).
    pub transactions: AtomicUsize,
    /// Releases that skipped the global lock.
    pub fast_releases: AtomicUsize,
    /// Of those, releases on top of a version another process wrote.
    pub taken_releases: AtomicUsize,
    /// Releases of writable blocks unchanged since the previous release.
    pub idle_releases: AtomicUsize,
    /// Blocks made writable ahead of a write fault.
    pub written_ahead: AtomicUsize,
    /// Misses served by one read from a write notice's writer.
    pub fast_reads: AtomicUsize,
    /// Blocks invalidated.
    pub invalidations: AtomicUsize,
    /// Bytes fetched from other processes' copies.
    pub bytes_fetched: AtomicUsize,
    /// DSM barriers.
    pub barriers: AtomicUsize,
    /// Flushes.
    pub flushes: AtomicUsize,
    /// Nanoseconds spent resolving faults.
    pub fault_ns: AtomicU64,
    /// Nanoseconds spent in release fences.
    pub release_ns: AtomicU64,
    /// Nanoseconds spent applying acquires (invalidations).
    pub acquire_ns: AtomicU64,
    /// Nanoseconds spent in DSM barriers (release and acquire included).
    pub barrier_ns: AtomicU64,
    /// Nanoseconds spent in DSM barriers waiting for the other processes
    /// (the communication layer's barrier).
    pub barrier_wait_ns: AtomicU64,
    /// Blocks fetched ahead of sequential read misses.
    pub prefetched: AtomicUsize,
    /// Stale copies refreshed in place by acquires.
    pub refreshed: AtomicUsize,
    /// Read misses that fetched only the page they touched.
    pub partial_reads: AtomicUsize,
    /// Blocks pinned because processes write them in turn.
    pub shared_pins: AtomicUsize,
    /// Idle releases known from a dirty scan, without a comparison.
    pub scanned_idle: AtomicUsize,
    /// Dirty scans (`PAGEMAP_SCAN` calls).
    pub dirty_scans: AtomicUsize,
    /// Stale write-shared pins whose merge an acquire deferred.
    pub deferred_refreshes: AtomicUsize,
    /// Speculative reads that held the latest version.
    pub speculative_reads: AtomicUsize,
    /// Speculative reads that did not (read again).
    pub void_speculations: AtomicUsize,
}

/// Counters as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Read faults resolved.
    pub read_faults: usize,
    /// Write faults resolved.
    pub write_faults: usize,
    /// Transactions (global lock taken).
    pub transactions: usize,
    /// Releases that skipped the global lock.
    pub fast_releases: usize,
    /// Of the fast releases, those of a block another process wrote last,
    /// whose version our last transaction took (refreshing a block the
    /// processes write in turn) and whose lock stayed here since: our
    /// changes on top of it were published without reading another
    /// process's copy, where before a transaction merged them.
    pub taken_releases: usize,
    /// Releases of writable blocks unchanged since the previous release
    /// (nothing announced).
    pub idle_releases: usize,
    /// Blocks made writable ahead of a write fault (write faults saved
    /// when the program then writes them).
    pub written_ahead: usize,
    /// Misses served by one read from a write notice's writer.
    pub fast_reads: usize,
    /// Blocks invalidated.
    pub invalidations: usize,
    /// Bytes fetched from other processes' copies.
    pub bytes_fetched: usize,
    /// DSM barriers.
    pub barriers: usize,
    /// Flushes.
    pub flushes: usize,
    /// Nanoseconds spent resolving faults (by every thread of the process).
    /// This and the other times are measured only when the DSM prints its
    /// counters (`MENPS_STATS`); they are 0 otherwise.
    pub fault_ns: u64,
    /// Nanoseconds spent in release fences (also those inside barriers).
    pub release_ns: u64,
    /// Nanoseconds spent applying acquires (also those inside barriers).
    pub acquire_ns: u64,
    /// Nanoseconds spent in DSM barriers, waiting included.
    pub barrier_ns: u64,
    /// Nanoseconds of `barrier_ns` spent waiting for the other processes.
    pub barrier_wait_ns: u64,
    /// Blocks fetched ahead of sequential read misses (`MENPS_DSM_PREFETCH`).
    pub prefetched: usize,
    /// Stale copies of hot blocks refreshed in place by acquires instead of
    /// dropped (`MENPS_DSM_REFRESH`): read misses saved when the program
    /// reads them again.
    pub refreshed: usize,
    /// Read misses that fetched only the page they touched of a larger
    /// block (`MENPS_DSM_PARTIAL_READ`).
    pub partial_reads: usize,
    /// Blocks pinned because several processes write them in turn
    /// (`MENPS_DSM_PIN_SHARED`): each pinning saves a write fault and the
    /// protection changes around it per write phase, until the block goes
    /// idle.
    pub shared_pins: usize,
    /// Of the idle releases, those known from the kernel's record of writes
    /// without comparing the block with its twin (`MENPS_DSM_DIRTY_SCAN`).
    pub scanned_idle: usize,
    /// Calls that read the kernel's record of writes (`PAGEMAP_SCAN`).
    pub dirty_scans: usize,
    /// Stale copies of write-shared pinned blocks that an acquire made
    /// inaccessible instead of merging the new version in at once: the
    /// merge happens at this process's next access, if any comes before
    /// the block is written elsewhere again (a merge saved otherwise).
    pub deferred_refreshes: usize,
    /// Read misses and prefetched blocks whose latest version came with the
    /// swap that took the block's lock (read at the process the lock was
    /// tried at, which the lock-associated data then named the last
    /// writer): one round trip for the lock and the data where it took two.
    pub speculative_reads: usize,
    /// Speculative reads of the latest version at the wrong process (the
    /// lock had moved on, or another process read the block last and holds
    /// its lock): read again from the last writer.
    pub void_speculations: usize,
}

impl core::fmt::Display for StatsSnapshot {
    /// One line of `name=value` pairs; times in milliseconds.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let ms = |ns: u64| ns as f64 / 1e6;
        write!(
            f,
            "read_faults={} write_faults={} written_ahead={} transactions={} fast_releases={} \
             taken_releases={} idle_releases={} fast_reads={} \
             invalidations={} bytes_fetched={} barriers={} flushes={} fault_ms={:.3} \
             release_ms={:.3} acquire_ms={:.3} barrier_ms={:.3} barrier_wait_ms={:.3} \
             prefetched={} partial_reads={} refreshed={} shared_pins={} scanned_idle={} \
             dirty_scans={} deferred_refreshes={} speculative_reads={} void_speculations={}",
            self.read_faults,
            self.write_faults,
            self.written_ahead,
            self.transactions,
            self.fast_releases,
            self.taken_releases,
            self.idle_releases,
            self.fast_reads,
            self.invalidations,
            self.bytes_fetched,
            self.barriers,
            self.flushes,
            ms(self.fault_ns),
            ms(self.release_ns),
            ms(self.acquire_ns),
            ms(self.barrier_ns),
            ms(self.barrier_wait_ns),
            self.prefetched,
            self.partial_reads,
            self.refreshed,
            self.shared_pins,
            self.scanned_idle,
            self.dirty_scans,
            self.deferred_refreshes,
            self.speculative_reads,
            self.void_speculations,
        )
    }
}

impl Stats {
    /// Counters at zero; times measured if `timing`.
    fn new(timing: bool) -> Self {
        Stats {
            timing,
            ..Stats::default()
        }
    }

    /// Adds the time from now to the guard's drop to `into` (one of our
    /// `*_ns` counters), if times are measured.
    pub(crate) fn timed<'a>(&self, into: &'a AtomicU64) -> Timed<'a> {
        Timed {
            start: self.timing.then(std::time::Instant::now),
            into,
        }
    }

    fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        let t = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            read_faults: l(&self.read_faults),
            write_faults: l(&self.write_faults),
            transactions: l(&self.transactions),
            fast_releases: l(&self.fast_releases),
            taken_releases: l(&self.taken_releases),
            idle_releases: l(&self.idle_releases),
            written_ahead: l(&self.written_ahead),
            fast_reads: l(&self.fast_reads),
            invalidations: l(&self.invalidations),
            bytes_fetched: l(&self.bytes_fetched),
            barriers: l(&self.barriers),
            flushes: l(&self.flushes),
            fault_ns: t(&self.fault_ns),
            release_ns: t(&self.release_ns),
            acquire_ns: t(&self.acquire_ns),
            barrier_ns: t(&self.barrier_ns),
            barrier_wait_ns: t(&self.barrier_wait_ns),
            prefetched: l(&self.prefetched),
            refreshed: l(&self.refreshed),
            partial_reads: l(&self.partial_reads),
            shared_pins: l(&self.shared_pins),
            scanned_idle: l(&self.scanned_idle),
            dirty_scans: l(&self.dirty_scans),
            deferred_refreshes: l(&self.deferred_refreshes),
            speculative_reads: l(&self.speculative_reads),
            void_speculations: l(&self.void_speculations),
        }
    }
}

/// Measures the time from its creation ([`Stats::timed`]) to its drop into
/// a counter of nanoseconds (nothing if times are not measured).
pub(crate) struct Timed<'a> {
    start: Option<std::time::Instant>,
    into: &'a AtomicU64,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let ns = start.elapsed().as_nanos() as u64;
            self.into.fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// Blocks a write fault makes writable ahead of the faulting one at most
/// ([`Space::write_ahead`]).
const WRITE_AHEAD: usize = 16;

/// Write faults in a row, each after another process's write, that pin a
/// block ([`Space::pin_if_write_shared`]): two rounds, so that data handed
/// on once is not pinned.
const SHARED_PIN_AFTER: u8 = 2;

/// Releases in a row that find a write-shared pinned block unchanged and
/// unpin it (`release::unpin_if_idle`): more than the phases between two
/// writes of a boundary block in the kernels (five in CG), few enough that
/// a block the program has stopped writing soon costs nothing again.
const SHARED_PIN_IDLE: u32 = 16;

#[inline]
fn bump_by(a: &AtomicUsize, n: usize) {
    a.fetch_add(n, Ordering::Relaxed);
}

#[inline]
fn bump(a: &AtomicUsize) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// A reusable word buffer of one block.
pub(crate) struct Tmp<'a> {
    buf: Vec<u64>,
    pool: &'a std::sync::Mutex<Vec<Vec<u64>>>,
}

impl Tmp<'_> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.buf.len() * 8;
        // SAFETY: a u64 buffer viewed as its bytes.
        unsafe { core::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), n) }
    }
}

impl Drop for Tmp<'_> {
    fn drop(&mut self) {
        let buf = core::mem::take(&mut self.buf);
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < 64 {
            p.push(buf);
        }
    }
}

/// The DSM of one process.
pub(crate) struct Space<C: Communicator, U: UltItf> {
    pub com: C,
    pub rank: usize,
    pub nprocs: usize,
    pub cfg: DsmConfig,
    segs: Box<[AtomicPtr<Segment<U>>]>,
    /// The address map (also serialises region creation).
    map: std::sync::Mutex<AddressMap>,
    /// The acquire timestamp (`min_wr_ts`): copies whose lease ends before
    /// it are stale.
    acq_ts: AtomicU64,
    read_set: Mutex<BinaryHeap<Reverse<(u64, usize)>>, U>,
    write_set: Mutex<Vec<usize>, U>,
    /// This process's release signature: its own write notices and every
    /// signature it acquired since the last barrier.
    pub(crate) rel_sig: Mutex<Signature, U>,
    /// Serialises release fences, and keeps their lists' buffers from one
    /// fence to the next (a barrier storm would otherwise allocate several
    /// per episode).
    release_lock: Mutex<release::ReleaseBufs, U>,
    /// Release fences this process has made (wrapping): the clock of the
    /// adaptive idle-release limit (see `fast_release`).
    release_count: AtomicU32,
    failed: AtomicBool,
    failure: std::sync::Mutex<Option<DsmError>>,
    bufs: std::sync::Mutex<Vec<Vec<u64>>>,
    /// Directory policy: this process's invalidation queue (window) and how
    /// far it was drained.
    inval_win: Option<WindowId>,
    inval_head: Mutex<u64, U>,
    sync: SyncState<U>,
    /// What of this process's call stacks can be live ([`live`]).
    stack_live: std::sync::OnceLock<StackLive>,
    /// The program writes DSM memory from one OS thread at a time (see
    /// [`Space::set_single_writer_thread`]).
    single_writer: AtomicBool,
    /// The kernel's record of writes to the application view, where it
    /// keeps one (see [`super::dirty`]).
    dirty: Option<DirtyTracker>,
    pub(crate) stats: Stats,
}

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    /// Collectively sets up the DSM on `com`.
    pub fn new(com: C, cfg: DsmConfig) -> DsmResult<Self> {
        let nprocs = com.size();
        cfg.validate(nprocs)?;
        super::images::check_same_layout(&com)?;
        layout::reserve()?;
        let inval_win = if cfg.invalidation == InvalidationPolicy::Directory {
            Some(com.create_window(INVAL_HEADER + INVAL_CAP * 16)?)
        } else {
            None
        };
        let cap = cfg.effective_wn_list_len();
        let sync = SyncState::new(&com, cap, cfg.max_mutexes)?;
        Ok(Space {
            sync,
            rank: com.rank(),
            nprocs,
            segs: (0..MAX_SEGMENTS)
                .map(|_| AtomicPtr::new(core::ptr::null_mut()))
                .collect(),
            map: std::sync::Mutex::new(AddressMap::default()),
            acq_ts: AtomicU64::new(0),
            read_set: Mutex::new_in(BinaryHeap::new()),
            write_set: Mutex::new_in(Vec::new()),
            rel_sig: Mutex::new_in(Signature::new(cap)),
            release_lock: Mutex::new_in(release::ReleaseBufs::default()),
            release_count: AtomicU32::new(0),
            failed: AtomicBool::new(false),
            failure: std::sync::Mutex::new(None),
            bufs: std::sync::Mutex::new(Vec::new()),
            inval_win,
            inval_head: Mutex::new_in(0),
            stack_live: std::sync::OnceLock::new(),
            single_writer: AtomicBool::new(false),
            dirty: if cfg.dirty_scan {
                DirtyTracker::open()
            } else {
                None
            },
            stats: Stats::new(cfg.print_stats),
            com,
            cfg,
        })
    }

    /// Whether the kernel keeps a record of writes for this process's
    /// dirty scans (see [`super::dirty`]).
    pub(crate) fn tracks_writes(&self) -> bool {
        self.dirty.is_some()
    }

    pub(crate) fn sync_state(&self) -> &SyncState<U> {
        &self.sync
    }

    /// Counters of this process.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    // ---------------------------------------------------------------
    // Failures

    /// The recorded failure, if the DSM has failed.
    pub fn check(&self) -> DsmResult<()> {
        if self.failed.load(Ordering::Acquire) {
            let f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            return Err(f.clone().unwrap_or_else(|| {
                DsmError::Misuse("the DSM failed earlier in this process".into())
            }));
        }
        Ok(())
    }

    /// [`Space::check`], then marks runtime code on this thread until the
    /// guard drops: the global allocator serves runtime code from the
    /// system allocator, even on a DSM stack.
    #[inline]
    pub fn enter(&self) -> DsmResult<RuntimeGuard> {
        self.check()?;
        Ok(RuntimeGuard::enter())
    }

    /// Records `e` as the DSM's failure (the first one wins) and returns it.
    pub fn fail(&self, e: DsmError) -> DsmError {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(e.clone());
        }
        self.failed.store(true, Ordering::Release);
        e
    }

    fn guard<T>(&self, r: DsmResult<T>) -> DsmResult<T> {
        r.map_err(|e| self.fail(e))
    }

    // ---------------------------------------------------------------
    // Segments

    /// Collectively creates the region `req`: its place is decided by the
    /// address map in every process and agreed on by all (an error in any
    /// process — `req` itself may be one — or processes that disagree fail
    /// the call in all of them, before any window exists); `init` gives its
    /// initial contents.
    pub fn create_region(&self, req: DsmResult<Request>, init: Init<'_>) -> DsmResult<Region> {
        let _rt = self.enter()?;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let placed = req.and_then(|r| map.place(r));
        // Agreement: (ok, fingerprint) from everybody.
        let mine = match &placed {
            Ok(r) => [1, r.fingerprint()],
            Err(_) => [0, 0],
        };
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        // A failed agreement (another process called another collective) is
        // the DSM's failure, as it is for the barrier it met: fail-stop.
        let all = self.guard(self.com.allgather(&bytes).map_err(DsmError::from))?;
        let region = placed?;
        for (rank, c) in all.chunks_exact(16).enumerate() {
            if c[..8] != 1u64.to_le_bytes() {
                return Err(DsmError::Misuse(format!(
                    "process {rank} could not place the {} of {} bytes (see its error)",
                    region.kind, region.size
                )));
            }
            if c[8..] != bytes[8..] {
                return Err(DsmError::Misuse(format!(
                    "processes disagree on the {} of {} bytes: process {rank} placed it \
                     differently from process {} (the same collective calls, with the same \
                     arguments, must be made in every process)",
                    region.kind, region.size, self.rank
                )));
            }
        }
        let seg = Segment::create(
            &self.com,
            region.id,
            region.base,
            region.size,
            region.block_size,
            |fresh| match init {
                Init::Zero => Ok(()),
                Init::Image(img) => fresh.copy_image(img),
                Init::FromRoot => {
                    super::memory::adopt::fill_from_root(&self.com, fresh, region.base)
                }
            },
        )?;
        let mut seg = seg;
        seg.keep = matches!(region.kind, RegionKind::Heap | RegionKind::Adopted);
        // Call stacks stay untracked: the runtime's frames below a thread's
        // program frames are rewritten at every call into it, so every
        // scan would report them, and releases skip those words anyway.
        seg.tracked = region.kind != RegionKind::Stacks
            && self
                .dirty
                .as_ref()
                .is_some_and(|d| d.track(region.base, region.size));
        self.segs[region.id].store(Box::into_raw(Box::new(seg)), Ordering::Release);
        map.commit(region)?;
        Ok(region)
    }

    /// The regions of the address map, in creation order.
    pub fn regions(&self) -> Vec<Region> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .regions()
            .to_vec()
    }

    /// The segment in slot `id`.
    fn seg(&self, id: usize) -> Option<&Segment<U>> {
        let p = self.segs.get(id)?.load(Ordering::Acquire);
        // SAFETY: published segments live until the space is dropped, and
        // `&self` borrows the space.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The segment and block index of `addr` (async-signal-safe).
    #[inline]
    pub fn locate(&self, addr: usize) -> Option<(&Segment<U>, usize)> {
        let id = match layout::slot_of(addr) {
            Some(id) => id,
            None => map::adopted_id(addr)?,
        };
        let seg = self.seg(id)?;
        seg.contains(addr).then(|| (seg, seg.index_of(addr)))
    }

    /// Whether `addr` is in a guard block of the stack region (its even
    /// blocks: every stack slot is preceded by one; async-signal-safe).
    #[inline]
    pub fn is_stack_guard(&self, addr: usize) -> bool {
        self.locate(addr)
            .is_some_and(|(seg, idx)| self.is_guard_block(seg, idx))
    }

    /// Whether block `idx` of `seg` lies in a stack's guard: the stack
    /// region holds, per stack, a guard of one stack's size, then the
    /// stack, each of `stack_size / block_size` blocks.
    #[inline]
    pub fn is_guard_block(&self, seg: &Segment<U>, idx: usize) -> bool {
        let per_stack = (self.cfg.stack_size / seg.block_size).max(1);
        Some(seg.id) == RegionKind::Stacks.fixed_id() && idx % (2 * per_stack) < per_stack
    }

    /// Block size of the segment holding `addr`.
    pub fn block_size_at(&self, addr: usize) -> Option<usize> {
        self.locate(addr).map(|(s, _)| s.block_size)
    }

    fn tmp(&self, block_size: usize) -> Tmp<'_> {
        let words = block_size / 8;
        let mut buf = self
            .bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        buf.resize(words, 0);
        Tmp {
            buf,
            pool: &self.bufs,
        }
    }

    fn block_tag(seg: &Segment<U>, idx: usize) -> Tag {
        DSM_TAG_BIT | ((seg.id as Tag) << 24) | idx as Tag
    }

    fn block_site(&self, seg: &Segment<U>, idx: usize) -> LockSite {
        LockSite {
            win: seg.meta_win,
            word_off: seg.meta_off(idx),
            init_owner: (seg.id + idx) % self.nprocs,
            tag: Self::block_tag(seg, idx),
        }
    }

    /// The fixed home of a block (block-cyclic).
    fn fixed_home(&self, seg: &Segment<U>, idx: usize) -> usize {
        (seg.id + idx) % self.nprocs
    }

    /// Whether this process is the fixed home of the block (its copy is then
    /// the master copy, never stale).
    fn is_fixed_home(&self, seg: &Segment<U>, idx: usize) -> bool {
        self.cfg.writer == WriterPolicy::Fixed && self.fixed_home(seg, idx) == self.rank
    }

    fn protect(&self, seg: &Segment<U>, idx: usize, state: BlockState) -> DsmResult<()> {
        layout::protect(seg.app(idx), seg.block_size, state.prot())
    }

    fn race_report(
        &self,
        seg: &Segment<U>,
        idx: usize,
        r: diff::Race,
        remote_rank: usize,
    ) -> RaceReport {
        let addr = seg.app(idx) + r.offset;
        RaceReport {
            addr,
            block: seg.app(idx),
            segment: seg.id,
            base: r.base,
            local: r.local,
            remote: r.remote,
            local_rank: self.rank,
            remote_rank,
            what: super::race::describe(addr),
        }
    }

    fn race(&self, seg: &Segment<U>, idx: usize, r: diff::Race, remote_rank: usize) -> DsmError {
        self.race_report(seg, idx, r, remote_rank).into()
    }

    /// Runs `merge` of our copy `data` (base `twin`) with `other`, the
    /// version of process `remote_rank`, under the configured race
    /// detection and action: a race stops the DSM, or (with
    /// [`RaceAction::Report`]) each racing word is reported once and keeps
    /// our value.
    pub(super) fn merge_checked(
        &self,
        seg: &Segment<U>,
        idx: usize,
        remote_rank: usize,
        (data, twin, other): (&mut [u64], &mut [u64], &[u64]),
        merge: diff::MergeFn,
    ) -> DsmResult<diff::Merged> {
        let detect = self.cfg.race_detection;
        if detect && self.cfg.on_race == RaceAction::Report {
            if let Some((fixed, races)) = diff::keep_ours(data, twin, other) {
                for r in races {
                    // A failed claim (a dead peer) reports anyway.
                    super::race::report_once(
                        seg.app(idx) + r.offset,
                        || self.race_report(seg, idx, r, remote_rank),
                        |w| self.claim_race_report(w).unwrap_or(true),
                    );
                }
                return Ok(merge(data, twin, &fixed, false).expect("merges without detection"));
            }
            return Ok(merge(data, twin, other, false).expect("merges without detection"));
        }
        merge(data, twin, other, detect).map_err(|r| self.race(seg, idx, r, remote_rank))
    }

    // ---------------------------------------------------------------
    // Faults

    /// Resolves an access to `addr`.
    pub fn resolve(&self, addr: usize, write: bool) -> DsmResult<()> {
        let _rt = self.enter()?;
        let _t = self.stats.timed(&self.stats.fault_ns);
        let (seg, idx) = self.locate(addr).ok_or_else(|| {
            DsmError::InvalidArgument(format!("{addr:#x} is not in a DSM segment"))
        })?;
        if write {
            bump(&self.stats.write_faults);
            self.start_write(seg, idx)
        } else {
            bump(&self.stats.read_faults);
            self.start_read(seg, idx, addr)
        }
    }

    /// Makes block `idx` readable at `addr` (an address inside it): the
    /// whole block, or only the page of `addr` (a partial read, see
    /// [`Space::partial_read_applies`]).
    pub fn start_read(&self, seg: &Segment<U>, idx: usize, addr: usize) -> DsmResult<()> {
        let mut m = seg.entry(idx).lock();
        if m.state == BlockState::PinnedStale {
            // A miss like any other for sequential prefetch: the blocks
            // after the merged run are fetched as they would be after it.
            let r = self.refresh_stale_run(seg, idx, m).and_then(|n| {
                let cap = self.prefetch_cap(seg);
                if cap == 0 {
                    return Ok(());
                }
                let first = PREFETCH_FIRST_BYTES / seg.block_size;
                let ahead = seg.seq.on_miss(idx, first, cap, seg.nblocks - idx - 1);
                if ahead >= n {
                    self.prefetch(seg, idx + n - 1, ahead + 1 - n, None)
                } else {
                    Ok(())
                }
            });
            return self.guard(r);
        }
        let page = (addr - seg.app(idx)) / crate::sys::page_size();
        let mut hot = false;
        // Whether this miss completes a partial copy past its page.
        let mut onward = false;
        if m.state.readable() {
            // (Only blocks of at most 64 pages are ever partial.)
            if m.missing == 0 || m.missing & (1 << page) == 0 {
                return Ok(());
            }
            // A page a partial read did not fetch: the whole block is read
            // anew (the pages we hold may be of an older version by now).
            onward = page > m.missing.trailing_ones() as usize;
            m.forget_partial();
        } else if m.dropped {
            // Read again after an acquire dropped it: hot.
            m.dropped = false;
            m.refreshes = self.cfg.refreshes;
            hot = m.refreshes > 0;
        }
        let cap = self.prefetch_cap(seg);
        let ahead = if cap > 0 {
            let first = PREFETCH_FIRST_BYTES / seg.block_size;
            let room = seg.nblocks - idx - 1;
            if onward {
                // A read moving on through the block: the next block comes
                // with it (the run's first step; a miss after it continues
                // the run).
                seg.seq.on_onward_miss(idx, cap, room)
            } else {
                seg.seq.on_miss(idx, first, cap, room)
            }
        } else {
            0
        };
        // A clean copy to replace under the floating policy, with blocks to
        // fetch ahead: the block goes with them through the batched path —
        // its lock and LAD with theirs in one round trip, its data with
        // theirs in one read per run. (Alone, the plain transaction costs
        // as many round trips and less bookkeeping.)
        if ahead > 0
            && m.state == BlockState::InvalidClean
            && m.missing == 0
            && self.cfg.writer == WriterPolicy::Floating
            && self.miss_needs_transaction(seg, idx, &m)
        {
            let r = self.prefetch(seg, idx, ahead, Some(m));
            return self.guard(r);
        }
        if ahead == 0 && !hot && self.partial_read_applies(seg, idx, &m) {
            let r = self.transaction(seg, idx, &mut m, TxKind::ReadPage(page));
            return self.guard(r.map(drop));
        }
        let r = self.read_upgrade(seg, idx, &mut m, false);
        drop(m);
        self.guard(r)?;
        if ahead > 0 {
            let r = self.prefetch(seg, idx, ahead, None);
            self.guard(r)?;
        }
        Ok(())
    }

    /// Whether a read miss on block `idx` (its entry lock held) fetches only
    /// the page it touched (`DsmConfig::partial_reads`): a clean, invalid
    /// block of two to
    /// [`PARTIAL_MAX_PAGES`] pages, outside the call stacks (pinned while
    /// used), whose miss takes the block's lock anyway (a transaction; the
    /// other misses re-read a copy we hold or a version a notice named) and
    /// was not told to re-read the whole block (`force_tx`: the miss that
    /// completes a partial copy, memory that changed hands). A hot block
    /// (see [`DsmConfig::refreshes`](crate::dsm::DsmConfig)) is read whole:
    /// acquires refresh whole copies.
    fn partial_read_applies(&self, seg: &Segment<U>, idx: usize, m: &BlockMeta) -> bool {
        let pages = seg.block_size / crate::sys::page_size();
        self.cfg.partial_reads
            && (2..=PARTIAL_MAX_PAGES).contains(&pages)
            && m.state == BlockState::InvalidClean
            && !m.force_tx
            && Some(seg.id) != RegionKind::Stacks.fixed_id()
            && self.miss_needs_transaction(seg, idx, m)
    }

    /// Blocks a sequential miss in `seg` may fetch ahead (0: none).
    fn prefetch_cap(&self, seg: &Segment<U>) -> usize {
        // Call stacks are pinned while used, and their guards never valid.
        if Some(seg.id) == RegionKind::Stacks.fixed_id() {
            return 0;
        }
        self.cfg.prefetch_blocks(seg.block_size)
    }

    /// Sequential prefetch: reads blocks `idx + 1 ..= idx + ahead` as read
    /// misses would (a read transaction each: the latest version merged
    /// with our pending changes if the block has any, its lease from the
    /// block's lock-associated data, listed in the read set — so an acquire
    /// drops a prefetched copy exactly as it drops any other; the clean ones
    /// together: their locks tried at once, then taken in ascending order
    /// from the first busy one, and one read per run held by the same
    /// process, see `prefetch_clean`; stale pins merged in place, together,
    /// see `merge_pinned`), then makes them readable (the pins read-write
    /// again) with one `mprotect` per contiguous run of one protection.
    /// Readable blocks are passed over; the scan stops at the first busy
    /// entry (another thread is resolving that block). The entries stay
    /// locked until the protection is set, so an invalidation cannot come
    /// in between.
    ///
    /// With `demand` (the missed block's own entry, clean and invalid), the
    /// missed block is read in the same batch, first.
    fn prefetch<'s>(
        &self,
        seg: &'s Segment<U>,
        idx: usize,
        ahead: usize,
        demand: Option<MutexGuard<'s, BlockMeta, U>>,
    ) -> DsmResult<()> {
        let mut held = Vec::with_capacity(ahead + 1);
        let demanded = demand.is_some();
        if let Some(m) = demand {
            held.push((idx, m));
        }
        let mut scanned = 0;
        for j in idx + 1..=idx + ahead {
            let Some(m) = seg.entry(j).try_lock() else {
                break;
            };
            // A partial copy is read whole by its own next miss.
            if m.missing != 0 {
                break;
            }
            scanned += 1;
            // Already here (a fixed home's own block, an earlier read).
            if !m.state.readable() {
                held.push((j, m));
            }
        }
        if scanned < ahead {
            seg.seq.cut(idx, scanned);
        }
        let mut clean = Vec::with_capacity(held.len());
        let mut stale = Vec::new();
        for (j, m) in held.iter_mut() {
            if m.state == BlockState::PinnedStale {
                // A stale pin is merged in place, and pinned again.
                stale.push((*j, &mut **m));
                continue;
            }
            let m: &mut BlockMeta = m;
            if self.is_fixed_home(seg, *j) {
                // The master copy is here and always current (pending
                // changes of ours stay pending).
                m.state = if m.state.dirty() {
                    BlockState::ReadonlyDirty
                } else {
                    BlockState::ReadonlyClean
                };
                self.add_to_read_set(seg, *j, m);
            } else if m.state.dirty() {
                // Merged as a read miss would (an error fails the DSM; the
                // caller records it).
                self.transaction(seg, *j, m, TxKind::Prefetch)?;
            } else {
                clean.push((*j, m));
            }
        }
        if !clean.is_empty() {
            self.prefetch_clean(seg, &mut clean)?;
        }
        drop(clean);
        self.merge_pinned(seg, &mut stale, TxKind::StaleRefresh)?;
        drop(stale);
        self.stats
            .prefetched
            .fetch_add(held.len() - usize::from(demanded), Ordering::Relaxed);
        // One `mprotect` per contiguous run of one protection.
        let mut k = 0;
        while k < held.len() {
            let prot = held[k].1.state.prot();
            let mut n = 1;
            while k + n < held.len()
                && held[k + n].0 == held[k].0 + n
                && held[k + n].1.state.prot() == prot
            {
                n += 1;
            }
            layout::protect(seg.app(held[k].0), n * seg.block_size, prot)?;
            k += n;
        }
        drop(held);
        Ok(())
    }

    /// Makes block `idx` writable.
    pub fn start_write(&self, seg: &Segment<U>, idx: usize) -> DsmResult<()> {
        let mut m = seg.entry(idx).lock();
        if m.state == BlockState::PinnedStale {
            let r = self.refresh_stale_run(seg, idx, m).map(drop);
            return self.guard(r);
        }
        let ahead = m.state == BlockState::ReadonlyClean && m.written_last;
        let contended = core::mem::take(&mut m.remote_write_seen);
        m.contended_writes = if contended {
            m.contended_writes.saturating_add(1)
        } else {
            0
        };
        let r = self.write_upgrade(seg, idx, &mut m);
        if r.is_ok() {
            self.pin_if_write_shared(seg, &mut m);
        }
        drop(m);
        let r = r.and_then(|()| {
            if ahead {
                self.write_ahead(seg, idx)
            } else {
                Ok(())
            }
        });
        self.guard(r)
    }

    /// Write-ahead: after a write fault on a clean copy of a block we were
    /// the last writer of, the blocks after it that are the same — our own
    /// part of an array that an OpenMP loop rewrites phase after phase —
    /// become writable too, with one `mprotect` for the run, instead of one
    /// fault each. A block made writable and then not written costs a
    /// comparison with its twin at the next releases (an idle release) and
    /// is protected again after a few.
    fn write_ahead(&self, seg: &Segment<U>, idx: usize) -> DsmResult<()> {
        let end = (idx + 1 + WRITE_AHEAD).min(seg.nblocks);
        let mut run = Vec::new();
        for j in idx + 1..end {
            // Entries are taken in ascending order, and never waited for.
            let Some(m) = seg.entry(j).try_lock() else {
                break;
            };
            if m.state != BlockState::ReadonlyClean
                || !m.written_last
                || m.pins > 0
                || m.missing != 0
            {
                break;
            }
            run.push(m);
        }
        if run.is_empty() {
            return Ok(());
        }
        let bs = seg.block_size;
        for (k, m) in run.iter_mut().enumerate() {
            let j = idx + 1 + k;
            // SAFETY: as in `write_upgrade`: the application view of block
            // `j` is read-only until the `protect` below, so no thread of
            // ours writes its system view meanwhile, and we hold its entry
            // lock.
            unsafe { diff::copy_to_twin(seg.sys(j).cast(), seg.twin_of(j).cast(), bs / 8) };
            m.twin_wr = self.clean_copy_version(m);
            m.armed = seg.tracked;
            m.state = BlockState::Writable;
            m.idle_releases = 0;
            self.note_rewrite(m);
            self.add_to_write_set(seg, j, m);
        }
        bump_by(&self.stats.written_ahead, run.len());
        layout::protect(
            seg.app(idx + 1),
            bs * run.len(),
            BlockState::Writable.prot(),
        )
    }

    /// Pinning of write-shared blocks (`DsmConfig::pin_shared`): a block
    /// just made writable by the [`SHARED_PIN_AFTER`]th write fault in a
    /// row that followed another process's write is pinned. The processes
    /// write it in turn — two halves of an array meet in it, or a phase
    /// hands it on to the next — and each round cost a write fault, a
    /// protection before the release's merge, and a drop or refresh at the
    /// acquire with its protection changes (CG's boundary blocks: a fifth
    /// of its time on two processes). Pinned, it stays writable: a release
    /// merges it in place, an acquire that finds it stale merges the new
    /// version in place, both with per-word atomic merges that never lose a
    /// store of this process's threads (plain stores when the program
    /// writes from the merging thread only, see
    /// [`Space::set_single_writer_thread`]). Releases that
    /// find it unchanged [`SHARED_PIN_IDLE`] times in a row unpin it
    /// (see `Space::release_locked`).
    ///
    /// Not for call stacks (pinned while used anyway) nor blocks pinned by
    /// [`Space::pin`]; only under the floating writer policy (the fixed
    /// home's in-place merge is not atomic) and timestamp-based
    /// invalidation (under the directory policy every invalidation of a
    /// pinned copy would cost a transaction).
    fn pin_if_write_shared(&self, seg: &Segment<U>, m: &mut BlockMeta) {
        if m.contended_writes < SHARED_PIN_AFTER
            || m.state != BlockState::Writable
            || m.pins > 0
            || !self.cfg.pin_shared
            || self.cfg.writer != WriterPolicy::Floating
            || self.cfg.invalidation == InvalidationPolicy::Directory
            || Some(seg.id) == RegionKind::Stacks.fixed_id()
        {
            return;
        }
        m.state = BlockState::Pinned;
        m.shared_pin = true;
        m.idle_releases = 0;
        m.eager_refreshes = acquire::EAGER_REFRESHES;
        m.eager_spells = 0;
        bump(&self.stats.shared_pins);
    }

    fn write_upgrade(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) -> DsmResult<()> {
        if m.state.writable() {
            return Ok(());
        }
        if m.state == BlockState::PinnedStale {
            // (Pinned again, read-write.)
            return self
                .transaction(seg, idx, m, TxKind::PinnedRefresh)
                .map(drop);
        }
        if m.missing != 0 {
            // A partial copy: the whole block is read first (anew, as a
            // miss on one of its missing pages would).
            m.forget_partial();
        }
        if !m.state.readable() {
            self.read_upgrade(seg, idx, m, true)?;
            if m.state.writable() {
                return Ok(());
            }
        }
        self.note_rewrite(m);
        if m.state == BlockState::ReadonlyClean {
            // The twin becomes the base version of our writes.
            // SAFETY: both are this process's copies of the block; the
            // application view is read-only, so no thread of ours writes the
            // system view meanwhile, and our twin writes happen under the
            // block's entry lock. Other processes read the twin (under the
            // global lock) while we are the last writer — and then a clean
            // copy equals its twin, so they read the same bytes whenever
            // they read — and an atomic run at our copy writes both, copy
            // first (the case `copy_to_twin` settles).
            unsafe {
                diff::copy_to_twin(
                    seg.sys(idx).cast(),
                    seg.twin_of(idx).cast(),
                    seg.block_size / 8,
                )
            };
            m.twin_wr = self.clean_copy_version(m);
            // (Equal now: see `BlockMeta::armed`.)
            m.armed = seg.tracked;
        }
        m.state = BlockState::Writable;
        self.add_to_write_set(seg, idx, m);
        self.protect(seg, idx, m.state)
    }

    /// The version a clean copy about to become the twin holds, for
    /// `BlockMeta::twin_wr`: the one its last transaction or release left
    /// (`cur_wr`). An atomic that changed the copy since made a newer
    /// version, which the LAD names instead, so a stale answer only ever
    /// fails to match. Under fast read a clean copy may be another
    /// process's working copy, which is no version at all: not known.
    fn clean_copy_version(&self, m: &BlockMeta) -> u64 {
        if self.cfg.fast_read_active() {
            0
        } else {
            m.cur_wr
        }
    }

    fn add_to_write_set(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) {
        if !m.in_write_set {
            m.in_write_set = true;
            self.write_set.lock().push(seg.app(idx));
        }
    }

    /// Lists a readable block in the read set (once): ordered by lease end
    /// for self-invalidation (under the directory policy it only serves to
    /// find every readable block when an invalidation queue overflowed).
    fn add_to_read_set(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) {
        if !m.in_read_set {
            m.in_read_set = true;
            self.read_set.lock().push(Reverse((m.cur_rd, seg.app(idx))));
        }
    }

    /// Whether a read miss on block `idx` (invalid) needs a transaction:
    /// unless the master copy is here (a fixed home), or the block's lease
    /// is still valid and our copy — or, under fast read, the version its
    /// write notice named — is the latest. A copy a partial read left
    /// incomplete always needs one.
    fn miss_needs_transaction(&self, seg: &Segment<U>, idx: usize, m: &BlockMeta) -> bool {
        if self.is_fixed_home(seg, idx) {
            return false;
        }
        if m.force_tx || m.missing != 0 {
            return true;
        }
        match self.cfg.invalidation {
            InvalidationPolicy::Directory => true,
            _ => {
                let lease_valid = m.cur_rd >= self.acq_ts.load(Ordering::Acquire);
                let home = m.home as usize;
                !(lease_valid
                    && (home == 0 || home - 1 == self.rank || self.cfg.fast_read_active()))
            }
        }
    }

    /// Makes an invalid block readable. With `for_write` the caller makes it
    /// writable right after, so the application view's protection is left
    /// to it (one `mprotect` instead of two).
    fn read_upgrade(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        for_write: bool,
    ) -> DsmResult<()> {
        debug_assert!(!m.state.readable() && m.state != BlockState::PinnedStale);
        let dirty = m.state == BlockState::InvalidDirty;
        if self.miss_needs_transaction(seg, idx, m) {
            self.transaction(seg, idx, m, TxKind::Read)?;
            return Ok(());
        }
        let home = m.home as usize;
        if home != 0 && home - 1 != self.rank && !self.is_fixed_home(seg, idx) {
            // Fast read: one read of the version the write notice named.
            let src = home - 1;
            let mut tmp = self.tmp(seg.block_size);
            self.com
                .read(seg.data_win.at(src, seg.offset(idx)), tmp.bytes_mut())?;
            self.stats
                .bytes_fetched
                .fetch_add(seg.block_size, Ordering::Relaxed);
            bump(&self.stats.fast_reads);
            // SAFETY: the block is invalid (application view inaccessible),
            // so only we touch our system view and twin, under the block's
            // entry lock.
            let (data, twin) = unsafe {
                (
                    diff::words_mut(seg.sys(idx), seg.block_size),
                    diff::words_mut(seg.twin_of(idx), seg.block_size),
                )
            };
            if dirty {
                self.merge_checked(seg, idx, src, (data, twin, &tmp.buf), diff::read_merge)?;
            } else {
                data.copy_from_slice(&tmp.buf);
            }
            // Another process's working copy, not a version a LAD names.
            m.twin_wr = 0;
        }
        m.state = if dirty {
            BlockState::ReadonlyDirty
        } else {
            BlockState::ReadonlyClean
        };
        self.add_to_read_set(seg, idx, m);
        if for_write {
            return Ok(());
        }
        self.protect(seg, idx, m.state)
    }

    // ---------------------------------------------------------------
    // Pinning and atomics

    /// Pins the blocks of `[addr, addr + len)`: read-write and never
    /// protected until unpinned as many times as they were pinned.
    pub fn pin(&self, addr: usize, len: usize) -> DsmResult<()> {
        let _rt = self.enter()?;
        self.for_blocks(addr, len, |seg, idx| {
            let mut m = seg.entry(idx).lock();
            if m.state != BlockState::Pinned {
                self.write_upgrade(seg, idx, &mut m)?;
                m.state = BlockState::Pinned;
            }
            m.pins += 1;
            Ok(())
        })
    }

    /// Unpins the blocks of `[addr, addr + len)`: once every pin is undone
    /// they become writable blocks that the next release fence releases.
    pub fn unpin(&self, addr: usize, len: usize) -> DsmResult<()> {
        let _rt = self.enter()?;
        self.for_blocks(addr, len, |seg, idx| {
            let mut m = seg.entry(idx).lock();
            m.pins = m.pins.saturating_sub(1);
            if m.pins == 0 && m.state == BlockState::Pinned {
                m.state = BlockState::Writable;
                m.shared_pin = false;
                self.add_to_write_set(seg, idx, &mut m);
            }
            Ok(())
        })
    }

    /// Records whether the program's code runs on one OS thread of this
    /// process at a time — the one that calls into the DSM, so that no
    /// store of the program can land while the DSM merges (see
    /// `Dsm::set_single_writer_thread`).
    pub fn set_single_writer_thread(&self, on: bool) {
        self.single_writer.store(on, Ordering::SeqCst);
    }

    /// Whether a merge into block `m`'s copy, which the application may
    /// write (pinned), can use plain stores: a write-shared pin (never a
    /// call stack, whose merging thread's own frames live in it) while the
    /// program writes from the merging thread only.
    pub(super) fn merges_alone(&self, m: &BlockMeta) -> bool {
        m.shared_pin && self.single_writer.load(Ordering::Relaxed)
    }

    /// Tracks which parts of the call stacks of `slots` (this process's
    /// share) can be live, so that releases skip the dead ones.
    pub(crate) fn register_stacks(&self, slots: &crate::dsm::memory::SlotRegion) {
        if let Some(l) = StackLive::new(slots) {
            let _ = self.stack_live.set(l);
        }
    }

    /// Records that the thread running on the stack holding `addr` is in
    /// the runtime and its program's frames end at `floor`, or higher if an
    /// outer entry into the runtime said so; returns the mark before, for
    /// [`Space::restore_stack_floor`].
    pub(crate) fn raise_stack_floor(&self, addr: usize, floor: usize) -> usize {
        self.stack_live
            .get()
            .map_or(0, |l| l.raise_floor(addr, floor))
    }

    /// Puts back the mark [`Space::raise_stack_floor`] returned (0: back in
    /// the program).
    pub(crate) fn restore_stack_floor(&self, addr: usize, prev: usize) {
        if let Some(l) = self.stack_live.get() {
            l.restore_floor(addr, prev);
        }
    }

    /// Records that nothing of the stack holding `addr` below `low` is live
    /// (`usize::MAX`: nothing at all, 0: everything).
    pub(crate) fn set_stack_low(&self, addr: usize, low: usize) {
        if let Some(l) = self.stack_live.get() {
            l.set_low(addr, low);
        }
    }

    /// State of the block holding `addr` (tests and diagnostics).
    pub fn state_of(&self, addr: usize) -> Option<BlockState> {
        let (seg, idx) = self.locate(addr)?;
        Some(seg.entry(idx).lock().state)
    }

    pub(super) fn for_blocks(
        &self,
        addr: usize,
        len: usize,
        mut f: impl FnMut(&Segment<U>, usize) -> DsmResult<()>,
    ) -> DsmResult<()> {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| DsmError::InvalidArgument("range overflows".into()))?;
        let mut a = addr;
        while a < end {
            let (seg, idx) = self.locate(a).ok_or_else(|| {
                DsmError::InvalidArgument(format!("{a:#x} is not in a DSM segment"))
            })?;
            let r = f(seg, idx);
            self.guard(r)?;
            a = seg.app(idx) + seg.block_size;
        }
        Ok(())
    }

    /// Applies `op` to the aligned word at `addr` inside a transaction on
    /// its block; returns the old value.
    pub fn atomic_in_block(&self, addr: usize, op: AtomicOp) -> DsmResult<u64> {
        let _rt = self.enter()?;
        if !addr.is_multiple_of(8) {
            return Err(DsmError::InvalidArgument(format!(
                "DSM atomic at {addr:#x} is not 8-byte aligned"
            )));
        }
        let (seg, idx) = self.locate(addr).ok_or_else(|| {
            DsmError::InvalidArgument(format!("{addr:#x} is not in a DSM segment"))
        })?;
        let mut m = seg.entry(idx).lock();
        let at = addr - seg.app(idx);
        let at_home = self.cfg.writer == WriterPolicy::Floating
            && self.cfg.invalidation != InvalidationPolicy::Directory
            && !m.force_tx;
        let r = if at_home {
            self.atomic_at_home(seg, idx, &mut m, at, op)
        } else {
            Ok(None)
        };
        let r = match r {
            Ok(Some(old)) => Ok(old),
            Ok(None) => self.transaction(seg, idx, &mut m, TxKind::Atomic(at, op)),
            Err(e) => Err(e),
        };
        self.guard(r)
    }
}

impl<C: Communicator, U: UltItf> Drop for Space<C, U> {
    fn drop(&mut self) {
        for s in self.segs.iter() {
            let p = s.swap(core::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: every published segment came from Box::into_raw in
                // `create_segment`; we own the space exclusively here.
                let seg = unsafe { Box::from_raw(p) };
                seg.retire();
            }
        }
        map::clear_adopted();
    }
}
