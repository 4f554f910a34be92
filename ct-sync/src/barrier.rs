//! A reusable barrier whose last arriver wakes everybody in one batch.
//!
//! Arrival is one `fetch_add` on a counter; arrival number `i` parks in slot
//! `i`, so waiters never contend on a shared wait list. The last arriver
//! flips the generation and wakes slots `0..n-1` in turn, each thread on the
//! worker it parked on, the threads of each other worker pushed to that
//! worker's inbox in one batch
//! ([`notify_home_each`](ct_worker::SuspendedThreadItf::notify_home_each)).
//! Counters and slots
//! are double-buffered by generation parity ("sense reversal"): threads
//! released from generation `g` may arrive at `g + 1` while the last arriver
//! of `g` is still waking others, without touching `g`'s slots.
//!
//! The condition-variable barrier of the original cmpth got 2.9× *slower*
//! with two workers than with one (every waiter went through a mutex and a
//! LIFO list). Here a waiter costs one atomic increment, one park and one
//! wake-up, on any number of workers.

use crossbeam_utils::CachePadded;
use ct_worker::{SuspendedThreadItf, Ult, UltItf};

use crate::sync::{AtomicUsize, Ordering};

/// Result of [`Barrier::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarrierWaitResult {
    leader: bool,
}

impl BarrierWaitResult {
    /// `true` for exactly one thread per episode (the last to arrive).
    pub fn is_leader(&self) -> bool {
        self.leader
    }
}

/// A barrier for a fixed number of threads, reusable for any number of
/// episodes, like [`std::sync::Barrier`]. Waiting threads park. Everything a
/// thread wrote before `wait` is visible to every thread after it.
///
/// ```
/// use ct_sync::Barrier;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
/// let barrier = Barrier::new(4);
/// let phase1 = AtomicUsize::new(0);
/// rt.block_on(|| {
///     ct_worker::scope(|s| {
///         for _ in 0..4 {
///             s.spawn(|| {
///                 phase1.fetch_add(1, Ordering::Relaxed);
///                 barrier.wait();
///                 assert_eq!(phase1.load(Ordering::Relaxed), 4);
///             });
///         }
///     })
/// });
/// ```
pub struct Barrier<U: UltItf = Ult> {
    n: usize,
    generation: CachePadded<AtomicUsize>,
    arrived: [CachePadded<AtomicUsize>; 2],
    slots: [Box<[CachePadded<U::SuspendedThread>]>; 2],
}

impl Barrier {
    /// A barrier for `n` user-level threads of a default-configuration
    /// runtime. For other threading libraries use [`Barrier::new_in`].
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    pub fn new(n: usize) -> Self {
        Self::new_in(n)
    }
}

impl<U: UltItf> Barrier<U> {
    /// A barrier for `n` threads of `U`.
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    pub fn new_in(n: usize) -> Self {
        assert!(n > 0, "a barrier needs at least one participant");
        let slots = || {
            (0..n.saturating_sub(1))
                .map(|_| CachePadded::new(U::SuspendedThread::default()))
                .collect()
        };
        Barrier {
            n,
            generation: CachePadded::new(AtomicUsize::new(0)),
            arrived: [
                CachePadded::new(AtomicUsize::new(0)),
                CachePadded::new(AtomicUsize::new(0)),
            ],
            slots: [slots(), slots()],
        }
    }

    /// Number of participants.
    pub fn participants(&self) -> usize {
        self.n
    }

    /// Waits until all participants have called `wait` in this episode.
    ///
    /// # Panics
    ///
    /// Panics if more threads than the barrier's count wait in one episode.
    pub fn wait(&self) -> BarrierWaitResult {
        if self.n == 1 {
            return BarrierWaitResult { leader: true };
        }
        let g = self.generation.load(Ordering::Acquire);
        let parity = g & 1;
        let i = self.arrived[parity].fetch_add(1, Ordering::AcqRel);
        assert!(
            i < self.n,
            "more than {} threads waited on a barrier in one episode",
            self.n
        );
        if i + 1 < self.n {
            self.slots[parity][i].wait_with(|| true);
            return BarrierWaitResult { leader: false };
        }
        // Last to arrive: open the next generation, then wake this one's
        // waiters. Each is parked or about to park (nothing between its
        // arrival and its parking can block).
        self.arrived[parity].store(0, Ordering::Relaxed);
        self.generation.store(g.wrapping_add(1), Ordering::Release);
        // Each goes back to the worker it parked on (no stealing storm), in
        // one batch per worker.
        U::SuspendedThread::notify_home_each(self.slots[parity].iter().map(|s| &**s));
        BarrierWaitResult { leader: true }
    }
}

impl<U: UltItf> core::fmt::Debug for Barrier<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Barrier")
            .field("participants", &self.n)
            .finish_non_exhaustive()
    }
}
