//! **Unstable**: DSM internals that the workspace's tests and benchmarks
//! look at. Not part of menps-dsm's public API: anything here may change or
//! disappear in any release, without notice.

/// Start of the address range every DSM process reserves (segments, the
/// heap, call stacks and every other shared region lie above it).
pub use crate::dsm::layout::DSM_BASE;

/// Fault-handling counters and per-thread switches of the `SIGSEGV` hook.
pub use crate::dsm::fault::{
    disable_on_this_thread, enable_on_this_thread, fault_count, is_enabled_on_this_thread,
};

/// A [`Dsm::flush`](crate::dsm::Dsm::flush) whose publication of this
/// process's release signature lasts as long as `f` runs (the slot is marked
/// as being rewritten meanwhile): tests use it to check that a peer's flush
/// in that window waits for the signature instead of passing it over.
pub fn flush_publishing_during<C, U>(
    dsm: &crate::dsm::Dsm<C, U>,
    f: impl FnOnce(),
) -> crate::dsm::DsmResult<()>
where
    C: crate::com::Communicator + 'static,
    U: ct_worker::UltItf,
{
    dsm.flush_publishing_during(f)
}

/// Whether this process's releases may learn from the kernel which pages
/// were written (dirty scans on, and the kernel keeps the record): tests
/// use it to tell a scan that should have happened from one the kernel
/// cannot make.
pub fn tracks_writes<C, U>(dsm: &crate::dsm::Dsm<C, U>) -> bool
where
    C: crate::com::Communicator + 'static,
    U: ct_worker::UltItf,
{
    dsm.tracks_writes()
}
