//! RMA served by messages (`MENPS_MPI_RMA=messages`): every one-sided
//! operation on another process's window is a request message to that
//! process, which performs it on its own memory (a copy, or a processor
//! atomic) and answers — one round trip of two-sided MPI for a read, a
//! write or an atomic.
//!
//! # Why
//!
//! Without an RDMA device, OpenMPI 4.1's `osc ucx` emulates one-sided
//! operations over TCP with messages the target must progress anyway, and
//! does so at several round trips per operation: across 2 simulated hosts
//! (UCX over TCP, `benches/rma.rs`) an 8-byte `MPI_Rget` took 63 µs, a
//! `MPI_Put` + flush 196 µs and a compare-and-swap or fetch-and-add about
//! 470 µs (it takes the target's accumulate lock with an atomic, reads,
//! writes and unlocks, each completed by a flush), against a two-sided
//! round trip of 50 µs; a 1 MiB `MPI_Rget` moved 360 MB/s over a link that
//! carries 1.6 GB/s. Served here, each costs one round trip of `btl tcp`
//! messages, which stream at the link's speed.
//!
//! # How
//!
//! - **Requests** go to the target on a communicator of their own with MPI
//!   tag 0: a 48-byte header (operation, reply tag, window, offset, length,
//!   two operands) and, for a write, the data. The requester first posts
//!   the receive of the reply (a tag of its own, cycling through
//!   [`REPLY_TAGS`]), then sends the request, and polls both.
//! - **Serving**: whichever thread of the target polls MPI serves — every
//!   wait of the backend calls [`Server::serve`], and so does the progress
//!   thread when no other thread polled since its last turn (it keeps
//!   polling, yielding its processor in between, for a while after it
//!   served something, since requests come in bursts). One thread serves
//!   at a time; it receives each request (`MPI_Improbe` + `MPI_Mrecv`),
//!   performs it on its part of the window and sends the reply
//!   (`MPI_Send`: the reply's receive is posted already).
//! - **Atomics** are processor atomics on the target's memory, so they are
//!   atomic with respect to each other whoever issues them: a process's
//!   operations on its own part skip the messages and run the same code.
//! - **Completion**: a request completes when its reply has arrived, after
//!   the target has performed it — a write is then visible to everyone, as
//!   [`Rma`](crate::com::Rma) requires, and `flush` has nothing left to wait
//!   for.
//! - **Early requests**: a process may return from a window's collective
//!   creation and send requests for it before the target has finished
//!   creating it; the target keeps those until the window is live here.
//! - **Errors**: an operation the target cannot perform (its window is gone,
//!   the range is outside it: a bug or a corrupted request) gets an empty
//!   reply, which the requester reports as [`Error::Transport`]; a target
//!   that left the job makes the wait fail like every other wait.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ::mpi::ffi;

use ct_worker::UltItf;

use super::MpiCom;
use super::raw::{self, Handle};
use super::window::WindowTable;
use crate::com::wait::Watch;
use crate::com::{Error, RemotePtr, Result};

/// MPI tag of requests on the serving communicator.
const TAG_REQUEST: c_int = 0;

/// Reply tags cycle through `1..=REPLY_TAGS` (MPI guarantees tags up to
/// 32767). A requester has at most one request outstanding per thread, so
/// a tag comes round again long after its reply arrived.
const REPLY_TAGS: u32 = 32_000;

/// Most bytes one request moves (`int` counts); longer accesses are split.
pub(crate) const MAX_PIECE: usize = raw::MAX_COUNT;

/// Most requests one call of [`Server::serve`] answers before it returns.
const SERVE_BATCH: usize = 64;

/// An operation of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Copy `len` bytes of the window out.
    Read,
    /// Copy the request's data into the window.
    Write,
    /// Compare-and-swap of a word: `a` expected, `b` new.
    Cas,
    /// Wrapping fetch-and-add of `a` to a word.
    FetchAdd,
}

impl Op {
    fn code(self) -> u32 {
        match self {
            Op::Read => 1,
            Op::Write => 2,
            Op::Cas => 3,
            Op::FetchAdd => 4,
        }
    }

