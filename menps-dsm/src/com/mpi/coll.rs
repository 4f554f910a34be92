//! Collectives on MPI: non-blocking MPI collectives on a dedicated
//! communicator, waited for by polling (so user-level threads yield instead
//! of blocking their worker).
//!
//! Broadcast and allgather first exchange a header (operation, length, root)
//! with a small allgather of [`HEAD_SLOT`] bytes per process; every process
//! compares all headers and, on a mismatch, returns
//! [`Error::CollectiveMismatch`] — all alike, and without starting the
//! mismatched MPI collective, whose behaviour would be undefined. An
//! allgather of at most [`INLINE_BYTES`] per process travels in that same
//! exchange, so it costs one MPI collective, as a barrier does (the DSM's
//! barrier is such an allgather). Data moves through buffers owned by the
//! call (copied from and to the caller's), so that an abandoned collective
//! (a process left the job) can never write into memory the caller has
//! reused.

use std::os::raw::{c_int, c_void};

use ::mpi::ffi;
use ct_worker::UltItf;

use super::{MpiCom, raw};
use crate::com::wait::Watch;
use crate::com::{Coll, Error, Result, check};

pub(crate) const OP_BROADCAST: u64 = 1;
pub(crate) const OP_ALLGATHER: u64 = 2;
pub(crate) const OP_WIN_CREATE: u64 = 3;
pub(crate) const OP_WIN_DESTROY: u64 = 4;

/// Bytes per MPI call of a chunked collective.
const CHUNK: usize = 1 << 26;

/// Bytes per process of every header exchange: the header's three words,
/// then room for an allgather's data. Always this size, so that any two
/// collectives with a header meet as a mismatch, never as MPI calls with
/// different counts.
pub(crate) const HEAD_SLOT: usize = 256;

/// Bytes per process an allgather may carry inside its header exchange.
pub(crate) const INLINE_BYTES: usize = HEAD_SLOT - HEADER_WORDS * 8;

/// Words of a collective's header.
const HEADER_WORDS: usize = 3;

/// Process-local state of the collectives (guarded by the collective lock).
pub(crate) struct CollState {
    /// Id the next window will get.
    pub(crate) next_window: u32,
}

impl CollState {
    pub(crate) fn new() -> Self {
        CollState { next_window: 0 }
    }
}

fn describe(h: &[u64; 3]) -> String {
    match h[0] {
        OP_BROADCAST => format!("broadcast of {} bytes from root {}", h[1], h[2]),
        OP_ALLGATHER => format!("allgather of {} bytes", h[1]),
        OP_WIN_CREATE => format!("create_window of {} bytes", h[2]),
        OP_WIN_DESTROY => "destroy_window".into(),
        _ => "(another collective)".into(),
    }
}

