//! The error type of this crate.

use std::io;

/// Errors from creating stacks and contexts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The requested stack is smaller than the minimum.
    #[error("stack of {requested} bytes is too small: at least {minimum} bytes are needed")]
    StackTooSmall {
        /// Requested usable size in bytes.
        requested: usize,
        /// Smallest accepted size in bytes.
        minimum: usize,
    },
    /// The requested stack size overflows the address space.
    #[error("stack of {requested} bytes is too large for the address space")]
    StackTooLarge {
        /// Requested size in bytes.
        requested: usize,
    },
    /// The guard-page count is out of range.
    #[error("{requested} guard pages requested: use between 1 and {maximum}")]
    InvalidGuardPages {
        /// Requested number of guard pages.
        requested: usize,
        /// Largest accepted number of guard pages.
        maximum: usize,
    },
    /// A null pointer was given as stack memory.
    #[error("stack memory pointer is null")]
    NullStack,
    /// `mmap` failed (usually: out of address space or `vm.max_map_count` reached).
    #[error("mmap of a stack failed: {0} (check `ulimit -v` and `vm.max_map_count`)")]
    Mmap(#[source] io::Error),
    /// `mprotect` failed while setting up a stack.
    #[error("mprotect of a stack failed: {0}")]
    Mprotect(#[source] io::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
