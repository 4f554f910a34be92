//! Mutexes, condition variables and barriers that park user-level threads.
//!
//! The ComposableThreads synchronisation layer (Endo 2020, §5.2.4, §5.3.1),
//! built on `ct-worker`'s suspended threads:
//!
//! - [`Mutex`] on [`RawMutex`] (the default): one CAS to lock, a store and a
//!   load to unlock (an asymmetric fence with `membarrier` keeps parked
//!   waiters from being missed); on a one-worker runtime the mutex is biased
//!   to the worker's OS thread and locks with plain loads and stores; waiters park in FIFO order, a running
//!   thread may barge in ahead of a woken one, and a waiter that keeps losing
//!   gets the lock handed to it.
//! - [`FairMutex`] on [`RawFairMutex`]: the MCS queue lock with **direct
//!   hand-off** — a waiter parks in its predecessor's queue node and links
//!   itself only after it has parked; unlock hands the lock to the successor
//!   and makes it runnable on the unlocking worker. Strict FIFO.
//! - Both implement [`RawLock`], whose [`unlock_and_wait`](RawLock::unlock_and_wait)
//!   releases the lock and parks in one step.
//! - [`Condvar`]: FIFO wake-up order (the original woke LIFO).
//! - [`Barrier`]: sense reversal, with arrivals counted and waiters woken
//!   per worker — a worker's idle hook publishes its threads' arrivals in
//!   one atomic operation once they have all parked, and wakes them itself
//!   when it sees the next generation — so two workers run 50 threads'
//!   episodes faster than one; a thread alone on a worker that its runtime
//!   keeps awake polls for a few microseconds instead of parking, as a
//!   spinning barrier would.
//! - [`SpinLock`] and [`McsSpinLock`] for short internal sections, and the
//!   [`McsCore`] queue shared with `ct-delegate`.
//!
//! Everything is generic over the threading interface
//! ([`UltItf`](ct_worker::UltItf)): the default is `ct-worker`'s user-level
//! threads, and the same types work on plain OS threads with
//! [`OsThreads`](ct_worker::OsThreads), e.g. `Mutex::<u64, OsThreads>::new_in(0)`.
//!
//! The lock protocols have `loom` models (`RUSTFLAGS="--cfg loom" cargo test
//! -p ct-sync --release --lib loom`) that run them with loom's threads in
//! place of user-level threads.

#![warn(missing_docs)]

mod barrier;
mod condvar;
pub mod mcs_core;
pub mod mutex;
pub mod node_pool;
mod spinlock;
mod sync;

/// A threading interface made of loom threads, for model-checking code that
/// is generic over [`UltItf`](ct_worker::UltItf) (only under `--cfg loom`).
#[cfg(loom)]
pub mod loom_itf;

pub use barrier::{Barrier, BarrierWaitResult};
pub use condvar::Condvar;
pub use mcs_core::{McsCore, McsNode};
pub use mutex::{FairMutex, Mutex, MutexGuard, RawFairMutex, RawLock, RawMutex};
pub use spinlock::{McsSpinLock, SpinLock, SpinLockGuard};
pub use sync::{Backoff, ProtocolCell};

/// Atomic types used by [`McsNode`] (loom's under `--cfg loom`).
pub mod atomic {
    #[cfg(loom)]
    pub use loom::sync::atomic::AtomicPtr;
    #[cfg(not(loom))]
    pub use std::sync::atomic::AtomicPtr;
}
