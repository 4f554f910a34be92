//! The fair mutex: an MCS queue lock with direct hand-off, which parks waiting threads.
//!
//! Lock: enqueue a node with one atomic swap. If there was a predecessor,
//! park *in the predecessor's node* and only then — once the waiter's context
//! is saved — link into the queue. A holder that finds a linked successor
//! therefore knows the successor is parked and can switch into it at once.
//!
//! Unlock: if nobody is queued, clear the tail with one CAS. Otherwise make
//! the successor the holder and make it runnable on the unlocker's own worker
//! ([`notify`]); the unlocker continues. (Switching straight into the
//! successor with [`enter`], as cmpth does, pushes the unlocker onto the deque
//! instead, where idle workers steal it: under contention every acquisition
//! then migrates a thread between cores. With 50 threads on one lock and two
//! workers that was 2–10× slower here than keeping the hand-off local.)
//!
//! [`RawFairMutex::unlock_and_wait`] releases the lock and parks the caller in a
//! given slot as one step, so that a condition-variable notifier can never
//! miss it.
//!
//! [`enter`]: ct_worker::SuspendedThreadItf::enter
//! [`notify`]: ct_worker::SuspendedThreadItf::notify

use core::ptr::{self, NonNull};

use ct_worker::{SuspendedThreadItf, Ult, UltItf};

use super::RawLock;
use crate::mcs_core::{McsCore, McsNode};
use crate::sync::{AtomicPtr, Backoff, const_unless_loom};

/// A queue node: the successor parks in `parked`.
pub(crate) struct Node<U: UltItf> {
    next: AtomicPtr<Node<U>>,
    parked: U::SuspendedThread,
}

impl<U: UltItf> McsNode for Node<U> {
    fn next(&self) -> &AtomicPtr<Self> {
        &self.next
    }
}

/// Whether `Node<U>` fits the node pool's blocks.
const fn pooled<U: UltItf>() -> bool {
    !cfg!(loom)
        && size_of::<Node<U>>() <= crate::node_pool::BLOCK_SIZE
        && align_of::<Node<U>>() <= 16
}

fn alloc_node<U: UltItf>() -> NonNull<Node<U>> {
    let node = Node::<U> {
        next: AtomicPtr::new(ptr::null_mut()),
        parked: U::SuspendedThread::default(),
    };
    if pooled::<U>() {
        let p = crate::node_pool::take().cast::<Node<U>>();
        // SAFETY: the block is large and aligned enough (checked by `pooled`).
        unsafe { p.as_ptr().write(node) };
        p
    } else {
        NonNull::from(Box::leak(Box::new(node)))
    }
}

/// # Safety
///
/// `n` must come from `alloc_node` and be unused by anyone.
unsafe fn free_node<U: UltItf>(n: NonNull<Node<U>>) {
    if pooled::<U>() {
        // SAFETY: per the contract; the block goes back to the pool.
        unsafe {
            ptr::drop_in_place(n.as_ptr());
            crate::node_pool::put(n.cast());
        }
    } else {
        // SAFETY: per the contract, a leaked box.
        drop(unsafe { Box::from_raw(n.as_ptr()) });
    }
}

/// Spins (with backoff and OS yields) until the successor that has already
/// swapped itself into the tail links itself behind `head`. The successor is
/// running on another OS thread between those two steps, so this is short.
///
/// # Safety
///
/// `head` must be the holder's node and `try_unlock` must have failed.
unsafe fn wait_for_successor<U: UltItf>(head: NonNull<Node<U>>) -> NonNull<Node<U>> {
    let mut backoff = Backoff::new();
    loop {
        // SAFETY: forwarded contract.
        if let Some(n) = unsafe { McsCore::next_of(head) } {
            return n;
        }
        backoff.snooze(std::thread::yield_now);
    }
}

/// The fair lock protocol: an MCS queue with direct hand-off, see the
/// [module docs](self). Waiters get the lock in arrival order. Use
/// [`FairMutex`](super::FairMutex) unless you need `lock`/`unlock` as separate calls.
///
/// `U` is the threading library the waiting threads belong to: user-level
/// threads by default, or [`ct_worker::OsThreads`].
pub struct RawFairMutex<U: UltItf = Ult> {
    core: McsCore<Node<U>>,
}

