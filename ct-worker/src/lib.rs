//! Work-stealing user-level threads.
//!
//! A MassiveThreads-style scheduler built on `ct-context`'s ontop context
//! switches (ComposableThreads, Endo 2020, §5.2.2–5.3):
//!
//! - **Work-first fork**: [`spawn`] runs the child at once; the parent's
//!   continuation goes to the owner end of the worker's Chase–Lev deque, where
//!   idle workers can steal it. Without steals, a fork and its join cost a few
//!   dozen nanoseconds and two stack switches.
//! - **Lazy threads for [`join`]**: `join(a, b)` runs `a` at once and queues
//!   `b` as a job that becomes a thread only if an idle worker steals it or
//!   `a` blocks; otherwise the caller runs `b` inline. Without steals a join
//!   costs about as much as `rayon::join` (~10 ns), yet both closures may
//!   block anywhere.
//! - **Random-victim stealing** with a per-worker xorshift generator; idle
//!   workers spin briefly, yield, then sleep (waking when work is injected),
//!   so an idle runtime does not burn the machine's cores.
//! - **Join parks the joiner** in the child's descriptor; an exiting child
//!   hands control straight to a waiting joiner.
//! - **Suspended threads** ([`SuspendedThread`]): the slot every blocking
//!   construct of the higher crates (mutexes, condition variables,
//!   delegators, DSM waits) is built on. `notify` makes the woken thread
//!   runnable on the waker's worker; [`SuspendedThread::notify_home`] sends
//!   it back to the worker it parked on, into that worker's home queue
//!   (through its inbox when woken elsewhere). Other workers take threads
//!   from home queues and inboxes only after idling a while (a few
//!   microseconds), not the moment they run out of work, which keeps a
//!   barrier's waiters on their workers from episode to episode.
//! - **Idle hooks** ([`idle`]): actions a synchronization object leaves for
//!   a worker's idle time, run when the worker has no runnable thread left
//!   (and polled while it spins idle). `ct-sync`'s barrier publishes a
//!   worker's arrivals in one atomic operation that way and has each worker
//!   wake its own waiters.
//! - **One back-off** ([`Backoff`]) for every wait loop of the workspace:
//!   spin, yield (a user-level thread to its scheduler), then park an OS
//!   thread briefly; a worker thread never sleeps (that would stop every
//!   user-level thread on it).
//! - **Per-worker pools** of stacks and descriptors that return memory to the
//!   worker that allocated it.
//! - **Stack sources and switch hooks**: the configuration chooses where
//!   threads' stacks come from ([`StackSource`]; by default [`MmapStacks`],
//!   guarded and pooled) and a [`SwitchHook`] told before a worker enters a
//!   thread's stack and after it has left it (a DSM pins the running
//!   threads' stacks that way); the default [`NoHook`] costs nothing.
//! - **Aspects** ([`Aspect`]): zero-cost by default; [`StatsConfig`] counts
//!   scheduler events, [`TraceConfig`] writes a Chrome trace (`CT_TRACE=file`).
//! - **One program for every configuration**: the free functions ([`join`],
//!   [`spawn`], [`scope`], [`yield_now`], [`parallel_for`]) work in a
//!   runtime of any configuration — in one built with
//!   `build_with::<TraceConfig>()` a plain `join` forks and is traced. The
//!   `_in::<C>` forms ([`join_in`], …) are the same functions with their
//!   fast path in a runtime of configuration `C`; in another runtime they
//!   forward to the running one's (through references to the closures; a
//!   spawned closure is boxed).
//! - **[`UltItf`]**: the interface higher layers are written against, also
//!   implemented for plain OS threads ([`OsThreads`]).
//!
//! # Example
//!
//! ```
//! fn fib(n: u64) -> u64 {
//!     if n < 2 {
//!         return n;
//!     }
//!     let (a, b) = ct_worker::join(|| fib(n - 1), || fib(n - 2));
//!     a + b
//! }
//!
//! let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
//! assert_eq!(rt.block_on(|| fib(20)), 6765);
//!
//! // Threads that block and are resumed elsewhere:
//! let r = rt.block_on(|| {
//!     let h = ct_worker::spawn(|| {
//!         ct_worker::yield_now();
//!         ct_worker::current_worker_index().unwrap() < 2
//!     });
//!     h.join()
//! });
//! assert!(r);
//! ```
//!
//! # Configuration
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `CT_NUM_WORKERS` | worker OS threads | available CPUs |
//! | `CT_STACK_SIZE` | stack size per thread (`k`/`M` suffixes) | 128 KiB |
//! | `CT_TRACE` | trace file of [`TraceConfig`] runtimes (a file that cannot be created fails the build) | none |
//!
//! Builder settings override the environment.
//!
//! # Public API
//!
//! Everything exported at the crate root, [`idle`] and [`suspended`] is the
//! public API: runtimes and their builder, the free functions, join
//! handles, scopes, configurations ([`Config`], the bundled ones, [`Custom`]
//! with a [`DequeKind`], [`Aspect`]s, [`StackSource`], [`SwitchHook`]),
//! suspended threads, idle hooks, ULT-local storage and [`UltItf`]. The
//! worker deque types and the `membarrier` wrapper are in [`unstable`]:
//! the workspace's other crates use them, but they are not part of the API
//! and may change in any release.
//!
//! Non-fatal trouble (a runtime dropped from one of its own threads, a
//! panicking ULT-local destructor) is reported through the `log` crate at
//! `warn` level; a program without a logger of its own sees it after
//! calling [`log_to_stderr`].
//!
//! # Thread-locals
//!
//! A user-level thread may resume on another OS thread after any blocking
//! call (`join`, `yield_now`, a mutex). Do not hold a `thread_local!`
//! reference across such calls; use [`ult_local!`] for per-thread state that
//! follows the user-level thread.

