//! The DSM heap: `malloc`/`free` on DSM memory, usable concurrently from
//! every process, whose `free` really makes memory reusable (the original
//! MENPS heap never reused anything).
//!
//! # Layout
//!
//! At start-up ([`Dsm::with_config`] with `heap_size > 0`) every process
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
//!   and in [`Dsm::heap_trim`]) or by any process that runs out of chunks (so
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
//! - [`Dsm::free`] first **releases** the object's blocks
//!   ([`Dsm::release_range`]), and only then clears the slot's bit (or the
//!   table entries). Otherwise writes the freeing process made to the object
//!   could still be pending in its copy and be merged later — over the data
//!   of the object's next user.
//! - An allocation that reuses memory **forgets** this process's copies of
//!   its blocks ([`Dsm::forget_range`]) before returning it, so the next
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
//!   [`Dsm::alloc_zeroed`] for zeros).

use core::sync::atomic::{AtomicU64, Ordering};

use ct_sync::Mutex;
use ct_worker::UltItf;

use crate::com::{Communicator, WindowId};

use super::error::{DsmError, DsmResult};
use super::layout::{self, MAX_SEGMENTS};
use super::space::Space;
use super::{Dsm, globals};

/// Segment slot of the heap.
pub(crate) const HEAP_SLOT: usize = MAX_SEGMENTS - 1;
/// Segment slot of the DSM globals.
pub(crate) const GLOBALS_SLOT: usize = MAX_SEGMENTS - 2;
/// Slots from here on are reserved for the runtime; `alloc_segment` uses the
/// ones below.
pub(crate) const FIRST_RESERVED_SLOT: usize = GLOBALS_SLOT;

/// Largest chunk size.
pub const MAX_CHUNK_SIZE: usize = 1 << 20;

/// The small-object size classes, in bytes: 16, 32, then `2^k` and
/// `1.5 · 2^k` up to 128 KiB. Every class is a multiple of 16, so every small
/// object is 16-byte aligned (and aligned to the largest power of two
/// dividing its class).
pub const SIZE_CLASSES: [usize; 26] = size_classes();

const fn size_classes() -> [usize; 26] {
    let mut c = [0usize; 26];
    c[0] = 16;
    c[1] = 32;
    let mut i = 2;
    let mut p = 32;
    while i < 26 {
        c[i] = p + p / 2;
        c[i + 1] = 2 * p;
        p *= 2;
        i += 2;
    }
    c
}

/// Smallest size class (the bitmap granularity).
const MIN_CLASS: usize = SIZE_CLASSES[0];

/// Largest small object for chunks of `chunk` bytes.
pub(crate) fn max_small(chunk: usize) -> usize {
    (chunk / 8).min(SIZE_CLASSES[SIZE_CLASSES.len() - 1])
}

/// Chunk size of a heap of `heap_size` bytes: the largest power of two that
/// divides it, at most [`MAX_CHUNK_SIZE`].
pub(crate) fn chunk_size_for(heap_size: usize) -> usize {
    1 << heap_size
        .trailing_zeros()
        .min(MAX_CHUNK_SIZE.trailing_zeros())
}

/// The smallest size class of at most `max_small` bytes that holds `size`
/// bytes aligned to `align` (a power of two), if any.
pub(crate) fn class_index(size: usize, align: usize, max_small: usize) -> Option<usize> {
    SIZE_CLASSES
        .iter()
        .take_while(|&&c| c <= max_small)
        .position(|&c| c >= size && c.is_multiple_of(align))
}

/// Words of one chunk's allocation bitmap (one bit per smallest-class slot).
pub(crate) fn bitmap_words(chunk: usize) -> usize {
    (chunk / MIN_CLASS).div_ceil(64)
}

/// Bitmap word and bit mask of slot `slot`.
pub(crate) fn bit_of(slot: usize) -> (usize, u64) {
    (slot / 64, 1u64 << (slot % 64))
}

/// The lowest clear bit of `word` below `limit` (≤ 64), if any.
pub(crate) fn first_clear_bit(word: u64, limit: usize) -> Option<usize> {
    let b = (!word).trailing_zeros() as usize;
    (b < limit).then_some(b)
}

// ---------------------------------------------------------------------------
// Chunk-table entries.

