//! The `mpi` backend (cargo feature `mpi`): MPI-3 passive-target RMA, for
//! jobs started by `mpirun` — on one machine or a cluster.
//!
//! # Running
//!
//! ```text
//! cargo build --release --features mpi --example hello_shm
//! mpirun -n 4 --oversubscribe target/release/examples/hello_shm
//! ```
//!
//! A program that joins its job with [`crate::launch::init_or_relaunch`] (or
//! [`crate::launch::init`]) for [`AnyCom`](crate::com::AnyCom) or [`MpiCom`]
//! gets this backend when it runs under `mpirun` (detected by
//! `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` or `PMIX_RANK`), and the embedded shm
//! backend otherwise. It needs an MPI library with `MPI_THREAD_MULTIPLE`
//! (tested: OpenMPI 4.1; Debian packages `openmpi-bin libopenmpi-dev`, plus
//! `libclang-dev` for the bindings). As root, OpenMPI's `mpirun` also wants
//! `--allow-run-as-root`.
//!
//! # What it does
//!
//! - **Start-up**: `MPI_Init_thread(MPI_THREAD_MULTIPLE)` through rsmpi
//!   (the `mpi` crate); separate duplicates of `MPI_COMM_WORLD` for
//!   collectives and windows, point-to-point messages, departure notices and
//!   the progress thread, all with `MPI_ERRORS_RETURN` so that failures
//!   become [`Error::Transport`] instead of aborting. rsmpi's safe API has
//!   no RMA, so everything after start-up goes through its raw FFI
//!   (`mpi::ffi`).
//! - **Windows** ([`WindowFlavor`], `MENPS_MPI_WINDOWS`): local parts are
//!   page-aligned `MAP_SHARED` mappings, as [`Windows`](crate::com::Windows)
//!   guarantees (the DSM maps them a second time as its application view).
//!   On one machine, `MPI_Win_allocate_shared` (`osc sm`; [`MpiCom::shared_ptr`]
//!   can then map peers' parts too) with one spare page, exposing the
//!   page-aligned part inside it — RMA adds each target's distance from the
//!   start of its allocation, exchanged at creation. Across machines, a
//!   `memfd` of our own mapped `MAP_SHARED`, registered with
//!   `MPI_Win_create` (`osc ucx`). Zero-filled, then
//!   `MPI_Win_lock_all(MPI_MODE_NOCHECK)`: one passive-target epoch for the
//!   window's life. [`Windows::destroy_window`](crate::com::Windows) forgets
//!   the id, makes the local part inaccessible and releases the MPI window
//!   (`MPI_Win_unlock_all` at once, `MPI_Win_free` collectively when the
//!   communicator is dropped) — so a stale
//!   [`LocalWindow`](crate::com::LocalWindow) pointer faults, never reaching
//!   memory reused for something else.
//! - **RMA**: reads are `MPI_Rget`; writes `MPI_Put` + `MPI_Win_flush`
//!   (an `Rput` request only completes locally, and the trait promises
//!   completion at the target); compare-and-swap and fetch-and-add are
//!   `MPI_Compare_and_swap` / `MPI_Fetch_and_op(MPI_SUM)` + `MPI_Win_flush`
//!   (not `flush_local`: OpenMPI issue #3750). Misuse (out-of-bounds offsets,
//!   unaligned atomics, unknown windows, bad ranks) is checked before MPI is
//!   called, with the same errors as shm.
//! - **Direct or offloaded** ([`MpiConfig::offload`], `MENPS_MPI_OFFLOAD`):
//!   *direct*, the calling thread makes the MPI calls itself (legal under
//!   `MPI_THREAD_MULTIPLE`; waiting for an `Rget` polls `MPI_Test` and
//!   yields the user-level thread in between). *Offloaded*, every RMA
//!   operation becomes a command for `ct-delegate`'s [`Offloader`]: its
//!   executor thread (spawned on demand) issues the MPI calls in order, its
//!   completer thread flushes and tests them in batches and completes the
//!   [`Request`]s, and the issuing user-level thread parks until then — so
//!   many user-level threads never contend inside the MPI library, and a
//!   worker never blocks in it. `rma` in `benches/` measures both
//!   ([`MpiCom::set_offloaded`] switches at run time). **Default**: offloaded
//!   for user-level threads when the job spans several machines (`osc ucx`:
//!   a call blocks for 10–150 µs, which the hand-off to the offloader's
//!   user-level threads, about 0.4 µs, easily pays for); direct otherwise —
//!   on one machine (`osc sm`) a direct call takes 20–30 ns, measured against
//!   about 440 ns through the offloader, and on OS threads
//!   ([`ct_worker::OsThreads`]) the offloader would start OS threads per busy
//!   period.
//! - **Point-to-point** (`MPI_Isend`, `MPI_Improbe` + `MPI_Mrecv`): the
//!   receiver drains every arrived message into per-(sender, tag) queues,
//!   exactly like shm, so tag matching, per-pair FIFO order, `recv_into`'s
//!   too-small-buffer rule and `u32` tags (carried in the payload, since MPI
//!   tags are smaller) behave the same. A sender waiting for its `Isend`
//!   also drains, so two processes sending large messages to each other do
//!   not deadlock.
//! - **Collectives**: `MPI_Ibarrier`, `MPI_Ibcast`, `MPI_Iallgather`, each
//!   preceded (except the barrier) by an exchange of (operation, length,
//!   root) headers so that mismatches are reported by every process alike
//!   ([`Error::CollectiveMismatch`]) instead of being undefined behaviour.
//! - **Waiting** polls for about 20 µs, yields, then sleeps for growing
//!   intervals (20 µs .. 640 µs) between polls, yielding the user-level
//!   thread each time, so oversubscribed processes (`mpirun -n 4` on 2
//!   cores) make progress.
//! - **Progress thread**: OpenMPI's `osc ucx` (used between machines) needs
//!   the target process to enter MPI for passive-target operations to
//!   progress; a thread calls `MPI_Iprobe` every `MENPS_MPI_PROGRESS_US`
//!   microseconds (default 1000; `0` turns it off — fine on one machine,
//!   where `osc sm` is truly one-sided).
//!
//! # The OpenMPI `osc` problem
//!
//! OpenMPI 4.1's default one-sided component on one machine (`osc rdma` over
//! `btl vader`) crashes with SIGSEGV in `MPI_Compare_and_swap`
//! (open-mpi/ompi#11349, #7967); `osc pt2pt` refuses `MPI_THREAD_MULTIPLE`.
//! `OMPI_MCA_osc=sm,ucx` works: `osc sm` on one machine, `osc ucx` across
//! machines. Therefore, before `MPI_Init`:
//!
//! - if `OMPI_MCA_osc` is **not set**, the process re-executes itself with
//!   `OMPI_MCA_osc=sm,ucx` added to its environment (a re-exec keeps the pid,
//!   the environment and the descriptors `mpirun` gave it, and MPI is not
//!   initialised yet; re-executing avoids `setenv` in a possibly
//!   multi-threaded process). The same re-exec also sets
//!   `personality(ADDR_NO_RANDOMIZE)`, so that every rank has the same
//!   address-space layout, as with the shm launcher. Whatever the program
//!   did before `init` then runs twice (so join the job first);
//!   `MENPS_MPI_REEXEC=0` forbids the re-exec, and an unset `OMPI_MCA_osc`
//!   is then an [`Error::BadConfig`] asking for it.
//! - if it is set to a value that selects `rdma` or `pt2pt` (e.g.
//!   `mpirun --mca osc rdma`, or `^pt2pt`), [`MpiCom::init`] returns an
//!   [`Error::BadConfig`] that names the crash and the fix
//!   (`OMPI_MCA_osc=sm,ucx`); `MENPS_MPI_OSC_CHECK=0` skips the check.
//!
//! # Failures
//!
//! MPI has no fail-stop error reporting of the shm kind: when a process of
//! the job crashes, is killed or exits without finalising, `mpirun` aborts
//! the job, killing every other process (SIGTERM, then SIGKILL) — so nobody
//! hangs, but the others do not get [`Error::PeerDied`] either; `mpirun`
//! prints which rank failed and exits non-zero. Waits here sleep in short
//! intervals, never in an uninterruptible MPI call, so the kill takes
//! effect at once. A process that finishes normally (drops its communicator)
//! sends a departure notice to every other one first; a wait that needs it
//! afterwards returns [`Error::PeerExited`] (after a 500 ms grace period for
//! messages still in flight) instead of hanging.
//!
//! # Environment variables
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `OMPI_MCA_osc` | OpenMPI's one-sided component; see above | set to `sm,ucx` if unset |
//! | `MENPS_MPI_OFFLOAD` | `1`: RMA through the offloading component; `0`: direct calls | `1` for user-level threads in a job across machines, else `0` |
//! | `MENPS_MPI_WINDOWS` | `shared` or `create`: how windows are made ([`WindowFlavor`]; `shared` needs one machine) | `shared` on one machine, else `create` |
//! | `MENPS_MPI_PROGRESS_US` | progress-thread interval in µs (`0`: no thread) | `1000` |
//! | `MENPS_MPI_OSC_CHECK` | `0`: accept any `OMPI_MCA_osc` | `1` |
//! | `MENPS_MPI_REEXEC` | `0`: never re-execute before `MPI_Init` | `1` |

