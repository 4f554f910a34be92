//! The RC queue pairs and the completion queue as a
//! [`ct_delegate::Device`]: the offloader's executor posts work requests,
//! its completer polls completions.
//!
//! Local buffers must be registered. A command's local buffer is used in
//! place when it lies inside a registered window of this process (the
//! DSM's usual case); otherwise small transfers go through a registered
//! staging slot (copied in at post, out at completion) and large ones
//! register the caller's buffer for the duration of the operation. Atomic
//! results land in registered 8-byte cells. A command that finds no free
//! slot, cell or send-queue entry is refused and retried by the offloader
//! after completions have freed some.
//!
//! Batched calls: [`Device::post_batch`] builds the work requests of every
//! command it takes and posts them as one chain per queue pair — one
//! `ibv_post_send` (one doorbell) per target rank in the batch, rather than
//! one per work request; [`Device::poll_batch`] reports the commands that one
//! `ibv_poll_cq` of up to [`WC_BATCH`] completions finished.

use std::collections::{HashMap, VecDeque};
use std::os::raw::c_int;
use std::sync::Arc;

use ct_delegate::{Device, PostBatch, Tag};
use rdma_sys::*;

use super::ctx::{Ctx, Mr, Qp, local_access};
use crate::com::outcome::Outcome;
use crate::com::{Error, Result};

/// Bytes of a staging slot; larger transfers register the caller's buffer.
pub(crate) const SLOT_BYTES: usize = 64 * 1024;
const SLOTS: usize = 64;
const CELLS: usize = 4096;
/// Completions taken per `ibv_poll_cq` (as many as the offloader asks for
/// per poll call).
const WC_BATCH: usize = ct_delegate::offload::BATCH;

/// What a command does.
pub(crate) enum Kind {
    /// RDMA READ of `len` bytes into `dst`.
    Read {
        /// Destination (valid until completion: `Rma::read_nb`'s contract).
        dst: *mut u8,
        /// Length.
        len: usize,
    },
    /// RDMA WRITE of `len` bytes from `src`.
    Write {
        /// Source (valid until completion: `Rma::write_nb`'s contract).
        src: *const u8,
        /// Length.
        len: usize,
    },
    /// Atomic compare-and-swap.
    Cas {
        /// Expected value.
        expected: u64,
        /// New value.
        new: u64,
    },
    /// Atomic fetch-and-add.
    FetchAdd {
        /// Addend.
        delta: u64,
    },
}

/// A command for the device.
pub(crate) enum Command {
    /// A one-sided operation on `rank`'s memory at `remote_addr` (bounds and
    /// alignment already checked), with the window's `rkey` there.
    Rma {
        /// Target rank (index of the queue pair).
        rank: usize,
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// What to do.
        kind: Kind,
        /// Result.
        out: Arc<Outcome>,
    },
    /// Completes once every command posted before it has completed.
    Flush,
}

// SAFETY: the raw pointers in `Kind` point to buffers the issuer keeps valid
// and unshared until the command completes (the unsafe contracts of
// `read_nb` / `write_nb`).
unsafe impl Send for Command {}

/// Where a local buffer comes from, and what completion must do with it.
enum Local {
    /// Inside a registered window: nothing to do.
    InPlace,
    /// A staging slot: copy out `len` bytes to `dst` (reads), then free it.
    Slot {
        slot: usize,
        copy_to: Option<(*mut u8, usize)>,
    },
    /// A registration of the caller's buffer, dropped at completion.
    Registered {
        /// Kept only to be dropped (deregistered) at completion.
        _mr: Mr,
    },
    /// An atomic result cell.
    Cell(usize),
}

/// A work request built by the current post call, posted at its end
/// ([`VerbsDevice::ring`]) in a chain with the others to the same rank.
struct QueuedWr {
    wr: ibv_send_wr,
    /// The work request's only scatter entry (`wr.sg_list` points here once
    /// the chain is linked).
    sge: ibv_sge,
    rank: usize,
}

struct InFlight {
    seq: u64,
    rank: usize,
    /// Work requests not yet completed.
    pending: u32,
    local: Local,
    out: Arc<Outcome>,
    error: Option<Error>,
}

/// Registered, page-aligned anonymous memory.
struct Pool {
    base: *mut u8,
    len: usize,
    mr: Option<Mr>,
    free: Vec<usize>,
}

