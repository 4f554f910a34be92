//! Multi-process tests of the shm backend and the launcher.
//!
//! Each test *drives* a job: it runs this test binary again, filtered to
//! [`job_entry`], with `MENPS_TEST_SCENARIO` naming what the processes do and
//! `MENPS_NPROCS` their count. That process calls `init_or_relaunch`, so it
//! becomes the launcher and re-executes itself N times; in those processes
//! the same call joins the job and the scenario runs. The driver
//! - kills the job's whole process group and fails if it takes longer than
//!   [`JOB_LIMIT`] (a hang is a failure),
//! - checks the exit status and the output,
//! - checks that no process of the job is left (every process carries a
//!   unique `MENPS_TEST_JOB` tag in its environment, looked up in `/proc`).
//!
//! Jobs run one at a time (a lock), so timing assertions hold on 2 cores.
//! The scenarios shared with the other backends' suites, their list of
//! tests (`common/suite.rs`) and the driver are in `common/`.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use ct_worker::{OsThreads, Ult, UltItf};
use menps_dsm::com::{Coll, Comm, Communicator, Error, P2p, ShmCom, Source};

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
    match name.as_str() {
        "ult" => {
            let com = join::<Ult>();
            scenario_ult(com);
        }
        "ult_bell" => scenario_ult_bell(join::<Ult>()),
        "bell_ends" => scenario_bell_ends(join::<Ult>()),
        "barrier_algorithm" => {
            let com = join::<OsThreads>();
            println!("rank {}: barrier {}", com.rank(), com.barrier_algorithm());
            common::scenario_coll(&com);
        }
        _ if name.starts_with(ON_ULT) => {
            // The scenario in a user-level thread of a one-worker runtime:
            // its waits park, and the doorbell's watcher wakes them.
            let com = join::<Ult>();
            let rt = ct_worker::Runtime::builder().workers(1).build().unwrap();
            rt.block_on(|| run_scenario(&name[ON_ULT.len()..], &com));
        }
        _ => {
            let com = join::<OsThreads>();
            run_scenario(&name, &com);
        }
    }
}

/// Prefix of a scenario name: run the scenario in a user-level thread.
const ON_ULT: &str = "ult:";

fn join<U: UltItf>() -> ShmCom<U> {
    menps_dsm::launch::Builder::new()
        .default_nprocs(2)
        .grace(Duration::from_secs(3))
        .init_or_relaunch::<ShmCom<U>>()
        .unwrap_or_else(|e| {
            eprintln!("cannot join the job: {e}");
            std::process::exit(3)
        })
}

fn run_scenario<C: Communicator>(name: &str, com: &C) {
    if run_common_scenario(name, com) {
        return;
    }
    match name {
        "kill9" => scenario_kill9(com),
        "panic" => scenario_panic(com),
        "exit_early" => scenario_exit_early(com),
        "block_forever" => scenario_block_forever(com),
        "aslr" => scenario_aslr(com),
        "barrier_mismatch" => scenario_barrier_mismatch(com),
        "stopped_peer" => scenario_stopped_peer(com),
        "launcher_stopped" => scenario_launcher_stopped(com),
        "launcher_stopped_timeout" => scenario_launcher_stopped_timeout(com),
        "report_same" => scenario_report_same(com),
        "report_one" => scenario_report_one(com),
        "report_long" => scenario_report_long(com),
        other => panic!("unknown scenario {other}"),
    }
}

/// The pid of this job's launcher (which sets `MENPS_LAUNCHER_PID`).
fn launcher_pid() -> i32 {
    std::env::var("MENPS_LAUNCHER_PID")
        .unwrap()
        .parse()
        .unwrap()
}

/// The last rank stops the launcher (`SIGSTOP`) and, 300 ms later (the
/// others asleep in a barrier by then), kills itself: the others must see
/// `PeerDied` without the launcher's help — nobody rings their doorbells;
/// rank 0 then continues the launcher.
fn scenario_launcher_stopped<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let launcher = launcher_pid();
    com.barrier().unwrap();
    if me == n - 1 {
        // SAFETY: kill(2) to the launcher.
        unsafe { libc::kill(launcher, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) to ourselves.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!();
    }
    let start = Instant::now();
    let e = com.barrier().unwrap_err();
    let ms = start.elapsed().as_millis();
    println!("rank {me}: {e} after {ms} ms");
    assert!(
        matches!(e, Error::PeerDied { rank } if rank == n - 1),
        "rank {me}: {e}"
    );
    if me == 0 {
        // Let the launcher finish the job.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) to the launcher.
        unsafe { libc::kill(launcher, libc::SIGCONT) };
    }
    std::process::exit(1);
}

