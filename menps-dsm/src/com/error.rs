//! The communication layer's error type.

/// Everything that can go wrong in the communication layer and the launcher.
///
/// Failures of other processes are *fail-stop*: once any process of the job
/// has died, every blocking call in every other process (receives, barriers,
/// collectives, waits, and RMA on the shm backend) returns
/// [`Error::PeerDied`] naming the first process that died, instead of
/// hanging.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A process of the job crashed, was killed, panicked or exited with a
    /// non-zero status. The job cannot continue; the launcher stops it.
    #[error(
        "process rank {rank} died (crashed, was killed or exited with an error); \
         the job cannot continue — its own report, or the launcher's, says how it ended"
    )]
    PeerDied {
        /// Rank of the (first) process that died.
        rank: usize,
    },
    /// A process finished normally (exit status 0) while this operation
    /// still needed it, so the operation could never complete.
    #[error(
        "process rank {rank} already finished and left the job, so this operation \
         can never complete (does every process call the same collectives?)"
    )]
    PeerExited {
        /// Rank of the process that left.
        rank: usize,
    },
    /// A rank outside `0..size`.
    #[error("rank {rank} is out of range: the job has {size} processes (ranks 0..{size})")]
    BadRank {
        /// The rank given.
        rank: usize,
        /// Number of processes in the job.
        size: usize,
    },
    /// An RMA access outside the target's window.
    #[error(
        "RMA access of {len} bytes at offset {offset} is out of bounds of window {window}, \
         which has {size} bytes per process"
    )]
    OutOfBounds {
        /// Window id.
        window: u32,
        /// Byte offset of the access.
        offset: u64,
        /// Length of the access.
        len: usize,
        /// Window size per process.
        size: usize,
    },
    /// An atomic operation on a word that is not 8-byte aligned.
    #[error(
        "atomic operation at offset {offset} of window {window} is not 8-byte aligned \
         (atomics work on aligned u64 words)"
    )]
    UnalignedAtomic {
        /// Window id.
        window: u32,
        /// Byte offset of the word.
        offset: u64,
    },
    /// A window id that was never created in this process, or was destroyed.
    #[error("unknown window {window}: it was never created by this process or has been destroyed")]
    UnknownWindow {
        /// Window id.
        window: u32,
    },
    /// A point-to-point message above the size limit.
    #[error(
        "message of {len} bytes exceeds the point-to-point limit of {max} bytes \
         (use RMA on a window for bulk data)"
    )]
    MessageTooLarge {
        /// Length of the message.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A receive buffer too small for the matched message (which is left
    /// queued).
    #[error("receive buffer of {capacity} bytes is too small for the {len}-byte message")]
    BufferTooSmall {
        /// Length of the message.
        len: usize,
        /// Capacity of the buffer.
        capacity: usize,
    },
    /// Processes called a collective with arguments that do not match
    /// (different sizes, roots or operations). Every process gets this error
    /// for the same call.
    #[error("collective call mismatch: {0}")]
    CollectiveMismatch(String),
    /// An argument that cannot be valid (wrong buffer length, root out of
    /// range, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Invalid settings (environment variables, builder values, process
    /// count), or use outside a job.
    #[error("bad configuration: {0}")]
    BadConfig(String),
    /// A communication backend cannot run here (no RDMA device, no MPI
    /// library support for what is needed, …). The message says what is
    /// missing and what to do.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// A wait for peers lasted longer than the watchdog period
    /// (`MENPS_WATCHDOG_SECS`) and the watchdog is set to fail
    /// (`MENPS_WATCHDOG_FAIL=1`): what was awaited, and stopped peers.
    #[error("stalled: {0}")]
    Stalled(String),
    /// The network or the communication library reported a failure (an MPI
    /// error code, a verbs completion with an error status, …).
    #[error("transport error: {0}")]
    Transport(String),
    /// A system call failed.
    #[error("{call} failed: {}", std::io::Error::from_raw_os_error(*.errno))]
    Os {
        /// The call.
        call: &'static str,
        /// `errno`.
        errno: i32,
    },
}

impl Error {
    /// Whether this only says that another process of the job died first
    /// ([`Error::PeerDied`]): that process's failure is the cause.
    pub fn is_peer_death(&self) -> bool {
        matches!(self, Error::PeerDied { .. })
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
