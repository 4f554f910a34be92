//! Anonymous memory for registration with the adapter: fresh page-aligned
//! mappings (window parts, staging pools), their release, and the
//! inaccessible reservation that replaces a destroyed window's part.

use crate::com::Result;

/// A fresh zero-filled read-write anonymous mapping of `len` bytes
/// (`share`: `MAP_SHARED` or `MAP_PRIVATE`); `what` names the call in the
/// error.
pub(super) fn map_anonymous(len: usize, share: libc::c_int, what: &'static str) -> Result<*mut u8> {
    // SAFETY: a fresh mapping chosen by the kernel; it overlaps nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            share | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(crate::sys::os_error(what));
    }
    Ok(p.cast())
}

/// Unmaps `len` bytes at `base`.
///
/// # Safety
/// `base..base + len` must be a mapping of [`map_anonymous`] that is no
/// longer registered nor used.
pub(super) unsafe fn unmap(base: *mut u8, len: usize) {
    // SAFETY: per the contract.
    unsafe { libc::munmap(base.cast(), len) };
}

/// Replaces `len` bytes at `base` with an inaccessible reservation that is
/// never unmapped, so that stale pointers fault instead of reaching memory
/// reused for something else.
///
/// # Safety
/// As [`unmap`].
pub(super) unsafe fn retire(base: *mut u8, len: usize) {
    // SAFETY: per the contract, the range is ours and unused; MAP_FIXED
    // replaces exactly it.
    unsafe {
        libc::mmap(
            base.cast(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
}
