//! [`UltItf`] on plain OS threads: one `std::thread` per thread, parking by
//! `std::thread::park`. The same synchronisation code then runs without any
//! user-level scheduler.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::itf::{JoinHandleItf, SuspendedThreadItf, UltItf};
use crate::os_waiter;

/// OS threads as a threading interface.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsThreads;

/// A slot for one parked OS thread.
#[derive(Debug, Default)]
pub struct OsSuspendedThread {
    word: AtomicUsize,
}

impl OsSuspendedThread {
    /// An empty slot.
    pub const fn new() -> Self {
        OsSuspendedThread {
            word: AtomicUsize::new(0),
        }
    }

    fn park_decision(&self, word: usize, decide: impl FnOnce() -> bool) -> bool {
        self.word.store(word, Ordering::Release);
        decide()
            || self
                .word
                .compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
    }
}

impl SuspendedThreadItf for OsSuspendedThread {
    fn wait_with(&self, decide: impl FnOnce() -> bool) -> bool {
        os_waiter::park_if(|word| self.park_decision(word, decide))
    }

    fn notify(&self) -> bool {
        match self.word.swap(0, Ordering::AcqRel) {
            0 => false,
            w => {
                // SAFETY: the swap gave us this waiter's wake-up.
                unsafe { os_waiter::wake(w) };
                true
            }
        }
    }

    fn enter(&self) -> bool {
        self.notify()
    }

    fn is_empty(&self) -> bool {
        self.word.load(Ordering::Acquire) == 0
    }
}

impl<T: Send + 'static> JoinHandleItf<T> for std::thread::JoinHandle<T> {
    fn join(self) -> T {
        match std::thread::JoinHandle::join(self) {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    fn is_finished(&self) -> bool {
        std::thread::JoinHandle::is_finished(self)
    }
}

static NEXT_INDEX: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

impl UltItf for OsThreads {
    type SuspendedThread = OsSuspendedThread;
    type JoinHandle<T: Send + 'static> = std::thread::JoinHandle<T>;

    fn spawn<F, T>(f: F) -> std::thread::JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        std::thread::spawn(f)
    }

    fn yield_now() {
        std::thread::yield_now();
    }

    /// A per-OS-thread number assigned on first use, modulo `num_workers`.
    fn worker_index() -> usize {
        let i = INDEX.with(|c| match c.get() {
            Some(i) => i,
            None => {
                let i = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
                c.set(Some(i));
                i
            }
        });
        i % Self::num_workers()
    }

    fn num_workers() -> usize {
        // available_parallelism reads cgroup files: ask once.
        static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn os_slot_handshake() {
        let slot = Arc::new(OsSuspendedThread::new());
        let s2 = slot.clone();
        let t = std::thread::spawn(move || {
            assert!(s2.wait_with(|| true));
            7
        });
        while slot.is_empty() {
            std::thread::yield_now();
        }
        assert!(slot.notify());
        assert_eq!(JoinHandleItf::join(t), 7);
        assert!(
            !slot.wait_with(|| false),
            "a refusing decision does not park"
        );
        assert!(slot.is_empty());
    }
}
