//! Typed helpers over the DSM heap: [`DsmBox<T>`], one value in the heap,
//! and [`DsmVec<T>`], an array that every process creates together.
//!
//! A value must make sense in every process that reads it: plain data, DSM
//! addresses and addresses of statics are the same everywhere (one binary,
//! no address randomisation), pointers to a process's own heap or stack are
//! not. Values that own memory (`String`, `Vec`, `Box` …) are fine when that
//! memory is DSM memory too: with [`DsmAllocator`](super::DsmAllocator) as
//! the global allocator, values built in DSM context own DSM heap memory.
//! Dropping a box or a vector drops its values (their destructors run in
//! the process that drops them).
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

/// An array of `len` values of `T` in the DSM heap, created by every
/// process together: the same object, at the same address, everywhere.
///
/// Each process holds its own `DsmVec` handle. Elements are accessed
/// through `unsafe` accessors whose rule is the DSM's: between a write by
/// one process (or thread) and an access to the same element by another,
/// there must be synchronisation (a barrier, a DSM mutex, acquire/release
/// atomics). Disjoint elements may be written concurrently (false sharing
/// within a block is merged by the DSM).
///
/// Free it with [`DsmVec::free_collective`]; a `DsmVec` that is just
/// dropped leaks its memory (which is safe: other processes may still use
/// it).
pub struct DsmVec<'d, T: 'static, C: Communicator + 'static, U: UltItf = OsThreads> {
    ptr: NonNull<T>,
    len: usize,
    dsm: &'d Dsm<C, U>,
    _own: PhantomData<T>,
}

// SAFETY: the handle is an address and a length; element accesses are
// `unsafe` with the DSM's synchronisation rule, and `&Dsm` may be shared
// between threads when `Dsm` is `Sync`.
unsafe impl<T: Send + 'static, C: Communicator + 'static, U: UltItf> Send for DsmVec<'_, T, C, U> where
    Dsm<C, U>: Sync
{
}

// SAFETY: as for `Send`; `&DsmVec` shares elements only through the unsafe
// accessors.
unsafe impl<T: Sync + 'static, C: Communicator + 'static, U: UltItf> Sync for DsmVec<'_, T, C, U> where
    Dsm<C, U>: Sync
{
}

impl<'d, T: 'static, C: Communicator + 'static, U: UltItf> DsmVec<'d, T, C, U> {
    /// Collectively creates an array of `len` default values (every process
    /// calls it with the same `len`).
    pub fn new_collective(dsm: &'d Dsm<C, U>, len: usize) -> DsmResult<Self>
    where
        T: Default + Clone,
    {
        Self::new_collective_with(dsm, len, T::default())
    }

    /// Collectively creates an array of `len` clones of `value`: process 0
    /// allocates and fills it and broadcasts its address; a DSM barrier
    /// makes the contents visible. Every process passes the same `len` (a
    /// mismatch is an error everywhere); `value` is process 0's.
    pub fn new_collective_with(dsm: &'d Dsm<C, U>, len: usize, value: T) -> DsmResult<Self>
    where
        T: Clone,
    {
        let lens = dsm.com().allgather(&(len as u64).to_le_bytes())?;
        if lens
            .chunks_exact(8)
            .any(|c| c != (len as u64).to_le_bytes())
        {
            return Err(DsmError::InvalidArgument(format!(
                "DsmVec::new_collective: the processes asked for different lengths ({len} here)"
            )));
        }
        let bytes = core::mem::size_of::<T>().checked_mul(len).ok_or_else(|| {
            DsmError::InvalidArgument(format!("a DsmVec of {len} elements is too large"))
        })?;
        let mut addr = [0u8; 8];
        let mut mine = None;
        if dsm.rank() == 0 {
            match dsm.alloc(bytes, core::mem::align_of::<T>()) {
                Ok(p) => {
                    let p = p.cast::<T>();
                    for i in 0..len {
                        // SAFETY: `i < len` elements fit in the fresh object
                        // (aligned for `T`), which no other process knows
                        // about before the broadcast.
                        unsafe { p.add(i).write(value.clone()) };
                    }
                    addr = (p as u64).to_le_bytes();
                }
                Err(e) => mine = Some(e),
            }
        }
        dsm.com().broadcast(0, &mut addr)?;
        let a = u64::from_le_bytes(addr) as usize;
        if a == 0 {
            return Err(mine.unwrap_or_else(|| {
                DsmError::OutOfMemory(format!(
                    "process 0 could not allocate a DsmVec of {bytes} bytes"
                ))
            }));
        }
        dsm.barrier()?;
        Ok(DsmVec {
            // SAFETY: `a != 0`.
            ptr: unsafe { NonNull::new_unchecked(a as *mut T) },
            len,
            dsm,
            _own: PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first element (the same in every process).
    pub fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// The elements as a slice.
    ///
    /// # Safety
    /// While the slice is in use, no thread of any process may write the
    /// elements, and writes made before by other processes must be ordered
    /// before this call by synchronisation (their release, our acquire).
    pub unsafe fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised elements at an aligned DSM address that
        // lives while `self` does; the caller excludes concurrent writers.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements as a mutable slice.
    ///
    /// # Safety
    /// While the slice is in use, no other thread of any process may access
    /// the elements, and accesses made before by other processes must be
    /// ordered before this call by synchronisation.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [T] {
        // SAFETY: as in `as_slice`; the caller guarantees exclusivity.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Reads element `i`.
    ///
    /// # Safety
    /// No thread of any process may write element `i` concurrently, and
    /// writes made before by other processes must be ordered before this
    /// read by synchronisation.
    ///
    /// # Panics
    /// If `i >= len`.
    pub unsafe fn read(&self, i: usize) -> T
    where
        T: Copy,
    {
        assert!(
            i < self.len,
            "DsmVec index {i} out of range 0..{}",
            self.len
        );
        // SAFETY: in bounds; the caller excludes conflicting writes.
        unsafe { self.ptr.as_ptr().add(i).read() }
    }

    /// Writes element `i` (the old value is dropped).
    ///
    /// # Safety
    /// No other thread of any process may access element `i` concurrently;
    /// other processes see the write after synchronising with this one.
    ///
    /// # Panics
    /// If `i >= len`.
    pub unsafe fn write(&self, i: usize, value: T) {
        assert!(
            i < self.len,
            "DsmVec index {i} out of range 0..{}",
            self.len
        );
        // SAFETY: in bounds, initialised; the caller excludes conflicting
        // accesses.
        unsafe { *self.ptr.as_ptr().add(i) = value }
    }

    /// Collectively frees the array: a DSM barrier (everybody is done with
    /// it), then process 0 drops the elements and frees it.
    pub fn free_collective(self) -> DsmResult<()> {
        self.dsm.barrier()?;
        if self.dsm.rank() == 0 {
            // SAFETY: `len` initialised elements nobody uses any more (the
            // barrier above); they are dropped once, here.
            unsafe {
                core::ptr::drop_in_place(core::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.len,
                ))
            };
            self.dsm.free(self.ptr.as_ptr().cast())?;
        }
        Ok(())
    }
}

impl<T: 'static, C: Communicator + 'static, U: UltItf> core::fmt::Debug for DsmVec<'_, T, C, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DsmVec")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}
