//! The control memory of a shm job: one `memfd` created by the launcher,
//! inherited by every process and mapped `MAP_SHARED`.
//!
//! Layout (all offsets page- or line-aligned; the memfd starts zero-filled,
//! and zero is a valid value of every atomic in it):
//!
//! ```text
//! header      magic, version, nprocs, sizes; `failed` (0, or 1 + first dead rank)
//! ranks[N]    per process: state (running / exited / died), pid,
//!             doorbell (futex word) and sleeper count, the dissemination
//!             barrier's arrival words
//! rings[N×N]  p2p byte ring from s to r: head, tail (own lines), data
//! scratch     2 parities × N slots of {header, chunk bytes} for collectives
//! ```
//!
//! **Doorbells.** A thread that has to wait for another process (message,
//! ring space, barrier, window descriptor) spins briefly, yields, and then
//! sleeps on its process's doorbell with a short futex timeout. Whoever
//! changes what it waits for calls `Control::notify`: a `SeqCst` fence,
//! then a bump and `FUTEX_WAKE` only if the target has sleepers. The sleeper
//! increments its sleeper count, fences, reads the doorbell and re-checks its
//! condition before `FUTEX_WAIT` on the value read, so a wake-up cannot be
//! lost (store-buffer pattern with fences on both sides). The launcher rings
//! every doorbell when a process ends.
//!
//! A user-level thread does not sleep its worker in `FUTEX_WAIT`: it counts
//! itself a sleeper, reads the doorbell and re-checks alike, then parks, and
//! the communicator's doorbell watcher (an OS thread) sleeps on the futex in
//! its place and wakes it (`shm::bell`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use crate::com::{Error, MAX_MESSAGE_BYTES, Result};
use crate::sys::{self, Mapping, round_up};

const MAGIC: u64 = u64::from_le_bytes(*b"MENPSCT1");
const VERSION: u32 = 3;

/// Largest supported process count.
pub const MAX_PROCS: usize = 256;
/// Default p2p ring size per ordered pair of processes.
pub const DEFAULT_RING_BYTES: usize = 128 * 1024;
/// Default collective chunk size per process.
pub const DEFAULT_CHUNK_BYTES: usize = 64 * 1024;

/// Process states in [`RankSlot::state`].
pub(crate) mod state {
    /// Started (or starting) and not ended.
    pub const RUNNING: u32 = 0;
    /// Exited with status 0.
    pub const EXITED: u32 = 1;
    /// Crashed, killed or exited non-zero.
    pub const DIED: u32 = 2;
}

/// A value alone on its (pair of) cache line(s).
#[repr(C, align(128))]
pub(crate) struct Line<T>(pub T);

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    nprocs: AtomicU32,
    ring_bytes: AtomicU64,
    chunk_bytes: AtomicU64,
    total_bytes: AtomicU64,
    /// Processes that have ended so far (numbers their `ended_seq`).
    ended: AtomicU32,
    /// Fingerprint of the first failure a process reported
    /// ([`Control::claim_report`]); 0: none yet.
    reported: AtomicU64,
    failed: Line<AtomicU64>,
}

/// Per-process slot.
#[repr(C, align(128))]
pub(crate) struct RankSlot {
    /// One of [`state`].
    pub state: AtomicU32,
    /// Process id (written by the launcher).
    pub pid: AtomicU32,
    /// Futex word bumped by [`Control::notify`].
    pub doorbell: AtomicU32,
    /// Threads of the process sleeping on the doorbell (or parked until its
    /// watcher sees it ring).
    pub sleepers: AtomicU32,
    /// 1 + how many processes had ended before this one (0 while running).
    pub ended_seq: AtomicU32,
    /// 1 once the process has joined the job (its communicator exists).
    pub joined: AtomicU32,
    /// 1 once the process has reported its own failure
    /// ([`Control::claim_report`]): a launcher the program started itself
    /// then adds nothing when it ends.
    pub reported: AtomicU32,
    /// Dissemination barrier: word `k` holds the number of the latest
    /// barrier whose round `k` signal reached this process (written by the
    /// peer `2^k` ranks below it).
    pub arrivals: [AtomicU32; BARRIER_ROUNDS],
    /// The number of the latest barrier this process passed (a process
    /// that leaves the job right after a barrier did not leave it early).
    pub passed: AtomicU32,
}

/// Rounds of the dissemination barrier for [`MAX_PROCS`] processes.
pub(crate) const BARRIER_ROUNDS: usize = MAX_PROCS.trailing_zeros() as usize;

