//! A per-OS-thread cache of small, fixed-size memory blocks for lock queue
//! nodes, which returns blocks to the thread that allocated them.
//!
//! An MCS node must outlive the `lock` call that enqueues it (the holder's
//! node stays in the queue until `unlock`), so it cannot live on the caller's
//! stack. Allocating one per `lock` from the global allocator would dominate
//! an uncontended lock, so nodes come from this cache. `ct-delegate` uses the
//! same cache for its queue entries.
//!
//! Blocks are often freed on another thread than the one that took them (a
//! delegated request is allocated by its requester and freed by the consumer;
//! a user-level thread may migrate while it holds a lock). Freeing into the
//! freeing thread's cache would make memory drift to the consumers while the
//! requesters fall back to `malloc` for every node. Instead every block
//! remembers its owner, and a block freed elsewhere goes onto the owner's
//! lock-free return list, which the owner takes in one swap when its own
//! list runs dry.
//!
//! The cache is per OS thread, which is safe for user-level threads too: a
//! `take` or `put` never switches context, so a user-level thread cannot
//! migrate in the middle of one. The accessors are never inlined, so the
//! compiler cannot reuse one thread's cache address after a context switch
//! moved the caller to another OS thread. When a thread exits, its cache is
//! freed; blocks returned to it later go back to the global allocator (a
//! 16-byte owner record per exited thread stays allocated).

use core::alloc::Layout;
use core::cell::UnsafeCell;
use core::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Usable size of every block, aligned to 16.
pub const BLOCK_SIZE: usize = 64;
/// Bytes before the usable part: the owner and the return-list link.
const HEADER: usize = 16;
/// Free blocks a thread keeps locally.
const CACHE_CAP: usize = 256;

/// Marks an owner whose thread has exited.
const ORPHANED: *mut Header = std::ptr::dangling_mut::<Header>();

#[repr(C)]
struct Header {
    owner: *const Owner,
    next: *mut Header,
}

/// What other threads need to return blocks to a thread.
struct Owner {
    returned: AtomicPtr<Header>,
}

fn layout() -> Layout {
    Layout::from_size_align(HEADER + BLOCK_SIZE, 16).expect("valid layout")
}

struct Cache {
    owner: &'static Owner,
    free: Vec<NonNull<Header>>,
}

impl Cache {
    fn new() -> Self {
        Cache {
            owner: Box::leak(Box::new(Owner {
                returned: AtomicPtr::new(ptr::null_mut()),
            })),
            free: Vec::new(),
        }
    }

    fn take(&mut self) -> NonNull<Header> {
        if let Some(h) = self.free.pop() {
            return h;
        }
        // Take everything other threads returned.
        let mut p = self.owner.returned.swap(ptr::null_mut(), Ordering::Acquire);
        while let Some(h) = NonNull::new(p) {
            // SAFETY: blocks on our return list are free and ours.
            p = unsafe { h.as_ref().next };
            self.free.push(h);
        }
        if let Some(h) = self.free.pop() {
            return h;
        }
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { std::alloc::alloc(layout()) } as *mut Header;
        let h = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout()));
        // SAFETY: fresh allocation of at least a header.
        unsafe {
            h.as_ptr().write(Header {
                owner: self.owner,
                next: ptr::null_mut(),
            })
        };
        h
    }

    fn put_local(&mut self, h: NonNull<Header>) {
        if self.free.len() < CACHE_CAP {
            self.free.push(h);
        } else {
            // SAFETY: allocated with `layout()`; free and ours.
            unsafe { std::alloc::dealloc(h.as_ptr() as *mut u8, layout()) };
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // Refuse further returns, then free everything we hold.
        let mut p = self.owner.returned.swap(ORPHANED, Ordering::AcqRel);
        while let Some(h) = NonNull::new(p) {
            // SAFETY: returned blocks are free and ours.
            p = unsafe { h.as_ref().next };
            // SAFETY: as above.
            unsafe { std::alloc::dealloc(h.as_ptr() as *mut u8, layout()) };
        }
        for h in self.free.drain(..) {
            // SAFETY: cached blocks are free and ours.
            unsafe { std::alloc::dealloc(h.as_ptr() as *mut u8, layout()) };
        }
    }
}

