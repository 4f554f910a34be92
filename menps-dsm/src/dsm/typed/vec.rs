//! [`DsmVec`], an array every process creates together, with checked
//! access for SPMD code: each process writes its own stripe
//! ([`StripeMut`]), everybody reads everything after a barrier
//! ([`Stripe`]).

use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::ops::{Bound, Deref, DerefMut, Range, RangeBounds};
use core::ptr::NonNull;

use ct_worker::{OsThreads, UltItf};

use crate::com::Communicator;
use crate::dsm::Dsm;
use crate::dsm::error::{DsmError, DsmResult};

use super::borrows;

/// An array of `len` values of `T` in the DSM heap, created by every
/// process together: the same object, at the same address, everywhere.
///
/// Each process holds its own handle, made by
/// [`new_collective`](DsmVec::new_collective).
///
/// # SPMD access without `unsafe`
///
/// ```
/// # // SAFETY: the first statement of a single-threaded program; a hung job
/// # // is killed after 120 s (this is a test).
/// # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
/// # use menps_dsm::dsm::{Dsm, DsmVec, DsmResult};
/// # fn f(dsm: &Dsm<menps_dsm::com::AnyCom<ct_worker::OsThreads>>) -> DsmResult<()> {
/// let v: DsmVec<'_, u64, _, _> = DsmVec::new_collective(dsm, 1_000_000)?;
/// {
///     // This process's part (block partition by rank).
///     let mut mine = v.my_part_mut()?;
///     let start = mine.start();
///     for (k, x) in mine.iter_mut().enumerate() {
///         *x = (start + k) as u64 * 2;
///     }
/// } // the stripe ends here: the view below would be refused while it lives
/// dsm.barrier()?; // everybody's writes become visible to everybody
/// let all = v.view()?;
/// assert!(all.iter().enumerate().all(|(i, &x)| x == i as u64 * 2));
/// # Ok(())
/// # }
/// # let com: menps_dsm::com::AnyCom<ct_worker::OsThreads> =
/// #     menps_dsm::launch::init_or_relaunch(2).unwrap();
/// # let dsm = Dsm::new(com).unwrap();
/// # f(&dsm).unwrap();
/// # dsm.finalize().unwrap();
/// ```
///
/// - [`stripe_mut`](DsmVec::stripe_mut) lends the elements of a range
///   mutably ([`StripeMut`], which dereferences to `&mut [T]`);
///   [`part_mut`](DsmVec::part_mut) and [`my_part_mut`](DsmVec::my_part_mut)
///   do so for one part of a block partition (this process's, for
///   `my_part_mut`).
/// - [`stripe`](DsmVec::stripe) lends a range for reading ([`Stripe`],
///   `&[T]`), [`view`](DsmVec::view) the whole vector.
/// - A stripe is split among the threads of the process — OS or user-level
///   — with [`StripeMut::parts_mut`], [`StripeMut::indexed_chunks_mut`], or
///   the slice methods (`chunks_mut`, `split_at_mut`): disjoint `&mut [T]`
///   that are `Send` when `T` is. Threads may also take stripes of their
///   own, disjoint ones.
/// - Requests outside `0..len` are errors
///   ([`DsmError::InvalidArgument`], naming the range and the length).
///
/// **Within a process** the handle keeps a table (in process-private
/// memory, shared by all threads of the process, keyed by the vector's
/// address) of the elements it has lent out, and refuses, with
/// [`DsmError::InvalidArgument`], a mutable stripe that overlaps any other
/// stripe or view of this process, and a stripe or view that overlaps a
/// mutable stripe. So a `&mut T` this API hands out is never aliased in its
/// process, whichever threads hold the guards; shared stripes and views
/// coexist.
///
/// **Across processes** the rule is the DSM's (release consistency): in a
/// phase between two synchronisations (barriers, a DSM mutex, acquire and
/// release atomics), each element is written by at most one process, and an
/// element another process wrote is read after synchronising with it.
/// Every process writing its own part ([`my_part_mut`](DsmVec::my_part_mut))
/// and reading the whole vector after a barrier ([`view`](DsmVec::view))
/// follows it by construction; stripes of different processes may share a
/// DSM block (the DSM merges them), though parts that start on block
/// boundaries move less data. The tables of different processes are
/// independent, so a program that gives two processes overlapping stripes
/// is not stopped there: two processes that write the same element in one
/// phase is a write-write race, which the DSM detects when it merges the
/// two versions — the barrier (or release) that publishes the second write
/// fails with [`DsmError::DataRace`], whose [`RaceReport`](crate::dsm::RaceReport)
/// names the address, both processes and both values, and so does every
/// later DSM operation (the DSM is fail-stop). A process reading an element
/// that another process writes in the same phase is not detected: it reads
/// its own copy, which may be old, new or partly updated — a data race, as
/// in any shared-memory program.
///
/// # Freeing
///
/// Dropping the handles frees the vector: every handle counts (a DSM word
/// next to the elements holds how many processes still have theirs), and
/// the process that drops the last one drops the elements and frees the
/// memory — in any order, at any time, without a collective call. A drop
/// publishes this process's writes first (a release) and costs one DSM
/// atomic operation. [`free`](DsmVec::free) does the same and reports
/// errors (a drop ignores them: the DSM is fail-stop and reports a failure
/// at every later operation); [`free_collective`](DsmVec::free_collective)
/// frees with a barrier instead. A handle dropped while its thread
/// panics, or leaked with [`core::mem::forget`], is not counted: the vector
/// then stays allocated (which is safe).
///
/// # Raw access
///
/// The `unsafe` accessors ([`as_slice`](DsmVec::as_slice),
/// [`as_mut_slice`](DsmVec::as_mut_slice), [`read`](DsmVec::read),
/// [`write`](DsmVec::write)) bypass the table; their callers keep the rules
/// themselves.
pub struct DsmVec<'d, T: 'static, C: Communicator + 'static, U: UltItf = OsThreads> {
    /// First element (and start of the heap object).
    ptr: NonNull<T>,
    len: usize,
    /// The handle count, a DSM word after the elements: how many processes
    /// still hold their handle.
    count: NonNull<u64>,
    /// This handle, in the borrow table.
    id: u64,
    dsm: &'d Dsm<C, U>,
    _own: PhantomData<T>,
}