    fn from_code(c: u32) -> Option<Op> {
        Some(match c {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Cas,
            4 => Op::FetchAdd,
            _ => return None,
        })
    }
}

/// Bytes of a request's header.
pub(crate) const HEADER: usize = 48;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) op: Op,
    pub(crate) reply_tag: u32,
    /// Where in the target's window (its rank is the message's destination).
    pub(crate) at: RemotePtr,
    pub(crate) len: u64,
    pub(crate) a: u64,
    pub(crate) b: u64,
}

impl Header {
    /// Serialized: op, reply tag (u32 each), the pointer (16 bytes), length
    /// and the two operands (u64 each), little-endian.
    pub(crate) fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&self.op.code().to_le_bytes());
        h[4..8].copy_from_slice(&self.reply_tag.to_le_bytes());
        h[8..24].copy_from_slice(&self.at.to_bytes());
        h[24..32].copy_from_slice(&self.len.to_le_bytes());
        h[32..40].copy_from_slice(&self.a.to_le_bytes());
        h[40..48].copy_from_slice(&self.b.to_le_bytes());
        h
    }

    /// Parses a request's header; `None` if `b` is not one.
    pub(crate) fn decode(b: &[u8]) -> Option<Header> {
        let h: &[u8; HEADER] = b.get(..HEADER)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4"));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8"));
        Some(Header {
            op: Op::from_code(u32_at(0))?,
            reply_tag: u32_at(4),
            at: RemotePtr::from_bytes(h[8..24].try_into().expect("16")),
            len: u64_at(24),
            a: u64_at(32),
            b: u64_at(40),
        })
    }
}

/// The serving side of a process, shared with its progress thread.
pub(crate) struct Server {
    comm: Handle<ffi::MPI_Comm>,
    windows: Arc<WindowTable>,
    rank: usize,
    size: usize,
    /// Held by the one thread serving; holds the requests for windows this
    /// process has not finished creating yet (a peer returned from the
    /// collective creation first), answered once they are.
    serving: Mutex<Vec<(c_int, Vec<u8>)>>,
    next_tag: AtomicU32,
    served: AtomicU64,
}

