//! `barrier`: 50 threads × 300,000 barrier episodes (Endo 2020 §5.4.2), on
//! user-level threads with 1 and 2 workers. Baseline in the same run:
//! `std::sync::Barrier` with 50 OS threads, with fewer episodes (a kernel
//! barrier episode costs hundreds of microseconds here); compare
//! `us_per_episode`. Output: JSON lines, seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ct_bench::{Args, emit, repeat, time_secs};
use ct_sync::Barrier;
use ct_worker::Runtime;

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "barrier [--threads 50] [--episodes 300000] [--os-episodes 3000] [--workers 1,2] [--runs 5]\n\
             Seed parameters: 50 threads x 300,000 episodes, 1 and 2 workers. Prints JSON lines\n\
             (seconds and us per episode), with std::sync::Barrier on 50 OS threads."
        );
        return;
    }
    let threads: usize = args.get("threads", 50);
    let episodes: u64 = args.get("episodes", 300_000);
    let os_episodes: u64 = args.get("os-episodes", 3_000);
    let workers: Vec<usize> = args.list("workers", &[1, 2]);
    let runs: usize = args.get("runs", 5);
    args.finish("barrier");
    // How expensive cross-core hand-offs are on this machine right now.
    ct_bench::emit_line_round_trip("ct-sync", "barrier", runs);

    for &w in &workers {
        eprintln!("ct-sync barrier: {threads} threads x {episodes} episodes, {w} workers...");
        let rt = Runtime::builder().workers(w).build().expect("runtime");
        let s = repeat(runs, || {
            let b = Arc::new(Barrier::new(threads));
            let leaders = Arc::new(AtomicU64::new(0));
            let t = time_secs(|| {
                rt.block_on(|| {
                    let hs: Vec<_> = (0..threads)
                        .map(|_| {
                            let (b, leaders) = (b.clone(), leaders.clone());
                            ct_worker::spawn(move || {
                                for _ in 0..episodes {
                                    if b.wait().is_leader() {
                                        leaders.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            })
                        })
                        .collect();
                    for h in hs {
                        h.join();
                    }
                })
            });
            if leaders.load(Ordering::Relaxed) != episodes {
                eprintln!("wrong number of leaders");
                std::process::exit(1);
            }
            t
        });
        let per = s.median * 1e6 / episodes as f64;
        emit(
            "ct-sync",
            "barrier",
            "ct-sync",
            &[
                ("threads", threads.into()),
                ("episodes", episodes.into()),
                ("workers", w.into()),
                ("us_per_episode", per.into()),
            ],
            "s",
            &s,
        );
    }

    eprintln!("std::sync::Barrier: {threads} OS threads x {os_episodes} episodes...");
    let s = repeat(runs, || {
        let b = Arc::new(std::sync::Barrier::new(threads));
        let leaders = Arc::new(AtomicU64::new(0));
        let t = time_secs(|| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    let (b, leaders) = (b.clone(), leaders.clone());
                    std::thread::spawn(move || {
                        for _ in 0..os_episodes {
                            if b.wait().is_leader() {
                                leaders.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
        if leaders.load(Ordering::Relaxed) != os_episodes {
            eprintln!("wrong number of leaders");
            std::process::exit(1);
        }
        t
    });
    let per = s.median * 1e6 / os_episodes as f64;
    emit(
        "ct-sync",
        "barrier",
        "std-barrier",
        &[
            ("threads", threads.into()),
            ("episodes", os_episodes.into()),
            ("workers", threads.into()),
            ("us_per_episode", per.into()),
        ],
        "s",
        &s,
    );
    ct_bench::print_summary();
}
