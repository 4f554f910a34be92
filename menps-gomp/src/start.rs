//! Taking over a C program's `main`: the library's `__libc_start_main`
//! (found before libc's, by preloading or by linking the library first)
//! hands libc a wrapper instead of `main`. The wrapper joins or starts the
//! job, creates the DSM (adopting the executable's globals when the job
//! has several processes), and runs the real `main` on process 0 on a DSM
//! call stack, as the initial OpenMP thread; the other processes serve its
//! parallel regions. `main`'s status becomes the status of every process's
//! exit, also when `main` calls `exit` itself.
//!
//! Programs that do not use OpenMP (a shell, a compiler, anything the
//! program starts while the library is preloaded) run untouched.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use menps_dsm::com::Comm;
use menps_dsm::dsm::allocator::RuntimeGuard;

use crate::{CThread, die, enter_task, leave_task};
use menps_omp::Builder;
use menps_omp::Error;
use menps_omp::internals::{Com, ProgramDsm, Settings, StartHooks, run_in_job};

/// The C `main`.
type CMain = unsafe extern "C-unwind" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
/// libc's `__libc_start_main`.
type StartMain = unsafe extern "C" fn(
    CMain,
    c_int,
    *mut *mut c_char,
    Option<unsafe extern "C" fn()>,
    Option<unsafe extern "C" fn()>,
    Option<unsafe extern "C" fn()>,
    *mut c_void,
) -> c_int;

/// The program's real `main`.
static REAL_MAIN: AtomicUsize = AtomicUsize::new(0);
/// The initial thread's task while `main` runs (process 0).
static MAIN_TASK: AtomicUsize = AtomicUsize::new(0);

/// Environment variable: whose standard output appears. `threads` (the
/// default): what the program's threads print, in every process (what
/// the processes other than 0 printed before `main` started, such as
/// constructors' output, is dropped); `rank0`: process 0's only; `all`:
/// everything.
pub const OUTPUT_VAR: &str = ct_config::vars::MENPS_OMP_OUTPUT.name;
/// Environment variable: `0` (or `false`, `no`, `off`) runs the program without the runtime taking
/// over `main` (OpenMP entry points then fail).
pub const ENABLE_VAR: &str = ct_config::vars::MENPS_GOMP.name;

/// A function of the next object in the lookup order (libc's).
pub(crate) fn next_symbol(name: &core::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// libc's start-up, with `main` replaced for OpenMP programs.
///
/// # Safety
///
/// Called by the executable's start code with libc's arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_start_main(
    main: CMain,
    argc: c_int,
    argv: *mut *mut c_char,
    init: Option<unsafe extern "C" fn()>,
    fini: Option<unsafe extern "C" fn()>,
    rtld_fini: Option<unsafe extern "C" fn()>,
    stack_end: *mut c_void,
) -> c_int {
    let real = next_symbol(c"__libc_start_main");
    if real.is_null() {
        die("cannot find libc's __libc_start_main");
    }
    // SAFETY: libc's function of this signature.
    let real: StartMain = unsafe { core::mem::transmute::<*mut c_void, StartMain>(real) };
    let take_over = {
        let exe = crate::image::read_executable();
        let off = match ct_config::vars::MENPS_GOMP.flag() {
            Ok(on) => on == Some(false),
            Err(e) => die(e),
        };
        !off && (exe.uses_openmp() || exe.contains(__libc_start_main as *const () as usize))
    };
    let main = if take_over {
        crate::affinity::restore_initial_thread();
        REAL_MAIN.store(main as usize, Ordering::Relaxed);
        program_main as CMain
    } else {
        main
    };
    // SAFETY: forwarded arguments.
    unsafe { real(main, argc, argv, init, fini, rtld_fini, stack_end) }
}

/// `exit`: from the program's `main` (process 0), it ends `main` as a
/// `return` would, so the other processes end with it; anywhere else it is
/// libc's `exit`.
///
/// # Safety
///
/// As libc's `exit`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn exit(status: c_int) -> ! {
    let task = crate::current_task().map_or(0, |t| t as *const crate::Task as usize);
    if task != 0 && task == MAIN_TASK.load(Ordering::Relaxed) {
        std::panic::resume_unwind(Box::new(ExitRequest(status)));
    }
    let real = next_symbol(c"exit");
    if real.is_null() {
        // SAFETY: ends the process.
        unsafe { libc::_exit(status) }
    }
    // SAFETY: libc's `exit`.
    let real: unsafe extern "C" fn(c_int) -> ! = unsafe { core::mem::transmute(real) };
    // SAFETY: as libc's `exit`.
    unsafe { real(status) }
}

