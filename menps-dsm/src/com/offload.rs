//! What the offloading backends (`mpi`, `verbs`) share around
//! `ct-delegate`'s [`Offloader`].
//!
//! - **Issuing side**: a command becomes a [`Request`] that completes with
//!   the command's [`Outcome`] ([`submit`]); [`drain`] waits for every
//!   command issued before it (a flush); [`settle`] gives the last ones time
//!   to finish before the communicator goes away.
//! - **Device side**: [`Completions`] reports finished commands in order and
//!   holds flush barriers back until every command accepted before them has
//!   finished.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ct_delegate::{Device, Offloader, Tag};
use ct_worker::UltItf;

use super::outcome::Outcome;
use super::wait::poll_for;
use super::{Request, Result, RmaRequest};

/// Submits `command`, whose device writes its result to `out`; the request
/// completes with that result.
pub(crate) fn submit<D: Device, U: UltItf>(
    off: &Arc<Offloader<D, U>>,
    command: D::Command,
    out: Arc<Outcome>,
) -> Request<U> {
    let (req, completer) = Request::<U>::pending();
    off.submit(command, move || completer.complete(out.take()));
    req
}

/// Waits until every command submitted so far has completed (and its
/// completion callback has run), through the device's flush barrier
/// `flush`.
pub(crate) fn drain<D: Device, U: UltItf>(
    off: &Arc<Offloader<D, U>>,
    flush: D::Command,
) -> Result<()> {
    // Nothing queued and nothing in flight (read in this order: the
    // executor counts a command as in flight before it may stop): every
    // operation issued before this call is complete.
    if !off.is_executor_running() && off.in_flight() == 0 {
        return Ok(());
    }
    let (req, completer) = Request::<U>::pending();
    off.submit(flush, move || completer.complete(Ok(0)));
    req.wait().map(drop)
}

/// How long a communicator that goes away waits for its last operations.
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

/// Yield rounds of the back-off before it parks (an OS thread; a worker
/// keeps yielding).
const SETTLE_YIELD_ROUNDS: u32 = 50;

/// Before the communicator goes away: requests dropped without waiting
/// still complete; gives them (and the offloader's threads) up to
/// [`SETTLE_LIMIT`] to finish.
pub(crate) fn settle<D: Device, U: UltItf>(off: &Offloader<D, U>) {
    poll_for::<U, ()>(SETTLE_LIMIT, SETTLE_YIELD_ROUNDS, || {
        (off.in_flight() == 0 && !off.is_executor_running()).then_some(())
    });
}

/// The reporting side of an offloaded device: the tags of finished
/// commands, reported in order, and flush barriers, each reported once
/// every command accepted before it has finished.
///
/// Every accepted command gets a sequence number ([`Completions::accept`]);
/// the device says which of those still in flight is oldest
/// ([`Completions::release_barriers`]).
#[derive(Default)]
pub(crate) struct Completions {
    /// Flush barriers: (tag, sequence number).
    barriers: VecDeque<(Tag, u64)>,
    /// Tags to report, in order.
    ready: VecDeque<Tag>,
    next_seq: u64,
}

impl Completions {
    /// Accepts a command: its sequence number.
    pub(crate) fn accept(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Accepts flush barrier `tag`: reported at once if nothing is in flight
    /// (`idle`) and no older barrier waits, else once every command
    /// accepted before it has finished.
    pub(crate) fn flush(&mut self, tag: Tag, idle: bool) {
        let seq = self.accept();
        if idle && self.barriers.is_empty() {
            self.ready.push_back(tag);
        } else {
            self.barriers.push_back((tag, seq));
        }
    }

    /// Command `tag` has finished (or failed): it is reported after those
    /// finished before it.
    pub(crate) fn done(&mut self, tag: Tag) {
        self.ready.push_back(tag);
    }

    /// Whether flush barriers wait.
    pub(crate) fn has_barriers(&self) -> bool {
        !self.barriers.is_empty()
    }

    /// Releases the barriers accepted before every command still in flight
    /// (`oldest`: the smallest sequence number in flight, `u64::MAX` for
    /// none).
    pub(crate) fn release_barriers(&mut self, oldest: u64) {
        while let Some(&(tag, seq)) = self.barriers.front() {
            if seq >= oldest {
                break;
            }
            self.ready.push_back(tag);
            self.barriers.pop_front();
        }
    }

    /// How many finished commands wait to be reported.
    pub(crate) fn backlog(&self) -> usize {
        self.ready.len()
    }

    /// The next finished command to report.
    pub(crate) fn pop(&mut self) -> Option<Tag> {
        self.ready.pop_front()
    }

    /// Reports up to `tags.len()` finished commands into the front of
    /// `tags`; how many.
    pub(crate) fn report(&mut self, tags: &mut [Tag]) -> usize {
        let n = tags.len().min(self.ready.len());
        for (t, tag) in tags.iter_mut().zip(self.ready.drain(..n)) {
            *t = tag;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barriers_wait_for_older_commands() {
        let mut c = Completions::default();
        let a = c.accept();
        c.flush(10, false);
        let b = c.accept();
        c.flush(11, false);
        assert_eq!(c.pop(), None);
        c.release_barriers(a);
        assert_eq!(c.pop(), None);
        c.done(1);
        c.release_barriers(b);
        let mut tags = [0; 4];
        assert_eq!(c.report(&mut tags), 2);
        assert_eq!(tags[..2], [1, 10]);
        c.release_barriers(u64::MAX);
        assert_eq!(c.pop(), Some(11));
        c.flush(12, true);
        assert_eq!((c.backlog(), c.pop()), (1, Some(12)));
        assert!(!c.has_barriers());
        assert_eq!(c.accept(), 5);
    }
}