// SAFETY: a handle owns (a share of) its elements like a `Vec<T>` (dropping
// it may drop them in this thread: `T: Send`), and `&Dsm` may be sent
// between threads when `Dsm` is `Sync`.
unsafe impl<T: Send + 'static, C: Communicator + 'static, U: UltItf> Send for DsmVec<'_, T, C, U> where
    Dsm<C, U>: Sync
{
}

// SAFETY: `&DsmVec` lends `&mut T` to the thread that asks (`T: Send`) and
// `&T` to several threads at once (`T: Sync`), never both for one element
// (the borrow table); `&Dsm` is shared when `Dsm` is `Sync`.
unsafe impl<T: Send + Sync + 'static, C: Communicator + 'static, U: UltItf> Sync
    for DsmVec<'_, T, C, U>
where
    Dsm<C, U>: Sync,
{
}

/// (bytes, alignment, offset of the handle count) of the heap object of a
/// vector of `len` values of `T`.
fn object_layout<T>(len: usize) -> Option<(usize, usize, usize)> {
    let elems = core::mem::size_of::<T>().checked_mul(len)?;
    let count_at = elems.checked_next_multiple_of(8)?;
    Some((
        count_at.checked_add(8)?,
        core::mem::align_of::<T>().max(8),
        count_at,
    ))
}

/// Part `part` of `0..len` cut into `nparts` contiguous parts whose lengths
/// differ by at most one (the longer ones first).
fn block_part(len: usize, part: usize, nparts: usize) -> Range<usize> {
    let (base, extra) = (len / nparts, len % nparts);
    let start = part * base + part.min(extra);
    start..start + base + usize::from(part < extra)
}

