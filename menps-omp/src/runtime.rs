//! Starting a program: the job, the DSM, the team runtime ([`run`],
//! [`Builder`]), and the process's runtime state that regions reach.

use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use ct_config::vars;
use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, Comm};
use menps_dsm::dsm::team::Team;
use menps_dsm::dsm::{Dsm, DsmConfig};

use crate::affinity::{Binding, ProcBind};
use crate::error::Error;
use crate::schedule::Schedule;
use crate::wait::WaitPolicy;
use crate::worksharing::WsRing;

/// The communicator of a program: the embedded `shm` backend, or MPI under
/// `mpirun` (with the `mpi` feature).
pub type Com = AnyCom<OsThreads>;
/// The DSM of a program.
pub type ProgramDsm = Dsm<Com, OsThreads>;

/// `OMP_NUM_THREADS`: threads of a team (all processes together).
pub const NUM_THREADS_VAR: &str = vars::OMP_NUM_THREADS.name;
/// `OMP_SCHEDULE`: the schedule of `Schedule::Runtime` loops.
pub const SCHEDULE_VAR: &str = vars::OMP_SCHEDULE.name;
/// `OMP_STACKSIZE`: the call stack of a team thread (OpenMP syntax: a
/// number of KiB, or a number with a `B`, `K`, `M` or `G` suffix).
pub const STACKSIZE_VAR: &str = vars::OMP_STACKSIZE.name;
/// `OMP_WAIT_POLICY`: `active` (waiting threads stay awake longer, for
/// the shortest waits) or `passive` (they sleep soon, leaving the
/// processors to others).
pub const WAIT_POLICY_VAR: &str = vars::OMP_WAIT_POLICY.name;

/// Write notices a signature keeps in programs of this runtime (unless
/// `MENPS_DSM_WN_LIST` says otherwise).
const OMP_WN_LIST: usize = 16 * 1024;

/// How a program runs: processes, team size, schedule, stack size. Values
/// set here win over the environment (`OMP_NUM_THREADS`, `OMP_SCHEDULE`,
/// `OMP_STACKSIZE`), which wins over the defaults (the workspace's one
/// precedence; the variables are read by `ct-config`'s parser). The number
/// of processes is the one exception: [`Builder::processes`] is a default
/// that `MENPS_NPROCS` overrides, since the size of a job is the user's to
/// choose (as with `menps run -n` and `mpirun -n`).
#[derive(Debug, Clone, Default)]
pub struct Builder {
    processes: Option<usize>,
    num_threads: Option<usize>,
    schedule: Option<Schedule>,
    stack_size: Option<usize>,
}

/// Settings after the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Team size (`OMP_NUM_THREADS`), if set.
    pub num_threads: Option<usize>,
    /// The run-time schedule (`OMP_SCHEDULE`).
    pub schedule: Schedule,
    /// Team threads' stack size (`OMP_STACKSIZE`), if set.
    pub stack_size: Option<usize>,
    /// `OMP_WAIT_POLICY`.
    pub wait_policy: WaitPolicy,
    /// `OMP_PROC_BIND`.
    pub proc_bind: ProcBind,
    /// `OMP_PLACES`, if set.
    pub places: Option<String>,
}

