//! `delegator`: 50 threads each do 200,000 increments of a shared counter
//! through `execute_or_delegate`, with both queue variants and 1 and 2
//! workers. Baselines in the same run: the same increments under ct-sync's
//! mutex, and under `std::sync::Mutex` with 50 OS threads. Also the
//! uncontended cost of one `execute_or_delegate` against one ct-sync mutex
//! lock/unlock (ns per operation, one thread). Output: JSON lines.

use std::sync::Arc;
use std::time::Instant;

use ct_bench::{Args, Param, emit, repeat, time_secs};
use ct_delegate::{Consumer, DelegationQueue, Delegator, Entry, McsQueue, RingQueue};
use ct_worker::{Runtime, Ult};

struct Counter(u64);

impl Consumer<Ult> for Counter {
    type Request = u64;
    fn execute(&mut self, n: u64) -> Result<(), u64> {
        self.0 += n;
        Ok(())
    }
}

fn check(got: u64, expect: u64) {
    if got != expect {
        eprintln!("counter is {got}, expected {expect}");
        std::process::exit(1);
    }
}

fn delegator_run<Q: DelegationQueue<Entry<Counter, Ult>>>(
    rt: &Runtime,
    threads: usize,
    iters: u64,
) -> f64 {
    let d = Arc::new(Delegator::<Counter, Ult, Q>::new(Counter(0)));
    let t = time_secs(|| {
        rt.block_on(|| {
            d.start_consumer();
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    let d = d.clone();
                    ct_worker::spawn(move || {
                        for _ in 0..iters {
                            d.execute_or_delegate(
                                |c| {
                                    c.0 += 1;
                                    true
                                },
                                || 1,
                            );
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join();
            }
            d.stop_consumer();
        });
    });
    check(d.lock().0, threads as u64 * iters);
    t
}

fn mutex_run(rt: &Runtime, threads: usize, iters: u64) -> f64 {
    let m = Arc::new(ct_sync::Mutex::new(0u64));
    let t = time_secs(|| {
        rt.block_on(|| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    let m = m.clone();
                    ct_worker::spawn(move || {
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
    check(*m.lock(), threads as u64 * iters);
    t
}

fn std_run(threads: usize, iters: u64) -> f64 {
    let m = Arc::new(std::sync::Mutex::new(0u64));
    let t = time_secs(|| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..iters {
                        *m.lock().unwrap() += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    check(*m.lock().unwrap(), threads as u64 * iters);
    t
}

/// ns per uncontended operation on one thread.
fn uncontended(rt: &Runtime, ops: u64, delegate: bool) -> f64 {
    rt.block_on(|| {
        if delegate {
            let d = Arc::new(Delegator::<Counter>::new(Counter(0)));
            d.start_consumer();
            let t = Instant::now();
            for _ in 0..ops {
                d.execute_or_delegate(
                    |c| {
                        c.0 += 1;
                        true
                    },
                    || 1,
                );
            }
            let ns = t.elapsed().as_nanos() as f64 / ops as f64;
            d.stop_consumer();
            check(d.lock().0, ops);
            ns
        } else {
            let m = ct_sync::Mutex::new(0u64);
            let t = Instant::now();
            for _ in 0..ops {
                *m.lock() += 1;
            }
            let ns = t.elapsed().as_nanos() as f64 / ops as f64;
            check(m.into_inner(), ops);
            ns
        }
    })
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "delegator [--threads 50] [--iters 200000] [--workers 1,2] [--runs 7]\n\
             Seed parameters: 50 threads x 200,000 increments, 1 and 2 workers, MCS and ring\n\
             queues. Prints JSON lines (seconds), with ct-sync's mutex and std::sync::Mutex\n\
             (50 OS threads) in the same run, and the uncontended ns/op of both."
        );
        return;
    }
    let threads: usize = args.get("threads", 50);
    let iters: u64 = args.get("iters", 200_000);
    let workers: Vec<usize> = args.list("workers", &[1, 2]);
    let runs: usize = args.get("runs", 7);
    args.finish("delegator");
    // How expensive cross-core hand-offs are on this machine right now.
    ct_bench::emit_line_round_trip("ct-delegate", "delegator", runs);
    let params = |w: usize| -> Vec<(&str, Param)> {
        vec![
            ("threads", threads.into()),
            ("iters", iters.into()),
            ("workers", w.into()),
        ]
    };
    for &w in &workers {
        let rt = Runtime::builder().workers(w).build().expect("runtime");
        eprintln!("delegator (MCS queue), {w} workers...");
        let s = repeat(runs, || {
            delegator_run::<McsQueue<Entry<Counter, Ult>>>(&rt, threads, iters)
        });
        emit(
            "ct-delegate",
            "delegator",
            "delegator-mcs",
            &params(w),
            "s",
            &s,
        );
        eprintln!("delegator (ring queue), {w} workers...");
        let s = repeat(runs, || {
            delegator_run::<RingQueue<Entry<Counter, Ult>>>(&rt, threads, iters)
        });
        emit(
            "ct-delegate",
            "delegator",
            "delegator-ring",
            &params(w),
            "s",
            &s,
        );
        eprintln!("ct-sync mutex, {w} workers...");
        let s = repeat(runs, || mutex_run(&rt, threads, iters));
        emit(
            "ct-delegate",
            "delegator",
            "ct-sync-mutex",
            &params(w),
            "s",
            &s,
        );
    }
    eprintln!("std::sync::Mutex with {threads} OS threads...");
    let s = repeat(runs, || std_run(threads, iters));
    emit(
        "ct-delegate",
        "delegator",
        "std-mutex",
        &params(threads),
        "s",
        &s,
    );

    let rt = Runtime::builder().workers(1).build().expect("runtime");
    let ops = 5_000_000u64;
    eprintln!("uncontended ns/op...");
    let s = repeat(runs, || uncontended(&rt, ops, true));
    emit(
        "ct-delegate",
        "delegator-uncontended",
        "execute-or-delegate",
        &[("ops", ops.into())],
        "ns",
        &s,
    );
    let s = repeat(runs, || uncontended(&rt, ops, false));
    emit(
        "ct-delegate",
        "delegator-uncontended",
        "ct-sync-mutex",
        &[("ops", ops.into())],
        "ns",
        &s,
    );
    ct_bench::print_summary();
}
