//! Multi-process tests of the OpenMP-style runtime: every construct on
//! 1×2, 2×1, 2×2 and 4×1 processes × threads (shm backend), failures, and
//! the settings.
//!
//! Each test drives jobs of this binary (menps-dsm's test driver: own
//! process group, time limit, no leftovers): the job processes run
//! [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario.

use menps_omp::sync::{AtomicU64, Mutex};
use menps_omp::{Schedule, SharedMut, Thread};

#[path = "../../menps-dsm/tests/common/mod.rs"]
mod common;
use common::*;

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let main: fn() -> String = match name.as_str() {
        "constructs" => constructs,
        "panic" => team_panic,
        "main_panic" => main_panic,
        "settings" => settings,
        "alias" => alias,
        other => panic!("unknown scenario {other}"),
    };
    match menps_omp::Builder::new().processes(2).run(main) {
        Ok(summary) => println!("rank 0: ok {summary}"),
        Err(e) => {
            println!("rank 0: error: {e}");
            std::process::exit(2);
        }
    }
}

/// Every construct, checked; returns a summary.
fn constructs() -> String {
    let n = menps_omp::max_threads();
    let procs = menps_omp::num_processes();
    assert_eq!(n % procs, 0);
    placement(n, procs);
    schedules(n);
    reductions(n);
    single_master(n);
    critical(n);
    ordered();
    borrowing(n, procs);
    barriers(n);
    flushes(n);
    recursion();
    tasks();
    nested();
    globals(n);
    views();
    private_memory();
    let stats = menps_omp::process_stats();
    assert_eq!(stats.len(), procs);
    format!("team {n} over {procs} processes")
}

/// Thread numbers are a permutation, each process runs its share.
fn placement(n: usize, procs: usize) {
    let mut seen = vec![0u64; n];
    let out = SharedMut::new(&mut seen);
    menps_omp::parallel(|t| {
        assert_eq!(t.num_threads(), n);
        assert_eq!(t.num_processes(), procs);
        assert_eq!(t.threads_here(), n / procs);
        assert_eq!(t.thread_num() / (n / procs), t.process());
        assert!(menps_omp::in_parallel());
        // Each thread takes the iteration of its own number (static blocks
        // of one iteration each).
        t.for_range(0..n).each_mut(&out, |i, x| {
            assert_eq!(i, t.thread_num());
            *x = 1 + t.process() as u64;
        });
    });
    assert!(!menps_omp::in_parallel());
    for (i, &p) in seen.iter().enumerate() {
        assert_eq!(
            p as usize,
            1 + i / (n / procs),
            "thread {i} ran in process {}",
            p - 1
        );
    }
}

/// Every schedule covers every iteration exactly once, with and without
/// `nowait`, for ranges that do not start at 0 and ranges smaller than the
/// team.
fn schedules(n: usize) {
    menps_omp::set_schedule(Schedule::Dynamic(2));
    let list = [
        Schedule::Static,
        Schedule::StaticChunk(1),
        Schedule::StaticChunk(7),
        Schedule::Dynamic(1),
        Schedule::Dynamic(13),
        Schedule::Guided(1),
        Schedule::Guided(9),
        Schedule::Runtime,
        Schedule::Auto,
    ];
    for (lo, hi) in [
        (0usize, 1000usize),
        (17, 17 + 3 * n + 1),
        (5, 5 + n / 2),
        (9, 9),
    ] {
        let mut marks = vec![0u32; hi];
        let out = SharedMut::new(&mut marks);
        let mut sums = vec![(0u64, 0u64, 0u64); list.len()];
        let sums_out = SharedMut::new(&mut sums);
        menps_omp::parallel(|t| {
            for (k, &s) in list.iter().enumerate() {
                // Mutable: each index handed to one thread.
                t.for_range(lo..hi)
                    .schedule(s)
                    .each_mut(&out, |_, x| *x += 1);
                // Read-only, nowait, folded: count, sum and sum of squares.
                let r = t.for_range(lo..hi).schedule(s).nowait().reduce(
                    (0u64, 0u64, 0u64),
                    |(c, s1, s2), i| (c + 1, s1 + i as u64, s2 + (i * i) as u64),
                    |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2),
                );
                t.for_range(k..k + 1).each_mut(&sums_out, |_, x| *x = r);
            }
        });
        for (i, &m) in marks.iter().enumerate() {
            let want = if i >= lo { list.len() as u32 } else { 0 };
            assert_eq!(m, want, "iteration {i} of {lo}..{hi} ran {m} times");
        }
        let want = (lo..hi).fold((0u64, 0u64, 0u64), |(c, s1, s2), i| {
            (c + 1, s1 + i as u64, s2 + (i * i) as u64)
        });
        for (k, s) in sums.iter().enumerate() {
            assert_eq!(*s, want, "schedule {} over {lo}..{hi}", list[k]);
        }
    }
    menps_omp::set_schedule(Schedule::Static);
}

