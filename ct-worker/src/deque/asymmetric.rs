//! A Chase–Lev deque whose owner operations need no memory fence.
//!
//! In the Chase–Lev algorithm the owner's `pop` must order its store of
//! `bottom` before its load of `top` — a full fence (`lock or` on x86, about
//! 5 ns here), paid on every pop, i.e. on every fork/join of a work-first
//! scheduler. Thieves, which are rare, order their load of `top` before
//! their load of `bottom` with the matching fence.
//!
//! This deque makes the pair *asymmetric*: the owner uses only a compiler
//! fence, and a thief issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`,
//! which makes every other running thread of the process execute a full
//! barrier before the call returns. For the owner this means: either its store
//! of `bottom` happened before that barrier, and the thief's later load sees
//! it; or its load of `top` happened after it, and sees at least the value
//! the thief read. That is exactly the Dekker guarantee the symmetric fences
//! gave. A thief first checks with plain loads whether the deque looks
//! non-empty, so idle thieves do not interrupt busy workers with barriers.
//!
//! Where `membarrier` is unavailable (old kernels, seccomp filters), both
//! sides fall back to ordinary fences — the textbook Chase–Lev deque.
//!
//! Buffers grow by doubling and never shrink; a replaced buffer is kept until
//! the deque is dropped, since a thief may still be reading it (at most as
//! much memory again as the largest buffer).

use core::cell::{Cell, UnsafeCell};
use core::mem::MaybeUninit;
use core::ptr;
use std::sync::atomic::{AtomicIsize, AtomicPtr, Ordering, compiler_fence, fence};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use super::{DequeStealer, Steal, WorkerDeque};

const MIN_CAPACITY: usize = 64;

struct Buffer<T> {
    mask: usize,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
}

impl<T> Buffer<T> {
    fn new(cap: usize) -> Box<Self> {
        debug_assert!(cap.is_power_of_two());
        Box::new(Buffer {
            mask: cap - 1,
            slots: (0..cap)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
        })
    }

    fn cap(&self) -> usize {
        self.mask + 1
    }

    fn at(&self, i: isize) -> *mut MaybeUninit<T> {
        self.slots[i as usize & self.mask].get()
    }
}

struct Inner<T> {
    top: CachePadded<AtomicIsize>,
    bottom: CachePadded<AtomicIsize>,
    buffer: AtomicPtr<Buffer<T>>,
    /// Replaced buffers, freed with the deque. Boxed: thieves may hold
    /// pointers to the `Buffer` headers themselves, which must not move.
    #[allow(clippy::vec_box)]
    retired: Mutex<Vec<Box<Buffer<T>>>>,
    /// Whether thieves use `membarrier` (and the owner a compiler fence).
    asymmetric: bool,
}

// SAFETY: items are moved between threads only through the Chase–Lev
// protocol (each index is taken by exactly one party, validated by CAS on
// `top` where contended).
unsafe impl<T: Send> Send for Inner<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Inner<T> {}

impl<T> Drop for Inner<T> {
    fn drop(&mut self) {
        let t = *self.top.get_mut();
        let b = *self.bottom.get_mut();
        let buf = *self.buffer.get_mut();
        // SAFETY: no other handle exists; items in t..b are initialised.
        unsafe {
            for i in t..b {
                ptr::drop_in_place((*(*buf).at(i)).as_mut_ptr());
            }
            drop(Box::from_raw(buf));
        }
    }
}

/// The owner's end of an [`AsymmetricChaseLev`] deque.
pub struct AsymmetricChaseLev<T> {
    inner: Arc<Inner<T>>,
    /// The owner's copy of the current buffer (only the owner replaces it).
    buffer: Cell<*mut Buffer<T>>,
}

/// The thieves' end of an [`AsymmetricChaseLev`] deque.
pub struct AsymmetricStealer<T> {
    inner: Arc<Inner<T>>,
}

// SAFETY: the owner's end may move to another thread (it is used by one
// thread at a time); `Cell` is only touched by the owner.
unsafe impl<T: Send> Send for AsymmetricChaseLev<T> {}

impl<T> core::fmt::Debug for AsymmetricChaseLev<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsymmetricChaseLev")
            .field("asymmetric", &self.inner.asymmetric)
            .finish_non_exhaustive()
    }
}

impl<T> core::fmt::Debug for AsymmetricStealer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsymmetricStealer").finish_non_exhaustive()
    }
}

impl<T> AsymmetricChaseLev<T> {
    /// Whether this deque runs fence-free on the owner side (`membarrier`
    /// is available) or fell back to symmetric fences.
    pub fn is_asymmetric(&self) -> bool {
        self.inner.asymmetric
    }

    /// Doubles the buffer, copying the live items `t..b`.
    #[cold]
    fn grow(&self, t: isize, b: isize) {
        let old = self.buffer.get();
        // SAFETY: only the owner replaces buffers; `old` is current.
        let new = Buffer::<T>::new(unsafe { (*old).cap() } * 2);
        for i in t..b {
            // SAFETY: items t..b are initialised in `old`; copying the bits
            // keeps one logical owner (the deque) per item.
            unsafe { ptr::copy_nonoverlapping((*old).at(i), new.at(i), 1) };
        }
        let new = Box::into_raw(new);
        self.inner.buffer.store(new, Ordering::Release);
        self.buffer.set(new);
        // SAFETY: `old` came from `Box::into_raw`; thieves may still read it,
        // so it is retired, not freed.
        let old = unsafe { Box::from_raw(old) };
        self.inner
            .retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(old);
    }
}

