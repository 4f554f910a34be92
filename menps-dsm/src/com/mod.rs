//! The communication layer: what the DSM needs from the network, as traits,
//! so that the DSM is generic over the backend.
//!
//! | trait | role | MPI-3 counterpart (the `mpi` backend) |
//! |---|---|---|
//! | [`Comm`] | who am I, how many | `MPI_Comm_rank` / `_size` |
//! | [`Windows`] | collective registration of page-aligned shared memory | `MPI_Win_allocate_shared` or `MPI_Win_create` / `MPI_Win_free` |
//! | [`Rma`] | one-sided read, write, CAS, fetch-add, flush | `MPI_Rget`/`Rput`/`Compare_and_swap`/`Fetch_and_op` + `MPI_Win_flush` |
//! | [`P2p`] | small tagged messages (lock hand-off) | `MPI_Isend`/`Irecv` |
//! | [`Coll`] | barrier, broadcast, allgather | `MPI_Barrier`/`Bcast`/`Allgather` |
//!
//! Remote memory is addressed by a fat pointer, [`RemotePtr`] = (rank,
//! [`WindowId`], byte offset), checked at every use: out-of-bounds offsets,
//! unaligned atomics and unknown windows are [`Error`]s, never stray
//! accesses.
//!
//! Asynchronous RMA returns a [`Rma::Request`]; waiting on it parks the
//! calling user-level thread (backends are generic over
//! [`ct_worker::UltItf`]) or a callback runs on completion. The embedded
//! [`shm`] backend completes every operation before returning; the traits do
//! not rely on that.
//!
//! [`netmodel`] decorates any of them with a modelled network's latency and
//! link rate, and counts their operations ([`Comm::traffic`]).
//!
//! Failures are fail-stop: once a process of the job dies, every blocking
//! call everywhere returns [`Error::PeerDied`] naming it.

pub mod any;
pub mod batch;
pub(crate) mod check;
pub mod error;
pub(crate) mod inbox;
pub(crate) mod mailbox;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod netmodel;
#[cfg(any(feature = "mpi", feature = "verbs"))]
pub(crate) mod offload;
#[cfg(any(feature = "mpi", feature = "verbs"))]
pub(crate) mod outcome;
pub mod ptr;
pub mod request;
pub mod shm;
pub(crate) mod slots;
#[cfg(feature = "verbs")]
pub mod verbs;
pub(crate) mod wait;

use std::sync::atomic::AtomicU64;

pub use any::AnyCom;
pub use batch::CasOp;
pub use error::{Error, Result};
#[cfg(feature = "mpi")]
pub use mpi::MpiCom;
pub use netmodel::{NetCom, NetModel, Traffic};
pub use ptr::{RemotePtr, WindowId};
pub use request::{Completer, Request};
pub use shm::ShmCom;
#[cfg(feature = "verbs")]
pub use verbs::VerbsCom;

/// Largest point-to-point message, in bytes (64 KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Identity within the job.
pub trait Comm: Send + Sync {
    /// This process's rank, in `0..size()`.
    fn rank(&self) -> usize;
    /// Number of processes in the job.
    fn size(&self) -> usize;
    /// This process's communication counters, if they are kept (by a
    /// [`NetCom`]; backends keep none).
    fn traffic(&self) -> Option<Traffic> {
        None
    }
}

/// Registration of memory that every process can access one-sidedly.
///
/// # The local part
///
/// Every backend guarantees, for every window of at least one byte, that
/// this process's part ([`Windows::local_window`]):
///
/// 1. starts at a page boundary and is mapped read-write for the page-rounded
///    length (accesses past `bytes` up to the page end are harmless but not
///    seen by RMA);
/// 2. is a `MAP_SHARED` mapping, so that the same pages can be mapped a
///    second time (`mremap` with an old size of 0) — the DSM's application
///    view of a segment is such an alias of the segment's `data` window;
/// 3. is what [`RemotePtr`] offsets address: offset `o` of rank `r` is byte
///    `o` of `r`'s local part (a backend whose native memory starts
///    elsewhere translates offsets itself);
/// 4. stays where it is until the window is destroyed.
///
/// Plain loads and stores to the local part and RMA from other processes
/// see each other once the usual synchronisation ([`Rma::flush`] by the
/// writer, then a message, collective or atomic) orders them.
pub trait Windows: Comm {
    /// Collectively creates a window: every process calls this in the same
    /// order with the same `bytes`, and gets a local part of `bytes` bytes
    /// (zero-filled, page-aligned and shared-mappable, see [above](Windows))
    /// that all the others can access with [`Rma`]. The id is the same in
    /// every process.
    fn create_window(&self, bytes: usize) -> Result<WindowId>;