/// Reductions are exact and every thread gets the same value.
fn reductions(n: usize) {
    let v: Vec<f64> = (0..10_000).map(|i| 1.0 / (1.0 + i as f64)).collect();
    let mut got = vec![(0u64, 0.0f64, 0.0f64, 0u64); n];
    let out = SharedMut::new(&mut got);
    menps_omp::parallel(|t| {
        let sum = t.reduce(t.thread_num() as u64 + 1, |a, b| a + b);
        let fsum = t
            .for_range(0..v.len())
            .schedule(Schedule::Dynamic(100))
            .reduce(0.0, |a, i| a + v[i], |a, b| a + b);
        let max = t.for_range(0..v.len()).nowait().reduce(
            f64::MIN,
            |a, i| a.max(v[i] * (i % 7) as f64),
            f64::max,
        );
        // A non-commutative associative operator: concatenating thread
        // numbers as base-n digits (value, n^digits) keeps thread order.
        let digits = t
            .reduce((t.thread_num() as u64, n as u64), |a, b| {
                (a.0 * b.1 + b.0, a.1 * b.1)
            })
            .0;
        t.for_range(0..n).each_mut(&out, |i, x| {
            assert_eq!(i, t.thread_num());
            *x = (sum, fsum, max, digits);
        });
    });
    let want_digits = (0..n as u64).fold(0, |a, b| a * n as u64 + b);
    let fsum0 = got[0].1;
    let serial: f64 = v.iter().sum();
    assert!(
        (fsum0 - serial).abs() < 1e-9 * serial,
        "{fsum0} vs {serial}"
    );
    for g in &got {
        assert_eq!(g.0, (n * (n + 1) / 2) as u64);
        assert_eq!(
            g.1.to_bits(),
            fsum0.to_bits(),
            "threads disagree on a reduction"
        );
        assert_eq!(g.3, want_digits, "reduction out of thread order");
    }
    let want_max = (0..v.len())
        .map(|i| v[i] * (i % 7) as f64)
        .fold(f64::MIN, f64::max);
    assert_eq!(got[0].2, want_max);
    let total = menps_omp::parallel_reduce(0..100_001, 0u64, |a, i| a + i as u64, |a, b| a + b);
    assert_eq!(total, 100_000 * 100_001 / 2);
}

