//! RMA on MPI: every operation is checked (window, rank, bounds,
//! alignment) before MPI is called, then made either directly by the
//! calling thread or offloaded to `ct-delegate`'s offloader (see the
//! [module docs](super) for when each is used).

use std::os::raw::c_int;
use std::sync::Arc;

use ::mpi::ffi;
use ct_delegate::Offloader;
use ct_worker::UltItf;

use super::device::{Command, Kind, RmaDevice};
use super::raw::{self, Handle};
use super::{MpiCom, served, wait};
use crate::com::outcome::Outcome;
use crate::com::{CasOp, RemotePtr, Request, Result, Rma, batch, check, offload};

/// Where an access goes: (window, target rank, displacement there).
type Target = (ffi::MPI_Win, c_int, ffi::MPI_Aint);

impl<U: UltItf> MpiCom<U> {
    /// The offloader, when RMA is offloaded now.
    #[inline]
    fn offloading(&self) -> Option<&Arc<Offloader<RmaDevice, U>>> {
        self.is_offloaded().then_some(&self.offloader)
    }

    /// Resolves `p` for an access of `len` bytes.
    #[inline]
    fn target(&self, p: RemotePtr, len: usize) -> Result<Target> {
        let (win, disp) = self.windows.resolve(p, len, self.size)?;
        Ok((win, p.rank() as c_int, disp))
    }

    /// [`MpiCom::target`] for an atomic, which needs an aligned word.
    #[inline]
    fn atomic_target(&self, p: RemotePtr) -> Result<Target> {
        check::aligned_word(p)?;
        self.target(p, 8)
    }

    /// Submits an RMA command to the offloader.
    fn submit_rma(
        &self,
        off: &Arc<Offloader<RmaDevice, U>>,
        (win, rank, disp): Target,
        kind: Kind,
        out: Arc<Outcome>,
    ) -> Request<U> {
        let command = Command::Rma {
            win: Handle(win),
            rank,
            disp,
            kind,
            out: out.clone(),
        };
        offload::submit(off, command, out)
    }

    /// A read or write of `len` bytes at `p`: offloaded as `kind`, or made
    /// at once by `direct`.
    fn transfer_nb(
        &self,
        p: RemotePtr,
        len: usize,
        kind: Kind,
        direct: impl FnOnce(Target) -> Result<()>,
    ) -> Result<Request<U>> {
        let t = self.target(p, len)?;
        if len == 0 {
            return Ok(Request::ready(Ok(0)));
        }
        match self.offloading() {
            Some(off) => Ok(self.submit_rma(off, t, kind, Outcome::new(0, 0))),
            None => direct(t).map(|()| Request::ready(Ok(0))),
        }
    }

    /// An atomic on the word at `p`: offloaded as `kind` with the operands
    /// in `out`, or made at once by `direct`.
    fn atomic_nb(
        &self,
        p: RemotePtr,
        kind: Kind,
        out: impl FnOnce() -> Arc<Outcome>,
        direct: impl FnOnce(Target) -> Result<u64>,
    ) -> Result<Request<U>> {
        let t = self.atomic_target(p)?;
        match self.offloading() {
            Some(off) => Ok(self.submit_rma(off, t, kind, out())),
            None => Ok(Request::ready(direct(t))),
        }
    }

    /// Direct read: `MPI_Rget`, polled with `MPI_Test` (yielding), or
    /// pieces of `MPI_Get` + flush beyond `int` counts.
    ///
    /// # Safety
    /// `dst` valid for writes of `len` bytes.
    unsafe fn direct_read(
        &self,
        (win, rank, disp): Target,
        dst: *mut u8,
        len: usize,
    ) -> Result<()> {
        if len > raw::MAX_COUNT {
            // SAFETY: per the contract; the window is live (resolved).
            return unsafe {
                raw::get(win, rank, disp, dst, len)?;
                raw::flush(win, rank)
            };
        }
        // SAFETY: per the contract; the window is live (resolved).
        let mut req = unsafe { raw::rget(win, rank, disp, dst, len) }?;
        let mut backoff = wait::backoff();
        // SAFETY: `req` is active and `dst` stays valid until it completes.
        while !unsafe { raw::test(&mut req) }? {
            super::progress::note_poll();
            backoff.snooze(U::yield_now);
        }
        Ok(())
    }

