//! Synchronisation on the DSM: barriers, mutexes whose hand-off carries the
//! releaser's signature, and atomics on DSM words (Endo 2020 §3.5.3;
//! `original-menps-design.md` §3.11).
//!
//! - **Barrier** = release fence, then an allgather of the processes'
//!   release signatures, and every process acquires the others'. A
//!   signature of up to [`BARRIER_INLINE_NOTICES`] write notices travels in
//!   the allgather itself (one collective, the cost of the communication
//!   layer's barrier); a longer one is written into its process's slot of a
//!   window (double-buffered by barrier parity) before, the allgather
//!   carries its header, and the others read it one-sidedly after. Its cost
//!   does not depend on how much DSM memory exists: only blocks in the write
//!   set are released, only listed blocks are invalidated.
//! - **Mutexes** are distributed queue locks ([`super::qlock`]) whose
//!   lock-associated data is the releaser's signature; a local mutex of the
//!   threading library serialises the threads of one process first. Ids
//!   come from a bitmap at rank 0 and are reused after `free`.
//! - **Flush** (a fence with no synchronisation object, OpenMP's `flush`):
//!   release fence, then the process publishes its release signature in its
//!   own slot of a window (a sequence lock: odd while being written), reads
//!   the other processes' sequence numbers and acquires each signature that
//!   changed since it last looked. Two processes that flush in turn thus
//!   see each other's writes without meeting anywhere; a flush that finds
//!   nothing new costs one remote word read per process.
//! - **Atomics** run under the word's block lock (which serialises them
//!   with every merge of that block) — under the floating home on the word
//!   of the block's latest version, with a remote atomic at its last writer
//!   (`Space::atomic_at_home`), otherwise as a transaction on the block —
//!   inside a *sync slot*: one of 64 extra mutexes chosen by the block,
//!   whose signature gives them release and acquire semantics.

use ct_sync::{Mutex, RawLock, RawMutex};
use ct_worker::UltItf;

use crate::com::{Communicator, Tag, WindowId};

use super::config::InvalidationPolicy;
use super::error::{DsmError, DsmResult};
use super::layout::MAX_SEGMENTS;
use super::qlock::{self, Granted, LockSite};
use super::signature::{HEADER_BYTES, Signature, WriteNotice};
use super::space::{AtomicOp, DSM_TAG_BIT, Space};

/// Sync slots for atomics.
pub(crate) const ATOMIC_SLOTS: usize = 64;
/// Write notices a barrier carries in its collective (a longer signature is
/// read from the releaser's slot after it).
const BARRIER_INLINE_NOTICES: usize = 8;
/// Bytes per process of the barrier's collective: a signature with at most
/// [`BARRIER_INLINE_NOTICES`] notices (small enough for the backends'
/// one-step allgathers).
pub(crate) const BARRIER_RECORD_BYTES: usize =
    HEADER_BYTES + BARRIER_INLINE_NOTICES * WriteNotice::BYTES;
/// Racing words the job remembers as reported (more are reported again).
const RACE_SLOTS: usize = 1024;

/// A process's barrier state: the epoch, and buffers kept from one barrier
/// to the next (a barrier storm would otherwise allocate several per
/// episode).
#[derive(Default)]
struct BarrierState {
    /// Barriers this process has passed.
    epoch: u64,
    /// Every process's record of the current barrier.
    records: Vec<u8>,
    /// An empty signature, to become the next release signature.
    spare: Signature,
    /// A peer's signature, as parsed from its record.
    peer: Signature,
}

