//! The MPI library as a [`ct_delegate::Device`]: what the offloading
//! component's executor posts and its completer polls.
//!
//! - **post**: `MPI_Rget` for reads (a request), `MPI_Put`,
//!   `MPI_Compare_and_swap` and `MPI_Fetch_and_op` for writes and atomics
//!   (which complete only at a flush), or a flush barrier.
//! - **poll**: reports finished commands in order. When nothing is ready it
//!   flushes every (window, target) pair that has unflushed writes or
//!   atomics — one `MPI_Win_flush` completes a whole batch — and tests the
//!   outstanding `Rget`s with `MPI_Testsome`. A flush barrier is reported
//!   once every command posted before it has been reported.
//!
//! The device is only used under the offloader's lock (its `post` and `poll`
//! never run at the same time), so it needs no synchronisation of its own.

use std::os::raw::c_int;
use std::sync::Arc;

use ::mpi::ffi;
use ct_delegate::{Device, Tag};

use super::raw::{self, Handle};
use crate::com::offload::Completions;
use crate::com::outcome::Outcome;
use crate::com::{Error, Result};

/// What an RMA command does.
pub(crate) enum Kind {
    /// Read `len` bytes into `dst`.
    Get {
        /// Destination (valid until completion: `Rma::read_nb`'s contract).
        dst: *mut u8,
        /// Length.
        len: usize,
    },
    /// Write `len` bytes from `src`.
    Put {
        /// Source (valid until completion: `Rma::write_nb`'s contract).
        src: *const u8,
        /// Length.
        len: usize,
    },
    /// Compare-and-swap (operands in the outcome).
    Cas,
    /// Fetch-and-add (delta in the outcome).
    FetchAdd,
}

/// A command for the device.
pub(crate) enum Command {
    /// A one-sided operation on `win` at `rank`, displacement `disp`.
    Rma {
        /// The window.
        win: Handle<ffi::MPI_Win>,
        /// Target rank.
        rank: c_int,
        /// Byte displacement (bounds already checked).
        disp: ffi::MPI_Aint,
        /// What to do.
        kind: Kind,
        /// Result and operands.
        out: Arc<Outcome>,
    },
    /// Completes once every command posted before it has completed.
    Flush,
}

// SAFETY: the raw pointers in `Kind` point to buffers the issuer keeps valid
// and unshared until the command completes (the unsafe contracts of
// `read_nb` / `write_nb`); MPI handles may be used from any thread
// (MPI_THREAD_MULTIPLE).
unsafe impl Send for Command {}

struct InFlight {
    tag: Tag,
    seq: u64,
    /// Keeps the operands and the result buffer alive while MPI uses them.
    _out: Arc<Outcome>,
}

/// Most operations in flight before `post` refuses more (the executor then
/// lets the completer catch up).
const MAX_IN_FLIGHT: usize = 1024;

/// The MPI library as an offloadable device (see the [`mpi` module docs](super)).
pub(crate) struct RmaDevice {
    /// Rget requests and their commands (same order).
    gets: Vec<ffi::MPI_Request>,
    get_ops: Vec<InFlight>,
    /// Writes and atomics waiting for a flush: (window, rank, command).
    unflushed: Vec<(Handle<ffi::MPI_Win>, c_int, InFlight)>,
    /// Finished commands and flush barriers, to report in order.
    completions: Completions,
    indices: Vec<c_int>,
}

// SAFETY: MPI requests and windows may be used from any thread
// (MPI_THREAD_MULTIPLE); the device is used by one thread at a time (under
// the offloader's lock).
unsafe impl Send for RmaDevice {}

impl RmaDevice {
    pub(crate) fn new() -> Self {
        RmaDevice {
            gets: Vec::new(),
            get_ops: Vec::new(),
            unflushed: Vec::new(),
            completions: Completions::default(),
            indices: Vec::new(),
        }
    }

    fn in_flight(&self) -> usize {
        self.gets.len() + self.unflushed.len()
    }

    /// Nothing in flight and no flush barrier waiting.
    fn is_idle(&self) -> bool {
        self.in_flight() == 0 && !self.completions.has_barriers()
    }

    /// Issues one operation; returns the Rget request if it made one.
    fn issue(
        win: ffi::MPI_Win,
        rank: c_int,
        disp: ffi::MPI_Aint,
        kind: &Kind,
        out: &Outcome,
    ) -> Result<Option<ffi::MPI_Request>> {
        // SAFETY: (all arms) the window is live and locked (commands are only
        // built for live windows, and windows are not destroyed while RMA is
        // in flight — `Windows::destroy_window`'s rule); bounds were checked
        // at submission; the user buffers are valid until completion per the
        // issuer's contract, and the outcome's cells live in an `Arc` we keep
        // until the command is reported.
        unsafe {
            match *kind {
                Kind::Get { dst, len } if len <= raw::MAX_COUNT => {
                    raw::rget(win, rank, disp, dst, len).map(Some)
                }
                Kind::Get { dst, len } => raw::get(win, rank, disp, dst, len).map(|()| None),
                Kind::Put { src, len } => raw::put(win, rank, disp, src, len).map(|()| None),
                Kind::Cas => raw::compare_and_swap(
                    win,
                    rank,
                    disp,
                    out.origin_ptr(),
                    out.compare_ptr(),
                    out.result_ptr(),
                )
                .map(|()| None),
                Kind::FetchAdd => {
                    raw::fetch_add(win, rank, disp, out.origin_ptr(), out.result_ptr())
                        .map(|()| None)
                }
            }
        }
    }

