//! The MCS queue core shared by the mutex (and by `ct-delegate`'s
//! delegators): a tail pointer that arrivals swap themselves into, and the
//! current holder's node, kept on separate cache lines.
//!
//! The core only does queue bookkeeping; *how* a waiter waits for its
//! predecessor (spinning, parking a user-level thread) is up to the lock
//! built on it. Nodes are `N: McsNode` and must stay at a fixed address while
//! queued.

use core::ptr::{self, NonNull};

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicPtr, Ordering, ProtocolCell, const_unless_loom};

/// A queue node: anything with an atomic `next` link.
pub trait McsNode: Sized {
    /// The link to the successor.
    fn next(&self) -> &AtomicPtr<Self>;
}

/// MCS queue state. See the [module docs](self).
pub struct McsCore<N> {
    tail: CachePadded<AtomicPtr<N>>,
    /// The holder's node; only the holder reads or writes it.
    head: CachePadded<ProtocolCell<*mut N>>,
}

// SAFETY: the core hands nodes between threads only through its atomics, and
// `head` is accessed by one lock holder at a time.
unsafe impl<N: Send> Send for McsCore<N> {}
// SAFETY: as above.
unsafe impl<N: Send> Sync for McsCore<N> {}

impl<N> core::fmt::Debug for McsCore<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("McsCore")
            .field("locked", &!self.tail.load(Ordering::Relaxed).is_null())
            .finish()
    }
}

impl<N: McsNode> Default for McsCore<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<N: McsNode> McsCore<N> {
    const_unless_loom! {
        /// An unlocked, empty queue.
        pub fn new() -> Self {
            McsCore {
                tail: CachePadded::new(AtomicPtr::new(ptr::null_mut())),
                head: CachePadded::new(ProtocolCell::new(ptr::null_mut())),
            }
        }
    }

    /// Enqueues `node`. Returns `None` if the lock was free (the caller now
    /// holds it, with `node` as head), else the predecessor, whose `next` the
    /// caller must eventually set with [`McsCore::set_next`].
    ///
    /// # Safety
    ///
    /// `node` must be valid and stay put until it leaves the queue.
    #[inline]
    pub unsafe fn start_lock(&self, node: NonNull<N>) -> Option<NonNull<N>> {
        // SAFETY: the caller owns `node`.
        unsafe {
            node.as_ref()
                .next()
                .store(ptr::null_mut(), Ordering::Relaxed)
        };
        let prev = self.tail.swap(node.as_ptr(), Ordering::AcqRel);
        match NonNull::new(prev) {
            None => {
                // SAFETY: we hold the lock.
                unsafe { self.set_head(node) };
                None
            }
            some => some,
        }
    }

