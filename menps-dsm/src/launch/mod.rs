//! Starting and joining jobs.
//!
//! A *job* is N processes of one program that share a control memory (the
//! shm backend's [`ShmCom`]). A *launcher* creates it, starts the
//! processes, watches them and exits with their combined status:
//!
//! - **In the program itself**: [`init_or_relaunch`] (or [`Builder`]). Run
//!   normally, the program becomes the launcher: it re-executes
//!   `/proc/self/exe` N times with the same arguments, waits for them and
//!   exits with their status — so `cargo run --example hello_shm` starts a
//!   multi-process job by itself. In each started process the same call
//!   returns the communicator.
//! - **The `menps` binary**: `menps run -n 4 [--prefix-output] -- ./prog args`;
//!   the program calls [`init`] (or [`init_or_relaunch`], which then joins).
//!   `menps run --backend mpi` starts the job with `mpirun` instead.
//! - **Under `mpirun`** (detected by [`under_mpirun`]) the same calls join
//!   the MPI job instead of relaunching, when the program asks for a
//!   communicator that can be MPI ([`AnyCom`](crate::com::AnyCom) or
//!   `MpiCom`, cargo feature `mpi`).
//!
//! What the calls return is chosen by the caller's type ([`JoinJob`]):
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! use menps_dsm::com::AnyCom;
//! use ct_worker::OsThreads;
//! // Runs on shm from `cargo run`, on MPI under `mpirun` (feature `mpi`):
//! let com: AnyCom<OsThreads> = menps_dsm::launch::init_or_relaunch(4)?;
//! # assert!(menps_dsm::com::Comm::rank(&com) < menps_dsm::com::Comm::size(&com));
//! # Ok::<(), menps_dsm::com::Error>(())
//! ```
//!
//! or `let com: ShmCom<OsThreads> = …` for the shm backend only (which is an
//! error under `mpirun`).
//!
//! Every started process gets `personality(ADDR_NO_RANDOMIZE)` before it
//! executes, so all ranks have identical address-space layouts (code,
//! globals, main stack) — the DSM needs identical virtual addresses. A
//! rank clears the flag once it has joined, so the programs it executes
//! get randomisation back. Each
//! also gets `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the launcher.
//!
//! # Failures
//!
//! When a process ends with a non-zero status or a signal, the launcher
//! records it in the control memory and wakes every waiting process: their
//! blocking calls return [`Error::PeerDied`] naming it, within milliseconds.
//! After a grace period (`MENPS_GRACE_MS`, default 2 s) the launcher kills the
//! processes that are still running, and exits with the failed process's
//! status (`128 + signal` for a signal). A process that exits with status 0
//! while others still wait for it makes their calls return
//! [`Error::PeerExited`]. Windows and the control memory are `memfd`s without
//! names, so nothing is left behind however the job ends.
//!
//! A process reports its failure with [`report_failure`]: one line per
//! failure, from the process that failed (see there). The `menps` binary
//! names every failed process (`menps: rank N (pid P) exited with status
//! S; …`); a program that started its own job names, under its own name,
//! only a process that ended without reporting (a panic, a crash).
//!
//! Under `mpirun`, MPI's rules apply instead: a process that crashes, is
//! killed or exits without finalising makes `mpirun` abort the whole job
//! (nobody hangs, but there is no `PeerDied`); see the `mpi` backend's
//! documentation (`com::mpi`).
//!
//! # Environment variables
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `MENPS_NPROCS` | number of processes [`init_or_relaunch`] starts (wins over its argument, a default; not over [`Builder::nprocs`]) | the program's choice |
//! | `MENPS_BACKEND` | communication backend of a job the launcher starts: `shm`, or `mpi` (the launcher runs `mpirun`) | `shm` |
//! | `MENPS_PREFIX_OUTPUT` | `1`: prefix every output line with `[rank N] ` | `0` |
//! | `MENPS_GRACE_MS` | time the other processes get to exit after one failed, before they are killed | `2000` |
//! | `MENPS_TIMEOUT_SECS` | kill the whole job after this many seconds (exit status 124) | none |
//! | `MENPS_WATCHDOG_SECS` | a process waiting this long for a peer says which operation and which peers (on `shm`, naming stopped ones); `0`: never | `30` |
//! | `MENPS_WATCHDOG_FAIL` | `1`: such a wait fails with `Error::Stalled` instead of going on | `0` |
//! | `MENPS_RING_BYTES` | p2p ring per ordered pair of processes (power of two ≥ 128 KiB) | `131072` |
//! | `MENPS_COLL_CHUNK_BYTES` | collective scratch per process and step | `65536` |
//! | `MENPS_SHM_BARRIER` | the shm barrier: `central` (one shared counter: each process signals and waits once, best when processes outnumber processors), `dissemination` (log2 N rounds of pairwise signals, best for many processes on as many processors) or `auto` (central up to 8 processes or when oversubscribed); read by the launcher, so every process uses the same | `auto` |
//! | `MENPS_NET_LATENCY`, `MENPS_NET_BANDWIDTH` | a process joining as [`AnyCom`](crate::com::AnyCom) runs its backend inside the network model ([`crate::com::netmodel`]) of this one-way latency (`25us`) and link rate (`10Gbit`) | none |
//! | `MENPS_MPIRUN` | `mpirun` command of `--backend mpi` | `mpirun` |
//! | `OMPI_MCA_osc` | (mpi) OpenMPI's one-sided component; values selecting `rdma` or `pt2pt` are refused | set to `sm,ucx` when unset |
//! | `MENPS_MPI_OFFLOAD` | (mpi) `1`: RMA through `ct-delegate`'s offloading; `0`: direct MPI calls | `1` for user-level threads in a job across machines, else `0` |
//! | `MENPS_MPI_PROGRESS_US` | (mpi) interval of the progress thread in µs, `0`: none | `1000` |
//! | `MENPS_MPI_OSC_CHECK` | (mpi) `0`: accept any `OMPI_MCA_osc` | `1` |
//! | `MENPS_MPI_REEXEC` | (mpi) `0`: never re-execute before `MPI_Init` (then `OMPI_MCA_osc` must be set) | `1` |
//!
//! Read under `mpirun` to detect it: `OMPI_COMM_WORLD_SIZE` (OpenMPI),
//! `PMI_SIZE` (MPICH), `PMIX_RANK` (PMIx).
//!
//! Set by the launcher in each process (read by [`init`]):
//!
//! | variable | meaning |
//! |---|---|
//! | `MENPS_RANK` | rank of the process |
//! | `MENPS_SIZE` | number of processes |
//! | `MENPS_BACKEND` | `shm` |
//! | `MENPS_CONTROL_FD` | inherited descriptor of the control memory |
//! | `MENPS_PEER_FDS` | inherited socket descriptors for passing window descriptors (`rank:fd` list) |
//! | `MENPS_LAUNCHER_PID` | pid of the launcher |
//! | `MENPS_JOB_DEADLINE_NS` | the job's time limit (`MENPS_TIMEOUT_SECS`) as `CLOCK_MONOTONIC` nanoseconds: every process ends itself with status 124 then, even when the launcher cannot act |
//!
//! Values given to [`Builder`] win over the `MENPS_*` variables, which win
//! over the defaults (the workspace's one precedence; before, the variables
//! won). A program that wants the shell to decide gives defaults instead:
//! [`Builder::default_nprocs`], or [`init_or_relaunch`]'s argument. The
//! variables are read by `ct-config`'s parser: sizes such as `128k`,
//! durations such as `2s` (a bare number is in the unit the name ends
//! with), booleans `1`/`0`/`true`/`false`/`yes`/`no`/`on`/`off`; an empty or
//! malformed value is an error naming the variable.