    /// Direct write: `MPI_Put` + `MPI_Win_flush`.
    ///
    /// # Safety
    /// `src` valid for reads of `len` bytes.
    unsafe fn direct_write(
        &self,
        (win, rank, disp): Target,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: per the contract; the window is live (resolved); the flush
        // completes the put before `src` may change.
        unsafe {
            raw::put(win, rank, disp, src, len)?;
            raw::flush(win, rank)
        }
    }

    /// Direct atomic: `issue` starts it (on the window, rank and
    /// displacement, with where the old word goes), `MPI_Win_flush`
    /// completes it; returns the old word.
    ///
    /// # Safety
    /// `issue` must start one atomic on the target that writes the old word
    /// to the given pointer and reads operands that live until this
    /// returns (the flush completes the atomic).
    unsafe fn direct_atomic(
        &self,
        (win, rank, disp): Target,
        issue: impl FnOnce(ffi::MPI_Win, c_int, ffi::MPI_Aint, *mut u64) -> Result<()>,
    ) -> Result<u64> {
        let mut old = 0u64;
        issue(win, rank, disp, &mut old)?;
        // SAFETY: the window is live (resolved); the flush completes the
        // atomic while `old` (and the caller's operands) are still there.
        unsafe { raw::flush(win, rank) }?;
        Ok(old)
    }

    /// Served RMA: a read (`dst` given) or write (`src` given) of `len`
    /// bytes at `p`, in pieces of at most [`served::MAX_PIECE`] bytes, after
    /// the same checks as the one-sided path.
    ///
    /// # Safety
    /// `dst` valid for writes / `src` valid for reads of `len` bytes.
    unsafe fn served_transfer(
        &self,
        s: &served::Server,
        p: RemotePtr,
        len: usize,
        dst: Option<*mut u8>,
        src: Option<*const u8>,
    ) -> Result<Request<U>> {
        self.windows.resolve(p, len, self.size)?;
        let mut off = 0;
        while off < len {
            let piece = (len - off).min(served::MAX_PIECE);
            let op = if dst.is_some() {
                served::Op::Read
            } else {
                served::Op::Write
            };
            let h = served::Header::transfer(op, p.add(off as u64), piece);
            // SAFETY: per the contract, the pieces lie inside the caller's
            // buffers.
            let (data, out): (&[u8], &mut [u8]) = unsafe {
                match (dst, src) {
                    (Some(d), _) => (&[], std::slice::from_raw_parts_mut(d.add(off), piece)),
                    (None, Some(s)) => (std::slice::from_raw_parts(s.add(off), piece), &mut []),
                    (None, None) => unreachable!("a transfer has a source or a destination"),
                }
            };
            self.served_op(s, h, data, out)?;
            off += piece;
        }
        Ok(Request::ready(Ok(0)))
    }

    /// Served RMA: an atomic at `p` with operands `a`, `b`.
    fn served_atomic(
        &self,
        s: &served::Server,
        p: RemotePtr,
        op: served::Op,
        a: u64,
        b: u64,
    ) -> Result<Request<U>> {
        self.atomic_target(p)?;
        let h = served::Header::atomic(op, p, a, b);
        Ok(Request::ready(self.served_op(s, h, &[], &mut [])))
    }

    /// Served batches: the swaps `ops`, then the reads (a read longer than
    /// `int` counts allow in pieces), after the one-sided path's checks, all
    /// in flight together ([`Self::served_many`]); sets each swap's old
    /// word.
    fn served_batch(
        &self,
        s: &served::Server,
        ops: &mut [CasOp],
        reads: &mut [(RemotePtr, &mut [u8])],
    ) -> Result<()> {
        for op in ops.iter() {
            self.atomic_target(op.target)?;
        }
        for (src, dst) in reads.iter() {
            self.windows.resolve(*src, dst.len(), self.size)?;
        }
        let mut served: Vec<served::ServedOp<'_>> = ops
            .iter()
            .map(|op| {
                let h = served::Header::atomic(served::Op::Cas, op.target, op.expected, op.new);
                served::ServedOp::new(h, &[], &mut [])
            })
            .collect();
        let swaps = served.len();
        for (src, dst) in reads.iter_mut() {
            for (k, piece) in dst.chunks_mut(served::MAX_PIECE).enumerate() {
                let at = src.add((k * served::MAX_PIECE) as u64);
                let h = served::Header::transfer(served::Op::Read, at, piece.len());
                served.push(served::ServedOp::new(h, &[], piece));
            }
        }
        self.served_many(s, &mut served)?;
        for (op, done) in ops.iter_mut().zip(&served[..swaps]) {
            op.old = done.old;
        }
        Ok(())
    }

