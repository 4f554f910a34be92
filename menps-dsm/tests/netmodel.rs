//! Multi-process tests of the network model (`com::netmodel`) switched on by
//! the environment: `MENPS_NET_LATENCY` and `MENPS_NET_BANDWIDTH` make a job
//! joined as `AnyCom` pay a modelled network's costs.
//!
//! The driver runs jobs of this binary (see `common/`) with the variables
//! set; the job processes check lower bounds of the time operations take
//! (never upper bounds: the machines are noisy) and print `rank R: ok`.

use std::time::{Duration, Instant};

use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, CasOp, Coll, Comm, NetModel, P2p, Rma, Source, Windows};

mod common;
use common::*;

// ---------------------------------------------------------------------------
// The job side.

fn join() -> AnyCom<OsThreads> {
    join_job()
}

/// Entry point of the job processes (a no-op in a normal test run).
#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let com = join();
    match name.as_str() {
        "latency" => scenario_latency(&com),
        "bandwidth" => scenario_bandwidth(&com),
        "off" => {
            assert!(com.as_net().is_none(), "wrapped without a model");
            assert!(com.traffic().is_none());
        }
        other => panic!("unknown scenario {other}"),
    }
    com.barrier().unwrap();
    println!("rank {}: ok", com.rank());
}

/// `MENPS_NET_LATENCY=2ms`: a remote read and an atomic take a round trip,
/// a write its acknowledgement, a message its flight, a barrier its
/// rounds.
fn scenario_latency(com: &AnyCom<OsThreads>) {
    let lat = Duration::from_millis(2);
    let net = com.as_net().expect("MENPS_NET_LATENCY wraps the backend");
    assert_eq!(net.model().latency, lat);
    let (me, n) = (com.rank(), com.size());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let w = com.create_window(4096).unwrap();
    let before = com.traffic().unwrap();

    let t = Instant::now();
    let mut b = [0u8; 64];
    com.read(w.at(next, 0), &mut b).unwrap();
    let took = t.elapsed();
    assert!(took >= 2 * lat, "remote read took {took:?}");

    let t = Instant::now();
    com.fetch_add(w.at(next, 64), 1).unwrap();
    let took = t.elapsed();
    assert!(took >= 2 * lat, "remote fetch-add took {took:?}");

    let t = Instant::now();
    com.write(w.at(next, 128), &[1; 32]).unwrap();
    let took = t.elapsed();
    assert!(took >= 2 * lat, "remote write took {took:?}");

    // A message is handed over no earlier than one latency after the send.
    let t = Instant::now();
    com.send(next, 7, b"hi").unwrap();
    let took = t.elapsed();
    assert!(took >= lat, "send took {took:?}");
    assert_eq!(
        com.recv(Source::Rank(prev), 7).unwrap(),
        (prev, b"hi".to_vec())
    );

    for _ in 0..3 {
        let t = Instant::now();
        com.barrier().unwrap();
        let took = t.elapsed();
        let rounds = NetModel::rounds(n) as u32;
        assert!(
            took >= rounds * lat,
            "barrier of {n} ({rounds} rounds) took {took:?}"
        );
    }

    // Operations on this process's own memory do not cross the network.
    let t = Instant::now();
    com.read(w.at(me, 0), &mut b).unwrap();
    let local = t.elapsed();
    let d = com.traffic().unwrap().since(&before);
    assert_eq!((d.reads, d.atomics, d.writes), (1, 1, 1), "{d}");
    assert_eq!((d.msgs_sent, d.msgs_received, d.barriers), (1, 1, 3), "{d}");
    assert_eq!(d.local_ops, 1, "{d}");
    // 8 round trips or one-way latencies (read, fetch-add, write, send,
    // 3 barriers of up to 2 rounds) of 2 ms are at least 14 ms; the
    // backend's own time overlaps the model's, hence the margin.
    assert!(d.delay_ns >= 13_000_000, "{d}");
    // (Not an upper bound on the time: only the count of its delay.)
    let _ = local;

    // A batch is in flight together: the model delays it by one round trip
    // (not one per operation: four would be 16 ms), and counts each.
    let before = com.traffic().unwrap();
    let t = Instant::now();
    let mut bufs = [[0u8; 8]; 4];
    let mut reads: Vec<_> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| (w.at(next, 512 + 8 * i as u64), &mut b[..]))
        .collect();
    com.read_all(&mut reads).unwrap();
    let mut ops: Vec<CasOp> = (0..4)
        .map(|i| CasOp::new(w.at(next, 1024 + 64 * (me as u64 * 4 + i)), 0, 1))
        .collect();
    com.compare_and_swap_all(&mut ops).unwrap();
    assert!(ops.iter().all(CasOp::swapped), "{ops:?}");
    let took = t.elapsed();
    assert!(took >= 2 * (2 * lat), "two batches took {took:?}");
    let d = com.traffic().unwrap().since(&before);
    assert_eq!((d.reads, d.atomics), (4, 4), "{d}");
    // Counted, not timed: how long the waits took depends on the host's
    // load (4 processes on 2 cores overshoot a deadline by milliseconds).
    assert!(
        d.waits <= 2,
        "two batches of 4 waited {} times: {d}",
        d.waits
    );
    com.barrier().unwrap();
    com.destroy_window(w).unwrap();
}

