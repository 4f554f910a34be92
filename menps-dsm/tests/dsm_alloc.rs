//! Multi-process tests of the DSM's global allocator (shm backend): this
//! test binary runs with `DsmAllocator` as its `#[global_allocator]`.
//!
//! Each test drives jobs of this binary (see `common/`): the job processes
//! run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario.

use std::process::Command;

use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, Coll};
use menps_dsm::dsm::allocator::{in_dsm_context, is_dsm_pointer};
use menps_dsm::dsm::{Dsm, DsmAllocator, DsmBox, DsmVec};

mod common;
use common::*;

#[global_allocator]
static ALLOC: DsmAllocator = DsmAllocator;

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    // Before start-up, even "DSM context" gets system memory.
    let early = in_dsm_context(|| String::from("before"));
    assert!(!is_dsm_pointer(early.as_ptr()));
    let dsm: D = start_dsm_job();
    let me = dsm.rank();
    match name.as_str() {
        "share" => share(dsm, early),
        "stress" => {
            stress(&dsm);
            dsm.finalize().unwrap();
        }
        "typed" => {
            typed(&dsm);
            dsm.finalize().unwrap();
        }
        "exhaust" => exhaust(&dsm),
        other => panic!("unknown scenario {other}"),
    }
    println!("rank {me}: ok");
}

fn broadcast_words(dsm: &D, root: usize, words: &mut [u64]) {
    let mut b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    dsm.com().broadcast(root, &mut b).unwrap();
    for (w, c) in words.iter_mut().zip(b.chunks_exact(8)) {
        *w = u64::from_le_bytes(c.try_into().unwrap());
    }
}

/// A `Vec<String>` built in DSM context on rank 0 is read by everybody and
/// dropped by the last rank; reallocation moves objects across the
/// boundary; after finalize DSM objects stay readable and freeing them is
/// harmless.
fn share(dsm: D, early: String) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let mut desc = [0u64; 3];
    if me == 0 {
        let v: Vec<String> = in_dsm_context(|| {
            let mut v = Vec::new();
            for i in 0..1000 {
                v.push(format!("string number {i} of rank 0"));
            }
            v
        });
        assert!(is_dsm_pointer(v.as_ptr().cast()));
        assert!(v.iter().all(|s| is_dsm_pointer(s.as_ptr())));
        let mut v = core::mem::ManuallyDrop::new(v);
        desc = [v.as_mut_ptr() as u64, v.len() as u64, v.capacity() as u64];
    }
    broadcast_words(&dsm, 0, &mut desc);
    dsm.barrier().unwrap();
    let (p, len, cap) = (desc[0] as *mut String, desc[1] as usize, desc[2] as usize);
    {
        // SAFETY: rank 0's vector, written before the barrier; only read
        // here, and owned (dropped) below by the last rank only.
        let v = unsafe { core::mem::ManuallyDrop::new(Vec::from_raw_parts(p, len, cap)) };
        for (i, s) in v.iter().enumerate() {
            assert_eq!(s, &format!("string number {i} of rank 0"));
        }
    }
    dsm.barrier().unwrap();
    if me == n - 1 {
        // SAFETY: ownership passes to this process; nobody else uses it.
        let mut v = unsafe { Vec::from_raw_parts(p, len, cap) };
        // Reallocated here: rank 0's strings and vector grow (move to
        // objects of this process) in DSM context, then shrink outside it
        // (move to system memory).
        in_dsm_context(|| {
            v[0].push_str(&"+".repeat(300));
            v.push(String::from("one more"));
        });
        assert!(is_dsm_pointer(v.as_ptr().cast()) && is_dsm_pointer(v[0].as_ptr()));
        assert!(v[0].starts_with("string number 0 of rank 0+++"));
        v[1].push_str(&"-".repeat(5000));
        assert!(!is_dsm_pointer(v[1].as_ptr()));
        assert!(v[1].starts_with("string number 1 of rank 0---"));
        drop(v); // every string and the buffer go back where they live
    }
    // Realloc across the boundary: a system string grown in DSM context
    // moves into the DSM, a DSM string grown outside moves out.
    let mut s = early;
    in_dsm_context(|| s.push_str(&"x".repeat(5000)));
    assert!(is_dsm_pointer(s.as_ptr()));
    assert!(s.starts_with("beforexxx") && s.len() == 5006);
    s.push_str(&"y".repeat(10_000));
    assert!(!is_dsm_pointer(s.as_ptr()));
    assert!(s.starts_with("beforexxx") && s.ends_with("yyy"));
    // Growing within a class keeps the object.
    let mut t = in_dsm_context(|| String::with_capacity(20));
    let at = t.as_ptr();
    in_dsm_context(|| t.push_str("0123456789"));
    assert_eq!(t.as_ptr(), at);
    let kept: Vec<u64> = in_dsm_context(|| (0..100).collect());
    assert!(is_dsm_pointer(kept.as_ptr().cast()));
    dsm.barrier().unwrap();
    let stats = dsm.heap_stats();
    if me == n - 1 {
        // 1001 objects freed here; a per-thread cache keeps at most 32 of
        // a size class from the heap.
        assert!(stats.frees >= 1001 - 32, "{stats:?}");
    }
    dsm.finalize().unwrap();
    // After the DSM: its objects are still readable, dropping them is a
    // no-op, and "DSM context" allocates system memory again.
    assert_eq!(kept.iter().sum::<u64>(), 4950);
    drop(kept);
    drop(t);
    let late = in_dsm_context(|| vec![1u8; 100]);
    assert!(!is_dsm_pointer(late.as_ptr()));
    println!("rank {me}: after finalize ok");
}

