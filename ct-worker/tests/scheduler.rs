//! Scheduler behaviour: fork/join, spawning, detaching, scopes, panics,
//! migration, stress, idleness.

mod common;

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Lcg, threads_cpu_seconds, with_timeout};
use ct_worker::{Runtime, SuspendedThread};

fn fib(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join(|| fib(n - 1), || fib(n - 2));
    a + b
}

fn rt(workers: usize) -> Runtime {
    Runtime::builder()
        .workers(workers)
        .build()
        .expect("runtime")
}

#[test]
fn fib_25_with_1_2_4_workers() {
    with_timeout(120, || {
        for w in [1, 2, 4] {
            let rt = rt(w);
            assert_eq!(rt.block_on(|| fib(25)), 75025, "fib(25) with {w} workers");
            assert_eq!(rt.num_workers(), w);
        }
    });
}

#[test]
fn hundred_thousand_spawned_threads_joined() {
    with_timeout(120, || {
        let rt = rt(2);
        let total = rt.block_on(|| {
            let handles: Vec<_> = (0..100_000u64)
                .map(|i| ct_worker::spawn(move || i * 2))
                .collect();
            handles.into_iter().map(|h| h.join()).sum::<u64>()
        });
        assert_eq!(total, 2 * (100_000 * 99_999 / 2));
    });
}

#[test]
fn detached_threads_outlive_their_spawner() {
    with_timeout(60, || {
        let rt = rt(2);
        let release = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let (r2, d2) = (release.clone(), done.clone());
        // The spawner returns while its children are still blocked.
        rt.block_on(move || {
            let spawner = ct_worker::spawn(move || {
                for _ in 0..50 {
                    let (r, d) = (r2.clone(), d2.clone());
                    drop(ct_worker::spawn(move || {
                        while !r.load(Ordering::Acquire) {
                            ct_worker::yield_now();
                        }
                        d.fetch_add(1, Ordering::AcqRel);
                    }));
                }
            });
            spawner.join();
        });
        assert_eq!(
            done.load(Ordering::Acquire),
            0,
            "children are still waiting"
        );
        release.store(true, Ordering::Release);
        let start = Instant::now();
        while done.load(Ordering::Acquire) < 50 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "detached threads never finished"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

#[test]
fn scoped_threads_borrow_locals() {
    with_timeout(60, || {
        let rt = rt(2);
        let mut data: Vec<u64> = (0..10_000).collect();
        let sum = AtomicUsize::new(0);
        rt.block_on(|| {
            ct_worker::scope(|s| {
                for chunk in data.chunks_mut(1000) {
                    let sum = &sum;
                    s.spawn(move || {
                        for x in chunk.iter_mut() {
                            *x *= 3;
                            sum.fetch_add(*x as usize, Ordering::Relaxed);
                        }
                    });
                }
            });
        });
        assert!(data.iter().enumerate().all(|(i, &x)| x == 3 * i as u64));
        assert_eq!(sum.into_inner(), 3 * 9_999 * 10_000 / 2);
    });
}

/// `join`'s closures may block on each other in either direction, on one
/// worker too: when `a` parks, its worker starts the queued `b` as a thread
/// (rayon, which runs `b` only after `a`, would deadlock here).
#[test]
fn join_closures_may_wait_for_each_other() {
    with_timeout(60, || {
        for w in [1, 2, 4] {
            let rt = rt(w);
            for round in 0..200 {
                let got = rt.block_on(|| {
                    let slot = SuspendedThread::new();
                    let flag = AtomicBool::new(false);
                    let wait = || {
                        slot.wait_with(|| !flag.load(Ordering::Acquire));
                        assert!(flag.load(Ordering::Acquire), "woken before the signal");
                    };
                    let signal = || {
                        flag.store(true, Ordering::Release);
                        slot.notify();
                    };
                    if round % 2 == 0 {
                        ct_worker::join(|| (wait(), 1).1, || (signal(), 2).1)
                    } else {
                        ct_worker::join(|| (signal(), 1).1, || (wait(), 2).1)
                    }
                });
                assert_eq!(got, (1, 2), "{w} workers, round {round}");
            }
        }
    });
}

/// A panic in the queued closure reaches the caller whether the caller ran
/// it itself (one worker, nothing blocks) or another thread did (`a` parks,
/// so `b` starts as a thread).
#[test]
fn join_propagates_panics_of_the_second_closure() {
    with_timeout(60, || {
        let rt = rt(1);
        rt.block_on(|| {
            let r =
                std::panic::catch_unwind(|| ct_worker::join(|| 1, || -> u32 { panic!("right") }));
            assert_eq!(
                r.expect_err("propagated").downcast_ref::<&str>(),
                Some(&"right")
            );
            let slot = SuspendedThread::new();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                ct_worker::join(
                    || slot.wait(),
                    || {
                        slot.notify();
                        panic!("right, as a thread")
                    },
                )
            }));
            assert_eq!(
                r.expect_err("propagated").downcast_ref::<&str>(),
                Some(&"right, as a thread")
            );
        });
    });
}