mod job;
pub(crate) mod output;

use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ct_config::vars;
use ct_worker::UltItf;

use crate::com::shm::control::{self, Control, MAX_PROCS};
use crate::com::{Error, Result, ShmCom};
use crate::sys;

pub use job::{run_job, run_mpi_job};

/// Names of the environment variables (see the [module docs](self)).
pub mod env {
    /// Number of processes to start.
    pub const NPROCS: &str = ct_config::vars::MENPS_NPROCS.name;
    /// Backend name.
    pub const BACKEND: &str = ct_config::vars::MENPS_BACKEND.name;
    /// Prefix output lines with the rank.
    pub const PREFIX_OUTPUT: &str = ct_config::vars::MENPS_PREFIX_OUTPUT.name;
    /// Grace period in milliseconds before surviving processes are killed.
    pub const GRACE_MS: &str = ct_config::vars::MENPS_GRACE_MS.name;
    /// Wall-clock limit of the job in seconds.
    pub const TIMEOUT_SECS: &str = ct_config::vars::MENPS_TIMEOUT_SECS.name;
    /// P2p ring size per ordered pair.
    pub const RING_BYTES: &str = ct_config::vars::MENPS_RING_BYTES.name;
    /// Collective chunk size.
    pub const COLL_CHUNK_BYTES: &str = ct_config::vars::MENPS_COLL_CHUNK_BYTES.name;
    /// Rank (set by the launcher).
    pub const RANK: &str = "MENPS_RANK";
    /// Process count (set by the launcher).
    pub const SIZE: &str = "MENPS_SIZE";
    /// Control memory descriptor (set by the launcher).
    pub const CONTROL_FD: &str = "MENPS_CONTROL_FD";
    /// Socket descriptors (set by the launcher).
    pub const PEER_FDS: &str = "MENPS_PEER_FDS";
    /// Launcher pid (set by the launcher).
    pub const LAUNCHER_PID: &str = "MENPS_LAUNCHER_PID";
    /// The `mpirun` command of `--backend mpi`.
    pub const MPIRUN: &str = ct_config::vars::MENPS_MPIRUN.name;
    /// Seconds a process waits for a peer before it says so (0: never).
    pub const WATCHDOG_SECS: &str = ct_config::vars::MENPS_WATCHDOG_SECS.name;
    /// `1`: a wait the watchdog reports fails (`Error::Stalled`) instead of
    /// going on.
    pub const WATCHDOG_FAIL: &str = ct_config::vars::MENPS_WATCHDOG_FAIL.name;
    /// The job's time limit, as nanoseconds of `CLOCK_MONOTONIC` (set by the
    /// launcher when `MENPS_TIMEOUT_SECS` is): every process ends itself
    /// with status 124 then, even if the launcher cannot act.
    pub const JOB_DEADLINE_NS: &str = "MENPS_JOB_DEADLINE_NS";
    /// Variables whose presence means "started by an MPI launcher".
    pub const MPIRUN_MARKERS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];
}

