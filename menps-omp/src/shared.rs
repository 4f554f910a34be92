//! Mutable work-sharing over a slice without `unsafe`: [`SharedMut`].

use core::marker::PhantomData;
use core::ops::Range;

use menps_dsm::dsm::allocator::RuntimeGuard;

use crate::region::Thread;
use crate::runtime::expect_runtime;

/// A slice that the threads of a team write in parallel, each element by
/// the one thread a work-sharing loop gives its index to
/// ([`Loop::each_mut`](crate::Loop::each_mut),
/// [`Loop::chunks_mut`](crate::Loop::chunks_mut)).
///
/// It borrows the slice mutably for its life, and the elements are
/// reachable only through those loops — which hand every index to exactly
/// one thread and end with a barrier — so no two threads ever hold the
/// same element.
///
/// ```no_run
/// # fn f() {
/// let mut v = vec![0u64; 1000];
/// let out = menps_omp::SharedMut::new(&mut v);
/// menps_omp::parallel(|t| {
///     t.for_range(0..1000).each_mut(&out, |i, x| *x = (i * i) as u64);
/// });
/// assert_eq!(v[10], 100); // the loops' borrow of `v` ended with `out`'s last use
/// # }
/// ```
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: threads get disjoint `&mut T` (see `slice_mut`), which needs
// `T: Send`; the handle itself exposes nothing else.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    /// Shares `data` for work-sharing loops.
    pub fn new(data: &'a mut [T]) -> Self {
        SharedMut {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: PhantomData,
        }
    }

    /// Elements of the slice.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The elements `r`.
    ///
    /// # Safety
    ///
    /// `r` lies within the slice, and no other reference to its elements
    /// exists while the result lives.
    // A `&self` method handing out `&mut`: the slice is borrowed mutably
    // by `self`, and the callers (the loops) keep the pieces disjoint.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, r: Range<usize>) -> &mut [T] {
        debug_assert!(r.end <= self.len);
        // SAFETY: the caller's contract.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }
}

impl<T> core::fmt::Debug for SharedMut<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedMut")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// This process takes part in one mutable work-sharing loop over a
/// `SharedMut` while it lives; another loop over the same slice meanwhile
/// (a nested one) is refused.
pub(crate) struct MutLoopGuard {
    addr: usize,
}

impl MutLoopGuard {
    /// Registers `t`'s current mutable loop over the slice at `addr`.
    pub fn enter(t: &Thread<'_>, addr: usize) -> Self {
        let n = t.mut_loops.get();
        t.mut_loops.set(n + 1);
        let key = (t.info.id, n);
        let rt = expect_runtime("a work-sharing loop");
        let _g = RuntimeGuard::enter();
        let mut active = rt.shared_mut.lock().unwrap_or_else(|e| e.into_inner());
        match active.iter_mut().find(|(a, _, _)| *a == addr) {
            Some((_, k, count)) if *k == key => *count += 1,
            Some(_) => {
                drop(active);
                panic!(
                    "menps-omp: a work-sharing loop over a SharedMut started while another loop \
                     over it runs (nested loops over one SharedMut would alias its elements)"
                )
            }
            None => active.push((addr, key, 1)),
        }
        MutLoopGuard { addr }
    }
}

impl Drop for MutLoopGuard {
    fn drop(&mut self) {
        let Some(rt) = crate::runtime::runtime() else {
            return;
        };
        let _g = RuntimeGuard::enter();
        let mut active = rt.shared_mut.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = active.iter().position(|(a, _, _)| *a == self.addr) {
            active[k].2 -= 1;
            if active[k].2 == 0 {
                active.swap_remove(k);
            }
        }
    }
}