/// Entry of a chunk never handed out (its memory is still zero everywhere).
const E_FRESH: u64 = 0;
/// Entry of a free chunk used before.
const E_USED: u64 = 1;
const KIND_SHIFT: u32 = 60;
const K_SMALL: u64 = 2;
const K_HEAD: u64 = 3;
const K_TAIL: u64 = 4;
const LOW_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// A decoded chunk-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Free; `used` if it held objects before.
    Free {
        /// Whether the chunk was handed out before (its memory is stale).
        used: bool,
    },
    /// Small objects of size class `class`, owned by process `owner`.
    Small {
        /// Size-class index.
        class: usize,
        /// Owner rank.
        owner: usize,
    },
    /// First chunk of a large object of `n` chunks.
    Head {
        /// Chunks of the object.
        n: usize,
    },
    /// Later chunk of the large object that starts at chunk `head`.
    Tail {
        /// Index of the head chunk.
        head: usize,
    },
    /// Not a valid entry (corrupted metadata).
    Bad(u64),
}

impl Entry {
    pub(crate) fn encode(self) -> u64 {
        match self {
            Entry::Free { used: false } => E_FRESH,
            Entry::Free { used: true } => E_USED,
            Entry::Small { class, owner } => {
                (K_SMALL << KIND_SHIFT) | ((owner as u64) << 8) | class as u64
            }
            Entry::Head { n } => (K_HEAD << KIND_SHIFT) | n as u64,
            Entry::Tail { head } => (K_TAIL << KIND_SHIFT) | head as u64,
            Entry::Bad(v) => v,
        }
    }

    pub(crate) fn decode(v: u64) -> Entry {
        let low = v & LOW_MASK;
        match v >> KIND_SHIFT {
            0 if v == E_FRESH => Entry::Free { used: false },
            0 if v == E_USED => Entry::Free { used: true },
            K_SMALL if ((low & 0xff) as usize) < SIZE_CLASSES.len() => Entry::Small {
                class: (low & 0xff) as usize,
                owner: (low >> 8) as usize,
            },
            K_HEAD if low > 0 => Entry::Head { n: low as usize },
            K_TAIL => Entry::Tail { head: low as usize },
            _ => Entry::Bad(v),
        }
    }
}

/// Header bit of a chunk its owner allocates from.
const ACTIVE: u64 = 1 << 63;
/// Header bits counting the chunk's live objects.
const COUNT_MASK: u64 = (1 << 32) - 1;

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

/// Counters of this process's heap activity.
#[derive(Default)]
struct Counters {
    allocs: AtomicU64,
    frees: AtomicU64,
    bytes_allocated: AtomicU64,
    bytes_freed: AtomicU64,
    reused: AtomicU64,
    chunks_acquired: AtomicU64,
    chunks_returned: AtomicU64,
    chunks_reclaimed: AtomicU64,
}

fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

/// Heap statistics of this process (see [`Dsm::heap_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Successful allocations made by this process.
    pub allocs: u64,
    /// Successful frees made by this process (of objects any process
    /// allocated).
    pub frees: u64,
    /// Bytes of the objects this process allocated (usable sizes: the size
    /// class, or whole chunks for large objects).
    pub bytes_allocated: u64,
    /// Bytes of the objects this process freed.
    pub bytes_freed: u64,
    /// Allocations that reused memory an earlier object had occupied.
    pub reused: u64,
    /// Chunks this process took from the chunk table for its small objects.
    pub chunks_acquired: u64,
    /// Empty chunks of its own this process gave back to the table.
    pub chunks_returned: u64,
    /// Empty chunks of other processes this process gave back to the table
    /// because it ran out of chunks.
    pub chunks_reclaimed: u64,
}

impl HeapStats {
    /// Bytes this process allocated minus the bytes it freed. Summed over
    /// all processes it is the heap's usage in bytes; per process it is
    /// negative when a process frees more than it allocates.
    pub fn net_bytes(&self) -> i64 {
        self.bytes_allocated as i64 - self.bytes_freed as i64
    }
}

/// The heap's global occupancy, read from the chunk table (see
/// [`Dsm::heap_usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapUsage {
    /// Size of the heap in bytes.
    pub heap_size: usize,
    /// Chunk size in bytes.
    pub chunk_size: usize,
    /// Number of chunks.
    pub chunks: usize,
    /// Free chunks.
    pub free_chunks: usize,
    /// Chunks holding small objects (of any process).
    pub small_chunks: usize,
    /// Chunks holding large objects.
    pub large_chunks: usize,
    /// Chunks holding small objects of this process.
    pub own_small_chunks: usize,
}

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

