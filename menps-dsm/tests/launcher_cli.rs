//! The `menps` launcher's command line, run as a user would: a misspelled
//! option stops it before anything starts; the usual spellings of the
//! options work; the library's warnings still reach stderr.

use std::process::{Command, Output};

fn menps(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_menps"))
        .args(args)
        .env_remove("MENPS_RANK")
        .env_remove("MENPS_NPROCS")
        .output()
        .expect("run menps")
}

#[test]
fn a_misspelled_option_is_rejected_before_anything_runs() {
    for (typo, named) in [
        (
            &["run", "--nprocz", "2", "--", "sh", "-c", "echo ran"][..],
            "--nprocz",
        ),
        (
            &["run", "-n", "2", "--prefix-ouptut", "sh", "-c", "echo ran"],
            "--prefix-ouptut",
        ),
        (&["run", "-m", "2", "sh", "-c", "echo ran"], "-m"),
    ] {
        let out = menps(typo);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{typo:?}: {err}");
        assert!(
            err.contains(&format!(
                "menps: unknown option {named} (options: -n/--nprocs"
            )),
            "{typo:?}: {err}"
        );
        assert!(err.contains("usage: menps run"), "{typo:?}: {err}");
        // Nothing was started.
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("ran"),
            "{typo:?}"
        );
    }
}

#[test]
fn options_in_every_spelling_start_the_job() {
    let out = menps(&[
        "run",
        "--nprocs=2",
        "--prefix-output",
        "--timeout",
        "60",
        "--",
        "sh",
        "-c",
        "echo size=$MENPS_SIZE",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for r in 0..2 {
        assert!(stdout.contains(&format!("[rank {r}] size=2")), "{stdout}");
    }
    // A warning of the library, through `log` and the launcher's logger.
    assert!(stderr.contains("no process joined the job"), "{stderr}");

    // `-n2`, and the program's own options stay its own.
    let out = menps(&[
        "run",
        "-n2",
        "--timeout=60",
        "sh",
        "-c",
        "echo \"$0\"",
        "--nprocz",
    ]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("--nprocz")
            .count(),
        2
    );
}
