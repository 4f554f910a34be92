//! A one-shot completion a delegating thread can wait on.

use ct_worker::{SuspendedThreadItf, Ult, UltItf};

use crate::sync::{AtomicBool, Backoff, Ordering};

/// Signals that a delegated request is done, waking the thread that waits
/// for it.
///
/// Typically it lives on the waiting thread's stack; the request carries a
/// [`CompletionRef`] to it, and whoever executes the request calls
/// [`CompletionRef::complete`] once. [`Completion::wait`] parks until then.
/// Completing never touches the completion after the waiter may have been
/// released, so the waiter may return (and free it) at once.
pub struct Completion<U: UltItf = Ult> {
    done: AtomicBool,
    /// Set after the completer's last access.
    released: AtomicBool,
    waiter: U::SuspendedThread,
}

impl<U: UltItf> Default for Completion<U> {
    fn default() -> Self {
        Self::new()
    }
}

impl<U: UltItf> core::fmt::Debug for Completion<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Completion")
            .field("done", &self.done.load(Ordering::Relaxed))
            .finish()
    }
}

impl<U: UltItf> Completion<U> {
    /// A pending completion.
    pub fn new() -> Self {
        Completion {
            done: AtomicBool::new(false),
            released: AtomicBool::new(false),
            waiter: U::SuspendedThread::default(),
        }
    }

    /// A handle to put in a request.
    pub fn handle(&self) -> CompletionRef<U> {
        CompletionRef(self as *const Completion<U>)
    }

    /// Whether [`CompletionRef::complete`] has been called.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Parks until the completion is signalled (returns at once if it was).
    pub fn wait(&self) {
        self.waiter.wait_with(|| !self.done.load(Ordering::Acquire));
        // The completer may still be inside `complete`; it is running (no
        // blocking between its two stores), so this wait is short.
        let mut backoff = Backoff::new();
        while !self.released.load(Ordering::Acquire) {
            backoff.snooze(U::yield_now);
        }
    }
}

/// A pointer to a [`Completion`] carried by a request.
pub struct CompletionRef<U: UltItf = Ult>(*const Completion<U>);

// SAFETY: a completion is shared between its waiter and its completer only
// through atomics and the suspended-thread slot.
unsafe impl<U: UltItf> Send for CompletionRef<U> {}

impl<U: UltItf> core::fmt::Debug for CompletionRef<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "CompletionRef({:p})", self.0)
    }
}

impl<U: UltItf> CompletionRef<U> {
    /// Signals the completion, waking its waiter.
    ///
    /// # Safety
    ///
    /// The completion must still be alive: its owner must be waiting for it
    /// (or about to) and not return before this call. Call it once.
    pub unsafe fn complete(self) {
        // SAFETY: per the contract, alive until `released` is set below.
        let c = unsafe { &*self.0 };
        c.done.store(true, Ordering::Release);
        c.waiter.notify();
        c.released.store(true, Ordering::Release);
    }
}
