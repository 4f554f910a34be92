//! The DSM heap: `malloc`/`free` on DSM memory, usable concurrently from
//! every process, whose `free` really makes memory reusable (the original
//! MENPS heap never reused anything).
//!
//! # Layout
//!
//! At start-up ([`Dsm::with_config`](crate::dsm::Dsm::with_config) with `heap_size > 0`) every process
//! collectively creates one segment of `heap_size` bytes with blocks of
//! `heap_block_size` bytes, in a reserved segment slot (so the segments an
//! application creates keep their addresses and homes). The heap is cut into
//! *chunks* of `min(1 MiB, largest power of two dividing heap_size)` bytes
//! (a multiple of the block size, so no DSM block straddles two chunks).
//!
//! The allocator's own metadata is **not** in DSM memory: it lives in windows
//! of the communication layer and is only touched with one-sided operations,
//! so the allocator never needs DSM coherence for itself.
//!
//! - The **chunk table** (rank 0's part of a window, one word per chunk, plus
//!   a spin-lock word) says of each chunk whether it is free (never used, or
//!   used before), holds small objects of one size class for one owner
//!   process, or is the head or a tail chunk of a large object. Changes to
//!   the table are serialised by the lock word (remote compare-and-swap with
//!   yielding backoff); they are rare (chunk acquisition and release, large
//!   objects).
//! - **Small objects** (up to `chunk / 8`, at most 128 KiB) come in 26 size
//!   classes (16 B … 128 KiB, two per power of two: `2^k` and `1.5 · 2^k`).
//!   Each process allocates from the chunks it *owns*; its part of the
//!   *owner window* holds, per chunk, a header word (an "active" bit and the
//!   number of live objects) and an allocation bitmap. The owner claims a
//!   slot by incrementing the header and setting the slot's bit; **any**
//!   process frees an object by clearing its bit and decrementing the header
//!   with remote atomics — the owner's CPU is not involved. All accesses to
//!   these words, the owner's own included, are RMA atomics (under MPI, local
//!   accesses to words that remote atomics target must be atomics too).
//! - A chunk whose header says "active, 0 live objects" can be taken back by
//!   a single compare-and-swap of its header to 0, by its owner (now and then,
//!   and in [`Dsm::heap_trim`](crate::dsm::Dsm::heap_trim)) or by any process that runs out of chunks (so
//!   chunks emptied by remote frees return to the table even if their owner
//!   never calls the heap again). Because a claim increments the header
//!   *before* setting its bit and a free clears its bit *before* decrementing,
//!   a count of 0 proves that no object lives in the chunk, and a claim that
//!   finds its chunk taken back undoes itself.
//! - **Large objects** are runs of whole chunks found first-fit in the table
//!   (chunk-aligned).
//!
//! Table entries are written (plain RMA puts) only under the lock, and read
//! with plain gets: by the lock holder, and by `free`, whose entry cannot
//! change while the object it frees is live. The lock word, headers and
//! bitmaps are only ever accessed with RMA atomics.
//!
//! Each process holds at least one chunk per size class it uses, so a heap
//! needs about `processes × classes in use` chunks for its small objects
//! before large ones; size the heap (`MENPS_DSM_HEAP_SIZE`) accordingly.
//!
//! # Coherence of reused memory
//!
//! Memory that changes hands through the heap needs two extra steps, because
//! the DSM is a multiple-writer protocol that merges *differences* against a
//! base version (the twin):
//!
//! - [`Dsm::free`](crate::dsm::Dsm::free) first **releases** the object's blocks
//!   ([`Dsm::release_range`](crate::dsm::Dsm::release_range)), and only then clears the slot's bit (or the
//!   table entries). Otherwise writes the freeing process made to the object
//!   could still be pending in its copy and be merged later — over the data
//!   of the object's next user.
//! - An allocation that reuses memory **forgets** this process's copies of
//!   its blocks ([`Dsm::forget_range`](crate::dsm::Dsm::forget_range)) before returning it, so the next
//!   access fetches the latest version. Otherwise the new owner would write
//!   into a stale copy whose base version predates the previous user's
//!   (released) writes: the merge would see both change the same bytes and
//!   report a false write-write race, or take stale bytes for new ones.
//!   Memory never handed out since its chunk was acquired needs no forget: the
//!   whole chunk is forgotten once when it is acquired (if it was used
//!   before), and chunks never used at all are still zero everywhere.
//!
//! Other processes need nothing special: they can only learn about the new
//! object through synchronisation with its new user (a barrier, a mutex, an
//! atomic with acquire semantics, or anything that transitively follows
//! one), whose acquire drops their stale copies like for any other write.
//!
//! # Rules
//!
//! - Free an object once, after every process is done with it: writes to it
//!   by *other* processes must have been released (by their barrier, unlock
//!   or release fence) and be ordered before the free by synchronisation, as
//!   for any data-race-free access. The freeing process's own writes are
//!   released by `free` itself.
//! - Any process may free any object. Double frees and pointers that are not
//!   the start of a live heap object are reported as
//!   [`DsmError::InvalidArgument`] when they can be recognised (a freed slot
//!   that was already reused by another allocation cannot be told from a live
//!   one).
//! - A full heap gives [`DsmError::OutOfMemory`].
//! - The contents of a new object are unspecified (use
//!   [`Dsm::alloc_zeroed`](crate::dsm::Dsm::alloc_zeroed) for zeros).

