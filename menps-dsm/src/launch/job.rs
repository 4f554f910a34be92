//! The launcher: creates a job's control memory and sockets, starts the
//! processes, watches them, reports the first failure, stops the job.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{Backend, JobConfig, Program, env, output};
use crate::com::shm::control::Control;
use crate::com::{Error, Result};
use crate::sys;

/// One started process.
struct Proc {
    rank: usize,
    child: Child,
    pidfd: Option<OwnedFd>,
}

/// Exit code of the launcher for a process's status.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!(
            "was killed by signal {s} ({}){}",
            sys::signal_name(s),
            if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            }
        ),
        _ => format!("ended ({status})"),
    }
}

/// Runs `program` as a job of `config.nprocs` processes and waits for it.
/// Returns the exit code the launcher should exit with: 0 if every process
/// exited with 0; otherwise the first failed process's status (`128 +
/// signal` for a signal), or 124 if the job timed out.
///
/// Every process is started with `MENPS_*` variables that let
/// [`init`](super::init) join the job, `personality(ADDR_NO_RANDOMIZE)` and
/// `PR_SET_PDEATHSIG(SIGKILL)`. Messages about failures go to stderr,
/// prefixed `menps:` (a program that starts its own job with
/// [`init_or_relaunch`](super::init_or_relaunch) is named by its own name
/// instead, and says nothing more of a process that reported its failure
/// itself with [`report_failure`](super::report_failure)).
///
/// With [`Backend::Mpi`] the job is started by `mpirun` instead (see
/// [`run_mpi_job`]).
pub fn run_job(config: &JobConfig, program: &Program) -> Result<i32> {
    run_job_as(config, program, &Launcher::menps())
}

/// Who runs a job, for the launcher's messages.
pub(crate) struct Launcher {
    /// Prefix of its messages: `menps`, or the program's name.
    name: String,
    /// The program started the job itself ([`super::init_or_relaunch`]):
    /// the user never ran a launcher, so the failure of a process that
    /// reported it itself ([`super::report_failure`]) gets no second
    /// message, and others are named without launcher vocabulary.
    self_launched: bool,
}

impl Launcher {
    /// The `menps` launcher (the binary, or a caller of [`run_job`]).
    pub(crate) fn menps() -> Self {
        Launcher {
            name: "menps".into(),
            self_launched: false,
        }
    }

    /// `program` starting its own job.
    pub(crate) fn program(program: &Program) -> Self {
        let name = program
            .arg0
            .as_ref()
            .map(std::path::Path::new)
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "menps".into());
        Launcher {
            name,
            self_launched: true,
        }
    }
}

/// [`run_job`] by `who`.
pub(crate) fn run_job_as(config: &JobConfig, program: &Program, who: &Launcher) -> Result<i32> {
    config.validate()?;
    if config.backend == Backend::Mpi {
        return run_mpi_job_as(config, program, who);
    }
    let n = config.nprocs;
    // The time limit as an instant of the system-wide monotonic clock, so
    // that every process enforces it itself (the launcher may be stopped).
    let deadline = config
        .timeout
        .map(|t| sys::monotonic_ns().saturating_add(t.as_nanos() as u64));
    let (control, control_fd) = Control::create(n, config.ring_bytes, config.coll_chunk_bytes)?;

    // Descriptor-passing sockets: rank 0 <-> rank k.
    let mut sockets: Vec<(OwnedFd, OwnedFd)> = Vec::with_capacity(n.saturating_sub(1));
    for _ in 1..n {
        sockets.push(sys::seqpacket_pair()?);
    }

    // Orphaned descendants of the processes (a shell's children, say) are
    // re-parented to us instead of init, so that we can stop them at the end.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only sets a process attribute.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
    let launcher_pid = std::process::id();
    let mut procs: Vec<Proc> = Vec::with_capacity(n);
    let mut printers = Vec::new();
    for rank in 0..n {
        let mut keep: Vec<RawFd> = vec![control_fd.as_raw_fd()];
        let peer_fds = if rank == 0 {
            sockets
                .iter()
                .enumerate()
                .map(|(i, (a, _))| {
                    keep.push(a.as_raw_fd());
                    format!("{}:{}", i + 1, a.as_raw_fd())
                })
                .collect::<Vec<_>>()
                .join(",")
        } else {
            let b = &sockets[rank - 1].1;
            keep.push(b.as_raw_fd());
            format!("0:{}", b.as_raw_fd())
        };
        let mut cmd = Command::new(&program.path);
        if let Some(a0) = &program.arg0 {
            cmd.arg0(a0);
        }
        cmd.args(&program.args)
            .env(env::RANK, rank.to_string())
            .env(env::SIZE, n.to_string())
            .env(env::BACKEND, "shm")
            .env(env::CONTROL_FD, control_fd.as_raw_fd().to_string())
            .env(env::PEER_FDS, peer_fds)
            .env(env::LAUNCHER_PID, launcher_pid.to_string());
        if let Some(d) = deadline {
            cmd.env(env::JOB_DEADLINE_NS, d.to_string());
        }
        if rank != 0 {
            cmd.stdin(Stdio::null());
        }
        if config.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        // SAFETY: the closure runs in the child between fork and exec and only
        // makes async-signal-safe system calls (prctl, getppid, personality,
        // fcntl) on values prepared before the fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died before the prctl took effect.
                if libc::getppid() as u32 != launcher_pid {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                let persona = libc::personality(0xffff_ffff);
                if persona != -1 {
                    libc::personality((persona | libc::ADDR_NO_RANDOMIZE) as libc::c_ulong);
                }
                for &fd in &keep {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for p in &mut procs {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                }
                return Err(Error::BadConfig(format!(
                    "cannot start {:?} for rank {rank}: {e}",
                    program.path
                )));
            }
        };
        control
            .slot(rank)
            .pid
            .store(child.id(), std::sync::atomic::Ordering::Relaxed);
        if config.prefix_output {
            if let Some(out) = child.stdout.take() {
                printers.push(output::prefix_lines(rank, out, false));
            }
            if let Some(err) = child.stderr.take() {
                printers.push(output::prefix_lines(rank, err, true));
            }
        }
        let pidfd = sys::pidfd_open(child.id());
        procs.push(Proc { rank, child, pidfd });
    }
    // The processes hold their own copies now.
    drop(sockets);
    drop(control_fd);

    let code = supervise(config, &control, procs, who);
    reap_orphans();
    output::finish(printers, Duration::from_secs(2));
    Ok(code)
}

