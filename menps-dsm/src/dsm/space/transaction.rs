//! Transactions: the global block locks, the version intervals, merging
//! with the latest version, and fast release (Endo 2020 §3.4.2, §3.4.6,
//! §3.5.4).

use core::sync::atomic::{AtomicU64, Ordering};

use ct_worker::UltItf;

use crate::com::{Communicator, WindowId};

use super::super::config::{InvalidationPolicy, WriterPolicy};
use super::super::diff;
use super::super::error::{DsmError, DsmResult};
use super::super::layout;
use super::super::qlock::{self, Granted};
use super::super::segment::{BlockMeta, BlockState, LAD_OFF, Lad, Segment};
use super::super::signature::WriteNotice;
use super::{AtomicOp, Space, TxKind, bump};

/// What a transaction's caller read of the block's latest version before
/// the transaction (see `Space::transaction_locked`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Fetched<'a> {
    /// Nothing: the transaction reads what it needs.
    No,
    /// The whole block, into this buffer (a batch's read).
    Buffer(&'a [u64]),
    /// What a clean read miss needs (the block, or the page of a partial
    /// read), straight into our copy (a speculative read that held the
    /// latest version).
    InCopy,
}

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    // ---------------------------------------------------------------
    // Global block locks

    pub(super) fn read_lad(&self, win: WindowId, rank: usize, off: u64) -> DsmResult<Lad> {
        let mut b = [0u8; Lad::BYTES];
        self.com.read(win.at(rank, off + LAD_OFF as u64), &mut b)?;
        Lad::from_bytes(&b)
    }

    /// Takes block `idx`'s global lock; returns its LAD.
    pub(super) fn lock_block(&self, seg: &Segment<U>, idx: usize) -> DsmResult<Lad> {
        self.lock_block_reading(seg, idx, None).map(|(lad, _)| lad)
    }

    /// [`Space::lock_block`], reading speculatively into `data` the latest
    /// version's bytes at offset `at` of the block (`data.len()` of them)
    /// as they are at the process the lock is first tried at, with the swap
    /// there, if that is the process `expect` (see
    /// [`qlock::LadRead::data`]): one round trip for the lock,
    /// its LAD and the data, where the block's last writer still holds its
    /// lock. Returns the LAD and whether `data` holds the latest version
    /// (the lock was taken from that process, and the LAD names it the
    /// last writer); otherwise `data` holds anything.
    pub(super) fn lock_block_reading(
        &self,
        seg: &Segment<U>,
        idx: usize,
        data: Option<(usize, usize, &mut [u8])>,
    ) -> DsmResult<(Lad, bool)> {
        match self.cfg.writer {
            WriterPolicy::Floating => {
                let site = self.block_site(seg, idx);
                let slot = seg.meta_off(idx) + LAD_OFF as u64;
                let at = |p: usize| seg.meta_win.at(p, slot);
                let mut buf = [0u8; Lad::BYTES];
                let mut lad = qlock::LadRead {
                    at: &at,
                    buf: &mut buf,
                    data: data.map(|(expect, at, buf)| qlock::DataRead {
                        expect,
                        win: self.latest_win(seg),
                        off: seg.offset(idx) + at as u64,
                        buf,
                    }),
                    data_from: None,
                };
                let granted = qlock::lock_reading(&self.com, &site, &mut lad)?;
                let data_from = lad.data_from;
                let lad = match granted {
                    Granted::Local => self.read_lad(seg.meta_win, self.rank, seg.meta_off(idx))?,
                    Granted::FromOwner(_) => Lad::from_bytes(&buf)?,
                    Granted::HandOff(_, bytes) => Lad::from_bytes(&bytes)?,
                };
                let latest = data_from.is_some_and(|p| self.tx_home(seg, idx, &lad) == p);
                Ok((lad, latest))
            }
            WriterPolicy::Fixed => {
                let home = self.fixed_home(seg, idx);
                qlock::spin_lock(&self.com, seg.meta_win.at(home, seg.meta_off(idx)))?;
                Ok((self.read_lad(seg.meta_win, home, seg.meta_off(idx))?, false))
            }
        }
    }

    pub(super) fn unlock_block(&self, seg: &Segment<U>, idx: usize, lad: Lad) -> DsmResult<()> {
        let bytes = lad.to_bytes();
        match self.cfg.writer {
            WriterPolicy::Floating => {
                let site = self.block_site(seg, idx);
                let slot = seg
                    .meta_win
                    .at(self.rank, seg.meta_off(idx) + LAD_OFF as u64);
                qlock::unlock(&self.com, &site, &bytes, || {
                    self.com.write(slot, &bytes).map_err(Into::into)
                })
            }
            WriterPolicy::Fixed => {
                let home = self.fixed_home(seg, idx);
                let word = seg.meta_win.at(home, seg.meta_off(idx));
                self.com.write(word.add(LAD_OFF as u64), &bytes)?;
                qlock::spin_unlock(&self.com, word)
            }
        }
    }

    // ---------------------------------------------------------------
    // Transactions

    /// New interval of a version: written versions get a write timestamp
    /// above every lease handed out; every transaction extends the lease.
    pub(super) fn next_interval(&self, lad: &Lad, written: bool) -> (u64, u64) {
        let acq = self.acq_ts.load(Ordering::Acquire);
        let lease = self.cfg.lease;
        if written {
            let wr = (lad.rd + 1).max(acq);
            (wr, wr.max(acq) + lease)
        } else {
            (lad.wr, (lad.wr.max(acq) + lease).max(lad.rd))
        }
    }

    /// Runs a transaction on block `idx`: takes its global lock, merges this
    /// process's changes with the latest version, updates the timestamps and
    /// the block's state, records a write notice, and unlocks. Returns the
    /// old value for atomic operations.
    pub(super) fn transaction(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        kind: TxKind,
    ) -> DsmResult<u64> {
        bump(&self.stats.transactions);
        let was = m.state;
        let dirty = was.dirty();
        m.force_tx = false;
        // A read miss of a clean invalid block reads the block (or its page)
        // speculatively with its lock's swap, into our copy.
        let spec = match kind {
            TxKind::Read => Some((0, seg.block_size)),
            TxKind::ReadPage(p) => {
                let page = crate::sys::page_size();
                Some((p * page, page))
            }
            _ => None,
        }
        .filter(|_| self.speculates(m));
        let (mut lad, fetched) = match spec {
            Some((at, len)) => {
                // SAFETY: our copy of the block, which is invalid (the
                // application view has no access) and whose entry lock the
                // caller holds: nobody else touches it, and what a void read
                // leaves in it is overwritten by the transaction.
                let buf = unsafe { core::slice::from_raw_parts_mut(seg.sys(idx).add(at), len) };
                let expect = m.home as usize - 1;
                let (lad, have) = self.lock_block_reading(seg, idx, Some((expect, at, buf)))?;
                if have {
                    bump(&self.stats.speculative_reads);
                    (lad, Fetched::InCopy)
                } else {
                    bump(&self.stats.void_speculations);
                    if let Err(e) = self.check_void_speculation(seg, idx, &lad) {
                        self.unlock_block(seg, idx, lad)?;
                        return Err(e);
                    }
                    (lad, Fetched::No)
                }
            }
            None => (self.lock_block(seg, idx)?, Fetched::No),
        };
        let result = self.transaction_locked(seg, idx, m, kind, was, dirty, &mut lad, fetched);
        match result {
            Ok((old, written, exported, copied_back_to)) => {
                if let Some(p) = copied_back_to {
                    self.com.flush(p)?;
                }
                // The write notice: for a written version, or for a floating
                // merge that found nothing of ours written (`exported`: the
                // original's case of changes another process's migration had
                // carried away; readers now take the published twin, so it
                // only re-announces the latest version).
                self.unlock_announcing(seg, idx, lad, written || exported)?;
                Ok(old)
            }
            Err(e) => Err(e),
        }
    }

    /// The end of a transaction on block `idx`: unlocks it with `lad`, and
    /// if `announce`, records the write notice of the version `lad` names
    /// in this process's release signature.
    pub(super) fn unlock_announcing(
        &self,
        seg: &Segment<U>,
        idx: usize,
        lad: Lad,
        announce: bool,
    ) -> DsmResult<()> {
        let notice = announce.then(|| {
            WriteNotice::new(
                seg.app(idx),
                self.lad_holder(seg, idx, &lad),
                lad.wr,
                lad.rd,
            )
        });
        self.unlock_block(seg, idx, lad)?;
        if let Some(wn) = notice {
            self.rel_sig.lock().push(wn);
        }
        Ok(())
    }

    /// The window holding, at the process a transaction reads, the latest
    /// version of a block of `seg`: under the floating home the last
    /// writer's twin — what it published, updated under the block's lock
    /// (its copy may be in the middle of a rewrite that ends on the same
    /// values, which would then never be announced) — and under the fixed
    /// home the home's copy, the master copy that writers merge into.
    pub(super) fn latest_win(&self, seg: &Segment<U>) -> crate::com::WindowId {
        match self.cfg.writer {
            WriterPolicy::Floating => seg.twin_win,
            WriterPolicy::Fixed => seg.data_win,
        }
    }

    /// Process whose copy a transaction under `lad` reads (this process:
    /// nothing to read).
    pub(super) fn tx_home(&self, seg: &Segment<U>, idx: usize, lad: &Lad) -> usize {
        if self.cfg.writer == WriterPolicy::Fixed {
            self.fixed_home(seg, idx)
        } else if lad.last_writer == 0 {
            self.rank
        } else {
            lad.last_writer as usize - 1
        }
    }

    /// The reads of a batched fetch of blocks `idxs` (ascending, their
    /// LADs `lads`, locked): one per maximal run of contiguous blocks whose
    /// latest version is at the same other process, as `(position in
    /// idxs, length, home)`. Blocks whose latest version is ours are left
    /// out, and so are those `have` marks (read already). The runs' bytes
    /// are counted as fetched.
    pub(super) fn remote_runs(
        &self,
        seg: &Segment<U>,
        idxs: &[usize],
        lads: &[Lad],
        have: &[bool],
    ) -> Vec<(usize, usize, usize)> {
        let homes: Vec<usize> = idxs
            .iter()
            .zip(lads)
            .enumerate()
            .map(|(k, (&j, lad))| {
                if have.get(k) == Some(&true) {
                    self.rank
                } else {
                    self.tx_home(seg, j, lad)
                }
            })
            .collect();
        let mut runs = Vec::new();
        let mut k = 0;
        while k < idxs.len() {
            let mut n = 1;
            while k + n < idxs.len() && idxs[k + n] == idxs[k] + n && homes[k + n] == homes[k] {
                n += 1;
            }
            if homes[k] != self.rank {
                runs.push((k, n, homes[k]));
                self.stats
                    .bytes_fetched
                    .fetch_add(n * seg.block_size, Ordering::Relaxed);
            }
            k += n;
        }
        runs
    }

    /// Takes the global locks of `blocks` (ascending) for a prefetch;
    /// returns their LADs. Under the floating policy the locks are first
    /// tried all at once ([`qlock::try_lock_all`]: the swaps at the
    /// probable owners and the LADs' reads behind them in flight together),
    /// so a run last written by one process costs one round trip however
    /// long it is. From the first lock that is busy or has moved on, they
    /// are taken one after the other as a miss takes them (waiting, and
    /// following the lock): the ones tried and taken after it are given back
    /// first, so that every lock waited for is above all the locks held —
    /// all nesting of block locks within a segment is ascending, which
    /// rules out deadlocks. Under the fixed policy they are taken in order.
    ///
    /// `spec` may add speculative reads of the blocks' latest versions, one
    /// per run of contiguous blocks (see [`qlock::try_lock_all`]); the
    /// second vector says which blocks hold the latest version (read, and
    /// the lock taken in the try from the process the LAD names the last
    /// writer: their bytes count as fetched), the third which were read
    /// in vain (their buffers hold anything).
    pub(super) fn lock_for_prefetch(
        &self,
        seg: &Segment<U>,
        blocks: &[usize],
        spec: &mut [qlock::RunRead<'_>],
    ) -> DsmResult<(Vec<Lad>, Vec<bool>, Vec<bool>)> {
        let mut have = vec![false; blocks.len()];
        let mut void = vec![false; blocks.len()];
        if self.cfg.writer == WriterPolicy::Fixed {
            let lads: DsmResult<Vec<Lad>> =
                blocks.iter().map(|&j| self.lock_block(seg, j)).collect();
            return Ok((lads?, have, void));
        }
        let sites: Vec<_> = blocks.iter().map(|&j| self.block_site(seg, j)).collect();
        let mut bufs = vec![[0u8; Lad::BYTES]; blocks.len()];
        let mut lad_bufs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        let granted = qlock::try_lock_all(
            &self.com,
            &sites,
            &mut lad_bufs,
            |k, holder| {
                seg.meta_win
                    .at(holder, seg.meta_off(blocks[k]) + LAD_OFF as u64)
            },
            spec,
        )?;
        drop(lad_bufs);
        let busy = granted
            .iter()
            .position(Option::is_none)
            .unwrap_or(blocks.len());
        // Where each block's data was read speculatively, if it was.
        let mut read_at = vec![None; blocks.len()];
        for r in spec.iter() {
            read_at[r.sites.clone()].fill(r.read_at);
        }
        let mut lads = Vec::with_capacity(blocks.len());
        for (k, (g, b)) in granted.iter().zip(&bufs).enumerate() {
            let Some(g) = g else {
                continue;
            };
            let lad = Lad::from_bytes(b)?;
            if k < busy {
                if let Granted::FromOwner(p) = g {
                    have[k] = read_at[k] == Some(*p) && self.tx_home(seg, blocks[k], &lad) == *p;
                }
                lads.push(lad);
            } else {
                // Given back unchanged: the lock stays here, free.
                self.unlock_block(seg, blocks[k], lad)?;
            }
        }
        for &j in &blocks[busy..] {
            lads.push(self.lock_block(seg, j)?);
        }
        for k in (0..blocks.len()).filter(|&k| read_at[k].is_some()) {
            if have[k] {
                bump(&self.stats.speculative_reads);
                self.stats
                    .bytes_fetched
                    .fetch_add(seg.block_size, Ordering::Relaxed);
            } else {
                bump(&self.stats.void_speculations);
                void[k] = true;
            }
        }
        Ok((lads, have, void))
    }

    /// Sequential prefetch of the clean invalid blocks `blocks` (ascending,
    /// their entries locked by the caller): takes their global locks
    /// ([`Self::lock_for_prefetch`]), reads each run of blocks that are
    /// contiguous and held by the same process with one read — all the
    /// runs' reads in flight together — then finishes and unlocks each
    /// block as a read transaction would.
    pub(super) fn prefetch_clean(
        &self,
        seg: &Segment<U>,
        blocks: &mut [(usize, &mut BlockMeta)],
    ) -> DsmResult<()> {
        let bs = seg.block_size;
        let idxs: Vec<usize> = blocks.iter().map(|(j, _)| *j).collect();
        // Each run of contiguous blocks whose last writers we know of is
        // read speculatively with the swaps that try their locks, straight
        // into our copies.
        let expect = |k: usize| {
            let m: &BlockMeta = blocks[k].1;
            self.speculates(m).then(|| m.home as usize - 1)
        };
        let mut spec: Vec<_> = contiguous_runs(&idxs, expect)
            .into_iter()
            .map(|(r, expect)| {
                // SAFETY: our copies of the run's blocks (contiguous in the
                // window), which are invalid (the application view has no
                // access) and whose entries are locked: nobody else touches
                // them, and what a void read leaves in them is overwritten
                // below.
                let buf = unsafe {
                    core::slice::from_raw_parts_mut(seg.sys(idxs[r.start]), r.len() * bs)
                };
                self.run_read(seg, idxs[r.start], r, expect, buf)
            })
            .collect();
        let (mut lads, have, void) = self.lock_for_prefetch(seg, &idxs, &mut spec)?;
        drop(spec);
        for (k, (j, m)) in blocks.iter_mut().enumerate() {
            debug_assert!(m.state == BlockState::InvalidClean);
            bump(&self.stats.transactions);
            m.force_tx = false;
            if void[k] {
                self.check_void_speculation(seg, *j, &lads[k])?;
            }
        }
        // One read per run of contiguous blocks with the same remote home.
        let mut runs = Vec::new();
        for (k, n, home) in self.remote_runs(seg, &idxs, &lads, &have) {
            let first = idxs[k];
            // SAFETY: our copies of blocks `first .. first + n` (contiguous
            // in the window), which are invalid (the application view has
            // no access) and whose entries are locked: nobody else touches
            // them.
            let dst = unsafe { core::slice::from_raw_parts_mut(seg.sys(first), n * bs) };
            runs.push((self.latest_win(seg).at(home, seg.offset(first)), dst));
        }
        self.com.read_all(&mut runs)?;
        drop(runs);
        for ((j, m), lad) in blocks.iter_mut().zip(lads.iter_mut()) {
            let was = m.state;
            self.transaction_locked(seg, *j, m, TxKind::Prefetch, was, false, lad, Fetched::No)?;
            self.unlock_block(seg, *j, *lad)?;
        }
        Ok(())
    }

    /// An atomic operation under the floating home, performed on the word
    /// of the block's latest version where it is — at its last writer, with
    /// the communication layer's remote atomics — instead of by a
    /// transaction that would take the whole block here and make this
    /// process its home (two block transfers for one word,
    /// and the old home's copy dropped: a reduction into a variable of
    /// `main`'s frame moved its block back and forth at every region).
    ///
    /// Under the block's global lock: the operation on the home's copy, the
    /// same value into the home's twin (so the home's next release does not
    /// take the word for a change of its own), a new interval in the LAD
    /// and, if the word was written, a write notice naming the home, so
    /// that acquirers drop their copies; this process's own copy, if it has
    /// one, gets the word too (a read after the operation sees it). The
    /// home stays where it was. Returns `None`, the lock given back
    /// unchanged, when the transaction must do it: no process wrote the
    /// block yet (every process holds the initial version: the transaction
    /// makes this one the home), or a write of this process to the word is
    /// pending in its copy (program order: the operation must see it, and
    /// the transaction merges it first).
    pub(super) fn atomic_at_home(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        at: usize,
        op: AtomicOp,
    ) -> DsmResult<Option<u64>> {
        let mut lad = self.lock_block(seg, idx)?;
        if lad.last_writer == 0 {
            self.unlock_block(seg, idx, lad)?;
            return Ok(None);
        }
        let home = lad.last_writer as usize - 1;
        // SAFETY: word `at / 8` of our copy and of our twin of the block,
        // 8-aligned, inside them; accessed atomically, as this process's
        // threads may access the copy meanwhile.
        let (mine, base) = unsafe {
            (
                AtomicU64::from_ptr(seg.sys(idx).add(at).cast()),
                AtomicU64::from_ptr(seg.twin_of(idx).add(at).cast()),
            )
        };
        let dirty = m.state.dirty();
        if home != self.rank
            && dirty
            && mine.load(Ordering::Relaxed) != base.load(Ordering::Relaxed)
        {
            // A write of ours to the word is pending: the operation must see
            // it, so the transaction merges it first.
            self.unlock_block(seg, idx, lad)?;
            return Ok(None);
        }
        bump(&self.stats.transactions);
        let off = seg.offset(idx) + at as u64;
        let word = seg.data_win.at(home, off);
        let result = (|| -> DsmResult<(u64, Option<u64>)> {
            Ok(match op {
                AtomicOp::Load => (self.com.atomic_load(word)?, None),
                AtomicOp::FetchAdd(d) => {
                    let old = self.com.fetch_add(word, d)?;
                    (old, Some(old.wrapping_add(d)))
                }
                AtomicOp::CompareExchange(e, n) => {
                    let old = self.com.compare_and_swap(word, e, n)?;
                    (old, (old == e).then_some(n))
                }
                AtomicOp::Store(v) => {
                    let mut old = self.com.atomic_load(word)?;
                    loop {
                        let seen = self.com.compare_and_swap(word, old, v)?;
                        if seen == old {
                            break (old, Some(v));
                        }
                        old = seen;
                    }
                }
            })
        })();
        let (old, new) = match result {
            Ok(r) => r,
            Err(e) => {
                // Given back as it was (the DSM fails with the error).
                let _ = self.unlock_block(seg, idx, lad);
                return Err(e);
            }
        };
        let mut notice = None;
        if let Some(v) = new {
            self.com
                .write(seg.twin_win.at(home, off), &v.to_le_bytes())?;
            self.com.flush(home)?;
            let (wr, rd) = self.next_interval(&lad, true);
            lad.wr = wr;
            lad.rd = rd;
            notice = Some(WriteNotice::new(seg.app(idx), home, wr, rd));
            if home == self.rank {
                if m.state.readable() {
                    m.cur_wr = wr;
                    m.cur_rd = rd;
                }
            } else if dirty {
                // The home's change merged into our copy as a release merge
                // does (only its bits flip: another thread of ours may be
                // writing another field of the word), and the twin takes it
                // as base.
                let b = base.load(Ordering::Relaxed);
                mine.fetch_xor(b ^ v, Ordering::Relaxed);
                base.store(v, Ordering::Relaxed);
            } else if m.state.readable() {
                // A clean copy: nobody of ours writes it (it is protected).
                mine.store(v, Ordering::Relaxed);
            }
        }
        // The lock stays here and our LAD slot will describe the block:
        // fast release may apply only if our copy is the latest version.
        m.written_last = home == self.rank;
        self.unlock_block(seg, idx, lad)?;
        if let Some(wn) = notice {
            self.rel_sig.lock().push(wn);
        }
        Ok(Some(old))
    }

    /// Process whose copy holds the version the LAD describes.
    pub(super) fn lad_holder(&self, seg: &Segment<U>, idx: usize, lad: &Lad) -> usize {
        match self.cfg.writer {
            WriterPolicy::Fixed => self.fixed_home(seg, idx),
            WriterPolicy::Floating => {
                if lad.last_writer == 0 {
                    self.rank
                } else {
                    lad.last_writer as usize - 1
                }
            }
        }
    }

    /// The speculative read, for [`Self::lock_for_prefetch`], of the latest
    /// versions of the run of blocks at `sites` (positions in its blocks),
    /// the first of them block `first` of `seg`, expected at process
    /// `expect`, into `buf`.
    pub(super) fn run_read<'b>(
        &self,
        seg: &Segment<U>,
        first: usize,
        sites: core::ops::Range<usize>,
        expect: usize,
        buf: &'b mut [u8],
    ) -> qlock::RunRead<'b> {
        qlock::RunRead {
            data: qlock::DataRead {
                expect,
                win: self.latest_win(seg),
                off: seg.offset(first),
                buf,
            },
            sites,
            read_at: None,
        }
    }

    /// Whether a read miss (or a prefetch) of block `m`, clean and
    /// invalid, reads its latest version speculatively with the swap that
    /// tries its lock (see [`Space::lock_block_reading`]), straight into our
    /// copy: under the floating policy, when a write notice (or our last
    /// transaction) named another process its last writer. Such a copy is
    /// never the latest version (only a transaction of ours could make us
    /// its last writer again), so a void read costs nothing but its bytes.
    pub(super) fn speculates(&self, m: &BlockMeta) -> bool {
        self.cfg.writer == WriterPolicy::Floating
            && m.state == BlockState::InvalidClean
            && m.home != 0
            && m.home as usize != self.rank + 1
    }

    /// Checks, for block `idx` whose copy a void speculative read may have
    /// overwritten, that the transaction goes on to read the latest version
    /// (`lad` names another process its last writer): the copy was no
    /// version of ours to keep (see [`Space::speculates`]).
    fn check_void_speculation(&self, seg: &Segment<U>, idx: usize, lad: &Lad) -> DsmResult<()> {
        if self.tx_home(seg, idx, lad) == self.rank {
            return Err(DsmError::Misuse(format!(
                "block at {:#x}: a speculative read overwrote a copy whose version is the \
                 latest (internal error)",
                seg.app(idx)
            )));
        }
        Ok(())
    }

    /// The body of a transaction, with the global lock held. Updates `lad`
    /// to the new LAD. Returns (old atomic value, written, exported,
    /// process whose twin we wrote). `fetched`: what the caller read of the
    /// latest version already (used if the latest version is another
    /// process's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn transaction_locked(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        kind: TxKind,
        was: BlockState,
        dirty: bool,
        lad: &mut Lad,
        fetched: Fetched<'_>,
    ) -> DsmResult<(u64, bool, bool, Option<usize>)> {
        let me = self.rank;
        let bs = seg.block_size;
        let off = seg.offset(idx);
        let fixed = self.cfg.writer == WriterPolicy::Fixed;
        let home = self.tx_home(seg, idx, lad);
        // A release that knows the copy unchanged from a dirty scan (taken
        // below unless the block is protected first).
        let scanned_clean = matches!(kind, TxKind::Release { clean: true }) && m.armed;
        // The copy and the twin may change below, through the system view.
        m.armed = false;
        // A partial copy (see `BlockMeta::missing`) lacks pages even where
        // the latest version is ours: it is read whole, like a remote one.
        let had_missing = m.missing != 0;
        let remote = home != me || had_missing;
        let thr = self.cfg.wr_count_threshold;
        let pinned = matches!(was, BlockState::Pinned | BlockState::PinnedStale);
        // Stop local writers before merging remote changes into our copy (or
        // when the block keeps being released without writes). Merging into
        // a writable copy while this process's other threads go on writing
        // it lost updates in an LU-style flag pipeline with two threads per
        // process, although the merge rewrites only the other side's words,
        // atomically.
        let protect_before = was == BlockState::Writable && (remote || m.wr_count >= thr);
        if protect_before {
            layout::protect(seg.app(idx), bs, libc::PROT_READ)?;
        }
        // What the scan knew holds while the block stays writable: a write
        // after it is reported at the next fence. A block protected now
        // leaves the write set if found unchanged, so a write between the
        // scan and the protection must be found by comparing.
        let known_clean = scanned_clean && !protect_before;
        let write_protected = !was.writable() || protect_before;
        // SAFETY: the block's entry lock is held, and either the application
        // view does not allow writes (invalid, read-only, or protected just
        // now), or the copy is ours alone to merge into (pinned: only words
        // the other side changed are rewritten, atomically — or with plain
        // stores when the program writes from this thread only, which runs
        // this merge; writable without remote changes: the system view is
        // only read).
        let (data, twin) = unsafe {
            (
                diff::words_mut(seg.sys(idx), bs),
                diff::words_mut(seg.twin_of(idx), bs),
            )
        };
        let mut written = false;
        let mut exported = false;
        let mut copied_back_to = None;
        if !remote {
            if dirty {
                // Written since what we last published, which is the twin
                // (a fast release updates it too).
                written = !known_clean && !diff::same(data, twin);
                if written {
                    twin.copy_from_slice(data);
                }
                if known_clean {
                    bump(&self.stats.scanned_idle);
                }
                // (Equal now: see `BlockMeta::armed`.)
                m.armed = seg.tracked;
            }
        } else if !dirty && !matches!(kind, TxKind::Atomic(..)) {
            // A clean copy is replaced: read the latest version straight
            // into it (nothing of ours to merge) —
            // unless a prefetch read it already, with its neighbours.
            // A partial read fetches only its page (`at`, `len` bytes).
            let (at, len) = match kind {
                TxKind::ReadPage(p) => {
                    let page = crate::sys::page_size();
                    m.missing = (u64::MAX >> (64 - bs / page)) & !(1u64 << p);
                    bump(&self.stats.partial_reads);
                    (p * page, page)
                }
                _ => {
                    m.missing = 0;
                    (0, bs)
                }
            };
            if matches!(fetched, Fetched::InCopy) {
                self.stats.bytes_fetched.fetch_add(len, Ordering::Relaxed);
            } else if !matches!(kind, TxKind::Prefetch) {
                // SAFETY: `data` is this process's copy of the block, `bs`
                // bytes, which nobody else writes while we hold its locks;
                // `at + len <= bs`.
                let dst = unsafe {
                    core::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>().add(at), len)
                };
                self.com
                    .read(self.latest_win(seg).at(home, off + at as u64), dst)?;
                self.stats.bytes_fetched.fetch_add(len, Ordering::Relaxed);
            }
        } else {
            m.missing = 0;
            let mut tmp = None;
            debug_assert!(!matches!(fetched, Fetched::InCopy));
            let other: &[u64] = match fetched {
                Fetched::Buffer(f) => f,
                Fetched::No | Fetched::InCopy => {
                    let t = tmp.insert(self.tmp(bs));
                    self.com
                        .read(self.latest_win(seg).at(home, off), t.bytes_mut())?;
                    self.stats.bytes_fetched.fetch_add(bs, Ordering::Relaxed);
                    &t.buf
                }
            };
            if fixed {
                if dirty {
                    // Take in the home's changes (only words the home's
                    // version changed are rewritten: a pinned stack's live
                    // words stay), then send our changed bytes to the home's
                    // copy and twin (the twin too, so the home does not take
                    // them for its own changes).
                    let mut runs = Vec::new();
                    diff::changed_runs(data, twin, &mut runs);
                    // The home's copy holds the last writer's changes —
                    // and the home's own, before it released them: if the
                    // recorded last writer is us, the other side is the
                    // home.
                    let writer = match lad.last_writer {
                        0 => home,
                        w if w as usize - 1 == me => home,
                        w => w as usize - 1,
                    };
                    self.merge_checked(seg, idx, writer, (data, twin, other), diff::read_merge)?;
                    written = !runs.is_empty();
                    // SAFETY: byte views reborrowed from the word views (same
                    // memory, `bs` bytes each).
                    let (dbytes, tbytes) = unsafe {
                        (
                            core::slice::from_raw_parts(data.as_ptr().cast::<u8>(), bs),
                            core::slice::from_raw_parts_mut(twin.as_mut_ptr().cast::<u8>(), bs),
                        )
                    };
                    // Each run is copied once and the copy sent: a pinned
                    // stack may change while we send (our own frames live
                    // there), and the home's copy, its twin and our twin must
                    // get the same bytes. Later changes stay in our diff.
                    let mut snap = Vec::new();
                    for &(o, len) in &runs {
                        let at = off + o as u64;
                        snap.clear();
                        snap.extend_from_slice(&dbytes[o..o + len]);
                        self.com.write(seg.data_win.at(home, at), &snap)?;
                        self.com.write(seg.twin_win.at(home, at), &snap)?;
                        tbytes[o..o + len].copy_from_slice(&snap);
                    }
                    copied_back_to = written.then_some(home);
                } else {
                    data.copy_from_slice(other);
                }
            } else {
                if dirty {
                    // Only a writable (pinned) copy may be written by this
                    // process's threads during the merge, unless the program
                    // writes from this thread only.
                    let merge = if write_protected || self.merges_alone(m) {
                        diff::write_merge_exclusive
                    } else {
                        diff::write_merge
                    };
                    let merged = self.merge_checked(seg, idx, home, (data, twin, other), merge)?;
                    written = merged.local_changes;
                    // Another process wrote the block since our base: a
                    // write fault after this is contended (see
                    // `Space::pin_if_write_shared`).
                    m.remote_write_seen |= merged.remote_changes;
                    exported = !written;
                } else {
                    // A clean copy (here for an atomic, which may leave us
                    // the last writer): the twin is the version taken, as
                    // every last writer's twin is what it published.
                    data.copy_from_slice(other);
                    twin.copy_from_slice(other);
                }
            }
        }
        // An atomic operation on the merged copy (in the twin too, so it is
        // not mistaken for a pending local change).
        let mut old = 0;
        if let TxKind::Atomic(at, op) = kind {
            let w = at / 8;
            old = data[w];
            let new = match op {
                AtomicOp::Load => None,
                AtomicOp::Store(v) => Some(v),
                AtomicOp::FetchAdd(d) => Some(old.wrapping_add(d)),
                AtomicOp::CompareExchange(e, n) => (old == e).then_some(n),
            };
            if let Some(v) = new {
                data[w] = v;
                twin[w] = v;
                written = true;
                if fixed && remote {
                    let b = v.to_le_bytes();
                    self.com.write(seg.data_win.at(home, off + at as u64), &b)?;
                    self.com.write(seg.twin_win.at(home, off + at as u64), &b)?;
                    copied_back_to = Some(home);
                }
            }
        }
        // No copy back when the block migrates to us: the version we took
        // is the old home's twin, its base version already, so its later
        // diffs hold only its later writes (its unreleased writes, which we
        // did not take, stay in them).
        // Timestamps.
        let (wr, rd) = self.next_interval(lad, written);
        if written {
            // Under a fixed home it only names the writer in race reports.
            lad.last_writer = me as u64 + 1;
        }
        lad.wr = wr;
        lad.rd = rd;
        if self.cfg.invalidation == InvalidationPolicy::Directory {
            let bit = 1u64 << me;
            if written {
                // Everyone else who holds a copy drops it at its next
                // acquire.
                let others = lad.sharers & !bit;
                for q in 0..self.nprocs {
                    if others & (1 << q) != 0 {
                        self.post_invalidation(q, seg.app(idx))?;
                    }
                }
                lad.sharers = bit;
            } else {
                lad.sharers |= bit;
            }
        }
        m.cur_wr = wr;
        m.cur_rd = rd;
        // The twin is now the version the LAD names where this transaction
        // made it so: a floating merge (the merged version, or the other's
        // if we had nothing to add), a clean copy taken for an atomic, or
        // our own copy published (or found equal) at the last writer.
        m.twin_wr = if !fixed && (dirty || (remote && matches!(kind, TxKind::Atomic(..)))) {
            wr
        } else {
            0
        };
        m.home = if fixed {
            home as u32 + 1
        } else {
            self.lad_holder(seg, idx, lad) as u32 + 1
        };
        // State.
        let new_state = match kind {
            TxKind::PinnedRefresh | TxKind::StaleRefresh => BlockState::Pinned,
            _ if pinned => BlockState::Pinned,
            _ if write_protected => BlockState::ReadonlyClean,
            _ => was,
        };
        // A clean block stays listed in the write set until a release
        // fence drops its entry (`release_block`): clearing the mark here,
        // in a transaction outside a release (a relaxed atomic, a miss),
        // let the next write list the block a second time.
        m.state = new_state;
        // A prefetch's caller protects its blocks together; a copy protected
        // before the merge is read-only already.
        let protected_already = protect_before && new_state.prot() == libc::PROT_READ;
        if m.missing != 0 {
            // A partial read: only its page becomes accessible.
            let page = crate::sys::page_size();
            let at = page * (m.missing.trailing_ones() as usize);
            layout::protect(seg.app(idx) + at, page, new_state.prot())?;
        } else if (new_state != was || !was.readable() || had_missing)
            && !protected_already
            && !matches!(kind, TxKind::Prefetch | TxKind::StaleRefresh)
        {
            // (A copy that was partial is made accessible whole.)
            self.protect(seg, idx, new_state)?;
        }
        self.add_to_read_set(seg, idx, m);
        // Fast-release bookkeeping.
        if write_protected {
            m.wr_count = 0;
            m.fast_rel_threshold = 1;
        } else if written {
            m.wr_count = 0;
            m.fast_rel_threshold =
                (m.fast_rel_threshold.max(1) * 2).min(self.cfg.max_fast_releases);
        } else {
            m.wr_count += m.fast_rel_count + 1;
            m.fast_rel_threshold = 1;
        }
        m.fast_rel_count = 0;
        m.idle_releases = 0;
        // Whenever our copy is the latest version (also after a floating
        // merge, or a transaction that found nothing written): our LAD slot
        // describes it and the lock stays here.
        m.written_last = !fixed && lad.last_writer == me as u64 + 1;
        Ok((old, written, exported && dirty, copied_back_to))
    }

    /// Fast release (Endo 2020 §3.4.6, Listing 3.1) of a writable block we
    /// were the last writer of: if our lock word still says the lock is
    /// free here (nobody took the block since), the lock is taken here
    /// without a message, a new interval stored in our own LAD slot, and
    /// the release is complete. Likewise for a block another process
    /// wrote last whose latest version our twin holds (see
    /// `BlockMeta::twin_wr`; the LAD here still names it): our changes on
    /// top of it become the next version, and we its last writer, with no
    /// read of the other's copy and no merge (a *taken* release). The
    /// write notice carries the *new* interval, so a reader holding the
    /// previous version always drops it (the original published the
    /// previous interval in some paths: a stale-read hole).
    ///
    /// The twin then becomes a copy of the released version — what the
    /// other processes read of the block from now on (under its lock, so
    /// never half copied) — so that a later release can tell whether
    /// anything was written since: an *idle* release (the copy equal to its
    /// twin) announces nothing at all — in an OpenMP program a block
    /// written in one phase is released at every barrier of the others,
    /// and a new interval each time made every reader drop its copy. After a few idle releases in
    /// a row (the block's adaptive limit, see [`idle_limit`]) the block is
    /// protected and leaves the write set, so blocks written once cost
    /// nothing at later releases.
    ///
    /// With `defer`, a block due to be protected is left as it is and
    /// `*defer` set: the caller protects it together with its neighbours
    /// under the same entry lock ([`Space::protect_idle_run`]). `clean`:
    /// this fence's dirty scan found none of the block's pages written
    /// (see [`Space::unchanged_since_release`]).
    pub(super) fn fast_release(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        defer: Option<&mut bool>,
        clean: bool,
    ) -> DsmResult<bool> {
        if !self.cfg.fast_release_active() {
            return Ok(false);
        }
        // A writable block whose latest version is another process's, and
        // which we have not changed since we took it (the program's stores
        // rewrote the values it held: a sweep writing zeros over zeros, far
        // from where a solution has spread): nothing to announce, so no
        // transaction — an idle release. (It was a transaction at every
        // release, which merged nothing and protected the block, and the
        // next sweep's store faulted again.) Our copy is the version we took
        // — what the twin holds — and stays valid until a write notice
        // drops it. Not under fast read: its readers copy the copy of the
        // process a write notice named, without the lock, and the merge's
        // notice re-announcing the latest version is what points them away
        // from ours (the scenario `handed_parts` read a rewrite's zeros).
        // Whether a comparison below found the copy changed (a second one
        // would find it changed too, or rewritten to its released values,
        // which the transaction the caller then runs handles alike).
        let seen_changed = core::cell::Cell::new(false);
        let unchanged = |space: &Self, m: &mut BlockMeta| {
            let u = space.unchanged_since_release(seg, idx, m, clean);
            seen_changed.set(seen_changed.get() || !u);
            u
        };
        if m.state == BlockState::Writable
            && !m.written_last
            && !self.cfg.fast_read_active()
            && unchanged(self, m)
        {
            return self.idle_release(seg, idx, m, defer);
        }
        // Either we wrote the latest version, or our twin is the version
        // our last transaction took (refreshing a block the processes
        // write in turn): if nobody took the block's lock since, that is
        // still the latest version, and our changes on top of it become
        // the next one here, as if we had written the last one.
        let on_latest = m.twin_wr != 0 && m.twin_wr == m.cur_wr;
        if !(m.state.writable() && (m.written_last || on_latest)) {
            return Ok(false);
        }
        // A block that was idle at the last release and stays listed when
        // idle (pinned, or not yet at its idle limit) and is still unchanged:
        // an idle release needs neither the global lock nor the LAD — it
        // announces nothing, whoever wrote the block last, and the twin
        // stays as it is. (A call stack's live blocks are released idle at
        // every barrier of a loop of barriers; the lock's message-free
        // round trip was a tenth of such a barrier.) A comparison that
        // races with a writer finds a change, and the locked path below
        // compares again.
        if m.written_last
            && m.idle_releases > 0
            && !self.cfg.fast_read_active()
            && stays_listed_when_idle(m)
            && unchanged(self, m)
        {
            self.count_idle_release(m);
            return Ok(true);
        }
        let site = self.block_site(seg, idx);
        // Cheap early exit: the lock has moved on. A copy unchanged since
        // its last release still announces nothing, whoever holds the lock
        // now (a transaction here merged nothing and took the lock away
        // from the process that is writing the block next: when two
        // processes write a block in turn, the one that wrote last, idle
        // now, took it back from the one that had just taken the latest
        // version).
        if !qlock::owned_here(&self.com, &site)? {
            if !self.cfg.fast_read_active() && !seen_changed.get() && unchanged(self, m) {
                return self.idle_release(seg, idx, m, defer);
            }
            return Ok(false);
        }
        // Taken here without a message (our word says `OWNED`, unless a
        // process took it since the test above: then we wait our turn), and
        // held while we look at the block and update its published version:
        // the twin, which is what others read of a block we are the last
        // writer of (see `transaction_locked`).
        let mut lad = self.lock_block(seg, idx)?;
        let ours = lad.last_writer == self.rank as u64 + 1;
        // Or the version our twin holds is still the latest (the LAD names
        // it), and our copy is based on it.
        let taken = on_latest && lad.last_writer != 0 && m.twin_wr == lad.wr;
        if !(ours || taken) {
            // Written elsewhere since: merged by a transaction.
            self.unlock_block(seg, idx, lad)?;
            return Ok(false);
        }
        let r = self.fast_release_locked(seg, idx, m, defer, &mut lad, clean);
        self.unlock_block(seg, idx, lad)?;
        r
    }

    /// [`Space::fast_release`] with the block's global lock held and `lad`
    /// its LAD (updated here for a new interval).
    fn fast_release_locked(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        defer: Option<&mut bool>,
        lad: &mut Lad,
        clean: bool,
    ) -> DsmResult<bool> {
        let bs = seg.block_size;
        // Nothing written since the version we published (the twin) — or
        // written and restored: no other process can hold a state from in
        // between, since they read the twin, not the copy. Not under fast
        // read, whose readers copy the copy without the lock.
        if !self.cfg.fast_read_active()
            && self.unchanged_since_release(seg, idx, m, clean)
            && self.idle_release(seg, idx, m, defer)?
        {
            return Ok(true);
        }
        let skip = self.dead_words(seg, idx);
        // SAFETY: as in `release_view`, and the twin is ours to write: we
        // hold the block's lock, which every other process reading it (the
        // latest version is our twin) or writing a word of it holds too.
        let (data, twin) = unsafe {
            (
                diff::words_mut(seg.sys(idx), bs),
                diff::words_mut(seg.twin_of(idx), bs),
            )
        };
        // Enough fast releases in a row: a transaction (the caller's).
        if m.fast_rel_count >= m.fast_rel_threshold.max(1) {
            return Ok(false);
        }
        let (wr, rd) = self.next_interval(lad, true);
        lad.wr = wr;
        lad.rd = rd;
        // The released version becomes the twin: what the others read from
        // now on, and the base of our next merge. A word another thread of
        // this process writes while we copy may land in it: it is then
        // covered by the write notice pushed below, which every later
        // release of this process carries in its signature. Only the live
        // part: the next release compares only what is live then (if the
        // stack has grown deeper, the part it compares that was not copied
        // makes it announce the block once more; so would the frames that
        // changed there), and copying the whole block was a tenth of a team
        // barrier's cost.
        twin[skip..].copy_from_slice(&data[skip..]);
        // (Equal now: see `BlockMeta::armed`.)
        m.armed = seg.tracked;
        if lad.last_writer != self.rank as u64 + 1 {
            // Our changes on top of the latest version (our twin, see
            // `BlockMeta::twin_wr`): we are its last writer now, and the
            // others read this version from our twin.
            lad.last_writer = self.rank as u64 + 1;
            m.written_last = true;
            m.home = self.rank as u32 + 1;
            bump(&self.stats.taken_releases);
        }
        m.twin_wr = wr;
        bump(&self.stats.fast_releases);
        m.fast_rel_count += 1;
        m.idle_releases = 0;
        m.wr_count = 0;
        m.cur_wr = wr;
        m.cur_rd = rd;
        self.rel_sig
            .lock()
            .push(WriteNotice::new(seg.app(idx), self.rank, wr, rd));
        Ok(true)
    }

    /// Counts an idle release of a block that stays in the write set (see
    /// [`stays_listed_when_idle`]); a write-shared pin idle long enough is
    /// unpinned.
    pub(super) fn count_idle_release(&self, m: &mut BlockMeta) {
        bump(&self.stats.idle_releases);
        m.idle_releases += 1;
        super::release::unpin_if_idle(m);
    }

    /// The release of block `idx` (dirty, its entry lock held), found
    /// unchanged since the version it was last released or taken as: counted
    /// as idle; a writable block at its idle limit is protected, or left to
    /// the caller to protect with its neighbours under `defer` (see
    /// [`Space::fast_release`]), and leaves the write set. Nothing is
    /// announced and the block's global lock is not needed: whichever
    /// process holds the latest version, protecting our copy of the version
    /// we hold changes nothing any other process reads. Pinned blocks are
    /// never protected. Returns `false` if the block was written meanwhile
    /// (it is writable again and must be released as written).
    fn idle_release(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        defer: Option<&mut bool>,
    ) -> DsmResult<bool> {
        if stays_listed_when_idle(m) {
            self.count_idle_release(m);
            return Ok(true);
        }
        if let Some(d) = defer {
            *d = true;
            return Ok(true);
        }
        let bs = seg.block_size;
        layout::protect(seg.app(idx), bs, libc::PROT_READ)?;
        if self.idle_protected(seg, idx, m, false) {
            return Ok(true);
        }
        // Written meanwhile: writable again, and released as written.
        layout::protect(seg.app(idx), bs, BlockState::Writable.prot())?;
        Ok(false)
    }
}

