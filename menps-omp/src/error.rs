//! The errors of the runtime.

use menps_dsm::dsm::DsmError;

/// What can keep [`run`](crate::run) from running a program to its end.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is invalid (the message names the variable or the builder
    /// method).
    #[error("menps-omp: {0}")]
    Config(String),
    /// The job could not be started or joined.
    #[error("menps-omp: cannot start the job: {0}")]
    Launch(#[from] menps_dsm::com::Error),
    /// The DSM failed (a dead peer, a detected data race, a protocol error).
    #[error("menps-omp: {0}")]
    Dsm(#[from] DsmError),
    /// The program's `main` panicked (the panic message).
    #[error("menps-omp: main panicked: {0}")]
    Panicked(String),
}

/// A DSM failure inside a parallel region: the region cannot go on (the
/// other threads would wait for this one forever), so it panics, which ends
/// the process with a message (see [`run`](crate::run)).
#[track_caller]
pub(crate) fn fail(what: &str, e: impl core::fmt::Display) -> ! {
    // The message is made in the private heap: the DSM heap may be what
    // failed.
    let _private = menps_dsm::dsm::allocator::RuntimeGuard::enter();
    panic!("menps-omp: {what}: {e}")
}