    /// Collectively destroys a window (every process, same order). No RMA to
    /// it may be in flight. Afterwards the id is unknown and the window's
    /// address range stays reserved but inaccessible, so a stale
    /// [`LocalWindow`] pointer faults instead of touching reused memory
    /// (every backend must give this guarantee).
    fn destroy_window(&self, id: WindowId) -> Result<()>;

    /// This process's part of window `id`.
    fn local_window(&self, id: WindowId) -> Result<LocalWindow>;

    /// Size of each process's part of window `id`.
    fn window_size(&self, id: WindowId) -> Result<usize> {
        self.local_window(id).map(|w| w.len())
    }
}

/// The handle of an asynchronous operation (see [`Request`]).
pub trait RmaRequest: Send + Sized {
    /// Whether the operation has completed (also drives progress where the
    /// backend needs it).
    fn is_complete(&self) -> bool;
    /// Waits for completion, parking the calling user-level thread; returns
    /// the fetched value for atomics and 0 for reads and writes.
    fn wait(self) -> Result<u64>;
    /// Runs `f` on completion: at once if already complete, otherwise in
    /// whichever thread completes the operation (keep it short).
    fn on_complete<F: FnOnce(Result<u64>) + Send + 'static>(self, f: F);
}

/// One-sided operations on registered windows.
///
/// Blocking forms return when the operation is complete at the target (a
/// read has its data, a write is visible to the target and everyone else).
/// The `_nb` forms return a request; completion of a request means the same.
/// Atomics work on aligned `u64` words and are atomic with respect to every
/// other atomic of the job on the same word (not with respect to plain
/// writes).
pub trait Rma: Comm {
    /// Handle of an asynchronous operation.
    type Request: RmaRequest;

    /// Starts reading `len` bytes at `src` into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, and neither read nor
    /// written by anyone else, until the request has completed (waited,
    /// tested complete, or a flush of `src.rank()` returned).
    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Self::Request>;

    /// Starts writing `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes, and not written by
    /// anyone, until the request has completed.
    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Self::Request>;

    /// Starts a compare-and-swap of the aligned word at `target`: if it
    /// equals `expected`, it becomes `new`. The request's value is the old
    /// word.
    fn compare_and_swap_nb(
        &self,
        target: RemotePtr,
        expected: u64,
        new: u64,
    ) -> Result<Self::Request>;

    /// Starts a wrapping fetch-and-add of `delta` to the aligned word at
    /// `target`. The request's value is the old word.
    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Self::Request>;

    /// Returns once every operation this process issued to `rank` has
    /// completed at the target.
    fn flush(&self, rank: usize) -> Result<()>;

    /// [`Rma::flush`] for every process.
    fn flush_all(&self) -> Result<()>;

    /// Reads `dst.len()` bytes at `src`.
    fn read(&self, src: RemotePtr, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `dst` is exclusively borrowed until we return, and we wait
        // for completion before returning.
        let r = unsafe { self.read_nb(src, dst.as_mut_ptr(), dst.len()) }?;
        r.wait().map(drop)
    }

    /// Writes `src` to `dst`.
    fn write(&self, dst: RemotePtr, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is borrowed (immutable) until we return, and we wait
        // for completion before returning.
        let r = unsafe { self.write_nb(dst, src.as_ptr(), src.len()) }?;
        r.wait().map(drop)
    }

    /// Compare-and-swap; returns the old word (success iff it equals
    /// `expected`).
    fn compare_and_swap(&self, target: RemotePtr, expected: u64, new: u64) -> Result<u64> {
        self.compare_and_swap_nb(target, expected, new)?.wait()
    }