/// `single` runs once per encounter; `master` on thread 0; copyprivate.
fn single_master(n: usize) {
    const ROUNDS: usize = 50;
    let mut runs = vec![0u64; 3];
    let out = SharedMut::new(&mut runs);
    menps_omp::parallel(|t| {
        let mut mine = (0u64, 0u64, 0u64);
        for r in 0..ROUNDS {
            if t.single(|| ()).is_some() {
                mine.0 += 1;
            }
            if t.single_nowait(|| ()).is_some() {
                mine.1 += 1;
            }
            if t.master(|| ()).is_some() {
                assert_eq!(t.thread_num(), 0);
                mine.2 += 1;
            }
            let v = t.single_copy(|| 1000 + r as u64);
            assert_eq!(v, 1000 + r as u64);
        }
        let all = t.reduce(mine, |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
        t.for_range(0..1).each_mut(&out, |_, x| *x = all.0);
        t.for_range(1..2).each_mut(&out, |_, x| *x = all.1);
        t.for_range(2..3).each_mut(&out, |_, x| *x = all.2);
    });
    assert_eq!(runs, vec![ROUNDS as u64; 3], "team of {n}");
}

/// `critical` excludes: unprotected read-modify-writes of one counter,
/// and a `Mutex<Vec>` that every thread pushes to.
fn critical(n: usize) {
    const EACH: u64 = 40;
    let mut counter = 0u64;
    let list = Mutex::new(Vec::<usize>::new());
    let atomic = AtomicU64::new(0);
    let cp = &mut counter as *mut u64 as usize;
    menps_omp::parallel(|t| {
        for _ in 0..EACH {
            t.critical(|| {
                // SAFETY: the critical section makes this thread the only
                // one touching the counter (in main's frame, DSM memory) and
                // shows it the previous holder's write.
                unsafe { *(cp as *mut u64) += 1 };
            });
        }
        t.critical_named("list", || list.lock().push(t.thread_num()));
        atomic.fetch_add(1);
    });
    assert_eq!(counter, EACH * n as u64);
    let mut l = list.into_inner();
    l.sort_unstable();
    assert_eq!(l, (0..n).collect::<Vec<_>>());
    assert_eq!(atomic.load(), n as u64);
}

/// `ordered` orders, under every schedule.
fn ordered() {
    for s in [Schedule::Static, Schedule::Dynamic(3), Schedule::Guided(1)] {
        let seen = Mutex::new(Vec::<usize>::new());
        menps_omp::parallel(|t| {
            t.for_range(10..110).schedule(s).each_ordered(|i, o| {
                // Some iterations have no ordered part.
                if i % 5 != 0 {
                    o.run(|| seen.lock().push(i));
                }
            });
        });
        let seen = seen.into_inner();
        let want: Vec<usize> = (10..110).filter(|i| i % 5 != 0).collect();
        assert_eq!(seen, want, "ordered under {s}");
    }
}

/// A closure borrowing main's locals and a `Vec<String>` works on every
/// process.
fn borrowing(n: usize, procs: usize) {
    let words: Vec<String> = (0..500).map(|i| format!("word-{i}")).collect();
    let table = [7u64; 64];
    let boxed = Box::new(12345u64);
    let want: u64 = words.iter().map(|w| w.len() as u64).sum();
    menps_omp::parallel(|t| {
        let len = t.for_range(0..words.len()).reduce(
            0u64,
            |a, i| a + words[i].len() as u64,
            |a, b| a + b,
        );
        assert_eq!(len, want);
        assert_eq!(table.iter().sum::<u64>(), 7 * 64);
        assert_eq!(*boxed, 12345);
        // Every process took part.
        let mask = t.reduce(1u64 << t.process(), |a, b| a | b);
        assert_eq!(mask, (1u64 << procs) - 1);
        let threads = t.reduce(1usize, |a, b| a + b);
        assert_eq!(threads, n);
        // Strings built by team threads are shared too.
        let mine = format!("thread-{}", t.thread_num());
        let total = t.reduce(mine.len(), |a, b| a + b);
        assert_eq!(
            total,
            (0..n).map(|k| format!("thread-{k}").len()).sum::<usize>()
        );
    });
}

/// Writes before a barrier are visible after it, over many phases.
fn barriers(n: usize) {
    let mut slots = vec![0u64; 2 * n];
    let p = slots.as_mut_ptr() as usize;
    menps_omp::parallel(|t| {
        let p = p as *mut u64;
        for phase in 1..=30u64 {
            let half = (phase as usize % 2) * n;
            // SAFETY: each thread writes its own slot of this phase's half;
            // the barrier separates the writes from the reads, and the other
            // half is written only after the next barrier.
            unsafe { p.add(half + t.thread_num()).write(phase) };
            t.barrier();
            for k in 0..n {
                // SAFETY: as above.
                assert_eq!(unsafe { p.add(half + k).read() }, phase);
            }
        }
    });
    drop(slots);
}

/// Flag synchronisation through flushes only: a token goes round the team
/// (thread `k` waits for thread `k - 1`'s flag), each holder checking the
/// previous holder's data and writing its own.
fn flushes(n: usize) {
    const ROUNDS: u64 = 20;
    const WORDS: usize = 2048;
    let mut cells = vec![0u64; WORDS + 8 * n];
    let p = cells.as_mut_ptr() as usize;
    menps_omp::parallel(|t| {
        let (data, flags) = (p as *mut u64, (p as *mut u64).wrapping_add(WORDS));
        let me = t.thread_num();
        let flag = |k: usize| flags.wrapping_add(8 * k);
        for round in 0..ROUNDS {
            let step = round * n as u64 + me as u64 + 1;
            if step > 1 {
                let prev = (me + n - 1) % n;
                let mut w = menps_omp::internals::Waiter::new();
                // SAFETY: `prev`'s flag, written by `prev` only.
                while unsafe { flag(prev).read_volatile() } != step - 1 {
                    if !t.flush() {
                        w.wait();
                    }
                }
                t.flush();
                for i in 0..WORDS {
                    // SAFETY: written by `prev` before its flag (and a flush).
                    assert_eq!(unsafe { data.add(i).read() }, step - 1 + i as u64);
                }
            }
            for i in 0..WORDS {
                // SAFETY: only the token holder writes the data.
                unsafe { data.add(i).write(step + i as u64) };
            }
            t.flush();
            // SAFETY: our own flag.
            unsafe { flag(me).write_volatile(step) };
            t.flush();
        }
    });
    drop(cells);
}

/// Deep recursion with large frames on team threads' DSM stacks.
fn recursion() {
    #[inline(never)]
    fn deep(d: u32) -> u64 {
        let mut frame = [0u8; 2048];
        for (k, b) in frame.iter_mut().enumerate() {
            *b = (k as u32 ^ d) as u8;
        }
        let here: u64 = std::hint::black_box(&frame)
            .iter()
            .map(|&b| u64::from(b))
            .sum();
        if d == 0 { here } else { here + deep(d - 1) }
    }
    let want = deep(40);
    menps_omp::parallel(|t| {
        let ok = t.reduce(u64::from(deep(40) == want), |a, b| a + b);
        assert_eq!(ok as usize, t.num_threads());
    });
}

/// Tasks: fib through nested task scopes, taskwait.
fn tasks() {
    fn fib(n: u64) -> u64 {
        if n < 12 {
            return if n < 2 { n } else { fib(n - 1) + fib(n - 2) };
        }
        let (mut a, mut b) = (0, 0);
        menps_omp::task_scope(|s| {
            s.spawn(|_| a = fib(n - 1));
            b = fib(n - 2);
        });
        a + b
    }
    let mut results = vec![0u64; 2];
    let out = SharedMut::new(&mut results);
    menps_omp::parallel(|t| {
        let f = t.single_copy(|| fib(22));
        assert_eq!(f, 17711);
        // Every thread spawns tasks that fill its own part; taskwait.
        let mut parts = [0u64; 32];
        let pp = parts.as_mut_ptr() as usize;
        menps_omp::task_scope(|s| {
            for k in 0..32usize {
                s.spawn(move |_| {
                    // SAFETY: task k alone writes element k of `parts`,
                    // which outlives the scope.
                    unsafe { (pp as *mut u64).add(k).write(k as u64 * 3) };
                });
            }
            s.taskwait();
            // SAFETY: every task finished (taskwait).
            let sum: u64 = (0..32)
                .map(|k| unsafe { (pp as *const u64).add(k).read() })
                .sum();
            assert_eq!(sum, 3 * 31 * 32 / 2);
        });
        assert_eq!(parts[31], 93);
        let total = t.reduce(1u64, |a, b| a + b);
        t.for_range(0..2)
            .each_mut(&out, |i, x| *x = if i == 0 { f } else { total });
    });
    assert_eq!(results[0], 17711);
}

/// Nested regions run on one thread.
fn nested() {
    let mut inner = vec![0usize; 1];
    let out = SharedMut::new(&mut inner);
    menps_omp::parallel(|t| {
        let mut team = [0usize; 1];
        let team_out = SharedMut::new(&mut team);
        menps_omp::parallel(|u: &Thread<'_>| {
            // A loop of the inner team: the whole range on this thread.
            let c = u.for_range(0..10).reduce(0, |a, _| a + 1, |a, b| a + b);
            assert_eq!(c, 10);
            u.for_range(0..1)
                .each_mut(&team_out, |_, x| *x = u.num_threads());
        });
        t.for_range(0..1).each_mut(&out, |_, x| *x = team[0]);
    });
    assert_eq!(inner[0], 1);
}

