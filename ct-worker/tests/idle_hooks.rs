//! Idle hooks: when a worker runs them, how often, in which mode, and where.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::with_timeout;
use ct_worker::{IdleHook, IdleMode, OsThreads, Runtime, SuspendedThread, Ult, UltItf};

/// What a test hook records, and the thread it wakes.
#[derive(Default)]
struct Probe {
    /// Runs in `Poll` and `Sleep` mode.
    polls: AtomicUsize,
    sleeps: AtomicUsize,
    /// Poll runs to report "not done" before waking `slot` (`usize::MAX`:
    /// never, wake only in `Sleep` mode).
    polls_before_done: AtomicUsize,
    /// The worker the hook last ran on (+1; 0: never ran).
    worker: AtomicUsize,
    slot: SuspendedThread,
}

/// The test hook: counts its runs, then wakes the probe's thread and
/// reports done (in `Sleep` mode at once; in `Poll` mode after
/// `polls_before_done` runs).
///
/// # Safety
///
/// `data` is a live `Probe`.
unsafe fn probe_hook(data: *const (), mode: IdleMode) -> bool {
    // SAFETY: per the contract.
    let p = unsafe { &*data.cast::<Probe>() };
    let worker = ct_worker::current_worker_index().expect("hooks run on workers");
    p.worker.store(worker + 1, Ordering::SeqCst);
    let done = match mode {
        IdleMode::Poll => {
            p.polls.fetch_add(1, Ordering::SeqCst) + 1 >= p.polls_before_done.load(Ordering::SeqCst)
        }
        IdleMode::Sleep => {
            p.sleeps.fetch_add(1, Ordering::SeqCst);
            true
        }
    };
    if done {
        // The probe's thread parked before the worker went idle.
        assert!(p.slot.notify(), "the hook ran before its thread parked");
    }
    done
}

/// Queues a hook on the caller's worker that wakes the caller, parks, and
/// returns the probe once woken.
fn park_with_hook(polls_before_done: usize, before_park: impl FnOnce(&Probe)) -> Arc<Probe> {
    let probe = Arc::new(Probe::default());
    probe
        .polls_before_done
        .store(polls_before_done, Ordering::SeqCst);
    let hook = Box::new(IdleHook::new(probe_hook));
    // SAFETY: a fresh hook; it and the probe live until the hook reports
    // done, which is what wakes this thread (both are dropped after).
    assert!(unsafe { <Ult>::defer_until_idle(&hook, Arc::as_ptr(&probe).cast()) });
    before_park(&probe);
    probe.slot.wait();
    drop(hook);
    probe
}

/// A queued hook does not run while its worker has runnable threads (here
/// a child thread and then the parent itself), only once the worker runs
/// out of them, and a hook that reports done runs no more.
#[test]
fn a_hook_runs_once_its_worker_has_nothing_else_to_run() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            let probe = park_with_hook(1, |p| {
                // Runs at once (work-first), while this thread waits in
                // the deque: the worker is not idle. (A yield would make it
                // idle: yielded threads go to the global queue, which the
                // worker looks at after its hooks.)
                ct_worker::spawn(|| {
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_millis(2) {
                        std::hint::spin_loop();
                    }
                })
                .join();
                assert_eq!(p.polls.load(Ordering::SeqCst), 0, "ran while work was left");
            });
            assert_eq!(probe.polls.load(Ordering::SeqCst), 1);
            // Idle again, for a while: the hook is no longer queued.
            ct_worker::spawn(|| std::thread::sleep(std::time::Duration::from_millis(5))).join();
            assert_eq!(
                probe.polls.load(Ordering::SeqCst),
                1,
                "ran after it was done"
            );
            assert_eq!(probe.sleeps.load(Ordering::SeqCst), 0);
        });
    });
}

