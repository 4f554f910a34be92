//! Acquire fences: write notices and the minimum write timestamp drop stale
//! copies (Endo 2020 §3.4.5).

use core::cmp::Reverse;
use core::sync::atomic::Ordering;

use ct_worker::{JoinHandleItf, UltItf};

use crate::com::Communicator;

use super::super::config::InvalidationPolicy;
use super::super::diff;
use super::super::error::DsmResult;
use super::super::layout;
use super::super::segment::{BlockMeta, BlockState, Lad, Segment};
use super::super::signature::{Signature, WriteNotice};
use super::transaction::{Fetched, contiguous_runs};
use super::{Space, TxKind, bump, parallel_tasks};

/// Bytes of hot blocks one refresh batch fetches at most (one buffer of
/// this size, reused; one read per run of blocks held by one process).
const REFRESH_BATCH_BYTES: usize = 1 << 20;

/// Bytes of contiguous stale pins one access merges at most (see
/// `Space::refresh_stale_run`): an OpenMP loop that reads what the other
/// processes wrote of an array reads on through its neighbours.
const STALE_RUN_BYTES: usize = 256 * 1024;

/// Eager merges of a new write-shared pin before it tries a deferral (see
/// `Space::defers_refresh`); a spell after a deferral that ended in an
/// access is this many times `2^k` for the `k`th such deferral in a row,
/// up to `EAGER_SPELLS_MAX` (2048 acquires).
pub(super) const EAGER_REFRESHES: u16 = 8;
const EAGER_SPELLS_MAX: u8 = 8;

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    // ---------------------------------------------------------------
    // Invalidation and acquire

    /// Drops our copy of block `idx` (pinned blocks are refreshed in place).
    pub(super) fn invalidate(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
    ) -> DsmResult<()> {
        if self.mark_invalid(m) {
            return self.protect(seg, idx, m.state);
        }
        match m.state {
            BlockState::Pinned => {
                bump(&self.stats.invalidations);
                m.eager_refreshes = m.eager_refreshes.saturating_sub(1);
                self.transaction(seg, idx, m, TxKind::PinnedRefresh)?;
            }
            // Stale again before this process touched it: deferring the
            // merge saved one.
            BlockState::PinnedStale => m.stale_saved = true,
            _ => {}
        }
        Ok(())
    }

    /// Whether an acquire that finds the pinned copy `m` stale defers its
    /// merge to the next access (see [`BlockState::PinnedStale`]): a
    /// write-shared pin outside a spell of eager merges. A pin starts with
    /// [`EAGER_REFRESHES`] eager merges, then tries a deferral: one that
    /// saves a merge (another notice comes before the access) keeps the
    /// block deferring; one that ends in an access without saving one
    /// starts a spell of eager merges twice as long as the last. Stacks
    /// pinned by their threads are merged at once: their threads run on
    /// them.
    fn defers_refresh(&self, m: &BlockMeta) -> bool {
        m.shared_pin && m.pins == 0 && m.eager_refreshes == 0
    }

    /// Merges the latest version into the stale pinned copy of block `idx`
    /// (entry `m`, whose access just faulted) and into those of the blocks
    /// after it that are stale pins too — up to [`STALE_RUN_BYTES`], their
    /// entries free — and pins them again with one `mprotect`; returns how
    /// many blocks it merged. The run counts as accessed: those of its
    /// blocks whose deferral saved no merge start a spell of eager merges
    /// (see [`Self::defers_refresh`]) together.
    pub(super) fn refresh_stale_run<'s>(
        &self,
        seg: &'s Segment<U>,
        idx: usize,
        m: ct_sync::MutexGuard<'s, BlockMeta, U>,
    ) -> DsmResult<usize> {
        debug_assert_eq!(m.state, BlockState::PinnedStale);
        let bs = seg.block_size;
        let end = (idx + (STALE_RUN_BYTES / bs).max(1)).min(seg.nblocks);
        let mut held = vec![(idx, m)];
        for j in idx + 1..end {
            // Entries are taken in ascending order, and never waited for.
            let Some(m) = seg.entry(j).try_lock() else {
                break;
            };
            if m.state != BlockState::PinnedStale {
                break;
            }
            held.push((j, m));
        }
        for (_, m) in held.iter_mut() {
            if m.stale_saved {
                m.eager_spells = 0;
            } else {
                m.eager_spells = (m.eager_spells + 1).min(EAGER_SPELLS_MAX);
                m.eager_refreshes = EAGER_REFRESHES << m.eager_spells;
            }
        }
        // (On an error the DSM fails: the blocks stay inaccessible.)
        self.merge_pinned(seg, &mut held, TxKind::StaleRefresh)?;
        layout::protect(seg.app(idx), held.len() * bs, BlockState::Pinned.prot())?;
        Ok(held.len())
    }

    /// Merges the latest versions into the pinned copies `blocks` of `seg`
    /// (ascending, their entries locked; write-shared pins, stale or not)
    /// as `kind` transactions would, in one batch: their global locks
    /// taken together ([`Space::lock_for_prefetch`]), one read per run of
    /// contiguous blocks whose latest version is at the same other process,
    /// all in flight together. A [`TxKind::StaleRefresh`] leaves the
    /// protection to the caller.
    pub(super) fn merge_pinned<M: core::ops::DerefMut<Target = BlockMeta>>(
        &self,
        seg: &Segment<U>,
        blocks: &mut [(usize, M)],
        kind: TxKind,
    ) -> DsmResult<()> {
        if let [(j, m)] = blocks {
            // Alone: the plain transaction costs as many round trips and
            // less bookkeeping.
            return self.transaction(seg, *j, m, kind).map(drop);
        }
        if blocks.is_empty() {
            return Ok(());
        }
        let bs = seg.block_size;
        let idxs: Vec<usize> = blocks.iter().map(|(j, _)| *j).collect();
        let homes: Vec<u32> = blocks.iter().map(|(_, m)| m.home).collect();
        let (mut lads, tmp, fetched) = self.lock_and_fetch(seg, &idxs, &homes)?;
        let fresh = &tmp.buf;
        for (k, ((j, m), lad)) in blocks.iter_mut().zip(lads.iter_mut()).enumerate() {
            let m: &mut BlockMeta = m;
            bump(&self.stats.transactions);
            m.force_tx = false;
            let was = m.state;
            let latest = fetched[k].then(|| &fresh[k * bs / 8..(k + 1) * bs / 8]);
            let (_, written, exported, _) = self.transaction_locked(
                seg,
                *j,
                m,
                kind,
                was,
                was.dirty(),
                lad,
                latest.map_or(Fetched::No, Fetched::Buffer),
            )?;
            self.unlock_announcing(seg, *j, *lad, written || exported)?;
        }
        Ok(())
    }

    /// Takes the global locks of blocks `idxs` of `seg` (ascending, see
    /// [`Space::lock_for_prefetch`]) and reads their latest versions into
    /// one buffer: speculatively with the swaps, a read per run of
    /// contiguous blocks whose last writer `homes` names (as
    /// `BlockMeta::home` does) where their locks are tried there; what that
    /// did not bring, one read per run of contiguous blocks held by the
    /// same other process, all in flight together. Returns their LADs, the
    /// buffer (block `k`'s version at words `k * bs / 8 ..`) and which
    /// blocks were read (not those whose latest version is ours).
    fn lock_and_fetch(
        &self,
        seg: &Segment<U>,
        idxs: &[usize],
        homes: &[u32],
    ) -> DsmResult<(Vec<Lad>, super::Tmp<'_>, Vec<bool>)> {
        let bs = seg.block_size;
        let mut tmp = self.tmp(idxs.len() * bs);
        // Each run of contiguous blocks with one known last writer (other
        // than us) is read speculatively with the swaps that try their
        // locks, into the buffer.
        let expect = |k: usize| {
            let h = homes[k] as usize;
            (h != 0 && h != self.rank + 1).then(|| h - 1)
        };
        let runs = contiguous_runs(idxs, expect);
        let ranges: Vec<_> = runs.iter().map(|(r, _)| r.clone()).collect();
        let mut spec: Vec<_> = run_bytes(&mut tmp.buf, &ranges, bs)
            .into_iter()
            .zip(runs)
            .map(|(buf, (r, expect))| self.run_read(seg, idxs[r.start], r, expect, buf))
            .collect();
        let (lads, have, _) = self.lock_for_prefetch(seg, idxs, &mut spec)?;
        drop(spec);
        let mut fetched = have.clone();
        let runs = self.remote_runs(seg, idxs, &lads, &have);
        let ranges: Vec<_> = runs.iter().map(|&(k, n, _)| k..k + n).collect();
        let mut reads = Vec::new();
        for (dst, &(k, n, home)) in run_bytes(&mut tmp.buf, &ranges, bs).into_iter().zip(&runs) {
            fetched[k..k + n].fill(true);
            reads.push((self.latest_win(seg).at(home, seg.offset(idxs[k])), dst));
        }
        self.com.read_all(&mut reads)?;
        drop(reads);
        Ok((lads, tmp, fetched))
    }

    /// The first half of [`Space::invalidate`] for a copy that is simply
    /// dropped (readable or writable, not pinned) or a write-shared pin
    /// whose merge is deferred (see [`Self::defers_refresh`]): marks it
    /// invalid (or [`BlockState::PinnedStale`]) and returns `true`; the
    /// caller then takes away the application view's access (`PROT_NONE`).
    /// Returns `false`, changing nothing, for the other states.
    fn mark_invalid(&self, m: &mut BlockMeta) -> bool {
        let new = match m.state {
            BlockState::ReadonlyClean => BlockState::InvalidClean,
            BlockState::ReadonlyDirty | BlockState::Writable => BlockState::InvalidDirty,
            BlockState::Pinned => {
                if !self.defers_refresh(m) {
                    return false;
                }
                bump(&self.stats.invalidations);
                bump(&self.stats.deferred_refreshes);
                m.state = BlockState::PinnedStale;
                m.stale_unchanged = false;
                m.stale_saved = false;
                return true;
            }
            _ => return false,
        };
        bump(&self.stats.invalidations);
        m.state = new;
        m.dropped = true;
        // (A partial copy keeps its `missing` pages: the next miss takes the
        // block's lock, see `Space::miss_needs_transaction`.)
        true
    }

    /// Takes away the access to a run of contiguous blocks of `seg` that
    /// [`Space::mark_invalid`] marked (their entry locks held in `run`,
    /// ascending) with one `mprotect`, and unlocks them: an acquire after a
    /// phase that rewrote a whole array drops hundreds of neighbouring
    /// copies, and one call per block also split the mapping into one area
    /// per block.
    fn protect_invalid_run(
        &self,
        seg: &Segment<U>,
        run: &mut Vec<(usize, ct_sync::MutexGuard<'_, BlockMeta, U>)>,
    ) -> DsmResult<()> {
        let Some(&(first, _)) = run.first() else {
            return Ok(());
        };
        let r = layout::protect(seg.app(first), run.len() * seg.block_size, libc::PROT_NONE);
        run.clear();
        r
    }

    /// Acquire fence with a signature: drops every copy a write notice or
    /// the minimum write timestamp makes stale.
    pub fn acquire(&self, sig: &mut Signature) -> DsmResult<()> {
        let _rt = self.enter()?;
        let r = self.acquire_inner(sig);
        self.guard(r)
    }

    pub(crate) fn acquire_inner(&self, sig: &mut Signature) -> DsmResult<()> {
        let _t = self.stats.timed(&self.stats.acquire_ns);
        if self.cfg.invalidation == InvalidationPolicy::Directory {
            return self.drain_invalidations();
        }
        let notices = sig.notices();
        let mut refresh = Vec::new();
        let tasks = parallel_tasks::<U>(notices.len(), self.nprocs);
        let r = if tasks > 1 {
            self.apply_notices_parallel(notices.to_vec(), tasks)
        } else {
            self.apply_notices(notices, Some(&mut refresh))
        };
        // Listed copies are stale but readable: refreshed, or dropped if the
        // acquire fails.
        r.and_then(|()| self.self_invalidate(sig.min_wr_ts(), Some(&mut refresh)))
            .and_then(|()| self.refresh(&mut refresh))
            .inspect_err(|_| self.drop_listed(&refresh))
    }

    /// Whether an acquire that finds block `idx`'s copy stale refreshes it
    /// (see [`Self::refresh`]) rather than dropping it: a hot, clean,
    /// readable copy with refreshes left (counted down here). A copy listed
    /// already says so again.
    fn keep_for_refresh(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) -> bool {
        if m.refresh_pending {
            return true;
        }
        if m.refreshes == 0
            || m.state != BlockState::ReadonlyClean
            || m.missing != 0
            || m.pins > 0
            || m.force_tx
            || self.is_fixed_home(seg, idx)
        {
            return false;
        }
        m.refreshes -= 1;
        m.refresh_pending = true;
        true
    }

    /// Refresh of hot blocks: the stale copies an acquire listed (still
    /// readable, see [`Self::keep_for_refresh`]) are fetched anew, per
    /// segment in batches of up to [`REFRESH_BATCH_BYTES`] into a reused
    /// buffer, each as a prefetch is (their global locks tried at
    /// once, one read per run held by the same process), and stay readable:
    /// no fault, no `mprotect`. Only the words that changed are rewritten,
    /// so this process's threads reading the others (as a data-race-free
    /// program may, before its own acquire completes) see no change.
    ///
    /// `list` holds application addresses of blocks; it is emptied.
    fn refresh(&self, list: &mut Vec<usize>) -> DsmResult<()> {
        if list.is_empty() {
            return Ok(());
        }
        list.sort_unstable();
        list.dedup();
        let mut k = 0;
        while k < list.len() {
            let Some((seg, first)) = self.locate(list[k]) else {
                k += 1;
                continue;
            };
            let mut n = 1;
            while k + n < list.len()
                && self
                    .locate(list[k + n])
                    .is_some_and(|(s, _)| s.id == seg.id)
            {
                n += 1;
            }
            let mut held = Vec::with_capacity(n);
            for &addr in &list[k..k + n] {
                let idx = first + (addr - list[k]) / seg.block_size;
                // Entries in ascending order, as every nesting of them.
                let mut m = seg.entry(idx).lock();
                if m.refresh_pending {
                    m.refresh_pending = false;
                    if m.state == BlockState::ReadonlyClean {
                        held.push((idx, m));
                    } else {
                        // Upgraded meanwhile (a write fault of another
                        // thread of ours, a pin) on top of the stale copy:
                        // dropped as the notice would have had it.
                        self.invalidate(seg, idx, &mut m)?;
                    }
                }
            }
            // In batches of about `REFRESH_BATCH_BYTES` (at least one
            // block), each fetched into one reused buffer.
            let per = (REFRESH_BATCH_BYTES / seg.block_size).max(1);
            let r = held
                .chunks_mut(per)
                .try_for_each(|batch| self.refresh_run(seg, batch));
            if r.is_err() {
                for (idx, m) in held.iter_mut() {
                    let _ = self.invalidate(seg, *idx, m);
                }
            }
            r?;
            k += n;
        }
        list.clear();
        Ok(())
    }

    /// Refreshes the copies `blocks` of `seg` (ascending, clean and readable,
    /// their entries locked): [`Self::refresh`] for one segment.
    fn refresh_run(
        &self,
        seg: &Segment<U>,
        blocks: &mut [(usize, ct_sync::MutexGuard<'_, BlockMeta, U>)],
    ) -> DsmResult<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let bs = seg.block_size;
        let idxs: Vec<usize> = blocks.iter().map(|(j, _)| *j).collect();
        let homes: Vec<u32> = blocks.iter().map(|(_, m)| m.home).collect();
        let (mut lads, tmp, fetched) = self.lock_and_fetch(seg, &idxs, &homes)?;
        let fresh = &tmp.buf;
        for (k, ((j, m), lad)) in blocks.iter_mut().zip(lads.iter_mut()).enumerate() {
            if fetched[k] {
                let new = &fresh[k * bs / 8..(k + 1) * bs / 8];
                // SAFETY: our copy of block `j` (`bs` bytes, 8-aligned),
                // whose entry lock we hold: no other thread writes it
                // meanwhile (this process's may read it, through the
                // application view, and see no store to a word that did
                // not change).
                unsafe { diff::write_changed(seg.sys(*j).cast::<u64>(), new) };
            }
            bump(&self.stats.transactions);
            self.transaction_locked(
                seg,
                *j,
                m,
                TxKind::Prefetch,
                BlockState::ReadonlyClean,
                false,
                lad,
                Fetched::No,
            )?;
            self.unlock_block(seg, *j, *lad)?;
            bump(&self.stats.refreshed);
        }
        Ok(())
    }

    /// Drops the copies still listed for refresh (an acquire that failed).
    fn drop_listed(&self, list: &[usize]) {
        for &addr in list {
            if let Some((seg, idx)) = self.locate(addr) {
                let mut m = seg.entry(idx).lock();
                if m.refresh_pending {
                    m.refresh_pending = false;
                    let _ = self.invalidate(seg, idx, &mut m);
                }
            }
        }
    }

    /// Invalidates the copies that `notices` make stale, remembering each
    /// notice's writer and interval for a later fast read.
    ///
    /// With `refresh`, a stale copy of a hot block is listed there instead,
    /// still readable (see [`Self::keep_for_refresh`]).
    fn apply_notices(
        &self,
        notices: &[WriteNotice],
        mut refresh: Option<&mut Vec<usize>>,
    ) -> DsmResult<()> {
        // Copies dropped one after the other in the same segment lose their
        // access together (notices come in address order from each
        // release); their entry locks are held until then.
        let mut run: Vec<(usize, ct_sync::MutexGuard<'_, BlockMeta, U>)> = Vec::new();
        let mut run_seg: Option<&Segment<U>> = None;
        for wn in notices {
            if wn.writer() == self.rank {
                continue;
            }
            let Some((seg, idx)) = self.locate(wn.block()) else {
                continue;
            };
            if let Some(rs) = run_seg
                && (!core::ptr::eq(rs, seg) || run.last().map(|r| r.0 + 1) != Some(idx))
            {
                run_seg = None;
                self.protect_invalid_run(rs, &mut run)?;
            }
            if self.is_fixed_home(seg, idx) {
                continue;
            }
            let mut m = seg.entry(idx).lock();
            if wn.wr_ts > m.cur_rd {
                m.remote_write_seen = true;
                if let Some(list) = refresh.as_deref_mut()
                    && self.keep_for_refresh(seg, idx, &mut m)
                {
                    list.push(seg.app(idx));
                    continue;
                }
                let marked = self.mark_invalid(&mut m);
                if !marked && let Err(e) = self.invalidate(seg, idx, &mut m) {
                    // The copies already marked lose their access all the
                    // same: a marked copy must never stay readable.
                    drop(m);
                    if let Some(rs) = run_seg {
                        let _ = self.protect_invalid_run(rs, &mut run);
                    }
                    return Err(e);
                }
                if !m.state.readable() {
                    m.home = wn.writer() as u32 + 1;
                    m.cur_wr = wn.wr_ts;
                    m.cur_rd = wn.rd_ts;
                }
                if marked {
                    run.push((idx, m));
                    run_seg = Some(seg);
                }
            }
        }
        if let Some(rs) = run_seg {
            self.protect_invalid_run(rs, &mut run)?;
        }
        Ok(())
    }

    /// [`Self::apply_notices`] in `tasks` strided chunks on threads of `U`
    /// (Endo 2020 §3.5.3: invalidations of an acquire fence run in
    /// parallel; the kernel serialises much of `mprotect`, so the gain is
    /// modest).
    fn apply_notices_parallel(&self, notices: Vec<WriteNotice>, tasks: usize) -> DsmResult<()> {
        // SAFETY: as in `release_parallel`: the space outlives every task
        // (it is only freed by `Dsm::finalize`, which cannot run while this
        // call borrows it), and every task is joined before we return.
        let me: &'static Self = unsafe { &*(self as *const Self) };
        let notices = std::sync::Arc::new(notices);
        let handles: Vec<_> = (1..tasks)
            .map(|t| {
                let notices = notices.clone();
                U::spawn(move || {
                    let mine: Vec<WriteNotice> =
                        notices.iter().copied().skip(t).step_by(tasks).collect();
                    me.apply_notices(&mine, None)
                })
            })
            .collect();
        let mine: Vec<WriteNotice> = notices.iter().copied().step_by(tasks).collect();
        let mut result = self.apply_notices(&mine, None);
        for h in handles {
            let r = h.join();
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Raises the acquire timestamp to `min` and drops every copy whose
    /// lease ends before it. With `refresh`, an expired copy of a hot block
    /// is listed there instead, still readable.
    fn self_invalidate(&self, min: u64, mut refresh: Option<&mut Vec<usize>>) -> DsmResult<()> {
        let prev = self.acq_ts.fetch_max(min, Ordering::AcqRel);
        if min <= prev {
            return Ok(());
        }
        let mut expired = Vec::new();
        {
            let mut rs = self.read_set.lock();
            while let Some(&Reverse((rd, addr))) = rs.peek() {
                if rd >= min {
                    break;
                }
                rs.pop();
                expired.push(addr);
            }
        }
        let mut back = Vec::new();
        for addr in expired {
            let Some((seg, idx)) = self.locate(addr) else {
                continue;
            };
            let mut m = seg.entry(idx).lock();
            if !m.state.readable() {
                m.in_read_set = false;
                continue;
            }
            if self.is_fixed_home(seg, idx) || m.cur_rd >= min {
                back.push(Reverse((m.cur_rd.max(min), addr)));
                continue;
            }
            if let Some(list) = refresh.as_deref_mut()
                && self.keep_for_refresh(seg, idx, &mut m)
            {
                // Listed again in the read set by the refresh.
                m.in_read_set = false;
                list.push(addr);
                continue;
            }
            self.invalidate(seg, idx, &mut m)?;
            if m.state.readable() {
                back.push(Reverse((m.cur_rd.max(min), addr)));
            } else {
                m.in_read_set = false;
            }
        }
        if !back.is_empty() {
            self.read_set.lock().extend(back);
        }
        Ok(())
    }
}

/// The bytes of `buf` (blocks of `bs` bytes, block `k` at words
/// `k * bs / 8 ..`) of each of `runs` (ascending, disjoint ranges of
/// blocks), one slice per run.
fn run_bytes<'b>(
    buf: &'b mut [u64],
    runs: &[core::ops::Range<usize>],
    bs: usize,
) -> Vec<&'b mut [u8]> {
    let mut out = Vec::with_capacity(runs.len());
    let mut rest = buf;
    let mut at = 0;
    for r in runs {
        let (_, tail) = core::mem::take(&mut rest).split_at_mut((r.start - at) * bs / 8);
        let (run, tail) = tail.split_at_mut(r.len() * bs / 8);
        rest = tail;
        at = r.end;
        // SAFETY: `run` is `r.len() * bs` bytes of plain words, borrowed
        // from `buf` for `'b` and disjoint from every other slice returned.
        out.push(unsafe {
            core::slice::from_raw_parts_mut(run.as_mut_ptr().cast::<u8>(), r.len() * bs)
        });
    }
    out
}