/// Communication backend of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Backend {
    /// Processes on one machine, shared memory ([`ShmCom`]).
    #[default]
    Shm,
    /// MPI: the launcher starts the job with `mpirun` (`MENPS_MPIRUN`); the
    /// program must be built with the `mpi` feature and join as `AnyCom` or
    /// `MpiCom`.
    Mpi,
}

impl std::str::FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "shm" => Ok(Backend::Shm),
            "mpi" => Ok(Backend::Mpi),
            other => Err(Error::BadConfig(format!(
                "unknown backend {other:?}: \"shm\" or \"mpi\" (verbs runs over one of them: \
                 VerbsCom::new)"
            ))),
        }
    }
}

/// Settings of a job, as the launcher uses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConfig {
    /// Number of processes.
    pub nprocs: usize,
    /// Backend.
    pub backend: Backend,
    /// Prefix each output line with `[rank N] `.
    pub prefix_output: bool,
    /// Time the other processes get to exit after one failed.
    pub grace: Duration,
    /// Wall-clock limit of the job.
    pub timeout: Option<Duration>,
    /// P2p ring size per ordered pair.
    pub ring_bytes: usize,
    /// Collective chunk size.
    pub coll_chunk_bytes: usize,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            nprocs: 1,
            backend: Backend::Shm,
            prefix_output: false,
            grace: Duration::from_millis(2000),
            timeout: None,
            ring_bytes: control::DEFAULT_RING_BYTES,
            coll_chunk_bytes: control::DEFAULT_CHUNK_BYTES,
        }
    }
}

/// A `ct-config` error (a malformed or empty variable) as this module's.
fn bad_var(e: ct_config::Error) -> Error {
    Error::BadConfig(e.to_string())
}

/// A variable the launcher sets for the processes it starts (not user
/// configuration, so not in `ct_config::vars`): `None` if unset.
fn launcher_var<T>(name: &'static str, parse: impl FnOnce(&str) -> Option<T>) -> Result<Option<T>> {
    let var = ct_config::Var {
        name,
        kind: ct_config::Kind::Custom("a value set by the menps launcher"),
        default: "",
        owner: "menps-dsm",
        help: "",
    };
    var.parse_with(parse).map_err(bad_var)
}

