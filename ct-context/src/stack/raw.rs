//! Stacks in caller-provided memory.

use super::{STACK_ALIGN, Stack, StackRegion};
use crate::error::{Error, Result};

/// A stack in memory that the caller owns, for example a slice of a DSM segment
/// (so that a thread's stack has the same address in every process) or a
/// pre-allocated arena.
///
/// `RawStack` does not free the memory. It has no guard page of its own: if the
/// caller wants overflow detection, it maps an inaccessible page below the
/// region and registers it with [`crate::trap::register_guard`].
#[derive(Debug, Clone, Copy)]
pub struct RawStack {
    region: StackRegion,
}

// SAFETY: a `RawStack` is a description of memory the caller vouched for in
// `RawStack::new`; it carries no thread affinity.
unsafe impl Send for RawStack {}
// SAFETY: as above; shared references only read the addresses.
unsafe impl Sync for RawStack {}

impl RawStack {
    /// The smallest usable size accepted: 4 KiB.
    pub const MIN_SIZE: usize = 4096;

    /// Describes the `len` bytes starting at `ptr` as a stack. The top is aligned
    /// down to 16 bytes.
    ///
    /// # Errors
    ///
    /// [`Error::StackTooSmall`] if fewer than [`RawStack::MIN_SIZE`] aligned bytes
    /// remain, [`Error::NullStack`] if `ptr` is null.
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` must be readable and writable memory that nothing else
    /// uses while a context runs on it and that outlives every context created
    /// on it.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Result<Self> {
        if ptr.is_null() {
            return Err(Error::NullStack);
        }
        let bottom = ptr as usize;
        let top = bottom
            .checked_add(len)
            .ok_or(Error::StackTooLarge { requested: len })?;
        let region = StackRegion::new(bottom, top & !(STACK_ALIGN - 1));
        match region {
            Some(region) if region.len() >= Self::MIN_SIZE => Ok(Self { region }),
            _ => Err(Error::StackTooSmall {
                requested: len,
                minimum: Self::MIN_SIZE,
            }),
        }
    }
}

// SAFETY: the caller of `RawStack::new` promised the region is usable memory
// that outlives the stack.
unsafe impl Stack for RawStack {
    fn region(&self) -> StackRegion {
        self.region
    }
}
