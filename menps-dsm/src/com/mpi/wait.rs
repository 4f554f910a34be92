//! Waiting on MPI: polls (a request, the inbox) with the workspace's
//! back-off, yielding the user-level thread in between and parking an OS
//! thread, never blocking inside an MPI call — so a job that `mpirun` kills
//! dies at once — and gives up when a process the wait needs has left.

use std::time::{Duration, Instant};

use ::mpi::ffi;
use ct_worker::UltItf;

use super::{MpiCom, raw};
use crate::com::wait::{Watch, report_long_wait};
use crate::com::{Error, Result};

/// Yield rounds of a wait before it parks (an OS thread; a worker thread
/// keeps yielding: it never sleeps, see [`ct_sync::Backoff`]).
const YIELD_ROUNDS: u32 = 50;

/// The back-off of this backend's waits: the workspace's one, parking
/// after [`YIELD_ROUNDS`].
pub(super) fn backoff() -> ct_sync::Backoff {
    ct_sync::Backoff::parking(YIELD_ROUNDS)
}

/// How long a wait keeps polling after it saw that a process it needs has
/// left (messages it sent before leaving may still be in flight).
const DEPARTURE_GRACE: Duration = Duration::from_millis(500);

impl<U: UltItf> MpiCom<U> {
    /// Polls until `poll` gives a value or an error, or `watch` says it
    /// never will (after [`DEPARTURE_GRACE`]). A wait longer than the
    /// watchdog period (`MENPS_WATCHDOG_SECS`) is reported once, naming
    /// `what` is awaited (`None`: a wait that may last as long as the
    /// program likes, such as for a lock's hand-off), and fails with
    /// [`Error::Stalled`] if the watchdog is set to fail.
    pub(crate) fn wait_until<T>(
        &self,
        watch: Watch,
        what: Option<&dyn Fn() -> String>,
        mut poll: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let mut backoff = backoff();
        let mut failed_at: Option<(Instant, Error)> = None;
        // When the wait stopped spinning, until it has been reported.
        let mut slow_since: Option<Instant> = None;
        let mut reported = false;
        loop {
            if let Some(v) = poll()? {
                return Ok(v);
            }
            // A waiting thread serves requests for served RMA: the peer it
            // waits for may be waiting for us.
            // Having served, it keeps polling closely (a peer that made one
            // request usually makes the next within a round trip) rather
            // than sleeping on.
            if let Some(s) = &self.server
                && s.serve()? > 0
            {
                backoff.reset();
            }
            super::progress::note_poll();
            if !backoff.is_spinning() {
                if !reported
                    && let Some(what) = what
                    && let Some(period) = crate::launch::watchdog_period()
                {
                    let now = Instant::now();
                    if now - *slow_since.get_or_insert(now) >= period {
                        reported = true;
                        let msg = report_long_wait(self.rank, watch, period, &what(), &[]);
                        if crate::launch::watchdog_fails() {
                            return Err(Error::Stalled(msg));
                        }
                    }
                }
                match &failed_at {
                    Some((t, e)) if t.elapsed() >= DEPARTURE_GRACE => return Err(e.clone()),
                    Some(_) => {}
                    None => {
                        if let Some(e) = self.failure(watch)? {
                            failed_at = Some((Instant::now(), e));
                        }
                    }
                }
            }
            backoff.snooze(U::yield_now);
        }
    }

    /// Waits for an MPI request of a collective or a message.
    ///
    /// # Safety
    /// `req` must be active (or null) and its buffers valid until this
    /// returns `Ok`. On `Err` the request is abandoned (never completed):
    /// the caller must leak its buffers.
    pub(crate) unsafe fn wait_request(
        &self,
        req: &mut ffi::MPI_Request,
        watch: Watch,
        what: Option<&dyn Fn() -> String>,
    ) -> Result<()> {
        self.wait_until(watch, what, || {
            // SAFETY: per the contract.
            unsafe { raw::test(req) }.map(|d| d.then_some(()))
        })
    }
}
