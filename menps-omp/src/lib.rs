//! An OpenMP-style runtime for Rust programs on the MENPS distributed shared
//! memory: the same program runs as one process with N threads or as N
//! processes (on one machine through the embedded `shm` backend, or across
//! machines under `mpirun`), with **everything shared** — `main`'s locals,
//! its `Vec`s and `String`s, DSM globals.
//!
//! # The execution model
//!
//! [`run`] starts the job (or joins it) and runs the program's `main` on
//! process 0, on a call stack in the DSM. The other processes wait for work.
//! A parallel region ([`parallel`]) starts its closure on every process:
//! each process runs its share of the team as user-level threads on DSM
//! call stacks. Because stacks, heap (through menps-dsm's global allocator,
//! installed by this crate) and DSM globals are DSM memory at the same
//! address in every process, the closure may borrow `main`'s data; the DSM
//! fetches pages on first access and keeps them coherent at barriers and
//! locks (release consistency).
//!
//! ```no_run
//! fn main() -> Result<(), menps_omp::Error> {
//!     // 4 processes unless MENPS_NPROCS says otherwise; the team has
//!     // OMP_NUM_THREADS threads (a multiple of the processes).
//!     let r = menps_omp::Builder::new().processes(4).run(program)?;
//!     println!("{r}");
//!     Ok(())
//! }
//!
//! fn program() -> f64 {
//!     let n = 1_000_000;
//!     let x: Vec<f64> = (0..n).map(|i| i as f64).collect(); // DSM heap
//!     let mut y = vec![0.0; n];
//!     let out = menps_omp::SharedMut::new(&mut y);
//!     menps_omp::parallel(|t| {
//!         // #pragma omp for
//!         t.for_range(0..n).each_mut(&out, |i, yi| *yi = 2.0 * x[i]);
//!         // #pragma omp for reduction(+:sum)
//!         let sum = t.for_range(0..n).reduce(0.0, |a, i| a + x[i], |a, b| a + b);
//!         t.master(|| println!("sum = {sum}"));
//!     });
//!     y.iter().sum()
//! }
//! ```
//!
//! # Constructs
//!
//! | OpenMP | here |
//! |---|---|
//! | `parallel`, `num_threads` | [`parallel`], [`Parallel`] |
//! | `for`, `schedule(static/dynamic/guided/runtime/auto)`, `nowait` | [`Thread::for_range`] → [`Loop`], [`Schedule`] |
//! | `reduction` | [`Loop::reduce`], [`Thread::reduce`], [`parallel_reduce`] |
//! | `ordered` | [`Loop::each_ordered`], [`Ordered::run`] |
//! | `barrier`, `single`, `master`, `single copyprivate` | [`Thread::barrier`], [`Thread::single`], [`Thread::master`], [`Thread::single_copy`] |
//! | `critical`, `critical(name)` | [`Thread::critical`], [`Thread::critical_named`], [`sync::critical`] |
//! | `task`, `taskwait`, `taskgroup` | [`task_scope`], [`TaskScope::spawn`], [`TaskScope::taskwait`] |
//! | `omp_get_thread_num`, `omp_get_num_threads` | [`Thread::thread_num`], [`Thread::num_threads`] |
//! | `omp_get_max_threads`, `omp_set_num_threads`, `omp_in_parallel`, `omp_get_wtime` | [`max_threads`], [`set_num_threads`], [`in_parallel`], [`wtime`] |
//! | `omp_set_schedule`, `omp_get_schedule` | [`set_schedule`], [`schedule`] |
//! | locks, `atomic` | [`sync::Mutex`], [`sync::AtomicU64`] |
//! | `private` data | [`private`] (allocations kept out of the DSM) |
//!
//! Writing a slice in parallel needs no `unsafe`: wrap it in a
//! [`SharedMut`] and use [`Loop::each_mut`] or [`Loop::chunks_mut`]; read
//! what the threads wrote, in a later phase of the same region, through
//! [`SharedMut::view`]. Scratch memory of one thread belongs in this
//! process's private heap ([`private`]): DSM memory a thread writes is
//! published at every barrier.
//!
//! # What does not work across processes
//!
//! - `std::sync::Mutex`, `std::sync::atomic` and anything built on them
//!   (`Arc`'s count, `OnceLock`…) on shared data: a locked instruction is
//!   atomic only on one process's copy of a page. Use [`sync::Mutex`],
//!   [`sync::AtomicU64`], [`Thread::critical`] or reductions.
//! - `thread_local!` and `static` variables: each process (and each OS
//!   thread) has its own. Use DSM globals ([`dsm_global!`], [`global_ptr`])
//!   for shared statics and per-thread arrays indexed by
//!   [`Thread::thread_num`] for per-thread data.
//! - Data created before [`run`] (it is in the process's private heap):
//!   `main` is a plain `fn`, so it cannot capture any.
//! - Nested parallel regions run on one thread (nesting is off).
//!
//! # Performance across processes
//!
//! The DSM moves whole blocks (4 KiB pages of the heap, 8 KiB blocks of
//! call stacks) and publishes, at every barrier, what each process wrote
//! since the last one. What keeps a program fast:
//!
//! - Each thread writes its own contiguous part of a shared array (static
//!   schedules, [`Loop::chunks_mut`], [`Loop::rows_mut`]); pages written by
//!   two processes between two barriers are merged, which costs more.
//! - Few barriers: one per phase that needs the others' data. A loop that
//!   writes nothing shared can skip its barrier ([`Loop::nowait`]);
//!   reductions ([`Thread::reduce`]) exchange values without touching the
//!   DSM.
//! - Scratch memory of one thread in the private heap ([`private`]).
//! - Few, long regions: a region's team reads the starting thread's frame
//!   (the closure and what it borrows), fetched again by the other
//!   processes after that frame changed; a region costs a release of the
//!   starting process that travels with the fork and one DSM barrier
//!   besides.
//!
//! On one process there is no DSM traffic at all: barriers are in-process.
//!
//! # Environment
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `OMP_NUM_THREADS` | threads of a team, all processes together (a multiple of the processes) | processes × (processors / processes) |
//! | `OMP_SCHEDULE` | schedule of `Schedule::Runtime` loops (`static`, `dynamic,4`, `guided`, `auto`…) | `static` |
//! | `OMP_WAIT_POLICY` | `active`: waiting threads yield longer before they sleep, and idle workers stay awake for 1 s; `passive`: they sleep soon | in between: idle workers stay awake for 5 ms when each has a processor of its own |
//! | `OMP_PROC_BIND` | `close`, `spread`, `primary` or `true`: each team worker (OS thread) bound to a place of `OMP_PLACES`, placed as OpenMP places team thread `rank × workers + i` (team threads normally stay on their worker, but another worker of their process may run one for a while) | `false` (`true` when `OMP_PLACES` is set) |
//! | `OMP_PLACES` | `threads`, `cores`, `sockets` (optional count), or places in braces (`{0,1},{2:2}`) | `threads` |
//! | `OMP_STACKSIZE` | call stack of a team thread (`512K`, `1M`; a bare number is KiB; at most 1 MiB) | 128 KiB |
//! | `MENPS_NPROCS` | processes of a job started by [`run`] | [`Builder::processes`], else 1 |
//! | `MENPS_DSM_*` | the DSM's settings (protocol, heap size, stacks per process …; see menps-dsm); programs of this runtime keep 16384 write notices (`MENPS_DSM_WN_LIST`) and at least 4 stacks per team thread of a process (`MENPS_DSM_STACKS`) unless told otherwise | |
//!
//! A builder setting wins over the `OMP_*` variable, which wins over the
//! default.
//!
//! # Features
//!
//! - `global-allocator` (default): menps-dsm's `DsmAllocator` becomes the
//!   program's global allocator. A program that installs its own must turn
//!   it off and install `DsmAllocator` itself, or nothing allocated by
//!   `main` is shared.
//! - `mpi`: join `mpirun` jobs (menps-dsm's MPI backend).

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