/// Head (written by the sender) and tail (written by the receiver) of a p2p
/// ring, as byte counts since the start; the data follows the header.
#[repr(C)]
pub(crate) struct RingHdr {
    pub head: Line<AtomicU64>,
    pub tail: Line<AtomicU64>,
}

/// Header of one collective scratch slot.
#[repr(C, align(64))]
pub(crate) struct ScratchHdr {
    /// Which collective wrote the slot.
    pub op: AtomicU64,
    /// Total length the process passed.
    pub len: AtomicU64,
    /// Root the process passed (broadcast), or an operation-specific word.
    pub root: AtomicU64,
}

/// Offsets of everything in the control memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub nprocs: usize,
    pub ring_bytes: usize,
    pub chunk_bytes: usize,
    ranks_off: usize,
    rings_off: usize,
    ring_stride: usize,
    scratch_off: usize,
    scratch_stride: usize,
    pub total: usize,
}

impl Layout {
    /// Computes the layout, validating the sizes.
    pub fn new(nprocs: usize, ring_bytes: usize, chunk_bytes: usize) -> Result<Layout> {
        if nprocs == 0 || nprocs > MAX_PROCS {
            return Err(Error::BadConfig(format!(
                "process count {nprocs} is out of range 1..={MAX_PROCS}"
            )));
        }
        if !ring_bytes.is_power_of_two() || !(2 * MAX_MESSAGE_BYTES..=1 << 30).contains(&ring_bytes)
        {
            return Err(Error::BadConfig(format!(
                "p2p ring size {ring_bytes} must be a power of two between {} and 1 GiB \
                 (MENPS_RING_BYTES)",
                2 * MAX_MESSAGE_BYTES
            )));
        }
        if !chunk_bytes.is_multiple_of(64) || !(4096..=1 << 26).contains(&chunk_bytes) {
            return Err(Error::BadConfig(format!(
                "collective chunk size {chunk_bytes} must be a multiple of 64 between 4096 and \
                 64 MiB (MENPS_COLL_CHUNK_BYTES)"
            )));
        }
        let page = sys::page_size();
        let too_big = || Error::BadConfig("control memory size overflows".into());
        let ranks_off = round_up(size_of::<Header>(), page).ok_or_else(too_big)?;
        let rings_off =
            round_up(ranks_off + nprocs * size_of::<RankSlot>(), page).ok_or_else(too_big)?;
        let ring_stride = round_up(size_of::<RingHdr>() + ring_bytes, page).ok_or_else(too_big)?;
        let scratch_off = nprocs
            .checked_mul(nprocs)
            .and_then(|n| n.checked_mul(ring_stride))
            .and_then(|n| n.checked_add(rings_off))
            .ok_or_else(too_big)?;
        let scratch_stride = size_of::<ScratchHdr>() + chunk_bytes;
        let total = (2 * nprocs)
            .checked_mul(scratch_stride)
            .and_then(|n| n.checked_add(scratch_off))
            .and_then(|n| round_up(n, page))
            .ok_or_else(too_big)?;
        Ok(Layout {
            nprocs,
            ring_bytes,
            chunk_bytes,
            ranks_off,
            rings_off,
            ring_stride,
            scratch_off,
            scratch_stride,
            total,
        })
    }
}

/// A mapped control memory.
#[derive(Debug)]
pub(crate) struct Control {
    map: Mapping,
    layout: Layout,
}

/// A p2p ring as seen from one process.
pub(crate) struct Ring<'a> {
    pub hdr: &'a RingHdr,
    pub data: *mut u8,
    pub cap: usize,
}