/// A hook that is not done is run again while its worker idles, and in
/// `Sleep` mode before the worker sleeps.
#[test]
fn a_pending_hook_is_polled_and_then_told_the_worker_sleeps() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            let probe = park_with_hook(usize::MAX, |_| {});
            assert!(
                probe.polls.load(Ordering::SeqCst) >= 2,
                "polled {} times",
                probe.polls.load(Ordering::SeqCst)
            );
            assert_eq!(probe.sleeps.load(Ordering::SeqCst), 1);
        });
    });
}

/// A hook runs on the worker of the thread that queued it, on every worker
/// of a multi-worker runtime.
#[test]
fn a_hook_runs_on_the_worker_that_queued_it() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            for _ in 0..200 {
                let hs: Vec<_> = (0..4)
                    .map(|_| {
                        ct_worker::spawn(|| {
                            let mut queued_on = usize::MAX;
                            let probe = park_with_hook(3, |_| {
                                queued_on = ct_worker::current_worker_index().unwrap();
                            });
                            assert_eq!(probe.worker.load(Ordering::SeqCst), queued_on + 1);
                            assert!(probe.polls.load(Ordering::SeqCst) >= 3);
                        })
                    })
                    .collect();
                for h in hs {
                    h.join();
                }
            }
        });
    });
}

/// Only workers run hooks: elsewhere nothing is queued.
#[test]
fn only_workers_take_hooks() {
    let hook = IdleHook::new(probe_hook);
    // SAFETY: not queued (refused), so never run.
    assert!(!unsafe { ct_worker::defer_until_idle(&hook, std::ptr::null()) });
    assert!(!<Ult>::runs_idle_hooks());
    assert!(!OsThreads::runs_idle_hooks());
    let rt = Runtime::builder().workers(1).build().unwrap();
    assert!(rt.block_on(<Ult>::runs_idle_hooks));
}

/// A worker told to stay awake keeps polling its hooks for that long before
/// it sleeps (the hook's `Sleep` run, which ends the park here, comes no
/// earlier), and a runtime's stay-awake time can be changed while it runs.
#[test]
fn a_worker_told_to_stay_awake_sleeps_no_earlier() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(1).build().unwrap();
        assert_eq!(rt.stay_awake(), std::time::Duration::ZERO);
        let awake = std::time::Duration::from_millis(40);
        rt.set_stay_awake(awake);
        assert_eq!(rt.stay_awake(), awake);
        rt.block_on(|| {
            for _ in 0..3 {
                let t = std::time::Instant::now();
                let probe = park_with_hook(usize::MAX, |_| {});
                let parked = t.elapsed();
                assert_eq!(probe.sleeps.load(Ordering::SeqCst), 1);
                assert!(
                    parked >= awake,
                    "slept after {parked:?}, told to stay awake {awake:?}"
                );
            }
        });
        // Back to the default: a short idle spell, then sleep (the hook's
        // `Sleep` run) — which the test above also checks.
        rt.set_stay_awake(std::time::Duration::ZERO);
        rt.block_on(|| {
            let probe = park_with_hook(usize::MAX, |_| {});
            assert_eq!(probe.sleeps.load(Ordering::SeqCst), 1);
        });
    });
}

/// A thread may wait awake only on a worker of a runtime that keeps idle
/// workers awake, and only while no other thread of its worker is ready.
#[test]
fn may_wait_awake_only_alone_on_a_worker_kept_awake() {
    with_timeout(60, || {
        assert!(!<Ult>::may_wait_awake(), "not on a worker");
        assert!(!OsThreads::may_wait_awake());
        let rt = Runtime::builder().workers(1).build().unwrap();
        assert!(
            !rt.block_on(<Ult>::may_wait_awake),
            "workers sleep when idle"
        );
        rt.set_stay_awake(std::time::Duration::from_millis(1));
        rt.block_on(|| {
            assert!(<Ult>::may_wait_awake(), "alone on an awake worker");
            // A spawned thread runs at once; its parent waits in the deque.
            let h = <Ult>::spawn(<Ult>::may_wait_awake);
            assert!(!h.join(), "the parent was ready to run");
            assert!(<Ult>::may_wait_awake(), "alone again");
        });
    });
}