/// Heavy side of the asymmetric barrier.
#[inline]
fn heavy_fence(asymmetric: bool) {
    if asymmetric {
        crate::membarrier::barrier();
    } else {
        fence(Ordering::SeqCst);
    }
}

impl<T: Send + 'static> WorkerDeque<T> for AsymmetricChaseLev<T> {
    type Stealer = AsymmetricStealer<T>;

    fn new() -> (Self, Self::Stealer) {
        let buf = Box::into_raw(Buffer::<T>::new(MIN_CAPACITY));
        let inner = Arc::new(Inner {
            top: CachePadded::new(AtomicIsize::new(0)),
            bottom: CachePadded::new(AtomicIsize::new(0)),
            buffer: AtomicPtr::new(buf),
            retired: Mutex::new(Vec::new()),
            asymmetric: crate::membarrier::available(),
        });
        let stealer = AsymmetricStealer {
            inner: inner.clone(),
        };
        (
            AsymmetricChaseLev {
                inner,
                buffer: Cell::new(buf),
            },
            stealer,
        )
    }

    #[inline]
    fn push(&self, item: T) {
        let b = self.inner.bottom.load(Ordering::Relaxed);
        let t = self.inner.top.load(Ordering::Acquire);
        // SAFETY: the owner's buffer copy is current.
        if b - t >= unsafe { (*self.buffer.get()).cap() } as isize {
            self.grow(t, b);
        }
        // SAFETY: slot `b` is outside t..b, so no thief reads it as an item
        // until `bottom` is published below.
        unsafe { (*self.buffer.get()).at(b).write(MaybeUninit::new(item)) };
        self.inner.bottom.store(b + 1, Ordering::Release);
    }

    #[inline]
    fn pop(&self) -> Option<T> {
        let inner = &*self.inner;
        let b = inner.bottom.load(Ordering::Relaxed) - 1;
        inner.bottom.store(b, Ordering::Relaxed);
        if inner.asymmetric {
            // Thieves' `membarrier` orders this pair for us.
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        let t = inner.top.load(Ordering::Relaxed);
        if t > b {
            inner.bottom.store(b + 1, Ordering::Relaxed);
            return None;
        }
        // SAFETY: index b is in t..=b, initialised, and ours unless a thief
        // wins the race for the last item (checked below).
        let item = unsafe { (*self.buffer.get()).at(b).read() };
        if t == b {
            let won = inner
                .top
                .compare_exchange(t, t + 1, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok();
            inner.bottom.store(b + 1, Ordering::Relaxed);
            if !won {
                // A thief took it; our copy of the bits is not ours to drop.
                return None;
            }
        }
        // SAFETY: the item at `b` is ours.
        Some(unsafe { item.assume_init() })
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.inner.bottom.load(Ordering::Relaxed) <= self.inner.top.load(Ordering::Relaxed)
    }

    #[inline]
    fn len(&self) -> usize {
        let (b, t) = (
            self.inner.bottom.load(Ordering::Relaxed),
            self.inner.top.load(Ordering::Relaxed),
        );
        (b - t).max(0) as usize
    }
}

impl<T: Send + 'static> DequeStealer<T> for AsymmetricStealer<T> {
    fn steal(&self) -> Steal<T> {
        let inner = &*self.inner;
        let t = inner.top.load(Ordering::Acquire);
        // Cheap look first: no barrier (and no interruption of the owner)
        // when there is evidently nothing to steal.
        if inner.bottom.load(Ordering::Acquire) <= t {
            return Steal::Empty;
        }
        heavy_fence(inner.asymmetric);
        let b = inner.bottom.load(Ordering::Acquire);
        if b <= t {
            return Steal::Empty;
        }
        let buf = inner.buffer.load(Ordering::Acquire);
        // SAFETY: `buf` is current or retired, so it is alive; slot `t`
        // holds the item at index t unless the owner or another thief takes
        // it first, which makes the CAS below fail (we then forget the copy).
        let item = unsafe { ptr::read_volatile((*buf).at(t)) };
        if inner
            .top
            .compare_exchange(t, t + 1, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return Steal::Retry;
        }
        // SAFETY: the CAS gave us index t.
        Steal::Success(unsafe { item.assume_init() })
    }

    fn is_empty(&self) -> bool {
        self.inner.bottom.load(Ordering::Acquire) <= self.inner.top.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_keeps_order() {
        let (d, s) = AsymmetricChaseLev::<u32>::new();
        for i in 0..1000 {
            d.push(i);
        }
        assert_eq!(s.steal(), Steal::Success(0));
        for i in (1..1000).rev() {
            assert_eq!(d.pop(), Some(i));
        }
        assert_eq!(d.pop(), None);
        assert_eq!(s.steal(), Steal::Empty);
    }

    #[test]
    fn drops_remaining_items() {
        let item = Arc::new(());
        {
            let (d, s) = AsymmetricChaseLev::new();
            for _ in 0..100 {
                d.push(item.clone());
            }
            drop(d);
            assert!(matches!(s.steal(), Steal::Success(_)));
        }
        assert_eq!(
            Arc::strong_count(&item),
            1,
            "no item leaked or dropped twice"
        );
    }
}
