//! Tests of the `verbs` backend (feature `verbs`).
//!
//! Where `ibv_devices` lists no RDMA adapter (every machine of this project
//! so far), only the error is checked: [`VerbsCom::new`] must fail at once
//! with [`Error::BackendUnavailable`] saying that there is no device. Where
//! an adapter exists, the shared scenarios run on it: in one process
//! (accesses to itself go through the adapter's loopback queue pair) and in
//! jobs of 2 and 3 processes started by the shm launcher, which is the
//! bootstrap that exchanges the queue-pair data.

#![cfg(feature = "verbs")]

use std::process::Command;

use ct_worker::OsThreads;
use menps_dsm::com::verbs::devices;
use menps_dsm::com::{Communicator, Error, ShmCom, VerbsCom};

mod common;
use common::*;

/// Whether `ibv_devices` (or, without it, the verbs library) lists an
/// adapter.
fn has_rdma_device() -> bool {
    match Command::new("ibv_devices").output() {
        // A header of two lines, then one line per device.
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip(2)
            .any(|l| !l.trim().is_empty()),
        Ok(_) => false,
        Err(_) => devices().is_ok(),
    }
}

const SCENARIOS: [(&str, &str); 3] = [
    ("rma", "rma ok"),
    ("fetch_add", "fetch_add ok"),
    ("cas_lock", "cas_lock ok"),
];

/// Entry point of the job processes (a no-op in a normal test run).
#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let boot: ShmCom<OsThreads> = menps_dsm::launch::init_or_relaunch(2).unwrap_or_else(|e| {
        eprintln!("cannot join the job: {e}");
        std::process::exit(3)
    });
    let com = VerbsCom::<_, OsThreads>::new(boot).unwrap_or_else(|e| {
        eprintln!("cannot connect the queue pairs: {e}");
        std::process::exit(4)
    });
    assert!(run_common_scenario(&name, &com), "unknown scenario {name}");
}

#[test]
fn without_a_device_new_returns_a_clear_error() {
    if has_rdma_device() {
        eprintln!("skipped: this machine has an RDMA device");
        return;
    }
    let e = devices().unwrap_err();
    assert!(matches!(e, Error::BackendUnavailable(_)), "{e:?}");
    let boot = ShmCom::<OsThreads>::single().unwrap();
    let e = VerbsCom::<_, OsThreads>::new(boot).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, Error::BackendUnavailable(_))
            && msg.contains("no RDMA device found")
            && msg.contains("ibv_devices")
            && msg.contains("shm or mpi backend"),
        "{msg}"
    );
}

fn run_here<C: Communicator>(com: &C) {
    for (name, _) in SCENARIOS {
        assert!(run_common_scenario(name, com));
    }
}

#[test]
fn single_process_rma_through_the_adapter() {
    if !has_rdma_device() {
        eprintln!("skipped: no RDMA device (ibv_devices lists none)");
        return;
    }
    let boot = ShmCom::<OsThreads>::single().unwrap();
    let com = VerbsCom::<_, OsThreads>::new(boot).unwrap();
    eprintln!("RDMA device {}", com.device_name());
    run_here(&com);
}

#[test]
fn jobs_of_2_and_3_processes() {
    if !has_rdma_device() {
        eprintln!("skipped: no RDMA device (ibv_devices lists none)");
        return;
    }
    for n in [2, 3] {
        for (name, line) in SCENARIOS {
            let mut cmd = clean_cmd(std::env::current_exe().unwrap());
            entry_args(&mut cmd);
            cmd.env(SCENARIO, name).env("MENPS_NPROCS", n.to_string());
            let run = drive(cmd, &new_tag(name), |_, _| true);
            assert_ok(&run, n, line);
        }
    }
}