/// `exit(status)` called by `main`, unwinding to [`program_main`].
struct ExitRequest(c_int);

/// The `main` libc calls: runs the program in the job.
unsafe extern "C-unwind" fn program_main(
    argc: c_int,
    argv: *mut *mut c_char,
    envp: *mut *mut c_char,
) -> c_int {
    match start(argc, argv as usize, envp as usize) {
        Ok(status) => status,
        Err(e) => {
            let _rt = RuntimeGuard::enter();
            // One line, and none for a failure that is another process's.
            menps_dsm::launch::report_failure("menps-gomp", &e);
            1
        }
    }
}

/// A job size announced by the environment (launcher or `mpirun`).
fn env_size(name: &str) -> usize {
    // Lenient: the launcher or the MPI library checks these properly.
    std::env::var(name)
        .ok()
        .and_then(|v| ct_config::parse::count(&v, 0, u64::MAX))
        .map_or(0, |n| n as usize)
}

/// Binds every function of the executable at start-up (`LD_BIND_NOW`) in a
/// job of several processes: lazy binding writes the executable's
/// `.got.plt`, which shares pages with `.data` and so is DSM memory, in
/// whichever process first calls a function — the same value in every
/// process, but two processes writing one word between barriers is a data
/// race for the DSM. A process of such a job started without it
/// re-executes itself with it; a program starting a job sets it for its
/// processes.
fn ensure_bind_now(argv: *const *const c_char) {
    if std::env::var_os("LD_BIND_NOW").is_some_and(|v| !v.is_empty()) {
        return;
    }
    let in_job = [
        menps_dsm::launch::env::SIZE,
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
    ]
    .iter()
    .any(|v| env_size(v) > 1);
    let starting = env_size(menps_dsm::launch::env::NPROCS) > 1;
    if !in_job && !starting {
        return;
    }
    // SAFETY: the program's only thread so far sets a variable.
    unsafe { std::env::set_var("LD_BIND_NOW", "1") };
    if in_job {
        // SAFETY: libc's argument vector; execv returns only on failure.
        unsafe { libc::execv(c"/proc/self/exe".as_ptr(), argv) };
        die("cannot re-execute the program with LD_BIND_NOW=1 (set it yourself)");
    }
}

/// Joins (or starts) the job and runs `main`.
fn start(argc: c_int, argv: usize, envp: usize) -> Result<c_int, Error> {
    let _rt = RuntimeGuard::enter();
    // The runtime's warnings reach the C program's stderr (a C program has
    // no logger of its own).
    ct_worker::log_to_stderr();
    ensure_bind_now(argv as *const *const c_char);
    let settings = Builder::new().settings()?;
    // A job of one process needs no launcher (nor address agreement).
    let alone = std::env::var_os(menps_dsm::launch::env::RANK).is_none()
        && !menps_dsm::launch::under_mpirun()
        && env_size(menps_dsm::launch::env::NPROCS) <= 1;
    let com: Com = if alone {
        menps_dsm::com::AnyCom::Shm(menps_dsm::com::ShmCom::single()?)
    } else {
        menps_dsm::launch::Builder::new()
            .default_nprocs(1)
            .init_or_relaunch()?
    };
    let rank = com.rank();
    if rank != 0 {
        let output = ct_config::vars::MENPS_OMP_OUTPUT
            .choice()
            .map_err(|e| Error::Config(e.to_string()))?;
        match output {
            Some("all") => {}
            Some("rank0") => silence_stdout(),
            _ => drop_pending_stdout(),
        }
    }
    let hooks = StartHooks {
        extra_stacks: TASK_STACKS,
        uneven_teams: true,
        after_dsm: Some(after_dsm),
        no_program_threads: Some(crate::threads::no_program_threads),
    };
    let inner = settings.clone();
    let r = run_in_job(com, &settings, hooks, move || {
        run_main(&inner, argc, argv, envp)
    });
    crate::heap::deactivate();
    match r {
        Ok(Some(status)) => Ok(status),
        Ok(None) => Ok(0),
        Err(e) if rank == 0 => Err(e),
        Err(e) => Err(Error::Config(format!("{e} (process {rank})"))),
    }
}

/// Stacks per process for tasks (tasks beyond them run undeferred).
const TASK_STACKS: usize = 256;