/// Default of [`env::WATCHDOG_SECS`].
const WATCHDOG_DEFAULT: Duration = Duration::from_secs(30);

/// How long a process of a shm job waits for a peer before it reports the
/// wait (once per wait): [`env::WATCHDOG_SECS`], default 30 s; `None` when
/// set to 0. Read once per process; a bad value is reported once and the
/// default kept (the wait itself must not fail on it).
pub(crate) fn watchdog_period() -> Option<Duration> {
    static PERIOD: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *PERIOD.get_or_init(|| match vars::MENPS_WATCHDOG_SECS.duration() {
        Ok(None) => Some(WATCHDOG_DEFAULT),
        Ok(Some(Duration::ZERO)) => None,
        Ok(Some(d)) => Some(d),
        Err(e) => {
            eprintln!("menps: {e}; using {} s", WATCHDOG_DEFAULT.as_secs());
            Some(WATCHDOG_DEFAULT)
        }
    })
}

/// Whether a wait the watchdog reports fails ([`env::WATCHDOG_FAIL`]);
/// read once per process, a bad value reported once and ignored.
pub(crate) fn watchdog_fails() -> bool {
    static FAIL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FAIL.get_or_init(|| match vars::MENPS_WATCHDOG_FAIL.flag() {
        Ok(v) => v.unwrap_or(false),
        Err(e) => {
            eprintln!("menps: {e}; the watchdog only reports");
            false
        }
    })
}

impl JobConfig {
    /// The defaults with the `MENPS_*` variables applied.
    pub fn from_env() -> Result<Self> {
        Builder::new().config_unchecked()
    }

    /// The `MENPS_*` variables applied over `self`, whose values serve as
    /// the defaults (a launcher applies its command-line options after
    /// this, so that they win).
    pub fn with_env_overrides(self) -> Result<Self> {
        Builder {
            base: self,
            ..Builder::default()
        }
        .config_unchecked()
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.nprocs == 0 || self.nprocs > MAX_PROCS {
            return Err(Error::BadConfig(format!(
                "process count {} is out of range 1..={MAX_PROCS} (set it with -n or {})",
                self.nprocs,
                env::NPROCS
            )));
        }
        control::Layout::new(self.nprocs, self.ring_bytes, self.coll_chunk_bytes).map(drop)
    }
}

/// The program a launcher starts N times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Path to execute.
    pub path: OsString,
    /// `argv[0]` to pass (default: `path`).
    pub arg0: Option<OsString>,
    /// Arguments after `argv[0]`.
    pub args: Vec<OsString>,
}

impl Program {
    /// The path, with `/proc/self/exe` resolved to the executable it names
    /// (for handing the program to another program, such as `mpirun`, in
    /// whose processes `/proc/self/exe` is something else).
    pub fn resolved_path(&self) -> OsString {
        if self.path == "/proc/self/exe"
            && let Ok(p) = std::fs::read_link("/proc/self/exe")
        {
            return p.into_os_string();
        }
        self.path.clone()
    }

    /// The running program itself (`/proc/self/exe`), with this process's
    /// `argv`.
    pub fn current() -> Self {
        let mut argv = std::env::args_os();
        let arg0 = argv.next();
        Program {
            path: "/proc/self/exe".into(),
            arg0,
            args: argv.collect(),
        }
    }
}

/// Configures [`Builder::init_or_relaunch`]. A value given here wins over
/// its `MENPS_*` variable, which wins over the default.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    base: JobConfig,
    nprocs: Option<usize>,
    prefix_output: Option<bool>,
    grace: Option<Duration>,
    timeout: Option<Duration>,
    ring_bytes: Option<usize>,
    coll_chunk_bytes: Option<usize>,
}

impl Builder {
    /// Default settings (one process unless `MENPS_NPROCS` says otherwise).
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of processes (wins over `MENPS_NPROCS`).
    pub fn nprocs(mut self, n: usize) -> Self {
        self.nprocs = Some(n);
        self
    }

    /// Default number of processes: `MENPS_NPROCS` wins over it (for
    /// programs whose process count is a default, not a requirement).
    pub fn default_nprocs(mut self, n: usize) -> Self {
        self.base.nprocs = n;
        self
    }

    /// Prefix output lines with the rank (wins over `MENPS_PREFIX_OUTPUT`).
    pub fn prefix_output(mut self, on: bool) -> Self {
        self.prefix_output = Some(on);
        self
    }

