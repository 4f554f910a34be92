//! Multi-process tests of the `mpi` backend, under `mpirun` (needs the `mpi`
//! feature and OpenMPI's `mpirun` on the `PATH`; `MENPS_TEST_MPIRUN`
//! overrides the command).
//!
//! Each test drives a job: `mpirun --oversubscribe -n N` (plus
//! `--allow-run-as-root` as root) runs this test binary, filtered to
//! [`job_entry`], with `MENPS_TEST_SCENARIO` naming what the processes do.
//! There the processes join as [`AnyCom`], which under `mpirun` is the MPI
//! backend. The driver (in `common/`) runs the job in its own process
//! group, kills it and fails after a time limit (a hang is a failure),
//! checks its output and that no process of it is left.
//!
//! The shared tests are the shm suite's (one list, `common/suite.rs`):
//! put/get of every size class with every misuse error, 4 × 10^4
//! `fetch_add` with the exact total and every old value once, a CAS
//! spinlock around a plain counter, p2p tag matching and ordering,
//! collectives with checked results and mismatch detection, identical
//! addresses, user-level threads — the RMA scenarios on the direct path and
//! on the offloaded path (with user-level and with OS threads).
//! MPI-specific: a killed rank aborts the job (nobody hangs), a rank that
//! finishes early gives `PeerExited`, and a crashing `OMPI_MCA_osc` setting
//! is refused with a message naming the fix.

#![cfg(feature = "mpi")]

use std::time::{Duration, Instant};

use ct_worker::{OsThreads, Ult, UltItf};
use menps_dsm::com::{AnyCom, Coll, Comm, Communicator, Error, P2p, ShmCom, Source};

mod common;
use common::suite::{assert_ranks_said, kill9_wait};
use common::*;

// ---------------------------------------------------------------------------
// The job side.

/// Entry point of the job processes (a no-op in a normal test run).
#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let offload = std::env::var("MENPS_MPI_OFFLOAD").as_deref() == Ok("1");
    match name.as_str() {
        "ult" => {
            let com = join::<Ult>();
            let mpi = com.as_mpi().expect("on the MPI backend");
            // One machine: direct unless asked for (see MpiConfig::offload).
            assert_eq!(mpi.is_offloaded(), offload);
            scenario_ult(com)
        }
        "shm_only" => {
            // The shm communicator cannot join an MPI job: a clear error,
            // not a hang or a relaunch.
            let e = menps_dsm::launch::init_or_relaunch::<ShmCom<OsThreads>>(2).unwrap_err();
            assert!(matches!(e, Error::BadConfig(_)), "{e:?}");
            let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default();
            println!("rank {rank}: shm_only refused: {e}");
        }
        _ if std::env::var_os(ON_ULT).is_some() => {
            // The scenario on the main user-level thread of a runtime (so
            // that offloaded operations park it).
            let com = join::<Ult>();
            assert_eq!(com.as_mpi().expect("MPI").is_offloaded(), offload);
            let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
            rt.block_on(|| assert!(run_common_scenario(&name, &com), "scenario {name}"));
            report_served::<Ult>(com.as_mpi().expect("MPI"))();
        }
        _ => {
            let com = join::<OsThreads>();
            let mpi = com.as_mpi().expect("not on the MPI backend");
            assert_eq!(mpi.is_offloaded(), offload);
            let served = report_served::<OsThreads>(mpi);
            if run_common_scenario(&name, &com) {
                served();
            } else {
                drop(served);
                match name.as_str() {
                    "late_peer" => scenario_late_peer(&com),
                    "kill9" => scenario_kill9(&com),
                    "finish_early" => scenario_finish_early(com),
                    other => panic!("unknown scenario {other}"),
                }
            }
        }
    }
}

/// With `MENPS_MPI_RMA=messages`: checks that RMA is served and returns a
/// closure that prints how many requests this process served so far
/// (`rank r: served N`; a scenario's work is done when it is called).
fn report_served<U: UltItf>(mpi: &menps_dsm::com::MpiCom<U>) -> impl Fn() + '_ {
    let asked = std::env::var("MENPS_MPI_RMA").as_deref() == Ok("messages");
    assert!(
        !asked || mpi.served_rma(),
        "MENPS_MPI_RMA=messages not applied"
    );
    move || {
        if let Some(n) = mpi.served_requests() {
            println!("rank {}: served {n}", mpi.rank());
        }
    }
}

/// Set: run the scenario on user-level threads.
const ON_ULT: &str = "MENPS_TEST_ON_ULT";

fn join<U: UltItf>() -> AnyCom<U> {
    menps_dsm::launch::init_or_relaunch::<AnyCom<U>>(2).unwrap_or_else(|e| {
        eprintln!("cannot join the job: {e}");
        std::process::exit(3)
    })
}

/// Rank 2 kills itself while rank 0 waits in a barrier, rank 1 in a receive
/// from rank 2 and rank 3 spins on a CAS lock rank 2 holds: `mpirun` must
/// abort the job (MPI reports no per-peer failures), and nobody may hang.
fn scenario_kill9<C: Communicator>(com: &C) {
    let (_, r, _) = kill9_wait(com, || std::thread::sleep(Duration::from_millis(1)));
    panic!(
        "rank {}: a wait for the killed rank returned {r:?}",
        com.rank()
    );
}

