//! Mutex, condition variable and barrier on user-level threads (1, 2 and 4
//! workers) and on OS threads. Every test body is written once against
//! `UltItf`, and the mutex tests run on both lock protocols (`RawMutex`,
//! barging, and `RawFairMutex`, MCS hand-off).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use ct_sync::{Barrier, Condvar, McsSpinLock, Mutex, RawFairMutex, RawLock, RawMutex, SpinLock};
use ct_worker::{JoinHandleItf, OsThreads, Runtime, SuspendedThreadItf, Ult, UltItf};

/// Fails the test if `f` does not finish within `secs` seconds.
fn with_timeout<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => match h.join().unwrap() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => panic!("test did not finish within {secs} s (hang)"),
    }
}

/// Runs `body` on user-level threads with 1, 2 and 4 workers.
fn on_ult<F>(secs: u64, body: F)
where
    F: Fn() + Send + Sync + Copy + 'static,
{
    with_timeout(secs, move || {
        for w in [1, 2, 4] {
            let rt = Runtime::builder().workers(w).build().unwrap();
            rt.block_on(body);
        }
    });
}

fn counter<U: UltItf, R: RawLock<U> + 'static>(threads: usize, per_thread: usize) -> u64 {
    let m = Arc::new(Mutex::<u64, U, R>::new_in(0));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let m = m.clone();
            U::spawn(move || {
                for _ in 0..per_thread {
                    let mut g = m.lock();
                    let v = *g;
                    // Make lost updates likely if exclusion were broken.
                    if v.is_multiple_of(64) {
                        U::yield_now();
                    }
                    *g = v + 1;
                }
            })
        })
        .collect();
    for h in hs {
        h.join();
    }
    *m.lock()
}

#[test]
fn mutex_50_threads_10k_increments() {
    with_timeout(120, || {
        for w in [1, 2, 4] {
            let rt = Runtime::builder().workers(w).build().unwrap();
            assert_eq!(
                rt.block_on(|| counter::<Ult, RawMutex>(50, 10_000)),
                500_000,
                "{w} workers"
            );
            assert_eq!(
                rt.block_on(|| counter::<Ult, RawFairMutex>(50, 10_000)),
                500_000,
                "fair, {w} workers"
            );
        }
    });
    with_timeout(120, || {
        assert_eq!(
            counter::<OsThreads, RawMutex<OsThreads>>(50, 2_000),
            100_000,
            "OS threads"
        );
        assert_eq!(
            counter::<OsThreads, RawFairMutex<OsThreads>>(50, 2_000),
            100_000,
            "fair, OS threads"
        );
    });
}