/// The last rank stops the launcher; then every rank waits for a message
/// that never comes. The job's time limit must end every rank anyway.
fn scenario_launcher_stopped_timeout<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let launcher = launcher_pid();
    com.barrier().unwrap();
    if me == n - 1 {
        // SAFETY: kill(2) to the launcher.
        unsafe { libc::kill(launcher, libc::SIGSTOP) };
    }
    let r = com.recv(Source::Rank((me + 1) % n), 99);
    panic!("rank {me}: a message that nobody sent: {r:?}");
}

/// Rank 1 stops itself (`SIGSTOP`) before a barrier; the last rank
/// continues it after 2.5 s. Meanwhile the others' watchdog (1 s in the
/// test) reports the wait and names the stopped rank.
fn scenario_stopped_peer<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let pids = com.allgather(&std::process::id().to_le_bytes()).unwrap();
    let pid1 = u32::from_le_bytes(pids[4..8].try_into().unwrap());
    if me == n - 1 {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2500));
            // SAFETY: kill(2) with a pid of this job.
            unsafe { libc::kill(pid1 as i32, libc::SIGCONT) };
        });
    }
    if me == 1 {
        // SAFETY: raise(3) stops this process until SIGCONT.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
    match com.barrier() {
        Ok(()) => println!("rank {me}: stopped peer ok"),
        // MENPS_WATCHDOG_FAIL=1.
        Err(Error::Stalled(msg)) => {
            println!("rank {me}: stalled: {msg}");
            std::process::exit(7);
        }
        Err(e) => panic!("rank {me}: {e}"),
    }
}

/// Rank 0 calls an allgather while the others call a barrier: every rank
/// gets `CollectiveMismatch` (not only the one whose collective carried
/// data), and the collectives stay in step.
fn scenario_barrier_mismatch<C: Communicator>(com: &C) {
    let me = com.rank();
    let e = if me == 0 {
        com.allgather(&[1u8; 8]).unwrap_err()
    } else {
        com.barrier().unwrap_err()
    };
    assert!(
        matches!(e, menps_dsm::com::Error::CollectiveMismatch(_)),
        "rank {me}: {e}"
    );
    assert!(e.to_string().contains("barrier"), "{e}");
    let ranks = com.allgather(&[me as u8]).unwrap();
    assert_eq!(ranks, (0..com.size() as u8).collect::<Vec<_>>());
    com.barrier().unwrap();
    println!("rank {me}: mismatch ok");
}

/// A rank runs without address-space randomisation, a program it executes
/// with it.
fn scenario_aslr<C: Communicator>(com: &C) {
    let persona = |text: &str| u64::from_str_radix(text.trim(), 16).expect("a hex personality");
    const NO_RANDOMIZE: u64 = 0x0040000;
    let mine = persona(&std::fs::read_to_string("/proc/self/personality").unwrap());
    assert_ne!(mine & NO_RANDOMIZE, 0, "the rank itself runs without ASLR");
    let out = std::process::Command::new("cat")
        .arg("/proc/self/personality")
        .output()
        .expect("run cat");
    let child = persona(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        child & NO_RANDOMIZE,
        0,
        "a program the rank executes has ASLR"
    );
    println!("rank {}: aslr ok", com.rank());
}

/// Rank 2 takes a CAS lock, then is killed with SIGKILL. Rank 0 waits in a
/// barrier, rank 1 in a receive from rank 2, rank 3 spins on the lock: each
/// must get `PeerDied { rank: 2 }` within 10 s.
fn scenario_kill9<C: Communicator>(com: &C) {
    let me = com.rank();
    let (what, r, took) = kill9_wait(com, std::thread::yield_now);
    let err = r.unwrap_err();
    let ms = took.as_millis();
    assert_eq!(err, Error::PeerDied { rank: 2 }, "rank {me}");
    assert!(ms < 10_000, "detection took {ms} ms");
    println!("rank {me} detected {err:?} in {what} after {ms} ms: {err}");
    // Every later blocking call fails too.
    assert_eq!(com.barrier(), Err(Error::PeerDied { rank: 2 }));
}

