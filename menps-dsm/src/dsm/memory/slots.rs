//! Slot regions: a region cut into equal slots, each process owning a
//! contiguous share — call stacks of user-level threads, thread-local blocks
//! of team threads.
//!
//! Slot `i` of process `p` is at `base + (p · per_process + i) · stride`,
//! the same address in every process, so a pointer into another process's
//! stack (a variable of the master thread's frame, say) is valid
//! everywhere. A process takes and gives back only its own slots, with no
//! communication.
//!
//! Call stacks have a **guard**: each slot is preceded by a block of the
//! same size that is never mapped accessible (the stride is twice the slot
//! size; address space only). A thread that overflows its DSM stack faults
//! there and the process ends with "stack overflow in user-level thread",
//! instead of writing into the next thread's stack.

use std::sync::Mutex;

use crate::dsm::error::{DsmError, DsmResult};

use super::map::{Region, RegionKind};

/// A region of equal slots, each process owning `per_process` of them.
#[derive(Debug)]
pub struct SlotRegion {
    region: Region,
    slot_size: usize,
    /// Whether a guard block precedes every slot.
    guarded: bool,
    per_process: usize,
    rank: usize,
    nprocs: usize,
    /// Free slots of this process (indices into its share), and which are
    /// taken.
    free: Mutex<Free>,
}

#[derive(Debug)]
struct Free {
    list: Vec<usize>,
    taken: Vec<bool>,
}

impl SlotRegion {
    /// The slot layout of `region` (made for `nprocs × per_process` slots of
    /// `slot_size` bytes, each preceded by a guard block of the same size if
    /// `guarded`).
    pub(crate) fn new(
        region: Region,
        slot_size: usize,
        guarded: bool,
        per_process: usize,
        rank: usize,
        nprocs: usize,
    ) -> Self {
        debug_assert_eq!(
            region.size,
            slot_size * (1 + usize::from(guarded)) * per_process * nprocs
        );
        SlotRegion {
            region,
            slot_size,
            guarded,
            per_process,
            rank,
            nprocs,
            // Lowest slots first.
            free: Mutex::new(Free {
                list: (0..per_process).rev().collect(),
                taken: vec![false; per_process],
            }),
        }
    }

    /// What the region holds ([`RegionKind::Stacks`] or
    /// [`RegionKind::ThreadLocal`]).
    pub fn kind(&self) -> RegionKind {
        self.region.kind
    }

    /// The whole region.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Bytes of one slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Slots each process owns.
    pub fn slots_per_process(&self) -> usize {
        self.per_process
    }

    /// Slots of this process taken now.
    pub fn taken(&self) -> usize {
        let f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        self.per_process - f.list.len()
    }

    /// Bytes from one slot to the next.
    fn stride(&self) -> usize {
        self.slot_size * (1 + usize::from(self.guarded))
    }

    /// Bytes of the guard block before each slot (0: no guards).
    fn guard(&self) -> usize {
        if self.guarded { self.slot_size } else { 0 }
    }

    /// [`SlotRegion::guard`], for the space's stack bounds.
    pub(crate) fn guard_bytes(&self) -> usize {
        self.guard()
    }

    /// This process's rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Address of slot `index` of process `rank`.
    pub fn slot(&self, rank: usize, index: usize) -> Option<*mut u8> {
        (rank < self.nprocs && index < self.per_process).then(|| {
            (self.region.base + (rank * self.per_process + index) * self.stride() + self.guard())
                as *mut u8
        })
    }

    /// The owner and index of the slot holding `addr` (`None` outside the
    /// slots, guard blocks included).
    pub fn owner_of(&self, addr: *const u8) -> Option<(usize, usize)> {
        let a = addr as usize;
        if !self.region.contains(a) {
            return None;
        }
        let off = a - self.region.base;
        let s = off / self.stride();
        (off % self.stride() >= self.guard()).then(|| (s / self.per_process, s % self.per_process))
    }