mod coll;
pub(crate) mod device;
mod p2p;
pub(crate) mod raw;
mod window;

use std::marker::PhantomData;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::mpi::ffi;
use ct_config::vars;
use ct_delegate::Offloader;
use ct_worker::{Ult, UltItf};

use super::{Comm, Error, RemotePtr, Request, Result, Rma, RmaRequest};
use device::{Command, Kind, Outcome, RmaDevice};
use raw::Handle;
pub use window::WindowFlavor;

/// Names of the environment variables this backend reads.
pub mod env {
    /// OpenMPI's one-sided component selection.
    pub const OMPI_OSC: &str = ct_config::vars::OMPI_MCA_OSC.name;
    /// `0`/`1`: offload RMA.
    pub const OFFLOAD: &str = ct_config::vars::MENPS_MPI_OFFLOAD.name;
    /// Progress-thread interval in microseconds (`0`: none).
    pub const PROGRESS_US: &str = ct_config::vars::MENPS_MPI_PROGRESS_US.name;
    /// `0`: skip the `OMPI_MCA_osc` check.
    pub const OSC_CHECK: &str = ct_config::vars::MENPS_MPI_OSC_CHECK.name;
    /// `0`: never re-execute before `MPI_Init`.
    pub const REEXEC: &str = ct_config::vars::MENPS_MPI_REEXEC.name;
    /// `shared` / `create` / `auto`: how windows are made
    /// ([`WindowFlavor`](super::WindowFlavor)).
    pub const WINDOWS: &str = ct_config::vars::MENPS_MPI_WINDOWS.name;
    /// Set in the environment of the re-executed process.
    pub const REEXECED: &str = "MENPS_MPI_REEXECED";
}