/// Rank 1 panics; the others, in a barrier, get `PeerDied { rank: 1 }`.
fn scenario_panic<C: Communicator>(com: &C) {
    let me = com.rank();
    com.barrier().unwrap();
    if me == 1 {
        panic!("rank 1 panics on purpose");
    }
    let err = com.barrier().unwrap_err();
    assert_eq!(err, Error::PeerDied { rank: 1 });
    println!("rank {me} detected {err:?}");
}

/// Every rank fails with the same error at the same moment (a setting all
/// of them read, say) and reports it.
fn scenario_report_same<C: Communicator>(com: &C) {
    com.barrier().unwrap();
    let e = menps_dsm::dsm::DsmError::Config("MENPS_TEST_SETTING=x is not a number".into());
    menps_dsm::launch::report_failure("report_test", &e);
    std::process::exit(1)
}

/// Rank 1 fails with a cause of its own and reports it; the others learn of
/// it in a barrier (`PeerDied`) and report that, as every process of a
/// program reporting its errors does.
fn scenario_report_one<C: Communicator>(com: &C) {
    com.barrier().unwrap();
    if com.rank() == 1 {
        let e = menps_dsm::dsm::DsmError::OutOfMemory("rank 1's own cause".into());
        menps_dsm::launch::report_failure("report_test", &e);
        std::process::exit(2)
    }
    let e = menps_dsm::dsm::DsmError::Com(com.barrier().unwrap_err());
    menps_dsm::launch::report_failure("report_test", &e);
    std::process::exit(1)
}

/// The long report of rank `r` (distinct per rank).
fn long_report(r: usize) -> String {
    format!("cause of rank {r}: {}", format!("<{r}>").repeat(600))
}

/// Every rank fails at once with a long error of its own and reports it.
fn scenario_report_long<C: Communicator>(com: &C) {
    com.barrier().unwrap();
    let e = menps_dsm::dsm::DsmError::InvalidArgument(long_report(com.rank()));
    menps_dsm::launch::report_failure("report_test", &e);
    std::process::exit(1)
}

/// The last rank exits normally at once; the others' barrier can never
/// complete and returns `PeerExited`.
fn scenario_exit_early<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    if me == n - 1 {
        std::process::exit(0);
    }
    let err = com.barrier().unwrap_err();
    assert_eq!(err, Error::PeerExited { rank: n - 1 });
    let err2 = com.recv(Source::Rank(n - 1), 1).unwrap_err();
    assert_eq!(err2, Error::PeerExited { rank: n - 1 });
    println!("rank {me} detected {err:?}");
}

/// Everyone waits for a message nobody sends.
fn scenario_block_forever<C: Communicator>(com: &C) {
    com.barrier().unwrap();
    println!("rank {} blocking", com.rank());
    let r = com.recv(Source::Any, 99);
    panic!("recv returned {r:?}");
}

// ---------------------------------------------------------------------------
// User-level threads waiting on the doorbell (the job side).

/// Yields that a user-level thread must make while another thread of its
/// worker waits on the doorbell (`ult_bell`).
const BELL_YIELDS: u64 = 100_000;
/// How long it may try, at most: a bound on the scenario, never asserted.
const BELL_CAP: Duration = Duration::from_secs(5);

/// Threads of this process named like the shm doorbell watcher.
fn bell_watchers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "menps-bell")
        })
        .count()
}

