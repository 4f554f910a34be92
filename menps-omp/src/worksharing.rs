//! The team's shared counters for work-sharing constructs that hand out
//! work at run time (dynamic and guided loops, `single`, `ordered`).
//!
//! They are not DSM memory: a DSM atomic takes a distributed lock and a
//! coherence transaction, while these counters need atomicity only (what the
//! constructs' code writes is published by barriers and DSM mutexes). They
//! live in a window of process 0 and are updated with the communication
//! layer's remote atomics — a native atomic on the embedded `shm` backend,
//! one `MPI_Fetch_and_op` under MPI.
//!
//! Every thread numbers the constructs it meets (all threads of a team meet
//! the same ones, in the same order); construct `s` uses slot `s % SLOTS`,
//! round `s / SLOTS`. A slot's words: the round it serves, the next
//! iteration to hand out, the threads done with it, and the ordered turn.
//! The last thread to finish a construct resets the slot and opens its next
//! round, so a thread that runs ahead through `nowait` constructs waits only
//! if it laps the ring.

use menps_dsm::com::{Coll, RemotePtr, Rma, WindowId, Windows};
use menps_dsm::dsm::allocator::RuntimeGuard;

use crate::error::{Error, fail};
use crate::runtime::ProgramDsm;
use crate::wait::Waiter;

/// Slots of the ring: how far a thread may run ahead through `nowait`
/// constructs before it waits for the slowest.
pub const SLOTS: u64 = 64;
const WORDS: u64 = 4;
const ROUND: u64 = 0;
/// Word of a slot: the next iteration (or `single` arrival) to hand out.
pub const NEXT: u64 = 1;
const DONE: u64 = 2;
/// Word of a slot: the ordered turn (or a `copyprivate` pointer).
pub const ORD: u64 = 3;

/// Entries of the table of lock words (the libgomp interface's
/// `omp_test_lock`): an entry's words are its key + 1 and whether the lock
/// is held.
pub const LOCK_SLOTS: u64 = 4096;
const LOCK_WORDS: u64 = 2;

/// The counters of a team (one window, homed at process 0).
#[derive(Debug)]
pub struct WsRing {
    win: WindowId,
}

impl WsRing {
    /// Collectively creates the counters (all zero: every slot in round 0).
    pub fn new(dsm: &ProgramDsm) -> Result<Self, Error> {
        let _rt = RuntimeGuard::enter();
        let bytes = ((SLOTS * WORDS + LOCK_SLOTS * LOCK_WORDS) * 8) as usize;
        let win = dsm.com().create_window(bytes)?;
        dsm.com().barrier()?;
        Ok(WsRing { win })
    }

    /// Collectively frees the counters.
    pub fn free(self, dsm: &ProgramDsm) -> Result<(), Error> {
        let _rt = RuntimeGuard::enter();
        dsm.com().barrier()?;
        dsm.com().destroy_window(self.win)?;
        Ok(())
    }

    fn word(&self, seq: u64, w: u64) -> RemotePtr {
        self.win.at(0, ((seq % SLOTS) * WORDS + w) * 8)
    }

    /// Waits until construct `seq`'s slot serves it.
    pub fn enter(&self, dsm: &ProgramDsm, seq: u64) {
        let round = seq / SLOTS;
        let word = self.word(seq, ROUND);
        let mut w = Waiter::new();
        loop {
            let r = {
                let _rt = RuntimeGuard::enter();
                dsm.com().atomic_load(word)
            }
            .unwrap_or_else(|e| fail("work-sharing counter", e));
            if r == round {
                return;
            }
            w.wait();
        }
    }

    /// Atomically adds `delta` to word `w` of construct `seq`'s slot.
    pub fn fetch_add(&self, dsm: &ProgramDsm, seq: u64, w: u64, delta: u64) -> u64 {
        let _rt = RuntimeGuard::enter();
        dsm.com()
            .fetch_add(self.word(seq, w), delta)
            .unwrap_or_else(|e| fail("work-sharing counter", e))
    }

    /// Reads word `w` of construct `seq`'s slot.
    pub fn load(&self, dsm: &ProgramDsm, seq: u64, w: u64) -> u64 {
        let _rt = RuntimeGuard::enter();
        dsm.com()
            .atomic_load(self.word(seq, w))
            .unwrap_or_else(|e| fail("work-sharing counter", e))
    }

    /// Compare-and-swap on word `w`; returns the value found.
    pub fn cas(&self, dsm: &ProgramDsm, seq: u64, w: u64, expected: u64, new: u64) -> u64 {
        let _rt = RuntimeGuard::enter();
        dsm.com()
            .compare_and_swap(self.word(seq, w), expected, new)
            .unwrap_or_else(|e| fail("work-sharing counter", e))
    }

    /// Word `w` of entry `slot` of the lock table.
    pub fn lock_word(&self, slot: u64, w: u64) -> RemotePtr {
        self.win.at(
            0,
            (SLOTS * WORDS + (slot % LOCK_SLOTS) * LOCK_WORDS + w) * 8,
        )
    }

    /// Compare-and-swap on a word of the lock table; returns the value
    /// found.
    pub fn lock_cas(&self, dsm: &ProgramDsm, slot: u64, w: u64, expected: u64, new: u64) -> u64 {
        let _rt = RuntimeGuard::enter();
        dsm.com()
            .compare_and_swap(self.lock_word(slot, w), expected, new)
            .unwrap_or_else(|e| fail("lock table", e))
    }

    /// Reads a word of the lock table.
    pub fn lock_load(&self, dsm: &ProgramDsm, slot: u64, w: u64) -> u64 {
        let _rt = RuntimeGuard::enter();
        dsm.com()
            .atomic_load(self.lock_word(slot, w))
            .unwrap_or_else(|e| fail("lock table", e))
    }

    /// This thread is done with construct `seq` (of a team of `threads`):
    /// the last one resets the slot and opens its next round.
    pub fn leave(&self, dsm: &ProgramDsm, seq: u64, threads: usize) {
        let done = self.fetch_add(dsm, seq, DONE, 1);
        if done + 1 == threads as u64 {
            for w in [NEXT, DONE, ORD] {
                self.store(dsm, seq, w, 0);
            }
            self.fetch_add(dsm, seq, ROUND, 1);
        }
    }

    /// Stores `v` in word `w` with atomics only (no thread uses the slot).
    fn store(&self, dsm: &ProgramDsm, seq: u64, w: u64, v: u64) {
        let mut cur = self.load(dsm, seq, w);
        loop {
            let found = self.cas(dsm, seq, w, cur, v);
            if found == cur {
                return;
            }
            cur = found;
        }
    }
}
