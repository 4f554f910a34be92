//! Every environment variable the workspace reads, in one list ([`ALL`]).
//!
//! Each crate reads its variables through these descriptions, the README's
//! table lists the same names (a test checks it), and `menps env` prints
//! them with their values.

use crate::parse::Unit;
use crate::var::{Kind, Var};

const fn var(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    owner: &'static str,
    help: &'static str,
) -> Var {
    Var {
        name,
        kind,
        default,
        owner,
        help,
    }
}

const SIZE: Kind = Kind::Size { bare_unit: 1 };
const BOOL: Kind = Kind::Bool;
const fn count(min: u64, max: u64) -> Kind {
    Kind::Count { min, max }
}
const ANY_COUNT: Kind = count(0, u64::MAX);

// ct-worker

/// Worker OS threads of a runtime.
pub const CT_NUM_WORKERS: Var = var(
    "CT_NUM_WORKERS",
    count(1, u64::MAX),
    "available CPUs",
    "ct-worker",
    "worker OS threads of a runtime",
);
/// Usable stack of a user-level thread.
pub const CT_STACK_SIZE: Var = var(
    "CT_STACK_SIZE",
    SIZE,
    "128k",
    "ct-worker",
    "stack size of each user-level thread",
);
/// The file a tracing runtime writes its trace to.
pub const CT_TRACE: Var = var(
    "CT_TRACE",
    Kind::Text,
    "(no trace)",
    "ct-worker",
    "file a TraceConfig runtime writes its Chrome trace to",
);
/// Whether `membarrier(2)` is not used.
pub const CT_NO_MEMBARRIER: Var = var(
    "CT_NO_MEMBARRIER",
    BOOL,
    "0",
    "ct-worker",
    "true: full fences instead of membarrier(2)",
);

// menps-dsm: the launcher

/// Processes a self-relaunching program starts.
pub const MENPS_NPROCS: Var = var(
    "MENPS_NPROCS",
    count(1, 256),
    "1",
    "menps-dsm",
    "processes a self-relaunching program starts",
);
/// Backend of a job.
pub const MENPS_BACKEND: Var = var(
    "MENPS_BACKEND",
    Kind::Choice(&["shm", "mpi"]),
    "shm",
    "menps-dsm",
    "backend of a job the program or `menps run` starts",
);
/// Prefix output lines with the rank.
pub const MENPS_PREFIX_OUTPUT: Var = var(
    "MENPS_PREFIX_OUTPUT",
    BOOL,
    "0",
    "menps-dsm",
    "prefix output lines with [rank N]",
);
/// Time the others get after a process failed.
pub const MENPS_GRACE_MS: Var = var(
    "MENPS_GRACE_MS",
    Kind::Duration {
        bare: Some(Unit::Millis),
    },
    "2000",
    "menps-dsm",
    "time the others get to exit after a process failed",
);
/// Wall-clock limit of a job.
pub const MENPS_TIMEOUT_SECS: Var = var(
    "MENPS_TIMEOUT_SECS",
    Kind::Duration {
        bare: Some(Unit::Secs),
    },
    "(none)",
    "menps-dsm",
    "kill the whole job after this long (status 124)",
);
/// How long a wait for a peer lasts before it is reported.
pub const MENPS_WATCHDOG_SECS: Var = var(
    "MENPS_WATCHDOG_SECS",
    Kind::Duration {
        bare: Some(Unit::Secs),
    },
    "30",
    "menps-dsm",
    "report a wait for a peer longer than this (0: never)",
);
/// Whether a reported wait fails.
pub const MENPS_WATCHDOG_FAIL: Var = var(
    "MENPS_WATCHDOG_FAIL",
    BOOL,
    "0",
    "menps-dsm",
    "a wait the watchdog reports fails with Error::Stalled",
);
/// Shm message ring per ordered pair of processes.
pub const MENPS_RING_BYTES: Var = var(
    "MENPS_RING_BYTES",
    SIZE,
    "128k",
    "menps-dsm",
    "shm message ring per ordered pair (power of two)",
);
/// Shm collective scratch.
pub const MENPS_COLL_CHUNK_BYTES: Var = var(
    "MENPS_COLL_CHUNK_BYTES",
    SIZE,
    "64k",
    "menps-dsm",
    "shm collective scratch per process",
);
/// The shm communication barrier's algorithm.
pub const MENPS_SHM_BARRIER: Var = var(
    "MENPS_SHM_BARRIER",
    Kind::Choice(&["central", "dissemination", "auto"]),
    "auto",
    "menps-dsm",
    "shm barrier: one shared counter, or log2(N) rounds of pairwise signals",
);
/// The `mpirun` command of the mpi backend.
pub const MENPS_MPIRUN: Var = var(
    "MENPS_MPIRUN",
    Kind::Text,
    "mpirun",
    "menps-dsm",
    "the mpirun command a job of the mpi backend is started with",
);
/// The OpenMP library `menps run` preloads and `menps cc` links.
pub const MENPS_GOMP_LIB: Var = var(
    "MENPS_GOMP_LIB",
    Kind::Text,
    "libmenps_gomp.so next to menps",
    "menps-dsm (menps)",
    "the libmenps_gomp.so `menps run` preloads and `menps cc` links",
);

