//! The C OpenMP programs of `tests/c/`, each run with the system libgomp
//! (the reference) and with our runtime `libmenps_gomp.so` on 1×2, 2×1,
//! 2×2 and 4×1 processes × threads; see the `tests` crate documentation.
//! One test per program, so a failure names the program.

use std::path::Path;
use std::time::Duration;

use tests::{
    all_programs, assert_same_as_reference, check_program, clean_command, compile,
    compile_linked_to_ours, libgomp_reference, needed_libraries, run_command, run_libgomp,
    run_ours, run_ours_env, run_ours_launcher, run_ours_linked, undefined_symbols,
};

/// Where the compiled programs go.
fn out_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// Full check of a program expected to exit with `status` (see
/// [`check_program`]).
fn check(name: &str, status: i32) {
    let times = check_program(out_dir(), name, status);
    print_times(name, &times);
}

fn print_times(name: &str, times: &[(String, Duration)]) {
    let list: Vec<String> = times
        .iter()
        .map(|(what, t)| format!("{what}: {:.0} ms", t.as_secs_f64() * 1e3))
        .collect();
    eprintln!("{name}: {}", list.join(", "));
}

/// The programs with a test of their own below.
const TESTED: &[&str] = &[
    "cg_kernel",
    "data_sharing",
    "exit_call",
    "exit_status",
    "flush_pipeline",
    "flush_wavefront",
    "locks",
    "loop_schedules",
    "old_abi",
    "proc_bind",
    "program_threads",
    "queries",
    "race_report",
    "reductions",
    "sections_ordered",
    "sync_constructs",
    "cancel_disabled",
    "tasks",
    "threadprivate",
    "unsupported_doacross",
];

#[test]
fn every_program_has_a_test() {
    let mut tested: Vec<String> = TESTED.iter().map(|s| s.to_string()).collect();
    tested.sort();
    assert_eq!(
        all_programs(),
        tested,
        "tests/c/*.c and the programs tested in tests/c_programs.rs differ"
    );
}

#[test]
fn data_sharing() {
    check("data_sharing", 0);
}

/// `OMP_PROC_BIND` and `OMP_PLACES`: unbound by default; bound as asked
/// (by `OMP_PROC_BIND`, or by `OMP_PLACES` alone),
/// each team thread on its place only, with libgomp's policy and number of
/// places — although libgomp's own start-up (the system libgomp is loaded
/// too) binds the initial thread, which every thread of ours would inherit
/// (with `close`, every thread ran on one processor). A place list we do
/// not support stops the program with a message naming `OMP_PLACES`.
#[test]
fn proc_bind() {
    check("proc_bind", 0);
    let program = compile(out_dir(), "proc_bind", "");
    // A one-processor place list of a processor this test may use.
    let first_cpu = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|st| {
            let list = st
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
            let first = list.trim().split([',', '-']).next()?;
            first.parse::<usize>().ok()
        })
        .expect("the processors this process may use (/proc/self/status)");
    let one_place = format!("{{{first_cpu}}}");
    let settings: [&[(&str, &str)]; 4] = [
        &[("OMP_PROC_BIND", "close")],
        &[("OMP_PROC_BIND", "spread"), ("OMP_PLACES", "cores")],
        &[
            ("OMP_PROC_BIND", "master,close"),
            ("OMP_PLACES", &one_place),
        ],
        // A place list alone binds, as `true`.
        &[("OMP_PLACES", "threads")],
    ];
    for env in settings {
        let mut cmd = clean_command(&program);
        cmd.env("OMP_NUM_THREADS", "2").envs(env.iter().copied());
        let reference = run_command(cmd);
        reference.assert_passed(0);
        for (processes, threads) in [(1, 2), (2, 1), (4, 1)] {
            let ours = run_ours_env(&program, &[], processes, threads, env);
            assert_same_as_reference(&ours, &reference, 0);
        }
    }
    let refused = run_ours_env(
        &program,
        &[],
        1,
        2,
        &[("OMP_PROC_BIND", "close"), ("OMP_PLACES", "{0,1}:2:1")],
    );
    assert!(
        !refused.status.success() && refused.stderr.contains("OMP_PLACES"),
        "an unsupported place list was not refused by name\n{}",
        refused.report()
    );
}

#[test]
fn loop_schedules() {
    check("loop_schedules", 0);
}

#[test]
fn flush_wavefront() {
    check("flush_wavefront", 0);
}

