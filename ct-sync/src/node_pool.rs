//! A per-OS-thread cache of small, fixed-size memory blocks for lock queue
//! nodes.
//!
//! An MCS node must outlive the `lock` call that enqueues it (the holder's
//! node stays in the queue until `unlock`), so it cannot live on the
//! caller's stack. Allocating one per `lock` from the global allocator would
//! dominate an uncontended lock, so nodes come from this cache.
//!
//! The cache is per OS thread, which is safe for user-level threads too: a
//! `take` or `put` never switches context, so a user-level thread cannot
//! migrate in the middle of one. A block taken on one thread and returned on
//! another simply changes caches. The accessors are never inlined, so the
//! compiler cannot reuse one thread's cache address after a context switch
//! moved the caller to another OS thread.

use core::alloc::Layout;
use core::cell::UnsafeCell;
use core::ptr::NonNull;

/// Size and alignment of every block.
pub(crate) const BLOCK_SIZE: usize = 64;
const BLOCK_ALIGN: usize = 16;
/// Free blocks a thread keeps.
const CACHE_CAP: usize = 256;

fn layout() -> Layout {
    Layout::from_size_align(BLOCK_SIZE, BLOCK_ALIGN).expect("valid layout")
}

struct Cache(Vec<NonNull<u8>>);

impl Drop for Cache {
    fn drop(&mut self) {
        for p in self.0.drain(..) {
            // SAFETY: every cached block was allocated with `layout()`.
            unsafe { std::alloc::dealloc(p.as_ptr(), layout()) };
        }
    }
}

std::thread_local! {
    static CACHE: UnsafeCell<Cache> = const { UnsafeCell::new(Cache(Vec::new())) };
}

/// A block of [`BLOCK_SIZE`] bytes aligned to 16.
#[inline(never)]
pub(crate) fn take() -> NonNull<u8> {
    let cached = CACHE
        // SAFETY: the cache is only touched by this OS thread, and never
        // re-entrantly (no callbacks run while it is borrowed).
        .try_with(|c| unsafe { (*c.get()).0.pop() })
        .ok()
        .flatten();
    match cached {
        Some(p) => p,
        None => {
            // SAFETY: the layout has non-zero size.
            let p = unsafe { std::alloc::alloc(layout()) };
            NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout()))
        }
    }
}

/// Returns a block from [`take`] (possibly taken on another thread).
///
/// # Safety
///
/// `p` must come from [`take`] and not be used afterwards.
#[inline(never)]
pub(crate) unsafe fn put(p: NonNull<u8>) {
    let kept = CACHE
        // SAFETY: as in `take`.
        .try_with(|c| unsafe {
            let v = &mut (*c.get()).0;
            if v.len() < CACHE_CAP {
                v.push(p);
                true
            } else {
                false
            }
        })
        .unwrap_or(false);
    if !kept {
        // SAFETY: allocated with `layout()` by `take`.
        unsafe { std::alloc::dealloc(p.as_ptr(), layout()) };
    }
}
