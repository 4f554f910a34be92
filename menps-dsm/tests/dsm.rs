//! Multi-process tests of the DSM on the shm backend, under every policy
//! combination.
//!
//! Each test drives jobs of this binary (see `common/`): the job processes
//! run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario (in
//! `dsm_scenarios/`), and the protocol chosen by `MENPS_DSM_*` variables.

use std::process::Command;

mod common;
mod dsm_scenarios;
use common::*;
use dsm_scenarios::RACE_OFFSET;

/// Entry point of the job processes (a no-op in a normal test run).
#[test]
fn job_entry() {
    dsm_scenarios::job_entry();
}

// ---------------------------------------------------------------------------
// The driver side.

/// The policy combinations every scenario runs under.
const POLICIES: [(&str, &str, &str); 8] = DSM_POLICIES;

fn job(
    scenario: &str,
    nprocs: usize,
    policy: (&'static str, &'static str, &'static str),
    extra: &[(&str, &str)],
) -> JobRun {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", nprocs.to_string())
        .envs(dsm_policy_env(policy))
        .envs(extra.iter().copied());
    let tag = new_tag(scenario);
    drive(cmd, &tag, |_, _| false)
}

fn run_everywhere(scenario: &str, procs: &[usize]) {
    run_everywhere_with(scenario, procs, &[]);
}

/// [`run_everywhere`] with more variables for the jobs.
fn run_everywhere_with(scenario: &str, procs: &[usize], extra: &[(&str, &str)]) {
    for &n in procs {
        for &pol in &POLICIES {
            let run = job(scenario, n, pol, extra);
            assert_passed(
                &run,
                &format!("{scenario} with {n} processes under {pol:?} {extra:?}"),
                n,
            );
        }
    }
}

#[test]
fn producer_consumer_all_policies() {
    run_everywhere("producer_consumer", &[2, 3, 4]);
}

#[test]
fn phased_writers_all_policies() {
    run_everywhere("phased_writers", &[2, 3]);
}

#[test]
fn handed_parts_all_policies() {
    run_everywhere("handed_parts", &[2, 3, 4]);
}

#[test]
fn deferred_merges_of_stale_pins_are_never_stale_all_policies() {
    run_everywhere("deferred_pin_merges", &[2, 3, 4]);
}

#[test]
fn speculative_reads_hold_the_latest_version_or_are_read_again_all_policies() {
    run_everywhere_with(
        "speculative_reads",
        &[2, 3, 4],
        &[("MENPS_DSM_REFRESH", "0")],
    );
}

#[test]
fn rewritten_runs_all_policies() {
    run_everywhere("rewritten_runs", &[2, 3]);
}

#[test]
fn idle_blocks_protected_soon_rewritten_ones_kept_all_policies() {
    run_everywhere("idle_limit", &[2, 3]);
}

#[test]
fn silent_rewrites_cost_no_transaction_all_policies() {
    run_everywhere("silent_rewrites", &[2, 3]);
}

#[test]
fn blocks_rewritten_unchanged_stop_faulting_all_policies() {
    run_everywhere("unchanged_rewrites", &[2, 3]);
}

#[test]
fn blocks_written_in_turn_released_on_the_version_taken_all_policies() {
    run_everywhere("taken_releases", &[2, 3]);
}

#[test]
fn false_sharing_all_policies() {
    run_everywhere("false_sharing", &[2, 3, 4]);
}

#[test]
fn shared_block_released_once_per_fence_all_policies() {
    run_everywhere("shared_block_rounds", &[2, 3]);
}

#[test]
fn mutex_increments_all_policies() {
    run_everywhere("mutex_increments", &[2, 4]);
}

#[test]
fn atomic_increments_all_policies() {
    run_everywhere("atomic_increments", &[2, 4]);
}

#[test]
fn atomics_run_at_the_home_all_policies() {
    run_everywhere("atomics_at_home", &[2, 3]);
}

#[test]
fn single_writer_never_stale_all_policies() {
    run_everywhere("single_writer", &[2, 3]);
}

#[test]
fn hot_blocks_refreshed_in_place_are_never_stale_all_policies() {
    run_everywhere("hot_refresh", &[2, 3]);
}

#[test]
fn prefetched_block_invalidated_before_use_is_never_stale_all_policies() {
    run_everywhere("prefetch_invalidated", &[2, 3]);
    // Every sequential pair of misses then prefetches.
    run_everywhere_with(
        "prefetch_invalidated",
        &[2, 3],
        &[("MENPS_DSM_REFRESH", "0")],
    );
}

#[test]
fn writes_to_blocks_a_dirty_scan_armed_are_never_lost_all_policies() {
    // The scenario's write sets are under the default threshold.
    let every_fence = ("MENPS_DSM_DIRTY_SCAN_MIN", "0");
    run_everywhere_with("dirty_scan", &[2, 3], &[every_fence]);
    run_everywhere("dirty_scan", &[2]);
    run_everywhere_with("dirty_scan", &[2], &[("MENPS_DSM_DIRTY_SCAN", "0")]);
}

#[test]
fn only_write_sets_over_the_threshold_are_scanned_all_policies() {
    run_everywhere("dirty_scan_threshold", &[2, 3]);
    run_everywhere_with(
        "dirty_scan_threshold",
        &[2],
        &[("MENPS_DSM_DIRTY_SCAN_MIN", "4M")],
    );
}

#[test]
fn partial_reads_are_never_stale_all_policies() {
    run_everywhere("partial_reads", &[2, 3]);
    // Every miss after the first round then re-reads an invalidated copy.
    run_everywhere_with("partial_reads", &[2, 3], &[("MENPS_DSM_REFRESH", "0")]);
    run_everywhere_with("partial_reads", &[2], &[("MENPS_DSM_PARTIAL_READ", "0")]);
}

#[test]
fn barrier_work_does_not_grow_with_touched_memory_all_policies() {
    run_everywhere("barrier_after_touch", &[2, 4]);
}

#[test]
fn single_writer_through_mutex_never_stale_all_policies() {
    run_everywhere("single_writer_mutex", &[2, 3]);
}

#[test]
fn flush_waits_for_a_publication_in_progress_all_policies() {
    run_everywhere("flush_while_publishing", &[2, 3]);
}

#[test]
fn flush_wavefront_all_policies() {
    run_everywhere("flush_wavefront", &[2, 3, 4]);
}

#[test]
fn user_level_threads_fault_park_and_migrate() {
    for &pol in &POLICIES[..3] {
        let run = job("ult_faults", 2, pol, &[]);
        assert!(run.status.success(), "{pol:?}: {}", run.dump());
        assert!(run.stdout.contains("rank 1: ok"), "{}", run.dump());
    }
}

#[test]
fn pinned_stack_in_dsm_all_policies() {
    run_everywhere("pinned_stack", &[2, 3]);
}

fn one_process(scenario: &str) -> JobRun {
    job(scenario, 1, POLICIES[0], &[])
}

#[test]
fn unrelated_segfaults_still_crash() {
    use std::os::unix::process::ExitStatusExt;
    for scenario in ["segv_outside", "segv_null"] {
        let run = one_process(scenario);
        assert!(!run.status.success(), "{scenario}: {}", run.dump());
        assert!(
            !run.stdout.contains("not reached"),
            "{scenario}: {}",
            run.dump()
        );
        // The launcher reports the signal.
        assert!(run.stderr.contains("SIGSEGV"), "{scenario}: {}", run.dump());
        let _ = run.status.signal();
    }
    let run = one_process("segv_outside");
    assert!(
        run.stderr
            .contains("inside the DSM range but in no segment"),
        "{}",
        run.dump()
    );
}

#[test]
fn stack_overflow_is_reported_with_the_dsm_active() {
    let run = one_process("overflow");
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("stack overflow in user-level thread"),
        "{}",
        run.dump()
    );
}