/// A mutex biased to the OS thread of a one-worker runtime (its threads
/// lock without a CAS) while OS threads outside the runtime take it too:
/// the first of them revokes the bias, and no increment is lost, whether
/// the foreign threads start before, during or after the biased ones.
#[test]
fn biased_mutex_is_revoked_by_foreign_os_threads() {
    with_timeout(120, || {
        for start_after_ms in [0u64, 0, 0, 0, 0, 1, 2, 20] {
            let rt = Runtime::builder().workers(1).build().unwrap();
            let m = Arc::new(Mutex::new(0u64));
            let foreign: Vec<_> = (0..2)
                .map(|_| {
                    let m = m.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(start_after_ms));
                        for i in 0..50_000u64 {
                            *m.lock() += 1;
                            if i % 1024 == 0 {
                                std::thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            let m2 = m.clone();
            rt.block_on(move || {
                let hs: Vec<_> = (0..8)
                    .map(|_| {
                        let m = m2.clone();
                        ct_worker::spawn(move || {
                            for i in 0..50_000u64 {
                                let mut g = m.lock();
                                let v = *g;
                                if i % 512 == 0 {
                                    ct_worker::yield_now();
                                }
                                *g = v + 1;
                            }
                        })
                    })
                    .collect();
                for h in hs {
                    h.join();
                }
            });
            for t in foreign {
                t.join().unwrap();
            }
            assert_eq!(
                *m.lock(),
                10 * 50_000,
                "foreign threads after {start_after_ms} ms"
            );
        }
    });
}

/// One thread holds the lock almost all the time (about 0.5 µs per
/// acquisition, re-taken at once, no yields) until another thread, which
/// asked for the lock once, has got it. The barging protocol lets the busy
/// thread keep the lock for a while, and a lock released this often never
/// looks quiet to the woken waiter; but a woken waiter that never finds the
/// lock quiet asks for a hand-off, so it gets the lock within about a
/// millisecond (a few thousand of the busy thread's acquisitions at most).
/// Without that bound the waiter gets in only by luck: in trials with the
/// bound removed it was passed over 0.4 to 3 million times. Returns how many
/// times the busy thread took the lock while the waiter was waiting.
fn busy_lock_is_handed_over<U: UltItf, R: RawLock<U> + 'static>() -> u64 {
    let m = Arc::new(Mutex::<u64, U, R>::new_in(0));
    // 0: nobody waits; 1: the waiter has asked; 2: the waiter got the lock.
    let state = Arc::new(AtomicUsize::new(0));
    let busy = {
        let (m, state) = (m.clone(), state.clone());
        U::spawn(move || {
            let mut passed_over = 0u64;
            loop {
                let mut g = m.lock();
                match state.load(Ordering::Relaxed) {
                    2 => return passed_over,
                    1 => passed_over += 1,
                    _ => {}
                }
                *g += 1;
                for _ in 0..20 {
                    std::hint::spin_loop();
                }
                drop(g);
            }
        })
    };
    // Let the busy thread get going, then ask for the lock once.
    while *m.lock() < 1000 {
        U::yield_now();
    }
    let waiter = {
        let (m, state) = (m.clone(), state.clone());
        U::spawn(move || {
            state.store(1, Ordering::Relaxed);
            let g = m.lock();
            state.store(2, Ordering::Relaxed);
            drop(g);
        })
    };
    waiter.join();
    busy.join()
}

#[test]
fn busy_lock_does_not_starve_a_waiter() {
    with_timeout(120, || {
        // A bound on how often a waiter is passed over, with a wide margin
        // (expected: at most thousands; without the hand-off: millions). A
        // waiter often gets in before it is woken at all (while it spins, or
        // after its parking fence), so several rounds make it likely that one
        // goes through the woken waiter's path.
        const LIMIT: u64 = 100_000;
        for _ in 0..5 {
            let n = busy_lock_is_handed_over::<OsThreads, RawMutex<OsThreads>>();
            assert!(
                n < LIMIT,
                "OS threads: the waiter was passed over {n} times"
            );
        }
        // Two workers: work-first spawning runs the busy thread at once, the
        // idle worker steals the spawner, and the waiter starts there.
        let rt = Runtime::builder().workers(2).build().unwrap();
        for _ in 0..5 {
            let n = rt.block_on(busy_lock_is_handed_over::<Ult, RawMutex>);
            assert!(n < LIMIT, "2 workers: the waiter was passed over {n} times");
        }
    });
}

fn try_lock_semantics<U: UltItf, R: RawLock<U>>() {
    let m = Mutex::<i32, U, R>::new_in(1);
    let g = m.try_lock().expect("free");
    assert!(m.try_lock().is_none(), "held");
    assert!(m.raw().is_locked());
    drop(g);
    assert!(!m.raw().is_locked());
    *m.lock() += 1;
    assert_eq!(*m.try_lock().unwrap(), 2);
}

#[test]
fn mutex_try_lock() {
    on_ult(30, try_lock_semantics::<Ult, RawMutex>);
    on_ult(30, try_lock_semantics::<Ult, RawFairMutex>);
    try_lock_semantics::<OsThreads, RawMutex<OsThreads>>();
    try_lock_semantics::<OsThreads, RawFairMutex<OsThreads>>();
}

/// Producers and consumers through a bounded queue with two condition
/// variables: every item arrives exactly once, nobody sleeps through a
/// notification.
fn producer_consumer<U: UltItf, R: RawLock<U> + 'static>(
    producers: usize,
    consumers: usize,
    items: usize,
) {
    struct Q {
        buf: std::collections::VecDeque<usize>,
        done: usize,
    }
    let shared = Arc::new((
        Mutex::<Q, U, R>::new_in(Q {
            buf: Default::default(),
            done: 0,
        }),
        Condvar::<U>::new_in(),
        Condvar::<U>::new_in(),
    ));
    const CAP: usize = 4;
    let sum = Arc::new(AtomicUsize::new(0));
    let mut hs = Vec::new();
    for p in 0..producers {
        let s = shared.clone();
        hs.push(U::spawn(move || {
            let (m, not_empty, not_full) = &*s;
            for i in 0..items {
                let mut q = not_full.wait_while(m.lock(), |q| q.buf.len() >= CAP);
                q.buf.push_back(p * items + i);
                drop(q);
                not_empty.notify_one();
            }
            m.lock().done += 1;
            not_empty.notify_all();
        }));
    }
    for _ in 0..consumers {
        let (s, sum) = (shared.clone(), sum.clone());
        hs.push(U::spawn(move || {
            let (m, not_empty, not_full) = &*s;
            loop {
                let mut q =
                    not_empty.wait_while(m.lock(), |q| q.buf.is_empty() && q.done < producers);
                match q.buf.pop_front() {
                    Some(v) => {
                        drop(q);
                        not_full.notify_one();
                        sum.fetch_add(v + 1, Ordering::Relaxed);
                    }
                    None => break,
                }
            }
        }));
    }
    for h in hs {
        h.join();
    }
    let n = producers * items;
    assert_eq!(sum.load(Ordering::Relaxed), n * (n + 1) / 2);
}

#[test]
fn condvar_producer_consumer_no_lost_wakeup() {
    on_ult(120, || producer_consumer::<Ult, RawMutex>(4, 4, 2_000));
    on_ult(120, || producer_consumer::<Ult, RawFairMutex>(4, 4, 2_000));
    with_timeout(120, || {
        producer_consumer::<OsThreads, RawMutex<OsThreads>>(3, 3, 2_000);
        producer_consumer::<OsThreads, RawFairMutex<OsThreads>>(3, 3, 2_000);
    });
}

/// Waiters are woken in the order they started waiting.
#[test]
fn condvar_is_fifo() {
    with_timeout(30, || {
        for workers in [1, 2] {
            let rt = Runtime::builder().workers(workers).build().unwrap();
            let order = rt.block_on(|| {
                let s = Arc::new((Mutex::new(Vec::new()), Condvar::new(), AtomicUsize::new(0)));
                let hs: Vec<_> = (0..8usize)
                    .map(|i| {
                        let s2 = s.clone();
                        let h = ct_worker::spawn(move || {
                            let (m, cv, waiting) = &*s2;
                            let mut g = m.lock();
                            waiting.fetch_add(1, Ordering::SeqCst);
                            g = cv.wait(g);
                            g.push(i);
                        });
                        // Let thread i start waiting before thread i + 1.
                        while s.2.load(Ordering::SeqCst) <= i {
                            ct_worker::yield_now();
                        }
                        h
                    })
                    .collect();
                for k in 1..=8 {
                    // Wake one, and let it record itself before the next.
                    assert!(s.1.notify_one());
                    while s.0.lock().len() < k {
                        ct_worker::yield_now();
                    }
                }
                assert!(!s.1.notify_one(), "nobody left");
                for h in hs {
                    h.join();
                }
                s.0.lock().clone()
            });
            assert_eq!(
                order,
                (0..8).collect::<Vec<_>>(),
                "FIFO wake-up order ({workers} workers)"
            );
        }
    });
}

/// 10^4 barrier episodes: what every thread wrote before the barrier is
/// visible to all after it; exactly one leader per episode.
fn barrier_episodes<U: UltItf>(threads: usize, episodes: usize) {
    barrier_episodes_late::<U>(threads, episodes, Duration::ZERO);
}

/// [`barrier_episodes`], where in each episode one thread (a different one
/// each time) blocks its OS thread for `late` before it arrives.
fn barrier_episodes_late<U: UltItf>(threads: usize, episodes: usize, late: Duration) {
    let b = Arc::new(Barrier::<U>::new_in(threads));
    let cells: Arc<Vec<AtomicUsize>> =
        Arc::new((0..threads).map(|_| AtomicUsize::new(0)).collect());
    let leaders = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (b, cells, leaders) = (b.clone(), cells.clone(), leaders.clone());
            U::spawn(move || {
                for e in 1..=episodes {
                    if !late.is_zero() && e % threads == t {
                        std::thread::sleep(late);
                    }
                    cells[t].store(e, Ordering::Relaxed);
                    if b.wait().is_leader() {
                        leaders.fetch_add(1, Ordering::Relaxed);
                    }
                    for (i, c) in cells.iter().enumerate() {
                        let v = c.load(Ordering::Relaxed);
                        assert_eq!(v, e, "thread {t} sees cell {i} = {v} in episode {e}");
                    }
                    b.wait();
                }
            })
        })
        .collect();
    for h in hs {
        h.join();
    }
    assert_eq!(leaders.load(Ordering::Relaxed), episodes);
}

