//! The MCS mutex with direct hand-off, which parks waiting threads.
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
//! [`RawMutex::unlock_and_wait`] releases the lock and parks the caller in a
//! given slot as one step, so that a condition-variable notifier can never
//! miss it.
//!
//! [`enter`]: ct_worker::SuspendedThreadItf::enter
//! [`notify`]: ct_worker::SuspendedThreadItf::notify

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};

use ct_worker::{SuspendedThreadItf, Ult, UltItf};

use crate::mcs_core::{McsCore, McsNode};
use crate::sync::{AtomicPtr, Backoff};

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

/// An MCS mutex without data; see the [module docs](self). Use [`Mutex`]
/// unless you need `lock`/`unlock` as separate calls.
///
/// `U` is the threading library the waiting threads belong to: user-level
/// threads by default, or [`ct_worker::OsThreads`].
pub struct RawMutex<U: UltItf = Ult> {
    core: McsCore<Node<U>>,
}

impl<U: UltItf> core::fmt::Debug for RawMutex<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RawMutex")
            .field("locked", &self.is_locked())
            .finish()
    }
}

impl<U: UltItf> Default for RawMutex<U> {
    fn default() -> Self {
        Self::new()
    }
}

impl<U: UltItf> RawMutex<U> {
    /// An unlocked mutex.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        RawMutex {
            core: McsCore::new(),
        }
    }

    /// An unlocked mutex.
    #[cfg(loom)]
    pub fn new() -> Self {
        RawMutex {
            core: McsCore::new(),
        }
    }

    /// Acquires the lock, parking the calling thread while it is held.
    pub fn lock(&self) {
        let node = alloc_node::<U>();
        // SAFETY: the node stays allocated until it leaves the queue (freed by
        // the unlock that ends our tenure).
        unsafe {
            if let Some(prev) = self.core.start_lock(node) {
                // Park in the predecessor's node; link only once parked, so that
                // a linked successor is always a parked one.
                prev.as_ref().parked.wait_with(|| {
                    McsCore::set_next(prev, node);
                    true
                });
                // Resumed by the hand-off, which made `node` the head.
            }
        }
    }

    /// Acquires the lock if it is free.
    pub fn try_lock(&self) -> bool {
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
    pub fn is_locked(&self) -> bool {
        self.core.is_locked()
    }

    /// Releases the lock. If a thread waits, it becomes the holder and is
    /// made runnable on the caller's worker (the caller continues).
    ///
    /// # Safety
    ///
    /// The caller must hold the lock (acquired by any thread: the lock is not
    /// tied to an OS or user-level thread).
    pub unsafe fn unlock(&self) {
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
    pub unsafe fn unlock_and_wait(&self, slot: &U::SuspendedThread) {
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
            // node, since nothing of ours runs until we are woken.
            slot.wait_with(|| {
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

/// A mutual-exclusion lock owning its data, like [`std::sync::Mutex`], whose
/// waiters park (user-level threads switch away instead of blocking their
/// worker). Unlocking hands the lock directly to the next waiter, in FIFO
/// order. There is no poisoning: a panic while holding the guard unlocks.
///
/// ```
/// use ct_sync::Mutex;
/// let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
/// let counter = Mutex::new(0u64);
/// rt.block_on(|| {
///     ct_worker::scope(|s| {
///         for _ in 0..8 {
///             s.spawn(|| {
///                 for _ in 0..1000 {
///                     *counter.lock() += 1;
///                 }
///             });
///         }
///     })
/// });
/// assert_eq!(counter.into_inner(), 8000);
/// ```
pub struct Mutex<T: ?Sized, U: UltItf = Ult> {
    raw: RawMutex<U>,
    data: UnsafeCell<T>,
}

// SAFETY: the mutex hands `&mut T` to one holder at a time.
unsafe impl<T: ?Sized + Send, U: UltItf> Send for Mutex<T, U> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send, U: UltItf> Sync for Mutex<T, U> {}

impl<T> Mutex<T> {
    /// A mutex for user-level threads of a default-configuration runtime.
    /// For other threading libraries use [`Mutex::new_in`].
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Self {
        Self::new_in(value)
    }
}

impl<T, U: UltItf> Mutex<T, U> {
    /// A mutex for threads of `U` (e.g. `Mutex::<_, OsThreads>::new_in(0)`).
    #[cfg(not(loom))]
    pub const fn new_in(value: T) -> Self {
        Mutex {
            raw: RawMutex::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// A mutex for threads of `U`.
    #[cfg(loom)]
    pub fn new_in(value: T) -> Self {
        Mutex {
            raw: RawMutex::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// Consumes the mutex, returning the data.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized, U: UltItf> Mutex<T, U> {
    /// Acquires the lock, parking while it is held.
    pub fn lock(&self) -> MutexGuard<'_, T, U> {
        self.raw.lock();
        MutexGuard { mutex: self }
    }

    /// Acquires the lock if it is free.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T, U>> {
        self.raw.try_lock().then(|| MutexGuard { mutex: self })
    }

    /// Mutable access without locking (the borrow proves exclusivity).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// The underlying raw mutex.
    pub fn raw(&self) -> &RawMutex<U> {
        &self.raw
    }
}

impl<T: Default, U: UltItf> Default for Mutex<T, U> {
    fn default() -> Self {
        Mutex {
            raw: RawMutex::new(),
            data: UnsafeCell::new(T::default()),
        }
    }
}

impl<T: ?Sized + core::fmt::Debug, U: UltItf> core::fmt::Debug for Mutex<T, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.try_lock() {
            Some(g) => f.debug_struct("Mutex").field("data", &&*g).finish(),
            None => f.debug_struct("Mutex").field("data", &"<locked>").finish(),
        }
    }
}

/// Access to a [`Mutex`]'s data; unlocks when dropped.
#[must_use = "the mutex unlocks as soon as the guard is dropped"]
pub struct MutexGuard<'a, T: ?Sized, U: UltItf = Ult> {
    mutex: &'a Mutex<T, U>,
}

// SAFETY: sharing a guard only shares `&T`.
unsafe impl<T: ?Sized + Sync, U: UltItf> Sync for MutexGuard<'_, T, U> {}

impl<'a, T: ?Sized, U: UltItf> MutexGuard<'a, T, U> {
    /// The mutex this guard locks (used by [`Condvar`](crate::Condvar)).
    pub(crate) fn mutex(&self) -> &'a Mutex<T, U> {
        self.mutex
    }
}

impl<T: ?Sized, U: UltItf> Deref for MutexGuard<'_, T, U> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &*self.mutex.data.get() }
    }
}

impl<T: ?Sized, U: UltItf> DerefMut for MutexGuard<'_, T, U> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &mut *self.mutex.data.get() }
    }
}

impl<T: ?Sized, U: UltItf> Drop for MutexGuard<'_, T, U> {
    fn drop(&mut self) {
        // SAFETY: the guard proves we hold the lock.
        unsafe { self.mutex.raw.unlock() };
    }
}

impl<T: ?Sized + core::fmt::Debug, U: UltItf> core::fmt::Debug for MutexGuard<'_, T, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        (**self).fmt(f)
    }
}
