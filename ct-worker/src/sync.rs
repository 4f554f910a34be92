//! Atomics for the lock-free protocols, swappable for `loom`'s under
//! `--cfg loom` so that the protocols are model-checked as written.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// One round of waiting for another OS thread (spinning 1, 2, … 32 pause
/// instructions over the first rounds, then yielding the OS thread); `spins`
/// counts the rounds. Under loom, a loom yield.
pub(crate) fn snooze(spins: &mut u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    if *spins < 6 {
        for _ in 0..1u32 << *spins {
            core::hint::spin_loop();
        }
        *spins += 1;
    } else {
        std::thread::yield_now();
    }
}
