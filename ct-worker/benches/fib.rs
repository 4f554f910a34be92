//! `fib`: parallel Fibonacci — fork fib(n−1), run fib(n−2), join
//! (Endo 2020 §5.4.1). Baselines in the same run: serial recursion and
//! `rayon::join`. Output: JSON lines, seconds per run, plus ns per fork+join.
//!
//! `ct-worker` / `ct-worker-asym` use `join_in` (the second closure waits as
//! a job and becomes a thread only if stolen); `ct-worker-free` is
//! `ct-worker` through the free `join`, which finds the running runtime's
//! configuration itself; `ct-worker-spawn` forks a real
//! user-level thread every time (`spawn` + `JoinHandle::join`, work-first, as
//! MassiveThreads does). `ct-worker-hook` / `ct-worker-spawn-hook` are
//! `ct-worker` / `ct-worker-spawn` with a switch hook installed (one that
//! counts `entering` and `left` calls per worker), to show what the hook
//! calls cost; the other lines have none (the default `NoHook`).

use std::hint::black_box;

use ct_bench::{Args, Stats, emit, repeat, time_secs};
use ct_worker::{AsymmetricConfig, Config, DefaultConfig};

mod common;
use common::HookConfig;

fn fib_serial(n: u64) -> u64 {
    if n < 2 {
        n
    } else {
        fib_serial(n - 1) + fib_serial(n - 2)
    }
}

fn fib_spawn(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let h = ct_worker::spawn(move || fib_spawn(n - 1));
    let b = fib_spawn(n - 2);
    h.join() + b
}

fn fib_spawn_in<C: Config>(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let h = ct_worker::spawn_in::<C, _, _>(move || fib_spawn_in::<C>(n - 1));
    let b = fib_spawn_in::<C>(n - 2);
    h.join() + b
}

/// Runs `fib(n)` on a runtime of the default configuration; returns the
/// summary.
fn bench_default(n: u64, workers: usize, runs: usize, fib: fn(u64) -> u64) -> Stats {
    let rt = ct_worker::Runtime::builder()
        .workers(workers)
        .build()
        .expect("runtime");
    repeat(runs, || {
        time_secs(|| {
            let r = rt.block_on(|| fib(black_box(n)));
            check(r, n);
        })
    })
}

fn bench_spawn(n: u64, workers: usize, runs: usize) -> Stats {
    bench_default(n, workers, runs, fib_spawn)
}

fn bench_spawn_hook(n: u64, workers: usize, runs: usize) -> Stats {
    let rt = ct_worker::Runtime::builder()
        .workers(workers)
        .build_with::<HookConfig>()
        .expect("runtime");
    repeat(runs, || {
        time_secs(|| {
            let r = rt.block_on(|| fib_spawn_in::<HookConfig>(black_box(n)));
            check(r, n);
        })
    })
}

fn fib_ct<C: Config>(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join_in::<C, _, _, _, _>(|| fib_ct::<C>(n - 1), || fib_ct::<C>(n - 2));
    a + b
}

/// fib through the free `ct_worker::join` (what user code writes), which
/// finds the running runtime's configuration itself.
fn fib_free(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join(|| fib_free(n - 1), || fib_free(n - 2));
    a + b
}

fn bench_free(n: u64, workers: usize, runs: usize) -> Stats {
    bench_default(n, workers, runs, fib_free)
}

/// Runs fib(n) on a runtime of configuration `C`; returns the summary.
fn bench_ct<C: Config>(n: u64, workers: usize, runs: usize) -> Stats
where
    C::Stacks: Default,
    C::Hook: Default,
{
    let rt = ct_worker::Runtime::builder()
        .workers(workers)
        .build_with::<C>()
        .expect("runtime");
    repeat(runs, || {
        time_secs(|| {
            let r = rt.block_on(|| fib_ct::<C>(black_box(n)));
            check(r, n);
        })
    })
}

fn fib_rayon(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = rayon::join(|| fib_rayon(n - 1), || fib_rayon(n - 2));
    a + b
}

/// Number of joins in fib(n): one per call with n >= 2.
fn joins(n: u64) -> u64 {
    let (mut a, mut b) = (0u64, 0u64); // joins(0), joins(1)
    for _ in 2..=n {
        (a, b) = (b, a + b + 1);
    }
    if n < 2 { 0 } else { b }
}

fn check(got: u64, n: u64) {
    if got != fib_serial_fast(n) {
        eprintln!("fib({n}) = {got} is wrong");
        std::process::exit(1);
    }
}

fn fib_serial_fast(n: u64) -> u64 {
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 0..n {
        (a, b) = (b, a + b);
    }
    a
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "fib [--n 30,35] [--workers 1,2] [--runs 7]\n\
             Seed parameters: n = 30 and 35, workers 1 and 2. Prints JSON lines (seconds)\n\
             for join on the default configuration (crossbeam Chase-Lev deques) and on the\n\
             asymmetric-fence deque, for spawn+join (a thread per fork, work-first), with\n\
             serial fib and rayon::join fib measured in the same run."
        );
        return;
    }
    let ns: Vec<u64> = args.list("n", &[30, 35]);
    let workers: Vec<usize> = args.list("workers", &[1, 2]);
    let runs: usize = args.get("runs", 7);
    args.finish("fib");

    for &n in &ns {
        eprintln!("serial fib({n})...");
        let s = repeat(runs, || {
            time_secs(|| {
                let r = fib_serial(black_box(n));
                check(r, n);
            })
        });
        emit(
            "ct-worker",
            "fib",
            "serial",
            &[("n", n.into()), ("workers", 1usize.into())],
            "s",
            &s,
        );

        for &w in &workers {
            for (name, run) in [
                (
                    "ct-worker",
                    bench_ct::<DefaultConfig> as fn(u64, usize, usize) -> Stats,
                ),
                ("ct-worker-free", bench_free),
                ("ct-worker-asym", bench_ct::<AsymmetricConfig>),
                ("ct-worker-spawn", bench_spawn),
                ("ct-worker-hook", bench_ct::<HookConfig>),
                ("ct-worker-spawn-hook", bench_spawn_hook),
            ] {
                eprintln!("{name} fib({n}) with {w} workers...");
                let s = run(n, w, runs);
                let per_join = s.median * 1e9 / joins(n) as f64;
                emit(
                    "ct-worker",
                    "fib",
                    name,
                    &[
                        ("n", n.into()),
                        ("workers", w.into()),
                        ("ns_per_fork_join", per_join.into()),
                    ],
                    "s",
                    &s,
                );
            }

            eprintln!("rayon fib({n}) with {w} workers...");
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(w)
                .build()
                .expect("rayon pool");
            let s = repeat(runs, || {
                time_secs(|| {
                    let r = pool.install(|| fib_rayon(black_box(n)));
                    check(r, n);
                })
            });
            let per_join = s.median * 1e9 / joins(n) as f64;
            emit(
                "ct-worker",
                "fib",
                "rayon",
                &[
                    ("n", n.into()),
                    ("workers", w.into()),
                    ("ns_per_fork_join", per_join.into()),
                ],
                "s",
                &s,
            );
        }
    }
    ct_bench::print_summary();
}