#[test]
fn disabled_fault_handling_crashes_clearly() {
    let run = one_process("disabled_thread");
    assert!(!run.status.success(), "{}", run.dump());
    assert!(!run.stdout.contains("not reached"), "{}", run.dump());
    assert!(
        run.stderr.contains("DSM fault handling disabled"),
        "{}",
        run.dump()
    );
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, "producer_consumer")
        .env("MENPS_NPROCS", "2")
        .env("MENPS_DSM_BLOCK_SIZE", "3000");
    let run = drive(cmd, &new_tag("bad_config"), |_, _| false);
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("block size 3000 is not a power of two"),
        "{}",
        run.dump()
    );
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, "producer_consumer")
        .env("MENPS_NPROCS", "2")
        .env("MENPS_DSM_WRITER", "sideways");
    let run = drive(cmd, &new_tag("bad_config"), |_, _| false);
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("MENPS_DSM_WRITER=\"sideways\""),
        "{}",
        run.dump()
    );
    // A variable set but blank is an error too, not the default.
    for (var, value, needle) in [
        ("MENPS_NPROCS", " ", "MENPS_NPROCS is set but empty"),
        // (Not MENPS_GRACE_MS: the job's builder gives a grace period, which
        // wins, so the variable is not read.)
        ("MENPS_RING_BYTES", "", "MENPS_RING_BYTES is set but empty"),
    ] {
        let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
        entry_args(&mut cmd);
        cmd.env(SCENARIO, "producer_consumer").env(var, value);
        if var != "MENPS_NPROCS" {
            cmd.env("MENPS_NPROCS", "2");
        }
        let run = drive(cmd, &new_tag("bad_config"), |_, _| false);
        assert!(!run.status.success(), "{var}={value:?}: {}", run.dump());
        assert!(
            run.stderr.contains(needle),
            "{var}={value:?}: {}",
            run.dump()
        );
    }
}

