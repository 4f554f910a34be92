//! Synchronisation that works across processes: critical sections, a
//! mutex and an atomic integer on the DSM.
//!
//! `std::sync::Mutex` and the `std::sync::atomic` types do **not** work on
//! data shared between processes: every process has its own copy of a DSM
//! page, and a locked instruction is atomic only on that copy. Two
//! processes could both "hold" a std mutex in DSM memory, or both add 1 to
//! an atomic and publish 1. Use these types instead (within one process,
//! the std types are fine on process-local data). Thread-locals are per OS
//! thread, and team threads are user-level threads that share OS threads:
//! index per-thread data by [`Thread::thread_num`](crate::Thread) instead.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};

use ct_worker::OsThreads;
use menps_dsm::dsm::DsmMutexGuard;
use menps_dsm::dsm::allocator::RuntimeGuard;

use crate::error::fail;
use crate::runtime::{Com, Runtime, expect_runtime};

/// Key of the critical section called `name` (FNV-1a, with a tag that
/// keeps it apart from address keys).
pub fn name_key(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"menps-omp critical:".iter().chain(name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // Address keys are below 2^47; names live above.
    h | (1 << 62)
}

/// A held DSM mutex of the program.
pub type Held = DsmMutexGuard<'static, Com, OsThreads>;

/// Locks the DSM mutex of `key` (a DSM failure is fatal: `what` names it).
pub fn lock(rt: &'static Runtime, key: u64, what: &str) -> Held {
    let _g = RuntimeGuard::enter();
    let m = rt.dsm.mutex_for_key(key).unwrap_or_else(|e| fail(what, e));
    rt.dsm.lock(m).unwrap_or_else(|e| fail(what, e))
}

/// Unlocks a mutex [`lock`] locked.
pub fn unlock(held: Held, what: &str) {
    let _g = RuntimeGuard::enter();
    held.unlock().unwrap_or_else(|e| fail(what, e));
}

/// Runs `f` inside the critical section `name` of the whole job.
pub(crate) fn critical_named<R>(name: &str, f: impl FnOnce() -> R) -> R {
    let rt = expect_runtime("a critical section");
    let held = lock(rt, name_key(name), "critical section");
    let r = f();
    unlock(held, "critical section");
    r
}

/// Runs an ordered part under the ordered loops' mutex (it carries the
/// previous ordered part's writes).
pub(crate) fn ordered_lock<R>(f: impl FnOnce() -> R) -> R {
    let rt = expect_runtime("an ordered loop");
    let held = lock(rt, name_key("\0ordered"), "ordered loop");
    let r = f();
    unlock(held, "ordered loop");
    r
}

/// Runs `f` inside the critical section called `name`, from anywhere in a
/// program started by [`run`](crate::run) (`#pragma omp critical(name)`).
pub fn critical<R>(name: &str, f: impl FnOnce() -> R) -> R {
    critical_named(name, f)
}

/// A mutual-exclusion lock for data shared across processes: a DSM mutex
/// keyed by the lock's own address, so it needs no set-up and the same
/// lock is found in every process. Locking makes everything the previous
/// holder wrote (under the lock or before) visible.
///
/// It must live in DSM memory (a local of `main`, the DSM heap, a DSM
/// global): [`Mutex::lock`] panics otherwise when the job has several
/// processes.
pub struct Mutex<T: ?Sized> {
    data: UnsafeCell<T>,
}

// SAFETY: the DSM mutex gives one holder at a time in the whole job.
unsafe impl<T: ?Sized + Send> Sync for Mutex<T> {}
// SAFETY: as any mutex.
unsafe impl<T: ?Sized + Send> Send for Mutex<T> {}

impl<T> Mutex<T> {
    /// A new unlocked mutex.
    pub const fn new(v: T) -> Self {
        Mutex {
            data: UnsafeCell::new(v),
        }
    }

    /// The value (no other reference can exist).
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks, waiting (parked, not spinning) while another thread of any
    /// process holds the lock.
    ///
    /// # Panics
    ///
    /// Outside [`run`](crate::run); if the mutex is not in DSM memory in a
    /// job of several processes; if the DSM fails.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let rt = expect_runtime("menps_omp::sync::Mutex::lock");
        let addr = self.data.get() as *const u8;
        if rt.dsm.nprocs() > 1 && rt.dsm.block_state(addr).is_none() {
            panic!(
                "menps-omp: a Mutex at {addr:p} is not in DSM memory: other processes cannot see \
                 it (create it in main, on the DSM heap or as a DSM global)"
            );
        }
        let held = lock(rt, addr as usize as u64, "Mutex::lock");
        MutexGuard {
            lock: self,
            held: Some(held),
        }
    }

    /// The value, through an exclusive borrow (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }
}

