//! Collectives on shm.
//!
//! **Barrier**: a dissemination barrier. In round `k` (of `ceil(log2 N)`)
//! process `r` stores the barrier's number in an arrival word of process
//! `r + 2^k` (mod N), rings its doorbell, and waits for its own round-`k`
//! word to reach the number, written by process `r - 2^k`. Every process
//! waits for one peer at a time and nobody waits on a word everybody
//! writes; a waiter gives its processor up at once when the job has more
//! processes than the machine has processors (see `ShmCom::wait_until`),
//! so the peer it waits for — often queued on the same processor — runs.
//! A peer may already signal round `k` of the next barrier before we saw
//! this one's, so arrival words are compared as "at least".
//!
//! **Broadcast / allgather**: every process owns one scratch slot per
//! *parity* (two buffers). Step `k` of a collective (one chunk of at most
//! `chunk_bytes`) writes the caller's header and chunk into its slot of
//! parity `k mod 2`, passes the barrier, checks that all headers agree, and
//! copies what it needs out. Slot parity `p` is written again only at step
//! `k + 2`, after the barrier of step `k + 1`, which every process passes
//! only after it finished reading step `k` — so one barrier per step
//! suffices. Since every process reads the same headers, a mismatch (other
//! length, root or operation) is detected by all processes at the same step.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use ct_worker::UltItf;

use super::ShmCom;
use crate::com::wait::Watch;
use crate::com::{Coll, Error, Result, check};

const OP_BROADCAST: u64 = 1;
const OP_ALLGATHER: u64 = 2;
const OP_BARRIER: u64 = 3;

/// Process-local state of the collectives (guarded by the collective lock).
pub(crate) struct CollState {
    /// Collective steps taken so far (its parity selects the scratch buffer).
    step: u64,
    /// Barriers passed so far (wrapping; the number of the last one).
    barriers: u32,
    /// Id the next window will get.
    pub(crate) next_window: u32,
    /// Descriptor-passing sockets, by peer rank (rank 0 has one to every
    /// other rank; the others have one to rank 0).
    pub(crate) peers: Vec<Option<OwnedFd>>,
}

impl CollState {
    pub(crate) fn new(peers: Vec<Option<OwnedFd>>) -> Self {
        CollState {
            step: 0,
            barriers: 0,
            next_window: 0,
            peers,
        }
    }
}

fn op_name(op: u64) -> &'static str {
    match op {
        OP_BROADCAST => "broadcast",
        OP_ALLGATHER => "allgather",
        OP_BARRIER => "barrier",
        _ => "(another collective)",
    }
}

impl<U: UltItf> ShmCom<U> {
    /// The barrier; the caller holds the collective lock (`st`).
    pub(crate) fn barrier_locked(&self, st: &mut CollState) -> Result<()> {
        self.check_alive()?;
        let epoch = st.barriers.wrapping_add(1);
        st.barriers = epoch;
        let n = self.size;
        let mine = &self.control.slot(self.rank).arrivals;
        let mut dist = 1;
        let mut round = 0;
        while dist < n {
            let to = (self.rank + dist) % n;
            self.control.slot(to).arrivals[round].store(epoch, Ordering::Release);
            self.control.notify(to);
            let word = &mine[round];
            let what = || "a barrier or collective".to_string();
            // A peer that left after passing this barrier sent all its
            // signals: only one that left before is an error.
            self.wait_until(Watch::AllOthers(Some(epoch)), Some(&what), || {
                // At least `epoch` (wrapping): the peer may be a barrier ahead.
                let seen = word.load(Ordering::Acquire);
                Ok(((seen.wrapping_sub(epoch) as i32) >= 0).then_some(()))
            })?;
            dist *= 2;
            round += 1;
        }
        self.control
            .slot(self.rank)
            .passed
            .store(epoch, Ordering::Release);
        Ok(())
    }