/// Nested joins recurse on the caller's stack (every leaf counted once);
/// prints how many bytes of stack one nesting level takes.
#[test]
fn nested_joins_recurse_on_the_callers_stack() {
    fn chain(depth: u32, leaves: &AtomicUsize) {
        let here = 0u8;
        if depth == 100 {
            TOP.store(&here as *const u8 as usize, Ordering::Relaxed);
        }
        if depth == 0 {
            let per_level = (TOP.load(Ordering::Relaxed) - &here as *const u8 as usize) / 100;
            PER_LEVEL.store(per_level, Ordering::Relaxed);
            leaves.fetch_add(1, Ordering::Relaxed);
            return;
        }
        ct_worker::join(
            || chain(depth - 1, leaves),
            || {
                leaves.fetch_add(1, Ordering::Relaxed);
            },
        );
    }
    static TOP: AtomicUsize = AtomicUsize::new(0);
    static PER_LEVEL: AtomicUsize = AtomicUsize::new(0);
    with_timeout(60, || {
        for w in [1, 2] {
            let rt = Runtime::builder()
                .workers(w)
                .stack_size(1 << 20)
                .build()
                .unwrap();
            let leaves = AtomicUsize::new(0);
            rt.block_on(|| chain(200, &leaves));
            assert_eq!(leaves.load(Ordering::Relaxed), 201, "{w} workers");
        }
        eprintln!(
            "one nested join level: {} bytes of stack",
            PER_LEVEL.load(Ordering::Relaxed)
        );
    });
}

/// A thread parked in `slot`, the worker it parked on, and a flag it sets
/// once woken (on the current runtime).
fn park_a_thread(
    slot: &Arc<SuspendedThread>,
) -> (ct_worker::JoinHandle<()>, usize, Arc<AtomicBool>) {
    let home = Arc::new(AtomicUsize::new(usize::MAX));
    let woken = Arc::new(AtomicBool::new(false));
    let p = {
        let (slot, home, woken) = (slot.clone(), home.clone(), woken.clone());
        ct_worker::spawn(move || {
            home.store(ct_worker::current_worker_index().unwrap(), Ordering::SeqCst);
            slot.wait();
            woken.store(true, Ordering::SeqCst);
        })
    };
    while home.load(Ordering::SeqCst) == usize::MAX || slot.is_empty() {
        ct_worker::yield_now();
    }
    (p, home.load(Ordering::SeqCst), woken)
}

/// Yields until the calling thread runs on worker `w`.
fn move_to_worker(w: usize) {
    while ct_worker::current_worker_index().unwrap() != w {
        ct_worker::yield_now();
    }
}

