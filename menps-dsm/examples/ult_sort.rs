//! User-level threads on the DSM: a parallel quicksort and a tree sum,
//! written with the plain `ct_worker::join`, running on every process of a
//! job with their call stacks in DSM memory.
//!
//! 1. Process 0's `main` runs on a DSM call stack ([`Team::run_main`]) and
//!    fills a `Vec` of pseudo-random numbers; with [`DsmAllocator`] as the
//!    global allocator the vector is in the DSM heap, at the same address
//!    in every process.
//! 2. A fork ([`Team::parallel`]) starts two team threads per process; each
//!    sorts its block of the vector with a quicksort that forks both halves
//!    with `ct_worker::join`. The halves are user-level threads of the
//!    process's team runtime: idle workers steal them, each on a DSM stack
//!    of its own.
//! 3. A second fork sums each block with a tree of `join`s and writes the
//!    block's sum into a vector of `main`.
//! 4. `main` checks that every block is sorted (reading the other
//!    processes' writes through the DSM) and that the sums add up to the
//!    sum of the numbers it generated. The exit status is non-zero if a
//!    check fails.
//!
//! ```text
//! cargo run --release -p menps-dsm --example ult_sort
//! cargo run --release -p menps-dsm --example ult_sort -- 4000000
//! MENPS_NPROCS=4 cargo run --release -p menps-dsm --example ult_sort
//! ```
//!
//! It starts 2 processes by itself (`MENPS_NPROCS` overrides the count).

use std::process::ExitCode;
use std::time::Instant;

use ct_worker::OsThreads;
use menps_dsm::com::AnyCom;
use menps_dsm::dsm::team::{Team, TeamThread};
use menps_dsm::dsm::{Dsm, DsmAllocator};

#[global_allocator]
static ALLOC: DsmAllocator = DsmAllocator;

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

const USAGE: &str = "usage: ult_sort [N]
  N  how many numbers to sort (default 1000000)
The job has 2 processes unless MENPS_NPROCS says otherwise.";

/// Team threads per process.
const THREADS_PER_PROCESS: usize = 2;
/// Workers (OS threads) of each process's team runtime.
const WORKERS: usize = 2;
/// Below this many elements a quicksort or sum runs sequentially.
const LEAF: usize = 4096;

/// Sorts `v` with a quicksort whose two halves are forked with
/// `ct_worker::join` (they run in parallel when another worker steals one).
fn quicksort(v: &mut [u64]) {
    if v.len() <= LEAF {
        v.sort_unstable();
        return;
    }
    let p = partition(v);
    let (lo, hi) = v.split_at_mut(p);
    // `hi[0]` is the pivot, in its final place.
    ct_worker::join(|| quicksort(lo), || quicksort(&mut hi[1..]));
}

/// Partitions `v` (at least 3 elements) around the median of its first,
/// middle and last elements; returns the pivot's final index: everything
/// before it is smaller or equal, everything after it larger or equal.
fn partition(v: &mut [u64]) -> usize {
    let last = v.len() - 1;
    let mid = v.len() / 2;
    // Median of three, moved to the end.
    if v[mid] < v[0] {
        v.swap(mid, 0);
    }
    if v[last] < v[0] {
        v.swap(last, 0);
    }
    if v[mid] < v[last] {
        v.swap(mid, last);
    }
    let pivot = v[last];
    let mut store = 0;
    for i in 0..last {
        if v[i] < pivot {
            v.swap(i, store);
            store += 1;
        }
    }
    v.swap(store, last);
    store
}

/// The sum of `v`, as a tree of `ct_worker::join`s.
fn tree_sum(v: &[u64]) -> u64 {
    if v.len() <= LEAF {
        return v.iter().sum();
    }
    let (a, b) = v.split_at(v.len() / 2);
    let (x, y) = ct_worker::join(|| tree_sum(a), || tree_sum(b));
    x + y
}

/// The numbers to sort: a fixed pseudo-random sequence below 2^32 (so that
/// the sum of up to 2^32 of them fits in a `u64`).
fn numbers(n: usize) -> Vec<u64> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            x >> 32
        })
        .collect()
}

/// Block `b` of `blocks` equal blocks of `0..n`.
fn block(n: usize, blocks: usize, b: usize) -> std::ops::Range<usize> {
    n * b / blocks..n * (b + 1) / blocks
}

/// What `main` found (process 0).
struct Outcome {
    n: usize,
    blocks: usize,
    sorted: bool,
    sums_match: bool,
    secs: f64,
}

