//! Condition variables with FIFO wake-up order.
//!
//! A waiter puts an entry (on its own stack) at the back of the condition
//! variable's list, then releases the mutex and parks in the entry in one
//! step ([`RawLock::unlock_and_wait`](crate::RawLock::unlock_and_wait)).
//! Notifiers take entries from the front. A notifier may find an entry whose
//! thread has not parked yet (it is between enqueueing and parking, which
//! involves no blocking); it then waits for it to park, briefly.

use core::ptr::{self, NonNull};

use ct_worker::{SuspendedThreadItf, Ult, UltItf};

use crate::mutex::{MutexGuard, RawLock};
use crate::spinlock::SpinLock;
use crate::sync::Backoff;

struct Entry<U: UltItf> {
    parked: U::SuspendedThread,
    next: *mut Entry<U>,
}

/// FIFO list of waiting entries.
struct WaitList<U: UltItf> {
    head: *mut Entry<U>,
    tail: *mut Entry<U>,
}

// SAFETY: entries are owned by their (parked) threads and only linked and
// unlinked under the list's spinlock.
unsafe impl<U: UltItf> Send for WaitList<U> {}

impl<U: UltItf> WaitList<U> {
    fn push_back(&mut self, e: NonNull<Entry<U>>) {
        if self.tail.is_null() {
            self.head = e.as_ptr();
        } else {
            // SAFETY: the tail entry is alive while listed.
            unsafe { (*self.tail).next = e.as_ptr() };
        }
        self.tail = e.as_ptr();
    }

    fn pop_front(&mut self) -> Option<NonNull<Entry<U>>> {
        let e = NonNull::new(self.head)?;
        // SAFETY: listed entries are alive.
        self.head = unsafe { e.as_ref().next };
        if self.head.is_null() {
            self.tail = ptr::null_mut();
        }
        Some(e)
    }

    fn take_all(&mut self) -> *mut Entry<U> {
        self.tail = ptr::null_mut();
        core::mem::replace(&mut self.head, ptr::null_mut())
    }
}

/// Wakes the thread of `e`, waiting for it to park if it has not yet.
///
/// # Safety
///
/// `e` must have been taken off the list by the caller; `e` must not be
/// touched afterwards (its thread may return at once).
unsafe fn wake<U: UltItf>(e: NonNull<Entry<U>>) {
    let mut backoff = Backoff::new();
    // SAFETY: the entry lives until its thread is woken, i.e. until `notify`
    // succeeds; we do not touch it after that.
    while !unsafe { e.as_ref().parked.notify() } {
        backoff.snooze(std::thread::yield_now);
    }
}

/// A condition variable for [`Mutex`](crate::Mutex), like
/// [`std::sync::Condvar`], waking waiters in the order they started waiting.
/// Notifying does not require holding the mutex. There are no spurious
/// wake-ups.
///
/// ```
/// use ct_sync::{Condvar, Mutex};
/// use std::sync::Arc;
/// let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
/// let pair = Arc::new((Mutex::new(false), Condvar::new()));
/// rt.block_on(|| {
///     let p = pair.clone();
///     let waiter = ct_worker::spawn(move || {
///         let (m, cv) = &*p;
///         let ready = cv.wait_while(m.lock(), |ready| !*ready);
///         *ready
///     });
///     let (m, cv) = &*pair;
///     *m.lock() = true;
///     cv.notify_one();
///     assert!(waiter.join());
/// });
/// ```
pub struct Condvar<U: UltItf = Ult> {
    waiters: SpinLock<WaitList<U>>,
}

impl Condvar {
    /// A condition variable for user-level threads of a default-configuration
    /// runtime. For other threading libraries use [`Condvar::new_in`].
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self::new_in()
    }
}

impl Default for Condvar {
    fn default() -> Self {
        Self::new_in()
    }
}

impl<U: UltItf> Condvar<U> {
    /// A condition variable for threads of `U`.
    #[cfg(not(loom))]
    pub const fn new_in() -> Self {
        Condvar {
            waiters: SpinLock::new(WaitList {
                head: ptr::null_mut(),
                tail: ptr::null_mut(),
            }),
        }
    }

    /// A condition variable for threads of `U`.
    #[cfg(loom)]
    pub fn new_in() -> Self {
        Condvar {
            waiters: SpinLock::new(WaitList {
                head: ptr::null_mut(),
                tail: ptr::null_mut(),
            }),
        }
    }

    /// Releases the guard's mutex, parks until notified, then re-locks the
    /// mutex and returns the new guard. Use one condition variable with one
    /// mutex at a time.
    pub fn wait<'a, T: ?Sized, R: RawLock<U>>(
        &self,
        guard: MutexGuard<'a, T, U, R>,
    ) -> MutexGuard<'a, T, U, R> {
        let entry = Entry::<U> {
            parked: U::SuspendedThread::default(),
            next: ptr::null_mut(),
        };
        self.waiters.lock().push_back(NonNull::from(&entry));
        let mutex = guard.mutex();
        core::mem::forget(guard);
        // SAFETY: we hold the mutex (the guard was forgotten instead of
        // dropped); `entry` lives on this frame until we are woken through it.
        unsafe { mutex.raw().unlock_and_wait(&entry.parked) };
        mutex.lock()
    }

    /// Waits while `condition` holds, re-checking it after every wake-up.
    pub fn wait_while<'a, T: ?Sized, R: RawLock<U>>(
        &self,
        mut guard: MutexGuard<'a, T, U, R>,
        mut condition: impl FnMut(&mut T) -> bool,
    ) -> MutexGuard<'a, T, U, R> {
        while condition(&mut guard) {
            guard = self.wait(guard);
        }
        guard
    }

    /// Wakes the longest-waiting thread, if any. Returns whether one was woken.
    pub fn notify_one(&self) -> bool {
        let e = self.waiters.lock().pop_front();
        match e {
            // SAFETY: we took the entry off the list.
            Some(e) => unsafe {
                wake::<U>(e);
                true
            },
            None => false,
        }
    }

    /// Wakes every waiting thread, oldest first. Returns how many.
    pub fn notify_all(&self) -> usize {
        let mut e = self.waiters.lock().take_all();
        let mut n = 0;
        while let Some(entry) = NonNull::new(e) {
            // SAFETY: taken off the list by us; read the link before waking,
            // after which the entry may vanish.
            unsafe {
                e = entry.as_ref().next;
                wake::<U>(entry);
            }
            n += 1;
        }
        n
    }
}

impl<U: UltItf> core::fmt::Debug for Condvar<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Condvar").finish_non_exhaustive()
    }
}
