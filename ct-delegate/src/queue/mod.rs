//! The queues a delegator is built on: an MCS list and a ring buffer behind
//! one trait.
//!
//! A delegation queue is a queue lock whose entries carry payloads. Entering
//! the queue either takes the lock (the queue was empty) or queues the entry
//! behind the current holder. A queued entry becomes visible to the holder
//! only when its producer *publishes* it, which lets a producer fill the entry
//! — or park its thread in it — first. The holder walks the queue: it looks at
//! the published successor of its head entry, moves the lock there
//! ([`DelegationQueue::advance`]), or releases the lock when nobody is queued
//! ([`DelegationQueue::try_unlock`]).
//!
//! - [`McsQueue`]: a linked list (unbounded, FIFO); entries are allocated per
//!   request from a per-thread cache.
//! - [`RingQueue`]: a fixed array indexed by a counter whose low bit is the
//!   lock bit (no allocation; bounded — a full ring makes producers retry).

mod mcs;
mod ring;

pub use mcs::McsQueue;
pub use ring::RingQueue;

/// How an entry entered the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued<H> {
    /// The queue was empty: the caller holds the lock; the entry is the head.
    Acquired(H),
    /// The entry is queued; the caller must [publish](DelegationQueue::publish) it.
    Queued(H),
}

/// A queue lock with payload entries. See the [module docs](self).
///
/// # Safety
///
/// Implementations must provide mutual exclusion (one holder at a time, the
/// holder's head entry identified by the handle it got), hand entries to the
/// holder in FIFO order of enqueueing, make an entry's contents written
/// before [`publish`](DelegationQueue::publish) visible to the holder that
/// sees it via [`next`](DelegationQueue::next), and keep an entry alive until
/// the holder advances past it or unlocks with it.
pub unsafe trait DelegationQueue<E: Send>: Send + Sync + 'static {
    /// Identifies an entry in the queue.
    type Handle: Copy + PartialEq + Send + core::fmt::Debug;

    /// An empty, unlocked queue.
    fn new() -> Self;

    /// Takes the lock if nobody holds it, with `entry` as the head; gives the
    /// entry back otherwise (without queuing it).
    fn try_acquire(&self, entry: E) -> Result<Self::Handle, E>;

    /// Enqueues `entry`. Gives it back if the queue is full (ring buffer):
    /// the caller should yield and retry.
    fn enqueue(&self, entry: E) -> Result<Enqueued<Self::Handle>, E>;

    /// Makes a [queued](Enqueued::Queued) entry visible to the holder.
    ///
    /// # Safety
    ///
    /// `h` must be a queued, unpublished handle of this queue.
    unsafe fn publish(&self, h: Self::Handle);

    /// The entry behind a handle.
    ///
    /// # Safety
    ///
    /// `h` must be in the queue (not yet advanced past or unlocked).
    unsafe fn entry(&self, h: Self::Handle) -> &E;

    /// Holder: the published successor of `head`, if any.
    ///
    /// # Safety
    ///
    /// The caller must hold the lock with head entry `head`.
    unsafe fn next(&self, head: Self::Handle) -> Option<Self::Handle>;

    /// Holder: moves the lock to `next` (from [`next`](DelegationQueue::next))
    /// and frees `head`'s entry.
    ///
    /// # Safety
    ///
    /// As for `next`; `next` must be `head`'s published successor.
    unsafe fn advance(&self, head: Self::Handle, next: Self::Handle);

    /// Holder: releases the lock if no entry is queued behind `head` (even
    /// unpublished), freeing `head`'s entry. `false`: an entry is queued; it
    /// will be published shortly.
    ///
    /// # Safety
    ///
    /// The caller must hold the lock with head entry `head`.
    unsafe fn try_unlock(&self, head: Self::Handle) -> bool;

    /// Whether the lock is held (a hint).
    fn is_locked(&self) -> bool;
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};

    /// What a delegator does with a queue, `rounds` times per thread: each
    /// thread enqueues a value (yielding and retrying while a ring is full).
    /// A thread that acquires the lock becomes the holder: it takes its own
    /// value and every published value behind it, then releases; a queued
    /// thread publishes its entry and goes on to its next round. Several
    /// rounds on a small ring make slots wrap around and be reused while
    /// other threads still work on their neighbours. Every value is taken
    /// exactly once, and the lock ends free.
    fn delegation_protocol<Q: DelegationQueue<usize>>(threads: usize, rounds: usize) {
        on_queue(Q::new(), threads, rounds);
    }

    /// [`delegation_protocol`] on `q`.
    fn on_queue<Q: DelegationQueue<usize>>(q: Q, threads: usize, rounds: usize) {
        let q = Arc::new(q);
        let taken = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (q, taken) = (q.clone(), taken.clone());
                loom::thread::spawn(move || {
                    for r in 0..rounds {
                        let mut bit = 1usize << (i * rounds + r);
                        let entered = loop {
                            match q.enqueue(bit) {
                                Ok(e) => break e,
                                Err(back) => {
                                    bit = back;
                                    loom::thread::yield_now();
                                }
                            }
                        };
                        match entered {
                            Enqueued::Queued(h) => unsafe { q.publish(h) },
                            Enqueued::Acquired(mut head) => unsafe {
                                taken.fetch_or(*q.entry(head), Ordering::Relaxed);
                                loop {
                                    if let Some(next) = q.next(head) {
                                        let v = *q.entry(next);
                                        let old = taken.fetch_or(v, Ordering::Relaxed);
                                        assert_eq!(old & v, 0, "value taken twice");
                                        q.advance(head, next);
                                        head = next;
                                    } else if q.try_unlock(head) {
                                        break;
                                    } else {
                                        loom::thread::yield_now();
                                    }
                                }
                            },
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(
            taken.load(Ordering::Relaxed),
            (1 << (threads * rounds)) - 1,
            "every value taken"
        );
        assert!(!q.is_locked());
    }

    #[test]
    fn loom_mcs_queue_protocol() {
        ct_sync::loom_itf::model(3, || delegation_protocol::<McsQueue<usize>>(2, 1));
        ct_sync::loom_itf::model(1, || delegation_protocol::<McsQueue<usize>>(3, 1));
        ct_sync::loom_itf::model(1, || delegation_protocol::<McsQueue<usize>>(2, 2));
    }

    #[test]
    fn loom_ring_queue_protocol() {
        ct_sync::loom_itf::model(3, || delegation_protocol::<RingQueue<usize, 4>>(2, 1));
        ct_sync::loom_itf::model(1, || delegation_protocol::<RingQueue<usize, 4>>(3, 1));
        // Two slots for four entries: slots are reused and the ring fills.
        ct_sync::loom_itf::model(2, || delegation_protocol::<RingQueue<usize, 2>>(2, 2));
    }

    /// The models catch a seeded bug: a ring queue that releases its lock
    /// before clearing its holder's slot lets the next holder write the
    /// slot while it is still being cleared (a loom causality violation).
    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_ring_queue_models_catch_a_seeded_bug() {
        ct_sync::loom_itf::model(2, || {
            on_queue(RingQueue::<usize, 2>::with_seeded_bug(), 2, 2);
        });
    }
}
