//! Dynamic offloading: every command posted and called back exactly once,
//! executors that come and go, a device that refuses when full.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ct_delegate::{Device, Offloader, Tag};
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

/// A device with a bounded hardware queue that completes a command after it
/// has been polled a few times, and that panics if used concurrently.
struct Emulated {
    queue: VecDeque<(Tag, u32)>,
    capacity: usize,
    busy: AtomicU8,
    posted: usize,
    refused: usize,
}

impl Emulated {
    fn new(capacity: usize) -> Self {
        Emulated {
            queue: VecDeque::new(),
            capacity,
            busy: AtomicU8::new(0),
            posted: 0,
            refused: 0,
        }
    }

    fn enter(&self) {
        assert_eq!(
            self.busy.swap(1, Ordering::AcqRel),
            0,
            "device used concurrently"
        );
    }

    fn leave(&self) {
        self.busy.store(0, Ordering::Release);
    }
}

impl Device for Emulated {
    type Command = usize;

    fn post(&mut self, cmd: usize, tag: Tag) -> Result<(), usize> {
        self.enter();
        let r = if self.queue.len() >= self.capacity {
            self.refused += 1;
            Err(cmd)
        } else {
            self.posted += 1;
            self.queue.push_back((tag, 3));
            Ok(())
        };
        self.leave();
        r
    }

    fn poll(&mut self) -> Option<Tag> {
        self.enter();
        let r = match self.queue.front_mut() {
            Some((_, 0)) => self.queue.pop_front().map(|(t, _)| t),
            Some((_, n)) => {
                *n -= 1;
                None
            }
            None => None,
        };
        self.leave();
        r
    }
}

fn run<U: UltItf>(requesters: usize, per: usize) {
    let off = Offloader::<Emulated, U>::new(Emulated::new(8), 32);
    let calls: Arc<Vec<AtomicU8>> =
        Arc::new((0..requesters * per).map(|_| AtomicU8::new(0)).collect());
    let hs: Vec<_> = (0..requesters)
        .map(|r| {
            let (off, calls) = (off.clone(), calls.clone());
            U::spawn(move || {
                for i in 0..per {
                    let id = r * per + i;
                    let calls = calls.clone();
                    off.submit(id, move || {
                        let old = calls[id].fetch_add(1, Ordering::AcqRel);
                        assert_eq!(old, 0, "callback of command {id} ran twice");
                    });
                }
            })
        })
        .collect();
    for h in hs {
        h.join();
    }
    let start = Instant::now();
    while calls.iter().any(|c| c.load(Ordering::Acquire) == 0) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "commands were lost"
        );
        U::yield_now();
    }
    while off.is_executor_running() || off.in_flight() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "an executor or completer never exited"
        );
        U::yield_now();
    }
    let (posted, refused) = off.with_device(|d| (d.posted, d.refused));
    assert_eq!(posted, requesters * per, "every command posted once");
    assert!(refused > 0, "the full device queue was exercised");
}

#[test]
fn every_command_completes_once_on_ults() {
    with_timeout(120, || {
        for workers in [1, 2, 4] {
            let rt = Runtime::builder().workers(workers).build().unwrap();
            rt.block_on(|| run::<Ult>(8, 10_000));
        }
    });
}

#[test]
fn every_command_completes_once_on_os_threads() {
    with_timeout(120, || run::<OsThreads>(4, 5_000));
}

#[test]
fn executors_come_and_go() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            let off = Offloader::<Emulated, Ult>::new(Emulated::new(8), 8);
            let done = Arc::new(AtomicUsize::new(0));
            for round in 1..=20 {
                let d = done.clone();
                off.submit(round, move || {
                    d.fetch_add(1, Ordering::AcqRel);
                });
                while done.load(Ordering::Acquire) < round
                    || off.is_executor_running()
                    || off.in_flight() > 0
                {
                    ct_worker::yield_now();
                }
                assert_eq!(
                    off.executors_spawned(),
                    round,
                    "a drained queue's executor exits; the next command starts a new one"
                );
            }
        });
    });
}