/// The `OMPI_MCA_osc` value the backend sets when none is given.
pub const RECOMMENDED_OSC: &str = "sm,ucx";

/// Settings of [`MpiCom`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiConfig {
    /// Offload RMA to `ct-delegate`'s [`Offloader`] (`Some(true)`), make
    /// direct calls (`Some(false)`), or choose (`None`: offload for
    /// user-level threads when the job spans several machines; see the
    /// [module docs](self)).
    pub offload: Option<bool>,
    /// Interval of the progress thread (`None`: no thread).
    pub progress_interval: Option<Duration>,
    /// How windows are made (`None`: [`WindowFlavor::Shared`] when every
    /// process runs on this machine, [`WindowFlavor::Created`] otherwise).
    pub windows: Option<WindowFlavor>,
    /// Refuse `OMPI_MCA_osc` values known to crash or fail.
    pub osc_check: bool,
    /// Allow re-executing the process before `MPI_Init` (to set
    /// `OMPI_MCA_osc` and `ADDR_NO_RANDOMIZE`).
    pub reexec: bool,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            offload: None,
            progress_interval: Some(Duration::from_millis(1)),
            windows: None,
            osc_check: true,
            reexec: true,
        }
    }
}

fn bad_var(e: ct_config::Error) -> Error {
    Error::BadConfig(e.to_string())
}

impl MpiConfig {
    /// The defaults with the `MENPS_MPI_*` variables applied.
    pub fn from_env() -> Result<Self> {
        let d = MpiConfig::default();
        Ok(MpiConfig {
            offload: vars::MENPS_MPI_OFFLOAD
                .flag()
                .map_err(bad_var)?
                .or(d.offload),
            progress_interval: match vars::MENPS_MPI_PROGRESS_US.duration().map_err(bad_var)? {
                None => d.progress_interval,
                Some(Duration::ZERO) => None,
                Some(t) => Some(t),
            },
            windows: match vars::MENPS_MPI_WINDOWS.choice().map_err(bad_var)? {
                None => d.windows,
                Some(name) => WindowFlavor::parse(name).ok_or_else(|| {
                    Error::BadConfig(format!("{}={name:?}: unknown flavour", env::WINDOWS))
                })?,
            },
            osc_check: vars::MENPS_MPI_OSC_CHECK
                .flag()
                .map_err(bad_var)?
                .unwrap_or(d.osc_check),
            reexec: vars::MENPS_MPI_REEXEC
                .flag()
                .map_err(bad_var)?
                .unwrap_or(d.reexec),
        })
    }
}