/// A start-up step that runs collectively once the DSM exists.
pub type AfterDsm = fn(&'static ProgramDsm) -> Result<(), Error>;

/// What a kind of program adds to the start-up: the C programs of the
/// libgomp interface adopt their executable's data and take more stacks.
#[derive(Clone, Copy)]
pub struct StartHooks {
    /// Call stacks per process at least, besides the team's.
    pub extra_stacks: usize,
    /// Whether a team size that is not a multiple of the processes is
    /// spread unevenly (C programs) instead of refused (Rust programs).
    pub uneven_teams: bool,
    /// Runs collectively once the DSM exists, before the team starts.
    pub after_dsm: Option<AfterDsm>,
    /// Whether the program has started no OS thread of its own, asked on
    /// every process once the team exists (`None`: not known). If so and
    /// the team runs on one worker per process, all of the program's code
    /// runs on that worker, and the DSM is told so
    /// ([`Dsm::set_single_writer_thread`](menps_dsm::dsm::Dsm::set_single_writer_thread)):
    /// whoever answers must turn that off when the program starts a thread
    /// after all.
    pub no_program_threads: Option<fn() -> bool>,
}

impl StartHooks {
    /// Rust programs of [`run`].
    pub const RUST: StartHooks = StartHooks {
        extra_stacks: 0,
        uneven_teams: false,
        after_dsm: None,
        no_program_threads: None,
    };
}

impl Builder {
    /// Default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Processes to start by default when the program is not already part
    /// of a job (default 1; `MENPS_NPROCS` wins over it, and a job started
    /// by `menps run -n N` or `mpirun -n N` has N).
    pub fn processes(mut self, n: usize) -> Self {
        self.processes = Some(n);
        self
    }

    /// Threads of a team, all processes together (default: the processes ×
    /// the processors of a host divided among its processes, at least one
    /// each). Must be a multiple of the number of processes.
    pub fn num_threads(mut self, n: usize) -> Self {
        self.num_threads = Some(n);
        self
    }

    /// The schedule of [`Schedule::Runtime`] loops (default static).
    pub fn schedule(mut self, s: Schedule) -> Self {
        self.schedule = Some(s);
        self
    }

    /// Bytes of a team thread's call stack (rounded up to a power of two,
    /// 4 KiB .. 1 MiB; default 128 KiB). Wins over `OMP_STACKSIZE`, which
    /// wins over `MENPS_DSM_STACK_SIZE`.
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = Some(bytes);
        self
    }

    #[doc(hidden)]
    pub fn settings(&self) -> Result<Settings, Error> {
        let env = |e: ct_config::Error| Error::Config(e.to_string());
        // Builder > environment > default (ct-config's precedence).
        let (num_threads, from) = ct_config::pick(
            self.num_threads.map(Some),
            || {
                // OpenMP allows a list (one per nesting level); the first
                // counts, nested regions are serial here.
                vars::OMP_NUM_THREADS
                    .parse_with(|v| ct_config::parse::count(v.split(',').next()?, 1, u64::MAX))
                    .map(|n| n.map(|n| Some(n as usize)))
            },
            || None,
        )
        .map_err(env)?;
        if num_threads == Some(0) {
            return Err(Error::Config(format!(
                "{from} of 0 threads: a team has at least one (Builder::num_threads)"
            )));
        }
        let schedule = match self.schedule {
            Some(Schedule::Runtime) => {
                return Err(Error::Config(
                    "Builder::schedule(Schedule::Runtime): the run-time schedule cannot be itself"
                        .into(),
                ));
            }
            Some(s) => s,
            None => vars::OMP_SCHEDULE
                .parse_with(|v| Schedule::parse(v).ok())
                .map_err(env)?
                .unwrap_or_default(),
        };
        let (stack_size, _) = ct_config::pick(
            self.stack_size.map(Some),
            || vars::OMP_STACKSIZE.size().map(|b| b.map(Some)),
            || None,
        )
        .map_err(env)?;
        let stack_size = stack_size
            .map(|b| {
                let p = b.max(4096).next_power_of_two();
                if p > 1 << 20 {
                    Err(Error::Config(format!(
                        "a stack of {b} bytes: team threads' stacks are at most 1 MiB (the DSM's \
                         largest stack slot)"
                    )))
                } else {
                    Ok(p)
                }
            })
            .transpose()?;
        let wait_policy = match vars::OMP_WAIT_POLICY.choice().map_err(env)? {
            Some(v) => WaitPolicy::parse(v).unwrap_or(WaitPolicy::Default),
            None => WaitPolicy::Default,
        };
        let places = vars::OMP_PLACES.text().map_err(env)?;
        // A place list alone binds (`true`), as OpenMP and libgomp have it.
        let proc_bind = vars::OMP_PROC_BIND
            .parse_with(ProcBind::parse)
            .map_err(env)?
            .unwrap_or(if places.is_some() {
                ProcBind::True
            } else {
                ProcBind::False
            });
        Ok(Settings {
            num_threads,
            schedule,
            stack_size,
            wait_policy,
            proc_bind,
            places,
        })
    }

    /// Runs `main` as the program: on process 0, on a DSM call stack, with
    /// every parallel region's team spread over all processes; returns its
    /// value there. The other processes serve the regions and, when `main`
    /// returns, **exit** (status 0, or 1 with a message on an error) without
    /// returning from `run`.
    ///
    /// When the program is not part of a job yet, `run` first starts one
    /// ([`Builder::processes`] processes running this executable, which
    /// re-enter `run`) and exits with its status.
    ///
    /// `main` is a function, not a closure: it captures nothing from the
    /// caller, whose locals and heap live outside the DSM.
    ///
    /// # Errors
    ///
    /// Invalid settings, a job that cannot start, a DSM failure, or a panic
    /// of `main` outside parallel regions ([`Error::Panicked`]). A panic
    /// inside a parallel region ends its process with status 101 and a
    /// message (the team's other threads could never pass their next
    /// barrier); the other processes then fail and exit non-zero.
    pub fn run<R: Send>(self, main: fn() -> R) -> Result<R, Error> {
        if runtime().is_some() {
            return Err(Error::Config(
                "menps_omp::run is already running in this process".into(),
            ));
        }
        let settings = self.settings()?;
        let com: Com = menps_dsm::launch::Builder::new()
            .default_nprocs(self.processes.unwrap_or(1))
            .init_or_relaunch()?;
        let rank = com.rank();
        match run_in_job(com, &settings, StartHooks::RUST, main) {
            Ok(Some(v)) => Ok(v),
            Err(e) if rank == 0 => Err(e),
            Ok(None) => std::process::exit(0),
            Err(e) => {
                // One line, and none for a failure that is another
                // process's (it reports its own).
                let program = std::env::args_os()
                    .next()
                    .and_then(|a| {
                        std::path::Path::new(&a)
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                    })
                    .unwrap_or_else(|| "menps-omp".into());
                menps_dsm::launch::report_failure(&program, &e);
                std::process::exit(1)
            }
        }
    }
}