    /// Grace period after a failure before the others are killed (wins over
    /// `MENPS_GRACE_MS`).
    pub fn grace(mut self, d: Duration) -> Self {
        self.grace = Some(d);
        self
    }

    /// Wall-clock limit of the job (wins over `MENPS_TIMEOUT_SECS`).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// P2p ring size per ordered pair (power of two ≥ 128 KiB; wins over
    /// `MENPS_RING_BYTES`).
    pub fn ring_bytes(mut self, b: usize) -> Self {
        self.ring_bytes = Some(b);
        self
    }

    /// Collective chunk size (wins over `MENPS_COLL_CHUNK_BYTES`).
    pub fn coll_chunk_bytes(mut self, b: usize) -> Self {
        self.coll_chunk_bytes = Some(b);
        self
    }

    /// The settings: builder values, else the `MENPS_*` variables, else the
    /// defaults; checked.
    pub fn config(&self) -> Result<JobConfig> {
        let c = self.config_unchecked()?;
        c.validate()?;
        Ok(c)
    }

    fn config_unchecked(&self) -> Result<JobConfig> {
        let b = &self.base;
        let backend = match vars::MENPS_BACKEND.choice().map_err(bad_var)? {
            None => b.backend,
            Some(name) => name.parse()?,
        };
        let timeout = match self.timeout {
            Some(t) => Some(t),
            None => match vars::MENPS_TIMEOUT_SECS.duration().map_err(bad_var)? {
                Some(Duration::ZERO) => {
                    return Err(Error::BadConfig(format!(
                        "{}=0: the time limit must be positive (unset it for none)",
                        env::TIMEOUT_SECS
                    )));
                }
                Some(t) => Some(t),
                None => b.timeout,
            },
        };
        Ok(JobConfig {
            nprocs: ct_config::pick(
                self.nprocs,
                || vars::MENPS_NPROCS.count_usize(),
                || b.nprocs,
            )
            .map_err(bad_var)?
            .0,
            backend,
            prefix_output: ct_config::pick(
                self.prefix_output,
                || vars::MENPS_PREFIX_OUTPUT.flag(),
                || b.prefix_output,
            )
            .map_err(bad_var)?
            .0,
            grace: ct_config::pick(self.grace, || vars::MENPS_GRACE_MS.duration(), || b.grace)
                .map_err(bad_var)?
                .0,
            timeout,
            ring_bytes: ct_config::pick(
                self.ring_bytes,
                || vars::MENPS_RING_BYTES.size(),
                || b.ring_bytes,
            )
            .map_err(bad_var)?
            .0,
            coll_chunk_bytes: ct_config::pick(
                self.coll_chunk_bytes,
                || vars::MENPS_COLL_CHUNK_BYTES.size(),
                || b.coll_chunk_bytes,
            )
            .map_err(bad_var)?
            .0,
        })
    }

    /// In a process of a job (started by a menps launcher, or by `mpirun`
    /// when `C` can be MPI): joins it and returns the communicator `C`.
    /// Otherwise: becomes the launcher of a new job running this program,
    /// and exits the process with the job's status when it ends (it never
    /// returns `Ok` then). Errors: bad settings, failure to start, a
    /// communicator type that cannot join this kind of job.
    pub fn init_or_relaunch<C: JoinJob>(self) -> Result<C> {
        if in_job() || under_mpirun() || !C::RELAUNCHABLE {
            return C::join_job();
        }
        let config = self.config()?;
        let program = Program::current();
        let code = job::run_job_as(&config, &program, &job::Launcher::program(&program))?;
        std::process::exit(code)
    }
}

/// [`Builder::init_or_relaunch`] with `nprocs` processes by default
/// (`MENPS_NPROCS` wins over it: [`Builder::default_nprocs`]) and default
/// settings. The caller's type picks
/// the communicator (see [`JoinJob`]):
///
/// ```
/// # // SAFETY: the first statement of a single-threaded program; a hung job
/// # // is killed after 120 s (this is a test).
/// # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
/// let com: menps_dsm::com::AnyCom<ct_worker::OsThreads> =
///     menps_dsm::launch::init_or_relaunch(4)?;
/// assert!(menps_dsm::launch::in_job());
/// # Ok::<(), menps_dsm::com::Error>(())
/// ```
pub fn init_or_relaunch<C: JoinJob>(nprocs: usize) -> Result<C> {
    Builder::new().default_nprocs(nprocs).init_or_relaunch()
}

