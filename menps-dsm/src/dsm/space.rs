//! The protocol core: block upgrades on faults, transactions, fast release,
//! invalidation, and the read and write sets (Endo 2020 §3.4–3.5).
//!
//! Every operation on a block runs under the block's local entry mutex,
//! which serialises the threads of this process; transactions also take the
//! block's global lock ([`super::qlock`]), which serialises processes and
//! tells where the latest version is.

use core::cmp::Reverse;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
use std::collections::BinaryHeap;

use ct_sync::Mutex;
use ct_worker::{JoinHandleItf, UltItf};

use crate::com::{Communicator, Tag, WindowId};

use super::config::{DsmConfig, InvalidationPolicy, WriterPolicy};
use super::diff;
use super::error::{DsmError, DsmResult, RaceReport};
use super::layout::{self, MAX_SEGMENTS};
use super::qlock::{self, Granted, LockSite};
use super::segment::{BlockMeta, BlockState, LAD_OFF, Lad, Segment};
use super::signature::{Signature, WriteNotice};
use super::sync::SyncState;

/// Tags with the top bit set are the DSM's.
pub(crate) const DSM_TAG_BIT: Tag = 0x8000_0000;

/// Write sets at least this large are released in parallel.
const PARALLEL_RELEASE_MIN: usize = 64;

/// Slots of a directory invalidation queue.
const INVAL_CAP: usize = 4096;
/// Header bytes of an invalidation queue (the tail counter at 0).
const INVAL_HEADER: usize = 64;

/// An atomic operation applied to a DSM word inside a transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AtomicOp {
    Load,
    Store(u64),
    FetchAdd(u64),
    CompareExchange(u64, u64),
}

/// Why a transaction runs.
#[derive(Debug, Clone, Copy)]
enum TxKind {
    /// A read miss whose lease expired (or without fast read).
    Read,
    /// A release of a dirty block.
    Release,
    /// An invalidated pinned block, merged in place.
    PinnedRefresh,
    /// An atomic operation on the word at this offset of the block.
    Atomic(usize, AtomicOp),
}

/// Counters of protocol events in this process.
#[derive(Debug, Default)]
pub struct Stats {
    /// Read faults resolved.
    pub read_faults: AtomicUsize,
    /// Write faults resolved.
    pub write_faults: AtomicUsize,
    /// Transactions (global lock taken).
    pub transactions: AtomicUsize,
    /// Releases that skipped the global lock.
    pub fast_releases: AtomicUsize,
    /// Misses served by one read from a write notice's writer.
    pub fast_reads: AtomicUsize,
    /// Blocks invalidated.
    pub invalidations: AtomicUsize,
    /// Bytes fetched from other processes' copies.
    pub bytes_fetched: AtomicUsize,
}

/// Counters as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Read faults resolved.
    pub read_faults: usize,
    /// Write faults resolved.
    pub write_faults: usize,
    /// Transactions (global lock taken).
    pub transactions: usize,
    /// Releases that skipped the global lock.
    pub fast_releases: usize,
    /// Misses served by one read from a write notice's writer.
    pub fast_reads: usize,
    /// Blocks invalidated.
    pub invalidations: usize,
    /// Bytes fetched from other processes' copies.
    pub bytes_fetched: usize,
}

impl Stats {
    fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        StatsSnapshot {
            read_faults: l(&self.read_faults),
            write_faults: l(&self.write_faults),
            transactions: l(&self.transactions),
            fast_releases: l(&self.fast_releases),
            fast_reads: l(&self.fast_reads),
            invalidations: l(&self.invalidations),
            bytes_fetched: l(&self.bytes_fetched),
        }
    }
}

#[inline]
fn bump(a: &AtomicUsize) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// A reusable word buffer of one block.
pub(crate) struct Tmp<'a> {
    buf: Vec<u64>,
    pool: &'a std::sync::Mutex<Vec<Vec<u64>>>,
}

impl Tmp<'_> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.buf.len() * 8;
        // SAFETY: a u64 buffer viewed as its bytes.
        unsafe { core::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), n) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: a u64 buffer viewed as its bytes.
        unsafe { core::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.buf.len() * 8) }
    }
}

impl Drop for Tmp<'_> {
    fn drop(&mut self) {
        let buf = core::mem::take(&mut self.buf);
        let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < 64 {
            p.push(buf);
        }
    }
}