/// Windows and local state of the synchronisation objects.
pub(crate) struct SyncState<U: UltItf> {
    /// Barrier signature slots: two per process.
    sig_win: WindowId,
    /// Mutex words and LAD slots.
    mutex_win: WindowId,
    /// At rank 0: the mutex id bitmap, then the keys of keyed mutexes (one
    /// word per keyed mutex, `key + 1` once claimed, 0 while free, from
    /// offset `key_off`).
    alloc_win: WindowId,
    /// Offset of the key table in `alloc_win`.
    key_off: usize,
    /// Keys this process has looked up already.
    keys: std::sync::Mutex<std::collections::HashMap<u64, u32>>,
    /// Bytes of one serialized signature at most.
    sig_bytes: usize,
    /// Bytes of a mutex slot (word + signature).
    mutex_slot: usize,
    max_mutexes: usize,
    /// Serialises the threads of this process per mutex / sync slot.
    local: Box<[RawMutex<U>]>,
    /// Barrier epoch and buffers (and serialisation of barriers in this
    /// process).
    barrier: Mutex<BarrierState, U>,
    /// Flush slots: per process a sequence word, then a signature.
    flush_win: WindowId,
    /// At rank 0: the words whose race was reported (open addressing,
    /// `word + 1` per claimed slot), so each is reported once in the job.
    race_win: WindowId,
    /// This process's side of the flushes (and their serialisation).
    flush: Mutex<FlushState, U>,
}

/// What one process knows of the flush slots.
struct FlushState {
    /// Sequence number of our slot (even: complete).
    seq: u64,
    /// The signature last published in our slot.
    published: Vec<u8>,
    /// The stamp (`Signature::stamp`) of our release signature when a flush
    /// last compared it with `published` (0: none): while it stays the
    /// same, so do the bytes, and a wait loop's flushes skip serializing it
    /// (a signature of a few hundred notices at every flush was a twentieth
    /// of an LU-style wavefront's time).
    published_stamp: u64,
    /// Per process: the sequence number of its slot we last acquired.
    seen: Vec<u64>,
    /// Per process: the signature we last acquired from its slot (only
    /// what a new one adds to it is applied).
    last: Vec<Signature>,
}

impl<U: UltItf> SyncState<U> {
    /// Creates the windows (collective).
    pub fn new<C: Communicator>(com: &C, wn_cap: usize, max_mutexes: usize) -> DsmResult<Self> {
        let sig_bytes = Signature::max_bytes(wn_cap).next_multiple_of(8);
        let mutex_slot = 8 + sig_bytes;
        // Allocated mutexes, the atomics' sync slots, keyed mutexes.
        let total = 2 * max_mutexes + ATOMIC_SLOTS;
        let sig_win = com.create_window(2 * sig_bytes)?;
        let mutex_win = com.create_window(total * mutex_slot)?;
        let key_off = max_mutexes.div_ceil(64) * 8;
        let alloc_win = com.create_window(key_off + max_mutexes * 8)?;
        let flush_win = com.create_window(8 + sig_bytes)?;
        let race_win = com.create_window(RACE_SLOTS * 8)?;
        Ok(SyncState {
            flush_win,
            race_win,
            flush: Mutex::new_in(FlushState {
                seq: 0,
                published: Vec::new(),
                published_stamp: 0,
                seen: vec![0; com.size()],
                last: (0..com.size()).map(|_| Signature::new(wn_cap)).collect(),
            }),
            sig_win,
            mutex_win,
            alloc_win,
            key_off,
            keys: std::sync::Mutex::new(std::collections::HashMap::new()),
            sig_bytes,
            mutex_slot,
            max_mutexes,
            local: (0..total).map(|_| RawMutex::new()).collect(),
            barrier: Mutex::new_in(BarrierState::default()),
        })
    }
}

/// Reads into `peer` the signature that process `q`'s barrier (or fork)
/// record `rec` carries inline.
fn read_record(peer: &mut Signature, rec: &[u8], cap: usize, q: usize) -> DsmResult<()> {
    let (_, n) = Signature::parse_header(rec);
    if rec.len() == BARRIER_RECORD_BYTES && n <= BARRIER_INLINE_NOTICES && peer.read_bytes(rec, cap)
    {
        Ok(())
    } else {
        Err(DsmError::Misuse(format!(
            "corrupt barrier record from process {q}"
        )))
    }
}

