//! Atomics and cells for the lock protocols, swappable for `loom`'s under
//! `--cfg loom` so that the protocols are model-checked as written.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering, fence,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering, fence};

/// Defines a function that is `const` except under loom, whose atomics and
/// cells cannot be made in constant contexts: the same body, as two
/// `cfg`-selected items.
macro_rules! const_unless_loom {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$attr])*
        #[cfg(not(loom))]
        $vis const fn $name($($arg: $ty),*) -> $ret $body

        $(#[$attr])*
        #[cfg(loom)]
        $vis fn $name($($arg: $ty),*) -> $ret $body
    };
}
pub(crate) use const_unless_loom;

/// A number above 1 that differs between OS threads alive at the same time
/// (the address of a thread-local; under loom: between loom threads, which
/// share an OS thread).
#[cfg(not(loom))]
pub(crate) fn os_thread_id() -> usize {
    std::thread_local! {
        static ID: u8 = const { 0 };
    }
    ID.with(|b| core::ptr::from_ref(b) as usize)
}

#[cfg(loom)]
pub(crate) fn os_thread_id() -> usize {
    // The thread's number within the execution (its `Debug` form is
    // `ThreadId(n)`); hashing the id itself would differ between executions.
    let name = format!("{:?}", loom::thread::current().id());
    let n: usize = name
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0);
    (n + 1) * 64
}

/// Whether [`light_fence`] is only a compiler fence (the process can use
/// `membarrier`); under loom, where both sides are full fences, as if it
/// were.
#[inline]
pub(crate) fn asymmetric_fences() -> bool {
    cfg!(loom) || ct_worker::unstable::membarrier::available()
}

/// The cheap side of an asymmetric fence (see [`heavy_fence`]): only a
/// compiler fence when the process can use `membarrier`, else a full fence.
/// Under loom both sides are full fences (loom cannot model `membarrier`; the
/// protocol is checked with the symmetric equivalent).
#[inline]
pub(crate) fn light_fence() {
    #[cfg(not(loom))]
    if ct_worker::unstable::membarrier::available() {
        core::sync::atomic::compiler_fence(Ordering::SeqCst);
        return;
    }
    fence(Ordering::SeqCst);
}

/// The expensive side of an asymmetric fence: a full fence here and, via
/// `membarrier`, on every other running thread of the process. A store
/// before a [`light_fence`] and a load after it, against a store before this
/// fence and a load after it: at least one of the two loads sees the other
/// side's store (the Dekker guarantee of two full fences).
#[cold]
pub(crate) fn heavy_fence() {
    fence(Ordering::SeqCst);
    #[cfg(not(loom))]
    if ct_worker::unstable::membarrier::available() {
        ct_worker::unstable::membarrier::barrier();
    }
}

/// A cell whose accesses are made exclusive by a lock protocol (e.g. the MCS
/// queue's `head`, only touched by the lock holder). Under loom, accesses
/// are checked for causality: two accesses that the protocol fails to order
/// (one of them a write) fail the model. Shared with ct-delegate, whose
/// queues keep their entries in such cells.
#[derive(Debug)]
pub struct ProtocolCell<T> {
    #[cfg(not(loom))]
    inner: core::cell::UnsafeCell<T>,
    #[cfg(loom)]
    inner: loom::cell::UnsafeCell<T>,
}

impl<T> ProtocolCell<T> {
    #[cfg(not(loom))]
    /// A cell holding `v`.
    pub const fn new(v: T) -> Self {
        ProtocolCell {
            inner: core::cell::UnsafeCell::new(v),
        }
    }

    #[cfg(loom)]
    /// A cell holding `v`.
    pub fn new(v: T) -> Self {
        ProtocolCell {
            inner: loom::cell::UnsafeCell::new(v),
        }
    }

    /// The value (the cell is consumed, so no access can race).
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }

    /// Runs `f` with shared (read) access.
    ///
    /// # Safety
    ///
    /// The caller's protocol must guarantee that nobody writes the cell
    /// meanwhile.
    #[inline]
    pub unsafe fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(not(loom))]
        {
            f(self.inner.get())
        }
        #[cfg(loom)]
        {
            self.inner.with(f)
        }
    }

    /// Runs `f` with exclusive access.
    ///
    /// # Safety
    ///
    /// The caller's protocol must guarantee that nobody else accesses the
    /// cell meanwhile.
    #[inline]
    pub unsafe fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(not(loom))]
        {
            f(self.inner.get())
        }
        #[cfg(loom)]
        {
            self.inner.with_mut(f)
        }
    }
}

/// The workspace's one back-off (ct-worker's: spin, yield, park; never a
/// sleep on a worker thread). Shared with ct-delegate.
pub use ct_worker::Backoff;
