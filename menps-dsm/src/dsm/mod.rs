//! The MENPS page-based distributed shared memory (Endo 2020 ch. 3).
//!
//! Every process maps the same DSM address range; what one process writes
//! there, another reads after synchronising with it — a barrier, a DSM
//! mutex, or an atomic with release/acquire semantics — as in any
//! data-race-free shared-memory program (release consistency). Coherence
//! works per *block* (a power of two, 4 KiB .. 1 MiB, chosen per segment)
//! with page protection: a block this process may not read or write is
//! protected, and the access faults into the DSM, which fetches or upgrades
//! the block and lets the access continue.
//!
//! # The protocol
//!
//! - **Floating home** (default): a block's data lives at the process that
//!   released it last. A release with changes takes the block's distributed
//!   queue lock, which finds the last releaser through probable-owner links
//!   and carries the block's timestamps (its *lock-associated data*); it
//!   reads the version that process published — its twin, which a release
//!   updates under the lock, not its live copy, which may be in the middle
//!   of a rewrite — applies its own changes with an XOR diff (detecting
//!   write-write races at byte granularity), and becomes the home; the old
//!   home's later diffs hold only its unpublished writes. (The original
//!   read the live copy and wrote what it took back into the old home's
//!   twin: a reader could keep a half-rewritten state that no notice ever
//!   replaced, once the writer's rewrite ended on the values it had
//!   published.) The **fixed home** policy (block-cyclic homes, changed
//!   runs written to the home) is there for comparison.
//! - **Hybrid invalidation** (default): every version of a block has a
//!   logical interval `[wr_ts, rd_ts]`; releases add *write notices* to the
//!   releaser's signature, a bounded list whose truncation raises a minimum
//!   write timestamp. An acquirer drops the copies that a notice or the
//!   minimum write timestamp makes stale, and can re-read an invalidated
//!   block straight from the notice's writer (**fast read**, off by default:
//!   see [`DsmConfig::fast_read`]). The `timestamp`
//!   (leases only) and `directory` (sharer sets with posted invalidations)
//!   policies are there for comparison.
//! - **Fast release**: a block that has not migrated since this process's
//!   last transaction (its queue-lock word still says so) is released
//!   without a message (the lock is taken and given back here); its write
//!   notice carries a fresh interval (the original published the previous
//!   one on some paths, a stale-read hole this implementation closes). Its
//!   twin becomes the released version, so
//!   a later release that finds the block unchanged (an OpenMP array
//!   written in one phase, released at every barrier of the others) is
//!   *idle*: it announces nothing, and readers keep their copies; a block
//!   idle at several releases in a row is protected and leaves the write
//!   set (how many adapts per block: a block written again soon after it
//!   was protected stays listed longer next time, and one that still is at
//!   the longest limit, because its program keeps storing values it
//!   already holds as a converged vector's update does, stays listed until
//!   it has been idle for 255 releases). Idle too is the release of a
//!   writable block another process wrote last, unchanged since we took
//!   it (the program stored the values it held): no transaction, since there is nothing to merge (not under fast
//!   read); and so is a release of an unchanged block whose lock has moved
//!   on. A block another process wrote last is also released without a
//!   transaction if our last transaction took its latest version into the
//!   twin (a miss, or the refresh of a block the processes write in turn)
//!   and its lock has stayed here since: that version is still the latest,
//!   and our changes on top of it are published as the next one (counted
//!   as `taken_releases`). A release goes through its blocks in address
//!   order, so that neighbouring blocks that go idle together (an array's)
//!   are protected with one `mprotect`; likewise the copies an acquire
//!   drops.
//! - **Two-way merging**: invalidating a block with local changes keeps them
//!   (`InvalidDirty`) and merges them at the next release.
//! - **Sequential prefetch** (`MENPS_DSM_PREFETCH`, on by default): a read
//!   miss that continues a run of misses in its segment also fetches the
//!   invalid blocks after it — 256 KiB (at least a block, at most the cap)
//!   at the first continuation, then a window that doubles along the run up
//!   to its cap, reset by a miss elsewhere — except a miss where the last run
//!   that continued began (an array read again after a barrier dropped it),
//!   which resumes that run at 256 KiB at once. Each is fetched by the read
//!   transaction a miss would run (the latest version, its lease, a place
//!   in the read set), so an acquire drops a prefetched copy like any
//!   other; their locks are tried all at once and the runs read together
//!   (across hosts, a round trip for each step rather than for each
//!   block), and the run is then made readable with one `mprotect`.
//! - **Speculative reads**: a fetch of a block's latest version under its
//!   lock — a read miss, a prefetch window, the refresh of hot blocks, the
//!   merges of write-shared pins — whose lock is tried at the process that
//!   a write notice named the block's last writer sends the read of the
//!   data with that compare-and-swap, performed after it (one read per run
//!   of contiguous blocks): if the swap took the lock and the
//!   lock-associated data confirms the last writer (a reader's usual case:
//!   the writer took the lock back when it released), the lock, its data
//!   and the block arrive in one round trip instead of two; otherwise the
//!   read is void and the block is read again from the last writer. A
//!   lock held by another reader is not tried with a read. A miss reads
//!   straight into its invalid copy (which is then never the latest
//!   version); the others read into a buffer. `MENPS_STATS` counts both
//!   outcomes (`speculative_reads`, `void_speculations`).
//! - **Partial reads** (`MENPS_DSM_PARTIAL_READ`, on by default): a read
//!   miss that starts no sequential run, on a clean block larger than a
//!   page (up to 64 pages), fetches only the page it touched, under the
//!   block's lock as any read miss; the copy is readable on that page only.
//!   A miss on another page of it fetches the whole block anew (one
//!   version and one lease for all of it, never pages of two versions), and
//!   so does a write, a pin or an atomic on it. A 4 KiB read of a 32 KiB
//!   block moves 4 KiB; a scan pays one extra miss at the start of its run.
//! - **Dirty scans** (`MENPS_DSM_DIRTY_SCAN`, on by default where the kernel
//!   allows): a release fence must tell which listed blocks the program
//!   changed since it last released them. Instead of comparing each with
//!   its twin (a read of the whole block, for most blocks of an OpenMP
//!   program idle at most barriers), it asks the kernel: the application
//!   views are registered with a `userfaultfd` for asynchronous write
//!   protection (Linux 6.7 and later), which notes a write to a protected
//!   page in the page table without a signal, and one `PAGEMAP_SCAN` ioctl
//!   per run of listed blocks reports the pages written since the last scan
//!   and protects them again. A block none of whose pages was written, and
//!   whose copy equalled its twin after its pages were last protected, is
//!   idle without a comparison. Writes through the DSM's own view are not
//!   noted, so a block the protocol itself changed is compared once more;
//!   call stacks are always compared. Without the kernel feature, releases
//!   compare. So does a fence whose listed blocks total less than
//!   `MENPS_DSM_DIRTY_SCAN_MIN` (1 MiB by default): such a write set is in
//!   the cache, where comparing costs less than the scan's system call and
//!   the fault that each page it protected again takes at its next write
//!   (an ADI-style solver rewriting a few small arrays between barriers
//!   took a fault on nearly every page at every barrier).
//! - **Refresh of hot blocks** (`MENPS_DSM_REFRESH`, on by default): a block
//!   that an acquire dropped and the program then read again — one
//!   process's part of an array the others read after every barrier, the
//!   master thread's frame in an OpenMP region — is *hot*. The next few
//!   acquires that find its copy stale (8 by default) fetch the new version
//!   into it instead of dropping it: per segment in batches of up to 1 MiB,
//!   as a prefetch (the read transaction's lock, lease and read-set entry), the
//!   copy staying readable, so the program's next read neither faults nor
//!   waits and no `mprotect` is made. Then the copy is dropped once, to
//!   test whether it is still read: a block the program stopped reading
//!   costs at most that many useless fetches.
//! - **Pinning of write-shared blocks** (`MENPS_DSM_PIN_SHARED`, on by
//!   default; floating writer, hybrid or timestamp invalidation): a block
//!   that this process writes again, twice in a row after another process
//!   wrote it — where two processes' halves of an array meet, or data that
//!   phases hand on — is pinned like a running thread's stack: it stays
//!   writable, a release merges it in place and an acquire that finds it
//!   stale merges the new version in place, which saves a write fault and
//!   three to four `mprotect` calls per round. Merges into a pinned copy
//!   are atomic per word, or plain and vectorized when the language
//!   runtime says that the program writes from one OS thread only
//!   ([`Dsm::set_single_writer_thread`]). A release that finds a pinned
//!   copy unchanged since this process last published or merged it
//!   announces nothing, whoever wrote the block last (a transaction reads
//!   what the last writer published, never its copy in the middle of a
//!   rewrite); releases that find it unchanged 16 times in a row unpin
//!   it. A pinned copy that the acquires
//!   find stale again and again before this process touches it (an ADI
//!   solver's phases: the other process rewrites its half of an array
//!   three times between two reads of ours) is not merged at each acquire
//!   but made inaccessible, and merged at its next access — together with
//!   the stale pins after it, in one batch — so the notices in between
//!   cost nothing; each pin learns which suits it (it starts merging at
//!   once, and a deferral that ends in an access starts a spell of eager
//!   merges twice as long as the last). `MENPS_STATS` counts the
//!   deferrals (`deferred_refreshes`).
//!
//! # Using it
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! use menps_dsm::dsm::Dsm;
//! use menps_dsm::com::ShmCom;
//! use ct_worker::OsThreads;
//!
//! // Start 2 processes of this program; each gets the communicator.
//! let com: ShmCom<OsThreads> = menps_dsm::launch::init_or_relaunch(2)?;
//! let dsm: Dsm<_> = Dsm::new(com)?;
//! // Collectively: 1 MiB of shared memory, 4 KiB blocks, same address in
//! // every process.
//! let p = dsm.alloc_segment(1 << 20, 4096)? as *mut u64;
//! if dsm.rank() == 0 {
//!     // SAFETY: `p` points to DSM memory nobody else writes now.
//!     unsafe { p.write(42) };
//! }
//! dsm.barrier()?;
//! // SAFETY: written before the barrier, read after it.
//! assert_eq!(unsafe { p.read() }, 42);
//! dsm.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Application code accesses DSM memory through raw pointers, or through
//! the typed helpers of the heap: [`DsmBox`], and [`DsmVec`], whose checked
//! stripes let SPMD code — each process writes its part, everybody reads
//! everything after a barrier — do without `unsafe` (the crate's
//! `dot_product` example). An access may fault and be resolved, possibly
//! parking the calling user-level thread.
//!
//! # Memory, threads and processes
//!
//! - [`memory`]: one address map owns every shared address — segments, the
//!   [`heap`], [`globals`], call stacks of user-level threads,
//!   thread-local blocks, and *adopted* ranges (memory the program already
//!   has, such as a `static`, kept at its own address).
//! - [`allocator`]: [`DsmAllocator`], a `#[global_allocator]` that gives code
//!   running on DSM call stacks DSM heap memory, so ordinary `Vec`s and
//!   `String`s built there are valid in every process.
//! - [`team`]: fork–join across processes — `main` on process 0 on a DSM
//!   call stack, forks onto user-level threads (with DSM stacks, pinned
//!   while they run) in every process, and the team barrier.
//! - [`process`]: the running DSM, type-erased, for code that cannot be
//!   generic (a C ABI).
//!
//! # Errors
//!
//! The DSM is fail-stop: a dead peer, a detected data race or a protocol
//! failure is recorded, returned by the operation that found it and by
//! every later one. A fault that cannot be resolved ends the process with
//! the error on stderr (status 1 for a dead peer, abort otherwise).

