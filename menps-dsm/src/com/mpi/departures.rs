//! Departures: a process that finishes normally (drops its communicator)
//! sends a zero-byte notice to every other one on the control communicator
//! first; waits poll for notices, and one that needs a process that has
//! left fails with [`Error::PeerExited`] (see the [module docs](super)).

use std::os::raw::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use ::mpi::ffi;
use ct_worker::UltItf;

use super::{MpiCom, raw};
use crate::com::wait::Watch;
use crate::com::{Error, Result};

/// MPI tag of departure notices on the control communicator.
const TAG_LEAVE: c_int = 1;

/// Departure notices received: the order in which processes left.
pub(super) struct Departures {
    any: AtomicBool,
    /// `order[r]`: 1 + how many had left before `r`, or 0.
    order: Mutex<Vec<u32>>,
    count: AtomicU32,
}

impl Departures {
    /// Nobody has left a job of `size` processes yet.
    pub(super) fn new(size: usize) -> Self {
        Departures {
            any: AtomicBool::new(false),
            order: Mutex::new(vec![0; size]),
            count: AtomicU32::new(0),
        }
    }
}

impl<U: UltItf> MpiCom<U> {
    /// Receives departure notices that arrived (non-blocking).
    fn poll_departures(&self) -> Result<()> {
        let Ok(mut order) = self.departures.order.try_lock() else {
            return Ok(());
        };
        while let Some((msg, st)) = raw::improbe(self.comms.ctl.0, TAG_LEAVE)? {
            // A zero-byte notice.
            raw::mrecv(msg, &mut [0u8], 1)?;
            let r = st.MPI_SOURCE as usize;
            if r < self.size && order[r] == 0 {
                order[r] = self.departures.count.fetch_add(1, Ordering::Relaxed) + 1;
                self.departures.any.store(true, Ordering::Release);
            }
        }
        Ok(())
    }

    /// The error a wait must return now, if any.
    pub(super) fn failure(&self, watch: Watch) -> Result<Option<Error>> {
        self.poll_departures()?;
        if !self.departures.any.load(Ordering::Acquire) {
            return Ok(None);
        }
        let order = self
            .departures
            .order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ok(watch
            .departed(self.rank, self.size, |r| {
                (order[r] != 0).then_some(u64::from(order[r]))
            })
            .map(|rank| Error::PeerExited { rank }))
    }

    /// Tells every other process that this one leaves, so that their waits
    /// for it fail instead of hanging.
    pub(super) fn announce_departure(&self) {
        for r in (0..self.size).filter(|&r| r != self.rank) {
            // SAFETY: a zero-byte eager send on a valid communicator.
            unsafe {
                ffi::MPI_Send(
                    std::ptr::null(),
                    0,
                    raw::byte(),
                    r as c_int,
                    TAG_LEAVE,
                    self.comms.ctl.0,
                );
            }
        }
    }
}
