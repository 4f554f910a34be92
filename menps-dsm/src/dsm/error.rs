//! The DSM's error type.

use crate::com;

/// A write-write data race found while merging a block: two processes
/// changed the same byte since the version they both started from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceReport {
    /// Address (in the DSM, the same in every process) of the first racing
    /// byte.
    pub addr: usize,
    /// First address of the block.
    pub block: usize,
    /// Segment of the block.
    pub segment: usize,
    /// The aligned 8-byte word around `addr` as the base version had it.
    pub base: u64,
    /// The word as this process wrote it.
    pub local: u64,
    /// The word as process `remote_rank` wrote it.
    pub remote: u64,
    /// This process.
    pub local_rank: usize,
    /// The process whose version was merged with ours.
    pub remote_rank: usize,
    /// Where the address lies, as far as known (a symbol, a heap object, a
    /// call stack; see [`crate::dsm::race`]); empty if unknown.
    pub what: String,
}

impl core::fmt::Display for RaceReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let word = self.addr & !7;
        write!(
            f,
            "write-write data race at {:#x} ({}block {:#x} of segment {}): \
             process {} wrote word {:#x} = {:#018x} and process {} wrote {:#018x} \
             (both changed it from {:#018x}); the program is not data-race-free",
            self.addr,
            if self.what.is_empty() {
                String::new()
            } else {
                format!("{}; ", self.what)
            },
            self.block,
            self.segment,
            self.local_rank,
            word,
            self.local,
            self.remote_rank,
            self.remote,
            self.base
        )
    }
}

/// Everything that can go wrong in the DSM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DsmError {
    /// The communication layer failed (a peer died, a collective mismatch…).
    #[error(transparent)]
    Com(#[from] com::Error),
    /// A write-write data race was detected; the DSM stops in this state.
    #[error("{0} (with MENPS_DSM_ON_RACE=report, each race is reported once and the run goes on)")]
    DataRace(Box<RaceReport>),
    /// No DSM runs in this process (the process-wide handle, [`super::process`],
    /// was used before [`Dsm::new`](super::Dsm::new) or after the DSM ended).
    #[error(
        "no DSM is running in this process (used before the DSM started or after it was \
         finalized)"
    )]
    NotRunning,
    /// Invalid configuration (builder values or `MENPS_DSM_*` variables).
    #[error("bad DSM configuration: {0}")]
    Config(String),
    /// Invalid arguments (sizes, alignment, pointers outside the DSM…).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The DSM heap or a fixed-size table is exhausted.
    #[error("out of DSM memory: {0}")]
    OutOfMemory(String),
    /// The fixed address range of the DSM could not be reserved.
    #[error("cannot set up the DSM address space: {0}")]
    AddressSpace(String),
    /// The DSM was used in a state that does not allow it (not initialised,
    /// initialised twice, a previous failure…).
    #[error("DSM misuse: {0}")]
    Misuse(String),
}

impl DsmError {
    /// Whether this only says that another process of the job died first
    /// ([`com::Error::PeerDied`]): that process's failure is the cause.
    pub fn is_peer_death(&self) -> bool {
        matches!(self, DsmError::Com(e) if e.is_peer_death())
    }
}

impl From<RaceReport> for DsmError {
    fn from(r: RaceReport) -> Self {
        DsmError::DataRace(Box::new(r))
    }
}

/// Result with the DSM's error.
pub type DsmResult<T> = Result<T, DsmError>;