/// Rank 1 enters a barrier 5 s after the others: with a 2 s watchdog the
/// others report their wait (and give up with `MENPS_WATCHDOG_FAIL=1`,
/// printing `rank r: stalled: …` and exiting with status 4). The period
/// leaves room for a skewed start on a loaded machine (the job's start-up
/// collectives are watched too).
fn scenario_late_peer<C: Communicator>(com: &C) {
    let me = com.rank();
    if me == 1 {
        std::thread::sleep(Duration::from_secs(5));
    }
    match com.barrier() {
        Ok(()) => println!("rank {me}: late peer ok"),
        Err(e) => {
            println!("rank {me}: {e}");
            std::process::exit(4);
        }
    }
}

/// The last rank finishes normally (drops its communicator, finalising
/// MPI) at once; the others' barrier can never complete and returns
/// `PeerExited`, as does a receive from it.
fn scenario_finish_early(com: AnyCom<OsThreads>) {
    let (me, n) = (com.rank(), com.size());
    if me == n - 1 {
        drop(com);
        println!("rank {me}: left");
        return;
    }
    let start = Instant::now();
    let err = com.barrier().unwrap_err();
    assert_eq!(err, Error::PeerExited { rank: n - 1 });
    let err2 = com.recv(Source::Rank(n - 1), 1).unwrap_err();
    assert_eq!(err2, Error::PeerExited { rank: n - 1 });
    println!(
        "rank {me} detected {err:?} after {} ms",
        start.elapsed().as_millis()
    );
}

// ---------------------------------------------------------------------------
// The driver side.

/// The RMA paths: direct MPI calls from the calling OS thread, and the
/// offloading component with user-level or OS threads.
const PATHS: [(&str, &[(&str, &str)]); 3] = [
    ("direct", &[("MENPS_MPI_OFFLOAD", "0")]),
    (
        "offloaded, user-level threads",
        &[("MENPS_MPI_OFFLOAD", "1"), (ON_ULT, "1")],
    ),
    ("offloaded, OS threads", &[("MENPS_MPI_OFFLOAD", "1")]),
];

/// How many of [`PATHS`] a shared scenario runs on with `n` processes:
/// the RMA scenarios on every path (fewer on more processes, for time),
/// user-level threads direct and offloaded, the others direct.
fn paths_for(scenario: &str, n: usize) -> usize {
    match (scenario, n) {
        ("rma", 2) | ("fetch_add", _) => 3,
        ("rma", 3) | ("cas_lock", _) | ("ult", _) => 2,
        _ => 1,
    }
}

/// Runs a shared scenario under `mpirun -n n` on its paths; every rank must
/// print `line`.
fn run_shared(scenario: &str, n: usize, line: &str) {
    for (path, env) in &PATHS[..paths_for(scenario, n)] {
        let run = mpirun_job(scenario, n, env);
        assert_ok(&run, n, line);
        eprintln!("{scenario} on {n} processes, {path}: {:?}", run.elapsed);
    }
}

backend_scenario_tests!(run_shared);

#[test]
fn mpi_hello_under_mpirun() {
    let run = mpirun_job("hello", 3, &[]);
    assert!(run.status.success(), "{}", run.dump());
    for r in 0..3 {
        assert!(
            run.stdout.contains(&format!("hello {r} of 3")),
            "{}",
            run.dump()
        );
    }
}

/// A program that starts its own job (`init_or_relaunch`) with
/// `MENPS_BACKEND=mpi` hands its real path to `mpirun` (not
/// `/proc/self/exe`, which would be `mpirun` in the started processes).
#[test]
fn self_relaunch_with_the_mpi_backend_runs_the_program() {
    let tag = new_tag("self-mpi");
    let mut cmd = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, "hello")
        .env(JOB_TAG, &tag)
        .env("MENPS_BACKEND", "mpi")
        .env("MENPS_NPROCS", "2");
    let run = drive(cmd, &tag, |_, _| true);
    assert!(run.status.success(), "{}", run.dump());
    for r in 0..2 {
        assert!(
            run.stdout.contains(&format!("hello {r} of 2")),
            "{}",
            run.dump()
        );
    }
}

#[test]
fn menps_run_backend_mpi_starts_the_job_with_mpirun() {
    let tag = new_tag("menps-mpi");
    let mut cmd = clean_cmd(env!("CARGO_BIN_EXE_menps"));
    cmd.args([
        "run",
        "-n",
        "3",
        "--backend",
        "mpi",
        "--prefix-output",
        "--",
    ])
    .arg(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, "hello").env(JOB_TAG, &tag);
    let run = drive(cmd, &tag, |_, _| true);
    assert!(run.status.success(), "{}", run.dump());
    // mpirun's --tag-output prefix, then the scenario's line.
    assert_ranks_said(&run, &run.stdout, 0..3, |r| {
        format!("[1,{r}]<stdout>:hello {r} of 3")
    });
}

