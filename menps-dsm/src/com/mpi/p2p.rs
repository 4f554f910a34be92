//! Point-to-point messages on MPI.
//!
//! A message is `MPI_Isend` of the payload followed by its 4-byte tag (MPI
//! tags are too small for every `u32`), on a dedicated communicator with one
//! MPI tag. Receivers drain every arrived message (`MPI_Improbe` +
//! `MPI_Mrecv`, which match atomically under `MPI_THREAD_MULTIPLE`) into
//! per-(sender, tag) queues under a process-local lock, in arrival order —
//! so the semantics are those of the shm backend: tag matching, FIFO per
//! (sender, receiver, tag), and a too-long message for `recv_into` stays
//! queued. A sender waiting for its `Isend` drains as well, which makes
//! sends buffered in effect: two processes sending big messages to each
//! other before receiving do not deadlock.

use std::os::raw::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use ::mpi::ffi;
use ct_worker::UltItf;

use super::raw;
use super::{MpiCom, Watch};
use crate::com::inbox::Inbox;
use crate::com::{Error, MAX_MESSAGE_BYTES, P2p, Result, Source, Tag};

/// The MPI tag of every message on the p2p communicator.
const TAG_MSG: c_int = 0;
/// Bytes of the tag trailer.
const TRAILER: usize = 4;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<U: UltItf> MpiCom<U> {
    /// Moves every message that has arrived into the inbox.
    fn drain(&self, inbox: &mut Inbox) -> Result<()> {
        loop {
            let mut flag: c_int = 0;
            let mut msg = std::mem::MaybeUninit::<ffi::MPI_Message>::uninit();
            let mut st = raw::empty_status();
            // SAFETY: valid communicator and out-parameters.
            raw::check("MPI_Improbe", unsafe {
                ffi::MPI_Improbe(
                    raw::any_source(),
                    TAG_MSG,
                    self.comms.p2p.0,
                    &mut flag,
                    msg.as_mut_ptr(),
                    &mut st,
                )
            })?;
            if flag == 0 {
                return Ok(());
            }
            let mut count: c_int = 0;
            // SAFETY: the status of the matched message.
            raw::check("MPI_Get_count", unsafe {
                ffi::MPI_Get_count(&st, raw::byte(), &mut count)
            })?;
            let len = count.max(0) as usize;
            let mut v = vec![0u8; len.max(1)];
            // SAFETY: the probe matched a message of `len` bytes and wrote
            // its handle; `v` has room for it.
            raw::check("MPI_Mrecv", unsafe {
                ffi::MPI_Mrecv(
                    v.as_mut_ptr().cast::<c_void>(),
                    count,
                    raw::byte(),
                    msg.as_mut_ptr(),
                    raw::status_ignore(),
                )
            })?;
            let sender = st.MPI_SOURCE as usize;
            if len < TRAILER || sender >= self.size {
                return Err(Error::Transport(format!(
                    "malformed point-to-point message ({len} bytes from rank {sender})"
                )));
            }
            v.truncate(len);
            let tag = Tag::from_le_bytes(v[len - TRAILER..].try_into().expect("4 bytes"));
            v.truncate(len - TRAILER);
            inbox.push(sender, tag, v);
        }
    }

    /// Takes the oldest matching message, if any; `fits` may refuse it (it
    /// then stays queued) with an error.
    fn take_matching(
        &self,
        from: Source,
        tag: Tag,
        fits: &impl Fn(usize) -> Result<()>,
    ) -> Result<Option<(usize, Vec<u8>)>> {
        let mut inbox = lock(&self.inbox);
        self.drain(&mut inbox)?;
        inbox.take(from, tag, self.size, fits)
    }

    fn source_watch(&self, from: Source) -> Result<Watch> {
        match from {
            Source::Rank(s) => {
                self.check_rank(s)?;
                Ok(Watch::Rank(s))
            }
            Source::Any => Ok(Watch::AnyOther),
        }
    }

    fn recv_checked(
        &self,
        from: Source,
        tag: Tag,
        fits: impl Fn(usize) -> Result<()>,
    ) -> Result<(usize, Vec<u8>)> {
        let watch = self.source_watch(from)?;
        self.wait_until(watch, || self.take_matching(from, tag, &fits))
    }
}

impl<U: UltItf> P2p for MpiCom<U> {
    fn send(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()> {
        if data.len() > MAX_MESSAGE_BYTES {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max: MAX_MESSAGE_BYTES,
            });
        }
        self.check_rank(to)?;
        let mut buf = Vec::with_capacity(data.len() + TRAILER);
        buf.extend_from_slice(data);
        buf.extend_from_slice(&tag.to_le_bytes());
        let mut req = raw::request_null();
        // SAFETY: `buf` is owned here and outlives the request (kept until it
        // completes, or leaked if we give up); valid communicator and rank.
        raw::check("MPI_Isend", unsafe {
            ffi::MPI_Isend(
                buf.as_ptr().cast::<c_void>(),
                buf.len() as c_int,
                raw::byte(),
                to as c_int,
                TAG_MSG,
                self.comms.p2p.0,
                &mut req,
            )
        })?;
        let r = self.wait_until(Watch::Rank(to), || {
            // SAFETY: `req` is active and `buf` alive.
            if unsafe { raw::test(&mut req) }? {
                return Ok(Some(()));
            }
            // Receive meanwhile, so that senders never wait for each other.
            if let Ok(mut inbox) = self.inbox.try_lock() {
                self.drain(&mut inbox)?;
            }
            Ok(None)
        });
        if r.is_err() {
            // The send never completed: MPI may still read the buffer.
            std::mem::forget(buf);
        }
        r
    }

    fn try_recv(&self, from: Source, tag: Tag) -> Result<Option<(usize, Vec<u8>)>> {
        self.source_watch(from)?;
        self.take_matching(from, tag, &|_| Ok(()))
    }

    fn recv(&self, from: Source, tag: Tag) -> Result<(usize, Vec<u8>)> {
        self.recv_checked(from, tag, |_| Ok(()))
    }

    fn recv_into(&self, from: Source, tag: Tag, buf: &mut [u8]) -> Result<(usize, usize)> {
        let capacity = buf.len();
        let (s, msg) = self.recv_checked(from, tag, |len| {
            if len <= capacity {
                Ok(())
            } else {
                Err(Error::BufferTooSmall { len, capacity })
            }
        })?;
        buf[..msg.len()].copy_from_slice(&msg);
        Ok((s, msg.len()))
    }
}