/// Spins, without yielding, until `flag` is set.
fn spin_until(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        std::hint::spin_loop();
    }
}

/// `notify_home` sends a thread back to the worker it parked on; if that
/// worker is busy (here: a thread spinning without yielding until the woken
/// one runs), an idle worker takes it instead of leaving it stranded.
#[test]
fn notify_home_never_strands_a_thread_behind_a_busy_worker() {
    with_timeout(60, || {
        let rt = rt(2);
        for _ in 0..20 {
            rt.block_on(|| {
                let slot = Arc::new(SuspendedThread::new());
                let (p, h, woken) = park_a_thread(&slot);
                // Occupy the home worker with a thread that only the woken
                // thread can release.
                let busy_ready = Arc::new(AtomicBool::new(false));
                let q = {
                    let (woken, busy_ready) = (woken.clone(), busy_ready.clone());
                    ct_worker::spawn(move || {
                        move_to_worker(h);
                        busy_ready.store(true, Ordering::SeqCst);
                        spin_until(&woken);
                    })
                };
                while !busy_ready.load(Ordering::SeqCst)
                    || ct_worker::current_worker_index().unwrap() == h
                {
                    ct_worker::yield_now();
                }
                assert!(slot.notify_home(), "the thread was parked");
                p.join();
                q.join();
            });
        }
    });
}

/// A thread woken by its own home worker waits in that worker's home queue;
/// if the worker then stays busy (the waker spins without yielding until the
/// woken thread runs), an idle worker takes it from there.
#[test]
fn a_thread_sent_home_is_taken_from_a_busy_home_worker() {
    with_timeout(60, || {
        let rt = rt(2);
        for _ in 0..20 {
            rt.block_on(|| {
                let slot = Arc::new(SuspendedThread::new());
                let (p, h, woken) = park_a_thread(&slot);
                // On the home worker: wake the thread (into this worker's
                // home queue), then keep the worker busy until it runs.
                let q = {
                    let slot = slot.clone();
                    ct_worker::spawn(move || {
                        move_to_worker(h);
                        assert!(slot.notify_home(), "the thread was parked");
                        spin_until(&woken);
                    })
                };
                p.join();
                q.join();
            });
        }
    });
}

/// `notify_home_each` wakes the thread of every slot exactly once, waiting
/// at slots whose thread has arrived but not parked yet (as a barrier's last
/// arriver does), from a user-level thread (the batched path: one chain per
/// worker) and from a plain OS thread. A thread lost from a chain or a slot
/// skipped hangs the test.
#[test]
fn notify_home_each_wakes_every_slot_even_before_it_parks() {
    const N: usize = 64;
    with_timeout(120, || {
        for workers in [1, 2, 4] {
            let rt = rt(workers);
            for round in 0..30 {
                let slots: Arc<Vec<SuspendedThread>> =
                    Arc::new((0..N).map(|_| SuspendedThread::new()).collect());
                let arrived = Arc::new(AtomicUsize::new(0));
                let woken = Arc::new(AtomicUsize::new(0));
                let from_os_thread = round % 3 == 2;
                rt.block_on(|| {
                    let hs: Vec<_> = (0..N)
                        .map(|i| {
                            let (slots, arrived, woken) =
                                (slots.clone(), arrived.clone(), woken.clone());
                            ct_worker::spawn(move || {
                                // Nothing between arriving and parking needs
                                // another thread (the method's precondition).
                                arrived.fetch_add(1, Ordering::SeqCst);
                                slots[i].wait();
                                woken.fetch_add(1, Ordering::SeqCst);
                            })
                        })
                        .collect();
                    while arrived.load(Ordering::SeqCst) < N {
                        ct_worker::yield_now();
                    }
                    if from_os_thread {
                        let slots = slots.clone();
                        std::thread::spawn(move || SuspendedThread::notify_home_each(slots.iter()))
                            .join()
                            .unwrap();
                    } else {
                        SuspendedThread::notify_home_each(slots.iter());
                    }
                    for h in hs {
                        h.join();
                    }
                });
                assert_eq!(woken.load(Ordering::SeqCst), N);
                assert!(slots.iter().all(|s| s.is_empty()));
            }
        }
    });
}

