//! The join/exit/detach protocol of a task, as one atomic word.
//!
//! ```text
//!            register(w)                 finish()
//!  RUNNING ───────────────▶ WAITER(w) ───────────▶ FINISHED   (child wakes w)
//!     │  ╲ finish()                                   ▲
//!     │   ╲───────────────────────────────────────────┘        (nobody waits)
//!     │ detach()              finish()
//!     └─────────▶ DETACHED ─────────────▶ FINISHED             (child frees itself)
//! ```
//!
//! - The **joiner** registers itself (after its context is saved) with a CAS
//!   from `RUNNING`; the CAS fails only if the child already finished, in which
//!   case the joiner does not park.
//! - The **child** marks itself finished with a swap *after* it has left its
//!   stack (in the ontop function of its final switch); the old value tells it
//!   whether to wake a waiter or free a detached task. Exactly one side frees
//!   the task and a registered waiter is woken exactly once.
//! - The **handle owner** detaches with a CAS from `RUNNING`; if the child
//!   already finished, the owner frees the task instead.

use crate::sync::{AtomicUsize, Ordering};

const RUNNING: usize = 0;
const FINISHED: usize = 1;
const DETACHED: usize = 2;

/// A registered waiter: an opaque, 8-byte-aligned address.
pub(crate) type WaiterWord = usize;

/// What the finishing child must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// Nobody waits: the joiner will find the task finished.
    Nobody,
    /// The handle was dropped: the child frees the task.
    Detached,
    /// Wake this waiter.
    Wake(WaiterWord),
}

/// The join state of one task.
#[derive(Debug)]
pub(crate) struct JoinState(AtomicUsize);

impl JoinState {
    pub(crate) fn new() -> Self {
        JoinState(AtomicUsize::new(RUNNING))
    }

    /// Resets a recycled state to `RUNNING`. Only valid while nobody else can
    /// see the task.
    pub(crate) fn reset(&self) {
        self.0.store(RUNNING, Ordering::Relaxed);
    }

    /// Joiner: registers `waiter` (an 8-byte-aligned address, possibly with
    /// its low bit set as a tag). `true` if
    /// registered (the child will wake it exactly once); `false` if the child
    /// already finished.
    pub(crate) fn register(&self, waiter: WaiterWord) -> bool {
        debug_assert!(waiter >= 8 && (waiter & !1).is_multiple_of(8));
        match self
            .0
            .compare_exchange(RUNNING, waiter, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(cur) => {
                debug_assert_eq!(cur, FINISHED, "a task is joined once and not detached");
                false
            }
        }
    }

    /// Child: the waiter already registered, if any (it cannot go away).
    pub(crate) fn waiter(&self) -> Option<WaiterWord> {
        let v = self.0.load(Ordering::Acquire);
        (v >= 8).then_some(v)
    }

    /// Child: marks the task finished after a waiter was seen by
    /// [`JoinState::waiter`]. The child itself switches to the waiter.
    pub(crate) fn finish_for_waiter(&self) {
        self.0.store(FINISHED, Ordering::Release);
    }

    /// Child: marks the task finished and says what else to do.
    pub(crate) fn finish(&self) -> Finish {
        match self.0.swap(FINISHED, Ordering::AcqRel) {
            RUNNING => Finish::Nobody,
            DETACHED => Finish::Detached,
            FINISHED => unreachable!("a task finishes once"),
            w => Finish::Wake(w),
        }
    }

    /// Handle owner: detaches. `true` if the child will free the task;
    /// `false` if it already finished and the caller must free it.
    pub(crate) fn detach(&self) -> bool {
        self.0
            .compare_exchange(RUNNING, DETACHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the task has finished (with acquire ordering: its result is visible).
    pub(crate) fn is_finished(&self) -> bool {
        self.0.load(Ordering::Acquire) == FINISHED
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize as Counter;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    /// A joiner and a finishing child race: the joiner either sees the task
    /// finished, or is woken exactly once, never both and never neither.
    #[test]
    fn loom_join_vs_finish() {
        model(|| {
            let s = Arc::new(JoinState::new());
            let woken = Arc::new(Counter::new(0));
            let result = Arc::new(Counter::new(0));
            let child = {
                let (s, woken, result) = (s.clone(), woken.clone(), result.clone());
                loom::thread::spawn(move || {
                    result.store(42, Ordering::Relaxed);
                    match s.finish() {
                        Finish::Wake(w) => {
                            assert_eq!(w, 64);
                            woken.fetch_add(1, Ordering::Release);
                        }
                        Finish::Nobody => {}
                        Finish::Detached => panic!("not detached"),
                    }
                })
            };
            let parked = s.register(64);
            if parked {
                // Wait to be woken (a real joiner is parked).
                while woken.load(Ordering::Acquire) == 0 {
                    loom::thread::yield_now();
                }
            } else {
                assert!(s.is_finished());
            }
            assert_eq!(
                result.load(Ordering::Relaxed),
                42,
                "result visible to the joiner"
            );
            child.join().unwrap();
            assert_eq!(woken.load(Ordering::Relaxed), usize::from(parked));
        });
    }

    /// Detaching races with finishing: exactly one side frees the task.
    #[test]
    fn loom_detach_vs_finish() {
        model(|| {
            let s = Arc::new(JoinState::new());
            let frees = Arc::new(Counter::new(0));
            let child = {
                let (s, frees) = (s.clone(), frees.clone());
                loom::thread::spawn(move || {
                    if s.finish() == Finish::Detached {
                        frees.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            if !s.detach() {
                frees.fetch_add(1, Ordering::Relaxed);
            }
            child.join().unwrap();
            assert_eq!(frees.load(Ordering::Relaxed), 1);
        });
    }
}