    /// One collective step: publishes our header (and `chunk` for
    /// broadcast roots / allgather), passes the barrier, and checks that
    /// every process's header matches ours.
    fn step(
        &self,
        st: &mut CollState,
        op: u64,
        len: u64,
        root: u64,
        chunk: &[u8],
    ) -> Result<usize> {
        let parity = (st.step & 1) as usize;
        st.step += 1;
        let (h, data) = self.control.scratch(parity, self.rank);
        debug_assert!(chunk.len() <= self.control.layout().chunk_bytes);
        h.op.store(op, Ordering::Relaxed);
        h.len.store(len, Ordering::Relaxed);
        h.root.store(root, Ordering::Relaxed);
        // SAFETY: our slot has room for `chunk_bytes`; nobody reads it until
        // the barrier below, and nobody else writes it.
        unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), data, chunk.len()) };
        self.barrier_locked(st)?;
        for r in 0..self.size {
            let (hr, _) = self.control.scratch(parity, r);
            let (rop, rlen, rroot) = (
                hr.op.load(Ordering::Relaxed),
                hr.len.load(Ordering::Relaxed),
                hr.root.load(Ordering::Relaxed),
            );
            if (rop, rlen, rroot) != (op, len, root) {
                let what = |o, l, rt| match o {
                    OP_BROADCAST => format!("broadcast of {l} bytes from root {rt}"),
                    OP_BARRIER => "barrier".to_string(),
                    o => format!("{} of {l} bytes", op_name(o)),
                };
                return Err(Error::CollectiveMismatch(format!(
                    "rank {} called {}, but rank {r} called {}",
                    self.rank,
                    what(op, len, root),
                    what(rop, rlen, rroot)
                )));
            }
        }
        Ok(parity)
    }

    /// Allgather into `dst`; the caller holds the collective lock.
    pub(crate) fn allgather_into_locked(
        &self,
        st: &mut CollState,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<()> {
        let n = self.size;
        let total = src.len();
        check::allgather_len(n, total, dst.len())?;
        let chunk = self.control.layout().chunk_bytes;
        let steps = total.div_ceil(chunk).max(1);
        for k in 0..steps {
            let lo = k * chunk;
            let hi = total.min(lo + chunk);
            let parity = self.step(st, OP_ALLGATHER, total as u64, 0, &src[lo..hi])?;
            for r in 0..n {
                let (_, data) = self.control.scratch(parity, r);
                let out = &mut dst[r * total + lo..r * total + hi];
                // SAFETY: process r wrote `hi - lo` bytes into its slot before
                // the barrier we passed; it will not write the slot again
                // before the next step's barrier, which needs us.
                unsafe { std::ptr::copy_nonoverlapping(data, out.as_mut_ptr(), out.len()) };
            }
        }
        Ok(())
    }

    /// Allgather into a new vector; the caller holds the collective lock.
    pub(crate) fn allgather_locked(&self, st: &mut CollState, src: &[u8]) -> Result<Vec<u8>> {
        let mut dst = vec![0u8; src.len() * self.size];
        self.allgather_into_locked(st, src, &mut dst)?;
        Ok(dst)
    }
}

impl<U: UltItf> Coll for ShmCom<U> {
    fn barrier(&self) -> Result<()> {
        // A collective step of its own (a header, no data), so that a
        // barrier met by another process's allgather or broadcast is a
        // mismatch on both sides, not a barrier passed on one.
        let mut st = self.coll.lock();
        self.step(&mut st, OP_BARRIER, 0, 0, &[]).map(drop)
    }

    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        check::rank(root, self.size)?;
        let mut st = self.coll.lock();
        let total = buf.len();
        let chunk = self.control.layout().chunk_bytes;
        let steps = total.div_ceil(chunk).max(1);
        for k in 0..steps {
            let lo = k * chunk;
            let hi = total.min(lo + chunk);
            let mine: &[u8] = if self.rank == root { &buf[lo..hi] } else { &[] };
            let parity = self.step(&mut st, OP_BROADCAST, total as u64, root as u64, mine)?;
            if self.rank != root {
                let (_, data) = self.control.scratch(parity, root);
                let out = &mut buf[lo..hi];
                // SAFETY: the root wrote `hi - lo` bytes before the barrier we
                // passed; see `allgather_into_locked`.
                unsafe { std::ptr::copy_nonoverlapping(data, out.as_mut_ptr(), out.len()) };
            }
        }
        Ok(())
    }

    fn allgather_into(&self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        let mut st = self.coll.lock();
        self.allgather_into_locked(&mut st, src, dst)
    }
}