    /// Flushes every pending (window, rank) pair and tests the Rgets.
    fn progress(&mut self) {
        if !self.unflushed.is_empty() {
            let mut pairs: Vec<(Handle<ffi::MPI_Win>, c_int)> = Vec::new();
            for (w, r, _) in &self.unflushed {
                if !pairs.contains(&(*w, *r)) {
                    pairs.push((*w, *r));
                }
            }
            let mut failed: Vec<((Handle<ffi::MPI_Win>, c_int), Error)> = Vec::new();
            for (w, r) in pairs {
                // SAFETY: the window is live (see `issue`).
                if let Err(e) = unsafe { raw::flush(w.0, r) } {
                    failed.push(((w, r), e));
                }
            }
            for (w, r, op) in self.unflushed.drain(..) {
                if let Some((_, e)) = failed.iter().find(|(p, _)| *p == (w, r)) {
                    op._out.fail(e.clone());
                }
                self.completions.done(op.tag);
            }
        }
        if !self.gets.is_empty() {
            self.indices.resize(self.gets.len(), 0);
            let mut outcount: c_int = 0;
            // SAFETY: `gets` holds active requests whose buffers are valid
            // (see `issue`); `indices` has room for every index.
            let rc = unsafe {
                ffi::MPI_Testsome(
                    self.gets.len() as c_int,
                    self.gets.as_mut_ptr(),
                    &mut outcount,
                    self.indices.as_mut_ptr(),
                    ffi::RSMPI_STATUSES_IGNORE,
                )
            };
            if let Err(e) = raw::check("MPI_Testsome", rc) {
                // Report every Rget as failed rather than spin on an error.
                for op in self.get_ops.drain(..) {
                    op._out.fail(e.clone());
                    self.completions.done(op.tag);
                }
                self.gets.clear();
            } else if outcount > 0 {
                let mut done = vec![false; self.gets.len()];
                for &i in &self.indices[..outcount as usize] {
                    done[i as usize] = true;
                }
                let mut k = 0;
                let ops = std::mem::take(&mut self.get_ops);
                let mut keep_ops = Vec::with_capacity(ops.len());
                self.gets.retain(|_| {
                    let d = done[k];
                    k += 1;
                    !d
                });
                for (op, d) in ops.into_iter().zip(done) {
                    if d {
                        self.completions.done(op.tag);
                    } else {
                        keep_ops.push(op);
                    }
                }
                self.get_ops = keep_ops;
            }
        }
        let oldest = self
            .get_ops
            .iter()
            .map(|o| o.seq)
            .chain(self.unflushed.iter().map(|(_, _, o)| o.seq))
            .min()
            .unwrap_or(u64::MAX);
        self.completions.release_barriers(oldest);
    }
}

impl Device for RmaDevice {
    type Command = Command;

    fn post(&mut self, command: Command, tag: Tag) -> Result<(), Command> {
        match command {
            Command::Flush => {
                self.completions.flush(tag, self.in_flight() == 0);
                Ok(())
            }
            Command::Rma {
                win,
                rank,
                disp,
                kind,
                out,
            } => {
                if self.in_flight() >= MAX_IN_FLIGHT {
                    return Err(Command::Rma {
                        win,
                        rank,
                        disp,
                        kind,
                        out,
                    });
                }
                let seq = self.completions.accept();
                match Self::issue(win.0, rank, disp, &kind, &out) {
                    Err(e) => {
                        out.fail(e);
                        self.completions.done(tag);
                    }
                    Ok(Some(req)) => {
                        self.gets.push(req);
                        self.get_ops.push(InFlight {
                            tag,
                            seq,
                            _out: out,
                        });
                    }
                    Ok(None) => self.unflushed.push((
                        win,
                        rank,
                        InFlight {
                            tag,
                            seq,
                            _out: out,
                        },
                    )),
                }
                Ok(())
            }
        }
    }

    fn poll(&mut self) -> Option<Tag> {
        if let Some(t) = self.completions.pop() {
            return Some(t);
        }
        if self.is_idle() {
            return None;
        }
        self.progress();
        self.completions.pop()
    }

    /// One round of progress (flushes and one `MPI_Testsome`) at most, and
    /// only when the operations finished earlier do not fill `tags`.
    fn poll_batch(&mut self, tags: &mut [Tag]) -> usize {
        if self.completions.backlog() < tags.len() && !self.is_idle() {
            self.progress();
        }
        self.completions.report(tags)
    }
}