#[test]
fn barrier_10k_episodes_publish_writes() {
    on_ult(120, || barrier_episodes::<Ult>(8, 10_000));
    with_timeout(120, || barrier_episodes::<OsThreads>(4, 2_000));
}

/// Episodes with a late arriver: the other workers run out of work and go
/// to sleep before the episode ends, so the completer wakes their waiters
/// through a local leader (which wakes the worker) instead of their idle
/// hooks. Nobody is left behind, writes are published, one leader each.
#[test]
fn barrier_wakes_the_waiters_of_sleeping_workers() {
    with_timeout(120, || {
        for w in [2, 4] {
            let rt = Runtime::builder().workers(w).build().unwrap();
            rt.block_on(|| barrier_episodes_late::<Ult>(6, 150, Duration::from_micros(400)));
        }
    });
}

/// Workers kept awake: a thread alone on its worker waits awake (polls the
/// generation, or completes the episode, without parking); with a late
/// arriver its polls run out and it parks, already counted; with more
/// threads than workers, awake and parked arrivals mix in one group.
/// Writes are published and every episode has one leader either way.
#[test]
fn barrier_episodes_on_workers_kept_awake() {
    with_timeout(120, || {
        let late = Duration::from_micros(50);
        for (workers, threads, episodes, late) in [
            (2, 2, 5_000, Duration::ZERO),
            (2, 2, 200, late),
            (4, 4, 1_000, Duration::ZERO),
            (2, 5, 2_000, Duration::ZERO),
            (2, 5, 200, late),
        ] {
            let rt = Runtime::builder().workers(workers).build().unwrap();
            rt.set_stay_awake(Duration::from_millis(5));
            rt.block_on(|| barrier_episodes_late::<Ult>(threads, episodes, late));
        }
    });
}