    /// Waits until every offloaded operation issued so far has completed
    /// (and its completion callback has run).
    fn drain_offloaded(&self) -> Result<()> {
        offload::drain(&self.offloader, Command::Flush)
    }
}

/// The blocking forms are the trait's: a direct operation's request is
/// complete when it is returned, so waiting for it costs nothing.
impl<U: UltItf> Rma for MpiCom<U> {
    type Request = Request<U>;

    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Request<U>> {
        if let Some(s) = &self.server {
            // SAFETY: forwarded contract.
            return unsafe { self.served_transfer(s, src, len, Some(dst), None) };
        }
        // SAFETY: forwarded contract.
        self.transfer_nb(src, len, Kind::Get { dst, len }, |t| unsafe {
            self.direct_read(t, dst, len)
        })
    }

    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Request<U>> {
        if let Some(s) = &self.server {
            // SAFETY: forwarded contract.
            return unsafe { self.served_transfer(s, dst, len, None, Some(src)) };
        }
        // SAFETY: forwarded contract.
        self.transfer_nb(dst, len, Kind::Put { src, len }, |t| unsafe {
            self.direct_write(t, src, len)
        })
    }

    fn compare_and_swap_nb(&self, at: RemotePtr, expected: u64, new: u64) -> Result<Request<U>> {
        if let Some(s) = &self.server {
            return self.served_atomic(s, at, served::Op::Cas, expected, new);
        }
        let out = || Outcome::new(new, expected);
        // SAFETY: the operands live on this stack frame until the flush in
        // `direct_atomic` has completed the operation.
        self.atomic_nb(at, Kind::Cas, out, |t| unsafe {
            self.direct_atomic(t, |w, r, d, old| {
                raw::compare_and_swap(w, r, d, &new, &expected, old)
            })
        })
    }

    fn fetch_add_nb(&self, at: RemotePtr, delta: u64) -> Result<Request<U>> {
        if let Some(s) = &self.server {
            return self.served_atomic(s, at, served::Op::FetchAdd, delta, 0);
        }
        // SAFETY: as in `compare_and_swap_nb`.
        self.atomic_nb(
            at,
            Kind::FetchAdd,
            || Outcome::new(delta, 0),
            |t| unsafe {
                self.direct_atomic(t, |w, r, d, old| raw::fetch_add(w, r, d, &delta, old))
            },
        )
    }

    /// Served: every request in flight together (one round trip for all).
    fn compare_and_swap_all(&self, ops: &mut [CasOp]) -> Result<()> {
        match &self.server {
            Some(s) => self.served_batch(s, ops, &mut []),
            None => batch::cas_all_nb(self, ops),
        }
    }

    /// Served: every request (a read longer than `int` counts allow in
    /// pieces) in flight together.
    fn read_all(&self, reads: &mut [(RemotePtr, &mut [u8])]) -> Result<()> {
        match &self.server {
            Some(s) => self.served_batch(s, &mut [], reads),
            None => batch::read_all_nb(self, reads),
        }
    }

    /// Served: the swaps and then the reads, each process's in one
    /// request where they fit (its operations are applied in order, and
    /// requests from one process are served in the order sent), all in
    /// flight together.
    fn compare_and_swap_then_read_all(
        &self,
        ops: &mut [CasOp],
        reads: &mut [(RemotePtr, &mut [u8])],
    ) -> Result<()> {
        match &self.server {
            Some(s) => self.served_batch(s, ops, reads),
            None => {
                self.compare_and_swap_all(ops)?;
                self.read_all(reads)
            }
        }
    }

    fn flush(&self, rank: usize) -> Result<()> {
        check::rank(rank, self.size)?;
        self.drain_offloaded()?;
        if self.server.is_some() {
            // Served operations are complete when they return.
            return Ok(());
        }
        self.windows.for_each_live(|w| {
            // SAFETY: a live, locked window.
            unsafe { raw::flush(w, rank as c_int) }
        })
    }

    fn flush_all(&self) -> Result<()> {
        self.drain_offloaded()?;
        if self.server.is_some() {
            return Ok(());
        }
        self.windows.for_each_live(|w| {
            // SAFETY: a live, locked window.
            unsafe { raw::flush_all(w) }
        })
    }
}
