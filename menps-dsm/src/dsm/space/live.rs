//! Which parts of this process's call stacks can hold live data.
//!
//! Below a thread's stack pointer nothing is live: the frames there have
//! returned. A release fence therefore need not publish a stack block that
//! lies wholly below the stack pointer of the thread using the stack — one
//! switched away from (its saved context marks the spot), a finished one
//! (nothing is live), or the thread running the release itself (its
//! current stack pointer). Such blocks stay in the write set, so that what
//! a later frame writes there is published once it is live again; only
//! the merge (a comparison with the twin and a transaction per block, most
//! of a barrier's cost for a deep stack) is skipped. The stacks of threads
//! that run meanwhile on other workers count as live in full.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::dsm::memory::SlotRegion;

/// The live bounds of this process's stack slots.
pub(crate) struct StackLive {
    /// Start of this process's first slot's stride (guard included).
    first: usize,
    stride: usize,
    guard: usize,
    slot_size: usize,
    /// Coherence block size of the stacks.
    block_size: usize,
    /// Per slot: the lowest address that may hold live data.
    lows: Box<[AtomicUsize]>,
    /// Per slot: while the thread on it is inside the runtime, the lowest
    /// address of its *program's* frames (0: none set). What lies below is
    /// the runtime's own frames, which no other thread reads.
    floors: Box<[AtomicUsize]>,
}

