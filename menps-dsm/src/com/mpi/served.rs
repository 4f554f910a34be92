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
//! - **Batches** ([`Rma::compare_and_swap_all`](crate::com::Rma::compare_and_swap_all),
//!   [`Rma::read_all`](crate::com::Rma::read_all),
//!   [`Rma::compare_and_swap_then_read_all`](crate::com::Rma::compare_and_swap_then_read_all)):
//!   every request of a batch is in flight at once, and the reads and
//!   atomics to one process travel in one *multi* request (its header, then
//!   theirs) whose reply is theirs one after the other — serving a request
//!   costs the target several MPI calls, so eight lock words cost it one
//!   request, not eight. The target performs a multi request's operations in
//!   order, and one process's requests in the order they were sent, so a
//!   read behind a swap in a batch sees it.
//! - **Operations on the own window** run here, without messages; they
//!   serve the requests that have arrived first, but only if nobody has for
//!   20 µs (a serve polls MPI, about 15 µs over TCP, and a transaction makes
//!   several such operations).
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
/// 32767). A requester thread has at most [`MAX_IN_FLIGHT`] requests
/// outstanding, so a tag comes round again long after its reply arrived.
const REPLY_TAGS: u32 = 32_000;

/// Most bytes one request moves (`int` counts); longer accesses are split.
pub(crate) const MAX_PIECE: usize = raw::MAX_COUNT;

/// An operation on this process's own window serves the requests that
/// have arrived first only if nobody has served for this long: often
/// enough that a thread spinning on its own words lets a peer's release
/// in within a few tens of microseconds, rarely enough that the several
/// local operations of a transaction do not each poll MPI.
const LOCAL_SERVE_GAP_NS: u64 = 20_000;

/// Most bytes of the reply to one multi request (the reads and atomics to
/// one process of a batch travel in one request up to this size).
const MULTI_MAX_REPLY: usize = 64 * 1024;

/// The headers of the operations of a multi request `msg` (after its own
/// header; a truncated or garbled one ends them).
fn sub_headers(msg: &[u8]) -> impl Iterator<Item = Header> + '_ {
    msg.get(HEADER..)
        .unwrap_or(&[])
        .chunks_exact(HEADER)
        .map_while(Header::decode)
}

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
    /// `len` reads and atomics, whose headers follow; the reply is their
    /// replies one after the other (`a` bytes in all).
    Multi,
}

impl Op {
    fn code(self) -> u32 {
        match self {
            Op::Read => 1,
            Op::Write => 2,
            Op::Cas => 3,
            Op::FetchAdd => 4,
            Op::Multi => 5,
        }
    }