/// The memory-management state a [`Dsm`] holds: its heap and whether the
/// globals segment exists.
pub(crate) struct MemState<U: UltItf> {
    heap: Option<Heap<U>>,
    globals: bool,
}

impl<U: UltItf> Default for MemState<U> {
    fn default() -> Self {
        MemState {
            heap: None,
            globals: false,
        }
    }
}

impl<U: UltItf> MemState<U> {
    /// Whether the globals segment was created.
    pub(crate) fn has_globals(&self) -> bool {
        self.globals
    }
}

/// Where an allocation came from.
struct Got {
    addr: usize,
    /// Usable size.
    size: usize,
    /// Never used since the DSM started (still zero).
    fresh: bool,
    /// Reused memory that an earlier object occupied.
    reused: bool,
}

impl<U: UltItf> Heap<U> {
    /// Collectively creates the heap segment and its metadata windows.
    fn create<C: Communicator + 'static>(space: &Space<C, U>) -> DsmResult<Self> {
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
        let base = space.create_segment_in_slot(HEAP_SLOT, size, cfg.heap_block_size)?;
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

    // -----------------------------------------------------------------
    // The chunk table and its lock.

    fn read_entry<C: Communicator + 'static>(&self, com: &C, idx: usize) -> DsmResult<u64> {
        let mut b = [0u8; 8];
        com.read(self.table_win.at(0, 8 + 8 * idx as u64), &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_table<C: Communicator + 'static>(&self, com: &C) -> DsmResult<Vec<u64>> {
        let mut b = vec![0u8; 8 * self.nchunks];
        com.read(self.table_win.at(0, 8), &mut b)?;
        Ok(b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
            .collect())
    }

