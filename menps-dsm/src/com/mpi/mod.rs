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
//! - **Served RMA** ([`MpiConfig::served_rma`], `MENPS_MPI_RMA`): without
//!   an RDMA device, `osc ucx` emulates one-sided operations over TCP at
//!   several round trips each (an atomic about 470 µs across 2 simulated
//!   hosts, where a two-sided round trip takes 50 µs). So across machines
//!   without one, every RMA operation is instead a request message that
//!   its target serves on its own memory (a copy or a processor atomic) and
//!   answers: one round trip (an atomic 80 µs, a 1 MiB read 2× faster,
//!   measured on a loaded machine). Whichever thread of the target polls
//!   MPI serves — every wait of this backend, and the progress thread when
//!   nobody else polls. Its windows are then our mappings alone (no
//!   `MPI_Win_create`, no epoch: no MPI one-sided call is ever made on
//!   them). See `served`.
//! - **Direct or offloaded** ([`MpiConfig::offload`], `MENPS_MPI_OFFLOAD`):
//!   *direct*, the calling thread makes the MPI calls itself (legal under
//!   `MPI_THREAD_MULTIPLE`; waiting for an `Rget` polls `MPI_Test` and
//!   yields the user-level thread in between). *Offloaded*, every RMA
//!   operation becomes a command for `ct-delegate`'s [`Offloader`]: its
//!   executor thread (spawned on demand) issues the MPI calls in order, its
//!   completer thread flushes and tests them in batches and completes the
//!   [`Request`](crate::com::Request)s, and the issuing user-level thread parks until then — so
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
//! - **Waiting** polls, yields, then parks an OS thread for growing
//!   intervals (1 µs .. 200 µs) between polls (a user-level thread yields
//!   instead), so oversubscribed processes (`mpirun -n 4` on 2 cores) make
//!   progress. A wait for a collective, a served RMA reply or a send that
//!   lasts longer than `MENPS_WATCHDOG_SECS` is reported once on standard
//!   error (and fails with [`Error::Stalled`] under `MENPS_WATCHDOG_FAIL=1`).
//! - **Progress thread**: OpenMPI's `osc ucx` (used between machines) needs
//!   the target process to enter MPI for passive-target operations to
//!   progress, and served RMA needs it to serve; a thread calls
//!   `MPI_Iprobe` (or serves) every `MENPS_MPI_PROGRESS_US` microseconds
//!   (default 1000; `0` turns it off — fine on one machine, where `osc sm`
//!   is truly one-sided), unless another thread of the process polled MPI
//!   in the meantime (see `progress`).
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
//! | `MENPS_MPI_RMA` | `onesided`: MPI one-sided operations; `messages`: requests the target serves | `messages` with `create` windows on a machine without an RDMA device (`/sys/class/infiniband` empty), else `onesided` |
//! | `MENPS_MPI_PROGRESS_US` | progress-thread interval in µs (`0`: no thread) | `1000` |
//! | `MENPS_MPI_OSC_CHECK` | `0`: accept any `OMPI_MCA_osc` | `1` |
//! | `MENPS_MPI_REEXEC` | `0`: never re-execute before `MPI_Init` | `1` |

mod coll;
mod config;
mod departures;
pub(crate) mod device;
mod p2p;
mod progress;
pub(crate) mod raw;
mod rma;
mod served;
mod startup;
mod wait;
mod window;

use std::marker::PhantomData;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ::mpi::ffi;
use ct_delegate::Offloader;
use ct_worker::{Ult, UltItf};

use super::inbox::Inbox;
use super::{Comm, Error, RemotePtr, Result, offload};
pub use config::{MpiConfig, RECOMMENDED_OSC, check_osc_setting, env};
use departures::Departures;
use device::RmaDevice;
use progress::ProgressThread;
use raw::Handle;
use startup::{library_version, prepare_process};
pub use window::WindowFlavor;

/// Whether this process was started by `mpirun` / `mpiexec` (OpenMPI's
/// `OMPI_COMM_WORLD_SIZE`, MPICH's `PMI_SIZE`, or PMIx's `PMIX_RANK`).
pub fn under_mpirun() -> bool {
    crate::launch::under_mpirun()
}

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
    /// Requests of served RMA and their replies.
    serve: Handle<ffi::MPI_Comm>,
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
    windows: Arc<window::WindowTable>,
    /// Served RMA (see `served`), when RMA goes by messages.
    server: Option<Arc<served::Server>>,
    coll: ct_sync::Mutex<coll::CollState, U>,
    inbox: Mutex<Inbox>,
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
            serve: Handle(raw::dup_comm(world)?),
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
        let windows = Arc::new(window::WindowTable::new());
        let served_rma = config.served_rma.unwrap_or_else(|| {
            window_flavor == WindowFlavor::Created && !startup::rdma_device_present()
        });
        let server = served_rma.then(|| {
            Arc::new(served::Server::new(
                comms.serve,
                windows.clone(),
                rank,
                size,
            ))
        });
        let progress = config
            .progress_interval
            .map(|every| ProgressThread::start(comms.progress, server.clone(), every));
        // This rank's layout is fixed: what it executes gets ASLR back.
        crate::launch::restore_aslr_for_children();
        Ok(MpiCom {
            rank,
            size,
            comms,
            windows,
            server,
            coll: ct_sync::Mutex::new_in(coll::CollState::new()),
            inbox: Mutex::new(Inbox::default()),
            offloader: Offloader::new(RmaDevice::new(), 1024),
            offload: AtomicBool::new(offload),
            departures: Departures::new(size),
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

    /// Whether RMA to other processes goes as requests they serve
    /// (`MENPS_MPI_RMA`), rather than MPI one-sided operations.
    pub fn served_rma(&self) -> bool {
        self.server.is_some()
    }

    /// Requests of other processes this one has served so far (`None`
    /// unless RMA is served).
    pub fn served_requests(&self) -> Option<u64> {
        self.server.as_ref().map(|s| s.served())
    }

    /// How this communicator makes windows.
    pub fn window_flavor(&self) -> WindowFlavor {
        self.window_flavor
    }

    /// Switches RMA between the offloading component (`true`) and direct
    /// MPI calls (`false`) from now on — e.g. to compare both in one run.
    /// Operations already issued complete either way; [`Rma::flush`](crate::com::Rma::flush) waits
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

    /// The MPI library's version string (first line).
    pub fn library_version(&self) -> &str {
        &self.library
    }
}

impl<U: UltItf> Drop for MpiCom<U> {
    fn drop(&mut self) {
        if let Some(p) = self.progress.take() {
            p.stop();
        }
        offload::settle(&self.offloader);
        self.announce_departure();
        self.windows.free_all();
        for c in [
            &mut self.comms.coll,
            &mut self.comms.p2p,
            &mut self.comms.ctl,
            &mut self.comms.progress,
            &mut self.comms.serve,
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