impl StackLive {
    /// Bounds for this process's slots of `slots`, all live at first.
    pub(crate) fn new(slots: &SlotRegion) -> Option<Self> {
        let n = slots.slots_per_process();
        let first = slots.slot(slots.rank(), 0)? as usize;
        let stride = if n > 1 {
            slots.slot(slots.rank(), 1)? as usize - first
        } else {
            0
        };
        let guard = slots.guard_bytes();
        Some(StackLive {
            first: first - guard,
            stride: stride.max(slots.slot_size() + guard),
            guard,
            slot_size: slots.slot_size(),
            block_size: slots.region().block_size,
            lows: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            floors: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// The slot of ours holding `addr`, with its bounds.
    fn slot_of(&self, addr: usize) -> Option<(usize, usize, usize)> {
        let off = addr.checked_sub(self.first)?;
        let i = off / self.stride;
        let lo = self.first + i * self.stride + self.guard;
        (i < self.lows.len() && addr >= lo).then(|| (i, lo, lo + self.slot_size))
    }

    /// Records that below `low` nothing of the stack holding `addr` is live
    /// (`usize::MAX`: none of it; 0: all of it). No-op outside our slots.
    pub(crate) fn set_low(&self, addr: usize, low: usize) {
        if let Some((i, _, _)) = self.slot_of(addr) {
            self.lows[i].store(low, Ordering::Release);
        }
    }

    /// Records that the thread on the stack holding `addr` is inside the
    /// runtime and its program's frames end at `floor`, unless an outer
    /// entry into the runtime marked them ending higher (the runtime calls
    /// itself through its public entry points: the higher mark stays).
    /// Returns the mark before (0: none), for [`Self::restore_floor`]; 0
    /// outside our slots, where nothing is recorded.
    pub(crate) fn raise_floor(&self, addr: usize, floor: usize) -> usize {
        match self.slot_of(addr) {
            Some((i, _, _)) => {
                // Only the thread running on this stack changes its mark.
                let prev = self.floors[i].load(Ordering::Acquire);
                self.floors[i].store(prev.max(floor), Ordering::Release);
                prev
            }
            None => 0,
        }
    }

    /// Puts back the mark [`Self::raise_floor`] returned, as the thread
    /// leaves that entry into the runtime (0: it left the runtime).
    pub(crate) fn restore_floor(&self, addr: usize, prev: usize) {
        if let Some((i, _, _)) = self.slot_of(addr) {
            self.floors[i].store(prev, Ordering::Release);
        }
    }

    /// The lowest address of the stack holding `addr` that may hold live
    /// data, for a release run by a thread whose stack pointer is `sp`
    /// (`None` outside our slots).
    fn live_low(&self, addr: usize, sp: usize) -> Option<usize> {
        let (i, lo, hi) = self.slot_of(addr)?;
        let low = if (lo..hi).contains(&sp) {
            sp
        } else {
            self.lows[i].load(Ordering::Acquire)
        };
        Some(low.max(self.floors[i].load(Ordering::Acquire)))
    }

    /// Whether the block at `addr` lies wholly in dead stack memory, for a
    /// release run by a thread whose stack pointer is `sp` (one block;
    /// releases use [`Self::dead_test`], which the tests check against this).
    #[cfg(test)]
    fn is_dead(&self, addr: usize, sp: usize) -> bool {
        self.live_low(addr, sp)
            .is_some_and(|low| addr + self.block_size <= low)
    }

    /// [`Self::is_dead`] for many blocks, for a release run by a thread
    /// whose stack pointer is `sp`: the bounds of the last slot asked about
    /// are kept, so blocks of one stack in a row cost a comparison each.
    pub(crate) fn dead_test(&self, sp: usize) -> impl FnMut(usize) -> bool + '_ {
        // (slot start, slot end, lowest live address) of the last slot.
        let mut last: Option<(usize, usize, usize)> = None;
        move |addr| {
            let low = match last {
                Some((lo, hi, low)) if (lo..hi).contains(&addr) => low,
                _ => match self.slot_of(addr) {
                    Some((_, lo, hi)) => {
                        let low = self.live_low(addr, sp).unwrap_or(0);
                        last = Some((lo, hi, low));
                        low
                    }
                    None => return false,
                },
            };
            addr + self.block_size <= low
        }
    }

    /// How many bytes at the start of the block at `addr` are dead stack
    /// memory (a multiple of 8; 0 outside our slots), for a release run by
    /// a thread whose stack pointer is `sp`.
    pub(crate) fn dead_prefix(&self, addr: usize, sp: usize) -> usize {
        self.live_low(addr, sp).map_or(0, |low| {
            (low.saturating_sub(addr) & !7).min(self.block_size)
        })
    }
}

/// The caller's stack pointer, about.
#[inline(always)]
pub(crate) fn stack_pointer() -> usize {
    let here = 0u8;
    core::hint::black_box(&here) as *const u8 as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> StackLive {
        // Two slots of 64 KiB after 64 KiB guards, from 0x10_0000.
        StackLive {
            first: 0x10_0000,
            stride: 0x2_0000,
            guard: 0x1_0000,
            slot_size: 0x1_0000,
            block_size: 0x2000,
            lows: (0..2).map(|_| AtomicUsize::new(0)).collect(),
            floors: (0..2).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    #[test]
    fn blocks_below_a_recorded_low_are_dead() {
        let l = live();
        let slot1 = 0x10_0000 + 0x2_0000 + 0x1_0000;
        assert!(!l.is_dead(slot1, 0), "all live at first");
        l.set_low(slot1 + 0x8000, slot1 + 0x5000);
        assert!(l.is_dead(slot1, 0));
        assert!(l.is_dead(slot1 + 0x2000, 0), "ends at 0x4000");
        assert!(!l.is_dead(slot1 + 0x4000, 0), "holds the low");
        l.set_low(slot1, usize::MAX);
        assert!(l.is_dead(slot1 + 0xe000, 0), "finished: all dead");
        l.set_low(slot1, 0);
        assert!(!l.is_dead(slot1, 0));
    }

    #[test]
    fn the_releasing_thread_uses_its_own_stack_pointer() {
        let l = live();
        let slot0 = 0x10_0000 + 0x1_0000;
        // Recorded as running (all live), but the release runs on it.
        assert!(l.is_dead(slot0, slot0 + 0x3000));
        assert!(!l.is_dead(slot0 + 0x2000, slot0 + 0x3000));
        // Another slot's stack pointer says nothing about this one.
        assert!(!l.is_dead(slot0, slot0 + 0x2_0000 + 0x3000));
    }

    #[test]
    fn a_floor_hides_the_runtime_frames_below_the_program() {
        let l = live();
        let slot0 = 0x10_0000 + 0x1_0000;
        // The thread runs deep in the runtime (sp at 0x1000), its program's
        // frames end at 0x5100.
        let sp = slot0 + 0x1000;
        assert!(!l.is_dead(slot0, sp));
        assert_eq!(l.raise_floor(slot0 + 0x100, slot0 + 0x5100), 0);
        assert!(l.is_dead(slot0, sp));
        assert!(l.is_dead(slot0 + 0x2000, sp));
        assert!(!l.is_dead(slot0 + 0x4000, sp));
        assert_eq!(l.dead_prefix(slot0 + 0x4000, sp), 0x1100);
        assert_eq!(l.dead_prefix(slot0 + 0x6000, sp), 0);
        assert_eq!(l.dead_prefix(slot0, sp), 0x2000);
        // The runtime enters itself again deeper down: the program's mark
        // stays, and comes back when the inner entry is left.
        let outer = l.raise_floor(slot0 + 0x100, slot0 + 0x3000);
        assert_eq!(outer, slot0 + 0x5100);
        assert_eq!(l.dead_prefix(slot0 + 0x4000, sp), 0x1100);
        l.restore_floor(slot0, outer);
        assert_eq!(l.dead_prefix(slot0 + 0x4000, sp), 0x1100);
        // Back in the program.
        l.restore_floor(slot0, 0);
        assert_eq!(l.dead_prefix(slot0, sp), 0x1000);
        assert!(!l.is_dead(slot0, sp));
        assert_eq!(l.dead_prefix(0x1000, sp), 0, "outside our slots");
    }

    #[test]
    fn the_dead_test_agrees_with_is_dead() {
        let l = live();
        let slot0 = 0x10_0000 + 0x1_0000;
        let slot1 = slot0 + 0x2_0000;
        l.set_low(slot1 + 0x100, slot1 + 0x6000);
        l.raise_floor(slot0, slot0 + 0x3000);
        let sp = slot0 + 0x1000;
        let mut t = l.dead_test(sp);
        // Back and forth between the slots, the guards and outside.
        let addrs = [
            slot0,
            slot0 + 0x2000,
            slot1,
            slot1 + 0x4000,
            slot0 + 0x4000,
            slot1 + 0x6000,
            0x10_0000,
            slot1 + 0x2000,
            0x1000,
            slot0 + 0xe000,
        ];
        for a in addrs {
            assert_eq!(t(a), l.is_dead(a, sp), "block {a:#x}");
        }
    }

    #[test]
    fn memory_outside_our_slots_is_never_dead() {
        let l = live();
        l.set_low(0x10_0000 + 0x1_0000, usize::MAX);
        assert!(!l.is_dead(0x10_0000, 0), "a guard block");
        assert!(
            !l.is_dead(0x10_0000 + 0x4_0000 + 0x1_0000, 0),
            "past our slots"
        );
        assert!(!l.is_dead(0x1000, 0), "below the region");
    }
}
