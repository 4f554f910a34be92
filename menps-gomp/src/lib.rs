//! `libmenps_gomp`: the libgomp interface — the entry points GCC's
//! `-fopenmp` code calls (`GOMP_*`) and the `omp_*` API — on menps-omp's
//! runtime, so that an unmodified C program runs on user-level threads: on
//! one process as a drop-in for libgomp, or across processes with its whole
//! memory in the DSM. Built as `libmenps_gomp.so` and `libmenps_gomp.a`.
//!
//! The library replaces `malloc` and its family, `exit`,
//! `__libc_start_main` and `pthread_create` (which it only watches, see
//! [`threads`]) for the whole process it is loaded into; it is for
//! C programs, not for Rust programs (which use menps-omp directly).
//!
//! # Using it
//!
//! ```text
//! cargo build --release -p menps-gomp -p menps-dsm --bin menps
//! gcc -fopenmp -O2 prog.c -o prog                    # against libgomp, as usual
//! target/release/menps run -n 4 ./prog               # 4 processes (the launcher preloads the library)
//! LD_PRELOAD=target/release/libmenps_gomp.so ./prog  # 1 process: a drop-in for libgomp
//! LD_PRELOAD=target/release/libmenps_gomp.so MENPS_NPROCS=2 ./prog   # starts 2 processes itself
//! target/release/menps cc -O2 prog.c -o prog         # linked against the library instead of libgomp
//! ```
//!
//! `OMP_NUM_THREADS` is the team size of all processes together;
//! `OMP_SCHEDULE`, `OMP_STACKSIZE`, `OMP_WAIT_POLICY`, `OMP_DYNAMIC` and
//! `OMP_CANCELLATION` are read as libgomp reads them; `OMP_PROC_BIND` and
//! `OMP_PLACES` bind the team's workers (see [`affinity`] for the system
//! libgomp's own binding at start-up). In a job of several
//! processes, `main` runs on process 0 on a DSM call stack, the program's
//! heap allocations ([`heap`]) and its globals ([`image`]) are DSM memory,
//! and its locked instructions work on shared data ([`atomics`]); its
//! fences are DSM flushes ([`atomics`]); each team thread has its own
//! thread-local storage (`threadprivate`, [`tls`]). What the
//! program's threads print appears once, in the order its synchronisation
//! gives ([`start::OUTPUT_VAR`]). Entry points the library lacks abort with
//! their name ([`unsupported`]).
//!
//! One module per family of entry points: [`start`] (taking over `main`),
//! [`parallel`], [`loops`] (loops, `ordered`, `sections`), [`sync`]
//! (barrier, critical, atomic, single, locks), [`tasks`], [`api`]
//! (`omp_*`), [`heap`] (the C heap in the DSM), [`image`] (the
//! executable's globals in the DSM), [`atomics`] (the program's locked
//! instructions and fences on DSM memory), [`tls`] (thread-local storage
//! per team thread), [`threads`] (the program's own OS threads, watched),
//! [`unsupported`] (entry points that abort with their name).
//!
//! # Per-thread state
//!
//! Every piece of C code that calls the runtime runs on a user-level
//! thread: `main` (on process 0), team threads, tasks. The thread's ct-worker
//! word ([`ct_worker::current_thread_word`]) points to its current task
//! (`Task`): the implicit task of a team thread, or an explicit task. The
//! task points to the team thread's state (`CThread`): its place in the
//! team, its work-sharing counters, the loop it is in. Both live in this
//! process's private memory (they are never read by other processes).

pub mod affinity;
pub mod api;
pub mod atomics;
mod caller_sp;
mod errno;
pub mod heap;
pub mod image;
pub mod loops;
pub mod parallel;
pub mod start;
mod symbols;
pub mod sync;
pub mod tasks;
pub mod threads;
pub mod tls;
pub mod unsupported;

use core::cell::{Cell, UnsafeCell};
use core::ptr::NonNull;

use menps_dsm::dsm::allocator::RuntimeGuard;
use menps_dsm::dsm::team::TeamThread;

use menps_omp::Schedule;
use menps_omp::internals::Runtime;
use smallvec::SmallVec;

/// Writes `msg` to stderr as one line and aborts the process: for misuse
/// and unsupported features, which must never silently misbehave.
/// The message is formatted in the private heap (pass `format_args!`): the
/// DSM heap may be what failed.
#[cold]
pub(crate) fn die(msg: impl core::fmt::Display) -> ! {
    let _rt = RuntimeGuard::enter();
    let line = format!("menps-gomp: {msg}\n");
    // SAFETY: write(2) of a valid buffer to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    std::process::abort()
}

/// The state of one loop (or `sections`) a team thread is in.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LoopState {
    /// How chunks are handed out.
    pub kind: LoopKind,
    /// Work-sharing sequence number (dynamic, guided and ordered loops).
    pub seq: u64,
    /// Whether the loop uses the team's counters (`seq` is valid).
    pub shared: bool,
    /// Iterations.
    pub n: u64,
    /// Chunk size (iterations; static: 0 = one block per thread).
    pub chunk: u64,
    /// First value and increment of the loop variable (two's complement:
    /// `long` and `unsigned long long` loops alike).
    pub start: u64,
    pub incr: u64,
    /// The loop's `end` (returned as the end of the last chunk).
    pub end: u64,
    /// Next static chunk number of this thread.
    pub next_static: u64,
    /// An `ordered` loop: the chunk this thread runs (iteration indices).
    pub ordered: bool,
    pub ord_lo: u64,
    pub ord_hi: u64,
    /// Whether this thread holds a chunk whose ordered turn it must pass.
    pub ord_open: bool,
}