    /// Fetch-and-add; returns the old word.
    fn fetch_add(&self, target: RemotePtr, delta: u64) -> Result<u64> {
        self.fetch_add_nb(target, delta)?.wait()
    }

    /// Atomic read of the aligned word at `target` (a fetch-and-add of 0).
    fn atomic_load(&self, target: RemotePtr) -> Result<u64> {
        self.fetch_add(target, 0)
    }

    /// Several compare-and-swaps, which the backend may have in flight
    /// together (the served mpi backend: one round trip for all); returns
    /// once every one has completed, with its `old` word set. Each is an
    /// atomic of its own, in no particular order with the others. On an
    /// error, the operations may have been performed or not.
    fn compare_and_swap_all(&self, ops: &mut [CasOp]) -> Result<()> {
        batch::cas_all_nb(self, ops)
    }

    /// Several reads (source, destination), which the backend may have in
    /// flight together; returns once every destination is filled.
    fn read_all(&self, reads: &mut [(RemotePtr, &mut [u8])]) -> Result<()> {
        batch::read_all_nb(self, reads)
    }

    /// Compare-and-swaps, then reads, as one batch: every read is performed
    /// after every compare-and-swap of the batch to the same process, so a
    /// read can fetch what a lock taken by one of the swaps protects — in
    /// the same round trip on the served mpi backend (one request per
    /// process carries both). The others do [`Self::compare_and_swap_all`]
    /// and then [`Self::read_all`]. Reads whose data turns out not to be
    /// wanted (their swap failed) are the caller's to ignore.
    fn compare_and_swap_then_read_all(
        &self,
        ops: &mut [CasOp],
        reads: &mut [(RemotePtr, &mut [u8])],
    ) -> Result<()> {
        if let ([op], [(src, dst)]) = (&mut *ops, &mut *reads) {
            // One of each (a lock and its data): the blocking forms.
            op.old = self.compare_and_swap(op.target, op.expected, op.new)?;
            return self.read(*src, dst);
        }
        self.compare_and_swap_all(ops)?;
        self.read_all(reads)
    }
}

/// Source selector of a receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A message from any process.
    Any,
    /// A message from this rank.
    Rank(usize),
}

impl From<usize> for Source {
    fn from(rank: usize) -> Self {
        Source::Rank(rank)
    }
}

/// Message tag. Every value is available to users.
pub type Tag = u32;

/// Small point-to-point messages.
///
/// Messages between one sender thread and one receiver with the same tag
/// arrive in the order sent; a receive for one tag never consumes a message
/// with another tag. Sends are buffered: `send` returns once the message is
/// queued at the receiver (waiting for queue space if needed).
pub trait P2p: Comm {
    /// Largest message in bytes ([`MAX_MESSAGE_BYTES`] unless the backend is
    /// more restrictive).
    fn max_message_bytes(&self) -> usize {
        MAX_MESSAGE_BYTES
    }

    /// Sends `data` to `to` with `tag`.
    fn send(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()>;

    /// Receives the oldest message with `tag` from `from`, if one is there.
    fn try_recv(&self, from: Source, tag: Tag) -> Result<Option<(usize, Vec<u8>)>>;

    /// Waits for a message with `tag` from `from`; returns the sender and
    /// the payload.
    fn recv(&self, from: Source, tag: Tag) -> Result<(usize, Vec<u8>)>;

    /// [`P2p::recv`] into `buf`; returns the sender and the length. A message
    /// longer than `buf` is left queued and gives [`Error::BufferTooSmall`].
    fn recv_into(&self, from: Source, tag: Tag, buf: &mut [u8]) -> Result<(usize, usize)>;
}

/// Collective operations: every process calls them in the same order (one
/// thread per process at a time; concurrent calls in one process are
/// serialised).
///
/// Disagreements between processes (lengths, roots, operations) are detected
/// by all of them alike ([`Error::CollectiveMismatch`]) and leave the
/// collectives usable. Errors about a process's own arguments
/// ([`Error::InvalidArgument`], [`Error::BadRank`]) are returned before it
/// takes part, so the others keep waiting for it.
pub trait Coll: Comm {
    /// Returns once every process has entered the barrier.
    fn barrier(&self) -> Result<()>;