/// `range` as written (`3..7`, `..=9`, `..`), for messages.
fn show(range: &impl RangeBounds<usize>) -> String {
    let lo = match range.start_bound() {
        Bound::Included(s) => s.to_string(),
        Bound::Excluded(s) => format!("{s}<"),
        Bound::Unbounded => String::new(),
    };
    match range.end_bound() {
        Bound::Included(e) => format!("{lo}..={e}"),
        Bound::Excluded(e) => format!("{lo}..{e}"),
        Bound::Unbounded => format!("{lo}.."),
    }
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
        let (bytes, align, count_at) = object_layout::<T>(len).ok_or_else(|| {
            DsmError::InvalidArgument(format!("a DsmVec of {len} elements is too large"))
        })?;
        let mut addr = [0u8; 8];
        let mut mine = None;
        if dsm.rank() == 0 {
            match dsm.alloc(bytes, align) {
                Ok(base) => {
                    let p = base.cast::<T>();
                    for i in 0..len {
                        // SAFETY: `i < len` elements fit in the fresh object
                        // (aligned for `T`), which no other process knows
                        // about before the broadcast.
                        unsafe { p.add(i).write(value.clone()) };
                    }
                    // SAFETY: the count word is inside the fresh object, 8-byte
                    // aligned (`count_at` is a multiple of 8, the object
                    // at least 8-aligned); every process holds a handle.
                    unsafe { base.add(count_at).cast::<u64>().write(dsm.nprocs() as u64) };
                    addr = (base as u64).to_le_bytes();
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
            // SAFETY: `a + count_at` is inside the object, so not null.
            count: unsafe { NonNull::new_unchecked((a + count_at) as *mut u64) },
            id: borrows::unique_id(dsm.rank()),
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

    // -----------------------------------------------------------------
    // Checked access.

    /// `range` checked against `0..len`.
    fn resolve(&self, what: &str, range: impl RangeBounds<usize>) -> DsmResult<Range<usize>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => Some(self.len),
        };
        match (start, end) {
            (Some(s), Some(e)) if s <= e && e <= self.len => Ok(s..e),
            (Some(s), Some(e)) if s > e && s <= self.len => Err(DsmError::InvalidArgument(
                format!("{what}({}): the range starts after it ends", show(&range)),
            )),
            _ => Err(DsmError::InvalidArgument(format!(
                "{what}({}): out of range for a DsmVec of {} elements (0..{})",
                show(&range),
                self.len,
                self.len
            ))),
        }
    }

    /// Registers a borrow of `r` in this process's table.
    fn lend(&self, what: &str, r: &Range<usize>, write: bool) -> DsmResult<u64> {
        let addr = self.ptr.as_ptr() as usize;
        borrows::borrow(self.dsm.rank(), addr, self.id, r.clone(), write).map_err(|c| {
            let held = if c.write {
                "mutably, by a StripeMut"
            } else {
                "for reading, by a Stripe or a view"
            };
            DsmError::InvalidArgument(format!(
                "{what}({}..{}): elements {}..{} of this DsmVec are borrowed {held} that is \
                 still alive in this process; drop it first",
                r.start, r.end, c.range.start, c.range.end
            ))
        })
    }

    /// The elements `range` for writing, by this process (its threads, or
    /// the thread that holds the guard): a guard that dereferences to
    /// `&mut [T]` and gives the range back when dropped.
    ///
    /// Other processes see what is written after synchronising with this
    /// one (a barrier); see the [type's rules](DsmVec#spmd-access-without-unsafe).
    ///
    /// # Errors
    ///
    /// [`DsmError::InvalidArgument`] if `range` is not within `0..len`, or
    /// if a stripe or view of this process that is still alive overlaps it.
    pub fn stripe_mut(&self, range: impl RangeBounds<usize>) -> DsmResult<StripeMut<'_, T>> {
        let r = self.resolve("DsmVec::stripe_mut", range)?;
        let token = self.lend("DsmVec::stripe_mut", &r, true)?;
        Ok(StripeMut {
            // SAFETY: `r.start <= len`: inside the object or one past its
            // elements, so not null.
            ptr: unsafe { self.ptr.add(r.start) },
            start: r.start,
            len: r.len(),
            token,
            _borrow: PhantomData,
        })
    }

    /// The elements `range` for reading: a guard that dereferences to
    /// `&[T]`. Stripes for reading coexist; a mutable one cannot overlap
    /// them in this process.
    ///
    /// It shows what other processes wrote before their last
    /// synchronisation with this one (take it after the barrier that ends
    /// their writing phase).
    ///
    /// # Errors
    ///
    /// [`DsmError::InvalidArgument`] if `range` is not within `0..len`, or
    /// if a mutable stripe of this process that is still alive overlaps it.
    pub fn stripe(&self, range: impl RangeBounds<usize>) -> DsmResult<Stripe<'_, T>> {
        let r = self.resolve("DsmVec::stripe", range)?;
        self.stripe_checked("DsmVec::stripe", r)
    }

    fn stripe_checked(&self, what: &str, r: Range<usize>) -> DsmResult<Stripe<'_, T>> {
        let token = self.lend(what, &r, false)?;
        Ok(Stripe {
            // SAFETY: as in `stripe_mut`.
            ptr: unsafe { self.ptr.add(r.start) },
            start: r.start,
            len: r.len(),
            token,
            _borrow: PhantomData,
        })
    }

    /// Every element, for reading: [`DsmVec::stripe`] of `0..len`. Take it
    /// after the barrier that ends a writing phase.
    ///
    /// # Errors
    ///
    /// [`DsmError::InvalidArgument`] if a mutable stripe of this process is
    /// still alive.
    pub fn view(&self) -> DsmResult<Stripe<'_, T>> {
        self.stripe_checked("DsmVec::view", 0..self.len)
    }

    /// The indices of part `part` when `0..len` is cut into `nparts`
    /// contiguous parts whose lengths differ by at most one (the first
    /// `len % nparts` parts are one longer).
    ///
    /// # Errors
    ///
    /// [`DsmError::InvalidArgument`] if `part >= nparts`.
    pub fn part_range(&self, part: usize, nparts: usize) -> DsmResult<Range<usize>> {
        if part >= nparts {
            return Err(DsmError::InvalidArgument(format!(
                "DsmVec part {part} of {nparts}: there are parts 0..{nparts} only"
            )));
        }
        Ok(block_part(self.len, part, nparts))
    }

    /// [`DsmVec::stripe_mut`] of part `part` of `nparts`
    /// ([`DsmVec::part_range`]): for SPMD code that partitions the vector
    /// among the team threads of all processes, say.
    ///
    /// # Errors
    ///
    /// As [`DsmVec::part_range`] and [`DsmVec::stripe_mut`].
    pub fn part_mut(&self, part: usize, nparts: usize) -> DsmResult<StripeMut<'_, T>> {
        self.stripe_mut(self.part_range(part, nparts)?)
    }

    /// This process's part: part `rank` of `nprocs` ([`DsmVec::part_range`]).
    pub fn my_range(&self) -> Range<usize> {
        block_part(self.len, self.dsm.rank(), self.dsm.nprocs())
    }

    /// [`DsmVec::stripe_mut`] of this process's part ([`DsmVec::my_range`]):
    /// the stripe that no other process writes when every process writes
    /// its own part.
    ///
    /// # Errors
    ///
    /// As [`DsmVec::stripe_mut`] (a stripe or view of this process that
    /// overlaps the part is still alive).
    pub fn my_part_mut(&self) -> DsmResult<StripeMut<'_, T>> {
        self.stripe_mut(self.my_range())
    }

    // -----------------------------------------------------------------
    // Raw access.

    /// The elements as a slice.
    ///
    /// # Safety
    /// While the slice is in use, no thread of any process may write the
    /// elements (no [`StripeMut`] of this process may be alive), and writes
    /// made before by other processes must be ordered before this call by
    /// synchronisation (their release, our acquire).
    pub unsafe fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised elements at an aligned DSM address that
        // lives while `self` does; the caller excludes concurrent writers.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements as a mutable slice.
    ///
    /// # Safety
    /// While the slice is in use, no other thread of any process may access
    /// the elements (no [`Stripe`] or [`StripeMut`] of this process may be
    /// alive), and accesses made before by other processes must be ordered
    /// before this call by synchronisation.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [T] {
        // SAFETY: as in `as_slice`; the caller guarantees exclusivity.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Reads element `i`.
    ///
    /// # Safety
    /// No thread of any process may write element `i` concurrently (no
    /// [`StripeMut`] of this process may hold it), and writes made before by
    /// other processes must be ordered before this read by synchronisation.
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
    /// No other thread of any process may access element `i` concurrently
    /// (no [`Stripe`] or [`StripeMut`] of this process may hold it); other
    /// processes see the write after synchronising with this one.
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

    // -----------------------------------------------------------------
    // Freeing.

    /// Drops the elements and frees the object, once nobody uses them.
    ///
    /// # Safety
    /// No process holds a handle any more, or every process has passed a
    /// barrier after its last use and holds no handle that it will use or
    /// drop (`free_collective`).
    unsafe fn destroy(&self) -> DsmResult<()> {
        // SAFETY: `len` initialised elements that nobody uses any more (the
        // caller's contract); they are dropped once, here.
        unsafe {
            core::ptr::drop_in_place(core::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        };
        self.dsm.free(self.ptr.as_ptr().cast())
    }

    /// Gives this process's handle up: one DSM atomic decrement of the
    /// handle count (releasing this process's writes first); the process
    /// that takes the count to zero frees the vector. `true` if that was
    /// this one.
    fn release_handle(&self) -> DsmResult<bool> {
        match self.dsm.fetch_add(self.count.as_ptr(), u64::MAX)? {
            1 => {
                // SAFETY: every process has given its handle up (the count
                // is zero), after releasing its writes; the atomic's acquire
                // ordered them before this.
                unsafe { self.destroy() }?;
                Ok(true)
            }
            0 => Err(DsmError::Misuse(format!(
                "the DsmVec at {:p} was given up by more handles than processes created it",
                self.ptr
            ))),
            _ => Ok(false),
        }
    }

    /// Gives this process's handle up, as a drop does, but reports errors:
    /// when it is the last handle of the job, this process drops the
    /// elements and frees the vector (returns `true`). Not collective: each
    /// process calls it (or drops its handle) when it is done, in any
    /// order.
    pub fn free(self) -> DsmResult<bool> {
        let this = ManuallyDrop::new(self);
        borrows::purge(this.ptr.as_ptr() as usize, this.id);
        this.release_handle()
    }

    /// Collectively frees the array: a DSM barrier (everybody is done with
    /// it), then process 0 drops the elements and frees it. Every process
    /// calls it (none drops its handle instead).
    pub fn free_collective(self) -> DsmResult<()> {
        let this = ManuallyDrop::new(self);
        borrows::purge(this.ptr.as_ptr() as usize, this.id);
        this.dsm.barrier()?;
        if this.dsm.rank() == 0 {
            // SAFETY: every process called `free_collective` (consuming its
            // handle, which is not counted down) and passed the barrier
            // after its last use.
            unsafe { this.destroy() }?;
        }
        Ok(())
    }
}

