//! What the control memory holds and where: its header, the per-process
//! slots, the headers of the p2p rings and of the collective scratch
//! slots, the process states, and the offsets of everything ([`Layout`]),
//! computed and validated from the job's sizes.

use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::com::{Error, MAX_MESSAGE_BYTES, Result};
use crate::sys::{self, round_up};

pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"MENPSCT1");
pub(super) const VERSION: u32 = 5;

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

impl<T> core::ops::Deref for Line<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

#[repr(C)]
pub(super) struct Header {
    pub(super) magic: AtomicU64,
    pub(super) version: AtomicU32,
    pub(super) nprocs: AtomicU32,
    pub(super) ring_bytes: AtomicU64,
    pub(super) chunk_bytes: AtomicU64,
    pub(super) total_bytes: AtomicU64,
    /// Processes that have ended so far (numbers their `ended_seq`).
    pub(super) ended: AtomicU32,
    /// Fingerprint of the first failure a process reported
    /// ([`Control::claim_report`](super::Control::claim_report)); 0: none yet.
    pub(super) reported: AtomicU64,
    pub(super) failed: Line<AtomicU64>,
    /// The barrier algorithm of the job (`BarrierKind as u32`), chosen by
    /// the launcher so that every process uses the same.
    pub(super) barrier_kind: AtomicU32,
    /// Central barrier: arrivals so far, over all barriers (each process
    /// adds one per barrier, so barrier `e` is complete at `e × N`).
    pub(super) barrier_arrivals: Line<AtomicU64>,
    /// Central barrier: the number of the latest barrier every process
    /// reached (written by its last arriver).
    pub(super) barrier_release: Line<AtomicU32>,
}

/// Per-process slot. The words written while the job runs — at every
/// barrier, sleep or ring — have lines of their own: every waiting process
/// reads every peer's `state` at each poll (to notice a peer that left),
/// and a line shared with a word its owner stores at every barrier cost
/// each of them a miss per barrier, and the owner's store a miss too.
#[repr(C, align(128))]
pub(crate) struct RankSlot {
    /// One of [`state`].
    pub state: AtomicU32,
    /// Process id (written by the launcher).
    pub pid: AtomicU32,
    /// 1 + how many processes had ended before this one (0 while running).
    pub ended_seq: AtomicU32,
    /// 1 once the process has joined the job (its communicator exists).
    pub joined: AtomicU32,
    /// 1 once the process has reported its own failure
    /// ([`Control::claim_report`](super::Control::claim_report)): a launcher
    /// the program started itself then adds nothing when it ends.
    pub reported: AtomicU32,
    /// Futex word bumped by [`Control::notify`](super::Control::notify).
    pub doorbell: Line<AtomicU32>,
    /// Threads of the process sleeping on the doorbell (or parked until its
    /// watcher sees it ring).
    pub sleepers: Line<AtomicU32>,
    /// Dissemination barrier (`BarrierKind::Dissemination`): word `k` holds the number of the latest
    /// barrier whose round `k` signal reached this process (written by the
    /// peer `2^k` ranks below it).
    pub arrivals: Line<[AtomicU32; BARRIER_ROUNDS]>,
    /// The number of the latest barrier this process passed (a process
    /// that leaves the job right after a barrier did not leave it early).
    pub passed: Line<AtomicU32>,
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
    pub(super) ranks_off: usize,
    pub(super) rings_off: usize,
    pub(super) ring_stride: usize,
    pub(super) scratch_off: usize,
    pub(super) scratch_stride: usize,
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
}
