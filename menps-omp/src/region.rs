//! Parallel regions ([`parallel`], [`Parallel`]) and a team thread's view of
//! its team ([`Thread`]): barrier, `single`, `master`, `critical`,
//! reductions.

use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU64, Ordering};

use menps_dsm::com::Coll;
use menps_dsm::dsm::DsmGlobal;
use menps_dsm::dsm::allocator::RuntimeGuard;
use menps_dsm::dsm::team::TeamThread;

use crate::error::fail;
use crate::runtime::{Runtime, expect_runtime};
use crate::schedule::Schedule;
use crate::worksharing::NEXT;

/// What every thread of a region reads: it lives in the frame of the
/// thread that started the region (DSM memory, the same address in every
/// process).
struct RegionInfo {
    /// Work-sharing sequence number of the region's first construct.
    seq_base: u64,
    /// The run-time schedule, encoded.
    schedule: u64,
    /// Unique id of the region (high bit: a serial region of one process).
    id: u64,
    /// The sequence number after the region's last construct (thread 0).
    seq_end: AtomicU64,
}

/// Region ids of serial (nested) regions, per process.
static SERIAL_IDS: AtomicU64 = AtomicU64::new(0);
const SERIAL_BIT: u64 = 1 << 63;

/// One thread of a parallel region's team, as its code sees it (the
/// argument of the closure given to [`parallel`]). It offers OpenMP's
/// constructs; every thread of the team must meet the same work-sharing
/// constructs (loops, `single`, reductions, barriers) in the same order.
pub struct Thread<'r> {
    tt: Option<&'r TeamThread<'r>>,
    /// The region's run-time schedule, encoded (copied from the region's
    /// `RegionInfo`, which lives in another thread's frame).
    schedule: u64,
    /// The region's id.
    pub(crate) region_id: u64,
    /// Next work-sharing sequence number of this thread.
    seq: Cell<u64>,
    /// Mutable work-sharing loops met so far.
    pub(crate) mut_loops: Cell<u64>,
    _not_send: PhantomData<*const ()>,
}

impl<'r> Thread<'r> {
    /// This thread's number in the team, `0 .. num_threads()`: process `p`
    /// runs threads `p · threads_here() ..`, so thread 0 (the master) runs
    /// on process 0, where the region started. Every team thread is a
    /// user-level thread of its own (the thread that started the region
    /// waits for the team), so the starting thread's frame, which every
    /// process reads, stays unchanged while the team runs.
    pub fn thread_num(&self) -> usize {
        self.tt.map_or(0, |t| t.thread_num())
    }

    /// Threads in the team.
    pub fn num_threads(&self) -> usize {
        self.tt.map_or(1, |t| t.num_threads())
    }

    /// The process this thread runs in.
    pub fn process(&self) -> usize {
        self.tt.map_or_else(process_rank, |t| t.rank())
    }

    /// Processes of the job.
    pub fn num_processes(&self) -> usize {
        self.tt.map_or_else(num_processes, |t| t.nprocs())
    }

    /// This thread's number among the team threads of its process.
    pub fn local_num(&self) -> usize {
        self.tt.map_or(0, |t| t.local_num())
    }

    /// Team threads in this thread's process.
    pub fn threads_here(&self) -> usize {
        self.tt.map_or(1, |t| t.threads_here())
    }

    /// Barrier of the team (`#pragma omp barrier`): returns once every
    /// thread has arrived; every write made before it by any thread of the
    /// team, in any process, is visible after it.
    #[inline(always)] // so the DSM sees where the caller's frames end
    pub fn barrier(&self) {
        if let Some(t) = self.tt {
            t.barrier().unwrap_or_else(|e| fail("team barrier", e));
        }
    }

    /// Flush (`#pragma omp flush`): this thread's writes so far become
    /// visible to any thread that flushes afterwards, in any process, and
    /// what other threads published by flushing before is visible after
    /// it. For flag synchronisation, flush between the data and the flag on
    /// both sides: write the data, flush, set the flag, flush; wait until
    /// the flag is seen (flushing in the loop), flush, read the data. A wait
    /// loop should back off: across processes a flush costs a release fence
    /// and a remote read per process. Returns whether the flush published or
    /// acquired anything (always `true` in a job of one process).
    pub fn flush(&self) -> bool {
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        let rt = self.rt();
        if rt.dsm.nprocs() == 1 {
            return true;
        }
        rt.dsm.flush().unwrap_or_else(|e| fail("flush", e))
    }