#[test]
fn panics_propagate_to_the_joiner() {
    with_timeout(60, || {
        let rt = rt(2);
        rt.block_on(|| {
            let h = ct_worker::spawn(|| -> u32 { panic!("boom in child") });
            let err = h.try_join().expect_err("the child panicked");
            assert_eq!(err.downcast_ref::<&str>(), Some(&"boom in child"));

            let r = std::panic::catch_unwind(|| ct_worker::join(|| panic!("left"), || 1));
            assert_eq!(
                r.expect_err("join propagates").downcast_ref::<&str>(),
                Some(&"left")
            );

            let r = std::panic::catch_unwind(|| {
                ct_worker::scope(|s| {
                    s.spawn(|| panic!("scoped"));
                })
            });
            let msg = r.expect_err("an unjoined scoped panic fails the scope");
            assert_eq!(
                msg.downcast_ref::<&str>(),
                Some(&"a scoped thread panicked")
            );

            // A joined scoped panic is handled by the joiner, not the scope.
            ct_worker::scope(|s| {
                let h = s.spawn(|| panic!("handled"));
                assert!(h.join().is_err());
            });
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(|| panic!("root panic"))
        }));
        assert_eq!(
            r.expect_err("block_on re-raises").downcast_ref::<&str>(),
            Some(&"root panic")
        );
        // The runtime still works after all that.
        assert_eq!(rt.block_on(|| fib(15)), 610);
    });
}

#[test]
fn suspended_thread_handshakes_across_workers() {
    with_timeout(60, || {
        let rt = rt(2);
        const ROUNDS: usize = 10_000;
        let (ping, pong) = (
            Arc::new(SuspendedThread::new()),
            Arc::new(SuspendedThread::new()),
        );
        let turn = Arc::new(AtomicUsize::new(0));
        let seen_workers = Arc::new(AtomicUsize::new(0));
        rt.block_on(|| {
            let (p1, q1, t1, s1) = (
                ping.clone(),
                pong.clone(),
                turn.clone(),
                seen_workers.clone(),
            );
            let a = ct_worker::spawn(move || {
                for i in 0..ROUNDS {
                    // Wait for our turn (even), then hand over.
                    p1.wait_with(|| t1.load(Ordering::Acquire) != 2 * i);
                    assert_eq!(t1.load(Ordering::Acquire), 2 * i);
                    s1.fetch_or(
                        1 << ct_worker::current_worker_index().unwrap(),
                        Ordering::Relaxed,
                    );
                    t1.store(2 * i + 1, Ordering::Release);
                    q1.notify();
                }
            });
            let (p2, q2, t2) = (ping.clone(), pong.clone(), turn.clone());
            let b = ct_worker::spawn(move || {
                for i in 0..ROUNDS {
                    q2.wait_with(|| t2.load(Ordering::Acquire) != 2 * i + 1);
                    assert_eq!(t2.load(Ordering::Acquire), 2 * i + 1);
                    t2.store(2 * i + 2, Ordering::Release);
                    p2.notify();
                }
            });
            a.join();
            b.join();
        });
        assert_eq!(turn.load(Ordering::Acquire), 2 * ROUNDS);
        assert_ne!(seen_workers.load(Ordering::Relaxed), 0);
    });
}

#[test]
fn wait_with_refusal_does_not_park() {
    with_timeout(30, || {
        let rt = rt(1);
        rt.block_on(|| {
            let slot: SuspendedThread = SuspendedThread::new();
            assert!(
                !slot.wait_with(|| false),
                "a refusing decision returns at once"
            );
            assert!(slot.is_empty());
            assert!(!slot.notify(), "nothing is parked");
        });
    });
}