/// Idle releases in a row after which a writable block is protected and
/// leaves the write set, until the block adapts. Each idle release compares
/// the whole block with its last released version, which for the arrays of
/// an OpenMP program is a read of memory that left the cache long ago
/// (about 1 µs for a 4 KiB block): the multigrid kernel writes each grid
/// once per V-cycle and then releases it at some 170 barriers that do not
/// touch it, so a limit of 8 spent more time comparing than computing.
const IDLE_LIMIT_START: u32 = 2;
/// The largest limit a block adapts to: a block written again every few
/// releases (data under a lock, a counter array updated in every phase)
/// costs an idle comparison at each release in between, less than a write
/// fault and an `mprotect` each time.
const IDLE_LIMIT_MAX: u32 = 16;
/// The limit of a block that is rewritten within [`REWRITE_GAP_SHORT`]
/// releases of being protected even at [`IDLE_LIMIT_MAX`]: one its
/// program keeps writing without changing it (a converged solution vector
/// that `x += alpha * p` no longer moves, zeros written over zeros), which
/// every release finds idle however often it is written. Protecting such a
/// block every [`IDLE_LIMIT_MAX`] releases cost a write fault and two
/// `mprotect` calls each time (the CG kernel at class W on 2 processes,
/// whose solution vector stops changing once it has converged, took 1,857
/// write faults in all, 546 with this limit). It stays listed until this
/// many idle releases in a row show that its program stopped writing it.
const IDLE_LIMIT_REWRITTEN: u32 = 255;
/// A block rewritten at most this many releases after idle releases
/// protected it would have been cheaper to keep listed: the `mprotect`
/// calls and the fault of protecting and rewriting a block cost about as
/// much as this many idle comparisons (measured with the IS kernel, whose
/// arrays are rewritten every five or six releases, and MG, whose grids
/// mostly wait longer).
const REWRITE_GAP_SHORT: u32 = 4;