    fn write_entries<C: Communicator + 'static>(
        &self,
        com: &C,
        first: usize,
        e: &[u64],
    ) -> DsmResult<()> {
        let b: Vec<u8> = e.iter().flat_map(|v| v.to_le_bytes()).collect();
        com.write(self.table_win.at(0, 8 + 8 * first as u64), &b)?;
        Ok(())
    }

    /// Runs `f` holding the chunk-table lock (a CAS spin lock at rank 0 with
    /// yielding backoff). Every write to the table happens under it.
    fn with_table_lock<C: Communicator, R>(
        &self,
        com: &C,
        f: impl FnOnce() -> DsmResult<R>,
    ) -> DsmResult<R> {
        let word = self.table_win.at(0, 0);
        let me = self.rank as u64 + 1;
        let mut tries = 0u32;
        loop {
            if com.compare_and_swap(word, 0, me)? == 0 {
                break;
            }
            tries += 1;
            if tries < 64 {
                for _ in 0..(1 << tries.min(6)) {
                    core::hint::spin_loop();
                }
                U::yield_now();
            } else {
                // Long waits (the holder may be descheduled on an
                // oversubscribed machine) back off further.
                U::yield_now();
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        let r = f();
        let old = com.compare_and_swap(word, me, 0)?;
        if old != me {
            return Err(DsmError::Misuse(format!(
                "DSM heap: the chunk-table lock was {old:#x} instead of {me:#x} at unlock"
            )));
        }
        r
    }

    // -----------------------------------------------------------------
    // Small objects.

    /// Claims slot `slot` of our chunk `idx`; `false` if the chunk was taken
    /// back in the meantime.
    fn claim<C: Communicator + 'static>(
        &self,
        com: &C,
        idx: usize,
        slot: usize,
    ) -> DsmResult<bool> {
        let hdr = self.owner_win.at(self.rank, self.header_off(idx));
        let old = com.fetch_add(hdr, 1)?;
        if old & ACTIVE == 0 {
            com.fetch_add(hdr, u64::MAX)?;
            return Ok(false);
        }
        let (w, mask) = bit_of(slot);
        let word = self.owner_win.at(self.rank, self.word_off(idx, w));
        let mut v = com.atomic_load(word)?;
        loop {
            if v & mask != 0 {
                return Err(DsmError::Misuse(format!(
                    "DSM heap metadata corrupt: slot {slot} of chunk {idx} is allocated twice"
                )));
            }
            let o = com.compare_and_swap(word, v, v | mask)?;
            if o == v {
                return Ok(true);
            }
            v = o;
        }
    }

    /// A clear bit of chunk `o` below its high-water mark, searching from
    /// its cursor.
    fn find_freed<C: Communicator + 'static>(
        &self,
        com: &C,
        o: &Owned,
    ) -> DsmResult<Option<usize>> {
        let words = o.hwm.div_ceil(64);
        for k in 0..words {
            let w = (o.cursor + k) % words;
            let limit = (o.hwm - w * 64).min(64);
            let v = com.atomic_load(self.owner_win.at(self.rank, self.word_off(o.idx, w)))?;
            if let Some(b) = first_clear_bit(v, limit) {
                return Ok(Some(w * 64 + b));
            }
        }
        Ok(None)
    }

    fn alloc_small<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        class: usize,
    ) -> DsmResult<Got> {
        let com = &space.com;
        let cs = SIZE_CLASSES[class];
        let slots = self.slots(class);
        let mut local = self.local.lock();
        local.since_trim += 1;
        if local.since_trim >= TRIM_PERIOD {
            local.since_trim = 0;
            self.trim_locked(com, &mut local, true)?;
        }
        let list = &mut local.classes[class];
        let mut i = list.len();
        while i > 0 {
            i -= 1;
            let o = list[i];
            let h = com.atomic_load(self.owner_win.at(self.rank, self.header_off(o.idx)))?;
            if h & ACTIVE == 0 {
                // Taken back by a process that ran out of chunks.
                list.remove(i);
                continue;
            }
            let live = (h & COUNT_MASK) as usize;
            let (slot, bump) = if live < o.hwm {
                // Bits set ≤ live count < hwm, and we alone set bits: a
                // freed slot exists below the high-water mark.
                match self.find_freed(com, &o)? {
                    Some(s) => (s, false),
                    None => {
                        return Err(DsmError::Misuse(format!(
                            "DSM heap metadata corrupt: chunk {} counts {live} objects but has \
                             no free slot below {}",
                            o.idx, o.hwm
                        )));
                    }
                }
            } else if o.hwm < slots {
                (o.hwm, true)
            } else {
                continue;
            };
            if !self.claim(com, o.idx, slot)? {
                list.remove(i);
                continue;
            }
            let o = &mut list[i];
            if bump {
                o.hwm += 1;
            } else {
                o.cursor = slot / 64;
            }
            let fresh = bump && o.virgin;
            let addr = self.chunk_addr(o.idx) + slot * cs;
            drop(local);
            if !bump {
                // Reused: drop our possibly stale copies (module docs).
                space.forget_range(addr, cs)?;
            }
            return Ok(Got {
                addr,
                size: cs,
                fresh,
                reused: !bump,
            });
        }
        let (idx, virgin) = self.acquire_chunk(com, &mut local, class)?;
        local.classes[class].push(Owned {
            idx,
            hwm: 1,
            cursor: 0,
            virgin,
        });
        drop(local);
        let addr = self.chunk_addr(idx);
        if !virgin {
            // Used before: forget the whole chunk once; slots handed out for
            // the first time since then need no forget.
            space.forget_range(addr, self.chunk)?;
        }
        Ok(Got {
            addr,
            size: cs,
            fresh: virgin,
            reused: !virgin,
        })
    }

    /// Takes a free chunk for size class `class`, with its slot 0 claimed;
    /// returns its index and whether it was never used. Runs out of chunks
    /// only after taking back every empty chunk of every process.
    fn acquire_chunk<C: Communicator + 'static>(
        &self,
        com: &C,
        local: &mut Local,
        class: usize,
    ) -> DsmResult<(usize, bool)> {
        for attempt in 0..2 {
            let got = self.with_table_lock(com, || {
                let table = self.read_table(com)?;
                let Some(idx) = table
                    .iter()
                    .position(|&e| matches!(Entry::decode(e), Entry::Free { .. }))
                else {
                    return Ok(None);
                };
                let virgin = table[idx] == E_FRESH;
                // Header and bit first, so the chunk cannot be taken back
                // before its first object is handed out.
                let hdr = self.owner_win.at(self.rank, self.header_off(idx));
                let old = com.compare_and_swap(hdr, 0, ACTIVE | 1)?;
                let word = self.owner_win.at(self.rank, self.word_off(idx, 0));
                let old_bits = com.compare_and_swap(word, 0, 1)?;
                if old != 0 || old_bits != 0 {
                    return Err(DsmError::Misuse(format!(
                        "DSM heap metadata corrupt: free chunk {idx} has header {old:#x} and \
                         bitmap word {old_bits:#x} at process {}",
                        self.rank
                    )));
                }
                let e = Entry::Small {
                    class,
                    owner: self.rank,
                };
                self.write_entries(com, idx, &[e.encode()])?;
                Ok(Some((idx, virgin)))
            })?;
            if let Some((idx, virgin)) = got {
                // Any record of this chunk from an earlier ownership is
                // stale.
                for l in &mut local.classes {
                    l.retain(|o| o.idx != idx);
                }
                add(&self.stats.chunks_acquired, 1);
                return Ok((idx, virgin));
            }
            if attempt == 0 {
                self.reclaim_all(com, local)?;
            }
        }
        Err(self.out_of_memory(com, SIZE_CLASSES[class]))
    }

    /// Gives back our empty chunks (except the current one of each class if
    /// `keep_current`). Returns how many.
    fn trim_locked<C: Communicator + 'static>(
        &self,
        com: &C,
        local: &mut Local,
        keep_current: bool,
    ) -> DsmResult<usize> {
        let mut empty = Vec::new();
        for l in &local.classes {
            let n = if keep_current {
                l.len().saturating_sub(1)
            } else {
                l.len()
            };
            for o in &l[..n] {
                let h = com.atomic_load(self.owner_win.at(self.rank, self.header_off(o.idx)))?;
                if h == ACTIVE || h & ACTIVE == 0 {
                    // Empty, or already taken back (dropped below).
                    empty.push(o.idx);
                }
            }
        }
        if empty.is_empty() {
            return Ok(0);
        }
        let returned = self.with_table_lock(com, || {
            let mut returned = 0;
            for &idx in &empty {
                if self.take_back(com, self.rank, idx)? {
                    returned += 1;
                }
            }
            Ok(returned)
        })?;
        for l in &mut local.classes {
            l.retain(|o| !empty.contains(&o.idx));
        }
        add(&self.stats.chunks_returned, returned as u64);
        Ok(returned)
    }

    /// Takes back chunk `idx` of `owner` if it is empty (holding the table
    /// lock).
    fn take_back<C: Communicator + 'static>(
        &self,
        com: &C,
        owner: usize,
        idx: usize,
    ) -> DsmResult<bool> {
        let hdr = self.owner_win.at(owner, self.header_off(idx));
        if com.compare_and_swap(hdr, ACTIVE, 0)? != ACTIVE {
            return Ok(false);
        }
        self.write_entries(com, idx, &[E_USED])?;
        Ok(true)
    }

    /// Out of chunks: gives back every empty chunk of every process.
    fn reclaim_all<C: Communicator + 'static>(&self, com: &C, local: &mut Local) -> DsmResult<()> {
        self.trim_locked(com, local, false)?;
        let stolen = self.with_table_lock(com, || {
            let table = self.read_table(com)?;
            let mut n = 0;
            for (idx, &e) in table.iter().enumerate() {
                if let Entry::Small { owner, .. } = Entry::decode(e)
                    && owner != self.rank
                    && owner < self.nprocs
                    && self.take_back(com, owner, idx)?
                {
                    n += 1;
                }
            }
            Ok(n)
        })?;
        add(&self.stats.chunks_reclaimed, stolen);
        Ok(())
    }

    fn out_of_memory<C: Communicator + 'static>(&self, com: &C, size: usize) -> DsmError {
        let free = self
            .read_table(com)
            .map(|t| {
                t.iter()
                    .filter(|&&e| matches!(Entry::decode(e), Entry::Free { .. }))
                    .count()
            })
            .unwrap_or(0);
        DsmError::OutOfMemory(format!(
            "the DSM heap cannot hold an object of {size} bytes: {free} of its {} chunks of {} \
             bytes are free ({} bytes in all; raise MENPS_DSM_HEAP_SIZE or free memory)",
            self.nchunks, self.chunk, self.size
        ))
    }

    // -----------------------------------------------------------------
    // Large objects.

    fn alloc_large<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        size: usize,
    ) -> DsmResult<Got> {
        let com = &space.com;
        let n = size.div_ceil(self.chunk);
        if n > self.nchunks {
            return Err(self.out_of_memory(com, size));
        }
        for attempt in 0..2 {
            let got = self.with_table_lock(com, || {
                let table = self.read_table(com)?;
                let Some(first) = first_fit(&table, n) else {
                    return Ok(None);
                };
                let virgin = table[first..first + n].iter().all(|&e| e == E_FRESH);
                let mut run = vec![Entry::Tail { head: first }.encode(); n];
                run[0] = Entry::Head { n }.encode();
                self.write_entries(com, first, &run)?;
                Ok(Some((first, virgin)))
            })?;
            if let Some((first, virgin)) = got {
                let addr = self.chunk_addr(first);
                let len = n * self.chunk;
                if !virgin {
                    space.forget_range(addr, len)?;
                }
                return Ok(Got {
                    addr,
                    size: len,
                    fresh: virgin,
                    reused: !virgin,
                });
            }
            if attempt == 0 {
                let mut local = self.local.lock();
                self.reclaim_all(com, &mut local)?;
            }
        }
        Err(self.out_of_memory(com, size))
    }

    // -----------------------------------------------------------------
    // The operations.

    fn alloc<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        size: usize,
        align: usize,
    ) -> DsmResult<Got> {
        space.check()?;
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

    /// What `addr` is: (chunk index, entry, usable size) of the live object
    /// starting there.
    fn lookup<C: Communicator + 'static>(
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

    fn free<C: Communicator + 'static>(&self, space: &Space<C, U>, addr: usize) -> DsmResult<()> {
        space.check()?;
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

    fn usage<C: Communicator + 'static>(&self, com: &C) -> DsmResult<HeapUsage> {
        let table = self.read_table(com)?;
        let mut u = HeapUsage {
            heap_size: self.size,
            chunk_size: self.chunk,
            chunks: self.nchunks,
            ..HeapUsage::default()
        };
        for &e in &table {
            match Entry::decode(e) {
                Entry::Free { .. } => u.free_chunks += 1,
                Entry::Small { owner, .. } => {
                    u.small_chunks += 1;
                    if owner == self.rank {
                        u.own_small_chunks += 1;
                    }
                }
                Entry::Head { .. } | Entry::Tail { .. } => u.large_chunks += 1,
                Entry::Bad(_) => {}
            }
        }
        Ok(u)
    }

    fn stats(&self) -> HeapStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.stats;
        HeapStats {
            allocs: g(&s.allocs),
            frees: g(&s.frees),
            bytes_allocated: g(&s.bytes_allocated),
            bytes_freed: g(&s.bytes_freed),
            reused: g(&s.reused),
            chunks_acquired: g(&s.chunks_acquired),
            chunks_returned: g(&s.chunks_returned),
            chunks_reclaimed: g(&s.chunks_reclaimed),
        }
    }
}