#[test]
fn mismatched_collectives_fail_on_every_rank() {
    for n in [2, 3] {
        let run = job("mismatch", n, POLICIES[0], &[]);
        assert!(!run.status.success(), "{}", run.dump());
        assert!(!run.stdout.contains("passed"), "{}", run.dump());
        for r in 0..n {
            assert!(
                run.stdout.contains(&format!("rank {r}: mismatch: ")),
                "rank {r} did not see the mismatch: {}",
                run.dump()
            );
            assert!(
                run.stdout.contains(&format!("rank {r}: next: ")),
                "rank {r}'s DSM went on after the mismatch: {}",
                run.dump()
            );
        }
    }
}

/// With `MENPS_DSM_ON_RACE=report`, racing words are reported once each in
/// the job — with the address and where it lies (the heap object's) and
/// the two processes — and the run goes on with one value everywhere.
#[test]
fn races_are_reported_once_and_the_run_goes_on() {
    for &pol in &POLICIES {
        let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
        entry_args(&mut cmd);
        cmd.env(SCENARIO, "races_reported")
            .env("MENPS_NPROCS", "3")
            .env("MENPS_DSM_ON_RACE", "report")
            .envs(dsm_policy_env(pol));
        let run = drive(cmd, &new_tag("races_reported"), |_, _| false);
        assert!(run.status.success(), "{pol:?}: {}", run.dump());
        let reports: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.contains("write-write data race at"))
            .collect();
        assert_eq!(
            reports.len(),
            2,
            "{pol:?}: two racing words: {}\n{}",
            run.dump(),
            run.stderr
        );
        let seg_word = format!("{:#x}", menps_dsm::internals::DSM_BASE + RACE_OFFSET);
        assert!(
            reports.iter().any(|l| l.contains(&seg_word)),
            "{pol:?}: no report names {seg_word}: {}",
            run.dump()
        );
        assert!(
            reports
                .iter()
                .any(|l| l.contains("in a heap object of 256 bytes") && l.contains("byte 100")),
            "{pol:?}: no report names the heap object: {}",
            run.dump()
        );
        assert!(
            reports
                .iter()
                .all(|l| l.contains("process 0") && l.contains("process 1")),
            "{pol:?}: reports name both processes: {}",
            run.dump()
        );
        // The same value everywhere in every round.
        for round in 0..5 {
            let seen: std::collections::BTreeSet<&str> = run
                .stdout
                .lines()
                .filter_map(|l| l.split_once(&format!(": round {round}: ")))
                .map(|(_, v)| v)
                .collect();
            assert_eq!(seen.len(), 1, "{pol:?}: round {round}: {}", run.dump());
        }
    }
}

#[test]
fn write_write_race_is_reported() {
    for &pol in &POLICIES {
        let run = job("race", 3, pol, &[]);
        assert!(
            !run.status.success(),
            "race not reported under {pol:?}: {}",
            run.dump()
        );
        assert!(
            run.stdout.contains("detected: write-write data race at 0x"),
            "race not reported as such under {pol:?}: {}",
            run.dump()
        );
        let addr = format!("{:#x}", menps_dsm::internals::DSM_BASE + RACE_OFFSET);
        assert!(
            run.stdout.contains(&addr),
            "race report lacks the address {addr}: {}",
            run.dump()
        );
    }
}

