//! Spinlocks for short internal critical sections that never block or
//! switch context while held.
//!
//! - [`SpinLock`]: test-and-test-and-set with exponential backoff (spins on a
//!   plain load, so waiters do not hammer the cache line with RMWs).
//! - [`McsSpinLock`]: an MCS queue lock; each waiter spins on its own node, so
//!   the hand-off touches one cache line, and waiters are served in FIFO order.
//!
//! Waiters back off and then yield their OS thread: a holder that was
//! preempted by the OS gets the core back.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};

use crate::mcs_core::{McsCore, McsNode};
use crate::sync::{AtomicBool, AtomicPtr, Backoff, Ordering};

/// A test-and-test-and-set spinlock owning its data.
///
/// Never hold it across anything that may block or switch user-level
/// threads: a waiter on the same worker would spin forever.
pub struct SpinLock<T: ?Sized> {
    locked: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands `&mut T` to one holder at a time.
unsafe impl<T: ?Sized + Send> Send for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// An unlocked spinlock.
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(value),
        }
    }

    /// An unlocked spinlock.
    #[cfg(loom)]
    pub fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(value),
        }
    }

    /// Consumes the lock, returning the data.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized> SpinLock<T> {
    /// Acquires the lock, spinning (with backoff) while it is held.
    #[inline]
    pub fn lock(&self) -> SpinLockGuard<'_, T> {
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        SpinLockGuard { lock: self }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut backoff = Backoff::new();
        loop {
            while self.locked.load(Ordering::Relaxed) {
                backoff.snooze(std::thread::yield_now);
            }
            if self
                .locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Acquires the lock if it is free.
    pub fn try_lock(&self) -> Option<SpinLockGuard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then(|| SpinLockGuard { lock: self })
    }
}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

impl<T: ?Sized> core::fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SpinLock")
            .field("locked", &self.locked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Access to a [`SpinLock`]'s data; unlocks when dropped.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct SpinLockGuard<'a, T: ?Sized> {
    lock: &'a SpinLock<T>,
}

impl<T: ?Sized> Deref for SpinLockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for SpinLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for SpinLockGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// Node of an [`McsSpinLock`] waiter, on the waiter's stack.
struct SpinNode {
    next: AtomicPtr<SpinNode>,
    granted: AtomicBool,
}

impl McsNode for SpinNode {
    fn next(&self) -> &AtomicPtr<Self> {
        &self.next
    }
}

/// An MCS queue spinlock owning its data: FIFO, and each waiter spins on its
/// own cache line. Nodes live on the waiters' stacks, so the lock is used
/// through a closure ([`McsSpinLock::with`]).
pub struct McsSpinLock<T: ?Sized> {
    core: McsCore<SpinNode>,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands `&mut T` to one holder at a time.
unsafe impl<T: ?Sized + Send> Send for McsSpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send> Sync for McsSpinLock<T> {}

impl<T> McsSpinLock<T> {
    /// An unlocked lock.
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Self {
        McsSpinLock {
            core: McsCore::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// An unlocked lock.
    #[cfg(loom)]
    pub fn new(value: T) -> Self {
        McsSpinLock {
            core: McsCore::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// Consumes the lock, returning the data.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized> McsSpinLock<T> {
    /// Runs `f` with the lock held. `f` must not block or switch user-level
    /// threads. If `f` panics, the lock is released.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let node = SpinNode {
            next: AtomicPtr::new(ptr::null_mut()),
            granted: AtomicBool::new(false),
        };
        let node = NonNull::from(&node);
        // SAFETY: the node lives on this frame until we leave the queue below.
        unsafe {
            if let Some(prev) = self.core.start_lock(node) {
                McsCore::set_next(prev, node);
                let mut backoff = Backoff::new();
                while !node.as_ref().granted.load(Ordering::Acquire) {
                    backoff.snooze(std::thread::yield_now);
                }
            }
        }
        struct Release<'a, T: ?Sized>(&'a McsSpinLock<T>);
        impl<T: ?Sized> Drop for Release<'_, T> {
            fn drop(&mut self) {
                // SAFETY: we hold the lock.
                unsafe {
                    let core = &self.0.core;
                    let head = core.head();
                    let next = match McsCore::next_of(head) {
                        Some(n) => n,
                        None if core.try_unlock(head) => return,
                        None => {
                            let mut backoff = Backoff::new();
                            loop {
                                if let Some(n) = McsCore::next_of(head) {
                                    break n;
                                }
                                backoff.snooze(std::thread::yield_now);
                            }
                        }
                    };
                    core.set_head(next);
                    next.as_ref().granted.store(true, Ordering::Release);
                }
            }
        }
        let _release = Release(self);
        // SAFETY: we hold the lock.
        f(unsafe { &mut *self.data.get() })
    }
}

impl<T: ?Sized> core::fmt::Debug for McsSpinLock<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("McsSpinLock")
            .field("locked", &self.core.is_locked())
            .finish_non_exhaustive()
    }
}