/// Rank 1 runs one worker; on it, thread A waits for rank 0 — in a receive
/// (round 0), then in a barrier (round 1) — while thread B makes
/// [`BELL_YIELDS`] yields (or tries for [`BELL_CAP`]) and then tells rank 0
/// how many it made; only then does rank 0 send what A waits for (enter the
/// barrier). A waiting thread that sleeps its worker's OS thread on the
/// doorbell lets B run about once per sleep (a millisecond): B makes a few
/// thousand yields, not [`BELL_YIELDS`]. Rank 0 waits on its main thread
/// (an OS thread, which sleeps on the futex and starts no watcher).
fn scenario_ult_bell(com: ShmCom<Ult>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let com = Arc::new(com);
    let me = com.rank();
    assert_eq!(com.size(), 2);
    if me == 0 {
        for round in 0..2 {
            let (_, m) = com.recv(Source::Rank(1), 1).unwrap();
            let yields = u64::from_le_bytes(m.try_into().unwrap());
            println!("rank 0: round {round}: rank 1 yielded {yields} times");
            if round == 0 {
                com.send(1, 2, b"go").unwrap();
            } else {
                com.barrier().unwrap();
            }
        }
        assert_eq!(bell_watchers(), 0, "an OS thread's waits need no watcher");
    } else {
        let rt = ct_worker::Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            for round in 0..2 {
                let waiting = Arc::new(AtomicBool::new(false));
                let a = {
                    let (com, waiting) = (com.clone(), waiting.clone());
                    ct_worker::spawn(move || {
                        waiting.store(true, Ordering::Release);
                        if round == 0 {
                            assert_eq!(com.recv(Source::Rank(0), 2).unwrap(), (0, b"go".to_vec()));
                        } else {
                            com.barrier().unwrap();
                        }
                    })
                };
                let b = {
                    let com = com.clone();
                    ct_worker::spawn(move || {
                        while !waiting.load(Ordering::Acquire) {
                            ct_worker::yield_now();
                        }
                        let start = Instant::now();
                        let mut yields = 0u64;
                        while yields < BELL_YIELDS && start.elapsed() < BELL_CAP {
                            ct_worker::yield_now();
                            yields += 1;
                        }
                        com.send(0, 1, &yields.to_le_bytes()).unwrap();
                        yields
                    })
                };
                let yields = b.join();
                a.join();
                println!("rank 1: round {round}: yielded {yields} times while a thread waited");
            }
        });
    }
    com.barrier().unwrap();
    println!("rank {me}: ult_bell ok");
}

/// Rank 1's user-level thread waits in a receive until another thread of
/// its worker has seen the doorbell watcher start (or [`BELL_CAP`] passed):
/// one watcher while the communicator lives, none once it is dropped. Rank
/// 0 (on its main thread) never has one.
fn scenario_bell_ends(com: ShmCom<Ult>) {
    use std::sync::Arc;
    let com = Arc::new(com);
    let me = com.rank();
    let before = bell_watchers();
    let mut during = 0;
    if me == 0 {
        let (_, m) = com.recv(Source::Rank(1), 1).unwrap();
        println!("rank 0: rank 1 saw {} watcher(s)", m[0]);
        com.send(1, 2, b"go").unwrap();
    } else {
        let rt = ct_worker::Runtime::builder().workers(1).build().unwrap();
        during = rt.block_on(|| {
            let a = {
                let com = com.clone();
                ct_worker::spawn(move || com.recv(Source::Rank(0), 2).unwrap())
            };
            let start = Instant::now();
            let mut seen = bell_watchers();
            while seen == 0 && start.elapsed() < BELL_CAP {
                ct_worker::yield_now();
                seen = bell_watchers();
            }
            com.send(0, 1, &[seen as u8]).unwrap();
            a.join();
            seen
        });
    }
    com.barrier().unwrap();
    let com = Arc::into_inner(com).expect("the only reference left");
    drop(com);
    let after = bell_watchers();
    println!("rank {me}: watchers before {before}, while waiting {during}, after {after}");
}

/// Runs `scenario` as a job of `n` processes started by the library
/// launcher (this test binary relaunching itself).
fn job(scenario: &str, n: usize) -> JobRun {
    job_with(scenario, n, &[], |_, _| true)
}

fn job_with(
    scenario: &str,
    n: usize,
    env: &[(&str, &str)],
    during: impl FnMut(u32, &str) -> bool,
) -> JobRun {
    let mut cmd = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", n.to_string());
    for (k, v) in env {
        cmd.env(k, v);
    }
    drive(cmd, &new_tag(scenario), during)
}