menps_omp::dsm_global! {
    /// A counter every thread increments under a critical section.
    static HITS: u64 = 0;
    /// A table main overwrites before the region.
    static TABLE: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
}

/// DSM globals are shared by every process.
fn globals(n: usize) {
    let (hits, table) = (menps_omp::global_ptr(&HITS), menps_omp::global_ptr(&TABLE));
    let (h, tb) = (hits as usize, table as usize);
    // SAFETY: no region runs; the fork publishes the write.
    unsafe { (*table)[7] = 80 };
    menps_omp::parallel(|t| {
        // SAFETY: written by main before the region, only read here.
        let sum: u32 = unsafe { (*(tb as *const [u32; 8])).iter().sum() };
        assert_eq!(sum, 1 + 2 + 3 + 4 + 5 + 6 + 7 + 80);
        // SAFETY: the critical section orders the increments.
        t.critical(|| unsafe { *(h as *mut u64) += 1 });
    });
    // SAFETY: the region's end published every increment.
    assert_eq!(unsafe { *hits }, n as u64);
    // SAFETY: as above; no region runs.
    unsafe { *hits = 0 };
}

/// Phases of one region exchange data through views: a 1-D Jacobi
/// relaxation whose every sweep reads the other buffer's neighbours, equal
/// to a serial run bit for bit.
fn views() {
    const N: usize = 3000;
    const SWEEPS: usize = 40;
    let init = |i: usize| {
        if i == 0 || i == N - 1 {
            1.0
        } else {
            (i % 17) as f64
        }
    };
    let mut a: Vec<f64> = (0..N).map(init).collect();
    let mut b = a.clone();
    let mut serial = a.clone();
    for _ in 0..SWEEPS {
        let old = serial.clone();
        for i in 1..N - 1 {
            serial[i] = (old[i - 1] + old[i] + old[i + 1]) / 3.0;
        }
    }
    {
        let (sa, sb) = (SharedMut::new(&mut a), SharedMut::new(&mut b));
        menps_omp::parallel(|t| {
            for sweep in 0..SWEEPS {
                let (src, dst) = if sweep % 2 == 0 {
                    (&sa, &sb)
                } else {
                    (&sb, &sa)
                };
                let old = src.view();
                t.for_range(1..N - 1)
                    .schedule(Schedule::StaticChunk(100))
                    .each_mut(dst, |i, x| *x = (old[i - 1] + old[i] + old[i + 1]) / 3.0);
            }
        });
    }
    let result = if SWEEPS.is_multiple_of(2) { &a } else { &b };
    assert!(
        result
            .iter()
            .zip(&serial)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "the parallel sweeps differ from the serial ones"
    );
}