#[test]
fn barrier_of_one_always_leads() {
    let b = Barrier::new(1);
    assert!(b.wait().is_leader());
    assert!(b.wait().is_leader());
    assert_eq!(b.participants(), 1);
}

#[test]
#[should_panic(expected = "at least one participant")]
fn barrier_of_zero_is_refused() {
    let _ = Barrier::new(0);
}

/// `unlock_and_wait`: the waiter is in its slot before anyone can take the
/// lock, so a waker that takes the lock after the waiter released it always
/// finds it parked.
fn unlock_and_wait_handshake<U: UltItf, R: RawLock<U> + 'static>(rounds: usize) {
    let m = Arc::new(R::unlocked());
    let slot = Arc::new(U::SuspendedThread::default());
    // Set by the waiter, under the lock, just before `unlock_and_wait`.
    let released = Arc::new(AtomicUsize::new(0));
    let (m2, s2, r2) = (m.clone(), slot.clone(), released.clone());
    let waker = U::spawn(move || {
        let mut woken = 0;
        while woken < rounds {
            m2.lock();
            if r2.swap(0, Ordering::Relaxed) == 1 {
                // The waiter released the lock through `unlock_and_wait`, and
                // we got the lock after that: it must already be parked.
                assert!(
                    s2.notify(),
                    "the waiter was not parked when the lock was released"
                );
                woken += 1;
            }
            // SAFETY: locked above.
            unsafe { m2.unlock() };
            U::yield_now();
        }
    });
    for _ in 0..rounds {
        m.lock();
        released.store(1, Ordering::Relaxed);
        // SAFETY: locked above.
        unsafe { m.unlock_and_wait(&slot) };
    }
    waker.join();
}

#[test]
fn unlock_and_wait_never_misses_a_wakeup() {
    on_ult(60, || unlock_and_wait_handshake::<Ult, RawMutex>(4_000));
    on_ult(60, || unlock_and_wait_handshake::<Ult, RawFairMutex>(4_000));
    with_timeout(60, || {
        unlock_and_wait_handshake::<OsThreads, RawMutex<OsThreads>>(2_000);
        unlock_and_wait_handshake::<OsThreads, RawFairMutex<OsThreads>>(2_000);
    });
}

#[test]
fn spinlocks_exclude() {
    with_timeout(60, || {
        let s = Arc::new(SpinLock::new(0u64));
        let m = Arc::new(McsSpinLock::new(0u64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (s, m) = (s.clone(), m.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *s.lock() += 1;
                        m.with(|v| *v += 1);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*s.lock(), 80_000);
        assert_eq!(m.with(|v| *v), 80_000);
        assert!(s.try_lock().is_some());
    });
}