/// How a loop hands out chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum LoopKind {
    /// Not in a loop.
    #[default]
    None,
    /// Static blocks or round-robin chunks.
    Static,
    /// First come, first served.
    Dynamic,
    /// Shrinking chunks.
    Guided,
}

/// What a region's threads share: it lives in the frame of the thread that
/// started the region (DSM memory when the team spans processes).
pub(crate) struct Region {
    /// Work-sharing sequence number of the region's first construct.
    pub seq_base: u64,
    /// The run-time schedule, encoded.
    pub schedule: u64,
    /// The outlined function and its data.
    pub fn_: usize,
    pub data: usize,
    /// The loop a combined construct starts (`kind == None`: none).
    pub preset: LoopState,
    /// The sequence number after the region's last construct (thread 0).
    pub seq_end: core::sync::atomic::AtomicU64,
    /// Nesting level of the region's threads.
    pub level: u32,
    /// The starting thread's thread-local carrier + 1 (0: none; see
    /// [`tls`]), which thread 0 uses.
    pub carrier0: usize,
    /// Active (more than one thread) levels up to this region's.
    pub active_level: u32,
    /// The `nthreads-var` ICV the team inherits.
    pub nthreads_var: usize,
}

/// A team thread of a C program (private memory of its process).
pub(crate) struct CThread {
    /// The team, if it has more than one thread.
    pub tt: Option<NonNull<TeamThread<'static>>>,
    pub thread_num: usize,
    pub num_threads: usize,
    /// Nesting level (0: the initial thread outside any region).
    pub level: u32,
    pub active_level: u32,
    /// The thread that started this thread's region (`None`: initial).
    pub parent: Option<NonNull<CThread>>,
    /// The region's run-time schedule.
    pub schedule: Cell<Schedule>,
    /// Team size of regions this thread starts (`omp_set_num_threads`).
    pub nthreads_var: Cell<usize>,
    /// Next work-sharing sequence number.
    pub seq: Cell<u64>,
    /// The loop this thread is in.
    pub lp: Cell<LoopState>,
    /// `single copyprivate`: the construct this thread runs.
    pub copy_seq: Cell<u64>,
    /// The region this thread started with `GOMP_parallel_start` and runs
    /// as its thread 0 (`parallel::OpenRegion`), until `GOMP_parallel_end`.
    pub open: Cell<*mut parallel::OpenRegion>,
    /// The implicit task.
    pub task: Task,
}

/// A task: the implicit task of a team thread or an explicit task.
pub(crate) struct Task {
    /// The team thread it belongs to.
    pub thread: Cell<*const CThread>,
    /// Child tasks not joined yet (only this task's own code touches it).
    pub children: UnsafeCell<SmallVec<[tasks::Child; 4]>>,
    /// Where each open taskgroup's children start in `children`.
    pub groups: UnsafeCell<Vec<usize>>,
    /// A final task (its descendants run undeferred).
    pub is_final: bool,
}

impl Task {
    pub(crate) fn new(thread: *const CThread, is_final: bool) -> Task {
        Task {
            thread: Cell::new(thread),
            children: UnsafeCell::new(SmallVec::new()),
            groups: UnsafeCell::new(Vec::new()),
            is_final,
        }
    }
}

impl CThread {
    /// The initial thread's state (outside any region). The states of a
    /// region's threads are built from it, with their place in the region
    /// (struct update): it holds what a thread starts with (no loop, no
    /// construct, no region of its own, a task pointing nowhere yet).
    pub(crate) fn initial(nthreads_var: usize, schedule: Schedule) -> CThread {
        CThread {
            tt: None,
            thread_num: 0,
            num_threads: 1,
            level: 0,
            active_level: 0,
            parent: None,
            schedule: Cell::new(schedule),
            nthreads_var: Cell::new(nthreads_var),
            seq: Cell::new(0),
            lp: Cell::new(LoopState::default()),
            copy_seq: Cell::new(0),
            open: Cell::new(core::ptr::null_mut()),
            task: Task::new(core::ptr::null(), false),
        }
    }

    /// The team (if it has more than one thread).
    pub(crate) fn team(&self) -> Option<&TeamThread<'static>> {
        // SAFETY: the team thread outlives the region's threads' states.
        self.tt.map(|t| unsafe { t.as_ref() })
    }

    /// The next work-sharing sequence number of this thread.
    pub(crate) fn next_seq(&self) -> u64 {
        let s = self.seq.get();
        self.seq.set(s + 1);
        s
    }
}

/// The running task, if the caller runs on a user-level thread that has one.
#[inline]
pub(crate) fn current_task() -> Option<&'static Task> {
    let w = ct_worker::current_thread_word()?;
    // SAFETY: the word is 0 or points to the running thread's task, which
    // lives while the thread runs it (set by `enter_task`).
    (w != 0).then(|| unsafe { &*(w as *const Task) })
}

/// Makes `task` the running thread's task; returns the previous word.
#[inline]
pub(crate) fn enter_task(task: *const Task) -> usize {
    ct_worker::replace_current_thread_word(task as usize).unwrap_or(0)
}

/// Restores the word `enter_task` returned.
#[inline]
pub(crate) fn leave_task(old: usize) {
    ct_worker::set_current_thread_word(old);
}

/// The team thread the caller belongs to, if any.
#[inline]
pub(crate) fn current_thread() -> Option<&'static CThread> {
    current_task().map(|t| {
        // SAFETY: as in `Task::thread`, for the 'static of the running task.
        unsafe { &*t.thread.get() }
    })
}

/// The runtime (a C program always runs inside it once `main` started).
pub(crate) fn rt() -> &'static Runtime {
    menps_omp::internals::runtime().unwrap_or_else(|| {
        die("an OpenMP entry point was called before main started or after it ended")
    })
}