/// Random yields, spawns, joins and detaches; every result is checked.
#[test]
fn stress_random_yields_and_spawns() {
    fn node(seed: u64, depth: u32, detached: &Arc<AtomicUsize>) -> u64 {
        let mut rng = Lcg(seed);
        if rng.below(4) == 0 {
            ct_worker::yield_now();
        }
        if depth == 0 {
            return seed % 1000;
        }
        let kids = 1 + rng.below(3);
        let mut handles = Vec::new();
        let mut sum = seed % 1000;
        for k in 0..kids {
            let s = seed.wrapping_mul(31).wrapping_add(k + 1);
            match rng.below(3) {
                0 => sum += node(s, depth - 1, detached),
                1 => {
                    let d = detached.clone();
                    handles.push(ct_worker::spawn(move || node(s, depth - 1, &d)));
                }
                _ => {
                    let d = detached.clone();
                    // Detached: its contribution is counted separately.
                    drop(ct_worker::spawn(move || {
                        let v = node(s, depth - 1, &d);
                        d.fetch_add(v as usize, Ordering::AcqRel);
                    }));
                }
            }
            if rng.below(5) == 0 {
                ct_worker::yield_now();
            }
        }
        sum + handles.into_iter().map(|h| h.join()).sum::<u64>()
    }
    // The same computation sequentially, with detached children counted the
    // same way.
    fn model(seed: u64, depth: u32, detached: &mut u64) -> u64 {
        let mut rng = Lcg(seed);
        let _ = rng.below(4); // the yield decision
        if depth == 0 {
            return seed % 1000;
        }
        let kids = 1 + rng.below(3);
        let mut sum = seed % 1000;
        for k in 0..kids {
            let s = seed.wrapping_mul(31).wrapping_add(k + 1);
            match rng.below(3) {
                0 | 1 => sum += model(s, depth - 1, detached),
                _ => {
                    let v = model(s, depth - 1, detached);
                    *detached += v;
                }
            }
            let _ = rng.below(5); // the yield decision
        }
        sum
    }
    with_timeout(120, || {
        for (workers, seed) in [(1, 7u64), (2, 11), (4, 13)] {
            let rt = rt(workers);
            let detached = Arc::new(AtomicUsize::new(0));
            let d = detached.clone();
            let got = rt.block_on(move || node(seed, 7, &d));
            let mut expect_detached = 0;
            let expect = model(seed, 7, &mut expect_detached);
            assert_eq!(got, expect, "joined results with {workers} workers");
            drop(rt); // runs every remaining detached thread to completion
            assert_eq!(detached.load(Ordering::Acquire) as u64, expect_detached);
        }
    });
}

#[test]
fn current_worker_accessor_follows_migration() {
    with_timeout(60, || {
        let rt = rt(2);
        let slot = Arc::new(SuspendedThread::new());
        let migrated = rt.block_on(|| {
            let s = slot.clone();
            // A thread that parks and is woken by threads on whatever worker;
            // after each wake-up the accessor must agree with the OS thread.
            let waiter = ct_worker::spawn(move || {
                let mut workers_seen = 0u32;
                for _ in 0..200 {
                    s.wait();
                    let idx = ct_worker::current_worker_index().unwrap();
                    let name = std::thread::current().name().unwrap().to_string();
                    assert_eq!(
                        name,
                        format!("ct-worker-{idx}"),
                        "accessor agrees with OS thread"
                    );
                    workers_seen |= 1 << idx;
                }
                workers_seen
            });
            for i in 0..200 {
                // Wake it from a thread that may run on either worker.
                let s = slot.clone();
                let h = ct_worker::spawn(move || {
                    while !s.notify() {
                        ct_worker::yield_now();
                    }
                    if i % 2 == 0 {
                        // Give the other worker a chance to steal us first.
                        std::thread::sleep(Duration::from_micros(50));
                    }
                });
                h.join();
            }
            waiter.join()
        });
        assert_ne!(migrated, 0);
    });
}

