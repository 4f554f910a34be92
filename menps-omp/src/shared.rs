//! Mutable work-sharing over a slice without `unsafe`: [`SharedMut`].

use core::marker::PhantomData;
use core::ops::Range;

use menps_dsm::dsm::allocator::RuntimeGuard;

use crate::region::Thread;
use crate::runtime::expect_runtime;
use crate::wait::Waiter;

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

    /// The slice's address (the registry key of its uses).
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

/// The registry key of views (loops have (region id, loop number) keys,
/// and region ids never reach it).
const VIEWS: (u64, u64) = (u64::MAX, u64::MAX);

/// Registers one use of the slice at `addr` under `key` (a loop, or views)
/// by the calling thread in this process. Uses under one key coexist (the
/// threads of one loop; views); a use under another key waits until those
/// end, unless the caller itself holds one of them, which panics: it could
/// only alias.
fn register(addr: usize, key: (u64, u64)) {
    let rt = expect_runtime("a SharedMut");
    let me = ct_worker::current_thread_id().unwrap_or(usize::MAX);
    let mut w = Waiter::new();
    loop {
        {
            let _g = RuntimeGuard::enter();
            let mut active = rt.shared_mut.lock().unwrap_or_else(|e| e.into_inner());
            let mut conflicts = active.iter().filter(|u| u.0 == addr && u.1 != key);
            match conflicts.next() {
                None => {
                    active.push((addr, key, me));
                    return;
                }
                Some(_)
                    if active
                        .iter()
                        .any(|u| u.0 == addr && u.1 != key && u.2 == me) =>
                {
                    let held = active
                        .iter()
                        .find(|u| u.0 == addr && u.1 != key && u.2 == me)
                        .map(|u| u.1);
                    drop(active);
                    let what = if held == Some(VIEWS) {
                        "a thread writes a SharedMut in a work-sharing loop while it holds a view                          of it (drop the view before the loop)"
                    } else if key == VIEWS {
                        "a thread takes a view of a SharedMut inside a work-sharing loop that                          writes it"
                    } else {
                        "a work-sharing loop over a SharedMut started inside another loop over                          it (nested loops over one SharedMut would alias its elements)"
                    };
                    panic!("menps-omp: {what}")
                }
                // Other threads' uses: they end soon in a conforming program
                // (a view dropped right after a barrier, the threads of a
                // loop leaving it).
                Some(_) => {}
            }
        }
        w.wait();
    }
}

/// Undoes the calling thread's [`register`] of `addr` under `key`.
fn unregister(addr: usize, key: (u64, u64)) {
    let Some(rt) = crate::runtime::runtime() else {
        return;
    };
    let me = ct_worker::current_thread_id().unwrap_or(usize::MAX);
    let _g = RuntimeGuard::enter();
    let mut active = rt.shared_mut.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = active.iter().position(|u| *u == (addr, key, me)) {
        active.swap_remove(k);
    }
}

/// This process takes part in one mutable work-sharing loop over a
/// `SharedMut` while it lives; another loop over the same slice meanwhile
/// (a nested one), or a view, is refused.
pub(crate) struct MutLoopGuard {
    addr: usize,
    key: (u64, u64),
}

impl MutLoopGuard {
    /// Registers `t`'s current mutable loop over the slice at `addr`.
    pub fn enter(t: &Thread<'_>, addr: usize) -> Self {
        let n = t.mut_loops.get();
        t.mut_loops.set(n + 1);
        let key = (t.region_id, n);
        register(addr, key);
        MutLoopGuard { addr, key }
    }
}

impl Drop for MutLoopGuard {
    fn drop(&mut self) {
        unregister(self.addr, self.key);
    }
}

/// Read access to the whole of a [`SharedMut`] between the work-sharing
/// loops that write it ([`SharedMut::view`]): it dereferences to `&[T]`.
///
/// In a process, a loop that writes the slice waits until the other
/// threads' views of it are dropped, and a view waits until such a loop
/// has ended there; a thread that would alias itself (write the slice in a
/// loop while holding a view of it, take a view inside a loop writing it)
/// panics. A view shows what the other threads wrote before the last
/// barrier (take it after the barrier that ends the writing loop).
pub struct SharedView<'s, T> {
    data: &'s [T],
    registered: bool,
}

impl<'a, T> SharedMut<'a, T> {
    /// A view of every element, for the phase of a region that reads what
    /// the threads wrote in an earlier loop (the halo rows of a stencil,
    /// the histograms of a sort):
    ///
    /// ```no_run
    /// # fn f(n: usize) {
    /// let (mut a, mut b) = (vec![0.0f64; n], vec![0.0f64; n]);
    /// let (a, b) = (menps_omp::SharedMut::new(&mut a), menps_omp::SharedMut::new(&mut b));
    /// menps_omp::parallel(|t| {
    ///     for sweep in 0..100 {
    ///         let (src, dst) = if sweep % 2 == 0 { (&a, &b) } else { (&b, &a) };
    ///         let old = src.view();
    ///         t.for_range(1..n - 1).each_mut(dst, |i, x| *x = (old[i - 1] + old[i + 1]) / 2.0);
    ///     }
    /// });
    /// # }
    /// ```
    ///
    /// (The loop over `dst` ends with a barrier while `old`, a view of the
    /// other slice, is alive; in the next sweep the loop over that slice
    /// waits, if need be, until every thread has dropped its `old`.)
    ///
    /// # Panics
    ///
    /// If the calling thread runs a work-sharing loop that writes this
    /// slice.
    pub fn view(&self) -> SharedView<'_, T> {
        let registered = crate::runtime::runtime().is_some();
        if registered {
            register(self.addr(), VIEWS);
        }
        // SAFETY: no loop writes the slice in this process (the registry
        // refused otherwise) and none can start while the view is
        // registered; other processes write their own copies of its pages.
        let data = unsafe { core::slice::from_raw_parts(self.ptr.cast_const(), self.len) };
        SharedView { data, registered }
    }
}

impl<T> core::ops::Deref for SharedView<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> Drop for SharedView<'_, T> {
    fn drop(&mut self) {
        if self.registered {
            unregister(self.data.as_ptr() as usize, VIEWS);
        }
    }
}

impl<T> core::fmt::Debug for SharedView<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedView")
            .field("len", &self.data.len())
            .finish()
    }
}

/// Runs `f` with its allocations taken from this process's private heap
/// instead of the DSM heap: for scratch memory that only the calling
/// thread (or its process) uses, which then costs nothing at barriers —
/// DSM memory that a thread writes is published at every barrier, even if
/// no other process ever reads it.
///
/// ```no_run
/// # fn f(t: &menps_omp::Thread<'_>, n: usize) {
/// // A work vector of this thread only.
/// let mut scratch: Vec<f64> = menps_omp::private(|| vec![0.0; n]);
/// scratch[0] = 1.0;
/// # }
/// ```
///
/// The memory must not be shared with other processes (they cannot see
/// it). Freeing it anywhere is fine; growing it outside `private` (a
/// `push` beyond its capacity) moves it to the DSM heap.
pub fn private<R>(f: impl FnOnce() -> R) -> R {
    let _private = RuntimeGuard::enter();
    f()
}