impl<T: 'static, C: Communicator + 'static, U: UltItf> Drop for DsmVec<'_, T, C, U> {
    /// Gives this process's handle up (see [`DsmVec#freeing`]); errors are
    /// ignored. Nothing happens while the thread panics (the vector stays
    /// allocated).
    fn drop(&mut self) {
        borrows::purge(self.ptr.as_ptr() as usize, self.id);
        if std::thread::panicking() {
            return;
        }
        let _ = self.release_handle();
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

/// Elements `range()` of a [`DsmVec`], lent for writing to the holder
/// ([`DsmVec::stripe_mut`], [`DsmVec::my_part_mut`]): dereferences to
/// `&mut [T]` (index 0 is element `start()` of the vector). No other stripe
/// or view of this process overlaps it while it lives; dropping it gives
/// the elements back.
#[must_use = "the elements are lent until the stripe is dropped"]
pub struct StripeMut<'v, T> {
    /// Element `start`.
    ptr: NonNull<T>,
    start: usize,
    len: usize,
    /// The borrow in this process's table (0: empty, not registered).
    token: u64,
    _borrow: PhantomData<&'v mut [T]>,
}

// SAFETY: the stripe is a `&mut [T]` whose exclusivity the borrow table
// keeps; moving it to another thread of the process moves that access
// (`T: Send`), and the table is process-wide.
unsafe impl<T: Send> Send for StripeMut<'_, T> {}
// SAFETY: `&StripeMut` gives `&[T]` only.
unsafe impl<T: Sync> Sync for StripeMut<'_, T> {}