/// `MENPS_NET_BANDWIDTH`: a 1 MiB read takes at least 1 MiB / rate.
fn scenario_bandwidth(com: &AnyCom<OsThreads>) {
    let rate = com
        .as_net()
        .expect("MENPS_NET_BANDWIDTH wraps the backend")
        .model()
        .bandwidth
        .expect("a rate");
    let (me, n) = (com.rank(), com.size());
    let w = com.create_window(1 << 20).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    com.read(w.at((me + 1) % n, 0), &mut buf).unwrap();
    let took = t.elapsed();
    let min = Duration::from_secs_f64((8u64 << 20) as f64 / rate as f64);
    assert!(took >= min, "1 MiB at {rate} bit/s took {took:?} < {min:?}");
    com.barrier().unwrap();
    com.destroy_window(w).unwrap();
}

// ---------------------------------------------------------------------------
// The driver side.

#[test]
fn latency_delays_reads_atomics_writes_messages_and_barriers() {
    for n in [2, 3, 4] {
        let run = job_with_own_net_model("latency", n, &[("MENPS_NET_LATENCY", "2ms")]);
        assert_passed(&run, &format!("latency with {n} processes"), n);
    }
}

#[test]
fn bandwidth_caps_a_1mib_read() {
    for rate in ["800Mbit", "10Gbit"] {
        let run = job_with_own_net_model("bandwidth", 2, &[("MENPS_NET_BANDWIDTH", rate)]);
        assert_passed(&run, &format!("1 MiB read at {rate}"), 2);
    }
    // Both together.
    let run = job_with_own_net_model(
        "bandwidth",
        2,
        &[
            ("MENPS_NET_BANDWIDTH", "2.5Gbit/s"),
            ("MENPS_NET_LATENCY", "25us"),
        ],
    );
    assert_passed(&run, "1 MiB read at 2.5 Gbit/s, 25 us", 2);
}

#[test]
fn without_the_variables_nothing_is_wrapped() {
    let run = job_with_own_net_model("off", 2, &[]);
    assert_passed(&run, "no model", 2);
}

#[test]
fn bad_values_are_errors_naming_the_variable() {
    for (var, value, needle) in [
        (
            "MENPS_NET_LATENCY",
            "fast",
            "MENPS_NET_LATENCY=\"fast\" is not valid",
        ),
        (
            "MENPS_NET_LATENCY",
            "",
            "MENPS_NET_LATENCY is set but empty",
        ),
        (
            "MENPS_NET_LATENCY",
            "25",
            "MENPS_NET_LATENCY=\"25\" is not valid",
        ),
        (
            "MENPS_NET_BANDWIDTH",
            "10G",
            "MENPS_NET_BANDWIDTH=\"10G\" is not valid",
        ),
        (
            "MENPS_NET_BANDWIDTH",
            " ",
            "MENPS_NET_BANDWIDTH is set but empty",
        ),
    ] {
        let run = job_with_own_net_model("off", 2, &[(var, value)]);
        assert!(!run.status.success(), "{var}={value:?}: {}", run.dump());
        assert!(
            run.stderr.contains(needle),
            "{var}={value:?}: {}",
            run.dump()
        );
    }
}