/// A communicator that a process of a job can get by joining it: what
/// [`init`] and [`init_or_relaunch`] return.
///
/// | type | menps launcher (shm job) | under `mpirun` |
/// |---|---|---|
/// | [`ShmCom`] | joins | error (asks for `AnyCom`) |
/// | [`AnyCom`](crate::com::AnyCom) | joins (`AnyCom::Shm`) | joins (`AnyCom::Mpi`, feature `mpi`; otherwise an error naming the feature) |
/// | `MpiCom` (feature `mpi`) | error | joins |
pub trait JoinJob: Sized {
    /// Whether [`init_or_relaunch`] may start a shm job of this program when
    /// the process is not in a job yet.
    const RELAUNCHABLE: bool;
    /// Joins the job this process was started in.
    fn join_job() -> Result<Self>;
}

fn mpirun_without_mpi_support(what: &str) -> Error {
    Error::BadConfig(format!(
        "this process was started by mpirun, but {what}; build with the `mpi` cargo feature \
         and join as AnyCom (or MpiCom), or start the program with `menps run -n N -- prog` \
         (or plain `cargo run`) for the shm backend"
    ))
}

impl<U: UltItf> JoinJob for ShmCom<U> {
    const RELAUNCHABLE: bool = true;
    fn join_job() -> Result<Self> {
        if !in_job() && under_mpirun() {
            return Err(mpirun_without_mpi_support(
                "the program joins as ShmCom, the shm backend only",
            ));
        }
        join_shm()
    }
}

impl<U: UltItf> JoinJob for crate::com::AnyCom<U> {
    const RELAUNCHABLE: bool = true;
    /// Joins the job's backend, inside the network model when the
    /// environment asks for one ([`AnyCom::with_env_net_model`](crate::com::AnyCom::with_env_net_model)).
    fn join_job() -> Result<Self> {
        join_any()?.with_env_net_model()
    }
}

/// Joins the job's backend as an [`AnyCom`](crate::com::AnyCom).
fn join_any<U: UltItf>() -> Result<crate::com::AnyCom<U>> {
    if in_job() {
        return join_shm().map(crate::com::AnyCom::Shm);
    }
    if under_mpirun() {
        #[cfg(feature = "mpi")]
        return crate::com::MpiCom::init().map(crate::com::AnyCom::Mpi);
        #[cfg(not(feature = "mpi"))]
        return Err(mpirun_without_mpi_support(
            "menps-dsm was built without the `mpi` cargo feature",
        ));
    }
    join_shm().map(crate::com::AnyCom::Shm)
}

#[cfg(feature = "mpi")]
impl<U: UltItf> JoinJob for crate::com::MpiCom<U> {
    const RELAUNCHABLE: bool = false;
    fn join_job() -> Result<Self> {
        if in_job() || !under_mpirun() {
            return Err(Error::BadConfig(
                "MpiCom needs a job started by mpirun (`mpirun -n N prog`, or `menps run \
                 --backend mpi -n N -- prog`); join as AnyCom to run on shm otherwise"
                    .into(),
            ));
        }
        crate::com::MpiCom::init()
    }
}

/// Whether this process was started by `mpirun` / `mpiexec` (one of
/// [`env::MPIRUN_MARKERS`] is set) and not by a menps launcher.
pub fn under_mpirun() -> bool {
    !in_job()
        && env::MPIRUN_MARKERS
            .iter()
            .any(|v| std::env::var_os(v).is_some())
}

/// Whether this process was started by a launcher (`MENPS_RANK` is set).
pub fn in_job() -> bool {
    std::env::var_os(env::RANK).is_some()
}

static JOINED: AtomicBool = AtomicBool::new(false);

fn required<T: std::str::FromStr>(name: &'static str) -> Result<T> {
    launcher_var(name, |v| v.parse().ok())?.ok_or_else(|| {
        Error::BadConfig(format!(
            "{name} is not set: this process was not started by a menps launcher \
             (use `menps run -n N -- prog` or launch::init_or_relaunch)"
        ))
    })
}

