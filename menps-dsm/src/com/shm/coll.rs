//! Collectives on shm.
//!
//! **Barrier**: one of two algorithms, the same in every process of a job
//! (the launcher chooses it, [`BarrierKind`], and records it in the control
//! memory). A waiter gives its processor up at once when the job has more
//! processes than the machine has processors (see `ShmCom::wait_until`), so
//! the peer it waits for — often queued on the same processor — runs.
//!
//! - *Central*: every process adds one to a shared arrival counter; the one
//!   that completes the barrier (counter at `epoch × N`) publishes the
//!   barrier's number in a release word and rings the others' doorbells;
//!   the others wait for the release word. Each process signals once and
//!   waits once. On an oversubscribed machine this is what counts: every
//!   wait a process leaves unsatisfied costs a context switch, and
//!   dissemination has `log2 N` waits per process.
//! - *Dissemination*: in round `k` (of `ceil(log2 N)`) process `r` stores
//!   the barrier's number in an arrival word of process `r + 2^k` (mod N),
//!   rings its doorbell, and waits for its own round-`k` word to reach the
//!   number, written by process `r - 2^k`. Nobody waits on a word everybody
//!   writes, so it scales to many processes on as many processors. A peer
//!   may already signal round `k` of the next barrier before we saw this
//!   one's, so arrival words are compared as "at least".
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
use std::sync::atomic::{AtomicU32, Ordering};

use ct_worker::UltItf;

use super::ShmCom;
use crate::com::wait::Watch;
use crate::com::{Coll, Error, Result, check};

/// The shm barrier's algorithm (`MENPS_SHM_BARRIER`; see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum BarrierKind {
    /// One shared arrival counter and release word.
    Central = 1,
    /// `ceil(log2 N)` rounds of pairwise signals.
    Dissemination = 2,
}

/// Up to this many processes, `auto` picks the central barrier even when
/// each has a processor of its own: a handful of atomic additions on one
/// cache line cost no more than `log2 N` rounds of signals.
const CENTRAL_MAX_PROCS: usize = 8;

impl BarrierKind {
    /// The algorithm for a job of `nprocs` processes: `MENPS_SHM_BARRIER`,
    /// or by default (`auto`) central when the job has more processes than
    /// the machine has processors or at most [`CENTRAL_MAX_PROCS`], else
    /// dissemination.
    pub(crate) fn configured(nprocs: usize) -> Result<BarrierKind> {
        let var = &ct_config::vars::MENPS_SHM_BARRIER;
        let chosen = var
            .choice()
            .map_err(|e| Error::BadConfig(e.to_string()))?
            .unwrap_or("auto");
        Ok(match chosen {
            "central" => BarrierKind::Central,
            "dissemination" => BarrierKind::Dissemination,
            _ => {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                Self::auto(nprocs, cpus)
            }
        })
    }

    /// `auto`'s choice for `nprocs` processes on `cpus` processors.
    fn auto(nprocs: usize, cpus: usize) -> BarrierKind {
        if nprocs > cpus || nprocs <= CENTRAL_MAX_PROCS {
            BarrierKind::Central
        } else {
            BarrierKind::Dissemination
        }
    }