    /// Copies `buf` of `root` into `buf` of every process. Every process
    /// passes the same `root` and length, or gets
    /// [`Error::CollectiveMismatch`].
    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()>;

    /// Gathers every process's `src` (all of the same length) into `dst`,
    /// ordered by rank; `dst.len()` must be `size() * src.len()`.
    fn allgather_into(&self, src: &[u8], dst: &mut [u8]) -> Result<()>;

    /// [`Coll::allgather_into`] of records of which only a prefix may
    /// matter: `used(first)`, given the first `head` bytes of a process's
    /// record (`head <= src.len()`), says how many bytes of it the caller
    /// will read (at least `head`; more than `src.len()` counts as all).
    /// Each process's record arrives in `dst` up to that length at least;
    /// the bytes after it are unspecified. A backend that reads peers'
    /// records in place (shm) copies only the prefixes, and touches fewer
    /// cache lines of them; the others copy everything.
    fn allgather_prefix_into(
        &self,
        src: &[u8],
        head: usize,
        used: &dyn Fn(&[u8]) -> usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let _ = (head, used);
        self.allgather_into(src, dst)
    }

    /// [`Coll::allgather_into`] into a new vector.
    fn allgather(&self, src: &[u8]) -> Result<Vec<u8>> {
        let mut dst = vec![0u8; src.len() * self.size()];
        self.allgather_into(src, &mut dst)?;
        Ok(dst)
    }
}

/// Everything the DSM needs from a communication backend.
pub trait Communicator: Rma + Windows + P2p + Coll {}

impl<T: Rma + Windows + P2p + Coll> Communicator for T {}

/// This process's part of a window: a raw range of memory that other
/// processes read and write concurrently through [`Rma`].
///
/// Plain access is `unsafe` (the caller must know no remote access conflicts);
/// atomic access to aligned words is safe.
#[derive(Debug, Clone, Copy)]
pub struct LocalWindow {
    id: WindowId,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a LocalWindow is an address range in shared memory that lives
// until the window is destroyed (after which the range stays reserved, see
// `Windows::destroy_window`); it carries no thread affinity.
unsafe impl Send for LocalWindow {}
// SAFETY: as above; `&LocalWindow` gives no unsynchronised access by itself.
unsafe impl Sync for LocalWindow {}

impl LocalWindow {
    /// Describes `len` bytes at `ptr` as window `id`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be this process's part of window `id`, mapped
    /// read-write, and follow the rules of [`Windows`] (page-aligned shared
    /// mapping, unless `len` is 0) and the reservation rule of
    /// [`Windows::destroy_window`].
    pub unsafe fn from_raw(id: WindowId, ptr: *mut u8, len: usize) -> Self {
        LocalWindow { id, ptr, len }
    }

    /// Window id.
    pub fn id(&self) -> WindowId {
        self.id
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The window as a slice.
    ///
    /// # Safety
    /// No process may write the bytes read through the slice while it is in
    /// use (remote RMA included), and the window must not be destroyed.
    pub unsafe fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the range is mapped and valid per `from_raw`; the caller
        // excludes concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The window as a mutable slice.
    ///
    /// # Safety
    /// No other reference to these bytes may exist, and no process may access
    /// them remotely, while the slice is in use; the window must not be
    /// destroyed.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the range is mapped and valid per `from_raw`; the caller
        // guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The aligned word at `offset`, for atomic access (the same word remote
    /// [`Rma::compare_and_swap`] and [`Rma::fetch_add`] operate on).
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        if !offset.is_multiple_of(8) {
            return Err(Error::UnalignedAtomic {
                window: self.id.0,
                offset: offset as u64,
            });
        }
        if offset.checked_add(8).is_none_or(|end| end > self.len) {
            return Err(Error::OutOfBounds {
                window: self.id.0,
                offset: offset as u64,
                len: 8,
                size: self.len,
            });
        }
        // SAFETY: the word is inside the mapped window and 8-byte aligned (the
        // window base is page-aligned); all-bit patterns are valid AtomicU64s,
        // and every access to it by the job is atomic or covered by the
        // caller's protocol.
        Ok(unsafe { &*(self.ptr.add(offset) as *const AtomicU64) })
    }
}
