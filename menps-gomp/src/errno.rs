//! Keeping the program's `errno` across the runtime's own work.
//!
//! A C program may set `errno` (or call something that fails) and look at
//! it after a barrier, a critical section or a lock: libgomp leaves it
//! alone there. This runtime's waits and DSM operations make system calls
//! (futex waits, `mprotect`, `sched_yield` …) that may set it, so every
//! entry point that can wait keeps the caller's value with a [`KeepErrno`].

use core::ffi::c_int;

/// Saves the calling thread's `errno` when made and writes it back when
/// dropped — through the location of the thread that drops it (a
/// user-level thread may resume on another OS thread).
pub(crate) struct KeepErrno(c_int);

impl KeepErrno {
    /// Saves the current `errno`.
    #[inline]
    pub(crate) fn new() -> Self {
        // SAFETY: the calling thread's errno.
        KeepErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for KeepErrno {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = self.0 };
    }
}
