//! Multi-process tests of `DsmVec`'s checked access for SPMD code —
//! stripes written by each process and by the threads of a process, views
//! read by everybody after a barrier, out-of-range and overlapping requests
//! refused — and of its freeing on drop (shm backend), under the default
//! protocol and the fixed-home writer.
//!
//! Each test drives jobs of this binary (see `common/`): the job processes
//! run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, Coll};
use menps_dsm::dsm::{Dsm, DsmError, DsmVec};

mod common;
use common::*;

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let dsm: D = start_dsm_job();
    let me = dsm.rank();
    match name.as_str() {
        "stripes" => stripes(&dsm),
        "errors" => errors(&dsm),
        "drop" => drop_frees(&dsm),
        "race" => race(&dsm),
        other => panic!("unknown scenario {other}"),
    }
    println!("rank {me}: ok");
    dsm.finalize().unwrap();
}

fn value(i: usize, round: u64) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round
}

/// Every element of `v` after a barrier, read through a view by every
/// process.
fn check_all(v: &DsmVec<'_, u64, AnyCom<OsThreads>, OsThreads>, round: u64, what: &str) {
    let all = v.view().unwrap();
    assert_eq!(all.range(), 0..v.len());
    for (i, &x) in all.iter().enumerate() {
        assert_eq!(x, value(i, round), "{what}: element {i}");
    }
}

/// Each process writes its stripe (whole, in pieces by OS threads, in
/// chunks by user-level threads, and as several parts taken by threads
/// themselves); after each barrier every process reads every element.
fn stripes(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    // Not a multiple of the process count, and spanning many blocks.
    const LEN: usize = 100_003;
    let v: DsmVec<'_, u64, _, _> = DsmVec::new_collective(dsm, LEN).unwrap();

    // The parts of the processes cover 0..LEN, in rank order.
    let mine = v.my_range();
    assert_eq!(mine, v.part_range(me, n).unwrap());
    let starts = u64s(
        &dsm.com()
            .allgather(&(mine.start as u64).to_le_bytes())
            .unwrap(),
    );
    let ends = u64s(
        &dsm.com()
            .allgather(&(mine.end as u64).to_le_bytes())
            .unwrap(),
    );
    assert_eq!(starts[0], 0);
    assert_eq!(ends[n - 1], LEN as u64);
    for r in 1..n {
        assert_eq!(starts[r], ends[r - 1], "parts of ranks {} and {r}", r - 1);
    }

    // Round 1: the whole stripe, by this thread.
    {
        let mut s = v.my_part_mut().unwrap();
        assert_eq!(s.range(), mine);
        let start = s.start();
        for (k, x) in s.iter_mut().enumerate() {
            *x = value(start + k, 1);
        }
    }
    dsm.barrier().unwrap();
    check_all(&v, 1, "round 1 (one thread per process)");
    dsm.barrier().unwrap();

    // Round 2: the stripe in pieces, one per OS thread.
    {
        let mut s = v.my_part_mut().unwrap();
        std::thread::scope(|sc| {
            for (start, piece) in s.parts_mut(3) {
                sc.spawn(move || {
                    for (k, x) in piece.iter_mut().enumerate() {
                        *x = value(start + k, 2);
                    }
                });
            }
        });
    }
    dsm.barrier().unwrap();
    check_all(&v, 2, "round 2 (OS threads)");
    dsm.barrier().unwrap();

    // Round 3: the stripe in chunks of 1000 elements, one user-level thread
    // each, on 2 workers.
    {
        let mut s = v.my_part_mut().unwrap();
        let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            ct_worker::scope(|sc| {
                for (start, chunk) in s.indexed_chunks_mut(1000) {
                    sc.spawn(move || {
                        for (k, x) in chunk.iter_mut().enumerate() {
                            *x = value(start + k, 3);
                        }
                    });
                }
            })
        });
    }
    dsm.barrier().unwrap();
    check_all(&v, 3, "round 3 (user-level threads)");
    dsm.barrier().unwrap();

    // Round 4: 2 parts per process, each taken by a thread of its own (the
    // two stripes are disjoint, so both are granted at once).
    let lent = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for t in 0..2 {
            let (v, lent) = (&v, &lent);
            sc.spawn(move || {
                let mut s = v.part_mut(me * 2 + t, n * 2).unwrap();
                lent.fetch_add(1, Ordering::SeqCst);
                // Both stripes are alive at once.
                while lent.load(Ordering::SeqCst) < 2 {
                    std::thread::yield_now();
                }
                let start = s.start();
                for (k, x) in s.iter_mut().enumerate() {
                    *x = value(start + k, 4);
                }
            });
        }
    });
    dsm.barrier().unwrap();
    check_all(&v, 4, "round 4 (a stripe per thread)");
    // Readers of parts of other processes, as stripes.
    let next = v.part_range((me + 1) % n, n).unwrap();
    let theirs = v.stripe(next.clone()).unwrap();
    assert_eq!(theirs.range(), next);
    assert!(
        theirs
            .iter()
            .enumerate()
            .all(|(k, &x)| x == value(next.start + k, 4))
    );
    drop(theirs);
    dsm.barrier().unwrap();
    v.free().unwrap();
    dsm.barrier().unwrap();
}