    fn from_code(c: u32) -> Option<Op> {
        Some(match c {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Cas,
            4 => Op::FetchAdd,
            5 => Op::Multi,
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
    /// A read or write of `len` bytes at `at` (its reply tag set when sent).
    pub(crate) fn transfer(op: Op, at: RemotePtr, len: usize) -> Header {
        Header {
            op,
            reply_tag: 0,
            at,
            len: len as u64,
            a: 0,
            b: 0,
        }
    }

    /// An atomic on the word at `at` with operands `a`, `b`.
    pub(crate) fn atomic(op: Op, at: RemotePtr, a: u64, b: u64) -> Header {
        Header {
            op,
            reply_tag: 0,
            at,
            len: 8,
            a,
            b,
        }
    }

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
    /// When a serve last started, in nanoseconds since `epoch`.
    last_serve: AtomicU64,
    epoch: std::time::Instant,
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
            last_serve: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
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
            Op::Multi => Err(Error::Transport("a multi request inside another".into())),
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

    /// Whether a thread that operates on its own window should serve
    /// first: if nobody has for [`LOCAL_SERVE_GAP_NS`].
    pub(crate) fn due(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        now.saturating_sub(self.last_serve.load(Ordering::Relaxed)) >= LOCAL_SERVE_GAP_NS
    }

    /// Answers the requests that have arrived (at most [`SERVE_BATCH`]),
    /// unless another thread is serving; returns how many.
    pub(crate) fn serve(&self) -> Result<usize> {
        let Ok(mut early) = self.serving.try_lock() else {
            return Ok(0);
        };
        self.last_serve
            .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
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
        let unborn = |h: &Header| self.windows.is_unborn(h.at.window().0);
        let keep = match Header::decode(&msg) {
            Some(h) if h.op == Op::Multi => sub_headers(&msg).any(|h| unborn(&h)),
            Some(h) => unborn(&h),
            None => false,
        };
        if keep {
            early.push((from, msg));
            return Ok(0);
        }
        self.answer(from, &msg)?;
        Ok(1)
    }

    /// Performs the reads and atomics of a multi request `h` (the whole
    /// message `msg`); returns their replies one after the other, or `None`
    /// if the request is malformed or one of them cannot be performed.
    fn apply_multi(&self, h: &Header, msg: &[u8]) -> Option<Vec<u8>> {
        let total = usize::try_from(h.a).ok()?;
        let count = usize::try_from(h.len).ok()?;
        if total > MULTI_MAX_REPLY || msg.len() != HEADER.checked_add(count.checked_mul(HEADER)?)? {
            return None;
        }
        let mut out = vec![0u8; total];
        let mut at = 0usize;
        for sub in sub_headers(msg) {
            let n = match sub.op {
                Op::Read => usize::try_from(sub.len).ok()?,
                Op::Cas | Op::FetchAdd => 8,
                Op::Write | Op::Multi => return None,
            };
            let piece = out.get_mut(at..at.checked_add(n)?)?;
            match sub.op {
                Op::Read => {
                    self.apply(&sub, &[], piece).ok()?;
                }
                _ => {
                    let old = self.apply(&sub, &[], &mut []).ok()?;
                    piece.copy_from_slice(&old.to_le_bytes());
                }
            }
            at += n;
        }
        (at == total).then_some(out)
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
        let tag = c_int::try_from(h.reply_tag)
            .map_err(|_| Error::Transport(format!("reply tag {}", h.reply_tag)))?;
        if h.op == Op::Read {
            // Sent straight from the window, without a copy (an empty reply
            // if the range is not ours to read).
            let (src, len) = usize::try_from(h.len)
                .ok()
                .filter(|&len| len <= MAX_PIECE)
                .and_then(|len| {
                    let at = h.at.with_rank(self.rank);
                    let p = self.windows.local_ptr(at, len, self.size).ok()?;
                    Some((p.cast_const(), len))
                })
                .unwrap_or((
                    core::ptr::NonNull::<u8>::dangling().as_ptr().cast_const(),
                    0,
                ));
            // SAFETY: `src` is `len` bytes of our live part of the window
            // (checked by `local_ptr`; window memory stays mapped until the
            // communicator ends), or nothing; MPI reads it while window
            // memory is accessed concurrently by design (as by RMA), without
            // references to it. Valid communicator and rank (the request's
            // source).
            return raw::check("MPI_Send", unsafe {
                ffi::MPI_Send(
                    src.cast::<c_void>(),
                    len as c_int,
                    raw::byte(),
                    from,
                    tag,
                    self.comm.0,
                )
            });
        }
        let mut out = Vec::new();
        let ok = match h.op {
            Op::Read => unreachable!("sent above"),
            Op::Write => self.apply(&h, &msg[HEADER..], &mut []).is_ok(),
            Op::Cas | Op::FetchAdd => match self.apply(&h, &[], &mut []) {
                Ok(old) => {
                    out = old.to_le_bytes().to_vec();
                    true
                }
                Err(_) => false,
            },
            Op::Multi => match self.apply_multi(&h, msg) {
                Some(replies) => {
                    out = replies;
                    true
                }
                None => false,
            },
        };
        let reply: &[u8] = match (ok, h.op) {
            (false, _) => &[],
            // A write's acknowledgement: one byte (empty means failure).
            (true, Op::Write) => &[1],
            (true, _) => &out,
        };
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

/// One operation of [`MpiCom::served_many`]: what to do, the data of a
/// write, where a read's bytes go, and an atomic's old word once done.
pub(super) struct ServedOp<'a> {
    pub(super) h: Header,
    pub(super) data: &'a [u8],
    pub(super) out: &'a mut [u8],
    pub(super) old: u64,
}

impl<'a> ServedOp<'a> {
    /// The operation `h`, with `data` for a write and `out` for a read.
    pub(super) fn new(h: Header, data: &'a [u8], out: &'a mut [u8]) -> Self {
        ServedOp {
            h,
            data,
            out,
            old: 0,
        }
    }

    /// Bytes of its reply: a read's data, an atomic's old word, or one for
    /// a write's acknowledgement (an empty reply is a failure).
    fn reply_len(&self) -> usize {
        match self.h.op {
            Op::Read => self.out.len(),
            Op::Write => 1,
            Op::Cas | Op::FetchAdd => 8,
            Op::Multi => unreachable!("a batch's operations are single ones"),
        }
    }

    /// Takes its reply (of [`Self::reply_len`] bytes).
    fn take_reply(&mut self, reply: &[u8]) {
        match self.h.op {
            Op::Read => self.out.copy_from_slice(reply),
            Op::Write | Op::Multi => {}
            Op::Cas | Op::FetchAdd => {
                self.old = u64::from_le_bytes(reply[..8].try_into().expect("8"));
            }
        }
    }
}

/// Most requests of one batch in flight at once (their replies' buffers
/// are allocated up front).
const MAX_IN_FLIGHT: usize = 64;

/// One request in flight: its two MPI requests and buffers.
struct InFlight {
    rreq: ffi::MPI_Request,
    sreq: ffi::MPI_Request,
    /// Room for the reply (capacity `reply_len`), its length set once
    /// received whole.
    reply: Vec<u8>,
    reply_len: usize,
    msg: Vec<u8>,
    sent: bool,
    got: Option<usize>,
}

impl<U: UltItf> MpiCom<U> {
    /// Performs `h` (with `data` for a write) through `s`: here if the
    /// target is this process, else by a request and its reply. A read
    /// fills `out`; an atomic returns the old word. The caller has checked
    /// window, rank, bounds and alignment; `h.len` is at most [`MAX_PIECE`].
    pub(super) fn served_op(
        &self,
        s: &Server,
        h: Header,
        data: &[u8],
        out: &mut [u8],
    ) -> Result<u64> {
        let mut ops = [ServedOp::new(h, data, out)];
        self.served_many(s, &mut ops)?;
        Ok(ops[0].old)
    }

    /// Performs `ops` as [`Self::served_op`] does each, with up to
    /// [`MAX_IN_FLIGHT`] requests in flight together: their replies come
    /// back in about one round trip. The caller has checked every
    /// operation as for `served_op`.
    pub(super) fn served_many(&self, s: &Server, ops: &mut [ServedOp<'_>]) -> Result<()> {
        if ops.iter().any(|o| o.h.at.rank() == self.rank) {
            // Serve first: a thread spinning on its own words (a lock a peer
            // holds) must let the peer's release in. Not at every local
            // operation, though: a serve polls MPI, which costs about 15 µs
            // over TCP, and a transaction makes several local operations.
            if s.due() {
                s.serve()?;
                super::progress::note_poll();
            }
            for o in ops.iter_mut().filter(|o| o.h.at.rank() == self.rank) {
                o.old = s.apply(&o.h, o.data, o.out)?;
            }
        }
        let mut remote: Vec<&mut ServedOp<'_>> = ops
            .iter_mut()
            .filter(|o| o.h.at.rank() != self.rank)
            .collect();
        for chunk in remote.chunks_mut(MAX_IN_FLIGHT) {
            self.served_chunk(s, chunk)?;
        }
        Ok(())
    }

    /// Sends the requests of `ops` (all to other processes) and waits for
    /// every reply. The reads and atomics to one process go in one multi
    /// request while their replies fit in [`MULTI_MAX_REPLY`] bytes (the
    /// target then answers them all at once: serving a request costs it
    /// several MPI calls); the rest go one by one.
    fn served_chunk(&self, s: &Server, ops: &mut [&mut ServedOp<'_>]) -> Result<()> {
        // Each request: the operations it carries (indices into `ops`).
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut open: Vec<(usize, usize, usize)> = Vec::new(); // (rank, group, reply bytes)
        for (k, o) in ops.iter().enumerate() {
            let rank = o.h.at.rank();
            let n = o.reply_len();
            let combinable = matches!(o.h.op, Op::Read | Op::Cas | Op::FetchAdd);
            match open.iter_mut().find(|(r, _, _)| *r == rank) {
                Some((_, g, bytes)) if combinable && *bytes + n <= MULTI_MAX_REPLY => {
                    groups[*g].push(k);
                    *bytes += n;
                }
                _ => {
                    groups.push(vec![k]);
                    if combinable {
                        open.retain(|(r, _, _)| *r != rank);
                        open.push((rank, groups.len() - 1, n));
                    }
                }
            }
        }
        let mut flights: Vec<InFlight> = Vec::with_capacity(groups.len());
        let mut posted = Ok(());
        for g in &groups {
            let first = &ops[g[0]];
            let to = first.h.at.rank() as c_int;
            let reply_tag = s.reply_tag();
            let (msg, reply_len) = if g.len() == 1 {
                let mut h = first.h;
                h.reply_tag = reply_tag;
                let mut msg = Vec::with_capacity(HEADER + first.data.len());
                msg.extend_from_slice(&h.encode());
                msg.extend_from_slice(first.data);
                (msg, first.reply_len())
            } else {
                let total: usize = g.iter().map(|&k| ops[k].reply_len()).sum();
                let h = Header {
                    op: Op::Multi,
                    reply_tag,
                    at: first.h.at,
                    len: g.len() as u64,
                    a: total as u64,
                    b: 0,
                };
                let mut msg = Vec::with_capacity(HEADER * (1 + g.len()));
                msg.extend_from_slice(&h.encode());
                for &k in g {
                    msg.extend_from_slice(&ops[k].h.encode());
                }
                (msg, total)
            };
            let mut f = InFlight {
                rreq: raw::request_null(),
                sreq: raw::request_null(),
                // Not zeroed: a read's reply is as long as its data.
                reply: Vec::with_capacity(reply_len),
                reply_len,
                msg,
                sent: false,
                got: None,
            };
            // SAFETY: `f.reply` has room for `reply_len` bytes on the heap,
            // which stay where they are until the receive completes (or are
            // leaked below); valid communicator and rank.
            match unsafe {
                raw::irecv_raw(
                    f.reply.as_mut_ptr(),
                    reply_len,
                    to,
                    reply_tag as c_int,
                    s.comm(),
                )
            } {
                Ok(r) => f.rreq = r,
                Err(e) => {
                    posted = Err(e);
                    break;
                }
            }
            // SAFETY: as above, for `f.msg`.
            match unsafe { raw::isend(&f.msg, to, TAG_REQUEST, s.comm()) } {
                Ok(r) => f.sreq = r,
                Err(e) => {
                    // The receive stays posted: MPI may still write `f.reply`.
                    std::mem::forget(f);
                    posted = Err(e);
                    break;
                }
            }
            flights.push(f);
        }
        if let Err(e) = posted {
            // Requests already sent may still be answered into their buffers.
            std::mem::forget(flights);
            return Err(e);
        }
        let first = ops.first().map(|o| o.h.at.rank());
        let watch = if ops.iter().all(|o| Some(o.h.at.rank()) == first) {
            Watch::Rank(first.unwrap_or(0))
        } else {
            Watch::AllOthers(None)
        };
        let what = || {
            let o = &ops[0];
            let more = if ops.len() > 1 {
                format!(" and {} more", ops.len() - 1)
            } else {
                String::new()
            };
            format!(
                "the reply to a served {:?} of {} bytes at rank {}{more}",
                o.h.op,
                o.h.len,
                o.h.at.rank()
            )
        };
        let r = self.wait_until(watch, Some(&what), || {
            let mut all = true;
            for f in flights.iter_mut() {
                if !f.sent {
                    // SAFETY: an active request whose buffer (`f.msg`) is
                    // alive.
                    f.sent = unsafe { raw::test(&mut f.sreq) }?;
                }
                if f.got.is_none() {
                    // SAFETY: an active request whose buffer (`f.reply`)
                    // is alive.
                    f.got = unsafe { raw::test_count(&mut f.rreq) }?;
                }
                all &= f.sent && f.got.is_some();
            }
            Ok(all.then_some(()))
        });
        if let Err(e) = r {
            // Abandoned requests: MPI may still use every buffer.
            std::mem::forget(flights);
            return Err(e);
        }
        for (g, mut f) in groups.iter().zip(flights) {
            if f.got != Some(f.reply_len) {
                let o = &ops[g[0]];
                let more = if g.len() > 1 {
                    format!(" (one of {} operations in one request)", g.len())
                } else {
                    String::new()
                };
                return Err(Error::Transport(format!(
                    "rank {} could not perform a served {:?} of {} bytes at window {} \
                     offset {}{more} (its window is gone or the range is outside it)",
                    o.h.at.rank(),
                    o.h.op,
                    o.h.len,
                    o.h.at.window().0,
                    o.h.at.offset()
                )));
            }
            // SAFETY: the receive completed with `reply_len` bytes, which
            // it wrote into the buffer's room.
            unsafe { f.reply.set_len(f.reply_len) };
            let mut at = 0;
            for &k in g {
                let n = ops[k].reply_len();
                ops[k].take_reply(&f.reply[at..at + n]);
                at += n;
            }
        }
        Ok(())
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
        for op in [Op::Read, Op::Write, Op::Cas, Op::FetchAdd, Op::Multi] {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
    }

    #[test]
    fn a_multi_request_carries_its_operations_headers() {
        let sub = |op, off, len| Header {
            op,
            reply_tag: 0,
            at: RemotePtr::new(1, WindowId(2), off),
            len,
            a: 0,
            b: 0,
        };
        let subs = [
            sub(Op::Read, 64, 32),
            sub(Op::Cas, 8, 8),
            sub(Op::Read, 0, 1),
        ];
        let head = Header {
            op: Op::Multi,
            reply_tag: 5,
            at: subs[0].at,
            len: 3,
            a: 41,
            b: 0,
        };
        let mut msg = head.encode().to_vec();
        for h in &subs {
            msg.extend_from_slice(&h.encode());
        }
        assert_eq!(sub_headers(&msg).collect::<Vec<_>>(), subs);
        // A garbled operation ends them (the server then refuses the
        // request: their count no longer matches).
        msg[HEADER + HEADER] = 0;
        assert_eq!(sub_headers(&msg).count(), 1);
        assert_eq!(sub_headers(&msg[..HEADER + 10]).count(), 0);
    }
}
