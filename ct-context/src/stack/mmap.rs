//! `mmap`'d stacks with guard pages.

use std::io;

use super::{Stack, StackRegion, page_size};
use crate::error::{Error, Result};
use crate::trap::{self, GuardSlot};

/// A stack in its own anonymous mapping, with inaccessible guard pages below it.
///
/// The guard pages are registered with [`crate::trap`], whose `SIGSEGV` handler
/// reports an overflow into them as `stack overflow in user-level thread` and
/// aborts the process. Memory is reserved lazily (`MAP_NORESERVE`): only the
/// pages a context touches cost physical memory.
#[derive(Debug)]
pub struct MmapStack {
    base: usize,
    mapping_len: usize,
    guard_len: usize,
    slot: Option<GuardSlot>,
}

// SAFETY: the mapping is owned exclusively by this value; nothing about it is
// tied to the creating thread.
unsafe impl Send for MmapStack {}
// SAFETY: `&MmapStack` only exposes the addresses of the mapping.
unsafe impl Sync for MmapStack {}

impl MmapStack {
    /// The smallest usable size accepted: 16 KiB.
    pub const MIN_SIZE: usize = 16 * 1024;

    /// Creates a stack of at least `size` usable bytes (rounded up to whole
    /// pages) with one guard page.
    pub fn new(size: usize) -> Result<Self> {
        Self::with_guard_pages(size, 1)
    }

    /// Creates a stack of at least `size` usable bytes with `guard_pages`
    /// inaccessible pages below it (at least one). More guard pages catch
    /// functions whose frames are larger than one page and that skip over a
    /// single guard page without touching it.
    pub fn with_guard_pages(size: usize, guard_pages: usize) -> Result<Self> {
        if size < Self::MIN_SIZE {
            return Err(Error::StackTooSmall {
                requested: size,
                minimum: Self::MIN_SIZE,
            });
        }
        if guard_pages == 0 || guard_pages > trap::MAX_GUARD_PAGES {
            return Err(Error::InvalidGuardPages {
                requested: guard_pages,
                maximum: trap::MAX_GUARD_PAGES,
            });
        }
        let page = page_size();
        let usable = size
            .checked_next_multiple_of(page)
            .ok_or(Error::StackTooLarge { requested: size })?;
        let guard_len = guard_pages * page;
        let mapping_len = usable
            .checked_add(guard_len)
            .ok_or(Error::StackTooLarge { requested: size })?;

        trap::install();

        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing aliases no existing memory.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                mapping_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::Mmap(io::Error::last_os_error()));
        }
        let base = base as usize;
        // SAFETY: `base + guard_len .. base + mapping_len` lies inside the
        // mapping we just created and own.
        let rc = unsafe {
            libc::mprotect(
                (base + guard_len) as *mut libc::c_void,
                usable,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            // SAFETY: unmapping the mapping we own; nothing references it yet.
            unsafe { libc::munmap(base as *mut libc::c_void, mapping_len) };
            return Err(Error::Mprotect(err));
        }
        let slot = trap::register_guard(base, guard_len);
        Ok(Self {
            base,
            mapping_len,
            guard_len,
            slot,
        })
    }

    /// The guard area below the stack: `(start, length)`.
    pub fn guard(&self) -> (usize, usize) {
        (self.base, self.guard_len)
    }

    /// Whether an overflow into this stack's guard pages will be reported (the
    /// registry of guard pages has a fixed capacity; see [`crate::trap`]).
    pub fn overflow_detected(&self) -> bool {
        self.slot.is_some()
    }
}

// SAFETY: the region is the read-write part of a mapping owned by `self` and
// unmapped only in `drop`.
unsafe impl Stack for MmapStack {
    fn region(&self) -> StackRegion {
        StackRegion::new(self.base + self.guard_len, self.base + self.mapping_len)
            .expect("mapping is non-empty")
    }
}

impl Drop for MmapStack {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            trap::unregister_guard(slot);
        }
        // SAFETY: the mapping is owned by `self`; `Stack`'s contract makes users
        // stop running on it before the stack is dropped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.mapping_len) };
    }
}