fn expect_refused<T>(r: Result<T, DsmError>, what: &str, words: &[&str]) {
    match r {
        Ok(_) => panic!("{what}: granted"),
        Err(DsmError::InvalidArgument(m)) => {
            for w in words {
                assert!(m.contains(w), "{what}: message {m:?} lacks {w:?}");
            }
        }
        Err(e) => panic!("{what}: unexpected error {e}"),
    }
}

/// Out-of-range requests and overlapping borrows in one process are
/// refused with clear errors; what does not overlap is granted.
#[allow(clippy::reversed_empty_ranges)]
fn errors(dsm: &D) {
    const LEN: usize = 1000;
    let v: DsmVec<'_, u32, _, _> = DsmVec::new_collective(dsm, LEN).unwrap();

    // Out of range.
    let oob = ["out of range for a DsmVec of 1000 elements"];
    expect_refused(v.stripe_mut(0..1001), "stripe_mut(0..1001)", &oob);
    expect_refused(v.stripe_mut(1000..=1000), "stripe_mut(1000..=1000)", &oob);
    expect_refused(v.stripe_mut(2000..), "stripe_mut(2000..)", &oob);
    expect_refused(v.stripe(..=usize::MAX), "stripe(..=MAX)", &oob);
    expect_refused(v.stripe(999..1001), "stripe(999..1001)", &["999..1001"]);
    expect_refused(
        v.stripe_mut(7..3),
        "stripe_mut(7..3)",
        &["7..3", "starts after it ends"],
    );
    expect_refused(v.part_range(4, 4), "part_range(4, 4)", &["part 4 of 4"]);
    expect_refused(v.part_mut(0, 0), "part_mut(0, 0)", &["part 0 of 0"]);
    // The ends are fine, and empty stripes too.
    assert_eq!(v.stripe_mut(1000..).unwrap().len(), 0);
    assert_eq!(v.stripe(..).unwrap().len(), LEN);
    assert_eq!(v.stripe_mut(999..1000).unwrap().range(), 999..1000);

    // Overlaps in this process.
    let m = v.stripe_mut(100..200).unwrap();
    let held = ["100..200", "borrowed mutably", "drop it first"];
    expect_refused(v.stripe_mut(150..250), "overlapping stripe_mut", &held);
    expect_refused(v.stripe_mut(..=100), "stripe_mut(..=100)", &held);
    expect_refused(v.stripe(199..200), "overlapping stripe", &held);
    expect_refused(v.view(), "view with a stripe out", &held);
    if dsm.rank() == 0 {
        expect_refused(v.my_part_mut(), "my_part_mut over a stripe", &held);
    } else {
        // This process's part does not overlap.
        assert!(v.my_part_mut().unwrap().start() >= 200);
    }
    // Adjacent and empty ones are granted.
    let left = v.stripe_mut(0..100).unwrap();
    let right = v.stripe(200..300).unwrap();
    let empty = v.stripe_mut(150..150).unwrap();
    // Another thread of the process is refused the same way.
    std::thread::scope(|s| {
        s.spawn(|| expect_refused(v.stripe_mut(120..130), "from another thread", &held));
    });
    drop((m, left, right, empty));
    // Views coexist, and keep writers out.
    let a = v.view().unwrap();
    let b = v.view().unwrap();
    let c = v.stripe(5..6).unwrap();
    expect_refused(
        v.stripe_mut(500..501),
        "stripe_mut under a view",
        &["0..1000", "for reading"],
    );
    drop((a, b, c));
    // Everything is given back (each process writes only its own part: two
    // processes writing the same element would be a race).
    let mut all = v.stripe_mut(..).unwrap();
    all[v.my_range()].fill(7);
    drop(all);
    // A leaked stripe keeps its elements; the vector can still be freed.
    core::mem::forget(v.stripe_mut(10..20).unwrap());
    expect_refused(v.stripe(15..16), "under a leaked stripe", &["10..20"]);
    dsm.barrier().unwrap();

    // Pieces: indexed chunks and parts cover the stripe in order.
    {
        let mut s = v.stripe_mut(300..317).unwrap();
        let chunks: Vec<_> = s.indexed_chunks_mut(5).map(|(i, c)| (i, c.len())).collect();
        assert_eq!(chunks, [(300, 5), (305, 5), (310, 5), (315, 2)]);
        let parts: Vec<_> = s.parts_mut(4).map(|(i, p)| (i, p.len())).collect();
        assert_eq!(parts, [(300, 5), (305, 4), (309, 4), (313, 4)]);
        let many: Vec<_> = s.parts_mut(20).map(|(_, p)| p.len()).collect();
        assert_eq!(many.iter().sum::<usize>(), 17);
        assert_eq!(many.len(), 20);
    }
    v.free().unwrap();
    dsm.barrier().unwrap();
}