    /// Runs `f` on thread 0 only (`#pragma omp master`; no barrier).
    pub fn master<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        (self.thread_num() == 0).then(f)
    }

    /// Runs `f` on exactly one thread of the team — the first to arrive —
    /// then waits at a barrier (`#pragma omp single`). Returns `Some` on that
    /// thread.
    pub fn single<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let r = self.single_nowait(f);
        self.barrier();
        r
    }

    /// [`Thread::single`] without the barrier (`single nowait`).
    pub fn single_nowait<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        if self.num_threads() == 1 {
            return Some(f());
        }
        let rt = self.rt();
        let seq = self.next_seq();
        rt.ring.enter(rt.dsm, seq);
        let first = rt.ring.fetch_add(rt.dsm, seq, NEXT, 1) == 0;
        rt.ring.leave(rt.dsm, seq, self.num_threads());
        first.then(f)
    }

    /// Runs `f` on one thread and gives its value to every thread
    /// (`single copyprivate`): ends with the barrier of `single`.
    pub fn single_copy<T: Copy + Send>(&self, f: impl FnOnce() -> T) -> T {
        // The value travels as a reduction that keeps the one `Some`.
        let v = self.single_nowait(f);
        let v = self.reduce(v, |a, b| a.or(b));
        self.barrier();
        v.expect("a single construct ran on one thread")
    }

    /// Runs `f` while holding the team's unnamed critical section
    /// (`#pragma omp critical`): one thread at a time in the whole job, and
    /// what the previous holder wrote is visible.
    pub fn critical<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::sync::critical_named("", f)
    }

    /// Runs `f` inside the critical section called `name`
    /// (`#pragma omp critical(name)`); sections of different names do not
    /// exclude each other.
    pub fn critical_named<R>(&self, name: &str, f: impl FnOnce() -> R) -> R {
        crate::sync::critical_named(name, f)
    }

    /// Combines every thread's `value` with the associative `op` and
    /// returns the result to every thread (an all-reduce). Values are
    /// combined in thread order, so every thread gets the same result, and
    /// it is the same in every run for the same team. Within a process the
    /// threads combine through shared memory; across processes one thread
    /// per process exchanges its process's value (`T`'s bytes: it must not
    /// hold pointers to process-local memory).
    ///
    /// No barrier: the writes of other threads are not made visible.
    pub fn reduce<T: Copy + Send>(&self, value: T, op: impl Fn(T, T) -> T) -> T {
        let Some(tt) = self.tt else { return value };
        if tt.num_threads() == 1 {
            return value;
        }
        let rt = self.rt();
        let (tpp, local) = (tt.threads_here(), tt.local_num());
        let mut out = MaybeUninit::<T>::uninit();
        if tpp > 1 {
            let slot = &rt.locals[local];
            slot.part
                .store(&value as *const T as usize, Ordering::Release);
            slot.out.store(out.as_mut_ptr() as usize, Ordering::Release);
            tt.local_barrier();
        }
        if local == 0 {
            let mut acc = value;
            for s in &rt.locals[1..tpp] {
                // SAFETY: thread `j` published a pointer to its value before
                // the local barrier and keeps it alive until the second one.
                let v = unsafe { (s.part.load(Ordering::Acquire) as *const T).read() };
                acc = op(acc, v);
            }
            if tt.nprocs() > 1 {
                acc = combine_processes(rt, acc, &op);
            }
            for s in &rt.locals[1..tpp] {
                // SAFETY: as above, for the result's place.
                unsafe { (s.out.load(Ordering::Acquire) as *mut T).write(acc) };
            }
            out.write(acc);
        }
        if tpp > 1 {
            tt.local_barrier();
        }
        // SAFETY: the process's local thread 0 wrote it before the last
        // barrier (or it is that thread itself).
        unsafe { out.assume_init() }
    }

    /// The runtime (a region's threads run inside `run`).
    pub(crate) fn rt(&self) -> &'static Runtime {
        expect_runtime("a parallel region")
    }

    /// The next work-sharing sequence number of this thread.
    pub(crate) fn next_seq(&self) -> u64 {
        let s = self.seq.get();
        self.seq.set(s + 1);
        s
    }

    /// The run-time schedule of the region.
    pub(crate) fn runtime_schedule(&self) -> Schedule {
        Schedule::decode(self.schedule)
    }
}

