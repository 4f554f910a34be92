//! The DSM refuses to start when the processes of a job were started with
//! different address-space layouts: here rank 1 runs with a stack limit of
//! 1 GiB, which moves every shared library (the kernel keeps room for the
//! stack below the libraries), as a host with another `ulimit -s` would.
//! Every process must fail with a message naming a library and both
//! addresses, and nothing of the job may be left behind. With the same
//! limits the same job starts.
//!
//! Each test drives jobs of this binary through the `menps` launcher (see
//! `common/`); the job processes run [`job_entry`].

mod common;
use common::*;

/// Run in each job process: start the DSM, say so, and end with a barrier.
#[test]
fn job_entry() {
    if std::env::var_os(SCENARIO).is_none() {
        return;
    }
    let dsm = start_dsm_job();
    println!("rank {} started", dsm.rank());
    dsm.barrier().unwrap();
}

/// A job of 2 processes of this binary, through `sh` so that rank 1's
/// stack limit can be raised first (`raise`), with a time limit.
fn job(raise: bool) -> JobRun {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = clean_cmd(env!("CARGO_BIN_EXE_menps"));
    let script = if raise {
        // 77: the hard limit does not allow it (the test is then skipped).
        r#"if [ "$MENPS_RANK" = 1 ]; then ulimit -s 1048576 || exit 77; fi; exec "$@""#
    } else {
        r#"exec "$@""#
    };
    cmd.args([
        "run",
        "-n",
        "2",
        "--timeout",
        "60",
        "--",
        "sh",
        "-c",
        script,
        "sh",
    ])
    .arg(&exe);
    entry_args(&mut cmd);
    cmd.env(SCENARIO, "layout");
    drive(cmd, &new_tag("layout"), |_, _| true)
}

#[test]
fn a_job_with_different_library_addresses_is_refused_naming_the_library() {
    let run = job(true);
    if run.code() == Some(77) {
        eprintln!("skipped: the hard stack limit is below 1 GiB here");
        return;
    }
    assert_ne!(run.code(), Some(0), "{}", run.dump());
    assert!(
        !run.stdout.contains("started"),
        "a process started its DSM: {}",
        run.dump()
    );
    let says = "were started with different address-space layouts";
    assert!(run.stderr.contains(says), "{}", run.dump());
    // The first difference is a library (the executable does not move),
    // with both addresses. (Both processes print the error, and their
    // writes may interleave within a line.)
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains(says))
        .unwrap_or_default();
    assert!(
        line.contains(".so")
            && line.contains("process 0 has /")
            && line.contains("where process 1 has /")
            && line.matches(" at 0x").count() >= 2,
        "{}",
        run.dump()
    );
}

#[test]
fn a_job_with_the_same_layout_starts() {
    let run = job(false);
    assert!(run.status.success(), "{}", run.dump());
    for r in 0..2 {
        assert!(
            run.stdout.contains(&format!("rank {r} started")),
            "{}",
            run.dump()
        );
    }
}
