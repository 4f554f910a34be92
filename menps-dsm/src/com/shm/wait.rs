//! Waiting on shm: polls with short pauses, then yields, then sleeps on the
//! process's futex doorbell — or, on a user-level thread, parks until the
//! doorbell's watcher (module `bell`) wakes it (see the [module
//! docs](super)); every wait also watches for peers that died or left (the
//! launcher's marks in the control memory, and `/proc` when the launcher
//! cannot run), and a long wait is reported by the watchdog.

use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use ct_worker::UltItf;

use super::ShmCom;
use super::control::state;
use crate::com::wait::{Watch, poll_for};
use crate::com::{Error, Result};

/// The waits' back-off (`ct_sync::Backoff::polling`) polls with a short
/// pause in between (about 5 µs in all on this kind of machine), so that a
/// peer running on another core is seen at once. (The back-off's default
/// spin, under a microsecond before its first yield, made the 2-process
/// communication barrier ten times slower: 0.31 → 3.6 µs.)
const SPIN_ROUNDS: u32 = 128;
/// Then yields (each returns at once when nobody else waits for the
/// processor) for up to about a millisecond before sleeping: a peer a few
/// tens of microseconds behind — a barrier after uneven work, the next
/// fork of a short region — is met without a futex wake-up, whose latency
/// on a virtual machine is tens of microseconds.
const YIELD_ROUNDS: u32 = 1024;
/// The same when the job has more processes than the machine has
/// processors: the peer we wait for may be queued behind us on our own
/// processor, so the processor is given up almost at once, and for longer
/// before sleeping (a yield with nobody else runnable returns at once, so
/// this costs no latency when the peer runs elsewhere).
const SPIN_ROUNDS_OVERSUBSCRIBED: u32 = 2;
const YIELD_ROUNDS_OVERSUBSCRIBED: u32 = 256;
const SLEEP: Duration = Duration::from_millis(1);
/// How often a sleeping wait looks at its peers in `/proc` (see
/// `watch_peers`).
const WATCH_PEERS: Duration = Duration::from_millis(64);

/// Whether the caller is a user-level thread on a worker, which must not
/// sleep its OS thread: `U` is a user-level threading library and the caller
/// runs on one of its workers (the workers are what runs idle hooks). An OS
/// thread outside the runtime — such as `main` calling a communicator of
/// user-level threads — sleeps on the futex, as with [`ct_worker::OsThreads`].
fn on_worker<U: UltItf>() -> bool {
    core::any::TypeId::of::<U>() != core::any::TypeId::of::<ct_worker::OsThreads>()
        && U::runs_idle_hooks()
}

/// (Spin rounds, yield rounds) of the waits of a job of `size` processes on
/// this machine (more processes than processors: the oversubscribed ones).
pub(super) fn rounds(size: usize) -> (u32, u32) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if size > cpus {
        (SPIN_ROUNDS_OVERSUBSCRIBED, YIELD_ROUNDS_OVERSUBSCRIBED)
    } else {
        (SPIN_ROUNDS, YIELD_ROUNDS)
    }
}

/// The back-off's yield: the user-level thread to its worker's other
/// threads, then the processor (on OS threads `U::yield_now` is the
/// processor's yield).
fn yield_both<U: UltItf>() {
    U::yield_now();
    if core::any::TypeId::of::<U>() != core::any::TypeId::of::<ct_worker::OsThreads>() {
        std::thread::yield_now();
    }
}

impl<U: UltItf> ShmCom<U> {
    /// The error a wait must return now, if any (every wait also watches
    /// for the job's first death).
    pub(super) fn failure(&self, watch: Watch) -> Option<Error> {
        if let Some(rank) = self.control.failed_rank() {
            return Some(Error::PeerDied { rank });
        }
        // A process that passed the barrier a wait is in has sent every
        // signal of it: only one that left before counts.
        let before = match watch {
            Watch::AllOthers(barrier) => barrier,
            Watch::Rank(_) | Watch::AnyOther => None,
        };
        let exited = watch
            .departed(self.rank, self.size, |r| {
                let slot = self.control.slot(r);
                let left = slot.state.load(Ordering::Acquire) != state::RUNNING
                    && before.is_none_or(|epoch| {
                        let passed = slot.passed.load(Ordering::Acquire);
                        (passed.wrapping_sub(epoch) as i32) < 0
                    });
                left.then(|| u64::from(slot.ended_seq.load(Ordering::Acquire)))
            })
            .map(|rank| Error::PeerExited { rank });
        // The launcher records a death (the `failed` word) before the
        // process's state: having seen the state, re-read the word, which
        // the first read above may have missed.
        exited.map(|e| match self.control.failed_rank() {
            Some(rank) => Error::PeerDied { rank },
            None => e,
        })
    }

    /// The error for a peer whose socket closed: the process has ended, and
    /// the launcher records how (death or exit) moments later; wait up to a
    /// second for that verdict.
    pub(crate) fn departure_of(&self, rank: usize) -> Error {
        poll_for::<U, _>(Duration::from_secs(1), 0, || {
            self.failure(Watch::Rank(rank))
        })
        .unwrap_or(Error::PeerExited { rank })
    }

