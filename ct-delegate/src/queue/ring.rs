//! The ring-buffer delegation queue.

use core::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use super::{DelegationQueue, Enqueued};
use crate::sync::{AtomicBool, AtomicUsize, Ordering, ProtocolCell};

struct Slot<E> {
    ready: AtomicBool,
    /// Whether `entry` holds a value (only the writer or holder touches it).
    live: AtomicBool,
    /// The entry (a loom-checked cell: the queue protocol, not a lock,
    /// keeps its accesses apart).
    entry: ProtocolCell<MaybeUninit<E>>,
}

/// A ring of `CAP` entries (default 128). The tail counter holds the number
/// of entries ever enqueued, shifted left by one, with the lock bit in bit 0:
/// entering is one CAS that both takes a slot and tells whether the lock was
/// free. No allocation; when `CAP` entries are queued, producers must wait
/// (the delegator yields and retries).
pub struct RingQueue<E, const CAP: usize = 128> {
    /// `(entries enqueued << 1) | locked`.
    tail: CachePadded<AtomicUsize>,
    /// Index of the holder's entry (or of the last holder's, when unlocked).
    /// Slots of older entries are free.
    head: CachePadded<AtomicUsize>,
    slots: Box<[Slot<E>]>,
    /// A bug that the loom models must find (under `--cfg loom` only): the
    /// lock is released before the holder's slot is cleared.
    #[cfg(loom)]
    seeded_bug: bool,
}

// SAFETY: entries move between threads only through the queue protocol.
unsafe impl<E: Send, const CAP: usize> Send for RingQueue<E, CAP> {}
// SAFETY: as above.
unsafe impl<E: Send, const CAP: usize> Sync for RingQueue<E, CAP> {}

impl<E, const CAP: usize> core::fmt::Debug for RingQueue<E, CAP> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RingQueue")
            .field("capacity", &CAP)
            .field("locked", &(self.tail.load(Ordering::Relaxed) & 1 == 1))
            .finish()
    }
}

impl<E, const CAP: usize> RingQueue<E, CAP> {
    /// A queue with the seeded bug (see the `seeded_bug` field).
    #[cfg(loom)]
    pub(crate) fn with_seeded_bug() -> Self
    where
        E: Send + 'static,
    {
        let mut q = <Self as DelegationQueue<E>>::new();
        q.seeded_bug = true;
        q
    }

    fn slot(&self, i: usize) -> &Slot<E> {
        &self.slots[i % CAP]
    }

    /// Writes entry `i`.
    ///
    /// # Safety
    ///
    /// Slot `i` must be free and reserved by the caller.
    unsafe fn fill(&self, i: usize, entry: E) {
        let s = self.slot(i);
        // SAFETY: per the contract, nobody else uses the slot.
        unsafe { s.entry.with_mut(|p| (*p).write(entry)) };
        s.live.store(true, Ordering::Relaxed);
    }

    /// Drops the entry at `i` (if not dropped yet) and clears its flag.
    ///
    /// # Safety
    ///
    /// Only the holder may call this, on its head entry, which it no longer
    /// uses.
    unsafe fn clear(&self, i: usize) {
        let s = self.slot(i);
        if s.live.swap(false, Ordering::Relaxed) {
            // SAFETY: `live` says the entry is initialised; per the contract it
            // is unused.
            unsafe { s.entry.with_mut(|p| (*p).assume_init_drop()) };
        }
        s.ready.store(false, Ordering::Relaxed);
    }
}

impl<E, const CAP: usize> Drop for RingQueue<E, CAP> {
    fn drop(&mut self) {
        // Entries still queued (or the holder's) are dropped here.
        for s in self.slots.iter_mut() {
            if s.live.load(Ordering::Relaxed) {
                // SAFETY: `live` marks initialised entries; we are the last user.
                unsafe { s.entry.with_mut(|p| (*p).assume_init_drop()) };
            }
        }
    }
}