/// `threadprivate` with `copyin` (by value and by address), persistence
/// across regions, `copyprivate` and `errno`: each team thread has its own
/// thread-local area.
///
/// Also 1×4 (more team threads than workers) several times: `main`, whose
/// area thread 0 takes over during a region, may still run the fork's
/// bookkeeping on another worker; sharing the area then crashed the
/// runtime in about one run of eight.
#[test]
fn threadprivate() {
    check("threadprivate", 0);
    let program = compile(out_dir(), "threadprivate", "");
    let reference = libgomp_reference(&program, 0);
    for _ in 0..6 {
        let ours = run_ours(&program, &[], 1, 4);
        assert_same_as_reference(&ours, &reference[&4], 0);
    }
}

/// An LU-style pipeline whose neighbouring processes write the same blocks
/// concurrently, synchronised by flushes only (it once read stale data on
/// 4 processes): equal to the serial sweeps on 2×1, 2×2 and 4×1. The
/// reference runs libgomp with 2 threads only (with more threads than cores
/// its spinning flag loops take seconds per run).
#[test]
fn flush_pipeline() {
    let program = compile(out_dir(), "flush_pipeline", "");
    let run = run_libgomp(&program, &[], 2);
    run.assert_passed(0);
    for (processes, threads) in [(2, 1), (2, 2), (4, 1)] {
        let ours = run_ours(&program, &[], processes, threads);
        assert_same_as_reference(&ours, &run, 0);
    }
}

/// The program's own OS thread writes a block the team merges in place:
/// the runtime must stop taking the program for single-threaded (plain
/// merges lost its counts, 10 runs out of 10, without that).
#[test]
fn program_threads() {
    check("program_threads", 0);
}

#[test]
fn reductions() {
    check("reductions", 0);
}

#[test]
fn sync_constructs() {
    check("sync_constructs", 0);
}

#[test]
fn sections_ordered() {
    check("sections_ordered", 0);
}

#[test]
fn locks() {
    check("locks", 0);
}

#[test]
fn tasks() {
    check("tasks", 0);
}

#[test]
fn queries() {
    check("queries", 0);
}

/// The entry points of code from GCC before 4.9 (`GOMP_parallel_start`
/// and its combined forms), called as that code calls them.
#[test]
fn old_abi() {
    check("old_abi", 0);
}

#[test]
fn cg_kernel() {
    check("cg_kernel", 0);
}

/// `exit(0)` from `main`, with an atexit handler printing `PASS`.
#[test]
fn exit_call() {
    check("exit_call", 0);
}

/// `main` returns 3 after printing `PASS`: the status must come through.
#[test]
fn exit_status() {
    check("exit_status", 3);
}

/// `cancel for` with cancellation off (the default): the construct does
/// nothing, as with libgomp.
#[test]
fn cancel_disabled() {
    check("cancel_disabled", 0);
}

/// Asks our runtime for something it does not offer; the run must fail
/// with stderr naming one of `wanted` (entry points the program needs,
/// from `nm -u`, filtered by `pick`).
fn assert_refused(program: &Path, env: &[(&str, &str)], pick: impl Fn(&str) -> bool) {
    let wanted: Vec<String> = undefined_symbols(program)
        .into_iter()
        .filter(|s| pick(s))
        .collect();
    assert!(
        !wanted.is_empty(),
        "the program needs none of the entry points (nm -u)"
    );
    let run = run_ours_env(program, &[], 1, 2, env);
    assert!(
        !run.status.success(),
        "our runtime ran a program needing {wanted:?}\n{}",
        run.report()
    );
    assert!(
        wanted.iter().any(|s| run.stderr.contains(s.as_str())),
        "stderr does not name the unsupported entry point (one of {wanted:?})\n{}",
        run.report()
    );
}

/// With `OMP_CANCELLATION=true`, our runtime (which cannot cancel) refuses
/// the `cancel` construct, naming `GOMP_cancel`.
#[test]
fn cancellation_requested_is_refused() {
    let program = compile(out_dir(), "cancel_disabled", "requested");
    assert_refused(&program, &[("OMP_CANCELLATION", "true")], |s| {
        s == "GOMP_cancel"
    });
}

/// A doacross loop: fine with libgomp; our runtime aborts naming the
/// unsupported entry point.
#[test]
fn unsupported_doacross() {
    let program = compile(out_dir(), "unsupported_doacross", "");
    libgomp_reference(&program, 0);
    assert_refused(&program, &[], |s| {
        s.starts_with("GOMP_") && s.contains("doacross")
    });
}