impl<U: UltItf> core::fmt::Debug for RawFairMutex<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RawFairMutex")
            .field("locked", &self.is_locked())
            .finish()
    }
}

impl<U: UltItf> Default for RawFairMutex<U> {
    fn default() -> Self {
        Self::new()
    }
}

impl<U: UltItf> RawFairMutex<U> {
    const_unless_loom! {
        /// An unlocked mutex.
        pub fn new() -> Self {
            RawFairMutex {
                core: McsCore::new(),
            }
        }
    }
}

// SAFETY: the MCS queue admits one holder at a time: the holder is the
// thread whose node is `head`, set on acquisition or by the hand-off.
unsafe impl<U: UltItf> RawLock<U> for RawFairMutex<U> {
    #[cfg(not(loom))]
    const INIT: Self = Self::new();

    fn unlocked() -> Self {
        Self::new()
    }

    /// Acquires the lock, parking the calling thread while it is held.
    fn lock(&self) {
        let node = alloc_node::<U>();
        // SAFETY: the node stays allocated until it leaves the queue (freed by
        // the unlock that ends our tenure).
        unsafe {
            if let Some(prev) = self.core.start_lock(node) {
                // Park in the predecessor's node; link only once parked, so that
                // a linked successor is always a parked one.
                // `move`: after the link, our stack may change at any time.
                prev.as_ref().parked.wait_with(move || {
                    McsCore::set_next(prev, node);
                    true
                });
                // Resumed by the hand-off, which made `node` the head.
            }
        }
    }

    /// Acquires the lock if it is free.
    fn try_lock(&self) -> bool {
        let node = alloc_node::<U>();
        // SAFETY: as in `lock`.
        let ok = unsafe { self.core.try_lock(node) };
        if !ok {
            // SAFETY: the node never entered the queue.
            unsafe { free_node(node) };
        }
        ok
    }

    /// Whether the lock is held (a hint).
    fn is_locked(&self) -> bool {
        self.core.is_locked()
    }

    /// Releases the lock. If a thread waits, it becomes the holder and is
    /// made runnable on the caller's worker (the caller continues).
    ///
    /// # Safety
    ///
    /// The caller must hold the lock (acquired by any thread: the lock is not
    /// tied to an OS or user-level thread).
    unsafe fn unlock(&self) {
        // SAFETY: we hold the lock.
        unsafe {
            let head = self.core.head();
            let next = match McsCore::next_of(head) {
                Some(n) => n,
                None if self.core.try_unlock(head) => {
                    free_node(head);
                    return;
                }
                None => wait_for_successor(head),
            };
            self.core.set_head(next);
            // The successor is parked in our node: it now holds the lock.
            head.as_ref().parked.notify();
            free_node(head);
        }
    }

    /// Releases the lock and parks the caller in `slot`, in one step: the
    /// caller is in `slot` before anyone else can take the lock, so a thread
    /// that takes the lock and then wakes `slot` always finds it there.
    ///
    /// Returns once the caller has been woken through `slot` (it does *not*
    /// hold the lock then).
    ///
    /// # Safety
    ///
    /// The caller must hold the lock.
    unsafe fn unlock_and_wait(&self, slot: &U::SuspendedThread) {
        // SAFETY: we hold the lock.
        unsafe {
            let head = self.core.head();
            if let Some(next) = McsCore::next_of(head) {
                // A parked successor: park in `slot` and switch straight to it.
                self.core.set_head(next);
                slot.swap(&head.as_ref().parked);
                free_node(head);
                return;
            }
            // No linked successor: release from the decision function, which
            // runs once we are in `slot`. It may not switch; it may free our
            // node. Once the lock is free, a notifier may wake us and our
            // stack may change while the decision still runs: it captures
            // `head` by value (`move`), never by reference into our frame.
            slot.wait_with(move || {
                if !self.core.try_unlock(head) {
                    let next = wait_for_successor(head);
                    self.core.set_head(next);
                    head.as_ref().parked.notify();
                }
                free_node(head);
                true
            });
        }
    }
}