pub mod allocator;
pub mod config;
pub(crate) mod diff;
mod dirty;
pub mod error;
pub(crate) mod fault;
pub mod globals;
pub mod heap;
mod images;
pub(crate) mod layout;
pub mod memory;
pub mod process;
mod qlock;
pub mod race;
pub(crate) mod segment;
pub(crate) mod signature;
mod space;
mod sync;
pub mod team;
pub mod typed;

use std::marker::PhantomData;

use ct_worker::{OsThreads, UltItf};

use crate::com::Communicator;

pub use allocator::DsmAllocator;
pub use config::{DsmConfig, DsmConfigBuilder, InvalidationPolicy, RaceAction, WriterPolicy};
pub use error::{DsmError, DsmResult, RaceReport};
pub use globals::DsmGlobal;
pub use heap::{HeapStats, HeapUsage};
pub use memory::{Region, RegionKind, SlotRegion};
pub use segment::BlockState;
pub use space::StatsSnapshot;
pub use typed::{DsmBox, DsmVec, Stripe, StripeMut};

use space::{AtomicOp, Space};

impl<C: Communicator + 'static, U: UltItf> fault::FaultResolver for Space<C, U> {
    fn owns(&self, addr: usize) -> bool {
        self.locate(addr)
            .is_some_and(|(seg, idx)| !self.is_guard_block(seg, idx))
    }

    fn is_stack_guard(&self, addr: usize) -> bool {
        Space::is_stack_guard(self, addr)
    }

    fn resolve(&self, addr: usize, write: bool) -> DsmResult<()> {
        Space::resolve(self, addr, write)
    }
}