// menps-dsm: the DSM

/// Writer management.
pub const MENPS_DSM_WRITER: Var = var(
    "MENPS_DSM_WRITER",
    Kind::Choice(&["floating", "fixed"]),
    "floating",
    "menps-dsm",
    "writer management: floating home or fixed (block-cyclic) homes",
);
/// Invalidation method.
pub const MENPS_DSM_INVALIDATION: Var = var(
    "MENPS_DSM_INVALIDATION",
    Kind::Choice(&["hybrid", "timestamp", "directory"]),
    "hybrid",
    "menps-dsm",
    "how stale copies are found at acquires",
);
/// Fast release.
pub const MENPS_DSM_FAST_RELEASE: Var = var(
    "MENPS_DSM_FAST_RELEASE",
    BOOL,
    "1",
    "menps-dsm",
    "skip the global lock when a block has not migrated",
);
/// Fast read.
pub const MENPS_DSM_FAST_READ: Var = var(
    "MENPS_DSM_FAST_READ",
    BOOL,
    "0",
    "menps-dsm",
    "re-read an invalidated block from its write notice's writer",
);
/// Sequential prefetch window.
pub const MENPS_DSM_PREFETCH: Var = var(
    "MENPS_DSM_PREFETCH",
    SIZE,
    "256k",
    "menps-dsm",
    "bytes of blocks a read miss continuing a run of misses fetches ahead (0: off)",
);
/// Partial reads of blocks larger than a page.
pub const MENPS_DSM_PARTIAL_READ: Var = var(
    "MENPS_DSM_PARTIAL_READ",
    BOOL,
    "1",
    "menps-dsm",
    "a read miss that starts no sequential run fetches only the page it touched of a larger \
     block; a miss on another page of it fetches the whole block",
);
/// Dirty tracking of the application view by the kernel.
pub const MENPS_DSM_DIRTY_SCAN: Var = var(
    "MENPS_DSM_DIRTY_SCAN",
    BOOL,
    "1",
    "menps-dsm",
    "releases learn which blocks were written from the kernel's record of writes (Linux 6.7+ \
     userfaultfd asynchronous write protection) instead of comparing idle blocks with their twins",
);
/// The smallest write set a release fence asks the kernel about.
pub const MENPS_DSM_DIRTY_SCAN_MIN: Var = var(
    "MENPS_DSM_DIRTY_SCAN_MIN",
    SIZE,
    "1M",
    "menps-dsm",
    "a release fence asks the kernel which listed blocks were written only when they total at \
     least this many bytes; a smaller write set is compared (0: always ask)",
);
/// Acquires that refresh a hot block's stale copy in place.
pub const MENPS_DSM_REFRESH: Var = var(
    "MENPS_DSM_REFRESH",
    count(0, 255),
    "8",
    "menps-dsm",
    "acquires that fetch a stale copy of a block read again after each invalidation anew, \
     instead of dropping it, before it is dropped once to test it (0: off)",
);
/// Pinning of blocks the processes write in turn.
pub const MENPS_DSM_PIN_SHARED: Var = var(
    "MENPS_DSM_PIN_SHARED",
    BOOL,
    "1",
    "menps-dsm",
    "keep a block that processes write in turn writable, merging the others' changes in place",
);
/// Race detection while merging.
pub const MENPS_DSM_RACE_DETECTION: Var = var(
    "MENPS_DSM_RACE_DETECTION",
    BOOL,
    "1",
    "menps-dsm",
    "report write-write races found while merging",
);
/// Per-process protocol counters printed when the DSM ends.
pub const MENPS_STATS: Var = var(
    "MENPS_STATS",
    BOOL,
    "0",
    "menps-dsm",
    "print each process's protocol counters and times on stderr when its DSM ends",
);
/// What a detected race does.
pub const MENPS_DSM_ON_RACE: Var = var(
    "MENPS_DSM_ON_RACE",
    Kind::Choice(&["stop", "report"]),
    "stop",
    "menps-dsm",
    "what a detected write-write race does",
);
/// Default block size of segments.
pub const MENPS_DSM_BLOCK_SIZE: Var = var(
    "MENPS_DSM_BLOCK_SIZE",
    SIZE,
    "32k",
    "menps-dsm",
    "default block size of segments (power of two, 4k..1M)",
);
/// Write notices a signature keeps.
pub const MENPS_DSM_WN_LIST: Var = var(
    "MENPS_DSM_WN_LIST",
    ANY_COUNT,
    "1024 (16384 under menps-omp)",
    "menps-dsm",
    "write notices a signature keeps before truncating",
);
/// Logical lease.
pub const MENPS_DSM_LEASE: Var = var(
    "MENPS_DSM_LEASE",
    count(1, u64::MAX),
    "10",
    "menps-dsm",
    "logical lease added to a block's read timestamp",
);
/// Size of the DSM heap.
pub const MENPS_DSM_HEAP_SIZE: Var = var(
    "MENPS_DSM_HEAP_SIZE",
    SIZE,
    "1G",
    "menps-dsm",
    "size of the DSM heap (sparse)",
);
/// Coherence block of the heap.
pub const MENPS_DSM_HEAP_BLOCK_SIZE: Var = var(
    "MENPS_DSM_HEAP_BLOCK_SIZE",
    SIZE,
    "4k",
    "menps-dsm",
    "coherence block of the DSM heap",
);
/// Number of DSM mutexes.
pub const MENPS_DSM_MUTEXES: Var = var(
    "MENPS_DSM_MUTEXES",
    count(1, 1 << 16),
    "1024",
    "menps-dsm",
    "DSM mutexes that can exist at once",
);
/// Size of a DSM call stack.
pub const MENPS_DSM_STACK_SIZE: Var = var(
    "MENPS_DSM_STACK_SIZE",
    SIZE,
    "128k",
    "menps-dsm",
    "size of a DSM call stack (power of two, 4k..1M)",
);
/// Call stacks per process.
pub const MENPS_DSM_STACKS: Var = var(
    "MENPS_DSM_STACKS",
    ANY_COUNT,
    "32",
    "menps-dsm",
    "call stacks each process can have at once (0: none)",
);