#![warn(missing_docs)]

mod aspect;
mod backoff;
mod config;
mod deque;
mod error;
mod handle;
mod hook;
pub mod idle;
mod itf;
mod join_state;
mod local;
mod log_stderr;
mod membarrier;
mod os;
mod os_waiter;
mod parallel;
mod pool;
mod remote_list;
mod rng;
mod runtime;
mod scope;
mod stack;
pub mod suspended;
mod sync;
mod task;
pub mod unstable;
mod worker;

pub use aspect::{Aspect, AspectInit, NoAspect, StatsAspect, TraceAspect, WorkerStats};
pub use backoff::Backoff;
pub use config::{
    AsymmetricConfig, AsymmetricKind, ChaseLevKind, Config, Custom, DefaultConfig, DequeKind,
    LockedKind, StatsConfig, TraceConfig,
};
pub use error::{Error, Result};
pub use handle::{
    Deferred, JoinHandle, defer_in, join, join_in, spawn, spawn_in, try_spawn_in,
    with_current_thread_word_in, yield_now, yield_now_in,
};
pub use hook::{LeaveReason, NoHook, SwitchHook, UltThread};
pub use idle::{IdleHook, IdleMode, defer_until_idle};
pub use itf::{JoinHandleItf, SuspendedThreadItf, Ult, UltItf};
pub use local::UltLocalKey;
pub use log_stderr::log_to_stderr;
pub use os::{OsSuspendedThread, OsThreads};
pub use parallel::{parallel_for, parallel_for_in};
pub use runtime::{
    Builder, BuilderPart, DEFAULT_STACK_SIZE, DefaultPart, Given, Runtime, allowed_cpus,
};
pub use scope::{Scope, ScopedJoinHandle, scope, scope_in};
pub use stack::{MmapStackCache, MmapStackHandle, MmapStacks, StackSource};
pub use suspended::SuspendedThread;

/// Index of the worker running the caller, or `None` outside any runtime.
///
/// A user-level thread may move to another worker whenever it blocks or
/// yields, so the value is only a snapshot.
pub fn current_worker_index() -> Option<usize> {
    worker::current_info().map(|(_, i, _)| i)
}

/// Number of workers of the runtime running the caller (1 outside a runtime).
pub fn num_workers() -> usize {
    worker::current_info().map_or(1, |(_, _, n)| n)
}

/// Identity of the running user-level thread (the same value its
/// [`SwitchHook`] calls see as [`UltThread::id`]), or `None` outside any.
pub fn current_thread_id() -> Option<usize> {
    worker::current_thread().map(|(id, _, _)| id)
}

/// The word of the running user-level thread that belongs to the program
/// (a runtime built on ct-worker keeps its per-thread context there, e.g. a
/// pointer to an OpenMP thread's state): 0 when the thread starts, set
/// with [`set_current_thread_word`]; `None` outside any user-level thread.
/// One load, unlike ULT-local storage ([`ult_local!`]), which a thread
/// creates on first use.
#[inline]
pub fn current_thread_word() -> Option<usize> {
    // SAFETY: as in `current_thread_data`.
    worker::current_thread().map(|(_, _, w)| unsafe { w.as_ref() }.get())
}

/// Stores the word of the running user-level thread
/// ([`current_thread_word`]); returns `false` (and does nothing) outside any.
#[inline]
pub fn set_current_thread_word(v: usize) -> bool {
    match worker::current_thread() {
        Some((_, _, w)) => {
            // SAFETY: as in `current_thread_data`.
            unsafe { w.as_ref() }.set(v);
            true
        }
        None => false,
    }
}

/// Replaces the word of the running user-level thread
/// ([`current_thread_word`]) and returns the old one; `None` (and nothing
/// stored) outside any user-level thread.
#[inline]
pub fn replace_current_thread_word(v: usize) -> Option<usize> {
    worker::current_thread().map(|(_, _, w)| {
        // SAFETY: as in `current_thread_data`.
        unsafe { w.as_ref() }.replace(v)
    })
}

/// The hook word of the running user-level thread ([`UltThread::data`]), or
/// `None` outside any.
pub fn current_thread_data() -> Option<usize> {
    // SAFETY: the word lives in the running thread's descriptor, which lives
    // at least as long as the thread runs; only the worker running the thread
    // touches it meanwhile.
    worker::current_thread().map(|(_, d, _)| unsafe { d.as_ref() }.get())
}

/// Stores the hook word of the running user-level thread
/// ([`UltThread::set_data`]); returns `false` (and does nothing) outside any.
pub fn set_current_thread_data(v: usize) -> bool {
    match worker::current_thread() {
        Some((_, d, _)) => {
            // SAFETY: as in `current_thread_data`.
            unsafe { d.as_ref() }.set(v);
            true
        }
        None => false,
    }
}
