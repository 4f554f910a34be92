//! Completion: work completions are polled from the completion queue in
//! batches; a command is finished once all its work requests are (its
//! staged read data copied out, its atomic result read from its cell, its
//! buffers released), and flush barriers are reported once everything
//! accepted before them has finished.

use std::os::raw::c_int;
use std::sync::Arc;

use ct_delegate::Tag;
use rdma_sys::*;

use super::buffers::Local;
use super::{SLOT_BYTES, VerbsDevice, WC_BATCH};
use crate::com::Error;
use crate::com::outcome::Outcome;

/// A command whose work requests are with the adapter.
pub(super) struct InFlight {
    pub(super) seq: u64,
    pub(super) rank: usize,
    /// Work requests not yet completed.
    pub(super) pending: u32,
    pub(super) local: Local,
    pub(super) out: Arc<Outcome>,
    pub(super) error: Option<Error>,
}

impl VerbsDevice {
    /// One work request of operation `tag` is over (completed, or never
    /// posted), with `error` if it failed; finishes the operation after
    /// its last one.
    pub(super) fn work_request_done(&mut self, tag: Tag, error: Option<Error>) {
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
        self.completions.done(tag);
    }

    /// Reports the flush barriers older than every command in flight.
    pub(super) fn release_barriers(&mut self) {
        if !self.completions.has_barriers() {
            return;
        }
        let oldest = self.ops.values().map(|o| o.seq).min().unwrap_or(u64::MAX);
        self.completions.release_barriers(oldest);
    }

    /// Takes up to [`WC_BATCH`] completions from the completion queue
    /// (one `ibv_poll_cq`).
    pub(super) fn poll_cq(&mut self) {
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