/// Idle releases in a row after which block `m` is protected (see
/// [`Space::note_rewrite`] for how the limit adapts).
/// Whether an idle release leaves block `m` writable and listed: pinned
/// blocks always, writable ones below their idle limit (at the limit they
/// are protected).
fn stays_listed_when_idle(m: &BlockMeta) -> bool {
    m.idle_releases + 1 < idle_limit(m) || m.state != BlockState::Writable
}

fn idle_limit(m: &BlockMeta) -> u32 {
    if m.idle_limit == 0 {
        IDLE_LIMIT_START
    } else {
        u32::from(m.idle_limit)
    }
}

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    /// What a release compares of block `idx` (whose entry lock the caller
    /// holds): this process's copy and twin, read only, and the number of
    /// leading words to skip. Only live memory counts: on a call stack, what
    /// lies below the thread's program frames changes with every call into
    /// the runtime (a thread waiting for a flag flushes in a loop) and
    /// nobody reads it.
    fn release_view(&self, seg: &Segment<U>, idx: usize) -> (&[u64], &[u64], usize) {
        let bs = seg.block_size;
        // SAFETY: this process's copy and twin of the block, under its entry
        // lock, read only. The copy may be written by this process's threads
        // meanwhile (a word written after a release's comparison is a write
        // after that release, announced by a later one); the twin only by
        // this process under the block's locks, or by another process's
        // atomic on a word of it under the global lock (a comparison that
        // sees half of it finds a change, and the release merges: compared
        // with `diff::same`, which reads each word once, not `memcmp`).
        let (data, twin): (&[u64], &[u64]) = unsafe {
            (
                diff::words_mut(seg.sys(idx), bs),
                diff::words_mut(seg.twin_of(idx), bs),
            )
        };
        (data, twin, self.dead_words(seg, idx))
    }

    /// Leading words of block `idx` that a release skips: dead stack
    /// memory below the program's frames (0 outside call stacks).
    fn dead_words(&self, seg: &Segment<U>, idx: usize) -> usize {
        self.stack_live.get().map_or(0, |l| {
            l.dead_prefix(seg.app(idx), super::live::stack_pointer())
        }) / 8
    }

    /// Whether this process's copy of block `idx` (entry `m`, locked) is
    /// still what it last released (as a release compares it, live memory
    /// only). Known without comparing where this fence's dirty scan found
    /// none of its pages written (`clean`) and the copy is armed (see
    /// [`BlockMeta::armed`]); otherwise compared, and a copy found equal on
    /// a tracked segment is armed from now on.
    pub(super) fn unchanged_since_release(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        clean: bool,
    ) -> bool {
        if clean && m.armed {
            bump(&self.stats.scanned_idle);
            return true;
        }
        let (data, twin, skip) = self.release_view(seg, idx);
        let unchanged = diff::same(&data[skip..], &twin[skip..]);
        if unchanged && seg.tracked {
            m.armed = true;
        }
        unchanged
    }

    /// The second half of an idle release that protects block `idx`, whose
    /// application view the caller has just made read-only: looks at the
    /// copy again, since a word another thread of this process wrote after
    /// the release's comparison would otherwise be left in a protected,
    /// clean copy that no release ever announces, and a reader would keep
    /// its old copy (a thread flushing in a wait loop counts idle releases
    /// fast, while its neighbour may be writing the block). If it is
    /// unchanged the block becomes read-only and clean (it leaves the write
    /// set in `release_block`; the next write faults and lists it again,
    /// and the twin, the base of the changes since the last transaction,
    /// then starts a clean diff) and this returns `true`; if not, the
    /// caller makes it writable again. `clean`: a look at the kernel's
    /// record of writes, after the block was made read-only, found none of
    /// its pages written (see [`Space::unchanged_since_release`]).
    pub(super) fn idle_protected(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        clean: bool,
    ) -> bool {
        if !self.unchanged_since_release(seg, idx, m, clean) {
            return false;
        }
        bump(&self.stats.idle_releases);
        m.state = BlockState::ReadonlyClean;
        m.idle_releases = 0;
        m.idled_at = self.release_count().max(1);
        true
    }

    /// This process's release fences so far (wrapping).
    pub(super) fn release_count(&self) -> u32 {
        self.release_count.load(Ordering::Relaxed)
    }

    /// Counts a release fence (under the release lock).
    pub(super) fn count_release(&self) {
        self.release_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Block `m` is made writable again (a write fault, or write-ahead
    /// after one on its neighbour) `gap` releases after idle releases
    /// protected it. A block rewritten every `P` releases costs `P - 1` idle
    /// comparisons between its writes if it stays listed, and `limit` of
    /// them plus two `mprotect` calls and a fault or a write-ahead if it is
    /// protected: the latter is the loss when the gap is short, so then its
    /// limit grows to cover the whole period (up to [`IDLE_LIMIT_MAX`], and
    /// past it to [`IDLE_LIMIT_REWRITTEN`] if the gap is still short there:
    /// a block rewritten without being changed); a block rewritten much
    /// later (a grid of the next V-cycle) keeps its limit.
    pub(super) fn note_rewrite(&self, m: &mut BlockMeta) {
        if m.idled_at == 0 {
            return;
        }
        let gap = self.release_count().wrapping_sub(m.idled_at);
        if gap <= REWRITE_GAP_SHORT {
            let limit = idle_limit(m);
            m.idle_limit = if limit >= IDLE_LIMIT_MAX {
                IDLE_LIMIT_REWRITTEN
            } else {
                (limit + gap + 1).min(IDLE_LIMIT_MAX)
            } as u8;
        }
        m.idled_at = 0;
    }
}

/// The maximal runs of contiguous blocks among `idxs` (ascending) with
/// one `key` (positions whose key is `None` are in no run), as ranges of
/// positions in `idxs` with their key.
pub(super) fn contiguous_runs<K: PartialEq>(
    idxs: &[usize],
    key: impl Fn(usize) -> Option<K>,
) -> Vec<(core::ops::Range<usize>, K)> {
    let mut runs = Vec::new();
    let mut k = 0;
    while k < idxs.len() {
        let Some(first) = key(k) else {
            k += 1;
            continue;
        };
        let mut n = 1;
        while k + n < idxs.len()
            && idxs[k + n] == idxs[k] + n
            && key(k + n).as_ref() == Some(&first)
        {
            n += 1;
        }
        runs.push((k..k + n, first));
        k += n;
    }
    runs
}
