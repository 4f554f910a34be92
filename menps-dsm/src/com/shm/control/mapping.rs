//! The mapped control memory ([`Control`]): created by the launcher,
//! attached by the job's processes, and the views of its parts (header,
//! process slots, p2p rings, collective scratch slots).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::layout::{Header, Layout, MAGIC, RankSlot, RingHdr, ScratchHdr, VERSION};
use crate::com::shm::coll::BarrierKind;
use crate::com::{Error, Result};
use crate::sys::{self, Mapping};

/// A mapped control memory.
#[derive(Debug)]
pub(crate) struct Control {
    map: Mapping,
    pub(super) layout: Layout,
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
        let barrier = BarrierKind::configured(nprocs)?;
        let fd = sys::memfd(c"menps-control", layout.total)?;
        let map = Mapping::shared(fd.as_fd(), layout.total)?;
        let c = Control { map, layout };
        let h = c.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.nprocs.store(nprocs as u32, Ordering::Relaxed);
        h.ring_bytes.store(ring_bytes as u64, Ordering::Relaxed);
        h.chunk_bytes.store(chunk_bytes as u64, Ordering::Relaxed);
        h.total_bytes.store(layout.total as u64, Ordering::Relaxed);
        h.barrier_kind.store(barrier as u32, Ordering::Relaxed);
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
        if BarrierKind::from_word(h.barrier_kind.load(Ordering::Relaxed)).is_none() {
            return Err(bad("unknown barrier algorithm"));
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

    pub(super) fn header(&self) -> &Header {
        self.at(0)
    }

    /// The slot of process `r`.
    pub fn slot(&self, r: usize) -> &RankSlot {
        assert!(r < self.layout.nprocs);
        self.at(self.layout.ranks_off + r * size_of::<RankSlot>())
    }

    /// 0 while every process is alive; otherwise 1 + the rank that died first.
    /// The job's barrier algorithm (checked by `attach`).
    pub fn barrier_kind(&self) -> BarrierKind {
        BarrierKind::from_word(self.header().barrier_kind.load(Ordering::Relaxed))
            .unwrap_or(BarrierKind::Dissemination)
    }

    /// The central barrier's arrival counter and release word.
    pub fn barrier_words(&self) -> (&AtomicU64, &AtomicU32) {
        let h = self.header();
        (&h.barrier_arrivals.0, &h.barrier_release.0)
    }

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
}

#[cfg(test)]
mod tests {
    use super::super::layout::{DEFAULT_CHUNK_BYTES, DEFAULT_RING_BYTES, state};
    use super::*;

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