/// Runs `program` with `mpirun -n N` (`MENPS_MPIRUN`, default `mpirun`),
/// adding `--oversubscribe`, `--allow-run-as-root` when running as root, and
/// `--tag-output` for [`JobConfig::prefix_output`]; waits for it, killing it
/// after [`JobConfig::timeout`] (status 124). Returns `mpirun`'s exit code.
/// `mpirun` itself stops the job when a process fails. The program must be
/// built with the `mpi` feature and join as `AnyCom` or `MpiCom`.
pub fn run_mpi_job(config: &JobConfig, program: &Program) -> Result<i32> {
    run_mpi_job_as(config, program, &Launcher::menps())
}

/// [`run_mpi_job`] by `who`.
fn run_mpi_job_as(config: &JobConfig, program: &Program, who: &Launcher) -> Result<i32> {
    let mpirun = ct_config::vars::MENPS_MPIRUN
        .text()
        .map_err(|e| Error::BadConfig(e.to_string()))?
        .unwrap_or_else(|| ct_config::vars::MENPS_MPIRUN.default.into());
    let mut cmd = Command::new(&mpirun);
    cmd.args(["-n", &config.nprocs.to_string(), "--oversubscribe"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--allow-run-as-root");
    }
    if config.prefix_output {
        cmd.arg("--tag-output");
    }
    // `/proc/self/exe` would name `mpirun` itself in the processes it starts.
    cmd.arg(program.resolved_path()).args(&program.args);
    let mut child = cmd.spawn().map_err(|e| {
        Error::BadConfig(format!(
            "cannot start {mpirun:?} for the mpi backend: {e} (install OpenMPI, e.g. \
             `apt-get install openmpi-bin libopenmpi-dev`, or set {})",
            env::MPIRUN
        ))
    })?;
    let deadline = config.timeout.map(|t| Instant::now() + t);
    loop {
        if let Some(status) = child.try_wait().map_err(|e| sys::io_error("waitpid", &e))? {
            return Ok(exit_code(status));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            eprintln!(
                "{}: the job exceeded its time limit of {:.1} s ({}); killing mpirun",
                who.name,
                config.timeout.unwrap_or_default().as_secs_f64(),
                env::TIMEOUT_SECS
            );
            // SIGTERM lets mpirun stop its processes (SIGKILL would orphan
            // them); SIGKILL only if it does not exit within 5 s.
            // SAFETY: signalling our own child, which has not been reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let until = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() >= until {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return Ok(124);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Watches the processes until all have ended; returns the exit code.
fn supervise(config: &JobConfig, control: &Control, mut procs: Vec<Proc>, who: &Launcher) -> i32 {
    let start = Instant::now();
    let deadline = config.timeout.map(|t| start + t);
    let mut first_failure: Option<i32> = None;
    let mut failed_at: Option<Instant> = None;
    let mut killed = false;
    let mut timed_out = false;
    let n = procs.len();

    while !procs.is_empty() {
        // Reap whatever ended.
        let mut i = 0;
        while i < procs.len() {
            let status = procs[i].child.try_wait().unwrap_or_default();
            let Some(status) = status else {
                i += 1;
                continue;
            };
            let mut p = procs.swap_remove(i);
            let mut status = status;
            let ok = status.success();
            control.mark_ended(p.rank, ok);
            if !ok && first_failure.is_none() && !killed {
                // The processes watch each other too: the first death may
                // be another's, recorded by its peers before we reaped it
                // (and this one failed because of it). The job's status is
                // that first one's.
                if let Some(k) = control
                    .failed_rank()
                    .filter(|&r| r != p.rank)
                    .and_then(|r| procs.iter().position(|q| q.rank == r))
                {
                    let mut first = procs.swap_remove(k);
                    if let Ok(st) = first.child.wait() {
                        procs.push(p);
                        status = st;
                        p = first;
                    } else {
                        procs.push(first);
                    }
                }
                first_failure = Some(exit_code(status));
                failed_at = Some(Instant::now());
                if !who.self_launched {
                    eprintln!(
                        "menps: rank {} (pid {}) {}; stopping the job (the other processes get \
                         Error::PeerDied)",
                        p.rank,
                        p.child.id(),
                        describe(status)
                    );
                } else if control
                    .slot(p.rank)
                    .reported
                    .load(std::sync::atomic::Ordering::SeqCst)
                    == 0
                {
                    // The process did not say why it failed (a panic, a
                    // crash, an exit without a report): say which one it was.
                    super::output::write_line(&format!(
                        "{}: rank {} (pid {}) {}",
                        who.name,
                        p.rank,
                        p.child.id(),
                        describe(status)
                    ));
                }
            }
        }
        if procs.is_empty() {
            break;
        }
        let now = Instant::now();
        if !killed {
            if let Some(t) = failed_at
                && now >= t + config.grace
            {
                eprintln!(
                    "{}: killing the {} remaining process(es) after a grace period of {} ms",
                    who.name,
                    procs.len(),
                    config.grace.as_millis()
                );
                kill_all(&mut procs);
                killed = true;
            } else if let Some(d) = deadline
                && now >= d
            {
                eprintln!(
                    "{}: the job exceeded its time limit of {:.1} s ({}); killing its {} \
                     remaining process(es) of {n}",
                    who.name,
                    config.timeout.unwrap_or_default().as_secs_f64(),
                    env::TIMEOUT_SECS,
                    procs.len()
                );
                timed_out = true;
                kill_all(&mut procs);
                killed = true;
            }
        }
        // Sleep until a process ends or the next deadline.
        let mut wake: Option<Instant> = None;
        if !killed {
            if let Some(t) = failed_at {
                wake = Some(t + config.grace);
            } else if let Some(d) = deadline {
                wake = Some(d);
            }
        }
        let timeout = wake.map(|w| w.saturating_duration_since(Instant::now()));
        let fds: Option<Vec<BorrowedFd<'_>>> = procs
            .iter()
            .map(|p| p.pidfd.as_ref().map(|f| f.as_fd()))
            .collect();
        match fds {
            Some(fds) => {
                sys::poll_readable(&fds, timeout);
            }
            // No pidfds (old kernel): poll the children.
            None => std::thread::sleep(
                timeout
                    .unwrap_or(Duration::MAX)
                    .min(Duration::from_millis(10)),
            ),
        }
    }
    warn_unjoined(control, n, who);
    if timed_out {
        124
    } else {
        first_failure.unwrap_or(0)
    }
}

/// Says so if processes ended without ever joining the job: the program
/// does not start a DSM or communicator (it ran as independent copies).
fn warn_unjoined(control: &Control, n: usize, who: &Launcher) {
    let never: Vec<usize> = (0..n)
        .filter(|&r| {
            control
                .slot(r)
                .joined
                .load(std::sync::atomic::Ordering::Acquire)
                == 0
        })
        .collect();
    if never.len() == n {
        log::warn!(
            "{}: no process joined the job: the program ran {n} times as independent copies \
             (a menps program joins with menps_dsm::launch::init or init_or_relaunch)",
            who.name
        );
    } else if !never.is_empty() {
        log::warn!(
            "{}: rank(s) {never:?} ended without joining the job",
            who.name
        );
    }
}

/// Kills and reaps the descendants of the job's processes that were
/// re-parented to us (we are a child subreaper), so that nothing of the job
/// outlives it. The launcher has no other children at this point.
fn reap_orphans() {
    for _ in 0..100 {
        let mut pids = Vec::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for t in tasks.flatten() {
                if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
                    pids.extend(
                        list.split_whitespace()
                            .filter_map(|p| p.parse::<i32>().ok()),
                    );
                }
            }
        }
        if pids.is_empty() {
            return;
        }
        for &pid in &pids {
            // SAFETY: `pid` is our own child (listed under /proc/self), so it
            // cannot have been reaped and reused before we wait for it below.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

fn kill_all(procs: &mut [Proc]) {
    for p in procs {
        let _ = p.child.kill();
    }
}