/// `private` keeps allocations out of the DSM heap; ordinary ones of main
/// and of team threads are in it.
fn private_memory() {
    use menps_dsm::dsm::allocator::is_dsm_pointer;
    let shared: Vec<u8> = std::hint::black_box(vec![1u8; 100]);
    let mine = menps_omp::private(|| vec![2u8; 100]);
    assert!(is_dsm_pointer(shared.as_ptr()));
    assert!(!is_dsm_pointer(mine.as_ptr()));
    menps_omp::parallel(|t| {
        let scratch = menps_omp::private(|| vec![t.thread_num(); 1000]);
        let team_vec: Vec<u8> = std::hint::black_box(vec![0u8; 10]);
        assert!(!is_dsm_pointer(scratch.as_ptr().cast()));
        assert!(is_dsm_pointer(team_vec.as_ptr()));
        assert_eq!(scratch.iter().sum::<usize>(), 1000 * t.thread_num());
    });
}

/// A thread writes a slice in a loop while holding a view of it: refused.
fn alias() -> String {
    let mut v = vec![0u8; 64];
    let s = SharedMut::new(&mut v);
    menps_omp::parallel(|t| {
        let view = s.view();
        t.for_range(0..64).each_mut(&s, |_, x| *x = 1);
        drop(view);
    });
    "unreachable".into()
}