    /// Takes the lock only if it is free.
    ///
    /// # Safety
    ///
    /// As for [`McsCore::start_lock`].
    #[inline]
    pub unsafe fn try_lock(&self, node: NonNull<N>) -> bool {
        // SAFETY: the caller owns `node`.
        unsafe {
            node.as_ref()
                .next()
                .store(ptr::null_mut(), Ordering::Relaxed)
        };
        let ok = self
            .tail
            .compare_exchange(
                ptr::null_mut(),
                node.as_ptr(),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok();
        if ok {
            // SAFETY: we hold the lock.
            unsafe { self.set_head(node) };
        }
        ok
    }

    /// Links `node` behind `prev`: from now on the holder of `prev` can see
    /// (and hand the lock to) `node`.
    ///
    /// # Safety
    ///
    /// `prev` must be the predecessor returned by `start_lock(node)`.
    #[inline]
    pub unsafe fn set_next(prev: NonNull<N>, node: NonNull<N>) {
        // SAFETY: `prev` stays alive until its holder sees this link.
        unsafe { prev.as_ref().next().store(node.as_ptr(), Ordering::Release) };
    }

    /// The holder's node.
    ///
    /// # Safety
    ///
    /// Only the lock holder may call this.
    #[inline]
    pub unsafe fn head(&self) -> NonNull<N> {
        // SAFETY: the holder has exclusive access to `head`.
        let h = unsafe { self.head.with_mut(|h| *h) };
        debug_assert!(!h.is_null());
        // SAFETY: set when the lock was acquired or handed over.
        unsafe { NonNull::new_unchecked(h) }
    }

    /// Records the new holder's node (on acquisition or hand-off).
    ///
    /// # Safety
    ///
    /// Only the (old or new) lock holder may call this, during its tenure.
    #[inline]
    pub unsafe fn set_head(&self, node: NonNull<N>) {
        // SAFETY: exclusive access per the contract.
        unsafe { self.head.with_mut(|h| *h = node.as_ptr()) };
    }

    /// The successor linked behind `head`, if any.
    ///
    /// # Safety
    ///
    /// `head` must be the holder's node.
    #[inline]
    pub unsafe fn next_of(head: NonNull<N>) -> Option<NonNull<N>> {
        // SAFETY: the holder's node is alive.
        NonNull::new(unsafe { head.as_ref().next().load(Ordering::Acquire) })
    }

    /// Releases the lock if nobody is queued behind `head`. `false` means a
    /// successor has enqueued itself (it may not be linked yet).
    ///
    /// # Safety
    ///
    /// `head` must be the holder's node; on success the caller no longer holds
    /// the lock.
    #[inline]
    pub unsafe fn try_unlock(&self, head: NonNull<N>) -> bool {
        self.tail
            .compare_exchange(
                head.as_ptr(),
                ptr::null_mut(),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Whether nobody is queued behind `head` (a hint: may change at once).
    #[inline]
    pub fn is_unlockable(&self, head: NonNull<N>) -> bool {
        self.tail.load(Ordering::Relaxed) == head.as_ptr()
    }

    /// Whether the lock is held (a hint).
    #[inline]
    pub fn is_locked(&self) -> bool {
        !self.tail.load(Ordering::Relaxed).is_null()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{AtomicBool, ProtocolCell};
    use loom::sync::Arc;

    struct Node {
        next: AtomicPtr<Node>,
        granted: AtomicBool,
    }
    impl McsNode for Node {
        fn next(&self) -> &AtomicPtr<Self> {
            &self.next
        }
    }

    /// The core with spinning waiters (a classic MCS spinlock): mutual
    /// exclusion and hand-off, with a counter protected by the lock (loom
    /// checks the causality of its accesses, and of `head`'s).
    #[test]
    fn loom_mcs_core_spinning() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.check(|| {
            let core = Arc::new(McsCore::<Node>::new());
            let counter = Arc::new(ProtocolCell::new(0u32));
            let ths: Vec<_> = (0..2)
                .map(|_| {
                    let (core, counter) = (core.clone(), counter.clone());
                    loom::thread::spawn(move || {
                        let node = Box::into_raw(Box::new(Node {
                            next: AtomicPtr::new(ptr::null_mut()),
                            granted: AtomicBool::new(false),
                        }));
                        let node = NonNull::new(node).unwrap();
                        // SAFETY: the node lives until we leave the queue.
                        unsafe {
                            if let Some(prev) = core.start_lock(node) {
                                McsCore::set_next(prev, node);
                                while !node.as_ref().granted.load(Ordering::Acquire) {
                                    loom::thread::yield_now();
                                }
                            }
                            counter.with_mut(|c| *c += 1);
                            let head = core.head();
                            assert_eq!(head, node);
                            if !core.try_unlock(head) {
                                let next = loop {
                                    if let Some(n) = McsCore::next_of(head) {
                                        break n;
                                    }
                                    loom::thread::yield_now();
                                };
                                core.set_head(next);
                                next.as_ref().granted.store(true, Ordering::Release);
                            }
                            drop(Box::from_raw(node.as_ptr()));
                        }
                    })
                })
                .collect();
            for t in ths {
                t.join().unwrap();
            }
            // SAFETY: all threads joined.
            assert_eq!(unsafe { counter.with_mut(|c| *c) }, 2);
            assert!(!core.is_locked());
        });
    }
}