impl<T> StripeMut<'_, T> {
    /// Index in the vector of the stripe's first element.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The stripe's indices in the vector.
    pub fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }

    /// The stripe in pieces of `chunk_len` elements (the last may be
    /// shorter), each with the vector index of its first element: for the
    /// threads of the process (each piece is a `&mut [T]`, `Send` when `T`
    /// is).
    ///
    /// # Panics
    /// If `chunk_len` is 0.
    pub fn indexed_chunks_mut(
        &mut self,
        chunk_len: usize,
    ) -> impl Iterator<Item = (usize, &mut [T])> + '_ {
        assert!(
            chunk_len > 0,
            "StripeMut::indexed_chunks_mut: the chunk length must not be 0"
        );
        let start = self.start;
        self.chunks_mut(chunk_len)
            .enumerate()
            .map(move |(k, c)| (start + k * chunk_len, c))
    }

    /// The stripe in `nparts` contiguous pieces whose lengths differ by at
    /// most one (some are empty if the stripe is shorter than `nparts`),
    /// each with the vector index of its first element: one per thread.
    ///
    /// # Panics
    /// If `nparts` is 0.
    pub fn parts_mut(&mut self, nparts: usize) -> impl Iterator<Item = (usize, &mut [T])> + '_ {
        assert!(
            nparts > 0,
            "StripeMut::parts_mut: the number of parts must not be 0"
        );
        let (start, len) = (self.start, self.len);
        let mut rest: &mut [T] = self;
        (0..nparts).map(move |p| {
            let r = block_part(len, p, nparts);
            let (piece, tail) = core::mem::take(&mut rest).split_at_mut(r.len());
            rest = tail;
            (start + r.start, piece)
        })
    }
}

