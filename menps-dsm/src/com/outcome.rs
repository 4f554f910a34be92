//! The result cell of an offloaded operation, shared by the offloading
//! backends (`mpi`, `verbs`): written while the operation is in flight by
//! the device (under the offloader's device lock), read once by the
//! completion callback.

use std::cell::UnsafeCell;
use std::sync::Arc;

use super::{Error, Result};

/// Where a command's result goes: the fetched word (atomics) or an error,
/// plus the origin operands MPI may read until the operation completes.
pub(crate) struct Outcome {
    result: UnsafeCell<u64>,
    /// Operands MPI reads until completion (verbs copies them into the work
    /// request instead).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    origin: UnsafeCell<u64>,
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    compare: UnsafeCell<u64>,
    error: UnsafeCell<Option<Error>>,
}

// SAFETY: the cells are written by MPI and by the device only while the
// command is in flight, under the offloader's device lock; the completion
// callback reads them after the device reported the command, which happens
// after that lock was released by the thread that last wrote them (the
// lock's release/acquire orders the accesses). Nothing touches them
// concurrently.
unsafe impl Sync for Outcome {}
// SAFETY: plain data.
unsafe impl Send for Outcome {}

impl Outcome {
    /// The fetched word's cell (written by the device or the library).
    pub(crate) fn result_ptr(&self) -> *mut u64 {
        self.result.get()
    }

    /// The first operand's cell (new value or delta).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn origin_ptr(&self) -> *mut u64 {
        self.origin.get()
    }

    /// The second operand's cell (expected value).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn compare_ptr(&self) -> *mut u64 {
        self.compare.get()
    }

    /// A fresh outcome with the atomic operands `origin` (new value or delta)
    /// and `compare` (expected value).
    pub(crate) fn new(origin: u64, compare: u64) -> Arc<Self> {
        Arc::new(Outcome {
            result: UnsafeCell::new(0),
            origin: UnsafeCell::new(origin),
            compare: UnsafeCell::new(compare),
            error: UnsafeCell::new(None),
        })
    }

    pub(crate) fn fail(&self, e: Error) {
        // SAFETY: called by the device while the command is in flight (see
        // the `Sync` impl).
        unsafe { *self.error.get() = Some(e) };
    }

    /// The result, once the device has reported the command.
    pub(crate) fn take(&self) -> Result<u64> {
        // SAFETY: the command was reported, so nothing writes the cells any
        // more (see the `Sync` impl); the completion callback is the only
        // reader.
        unsafe {
            match (*self.error.get()).take() {
                Some(e) => Err(e),
                None => Ok(*self.result.get()),
            }
        }
    }
}