/// First index of `n` consecutive free entries.
pub(crate) fn first_fit(table: &[u64], n: usize) -> Option<usize> {
    let mut run = 0;
    for (i, &e) in table.iter().enumerate() {
        if matches!(Entry::decode(e), Entry::Free { .. }) {
            run += 1;
            if run == n {
                return Some(i + 1 - n);
            }
        } else {
            run = 0;
        }
    }
    None
}

// ---------------------------------------------------------------------------
// The public API.

impl<C: Communicator + 'static, U: UltItf> Dsm<C, U> {
    /// Sets up the heap and the globals segment (collective; called once by
    /// [`Dsm::with_config`]).
    pub(super) fn init_memory(&mut self) -> DsmResult<()> {
        if self.space.cfg.heap_size > 0 {
            self.mem.heap = Some(Heap::create(self.space)?);
        }
        self.mem.globals = globals::init(self.space)?;
        Ok(())
    }

    fn heap(&self) -> DsmResult<&Heap<U>> {
        self.mem.heap.as_ref().ok_or_else(|| {
            DsmError::OutOfMemory(
                "the DSM has no heap (heap_size is 0; set MENPS_DSM_HEAP_SIZE)".into(),
            )
        })
    }

    /// Allocates `size` bytes aligned to `align` (a power of two, at most
    /// the chunk size) in the DSM heap; the address is valid in every process
    /// until the object is freed. Not collective: any process may allocate at
    /// any time. The contents are unspecified.
    ///
    /// Objects up to `chunk / 8` bytes (128 KiB with the default heap) take
    /// their size class; larger ones take whole chunks.
    pub fn alloc(&self, size: usize, align: usize) -> DsmResult<*mut u8> {
        let h = self.heap()?;
        h.alloc(self.space, size, align).map(|g| g.addr as *mut u8)
    }

    /// [`Dsm::alloc`], with the first `size` bytes of the object zeroed
    /// (memory never used since start-up is zero already and is not
    /// written).
    pub fn alloc_zeroed(&self, size: usize, align: usize) -> DsmResult<*mut u8> {
        let h = self.heap()?;
        let g = h.alloc(self.space, size, align)?;
        if !g.fresh {
            // SAFETY: the object was just allocated to us: at least `size`
            // bytes of DSM memory (faults are resolved by the DSM) that
            // nobody else may access until we hand the pointer out.
            unsafe { core::ptr::write_bytes(g.addr as *mut u8, 0, size) };
        }
        Ok(g.addr as *mut u8)
    }

    /// Frees the heap object at `ptr` (allocated by any process; see the
    /// [rules](crate::dsm::heap#rules)): this process's writes to it are released
    /// first, then its memory becomes reusable. A pointer that is not the
    /// start of a live heap object gives [`DsmError::InvalidArgument`].
    pub fn free(&self, ptr: *mut u8) -> DsmResult<()> {
        let h = self.heap()?;
        h.free(self.space, ptr as usize)
    }

    /// The usable size of the live heap object at `ptr` (its size class, or
    /// its whole chunks).
    pub fn usable_size(&self, ptr: *const u8) -> DsmResult<usize> {
        let h = self.heap()?;
        h.lookup(&self.space.com, ptr as usize).map(|(_, _, s)| s)
    }

    /// Gives this process's empty chunks back to the chunk table, so that
    /// other processes (and large objects) can use them; returns how many.
    /// The heap also does this now and then, and any process that runs out
    /// of chunks takes back the empty chunks of all.
    pub fn heap_trim(&self) -> DsmResult<usize> {
        let h = self.heap()?;
        self.space.check()?;
        let mut local = h.local.lock();
        h.trim_locked(&self.space.com, &mut local, false)
    }

    /// Heap statistics of this process (zero without a heap).
    pub fn heap_stats(&self) -> HeapStats {
        self.mem.heap.as_ref().map(Heap::stats).unwrap_or_default()
    }

    /// The heap's occupancy, from the chunk table (a snapshot; objects
    /// allocated or freed concurrently may or may not show).
    pub fn heap_usage(&self) -> DsmResult<HeapUsage> {
        let h = self.heap()?;
        h.usage(&self.space.com)
    }

    /// The heap's address range, if the DSM has a heap.
    pub fn heap_range(&self) -> Option<(*mut u8, usize)> {
        self.mem.heap.as_ref().map(|h| (h.base as *mut u8, h.size))
    }
}

