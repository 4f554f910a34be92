//! The commands the verbs device takes from the offloader: one-sided
//! operations on a process's registered memory, and flush barriers.

use std::sync::Arc;

use crate::com::outcome::Outcome;

/// What a command does.
pub(crate) enum Kind {
    /// RDMA READ of `len` bytes into `dst`.
    Read {
        /// Destination (valid until completion: `Rma::read_nb`'s contract).
        dst: *mut u8,
        /// Length.
        len: usize,
    },
    /// RDMA WRITE of `len` bytes from `src`.
    Write {
        /// Source (valid until completion: `Rma::write_nb`'s contract).
        src: *const u8,
        /// Length.
        len: usize,
    },
    /// Atomic compare-and-swap.
    Cas {
        /// Expected value.
        expected: u64,
        /// New value.
        new: u64,
    },
    /// Atomic fetch-and-add.
    FetchAdd {
        /// Addend.
        delta: u64,
    },
}

/// A command for the device.
pub(crate) enum Command {
    /// A one-sided operation on `rank`'s memory at `remote_addr` (bounds and
    /// alignment already checked), with the window's `rkey` there.
    Rma {
        /// Target rank (index of the queue pair).
        rank: usize,
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// What to do.
        kind: Kind,
        /// Result.
        out: Arc<Outcome>,
    },
    /// Completes once every command posted before it has completed.
    Flush,
}

// SAFETY: the raw pointers in `Kind` point to buffers the issuer keeps valid
// and unshared until the command completes (the unsafe contracts of
// `read_nb` / `write_nb`).
unsafe impl Send for Command {}
