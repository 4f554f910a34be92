//! Atomics for the delegation protocols, swappable for `loom`'s under
//! `--cfg loom`, and a back-off helper for short waits.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// Waits a little: processor spin hints first, then `yield_now` (under loom,
/// always a loom yield so that the model makes progress).
pub(crate) struct Backoff {
    #[cfg(not(loom))]
    step: u32,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            #[cfg(not(loom))]
            step: 0,
        }
    }

    #[inline]
    pub(crate) fn snooze(&mut self, yield_now: impl FnOnce()) {
        #[cfg(loom)]
        {
            let _ = yield_now;
            loom::thread::yield_now();
        }
        #[cfg(not(loom))]
        {
            if self.step < 6 {
                for _ in 0..1u32 << self.step {
                    core::hint::spin_loop();
                }
                self.step += 1;
            } else {
                yield_now();
            }
        }
    }
}
