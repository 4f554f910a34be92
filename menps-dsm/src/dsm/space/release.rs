//! Release fences: every block with local changes is merged or fast
//! released, one after the other or in parallel on threads of `U`.

use core::sync::atomic::{Ordering, fence};

use ct_worker::{JoinHandleItf, UltItf};

use crate::com::Communicator;

use ct_sync::MutexGuard;

use super::super::dirty::{DirtyTracker, ScanResult};
use super::super::error::DsmResult;
use super::super::layout;
use super::super::segment::{BlockMeta, BlockState, Segment};
use super::{SHARED_PIN_IDLE, Space, TxKind, bump, bump_by, parallel_tasks};

/// The smallest run of blocks a dirty scan covers: below it, comparing the
/// blocks costs less than the system call (about 2 µs; a 4 KiB block that
/// left the cache compares in about 1 µs).
const SCAN_MIN_BYTES: usize = 16 * 1024;

/// Unpins a write-shared pinned block after [`SHARED_PIN_IDLE`] idle
/// releases in a row: an ordinary writable block again, which the next
/// releases protect if it stays idle.
pub(super) fn unpin_if_idle(m: &mut BlockMeta) {
    if m.shared_pin && m.idle_releases >= SHARED_PIN_IDLE {
        // A stale one (found unchanged: no local changes) is dropped.
        m.state = if m.state == BlockState::PinnedStale {
            BlockState::InvalidClean
        } else {
            BlockState::Writable
        };
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
    /// What this fence's dirty scan found.
    scan: ScanResult,
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
        self.release_locked(seg, idx, &mut m, None, false)
    }

    /// [`Space::release_block`] under the entry lock the caller holds; with
    /// `defer`, an idle block due to be protected is left to the caller (see
    /// [`Space::fast_release`]), and counts as staying in the write set.
    /// `clean`: this fence's dirty scan found none of the block's pages
    /// written.
    fn release_locked(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        defer: Option<&mut bool>,
        clean: bool,
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
        // row it is unpinned; the fast release counts alike. A stale one
        // unchanged has nothing to announce either, whoever wrote it last.
        if m.shared_pin
            && match m.state {
                BlockState::Pinned => !m.written_last,
                BlockState::PinnedStale => true,
                _ => false,
            }
            && self.unchanged_pin(seg, idx, m, clean)
        {
            self.count_idle_release(m);
            return Ok(true);
        }
        if m.state.dirty() && !self.fast_release(seg, idx, m, defer, clean)? {
            self.transaction(seg, idx, m, TxKind::Release { clean })?;
        }
        if !m.state.dirty() {
            m.in_write_set = false;
        }
        Ok(m.in_write_set)
    }

    /// [`Space::unchanged_since_release`] for a write-shared pin: a stale
    /// one found unchanged once stays so (see
    /// `BlockMeta::stale_unchanged`).
    fn unchanged_pin(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta, clean: bool) -> bool {
        let stale = m.state == BlockState::PinnedStale;
        if stale && m.stale_unchanged {
            return true;
        }
        let unchanged = self.unchanged_since_release(seg, idx, m, clean);
        m.stale_unchanged = stale && unchanged;
        unchanged
    }

    /// Protects a run of contiguous idle blocks of `seg` whose releases
    /// deferred it (their entry locks held in `run`, ascending), with one
    /// `mprotect` for the whole run: protecting block by block split the
    /// mapping into one area per block, which made every later `mprotect`
    /// of the segment slower too (the multigrid kernel's grids go idle
    /// together, hundreds of blocks at a time). A block written meanwhile
    /// is made writable again and stays listed, dirty: it is released at
    /// the next fence, as a write made during this one may be (on a tracked
    /// segment, the kernel's record of writes tells which blocks were
    /// written, without comparing the armed ones, if `look`: the fence
    /// scanned). The blocks that stay listed go to `keep`; `run` is emptied.
    fn protect_idle_run(
        &self,
        seg: &Segment<U>,
        run: &mut Vec<IdleBlock<'_, U>>,
        keep: &mut Vec<usize>,
        look: bool,
    ) -> DsmResult<()> {
        let Some(&(_, first, _)) = run.first() else {
            return Ok(());
        };
        let bs = seg.block_size;
        let (start, len) = (seg.app(first), run.len() * bs);
        if let Err(e) = layout::protect(start, len, libc::PROT_READ) {
            keep.extend(run.drain(..).map(|(addr, _, _)| addr));
            return Err(e);
        }
        // Pages written since the fence's scan (or never protected by one):
        // the run is read-only now, so nothing is written after this look,
        // which only reports (it protects nothing, so it consumes nothing).
        let mut now = ScanResult::default();
        if let Some(t) = self
            .dirty
            .as_ref()
            .filter(|_| look && seg.tracked && len >= SCAN_MIN_BYTES)
        {
            bump(&self.stats.dirty_scans);
            if t.written(start, start + len, &mut now.written).is_ok() {
                now.covered.push((start, start + len));
            }
        }
        let mut result = Ok(());
        for (addr, idx, mut m) in run.drain(..) {
            if self.idle_protected(seg, idx, &mut m, now.clean(addr, bs)) {
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
        let ReleaseBufs {
            blocks,
            dead,
            keep,
            scan,
        } = &mut *bufs;
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
        // Which of them were written since they were last armed, from the
        // kernel (arming them again).
        scan.clear();
        if let Some(t) = &self.dirty {
            self.scan_listed(t, blocks, scan);
        }
        let tasks = parallel_tasks::<U>(blocks.len(), self.nprocs);
        let result = if tasks > 1 {
            let (k, r) = self.release_parallel(core::mem::take(blocks), tasks, scan);
            *keep = k;
            r
        } else {
            self.release_list(blocks, scan, keep)
        };
        if !keep.is_empty() || !dead.is_empty() {
            let mut ws = self.write_set.lock();
            ws.extend_from_slice(keep);
            ws.extend_from_slice(dead);
        }
        self.guard(result)
    }

    /// Asks the kernel which of the listed `blocks` (sorted) of tracked
    /// segments were written since they were last armed, a run of
    /// contiguous blocks at a time; the runs are armed again as they are
    /// scanned (see [`DirtyTracker::written_and_protect`]). Runs shorter
    /// than [`SCAN_MIN_BYTES`], and every block when they total less than
    /// `DsmConfig::dirty_scan_min` bytes, are left to comparisons.
    ///
    /// Arming every listed block, also the ones written in this interval,
    /// costs a block written again in the next one a fault in the kernel
    /// (about 0.5 µs a page, without a signal); in exchange, a block
    /// written once is known idle from the first release after, without
    /// comparing it. (Arming only blocks already found idle once left a
    /// third of the multigrid kernel's comparisons, and was no faster.)
    fn scan_listed(&self, t: &DirtyTracker, blocks: &[usize], out: &mut ScanResult) {
        // The runs of contiguous tracked blocks (start, end), gathered
        // before any is scanned: their total decides.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        // (segment, start, end) of the run being gathered.
        let mut run: Option<(usize, usize, usize)> = None;
        let mut tracked_bytes = 0;
        for &a in blocks {
            let Some((seg, _)) = self.locate(a) else {
                continue;
            };
            if !seg.tracked {
                continue;
            }
            tracked_bytes += seg.block_size;
            match &mut run {
                Some((id, _, end)) if *id == seg.id && *end == a => *end += seg.block_size,
                _ => {
                    runs.extend(run.take().map(|r| (r.1, r.2)));
                    run = Some((seg.id, a, a + seg.block_size));
                }
            }
        }
        runs.extend(run.map(|r| (r.1, r.2)));
        if tracked_bytes < self.cfg.dirty_scan_min {
            return;
        }
        for (start, end) in runs {
            self.scan_run(t, start, end, out);
        }
    }

    /// Scans (and protects) the run `[start, end)` of tracked blocks into
    /// `out`, if it is long enough. A scan that fails counts every page of
    /// the run as written: it may have protected some already, and what it
    /// would have reported of them must not be lost.
    fn scan_run(&self, t: &DirtyTracker, start: usize, end: usize, out: &mut ScanResult) {
        if end - start < SCAN_MIN_BYTES {
            return;
        }
        let before = out.written.len();
        match t.written_and_protect(start, end, &mut out.written) {
            Ok(calls) => bump_by(&self.stats.dirty_scans, calls),
            Err(_) => {
                bump(&self.stats.dirty_scans);
                out.written.truncate(before);
                out.written.push((start, end));
            }
        }
        out.covered.push((start, end));
    }

    /// Releases `blocks` one after the other; adds the ones that stay in
    /// the write set to `keep`; returns the first error. `scan` is what this
    /// fence's dirty scan found.
    ///
    /// Idle blocks due to be protected are protected in runs of contiguous
    /// blocks ([`Space::protect_idle_run`]), so `blocks` should be sorted.
    pub(super) fn release_list(
        &self,
        blocks: &[usize],
        scan: &ScanResult,
        keep: &mut Vec<usize>,
    ) -> DsmResult<()> {
        let mut result = Ok(());
        // Idle runs look at the kernel's record only at a fence that
        // scanned: below `DsmConfig::dirty_scan_min` the write set is
        // compared, the idle runs' blocks too.
        let look = !scan.covered.is_empty();
        let mut run: Vec<IdleBlock<'_, U>> = Vec::new();
        let mut run_seg: Option<&Segment<U>> = None;
        for &addr in blocks {
            if result.is_err() {
                // (Taking the entry forgets what the scan reported of it.)
                if let Some((seg, idx)) = self.locate(addr) {
                    drop(seg.entry(idx).lock());
                }
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
                if let Err(e) = self.protect_idle_run(rs, &mut run, keep, look) {
                    keep.push(addr);
                    result = Err(e);
                    continue;
                }
            }
            let mut m = seg.entry(idx).lock_for_release();
            // What the scan found: a page written since the block was armed
            // disarms it (the scan protected the page again, so only this
            // fence learns of the write); none written, and it is clean.
            let bs = seg.block_size;
            let covered = scan.covers(addr, bs);
            let clean = covered && !scan.touched(addr, bs);
            if covered && !clean {
                m.armed = false;
            }
            let mut deferred = false;
            match self.release_locked(seg, idx, &mut m, Some(&mut deferred), clean) {
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
            let r = self.protect_idle_run(rs, &mut run, keep, look);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Releases `blocks` in parallel, in `tasks` strided chunks on threads
    /// of `U` (Endo 2020 §3.5.3: merges of a release fence run in
    /// parallel). Returns the blocks that stay listed and the first error.
    pub(super) fn release_parallel(
        &self,
        blocks: Vec<usize>,
        tasks: usize,
        scan: &ScanResult,
    ) -> (Vec<usize>, DsmResult<()>) {
        // SAFETY: the space is leaked by `Dsm::with_config` and only freed by
        // `Dsm::finalize`, which consumes the only handle and so cannot run
        // while this call (which borrows the space through it) is running;
        // every task is joined before we return.
        let me: &'static Self = unsafe { &*(self as *const Self) };
        // SAFETY: likewise, the scan result is borrowed for this call, and
        // every task is joined before we return.
        let scan: &'static ScanResult = unsafe { &*(scan as *const ScanResult) };
        let blocks = std::sync::Arc::new(blocks);
        let handles: Vec<_> = (1..tasks)
            .map(|t| {
                let blocks = blocks.clone();
                U::spawn(move || {
                    let mine: Vec<usize> = blocks.iter().copied().skip(t).step_by(tasks).collect();
                    let mut keep = Vec::new();
                    let r = me.release_list(&mine, scan, &mut keep);
                    (keep, r)
                })
            })
            .collect();
        let mine: Vec<usize> = blocks.iter().copied().step_by(tasks).collect();
        let mut keep = Vec::new();
        let mut result = self.release_list(&mine, scan, &mut keep);
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