impl<U: UltItf> MpiCom<U> {
    /// Waits for a collective's request; on failure the request and `buf`
    /// are abandoned (leaked), since MPI may still write into `buf`.
    /// `what` names the collective for the watchdog (called only if it
    /// reports).
    fn finish(
        &self,
        mut req: ffi::MPI_Request,
        buf: Vec<u8>,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<u8>> {
        // SAFETY: `req` is active and its buffer (`buf`, owned here) stays
        // valid: on success we return it, on failure we leak it.
        match unsafe { self.wait_request(&mut req, Watch::AllOthers(None), Some(what)) } {
            Ok(()) => Ok(buf),
            Err(e) => {
                std::mem::forget(buf);
                Err(e)
            }
        }
    }

    /// The barrier; the caller holds the collective lock.
    pub(crate) fn barrier_locked(&self) -> Result<()> {
        let mut req = raw::request_null();
        // SAFETY: a valid communicator; `req` is an out-parameter.
        raw::check("MPI_Ibarrier", unsafe {
            ffi::MPI_Ibarrier(self.comms.coll.0, &mut req)
        })?;
        self.finish(req, Vec::new(), &|| "a barrier".into())
            .map(drop)
    }

    /// Allgather of `len` bytes per process from `src` into a new vector;
    /// the caller holds the collective lock.
    fn allgather_raw(&self, src: &[u8]) -> Result<Vec<u8>> {
        let (n, len) = (self.size, src.len());
        let mut out = vec![0u8; n * len];
        let mut lo = 0;
        loop {
            let hi = len.min(lo + CHUNK);
            let piece = hi - lo;
            let send = src[lo..hi].to_vec();
            let mut recv = vec![0u8; n * piece];
            let mut req = raw::request_null();
            // SAFETY: `send` has `piece` bytes and `recv` `n * piece` (owned,
            // kept alive by `finish`); valid communicator.
            raw::check("MPI_Iallgather", unsafe {
                ffi::MPI_Iallgather(
                    send.as_ptr().cast::<c_void>(),
                    piece as c_int,
                    raw::byte(),
                    recv.as_mut_ptr().cast::<c_void>(),
                    piece as c_int,
                    raw::byte(),
                    self.comms.coll.0,
                    &mut req,
                )
            })?;
            let what = || format!("an allgather of {len} bytes each");
            let recv = match self.finish(req, recv, &what) {
                Ok(r) => r,
                Err(e) => {
                    std::mem::forget(send);
                    return Err(e);
                }
            };
            for r in 0..n {
                out[r * len + lo..r * len + hi].copy_from_slice(&recv[r * piece..(r + 1) * piece]);
            }
            lo = hi;
            if lo >= len {
                return Ok(out);
            }
        }
    }

    /// Exchanges a header with every process; the caller holds the
    /// collective lock.
    pub(crate) fn exchange_headers(
        &self,
        st: &mut CollState,
        mine: [u64; 3],
    ) -> Result<Vec<[u64; 3]>> {
        let (heads, _) = self.exchange_slots(st, mine, &[])?;
        Ok(heads)
    }

    /// Exchanges a header and up to [`INLINE_BYTES`] of `payload` with
    /// every process in one allgather of [`HEAD_SLOT`] bytes each: returns
    /// every process's header and the whole slots (payload at
    /// `HEADER_WORDS * 8` of each).
    fn exchange_slots(
        &self,
        _st: &mut CollState,
        mine: [u64; 3],
        payload: &[u8],
    ) -> Result<(Vec<[u64; 3]>, Vec<u8>)> {
        debug_assert!(payload.len() <= INLINE_BYTES);
        let mut slot = [0u8; HEAD_SLOT];
        for (i, w) in mine.iter().enumerate() {
            slot[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        let at = HEADER_WORDS * 8;
        slot[at..at + payload.len()].copy_from_slice(payload);
        let all = self.allgather_raw(&slot)?;
        let heads = all
            .chunks_exact(HEAD_SLOT)
            .map(|c| {
                let w = |i: usize| u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().expect("8"));
                [w(0), w(1), w(2)]
            })
            .collect();
        Ok((heads, all))
    }

    /// Checks that every process called the same collective.
    fn check_heads(&self, heads: &[[u64; 3]], mine: [u64; 3]) -> Result<()> {
        for (r, h) in heads.iter().enumerate() {
            if *h != mine {
                return Err(Error::CollectiveMismatch(format!(
                    "rank {} called {}, but rank {r} called {}",
                    self.rank,
                    describe(&mine),
                    describe(h)
                )));
            }
        }
        Ok(())
    }

    /// Exchanges headers and checks that everyone called the same thing.
    fn agree(&self, st: &mut CollState, mine: [u64; 3]) -> Result<()> {
        let heads = self.exchange_headers(st, mine)?;
        self.check_heads(&heads, mine)
    }
}

impl<U: UltItf> Coll for MpiCom<U> {
    fn barrier(&self) -> Result<()> {
        let _st = self.coll.lock();
        self.barrier_locked()
    }

    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        check::rank(root, self.size)?;
        let mut st = self.coll.lock();
        let total = buf.len();
        self.agree(&mut st, [OP_BROADCAST, total as u64, root as u64])?;
        let mut lo = 0;
        while lo < total {
            let hi = total.min(lo + CHUNK);
            let mut tmp = if self.rank == root {
                buf[lo..hi].to_vec()
            } else {
                vec![0u8; hi - lo]
            };
            let mut req = raw::request_null();
            // SAFETY: `tmp` (owned, kept alive by `finish`) has `hi - lo`
            // bytes; valid communicator; `root` was checked.
            raw::check("MPI_Ibcast", unsafe {
                ffi::MPI_Ibcast(
                    tmp.as_mut_ptr().cast::<c_void>(),
                    (hi - lo) as c_int,
                    raw::byte(),
                    root as c_int,
                    self.comms.coll.0,
                    &mut req,
                )
            })?;
            let total = buf.len();
            let what = || format!("a broadcast of {total} bytes from rank {root}");
            let tmp = self.finish(req, tmp, &what)?;
            if self.rank != root {
                buf[lo..hi].copy_from_slice(&tmp);
            }
            lo = hi;
        }
        Ok(())
    }

    fn allgather_into(&self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        let total = src.len();
        check::allgather_len(self.size, total, dst.len())?;
        let mut st = self.coll.lock();
        let mine = [OP_ALLGATHER, total as u64, 0];
        if total <= INLINE_BYTES {
            // One collective: the data rides in the header exchange.
            let (heads, slots) = self.exchange_slots(&mut st, mine, src)?;
            self.check_heads(&heads, mine)?;
            let at = HEADER_WORDS * 8;
            for (r, out) in dst
                .chunks_exact_mut(total.max(1))
                .enumerate()
                .take(self.size)
            {
                out.copy_from_slice(&slots[r * HEAD_SLOT + at..r * HEAD_SLOT + at + total]);
            }
            return Ok(());
        }
        self.agree(&mut st, mine)?;
        let all = self.allgather_raw(src)?;
        dst.copy_from_slice(&all);
        Ok(())
    }
}
