//! Mutexes that park waiting threads, on two lock protocols:
//!
//! - [`RawMutex`] (under [`Mutex`], the default): one CAS to lock, a store
//!   and a load to unlock; waiters park in a FIFO queue and a running thread
//!   may take a free lock before a woken waiter does (*barging*), which keeps
//!   a contended lock on one core. A woken waiter that cannot get the lock
//!   within about a millisecond has it handed to it directly, so nobody
//!   starves. See [`barging`].
//! - [`RawFairMutex`] (under [`FairMutex`]): the MCS queue lock with direct
//!   hand-off — strict FIFO, every contended acquisition is a hand-off to the
//!   next parked waiter. See [`fair`].
//!
//! Both implement [`RawLock`], including
//! [`unlock_and_wait`](RawLock::unlock_and_wait) (release and park in one
//! step, for condition variables), and both work on user-level threads and
//! on OS threads ([`ct_worker::OsThreads`]).

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};

use ct_worker::{Ult, UltItf};

pub mod barging;
pub mod fair;

pub use barging::RawMutex;
pub use fair::RawFairMutex;

/// A lock protocol that parks waiting threads of `U`: what [`Mutex`] is
/// built on. Call these methods directly when `lock` and `unlock` cannot be
/// paired by a guard (e.g. a lock taken in one function and released in
/// another, or released by another thread).
///
/// # Safety
///
/// Implementations must provide mutual exclusion: from a `lock` (or a
/// successful `try_lock`) until the matching `unlock` or `unlock_and_wait`,
/// no other `lock`/`try_lock` returns, and each release happens-before the
/// next acquisition.
pub unsafe trait RawLock<U: UltItf>: Send + Sync + Sized {
    /// An unlocked lock, for `const` construction.
    #[cfg(not(loom))]
    const INIT: Self;

    /// An unlocked lock.
    fn unlocked() -> Self;

    /// Acquires the lock, parking the calling thread while it is held.
    fn lock(&self);

    /// Acquires the lock if it is free.
    fn try_lock(&self) -> bool;

    /// Whether the lock is held (a hint: it may change at once).
    fn is_locked(&self) -> bool;

    /// Releases the lock; a waiting thread (if any) is made runnable — on
    /// the caller's worker ([`RawFairMutex`]) or on the worker it parked on
    /// ([`RawMutex`]) — and the caller continues.
    ///
    /// # Safety
    ///
    /// The caller must hold the lock (acquired by any thread: the lock is not
    /// tied to an OS or user-level thread).
    unsafe fn unlock(&self);

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
    unsafe fn unlock_and_wait(&self, slot: &U::SuspendedThread);
}

/// A mutual-exclusion lock owning its data, like [`std::sync::Mutex`], whose
/// waiters park (user-level threads switch away instead of blocking their
/// worker). `R` is the lock protocol: [`RawMutex`] by default (fast, barging
/// with eventual hand-off), or [`RawFairMutex`] (strict FIFO hand-off, see
/// [`FairMutex`]). There is no poisoning: a panic while holding the guard
/// unlocks.
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
pub struct Mutex<T: ?Sized, U: UltItf = Ult, R: RawLock<U> = RawMutex<U>> {
    raw: R,
    _itf: core::marker::PhantomData<fn() -> U>,
    data: UnsafeCell<T>,
}

/// A [`Mutex`] on the fair MCS protocol: the lock goes to waiters strictly
/// in arrival order, by direct hand-off. Slower than [`Mutex`] under
/// contention (every contended acquisition switches threads), but no thread
/// can overtake a waiting one.
///
/// ```
/// use ct_sync::FairMutex;
/// let m: FairMutex<Vec<u32>> = FairMutex::new_in(Vec::new());
/// m.lock().push(1);
/// assert_eq!(*m.lock(), [1]);
/// ```
pub type FairMutex<T, U = Ult> = Mutex<T, U, RawFairMutex<U>>;