#[test]
fn mpi_killed_rank_aborts_the_job_without_hanging() {
    let run = mpirun_job("kill9", 4, &[]);
    assert!(!run.status.success(), "{}", run.dump());
    assert_eq!(
        run.stdout.matches("waiting").count(),
        4,
        "every rank reached the waits: {}",
        run.dump()
    );
    assert!(
        !run.stderr.contains("a wait for the killed rank returned"),
        "{}",
        run.dump()
    );
    assert!(run.elapsed < Duration::from_secs(15), "{}", run.dump());
}

#[test]
fn mpi_watchdog_reports_a_long_wait() {
    let run = mpirun_job("late_peer", 2, &[("MENPS_WATCHDOG_SECS", "2")]);
    assert!(run.status.success(), "{}", run.dump());
    assert_ranks_said(&run, &run.stdout, [0, 1], |r| {
        format!("rank {r}: late peer ok")
    });
    assert!(
        run.stderr.contains(
            "menps: rank 0 has waited 2 s for every other rank (a barrier); still waiting"
        ),
        "{}",
        run.dump()
    );
}

#[test]
fn mpi_watchdog_can_give_up() {
    let run = mpirun_job(
        "late_peer",
        2,
        &[("MENPS_WATCHDOG_SECS", "2"), ("MENPS_WATCHDOG_FAIL", "1")],
    );
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stdout
            .contains("rank 0: stalled: rank 0 has waited 2 s for every other rank (a barrier)"),
        "{}",
        run.dump()
    );
    assert!(run.stderr.contains("giving up"), "{}", run.dump());
}

#[test]
fn mpi_finished_rank_gives_peer_exited() {
    let run = mpirun_job("finish_early", 3, &[]);
    assert!(run.status.success(), "{}", run.dump());
    assert_ranks_said(&run, &run.stdout, [0, 1], |r| {
        format!("rank {r} detected PeerExited {{ rank: 2 }}")
    });
}

#[test]
fn mpi_crashing_osc_setting_is_refused_with_the_fix() {
    for bad in ["rdma", "pt2pt"] {
        let run = mpirun_job("hello", 2, &[("OMPI_MCA_osc", bad)]);
        assert!(!run.status.success(), "{}", run.dump());
        assert!(
            run.stderr
                .contains(&format!("OMPI_MCA_osc=\"{bad}\" cannot be used"))
                && run.stderr.contains("set OMPI_MCA_osc=sm,ucx"),
            "{}",
            run.dump()
        );
    }
    // Without the re-exec, an unset (empty) OMPI_MCA_osc must be asked for.
    let run = mpirun_job(
        "hello",
        2,
        &[("MENPS_MPI_REEXEC", "0"), ("OMPI_MCA_osc", "")],
    );
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("OMPI_MCA_osc is not set"),
        "{}",
        run.dump()
    );
}

#[test]
fn shm_communicator_under_mpirun_is_a_clear_error() {
    let run = mpirun_job("shm_only", 2, &[]);
    assert_ok(&run, 2, "shm_only refused");
    assert!(
        run.stdout.contains("started by mpirun") && run.stdout.contains("AnyCom"),
        "{}",
        run.dump()
    );
}

/// Served RMA (`MENPS_MPI_RMA=messages`, on windows of our own memory as
/// across machines): the RMA (every size) and atomic scenarios pass, on OS and user-level threads, and the
/// processes served each other's requests (a fallback to one-sided MPI
/// would serve none).
#[test]
fn mpi_served_rma_passes_the_rma_scenarios() {
    let served = [
        ("MENPS_MPI_RMA", "messages"),
        ("MENPS_MPI_WINDOWS", "create"),
    ];
    let on_ult = [
        ("MENPS_MPI_RMA", "messages"),
        ("MENPS_MPI_WINDOWS", "create"),
        (ON_ULT, "1"),
    ];
    // Not `cas_lock`: its 2 x 20,000 acquisitions of a spinlock homed at
    // rank 0, which takes it with local atomics and the others with round
    // trips, measure wake-up latency more than they test anything the RMA
    // and atomic scenarios do not (the DSM's locks are queue locks; their
    // scenarios run served in `dsm_mpi.rs`).
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&str, usize, Env); 4] = [
        ("rma", 2, &served),
        ("rma", 3, &on_ult),
        ("fetch_add", 4, &served),
        ("fetch_add", 2, &on_ult),
    ];
    for (scenario, n, env) in cases {
        let run = mpirun_job(scenario, n, env);
        assert!(run.status.success(), "{scenario} on {n}: {}", run.dump());
        let total: u64 = (0..n)
            .map(|r| {
                let prefix = format!("rank {r}: served ");
                run.stdout
                    .lines()
                    .find_map(|l| l.strip_prefix(&prefix)?.trim().parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("rank {r} did not report: {}", run.dump()))
            })
            .sum();
        assert!(
            total > 0,
            "{scenario} on {n}: nothing was served: {}",
            run.dump()
        );
        eprintln!(
            "{scenario} on {n}, served: {total} requests in {:?}",
            run.elapsed
        );
    }
}