// menps-dsm: the network model (`com::netmodel`)

/// One-way latency the network model adds to every communication.
pub const MENPS_NET_LATENCY: Var = var(
    "MENPS_NET_LATENCY",
    Kind::Duration { bare: None },
    "(none: no model)",
    "menps-dsm",
    "model a network: one-way latency added to every remote operation (25us: Ethernet, 2us: InfiniBand)",
);
/// Link rate the network model caps transfers at.
pub const MENPS_NET_BANDWIDTH: Var = var(
    "MENPS_NET_BANDWIDTH",
    Kind::Rate,
    "(none: no cap)",
    "menps-dsm",
    "model a network: link rate every transfer is capped at (10Gbit, 100Gbit)",
);

// menps-dsm: the mpi backend

/// Route MPI calls through the offloader.
pub const MENPS_MPI_OFFLOAD: Var = var(
    "MENPS_MPI_OFFLOAD",
    BOOL,
    "auto",
    "menps-dsm (mpi)",
    "route MPI calls through ct-delegate's offloader",
);
/// Period of the progress thread.
pub const MENPS_MPI_PROGRESS_US: Var = var(
    "MENPS_MPI_PROGRESS_US",
    Kind::Duration {
        bare: Some(Unit::Micros),
    },
    "1000",
    "menps-dsm (mpi)",
    "period of the MPI progress thread (0: no thread)",
);
/// How windows are made.
pub const MENPS_MPI_WINDOWS: Var = var(
    "MENPS_MPI_WINDOWS",
    Kind::Choice(&["shared", "create", "created", "auto"]),
    "auto",
    "menps-dsm (mpi)",
    "how MPI windows are made",
);
/// How RMA reaches other processes on MPI.
pub const MENPS_MPI_RMA: Var = var(
    "MENPS_MPI_RMA",
    Kind::Choice(&["onesided", "messages", "auto"]),
    "auto",
    "menps-dsm (mpi)",
    "RMA as MPI one-sided operations, or as requests the target serves",
);
/// Check `OMPI_MCA_osc`.
pub const MENPS_MPI_OSC_CHECK: Var = var(
    "MENPS_MPI_OSC_CHECK",
    BOOL,
    "1",
    "menps-dsm (mpi)",
    "refuse OMPI_MCA_osc values known to crash or fail",
);
/// Allow re-executing before `MPI_Init`.
pub const MENPS_MPI_REEXEC: Var = var(
    "MENPS_MPI_REEXEC",
    BOOL,
    "1",
    "menps-dsm (mpi)",
    "allow re-executing the process before MPI_Init",
);
/// OpenMPI's one-sided component selection.
pub const OMPI_MCA_OSC: Var = var(
    "OMPI_MCA_osc",
    Kind::Text,
    "sm,ucx (set by the backend)",
    "menps-dsm (mpi)",
    "OpenMPI's one-sided components",
);

