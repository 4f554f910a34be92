//! `create`: a binary fork tree of N leaves with no work — the cost of
//! creating, running and joining N user-level threads (original
//! `bench-create`). Each inner node spawns its left half as a new thread
//! (`spawn` + `JoinHandle::join`) and runs its right half itself. Baseline in
//! the same run: the same tree with `rayon::join`. `ct-worker-hook` is the
//! same tree on a runtime with a switch hook installed (one that counts its
//! calls per worker), to show what the hook calls cost. Output: JSON lines,
//! seconds.

use std::hint::black_box;

use ct_bench::{Args, emit, repeat, time_secs};
use ct_worker::Config;

mod common;
use common::HookConfig;

fn tree_ct_in<C: Config>(leaves: u64) -> u64 {
    if leaves <= 1 {
        return black_box(leaves);
    }
    let half = leaves / 2;
    let left = ct_worker::spawn_in::<C, _, _>(move || tree_ct_in::<C>(half));
    let right = tree_ct_in::<C>(leaves - half);
    left.join() + right
}

fn tree_ct(leaves: u64) -> u64 {
    if leaves <= 1 {
        return black_box(leaves);
    }
    let half = leaves / 2;
    let left = ct_worker::spawn(move || tree_ct(half));
    let right = tree_ct(leaves - half);
    left.join() + right
}

fn tree_rayon(leaves: u64) -> u64 {
    if leaves <= 1 {
        return black_box(leaves);
    }
    let half = leaves / 2;
    let (l, r) = rayon::join(|| tree_rayon(half), || tree_rayon(leaves - half));
    l + r
}

fn check(got: u64, n: u64) {
    if got != n {
        eprintln!("tree counted {got} leaves, expected {n}");
        std::process::exit(1);
    }
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "create [--n 1000000] [--workers 1,2] [--runs 7]\n\
             Seed parameters: N = 10^6 leaves, workers 1 and 2. Prints JSON lines (seconds),\n\
             with a rayon::join tree measured in the same run."
        );
        return;
    }
    let n: u64 = args.get("n", 1_000_000);
    let workers: Vec<usize> = args.list("workers", &[1, 2]);
    let runs: usize = args.get("runs", 7);
    args.finish("create");
    for &w in &workers {
        eprintln!("ct-worker create {n} with {w} workers...");
        let rt = ct_worker::Runtime::builder()
            .workers(w)
            .build()
            .expect("runtime");
        let s = repeat(runs, || time_secs(|| check(rt.block_on(|| tree_ct(n)), n)));
        drop(rt);
        let per = s.median * 1e9 / n as f64;
        emit(
            "ct-worker",
            "create",
            "ct-worker",
            &[
                ("n", n.into()),
                ("workers", w.into()),
                ("ns_per_thread", per.into()),
            ],
            "s",
            &s,
        );

        eprintln!("ct-worker (hook) create {n} with {w} workers...");
        let rt = ct_worker::Runtime::builder()
            .workers(w)
            .build_with::<HookConfig>()
            .expect("runtime");
        let s = repeat(runs, || {
            time_secs(|| check(rt.block_on(|| tree_ct_in::<HookConfig>(n)), n))
        });
        drop(rt);
        let per = s.median * 1e9 / n as f64;
        emit(
            "ct-worker",
            "create",
            "ct-worker-hook",
            &[
                ("n", n.into()),
                ("workers", w.into()),
                ("ns_per_thread", per.into()),
            ],
            "s",
            &s,
        );

        eprintln!("rayon create {n} with {w} workers...");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(w)
            .build()
            .expect("rayon pool");
        let s = repeat(runs, || {
            time_secs(|| check(pool.install(|| tree_rayon(n)), n))
        });
        let per = s.median * 1e9 / n as f64;
        emit(
            "ct-worker",
            "create",
            "rayon",
            &[
                ("n", n.into()),
                ("workers", w.into()),
                ("ns_per_thread", per.into()),
            ],
            "s",
            &s,
        );
    }
    ct_bench::print_summary();
}