impl core::fmt::Debug for Thread<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Thread")
            .field("thread_num", &self.thread_num())
            .field("num_threads", &self.num_threads())
            .field("process", &self.process())
            .finish()
    }
}

/// Combines the processes' values (one thread per process calls it), in
/// rank order.
fn combine_processes<T: Copy>(rt: &Runtime, acc: T, op: &impl Fn(T, T) -> T) -> T {
    let all = {
        let _rt = RuntimeGuard::enter();
        // SAFETY: the bytes of a `Copy` value, read for sending (`reduce`
        // documents that `T` travels as bytes).
        let bytes =
            unsafe { core::slice::from_raw_parts((&acc as *const T).cast::<u8>(), size_of::<T>()) };
        rt.dsm
            .com()
            .allgather(bytes)
            .unwrap_or_else(|e| fail("reduction across processes", e))
    };
    let n = size_of::<T>();
    let value = |k: usize| {
        if n == 0 {
            acc
        } else {
            // SAFETY: chunk `k` is process k's `T`, sent as bytes.
            unsafe { all[k * n..].as_ptr().cast::<T>().read_unaligned() }
        }
    };
    let nprocs = all.len().checked_div(n).unwrap_or(1);
    let mut r = value(0);
    for k in 1..nprocs {
        r = op(r, value(k));
    }
    r
}

/// The rank of this process (0 outside a job).
pub fn process_rank() -> usize {
    crate::runtime::runtime().map_or(0, |rt| rt.dsm.rank())
}

/// Processes of the job (1 outside a job).
pub fn num_processes() -> usize {
    crate::runtime::runtime().map_or(1, |rt| rt.dsm.nprocs())
}

/// The address of a DSM global declared with
/// [`dsm_global!`](crate::dsm_global): the same in every process, valid
/// while [`run`](crate::run) runs. Access it under the DSM's rules, as any
/// shared data: written before a barrier (or under a critical section)
/// and read after it.
///
/// # Panics
///
/// Outside [`run`](crate::run).
pub fn global_ptr<T: Copy + Send + Sync + 'static>(g: &DsmGlobal<T>) -> *mut T {
    g.get(expect_runtime("menps_omp::global_ptr").dsm)
}

/// A parallel region with clauses: `Parallel::new().num_threads(4).run(f)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Parallel {
    num_threads: Option<usize>,
}

impl Parallel {
    /// A region with the default team.
    pub fn new() -> Self {
        Self::default()
    }

    /// The team's size (`num_threads` clause): a multiple of the number of
    /// processes, each running `n / processes` threads.
    pub fn num_threads(mut self, n: usize) -> Self {
        self.num_threads = Some(n);
        self
    }

    /// Runs `f` on every thread of a new team and returns when all have
    /// finished (`#pragma omp parallel`); what they wrote is visible
    /// afterwards.
    ///
    /// The closure may borrow the caller's locals, heap data and DSM
    /// globals: they are DSM memory, valid in every process, when the
    /// caller is `main` of [`run`](crate::run) or code it calls. Inside a
    /// region, `parallel` runs `f` on the calling thread alone (a team of
    /// one: nested parallelism is off).
    ///
    /// # Panics
    ///
    /// Outside [`run`](crate::run); if the team size is not a multiple of
    /// the number of processes or exceeds the stacks a process has
    /// (`MENPS_DSM_STACKS`); if the DSM fails (the region cannot go on).
    pub fn run<F>(self, f: F)
    where
        F: Fn(&Thread<'_>) + Sync,
    {
        let rt = expect_runtime("menps_omp::parallel");
        if rt.active.load(Ordering::Acquire) > 0 || rt.dsm.rank() != 0 {
            return run_serial(&f);
        }
        let nprocs = rt.dsm.nprocs();
        let n = self
            .num_threads
            .unwrap_or_else(|| rt.team_size.load(Ordering::Relaxed));
        if n == 0 || !n.is_multiple_of(nprocs) {
            panic!(
                "menps-omp: a team of {n} threads over {nprocs} processes: the team size must be a \
                 positive multiple of the number of processes"
            );
        }
        let info = RegionInfo {
            seq_base: rt.next_seq.load(Ordering::Relaxed),
            schedule: Schedule::decode(rt.schedule.load(Ordering::Relaxed))
                .resolve(Schedule::Static)
                .encode(),
            id: rt.next_region.fetch_add(1, Ordering::Relaxed),
            seq_end: AtomicU64::new(u64::MAX),
        };
        let body = |tt: &TeamThread<'_>| {
            let rt = expect_runtime("a parallel region");
            rt.active.fetch_add(1, Ordering::AcqRel);
            let t = Thread {
                tt: Some(tt),
                schedule: info.schedule,
                region_id: info.id,
                seq: Cell::new(info.seq_base),
                mut_loops: Cell::new(0),
                _not_send: PhantomData,
            };
            f(&t);
            if tt.thread_num() == 0 {
                info.seq_end.store(t.seq.get(), Ordering::Relaxed);
            }
            rt.active.fetch_sub(1, Ordering::AcqRel);
        };
        // SAFETY: `body`, `info` and `f` live in this frame, which is DSM
        // memory (a DSM call stack: `main` of `run`, checked by
        // `Team::parallel`), and everything `f` borrows is the caller's
        // responsibility as documented; the fork joins before we return.
        unsafe { rt.team.parallel(n / nprocs, &body) }
            .unwrap_or_else(|e| fail("parallel region", e));
        let end = info.seq_end.load(Ordering::Relaxed);
        if end != u64::MAX {
            rt.next_seq.store(end, Ordering::Relaxed);
        }
    }
}

