//! A DSM process killed with SIGKILL is detected by the others: each ends
//! with an error naming the dead rank — `DsmError::Com(PeerDied { rank })`
//! from a DSM call, or, when it notices inside a page fault, the fault
//! path's "menps-dsm: fatal: cannot resolve the access …" and status 1 —
//! within 10 seconds, never a hang; the job exits with the dead process's
//! status and leaves no process behind.
//!
//! The jobs run with a launcher grace period of 20 s (`MENPS_GRACE_MS`), so
//! a survivor that hangs is not rescued by the launcher's clean-up within
//! the 10 s the test allows, and with `MENPS_PREFIX_OUTPUT=1` so every
//! line, the fault path's included, names its rank.

use std::process::Command;
use std::time::{Duration, Instant};

use ct_worker::OsThreads;
use menps_dsm::com::{Error, ShmCom};
use menps_dsm::dsm::{Dsm, DsmError, DsmMutex};

mod common;
use common::*;

type D = Dsm<ShmCom<OsThreads>, OsThreads>;

/// Longest a survivor may take to notice the death.
const DETECTION_LIMIT: Duration = Duration::from_secs(10);
/// The launcher's grace period in these jobs (well above the limit).
const GRACE_MS: &str = "20000";

/// `CLOCK_MONOTONIC` in nanoseconds: comparable between processes.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let com: ShmCom<OsThreads> = menps_dsm::launch::Builder::new()
        .default_nprocs(4)
        .init_or_relaunch()
        .unwrap_or_else(|e| {
            eprintln!("cannot join the job: {e}");
            std::process::exit(3)
        });
    let dsm = D::new(com).unwrap_or_else(|e| {
        eprintln!("cannot start the DSM: {e}");
        std::process::exit(3)
    });
    match name.as_str() {
        "self_kill" => self_kill(&dsm),
        "busy" => busy(&dsm),
        other => panic!("unknown scenario {other}"),
    }
}

fn shared_mutex(dsm: &D) -> DsmMutex {
    let mut id = [0u8; 4];
    if dsm.rank() == 0 {
        id = dsm.new_mutex().unwrap().0.to_le_bytes();
    }
    menps_dsm::com::Coll::broadcast(dsm.com(), 0, &mut id).unwrap();
    DsmMutex(u32::from_le_bytes(id))
}

/// Reports how this survivor learnt of the death and ends the process
/// with status 1, as an application returning the error would.
fn detected(dsm: &D, what: &str, e: DsmError) -> ! {
    let me = dsm.rank();
    let at = mono_ns();
    match &e {
        DsmError::Com(Error::PeerDied { rank }) => {
            println!("rank {me} detected PeerDied {{ rank: {rank} }} in {what} at {at}: {e}");
        }
        other => println!("rank {me} got another error in {what} at {at}: {other}"),
    }
    // Fail-stop: every later operation fails too.
    match dsm.barrier() {
        Err(later) => println!("rank {me} later barrier: {later}"),
        Ok(()) => println!("rank {me} later barrier: succeeded"),
    }
    eprintln!("error: {e}");
    std::process::exit(1)
}

/// Bytes of the work segment of [`self_kill`]: one 4 KiB block per rank.
const BLOCK: usize = 4096;