/// The DSM of this process: a handle every thread of the process may use
/// (`&Dsm` is `Send + Sync`). One exists per process at a time.
///
/// `C` is the communication backend, `U` the threading library the
/// process's threads run on (`OsThreads` for plain threads; ct-worker's
/// `Ult` for user-level threads, whose waits then park instead of blocking).
pub struct Dsm<C: Communicator + 'static, U: UltItf = OsThreads> {
    space: &'static Space<C, U>,
    done: bool,
    /// The heap, the globals, the slot regions ([`memory`]).
    mem: Box<memory::MemState<U>>,
    _u: PhantomData<fn() -> U>,
}

/// A DSM mutex: an id valid in every process (pass it through DSM memory or
/// a broadcast, or get it from a key with [`Dsm::mutex_for_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DsmMutex(pub u32);

impl<C: Communicator + 'static, U: UltItf> Dsm<C, U> {
    /// Collectively starts the DSM on `com` with the default configuration
    /// and the `MENPS_DSM_*` environment variables ([`DsmConfig::from_env`]).
    pub fn new(com: C) -> DsmResult<Self> {
        Self::with_config(com, DsmConfig::from_env()?)
    }

    /// Collectively starts the DSM with `cfg` exactly (the environment is
    /// not read: build `cfg` with [`DsmConfig::builder`] for builder values
    /// over the `MENPS_DSM_*` variables over the defaults). Every process
    /// must pass the same configuration.
    pub fn with_config(com: C, cfg: DsmConfig) -> DsmResult<Self> {
        cfg.validate(com.size())?;
        // Every process must agree on the protocol.
        let mine = format!("{cfg:?}");
        let all = com.allgather(&fingerprint(&mine).to_le_bytes())?;
        if all
            .chunks_exact(8)
            .any(|c| c != fingerprint(&mine).to_le_bytes())
        {
            return Err(DsmError::Config(
                "processes started the DSM with different configurations".into(),
            ));
        }
        let space = Space::new(com, cfg)?;
        let space: &'static Space<C, U> = Box::leak(Box::new(space));
        if let Err(e) = fault::register(space) {
            // SAFETY: `space` was leaked just above and never registered or
            // shared.
            drop(unsafe { Box::from_raw(space as *const Space<C, U> as *mut Space<C, U>) });
            return Err(e);
        }
        let mut dsm = Dsm {
            space,
            done: false,
            mem: Box::default(),
            _u: PhantomData,
        };
        // The heap and the DSM globals (collective).
        dsm.init_memory()?;
        // Caches of the global allocator from an earlier DSM are stale.
        allocator::new_generation();
        // SAFETY: `dsm.mem` is boxed (it keeps its address when `dsm`
        // moves) and `finalize` / `drop` unregister before it is freed.
        unsafe { process::register(&dsm) }?;
        Ok(dsm)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.space.rank
    }

    /// Number of processes.
    pub fn nprocs(&self) -> usize {
        self.space.nprocs
    }

    /// The configuration in effect.
    pub fn config(&self) -> &DsmConfig {
        &self.space.cfg
    }

    /// The communicator (for the application's own messages; tags with the
    /// top bit set are the DSM's).
    pub fn com(&self) -> &C {
        &self.space.com
    }

    /// Counters of protocol events in this process.
    pub fn stats(&self) -> StatsSnapshot {
        self.space.stats()
    }

    /// Collectively creates a segment of `size` bytes (a multiple of
    /// `block_size`) with blocks of `block_size` bytes; returns its address,
    /// the same in every process. Its memory starts zeroed.
    pub fn alloc_segment(&self, size: usize, block_size: usize) -> DsmResult<*mut u8> {
        self.space
            .create_region(segment_request(size, block_size), space::Init::Zero)
            .map(|r| r.base as *mut u8)
    }

    /// Collectively creates a segment whose initial contents are `image`
    /// (the same in every process).
    pub fn alloc_segment_with(&self, image: &[u8], block_size: usize) -> DsmResult<*mut u8> {
        let size = image.len().next_multiple_of(block_size).max(block_size);
        self.space
            .create_region(segment_request(size, block_size), space::Init::Image(image))
            .map(|r| r.base as *mut u8)
    }

    /// DSM barrier: every write before it, by any process, is visible to
    /// every read after it. Collective (one caller per process).
    pub fn barrier(&self) -> DsmResult<()> {
        self.space.barrier()
    }

    /// The release half of a fork: see `Space::fork_release`.
    pub(crate) fn fork_release(&self) -> DsmResult<Option<[u8; sync::BARRIER_RECORD_BYTES]>> {
        self.space.fork_release()
    }

    /// The acquire half of a fork: see `Space::fork_acquire`.
    pub(crate) fn fork_acquire(&self, record: &[u8]) -> DsmResult<()> {
        self.space.fork_acquire(record)
    }

    /// The DSM's recorded failure, if it failed (it is fail-stop: every
    /// operation after a failure returns it).
    pub fn check(&self) -> DsmResult<()> {
        self.space.check()
    }

    /// Release fence: this process's writes so far become visible to any
    /// process that later acquires from it.
    pub fn release_fence(&self) -> DsmResult<()> {
        self.space.release_fence()
    }

    /// Flush, as OpenMP's `flush` across processes: this process's writes so
    /// far become visible to every process at its next flush (or acquire),
    /// and what other processes published by flushing before this call is
    /// visible after it — without a barrier or lock in common. Not
    /// collective. Returns whether it published or acquired anything; a
    /// thread that waits for another's flag by flushing in a loop should
    /// back off while it returns `false`.
    ///
    /// Costs a release fence and one remote word read per other process
    /// when nothing changed.
    pub fn flush(&self) -> DsmResult<bool> {
        self.space.flush()
    }

    /// [`flush`](Self::flush) for a language runtime that flushes on behalf
    /// of a program: `program_sp` is the calling thread's stack pointer
    /// where the program entered the runtime (a trapped fence, a runtime
    /// call). The stack below it — the runtime's own frames, and the
    /// x86-64 red zone's 128 bytes excepted — is not published, so a thread
    /// that waits for a flag by flushing in a loop finds nothing new to
    /// publish and may back off, instead of announcing its stack at every
    /// turn.
    pub fn flush_from(&self, program_sp: usize) -> DsmResult<bool> {
        let _floor = self.program_frames_end(program_sp);
        self.space.flush()
    }

    /// Tells the DSM, for a language runtime, whether the program's code
    /// runs on one OS thread of this process at a time: the runtime runs
    /// every thread of the program as a user-level thread on a single
    /// worker, and the program starts no OS threads of its own. The DSM
    /// then merges other processes' changes into the blocks it keeps
    /// writable for the program (write-shared pins, see
    /// [`DsmConfig::pin_shared`]) with plain stores, vectorized, instead of
    /// one atomic operation per changed word: no store of the program can
    /// land meanwhile, since the DSM runs on that thread. Off by default.
    ///
    /// A wrong promise loses the program's writes made during a merge; turn
    /// it off before the program may start a thread of its own.
    pub fn set_single_writer_thread(&self, on: bool) {
        self.space.set_single_writer_thread(on);
    }

    /// Tells the DSM, for a language runtime, that the calling thread has
    /// entered the runtime from its program with the stack pointer
    /// `program_sp`: until the returned guard is dropped, the stack below it
    /// (the runtime's own frames; the x86-64 red zone's 128 bytes excepted)
    /// counts as dead, so releases — this thread's, or a barrier's leader's
    /// while this thread waits — neither publish it nor count its changes.
    /// Nothing happens for a stack that is not one of the DSM's call stacks.
    ///
    /// Entries nest: while an outer guard marks the program's frames as
    /// ending higher on the same stack, that mark stays (the runtime calling
    /// itself through another entry point does not make its own frames
    /// live); dropping the inner guard puts the outer mark back.
    pub fn program_frames_end(&self, program_sp: usize) -> ProgramFrames<'_, C, U> {
        let prev = self
            .space
            .raise_stack_floor(program_sp, program_sp.saturating_sub(RED_ZONE));
        ProgramFrames {
            dsm: self,
            sp: program_sp,
            prev,
        }
    }

    /// [`program_frames_end`](Self::program_frames_end) for a program that
    /// entered the runtime by a call: `caller_sp` is its stack pointer
    /// before the call instruction (the address just above the return
    /// address). A function that calls has no red zone, so everything below
    /// `caller_sp` counts as dead — the return address, and the registers
    /// the runtime's frames saved, which change from call to call (a loop
    /// counter the program keeps in a callee-saved register) and would
    /// otherwise make every barrier of a loop publish a stack block.
    /// Entries nest as [`program_frames_end`](Self::program_frames_end)'s.
    pub fn program_frames_end_at_call(&self, caller_sp: usize) -> ProgramFrames<'_, C, U> {
        let prev = self.space.raise_stack_floor(caller_sp, caller_sp);
        ProgramFrames {
            dsm: self,
            sp: caller_sp,
            prev,
        }
    }

    /// See [`crate::internals::tracks_writes`].
    pub(crate) fn tracks_writes(&self) -> bool {
        self.space.tracks_writes()
    }

    /// See [`crate::internals::flush_publishing_during`].
    pub(crate) fn flush_publishing_during(&self, f: impl FnOnce()) -> DsmResult<()> {
        self.space.flush_publishing_during(f)
    }

    /// Allocates a DSM mutex (not collective; share its id).
    pub fn new_mutex(&self) -> DsmResult<DsmMutex> {
        self.space.mutex_alloc().map(DsmMutex)
    }

    /// The mutex of `key`: the same mutex in every process that asks for
    /// the same key, without any exchange beforehand (not collective). A key
    /// is any `u64` but `u64::MAX` — an address valid everywhere (a lock
    /// variable in DSM memory), a hash of a name. Keyed mutexes cannot be
    /// freed; there can be `max_mutexes` of them (`MENPS_DSM_MUTEXES`), on
    /// top of the allocated ones.
    pub fn mutex_for_key(&self, key: u64) -> DsmResult<DsmMutex> {
        self.space.mutex_for_key(key).map(DsmMutex)
    }

    /// Frees a mutex that nobody holds; its id may be reused.
    pub fn free_mutex(&self, m: DsmMutex) -> DsmResult<()> {
        self.space.mutex_free(m.0)
    }

    /// Locks `m`; everything its previous holders wrote before unlocking is
    /// visible afterwards.
    pub fn lock(&self, m: DsmMutex) -> DsmResult<DsmMutexGuard<'_, C, U>> {
        self.space.mutex_lock(m.0)?;
        Ok(DsmMutexGuard {
            dsm: self,
            m,
            armed: true,
        })
    }

    /// Atomically adds `delta` to the DSM word at `word` (acquire and
    /// release); returns the old value.
    pub fn fetch_add(&self, word: *mut u64, delta: u64) -> DsmResult<u64> {
        self.space
            .atomic(word as usize, AtomicOp::FetchAdd(delta), true)
    }

    /// Atomically replaces the DSM word at `word` with `new` if it equals
    /// `expected` (acquire and release); returns `Ok(old)` on success and
    /// `Err(actual)` otherwise.
    pub fn compare_exchange(
        &self,
        word: *mut u64,
        expected: u64,
        new: u64,
    ) -> DsmResult<Result<u64, u64>> {
        self.space.compare_exchange(word as usize, expected, new)
    }

    /// [`Dsm::compare_exchange`] without ordering (a relaxed atomic): the
    /// operation is atomic on the coherent copy of the word's block (under
    /// the block's global lock: on the word of its latest version, at the
    /// process that holds it, under the floating home; a transaction on the
    /// block otherwise, or when a write of this process to the word is
    /// still pending) and becomes visible to
    /// other processes at their next acquire after this process's next
    /// release, like a plain write — but it never races with the other
    /// processes' relaxed atomics on the same word. Much cheaper than the
    /// ordered form: no fence, no synchronisation object. For operations
    /// whose ordering comes from elsewhere (a barrier after an OpenMP
    /// reduction).
    pub fn compare_exchange_relaxed(
        &self,
        word: *mut u64,
        expected: u64,
        new: u64,
    ) -> DsmResult<Result<u64, u64>> {
        let old = self
            .space
            .atomic_in_block(word as usize, AtomicOp::CompareExchange(expected, new))?;
        Ok(if old == expected { Ok(old) } else { Err(old) })
    }

    /// Reads the DSM word at `word` from the coherent copy of its block,
    /// without ordering (see [`Dsm::compare_exchange_relaxed`]).
    pub fn load_relaxed(&self, word: *const u64) -> DsmResult<u64> {
        self.space.atomic_in_block(word as usize, AtomicOp::Load)
    }

    /// Reads the DSM word at `word` with acquire semantics.
    pub fn load_acquire(&self, word: *const u64) -> DsmResult<u64> {
        self.space.atomic(word as usize, AtomicOp::Load, false)
    }

    /// Writes the DSM word at `word` with release semantics.
    pub fn store_release(&self, word: *mut u64, value: u64) -> DsmResult<()> {
        self.space
            .atomic(word as usize, AtomicOp::Store(value), true)
            .map(drop)
    }

    /// Pins `[addr, addr + len)`: its blocks become writable and stay so —
    /// no fault can happen there — until [`Dsm::unpin`] (pins nest: a block
    /// stays pinned until it was unpinned as often as pinned). For call
    /// stacks in the DSM.
    pub fn pin(&self, addr: *mut u8, len: usize) -> DsmResult<()> {
        self.space.pin(addr as usize, len)
    }

    /// Unpins `[addr, addr + len)`; the next release fence releases it.
    pub fn unpin(&self, addr: *mut u8, len: usize) -> DsmResult<()> {
        self.space.unpin(addr as usize, len)
    }

    /// State of the block holding `addr` in this process, if it is DSM
    /// memory (diagnostics and tests).
    pub fn block_state(&self, addr: *const u8) -> Option<BlockState> {
        self.space.state_of(addr as usize)
    }

    /// Releases the blocks of `[addr, addr + len)` now (memory changing
    /// hands).
    pub fn release_range(&self, addr: *mut u8, len: usize) -> DsmResult<()> {
        self.space.release_range(addr as usize, len)
    }

    /// Drops this process's copies of the blocks of `[addr, addr + len)`,
    /// so the next access fetches the latest version (memory changing
    /// hands).
    pub fn forget_range(&self, addr: *mut u8, len: usize) -> DsmResult<()> {
        self.space.forget_range(addr as usize, len)
    }

    /// Collectively shuts the DSM down: a final barrier, then the fault
    /// handler is removed and the DSM's memory unmapped (later accesses
    /// crash as ordinary segmentation faults).
    pub fn finalize(mut self) -> DsmResult<()> {
        self.done = true;
        process::unregister();
        // The last DSM barrier, then one of the communication layer: after
        // its own barrier a process still reads the others' signatures, so
        // none may leave before every process has (a barrier's last
        // arriver, or with a dissemination barrier one that finished its
        // rounds, can leave well before another is woken).
        let r = self
            .space
            .barrier()
            .and_then(|()| Ok(self.com().barrier()?));
        if self.config().print_stats {
            // One write, so that the lines of several processes do not mix.
            let mut line = format!("menps: process {}: {}\n", self.rank(), self.space.stats());
            // The communication layer's counters, when it keeps them (a
            // network model, `MENPS_STATS` set as the job joined).
            if let Some(t) = self.com().traffic() {
                line += &format!("menps: process {}: com: {t}\n", self.rank());
            }
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        }
        fault::unregister();
        // SAFETY: the space was leaked in `with_config`; the hook no longer
        // reaches it and `self` (the only handle) is consumed.
        drop(unsafe { Box::from_raw(self.space as *const Space<C, U> as *mut Space<C, U>) });
        r
    }
}