/// Runs the program in a job already joined.
pub fn run_in_job<R: Send>(
    com: Com,
    s: &Settings,
    hooks: StartHooks,
    main: impl FnOnce() -> R + Send,
) -> Result<Option<R>, Error> {
    let nprocs = com.size();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let team_default = match s.num_threads {
        Some(n) if n % nprocs != 0 && !hooks.uneven_teams => {
            return Err(Error::Config(format!(
                "a team of {n} threads over {nprocs} processes: the team size \
                 ({NUM_THREADS_VAR} or Builder::num_threads) must be a multiple of the number of \
                 processes"
            )));
        }
        Some(n) => n,
        None => nprocs * (cpus / nprocs).max(1),
    };
    let tpp = team_default.div_ceil(nprocs);
    s.wait_policy.apply();
    // The runtime's tuning is a default the `MENPS_DSM_*` variables
    // override; a team stack size from the program or `OMP_STACKSIZE` wins
    // over `MENPS_DSM_STACK_SIZE`.
    let mut tuned = DsmConfig::default();
    // Room for main, the serving thread, the team threads and tasks.
    tuned.stacks_per_process = tuned
        .stacks_per_process
        .max(4 * tpp + 8 + hooks.extra_stacks);
    // OpenMP loops write every page of their arrays between two barriers;
    // a write-notice list shorter than that truncates at every barrier,
    // and a truncated signature invalidates every copy (a 2-D stencil of
    // 8 MiB over 2 processes ran 2-3x slower with the DSM's default 1024).
    tuned.wn_list_len = tuned.wn_list_len.max(OMP_WN_LIST);
    let mut builder = DsmConfig::builder().defaults(tuned);
    if let Some(b) = s.stack_size {
        builder = builder.stack_size(b);
    }
    let cfg = builder.build()?;
    let dsm: &'static ProgramDsm = Box::leak(Box::new(Dsm::with_config(com, cfg)?));
    let r = match hooks.after_dsm.map_or(Ok(()), |f| f(dsm)) {
        Ok(()) => run_with_dsm(dsm, s, team_default, tpp, hooks.no_program_threads, main),
        Err(e) => Err(e),
    };
    // SAFETY: `dsm` was leaked above; the runtime that borrowed it is gone
    // (`run_with_dsm` dropped it), so this is the only reference.
    let dsm = unsafe { Box::from_raw(dsm as *const ProgramDsm as *mut ProgramDsm) };
    let f = dsm.finalize();
    let v = r?;
    f?;
    Ok(v)
}

fn run_with_dsm<R: Send>(
    dsm: &'static ProgramDsm,
    s: &Settings,
    team_default: usize,
    tpp: usize,
    no_program_threads: Option<fn() -> bool>,
    main: impl FnOnce() -> R + Send,
) -> Result<Option<R>, Error> {
    let ring = WsRing::new(dsm)?;
    let team = Team::new(dsm, tpp)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    team.set_stay_awake(s.wait_policy.stay_awake(tpp, cpus / dsm.nprocs()));
    let binding = bind_workers(dsm, &team, s, tpp)?;
    // The program's code runs on the team's workers only, here one.
    let single = team.workers() == 1 && no_program_threads.is_some_and(|f| f());
    dsm.set_single_writer_thread(single);
    let locals = dsm.stacks().map_or(0, |st| st.slots_per_process());
    let rt = Box::new(Runtime {
        dsm,
        team,
        ring,
        team_size: AtomicUsize::new(team_default),
        schedule: AtomicU64::new(s.schedule.encode()),
        next_seq: AtomicU64::new(0),
        next_region: AtomicU64::new(0),
        active: AtomicUsize::new(0),
        locals: (0..locals).map(|_| LocalSlot::default()).collect(),
        shared_mut: Mutex::new(Vec::new()),
        binding,
    });
    RUNTIME.store(&*rt as *const Runtime as *mut Runtime, Ordering::Release);
    let out = rt.team.run_main(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(main)).map_err(|p| {
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic".into())
        })
    });
    RUNTIME.store(core::ptr::null_mut(), Ordering::Release);
    let Runtime { ring, team, .. } = *rt;
    dsm.set_single_writer_thread(false);
    drop(team);
    let freed = ring.free(dsm);
    let out = out?;
    freed?;
    match out {
        Some(Ok(v)) => Ok(Some(v)),
        Some(Err(msg)) => Err(Error::Panicked(msg)),
        // Processes other than 0 served the regions.
        None => Ok(None),
    }
}

