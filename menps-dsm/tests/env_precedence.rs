//! Builder values win over `MENPS_*` variables, which win over defaults;
//! `menps env` shows each variable's value and source. (One test in its own
//! binary: it sets the process's environment.)

use std::process::Command;
use std::time::Duration;

use menps_dsm::dsm::{DsmConfig, InvalidationPolicy, WriterPolicy};
use menps_dsm::launch;

fn set(name: &str, value: &str) {
    // SAFETY: the only test of this binary; no other thread reads the
    // environment while it is changed.
    unsafe { std::env::set_var(name, value) };
}

#[test]
fn builder_then_environment_then_default() {
    // The DSM configuration.
    set("MENPS_DSM_WRITER", "fixed");
    set("MENPS_DSM_BLOCK_SIZE", "64KiB");
    set("MENPS_DSM_FAST_RELEASE", "off");
    let c = DsmConfig::builder()
        .writer(WriterPolicy::Floating)
        .block_size(16 << 10)
        .build()
        .unwrap();
    assert_eq!(
        c.writer,
        WriterPolicy::Floating,
        "the builder's writer wins"
    );
    assert_eq!(c.block_size, 16 << 10, "the builder's block size wins");
    assert!(
        !c.fast_release,
        "the environment applies where the builder is silent"
    );
    assert_eq!(c.invalidation, InvalidationPolicy::Hybrid, "the default");
    let c = DsmConfig::from_env().unwrap();
    assert_eq!((c.writer, c.block_size), (WriterPolicy::Fixed, 64 << 10));
    assert_eq!(c.refreshes, 8, "the default refresh count");
    set("MENPS_DSM_REFRESH", "3");
    assert_eq!(DsmConfig::from_env().unwrap().refreshes, 3);
    let c = DsmConfig::builder().refreshes(0).build().unwrap();
    assert_eq!(c.refreshes, 0, "the builder's refresh count wins");
    set("MENPS_DSM_REFRESH", "256");
    let e = DsmConfig::from_env().unwrap_err().to_string();
    assert!(e.contains("MENPS_DSM_REFRESH=\"256\" is not valid"), "{e}");
    set("MENPS_DSM_REFRESH", "0");
    assert_eq!(DsmConfig::from_env().unwrap().refreshes, 0, "0: off");
    // The defaults an embedding runtime gives lose to the environment.
    let tuned = DsmConfig {
        block_size: 8 << 10,
        wn_list_len: 4096,
        ..DsmConfig::default()
    };
    let c = DsmConfig::builder().defaults(tuned).build().unwrap();
    assert_eq!((c.block_size, c.wn_list_len), (64 << 10, 4096));
    set("MENPS_DSM_BLOCK_SIZE", "");
    let e = DsmConfig::from_env().unwrap_err().to_string();
    assert!(e.contains("MENPS_DSM_BLOCK_SIZE is set but empty"), "{e}");
    set("MENPS_DSM_WRITER", "floaty");
    let e = DsmConfig::builder()
        .block_size(4096)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("MENPS_DSM_WRITER=\"floaty\" is not valid: expected one of floating, fixed"),
        "{e}"
    );

    // The launcher's settings.
    set("MENPS_NPROCS", "3");
    set("MENPS_GRACE_MS", "1.5s");
    let c = launch::Builder::new()
        .nprocs(2)
        .grace(Duration::from_millis(10))
        .config()
        .unwrap();
    assert_eq!((c.nprocs, c.grace), (2, Duration::from_millis(10)));
    let c = launch::Builder::new().default_nprocs(2).config().unwrap();
    assert_eq!(c.nprocs, 3, "MENPS_NPROCS wins over a default");
    assert_eq!(c.grace, Duration::from_millis(1500));
    set("MENPS_GRACE_MS", "250");
    assert_eq!(
        launch::Builder::new().config().unwrap().grace,
        Duration::from_millis(250),
        "a bare number is in the unit of the name"
    );

    // `menps env`: values and sources; an invalid one fails.
    let out = Command::new(env!("CARGO_BIN_EXE_menps"))
        .arg("env")
        .env("MENPS_DSM_WRITER", "fixed")
        .env("MENPS_DSM_BLOCK_SIZE", "64k")
        .env_remove("MENPS_DSM_STACKS")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    let row = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("MENPS_DSM_WRITER")[1..3], ["fixed", "environment"]);
    assert_eq!(row("MENPS_DSM_STACKS")[1..3], ["32", "default"]);
    for v in ct_config::vars::ALL {
        row(v.name);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_menps"))
        .arg("env")
        .env("CT_STACK_SIZE", "12q")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("CT_STACK_SIZE=\"12q\" is not valid"), "{err}");
}