use ct_sync::Mutex;
use ct_worker::UltItf;

use crate::com::{Communicator, WindowId};

use crate::dsm::error::{DsmError, DsmResult};
use crate::dsm::memory::map::{RegionKind, Request};
use crate::dsm::space::{Init, Space};

mod api;
mod classes;
mod large;
mod small;
mod stats;
mod table;

pub use classes::{MAX_CHUNK_SIZE, SIZE_CLASSES};
pub use stats::{HeapStats, HeapUsage};

use classes::{bit_of, bitmap_words, chunk_size_for, class_index, max_small};
use stats::{Counters, add};
use table::{E_USED, Entry};

// ---------------------------------------------------------------------------
// State.

/// A chunk this process owns, as it knows it.
#[derive(Debug, Clone, Copy)]
struct Owned {
    /// Chunk index.
    idx: usize,
    /// Slots handed out at least once since the chunk was acquired; the ones
    /// above are untouched since then.
    hwm: usize,
    /// Bitmap word where the next search for a freed slot starts.
    cursor: usize,
    /// Whether the chunk had never been used when it was acquired.
    virgin: bool,
}

/// The owner-side state of this process (behind one mutex of the threading
/// library: claims, chunk acquisitions and trims of one process are
/// serialised, which also rules out ABA on its own headers).
struct Local {
    /// Owned chunks per size class; the last one is the current one.
    classes: Vec<Vec<Owned>>,
    /// Small allocations since the last periodic trim.
    since_trim: u32,
}

/// Small allocations between two periodic trims.
const TRIM_PERIOD: u32 = 256;

/// The heap of this process.
pub(crate) struct Heap<U: UltItf> {
    base: usize,
    size: usize,
    chunk: usize,
    chunk_shift: u32,
    nchunks: usize,
    max_small: usize,
    /// Bytes of one chunk's area in the owner window (header + bitmap).
    area: usize,
    table_win: WindowId,
    owner_win: WindowId,
    rank: usize,
    nprocs: usize,
    local: Mutex<Local, U>,
    stats: Counters,
}

/// Where an allocation came from.
pub(crate) struct Got {
    pub(crate) addr: usize,
    /// Usable size.
    size: usize,
    /// Never used since the DSM started (still zero).
    fresh: bool,
    /// Reused memory that an earlier object occupied.
    reused: bool,
}

