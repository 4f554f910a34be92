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