// menps-dsm: the verbs backend

/// RDMA adapter.
pub const MENPS_VERBS_DEVICE: Var = var(
    "MENPS_VERBS_DEVICE",
    Kind::Text,
    "the first adapter",
    "menps-dsm (verbs)",
    "RDMA adapter name",
);
/// Port of the adapter.
pub const MENPS_VERBS_PORT: Var = var(
    "MENPS_VERBS_PORT",
    count(1, 255),
    "1",
    "menps-dsm (verbs)",
    "port number of the adapter",
);
/// GID table index.
pub const MENPS_VERBS_GID_INDEX: Var = var(
    "MENPS_VERBS_GID_INDEX",
    count(0, 255),
    "0",
    "menps-dsm (verbs)",
    "GID table index",
);

// menps-omp and menps-gomp: OpenMP's variables

/// Team size.
pub const OMP_NUM_THREADS: Var = var(
    "OMP_NUM_THREADS",
    Kind::Custom("a positive whole number, or a comma-separated list of them (the first counts)"),
    "processes x processors per process",
    "menps-omp",
    "threads of a team, all processes together",
);
/// Schedule of `runtime` loops.
pub const OMP_SCHEDULE: Var = var(
    "OMP_SCHEDULE",
    Kind::Custom(
        "static, dynamic, guided or auto, optionally with a chunk (dynamic,4), \
         optionally prefixed by monotonic: or nonmonotonic:",
    ),
    "static",
    "menps-omp",
    "schedule of runtime-scheduled loops",
);
/// Stack of a team thread.
pub const OMP_STACKSIZE: Var = var(
    "OMP_STACKSIZE",
    Kind::Size { bare_unit: 1024 },
    "128K",
    "menps-omp",
    "call stack of a team thread (at most 1M)",
);
/// How waiting threads wait.
pub const OMP_WAIT_POLICY: Var = var(
    "OMP_WAIT_POLICY",
    Kind::Choice(&["active", "passive"]),
    "(between the two)",
    "menps-omp",
    "active: waiting threads yield longer, idle workers stay awake 1 s; passive: they park soon",
);
/// How team workers are bound to processors.
pub const OMP_PROC_BIND: Var = var(
    "OMP_PROC_BIND",
    Kind::Custom("false, true, primary (or master), close or spread; a list's first item is used"),
    "false (true when OMP_PLACES is set)",
    "menps-omp",
    "binds each team worker to a place of OMP_PLACES (close, spread, primary)",
);
/// The places workers are bound to.
pub const OMP_PLACES: Var = var(
    "OMP_PLACES",
    Kind::Custom(
        "threads, cores or sockets, optionally with a count (cores(4)), or places listed          in braces ({0,1},{2:2},{4:2:2})",
    ),
    "threads",
    "menps-omp",
    "the places OMP_PROC_BIND binds to (of the processors the process may use)",
);
/// The `dyn-var` ICV.
pub const OMP_DYNAMIC: Var = var(
    "OMP_DYNAMIC",
    BOOL,
    "false",
    "menps-gomp",
    "the dyn-var ICV (recorded, no effect)",
);
/// The `cancel-var` ICV.
pub const OMP_CANCELLATION: Var = var(
    "OMP_CANCELLATION",
    BOOL,
    "false",
    "menps-gomp",
    "true: a cancel construct aborts (cancellation is not supported)",
);
/// Whose output appears.
pub const MENPS_OMP_OUTPUT: Var = var(
    "MENPS_OMP_OUTPUT",
    Kind::Choice(&["threads", "rank0", "all"]),
    "threads",
    "menps-gomp",
    "whose standard output appears",
);
/// Whether the library takes over `main`.
pub const MENPS_GOMP: Var = var(
    "MENPS_GOMP",
    BOOL,
    "1",
    "menps-gomp",
    "false: the library does not take over main",
);

