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
//! The parts: [`command`] (what the offloader hands over), [`issue`] (what a
//! command needs and becomes), [`buffers`] (registered local memory),
//! [`post`] (chains of work requests), [`complete`] (completions).
//!
//! Batched calls: [`Device::post_batch`] builds the work requests of every
//! command it takes and posts them as one chain per queue pair — one
//! `ibv_post_send` (one doorbell) per target rank in the batch, rather than
//! one per work request; [`Device::poll_batch`] reports the commands that one
//! `ibv_poll_cq` of up to [`WC_BATCH`] completions finished.

mod buffers;
mod command;
mod complete;
mod issue;
mod post;

use std::collections::HashMap;
use std::os::raw::c_int;
use std::sync::Arc;

use ct_delegate::{Device, PostBatch, Tag};

use super::context::Ctx;
use super::queue_pair::Qp;
use crate::com::Result;
use crate::com::offload::Completions;
use buffers::Pool;
pub(crate) use command::{Command, Kind};
use complete::InFlight;
use post::QueuedWr;

/// Bytes of a staging slot; larger transfers register the caller's buffer.
pub(crate) const SLOT_BYTES: usize = 64 * 1024;
const SLOTS: usize = 64;
const CELLS: usize = 4096;
/// Completions taken per `ibv_poll_cq` (as many as the offloader asks for
/// per poll call).
const WC_BATCH: usize = ct_delegate::offload::BATCH;

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
    /// Commands with the adapter, by tag.
    ops: HashMap<Tag, InFlight>,
    /// Finished commands and flush barriers, to report in order.
    completions: Completions,
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
            completions: Completions::default(),
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
        if let Some(t) = self.completions.pop() {
            return Some(t);
        }
        if !self.ops.is_empty() {
            self.poll_cq();
        }
        self.release_barriers();
        self.completions.pop()
    }

    /// At most one `ibv_poll_cq` (of up to [`WC_BATCH`] completions), and
    /// only when the operations finished earlier do not fill `tags`.
    fn poll_batch(&mut self, tags: &mut [Tag]) -> usize {
        if self.completions.backlog() < tags.len() && !self.ops.is_empty() {
            self.poll_cq();
        }
        self.release_barriers();
        self.completions.report(tags)
    }
}
