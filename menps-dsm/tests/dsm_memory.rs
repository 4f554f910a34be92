//! Multi-process tests of the DSM's memory layer (shm backend): the address
//! map, adopted ranges, the stack region and thread-local blocks, and the
//! errors of bad requests — which must fail in every process alike, never
//! leave some processes waiting in a collective call.
//!
//! Each test drives jobs of this binary (see `common/`): the job processes
//! run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario.

use std::process::Command;

use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, Coll};
use menps_dsm::dsm::{Dsm, DsmError, RegionKind};

mod common;
use common::*;

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

/// Words of the adopted table.
const WORDS: usize = 3 * 4096 / 8;

/// A page-aligned array of this test binary, adopted by the DSM.
#[repr(C, align(4096))]
struct Table([u64; WORDS]);

static mut TABLE: Table = Table([0; WORDS]);

/// A second page-aligned array, for the overlap errors.
static mut OTHER: Table = Table([0; WORDS]);

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let dsm: D = start_dsm_job();
    let me = dsm.rank();
    let f: fn(&D) = match name.as_str() {
        // Finalizes the DSM itself.
        "adopt" => {
            adopt(dsm);
            println!("rank {me}: ok");
            return;
        }
        "regions" => regions,
        "bad_requests" => bad_requests,
        "slots" => slots,
        other => panic!("unknown scenario {other}"),
    };
    f(&dsm);
    dsm.finalize().unwrap();
    println!("rank {me}: ok");
}

fn value(rank: usize, i: usize) -> u64 {
    (rank as u64 + 1) << 32 | i as u64
}

/// Process 0's contents become everybody's; writes of every process are
/// seen by all after a barrier; after finalize the range is ordinary memory
/// holding this process's copy.
fn adopt(dsm: D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let t = &raw mut TABLE;
    // Before adoption every process has its own contents; process 0's win.
    // Page 1 stays zero on process 0 (the pages that are zero there are not
    // sent) but not elsewhere.
    for i in 0..WORDS {
        let v = if i / 512 == 1 && me == 0 {
            0
        } else {
            value(me, i)
        };
        // SAFETY: nobody else uses TABLE in this process.
        unsafe { (*t).0[i] = v };
    }
    dsm.adopt_range(t.cast(), size_of::<Table>(), 4096).unwrap();
    let regions = dsm.regions();
    let r = regions
        .iter()
        .find(|r| r.kind == RegionKind::Adopted)
        .expect("the adopted region is listed");
    assert_eq!((r.base, r.size), (t as usize, size_of::<Table>()));
    for i in 0..WORDS {
        let want = if i / 512 == 1 { 0 } else { value(0, i) };
        // SAFETY: adopted DSM memory, written by nobody since adoption.
        assert_eq!(unsafe { (*t).0[i] }, want, "word {i} after adoption");
    }
    dsm.barrier().unwrap();
    // Each process writes a stripe.
    for i in (me..WORDS).step_by(n) {
        // SAFETY: word i belongs to this process's stripe.
        unsafe { (*t).0[i] = value(me + 10, i) };
    }
    dsm.barrier().unwrap();
    for i in 0..WORDS {
        // SAFETY: written before the barrier.
        assert_eq!(unsafe { (*t).0[i] }, value(i % n + 10, i), "word {i}");
    }
    dsm.barrier().unwrap();
    let me = dsm.rank();
    dsm.finalize().unwrap();
    // Private memory again, with this process's (up-to-date) copy.
    for i in 0..WORDS {
        // SAFETY: no DSM any more; the range is this process's memory.
        unsafe {
            assert_eq!((*t).0[i], value(i % n + 10, i));
            (*t).0[i] = me as u64;
        }
    }
    // SAFETY: as above.
    assert_eq!(unsafe { (*t).0[WORDS - 1] }, me as u64);
    println!("rank {me}: adopted range private again");
}