mod affinity;
mod error;
mod loops;
mod reduce;
mod region;
mod runtime;
mod schedule;
mod shared;
mod stats;
pub mod sync;
mod tasks;
mod wait;
mod worksharing;

pub use error::Error;
pub use loops::{Loop, Ordered};
pub use reduce::parallel_reduce;
pub use region::{
    Parallel, Thread, global_ptr, in_parallel, max_threads, num_processes, parallel, process_rank,
    schedule, set_num_threads, set_schedule, wtime,
};
pub use runtime::{Builder, NUM_THREADS_VAR, SCHEDULE_VAR, STACKSIZE_VAR, WAIT_POLICY_VAR, run};
pub use schedule::{Schedule, static_block};
pub use shared::{SharedMut, SharedView, private};
pub use stats::process_stats;
pub use tasks::{TaskScope, task_scope};

/// The runtime's internals that the libgomp interface (the `menps-gomp`
/// package) builds on. Not a stable API.
#[doc(hidden)]
pub mod internals {
    pub use crate::affinity::{Binding, ProcBind, place_num};
    pub use crate::runtime::{
        AfterDsm, Com, ProgramDsm, Runtime, Settings, StartHooks, run_in_job, runtime,
    };
    pub use crate::schedule::{guided_chunk, static_block};
    pub use crate::sync::{Held, lock, name_key, unlock};
    pub use crate::wait::Waiter;
    pub use crate::worksharing::{LOCK_SLOTS, NEXT, ORD, WsRing};
}

/// A global variable in the DSM, declared with [`dsm_global!`].
pub use menps_dsm::dsm::DsmGlobal;
/// menps-dsm's statistics of one process.
pub use menps_dsm::dsm::StatsSnapshot;
/// Declares global variables that live in the DSM (shared by every
/// process); [`global_ptr`] gives their address.
pub use menps_dsm::dsm_global;

#[cfg(feature = "global-allocator")]
#[global_allocator]
static ALLOCATOR: menps_dsm::dsm::DsmAllocator = menps_dsm::dsm::DsmAllocator;