/// Values that count their drops (in this process).
static DROPPED: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Default)]
struct Tally(#[allow(dead_code)] u64);

impl Drop for Tally {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}

/// The processes drop their handles one after the other: the vector stays
/// usable until the last one, which drops the elements and frees the
/// memory (exactly once in the job); a handle dropped by a panicking thread
/// is not counted (the vector stays allocated).
fn drop_frees(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    const LEN: usize = 50_000;
    let gather = |x: u64| u64s(&dsm.com().allgather(&x.to_le_bytes()).unwrap());

    for round in 0..2 {
        let v: DsmVec<'_, u64, _, _> = DsmVec::new_collective(dsm, LEN).unwrap();
        {
            let mut s = v.my_part_mut().unwrap();
            let start = s.start();
            for (k, x) in s.iter_mut().enumerate() {
                *x = value(start + k, round);
            }
        }
        dsm.barrier().unwrap();
        let frees = dsm.heap_stats().frees;
        let mut v = Some(v);
        // Round 0 drops in rank order, round 1 in reverse; odd ranks use
        // `free` (which says whether it freed), even ones a plain drop.
        for k in 0..n {
            let turn = if round == 0 { k } else { n - 1 - k };
            if me == turn {
                let v = v.take().unwrap();
                // Still intact: the processes that dropped theirs freed
                // nothing.
                check_all(&v, round, "before this process's drop");
                if me % 2 == 1 {
                    assert_eq!(v.free().unwrap(), k == n - 1, "free's answer");
                } else {
                    drop(v);
                }
            }
            dsm.com().barrier().unwrap();
        }
        let freed = gather(dsm.heap_stats().frees - frees);
        let last = if round == 0 { n - 1 } else { 0 };
        let expect: Vec<u64> = (0..n).map(|r| u64::from(r == last)).collect();
        assert_eq!(freed, expect, "round {round}: frees per process");
        dsm.barrier().unwrap();
    }

    // Elements are dropped once, by the last process.
    let before = DROPPED.load(Ordering::SeqCst);
    let t: DsmVec<'_, Tally, _, _> = DsmVec::new_collective(dsm, 100).unwrap();
    // (`new_collective` drops each process's default value; process 0 put
    // 100 clones of its own into the vector.)
    let base = DROPPED.load(Ordering::SeqCst);
    assert_eq!(base - before, 1);
    assert_eq!(t.view().unwrap().len(), 100);
    drop(t);
    dsm.barrier().unwrap();
    let dropped = gather((DROPPED.load(Ordering::SeqCst) - base) as u64);
    assert_eq!(
        dropped.iter().sum::<u64>(),
        100,
        "elements dropped: {dropped:?}"
    );
    assert!(dropped.iter().all(|&d| d == 0 || d == 100), "{dropped:?}");

    // A handle dropped while its thread panics is not counted.
    let v: DsmVec<'_, u64, _, _> = DsmVec::new_collective(dsm, 10).unwrap();
    let frees = dsm.heap_stats().frees;
    if me == 0 {
        let r = std::thread::scope(|s| {
            s.spawn(move || {
                let _v = v;
                panic!("a deliberate panic holding a DsmVec handle");
            })
            .join()
        });
        assert!(r.is_err());
    } else {
        drop(v);
    }
    dsm.barrier().unwrap();
    let freed = gather(dsm.heap_stats().frees - frees);
    assert!(
        freed.iter().all(|&f| f == 0),
        "freed after a panic: {freed:?}"
    );
    dsm.barrier().unwrap();
}

/// Two processes take overlapping stripes (each table only knows its own
/// process) and write the same element differently in one phase: the DSM
/// reports the write-write race at the barrier, naming the element's
/// address.
fn race(dsm: &D) {
    let me = dsm.rank();
    let v: DsmVec<'_, u64, _, _> = DsmVec::new_collective(dsm, 4096).unwrap();
    let at = v.as_ptr() as usize + 8 * 1000;
    println!("rank {me}: element 1000 at {at:#x}");
    if me == 1 || me == 2 {
        let mut s = v.stripe_mut(1000..1001).unwrap();
        s[0] = me as u64 + 1;
    }
    dsm.com().barrier().unwrap();
    barrier_reporting_race(dsm);
}

// ---------------------------------------------------------------------------
// The driver side.

/// The policies every scenario runs under: the default protocol and the
/// fixed-home writer.
const POLICIES: &[&str] = &["floating", "fixed"];

fn job(scenario: &str, nprocs: usize, writer: &str) -> JobRun {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", nprocs.to_string())
        .env("MENPS_DSM_WRITER", writer)
        .env("MENPS_DSM_HEAP_SIZE", "64M");
    let tag = new_tag(scenario);
    drive(cmd, &tag, |_, _| false)
}

fn run(scenario: &str, procs: &[usize]) {
    for &n in procs {
        for &writer in POLICIES {
            let run = job(scenario, n, writer);
            let what = format!("{scenario} with {n} processes, writer {writer}");
            assert_passed(&run, &what, n);
            eprintln!("{what}: {:?}", run.elapsed);
        }
    }
}

#[test]
fn each_process_writes_its_stripe_and_all_read_everything() {
    run("stripes", &[2, 3]);
}

#[test]
fn out_of_range_and_overlapping_stripes_are_refused() {
    run("errors", &[2]);
}

#[test]
fn dropping_every_handle_frees_the_vector_once() {
    run("drop", &[2, 3]);
}

#[test]
fn overlapping_stripes_of_two_processes_are_a_reported_race() {
    for &writer in POLICIES {
        let run = job("race", 3, writer);
        assert!(
            !run.status.success(),
            "race not reported under writer {writer}: {}",
            run.dump()
        );
        assert!(
            run.stdout.contains("detected: write-write data race at 0x"),
            "race not reported as such under writer {writer}: {}",
            run.dump()
        );
        let at = run
            .stdout
            .lines()
            .find_map(|l| l.split_once("element 1000 at ").map(|(_, a)| a.trim()))
            .expect("the element's address");
        assert!(
            run.stdout.contains(&format!("data race at {at}")),
            "race report lacks the address {at}: {}",
            run.dump()
        );
    }
}

/// The scenarios on the `mpi` backend, as jobs of `mpirun` (they join as
/// `AnyCom`).
#[cfg(feature = "mpi")]
#[test]
fn stripes_and_freeing_under_mpirun() {
    for scenario in ["stripes", "errors", "drop"] {
        let run = mpirun_job(scenario, 3, &[("MENPS_DSM_HEAP_SIZE", "64M")]);
        assert_passed(&run, &format!("{scenario} under mpirun"), 3);
    }
}