#[test]
fn ranks_detect_a_dead_peer_while_the_launcher_is_stopped() {
    dead_peer_while_the_launcher_is_stopped("");
}

/// As above, every wait parked (the doorbell's watcher must wake the
/// waiters now and then to look at `/proc`: nobody rings).
#[test]
fn parked_user_level_threads_detect_a_dead_peer_while_the_launcher_is_stopped() {
    dead_peer_while_the_launcher_is_stopped(ON_ULT);
}

/// `launcher_stopped` on 3 processes, the scenario name behind `prefix`.
fn dead_peer_while_the_launcher_is_stopped(prefix: &str) {
    let run = job(&format!("{prefix}launcher_stopped"), 3);
    assert!(!run.status.success(), "{}", run.dump());
    for r in 0..2 {
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {r}: ")))
            .unwrap_or_else(|| panic!("rank {r} did not report: {}", run.dump()));
        let ms: u64 = line
            .rsplit_once(" after ")
            .and_then(|(_, t)| t.strip_suffix(" ms"))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!(ms < 3000, "rank {r} took {ms} ms: {}", run.dump());
    }
}

#[test]
fn the_time_limit_holds_while_the_launcher_is_stopped() {
    let mut first: Option<Instant> = None;
    let run = job_with(
        "launcher_stopped_timeout",
        2,
        &[("MENPS_TIMEOUT_SECS", "2")],
        // The launcher is stopped: continue it after 4 s, once the ranks
        // should have ended themselves.
        |pid, _| {
            let t = *first.get_or_insert_with(Instant::now);
            if t.elapsed() < Duration::from_secs(4) {
                return false;
            }
            // SAFETY: kill(2) to the job's launcher, which we started.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            true
        },
    );
    assert_eq!(run.code(), Some(124), "{}", run.dump());
    assert_ranks_said(&run, &run.stderr, 0..2, |r| {
        format!("menps: rank {r}: the job exceeded its time limit")
    });
    assert!(
        !run.stderr.contains("a message that nobody sent"),
        "{}",
        run.dump()
    );
}

#[test]
fn the_watchdog_names_a_stopped_peer() {
    watchdog_names_a_stopped_peer("");
}

/// As above, every wait parked (the watchdog's report needs the waiters to
/// wake without a ring).
#[test]
fn the_watchdog_names_a_stopped_peer_to_parked_user_level_threads() {
    watchdog_names_a_stopped_peer(ON_ULT);
}

/// `stopped_peer` on 3 processes, the scenario name behind `prefix`.
fn watchdog_names_a_stopped_peer(prefix: &str) {
    let run = job_with(
        &format!("{prefix}stopped_peer"),
        3,
        &[("MENPS_WATCHDOG_SECS", "1")],
        |_, _| true,
    );
    assert_ok(&run, 3, "stopped peer ok");
    assert_ranks_said(&run, &run.stderr, [0, 2], |r| {
        format!("menps: rank {r} has waited 1 s for every other rank (a barrier")
    });
    assert!(
        run.stderr.contains("rank 1 (pid ") && run.stderr.contains(") is stopped"),
        "{}",
        run.dump()
    );
}

#[test]
fn the_watchdog_can_give_up() {
    let run = job_with(
        "stopped_peer",
        3,
        &[("MENPS_WATCHDOG_SECS", "1"), ("MENPS_WATCHDOG_FAIL", "1")],
        |_, _| true,
    );
    assert!(!run.status.success(), "{}", run.dump());
    assert!(run.stderr.contains("giving up"), "{}", run.dump());
    assert!(
        run.stdout
            .contains("rank 0: stalled: rank 0 has waited 1 s")
            || run
                .stdout
                .contains("rank 2: stalled: rank 2 has waited 1 s"),
        "{}",
        run.dump()
    );
}

#[test]
fn a_barrier_against_another_collective_fails_on_every_rank() {
    for n in [2, 3] {
        let run = job("barrier_mismatch", n);
        assert_ok(&run, n, "mismatch ok");
    }
}

#[test]
fn programs_a_rank_executes_get_aslr_back() {
    let run = job("aslr", 2);
    assert_ok(&run, 2, "aslr ok");
}