/// Judges an `OMPI_MCA_osc` value: `Ok` if it cannot select a component
/// known to crash (`rdma`, whose `MPI_Compare_and_swap` segfaults on one
/// machine in OpenMPI 4.1) or to fail (`pt2pt`, which refuses
/// `MPI_THREAD_MULTIPLE`), and leaves `sm` or `ucx`; otherwise an
/// [`Error::BadConfig`] naming the fix. `None` (unset) is fine: the backend
/// sets [`RECOMMENDED_OSC`].
pub fn check_osc_setting(value: Option<&str>) -> Result<()> {
    const ALL: [&str; 5] = ["rdma", "sm", "ucx", "pt2pt", "monitoring"];
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let (exclude, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let named: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let selected: Vec<&str> = if exclude {
        ALL.iter().copied().filter(|c| !named.contains(c)).collect()
    } else {
        named.clone()
    };
    let bad: Vec<&str> = selected
        .iter()
        .copied()
        .filter(|c| matches!(*c, "rdma" | "pt2pt"))
        .collect();
    let usable = selected.iter().any(|c| matches!(*c, "sm" | "ucx"));
    if bad.is_empty() && usable {
        return Ok(());
    }
    let why = if bad.contains(&"rdma") {
        "OpenMPI 4.1's `osc rdma` component crashes (SIGSEGV) in MPI_Compare_and_swap on one \
         machine (open-mpi/ompi#11349)"
    } else if bad.contains(&"pt2pt") {
        "OpenMPI's `osc pt2pt` component refuses MPI_THREAD_MULTIPLE, which this backend needs"
    } else {
        "it selects neither `sm` nor `ucx`, the one-sided components that work"
    };
    Err(Error::BadConfig(format!(
        "{}={v:?} cannot be used: {why}. Fix: set {}={RECOMMENDED_OSC} (or leave it unset: \
         menps then sets it), e.g. `mpirun -x {}={RECOMMENDED_OSC} ...`; {}=0 skips this check",
        env::OMPI_OSC,
        env::OMPI_OSC,
        env::OMPI_OSC,
        env::OSC_CHECK
    )))
}

/// Whether address-space randomisation is off for this process.
fn aslr_disabled() -> bool {
    std::fs::read_to_string("/proc/self/personality")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
        .is_some_and(|p| p & libc::ADDR_NO_RANDOMIZE as u64 != 0)
}

/// Before `MPI_Init`: checks `OMPI_MCA_osc` and re-executes the process if
/// that is needed to set it (or to turn address randomisation off).
fn prepare_process(cfg: &MpiConfig) -> Result<()> {
    // Set but empty counts as unset here: OpenMPI ignores it too.
    let osc = vars::OMPI_MCA_OSC.text().ok().flatten();
    if cfg.osc_check {
        check_osc_setting(osc.as_deref())?;
    }
    if std::env::var_os(env::REEXECED).is_some() {
        return Ok(());
    }
    let need_osc = osc.is_none();
    let need_aslr = !aslr_disabled();
    if !need_osc && !need_aslr {
        return Ok(());
    }
    if !cfg.reexec {
        if need_osc {
            return Err(Error::BadConfig(format!(
                "{} is not set and {}=0 forbids setting it by re-executing the process; \
                 set {}={RECOMMENDED_OSC} (OpenMPI 4.1's default one-sided component crashes \
                 in MPI_Compare_and_swap)",
                env::OMPI_OSC,
                env::REEXEC,
                env::OMPI_OSC
            )));
        }
        return Ok(());
    }
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new("/proc/self/exe");
    if let Some(a0) = args.next() {
        cmd.arg0(a0);
    }
    cmd.args(args).env(env::REEXECED, "1");
    if need_osc {
        cmd.env(env::OMPI_OSC, RECOMMENDED_OSC);
    }
    if need_aslr {
        // SAFETY: personality() only changes an attribute of this process
        // that takes effect at the next exec; 0xffffffff queries it.
        unsafe {
            let p = libc::personality(0xffff_ffff);
            if p != -1 {
                libc::personality((p | libc::ADDR_NO_RANDOMIZE) as libc::c_ulong);
            }
        }
    }
    let e = cmd.exec();
    Err(Error::BadConfig(format!(
        "cannot re-execute /proc/self/exe before MPI_Init ({e}); set {}={RECOMMENDED_OSC} and \
         {}=0 to avoid the re-exec",
        env::OMPI_OSC,
        env::REEXEC
    )))
}

/// Whether this process was started by `mpirun` / `mpiexec` (OpenMPI's
/// `OMPI_COMM_WORLD_SIZE`, MPICH's `PMI_SIZE`, or PMIx's `PMIX_RANK`).
pub fn under_mpirun() -> bool {
    crate::launch::under_mpirun()
}

/// Yield rounds of a wait before it parks (an OS thread; a worker thread
/// keeps yielding: it never sleeps, see [`ct_sync::Backoff`]).
const YIELD_ROUNDS: u32 = 50;

/// The back-off of this backend's waits: the workspace's one, parking
/// after [`YIELD_ROUNDS`].
fn backoff() -> ct_sync::Backoff {
    ct_sync::Backoff::parking(YIELD_ROUNDS)
}

/// What a wait must also watch for (as on shm).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Watch {
    /// Fails if this process has left the job.
    Rank(usize),
    /// Fails if any other process has left the job.
    AllOthers,
    /// Fails if every other process has left the job.
    AnyOther,
}

/// How long a wait keeps polling after it saw that a process it needs has
/// left (messages it sent before leaving may still be in flight).
const DEPARTURE_GRACE: Duration = Duration::from_millis(500);

/// Departure notices received: the order in which processes left.
struct Departures {
    any: AtomicBool,
    /// `order[r]`: 1 + how many had left before `r`, or 0.
    order: Mutex<Vec<u32>>,
    count: AtomicU32,
}

struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<()>,
}

/// MPI tag of departure notices on the control communicator.
const TAG_LEAVE: c_int = 1;

/// The communicators of the job (duplicates of `MPI_COMM_WORLD`).
struct Comms {
    /// Collectives and window creation.
    coll: Handle<ffi::MPI_Comm>,
    /// Point-to-point messages.
    p2p: Handle<ffi::MPI_Comm>,
    /// Departure notices.
    ctl: Handle<ffi::MPI_Comm>,
    /// The progress thread's probes.
    progress: Handle<ffi::MPI_Comm>,
}

/// Communicator of the `mpi` backend; see the [module docs](self).
///
/// At most one exists per process (it owns MPI's initialisation: dropping
/// it finalises MPI). It is `Send + Sync`; share it between threads and
/// user-level threads of the process.
pub struct MpiCom<U: UltItf = Ult> {
    rank: usize,
    size: usize,
    comms: Comms,
    windows: window::WindowTable,
    coll: ct_sync::Mutex<coll::CollState, U>,
    inbox: Mutex<crate::com::inbox::Inbox>,
    offloader: Arc<Offloader<RmaDevice, U>>,
    /// Whether RMA goes through `offloader` (see [`MpiCom::set_offloaded`]).
    offload: AtomicBool,
    departures: Departures,
    progress: Option<ProgressThread>,
    library: String,
    /// How windows are made.
    window_flavor: WindowFlavor,
    universe: Option<::mpi::environment::Universe>,
    _u: PhantomData<fn() -> U>,
}