/// Takes an inherited descriptor named by the launcher.
fn inherited_fd(fd: RawFd, what: &str) -> Result<OwnedFd> {
    // SAFETY: F_GETFD only queries the descriptor table.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(Error::BadConfig(format!(
            "{what} descriptor {fd} from the launcher is not open in this process \
             (was it started by a job member rather than by the launcher? then unset MENPS_RANK)"
        )));
    }
    // Keep it from leaking into programs this process starts.
    sys::set_cloexec(fd, true)?;
    // SAFETY: the launcher passed this open descriptor to this process for
    // the job, and `JOINED` guarantees we take it only once; nothing else in
    // the process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Joins the job this process was started in (by [`init_or_relaunch`],
/// `menps run`, or `mpirun` for communicators that can be MPI), as the
/// caller's communicator type ([`JoinJob`]). At most once per process.
pub fn init<C: JoinJob>() -> Result<C> {
    C::join_job()
}

/// Joins the shm job this process was started in.
fn join_shm<U: UltItf>() -> Result<ShmCom<U>> {
    let rank: usize = required(env::RANK)?;
    let size: usize = required(env::SIZE)?;
    let control_fd: RawFd = required(env::CONTROL_FD)?;
    if let Some(b) = vars::MENPS_BACKEND.choice().map_err(bad_var)? {
        b.parse::<Backend>()?;
    }
    if size == 0 || size > MAX_PROCS || rank >= size {
        return Err(Error::BadConfig(format!(
            "MENPS_RANK={rank} / MENPS_SIZE={size} are inconsistent"
        )));
    }
    // Empty for a job of one process.
    let peer_list = std::env::var(env::PEER_FDS).unwrap_or_default();
    let mut peer_fds: Vec<(usize, RawFd)> = Vec::new();
    for item in peer_list.split(',').filter(|s| !s.is_empty()) {
        let parsed = item
            .split_once(':')
            .and_then(|(r, f)| Some((r.parse().ok()?, f.parse().ok()?)));
        match parsed {
            Some((r, f)) if r < size => peer_fds.push((r, f)),
            _ => {
                return Err(Error::BadConfig(format!(
                    "{}={peer_list:?} is malformed",
                    env::PEER_FDS
                )));
            }
        }
    }
    if JOINED.swap(true, Ordering::SeqCst) {
        return Err(Error::BadConfig(
            "this process has already joined its job (init may be called only once)".into(),
        ));
    }
    let control_fd = inherited_fd(control_fd, "control memory")?;
    let control = Control::attach(std::os::fd::AsFd::as_fd(&control_fd), size)?;
    let mut peers: Vec<Option<OwnedFd>> = (0..size).map(|_| None).collect();
    for (r, f) in peer_fds {
        peers[r] = Some(inherited_fd(f, "peer socket")?);
    }
    let expected = if rank == 0 {
        size - 1
    } else {
        usize::from(size > 1)
    };
    if peers.iter().flatten().count() != expected {
        return Err(Error::BadConfig(format!(
            "{} names {} sockets, rank {rank} of {size} needs {expected}",
            env::PEER_FDS,
            peers.iter().flatten().count()
        )));
    }
    // A second mapping of the control memory, kept for the life of the
    // process: failures are reported ([`report_failure`]) after the
    // communicator (and its mapping) may be gone.
    if let Ok(c) = Control::attach_slots(std::os::fd::AsFd::as_fd(&control_fd), size) {
        let _ = JOB_CONTROL.set((rank, c));
    }
    let com = ShmCom::from_parts(rank, size, control, peers);
    restore_aslr_for_children();
    if let Some(deadline) = launcher_var(env::JOB_DEADLINE_NS, |v| v.parse::<u64>().ok())? {
        enforce_deadline(rank, deadline);
    }
    Ok(com)
}

/// This process's rank and its own mapping of its shm job's control memory.
static JOB_CONTROL: std::sync::OnceLock<(usize, Control)> = std::sync::OnceLock::new();

