//! The progress thread: OpenMPI's `osc ucx` (between machines) needs the
//! target process to enter MPI for passive-target operations to progress;
//! this thread calls `MPI_Iprobe` at a fixed interval on a communicator of
//! its own (`MENPS_MPI_PROGRESS_US`) — when no other thread of the process
//! did so since its last turn.
//!
//! With served RMA (see `served`) the thread serves requests instead of
//! probing, when no other thread polled (which serves as well).
//!
//! A thread of ours that waits polls MPI itself ([`note_poll`] counts its
//! polls), and that drives the progress engine as well. Probing then as
//! well only made two threads contend inside UCX: across 2 simulated hosts
//! (UCX over TCP) the CG example's solve took about 3 s with the thread
//! probing regardless and about 1 s without the thread, and 2 of some 40
//! runs stalled in a remote read that never completed while both threads
//! progressed the target (none in about 35 runs without the thread).

use std::os::raw::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::mpi::ffi;

use super::raw::{self, Handle};
use super::served::Server;

/// How long the thread keeps polling, yielding its processor in between,
/// after it served a request of served RMA (requests come in bursts: a
/// peer's faults, a lock hand-off) before it waits its interval again.
const HOT: Duration = Duration::from_micros(500);

/// Polls of MPI by this process's waiting threads (wrapping).
static POLLS: AtomicU64 = AtomicU64::new(0);

/// Counts one poll of MPI by a waiting thread (it drives MPI's progress,
/// so the progress thread need not).
#[inline]
pub(super) fn note_poll() {
    POLLS.fetch_add(1, Ordering::Relaxed);
}

/// The running progress thread.
pub(super) struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<()>,
}

impl ProgressThread {
    /// Starts probing `comm` every `every` — or serving requests of served
    /// RMA, if `server` is given.
    pub(super) fn start(
        comm: Handle<ffi::MPI_Comm>,
        server: Option<Arc<Server>>,
        every: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("menps-mpi-progress".into())
            .spawn(move || progress_main(comm, server, every, &s))
            .expect("cannot start the MPI progress thread");
        ProgressThread { stop, handle }
    }

    /// Stops the thread and waits for it.
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.handle.thread().unpark();
        let _ = self.handle.join();
    }
}

fn progress_main(
    comm: Handle<ffi::MPI_Comm>,
    server: Option<Arc<Server>>,
    every: Duration,
    stop: &AtomicBool,
) {
    let mut polls = POLLS.load(Ordering::Relaxed);
    let mut hot_until: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let now = POLLS.load(Ordering::Relaxed);
        if now != polls {
            // Another thread polled MPI meanwhile.
            polls = now;
            std::thread::park_timeout(every);
            continue;
        }
        if let Some(s) = &server {
            // Errors are left to the waits, which serve too and report them.
            if s.serve().unwrap_or(0) > 0 {
                hot_until = Some(Instant::now() + HOT);
            }
            if hot_until.is_some_and(|t| Instant::now() < t) {
                std::thread::yield_now();
                continue;
            }
            hot_until = None;
        } else {
            let mut flag: c_int = 0;
            // SAFETY: a valid communicator (freed only after this thread was
            // joined) and out-parameters. Errors are ignored: the probe is
            // only there to drive MPI's progress engine.
            unsafe {
                ffi::MPI_Iprobe(
                    raw::any_source(),
                    0,
                    comm.0,
                    &mut flag,
                    raw::status_ignore(),
                );
            }
        }
        std::thread::park_timeout(every);
    }
}