impl<U: UltItf> Heap<U> {
    /// Collectively creates the heap segment and its metadata windows.
    pub(crate) fn create<C: Communicator + 'static>(space: &Space<C, U>) -> DsmResult<Self> {
        let cfg = &space.cfg;
        let size = cfg.heap_size;
        let chunk = chunk_size_for(size);
        if chunk < cfg.heap_block_size {
            return Err(DsmError::Config(format!(
                "heap size {size} is not a multiple of its block size {}",
                cfg.heap_block_size
            )));
        }
        let nchunks = size / chunk;
        if nchunks as u64 >= 1 << 32 {
            return Err(DsmError::Config(format!("heap size {size} is too large")));
        }
        let base = space
            .create_region(
                Ok(Request {
                    kind: RegionKind::Heap,
                    size,
                    block_size: cfg.heap_block_size,
                    at: None,
                }),
                Init::Zero,
            )?
            .base;
        let area = 8 + 8 * bitmap_words(chunk);
        let table_win = space.com.create_window(8 + 8 * nchunks)?;
        let owner_win = space.com.create_window(area * nchunks)?;
        Ok(Heap {
            base,
            size,
            chunk,
            chunk_shift: chunk.trailing_zeros(),
            nchunks,
            max_small: max_small(chunk),
            area,
            table_win,
            owner_win,
            rank: space.rank,
            nprocs: space.nprocs,
            local: Mutex::new_in(Local {
                classes: vec![Vec::new(); SIZE_CLASSES.len()],
                since_trim: 0,
            }),
            stats: Counters::default(),
        })
    }

    /// The usable size of the live object at `addr`.
    pub(crate) fn usable_size<C: Communicator + 'static>(
        &self,
        com: &C,
        addr: usize,
    ) -> DsmResult<usize> {
        self.lookup(com, addr).map(|(_, _, s)| s)
    }

    /// The heap's first address and size.
    pub(crate) fn range(&self) -> (usize, usize) {
        (self.base, self.size)
    }

    fn chunk_addr(&self, idx: usize) -> usize {
        self.base + (idx << self.chunk_shift)
    }

    fn header_off(&self, idx: usize) -> u64 {
        (idx * self.area) as u64
    }

    fn word_off(&self, idx: usize, w: usize) -> u64 {
        (idx * self.area + 8 + 8 * w) as u64
    }

    fn slots(&self, class: usize) -> usize {
        self.chunk / SIZE_CLASSES[class]
    }
}

impl<U: UltItf> Heap<U> {
    // -----------------------------------------------------------------
    // The operations.