/// Runs a shared scenario as a job of `n` processes; every rank must print
/// `line`.
fn run_shared(scenario: &str, n: usize, line: &str) {
    assert_ok(&job(scenario, n), n, line);
}

backend_scenario_tests!(run_shared);

/// The collectives (barriers checked to hold every rank back) under each
/// barrier algorithm `MENPS_SHM_BARRIER` names, on a power of two and on
/// sizes that are not, all more processes than CI's two processors.
#[test]
fn collectives_under_either_barrier_algorithm() {
    for algo in ["central", "dissemination"] {
        for n in [3, 4, 5] {
            let run = job_with(
                "barrier_algorithm",
                n,
                &[("MENPS_SHM_BARRIER", algo)],
                |_, _| true,
            );
            assert_ok(&run, n, "coll ok");
            assert_ranks_said(&run, &run.stdout, 0..n, |r| {
                format!("rank {r}: barrier {algo}")
            });
        }
    }
}

#[test]
fn an_unknown_barrier_algorithm_is_refused() {
    let run = job_with(
        "barrier_algorithm",
        2,
        &[("MENPS_SHM_BARRIER", "tree")],
        |_, _| true,
    );
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("MENPS_SHM_BARRIER") && run.stderr.contains("tree"),
        "{}",
        run.dump()
    );
    assert!(!run.stdout.contains("coll ok"), "{}", run.dump());
}

#[test]
fn kill9_is_detected_by_every_other_process() {
    kill9_is_detected("");
}

/// As above, every wait parked (the launcher's ring reaches them through
/// the doorbell's watcher).
#[test]
fn kill9_is_detected_by_parked_user_level_threads() {
    kill9_is_detected(ON_ULT);
}

/// `kill9` on 4 processes, the scenario name behind `prefix`.
fn kill9_is_detected(prefix: &str) {
    let run = job(&format!("{prefix}kill9"), 4);
    assert_eq!(
        run.code(),
        Some(128 + 9),
        "job must exit 137: {}",
        run.dump()
    );
    assert_ranks_said(&run, &run.stdout, [0, 1, 3], |r| {
        format!("rank {r} detected PeerDied {{ rank: 2 }}")
    });
    assert!(
        run.stderr.contains(": rank 2 (pid") && run.stderr.contains("signal 9 (SIGKILL)"),
        "launcher message: {}",
        run.dump()
    );
    assert!(run.elapsed < Duration::from_secs(10), "{}", run.dump());
}

#[test]
fn panic_is_detected_and_fails_the_job() {
    let run = job("panic", 3);
    assert_eq!(run.code(), Some(101), "{}", run.dump());
    assert_ranks_said(&run, &run.stdout, [0, 2], |r| {
        format!("rank {r} detected PeerDied {{ rank: 1 }}")
    });
    // The program started its own job: the launcher names the process
    // that failed without a report (a panic) under the program's name.
    assert!(run.stderr.contains(": rank 1 (pid"), "{}", run.dump());
    assert!(!run.stderr.contains("menps: rank 1 (pid"), "{}", run.dump());
    assert!(
        run.stderr.contains("exited with status 101"),
        "{}",
        run.dump()
    );
}

#[test]
fn early_normal_exit_gives_peer_exited() {
    let run = job("exit_early", 3);
    assert_ranks_said(&run, &run.stdout, [0, 1], |r| {
        format!("rank {r} detected PeerExited {{ rank: 2 }}")
    });
}

#[test]
fn job_timeout_kills_a_hung_job() {
    let run = job_with(
        "block_forever",
        2,
        &[("MENPS_TIMEOUT_SECS", "1.5")],
        |_, _| true,
    );
    assert_eq!(run.code(), Some(124), "{}", run.dump());
    assert!(run.stderr.contains("time limit"), "{}", run.dump());
    assert!(run.elapsed < Duration::from_secs(8), "{}", run.dump());
}

#[test]
fn killing_the_launcher_takes_every_process_down() {
    let run = job_with("block_forever", 3, &[], |launcher, out| {
        if out.matches("blocking").count() == 3 {
            // SAFETY: killing the launcher we started.
            unsafe { libc::kill(launcher as i32, libc::SIGKILL) };
            true
        } else {
            false
        }
    });
    // The launcher died by SIGKILL; `drive` checked no process is left.
    assert_eq!(run.status.signal(), Some(libc::SIGKILL), "{}", run.dump());
}