/// A region of one thread (nested, or started by a team thread).
fn run_serial<F: Fn(&Thread<'_>) + Sync>(f: &F) {
    let t = Thread {
        tt: None,
        schedule: Schedule::Static.encode(),
        region_id: SERIAL_BIT | SERIAL_IDS.fetch_add(1, Ordering::Relaxed),
        seq: Cell::new(0),
        mut_loops: Cell::new(0),
        _not_send: PhantomData,
    };
    f(&t);
}

/// Runs `f` on every thread of a team of the default size
/// (`#pragma omp parallel`): [`Parallel::run`].
///
/// ```no_run
/// menps_omp::run(|| {
///     let hits: Vec<u32> = vec![0; 64];
///     let total = menps_omp::sync::AtomicU64::new(0);
///     menps_omp::parallel(|t| {
///         t.for_each(0..hits.len(), |i| {
///             total.fetch_add(u64::from(hits[i]) + 1);
///         });
///     });
///     assert_eq!(total.load(), 64);
/// })
/// .unwrap();
/// ```
pub fn parallel<F>(f: F)
where
    F: Fn(&Thread<'_>) + Sync,
{
    Parallel::new().run(f)
}

/// Sets the team size of later regions without `num_threads`
/// (`omp_set_num_threads`; process 0's `main`).
///
/// # Panics
///
/// Outside [`run`](crate::run), or if `n` is 0.
pub fn set_num_threads(n: usize) {
    assert!(
        n > 0,
        "menps-omp: set_num_threads(0): a team has at least one thread"
    );
    expect_runtime("menps_omp::set_num_threads")
        .team_size
        .store(n, Ordering::Relaxed);
}

/// The team size of the next region without `num_threads`
/// (`omp_get_max_threads`); 1 outside [`run`](crate::run).
pub fn max_threads() -> usize {
    crate::runtime::runtime().map_or(1, |rt| rt.team_size.load(Ordering::Relaxed))
}

/// Sets the schedule of later `Schedule::Runtime` loops (`omp_set_schedule`;
/// process 0's `main`).
///
/// # Panics
///
/// Outside [`run`](crate::run).
pub fn set_schedule(s: Schedule) {
    expect_runtime("menps_omp::set_schedule")
        .schedule
        .store(s.resolve(Schedule::Static).encode(), Ordering::Relaxed);
}

/// The schedule of `Schedule::Runtime` loops (`omp_get_schedule`).
pub fn schedule() -> Schedule {
    crate::runtime::runtime().map_or(Schedule::Static, |rt| {
        Schedule::decode(rt.schedule.load(Ordering::Relaxed))
    })
}

/// Whether the caller runs inside a parallel region (`omp_in_parallel`).
pub fn in_parallel() -> bool {
    crate::runtime::runtime().is_some_and(|rt| rt.active.load(Ordering::Acquire) > 0)
}

/// Seconds since an arbitrary moment of this process (`omp_get_wtime`).
pub fn wtime() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let _rt = RuntimeGuard::enter();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}