impl Server {
    pub(crate) fn new(
        comm: Handle<ffi::MPI_Comm>,
        windows: Arc<WindowTable>,
        rank: usize,
        size: usize,
    ) -> Self {
        Server {
            comm,
            windows,
            rank,
            size,
            serving: Mutex::new(Vec::new()),
            next_tag: AtomicU32::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// The serving communicator.
    pub(crate) fn comm(&self) -> ffi::MPI_Comm {
        self.comm.0
    }

    /// A reply tag for a new request.
    pub(crate) fn reply_tag(&self) -> u32 {
        self.next_tag.fetch_add(1, Ordering::Relaxed) % REPLY_TAGS + 1
    }

    /// Requests this process has answered so far.
    pub(crate) fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Performs `h` on this process's part of its window: a read fills
    /// `out` (`h.len` bytes), a write copies `data` in; an atomic returns
    /// the old word (0 otherwise).
    pub(crate) fn apply(&self, h: &Header, data: &[u8], out: &mut [u8]) -> Result<u64> {
        let len = usize::try_from(h.len)
            .map_err(|_| Error::Transport(format!("request of {} bytes", h.len)))?;
        let at = h.at.with_rank(self.rank);
        let p = self.windows.local_ptr(at, len, self.size)?;
        match h.op {
            Op::Read => {
                if out.len() != len {
                    return Err(Error::Transport(
                        "read reply buffer of the wrong size".into(),
                    ));
                }
                // SAFETY: `p` points at `len` bytes of our live part of the
                // window (checked by `local_ptr`), `out` has `len` bytes;
                // window memory is accessed concurrently by design (as by
                // RMA), without references to it.
                unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), len) };
                Ok(0)
            }
            Op::Write => {
                if data.len() != len {
                    return Err(Error::Transport(format!(
                        "write request says {len} bytes and carries {}",
                        data.len()
                    )));
                }
                // SAFETY: as for reads, into the window.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, len) };
                // The reply (sent after this) publishes the data.
                std::sync::atomic::fence(Ordering::Release);
                Ok(0)
            }
            Op::Cas | Op::FetchAdd => {
                crate::com::check::aligned_word(at)?;
                if len != 8 {
                    return Err(Error::Transport(format!("atomic of {len} bytes")));
                }
                // SAFETY: an aligned word inside our live part (checked),
                // which every atomic of the job reaches through this
                // function, so all of them are processor atomics on it.
                let word = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
                Ok(match h.op {
                    Op::Cas => {
                        match word.compare_exchange(h.a, h.b, Ordering::SeqCst, Ordering::SeqCst) {
                            Ok(v) | Err(v) => v,
                        }
                    }
                    _ => word.fetch_add(h.a, Ordering::SeqCst),
                })
            }
        }
    }

    /// Answers the requests that have arrived (at most [`SERVE_BATCH`]),
    /// unless another thread is serving; returns how many.
    pub(crate) fn serve(&self) -> Result<usize> {
        let Ok(mut early) = self.serving.try_lock() else {
            return Ok(0);
        };
        let mut n = 0;
        if !early.is_empty() {
            for (from, msg) in std::mem::take(&mut *early) {
                n += self.answer_or_keep(from, msg, &mut early)?;
            }
        }
        while n < SERVE_BATCH {
            let Some((msg, st)) = raw::improbe(self.comm.0, TAG_REQUEST)? else {
                break;
            };
            let count = raw::count(&st)?;
            let mut buf = vec![0u8; count.max(1)];
            raw::mrecv(msg, &mut buf, count as c_int)?;
            buf.truncate(count);
            n += self.answer_or_keep(st.MPI_SOURCE, buf, &mut early)?;
        }
        if n > 0 {
            self.served.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Answers `msg` from `from` (returns 1), or keeps it in `early` if its
    /// window is still being created here (returns 0).
    fn answer_or_keep(
        &self,
        from: c_int,
        msg: Vec<u8>,
        early: &mut Vec<(c_int, Vec<u8>)>,
    ) -> Result<usize> {
        if let Some(h) = Header::decode(&msg)
            && self.windows.is_unborn(h.at.window().0)
        {
            early.push((from, msg));
            return Ok(0);
        }
        self.answer(from, &msg)?;
        Ok(1)
    }

    /// Performs one request from `from` and sends the reply (empty if it
    /// cannot be performed).
    fn answer(&self, from: c_int, msg: &[u8]) -> Result<()> {
        let Some(h) = Header::decode(msg) else {
            return Err(Error::Transport(format!(
                "malformed RMA request ({} bytes from rank {from})",
                msg.len()
            )));
        };
        let mut out = Vec::new();
        let ok = match h.op {
            Op::Read => {
                out = vec![0u8; usize::try_from(h.len).unwrap_or(0).min(MAX_PIECE)];
                self.apply(&h, &[], &mut out).is_ok()
            }
            Op::Write => self.apply(&h, &msg[HEADER..], &mut []).is_ok(),
            Op::Cas | Op::FetchAdd => match self.apply(&h, &[], &mut []) {
                Ok(old) => {
                    out = old.to_le_bytes().to_vec();
                    true
                }
                Err(_) => false,
            },
        };
        let reply: &[u8] = match (ok, h.op) {
            (false, _) => &[],
            // A write's acknowledgement: one byte (empty means failure).
            (true, Op::Write) => &[1],
            (true, _) => &out,
        };
        let tag = c_int::try_from(h.reply_tag)
            .map_err(|_| Error::Transport(format!("reply tag {}", h.reply_tag)))?;
        // SAFETY: `reply` lives until the blocking send returns; valid
        // communicator and rank (the request's source).
        raw::check("MPI_Send", unsafe {
            ffi::MPI_Send(
                reply.as_ptr().cast::<c_void>(),
                reply.len() as c_int,
                raw::byte(),
                from,
                tag,
                self.comm.0,
            )
        })
    }
}

impl<U: UltItf> MpiCom<U> {
    /// Performs `h` (with `data` for a write) through `s`: here if the
    /// target is this process, else by a request and its reply. A read
    /// fills `out`; an atomic returns the old word. The caller has checked
    /// window, rank, bounds and alignment; `h.len` is at most [`MAX_PIECE`].
    pub(super) fn served_op(
        &self,
        s: &Server,
        mut h: Header,
        data: &[u8],
        out: &mut [u8],
    ) -> Result<u64> {
        let target = h.at.rank();
        if target == self.rank {
            // Serve first: a thread spinning on its own words (a lock a peer
            // holds) must let the peer's release in.
            s.serve()?;
            super::progress::note_poll();
            return s.apply(&h, data, out);
        }
        let reply_len = match h.op {
            Op::Read => out.len(),
            Op::Write => 1,
            Op::Cas | Op::FetchAdd => 8,
        };
        h.reply_tag = s.reply_tag();
        let mut reply = vec![0u8; reply_len];
        let mut msg = Vec::with_capacity(HEADER + data.len());
        msg.extend_from_slice(&h.encode());
        msg.extend_from_slice(data);
        let (to, tag) = (target as c_int, h.reply_tag as c_int);
        let mut rreq = raw::request_null();
        // SAFETY: `reply` is owned here and kept until the receive completes
        // (or leaked below); valid communicator and rank.
        raw::check("MPI_Irecv", unsafe {
            ffi::MPI_Irecv(
                reply.as_mut_ptr().cast::<c_void>(),
                reply_len as c_int,
                raw::byte(),
                to,
                tag,
                s.comm(),
                &mut rreq,
            )
        })?;
        let mut sreq = raw::request_null();
        // SAFETY: as above, for `msg`.
        let sent = raw::check("MPI_Isend", unsafe {
            ffi::MPI_Isend(
                msg.as_ptr().cast::<c_void>(),
                msg.len() as c_int,
                raw::byte(),
                to,
                TAG_REQUEST,
                s.comm(),
                &mut sreq,
            )
        });
        if let Err(e) = sent {
            // The receive stays posted: MPI may still write `reply`.
            std::mem::forget(reply);
            return Err(e);
        }
        let (mut send_done, mut got) = (false, None);
        let r = self.wait_until(Watch::Rank(target), || {
            if !send_done {
                // SAFETY: an active request whose buffer (`msg`) is alive.
                send_done = unsafe { raw::test(&mut sreq) }?;
            }
            if got.is_none() {
                // SAFETY: an active request whose buffer (`reply`) is alive.
                got = unsafe { raw::test_count(&mut rreq) }?;
            }
            Ok((send_done && got.is_some()).then_some(()))
        });
        if let Err(e) = r {
            // Abandoned requests: MPI may still use both buffers.
            std::mem::forget(reply);
            std::mem::forget(msg);
            return Err(e);
        }
        if got != Some(reply_len) {
            return Err(Error::Transport(format!(
                "rank {target} could not perform a served {:?} of {} bytes at window {} \
                 offset {} (its window is gone or the range is outside it)",
                h.op,
                h.len,
                h.at.window().0,
                h.at.offset()
            )));
        }
        Ok(match h.op {
            Op::Read => {
                out.copy_from_slice(&reply);
                0
            }
            Op::Write => 0,
            Op::Cas | Op::FetchAdd => u64::from_le_bytes(reply[..8].try_into().expect("8")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::com::WindowId;

    #[test]
    fn headers_round_trip_and_reject_garbage() {
        let h = Header {
            op: Op::Cas,
            reply_tag: 31_999,
            at: RemotePtr::new(3, WindowId(7), 4096 + 8),
            len: 8,
            a: u64::MAX,
            b: 42,
        };
        let b = h.encode();
        assert_eq!(Header::decode(&b), Some(h));
        let mut longer = b.to_vec();
        longer.extend_from_slice(b"data");
        assert_eq!(Header::decode(&longer), Some(h));
        assert_eq!(Header::decode(&b[..HEADER - 1]), None);
        let mut bad = b;
        bad[0] = 9;
        assert_eq!(Header::decode(&bad), None);
        for op in [Op::Read, Op::Write, Op::Cas, Op::FetchAdd] {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
    }
}
