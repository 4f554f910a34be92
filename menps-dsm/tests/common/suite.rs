//! What the backends' communication suites (`shm.rs`, `mpi.rs`) share
//! beyond the scenarios themselves: the one list of tests every backend
//! runs (scenarios with their job sizes and the line every rank prints when
//! it passes), turned into `#[test]`s by
//! [`backend_scenario_tests!`](crate::backend_scenario_tests) over the
//! suite's own way to run a job; the failure scenario both start alike
//! ([`kill9_wait`]); and the check of what every rank said.

use std::time::{Duration, Instant};

use menps_dsm::com::{Communicator, Error, Source};

use super::{ADDS, JobRun, LOCK_ITERS};

/// The line every rank prints (after `rank N: `) when `scenario` passed on
/// `n` processes.
pub fn passed_line(scenario: &str, n: usize) -> String {
    match scenario {
        "rma" => "rma ok".into(),
        "fetch_add" => format!("fetch_add ok, total {}", n as u64 * ADDS),
        "cas_lock" => format!("cas_lock ok, total {}", n as u64 * LOCK_ITERS),
        "p2p" => "p2p ok".into(),
        "coll" => "coll ok".into(),
        "addresses" => "addresses identical".into(),
        "ult" => "ult ok".into(),
        other => panic!("not a shared scenario: {other}"),
    }
}

/// Runs `scenario` on each of `sizes` processes with `run` (the suite's:
/// run the job, check that every rank printed `line`).
pub fn on_sizes(scenario: &str, sizes: &[usize], run: fn(&str, usize, &str)) {
    for &n in sizes {
        run(scenario, n, &passed_line(scenario, n));
    }
}

/// The shared tests, over `$run: fn(scenario, processes, line)`, which runs
/// the job on the suite's backend and checks that every rank printed `line`.
#[macro_export]
macro_rules! backend_scenario_tests {
    ($run:path) => {
        #[test]
        fn rma_put_get_all_sizes_2_3_4_procs() {
            common::suite::on_sizes("rma", &[2, 3, 4], $run);
        }

        #[test]
        fn fetch_add_4_procs_exact_total() {
            common::suite::on_sizes("fetch_add", &[4], $run);
        }

        #[test]
        fn cas_spinlock_counter_3_and_4_procs() {
            common::suite::on_sizes("cas_lock", &[3, 4], $run);
        }

        #[test]
        fn p2p_tags_and_ordering_2_3_4_procs() {
            common::suite::on_sizes("p2p", &[2, 3, 4], $run);
        }

        #[test]
        fn collectives_2_3_4_procs() {
            common::suite::on_sizes("coll", &[2, 3, 4], $run);
        }

        #[test]
        fn identical_addresses_in_every_process() {
            common::suite::on_sizes("addresses", &[3], $run);
        }

        #[test]
        fn user_level_threads_wait_without_blocking_others() {
            common::suite::on_sizes("ult", &[3], $run);
        }
    };
}

/// Asserts that `out` (`run`'s stdout or stderr) contains `want(r)` for
/// every rank `r` of `ranks`; shows the whole run when one is missing.
pub fn assert_ranks_said(
    run: &JobRun,
    out: &str,
    ranks: impl IntoIterator<Item = usize>,
    want: impl Fn(usize) -> String,
) {
    for r in ranks {
        let want = want(r);
        assert!(out.contains(&want), "missing {want:?}: {}", run.dump());
    }
}

/// The shared part of the suites' `kill9` scenarios, in a job of 4: rank 2
/// takes a CAS lock, every rank prints `waiting` after a barrier, and rank
/// 2 kills itself (`SIGKILL`) 300 ms later. Meanwhile rank 0 waits in a
/// barrier, rank 1 in a receive from rank 2 and rank 3 spins on the lock
/// (calling `pause` between attempts). Returns what the rank waited in, how
/// the wait ended (`Ok`: it returned normally, which is wrong) and how long
/// it took.
pub fn kill9_wait<C: Communicator>(
    com: &C,
    pause: fn(),
) -> (&'static str, Result<(), Error>, Duration) {
    let me = com.rank();
    assert_eq!(com.size(), 4);
    let win = com.create_window(64).unwrap();
    let lock = win.at(0, 0);
    if me == 2 {
        assert_eq!(com.compare_and_swap(lock, 0, 3).unwrap(), 0);
    }
    com.barrier().unwrap();
    println!("rank {me}: waiting");
    if me == 2 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: sending a signal to ourselves.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!();
    }
    let start = Instant::now();
    let (what, r) = match me {
        0 => ("barrier", com.barrier()),
        1 => ("recv", com.recv(Source::Rank(2), 5).map(drop)),
        _ => loop {
            match com.compare_and_swap(lock, 0, me as u64 + 1) {
                Ok(0) => panic!("got a lock held by a dead process"),
                Ok(_) => pause(),
                Err(e) => break ("cas spin", Err(e)),
            }
        },
    };
    (what, r, start.elapsed())
}