    /// Whether `addr` lies in a guard block.
    pub fn is_guard(&self, addr: *const u8) -> bool {
        let a = addr as usize;
        self.guarded
            && self.region.contains(a)
            && (a - self.region.base) % self.stride() < self.guard()
    }

    /// Takes a free slot of this process; its memory keeps whatever the
    /// slot's previous user left.
    pub fn take(&self) -> DsmResult<*mut u8> {
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let i = f.list.pop().ok_or_else(|| {
            DsmError::OutOfMemory(format!(
                "all {} slots of the {} of process {} are taken (raise the count per process)",
                self.per_process, self.region.kind, self.rank
            ))
        })?;
        f.taken[i] = true;
        Ok(self.slot(self.rank, i).expect("own slot"))
    }

    /// Gives back a slot [`SlotRegion::take`] returned.
    pub fn give_back(&self, slot: *mut u8) -> DsmResult<()> {
        let bad = || {
            DsmError::InvalidArgument(format!(
                "{slot:p} is not a taken slot of the {} of process {}",
                self.region.kind, self.rank
            ))
        };
        let (rank, i) = self.owner_of(slot).ok_or_else(bad)?;
        if rank != self.rank || self.slot(rank, i) != Some(slot) {
            return Err(bad());
        }
        let mut f = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if !f.taken[i] {
            return Err(bad());
        }
        f.taken[i] = false;
        f.list.push(i);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(n: usize) -> SlotRegion {
        let r = Region {
            kind: RegionKind::Stacks,
            base: 1 << 40,
            size: 3 * n * 8192,
            block_size: 8192,
            id: 124,
        };
        SlotRegion::new(r, 8192, false, n, 1, 3)
    }

    #[test]
    fn guarded_slots_skip_their_guard_blocks() {
        let r = Region {
            kind: RegionKind::Stacks,
            base: 1 << 40,
            size: 2 * 2 * 2 * 8192,
            block_size: 8192,
            id: 124,
        };
        let s = SlotRegion::new(r, 8192, true, 2, 0, 2);
        let a = s.take().unwrap() as usize;
        assert_eq!(a, (1 << 40) + 8192, "after the first guard block");
        let b = s.take().unwrap() as usize;
        assert_eq!(b, (1 << 40) + 3 * 8192);
        assert!(s.is_guard((a - 1) as *const u8));
        assert!(s.is_guard((1usize << 40) as *const u8));
        assert!(!s.is_guard(a as *const u8));
        assert!(!s.is_guard((a + 8191) as *const u8));
        assert_eq!(s.owner_of((a - 1) as *const u8), None);
        assert_eq!(s.owner_of((b + 100) as *const u8), Some((0, 1)));
        assert_eq!(s.slot(1, 0), Some(((1usize << 40) + 5 * 8192) as *mut u8));
    }

    #[test]
    fn slots_are_per_process_and_reused() {
        let s = region(2);
        let a = s.take().unwrap();
        let b = s.take().unwrap();
        assert_eq!(a as usize, (1 << 40) + 2 * 8192, "process 1's first slot");
        assert_eq!(b as usize, (1 << 40) + 3 * 8192);
        assert_eq!(s.owner_of(a), Some((1, 0)));
        assert_eq!(s.owner_of(b.wrapping_add(100)), Some((1, 1)));
        let e = s.take().unwrap_err();
        assert!(
            e.to_string().contains("all 2 slots of the stack region"),
            "{e}"
        );
        assert_eq!(s.taken(), 2);
        s.give_back(a).unwrap();
        assert!(s.give_back(a).is_err(), "double give-back");
        assert!(
            s.give_back(s.slot(0, 0).unwrap()).is_err(),
            "another process's slot"
        );
        assert!(s.give_back(b.wrapping_add(8)).is_err(), "inside a slot");
        assert_eq!(s.take().unwrap(), a);
        assert_eq!(s.slot(3, 0), None);
    }
}