impl Control {
    /// Creates the control memory of a new job (the launcher does this);
    /// returns it and its descriptor, to be inherited by the processes.
    pub fn create(
        nprocs: usize,
        ring_bytes: usize,
        chunk_bytes: usize,
    ) -> Result<(Control, OwnedFd)> {
        let layout = Layout::new(nprocs, ring_bytes, chunk_bytes)?;
        let fd = sys::memfd(c"menps-control", layout.total)?;
        let map = Mapping::shared(fd.as_fd(), layout.total)?;
        let c = Control { map, layout };
        let h = c.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.nprocs.store(nprocs as u32, Ordering::Relaxed);
        h.ring_bytes.store(ring_bytes as u64, Ordering::Relaxed);
        h.chunk_bytes.store(chunk_bytes as u64, Ordering::Relaxed);
        h.total_bytes.store(layout.total as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok((c, fd))
    }

    /// Maps the control memory of the job this process belongs to.
    pub fn attach(fd: BorrowedFd<'_>, nprocs: usize) -> Result<Control> {
        Self::attach_prefix(fd, nprocs, false)
    }

    /// Maps the header and the rank slots of the control memory of the job
    /// this process belongs to (not the rings and scratch areas): for
    /// [`Control::claim_report`] and [`Control::slot`] only.
    pub fn attach_slots(fd: BorrowedFd<'_>, nprocs: usize) -> Result<Control> {
        Self::attach_prefix(fd, nprocs, true)
    }

    /// [`Control::attach`], or [`Control::attach_slots`] if `slots_only`.
    fn attach_prefix(fd: BorrowedFd<'_>, nprocs: usize, slots_only: bool) -> Result<Control> {
        let len = sys::file_size(fd)?;
        let bad = |what: &str| {
            Error::BadConfig(format!(
                "the control memory passed by the launcher is not valid ({what}); \
                 was this process started by the menps launcher of the same version?"
            ))
        };
        if len < size_of::<Header>() {
            return Err(bad("too small"));
        }
        let map = Mapping::shared(fd, len)?;
        // SAFETY: the mapping is at least a header long and page-aligned.
        let h = unsafe { &*(map.ptr() as *const Header) };
        if h.magic.load(Ordering::Acquire) != MAGIC || h.version.load(Ordering::Relaxed) != VERSION
        {
            return Err(bad("wrong magic or version"));
        }
        let n = h.nprocs.load(Ordering::Relaxed) as usize;
        if n != nprocs {
            return Err(bad(&format!(
                "it is for {n} processes, MENPS_SIZE says {nprocs}"
            )));
        }
        let layout = Layout::new(
            n,
            h.ring_bytes.load(Ordering::Relaxed) as usize,
            h.chunk_bytes.load(Ordering::Relaxed) as usize,
        )?;
        if layout.total != len || h.total_bytes.load(Ordering::Relaxed) as usize != len {
            return Err(bad("size does not match its header"));
        }
        let map = if slots_only {
            // Header and rank slots: the first pages.
            Mapping::shared(fd, layout.rings_off)?
        } else {
            map
        };
        Ok(Control { map, layout })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// A reference to a `T` at `off`.
    fn at<T>(&self, off: usize) -> &T {
        debug_assert!(off + size_of::<T>() <= self.map.len());
        debug_assert_eq!(off % align_of::<T>(), 0);
        // SAFETY: every caller passes an offset from the validated layout, so
        // the object lies inside the mapping and is aligned; the types are
        // made of atomics, for which the zero-filled or concurrently updated
        // shared memory is always a valid value.
        unsafe { &*(self.map.ptr().add(off) as *const T) }
    }

    fn header(&self) -> &Header {
        self.at(0)
    }

    /// The slot of process `r`.
    pub fn slot(&self, r: usize) -> &RankSlot {
        assert!(r < self.layout.nprocs);
        self.at(self.layout.ranks_off + r * size_of::<RankSlot>())
    }

    /// 0 while every process is alive; otherwise 1 + the rank that died first.
    pub fn failed_word(&self) -> &AtomicU64 {
        &self.header().failed.0
    }

    /// The rank that died first, if any.
    pub fn failed_rank(&self) -> Option<usize> {
        match self.failed_word().load(Ordering::Acquire) {
            0 => None,
            r => Some(r as usize - 1),
        }
    }

    /// The ring from process `s` to process `r`.
    pub fn ring(&self, s: usize, r: usize) -> Ring<'_> {
        let n = self.layout.nprocs;
        assert!(s < n && r < n);
        let off = self.layout.rings_off + (s * n + r) * self.layout.ring_stride;
        Ring {
            hdr: self.at(off),
            // SAFETY: the ring's data follows its header inside the mapping.
            data: unsafe { self.map.ptr().add(off + size_of::<RingHdr>()) },
            cap: self.layout.ring_bytes,
        }
    }

    /// Scratch slot of process `r` in buffer `parity` (0 or 1): its header
    /// and `chunk_bytes` of data.
    pub fn scratch(&self, parity: usize, r: usize) -> (&ScratchHdr, *mut u8) {
        let n = self.layout.nprocs;
        assert!(parity < 2 && r < n);
        let off = self.layout.scratch_off + (parity * n + r) * self.layout.scratch_stride;
        // SAFETY: the slot's data follows its header inside the mapping.
        let data = unsafe { self.map.ptr().add(off + size_of::<ScratchHdr>()) };
        (self.at(off), data)
    }

    /// Wakes process `r`'s sleeping threads, if any, after the caller has
    /// published what they wait for (see the module docs).
    pub fn notify(&self, r: usize) {
        fence(Ordering::SeqCst);
        let s = self.slot(r);
        if s.sleepers.load(Ordering::Relaxed) > 0 {
            s.doorbell.fetch_add(1, Ordering::SeqCst);
            sys::futex_wake_all(&s.doorbell);
        }
    }

    /// Rings every doorbell unconditionally (the launcher, after a process
    /// ended).
    pub fn ring_all(&self) {
        fence(Ordering::SeqCst);
        for r in 0..self.layout.nprocs {
            let s = self.slot(r);
            s.doorbell.fetch_add(1, Ordering::SeqCst);
            sys::futex_wake_all(&s.doorbell);
        }
    }

    /// Process `r` is about to report a failure whose text has fingerprint
    /// `fp` (non-zero): records that it reported, and returns whether the
    /// report should be written — `false` if another process of the job
    /// already reported the same text (a failure every process hits alike
    /// is reported once).
    pub fn claim_report(&self, r: usize, fp: u64) -> bool {
        self.slot(r).reported.store(1, Ordering::SeqCst);
        match self
            .header()
            .reported
            .compare_exchange(0, fp, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => true,
            Err(first) => first != fp,
        }
    }

    /// Records that process `r` ended (the launcher): `ok` for exit status
    /// 0. A failure also sets the job's `failed` word if it is the first.
    ///
    /// Idempotent: the launcher and the process's peers (which watch it
    /// themselves, in case the launcher cannot) may both report it.
    pub fn mark_ended(&self, r: usize, ok: bool) {
        let s = self.slot(r);
        if s.state.load(Ordering::SeqCst) != state::RUNNING {
            return;
        }
        let seq = self.header().ended.fetch_add(1, Ordering::SeqCst) + 1;
        s.ended_seq.store(seq, Ordering::SeqCst);
        if ok {
            s.state.store(state::EXITED, Ordering::SeqCst);
        } else {
            // The failure first: a waiter that sees the process gone must
            // already see that it died (PeerDied, not PeerExited).
            let _ = self.failed_word().compare_exchange(
                0,
                r as u64 + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            s.state.store(state::DIED, Ordering::SeqCst);
        }
        self.ring_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_validation() {
        assert!(Layout::new(0, DEFAULT_RING_BYTES, DEFAULT_CHUNK_BYTES).is_err());
        assert!(Layout::new(MAX_PROCS + 1, DEFAULT_RING_BYTES, DEFAULT_CHUNK_BYTES).is_err());
        assert!(Layout::new(2, 100_000, DEFAULT_CHUNK_BYTES).is_err());
        assert!(Layout::new(2, 64 * 1024, DEFAULT_CHUNK_BYTES).is_err());
        assert!(Layout::new(2, DEFAULT_RING_BYTES, 100).is_err());
        let l = Layout::new(4, DEFAULT_RING_BYTES, DEFAULT_CHUNK_BYTES).unwrap();
        assert_eq!(l.total % sys::page_size(), 0);
        assert!(l.total >= 16 * DEFAULT_RING_BYTES + 8 * DEFAULT_CHUNK_BYTES);
    }

    #[test]
    fn create_attach_and_mark() {
        let (c, fd) = Control::create(3, DEFAULT_RING_BYTES, DEFAULT_CHUNK_BYTES).unwrap();
        let d = Control::attach(fd.as_fd(), 3).unwrap();
        assert_eq!(d.layout(), c.layout());
        assert!(Control::attach(fd.as_fd(), 2).is_err());
        assert_eq!(d.failed_rank(), None);
        c.mark_ended(1, true);
        assert_eq!(d.slot(1).state.load(Ordering::SeqCst), state::EXITED);
        assert_eq!(d.failed_rank(), None);
        c.mark_ended(2, false);
        c.mark_ended(0, false);
        assert_eq!(d.failed_rank(), Some(2));
        // The two mappings are the same memory.
        d.ring(0, 1).hdr.head.0.store(77, Ordering::SeqCst);
        assert_eq!(c.ring(0, 1).hdr.head.0.load(Ordering::SeqCst), 77);
    }
}
