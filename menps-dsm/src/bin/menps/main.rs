//! `menps`: starts a job of N processes of a program on this machine; runs
//! and builds OpenMP C programs on the libgomp replacement.
//!
//! ```text
//! menps run -n 4 [--backend shm|mpi] [--prefix-output] [--grace-ms 2000] [--timeout SECS] -- ./prog args
//! menps cc prog.c -o prog      # gcc -fopenmp, linked against libmenps_gomp.so
//! ```
//!
//! The program joins the job with `menps_dsm::launch::init` (or
//! `init_or_relaunch`). `menps` exits with 0 if every process exited with 0,
//! otherwise with the status of the first process that failed.

use std::ffi::OsString;
use std::process::ExitCode;

use menps_dsm::launch::{self, JobConfig, Program};

mod cli;
mod env;
mod openmp;

const USAGE: &str = "\
usage: menps run -n N [options] [--] PROGRAM [ARGS...]
       menps cc [GCC ARGS...]
       menps env            every variable read, its value and its source

Starts N processes of PROGRAM as one menps job on this machine (shm backend,
or mpirun with --backend mpi) and exits with their combined status: 0 if all exited with 0, otherwise the
status of the first that failed (128 + signal number for a signal). When one
process fails, the others get Error::PeerDied and are killed after a grace
period.

options:
  -n, --nprocs N       number of processes (default: MENPS_NPROCS, else 1)
  --backend NAME       `shm` (default), or `mpi`: start the job with mpirun
                       (MENPS_MPIRUN; the program needs the `mpi` feature)
  --prefix-output      prefix every output line with `[rank N] `
  --grace-ms MS        time the others get to exit after a failure (default 2000)
  --timeout SECS       kill the job after SECS seconds (exit status 124)
  -h, --help           this text

A PROGRAM built with `gcc -fopenmp` (linked against libgomp) runs on
libmenps_gomp.so, preloaded (MENPS_GOMP_LIB, default: next to menps): its
team threads are user-level threads, and with N > 1 its memory is shared
through the DSM. `menps cc` runs `gcc -fopenmp` (CC) linked against
libmenps_gomp.so instead of libgomp.

environment: MENPS_NPROCS, MENPS_BACKEND, MENPS_PREFIX_OUTPUT, MENPS_GRACE_MS, MENPS_GOMP_LIB,
MENPS_TIMEOUT_SECS, MENPS_RING_BYTES, MENPS_COLL_CHUNK_BYTES, MENPS_SHM_BARRIER
(options win over the environment). Each process gets MENPS_RANK, MENPS_SIZE, MENPS_BACKEND,
MENPS_CONTROL_FD, MENPS_PEER_FDS and MENPS_LAUNCHER_PID.";

fn fail(msg: &str) -> ExitCode {
    eprintln!("menps: {msg}\n\n{USAGE}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    // The library's warnings (a process that never joined the job, ...).
    ct_worker::log_to_stderr();
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some("run") => {
            args.remove(0);
        }
        Some("cc") => {
            args.remove(0);
            return match openmp::cc(args) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => {
                    eprintln!("menps: {e}");
                    ExitCode::from(2)
                }
            };
        }
        Some("env") => return env::run(&args[1..]),
        Some(other) => return fail(&format!("unknown command {other:?}")),
        None => return fail("missing command"),
    }

    let config = match JobConfig::default().with_env_overrides() {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    let (config, path, args) = match cli::parse_run(args, config) {
        Ok(cli::Run::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(cli::Run::Job {
            config,
            program,
            args,
        }) => (config, program, args),
        Err(msg) => return fail(&msg),
    };
    if let Err(e) = config.validate() {
        return fail(&e.to_string());
    }
    match openmp::preload_for(std::path::Path::new(&path)) {
        // SAFETY: the launcher has no other threads yet; its processes
        // inherit the variable.
        Ok(Some(preload)) => unsafe { std::env::set_var("LD_PRELOAD", preload) },
        Ok(None) => {}
        Err(e) => return fail(&e),
    }
    let program = Program {
        path,
        arg0: None,
        args,
    };
    match launch::run_job(&config, &program) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("menps: {e}");
            ExitCode::from(2)
        }
    }
}
