//! Delegator behaviour on user-level threads (1, 2 and 4 workers, both queue
//! variants) and on OS threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use ct_delegate::{
    CompletionRef, Consumer, DelegationQueue, Delegator, Entry, McsQueue, RingQueue,
};
use ct_worker::{JoinHandleItf, OsThreads, Runtime, Ult, UltItf};

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

/// Checks that every thread's requests are executed exactly once and in the
/// order the thread made them, refusing some at random.
struct Checker {
    next: Vec<u64>,
    executed: u64,
    refuse_per_mille: u64,
    rng: u64,
    backlog: u64,
    refusals: u64,
}

impl Checker {
    fn new(threads: usize, refuse_per_mille: u64) -> Self {
        Checker {
            next: vec![0; threads],
            executed: 0,
            refuse_per_mille,
            rng: 0x2545_f491_4f6c_dd1d,
            backlog: 0,
            refusals: 0,
        }
    }

    fn refuse(&mut self) -> bool {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 1000 < self.refuse_per_mille
    }

    fn take(&mut self, (t, seq, flag): Req) {
        assert_eq!(
            self.next[t], seq,
            "thread {t}: request {seq} out of order or repeated"
        );
        self.next[t] += 1;
        self.executed += 1;
        // SAFETY: the requester keeps the flag alive (it is in an Arc).
        flag.store(true, Ordering::Release);
    }
}

/// (thread, sequence number, set when executed).
type Req = (usize, u64, Arc<AtomicBool>);

impl<U: UltItf> Consumer<U> for Checker {
    type Request = Req;

    fn execute(&mut self, req: Req) -> Result<(), Req> {
        if self.refuse() {
            self.backlog += 1;
            self.refusals += 1;
            return Err(req);
        }
        self.take(req);
        Ok(())
    }

    fn progress(&mut self) -> Option<&U::SuspendedThread> {
        self.backlog = 0;
        None
    }

    fn is_active(&self) -> bool {
        self.backlog > 0
    }
}

/// `threads` threads each make `per_thread` requests with
/// `execute_or_delegate`; checks the totals and the truthfulness of the
/// returned flag.
fn stress<U, Q>(threads: usize, per_thread: u64, refuse: u64, consumer: bool) -> (u64, u64)
where
    U: UltItf,
    Q: DelegationQueue<Entry<Checker, U>>,
{
    let d = Arc::new(Delegator::<Checker, U, Q>::new(Checker::new(
        threads, refuse,
    )));
    if consumer {
        d.start_consumer();
    }
    let inline_count = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (d, inline_count) = (d.clone(), inline_count.clone());
            U::spawn(move || {
                for seq in 0..per_thread {
                    let flag = Arc::new(AtomicBool::new(false));
                    let f2 = flag.clone();
                    let mut imm_refused = false;
                    let ran = d.execute_or_delegate(
                        |c| {
                            if c.refuse() {
                                imm_refused = true;
                                return false;
                            }
                            c.take((t, seq, flag.clone()));
                            true
                        },
                        || (t, seq, f2),
                    );
                    if ran {
                        assert!(
                            flag.load(Ordering::Acquire),
                            "reported inline but not executed"
                        );
                        inline_count.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = imm_refused;
                }
            })
        })
        .collect();
    for h in hs {
        h.join();
    }
    d.stop_consumer();
    let g = d.lock();
    assert_eq!(
        g.executed,
        threads as u64 * per_thread,
        "every request executed once"
    );
    assert!(g.next.iter().all(|&n| n == per_thread));
    let refusals = g.refusals;
    drop(g);
    (inline_count.load(Ordering::Relaxed) as u64, refusals)
}

type Mcs = McsQueue<Entry<Checker, Ult>>;
type Ring = RingQueue<Entry<Checker, Ult>, 16>;

#[test]
fn fifty_threads_every_request_exactly_once() {
    with_timeout(300, || {
        for workers in [1, 2, 4] {
            let rt = Runtime::builder().workers(workers).build().unwrap();
            let (inline, refusals) = rt.block_on(|| stress::<Ult, Mcs>(50, 20_000, 5, true));
            assert!(refusals > 0, "refusals were exercised");
            assert!(inline > 0);
            let (inline_r, _) = rt.block_on(|| stress::<Ult, Ring>(50, 20_000, 5, true));
            assert!(inline_r > 0);
            eprintln!("{workers} workers: {inline} / {inline_r} inline of 10^6");
        }
    });
}

#[test]
fn contended_requests_are_delegated() {
    with_timeout(120, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        let (inline, _) = rt.block_on(|| stress::<Ult, Mcs>(8, 50_000, 0, true));
        assert!(
            inline < 8 * 50_000,
            "with two workers some requests are delegated"
        );
    });
}

#[test]
fn without_consumer_holders_execute() {
    with_timeout(120, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        let (inline, _) = rt.block_on(|| stress::<Ult, Mcs>(16, 5_000, 5, false));
        // Without a consumer thread every request runs before its call returns.
        assert_eq!(inline, 16 * 5_000);
        let (inline, _) = rt.block_on(|| stress::<Ult, Ring>(16, 5_000, 5, false));
        assert_eq!(inline, 16 * 5_000);
    });
}