std::thread_local! {
    static CACHE: UnsafeCell<Option<Cache>> = const { UnsafeCell::new(None) };
}

/// A block of [`BLOCK_SIZE`] bytes aligned to 16.
#[inline(never)]
pub fn take() -> NonNull<u8> {
    let h = CACHE
        // SAFETY: the cache is only touched by this OS thread, never
        // re-entrantly (nothing in here calls back into user code).
        .try_with(|c| unsafe { (*c.get()).get_or_insert_with(Cache::new).take() })
        .unwrap_or_else(|_| {
            // Thread-local storage is being torn down: plain allocation, with
            // no owner to return to.
            // SAFETY: the layout has non-zero size.
            let raw = unsafe { std::alloc::alloc(layout()) } as *mut Header;
            let h = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout()));
            // SAFETY: fresh allocation.
            unsafe {
                h.as_ptr().write(Header {
                    owner: ptr::null(),
                    next: ptr::null_mut(),
                })
            };
            h
        });
    // SAFETY: the usable part follows the header inside the block.
    unsafe { NonNull::new_unchecked((h.as_ptr() as *mut u8).add(HEADER)) }
}

/// Returns a block from [`take`] (possibly taken on another thread) to the
/// thread that allocated it.
///
/// # Safety
///
/// `p` must come from [`take`] and not be used afterwards.
#[inline(never)]
pub unsafe fn put(p: NonNull<u8>) {
    // SAFETY: every block handed out has its header right before it.
    let h = unsafe { NonNull::new_unchecked(p.as_ptr().sub(HEADER) as *mut Header) };
    // SAFETY: as above.
    let owner = unsafe { h.as_ref().owner };
    let local = CACHE
        // SAFETY: as in `take`.
        .try_with(|c| unsafe {
            match (*c.get()).as_mut() {
                Some(cache) if ptr::eq(cache.owner, owner) => {
                    cache.put_local(h);
                    true
                }
                _ => false,
            }
        })
        .unwrap_or(false);
    if local {
        return;
    }
    if owner.is_null() {
        // SAFETY: an ownerless block from `take`, allocated with `layout()`.
        unsafe { std::alloc::dealloc(h.as_ptr() as *mut u8, layout()) };
        return;
    }
    // SAFETY: owner records are never freed.
    let returned = unsafe { &(*owner).returned };
    let mut head = returned.load(Ordering::Relaxed);
    loop {
        if head == ORPHANED {
            // Its thread has exited.
            // SAFETY: the block is free; allocated with `layout()`.
            unsafe { std::alloc::dealloc(h.as_ptr() as *mut u8, layout()) };
            return;
        }
        // SAFETY: the block is ours until the CAS publishes it.
        unsafe { (*h.as_ptr()).next = head };
        match returned.compare_exchange_weak(head, h.as_ptr(), Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(cur) => head = cur,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_return_to_their_owner() {
        let p = take();
        let addr = p.as_ptr() as usize;
        // Freed on another thread: it goes back to us, not to that thread.
        let q = p.as_ptr() as usize;
        std::thread::spawn(move || {
            // SAFETY: the block came from `take` and is not used again.
            unsafe { put(NonNull::new(q as *mut u8).unwrap()) }
        })
        .join()
        .unwrap();
        // Our local list is empty, so the next take drains the return list.
        let again = take();
        assert_eq!(
            again.as_ptr() as usize,
            addr,
            "the returned block is reused by its owner"
        );
        // SAFETY: from `take`, unused afterwards.
        unsafe { put(again) };
    }

    #[test]
    fn blocks_outlive_their_thread() {
        let q = std::thread::spawn(|| take().as_ptr() as usize)
            .join()
            .unwrap();
        // The owner has exited: the block is freed, not leaked or reused.
        // SAFETY: from `take`, unused afterwards.
        unsafe { put(NonNull::new(q as *mut u8).unwrap()) };
    }
}