/// A program with a genuine write-write race on a global, across 2
/// processes: by default the run stops with a report naming the variable
/// and both processes; with `MENPS_DSM_ON_RACE=report` it is reported once
/// and the run goes on to libgomp's output.
#[test]
fn races_are_reported_with_the_variable() {
    let program = compile(out_dir(), "race_report", "");
    let reference = libgomp_reference(&program, 0);
    let names_it = |stderr: &str| {
        stderr.contains("write-write data race at")
            && stderr.contains("`racy`")
            && stderr.contains("process 0")
            && stderr.contains("process 1")
    };
    let stopped = run_ours_env(&program, &[], 2, 1, &[]);
    assert!(
        !stopped.status.success(),
        "a race did not stop the run\n{}",
        stopped.report()
    );
    assert!(
        names_it(&stopped.stderr),
        "no clear report\n{}",
        stopped.report()
    );
    let goes_on = run_ours_env(&program, &[], 2, 1, &[("MENPS_DSM_ON_RACE", "report")]);
    assert_same_as_reference(&goes_on, &reference[&2], 0);
    let reports = goes_on
        .stderr
        .lines()
        .filter(|l| l.contains("write-write data race at"))
        .count();
    assert_eq!(
        reports,
        1,
        "the racing word is reported once\n{}",
        goes_on.report()
    );
    assert!(
        names_it(&goes_on.stderr),
        "no clear report\n{}",
        goes_on.report()
    );
}

/// The stand-alone launcher: `menps run -n 2` of a program built against
/// libgomp (the launcher preloads our runtime), 2 processes × 1 thread.
#[test]
fn launcher_menps_run() {
    let program = compile(out_dir(), "data_sharing", "launcher");
    let reference = libgomp_reference(&program, 0);
    let run = run_ours_launcher(&program, &[], 2, 1);
    assert_same_as_reference(&run, &reference[&2], 0);
    print_times("launcher_menps_run", &[("ours 2x1".into(), run.elapsed)]);
}

/// A program built with `menps cc` (linked against our library instead of
/// libgomp, no `LD_PRELOAD`), on 1×2 and 2×2.
#[test]
fn linked_against_ours() {
    let name = "loop_schedules";
    let reference = libgomp_reference(&compile(out_dir(), name, "linked-reference"), 0);
    let program = compile_linked_to_ours(out_dir(), name);
    let needed = needed_libraries(&program);
    assert!(
        needed.iter().any(|l| l.contains("menps_gomp")),
        "the linked program does not need our library: {needed:?}"
    );
    assert!(
        !needed.iter().any(|l| l.starts_with("libgomp")),
        "the linked program still needs libgomp: {needed:?}"
    );
    let mut times = Vec::new();
    for (processes, threads) in [(1, 2), (2, 2)] {
        let run = run_ours_linked(&program, &[], processes, threads);
        assert_same_as_reference(&run, &reference[&(processes * threads)], 0);
        times.push((format!("ours linked {processes}x{threads}"), run.elapsed));
    }
    print_times("linked_against_ours", &times);
}

/// A barrier storm across processes (the `barrier` kernel of the
/// benchmarks, class S: 20 000 barriers in a loop, 2 × 1) publishes
/// nothing at its barriers: `GOMP_barrier` passes the DSM the caller's
/// stack pointer, so the registers the runtime saves below the program's
/// frames (the loop's counter among them) are not taken for the program's
/// data. Counted with `MENPS_STATS`: each process's merges (fast releases
/// and transactions) stay far below one per barrier (before, one fast
/// release per barrier on process 0).
#[test]
fn barrier_storm_publishes_no_runtime_frames() {
    let source = tests::c_dir().join("bench").join("barrier.c");
    let program = tests::gcc(
        &source,
        &out_dir().join("c-programs").join("bench-barrier"),
        &[
            std::ffi::OsStr::new("-I"),
            tests::c_dir().join("bench").as_os_str(),
        ],
    );
    let run = run_ours_env(&program, &["S"], 2, 1, &[("MENPS_STATS", "1")]);
    assert!(run.status.success(), "{}", run.report());
    const EPISODES: u64 = 20_000;
    let counter = |line: &str, name: &str| -> Option<u64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..].split(' ').next()?.parse().ok()
    };
    let mut seen = 0;
    for line in run.stderr.lines().filter(|l| l.contains(" read_faults=")) {
        let merges = counter(line, "fast_releases").unwrap_or(u64::MAX)
            + counter(line, "transactions").unwrap_or(u64::MAX);
        assert!(
            merges < EPISODES / 10,
            "{merges} merges in {EPISODES} barriers: {line}\n{}",
            run.report()
        );
        seen += 1;
    }
    assert_eq!(seen, 2, "no stats line of each process\n{}", run.report());
}