/// Base address of the globals segment (fixed).
pub(crate) fn globals_base() -> usize {
    layout::segment_base(GLOBALS_SLOT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_geometric_and_aligned() {
        assert_eq!(SIZE_CLASSES[..6], [16, 32, 48, 64, 96, 128]);
        assert_eq!(SIZE_CLASSES[25], 128 * 1024);
        for w in SIZE_CLASSES.windows(2) {
            assert!(w[0] < w[1]);
            // At most 50 % larger than the previous class.
            assert!(w[1] * 2 <= w[0] * 3 + 32, "{w:?}");
        }
        for c in SIZE_CLASSES {
            assert!(c.is_multiple_of(16), "{c}");
        }
    }

    #[test]
    fn class_selection_respects_size_alignment_and_limit() {
        let max = max_small(1 << 20);
        assert_eq!(max, 128 * 1024);
        let size_of = |i: Option<usize>| i.map(|i| SIZE_CLASSES[i]);
        assert_eq!(size_of(class_index(1, 1, max)), Some(16));
        assert_eq!(size_of(class_index(16, 8, max)), Some(16));
        assert_eq!(size_of(class_index(17, 8, max)), Some(32));
        assert_eq!(size_of(class_index(33, 16, max)), Some(48));
        // 48 is not 32-aligned: the next class that is.
        assert_eq!(size_of(class_index(33, 32, max)), Some(64));
        assert_eq!(size_of(class_index(65, 64, max)), Some(128));
        assert_eq!(size_of(class_index(100_000, 8, max)), Some(128 * 1024));
        assert_eq!(class_index(128 * 1024 + 1, 8, max), None);
        // Small chunks lower the limit.
        assert_eq!(max_small(4096), 512);
        assert_eq!(class_index(513, 8, 512), None);
        assert_eq!(size_of(class_index(512, 512, 512)), Some(512));
        for size in 1..5000 {
            for align in [1, 2, 8, 16, 32, 64, 256] {
                if let Some(i) = class_index(size, align, max) {
                    let c = SIZE_CLASSES[i];
                    assert!(c >= size && c.is_multiple_of(align));
                    // No smaller class would do.
                    assert!(
                        SIZE_CLASSES[..i]
                            .iter()
                            .all(|&d| d < size || !d.is_multiple_of(align))
                    );
                }
            }
        }
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(chunk_size_for(1 << 30), 1 << 20);
        assert_eq!(chunk_size_for(3 << 20), 1 << 20);
        assert_eq!(chunk_size_for(12 * 1024), 4096);
        assert_eq!(chunk_size_for(96 * 1024), 32 * 1024);
        assert_eq!(bitmap_words(1 << 20), 1024);
        assert_eq!(bitmap_words(4096), 4);
    }

    #[test]
    fn bitmap_math() {
        assert_eq!(bit_of(0), (0, 1));
        assert_eq!(bit_of(63), (0, 1 << 63));
        assert_eq!(bit_of(64), (1, 1));
        assert_eq!(bit_of(130), (2, 4));
        assert_eq!(first_clear_bit(0, 64), Some(0));
        assert_eq!(first_clear_bit(0b1011, 64), Some(2));
        assert_eq!(first_clear_bit(u64::MAX, 64), None);
        assert_eq!(first_clear_bit(0b0111, 3), None);
        assert_eq!(first_clear_bit(0b0111, 4), Some(3));
        assert_eq!(first_clear_bit(u64::MAX >> 1, 64), Some(63));
    }

    #[test]
    fn entries_round_trip() {
        for e in [
            Entry::Free { used: false },
            Entry::Free { used: true },
            Entry::Small { class: 0, owner: 0 },
            Entry::Small {
                class: 25,
                owner: 4095,
            },
            Entry::Head { n: 1 },
            Entry::Head { n: 1 << 20 },
            Entry::Tail { head: 0 },
            Entry::Tail { head: 77 },
        ] {
            assert_eq!(Entry::decode(e.encode()), e, "{e:?}");
        }
        assert!(matches!(Entry::decode(2), Entry::Bad(2)));
        assert!(matches!(Entry::decode(K_HEAD << KIND_SHIFT), Entry::Bad(_)));
        assert!(matches!(
            Entry::decode((K_SMALL << KIND_SHIFT) | 26),
            Entry::Bad(_)
        ));
        // The header's active bit and count do not overlap.
        assert_eq!(ACTIVE & COUNT_MASK, 0);
    }

    #[test]
    fn handles_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        fn sync<T: Sync>() {}
        type C = crate::com::ShmCom<ct_worker::OsThreads>;
        send_sync::<Dsm<C>>();
        send_sync::<crate::dsm::DsmBox<'static, u64, C>>();
        send_sync::<crate::dsm::DsmVec<'static, u64, C>>();
        // Globals may hold DSM pointers.
        sync::<crate::dsm::DsmGlobal<*mut u8>>();
    }

    #[test]
    fn first_fit_finds_runs() {
        let s = Entry::Small { class: 1, owner: 0 }.encode();
        let t = [s, E_FRESH, E_USED, s, E_FRESH, E_FRESH, E_USED, s];
        assert_eq!(first_fit(&t, 1), Some(1));
        assert_eq!(first_fit(&t, 2), Some(1));
        assert_eq!(first_fit(&t, 3), Some(4));
        assert_eq!(first_fit(&t, 4), None);
        assert_eq!(first_fit(&[], 1), None);
    }
}