#[test]
fn idle_runtime_uses_little_cpu() {
    with_timeout(60, || {
        // Named workers: only their CPU time counts (the other tests of
        // this binary run in parallel in the same process).
        let rt = Runtime::builder()
            .workers(2)
            .thread_name("idle-probe")
            .build()
            .expect("runtime");
        assert_eq!(rt.block_on(|| fib(20)), 6765);
        // Let workers run down their backoff, then measure.
        std::thread::sleep(Duration::from_millis(100));
        let c0 = threads_cpu_seconds("idle-probe");
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(1));
        let used = threads_cpu_seconds("idle-probe") - c0;
        let wall = t0.elapsed().as_secs_f64();
        // Two spinning workers would use about 2 s per second.
        assert!(
            used < 0.2 * wall,
            "idle runtime used {used:.3} s of CPU in {wall:.3} s"
        );
        drop(rt);
    });
}

#[test]
fn block_on_from_many_os_threads() {
    with_timeout(60, || {
        let rt = Arc::new(rt(2));
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                let rt = rt.clone();
                std::thread::spawn(move || rt.block_on(move || fib(15 + i % 3) + i))
            })
            .collect();
        let got: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let expect: Vec<u64> = (0..8u64)
            .map(|i| [610, 987, 1597][(i % 3) as usize] + i)
            .collect();
        assert_eq!(got, expect);
    });
}

#[test]
fn join_handles_from_os_threads_and_rt_spawn() {
    with_timeout(60, || {
        let rt = rt(2);
        let hs: Vec<_> = (0..100u64).map(|i| rt.spawn(move || fib(10) + i)).collect();
        let sum: u64 = hs.into_iter().map(|h| h.join()).sum();
        assert_eq!(sum, 100 * 55 + 99 * 100 / 2);
        // A handle joined from a user-level thread of the runtime.
        let h = rt.spawn(|| fib(12));
        assert_eq!(rt.block_on(move || h.join()), 144);
    });
}

