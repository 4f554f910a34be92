//! The point-to-point path shared by the backends that carry messages
//! themselves (`shm`, `mpi`): argument checks, tag matching through the
//! [`Inbox`], and the receive loop; a backend supplies only how a message
//! travels ([`Mailbox`]).
//!
//! Every backend with a [`Mailbox`] gets [`P2p`] from here, so the rules of
//! the trait (tag matching, FIFO per sender and tag, `recv_into`'s
//! too-small-buffer rule, the errors of misuse) are one piece of code.

use std::sync::{Mutex, MutexGuard};

use super::inbox::Inbox;
use super::wait::Watch;
use super::{Comm, P2p, Result, Source, Tag, check};

/// A backend's side of point-to-point messages.
pub(crate) trait Mailbox: Comm {
    /// The messages that have arrived but were not received yet.
    fn inbox(&self) -> &Mutex<Inbox>;

    /// Moves the messages that have arrived (from `from`; a backend may take
    /// every sender's) into `inbox`, without waiting.
    fn collect(&self, inbox: &mut Inbox, from: Source) -> Result<()>;

    /// Sends `data` to `to` with `tag`, once the arguments have been
    /// checked; returns when the message is queued at the receiver (or
    /// buffered on its way).
    fn transmit(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()>;

    /// Polls `poll` until it gives a message, an error, or `watch` says the
    /// message can never come. A receive may wait as long as the program
    /// likes (a server waiting for requests).
    fn wait_for<T>(&self, watch: Watch, poll: impl FnMut() -> Result<Option<T>>) -> Result<T>;

    /// Whether the job can still communicate, checked after the arguments
    /// (shm: that no process has died); the default has nothing to check.
    fn check_usable(&self) -> Result<()> {
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The inbox stays consistent even if a holder panicked (no user code
    // runs under the lock).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watch of a receive from `from`, after checking the rank.
fn source_watch<M: Mailbox>(m: &M, from: Source) -> Result<Watch> {
    match from {
        Source::Rank(s) => {
            check::rank(s, m.size())?;
            Ok(Watch::Rank(s))
        }
        Source::Any => Ok(Watch::AnyOther),
    }
}

/// Takes the oldest matching message, if there is one (after collecting
/// what has arrived); `fits` may refuse it by its length (it then stays
/// queued) with an error.
fn take_matching<M: Mailbox>(
    m: &M,
    from: Source,
    tag: Tag,
    fits: &impl Fn(usize) -> Result<()>,
) -> Result<Option<(usize, Vec<u8>)>> {
    let mut inbox = lock(m.inbox());
    m.collect(&mut inbox, from)?;
    inbox.take(from, tag, m.size(), fits)
}

/// The receive loop: waits for a matching message that `fits` accepts.
fn receive<M: Mailbox>(
    m: &M,
    from: Source,
    tag: Tag,
    fits: impl Fn(usize) -> Result<()>,
) -> Result<(usize, Vec<u8>)> {
    let watch = source_watch(m, from)?;
    m.check_usable()?;
    m.wait_for(watch, || take_matching(m, from, tag, &fits))
}

impl<M: Mailbox> P2p for M {
    fn send(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()> {
        check::message_len(data.len())?;
        check::rank(to, self.size())?;
        self.check_usable()?;
        self.transmit(to, tag, data)
    }

    fn try_recv(&self, from: Source, tag: Tag) -> Result<Option<(usize, Vec<u8>)>> {
        source_watch(self, from)?;
        self.check_usable()?;
        take_matching(self, from, tag, &|_| Ok(()))
    }

    fn recv(&self, from: Source, tag: Tag) -> Result<(usize, Vec<u8>)> {
        receive(self, from, tag, |_| Ok(()))
    }

    fn recv_into(&self, from: Source, tag: Tag, buf: &mut [u8]) -> Result<(usize, usize)> {
        let capacity = buf.len();
        let (s, msg) = receive(self, from, tag, |len| check::fits(len, capacity))?;
        buf[..msg.len()].copy_from_slice(&msg);
        Ok((s, msg.len()))
    }
}