impl<U: UltItf> core::fmt::Debug for MpiCom<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MpiCom")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("offloaded", &self.is_offloaded())
            .finish_non_exhaustive()
    }
}

fn library_version() -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer has room for the longest version string.
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 || len <= 0 {
        return "unknown MPI library".into();
    }
    buf.truncate(len as usize);
    String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or("")
        .trim_end_matches(['\0', ','])
        .trim()
        .to_owned()
}

impl<U: UltItf> MpiCom<U> {
    /// Initialises MPI with the settings from the environment
    /// ([`MpiConfig::from_env`]) and joins the job. Run under `mpirun`; at
    /// most once per process. May re-execute the process first (see the
    /// [module docs](self)).
    pub fn init() -> Result<Self> {
        Self::init_with(MpiConfig::from_env()?)
    }

    /// [`MpiCom::init`] with explicit settings.
    pub fn init_with(config: MpiConfig) -> Result<Self> {
        prepare_process(&config)?;
        let (universe, threading) = ::mpi::initialize_with_threading(::mpi::Threading::Multiple)
            .ok_or_else(|| {
                Error::BadConfig(
                    "MPI is already initialised in this process (at most one MpiCom per \
                     process)"
                        .into(),
                )
            })?;
        if threading != ::mpi::Threading::Multiple {
            return Err(Error::BackendUnavailable(format!(
                "the MPI library ({}) provides only {threading:?} threading; the mpi backend \
                 needs MPI_THREAD_MULTIPLE",
                library_version()
            )));
        }
        let world = raw::comm_world();
        let comms = Comms {
            coll: Handle(raw::dup_comm(world)?),
            p2p: Handle(raw::dup_comm(world)?),
            ctl: Handle(raw::dup_comm(world)?),
            progress: Handle(raw::dup_comm(world)?),
        };
        let (rank, size) = raw::rank_size(comms.coll.0)?;
        let single_node = raw::node_size(world)? == size;
        let user_level =
            std::any::TypeId::of::<U>() != std::any::TypeId::of::<ct_worker::OsThreads>();
        let offload = config.offload.unwrap_or(user_level && !single_node);
        let window_flavor = match config.windows {
            None if single_node => WindowFlavor::Shared,
            None => WindowFlavor::Created,
            Some(WindowFlavor::Shared) if !single_node => {
                return Err(Error::BadConfig(format!(
                    "{}=shared needs every process on one machine (MPI_Win_allocate_shared); \
                     this job spans several: use `create` or leave it unset",
                    env::WINDOWS
                )));
            }
            Some(f) => f,
        };
        let progress = config.progress_interval.map(|every| {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let comm = comms.progress;
            let handle = std::thread::Builder::new()
                .name("menps-mpi-progress".into())
                .spawn(move || progress_main(comm, every, &s))
                .expect("cannot start the MPI progress thread");
            ProgressThread { stop, handle }
        });
        // This rank's layout is fixed: what it executes gets ASLR back.
        crate::launch::restore_aslr_for_children();
        Ok(MpiCom {
            rank,
            size,
            comms,
            windows: window::WindowTable::new(),
            coll: ct_sync::Mutex::new_in(coll::CollState::new()),
            inbox: Mutex::new(crate::com::inbox::Inbox::default()),
            offloader: Offloader::new(RmaDevice::new(), 1024),
            offload: AtomicBool::new(offload),
            departures: Departures {
                any: AtomicBool::new(false),
                order: Mutex::new(vec![0; size]),
                count: AtomicU32::new(0),
            },
            progress,
            library: library_version(),
            window_flavor,
            universe: Some(universe),
            _u: PhantomData,
        })
    }

    /// Whether RMA goes through the offloading component.
    pub fn is_offloaded(&self) -> bool {
        self.offload.load(Ordering::Relaxed)
    }

    /// How this communicator makes windows.
    pub fn window_flavor(&self) -> WindowFlavor {
        self.window_flavor
    }

    /// Switches RMA between the offloading component (`true`) and direct
    /// MPI calls (`false`) from now on — e.g. to compare both in one run.
    /// Operations already issued complete either way; [`Rma::flush`] waits
    /// for both kinds. With user-level threads, offloaded operations must be
    /// issued from a running runtime (the offloader's threads are
    /// user-level threads).
    pub fn set_offloaded(&self, on: bool) {
        self.offload.store(on, Ordering::Relaxed);
    }

    /// The address, in this process, of `len` bytes at `p` (bounds-checked),
    /// if the target's part of the window is mapped here: on one machine
    /// with `osc sm` (`MPI_Win_shared_query`); `None` otherwise (e.g. `osc
    /// ucx`). Like `ShmCom::translate`, for baselines and local fast paths;
    /// using the pointer is `unsafe` and subject to the window's rules.
    pub fn shared_ptr(&self, p: RemotePtr, len: usize) -> Result<Option<*mut u8>> {
        let (win, disp) = self.windows.resolve(p, len, self.size)?;
        let mut size: ffi::MPI_Aint = 0;
        let mut disp_unit: c_int = 0;
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: a live window and out-parameters (`baseptr` receives a
        // pointer, as the call requires).
        let rc = unsafe {
            ffi::MPI_Win_shared_query(
                win,
                p.rank() as c_int,
                &mut size,
                &mut disp_unit,
                (&mut base as *mut *mut u8).cast(),
            )
        };
        // `disp` counts from the start of the target's allocation, which
        // ends after its (aligned) part.
        if rc != 0 || base.is_null() || (size as i128) < disp as i128 + len as i128 {
            return Ok(None);
        }
        // SAFETY: the range is inside the target's allocation (checked
        // above).
        Ok(Some(unsafe { base.add(disp as usize) }))
    }

    /// The offloader, when RMA is offloaded now.
    #[inline]
    fn offloading(&self) -> Option<&Arc<Offloader<RmaDevice, U>>> {
        self.is_offloaded().then_some(&self.offloader)
    }

    /// The MPI library's version string (first line).
    pub fn library_version(&self) -> &str {
        &self.library
    }

    #[inline]
    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank < self.size {
            Ok(())
        } else {
            Err(Error::BadRank {
                rank,
                size: self.size,
            })
        }
    }