/// Bytes below the stack pointer that x86-64 code may use without moving it.
const RED_ZONE: usize = 128;

/// While alive, the runtime frames below a program's stack pointer count as
/// dead ([`Dsm::program_frames_end`]).
#[must_use = "the frames count as dead only while the guard lives"]
pub struct ProgramFrames<'a, C: Communicator + 'static, U: UltItf> {
    dsm: &'a Dsm<C, U>,
    sp: usize,
    /// The mark of an outer entry (0: none), put back on drop.
    prev: usize,
}

impl<C: Communicator + 'static, U: UltItf> Drop for ProgramFrames<'_, C, U> {
    fn drop(&mut self) {
        self.dsm.space.restore_stack_floor(self.sp, self.prev);
    }
}

impl<C: Communicator + 'static, U: UltItf> core::fmt::Debug for ProgramFrames<'_, C, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ProgramFrames")
            .field("sp", &self.sp)
            .finish()
    }
}

impl<C: Communicator + 'static, U: UltItf> Drop for Dsm<C, U> {
    fn drop(&mut self) {
        if !self.done {
            // Not finalized (an error or a panic unwinds): stop resolving
            // faults, but keep the memory mapped for whoever still reads it.
            process::unregister();
            fault::unregister();
        }
    }
}

impl<C: Communicator + 'static, U: UltItf> core::fmt::Debug for Dsm<C, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Dsm")
            .field("rank", &self.rank())
            .field("nprocs", &self.nprocs())
            .field("config", self.config())
            .finish()
    }
}