    /// Polls until `poll` gives a value, an error, or `watch` (or a death in
    /// the job) says it never will. Backs off: spin, yield, doorbell sleep
    /// (a user-level thread on a worker parks until the doorbell's watcher
    /// wakes it, at a ring or after `bell::HEARTBEAT`, and then polls and
    /// checks as after a sleep). A wait longer than the watchdog period
    /// (`MENPS_WATCHDOG_SECS`) is reported once, naming `what` is awaited
    /// and any stopped peer (`None`: a wait that may last as long as the
    /// program likes, such as a server waiting for its next request).
    pub(crate) fn wait_until<T>(
        &self,
        watch: Watch,
        what: Option<&dyn Fn() -> String>,
        mut poll: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let mut backoff = ct_sync::Backoff::polling(self.spin_rounds, self.yield_rounds);
        let mut asleep_since: Option<Instant> = None;
        let mut peers_watched: Option<Instant> = None;
        let mut reported = false;
        loop {
            if let Some(v) = poll()? {
                return Ok(v);
            }
            if let Some(e) = self.failure(watch) {
                // What we wait for may have happened just before the peer left.
                return poll()?.ok_or(e);
            }
            if !backoff.yields_done() {
                // Poll, then yield: the one back-off, up to where it would
                // park; the doorbell's sleep takes over from there.
                backoff.snooze(yield_both::<U>);
            } else {
                let now = Instant::now();
                let since = *asleep_since.get_or_insert(now);
                if !reported
                    && let Some(what) = what
                    && let Some(period) = crate::launch::watchdog_period()
                    && now - since >= period
                {
                    let msg = self.report_long_wait(watch, what, period);
                    reported = true;
                    if crate::launch::watchdog_fails() {
                        return Err(Error::Stalled(msg));
                    }
                }
                // Peers are watched here too, not only by the launcher (which
                // may be stopped or descheduled): on the first sleep, then
                // about every 64 ms.
                if peers_watched.is_none_or(|t| now - t >= WATCH_PEERS) {
                    self.watch_peers();
                    peers_watched = Some(now);
                }
                let slot = self.control.slot(self.rank);
                slot.sleepers.fetch_add(1, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                let bell = slot.doorbell.load(Ordering::SeqCst);
                let r = poll();
                let mut parked = false;
                if matches!(r, Ok(None)) && self.failure(watch).is_none() {
                    // A user-level thread parks, its worker runs the others
                    // (and sleeps only when it has none); an OS thread
                    // sleeps on the futex.
                    parked = on_worker::<U>() && self.bell.park(&slot.doorbell, bell);
                    if !parked {
                        crate::sys::futex_wait(&slot.doorbell, bell, SLEEP);
                    }
                }
                slot.sleepers.fetch_sub(1, Ordering::SeqCst);
                if let Some(v) = r? {
                    return Ok(v);
                }
                if !parked {
                    // Let other user-level threads of this worker run
                    // between sleeps.
                    U::yield_now();
                }
            }
        }
    }

    /// Records peers that have ended (gone, or zombies their launcher has
    /// not reaped), from `/proc`, with their exit status: a dead peer is
    /// detected even when the launcher cannot run.
    #[cold]
    fn watch_peers(&self) {
        for r in (0..self.size).filter(|&r| r != self.rank) {
            let slot = self.control.slot(r);
            let pid = slot.pid.load(Ordering::Relaxed);
            if pid == 0 || slot.state.load(Ordering::Acquire) != state::RUNNING {
                continue;
            }
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                // Gone: reaped by our launcher, which records how it ended a
                // moment later (a process that exited well after its last
                // barrier was taken for dead when we looked in between), or
                // by someone else — then it did not end well.
                Err(_) => {
                    if !self.verdict_within(r, Duration::from_secs(1)) {
                        self.control.mark_ended(r, false);
                    }
                }
                Ok(stat) => {
                    let Some((_, rest)) = stat.rsplit_once(')') else {
                        continue;
                    };
                    let fields: Vec<&str> = rest.split_whitespace().collect();
                    if matches!(fields.first(), Some(&"Z" | &"X")) {
                        // Field 52, the wait status (field 3 is fields[0]).
                        let ok = fields.get(49).and_then(|v| v.parse::<i32>().ok()) == Some(0);
                        self.control.mark_ended(r, ok);
                    }
                }
            }
        }
    }

    /// Waits up to `limit` for the launcher to record that rank `r` ended;
    /// whether it did.
    #[cold]
    fn verdict_within(&self, r: usize, limit: Duration) -> bool {
        let slot = self.control.slot(r);
        poll_for::<U, _>(limit, 0, || {
            (slot.state.load(Ordering::Acquire) != state::RUNNING).then_some(())
        })
        .is_some()
    }

    /// The watchdog's report: this process has waited `period` for `what`
    /// from the peers of `watch`; peers that are stopped (`SIGSTOP`, a
    /// debugger) are named, since they are the usual reason.
    #[cold]
    fn report_long_wait(
        &self,
        watch: Watch,
        what: &dyn Fn() -> String,
        period: Duration,
    ) -> String {
        let peers: Vec<usize> = match watch {
            Watch::Rank(r) => vec![r],
            Watch::AllOthers(_) | Watch::AnyOther => {
                (0..self.size).filter(|&r| r != self.rank).collect()
            }
        };
        let stopped: Vec<String> = peers
            .iter()
            .filter_map(|&r| {
                let pid = self.control.slot(r).pid.load(Ordering::Relaxed);
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // The state follows the command name's closing parenthesis.
                let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
                matches!(state, 'T' | 't').then(|| format!("rank {r} (pid {pid}) is stopped"))
            })
            .collect();
        crate::com::wait::report_long_wait(self.rank, watch, period, &what(), &stopped)
    }
}
