//! Typed helpers over the DSM heap: [`DsmBox<T>`], one value in the heap,
//! and [`DsmVec<T>`], an array that every process creates together and
//! accesses in checked stripes ([`StripeMut`], [`Stripe`]).
//!
//! A value must make sense in every process that reads it: plain data, DSM
//! addresses and addresses of statics are the same everywhere (one binary,
//! no address randomisation), pointers to a process's own heap or stack are
//! not. Values that own memory (`String`, `Vec`, `Box` …) are fine when that
//! memory is DSM memory too: with [`DsmAllocator`](super::DsmAllocator) as
//! the global allocator, values built in DSM context own DSM heap memory.
//! Dropping a box drops its value (its destructor runs in the process that
//! drops the box); a vector's values are dropped by the process that drops
//! the last handle to it.
//!
//! Accesses follow the DSM's rules (release consistency): what one process
//! writes, another reads after synchronising with it (a barrier, a DSM
//! mutex, an atomic with release/acquire semantics).

use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;

use ct_worker::{OsThreads, UltItf};

use crate::com::Communicator;

use super::Dsm;
use super::error::{DsmError, DsmResult};

mod borrows;
mod vec;

pub use vec::{DsmVec, Stripe, StripeMut};

/// A value of type `T` in the DSM heap, owned like a [`Box`].
///
/// The box dereferences to the value through its DSM address (accesses may
/// fault and be resolved by the DSM). It can move to another process:
/// [`DsmBox::into_raw`] gives up ownership and returns the address, which
/// the other process turns back into a box with [`DsmBox::from_raw`] —
/// after synchronising with the writer, so it sees the value.
///
/// Dropping the box frees the object, in whichever process holds the box
/// then (any process may free any heap object; `free` publishes the
/// dropping process's own writes first). Errors are reported by
/// [`DsmBox::free`]; a drop panics on a pointer the heap rejects (a
/// double free through two boxes) and ignores other errors (a failed DSM
/// reports its failure at every later operation).
pub struct DsmBox<'d, T: 'static, C: Communicator + 'static, U: UltItf = OsThreads> {
    ptr: NonNull<T>,
    dsm: &'d Dsm<C, U>,
    _own: PhantomData<T>,
}

// SAFETY: the box owns its value like a `Box<T>` does (nobody else accesses
// it while the box lives, per `new` / `from_raw`), and `&Dsm` may be sent
// between threads when `Dsm` is `Sync`.
unsafe impl<T: Send + 'static, C: Communicator + 'static, U: UltItf> Send for DsmBox<'_, T, C, U> where
    Dsm<C, U>: Sync
{
}

// SAFETY: `&DsmBox` only gives `&T` (shared reads) and `&Dsm`.
unsafe impl<T: Sync + 'static, C: Communicator + 'static, U: UltItf> Sync for DsmBox<'_, T, C, U> where
    Dsm<C, U>: Sync
{
}

impl<'d, T: 'static, C: Communicator + 'static, U: UltItf> DsmBox<'d, T, C, U> {
    /// Allocates room for a `T` in the DSM heap and moves `value` there.
    pub fn new(dsm: &'d Dsm<C, U>, value: T) -> DsmResult<Self> {
        let p = dsm
            .alloc(core::mem::size_of::<T>(), core::mem::align_of::<T>())?
            .cast::<T>();
        // SAFETY: a fresh heap object of at least `size_of::<T>()` bytes,
        // aligned for `T`, that nobody else knows about yet; DSM faults are
        // resolved by the DSM.
        unsafe { p.write(value) };
        Ok(DsmBox {
            // SAFETY: heap addresses are never null.
            ptr: unsafe { NonNull::new_unchecked(p) },
            dsm,
            _own: PhantomData,
        })
    }

    /// The value's DSM address (valid in every process while the box
    /// lives).
    pub fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Gives up the box without freeing the object; returns its address.
    /// Turn it back into a box with [`DsmBox::from_raw`] (in this or another
    /// process) to free it, or free it with [`Dsm::free`].
    pub fn into_raw(self) -> *mut T {
        let p = self.ptr.as_ptr();
        core::mem::forget(self);
        p
    }

    /// Takes ownership of the heap object at `ptr`.
    ///
    /// # Safety
    /// `ptr` must come from [`DsmBox::into_raw`] (in any process) for the
    /// same `T`, and no other box may own it: exactly one `from_raw` per
    /// `into_raw`. While the box lives nobody else may access the value.
    /// The value written by the previous owner is visible only if this
    /// process synchronised with it (acquired its release) since.
    pub unsafe fn from_raw(dsm: &'d Dsm<C, U>, ptr: *mut T) -> Self {
        DsmBox {
            // SAFETY: the caller passes a heap address, never null.
            ptr: unsafe { NonNull::new_unchecked(ptr) },
            dsm,
            _own: PhantomData,
        }
    }

    /// Drops the value and frees the object, reporting errors.
    pub fn free(self) -> DsmResult<()> {
        let dsm = self.dsm;
        let p = self.into_raw();
        // SAFETY: the box owned the live value; it is never used again.
        unsafe { core::ptr::drop_in_place(p) };
        dsm.free(p.cast())
    }

    /// Moves the value out and frees the object.
    pub fn into_inner(self) -> DsmResult<T> {
        let dsm = self.dsm;
        let p = self.into_raw();
        // SAFETY: the box owned the live value; it is moved out once.
        let v = unsafe { p.read() };
        dsm.free(p.cast())?;
        Ok(v)
    }
}

impl<T: 'static, C: Communicator + 'static, U: UltItf> Deref for DsmBox<'_, T, C, U> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the box owns a live, aligned, initialised `T` in the DSM
        // heap that nobody else accesses while the box lives (`new` /
        // `from_raw`); faults on it are resolved by the DSM.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: 'static, C: Communicator + 'static, U: UltItf> DerefMut for DsmBox<'_, T, C, U> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique in
        // this process.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T: 'static, C: Communicator + 'static, U: UltItf> Drop for DsmBox<'_, T, C, U> {
    fn drop(&mut self) {
        // SAFETY: the box owns the live value (see `deref`); it is never
        // used again.
        unsafe { core::ptr::drop_in_place(self.ptr.as_ptr()) };
        match self.dsm.free(self.ptr.as_ptr().cast()) {
            Err(e @ DsmError::InvalidArgument(_)) if !std::thread::panicking() => {
                panic!("dropping a DsmBox: {e}")
            }
            _ => {}
        }
    }
}

impl<T: core::fmt::Debug + 'static, C: Communicator + 'static, U: UltItf> core::fmt::Debug
    for DsmBox<'_, T, C, U>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("DsmBox").field(&**self).finish()
    }
}