/// A user-level thread waiting on the doorbell parks; its worker runs its
/// other threads meanwhile. (With the worker's OS thread asleep in the
/// futex, the other thread makes a few thousand yields in the scenario's 5
/// s, not 100,000.)
#[test]
fn a_worker_runs_its_other_threads_while_one_waits_on_the_doorbell() {
    let run = job("ult_bell", 2);
    assert_ok(&run, 2, "ult_bell ok");
    for round in 0..2 {
        let want =
            format!("rank 1: round {round}: yielded {BELL_YIELDS} times while a thread waited");
        assert!(
            run.stdout.contains(&want),
            "missing {want:?}: {}",
            run.dump()
        );
    }
}

/// The doorbell watcher runs only for user-level threads that waited, and
/// ends with its communicator.
#[test]
fn the_doorbell_watcher_ends_with_the_communicator() {
    let run = job("bell_ends", 2);
    assert!(run.status.success(), "job failed: {}", run.dump());
    for (r, during) in [(0, 0), (1, 1)] {
        let want = format!("rank {r}: watchers before 0, while waiting {during}, after 0");
        assert!(
            run.stdout.contains(&want),
            "missing {want:?}: {}",
            run.dump()
        );
    }
}

/// CPU seconds used so far by all threads of process `pid` (scheduler
/// statistics, nanosecond resolution).
fn cpu_secs(pid: u32) -> f64 {
    let mut ns = 0u64;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e9
}

#[test]
fn idle_waiting_does_not_burn_cpu() {
    idle_waiting_burns_no_cpu("");
}

/// As above, every wait parked: the workers sleep, and the doorbell's
/// watchers wake them only now and then.
#[test]
fn parked_user_level_threads_do_not_burn_cpu() {
    idle_waiting_burns_no_cpu(ON_ULT);
}

/// `block_forever` on 4 processes, the scenario name behind `prefix`: the
/// ranks use well under 5 % of a core each while they wait.
fn idle_waiting_burns_no_cpu(prefix: &str) {
    let tag = new_tag("idle");
    let mut cmd = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, format!("{prefix}block_forever"))
        .env("MENPS_NPROCS", "4");
    let mut phase: Option<(Instant, Vec<(u32, f64)>)> = None;
    let mut used = None;
    let run = drive(cmd, &tag, |launcher, out| {
        if out.matches("blocking").count() < 4 {
            return false;
        }
        match &phase {
            None => {
                let ranks: Vec<u32> = processes_tagged(&tag)
                    .into_iter()
                    .filter(|&p| p != launcher)
                    .collect();
                phase = Some((
                    Instant::now(),
                    ranks.iter().map(|&p| (p, cpu_secs(p))).collect(),
                ));
                false
            }
            Some((t0, before)) if t0.elapsed() >= Duration::from_secs(2) => {
                let cpu: f64 = before.iter().map(|&(p, c)| cpu_secs(p) - c).sum();
                used = Some((cpu, t0.elapsed().as_secs_f64(), before.len()));
                // SAFETY: killing the launcher we started.
                unsafe { libc::kill(launcher as i32, libc::SIGKILL) };
                true
            }
            Some(_) => false,
        }
    });
    let (cpu, wall, ranks) = used.unwrap_or_else(|| panic!("never measured: {}", run.dump()));
    assert_eq!(ranks, 4, "{}", run.dump());
    // 4 processes blocked in recv for 2 s: well under 5 % of one core each.
    assert!(
        cpu < 0.05 * wall * 4.0,
        "{prefix}block_forever: idle ranks used {cpu:.3} s CPU in {wall:.1} s"
    );
    eprintln!("{prefix}block_forever: idle ranks used {cpu:.3} s CPU in {wall:.1} s");
}