    /// The kind a control-memory word names, if any.
    pub(crate) fn from_word(w: u32) -> Option<BarrierKind> {
        match w {
            1 => Some(BarrierKind::Central),
            2 => Some(BarrierKind::Dissemination),
            _ => None,
        }
    }
}

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
        match self.barrier_kind {
            BarrierKind::Central => self.central_barrier(epoch)?,
            BarrierKind::Dissemination => self.dissemination_barrier(epoch)?,
        }
        self.control
            .slot(self.rank)
            .passed
            .store(epoch, Ordering::Release);
        Ok(())
    }

    /// Waits until `word` holds barrier number `epoch` or a later one
    /// (wrapping: a peer may be a barrier ahead).
    fn wait_for_epoch(&self, word: &AtomicU32, epoch: u32) -> Result<()> {
        let what = || "a barrier or collective".to_string();
        // A peer that left after passing this barrier sent all its signals:
        // only one that left before is an error.
        self.wait_until(Watch::AllOthers(Some(epoch)), Some(&what), || {
            let seen = word.load(Ordering::Acquire);
            Ok(((seen.wrapping_sub(epoch) as i32) >= 0).then_some(()))
        })
    }

    /// Barrier number `epoch`, central (see the module docs).
    fn central_barrier(&self, epoch: u32) -> Result<()> {
        let n = self.size as u64;
        let (arrivals, release) = self.control.barrier_words();
        // Every process adds one per barrier and cannot add for the next
        // before this one is released, so the counter reaches a multiple of
        // N exactly when the last process of a barrier arrives.
        let before = arrivals.fetch_add(1, Ordering::AcqRel);
        if (before + 1) % n == 0 {
            release.store(epoch, Ordering::Release);
            for r in (0..self.size).filter(|&r| r != self.rank) {
                self.control.notify(r);
            }
            Ok(())
        } else {
            self.wait_for_epoch(release, epoch)
        }
    }

    /// Barrier number `epoch`, by dissemination (see the module docs).
    fn dissemination_barrier(&self, epoch: u32) -> Result<()> {
        let n = self.size;
        let mine = &self.control.slot(self.rank).arrivals;
        let mut dist = 1;
        let mut round = 0;
        while dist < n {
            let to = (self.rank + dist) % n;
            self.control.slot(to).arrivals[round].store(epoch, Ordering::Release);
            self.control.notify(to);
            self.wait_for_epoch(&mine[round], epoch)?;
            dist *= 2;
            round += 1;
        }
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

    fn allgather_prefix_into(
        &self,
        src: &[u8],
        head: usize,
        used: &dyn Fn(&[u8]) -> usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let mut st = self.coll.lock();
        let total = src.len();
        if total == 0 || head > total || total > self.control.layout().chunk_bytes {
            // (Empty records, and records of several steps, are gathered
            // whole.)
            return self.allgather_into_locked(&mut st, src, dst);
        }
        check::allgather_len(self.size, total, dst.len())?;
        let parity = self.step(&mut st, OP_ALLGATHER, total as u64, 0, src)?;
        for (r, out) in dst.chunks_exact_mut(total).enumerate() {
            let (_, data) = self.control.scratch(parity, r);
            // SAFETY: as in `allgather_into_locked`: process r wrote `total`
            // bytes into its slot before the barrier we passed, and will not
            // write it again before the next step's barrier, which needs us.
            unsafe { std::ptr::copy_nonoverlapping(data, out.as_mut_ptr(), head) };
            let len = used(&out[..head]).clamp(head, total);
            // SAFETY: as above; `head <= len <= total`.
            unsafe {
                std::ptr::copy_nonoverlapping(data.add(head), out[head..].as_mut_ptr(), len - head)
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_central_when_oversubscribed_or_small() {
        assert_eq!(BarrierKind::auto(2, 2), BarrierKind::Central);
        assert_eq!(BarrierKind::auto(4, 2), BarrierKind::Central);
        assert_eq!(BarrierKind::auto(8, 64), BarrierKind::Central);
        assert_eq!(BarrierKind::auto(64, 32), BarrierKind::Central);
        assert_eq!(BarrierKind::auto(9, 64), BarrierKind::Dissemination);
        assert_eq!(BarrierKind::auto(64, 64), BarrierKind::Dissemination);
    }

    #[test]
    fn control_words_name_the_kinds() {
        for k in [BarrierKind::Central, BarrierKind::Dissemination] {
            assert_eq!(BarrierKind::from_word(k as u32), Some(k));
        }
        assert_eq!(BarrierKind::from_word(0), None);
        assert_eq!(BarrierKind::from_word(3), None);
    }
}