/// A job of `scenario` under `policy` with more variables set (the network
/// model only as `env` sets it).
fn job_with(
    scenario: &str,
    nprocs: usize,
    policy: (&'static str, &'static str, &'static str),
    env: &[(&str, &str)],
) -> JobRun {
    let all: Vec<(&str, &str)> = dsm_policy_env(policy)
        .into_iter()
        .chain(env.iter().copied())
        .collect();
    job_with_own_net_model(scenario, nprocs, &all)
}

/// The protocol stays correct when every communication takes what it
/// would over Ethernet (`com::netmodel`, switched on by the environment):
/// a slower network changes the interleavings, never the results.
#[test]
fn scenarios_over_a_modelled_network() {
    let net = [
        ("MENPS_NET_LATENCY", "20us"),
        ("MENPS_NET_BANDWIDTH", "10Gbit"),
    ];
    // Each scenario once under the default policy and once under fixed
    // homes (the directory policy is the slowest over a network: the
    // other suites cover it).
    for (scenario, n, pol) in [
        ("producer_consumer", 3, POLICIES[0]),
        ("producer_consumer", 2, POLICIES[5]),
        ("phased_writers", 2, POLICIES[0]),
        ("phased_writers", 2, POLICIES[7]),
        ("false_sharing", 3, POLICIES[0]),
        // (Not under fixed homes: a release there merges its diff into the
        // home with one blocking remote write per changed run of words,
        // about 100 000 in this scenario, each a 40 us round trip here —
        // see `MENPS_STATS=1`'s `writes=`.)
        ("false_sharing", 2, POLICIES[3]),
        ("mutex_increments", 2, POLICIES[0]),
        ("atomic_increments", 2, POLICIES[5]),
        ("flush_wavefront", 2, POLICIES[0]),
        ("flush_wavefront", 2, POLICIES[2]),
    ] {
        let run = job_with(scenario, n, pol, &net);
        eprintln!("{scenario} x{n} {pol:?} over 20 us: {:?}", run.elapsed);
        assert_passed(
            &run,
            &format!("{scenario} with {n} processes under {pol:?} over 20 us"),
            n,
        );
    }
}

/// The value of `name=` in a line of counters.
fn counter(line: &str, name: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name} in {line:?}: {e}"))
}

/// `MENPS_STATS=1`: every process prints its protocol counters and its
/// communication counters (`com:`), with plausible values; with a latency
/// the time waited for the network shows.
#[test]
fn stats_print_protocol_and_communication_counters() {
    for (latency, n) in [(None, 2), (Some("50us"), 3)] {
        let mut env = vec![("MENPS_STATS", "1")];
        if let Some(l) = latency {
            env.push(("MENPS_NET_LATENCY", l));
        }
        let run = job_with("producer_consumer", n, POLICIES[0], &env);
        let what = format!("stats with {n} processes, latency {latency:?}");
        assert_passed(&run, &what, n);
        for r in 0..n {
            let prefix = format!("menps: process {r}: ");
            let dsm = run
                .stderr
                .lines()
                .find(|l| l.starts_with(&prefix) && l.contains("read_faults="))
                .unwrap_or_else(|| panic!("{what}: no protocol line of {r}: {}", run.dump()));
            assert!(counter(dsm, "barriers") >= 1.0, "{dsm}");
            assert!(counter(dsm, "barrier_ms") > 0.0, "{dsm}");
            let com = run
                .stderr
                .lines()
                .find(|l| l.starts_with(&format!("{prefix}com: ")))
                .unwrap_or_else(|| panic!("{what}: no com line of {r}: {}", run.dump()));
            eprintln!("{what}:\n{dsm}\n{com}");
            // The DSM's barriers are allgathers of the communication layer
            // (carrying the release signatures).
            assert!(
                counter(com, "allgathers") >= counter(dsm, "barriers"),
                "{com}"
            );
            // Locks, directories and fetches go through one-sided operations.
            assert!(
                counter(com, "atomics") + counter(com, "reads") > 0.0,
                "{com}"
            );
            // Every process either faults remote data in or is read from.
            assert!(counter(com, "allgathers") > 0.0, "{com}");
            match latency {
                None => {
                    assert_eq!(counter(com, "delay_ms"), 0.0, "{com}");
                    assert!(com.contains("latency_us=0 bandwidth_gbit=none"), "{com}");
                }
                Some(_) => {
                    // Each barrier and allgather alone waits ceil(log2 3)
                    // x 50 us.
                    let colls = counter(com, "barriers") + counter(com, "allgathers");
                    let min = colls * 2.0 * 0.05;
                    assert!(counter(com, "delay_ms") >= min, "{com}");
                    assert!(com.contains("latency_us=50 "), "{com}");
                }
            }
        }
    }
}
