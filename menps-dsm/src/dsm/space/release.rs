//! Release fences: every block with local changes is merged or fast
//! released, one after the other or in parallel on threads of `U`.

use core::sync::atomic::{Ordering, fence};

use ct_worker::{JoinHandleItf, UltItf};

use crate::com::Communicator;

use ct_sync::MutexGuard;

use super::super::error::DsmResult;
use super::super::layout;
use super::super::segment::{BlockMeta, BlockState, Segment};
use super::{PARALLEL_RELEASE_MIN, SHARED_PIN_IDLE, Space, TxKind, parallel_min};

/// Unpins a write-shared pinned block after [`SHARED_PIN_IDLE`] idle
/// releases in a row: an ordinary writable block again, which the next
/// releases protect if it stays idle.
pub(super) fn unpin_if_idle(m: &mut BlockMeta) {
    if m.shared_pin && m.idle_releases >= SHARED_PIN_IDLE {
        m.state = BlockState::Writable;
        m.shared_pin = false;
        m.contended_writes = 0;
        m.idle_releases = 0;
    }
}

/// An idle block whose protection a release deferred: its address, its
/// index in its segment and its entry lock.
type IdleBlock<'a, U> = (usize, usize, MutexGuard<'a, BlockMeta, U>);

/// The lists of a release fence, kept from one fence to the next.
#[derive(Default)]
pub(super) struct ReleaseBufs {
    /// The blocks listed in the write set when the fence began.
    blocks: Vec<usize>,
    /// Those of them in dead stack memory (listed again, unmerged).
    dead: Vec<usize>,
    /// Those that stay listed after their release.
    keep: Vec<usize>,
}

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    /// Releases block `idx` if it is in the write set; returns whether it
    /// stays there (still dirty: a fast release keeps it writable).
    ///
    /// `in_write_set` means "listed once": only this function, as it drops
    /// a block's entry, clears it. A transaction elsewhere (a miss, a
    /// relaxed atomic) may leave a listed block clean; its entry is dropped
    /// here at the next fence, and a write before then finds it listed.
    pub(super) fn release_block(&self, seg: &Segment<U>, idx: usize) -> DsmResult<bool> {
        let mut m = seg.entry(idx).lock();
        self.release_locked(seg, idx, &mut m, None)
    }

    /// [`Space::release_block`] under the entry lock the caller holds; with
    /// `defer`, an idle block due to be protected is left to the caller (see
    /// [`Space::fast_release`]), and counts as staying in the write set.
    fn release_locked(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        defer: Option<&mut bool>,
    ) -> DsmResult<bool> {
        if !m.in_write_set {
            return Ok(false);
        }
        // A write-shared pin (see `Space::pin_if_write_shared`) of which
        // another process is the last writer, unchanged by us since our
        // last release (or merge): nothing to announce, so no transaction.
        // (What it holds of the others' words is what they published: a
        // transaction reads the last writer's twin, never its copy in the
        // middle of a rewrite.) After `SHARED_PIN_IDLE` such releases in a
        // row it is unpinned; the fast release counts alike.
        if m.shared_pin
            && m.state == BlockState::Pinned
            && !m.written_last
            && self.unchanged_since_release(seg, idx)
        {
            self.count_idle_release(m);
            return Ok(true);
        }
        if m.state.dirty() && !self.fast_release(seg, idx, m, defer)? {
            self.transaction(seg, idx, m, TxKind::Release)?;
        }
        if !m.state.dirty() {
            m.in_write_set = false;
        }
        Ok(m.in_write_set)
    }

    /// Protects a run of contiguous idle blocks of `seg` whose releases
    /// deferred it (their entry locks held in `run`, ascending), with one
    /// `mprotect` for the whole run: protecting block by block split the
    /// mapping into one area per block, which made every later `mprotect`
    /// of the segment slower too (the multigrid kernel's grids go idle
    /// together, hundreds of blocks at a time). A block written meanwhile
    /// is made writable again and stays listed, dirty: it is released at
    /// the next fence, as a write made during this one may be. The blocks
    /// that stay listed go to `keep`; `run` is emptied.
    fn protect_idle_run(
        &self,
        seg: &Segment<U>,
        run: &mut Vec<IdleBlock<'_, U>>,
        keep: &mut Vec<usize>,
    ) -> DsmResult<()> {
        let Some(&(_, first, _)) = run.first() else {
            return Ok(());
        };
        let bs = seg.block_size;
        if let Err(e) = layout::protect(seg.app(first), run.len() * bs, libc::PROT_READ) {
            keep.extend(run.drain(..).map(|(addr, _, _)| addr));
            return Err(e);
        }
        let mut result = Ok(());
        for (addr, idx, mut m) in run.drain(..) {
            if self.idle_protected(seg, idx, &mut m) {
                m.in_write_set = false;
                continue;
            }
            keep.push(addr);
            if let Err(e) = layout::protect(seg.app(idx), bs, BlockState::Writable.prot()) {
                result = Err(e);
            }
        }
        result
    }

    /// Release fence: every block with local changes is merged (or fast
    /// released) and its write notice added to the release signature.
    pub fn release_fence(&self) -> DsmResult<()> {
        let _rt = self.enter()?;
        let mut bufs = self.release_lock.lock();
        let ReleaseBufs { blocks, dead, keep } = &mut *bufs;
        let _t = self.stats.timed(&self.stats.release_ns);
        self.count_release();
        // Local stores are visible before lock words are read (fast release).
        fence(Ordering::SeqCst);
        // The listed blocks; the write set keeps the (empty) buffer of the
        // last fence.
        blocks.clear();
        core::mem::swap(blocks, &mut *self.write_set.lock());
        // Stack blocks below the live part of their stack stay listed,
        // unmerged (see `live`).
        dead.clear();
        if let Some(live) = self.stack_live.get() {
            let mut is_dead = live.dead_test(super::live::stack_pointer());
            blocks.retain(|&a| {
                let d = is_dead(a);
                if d {
                    dead.push(a);
                }
                !d
            });
        }
        keep.clear();
        // In address order, so that idle blocks are protected in runs.
        blocks.sort_unstable();
        let parallel = blocks.len() >= parallel_min::<U>() && U::num_workers() > 1;
        let result = if parallel {
            let (k, r) = self.release_parallel(core::mem::take(blocks), U::num_workers());
            *keep = k;
            r
        } else {
            self.release_list(blocks, keep)
        };
        if !keep.is_empty() || !dead.is_empty() {
            let mut ws = self.write_set.lock();
            ws.extend_from_slice(keep);
            ws.extend_from_slice(dead);
        }
        self.guard(result)
    }

    /// Releases `blocks` one after the other; adds the ones that stay in
    /// the write set to `keep`; returns the first error.
    ///
    /// Idle blocks due to be protected are protected in runs of contiguous
    /// blocks ([`Space::protect_idle_run`]), so `blocks` should be sorted.
    pub(super) fn release_list(&self, blocks: &[usize], keep: &mut Vec<usize>) -> DsmResult<()> {
        let mut result = Ok(());
        let mut run: Vec<IdleBlock<'_, U>> = Vec::new();
        let mut run_seg: Option<&Segment<U>> = None;
        for &addr in blocks {
            if result.is_err() {
                keep.push(addr);
                continue;
            }
            let Some((seg, idx)) = self.locate(addr) else {
                continue;
            };
            // The run of idle blocks ends where the next block does not
            // continue it.
            if let Some(rs) = run_seg
                && (!core::ptr::eq(rs, seg) || run.last().map(|r| r.1 + 1) != Some(idx))
            {
                run_seg = None;
                if let Err(e) = self.protect_idle_run(rs, &mut run, keep) {
                    keep.push(addr);
                    result = Err(e);
                    continue;
                }
            }
            let mut m = seg.entry(idx).lock();
            let mut deferred = false;
            match self.release_locked(seg, idx, &mut m, Some(&mut deferred)) {
                Ok(_) if deferred => {
                    run.push((addr, idx, m));
                    run_seg = Some(seg);
                }
                Ok(true) => keep.push(addr),
                Ok(false) => {}
                Err(e) => {
                    keep.push(addr);
                    result = Err(e);
                }
            }
        }
        if let Some(rs) = run_seg {
            let r = self.protect_idle_run(rs, &mut run, keep);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Releases `blocks` in parallel, in strided chunks on threads of `U`
    /// (Endo 2020 §3.5.3: merges of a release fence run in parallel).
    pub(super) fn release_parallel(
        &self,
        blocks: Vec<usize>,
        workers: usize,
    ) -> (Vec<usize>, DsmResult<()>) {
        let tasks = (workers * 4)
            .min(blocks.len() / (PARALLEL_RELEASE_MIN / 4))
            .max(2);
        // SAFETY: the space is leaked by `Dsm::with_config` and only freed by
        // `Dsm::finalize`, which consumes the only handle and so cannot run
        // while this call (which borrows the space through it) is running;
        // every task is joined before we return.
        let me: &'static Self = unsafe { &*(self as *const Self) };
        let blocks = std::sync::Arc::new(blocks);
        let handles: Vec<_> = (1..tasks)
            .map(|t| {
                let blocks = blocks.clone();
                U::spawn(move || {
                    let mine: Vec<usize> = blocks.iter().copied().skip(t).step_by(tasks).collect();
                    let mut keep = Vec::new();
                    let r = me.release_list(&mine, &mut keep);
                    (keep, r)
                })
            })
            .collect();
        let mine: Vec<usize> = blocks.iter().copied().step_by(tasks).collect();
        let mut keep = Vec::new();
        let mut result = self.release_list(&mine, &mut keep);
        for h in handles {
            let (k, r) = h.join();
            keep.extend(k);
            if result.is_ok() {
                result = r;
            }
        }
        (keep, result)
    }

    /// Releases only the blocks overlapping `[addr, addr + len)` (used when
    /// memory changes hands, e.g. by `free`).
    pub fn release_range(&self, addr: usize, len: usize) -> DsmResult<()> {
        let _rt = self.enter()?;
        self.for_blocks(addr, len, |seg, idx| self.release_block(seg, idx).map(drop))
    }

    /// Drops this process's copies of the blocks overlapping `[addr, addr +
    /// len)` so their next access fetches the latest version (used when
    /// memory changes hands, e.g. by `malloc`).
    pub fn forget_range(&self, addr: usize, len: usize) -> DsmResult<()> {
        let _rt = self.enter()?;
        self.for_blocks(addr, len, |seg, idx| {
            if !self.is_fixed_home(seg, idx) {
                let mut m = seg.entry(idx).lock();
                self.invalidate(seg, idx, &mut m)?;
                if !m.state.readable() {
                    // The next access takes the lock and finds the latest
                    // version.
                    m.force_tx = true;
                }
            }
            Ok(())
        })
    }
}