    /// Receives departure notices that arrived (non-blocking).
    fn poll_departures(&self) -> Result<()> {
        let Ok(mut order) = self.departures.order.try_lock() else {
            return Ok(());
        };
        loop {
            let mut flag: c_int = 0;
            let mut msg = std::mem::MaybeUninit::<ffi::MPI_Message>::uninit();
            let mut st = raw::empty_status();
            // SAFETY: valid communicator and out-parameters.
            raw::check("MPI_Improbe", unsafe {
                ffi::MPI_Improbe(
                    raw::any_source(),
                    TAG_LEAVE,
                    self.comms.ctl.0,
                    &mut flag,
                    msg.as_mut_ptr(),
                    &mut st,
                )
            })?;
            if flag == 0 {
                return Ok(());
            }
            let mut byte = 0u8;
            // SAFETY: the probe matched a (zero-byte) message and wrote its
            // handle; `byte` has room for it.
            raw::check("MPI_Mrecv", unsafe {
                ffi::MPI_Mrecv(
                    (&mut byte as *mut u8).cast(),
                    1,
                    raw::byte(),
                    msg.as_mut_ptr(),
                    raw::status_ignore(),
                )
            })?;
            let r = st.MPI_SOURCE as usize;
            if r < self.size && order[r] == 0 {
                order[r] = self.departures.count.fetch_add(1, Ordering::Relaxed) + 1;
                self.departures.any.store(true, Ordering::Release);
            }
        }
    }

    /// The error a wait must return now, if any.
    fn failure(&self, watch: Watch) -> Result<Option<Error>> {
        self.poll_departures()?;
        if !self.departures.any.load(Ordering::Acquire) {
            return Ok(None);
        }
        let order = self
            .departures
            .order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let left = |r: usize| order[r] != 0;
        let first = |it: &mut dyn Iterator<Item = usize>| {
            it.filter(|&r| left(r))
                .min_by_key(|&r| order[r])
                .map(|rank| Error::PeerExited { rank })
        };
        Ok(match watch {
            Watch::Rank(r) => left(r).then_some(Error::PeerExited { rank: r }),
            Watch::AllOthers => first(&mut (0..self.size).filter(|&r| r != self.rank)),
            Watch::AnyOther => {
                let others: Vec<usize> = (0..self.size).filter(|&r| r != self.rank).collect();
                if !others.is_empty() && others.iter().all(|&r| left(r)) {
                    first(&mut others.into_iter())
                } else {
                    None
                }
            }
        })
    }

    /// Polls until `poll` gives a value or an error, or `watch` says it
    /// never will (after [`DEPARTURE_GRACE`]).
    pub(crate) fn wait_until<T>(
        &self,
        watch: Watch,
        mut poll: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let mut backoff = backoff();
        let mut failed_at: Option<(Instant, Error)> = None;
        loop {
            if let Some(v) = poll()? {
                return Ok(v);
            }
            if !backoff.is_spinning() {
                match &failed_at {
                    Some((t, e)) if t.elapsed() >= DEPARTURE_GRACE => return Err(e.clone()),
                    Some(_) => {}
                    None => {
                        if let Some(e) = self.failure(watch)? {
                            failed_at = Some((Instant::now(), e));
                        }
                    }
                }
            }
            backoff.snooze(U::yield_now);
        }
    }

    /// Waits for an MPI request of a collective or a message.
    ///
    /// # Safety
    /// `req` must be active (or null) and its buffers valid until this
    /// returns `Ok`. On `Err` the request is abandoned (never completed):
    /// the caller must leak its buffers.
    pub(crate) unsafe fn wait_request(
        &self,
        req: &mut ffi::MPI_Request,
        watch: Watch,
    ) -> Result<()> {
        // SAFETY: per the contract.
        self.wait_until(watch, || unsafe { raw::test(req) }.map(|d| d.then_some(())))
    }

    /// Resolves `p` for an access of `len` bytes: (window, rank, disp).
    #[inline]
    fn target(&self, p: RemotePtr, len: usize) -> Result<(ffi::MPI_Win, c_int, ffi::MPI_Aint)> {
        let (win, disp) = self.windows.resolve(p, len, self.size)?;
        Ok((win, p.rank() as c_int, disp))
    }