impl<T> Deref for StripeMut<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised, aligned elements of a live vector (the
        // guard borrows this process's handle, which holds the vector's
        // handle count above zero); this process's borrow table keeps every
        // other reference of the process off them while the guard lives
        // (`token`); other processes work on their own copies, merged at
        // synchronisation (the DSM's rule, see `DsmVec`). Faults are
        // resolved by the DSM.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for StripeMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the access unique.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for StripeMut<'_, T> {
    fn drop(&mut self) {
        borrows::unborrow(self.token);
    }
}

impl<T> core::fmt::Debug for StripeMut<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StripeMut")
            .field("range", &self.range())
            .finish()
    }
}

/// Elements `range()` of a [`DsmVec`], lent for reading
/// ([`DsmVec::stripe`], [`DsmVec::view`]): dereferences to `&[T]` (index 0
/// is element `start()` of the vector). No mutable stripe of this process
/// overlaps it while it lives.
#[must_use = "the elements are lent until the stripe is dropped"]
pub struct Stripe<'v, T> {
    /// Element `start`.
    ptr: NonNull<T>,
    start: usize,
    len: usize,
    /// The borrow in this process's table (0: empty, not registered).
    token: u64,
    _borrow: PhantomData<&'v [T]>,
}

// SAFETY: the stripe is a `&[T]` (shared access from any thread: `T: Sync`)
// whose validity the process-wide borrow table keeps.
unsafe impl<T: Sync> Send for Stripe<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Stripe<'_, T> {}

impl<T> Stripe<'_, T> {
    /// Index in the vector of the stripe's first element.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The stripe's indices in the vector.
    pub fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }
}

impl<T> Deref for Stripe<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised, aligned elements of a live vector (as
        // in `StripeMut::deref`); this process's borrow table keeps
        // mutable references of the process off them while the guard lives;
        // other processes write their own copies, which reach ours only at
        // this process's synchronisation (the DSM's rule, see `DsmVec`).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Stripe<'_, T> {
    fn drop(&mut self) {
        borrows::unborrow(self.token);
    }
}

impl<T> core::fmt::Debug for Stripe<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Stripe")
            .field("range", &self.range())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_parts_cover_the_range_in_order() {
        for len in [0, 1, 5, 7, 100, 101] {
            for nparts in 1..10 {
                let parts: Vec<_> = (0..nparts).map(|p| block_part(len, p, nparts)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[nparts - 1].end, len);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() == w[1].len() || w[0].len() == w[1].len() + 1);
                }
            }
        }
        assert_eq!(block_part(10, 0, 3), 0..4);
        assert_eq!(block_part(10, 1, 3), 4..7);
        assert_eq!(block_part(10, 2, 3), 7..10);
    }

    #[test]
    fn object_layout_puts_the_count_after_the_elements() {
        assert_eq!(object_layout::<u8>(3), Some((16, 8, 8)));
        assert_eq!(object_layout::<u64>(2), Some((24, 8, 16)));
        assert_eq!(object_layout::<()>(1000), Some((8, 8, 0)));
        #[repr(align(64))]
        struct Big {
            _bytes: [u8; 64],
        }
        assert_eq!(object_layout::<Big>(2), Some((136, 64, 128)));
        assert_eq!(object_layout::<u64>(usize::MAX / 4), None);
    }

    #[test]
    fn ranges_are_shown_as_written() {
        assert_eq!(show(&(3..7)), "3..7");
        assert_eq!(show(&(..=9)), "..=9");
        assert_eq!(show(&(2..)), "2..");
        assert_eq!(show(&(..)), "..");
    }
}