#[test]
fn menps_binary_runs_and_prefixes_output() {
    let menps = env!("CARGO_BIN_EXE_menps");
    let exe = std::env::current_exe().unwrap();

    let mut cmd = clean_cmd(menps);
    cmd.args(["run", "-n", "3", "--prefix-output", "--"])
        .arg(&exe);
    entry_args(&mut cmd);
    cmd.env(SCENARIO, "hello");
    let run = drive(cmd, &new_tag("menps-hello"), |_, _| true);
    assert!(run.status.success(), "{}", run.dump());
    for r in 0..3 {
        let want = format!("[rank {r}] hello {r} of 3");
        assert!(
            run.stdout.lines().any(|l| l == want),
            "missing {want:?}: {}",
            run.dump()
        );
    }

    let mut cmd = clean_cmd(menps);
    cmd.args([
        "run",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "echo rank=$MENPS_RANK size=$MENPS_SIZE",
    ]);
    let run = drive(cmd, &new_tag("menps-sh"), |_, _| true);
    assert!(run.status.success(), "{}", run.dump());
    for r in 0..2 {
        assert!(
            run.stdout.contains(&format!("rank={r} size=2")),
            "{}",
            run.dump()
        );
    }
    // A program that never joins the job: it ran, and the launcher says so.
    assert!(
        run.stderr.contains("no process joined the job"),
        "{}",
        run.dump()
    );

    let mut cmd = clean_cmd(menps);
    cmd.args(["run", "-n", "2", "--grace-ms", "200", "--", "sh", "-c"])
        .arg("if [ $MENPS_RANK = 1 ]; then exit 3; fi; sleep 30");
    let run = drive(cmd, &new_tag("menps-fail"), |_, _| true);
    assert_eq!(run.code(), Some(3), "{}", run.dump());
    assert!(run.stderr.contains("rank 1") && run.stderr.contains("exited with status 3"));
    assert!(
        run.stderr.contains("killing the 1 remaining"),
        "{}",
        run.dump()
    );
    assert!(run.elapsed < Duration::from_secs(10), "{}", run.dump());

    for bad in [
        &["run", "-n", "0", "--", "true"][..],
        &["run", "-n", "2"],
        &["frobnicate"],
    ] {
        let out = Command::new(menps).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("usage: menps run"),
            "{bad:?}"
        );
    }
    let out = Command::new(menps).arg("--help").output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("MENPS_NPROCS"));
}

/// Lines of `stderr` that come from the launcher (a rank's end, named by
/// the launcher) rather than from the ranks' own reports.
fn launcher_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("menps:") || l.contains(" (pid "))
        .collect()
}

/// A failure every process hits alike is reported once, by one process,
/// naming its rank; the program started its own job, so no launcher
/// speaks.
#[test]
fn the_same_failure_on_every_process_is_one_report() {
    let run = job("report_same", 4);
    assert_eq!(run.code(), Some(1), "{}", run.dump());
    let reports: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("MENPS_TEST_SETTING"))
        .collect();
    assert_eq!(reports.len(), 1, "one report: {}", run.dump());
    assert!(
        reports[0].starts_with("report_test: rank ")
            && reports[0]
                .ends_with(": bad DSM configuration: MENPS_TEST_SETTING=x is not a number"),
        "{}",
        run.dump()
    );
    assert!(launcher_lines(&run.stderr).is_empty(), "{}", run.dump());
}

/// A process that fails with its own cause is the one report; the others,
/// which only learn that it died, stay quiet; no launcher message; the job
/// exits with the failed process's status.
#[test]
fn a_failure_is_reported_by_the_failed_process_alone() {
    let run = job("report_one", 3);
    assert_eq!(run.code(), Some(2), "{}", run.dump());
    assert_eq!(
        run.stderr.trim_end(),
        "report_test: rank 1: out of DSM memory: rank 1's own cause",
        "{}",
        run.dump()
    );
}

/// Long reports of processes failing at once arrive whole, one per line.
#[test]
fn reports_of_processes_failing_at_once_do_not_interleave() {
    let n = 4;
    let run = job("report_long", n);
    assert_eq!(run.code(), Some(1), "{}", run.dump());
    for r in 0..n {
        let want = format!(
            "report_test: rank {r}: invalid argument: {}",
            long_report(r)
        );
        assert!(
            run.stderr.lines().any(|l| l == want),
            "rank {r}'s report is not a line of its own: {}",
            run.dump()
        );
    }
    assert!(launcher_lines(&run.stderr).is_empty(), "{}", run.dump());
}