/// Every variable, grouped by the crate that reads it.
pub const ALL: &[Var] = &[
    CT_NUM_WORKERS,
    CT_STACK_SIZE,
    CT_TRACE,
    CT_NO_MEMBARRIER,
    MENPS_NPROCS,
    MENPS_BACKEND,
    MENPS_PREFIX_OUTPUT,
    MENPS_GRACE_MS,
    MENPS_TIMEOUT_SECS,
    MENPS_WATCHDOG_SECS,
    MENPS_WATCHDOG_FAIL,
    MENPS_RING_BYTES,
    MENPS_COLL_CHUNK_BYTES,
    MENPS_SHM_BARRIER,
    MENPS_MPIRUN,
    MENPS_GOMP_LIB,
    MENPS_DSM_WRITER,
    MENPS_DSM_INVALIDATION,
    MENPS_DSM_FAST_RELEASE,
    MENPS_DSM_FAST_READ,
    MENPS_DSM_PREFETCH,
    MENPS_DSM_PARTIAL_READ,
    MENPS_DSM_DIRTY_SCAN,
    MENPS_DSM_DIRTY_SCAN_MIN,
    MENPS_DSM_REFRESH,
    MENPS_DSM_PIN_SHARED,
    MENPS_DSM_RACE_DETECTION,
    MENPS_STATS,
    MENPS_DSM_ON_RACE,
    MENPS_DSM_BLOCK_SIZE,
    MENPS_DSM_WN_LIST,
    MENPS_DSM_LEASE,
    MENPS_DSM_HEAP_SIZE,
    MENPS_DSM_HEAP_BLOCK_SIZE,
    MENPS_DSM_MUTEXES,
    MENPS_DSM_STACK_SIZE,
    MENPS_DSM_STACKS,
    MENPS_NET_LATENCY,
    MENPS_NET_BANDWIDTH,
    MENPS_MPI_OFFLOAD,
    MENPS_MPI_PROGRESS_US,
    MENPS_MPI_WINDOWS,
    MENPS_MPI_RMA,
    MENPS_MPI_OSC_CHECK,
    MENPS_MPI_REEXEC,
    OMPI_MCA_OSC,
    MENPS_VERBS_DEVICE,
    MENPS_VERBS_PORT,
    MENPS_VERBS_GID_INDEX,
    OMP_NUM_THREADS,
    OMP_SCHEDULE,
    OMP_STACKSIZE,
    OMP_WAIT_POLICY,
    OMP_PROC_BIND,
    OMP_PLACES,
    OMP_DYNAMIC,
    OMP_CANCELLATION,
    MENPS_OMP_OUTPUT,
    MENPS_GOMP,
];

/// The variable named `name`, if the workspace reads it.
pub fn find(name: &str) -> Option<&'static Var> {
    ALL.iter().find(|v| v.name == name)
}
