//! Parking an OS thread (not a user-level thread) until a user-level thread
//! wakes it: how `block_on` and joins from outside a runtime wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, Thread};

/// A parked OS thread, on that thread's own stack. Its waiter word is its
/// address with the low bit set (user-level waiters have it clear).
#[repr(align(8))]
pub(crate) struct OsWaiter {
    thread: Thread,
    done: AtomicBool,
}

impl OsWaiter {
    pub(crate) fn new() -> Self {
        OsWaiter {
            thread: thread::current(),
            done: AtomicBool::new(false),
        }
    }

    /// The waiter word to register.
    pub(crate) fn word(&self) -> usize {
        self as *const OsWaiter as usize | 1
    }

    /// Parks until [`wake`] was called for this waiter.
    pub(crate) fn wait(&self) {
        while !self.done.load(Ordering::Acquire) {
            thread::park();
        }
    }
}

/// Parks the calling OS thread if `register(word)` — given the word of a
/// waiter for it, to make it wakeable — says so (`true`: registered), until
/// [`wake`] is called for that word. Returns whether it parked.
pub(crate) fn park_if(register: impl FnOnce(usize) -> bool) -> bool {
    let waiter = OsWaiter::new();
    let parked = register(waiter.word());
    if parked {
        waiter.wait();
    }
    parked
}

/// Wakes the waiter with word `word`.
///
/// # Safety
///
/// `word` must come from [`OsWaiter::word`] of a waiter that is (or will be)
/// waiting and has not been woken.
pub(crate) unsafe fn wake(word: usize) {
    // SAFETY: per the contract the waiter is alive until `done` is set.
    let w = unsafe { &*((word & !1) as *const OsWaiter) };
    // Clone the handle first: once `done` is set the waiter may return and its
    // stack frame (holding `w`) may be gone.
    let t = w.thread.clone();
    w.done.store(true, Ordering::Release);
    t.unpark();
}