/// The last thread of the team panics inside a region.
fn team_panic() -> String {
    menps_omp::parallel(|t| {
        t.barrier();
        if t.thread_num() + 1 == t.num_threads() {
            panic!("deliberate panic in thread {}", t.thread_num());
        }
        t.barrier();
    });
    "unreachable".into()
}

/// `main` panics outside regions: an error on process 0.
fn main_panic() -> String {
    menps_omp::parallel(|t| t.barrier());
    panic!("deliberate panic in main");
}

/// The settings as the runtime sees them.
fn settings() -> String {
    format!(
        "threads={} schedule={} procs={}",
        menps_omp::max_threads(),
        menps_omp::schedule(),
        menps_omp::num_processes()
    )
}

// ---------------------------------------------------------------------------
// The driver side.

/// Runs `scenario` as a job of `procs` processes with `env`.
fn omp_job(scenario: &str, procs: usize, env: &[(&str, &str)]) -> JobRun {
    let tag = new_tag(scenario);
    let mut cmd = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    for k in [
        "OMP_NUM_THREADS",
        "OMP_SCHEDULE",
        "OMP_STACKSIZE",
        "OMP_WAIT_POLICY",
    ] {
        cmd.env_remove(k);
    }
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", procs.to_string())
        .env("MENPS_GRACE_MS", "1000");
    for (k, v) in env {
        cmd.env(k, v);
    }
    drive(cmd, &tag, |_, _| false)
}