/// Random allocations and frees of many sizes in DSM context, objects
/// handed to other processes through a DSM mailbox and freed there.
fn stress(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    const ROUNDS: usize = 40;
    const PER: usize = 24;
    // Mailbox: per round parity, per (sender, receiver): PER (addr, len).
    let mailbox = dsm.alloc_segment(1 << 20, 4096).unwrap() as *mut u64;
    let slot = |parity: usize, from: usize, to: usize, k: usize| {
        // SAFETY: inside the 1 MiB segment for n <= 4.
        unsafe { mailbox.add((((parity * 4 + from) * 4 + to) * PER + k) * 2) }
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (me as u64 + 1);
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let fill = |v: &mut Vec<u8>, seed: u64| {
        for (i, b) in v.iter_mut().enumerate() {
            *b = (seed as usize).wrapping_mul(31).wrapping_add(i) as u8;
        }
    };
    // (length as allocated, the vector)
    let mut mine: Vec<(usize, Vec<u8>)> = Vec::new();
    for round in 0..ROUNDS {
        let parity = round % 2;
        in_dsm_context(|| {
            // Local churn: allocate, grow, free.
            for _ in 0..200 {
                let len = 1 + (next() % 6000) as usize;
                let mut v = vec![0u8; len];
                // Zeroed, also where a freed object was (large ones are
                // zeroed by the heap unless the memory was never used).
                assert!(v.iter().all(|&b| b == 0), "vec![0; {len}] is not zero");
                fill(&mut v, 0);
                if next() % 3 == 0 {
                    // Grows, possibly into another size class.
                    v.extend_from_slice(&[7u8; 100]);
                }
                if next() % 2 == 0 {
                    mine.push((len, v));
                }
                if mine.len() > 64 {
                    let i = (next() % mine.len() as u64) as usize;
                    let (_, v) = mine.swap_remove(i);
                    assert!(is_dsm_pointer(v.as_ptr()));
                }
            }
            // Objects for every other process.
            for to in 0..n {
                if to == me {
                    continue;
                }
                for k in 0..PER {
                    let len = 1 + (next() % 9000) as usize;
                    let mut v = vec![0u8; len];
                    assert!(v.iter().all(|&b| b == 0), "vec![0; {len}] is not zero");
                    fill(&mut v, (round * 1000 + me * 100 + k) as u64);
                    let mut v = core::mem::ManuallyDrop::new(v.into_boxed_slice());
                    // SAFETY: this process's mailbox slot for `to`.
                    unsafe {
                        slot(parity, me, to, k).write(v.as_mut_ptr() as u64);
                        slot(parity, me, to, k).add(1).write(len as u64);
                    }
                }
            }
        });
        dsm.barrier().unwrap();
        // Check and free what the others sent (freed by the receiver, not
        // the allocating process), outside DSM context half the time.
        let receive = || {
            for from in 0..n {
                if from == me {
                    continue;
                }
                for k in 0..PER {
                    // SAFETY: written by `from` before the barrier.
                    let (p, len) = unsafe {
                        (
                            slot(parity, from, me, k).read() as *mut u8,
                            slot(parity, from, me, k).add(1).read() as usize,
                        )
                    };
                    assert!(is_dsm_pointer(p));
                    // SAFETY: a boxed slice `from` gave up for us.
                    let b = unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(p, len)) };
                    let seed = (round * 1000 + from * 100 + k) as u64;
                    for (i, &x) in b.iter().enumerate() {
                        assert_eq!(x, (seed as usize).wrapping_mul(31).wrapping_add(i) as u8);
                    }
                }
            }
        };
        if round % 2 == 0 {
            in_dsm_context(receive);
        } else {
            receive();
        }
    }
    for (len, v) in &mine {
        for (i, &b) in v.iter().enumerate() {
            let want = if i < *len { i as u8 } else { 7 };
            assert_eq!(b, want, "byte {i} of a vector of {len} (+ growth)");
        }
    }
    drop(mine);
    dsm.barrier().unwrap();
    let s = dsm.heap_stats();
    assert!(s.allocs > 0 && s.frees > 0, "{s:?}");
}