#[test]
fn parallel_for_covers_every_index_once() {
    with_timeout(60, || {
        let rt = rt(2);
        let hits: Vec<AtomicUsize> = (0..10_007).map(|_| AtomicUsize::new(0)).collect();
        rt.block_on(|| {
            ct_worker::parallel_for(0..hits.len(), 7, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            })
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        // Outside a runtime it runs sequentially.
        let c = AtomicUsize::new(0);
        ct_worker::parallel_for(0..100, 0, |_| {
            c.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(c.into_inner(), 100);
    });
}

ct_worker::ult_local! {
    static LOCAL: Cell<u64> = Cell::new(0);
}

#[test]
fn ult_locals_follow_the_thread() {
    with_timeout(60, || {
        let rt = rt(2);
        let ok = rt.block_on(|| {
            let hs: Vec<_> = (1..=64u64)
                .map(|i| {
                    ct_worker::spawn(move || {
                        LOCAL.with(|l| l.set(i));
                        for _ in 0..20 {
                            ct_worker::yield_now();
                            if LOCAL.with(|l| l.get()) != i {
                                return false;
                            }
                        }
                        true
                    })
                })
                .collect();
            hs.into_iter().all(|h| h.join())
        });
        assert!(
            ok,
            "each thread keeps its own ULT-local across yields and migrations"
        );
        // Fresh threads start from the initial value.
        assert_eq!(
            rt.block_on(|| ct_worker::spawn(|| LOCAL.with(|l| l.get())).join()),
            0
        );
    });
}

#[test]
fn spawn_outside_a_runtime_panics_clearly() {
    let r = std::panic::catch_unwind(|| ct_worker::spawn(|| 1));
    let p = r.expect_err("spawn needs a runtime");
    let msg = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("outside a user-level thread"), "{msg}");
}

#[test]
fn builder_rejects_bad_settings() {
    assert!(matches!(
        Runtime::builder().workers(0).build(),
        Err(ct_worker::Error::InvalidWorkers(_))
    ));
    assert!(matches!(
        Runtime::builder().stack_size(100).build(),
        Err(ct_worker::Error::InvalidStackSize(_))
    ));
    let e = Runtime::builder()
        .workers(0)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("CT_NUM_WORKERS"), "{e}");
}

#[test]
fn deep_recursion_inside_threads_uses_the_configured_stack() {
    with_timeout(60, || {
        #[inline(never)]
        fn deep(n: u32) -> u64 {
            let pad = std::hint::black_box([n as u8; 256]);
            if n == 0 {
                0
            } else {
                deep(n - 1) + pad[3] as u64
            }
        }
        let rt = Runtime::builder()
            .workers(1)
            .stack_size(8 << 20)
            .build()
            .unwrap();
        // About 2000 frames of ~300 bytes: needs well over the default stack.
        let v = rt.block_on(|| ct_worker::spawn(|| deep(2000)).join());
        assert_eq!(v, (1..=2000u64).map(|n| n % 256).sum::<u64>());
    });
}

#[test]
#[ignore = "helper: runs in a child process of `stack_overflow_in_a_thread_is_reported`"]
fn overflow_child() {
    #[inline(never)]
    #[allow(unconditional_recursion)]
    fn smash(n: u64) -> u64 {
        let pad = std::hint::black_box([n as u8; 512]);
        smash(n + 1) + pad[1] as u64
    }
    let rt = Runtime::builder()
        .workers(2)
        .stack_size(64 * 1024)
        .build()
        .unwrap();
    rt.block_on(|| ct_worker::spawn(|| smash(0)).join());
}

#[test]
fn stack_overflow_in_a_thread_is_reported() {
    use std::os::unix::process::ExitStatusExt;
    let out = with_timeout(60, || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["overflow_child", "--exact", "--ignored", "--nocapture"])
            .output()
            .unwrap()
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "stderr:\n{err}");
    assert!(
        err.contains("stack overflow in user-level thread"),
        "stderr:\n{err}"
    );
    // The report names the knobs that size a thread's stack.
    for knob in ["CT_STACK_SIZE", "Builder::stack_size", "default 128k"] {
        assert!(err.contains(knob), "no {knob} in stderr:\n{err}");
    }
}

/// A worker bound to a processor runs there only (its OS thread's mask is
/// that processor), and binding a worker that does not exist, to no
/// processor or to one the system cannot name fails with a message.
#[test]
fn a_bound_worker_runs_on_its_processor_only() {
    with_timeout(60, || {
        let allowed = ct_worker::allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let rt = Runtime::builder().workers(1).build().unwrap();
        let cpu = *allowed.last().unwrap();
        rt.bind_worker(0, &[cpu]).unwrap();
        let (mask, on) = rt.block_on(|| {
            let mask = ct_worker::allowed_cpus().unwrap();
            // SAFETY: no arguments.
            let on = unsafe { libc::sched_getcpu() };
            (mask, on)
        });
        assert_eq!(mask, vec![cpu]);
        assert_eq!(on, cpu as i32);
        // Back to every allowed processor.
        rt.bind_worker(0, &allowed).unwrap();
        assert_eq!(rt.block_on(|| ct_worker::allowed_cpus().unwrap()), allowed);
        for (index, cpus) in [(1, vec![cpu]), (0, vec![]), (0, vec![1 << 20])] {
            let e = rt.bind_worker(index, &cpus).unwrap_err();
            assert!(
                matches!(e, ct_worker::Error::Bind { worker, .. } if worker == index),
                "{e}"
            );
            assert!(e.to_string().contains("cannot bind worker"), "{e}");
        }
    });
}