/// Starts the program with the default settings: [`Builder::run`].
///
/// ```no_run
/// fn main() -> Result<(), menps_omp::Error> {
///     let sum = menps_omp::run(program)?;
///     println!("sum = {sum}");
///     Ok(())
/// }
///
/// fn program() -> u64 {
///     let data: Vec<u64> = (0..1000).collect(); // in the DSM heap
///     menps_omp::parallel_reduce(0..data.len(), 0, |acc, i| acc + data[i], |a, b| a + b)
/// }
/// ```
pub fn run<R: Send>(main: fn() -> R) -> Result<R, Error> {
    Builder::new().run(main)
}

/// Where a team thread of this process publishes what a reduction combines
/// (a pointer to its value, and one to where the result goes).
#[derive(Debug, Default)]
pub struct LocalSlot {
    pub part: AtomicUsize,
    pub out: AtomicUsize,
}

/// A use of a `SharedMut` in this process: the slice's address, the use
/// (a loop's region id and number, or views), the user-level thread.
pub type MutLoop = (usize, (u64, u64), usize);

/// The runtime of this process while [`run`] runs.
pub struct Runtime {
    /// The DSM.
    pub dsm: &'static ProgramDsm,
    /// The team runtime (fork–join across processes).
    pub team: Team<'static, Com, OsThreads>,
    /// The work-sharing counters.
    pub ring: WsRing,
    /// Team size of regions without `num_threads` (process 0).
    pub team_size: AtomicUsize,
    /// The run-time schedule, encoded (process 0).
    pub schedule: AtomicU64,
    /// Next work-sharing sequence number (process 0).
    pub next_seq: AtomicU64,
    /// Next region id (process 0).
    pub next_region: AtomicU64,
    /// Team threads of this process inside a region.
    pub active: AtomicUsize,
    /// Reduction exchange, one per team thread of this process.
    pub locals: Box<[LocalSlot]>,
    /// Work-sharing loops over a `SharedMut` running in this process:
    /// (address, construct).
    pub shared_mut: Mutex<Vec<MutLoop>>,
    /// How the team's workers are bound (`OMP_PROC_BIND`), if they are.
    pub binding: Option<Binding>,
}

/// Binds the team's `tpp` workers as `OMP_PROC_BIND` and `OMP_PLACES` say
/// (see [`crate::affinity`]).
fn bind_workers(
    dsm: &ProgramDsm,
    team: &Team<'static, Com, OsThreads>,
    s: &Settings,
    tpp: usize,
) -> Result<Option<Binding>, Error> {
    if s.proc_bind == ProcBind::False {
        return Ok(None);
    }
    let allowed = ct_worker::allowed_cpus().map_err(|e| {
        Error::Config(format!(
            "OMP_PROC_BIND: cannot read the processors allowed: {e}"
        ))
    })?;
    let Some(b) = Binding::new(
        s.proc_bind,
        s.places.as_deref(),
        &allowed,
        dsm.rank(),
        dsm.nprocs(),
        tpp,
    )?
    else {
        return Ok(None);
    };
    for (i, &p) in b.worker_place.iter().enumerate() {
        team.bind_worker(i, &b.places[p])
            .map_err(|e| Error::Config(format!("OMP_PROC_BIND: {e}")))?;
    }
    Ok(Some(b))
}

static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(core::ptr::null_mut());

/// The runtime of this process, while [`run`] runs.
pub fn runtime() -> Option<&'static Runtime> {
    let p = RUNTIME.load(Ordering::Acquire);
    // SAFETY: `run_with_dsm` publishes a pointer to its boxed runtime and
    // clears it before dropping the box; everything that reads it (team
    // threads, main) runs inside `run_main`, which ends before that.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The runtime, or a panic naming the misuse.
#[track_caller]
pub(crate) fn expect_runtime(what: &str) -> &'static Runtime {
    runtime().unwrap_or_else(|| {
        panic!("menps-omp: {what} is called outside menps_omp::run (start the program with it)")
    })
}