/// `DsmBox` and `DsmVec` hold non-`Copy` values: strings built in DSM
/// context, dropped in the DSM.
fn typed(dsm: &D) {
    let me = dsm.rank();
    let b = in_dsm_context(|| DsmBox::new(dsm, format!("box of rank {me}"))).unwrap();
    assert_eq!(*b, format!("box of rank {me}"));
    assert!(is_dsm_pointer(b.as_ptr().cast()));
    assert!(is_dsm_pointer(b.as_str().as_ptr()));
    let frees = dsm.heap_stats().frees;
    drop(b);
    // The string's buffer went to this thread's cache; the box itself to
    // the heap.
    assert_eq!(dsm.heap_stats().frees, frees + 1);
    let b = in_dsm_context(|| DsmBox::new(dsm, vec![1u32, 2, 3])).unwrap();
    assert_eq!(b.into_inner().unwrap(), [1, 2, 3]);
    let v: DsmVec<'_, String, _, _> = DsmVec::new_collective_with(dsm, 8, String::new()).unwrap();
    let p = v.as_ptr();
    if me == 0 {
        in_dsm_context(|| {
            for i in 0..8 {
                // SAFETY: element i, written by rank 0 only before the
                // barrier; the old empty string is dropped.
                unsafe { *p.add(i) = format!("element {i}") };
            }
        });
    }
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier, not written again.
    for (i, s) in unsafe { v.as_slice() }.iter().enumerate() {
        assert_eq!(s, &format!("element {i}"));
        assert!(is_dsm_pointer(s.as_ptr()));
    }
    // Freeing the vector drops its strings (collectively, once).
    let frees = dsm.heap_stats().frees;
    v.free_collective().unwrap();
    if me == 0 {
        // The array (its strings went to this thread's cache).
        assert!(dsm.heap_stats().frees > frees);
    }
}

/// A DSM context that allocates more than the heap holds ends its process
/// with a message that names the heap; the other processes do not hang.
fn exhaust(dsm: &D) {
    if dsm.rank() == 0 {
        let mut keep = Vec::new();
        in_dsm_context(|| {
            loop {
                keep.push(vec![1u8; 64 * 1024]);
            }
        });
    }
    // The others wait for rank 0, which never comes: its death is detected.
    let e = dsm.barrier().unwrap_err();
    eprintln!("rank {}: barrier failed: {e}", dsm.rank());
    std::process::exit(1);
}

// ---------------------------------------------------------------------------
// The driver side.

fn job(scenario: &str, n: usize, heap: &str) -> JobRun {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", n.to_string())
        .env("MENPS_DSM_HEAP_SIZE", heap);
    let tag = new_tag(scenario);
    drive(cmd, &tag, |_, _| false)
}

#[test]
fn vec_of_strings_crosses_processes_and_boundaries() {
    for n in [2, 4] {
        let run = job("share", n, "64M");
        assert_passed(&run, &format!("share, {n} processes"), n);
        assert_eq!(run.stdout.matches("after finalize ok").count(), n);
    }
}

#[test]
fn randomized_alloc_and_remote_free() {
    for n in [2, 3] {
        let run = job("stress", n, "256M");
        assert_passed(&run, &format!("stress, {n} processes"), n);
    }
}

#[test]
fn typed_helpers_hold_non_copy_values() {
    let run = job("typed", 2, "16M");
    assert_passed(&run, "typed, 2 processes", 2);
}

#[test]
fn exhausted_heap_is_a_clear_failure() {
    let run = job("exhaust", 2, "4M");
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("the DSM heap cannot serve"),
        "{}",
        run.dump()
    );
    // The reason, from the heap: out of memory …
    assert!(run.stderr.contains("MENPS_DSM_HEAP_SIZE"), "{}", run.dump());
    // … or no heap at all.
    let run = job("exhaust", 2, "0");
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("the DSM has no heap (heap_size is 0"),
        "{}",
        run.dump()
    );
}

/// The global allocator on the `mpi` backend: the same scenarios as jobs of
/// `mpirun` (they join as `AnyCom`).
#[cfg(feature = "mpi")]
#[test]
fn allocator_scenarios_under_mpirun() {
    for (scenario, heap) in [("share", "64M"), ("stress", "256M"), ("typed", "16M")] {
        let run = mpirun_job(scenario, 2, &[("MENPS_DSM_HEAP_SIZE", heap)]);
        assert_passed(&run, &format!("{scenario} under mpirun"), 2);
    }
}
