//! Point-to-point messages on MPI.
//!
//! A message is `MPI_Isend` of the payload followed by its 4-byte tag (MPI
//! tags are too small for every `u32`), on a dedicated communicator with one
//! MPI tag. Receivers drain every arrived message (`MPI_Improbe` +
//! `MPI_Mrecv`, which match atomically under `MPI_THREAD_MULTIPLE`) into
//! the per-(sender, tag) queues of the receive path shared with shm
//! (`com::mailbox`), under a process-local lock, in arrival order — so the
//! semantics are those of the shm backend: tag matching, FIFO per
//! (sender, receiver, tag), and a too-long message for `recv_into` stays
//! queued. A sender waiting for its `Isend` drains as well, which makes
//! sends buffered in effect: two processes sending big messages to each
//! other before receiving do not deadlock.

use std::os::raw::c_int;
use std::sync::Mutex;

use ::mpi::ffi;
use ct_worker::UltItf;

use super::{MpiCom, raw};
use crate::com::inbox::Inbox;
use crate::com::mailbox::Mailbox;
use crate::com::wait::Watch;
use crate::com::{Error, Result, Source, Tag};

/// The MPI tag of every message on the p2p communicator.
const TAG_MSG: c_int = 0;
/// Bytes of the tag trailer.
const TRAILER: usize = 4;

impl<U: UltItf> Mailbox for MpiCom<U> {
    fn inbox(&self) -> &Mutex<Inbox> {
        &self.inbox
    }

    /// Moves every message that has arrived (from anyone) into the inbox.
    fn collect(&self, inbox: &mut Inbox, _from: Source) -> Result<()> {
        while let Some((msg, st)) = raw::improbe(self.comms.p2p.0, TAG_MSG)? {
            let mut count: c_int = 0;
            // SAFETY: the status of the matched message.
            raw::check("MPI_Get_count", unsafe {
                ffi::MPI_Get_count(&st, raw::byte(), &mut count)
            })?;
            let len = count.max(0) as usize;
            let mut v = vec![0u8; len.max(1)];
            raw::mrecv(msg, &mut v, count)?;
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
        Ok(())
    }

    /// `MPI_Isend` of the payload and its tag, waited for while receiving.
    fn transmit(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()> {
        let mut buf = Vec::with_capacity(data.len() + TRAILER);
        buf.extend_from_slice(data);
        buf.extend_from_slice(&tag.to_le_bytes());
        // SAFETY: `buf` is owned here and outlives the request (kept until it
        // completes, or leaked if we give up); valid communicator and rank.
        let mut req = unsafe { raw::isend(&buf, to as c_int, TAG_MSG, self.comms.p2p.0) }?;
        let what = || format!("the send of a message of {} bytes (tag {tag})", data.len());
        let r = self.wait_until(Watch::Rank(to), Some(&what), || {
            // SAFETY: `req` is active and `buf` alive.
            if unsafe { raw::test(&mut req) }? {
                return Ok(Some(()));
            }
            // Receive meanwhile, so that senders never wait for each other.
            if let Ok(mut inbox) = self.inbox.try_lock() {
                self.collect(&mut inbox, Source::Any)?;
            }
            Ok(None)
        });
        if r.is_err() {
            // The send never completed: MPI may still read the buffer.
            std::mem::forget(buf);
        }
        r
    }

    fn wait_for<T>(&self, watch: Watch, poll: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        self.wait_until(watch, None, poll)
    }
}