// SAFETY: the mutex hands `&mut T` to one holder at a time.
unsafe impl<T: ?Sized + Send, U: UltItf, R: RawLock<U>> Send for Mutex<T, U, R> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send, U: UltItf, R: RawLock<U>> Sync for Mutex<T, U, R> {}

impl<T> Mutex<T> {
    /// A mutex for user-level threads of a default-configuration runtime.
    /// For other threading libraries or protocols use [`Mutex::new_in`].
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Self {
        Self::new_in(value)
    }
}

impl<T, U: UltItf, R: RawLock<U>> Mutex<T, U, R> {
    /// A mutex for threads of `U` on protocol `R` (e.g.
    /// `Mutex::<_, OsThreads>::new_in(0)`).
    #[cfg(not(loom))]
    pub const fn new_in(value: T) -> Self {
        Mutex {
            raw: R::INIT,
            _itf: core::marker::PhantomData,
            data: UnsafeCell::new(value),
        }
    }

    /// A mutex for threads of `U` on protocol `R`.
    #[cfg(loom)]
    pub fn new_in(value: T) -> Self {
        Mutex {
            raw: R::unlocked(),
            _itf: core::marker::PhantomData,
            data: UnsafeCell::new(value),
        }
    }

    /// Consumes the mutex, returning the data.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized, U: UltItf, R: RawLock<U>> Mutex<T, U, R> {
    /// Acquires the lock, parking while it is held.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T, U, R> {
        self.raw.lock();
        MutexGuard { mutex: self }
    }

    /// Acquires the lock if it is free.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T, U, R>> {
        self.raw.try_lock().then(|| MutexGuard { mutex: self })
    }

    /// Mutable access without locking (the borrow proves exclusivity).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// The underlying raw lock.
    pub fn raw(&self) -> &R {
        &self.raw
    }
}

impl<T: Default, U: UltItf, R: RawLock<U>> Default for Mutex<T, U, R> {
    fn default() -> Self {
        Mutex {
            raw: R::unlocked(),
            _itf: core::marker::PhantomData,
            data: UnsafeCell::new(T::default()),
        }
    }
}

impl<T: ?Sized + core::fmt::Debug, U: UltItf, R: RawLock<U>> core::fmt::Debug for Mutex<T, U, R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.try_lock() {
            Some(g) => f.debug_struct("Mutex").field("data", &&*g).finish(),
            None => f.debug_struct("Mutex").field("data", &"<locked>").finish(),
        }
    }
}

/// Access to a [`Mutex`]'s data; unlocks when dropped.
#[must_use = "the mutex unlocks as soon as the guard is dropped"]
pub struct MutexGuard<'a, T: ?Sized, U: UltItf = Ult, R: RawLock<U> = RawMutex<U>> {
    mutex: &'a Mutex<T, U, R>,
}

// SAFETY: sharing a guard only shares `&T`.
unsafe impl<T: ?Sized + Sync, U: UltItf, R: RawLock<U>> Sync for MutexGuard<'_, T, U, R> {}

impl<'a, T: ?Sized, U: UltItf, R: RawLock<U>> MutexGuard<'a, T, U, R> {
    /// The mutex this guard locks (used by [`Condvar`](crate::Condvar)).
    pub(crate) fn mutex(&self) -> &'a Mutex<T, U, R> {
        self.mutex
    }
}

impl<T: ?Sized, U: UltItf, R: RawLock<U>> Deref for MutexGuard<'_, T, U, R> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &*self.mutex.data.get() }
    }
}

impl<T: ?Sized, U: UltItf, R: RawLock<U>> DerefMut for MutexGuard<'_, T, U, R> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &mut *self.mutex.data.get() }
    }
}

impl<T: ?Sized, U: UltItf, R: RawLock<U>> Drop for MutexGuard<'_, T, U, R> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the guard proves we hold the lock.
        unsafe { self.mutex.raw.unlock() };
    }
}

impl<T: ?Sized + core::fmt::Debug, U: UltItf, R: RawLock<U>> core::fmt::Debug
    for MutexGuard<'_, T, U, R>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        (**self).fmt(f)
    }
}
