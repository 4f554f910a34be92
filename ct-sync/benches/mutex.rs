//! `mutex`: 50 threads each do 200,000 × {lock; counter += 1; unlock}
//! (Endo 2020 §5.4.2), with all threads on one mutex or spread over 50.
//! ct-sync's `Mutex` (barging protocol, `impl` `ct-sync`) and `FairMutex`
//! (MCS hand-off, `ct-sync-fair`) on user-level threads with 1 and 2
//! workers; baselines in the same run: `std::sync::Mutex` and
//! `parking_lot::Mutex` with 50 OS threads, and ct-sync's mutex on 50 OS
//! threads; and `cas-floor`, what the same number of lock/increment/unlock
//! rounds cost as one compare-and-swap, an increment and a release store
//! in one loop on one OS thread — the floor of any lock taken with an atomic
//! read-modify-write, which moves with the host's clock as the 1-worker
//! figure does. Output: JSON lines, seconds.

use std::sync::Arc;

use ct_bench::{Args, Param, emit, repeat, time_secs};
use ct_sync::{Mutex, RawFairMutex, RawLock, RawMutex};
use ct_worker::{OsThreads, Runtime, Ult};

fn check(total: u64, expect: u64) {
    if total != expect {
        eprintln!("counters sum to {total}, expected {expect}");
        std::process::exit(1);
    }
}

/// Runs `threads` workers of `iters` increments over `mutexes` locks, each
/// thread using lock `t % mutexes`, with `spawn`/`join` from the given API.
fn ct_run<R: RawLock<Ult> + 'static>(
    rt: &Runtime,
    threads: usize,
    iters: u64,
    mutexes: usize,
) -> f64 {
    let locks: Arc<Vec<Mutex<u64, Ult, R>>> =
        Arc::new((0..mutexes).map(|_| Mutex::new_in(0)).collect());
    let t = time_secs(|| {
        rt.block_on(|| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let locks = locks.clone();
                    ct_worker::spawn(move || {
                        let m = &locks[t % mutexes];
                        for _ in 0..iters {
                            *m.lock() += 1;
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join();
            }
        })
    });
    check(
        locks.iter().map(|m| *m.lock()).sum(),
        threads as u64 * iters,
    );
    t
}

fn os_run<M: Send + Sync + 'static>(
    threads: usize,
    iters: u64,
    mutexes: usize,
    make: impl Fn() -> M,
    incr: fn(&M),
    read: fn(&M) -> u64,
) -> f64 {
    let locks: Arc<Vec<M>> = Arc::new((0..mutexes).map(|_| make()).collect());
    let t = time_secs(|| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let locks = locks.clone();
                std::thread::spawn(move || {
                    let m = &locks[t % mutexes];
                    for _ in 0..iters {
                        incr(m);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    check(locks.iter().map(read).sum(), threads as u64 * iters);
    t
}

/// `rounds` × {CAS 0 → 1 (acquire); increment; store 0 (release)} on one
/// word, one OS thread: the cost of a lock round without any lock protocol.
fn cas_floor(rounds: u64) -> f64 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let word = AtomicUsize::new(0);
    let mut counter = 0u64;
    let t = time_secs(|| {
        for _ in 0..rounds {
            while word
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::hint::spin_loop();
            }
            counter = std::hint::black_box(counter) + 1;
            word.store(0, Ordering::Release);
        }
    });
    check(counter, rounds);
    t
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "mutex [--threads 50] [--iters 200000] [--mutexes 1,50] [--workers 1,2] [--runs 7]\n\
             [--baselines true|false]\n\
             Seed parameters: 50 threads x 200,000 lock/increment/unlock, 1 and 50 mutexes,\n\
             1 and 2 workers. Prints JSON lines (seconds), with std::sync::Mutex,\n\
             parking_lot::Mutex and ct-sync on 50 OS threads measured in the same run."
        );
        return;
    }
    let threads: usize = args.get("threads", 50);
    let iters: u64 = args.get("iters", 200_000);
    let mutexes: Vec<usize> = args.list("mutexes", &[1, 50]);
    let workers: Vec<usize> = args.list("workers", &[1, 2]);
    let runs: usize = args.get("runs", 7);
    let baselines: bool = args.get("baselines", true);
    args.finish("mutex");
    // How expensive cross-core hand-offs are on this machine right now.
    ct_bench::emit_line_round_trip("ct-sync", "mutex", runs);

    for &m in &mutexes {
        let params = |w: usize| -> Vec<(&str, Param)> {
            vec![
                ("threads", threads.into()),
                ("iters", iters.into()),
                ("mutexes", m.into()),
                ("workers", w.into()),
            ]
        };
        for &w in &workers {
            eprintln!("ct-sync mutex: {m} mutexes, {w} workers...");
            let rt = Runtime::builder().workers(w).build().expect("runtime");
            let s = repeat(runs, || ct_run::<RawMutex>(&rt, threads, iters, m));
            emit("ct-sync", "mutex", "ct-sync", &params(w), "s", &s);
            eprintln!("ct-sync fair mutex: {m} mutexes, {w} workers...");
            let s = repeat(runs, || ct_run::<RawFairMutex>(&rt, threads, iters, m));
            emit("ct-sync", "mutex", "ct-sync-fair", &params(w), "s", &s);
        }
        if !baselines {
            continue;
        }
        if m == 1 {
            eprintln!(
                "CAS floor: {} rounds on one OS thread...",
                threads as u64 * iters
            );
            let s = repeat(runs, || cas_floor(threads as u64 * iters));
            emit("ct-sync", "mutex", "cas-floor", &params(1), "s", &s);
        }
        eprintln!("std::sync::Mutex with {threads} OS threads...");
        let s = repeat(runs, || {
            os_run(
                threads,
                iters,
                m,
                || std::sync::Mutex::new(0u64),
                |m| *m.lock().unwrap() += 1,
                |m| *m.lock().unwrap(),
            )
        });
        emit("ct-sync", "mutex", "std-mutex", &params(threads), "s", &s);
        eprintln!("parking_lot::Mutex with {threads} OS threads...");
        let s = repeat(runs, || {
            os_run(
                threads,
                iters,
                m,
                || parking_lot::Mutex::new(0u64),
                |m| *m.lock() += 1,
                |m| *m.lock(),
            )
        });
        emit("ct-sync", "mutex", "parking-lot", &params(threads), "s", &s);
        eprintln!("ct-sync mutex with {threads} OS threads...");
        let s = repeat(runs, || {
            os_run(
                threads,
                iters,
                m,
                || Mutex::<u64, OsThreads>::new_in(0),
                |m| *m.lock() += 1,
                |m| *m.lock(),
            )
        });
        emit("ct-sync", "mutex", "ct-sync-os", &params(threads), "s", &s);
    }
    ct_bench::print_summary();
}
