//! Self-tests of the harness: a hung program is killed and fails the
//! test, processes that outlive a run (even in another session) are killed
//! and fail it, and statuses and output are captured.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tests::{clean_command, run_command, run_command_limited};

fn sh(script: &str) -> Command {
    let mut cmd = clean_command("/bin/sh");
    cmd.args(["-c", script]);
    cmd
}

/// A fresh file path for a test's pid file.
fn pid_file(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("{name}-{}.pid", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Whether `pid` is a live (non-zombie) process.
fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty()
        && !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
}

fn wait_dead(pid: i32) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn captures_output_and_status() {
    let run = run_command(sh("echo out; echo err >&2; exit 3"));
    assert_eq!(run.stdout, "out\n");
    assert_eq!(run.stderr, "err\n");
    assert_eq!(run.status.code(), Some(3));
    let run = run_command(sh("echo PASS"));
    run.assert_passed(0);
}

#[test]
fn hung_program_is_killed_and_fails() {
    let pids = pid_file("hung");
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 600' & echo started; exec sleep 600",
        pids.display()
    );
    let start = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| {
        run_command_limited(sh(&script), Duration::from_secs(1), Duration::from_secs(1))
    }));
    let message = *result
        .expect_err("a hang must fail")
        .downcast::<String>()
        .unwrap();
    assert!(message.contains("hung"), "{message}");
    assert!(
        message.contains("started"),
        "output so far is reported: {message}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    // The process in another session (outside the process group) is gone.
    assert!(
        wait_dead(read_pid(&pids)),
        "a process of the hung run survived"
    );
}

#[test]
fn leftover_processes_are_killed_and_fail() {
    let pids = pid_file("leftover");
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 600' & sleep 0.2; echo PASS",
        pids.display()
    );
    let result = catch_unwind(AssertUnwindSafe(|| {
        run_command_limited(
            sh(&script),
            Duration::from_secs(10),
            Duration::from_millis(500),
        )
    }));
    let message = *result
        .expect_err("leftovers must fail")
        .downcast::<String>()
        .unwrap();
    assert!(message.contains("still running"), "{message}");
    assert!(wait_dead(read_pid(&pids)), "the leftover process survived");
}
