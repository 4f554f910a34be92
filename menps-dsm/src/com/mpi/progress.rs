//! The progress thread: OpenMPI's `osc ucx` (between machines) needs the
//! target process to enter MPI for passive-target operations to progress;
//! this thread calls `MPI_Iprobe` at a fixed interval on a communicator of
//! its own (`MENPS_MPI_PROGRESS_US`).

use std::os::raw::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::mpi::ffi;

use super::raw::{self, Handle};

/// The running progress thread.
pub(super) struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<()>,
}

impl ProgressThread {
    /// Starts probing `comm` every `every`.
    pub(super) fn start(comm: Handle<ffi::MPI_Comm>, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("menps-mpi-progress".into())
            .spawn(move || progress_main(comm, every, &s))
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

fn progress_main(comm: Handle<ffi::MPI_Comm>, every: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let mut flag: c_int = 0;
        // SAFETY: a valid communicator (freed only after this thread was
        // joined) and out-parameters. Errors are ignored: the probe is only
        // there to drive MPI's progress engine.
        unsafe {
            ffi::MPI_Iprobe(
                raw::any_source(),
                0,
                comm.0,
                &mut flag,
                raw::status_ignore(),
            );
        }
        std::thread::park_timeout(every);
    }
}
