//! Mutexes, condition variables and barriers that park user-level threads.
//!
//! The ComposableThreads synchronisation layer (Endo 2020, §5.2.4, §5.3.1),
//! built on `ct-worker`'s suspended threads:
//!
//! - [`Mutex`] / [`RawMutex`]: an MCS queue lock with **direct hand-off** —
//!   a waiter parks in its predecessor's queue node and links itself only
//!   after it has parked; unlock hands the lock to the successor and makes it
//!   runnable on the unlocking worker.
//!   [`RawMutex::unlock_and_wait`] releases the lock and parks in one step.
//! - [`Condvar`]: FIFO wake-up order (the original woke LIFO).
//! - [`Barrier`]: counter plus per-arrival slots with sense reversal; the last
//!   arriver wakes everybody in one batch, so more workers do not make it
//!   slower.
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
pub use mutex::{Mutex, MutexGuard, RawMutex};
pub use spinlock::{McsSpinLock, SpinLock, SpinLockGuard};
pub use sync::Backoff;

/// Atomic types used by [`McsNode`] (loom's under `--cfg loom`).
pub mod atomic {
    #[cfg(loom)]
    pub use loom::sync::atomic::AtomicPtr;
    #[cfg(not(loom))]
    pub use std::sync::atomic::AtomicPtr;
}