/// This process's rank in its job, if it is in one: `MENPS_RANK` (a menps
/// launcher's job), else the rank `mpirun` gives it.
fn job_rank() -> Option<usize> {
    [env::RANK, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// Whether `err` (or an error it wraps) only says that another process of
/// the job died first: that process's failure is the one to report.
fn is_peer_death(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut e = Some(err);
    while let Some(cur) = e {
        if let Some(c) = cur.downcast_ref::<Error>() {
            return c.is_peer_death();
        }
        if let Some(d) = cur.downcast_ref::<crate::dsm::DsmError>() {
            return d.is_peer_death();
        }
        e = cur.source();
    }
    false
}

/// Reports that this process failed with `err`, as one line on stderr:
/// `{program}: rank {rank}: {err}` (`{program}: {err}` outside a job).
/// Returns whether the line was written.
///
/// A program whose processes may fail should report with this rather than
/// `eprintln!`, so that a failing job prints one clear report per failure:
///
/// - the line is written at once (one `write(2)`), so that the reports of
///   processes failing at the same time never interleave;
/// - an error that only says another process died first
///   ([`Error::PeerDied`], also inside a
///   [`DsmError`](crate::dsm::DsmError)) is not reported: the process
///   that died reports its own cause;
/// - in a job of the menps launcher (shm backend), a failure whose text
///   another process already reported — one every process hits alike, such
///   as a bad setting — is reported once;
/// - a program that started its own job ([`init_or_relaunch`]) then adds
///   nothing when the process ends; without a report (a panic, a crash)
///   it names the process and how it ended.
///
/// ```
/// use menps_dsm::dsm::DsmError;
/// // Outside a job: the error, named by the program.
/// let e = DsmError::Config("MENPS_DSM_LEASE=x is not a number".into());
/// assert!(menps_dsm::launch::report_failure("example", &e));
/// ```
pub fn report_failure(program: &str, err: &(dyn std::error::Error + 'static)) -> bool {
    let rank = job_rank();
    if rank.is_some() && is_peer_death(err) {
        return false;
    }
    let text = err.to_string();
    if let Some((r, control)) = JOB_CONTROL.get() {
        // A fingerprint of the text (not the rank): the same failure on
        // every process is one report.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&(program, &text), &mut h);
        let fp = std::hash::Hasher::finish(&h) | 1;
        if !control.claim_report(*r, fp) {
            return false;
        }
    }
    output::write_line(&match rank {
        Some(r) => format!("{program}: rank {r}: {text}"),
        None => format!("{program}: {text}"),
    });
    true
}

/// Ends this process with status 124 at `deadline` (`CLOCK_MONOTONIC`
/// nanoseconds), the job's time limit, whatever it is doing then: the
/// launcher enforces the limit too, but it may be stopped or starved.
fn enforce_deadline(rank: usize, deadline: u64) {
    let spawned = std::thread::Builder::new()
        .name("menps-deadline".into())
        .spawn(move || {
            loop {
                let now = sys::monotonic_ns();
                if now >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_nanos(deadline - now));
            }
            let msg = format!(
                "menps: rank {rank}: the job exceeded its time limit ({}); ending this process\n",
                env::TIMEOUT_SECS
            );
            // SAFETY: write(2) of a valid buffer, then _exit: nothing waits
            // for a job that is over.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(124)
            }
        });
    if let Err(e) = spawned {
        log::warn!("menps: rank {rank}: cannot watch the job's time limit: {e}");
    }
}

/// A rank runs without address-space randomisation (every rank needs the
/// same layout), which programs it executes would inherit. Once the rank
/// has started, its own layout is fixed: clear the flag, so that what it
/// executes (`sh -c …`, tools) gets randomisation back.
pub(crate) fn restore_aslr_for_children() {
    // SAFETY: personality(0xffffffff) only queries; the second call changes
    // an attribute that takes effect at the next execve.
    unsafe {
        let p = libc::personality(0xffff_ffff);
        if p != -1 && p & libc::ADDR_NO_RANDOMIZE != 0 {
            libc::personality((p & !libc::ADDR_NO_RANDOMIZE) as libc::c_ulong);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        let c = JobConfig {
            nprocs: 0,
            ..JobConfig::default()
        };
        assert!(matches!(c.validate(), Err(Error::BadConfig(_))));
        let c = JobConfig {
            nprocs: 4,
            ring_bytes: 1000,
            ..JobConfig::default()
        };
        assert!(matches!(c.validate(), Err(Error::BadConfig(_))));
        assert!(
            JobConfig {
                nprocs: 4,
                ..JobConfig::default()
            }
            .validate()
            .is_ok()
        );
        assert!("shm".parse::<Backend>().is_ok());
        assert_eq!("mpi".parse::<Backend>(), Ok(Backend::Mpi));
        let e = "verbs".parse::<Backend>().unwrap_err();
        assert!(e.to_string().contains("\"shm\" or \"mpi\""), "{e}");
    }
}