impl Pool {
    fn new(ctx: &Arc<Ctx>, unit: usize, count: usize) -> Result<Pool> {
        let len = unit * count;
        // SAFETY: a fresh private anonymous mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(crate::sys::os_error("mmap (RDMA staging)"));
        }
        let mut pool = Pool {
            base: p.cast(),
            len,
            mr: None,
            free: (0..count).rev().collect(),
        };
        // SAFETY: the mapping lives until the pool is dropped, after the
        // registration (field order in Drop below).
        pool.mr = Some(unsafe { Mr::register(ctx, pool.base, len, local_access()) }?);
        Ok(pool)
    }

    fn lkey(&self) -> u32 {
        self.mr.as_ref().expect("registered").lkey()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        drop(self.mr.take());
        // SAFETY: our own mapping, no longer registered or referenced.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The verbs device (see the [`verbs` module docs](super)).
pub(crate) struct VerbsDevice {
    /// Queue pair to each rank (index = rank; ours goes to `loopback`).
    qps: Vec<Qp>,
    /// The other end of our own queue pair (accesses to ourselves go
    /// through the adapter too, so that they are atomic with the others').
    _loopback: Qp,
    /// Outstanding work requests per queue pair.
    outstanding: Vec<u32>,
    staging: Pool,
    cells: Pool,
    /// Registered windows of this process: (base, len, lkey).
    windows: Vec<(usize, usize, u32)>,
    ops: HashMap<Tag, InFlight>,
    barriers: VecDeque<(Tag, u64)>,
    ready: VecDeque<Tag>,
    next_seq: u64,
    /// Work requests of the current post call, not yet handed to the
    /// adapter (empty between calls; the buffers are reused).
    queued: Vec<QueuedWr>,
    /// Per rank: first and last index in `queued` of its chain (in `ring`).
    chains: Vec<Option<(usize, usize)>>,
    /// Work requests `ring` could not post: (tag, rank, error code).
    unposted: Vec<(Tag, usize, c_int)>,
    ctx: Arc<Ctx>,
}

// SAFETY: verbs objects may be used from any thread; the device is used by
// one thread at a time (under the offloader's lock); the raw pointers in
// `ops` point to buffers kept valid by the issuers' contracts.
unsafe impl Send for VerbsDevice {}

impl VerbsDevice {
    pub(crate) fn new(ctx: Arc<Ctx>, qps: Vec<Qp>, loopback: Qp) -> Result<Self> {
        Ok(VerbsDevice {
            outstanding: vec![0; qps.len()],
            qps,
            _loopback: loopback,
            staging: Pool::new(&ctx, SLOT_BYTES, SLOTS)?,
            cells: Pool::new(&ctx, 8, CELLS)?,
            windows: Vec::new(),
            ops: HashMap::new(),
            barriers: VecDeque::new(),
            ready: VecDeque::new(),
            next_seq: 0,
            queued: Vec::new(),
            chains: Vec::new(),
            unposted: Vec::new(),
            ctx,
        })
    }

    /// Registers a window of this process for zero-copy local buffers.
    pub(crate) fn add_window(&mut self, base: usize, len: usize, lkey: u32) {
        self.windows.push((base, len, lkey));
    }

    /// Forgets a window (before it is deregistered).
    pub(crate) fn remove_window(&mut self, base: usize) {
        self.windows.retain(|w| w.0 != base);
    }

    fn in_window(&self, addr: usize, len: usize) -> Option<u32> {
        self.windows
            .iter()
            .find(|&&(b, l, _)| addr >= b && addr.saturating_add(len) <= b + l)
            .map(|w| w.2)
    }

    /// Queues the work requests of one operation's pieces for [`ring`]
    /// and counts them as outstanding on `rank`; returns how many.
    ///
    /// [`ring`]: VerbsDevice::ring
    #[allow(clippy::too_many_arguments)]
    fn queue_pieces(
        &mut self,
        tag: Tag,
        rank: usize,
        opcode: ibv_wr_opcode::Type,
        local: (u64, u32),
        remote: (u64, u32),
        len: usize,
        atomic: (u64, u64),
    ) -> u32 {
        let piece = self.ctx.max_msg;
        let pieces = len.div_ceil(piece).max(1);
        for k in 0..pieces {
            let off = k * piece;
            let n = (len - off).min(piece);
            let sge = ibv_sge {
                addr: local.0 + off as u64,
                length: n as u32,
                lkey: local.1,
            };
            // SAFETY: a zeroed work request is valid; filled in below (its
            // scatter list and chain link in `ring`).
            let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = tag as u64;
            wr.num_sge = 1;
            wr.opcode = opcode;
            wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            if opcode == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP
                || opcode == ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD
            {
                wr.wr.atomic = atomic_t {
                    remote_addr: remote.0,
                    compare_add: atomic.0,
                    swap: atomic.1,
                    rkey: remote.1,
                };
            } else {
                wr.wr.rdma = rdma_t {
                    remote_addr: remote.0 + off as u64,
                    rkey: remote.1,
                };
            }
            self.queued.push(QueuedWr { wr, sge, rank });
        }
        self.outstanding[rank] += pieces as u32;
        pieces as u32
    }

    /// Posts the queued work requests: one chain, and one `ibv_post_send`,
    /// per rank, in the order they were queued. Work requests the adapter
    /// refuses complete their operations with an error, as failed
    /// completions do.
    fn ring(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let n = self.queued.len();
        // (`as_mut_ptr` makes no reference to the elements: the pointers
        // derived from it stay valid until `queued` changes.)
        let base = self.queued.as_mut_ptr();
        // SAFETY: `queued` holds `n` elements, with ranks below
        // `qps.len()`; it does not move or change until it is cleared below,
        // and only pointers derived from `base` reach its elements meanwhile.
        unsafe { link_chains(base, n, &mut self.chains, self.qps.len()) };
        for rank in 0..self.chains.len() {
            let Some((first, _)) = self.chains[rank] else {
                continue;
            };
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            // SAFETY: a connected queue pair; the chain's work requests and
            // their scatter entries live in `queued` and are read during the
            // call only; the local buffers are registered and stay valid
            // until the completions (see the `Local` kept in `ops`).
            let rc = unsafe {
                ibv_post_send(self.qps[rank].qp, &raw mut (*base.add(first)).wr, &mut bad)
            };
            if rc != 0 {
                // The adapter took the chain up to `bad`, excluded (none of
                // it if it did not say where it stopped).
                let mut refused = bad.is_null();
                for i in first..n {
                    // SAFETY: as above.
                    let (wr, r) = unsafe { (&raw mut (*base.add(i)).wr, (*base.add(i)).rank) };
                    if r != rank {
                        continue;
                    }
                    refused |= std::ptr::eq(wr, bad);
                    if refused {
                        // SAFETY: as above.
                        let tag = unsafe { (*wr).wr_id } as Tag;
                        self.unposted.push((tag, rank, rc));
                    }
                }
            }
        }
        self.queued.clear();
        // Fail what was not posted, as a failed completion would.
        for k in 0..self.unposted.len() {
            let (tag, rank, rc) = self.unposted[k];
            self.outstanding[rank] = self.outstanding[rank].saturating_sub(1);
            let e = Error::Transport(format!(
                "ibv_post_send to rank {rank} failed: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
            self.work_request_done(tag, Some(e));
        }
        self.unposted.clear();
    }

    /// One work request of operation `tag` is over (completed, or never
    /// posted), with `error` if it failed; finishes the operation after
    /// its last one.
    fn work_request_done(&mut self, tag: Tag, error: Option<Error>) {
        let Some(op) = self.ops.get_mut(&tag) else {
            return;
        };
        if let Some(e) = error {
            op.error.get_or_insert(e);
        }
        op.pending -= 1;
        if op.pending == 0 {
            let op = self.ops.remove(&tag).expect("present");
            self.finish(tag, op);
        }
    }

    /// Issues an RMA command (queues its work requests for [`ring`]);
    /// `Err(kind)` if resources are short now.
    ///
    /// [`ring`]: VerbsDevice::ring
    fn issue(
        &mut self,
        tag: Tag,
        seq: u64,
        rank: usize,
        remote: (u64, u32),
        kind: Kind,
        out: Arc<Outcome>,
    ) -> std::result::Result<(), Kind> {
        let pieces_needed = match &kind {
            Kind::Read { len, .. } | Kind::Write { len, .. } => {
                len.div_ceil(self.ctx.max_msg).max(1) as u32
            }
            _ => 1,
        };
        if pieces_needed > self.ctx.sq_depth {
            // Could never be posted: fail it rather than retry for ever.
            out.fail(Error::InvalidArgument(format!(
                "RDMA transfer needs {pieces_needed} work requests of at most {} bytes, more \
                 than the send queue holds ({})",
                self.ctx.max_msg, self.ctx.sq_depth
            )));
            self.ready.push_back(tag);
            return Ok(());
        }
        let total: u32 = self.outstanding.iter().sum();
        if self.outstanding[rank] + pieces_needed > self.ctx.sq_depth
            || total + pieces_needed > self.ctx.cqe
        {
            // Completions will free room (the completion queue must never
            // overflow: every work request is signalled).
            return Err(kind);
        }
        let (opcode, local, len, atomic, keep) = match kind {
            Kind::Read { dst, len } => {
                let (l, lk) = match self.local_buffer(dst, len, true) {
                    Ok(Some(x)) => x,
                    Ok(None) => return Err(Kind::Read { dst, len }),
                    Err(e) => {
                        out.fail(e);
                        self.ready.push_back(tag);
                        return Ok(());
                    }
                };
                (ibv_wr_opcode::IBV_WR_RDMA_READ, l, len, (0, 0), lk)
            }
            Kind::Write { src, len } => {
                let (l, lk) = match self.local_buffer(src.cast_mut(), len, false) {
                    Ok(Some(x)) => x,
                    Ok(None) => return Err(Kind::Write { src, len }),
                    Err(e) => {
                        out.fail(e);
                        self.ready.push_back(tag);
                        return Ok(());
                    }
                };
                (ibv_wr_opcode::IBV_WR_RDMA_WRITE, l, len, (0, 0), lk)
            }
            Kind::Cas { expected, new } => {
                let Some(cell) = self.cells.free.pop() else {
                    return Err(Kind::Cas { expected, new });
                };
                let addr = self.cells.base as u64 + 8 * cell as u64;
                (
                    ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                    (addr, self.cells.lkey()),
                    8,
                    (expected, new),
                    Local::Cell(cell),
                )
            }
            Kind::FetchAdd { delta } => {
                let Some(cell) = self.cells.free.pop() else {
                    return Err(Kind::FetchAdd { delta });
                };
                let addr = self.cells.base as u64 + 8 * cell as u64;
                (
                    ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
                    (addr, self.cells.lkey()),
                    8,
                    (delta, 0),
                    Local::Cell(cell),
                )
            }
        };
        // Posted by the `ring` that ends this device call.
        let pending = self.queue_pieces(tag, rank, opcode, local, remote, len, atomic);
        self.ops.insert(
            tag,
            InFlight {
                seq,
                rank,
                pending,
                local: keep,
                out,
                error: None,
            },
        );
        Ok(())
    }

    /// A registered local buffer for `len` bytes at `user`: in place, a
    /// staging slot (filled now for writes), or a new registration.
    /// `Ok(None)`: no slot free now.
    fn local_buffer(
        &mut self,
        user: *mut u8,
        len: usize,
        is_read: bool,
    ) -> Result<Option<((u64, u32), Local)>> {
        if let Some(lkey) = self.in_window(user as usize, len) {
            return Ok(Some(((user as u64, lkey), Local::InPlace)));
        }
        if len <= SLOT_BYTES {
            let Some(slot) = self.staging.free.pop() else {
                return Ok(None);
            };
            // SAFETY: slot `slot` of the staging pool has SLOT_BYTES bytes.
            let buf = unsafe { self.staging.base.add(slot * SLOT_BYTES) };
            if !is_read {
                // SAFETY: `user` is valid for `len` bytes (issuer's
                // contract); the slot is ours until completion.
                unsafe { std::ptr::copy_nonoverlapping(user, buf, len) };
            }
            return Ok(Some((
                (buf as u64, self.staging.lkey()),
                Local::Slot {
                    slot,
                    copy_to: is_read.then_some((user, len)),
                },
            )));
        }
        let access = if is_read { local_access() } else { 0 };
        // SAFETY: the buffer stays valid until completion (issuer's
        // contract); the registration is dropped at completion.
        let mr = unsafe { Mr::register(&self.ctx, user, len, access) }?;
        Ok(Some((
            (user as u64, mr.lkey()),
            Local::Registered { _mr: mr },
        )))
    }

    fn release(&mut self, local: Local) {
        match local {
            Local::Slot { slot, .. } => self.staging.free.push(slot),
            Local::Cell(c) => self.cells.free.push(c),
            Local::InPlace | Local::Registered { .. } => {}
        }
    }

    /// Finishes a command whose work requests have all completed.
    fn finish(&mut self, tag: Tag, op: InFlight) {
        if let Some(e) = op.error {
            op.out.fail(e);
        } else {
            match &op.local {
                Local::Slot {
                    slot,
                    copy_to: Some((dst, len)),
                } => {
                    // SAFETY: the RDMA READ into the slot completed; `dst` is
                    // valid for `len` bytes until completion (issuer's
                    // contract).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.staging.base.add(slot * SLOT_BYTES),
                            *dst,
                            *len,
                        )
                    };
                }
                Local::Cell(c) => {
                    // SAFETY: the atomic completed and wrote the old value
                    // into cell `c` of the registered pool.
                    let v =
                        unsafe { std::ptr::read_volatile(self.cells.base.cast::<u64>().add(*c)) };
                    // SAFETY: the command is in flight until we report it.
                    unsafe { *op.out.result_ptr() = v };
                }
                _ => {}
            }
        }
        self.release(op.local);
        self.ready.push_back(tag);
    }

    fn release_barriers(&mut self) {
        if self.barriers.is_empty() {
            return;
        }
        let oldest = self.ops.values().map(|o| o.seq).min().unwrap_or(u64::MAX);
        while let Some(&(tag, seq)) = self.barriers.front() {
            if seq < oldest {
                self.ready.push_back(tag);
                self.barriers.pop_front();
            } else {
                break;
            }
        }
    }

    fn poll_cq(&mut self) {
        // SAFETY: zeroed completions are valid out-parameters.
        let mut wcs: [ibv_wc; WC_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: our completion queue; `wcs` has room for WC_BATCH entries.
        let n = unsafe { ibv_poll_cq(self.ctx.cq, WC_BATCH as c_int, wcs.as_mut_ptr()) };
        if n < 0 {
            let e = Error::Transport("ibv_poll_cq failed".into());
            for op in self.ops.values_mut() {
                op.error.get_or_insert_with(|| e.clone());
            }
            return;
        }
        for wc in &wcs[..n as usize] {
            let tag = wc.wr_id as Tag;
            let Some(rank) = self.ops.get(&tag).map(|op| op.rank) else {
                continue;
            };
            let error = (wc.status != ibv_wc_status::IBV_WC_SUCCESS).then(|| {
                // SAFETY: returns a static string for any status value.
                let what = unsafe { std::ffi::CStr::from_ptr(ibv_wc_status_str(wc.status)) };
                Error::Transport(format!(
                    "RDMA operation to rank {rank} failed: {} (work completion status {})",
                    what.to_string_lossy(),
                    wc.status
                ))
            });
            self.outstanding[rank] = self.outstanding[rank].saturating_sub(1);
            self.work_request_done(tag, error);
        }
    }
}

/// Links the `n` work requests at `base` into one chain per rank, in order
/// (each with its scatter entry); `chains[rank]` gets the first and last
/// index of the rank's chain.
///
/// # Safety
///
/// `base` points to `n` initialised elements, each with `rank < ranks`, that
/// stay in place while the chains are used.
unsafe fn link_chains(
    base: *mut QueuedWr,
    n: usize,
    chains: &mut Vec<Option<(usize, usize)>>,
    ranks: usize,
) {
    chains.clear();
    chains.resize(ranks, None);
    for i in 0..n {
        // SAFETY: `i < n` and `last < i` index elements at `base` (the
        // caller's contract); only raw pointers reach them.
        unsafe {
            let q = base.add(i);
            (*q).wr.sg_list = &raw mut (*q).sge;
            (*q).wr.next = std::ptr::null_mut();
            let chain = &mut chains[(*q).rank];
            match chain {
                None => *chain = Some((i, i)),
                Some((_, last)) => {
                    (*base.add(*last)).wr.next = &raw mut (*q).wr;
                    *last = i;
                }
            }
        }
    }
}

impl VerbsDevice {
    /// Issues `command` (an RMA command's work requests are queued for
    /// [`ring`](VerbsDevice::ring)); gives it back if resources are short.
    fn issue_command(&mut self, command: Command, tag: Tag) -> std::result::Result<(), Command> {
        let seq = self.next_seq;
        match command {
            Command::Flush => {
                self.next_seq += 1;
                if self.ops.is_empty() && self.barriers.is_empty() {
                    self.ready.push_back(tag);
                } else {
                    self.barriers.push_back((tag, seq));
                }
                Ok(())
            }
            Command::Rma {
                rank,
                remote_addr,
                rkey,
                kind,
                out,
            } => match self.issue(tag, seq, rank, (remote_addr, rkey), kind, out.clone()) {
                Ok(()) => {
                    self.next_seq += 1;
                    Ok(())
                }
                Err(kind) => Err(Command::Rma {
                    rank,
                    remote_addr,
                    rkey,
                    kind,
                    out,
                }),
            },
        }
    }
}

impl Device for VerbsDevice {
    type Command = Command;

    fn post(&mut self, command: Command, tag: Tag) -> std::result::Result<(), Command> {
        let r = self.issue_command(command, tag);
        self.ring();
        r
    }

    /// Issues commands until one finds resources short, then posts all
    /// their work requests: one chained `ibv_post_send` per target rank.
    fn post_batch(&mut self, batch: &mut PostBatch<'_, Command>) {
        while let Some((command, tag)) = batch.take() {
            if let Err(command) = self.issue_command(command, tag) {
                batch.give_back(command);
                break;
            }
        }
        self.ring();
    }

    fn poll(&mut self) -> Option<Tag> {
        if let Some(t) = self.ready.pop_front() {
            return Some(t);
        }
        if !self.ops.is_empty() {
            self.poll_cq();
        }
        self.release_barriers();
        self.ready.pop_front()
    }

    /// At most one `ibv_poll_cq` (of up to [`WC_BATCH`] completions), and
    /// only when the operations finished earlier do not fill `tags`.
    fn poll_batch(&mut self, tags: &mut [Tag]) -> usize {
        if self.ready.len() < tags.len() && !self.ops.is_empty() {
            self.poll_cq();
        }
        self.release_barriers();
        let n = tags.len().min(self.ready.len());
        for (t, tag) in tags.iter_mut().zip(self.ready.drain(..n)) {
            *t = tag;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work requests to several ranks, interleaved, become one chain per
    /// rank in queue order, each pointing at its own scatter entry.
    #[test]
    fn work_requests_are_chained_per_rank_in_order() {
        let ranks = [0usize, 2, 0, 1, 2, 0];
        let mut queued: Vec<QueuedWr> = ranks
            .iter()
            .enumerate()
            .map(|(i, &rank)| {
                let mut q: QueuedWr = QueuedWr {
                    // SAFETY: a zeroed work request is valid.
                    wr: unsafe { std::mem::zeroed() },
                    sge: ibv_sge {
                        addr: 0,
                        length: 8,
                        lkey: 0,
                    },
                    rank,
                };
                q.wr.wr_id = i as u64;
                q.sge.addr = 1000 + i as u64;
                q
            })
            .collect();
        let mut chains = Vec::new();
        let base = queued.as_mut_ptr();
        // SAFETY: `queued` holds the elements, with ranks below 4, and is
        // only read through `base` until the end of the test.
        unsafe { link_chains(base, ranks.len(), &mut chains, 4) };
        let walk = |first: usize| {
            let mut ids = Vec::new();
            // SAFETY: the chain links elements of `queued`.
            let mut p: *const ibv_send_wr = unsafe { &raw const (*base.add(first)).wr };
            while !p.is_null() {
                // SAFETY: as above; each scatter entry is its element's.
                unsafe {
                    assert_eq!((*(*p).sg_list).addr, 1000 + (*p).wr_id);
                    ids.push((*p).wr_id);
                    p = (*p).next;
                }
            }
            ids
        };
        assert_eq!(chains, [Some((0, 5)), Some((3, 3)), Some((1, 4)), None]);
        assert_eq!(walk(0), [0, 2, 5]);
        assert_eq!(walk(3), [3]);
        assert_eq!(walk(1), [1, 4]);
    }
}