impl<T: ?Sized> core::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Mutex").finish_non_exhaustive()
    }
}

/// The holder of a [`Mutex`]; unlocks when dropped.
pub struct MutexGuard<'a, T: ?Sized> {
    lock: &'a Mutex<T>,
    held: Option<Held>,
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: we hold the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: we hold the lock.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            unlock(held, "Mutex unlock");
        }
    }
}

impl<T: ?Sized> core::fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MutexGuard").finish_non_exhaustive()
    }
}

/// A 64-bit integer updated atomically across processes (a DSM atomic,
/// with acquire and release semantics: every operation also publishes this
/// process's writes and sees those published before). Each operation is a
/// DSM transaction — microseconds, not nanoseconds: combine values with
/// reductions where you can.
///
/// It must live in DSM memory, like [`Mutex`].
#[repr(transparent)]
pub struct AtomicU64 {
    v: UnsafeCell<u64>,
}

// SAFETY: every access goes through DSM atomics.
unsafe impl Sync for AtomicU64 {}

impl AtomicU64 {
    /// A new atomic integer.
    pub const fn new(v: u64) -> Self {
        AtomicU64 {
            v: UnsafeCell::new(v),
        }
    }

    fn rt(&self, what: &str) -> &'static Runtime {
        expect_runtime(what)
    }

    /// Adds `delta` (wrapping); returns the previous value.
    pub fn fetch_add(&self, delta: u64) -> u64 {
        let rt = self.rt("AtomicU64::fetch_add");
        let _g = RuntimeGuard::enter();
        rt.dsm
            .fetch_add(self.v.get(), delta)
            .unwrap_or_else(|e| fail("AtomicU64::fetch_add", e))
    }

    /// Subtracts `delta` (wrapping); returns the previous value.
    pub fn fetch_sub(&self, delta: u64) -> u64 {
        self.fetch_add(delta.wrapping_neg())
    }

    /// The value (acquire).
    pub fn load(&self) -> u64 {
        let rt = self.rt("AtomicU64::load");
        let _g = RuntimeGuard::enter();
        rt.dsm
            .load_acquire(self.v.get())
            .unwrap_or_else(|e| fail("AtomicU64::load", e))
    }

    /// Stores `v` (release).
    pub fn store(&self, v: u64) {
        let rt = self.rt("AtomicU64::store");
        let _g = RuntimeGuard::enter();
        rt.dsm
            .store_release(self.v.get(), v)
            .unwrap_or_else(|e| fail("AtomicU64::store", e))
    }

    /// Replaces the value with `new` if it is `current`: `Ok(previous)` on
    /// success, `Err(actual)` otherwise.
    pub fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        let rt = self.rt("AtomicU64::compare_exchange");
        let _g = RuntimeGuard::enter();
        rt.dsm
            .compare_exchange(self.v.get(), current, new)
            .unwrap_or_else(|e| fail("AtomicU64::compare_exchange", e))
    }

    /// The value, through an exclusive borrow.
    pub fn get_mut(&mut self) -> &mut u64 {
        self.v.get_mut()
    }
}

impl core::fmt::Debug for AtomicU64 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AtomicU64").finish_non_exhaustive()
    }
}