/// Sends this process's standard output to `/dev/null`.
fn silence_stdout() {
    // SAFETY: open/dup2/close on descriptors this function owns.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if fd >= 0 {
            libc::dup2(fd, 1);
            libc::close(fd);
        }
    }
}

/// Drops what this process's `stdout` holds but has not written.
fn drop_pending_stdout() {
    unsafe extern "C" {
        static mut stdout: *mut libc::FILE;
        fn __fpurge(f: *mut libc::FILE);
    }
    // SAFETY: libc's stdout stream, purged by the process's only thread.
    unsafe { __fpurge(stdout) };
}

/// Writes out every process's buffered output at a synchronisation point
/// of a job of several processes, so that output appears in the order the
/// program's synchronisation gives it (threads of one process share one
/// buffer; those of different processes do not).
pub(crate) fn flush_output() {
    if menps_omp::num_processes() > 1 {
        // SAFETY: fflush(NULL) flushes every output stream.
        unsafe { libc::fflush(core::ptr::null_mut()) };
    }
}

/// Runs collectively once the DSM exists: the C heap and globals move into
/// it when the job has several processes.
fn after_dsm(dsm: &'static ProgramDsm) -> Result<(), Error> {
    if dsm.nprocs() > 1 {
        crate::image::adopt(dsm)?;
        crate::heap::activate();
    }
    crate::tls::install(&crate::image::read_executable(), dsm);
    Ok(())
}

/// Process 0's `main`, on a DSM call stack.
fn run_main(settings: &Settings, argc: c_int, argv: usize, envp: usize) -> c_int {
    let rt = crate::rt();
    let nthreads = rt.team_size.load(Ordering::Relaxed);
    if rt.dsm.nprocs() == 1 && nthreads > rt.team.workers() {
        // More team threads than workers: a thread that waits by flushing
        // in a loop must let the others of its worker run.
        let exe = crate::image::read_executable();
        if let Err(e) = crate::atomics::install(&exe, crate::atomics::Patching::Fences) {
            die(e);
        }
    }
    let initial = {
        let _rt = RuntimeGuard::enter();
        let t = Box::new(CThread::initial(nthreads, settings.schedule));
        t.task.thread.set(&*t);
        t
    };
    let old = enter_task(&initial.task);
    MAIN_TASK.store(
        &initial.task as *const crate::Task as usize,
        Ordering::Relaxed,
    );
    // `argv` moves to memory every process can read (a region may be
    // given pointers into it).
    let argv = if rt.dsm.nprocs() > 1 {
        copy_argv(argc, argv as *mut *mut c_char)
    } else {
        argv as *mut *mut c_char
    };
    let real = REAL_MAIN.load(Ordering::Relaxed);
    // SAFETY: the program's `main`, stored by `__libc_start_main`.
    let real: CMain = unsafe { core::mem::transmute::<usize, CMain>(real) };
    // `main`'s thread-locals: carrier 0 (see `tls`).
    crate::tls::enter(0);
    let r = std::panic::catch_unwind(|| {
        // SAFETY: libc's arguments for `main`.
        unsafe { real(argc, argv, envp as *mut *mut c_char) }
    });
    crate::tasks::wait_children(&initial.task);
    crate::tls::leave();
    MAIN_TASK.store(0, Ordering::Relaxed);
    leave_task(old);
    match r {
        Ok(status) => status,
        Err(p) => match p.downcast::<ExitRequest>() {
            Ok(e) => e.0,
            Err(p) => std::panic::resume_unwind(p),
        },
    }
}

/// Copies the argument vector into the DSM heap (`main`'s allocations are
/// DSM memory there).
fn copy_argv(argc: c_int, argv: *mut *mut c_char) -> *mut *mut c_char {
    let n = argc.max(0) as usize;
    // SAFETY: libc's argument vector: `argc` strings and a null; the copies
    // come from `malloc` in DSM context (the DSM heap) and stay alive for
    // the program's life.
    unsafe {
        let out = libc::malloc((n + 1) * 8) as *mut *mut c_char;
        if out.is_null() {
            return argv;
        }
        for i in 0..n {
            let s = *argv.add(i);
            let len = libc::strlen(s) + 1;
            let d = libc::malloc(len) as *mut c_char;
            if d.is_null() {
                return argv;
            }
            core::ptr::copy_nonoverlapping(s, d, len);
            *out.add(i) = d;
        }
        *out.add(n) = core::ptr::null_mut();
        out
    }
}