#[test]
fn os_threads() {
    with_timeout(120, || {
        let (_, _) = stress::<OsThreads, McsQueue<Entry<Checker, OsThreads>>>(6, 5_000, 5, true);
        let (_, _) =
            stress::<OsThreads, RingQueue<Entry<Checker, OsThreads>, 8>>(6, 5_000, 5, true);
    });
}

/// A consumer that counts.
struct Count(u64);
impl<U: UltItf> Consumer<U> for Count {
    type Request = u64;
    fn execute(&mut self, n: u64) -> Result<(), u64> {
        self.0 += n;
        Ok(())
    }
}

#[test]
fn start_and_stop_consumers_10k_times() {
    with_timeout(300, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            let d = Arc::new(Delegator::<Count>::new(Count(0)));
            for i in 0..10_000u64 {
                d.start_consumer();
                assert!(d.is_consumer_running());
                d.execute_or_delegate(
                    |c| {
                        c.0 += 1;
                        true
                    },
                    || 1,
                );
                if i % 3 == 0 {
                    // A concurrent requester while the consumer runs.
                    let d2 = d.clone();
                    ct_worker::spawn(move || {
                        d2.execute_or_delegate(
                            |c| {
                                c.0 += 1;
                                true
                            },
                            || 1,
                        );
                    })
                    .join();
                }
                d.stop_consumer();
                assert!(!d.is_consumer_running());
            }
            assert_eq!(d.lock().0, 10_000 + 3_334);
        });
    });
}

#[test]
fn locks_exclude_and_mix_with_delegation() {
    with_timeout(120, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            let d = Arc::new(Delegator::<Count>::new(Count(0)));
            d.start_consumer();
            let hs: Vec<_> = (0..16)
                .map(|i| {
                    let d = d.clone();
                    ct_worker::spawn(move || {
                        for _ in 0..2_000 {
                            if i % 2 == 0 {
                                let mut g = d.lock();
                                let v = g.0;
                                ct_worker::yield_now();
                                g.0 = v + 1;
                            } else {
                                if let Some(mut g) = d.lock_or_delegate(|| 1) {
                                    g.0 += 1;
                                }
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join();
            }
            d.stop_consumer();
            assert_eq!(d.lock().0, 16 * 2_000);
            assert!(d.try_lock().is_some());
        });
    });
}

/// A consumer whose requests carry a completion to signal.
struct Signal(u64);
impl<U: UltItf> Consumer<U> for Signal {
    type Request = (u64, CompletionRef<U>);
    fn execute(
        &mut self,
        (n, done): (u64, CompletionRef<U>),
    ) -> Result<(), (u64, CompletionRef<U>)> {
        self.0 += n;
        // SAFETY: the requester waits for this completion.
        unsafe { done.complete() };
        Ok(())
    }
}

#[test]
fn delegate_and_wait_for_completion() {
    with_timeout(120, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            let d = Arc::new(Delegator::<Signal>::new(Signal(0)));
            d.start_consumer();
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    let d = d.clone();
                    ct_worker::spawn(move || {
                        for _ in 0..2_000 {
                            let before;
                            match d.lock_or_delegate_and_wait(|done| (1, done)) {
                                Some(mut g) => {
                                    before = g.0;
                                    g.0 += 1;
                                }
                                None => before = 0,
                            }
                            let _ = before;
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join();
            }
            d.stop_consumer();
            assert_eq!(d.lock().0, 8 * 2_000);
        });
    });
}

#[test]
fn full_ring_makes_producers_retry() {
    with_timeout(120, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            type Tiny = RingQueue<Entry<Count, Ult>, 2>;
            let d = Arc::new(Delegator::<Count, Ult, Tiny>::new(Count(0)));
            d.start_consumer();
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    let d = d.clone();
                    ct_worker::spawn(move || {
                        for _ in 0..2_000 {
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
            assert_eq!(d.lock().0, 16 * 2_000);
        });
    });
}

#[test]
fn unlock_and_wait_releases_and_parks() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            let d = Arc::new(Delegator::<Count>::new(Count(0)));
            let slot = Arc::new(ct_worker::SuspendedThread::new());
            let released = Arc::new(AtomicBool::new(false));
            let (d2, s2, r2) = (d.clone(), slot.clone(), released.clone());
            let waker = ct_worker::spawn(move || {
                let mut woken = 0;
                while woken < 1_000 {
                    let g = d2.lock();
                    if r2.swap(false, Ordering::Relaxed) {
                        assert!(
                            s2.notify(),
                            "the waiter was not parked when the lock was released"
                        );
                        woken += 1;
                    }
                    drop(g);
                    ct_worker::yield_now();
                }
            });
            for _ in 0..1_000 {
                d.lock_raw_unguarded();
                released.store(true, Ordering::Relaxed);
                // SAFETY: locked just above.
                unsafe { d.unlock_and_wait(&slot) };
            }
            waker.join();
        });
    });
}