    #[inline]
    fn atomic_target(&self, p: RemotePtr) -> Result<(ffi::MPI_Win, c_int, ffi::MPI_Aint)> {
        if !p.offset().is_multiple_of(8) {
            return Err(Error::UnalignedAtomic {
                window: p.window().0,
                offset: p.offset(),
            });
        }
        self.target(p, 8)
    }

    fn offload(
        off: &Arc<Offloader<RmaDevice, U>>,
        command: Command,
        out: Arc<Outcome>,
    ) -> Request<U> {
        let (req, completer) = Request::<U>::pending();
        off.submit(command, move || completer.complete(out.take()));
        req
    }

    fn submit_rma(
        &self,
        off: &Arc<Offloader<RmaDevice, U>>,
        (win, rank, disp): (ffi::MPI_Win, c_int, ffi::MPI_Aint),
        kind: Kind,
        out: Arc<Outcome>,
    ) -> Request<U> {
        Self::offload(
            off,
            Command::Rma {
                win: Handle(win),
                rank,
                disp,
                kind,
                out: out.clone(),
            },
            out,
        )
    }

    /// Direct read: `MPI_Rget`, polled with `MPI_Test` (yielding), or
    /// pieces of `MPI_Get` + flush beyond `int` counts.
    ///
    /// # Safety
    /// `dst` valid for writes of `len` bytes.
    unsafe fn direct_read(
        &self,
        (win, rank, disp): (ffi::MPI_Win, c_int, ffi::MPI_Aint),
        dst: *mut u8,
        len: usize,
    ) -> Result<()> {
        if len > raw::MAX_COUNT {
            // SAFETY: per the contract; the window is live (resolved).
            return unsafe {
                raw::get(win, rank, disp, dst, len)?;
                raw::flush(win, rank)
            };
        }
        // SAFETY: per the contract; the window is live (resolved).
        let mut req = unsafe { raw::rget(win, rank, disp, dst, len) }?;
        let mut backoff = backoff();
        // SAFETY: `req` is active and `dst` stays valid until it completes.
        while !unsafe { raw::test(&mut req) }? {
            backoff.snooze(U::yield_now);
        }
        Ok(())
    }

    /// Direct write: `MPI_Put` + `MPI_Win_flush`.
    ///
    /// # Safety
    /// `src` valid for reads of `len` bytes.
    unsafe fn direct_write(
        &self,
        (win, rank, disp): (ffi::MPI_Win, c_int, ffi::MPI_Aint),
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: per the contract; the window is live (resolved); the flush
        // completes the put before `src` may change.
        unsafe {
            raw::put(win, rank, disp, src, len)?;
            raw::flush(win, rank)
        }
    }

    fn direct_cas(
        &self,
        (win, rank, disp): (ffi::MPI_Win, c_int, ffi::MPI_Aint),
        expected: u64,
        new: u64,
    ) -> Result<u64> {
        let mut old = 0u64;
        // SAFETY: the operands and the result live on our stack until the
        // flush has completed the operation; the window is live (resolved).
        unsafe {
            raw::compare_and_swap(win, rank, disp, &new, &expected, &mut old)?;
            raw::flush(win, rank)?;
        }
        Ok(old)
    }

    fn direct_fetch_add(
        &self,
        (win, rank, disp): (ffi::MPI_Win, c_int, ffi::MPI_Aint),
        delta: u64,
    ) -> Result<u64> {
        let mut old = 0u64;
        // SAFETY: as in `direct_cas`.
        unsafe {
            raw::fetch_add(win, rank, disp, &delta, &mut old)?;
            raw::flush(win, rank)?;
        }
        Ok(old)
    }

    /// Waits until every offloaded operation issued so far has completed
    /// (and its completion callback has run).
    fn drain_offloaded(&self) -> Result<()> {
        let off = &self.offloader;
        // Nothing queued and nothing in flight (read in this order: the
        // executor counts a command as in flight before it may stop): every
        // operation issued before this call is complete.
        if !off.is_executor_running() && off.in_flight() == 0 {
            return Ok(());
        }
        Self::offload(off, Command::Flush, Outcome::new(0, 0))
            .wait()
            .map(drop)
    }
}

fn progress_main(comm: Handle<ffi::MPI_Comm>, every: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let mut flag: c_int = 0;
        // SAFETY: a valid communicator (freed only after this thread was
        // joined) and out-parameters. Errors are ignored: the probe is only
        // there to drive MPI's progress engine.
        unsafe {
            ffi::MPI_Iprobe(
                raw::any_source(),
                0,
                comm.0,
                &mut flag,
                raw::status_ignore(),
            );
        }
        std::thread::park_timeout(every);
    }
}

impl<U: UltItf> Drop for MpiCom<U> {
    fn drop(&mut self) {
        if let Some(p) = self.progress.take() {
            p.stop.store(true, Ordering::Release);
            p.handle.thread().unpark();
            let _ = p.handle.join();
        }
        {
            let off = &self.offloader;
            // Requests dropped without waiting still complete; give them (and
            // the offloader's threads) a moment.
            let until = Instant::now() + Duration::from_secs(2);
            let mut backoff = backoff();
            while (off.in_flight() > 0 || off.is_executor_running()) && Instant::now() < until {
                backoff.snooze(U::yield_now);
            }
        }
        // Tell the others we leave, so that their waits for us fail instead
        // of hanging (see the module docs).
        for r in (0..self.size).filter(|&r| r != self.rank) {
            // SAFETY: a zero-byte eager send on a valid communicator.
            unsafe {
                ffi::MPI_Send(
                    std::ptr::null(),
                    0,
                    raw::byte(),
                    r as c_int,
                    TAG_LEAVE,
                    self.comms.ctl.0,
                );
            }
        }
        self.windows.free_all();
        for c in [
            &mut self.comms.coll,
            &mut self.comms.p2p,
            &mut self.comms.ctl,
            &mut self.comms.progress,
        ] {
            // SAFETY: our own duplicated communicators, no longer used.
            unsafe { ffi::MPI_Comm_free(&mut c.0) };
        }
        // Finalises MPI.
        drop(self.universe.take());
    }
}