/// The DSM of one process.
pub(crate) struct Space<C: Communicator, U: UltItf> {
    pub com: C,
    pub rank: usize,
    pub nprocs: usize,
    pub cfg: DsmConfig,
    segs: Box<[AtomicPtr<Segment<U>>]>,
    next_seg: std::sync::Mutex<usize>,
    /// The acquire timestamp (`min_wr_ts`): copies whose lease ends before
    /// it are stale.
    acq_ts: AtomicU64,
    read_set: Mutex<BinaryHeap<Reverse<(u64, usize)>>, U>,
    write_set: Mutex<Vec<usize>, U>,
    /// This process's release signature: its own write notices and every
    /// signature it acquired since the last barrier.
    pub(crate) rel_sig: Mutex<Signature, U>,
    /// Serialises release fences.
    release_lock: Mutex<(), U>,
    failed: AtomicBool,
    failure: std::sync::Mutex<Option<DsmError>>,
    bufs: std::sync::Mutex<Vec<Vec<u64>>>,
    /// Directory policy: this process's invalidation queue (window) and how
    /// far it was drained.
    inval_win: Option<WindowId>,
    inval_head: Mutex<u64, U>,
    sync: SyncState<U>,
    pub(crate) stats: Stats,
}

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    /// Collectively sets up the DSM on `com`.
    pub fn new(com: C, cfg: DsmConfig) -> DsmResult<Self> {
        let nprocs = com.size();
        cfg.validate(nprocs)?;
        layout::reserve()?;
        let inval_win = if cfg.invalidation == InvalidationPolicy::Directory {
            Some(com.create_window(INVAL_HEADER + INVAL_CAP * 16)?)
        } else {
            None
        };
        let cap = cfg.effective_wn_list_len();
        let sync = SyncState::new(&com, cap, cfg.max_mutexes)?;
        Ok(Space {
            sync,
            rank: com.rank(),
            nprocs,
            segs: (0..MAX_SEGMENTS)
                .map(|_| AtomicPtr::new(core::ptr::null_mut()))
                .collect(),
            next_seg: std::sync::Mutex::new(0),
            acq_ts: AtomicU64::new(0),
            read_set: Mutex::new_in(BinaryHeap::new()),
            write_set: Mutex::new_in(Vec::new()),
            rel_sig: Mutex::new_in(Signature::new(cap)),
            release_lock: Mutex::new_in(()),
            failed: AtomicBool::new(false),
            failure: std::sync::Mutex::new(None),
            bufs: std::sync::Mutex::new(Vec::new()),
            inval_win,
            inval_head: Mutex::new_in(0),
            stats: Stats::default(),
            com,
            cfg,
        })
    }

    pub(crate) fn sync_state(&self) -> &SyncState<U> {
        &self.sync
    }

    /// Counters of this process.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    // ---------------------------------------------------------------
    // Failures

    /// The recorded failure, if the DSM has failed.
    pub fn check(&self) -> DsmResult<()> {
        if self.failed.load(Ordering::Acquire) {
            let f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            return Err(f.clone().unwrap_or_else(|| {
                DsmError::Misuse("the DSM failed earlier in this process".into())
            }));
        }
        Ok(())
    }

    /// Records `e` as the DSM's failure (the first one wins) and returns it.
    pub fn fail(&self, e: DsmError) -> DsmError {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(e.clone());
        }
        self.failed.store(true, Ordering::Release);
        e
    }

    fn guard<T>(&self, r: DsmResult<T>) -> DsmResult<T> {
        r.map_err(|e| self.fail(e))
    }

    // ---------------------------------------------------------------
    // Segments

    /// Collectively creates a segment; returns its base address.
    pub fn create_segment(
        &self,
        size: usize,
        block_size: usize,
        image: Option<&[u8]>,
    ) -> DsmResult<usize> {
        self.check()?;
        let mut next = self.next_seg.lock().unwrap_or_else(|e| e.into_inner());
        let id = *next;
        // The last slots are the heap's and the globals'.
        if id >= super::heap::FIRST_RESERVED_SLOT {
            return Err(DsmError::OutOfMemory(format!(
                "at most {} segments can exist",
                super::heap::FIRST_RESERVED_SLOT
            )));
        }
        let seg = Segment::create(&self.com, id, size, block_size, image)?;
        let base = seg.base;
        self.segs[id].store(Box::into_raw(Box::new(seg)), Ordering::Release);
        *next += 1;
        Ok(base)
    }

    /// Collectively creates a zeroed segment in the reserved slot `id` (the
    /// heap's or the globals', outside `create_segment`'s sequence); returns
    /// its base address.
    pub(crate) fn create_segment_in_slot(
        &self,
        id: usize,
        size: usize,
        block_size: usize,
    ) -> DsmResult<usize> {
        self.check()?;
        let _next = self.next_seg.lock().unwrap_or_else(|e| e.into_inner());
        if !(super::heap::FIRST_RESERVED_SLOT..MAX_SEGMENTS).contains(&id) || self.seg(id).is_some()
        {
            return Err(DsmError::Misuse(format!(
                "segment slot {id} is not a free reserved slot"
            )));
        }
        let seg = Segment::create(&self.com, id, size, block_size, None)?;
        let base = seg.base;
        self.segs[id].store(Box::into_raw(Box::new(seg)), Ordering::Release);
        Ok(base)
    }

    /// The segment in slot `id`.
    fn seg(&self, id: usize) -> Option<&Segment<U>> {
        let p = self.segs.get(id)?.load(Ordering::Acquire);
        // SAFETY: published segments live until the space is dropped, and
        // `&self` borrows the space.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The segment and block index of `addr`.
    #[inline]
    pub fn locate(&self, addr: usize) -> Option<(&Segment<U>, usize)> {
        let seg = self.seg(layout::slot_of(addr)?)?;
        seg.contains(addr).then(|| (seg, seg.index_of(addr)))
    }

    /// Block size of the segment holding `addr`.
    pub fn block_size_at(&self, addr: usize) -> Option<usize> {
        self.locate(addr).map(|(s, _)| s.block_size)
    }

    fn tmp(&self, block_size: usize) -> Tmp<'_> {
        let words = block_size / 8;
        let mut buf = self
            .bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        buf.resize(words, 0);
        Tmp {
            buf,
            pool: &self.bufs,
        }
    }

    fn block_tag(seg: &Segment<U>, idx: usize) -> Tag {
        DSM_TAG_BIT | ((seg.id as Tag) << 24) | idx as Tag
    }

    fn block_site(&self, seg: &Segment<U>, idx: usize) -> LockSite {
        LockSite {
            win: seg.meta_win,
            word_off: seg.meta_off(idx),
            init_owner: (seg.id + idx) % self.nprocs,
            tag: Self::block_tag(seg, idx),
        }
    }

    /// The fixed home of a block (block-cyclic).
    fn fixed_home(&self, seg: &Segment<U>, idx: usize) -> usize {
        (seg.id + idx) % self.nprocs
    }

    /// Whether this process is the fixed home of the block (its copy is then
    /// the master copy, never stale).
    fn is_fixed_home(&self, seg: &Segment<U>, idx: usize) -> bool {
        self.cfg.writer == WriterPolicy::Fixed && self.fixed_home(seg, idx) == self.rank
    }

    fn protect(&self, seg: &Segment<U>, idx: usize, state: BlockState) -> DsmResult<()> {
        layout::protect(seg.app(idx), seg.block_size, state.prot())
    }

    fn race(&self, seg: &Segment<U>, idx: usize, r: diff::Race, remote_rank: usize) -> DsmError {
        RaceReport {
            addr: seg.app(idx) + r.offset,
            block: seg.app(idx),
            segment: seg.id,
            base: r.base,
            local: r.local,
            remote: r.remote,
            local_rank: self.rank,
            remote_rank,
        }
        .into()
    }

    // ---------------------------------------------------------------
    // Faults

    /// Resolves an access to `addr`.
    pub fn resolve(&self, addr: usize, write: bool) -> DsmResult<()> {
        self.check()?;
        let (seg, idx) = self.locate(addr).ok_or_else(|| {
            DsmError::InvalidArgument(format!("{addr:#x} is not in a DSM segment"))
        })?;
        if write {
            bump(&self.stats.write_faults);
            self.start_write(seg, idx)
        } else {
            bump(&self.stats.read_faults);
            self.start_read(seg, idx)
        }
    }

    /// Makes block `idx` readable.
    pub fn start_read(&self, seg: &Segment<U>, idx: usize) -> DsmResult<()> {
        let mut m = seg.entry(idx).lock();
        if m.state.readable() {
            return Ok(());
        }
        let r = self.read_upgrade(seg, idx, &mut m, false);
        self.guard(r)
    }

    /// Makes block `idx` writable.
    pub fn start_write(&self, seg: &Segment<U>, idx: usize) -> DsmResult<()> {
        let mut m = seg.entry(idx).lock();
        let r = self.write_upgrade(seg, idx, &mut m);
        self.guard(r)
    }

    fn write_upgrade(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) -> DsmResult<()> {
        if m.state.writable() {
            return Ok(());
        }
        if !m.state.readable() {
            self.read_upgrade(seg, idx, m, true)?;
            if m.state.writable() {
                return Ok(());
            }
        }
        if m.state == BlockState::ReadonlyClean {
            // The twin becomes the base version of our writes.
            // SAFETY: both are this process's copies of the block; the
            // application view is read-only, so nobody writes the system view
            // meanwhile, and the twin is only written under the block's locks
            // (a remote copy-back writes it only while we are the last
            // writer, when the copy is clean and equal anyway).
            unsafe {
                core::ptr::copy_nonoverlapping(seg.sys(idx), seg.twin_of(idx), seg.block_size)
            };
        }
        m.state = BlockState::Writable;
        self.add_to_write_set(seg, idx, m);
        self.protect(seg, idx, m.state)
    }

    fn add_to_write_set(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) {
        if !m.in_write_set {
            m.in_write_set = true;
            self.write_set.lock().push(seg.app(idx));
        }
    }

    /// Lists a readable block in the read set (once): ordered by lease end
    /// for self-invalidation (under the directory policy it only serves to
    /// find every readable block when an invalidation queue overflowed).
    fn add_to_read_set(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) {
        if !m.in_read_set {
            m.in_read_set = true;
            self.read_set.lock().push(Reverse((m.cur_rd, seg.app(idx))));
        }
    }

    /// Makes an invalid block readable. With `for_write` the caller makes it
    /// writable right after, so the application view's protection is left
    /// to it (one `mprotect` instead of two).
    fn read_upgrade(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        for_write: bool,
    ) -> DsmResult<()> {
        debug_assert!(!m.state.readable());
        let dirty = m.state == BlockState::InvalidDirty;
        let local_ok = if self.is_fixed_home(seg, idx) {
            // The master copy is here and always current.
            true
        } else if m.force_tx {
            false
        } else {
            match self.cfg.invalidation {
                InvalidationPolicy::Directory => false,
                _ => {
                    let lease_valid = m.cur_rd >= self.acq_ts.load(Ordering::Acquire);
                    let home = m.home as usize;
                    lease_valid
                        && (home == 0 || home - 1 == self.rank || self.cfg.fast_read_active())
                }
            }
        };
        if !local_ok {
            self.transaction(seg, idx, m, TxKind::Read)?;
            return Ok(());
        }
        let home = m.home as usize;
        if home != 0 && home - 1 != self.rank && !self.is_fixed_home(seg, idx) {
            // Fast read: one read of the version the write notice named.
            let src = home - 1;
            let mut tmp = self.tmp(seg.block_size);
            self.com
                .read(seg.data_win.at(src, seg.offset(idx)), tmp.bytes_mut())?;
            self.stats
                .bytes_fetched
                .fetch_add(seg.block_size, Ordering::Relaxed);
            bump(&self.stats.fast_reads);
            // SAFETY: the block is invalid (application view inaccessible),
            // so only we touch our system view and twin, under the block's
            // entry lock.
            let (data, twin) = unsafe {
                (
                    diff::words_mut(seg.sys(idx), seg.block_size),
                    diff::words_mut(seg.twin_of(idx), seg.block_size),
                )
            };
            if dirty {
                diff::read_merge(data, twin, &tmp.buf, self.cfg.race_detection)
                    .map_err(|r| self.race(seg, idx, r, src))?;
            } else {
                data.copy_from_slice(&tmp.buf);
            }
        }
        m.state = if dirty {
            BlockState::ReadonlyDirty
        } else {
            BlockState::ReadonlyClean
        };
        self.add_to_read_set(seg, idx, m);
        if for_write {
            return Ok(());
        }
        self.protect(seg, idx, m.state)
    }

    // ---------------------------------------------------------------
    // Global block locks

    fn read_lad(&self, win: WindowId, rank: usize, off: u64) -> DsmResult<Lad> {
        let mut b = [0u8; Lad::BYTES];
        self.com.read(win.at(rank, off + LAD_OFF as u64), &mut b)?;
        Lad::from_bytes(&b)
    }

    /// Takes block `idx`'s global lock; returns its LAD.
    fn lock_block(&self, seg: &Segment<U>, idx: usize) -> DsmResult<Lad> {
        match self.cfg.writer {
            WriterPolicy::Floating => {
                let site = self.block_site(seg, idx);
                match qlock::lock(&self.com, &site)? {
                    Granted::Local => self.read_lad(seg.meta_win, self.rank, seg.meta_off(idx)),
                    Granted::FromOwner(p) => self.read_lad(seg.meta_win, p, seg.meta_off(idx)),
                    Granted::HandOff(_, bytes) => Lad::from_bytes(&bytes),
                }
            }
            WriterPolicy::Fixed => {
                let home = self.fixed_home(seg, idx);
                qlock::spin_lock(&self.com, seg.meta_win.at(home, seg.meta_off(idx)))?;
                self.read_lad(seg.meta_win, home, seg.meta_off(idx))
            }
        }
    }

    fn unlock_block(&self, seg: &Segment<U>, idx: usize, lad: Lad) -> DsmResult<()> {
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
    fn next_interval(&self, lad: &Lad, written: bool) -> (u64, u64) {
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
    fn transaction(
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
        let mut lad = self.lock_block(seg, idx)?;
        let result = self.transaction_locked(seg, idx, m, kind, was, dirty, &mut lad);
        match result {
            Ok((old, written, exported, copied_back_to)) => {
                if let Some(p) = copied_back_to {
                    self.com.flush(p)?;
                }
                // The write notice: for a written version, or for changes of
                // ours that someone else's migration already exported (they
                // are then in the latest version, but our acquirers must
                // still drop their copies).
                let notice = (written || exported).then(|| {
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
                Ok(old)
            }
            Err(e) => Err(e),
        }
    }

    /// Process whose copy holds the version the LAD describes.
    fn lad_holder(&self, seg: &Segment<U>, idx: usize, lad: &Lad) -> usize {
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

    /// The body of a transaction, with the global lock held. Updates `lad`
    /// to the new LAD. Returns (old atomic value, written, exported,
    /// process whose twin we wrote).
    #[allow(clippy::too_many_arguments)]
    fn transaction_locked(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
        kind: TxKind,
        was: BlockState,
        dirty: bool,
        lad: &mut Lad,
    ) -> DsmResult<(u64, bool, bool, Option<usize>)> {
        let me = self.rank;
        let bs = seg.block_size;
        let off = seg.offset(idx);
        let fixed = self.cfg.writer == WriterPolicy::Fixed;
        let home = if fixed {
            self.fixed_home(seg, idx)
        } else if lad.last_writer == 0 {
            me
        } else {
            lad.last_writer as usize - 1
        };
        let remote = home != me;
        let thr = self.cfg.wr_count_threshold;
        let pinned = was == BlockState::Pinned;
        // Stop local writers before merging remote changes into our copy (or
        // when the block keeps being released without writes).
        let protect_before = was == BlockState::Writable && (remote || m.wr_count >= thr);
        if protect_before {
            layout::protect(seg.app(idx), bs, libc::PROT_READ)?;
        }
        let write_protected = !was.writable() || protect_before;
        let detect = self.cfg.race_detection;
        // SAFETY: the block's entry lock is held, and either the application
        // view does not allow writes (invalid, read-only, or protected just
        // now), or the copy is ours alone to merge into (pinned: only words
        // the other side changed are rewritten; writable without remote
        // changes: the system view is only read).
        let (data, twin) = unsafe {
            (
                diff::words_mut(seg.sys(idx), bs),
                diff::words_mut(seg.twin_of(idx), bs),
            )
        };
        let mut written = false;
        let mut exported = false;
        let mut copied_back_to = None;
        // The version taken from the old home, kept for the copy back.
        let mut taken: Option<Tmp<'_>> = None;
        if !remote {
            if dirty {
                written = diff::differs(data, twin);
                if written {
                    twin.copy_from_slice(data);
                }
            }
        } else {
            let mut tmp = self.tmp(bs);
            self.com.read(seg.data_win.at(home, off), tmp.bytes_mut())?;
            self.stats.bytes_fetched.fetch_add(bs, Ordering::Relaxed);
            if fixed {
                if dirty {
                    // Take in the home's changes (only words the home's
                    // version changed are rewritten: a pinned stack's live
                    // words stay), then send our changed bytes to the home's
                    // copy and twin (the twin too, so the home does not take
                    // them for its own changes).
                    let mut runs = Vec::new();
                    diff::changed_runs(data, twin, &mut runs);
                    diff::read_merge(data, twin, &tmp.buf, detect)
                        .map_err(|r| self.race(seg, idx, r, home))?;
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
                    data.copy_from_slice(&tmp.buf);
                }
            } else {
                if dirty {
                    let merged = diff::write_merge(data, twin, &tmp.buf, detect)
                        .map_err(|r| self.race(seg, idx, r, home))?;
                    written = merged.local_changes;
                    exported = !written;
                } else {
                    data.copy_from_slice(&tmp.buf);
                }
                taken = Some(tmp);
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
        // Copy back, when the block migrates to us (we wrote it): the version
        // we took becomes the old home's base version, so its later diffs
        // hold only its later writes. Not when we only read it: the old home
        // stays the last writer, and its unreleased writes (which we may
        // have taken) must stay in its diff, so its release announces them.
        if let Some(t) = taken
            && written
        {
            self.com.write(seg.twin_win.at(home, off), t.bytes())?;
            copied_back_to = Some(home);
        }
        // Timestamps.
        let (wr, rd) = self.next_interval(lad, written);
        if written && !fixed {
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
        m.home = if fixed {
            home as u32 + 1
        } else {
            self.lad_holder(seg, idx, lad) as u32 + 1
        };
        // State.
        let new_state = match kind {
            TxKind::PinnedRefresh => BlockState::Pinned,
            _ if pinned => BlockState::Pinned,
            _ if write_protected => BlockState::ReadonlyClean,
            _ => was,
        };
        m.state = new_state;
        if !new_state.dirty() {
            m.in_write_set = false;
        }
        if new_state != was || !was.readable() {
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
        m.written_last = written && !remote && !fixed;
        Ok((old, written, exported && dirty, copied_back_to))
    }

    /// Fast release (Endo 2020 §3.4.6, Listing 3.1) of a writable block we
    /// were the last writer of: a new interval is stored in our own LAD slot
    /// and, if our lock word still says the lock is free here (nobody took
    /// the block since), the release is complete without the global lock or
    /// a twin copy. The write notice carries the *new* interval, so a reader
    /// holding the previous version always drops it (the original published
    /// the previous interval in some paths: a stale-read hole).
    fn fast_release(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) -> DsmResult<bool> {
        if !(self.cfg.fast_release_active()
            && m.state.writable()
            && m.written_last
            && m.fast_rel_count < m.fast_rel_threshold.max(1))
        {
            return Ok(false);
        }
        let site = self.block_site(seg, idx);
        let off = seg.meta_off(idx);
        // Cheap early exit: the lock has moved on.
        if !qlock::owned_here(&self.com, &site)? {
            return Ok(false);
        }
        let mut lad = self.read_lad(seg.meta_win, self.rank, off)?;
        debug_assert_eq!(lad.last_writer, self.rank as u64 + 1);
        let (wr, rd) = self.next_interval(&lad, true);
        lad.wr = wr;
        lad.rd = rd;
        self.com.write(
            seg.meta_win.at(self.rank, off + LAD_OFF as u64),
            &lad.to_bytes(),
        )?;
        // Our writes to the block and the new LAD are visible before we look
        // at the lock word: whoever takes the lock after our check sees both.
        fence(Ordering::SeqCst);
        if !qlock::owned_here(&self.com, &site)? {
            return Ok(false);
        }
        bump(&self.stats.fast_releases);
        m.fast_rel_count += 1;
        m.cur_wr = wr;
        m.cur_rd = rd;
        self.rel_sig
            .lock()
            .push(WriteNotice::new(seg.app(idx), self.rank, wr, rd));
        Ok(true)
    }

    /// Releases block `idx` if it is in the write set.
    fn release_block(&self, seg: &Segment<U>, idx: usize) -> DsmResult<bool> {
        let mut m = seg.entry(idx).lock();
        if !m.in_write_set {
            return Ok(false);
        }
        if !m.state.dirty() {
            m.in_write_set = false;
            return Ok(false);
        }
        if !self.fast_release(seg, idx, &mut m)? {
            self.transaction(seg, idx, &mut m, TxKind::Release)?;
        }
        Ok(m.in_write_set)
    }

    /// Release fence: every block with local changes is merged (or fast
    /// released) and its write notice added to the release signature.
    pub fn release_fence(&self) -> DsmResult<()> {
        self.check()?;
        let _serial = self.release_lock.lock();
        // Local stores are visible before lock words are read (fast release).
        fence(Ordering::SeqCst);
        let blocks = core::mem::take(&mut *self.write_set.lock());
        let parallel = blocks.len() >= PARALLEL_RELEASE_MIN && U::num_workers() > 1;
        let (keep, result) = if parallel {
            self.release_parallel(blocks, U::num_workers())
        } else {
            self.release_list(&blocks)
        };
        if !keep.is_empty() {
            self.write_set.lock().extend(keep);
        }
        self.guard(result)
    }

    /// Releases `blocks` one after the other; returns the ones that stay in
    /// the write set and the first error.
    fn release_list(&self, blocks: &[usize]) -> (Vec<usize>, DsmResult<()>) {
        let mut keep = Vec::new();
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
        (keep, result)
    }

    /// Releases `blocks` in parallel, in strided chunks on threads of `U`
    /// (Endo 2020 §3.5.3: merges of a release fence run in parallel).
    fn release_parallel(&self, blocks: Vec<usize>, workers: usize) -> (Vec<usize>, DsmResult<()>) {
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
                    me.release_list(&mine)
                })
            })
            .collect();
        let mine: Vec<usize> = blocks.iter().copied().step_by(tasks).collect();
        let (mut keep, mut result) = self.release_list(&mine);
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
        self.check()?;
        let mut a = addr;
        let end = addr + len;
        while a < end {
            let Some((seg, idx)) = self.locate(a) else {
                return Err(DsmError::InvalidArgument(format!(
                    "{a:#x} is not in the DSM"
                )));
            };
            self.release_block(seg, idx).map_err(|e| self.fail(e))?;
            a = seg.app(idx) + seg.block_size;
        }
        Ok(())
    }

    /// Drops this process's copies of the blocks overlapping `[addr, addr +
    /// len)` so their next access fetches the latest version (used when
    /// memory changes hands, e.g. by `malloc`).
    pub fn forget_range(&self, addr: usize, len: usize) -> DsmResult<()> {
        self.check()?;
        let mut a = addr;
        let end = addr + len;
        while a < end {
            let Some((seg, idx)) = self.locate(a) else {
                return Err(DsmError::InvalidArgument(format!(
                    "{a:#x} is not in the DSM"
                )));
            };
            if !self.is_fixed_home(seg, idx) {
                let mut m = seg.entry(idx).lock();
                self.invalidate(seg, idx, &mut m)
                    .map_err(|e| self.fail(e))?;
                if !m.state.readable() {
                    // The next access takes the lock and finds the latest
                    // version.
                    m.force_tx = true;
                }
            }
            a = seg.app(idx) + seg.block_size;
        }
        Ok(())
    }

    // ---------------------------------------------------------------
    // Invalidation and acquire

    /// Drops our copy of block `idx` (pinned blocks are refreshed in place).
    fn invalidate(&self, seg: &Segment<U>, idx: usize, m: &mut BlockMeta) -> DsmResult<()> {
        let new = match m.state {
            BlockState::ReadonlyClean => BlockState::InvalidClean,
            BlockState::ReadonlyDirty | BlockState::Writable => BlockState::InvalidDirty,
            BlockState::Pinned => {
                bump(&self.stats.invalidations);
                self.transaction(seg, idx, m, TxKind::PinnedRefresh)?;
                return Ok(());
            }
            BlockState::InvalidClean | BlockState::InvalidDirty => return Ok(()),
        };
        bump(&self.stats.invalidations);
        m.state = new;
        self.protect(seg, idx, new)
    }

    /// Acquire fence with a signature: drops every copy a write notice or
    /// the minimum write timestamp makes stale.
    pub fn acquire(&self, sig: &mut Signature) -> DsmResult<()> {
        self.check()?;
        let r = self.acquire_inner(sig);
        self.guard(r)
    }

    fn acquire_inner(&self, sig: &mut Signature) -> DsmResult<()> {
        if self.cfg.invalidation == InvalidationPolicy::Directory {
            return self.drain_invalidations();
        }
        for wn in sig.notices().to_vec() {
            if wn.writer() == self.rank {
                continue;
            }
            let Some((seg, idx)) = self.locate(wn.block()) else {
                continue;
            };
            if self.is_fixed_home(seg, idx) {
                continue;
            }
            let mut m = seg.entry(idx).lock();
            if wn.wr_ts > m.cur_rd {
                self.invalidate(seg, idx, &mut m)?;
                if !m.state.readable() {
                    m.home = wn.writer() as u32 + 1;
                    m.cur_wr = wn.wr_ts;
                    m.cur_rd = wn.rd_ts;
                }
            }
        }
        self.self_invalidate(sig.min_wr_ts())
    }

    /// Raises the acquire timestamp to `min` and drops every copy whose
    /// lease ends before it.
    fn self_invalidate(&self, min: u64) -> DsmResult<()> {
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

    // ---------------------------------------------------------------
    // Directory invalidation queues

    /// Posts "drop block `block`" into process `q`'s invalidation queue: a
    /// ring of (sequence, block) slots. Posters never wait; a consumer that
    /// finds a slot overwritten (it lagged by a whole ring) drops every copy
    /// instead.
    fn post_invalidation(&self, q: usize, block: usize) -> DsmResult<()> {
        let win = self
            .inval_win
            .expect("directory policy has an invalidation window");
        let t = self.com.fetch_add(win.at(q, 0), 1)?;
        let slot = Self::inval_slot(t);
        self.com
            .write(win.at(q, slot + 8), &(block as u64).to_le_bytes())?;
        self.com.flush(q)?;
        // Publish the sequence number last (monotonically: a later poster of
        // the same slot may already have written a larger one).
        let seq = win.at(q, slot);
        let mut cur = self.com.atomic_load(seq)?;
        while cur < t + 1 {
            let old = self.com.compare_and_swap(seq, cur, t + 1)?;
            if old == cur {
                break;
            }
            cur = old;
        }
        Ok(())
    }

    fn inval_slot(t: u64) -> u64 {
        (INVAL_HEADER + (t as usize % INVAL_CAP) * 16) as u64
    }

    /// Applies the invalidations posted to this process.
    fn drain_invalidations(&self) -> DsmResult<()> {
        let win = self
            .inval_win
            .expect("directory policy has an invalidation window");
        let me = self.rank;
        let mut head = self.inval_head.lock();
        let tail = self.com.atomic_load(win.at(me, 0))?;
        let mut overflow = tail - *head > INVAL_CAP as u64;
        let mut blocks = Vec::new();
        let mut t = *head;
        while !overflow && t < tail {
            let slot = Self::inval_slot(t);
            let mut spins = 0u32;
            loop {
                let s = self.com.atomic_load(win.at(me, slot))?;
                if s == t + 1 {
                    let mut b = [0u8; 8];
                    self.com.read(win.at(me, slot + 8), &mut b)?;
                    if self.com.atomic_load(win.at(me, slot))? == t + 1 {
                        blocks.push(u64::from_le_bytes(b) as usize);
                    } else {
                        overflow = true;
                    }
                    break;
                }
                if s > t + 1 {
                    overflow = true;
                    break;
                }
                // Reserved, not written yet: the poster is in the middle of
                // its transaction.
                spins += 1;
                if spins > 16 {
                    std::thread::yield_now();
                } else {
                    core::hint::spin_loop();
                }
            }
            t += 1;
        }
        *head = tail;
        drop(head);
        if overflow {
            let everything: Vec<usize> = {
                let mut rs = self.read_set.lock();
                let v = rs.iter().map(|Reverse((_, a))| *a).collect();
                rs.clear();
                v
            };
            for addr in everything {
                if let Some((seg, idx)) = self.locate(addr) {
                    let mut m = seg.entry(idx).lock();
                    m.in_read_set = false;
                    if !self.is_fixed_home(seg, idx) {
                        self.invalidate(seg, idx, &mut m)?;
                    }
                    if m.state.readable() {
                        self.add_to_read_set(seg, idx, &mut m);
                    }
                }
            }
            return Ok(());
        }
        for addr in blocks {
            if let Some((seg, idx)) = self.locate(addr) {
                if self.is_fixed_home(seg, idx) {
                    continue;
                }
                let mut m = seg.entry(idx).lock();
                self.invalidate(seg, idx, &mut m)?;
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------
    // Pinning and atomics

    /// Pins the blocks of `[addr, addr + len)`: read-write and never
    /// protected until unpinned.
    pub fn pin(&self, addr: usize, len: usize) -> DsmResult<()> {
        self.check()?;
        self.for_blocks(addr, len, |seg, idx| {
            let mut m = seg.entry(idx).lock();
            self.write_upgrade(seg, idx, &mut m)?;
            m.state = BlockState::Pinned;
            Ok(())
        })
    }

    /// Unpins the blocks of `[addr, addr + len)`: they become writable
    /// blocks that the next release fence releases.
    pub fn unpin(&self, addr: usize, len: usize) -> DsmResult<()> {
        self.check()?;
        self.for_blocks(addr, len, |seg, idx| {
            let mut m = seg.entry(idx).lock();
            if m.state == BlockState::Pinned {
                m.state = BlockState::Writable;
                self.add_to_write_set(seg, idx, &mut m);
            }
            Ok(())
        })
    }

    /// State of the block holding `addr` (tests and diagnostics).
    pub fn state_of(&self, addr: usize) -> Option<BlockState> {
        let (seg, idx) = self.locate(addr)?;
        Some(seg.entry(idx).lock().state)
    }

    fn for_blocks(
        &self,
        addr: usize,
        len: usize,
        mut f: impl FnMut(&Segment<U>, usize) -> DsmResult<()>,
    ) -> DsmResult<()> {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| DsmError::InvalidArgument("range overflows".into()))?;
        let mut a = addr;
        while a < end {
            let (seg, idx) = self.locate(a).ok_or_else(|| {
                DsmError::InvalidArgument(format!("{a:#x} is not in a DSM segment"))
            })?;
            let r = f(seg, idx);
            self.guard(r)?;
            a = seg.app(idx) + seg.block_size;
        }
        Ok(())
    }

    /// Applies `op` to the aligned word at `addr` inside a transaction on
    /// its block; returns the old value.
    pub fn atomic_in_block(&self, addr: usize, op: AtomicOp) -> DsmResult<u64> {
        self.check()?;
        if !addr.is_multiple_of(8) {
            return Err(DsmError::InvalidArgument(format!(
                "DSM atomic at {addr:#x} is not 8-byte aligned"
            )));
        }
        let (seg, idx) = self.locate(addr).ok_or_else(|| {
            DsmError::InvalidArgument(format!("{addr:#x} is not in a DSM segment"))
        })?;
        let mut m = seg.entry(idx).lock();
        let at = addr - seg.app(idx);
        let r = self.transaction(seg, idx, &mut m, TxKind::Atomic(at, op));
        self.guard(r)
    }
}

impl<C: Communicator, U: UltItf> Drop for Space<C, U> {
    fn drop(&mut self) {
        for s in self.segs.iter() {
            let p = s.swap(core::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: every published segment came from Box::into_raw in
                // `create_segment`; we own the space exclusively here.
                let seg = unsafe { Box::from_raw(p) };
                seg.retire();
            }
        }
    }
}
