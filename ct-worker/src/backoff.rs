//! The one back-off of the workspace: how a wait loop waits between two
//! looks at its condition.
//!
//! Three phases:
//!
//! 1. **spin**: 1, 2, 4, … 32 processor pause hints over the first six
//!    rounds (63 in all, well under a microsecond): a condition another core
//!    is about to set costs no system call. [`Backoff::polling`] spins a
//!    given number of rounds of one pause hint each instead, for a wait
//!    that polls for a few microseconds (another process on another core);
//! 2. **yield**: the caller's `yield_now` each round — through a threading
//!    interface ([`UltItf::yield_now`](crate::UltItf::yield_now)) a
//!    user-level thread goes back to its worker's scheduler, which runs the
//!    worker's other threads first; an OS thread yields its processor;
//! 3. **park** (only for back-offs made with [`Backoff::parking`], after
//!    their yield rounds): an OS thread that is not a worker sleeps with
//!    [`std::thread::park_timeout`], 1 µs doubling to 200 µs (an `unpark`
//!    ends it early); on a **worker** thread the back-off never sleeps: it
//!    yields the user-level thread and then the processor
//!    ([`std::thread::yield_now`]), since sleeping would stop every
//!    user-level thread of the worker.
//!
//! Under `--cfg loom` every round is a loom yield, so models make progress.

use std::time::Duration;

/// Rounds of spinning (round `i` spins `2^i` pause hints).
const SPIN_STEPS: u32 = 6;
/// First and longest park of an OS thread.
const MIN_PARK: Duration = Duration::from_micros(1);
const MAX_PARK: Duration = Duration::from_micros(200);