/// A locked DSM mutex; unlocks when dropped (an error then is recorded and
/// returned by the DSM's next operation) or with [`DsmMutexGuard::unlock`].
pub struct DsmMutexGuard<'a, C: Communicator + 'static, U: UltItf> {
    dsm: &'a Dsm<C, U>,
    m: DsmMutex,
    armed: bool,
}

impl<C: Communicator + 'static, U: UltItf> DsmMutexGuard<'_, C, U> {
    /// Unlocks, reporting errors.
    pub fn unlock(mut self) -> DsmResult<()> {
        self.armed = false;
        self.dsm.space.mutex_unlock(self.m.0)
    }
}

impl<C: Communicator + 'static, U: UltItf> Drop for DsmMutexGuard<'_, C, U> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.dsm.space.mutex_unlock(self.m.0);
        }
    }
}

/// The request for a user segment, checked.
fn segment_request(size: usize, block_size: usize) -> DsmResult<memory::map::Request> {
    config::check_block_size(block_size)?;
    if size == 0 || !size.is_multiple_of(block_size) {
        return Err(DsmError::InvalidArgument(format!(
            "segment size {size} must be a positive multiple of the block size {block_size}"
        )));
    }
    Ok(memory::map::Request {
        kind: memory::RegionKind::Segment,
        size,
        block_size,
        at: None,
    })
}

/// FNV-1a of a string (configuration agreement check).
fn fingerprint(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