/// Rank 2 takes a DSM mutex, dirties a block, and kills itself with
/// SIGKILL; rank 0 then waits in a DSM barrier, rank 1 for the mutex, and
/// rank 3 keeps faulting on blocks whose latest version rank 2 released
/// (forgetting its copies each time), with release fences.
fn self_kill(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    assert_eq!(n, 4);
    let seg = dsm.alloc_segment(n * BLOCK * 4, BLOCK).unwrap();
    let m = shared_mutex(dsm);
    // Some ordinary work: every rank writes its blocks, everybody checks.
    for round in 1..=5u8 {
        for b in 0..4 {
            // SAFETY: blocks `4 * me .. 4 * me + 4` are written by this
            // rank only.
            unsafe { seg.add((4 * me + b) * BLOCK + 17).write(round + me as u8) };
        }
        {
            let g = dsm.lock(m).unwrap();
            // SAFETY: DSM memory protected by the mutex (last word).
            unsafe {
                let c = seg.add(n * BLOCK * 4 - 8).cast::<u64>();
                c.write(c.read() + 1);
            }
            g.unlock().unwrap();
        }
        dsm.barrier().unwrap();
        for q in 0..n {
            // SAFETY: written before the barrier.
            let v = unsafe { seg.add(4 * q * BLOCK + 17).read() };
            assert_eq!(v, round + q as u8, "rank {me}: block of rank {q}");
        }
        dsm.barrier().unwrap();
    }
    if me == 2 {
        let g = dsm.lock(m).unwrap();
        // A dirty block that will never be released.
        // SAFETY: this rank's block.
        unsafe { seg.add(8 * BLOCK).write(0xee) };
        menps_dsm::com::Coll::barrier(dsm.com()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        println!("rank 2 killing itself at {}", mono_ns());
        // SAFETY: sending a signal to ourselves.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        drop(g);
        unreachable!("SIGKILL returned");
    }
    menps_dsm::com::Coll::barrier(dsm.com()).unwrap();
    let start = Instant::now();
    match me {
        0 => {
            let e = dsm.barrier().unwrap_err();
            detected(dsm, "barrier", e)
        }
        1 => {
            let e = dsm.lock(m).map(drop).unwrap_err();
            detected(dsm, "lock of the mutex rank 2 held", e)
        }
        _ => {
            // Page faults on rank 2's blocks until something fails; a
            // failure inside a fault ends the process on the fault path.
            let theirs = 2 * 4;
            let mut sum = 0u64;
            while start.elapsed() < 2 * DETECTION_LIMIT {
                // SAFETY: inside the segment.
                let p = unsafe { seg.add(theirs * BLOCK) };
                if let Err(e) = dsm.forget_range(p, 4 * BLOCK) {
                    detected(dsm, "forget_range", e);
                }
                for b in 0..4 {
                    // SAFETY: rank 2's blocks, last written before a
                    // barrier (rank 2's unreleased write races with nothing
                    // we read: offset 0 of its first block is not read).
                    sum += u64::from(unsafe { p.add(b * BLOCK + 17).read() });
                }
                // SAFETY: rank 3's own block.
                unsafe { seg.add(4 * me * BLOCK + 99).write(sum as u8) };
                if let Err(e) = dsm.release_fence() {
                    detected(dsm, "release_fence", e);
                }
            }
            println!("rank {me}: NOT detected after {:?}", start.elapsed());
            std::process::exit(7)
        }
    }
}

/// Every rank loops over a mix of DSM work — writes to its stripes of
/// shared blocks (page faults, false sharing), mutex-protected increments,
/// atomics, barriers, reads of the others' stripes checked — until a DSM
/// call fails (or the fault path ends the process). The driver kills one
/// rank by pid meanwhile.
fn busy(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let stripe = 1024;
    let block = 32 * 1024;
    let seg = dsm.alloc_segment(2 * block, 4096).unwrap();
    let shared = dsm.alloc_segment(block, block).unwrap();
    let m = shared_mutex(dsm);
    let counter = shared.cast::<u64>();
    // SAFETY: inside the segment.
    let atomic = unsafe { shared.add(block - 8).cast::<u64>() };
    let start = Instant::now();
    let mut it = 0u64;
    let check = |what: &str, r: Result<(), DsmError>| {
        if let Err(e) = r {
            detected(dsm, what, e);
        }
    };
    while start.elapsed() < 3 * DETECTION_LIMIT {
        it += 1;
        let v = (it % 200) as u8 + me as u8;
        for s in (0..2 * block / stripe).filter(|s| s % n == me) {
            for b in (0..stripe).step_by(61) {
                // SAFETY: stripe `s` is written by this rank only.
                unsafe { seg.add(s * stripe + b).write(v) };
            }
        }
        // SAFETY: 64 bytes of the shared block, this rank's only.
        unsafe { shared.add(512 + 64 * me).write_bytes(v, 64) };
        match dsm.lock(m) {
            Ok(g) => {
                // SAFETY: DSM memory protected by the mutex.
                unsafe { counter.write(counter.read() + 1) };
                check("unlock", g.unlock());
            }
            Err(e) => detected(dsm, "lock", e),
        }
        if let Err(e) = dsm.fetch_add(atomic, 1) {
            detected(dsm, "fetch_add", e);
        }
        check("barrier", dsm.barrier());
        for s in 0..2 * block / stripe {
            let q = s % n;
            let want = (it % 200) as u8 + q as u8;
            // SAFETY: written before the barrier.
            let got = unsafe { seg.add(s * stripe + 61).read() };
            assert_eq!(
                got, want,
                "rank {me}: iteration {it}, stripe {s} of rank {q}"
            );
        }
        check("barrier", dsm.barrier());
        if it == 3 {
            println!("rank {me} working, pid {}", std::process::id());
        }
    }
    println!("rank {me}: NOT detected after {:?}", start.elapsed());
    std::process::exit(7)
}

// ---------------------------------------------------------------------------
// The driver side.

/// The policy combinations (as in `tests/dsm.rs`).
const POLICIES: [(&str, &str, &str); 8] = DSM_POLICIES;

fn command(scenario: &str, n: usize, pol: (&str, &str, &str)) -> Command {
    let mut cmd = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", n.to_string())
        .env("MENPS_GRACE_MS", GRACE_MS)
        .env("MENPS_PREFIX_OUTPUT", "1")
        .envs(dsm_policy_env(pol));
    cmd
}

/// The number after `key` in `line`.
fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Checks that every rank but `dead` reported the death of `dead` within
/// [`DETECTION_LIMIT`] of `killed_at` (a `CLOCK_MONOTONIC` time), either
/// from a DSM call or on the fault path; that the job exited with 137 and
/// ended within the limit. Returns a summary per rank.
fn check_detection(
    run: &JobRun,
    n: usize,
    dead: usize,
    killed_at: u64,
    ended_at: u64,
    what: &str,
) -> Vec<String> {
    assert_eq!(
        run.code(),
        Some(128 + libc::SIGKILL),
        "{what}: the job must exit with the killed process's status: {}",
        run.dump()
    );
    assert!(
        run.stderr.contains(&format!(": rank {dead} (pid"))
            && run.stderr.contains("signal 9 (SIGKILL)"),
        "{what}: launcher message: {}",
        run.dump()
    );
    let took = Duration::from_nanos(ended_at.saturating_sub(killed_at));
    assert!(
        took < DETECTION_LIMIT,
        "{what}: the job took {took:?} after the kill: {}",
        run.dump()
    );
    let mut summary = Vec::new();
    for r in (0..n).filter(|&r| r != dead) {
        let prefix = format!("[rank {r}] ");
        let api = format!("rank {r} detected PeerDied {{ rank: {dead} }} in ");
        let by_call = run
            .stdout
            .lines()
            .find(|l| l.starts_with(&prefix) && l.contains(&api));
        let fatal = run.stderr.lines().find(|l| {
            l.starts_with(&prefix)
                && l.contains("menps-dsm: fatal: cannot resolve the access to 0x")
                && l.contains(&format!("process rank {dead} died"))
        });
        match (by_call, fatal) {
            (Some(l), _) => {
                let at = number_after(l, " at ").unwrap();
                let latency = Duration::from_nanos(at.saturating_sub(killed_at));
                assert!(
                    latency < DETECTION_LIMIT,
                    "{what}: rank {r} took {latency:?}: {}",
                    run.dump()
                );
                assert!(
                    run.stdout.contains(&format!(
                        "[rank {r}] rank {r} later barrier: process rank {dead} died"
                    )),
                    "{what}: rank {r}: a later DSM call must fail too: {}",
                    run.dump()
                );
                let place = &l[l.find(" in ").unwrap() + 4..l.find(" at ").unwrap()];
                summary.push(format!("rank {r}: PeerDied in {place} after {latency:.1?}"));
            }
            (None, Some(l)) => summary.push(format!("rank {r}: {}", &l[prefix.len()..])),
            (None, None) => panic!(
                "{what}: rank {r} did not report the death of rank {dead}: {}",
                run.dump()
            ),
        }
    }
    summary
}

#[test]
fn kill9_of_a_mutex_holder_is_detected_in_barrier_lock_and_faults() {
    for &pol in &POLICIES {
        let what = format!("self-kill under {pol:?}");
        let run = drive(
            command("self_kill", 4, pol),
            &new_tag("self_kill"),
            |_, _| false,
        );
        let ended_at = mono_ns();
        let line = run
            .stdout
            .lines()
            .find(|l| l.contains("rank 2 killing itself at "))
            .unwrap_or_else(|| panic!("{what}: rank 2 did not get to the kill: {}", run.dump()));
        let killed_at = number_after(line, " at ").unwrap();
        let summary = check_detection(&run, 4, 2, killed_at, ended_at, &what);
        // Ranks 0 and 1 wait in DSM calls: they must get the error there.
        for (r, place) in [(0, "barrier"), (1, "lock of the mutex rank 2 held")] {
            assert!(
                summary[r].contains(&format!("PeerDied in {place}")),
                "{what}: {summary:?}: {}",
                run.dump()
            );
        }
        eprintln!("{what}: {summary:?}");
    }
}

/// Kills `victim` by pid while every rank of an `n`-process job is busy.
fn kill_busy_rank(n: usize, victim: usize, pol: (&str, &str, &str)) {
    let what = format!("kill -9 of busy rank {victim} of {n} under {pol:?}");
    let mut seen_at: Option<Instant> = None;
    let mut killed_at = 0;
    let run = drive(command("busy", n, pol), &new_tag("busy"), |_, out| {
        let working: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(" working, pid "))
            .collect();
        if working.len() < n {
            return false;
        }
        // Let them work a little longer, then kill the victim.
        let t = *seen_at.get_or_insert_with(Instant::now);
        if t.elapsed() < Duration::from_millis(200) {
            return false;
        }
        let line = working
            .iter()
            .find(|l| l.starts_with(&format!("[rank {victim}] ")))
            .unwrap();
        let pid = number_after(line, "pid ").unwrap() as i32;
        killed_at = mono_ns();
        // SAFETY: killing a process of the job we started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        true
    });
    let ended_at = mono_ns();
    assert!(killed_at != 0, "{what}: never killed: {}", run.dump());
    assert!(
        !run.stdout.contains("NOT detected") && !run.stderr.contains("panicked"),
        "{what}: {}",
        run.dump()
    );
    let summary = check_detection(&run, n, victim, killed_at, ended_at, &what);
    eprintln!("{what}: {summary:?}");
}

#[test]
fn kill9_by_pid_during_dsm_work_is_detected_4_procs_all_policies() {
    for (i, &pol) in POLICIES.iter().enumerate() {
        kill_busy_rank(4, 1 + i % 3, pol);
    }
}

#[test]
fn kill9_by_pid_during_dsm_work_is_detected_3_procs() {
    for (i, &pol) in [POLICIES[0], POLICIES[4], POLICIES[5]].iter().enumerate() {
        kill_busy_rank(3, i % 3, pol);
    }
}