/// The environment of the constructs scenario on `procs` × `threads`.
fn constructs_env(procs: usize, threads: usize) -> [(&'static str, String); 2] {
    [
        ("OMP_NUM_THREADS", (procs * threads).to_string()),
        ("OMP_STACKSIZE", "1M".to_string()),
    ]
}

/// The constructs scenario passed on `procs` × `threads`.
fn assert_constructs_passed(run: &JobRun, procs: usize, threads: usize) {
    let team = procs * threads;
    assert!(run.status.success(), "{procs}×{threads}: {}", run.dump());
    assert!(
        run.stdout
            .contains(&format!("rank 0: ok team {team} over {procs} processes")),
        "{}",
        run.dump()
    );
}

fn constructs_on(procs: usize, threads: usize) {
    let env = constructs_env(procs, threads);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run = omp_job("constructs", procs, &env);
    assert_constructs_passed(&run, procs, threads);
}

#[test]
fn constructs_1x2() {
    constructs_on(1, 2);
}

#[test]
fn constructs_2x1() {
    constructs_on(2, 1);
}

#[test]
fn constructs_2x2() {
    constructs_on(2, 2);
}

#[test]
fn constructs_4x1() {
    constructs_on(4, 1);
}

#[test]
fn a_panicking_team_thread_fails_every_process() {
    for (procs, threads) in [(2, 1), (2, 2), (1, 2)] {
        let team = (procs * threads).to_string();
        let run = omp_job("panic", procs, &[("OMP_NUM_THREADS", &team)]);
        assert!(!run.status.success(), "{}", run.dump());
        assert!(
            run.stderr.contains("deliberate panic in thread"),
            "{}",
            run.dump()
        );
        assert!(!run.stdout.contains("rank 0: ok"), "{}", run.dump());
        // Process 0 ends with the reason, not with a crash of its own.
        for bad in ["stack overflow", "memory allocation", "SIGABRT", "SIGSEGV"] {
            assert!(!run.stderr.contains(bad), "{bad}: {}", run.dump());
        }
        // (In a barrier, or switching threads: either way the reason.)
        if procs > 1 {
            assert!(run.stderr.contains("process rank 1 died"), "{}", run.dump());
        }
    }
}

#[test]
fn a_panicking_main_is_an_error_on_process_0() {
    let run = omp_job("main_panic", 2, &[("OMP_NUM_THREADS", "2")]);
    assert_eq!(run.code(), Some(2), "{}", run.dump());
    assert!(
        run.stdout
            .contains("rank 0: error: menps-omp: main panicked: deliberate panic in main"),
        "{}",
        run.dump()
    );
}

#[test]
fn writing_a_slice_while_viewing_it_is_refused() {
    for procs in [1, 2] {
        let run = omp_job("alias", procs, &[("OMP_NUM_THREADS", "2")]);
        assert!(!run.status.success(), "{}", run.dump());
        assert!(
            run.stderr
                .contains("writes a SharedMut in a work-sharing loop while it holds a view"),
            "{}",
            run.dump()
        );
    }
}

#[test]
fn settings_come_from_the_environment() {
    let run = omp_job(
        "settings",
        2,
        &[("OMP_NUM_THREADS", "4"), ("OMP_SCHEDULE", "guided,8")],
    );
    assert!(
        run.stdout
            .contains("rank 0: ok threads=4 schedule=guided,8 procs=2"),
        "{}",
        run.dump()
    );
    // Defaults: one process, the processors of the host.
    let run = omp_job("settings", 1, &[]);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        run.stdout.contains(&format!(
            "rank 0: ok threads={cpus} schedule=static procs=1"
        )),
        "{}",
        run.dump()
    );
}

#[test]
fn bad_settings_are_errors_that_name_the_variable() {
    for (env, needle) in [
        (
            ("OMP_NUM_THREADS", "3"),
            "must be a multiple of the number of processes",
        ),
        (("OMP_NUM_THREADS", "two"), "OMP_NUM_THREADS=\"two\""),
        (("OMP_SCHEDULE", "fastest"), "OMP_SCHEDULE"),
        (("OMP_STACKSIZE", "64M"), "at most 1 MiB"),
        (("OMP_STACKSIZE", "lots"), "OMP_STACKSIZE"),
        (("OMP_WAIT_POLICY", "busy"), "OMP_WAIT_POLICY=\"busy\""),
    ] {
        let run = omp_job("settings", 2, &[env]);
        assert!(!run.status.success(), "{env:?}: {}", run.dump());
        let all = format!("{}{}", run.stdout, run.stderr);
        assert!(all.contains(needle), "{env:?}: {}", run.dump());
    }
}

/// The same constructs in a job started by `mpirun` (MPI backend).
#[cfg(feature = "mpi")]
#[test]
fn constructs_under_mpirun() {
    for (procs, threads) in [(2, 1), (2, 2)] {
        let env = constructs_env(procs, threads);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let run = mpirun_job("constructs", procs, &env);
        assert_constructs_passed(&run, procs, threads);
    }
}

/// A team thread's panic under `mpirun`: the job fails, nothing hangs.
#[cfg(feature = "mpi")]
#[test]
fn a_panicking_team_thread_under_mpirun() {
    let run = mpirun_job("panic", 2, &[("OMP_NUM_THREADS", "2")]);
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("deliberate panic in thread"),
        "{}",
        run.dump()
    );
}