/// The map is the same everywhere, user segments keep counting up, runtime
/// regions are where they are.
fn regions(dsm: &D) {
    let a = dsm.alloc_segment(1 << 16, 4096).unwrap();
    let b = dsm.alloc_segment(1 << 16, 8192).unwrap();
    assert!(b as usize > a as usize);
    let regions = dsm.regions();
    let kinds: Vec<RegionKind> = regions.iter().map(|r| r.kind).collect();
    // The heap (no globals in this binary, no stack region before a team
    // asks for it), then ours.
    assert_eq!(
        kinds,
        [RegionKind::Heap, RegionKind::Segment, RegionKind::Segment]
    );
    assert!(dsm.stacks().is_none());
    for w in regions.iter().enumerate() {
        for o in regions.iter().skip(w.0 + 1) {
            assert!(w.1.end() <= o.base || o.end() <= w.1.base, "{w:?} {o:?}");
        }
    }
    // The same in every process.
    let mine: Vec<u8> = regions
        .iter()
        .flat_map(|r| [r.base as u64, r.size as u64, r.block_size as u64])
        .flat_map(u64::to_le_bytes)
        .collect();
    let all = dsm.com().allgather(&mine).unwrap();
    for c in all.chunks_exact(mine.len()) {
        assert_eq!(c, &mine[..]);
    }
    let heap = dsm.heap_range().unwrap();
    assert_eq!(regions[0].base, heap.0 as usize);
}

fn expect_err(r: Result<(), DsmError>, what: &str, needle: &str) {
    match r {
        Ok(()) => panic!("{what}: succeeded"),
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains(needle), "{what}: {s}");
            println!("rank error ({what}): {s}");
        }
    }
}

/// Bad requests fail in every process (no process hangs in a collective
/// call), and the DSM goes on working afterwards.
fn bad_requests(dsm: &D) {
    let me = dsm.rank();
    let t = &raw mut TABLE;
    let o = &raw mut OTHER;
    let page = 4096;
    dsm.adopt_range(t.cast(), size_of::<Table>(), 4096).unwrap();
    // Overlapping an adopted range.
    expect_err(
        // SAFETY: a pointer inside TABLE (not dereferenced).
        dsm.adopt_range(unsafe { t.cast::<u8>().add(page) }, page, 4096),
        "overlap",
        "overlap the adopted range",
    );
    // Not page-aligned.
    expect_err(
        // SAFETY: a pointer inside OTHER (not dereferenced).
        dsm.adopt_range(unsafe { o.cast::<u8>().add(8) }, page, 4096),
        "unaligned",
        "page boundaries",
    );
    // Inside the DSM's own range.
    let seg = dsm.alloc_segment(1 << 16, 4096).unwrap();
    expect_err(
        dsm.adopt_range(seg, page, 4096),
        "inside the DSM",
        "DSM's own range",
    );
    // A length that is not a multiple of the block size.
    expect_err(
        dsm.adopt_range(o.cast(), 3 * page, 8192),
        "block multiple",
        "multiple of its block size",
    );
    // Only process 1 asks for something wrong: everybody fails.
    let len = if me == 1 { page + 1 } else { page };
    expect_err(
        dsm.adopt_range(o.cast(), len, 4096).map(drop),
        "one bad process",
        if me == 1 {
            "multiple of its block size"
        } else {
            "process 1 could not place"
        },
    );
    // Processes that ask for different (valid) things: everybody fails.
    let len = if me == 0 { page } else { 2 * page };
    expect_err(
        dsm.adopt_range(o.cast(), len, 4096).map(drop),
        "disagreement",
        "disagree",
    );
    // A segment that is not a multiple of its block size, or empty.
    expect_err(
        dsm.alloc_segment(5000, 4096).map(drop),
        "segment size",
        "positive multiple",
    );
    expect_err(dsm.alloc_segment(0, 4096).map(drop), "empty", "positive");
    // The DSM still works: OTHER can be adopted properly now.
    dsm.adopt_range(o.cast(), page, 4096).unwrap();
    if me == 0 {
        // SAFETY: adopted DSM memory only process 0 writes now.
        unsafe { (*o).0[3] = 77 };
    }
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier.
    assert_eq!(unsafe { (*o).0[3] }, 77);
    dsm.barrier().unwrap();
}

