//! What the backends' waits share: which processes a wait watches
//! ([`Watch`]), which of them has left in a way that fails the wait
//! ([`Watch::departed`]), and bounded polling with the workspace's back-off
//! ([`poll_for`]).
//!
//! How a backend learns that a process has left differs (shm: the
//! launcher's marks in the control memory; mpi: departure notices), and so
//! does how it sleeps between polls; what a departure means for a wait does
//! not.

use std::time::{Duration, Instant};

use ct_worker::UltItf;

/// What a wait must also watch for: the processes whose departure means
/// that what it waits for may never come.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Watch {
    /// Fails if this process has left the job.
    Rank(usize),
    /// Fails if another process has left the job. With `Some(n)` (shm's
    /// barriers, numbered with wrapping), only one that left without
    /// passing barrier `n` counts: one that passed it has sent every signal
    /// of it. The backend that numbers its barriers applies that rule.
    AllOthers(Option<u32>),
    /// Fails if every other process has left the job.
    AnyOther,
}

impl Watch {
    /// The process whose departure fails a wait with this watch, if any,
    /// for process `me` of a job of `size`: `left(r)` is `None` while
    /// process `r` has not left (as far as this watch is concerned), else
    /// its place in the order of departures (smaller: earlier). Of several,
    /// the one that left first is named — the others may have left because
    /// of it.
    pub(crate) fn departed(
        self,
        me: usize,
        size: usize,
        left: impl Fn(usize) -> Option<u64>,
    ) -> Option<usize> {
        let others = (0..size).filter(|&r| r != me);
        let first = |gone: &mut dyn Iterator<Item = (u64, usize)>| gone.min().map(|(_, r)| r);
        match self {
            Watch::Rank(r) => left(r).map(|_| r),
            Watch::AllOthers(_) => first(&mut others.filter_map(|r| Some((left(r)?, r)))),
            Watch::AnyOther => {
                // Every other one, or nothing.
                let gone: Option<Vec<(u64, usize)>> =
                    others.map(|r| left(r).map(|at| (at, r))).collect();
                first(&mut gone?.into_iter())
            }
        }
    }
}

/// Reports a wait that has lasted the watchdog period
/// (`MENPS_WATCHDOG_SECS`) on standard error, once, in one line: process
/// `me` has waited `period` for the processes of `watch` (`what` is awaited;
/// `notes` add what the backend knows, such as stopped peers). Returns the
/// message, for [`Error::Stalled`](super::Error::Stalled) when the
/// watchdog is set to fail.
#[cold]
pub(crate) fn report_long_wait(
    me: usize,
    watch: Watch,
    period: Duration,
    what: &str,
    notes: &[String],
) -> String {
    let whom = match watch {
        Watch::Rank(r) => format!("rank {r}"),
        Watch::AllOthers(_) => "every other rank".to_string(),
        Watch::AnyOther => "any other rank".to_string(),
    };
    let mut msg = format!(
        "rank {me} has waited {:.0} s for {whom} ({what})",
        period.as_secs_f64()
    );
    if !notes.is_empty() {
        msg.push_str(": ");
        msg.push_str(&notes.join(", "));
    }
    let going_on = if crate::launch::watchdog_fails() {
        "giving up"
    } else {
        "still waiting"
    };
    // One write, so that other processes' output cannot split the line.
    let line = format!("menps: {msg}; {going_on}\n");
    use std::io::Write;
    let _ = std::io::stderr().write_all(line.as_bytes());
    msg
}

/// Polls `poll` until it gives a value or `limit` has passed (`None`),
/// backing off between polls with the workspace's back-off, which parks an
/// OS thread after `yield_rounds` rounds and never sleeps on a worker.
pub(crate) fn poll_for<U: UltItf, T>(
    limit: Duration,
    yield_rounds: u32,
    mut poll: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    let mut backoff = ct_sync::Backoff::parking(yield_rounds);
    loop {
        if let Some(v) = poll() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        backoff.snooze(U::yield_now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_to_leave_is_named() {
        // Rank 0 of 4; ranks 2 and 3 left, 3 first.
        let left = |r: usize| [None, None, Some(2), Some(1)][r];
        assert_eq!(Watch::Rank(1).departed(0, 4, left), None);
        assert_eq!(Watch::Rank(2).departed(0, 4, left), Some(2));
        assert_eq!(Watch::AllOthers(None).departed(0, 4, left), Some(3));
        assert_eq!(Watch::AnyOther.departed(0, 4, left), None);
        let all = |r: usize| [None, Some(5), Some(2), Some(2)][r];
        assert_eq!(Watch::AnyOther.departed(0, 4, all), Some(2));
        // Alone in the job: nobody to wait for, nobody to fail the wait.
        assert_eq!(Watch::AnyOther.departed(0, 1, all), None);
        assert_eq!(Watch::AllOthers(Some(1)).departed(0, 1, all), None);
    }
}