impl<U: UltItf> Comm for MpiCom<U> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
}

impl<U: UltItf> Rma for MpiCom<U> {
    type Request = Request<U>;

    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Request<U>> {
        let t = self.target(src, len)?;
        if len == 0 {
            return Ok(Request::ready(Ok(0)));
        }
        match self.offloading() {
            Some(off) => Ok(self.submit_rma(off, t, Kind::Get { dst, len }, Outcome::new(0, 0))),
            // SAFETY: forwarded contract.
            None => unsafe { self.direct_read(t, dst, len) }.map(|()| Request::ready(Ok(0))),
        }
    }

    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Request<U>> {
        let t = self.target(dst, len)?;
        if len == 0 {
            return Ok(Request::ready(Ok(0)));
        }
        match self.offloading() {
            Some(off) => Ok(self.submit_rma(off, t, Kind::Put { src, len }, Outcome::new(0, 0))),
            // SAFETY: forwarded contract.
            None => unsafe { self.direct_write(t, src, len) }.map(|()| Request::ready(Ok(0))),
        }
    }

    fn compare_and_swap_nb(
        &self,
        target: RemotePtr,
        expected: u64,
        new: u64,
    ) -> Result<Request<U>> {
        let t = self.atomic_target(target)?;
        match self.offloading() {
            Some(off) => Ok(self.submit_rma(off, t, Kind::Cas, Outcome::new(new, expected))),
            None => Ok(Request::ready(self.direct_cas(t, expected, new))),
        }
    }

    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Request<U>> {
        let t = self.atomic_target(target)?;
        match self.offloading() {
            Some(off) => Ok(self.submit_rma(off, t, Kind::FetchAdd, Outcome::new(delta, 0))),
            None => Ok(Request::ready(self.direct_fetch_add(t, delta))),
        }
    }

    fn flush(&self, rank: usize) -> Result<()> {
        self.check_rank(rank)?;
        self.drain_offloaded()?;
        self.windows.for_each_live(|w| {
            // SAFETY: a live, locked window.
            unsafe { raw::flush(w, rank as c_int) }
        })
    }

    fn flush_all(&self) -> Result<()> {
        self.drain_offloaded()?;
        self.windows.for_each_live(|w| {
            // SAFETY: a live, locked window.
            unsafe { raw::flush_all(w) }
        })
    }

    fn read(&self, src: RemotePtr, dst: &mut [u8]) -> Result<()> {
        if self.is_offloaded() {
            // SAFETY: `dst` is exclusively borrowed until we have waited.
            return unsafe { self.read_nb(src, dst.as_mut_ptr(), dst.len()) }?
                .wait()
                .map(drop);
        }
        let t = self.target(src, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` is valid for its length.
        unsafe { self.direct_read(t, dst.as_mut_ptr(), dst.len()) }
    }

    fn write(&self, dst: RemotePtr, src: &[u8]) -> Result<()> {
        if self.is_offloaded() {
            // SAFETY: `src` is borrowed until we have waited.
            return unsafe { self.write_nb(dst, src.as_ptr(), src.len()) }?
                .wait()
                .map(drop);
        }
        let t = self.target(dst, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: `src` is valid for its length.
        unsafe { self.direct_write(t, src.as_ptr(), src.len()) }
    }

    fn compare_and_swap(&self, target: RemotePtr, expected: u64, new: u64) -> Result<u64> {
        if self.is_offloaded() {
            return self.compare_and_swap_nb(target, expected, new)?.wait();
        }
        let t = self.atomic_target(target)?;
        self.direct_cas(t, expected, new)
    }

    fn fetch_add(&self, target: RemotePtr, delta: u64) -> Result<u64> {
        if self.is_offloaded() {
            return self.fetch_add_nb(target, delta)?.wait();
        }
        let t = self.atomic_target(target)?;
        self.direct_fetch_add(t, delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn osc_settings_are_judged() {
        for ok in [
            None,
            Some(""),
            Some("sm,ucx"),
            Some("sm"),
            Some("ucx"),
            Some("^rdma,pt2pt"),
        ] {
            assert_eq!(check_osc_setting(ok), Ok(()), "{ok:?}");
        }
        for bad in ["rdma", "pt2pt", "^pt2pt", "sm,rdma", "^sm,ucx", "foo"] {
            let e = check_osc_setting(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("OMPI_MCA_osc=sm,ucx") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        assert!(
            check_osc_setting(Some("rdma"))
                .unwrap_err()
                .to_string()
                .contains("MPI_Compare_and_swap")
        );
    }
}
