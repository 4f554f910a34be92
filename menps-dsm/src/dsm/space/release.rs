//! Release fences: every block with local changes is merged or fast
//! released, one after the other or in parallel on threads of `U`.

use core::sync::atomic::{Ordering, fence};

use ct_worker::{JoinHandleItf, UltItf};

use crate::com::Communicator;

use super::super::error::DsmResult;
use super::super::segment::Segment;
use super::{PARALLEL_RELEASE_MIN, Space, TxKind, parallel_min};

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
        if !m.in_write_set {
            return Ok(false);
        }
        if m.state.dirty() && !self.fast_release(seg, idx, &mut m)? {
            self.transaction(seg, idx, &mut m, TxKind::Release)?;
        }
        if !m.state.dirty() {
            m.in_write_set = false;
        }
        Ok(m.in_write_set)
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
    pub(super) fn release_list(&self, blocks: &[usize], keep: &mut Vec<usize>) -> DsmResult<()> {
        let mut result = Ok(());
        for &addr in blocks {
            if result.is_err() {
                keep.push(addr);
                continue;
            }
            let Some((seg, idx)) = self.locate(addr) else {
                continue;
            };
            match self.release_block(seg, idx) {
                Ok(true) => keep.push(addr),
                Ok(false) => {}
                Err(e) => {
                    keep.push(addr);
                    result = Err(e);
                }
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