/// Tag of hand-offs of mutex / sync slot `id` (the segment field holds the
/// reserved last slot number, so they never collide with block tags).
fn mutex_tag(id: usize) -> Tag {
    DSM_TAG_BIT | ((MAX_SEGMENTS as Tag) << 24) | id as Tag
}

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    fn sync(&self) -> &SyncState<U> {
        self.sync_state()
    }

    fn mutex_site(&self, id: usize) -> LockSite {
        let s = self.sync();
        LockSite {
            win: s.mutex_win,
            word_off: (id * s.mutex_slot) as u64,
            init_owner: id % self.nprocs,
            tag: mutex_tag(id),
        }
    }

    /// Reads a signature from `rank`'s part of `win` at `off`.
    fn read_signature(&self, win: WindowId, rank: usize, off: u64) -> DsmResult<Signature> {
        let cap = self.cfg.effective_wn_list_len();
        let mut head = [0u8; HEADER_BYTES];
        self.com.read(win.at(rank, off), &mut head)?;
        let (_, n) = Signature::parse_header(&head);
        let max = Signature::max_bytes(cap);
        let len = HEADER_BYTES + n.saturating_mul(WriteNotice::BYTES);
        if len > max {
            return Err(DsmError::Misuse(format!(
                "corrupt signature from process {rank}: {n} write notices, at most {cap} fit"
            )));
        }
        let mut buf = vec![0u8; len];
        buf[..HEADER_BYTES].copy_from_slice(&head);
        if len > HEADER_BYTES {
            self.com.read(
                win.at(rank, off + HEADER_BYTES as u64),
                &mut buf[HEADER_BYTES..],
            )?;
        }
        Signature::from_bytes(&buf, cap)
            .ok_or_else(|| DsmError::Misuse(format!("corrupt signature from process {rank}")))
    }

    /// DSM barrier: release fence, exchange of signatures, acquire.
    pub fn barrier(&self) -> DsmResult<()> {
        let _rt = self.enter()?;
        let r = self.barrier_inner();
        r.map_err(|e| self.fail(e))
    }

    fn barrier_inner(&self) -> DsmResult<()> {
        let s = self.sync();
        let mut st = s.barrier.lock();
        let BarrierState {
            epoch,
            records,
            spare,
            peer,
        } = &mut *st;
        let stats = &self.stats;
        stats
            .barriers
            .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        let _t = stats.timed(&stats.barrier_ns);
        self.release_fence()?;
        let cap = self.cfg.effective_wn_list_len();
        // Our signature; the (empty) one of the last barrier takes its place.
        spare.reset(cap);
        let mut mine = core::mem::replace(&mut *self.rel_sig.lock(), core::mem::take(spare));
        let off = ((*epoch % 2) as usize * s.sig_bytes) as u64;
        // The signature travels with the barrier if it is short; a longer
        // one is left in our slot for the others to read, and the record
        // carries its header only (its count tells them to read it).
        let mut record = [0u8; BARRIER_RECORD_BYTES];
        if mine.byte_len() <= BARRIER_RECORD_BYTES {
            mine.serialize_into(&mut record);
        } else {
            let bytes = mine.to_bytes();
            self.com.write(s.sig_win.at(self.rank, off), &bytes)?;
            self.com.flush(self.rank)?;
            record[..HEADER_BYTES].copy_from_slice(&bytes[..HEADER_BYTES]);
        }
        *spare = mine;
        records.resize(BARRIER_RECORD_BYTES * self.nprocs, 0);
        {
            let _w = stats.timed(&stats.barrier_wait_ns);
            // Only the notices a record holds are read (an empty
            // signature's record is its header).
            self.com.allgather_prefix_into(
                &record,
                HEADER_BYTES,
                &|h| match Signature::parse_header(h) {
                    (_, n) if n <= BARRIER_INLINE_NOTICES => HEADER_BYTES + n * WriteNotice::BYTES,
                    // A longer signature is read from its slot.
                    _ => HEADER_BYTES,
                },
                records,
            )?;
        }
        let mut min = 0;
        for (q, rec) in records.chunks_exact(BARRIER_RECORD_BYTES).enumerate() {
            if q == self.rank {
                continue;
            }
            let (rec_min, n) = Signature::parse_header(rec);
            if n == 0 {
                // Nothing to invalidate but what the minimum write
                // timestamp makes stale, which the final acquire below
                // (the largest minimum) covers.
                min = min.max(rec_min);
                continue;
            }
            if n <= BARRIER_INLINE_NOTICES {
                read_record(peer, rec, cap, q)?;
            } else {
                *peer = self.read_signature(s.sig_win, q, off)?;
            }
            min = min.max(peer.min_wr_ts());
            self.acquire(peer)?;
        }
        let mut ts = Signature::new(0);
        ts.raise_min_wr_ts(min);
        self.acquire(&mut ts)?;
        *epoch += 1;
        Ok(())
    }

    /// The release half of a fork (see `Team`): this process's writes are
    /// released, and its signature — what the others must acquire to see
    /// them — returned as a barrier record, to travel with the fork's
    /// command instead of a barrier's collective. The signature starts
    /// anew, as after a barrier: every process acquires the record before
    /// the fork's threads run. `None` if the signature is too long for a
    /// record, or under the directory policy (whose acquires drain
    /// invalidation queues that a record does not order): the fork then
    /// takes a DSM barrier, and the signature is left for it.
    pub(crate) fn fork_release(&self) -> DsmResult<Option<[u8; BARRIER_RECORD_BYTES]>> {
        let _rt = self.enter()?;
        let r = self.fork_release_inner();
        r.map_err(|e| self.fail(e))
    }

    fn fork_release_inner(&self) -> DsmResult<Option<[u8; BARRIER_RECORD_BYTES]>> {
        if self.cfg.invalidation == InvalidationPolicy::Directory {
            return Ok(None);
        }
        let mut st = self.sync().barrier.lock();
        self.release_fence()?;
        let cap = self.cfg.effective_wn_list_len();
        let mut sig = self.rel_sig.lock();
        if sig.byte_len() > BARRIER_RECORD_BYTES {
            return Ok(None);
        }
        let mut record = [0u8; BARRIER_RECORD_BYTES];
        sig.serialize_into(&mut record);
        st.spare.reset(cap);
        let mine = core::mem::replace(&mut *sig, core::mem::take(&mut st.spare));
        st.spare = mine;
        Ok(Some(record))
    }

    /// The acquire half of a fork: acquires the `record` that the forking
    /// process's [`Space::fork_release`] made.
    pub(crate) fn fork_acquire(&self, record: &[u8]) -> DsmResult<()> {
        let _rt = self.enter()?;
        let r = self.fork_acquire_inner(record);
        r.map_err(|e| self.fail(e))
    }

    fn fork_acquire_inner(&self, record: &[u8]) -> DsmResult<()> {
        let mut st = self.sync().barrier.lock();
        let (min, n) = Signature::parse_header(record);
        if n == 0 {
            // Only the minimum write timestamp, as in a barrier.
            let mut ts = Signature::new(0);
            ts.raise_min_wr_ts(min);
            return self.acquire(&mut ts);
        }
        read_record(&mut st.peer, record, self.cfg.effective_wn_list_len(), 0)?;
        self.acquire(&mut st.peer)
    }

    // -----------------------------------------------------------------
    // Flush

    /// Flush: this process's writes so far become visible to every process
    /// at its next flush (or other acquire), and every write another process
    /// published with a flush (or a lock release it passed on) before this
    /// one is visible after it. Returns whether it published or acquired
    /// anything — `false` tells a thread that waits for a flag by flushing
    /// in a loop that it may back off.
    pub fn flush(&self) -> DsmResult<bool> {
        let _rt = self.enter()?;
        let r = self.flush_inner();
        r.map_err(|e| self.fail(e))
    }

    fn flush_inner(&self) -> DsmResult<bool> {
        let s = self.sync();
        let mut fl = s.flush.lock();
        let stats = &self.stats;
        stats
            .flushes
            .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        self.release_fence()?;
        if self.cfg.invalidation == InvalidationPolicy::Directory {
            // Invalidations arrive in our queue: draining it is the acquire.
            let before = self.invalidations_drained();
            self.acquire_inner(&mut Signature::new(0))?;
            return Ok(self.invalidations_drained() != before);
        }
        let mut news = false;
        let mut sig = self.rel_sig.lock();
        let stamp = sig.stamp();
        if stamp != fl.published_stamp {
            let bytes = sig.to_bytes();
            drop(sig);
            if bytes != fl.published {
                self.publish_flush_slot(&mut fl, bytes, || {})?;
                news = true;
            }
            fl.published_stamp = stamp;
        } else {
            drop(sig);
        }
        for q in (0..self.nprocs).filter(|&q| q != self.rank) {
            // Every signature `q` completed before we look is acquired now: a
            // thread that saw a flag `q` set after its flush must find the
            // data `q` released before setting it. So a slot being rewritten
            // (odd) or rewritten while we read it is read again, not left to
            // a later flush (which let an LU-style pipeline read a stale
            // row, one run in 40 at 4 processes: the flag's own flush was
            // publishing while the reader looked). The writer's window is a
            // few word writes; a peer that dies in it fails the load.
            let mut backoff = ct_sync::Backoff::new();
            loop {
                let seq = self.com.atomic_load(s.flush_win.at(q, 0))?;
                if seq == fl.seen[q] {
                    break;
                }
                news = true;
                if seq % 2 == 0 {
                    let sig = self.read_signature(s.flush_win, q, 8);
                    // Checked before `sig` is used: a torn read may not parse.
                    if self.com.atomic_load(s.flush_win.at(q, 0))? == seq {
                        let mut sig = sig?;
                        // Its notices we acquired at an earlier flush need
                        // nothing more: each copy they made stale was
                        // dropped (or refreshed) then, and whatever we
                        // fetched after that is at least their version.
                        // They went into our signature then too, and are
                        // still there, or covered by its minimum write
                        // timestamp (truncated), or by a barrier since
                        // (which every process passed: its acquire covers
                        // them for all).
                        let mut new = sig.minus(&mut fl.last[q]);
                        self.acquire_inner(&mut new)?;
                        self.rel_sig.lock().merge(&new);
                        fl.seen[q] = seq;
                        fl.last[q] = sig;
                        break;
                    }
                }
                backoff.snooze(U::yield_now);
            }
        }
        Ok(news)
    }

    /// Writes `bytes` (our release signature) into our flush slot under its
    /// sequence lock: the sequence number is odd while the slot is being
    /// rewritten, and `while_open` runs then.
    fn publish_flush_slot(
        &self,
        fl: &mut FlushState,
        bytes: Vec<u8>,
        while_open: impl FnOnce(),
    ) -> DsmResult<()> {
        let s = self.sync();
        let seq = s.flush_win.at(self.rank, 0);
        self.com.compare_and_swap(seq, fl.seq, fl.seq + 1)?;
        self.com.flush(self.rank)?;
        while_open();
        self.com.write(s.flush_win.at(self.rank, 8), &bytes)?;
        self.com.flush(self.rank)?;
        self.com.compare_and_swap(seq, fl.seq + 1, fl.seq + 2)?;
        self.com.flush(self.rank)?;
        fl.seq += 2;
        fl.published = bytes;
        Ok(())
    }

    /// A flush whose publication lasts as long as `f` runs: our flush slot
    /// is marked as being rewritten (odd) before `f` and completed after
    /// it (tests: a peer's flush meanwhile must wait for it, not skip it).
    pub(crate) fn flush_publishing_during(&self, f: impl FnOnce()) -> DsmResult<()> {
        let _rt = self.enter()?;
        let mut fl = self.sync().flush.lock();
        self.release_fence()?;
        let bytes = self.rel_sig.lock().to_bytes();
        fl.published_stamp = 0;
        self.publish_flush_slot(&mut fl, bytes, f)
    }

    // -----------------------------------------------------------------
    // Race reports

    /// Claims the report of a race on `word` for this process: `true` the
    /// first time any process of the job claims it (also when the job's
    /// table of reported words is full).
    pub(crate) fn claim_race_report(&self, word: usize) -> DsmResult<bool> {
        let s = self.sync();
        let stored = word as u64 + 1;
        let h = (word as u64 >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..RACE_SLOTS.min(16) {
            let k = (h as usize).wrapping_add(i) % RACE_SLOTS;
            let slot = s.race_win.at(0, (k * 8) as u64);
            match self.com.compare_and_swap(slot, 0, stored)? {
                0 => return Ok(true),
                v if v == stored => return Ok(false),
                _ => {}
            }
        }
        Ok(true)
    }

    // -----------------------------------------------------------------
    // Mutexes

    /// Allocates a mutex id (not collective).
    pub fn mutex_alloc(&self) -> DsmResult<u32> {
        let _rt = self.enter()?;
        let s = self.sync();
        for w in 0..s.max_mutexes.div_ceil(64) {
            let word = s.alloc_win.at(0, (w * 8) as u64);
            let mut v = self.com.atomic_load(word)?;
            loop {
                let bits = (s.max_mutexes - w * 64).min(64);
                let free = (!v).trailing_zeros() as usize;
                if free >= bits {
                    break;
                }
                let old = self.com.compare_and_swap(word, v, v | (1 << free))?;
                if old == v {
                    return Ok((w * 64 + free) as u32);
                }
                v = old;
            }
        }
        Err(DsmError::OutOfMemory(format!(
            "all {} DSM mutexes are in use (raise MENPS_DSM_MUTEXES)",
            s.max_mutexes
        )))
    }

    /// Frees a mutex id; it must not be locked.
    pub fn mutex_free(&self, id: u32) -> DsmResult<()> {
        let _rt = self.enter()?;
        let s = self.sync();
        let id = self.check_mutex(id)?;
        if id >= s.max_mutexes {
            return Err(DsmError::Misuse(format!(
                "DSM mutex {id} is keyed: keyed mutexes live as long as the DSM"
            )));
        }
        if s.local[id].is_locked() {
            return Err(DsmError::Misuse(format!(
                "DSM mutex {id} freed while locked"
            )));
        }
        let word = s.alloc_win.at(0, ((id / 64) * 8) as u64);
        let bit = 1u64 << (id % 64);
        let mut v = self.com.atomic_load(word)?;
        loop {
            if v & bit == 0 {
                return Err(DsmError::Misuse(format!(
                    "DSM mutex {id} is not allocated (never allocated, or freed already)"
                )));
            }
            let old = self.com.compare_and_swap(word, v, v & !bit)?;
            if old == v {
                return Ok(());
            }
            v = old;
        }
    }

    /// First id of the keyed mutexes.
    fn keyed_base(&self) -> usize {
        self.sync().max_mutexes + ATOMIC_SLOTS
    }

    fn check_mutex(&self, id: u32) -> DsmResult<usize> {
        let id = id as usize;
        let max = self.sync().max_mutexes;
        if id >= max && !(self.keyed_base()..self.keyed_base() + max).contains(&id) {
            return Err(DsmError::InvalidArgument(format!(
                "DSM mutex id {id} is neither an allocated mutex (0..{max}) nor a keyed one"
            )));
        }
        Ok(id)
    }

    /// The mutex of `key` — the same mutex in every process that asks for
    /// the same key, with no exchange beforehand (a key is an address, a
    /// hashed name …). Keyed mutexes live as long as the DSM; the first
    /// lookup of a key in a process claims or finds it in a table at
    /// process 0 (open addressing, one remote compare-and-swap per probe),
    /// later lookups are local.
    pub fn mutex_for_key(&self, key: u64) -> DsmResult<u32> {
        let _rt = self.enter()?;
        let s = self.sync();
        if let Some(&id) = s.keys.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(id);
        }
        let stored = key
            .checked_add(1)
            .ok_or_else(|| DsmError::InvalidArgument("the key u64::MAX is reserved".into()))?;
        let n = s.max_mutexes;
        // A 64-bit mix, so that neighbouring addresses spread out.
        let h = (key ^ (key >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let start = ((h ^ (h >> 32)) % n as u64) as usize;
        for i in 0..n {
            let k = (start + i) % n;
            let word = s.alloc_win.at(0, (s.key_off + k * 8) as u64);
            let mut v = self.com.atomic_load(word)?;
            if v == 0 {
                v = self.com.compare_and_swap(word, 0, stored)?;
                if v == 0 {
                    v = stored;
                }
            }
            if v == stored {
                let id = (self.keyed_base() + k) as u32;
                s.keys
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, id);
                return Ok(id);
            }
        }
        Err(DsmError::OutOfMemory(format!(
            "all {n} keyed DSM mutexes are in use (raise MENPS_DSM_MUTEXES)"
        )))
    }

    /// Locks mutex `id`: acquires the signature of its last holder.
    pub fn mutex_lock(&self, id: u32) -> DsmResult<()> {
        let _rt = self.enter()?;
        let id = self.check_mutex(id)?;
        self.lock_slot(id)
    }

    /// Unlocks mutex `id`: release fence, then the signature goes with the
    /// lock.
    pub fn mutex_unlock(&self, id: u32) -> DsmResult<()> {
        let _rt = self.enter()?;
        let id = self.check_mutex(id)?;
        if !self.sync().local[id].is_locked() {
            return Err(DsmError::Misuse(format!(
                "DSM mutex {id} unlocked but not locked"
            )));
        }
        if let Err(e) = self.release_fence() {
            // SAFETY: the local lock was taken by this process's lock call
            // (the caller's contract), and we give up the mutex on failure.
            unsafe { self.sync().local[id].unlock() };
            return Err(e);
        }
        self.unlock_slot(id)
    }

    fn lock_slot(&self, id: usize) -> DsmResult<()> {
        let s = self.sync();
        s.local[id].lock();
        let r = self.lock_slot_global(id);
        if r.is_err() {
            // SAFETY: taken just above by this thread.
            unsafe { s.local[id].unlock() };
        }
        r.map_err(|e| self.fail(e))
    }

    fn lock_slot_global(&self, id: usize) -> DsmResult<()> {
        let s = self.sync();
        let site = self.mutex_site(id);
        let cap = self.cfg.effective_wn_list_len();
        let sig = match qlock::lock(&self.com, &site)? {
            Granted::Local => None,
            Granted::FromOwner(p) => {
                Some(self.read_signature(s.mutex_win, p, site.word_off + 8)?)
            }
            Granted::HandOff(p, bytes) => {
                Some(Signature::from_bytes(&bytes, cap).ok_or_else(|| {
                    DsmError::Misuse(format!("corrupt mutex hand-off from process {p}"))
                })?)
            }
        };
        if let Some(mut sig) = sig {
            self.acquire(&mut sig)?;
            self.rel_sig.lock().merge(&sig);
        }
        Ok(())
    }

    fn unlock_slot(&self, id: usize) -> DsmResult<()> {
        let s = self.sync();
        let site = self.mutex_site(id);
        let bytes = self.rel_sig.lock().to_bytes();
        let slot = s.mutex_win.at(self.rank, site.word_off + 8);
        let r = qlock::unlock(&self.com, &site, &bytes, || {
            self.com.write(slot, &bytes).map_err(Into::into)
        });
        // SAFETY: the local lock was taken by `lock_slot` in this process.
        unsafe { s.local[id].unlock() };
        r.map_err(|e| self.fail(e))
    }

    // -----------------------------------------------------------------
    // Atomics

    /// Compare-and-swap of the DSM word at `addr` (acquire and release):
    /// `Ok(old)` if it was `expected` and is now `new`, `Err(actual)`
    /// otherwise.
    pub fn compare_exchange(
        &self,
        addr: usize,
        expected: u64,
        new: u64,
    ) -> DsmResult<Result<u64, u64>> {
        let old = self.atomic(addr, AtomicOp::CompareExchange(expected, new), true)?;
        Ok(if old == expected { Ok(old) } else { Err(old) })
    }

    /// Applies `op` to the DSM word at `addr` with the given semantics.
    pub fn atomic(&self, addr: usize, op: AtomicOp, release: bool) -> DsmResult<u64> {
        let _rt = self.enter()?;
        if !addr.is_multiple_of(8) {
            return Err(DsmError::InvalidArgument(format!(
                "DSM atomic at {addr:#x} is not 8-byte aligned"
            )));
        }
        let bs = self.block_size_at(addr).ok_or_else(|| {
            DsmError::InvalidArgument(format!("{addr:#x} is not in a DSM segment"))
        })?;
        if release {
            self.release_fence()?;
        }
        let slot = self.sync().max_mutexes + (addr / bs) % ATOMIC_SLOTS;
        self.lock_slot(slot)?;
        let r = self.atomic_in_block(addr, op);
        let u = self.unlock_slot(slot);
        let v = r?;
        u?;
        Ok(v)
    }
}