/// Stack slots: each process has its own share at the same addresses
/// everywhere; thread-local blocks are created once.
fn slots(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    assert!(dsm.stacks().is_none(), "created on demand");
    let stacks = dsm.create_stacks().unwrap();
    assert!(core::ptr::eq(stacks, dsm.create_stacks().unwrap()), "once");
    assert_eq!(stacks.kind(), RegionKind::Stacks);
    assert_eq!(stacks.slot_size(), 128 * 1024);
    let per = stacks.slots_per_process();
    let mine: Vec<*mut u8> = (0..per).map(|_| stacks.take().unwrap()).collect();
    assert!(stacks.take().is_err(), "all taken");
    for (i, &s) in mine.iter().enumerate() {
        assert_eq!(stacks.owner_of(s), Some((me, i)));
    }
    // Write into every slot's last word (as a stack would) and read the
    // other processes' after a barrier: the slots are shared memory.
    for &s in &mine {
        // SAFETY: our own slot of DSM memory.
        unsafe {
            s.add(stacks.slot_size() - 8)
                .cast::<u64>()
                .write(me as u64 + 100)
        };
    }
    dsm.barrier().unwrap();
    for r in 0..n {
        let s = stacks.slot(r, per - 1).unwrap();
        // SAFETY: process r's slot, written before the barrier.
        let v = unsafe { s.add(stacks.slot_size() - 8).cast::<u64>().read() };
        assert_eq!(v, r as u64 + 100);
    }
    for s in mine {
        stacks.give_back(s).unwrap();
    }
    assert_eq!(stacks.taken(), 0);
    let tls = dsm.create_thread_local_blocks(4096, 8).unwrap();
    assert_eq!(tls.kind(), RegionKind::ThreadLocal);
    assert_eq!(tls.slots_per_process(), 8);
    assert!(dsm.create_thread_local_blocks(4096, 8).is_err());
    assert!(dsm.thread_local_blocks().is_some());
    dsm.barrier().unwrap();
}

// ---------------------------------------------------------------------------
// The driver side.

fn job(scenario: &str, nprocs: usize) -> JobRun {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", nprocs.to_string())
        .env("MENPS_DSM_HEAP_SIZE", "16M");
    let tag = new_tag(scenario);
    drive(cmd, &tag, |_, _| false)
}

fn run(scenario: &str, procs: &[usize]) -> Vec<JobRun> {
    procs
        .iter()
        .map(|&n| {
            let run = job(scenario, n);
            let what = format!("{scenario} with {n} processes");
            assert_passed(&run, &what, n);
            run
        })
        .collect()
}

#[test]
fn adopted_static_is_shared_and_private_again_after_finalize() {
    for (run, n) in run("adopt", &[2, 4]).iter().zip([2, 4]) {
        assert_eq!(
            run.stdout.matches("adopted range private again").count(),
            n,
            "{}",
            run.dump()
        );
    }
}

#[test]
fn address_map_is_identical_everywhere() {
    run("regions", &[2, 3]);
}

#[test]
fn bad_requests_fail_in_every_process() {
    for (run, n) in run("bad_requests", &[2, 4]).iter().zip([2, 4]) {
        // Every process reported all eight errors.
        assert_eq!(
            run.stdout.matches("rank error").count(),
            8 * n,
            "{}",
            run.dump()
        );
    }
}

#[test]
fn stack_and_thread_local_slots() {
    run("slots", &[2, 4]);
}

/// The memory layer on the `mpi` backend: the same scenarios as jobs of
/// `mpirun` (they join as `AnyCom`).
#[cfg(feature = "mpi")]
#[test]
fn memory_scenarios_under_mpirun() {
    for scenario in ["adopt", "regions", "bad_requests", "slots"] {
        let run = mpirun_job(scenario, 2, &[("MENPS_DSM_HEAP_SIZE", "16M")]);
        assert_passed(&run, &format!("{scenario} under mpirun"), 2);
    }
}
