//! Issuing: what a command needs before it can be posted (room in its queue
//! pair's send queue and in the completion queue, a registered local
//! buffer or result cell), and the work requests it becomes. A command that
//! finds something short is given back to the offloader, which retries it
//! after completions have freed resources.

use std::sync::Arc;

use ct_delegate::Tag;
use rdma_sys::*;

use super::VerbsDevice;
use super::buffers::Local;
use super::command::{Command, Kind};
use super::complete::InFlight;
use crate::com::outcome::Outcome;
use crate::com::{Error, Result};

/// The work requests of an operation, once its local buffer is settled.
struct Plan {
    opcode: ibv_wr_opcode::Type,
    /// Local buffer: (address, lkey).
    local: (u64, u32),
    len: usize,
    /// Atomic operands: (compare or addend, swap).
    atomic: (u64, u64),
    /// What completion does with the local buffer.
    keep: Local,
}

impl VerbsDevice {
    /// Issues `command` (an RMA command's work requests are queued for
    /// [`ring`](VerbsDevice::ring)); gives it back if resources are short.
    pub(super) fn issue_command(
        &mut self,
        command: Command,
        tag: Tag,
    ) -> std::result::Result<(), Command> {
        match command {
            Command::Flush => {
                self.completions.flush(tag, self.ops.is_empty());
                Ok(())
            }
            Command::Rma {
                rank,
                remote_addr,
                rkey,
                kind,
                out,
            } => match self.issue(tag, rank, (remote_addr, rkey), kind, out.clone()) {
                Ok(()) => Ok(()),
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

    /// Issues an RMA command (queues its work requests for [`ring`]);
    /// `Err(kind)` if resources are short now.
    ///
    /// [`ring`]: VerbsDevice::ring
    fn issue(
        &mut self,
        tag: Tag,
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
            let e = Error::InvalidArgument(format!(
                "RDMA transfer needs {pieces_needed} work requests of at most {} bytes, more \
                 than the send queue holds ({})",
                self.ctx.max_msg, self.ctx.sq_depth
            ));
            self.fail_at_once(tag, &out, e);
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
        let plan = match self.plan(&kind) {
            Ok(Some(plan)) => plan,
            Ok(None) => return Err(kind),
            Err(e) => {
                self.fail_at_once(tag, &out, e);
                return Ok(());
            }
        };
        let seq = self.completions.accept();
        // Posted by the `ring` that ends this device call.
        let pending = self.queue_pieces(
            tag,
            rank,
            plan.opcode,
            plan.local,
            remote,
            plan.len,
            plan.atomic,
        );
        self.ops.insert(
            tag,
            InFlight {
                seq,
                rank,
                pending,
                local: plan.keep,
                out,
                error: None,
            },
        );
        Ok(())
    }

    /// The work requests of `kind` with their local buffer; `Ok(None)` if
    /// no staging slot or cell is free now.
    fn plan(&mut self, kind: &Kind) -> Result<Option<Plan>> {
        let transfer = |opcode, len| {
            move |(local, keep)| Plan {
                opcode,
                local,
                len,
                atomic: (0, 0),
                keep,
            }
        };
        let atomic = |opcode, atomic| {
            move |(local, keep)| Plan {
                opcode,
                local,
                len: 8,
                atomic,
                keep,
            }
        };
        Ok(match *kind {
            Kind::Read { dst, len } => self
                .local_buffer(dst, len, true)?
                .map(transfer(ibv_wr_opcode::IBV_WR_RDMA_READ, len)),
            Kind::Write { src, len } => self
                .local_buffer(src.cast_mut(), len, false)?
                .map(transfer(ibv_wr_opcode::IBV_WR_RDMA_WRITE, len)),
            Kind::Cas { expected, new } => self.cell().map(atomic(
                ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                (expected, new),
            )),
            Kind::FetchAdd { delta } => self.cell().map(atomic(
                ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
                (delta, 0),
            )),
        })
    }

    /// Fails command `tag` before anything was posted for it.
    fn fail_at_once(&mut self, tag: Tag, out: &Outcome, e: Error) {
        out.fail(e);
        self.completions.done(tag);
    }
}