// SAFETY: the tail CAS linearises arrivals (FIFO by counter); the holder reads
// an entry only after its `ready` flag (release/acquire); a slot is reused only
// after the holder's `head` passed it (producers check against `head`).
unsafe impl<E: Send + 'static, const CAP: usize> DelegationQueue<E> for RingQueue<E, CAP> {
    type Handle = usize;

    fn new() -> Self {
        assert!(CAP >= 2, "a ring queue needs at least two slots");
        RingQueue {
            tail: CachePadded::new(AtomicUsize::new(0)),
            head: CachePadded::new(AtomicUsize::new(usize::MAX)),
            slots: (0..CAP)
                .map(|_| Slot {
                    ready: AtomicBool::new(false),
                    live: AtomicBool::new(false),
                    entry: ProtocolCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            #[cfg(loom)]
            seeded_bug: false,
        }
    }

    #[inline]
    fn try_acquire(&self, entry: E) -> Result<usize, E> {
        let t = self.tail.load(Ordering::Relaxed);
        if t & 1 == 1 {
            return Err(entry);
        }
        let c = t >> 1;
        if self
            .tail
            .compare_exchange(t, ((c + 1) << 1) | 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Err(entry);
        }
        // SAFETY: slot c is free (the lock was free, so every older entry was
        // cleared) and only the holder touches it.
        unsafe { self.fill(c, entry) };
        self.head.store(c, Ordering::Release);
        Ok(c)
    }

    #[inline]
    fn enqueue(&self, entry: E) -> Result<Enqueued<usize>, E> {
        let mut t = self.tail.load(Ordering::Relaxed);
        loop {
            let c = t >> 1;
            let h = self.head.load(Ordering::Acquire);
            if t & 1 == 1 && c.wrapping_sub(h) >= CAP {
                return Err(entry);
            }
            match self.tail.compare_exchange_weak(
                t,
                ((c + 1) << 1) | 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // SAFETY: slot c is free: either the lock was free, or
                    // c - head < CAP, so its previous entry was cleared before
                    // `head` passed it.
                    unsafe { self.fill(c, entry) };
                    if t & 1 == 0 {
                        self.head.store(c, Ordering::Release);
                        return Ok(Enqueued::Acquired(c));
                    }
                    return Ok(Enqueued::Queued(c));
                }
                Err(cur) => t = cur,
            }
        }
    }

    #[inline]
    unsafe fn publish(&self, h: usize) {
        self.slot(h).ready.store(true, Ordering::Release);
    }

    #[inline]
    unsafe fn entry(&self, h: usize) -> &E {
        // SAFETY: per the contract the entry is initialised and alive, and
        // only read until the holder moves past it.
        unsafe { self.slot(h).entry.with(|p| (*p).assume_init_ref()) }
    }

    #[inline]
    unsafe fn next(&self, head: usize) -> Option<usize> {
        let n = head.wrapping_add(1);
        self.slot(n).ready.load(Ordering::Acquire).then_some(n)
    }

    #[inline]
    unsafe fn advance(&self, head: usize, next: usize) {
        // SAFETY: the old head is done and ours.
        unsafe { self.clear(head) };
        self.head.store(next, Ordering::Release);
    }

    #[inline]
    unsafe fn try_unlock(&self, head: usize) -> bool {
        let c = head.wrapping_add(1);
        // Clear first: once the lock is free, the next holder may move `head`
        // on and producers may reuse this slot. If the CAS fails the (dropped)
        // entry simply stays the head until `advance`.
        #[cfg(loom)]
        if self.seeded_bug {
            // The seeded bug: unlock first, clear after. A new holder may by
            // then have reused the slot; the loom models must catch it.
            let ok = self
                .tail
                .compare_exchange((c << 1) | 1, c << 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            // SAFETY: none; this is the bug.
            unsafe { self.clear(head) };
            return ok;
        }
        // SAFETY: the holder is done with its head entry.
        unsafe { self.clear(head) };
        self.tail
            .compare_exchange((c << 1) | 1, c << 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.tail.load(Ordering::Relaxed) & 1 == 1
    }
}
