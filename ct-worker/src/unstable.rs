//! **Unstable**: scheduler internals that the workspace's other crates,
//! tests and benchmarks use. Not part of ct-worker's public API: anything
//! here may change or disappear in any release, without notice.
//!
//! - The worker deques ([`ChaseLev`], [`AsymmetricChaseLev`],
//!   [`LockedDeque`]) and their traits ([`WorkerDeque`], [`DequeStealer`],
//!   [`Steal`]). A configuration chooses its deque through the stable
//!   [`DequeKind`](crate::DequeKind) types ([`ChaseLevKind`](crate::ChaseLevKind),
//!   [`AsymmetricKind`](crate::AsymmetricKind),
//!   [`LockedKind`](crate::LockedKind)); naming a deque type directly, or
//!   writing one, needs this module.
//! - [`membarrier`]: the heavy side of asymmetric fences (Linux
//!   `membarrier(2)`), which `ct-sync`'s mutexes pair with compiler fences.

pub use crate::deque::{
    AsymmetricChaseLev, AsymmetricStealer, ChaseLev, ChaseLevStealer, DequeStealer, LockedDeque,
    LockedStealer, Steal, WorkerDeque,
};

pub mod membarrier {
    //! The heavy side of asymmetric memory barriers: Linux
    //! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which returns only
    //! after every other running thread of the process has executed a full
    //! memory barrier. Call [`available`] first (it registers the process);
    //! [`barrier`] is valid only after it returned `true`.
    pub use crate::membarrier::{available, barrier};
}