/// Process 0's `main`, on a DSM call stack; the other processes serve its
/// forks meanwhile.
fn dsm_main(team: &Team<'_, AnyCom<OsThreads>, OsThreads>, n: usize) -> Outcome {
    let nprocs = team.dsm().nprocs();
    let blocks = nprocs * THREADS_PER_PROCESS;
    // In the DSM heap: `main` runs DSM code.
    let mut data = numbers(n);
    let want: u64 = data.iter().sum();
    let mut sums = vec![0u64; blocks];
    let (data_at, sums_at) = (data.as_mut_ptr() as usize, sums.as_mut_ptr() as usize);
    let start = Instant::now();

    let sort = |t: &TeamThread<'_>| {
        let r = block(n, t.num_threads(), t.thread_num());
        // SAFETY: `data` (DSM heap) outlives the fork, and every team
        // thread sorts its own block of it.
        let mine =
            unsafe { std::slice::from_raw_parts_mut((data_at as *mut u64).add(r.start), r.len()) };
        quicksort(mine);
    };
    // SAFETY: the closure and what it uses (`n`, the two addresses) are in
    // main's frame, DSM memory; team threads write disjoint blocks.
    unsafe { team.parallel(THREADS_PER_PROCESS, &sort) }.expect("the sorting fork");

    let sum = |t: &TeamThread<'_>| {
        let r = block(n, t.num_threads(), t.thread_num());
        // SAFETY: sorted by the previous fork, which has been joined; only
        // read now.
        let mine =
            unsafe { std::slice::from_raw_parts((data_at as *const u64).add(r.start), r.len()) };
        let s = tree_sum(mine);
        // SAFETY: one element of `sums` (DSM heap) per team thread.
        unsafe { (sums_at as *mut u64).add(t.thread_num()).write(s) };
    };
    // SAFETY: as above; each thread writes its own element of `sums`.
    unsafe { team.parallel(THREADS_PER_PROCESS, &sum) }.expect("the summing fork");
    let secs = start.elapsed().as_secs_f64();

    let sorted = (0..blocks).all(|b| data[block(n, blocks, b)].is_sorted());
    let sums_match = sums.iter().sum::<u64>() == want;
    Outcome {
        n,
        blocks,
        sorted,
        sums_match,
        secs,
    }
}

fn main() -> ExitCode {
    // Warnings the libraries report (through `log`) go to stderr.
    ct_worker::log_to_stderr();
    let mut n = 1_000_000;
    for a in std::env::args().skip(1) {
        match a.parse() {
            Ok(v) => n = v,
            Err(_) => {
                let help = a == "-h" || a == "--help";
                eprintln!(
                    "{}{USAGE}",
                    if help { "" } else { "ult_sort: bad argument\n" }
                );
                return if help {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                };
            }
        }
    }
    let com: AnyCom<OsThreads> = match menps_dsm::launch::init_or_relaunch(2) {
        Ok(c) => c,
        Err(e) => {
            menps_dsm::launch::report_failure("ult_sort", &e);
            return ExitCode::FAILURE;
        }
    };
    let dsm: D = match Dsm::new(com) {
        Ok(d) => d,
        Err(e) => {
            menps_dsm::launch::report_failure("ult_sort", &e);
            return ExitCode::FAILURE;
        }
    };
    let nprocs = dsm.nprocs();
    let outcome = Team::new(&dsm, WORKERS).and_then(|team| team.run_main(|| dsm_main(&team, n)));
    let outcome = match outcome.and_then(|o| dsm.finalize().map(|()| o)) {
        Ok(o) => o,
        Err(e) => {
            menps_dsm::launch::report_failure("ult_sort", &e);
            return ExitCode::FAILURE;
        }
    };
    // Only process 0 ran `main`.
    let Some(o) = outcome else {
        return ExitCode::SUCCESS;
    };
    let ok = o.sorted && o.sums_match;
    println!(
        "sorted and summed {} numbers in {} blocks on {nprocs} process{} x {THREADS_PER_PROCESS} \
         team threads ({WORKERS} workers each), with join on DSM stacks: {:.1} ms, {}",
        o.n,
        o.blocks,
        if nprocs == 1 { "" } else { "es" },
        o.secs * 1e3,
        if ok { "verified" } else { "WRONG" }
    );
    if !o.sorted {
        eprintln!("ult_sort: a block is not sorted");
    }
    if !o.sums_match {
        eprintln!("ult_sort: the blocks' sums do not add up to the numbers' sum");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
