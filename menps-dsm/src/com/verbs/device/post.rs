//! Posting: the work requests of the commands one device call issues are
//! queued, then handed to the adapter as one chain per target rank — one
//! `ibv_post_send` (one doorbell) per rank, rather than one per work
//! request. Work requests the adapter refuses fail their operations as
//! failed completions do.

use rdma_sys::*;

use super::VerbsDevice;
use crate::com::Error;
use ct_delegate::Tag;

/// A work request built by the current post call, posted at its end
/// ([`VerbsDevice::ring`]) in a chain with the others to the same rank.
pub(super) struct QueuedWr {
    wr: ibv_send_wr,
    /// The work request's only scatter entry (`wr.sg_list` points here once
    /// the chain is linked).
    sge: ibv_sge,
    rank: usize,
}

impl VerbsDevice {
    /// Queues the work requests of one operation's pieces for [`ring`]
    /// and counts them as outstanding on `rank`; returns how many.
    ///
    /// [`ring`]: VerbsDevice::ring
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue_pieces(
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
    pub(super) fn ring(&mut self) {
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
