//! The error type of this crate.

/// Errors from building a runtime or creating threads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The worker count is zero or not a number.
    #[error("invalid worker count {0:?}: use a positive integer (builder or CT_NUM_WORKERS)")]
    InvalidWorkers(String),
    /// The stack size is invalid.
    #[error(
        "invalid stack size {0:?}: use a byte count of at least 16 KiB (builder or CT_STACK_SIZE)"
    )]
    InvalidStackSize(String),
    /// The stack cannot hold a thread's bookkeeping.
    #[error("stack of {requested} bytes is too small for a thread")]
    StackTooSmall {
        /// Requested size in bytes.
        requested: usize,
    },
    /// A stack could not be created.
    #[error(
        "cannot create a thread stack: {0} (too many live threads for `vm.max_map_count`? \
         each guarded stack uses two memory mappings)"
    )]
    Stack(#[source] ct_context::Error),
    /// The runtime's stack source cannot provide a stack (it ran out of
    /// memory it owns, or refuses the stack size).
    #[error("the stack source cannot provide a thread stack: {0}")]
    StackSource(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The configuration's aspect cannot be set up (a
    /// [`TraceAspect`](crate::TraceAspect) whose file cannot be created).
    #[error("{0}")]
    Aspect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A worker could not be bound to processors ([`Runtime::bind_worker`](crate::Runtime::bind_worker)).
    #[error("cannot bind worker {worker} to processors {cpus:?}: {why}")]
    Bind {
        /// The worker.
        worker: usize,
        /// The processors asked for.
        cpus: Vec<usize>,
        /// Why not.
        why: String,
    },
    /// An environment variable (`CT_*`) has a value that cannot be used.
    #[error("{0}")]
    Env(#[from] ct_config::Error),
    /// A worker thread could not be started.
    #[error("cannot start worker thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