    pub(crate) fn alloc<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        size: usize,
        align: usize,
    ) -> DsmResult<Got> {
        let _rt = space.enter()?;
        if !align.is_power_of_two() || align > self.chunk {
            return Err(DsmError::InvalidArgument(format!(
                "DSM heap alignment {align} is not a power of two of at most {} bytes",
                self.chunk
            )));
        }
        let size = size.max(1);
        let got = match class_index(size, align, self.max_small) {
            Some(class) => self.alloc_small(space, class)?,
            None => self.alloc_large(space, size)?,
        };
        add(&self.stats.allocs, 1);
        add(&self.stats.bytes_allocated, got.size as u64);
        if got.reused {
            add(&self.stats.reused, 1);
        }
        Ok(got)
    }

    /// [`Heap::alloc`] with the first `size` bytes zeroed; memory never
    /// used since start-up is zero already and is not written (a write
    /// fault saved per page).
    pub(crate) fn alloc_zeroed<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        size: usize,
        align: usize,
    ) -> DsmResult<usize> {
        let g = self.alloc(space, size, align)?;
        if !g.fresh {
            // SAFETY: the object was just allocated to us: at least `size`
            // bytes of DSM memory (faults are resolved by the DSM) that
            // nobody else may access until we hand the pointer out.
            unsafe { core::ptr::write_bytes(g.addr as *mut u8, 0, size) };
        }
        Ok(g.addr)
    }

    /// The live object holding `addr` (anywhere inside it): its start and
    /// usable size. `None` outside the heap or in free memory.
    pub(crate) fn containing<C: Communicator + 'static>(
        &self,
        com: &C,
        addr: usize,
    ) -> Option<(usize, usize)> {
        if addr < self.base || addr >= self.base + self.size {
            return None;
        }
        let idx = (addr - self.base) >> self.chunk_shift;
        match Entry::decode(self.read_entry(com, idx).ok()?) {
            Entry::Small { class, .. } => {
                let cs = SIZE_CLASSES[class];
                let slot = (addr - self.chunk_addr(idx)) / cs;
                (slot < self.slots(class)).then(|| (self.chunk_addr(idx) + slot * cs, cs))
            }
            Entry::Head { n } => Some((self.chunk_addr(idx), n * self.chunk)),
            Entry::Tail { head } => match Entry::decode(self.read_entry(com, head).ok()?) {
                Entry::Head { n } => Some((self.chunk_addr(head), n * self.chunk)),
                _ => None,
            },
            Entry::Free { .. } | Entry::Bad(_) => None,
        }
    }

    /// What `addr` is: (chunk index, entry, usable size) of the live object
    /// starting there.
    pub(crate) fn lookup<C: Communicator + 'static>(
        &self,
        com: &C,
        addr: usize,
    ) -> DsmResult<(usize, Entry, usize)> {
        if addr < self.base || addr >= self.base + self.size {
            return Err(DsmError::InvalidArgument(format!(
                "{addr:#x} is not a pointer into the DSM heap ({:#x}..{:#x})",
                self.base,
                self.base + self.size
            )));
        }
        let idx = (addr - self.base) >> self.chunk_shift;
        let off = addr - self.chunk_addr(idx);
        let e = Entry::decode(self.read_entry(com, idx)?);
        let size = match e {
            Entry::Free { .. } => {
                return Err(DsmError::InvalidArgument(format!(
                    "{addr:#x} is not an allocated DSM heap object (freed twice?)"
                )));
            }
            Entry::Small { class, owner } => {
                let cs = SIZE_CLASSES[class];
                if owner >= self.nprocs {
                    return Err(DsmError::Misuse(format!(
                        "DSM heap metadata corrupt: chunk {idx} owned by process {owner}"
                    )));
                }
                if !off.is_multiple_of(cs) || off / cs >= self.slots(class) {
                    return Err(DsmError::InvalidArgument(format!(
                        "{addr:#x} points inside a DSM heap object of {cs} bytes, not to its start"
                    )));
                }
                cs
            }
            Entry::Head { n } => {
                if off != 0 {
                    return Err(DsmError::InvalidArgument(format!(
                        "{addr:#x} points inside the DSM heap object at {:#x}, not to its start",
                        self.chunk_addr(idx)
                    )));
                }
                n * self.chunk
            }
            Entry::Tail { head } => {
                return Err(DsmError::InvalidArgument(format!(
                    "{addr:#x} points inside the DSM heap object at {:#x}, not to its start",
                    self.chunk_addr(head)
                )));
            }
            Entry::Bad(v) => {
                return Err(DsmError::Misuse(format!(
                    "DSM heap metadata corrupt: chunk {idx} has entry {v:#x}"
                )));
            }
        };
        Ok((idx, e, size))
    }

    pub(crate) fn free<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        addr: usize,
    ) -> DsmResult<()> {
        let _rt = space.enter()?;
        let com = &space.com;
        let (idx, e, size) = self.lookup(com, addr)?;
        // Publish our writes to the object before anybody can reuse it.
        space.release_range(addr, size)?;
        match e {
            Entry::Small { owner, .. } => {
                let slot = (addr - self.chunk_addr(idx)) / size;
                let (w, mask) = bit_of(slot);
                let word = self.owner_win.at(owner, self.word_off(idx, w));
                let mut v = com.atomic_load(word)?;
                loop {
                    if v & mask == 0 {
                        return Err(DsmError::InvalidArgument(format!(
                            "{addr:#x} is not an allocated DSM heap object (freed twice?)"
                        )));
                    }
                    let o = com.compare_and_swap(word, v, v & !mask)?;
                    if o == v {
                        break;
                    }
                    v = o;
                }
                com.fetch_add(self.owner_win.at(owner, self.header_off(idx)), u64::MAX)?;
            }
            Entry::Head { n } => {
                self.with_table_lock(com, || {
                    if Entry::decode(self.read_entry(com, idx)?) != e {
                        return Err(DsmError::InvalidArgument(format!(
                            "{addr:#x} is not an allocated DSM heap object (freed twice?)"
                        )));
                    }
                    self.write_entries(com, idx, &vec![E_USED; n])
                })?;
            }
            _ => unreachable!("lookup returns live objects only"),
        }
        add(&self.stats.frees, 1);
        add(&self.stats.bytes_freed, size as u64);
        Ok(())
    }
}