/// Backs off in a wait loop: spin, then yield, then (for
/// [`Backoff::parking`]) park.
///
/// 1. **spin**: 1, 2, 4, … 32 processor pause hints over the first six
///    rounds;
/// 2. **yield**: the caller's `yield_now` each round (through a threading
///    interface a user-level thread goes back to its worker's scheduler;
///    an OS thread yields its processor);
/// 3. **park**, after the yield rounds of [`Backoff::parking`]: an OS thread
///    that is not a worker sleeps with `park_timeout`, 1 µs doubling to
///    200 µs; a worker thread never sleeps (it would stop every user-level
///    thread of the worker): it yields, then yields the processor.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// let flag = AtomicBool::new(false);
/// std::thread::scope(|s| {
///     s.spawn(|| flag.store(true, Ordering::Release));
///     let mut backoff = ct_worker::Backoff::parking(16);
///     while !flag.load(Ordering::Acquire) {
///         backoff.snooze(std::thread::yield_now);
///     }
/// });
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    /// Spin rounds done (up to `spin_rounds`).
    step: u32,
    /// Spin rounds before yielding.
    spin_rounds: u32,
    /// Whether spin round `i` spins `2^i` pause hints (otherwise one).
    doubling: bool,
    /// Yield and park rounds done.
    rounds: u32,
    /// Yield rounds before parking (`u32::MAX`: never parks).
    park_after: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// A back-off that spins, then yields every round (never parks): for
    /// waits that end soon (a lock's hand-over).
    pub const fn new() -> Self {
        Backoff {
            step: 0,
            spin_rounds: SPIN_STEPS,
            doubling: true,
            rounds: 0,
            park_after: u32::MAX,
        }
    }

    /// A back-off that spins, yields `yields` rounds, then parks (an OS
    /// thread) or keeps yielding (a worker thread): for waits that may last
    /// (a message, another process).
    pub const fn parking(yields: u32) -> Self {
        Backoff {
            step: 0,
            spin_rounds: SPIN_STEPS,
            doubling: true,
            rounds: 0,
            park_after: yields,
        }
    }

    /// A back-off that polls: `spins` rounds of one pause hint each, then
    /// `yields` rounds of yielding, then it parks like
    /// [`Backoff::parking`]. For a wait whose condition another process
    /// sets within a few microseconds when it runs on another core (128
    /// rounds poll for about 5 µs), where a yield after less than a
    /// microsecond would cost a system call on most waits.
    pub const fn polling(spins: u32, yields: u32) -> Self {
        Backoff {
            step: 0,
            spin_rounds: spins,
            doubling: false,
            rounds: 0,
            park_after: yields,
        }
    }

    /// Whether the back-off is still spinning (a wait loop can do its
    /// costlier checks, such as for failed peers, once it is not).
    #[inline]
    pub fn is_spinning(&self) -> bool {
        self.step < self.spin_rounds
    }

    /// Whether the spin and yield rounds of a [`Backoff::parking`] or
    /// [`Backoff::polling`] are over, so that the next round would park: a
    /// wait with a sleep of its own (a futex word another process rings)
    /// takes over from here instead of calling [`Backoff::snooze`] again.
    #[inline]
    pub fn yields_done(&self) -> bool {
        !self.is_spinning() && self.rounds >= self.park_after
    }

    /// Starts over (after progress).
    #[inline]
    pub fn reset(&mut self) {
        self.step = 0;
        self.rounds = 0;
    }

    /// One round of waiting; `yield_now` yields the caller (a user-level
    /// thread through its threading interface, or an OS thread) once
    /// spinning has not helped.
    #[inline]
    pub fn snooze(&mut self, yield_now: impl FnOnce()) {
        #[cfg(loom)]
        {
            let _ = yield_now;
            loom::thread::yield_now();
        }
        #[cfg(not(loom))]
        {
            if self.step < self.spin_rounds {
                let pauses = if self.doubling { 1u32 << self.step } else { 1 };
                for _ in 0..pauses {
                    core::hint::spin_loop();
                }
                self.step += 1;
            } else {
                yield_now();
                if self.rounds < self.park_after {
                    self.rounds += 1;
                } else {
                    self.park();
                }
            }
        }
    }

    /// The park phase: sleep an OS thread, never a worker.
    #[cold]
    #[cfg_attr(loom, allow(dead_code))]
    fn park(&mut self) {
        if crate::worker::current_info().is_some() {
            // Sleeping would stop every user-level thread of this worker.
            std::thread::yield_now();
            return;
        }
        let k = (self.rounds - self.park_after).min(8);
        self.rounds = self.rounds.saturating_add(1);
        std::thread::park_timeout(MIN_PARK.saturating_mul(1 << k).min(MAX_PARK));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn phases() {
        let mut b = Backoff::parking(3);
        let mut yields = 0;
        for _ in 0..SPIN_STEPS {
            assert!(b.is_spinning());
            b.snooze(|| yields += 1);
        }
        assert!(!b.is_spinning());
        assert!(!b.yields_done());
        assert_eq!(yields, 0, "spinning does not yield");
        for _ in 0..5 {
            b.snooze(|| yields += 1);
        }
        assert_eq!(yields, 5, "every round after spinning yields");
        assert_eq!(b.rounds, 5, "3 yield rounds, then 2 parks");
        assert!(b.yields_done());
        b.reset();
        assert!(b.is_spinning());
    }

    #[test]
    fn polling_phases() {
        let mut b = Backoff::polling(100, 2);
        let mut yields = 0;
        for _ in 0..100 {
            assert!(b.is_spinning() && !b.yields_done());
            b.snooze(|| yields += 1);
        }
        assert_eq!(yields, 0, "100 polls, no yield");
        b.snooze(|| yields += 1);
        b.snooze(|| yields += 1);
        assert_eq!(yields, 2);
        assert!(b.yields_done(), "then the wait's own sleep takes over");
        let none = Backoff::polling(0, 0);
        assert!(!none.is_spinning() && none.yields_done());
        assert!(!Backoff::new().yields_done(), "a back-off that never parks");
    }

    #[test]
    fn a_worker_never_parks() {
        let rt = crate::Runtime::builder().workers(1).build().unwrap();
        let rounds = rt.block_on(|| {
            let mut b = Backoff::parking(0);
            let t = std::time::Instant::now();
            for _ in 0..SPIN_STEPS + 1000 {
                b.snooze(crate::yield_now);
            }
            (b.rounds, t.elapsed())
        });
        // A park round would not count past `park_after` on a worker.
        assert_eq!(rounds.0, 0, "{rounds:?}");
        let mut b = Backoff::parking(0);
        for _ in 0..SPIN_STEPS + 3 {
            b.snooze(|| {});
        }
        assert_eq!(b.rounds, 3, "an OS thread parks");
    }
}
