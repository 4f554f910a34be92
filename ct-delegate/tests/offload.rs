//! Dynamic offloading: every command posted and called back exactly once,
//! executors that come and go, a device that refuses when full, takes only
//! part of a batch or refuses at random, and an executor that batches.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ct_delegate::{Device, Offloader, PostBatch, Tag};
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

/// A device with a bounded hardware queue that completes a command after
/// three device polls, and that panics if used concurrently. Its batched
/// calls post what fits in one call and report every completed command; with
/// a random source it also takes only part of a batch or refuses it at
/// random, sometimes after taking a command (which it gives back).
struct Emulated {
    /// Posted commands in post order, with the polls left until complete.
    queue: VecDeque<(Tag, u32)>,
    capacity: usize,
    busy: AtomicU8,
    /// Times each command (a `usize` id) was posted.
    posts: Vec<u8>,
    posted: usize,
    /// Calls that left commands unposted (single posts refused, batches
    /// taken in part or not at all).
    refused: usize,
    /// Device calls that posted (single or batched), and commands posted in
    /// batched calls.
    post_calls: usize,
    batched: usize,
    /// Random partial acceptance and refusals (an xorshift state).
    rng: Option<u64>,
    /// Commands per requester (ids `r * per ..`), to check that each
    /// requester's commands are posted in the order it submitted them.
    per: usize,
    /// The last command posted of each requester.
    last: Vec<Option<usize>>,
}

impl Emulated {
    fn new(capacity: usize, rng: Option<u64>) -> Self {
        Emulated {
            queue: VecDeque::new(),
            capacity,
            busy: AtomicU8::new(0),
            posts: Vec::new(),
            posted: 0,
            refused: 0,
            post_calls: 0,
            batched: 0,
            rng,
            per: usize::MAX,
            last: Vec::new(),
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

    fn random(&mut self) -> Option<u64> {
        let x = self.rng.as_mut()?;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        Some(*x)
    }

    fn accept(&mut self, cmd: usize, tag: Tag) {
        if self.posts.len() <= cmd {
            self.posts.resize(cmd + 1, 0);
        }
        let r = cmd / self.per;
        if self.last.len() <= r {
            self.last.resize(r + 1, None);
        }
        if let Some(prev) = self.last[r] {
            assert!(prev < cmd, "command {cmd} posted after {prev}");
        }
        self.last[r] = Some(cmd);
        self.posts[cmd] += 1;
        self.posted += 1;
        self.queue.push_back((tag, 3));
    }

    /// One poll's worth of progress: every queued command ages by one poll.
    fn age(&mut self) {
        for (_, n) in &mut self.queue {
            *n = n.saturating_sub(1);
        }
    }

    fn pop_ready(&mut self) -> Option<Tag> {
        match self.queue.front() {
            Some(&(tag, 0)) => {
                self.queue.pop_front();
                Some(tag)
            }
            _ => None,
        }
    }
}

impl Device for Emulated {
    type Command = usize;

    fn post(&mut self, cmd: usize, tag: Tag) -> Result<(), usize> {
        self.enter();
        self.post_calls += 1;
        let r = if self.queue.len() >= self.capacity {
            self.refused += 1;
            Err(cmd)
        } else {
            self.accept(cmd, tag);
            Ok(())
        };
        self.leave();
        r
    }

    fn poll(&mut self) -> Option<Tag> {
        self.enter();
        self.age();
        let r = self.pop_ready();
        self.leave();
        r
    }

    fn post_batch(&mut self, batch: &mut PostBatch<'_, usize>) {
        self.enter();
        self.post_calls += 1;
        // How many this call accepts at most (0: refuses the batch).
        let limit = match self.random() {
            Some(r) if r % 5 == 0 => 0,
            Some(r) => 1 + (r >> 8) as usize % 3,
            None => usize::MAX,
        };
        let mut n = 0;
        while !batch.is_empty() {
            let full = self.queue.len() >= self.capacity || n >= limit;
            if full && self.random().is_some_and(|r| r % 2 == 0) {
                // Stop before taking the next command.
                break;
            }
            let (cmd, tag) = batch.take().expect("not empty");
            if full {
                // Found out only after taking it: give it back.
                batch.give_back(cmd);
                break;
            }
            self.accept(cmd, tag);
            n += 1;
        }
        assert_eq!(batch.taken(), n, "taken() counts the commands posted");
        self.batched += n;
        if !batch.is_empty() {
            self.refused += 1;
        }
        self.leave();
    }

    fn poll_batch(&mut self, tags: &mut [Tag]) -> usize {
        self.enter();
        self.age();
        let mut n = 0;
        while n < tags.len() {
            let Some(tag) = self.pop_ready() else { break };
            tags[n] = tag;
            n += 1;
        }
        self.leave();
        n
    }
}

/// The same device without batched calls: the offloader uses the trait's
/// default `post_batch` and `poll_batch`.
struct SingleOnly(Emulated);

impl Device for SingleOnly {
    type Command = usize;

    fn post(&mut self, cmd: usize, tag: Tag) -> Result<(), usize> {
        self.0.post(cmd, tag)
    }

    fn poll(&mut self) -> Option<Tag> {
        self.0.poll()
    }
}

/// Access to the emulation's counters.
trait Counters: Device<Command = usize> {
    fn emu(&mut self) -> &mut Emulated;
}

impl Counters for Emulated {
    fn emu(&mut self) -> &mut Emulated {
        self
    }
}

impl Counters for SingleOnly {
    fn emu(&mut self) -> &mut Emulated {
        &mut self.0
    }
}

/// What a run saw on the device.
#[derive(Debug)]
struct Seen {
    refused: usize,
    post_calls: usize,
    batched: usize,
}

/// `requesters` threads submit `per` commands each to `dev` through an
/// offloader with a queue of `queue` entries; checks that each command was
/// posted once, each requester's in order, and called back once, and that
/// the executor and completer exit.
fn run<U: UltItf, D: Counters>(mut dev: D, queue: usize, requesters: usize, per: usize) -> Seen {
    dev.emu().per = per;
    let off = Offloader::<D, U>::new(dev, queue);
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
    off.with_device(|d| {
        let e = d.emu();
        assert_eq!(e.posted, requesters * per, "every command posted once");
        assert_eq!(e.posts.len(), requesters * per);
        if let Some(id) = e.posts.iter().position(|&n| n != 1) {
            panic!("command {id} was posted {} times", e.posts[id]);
        }
        assert!(e.queue.is_empty(), "every posted command completed");
        Seen {
            refused: e.refused,
            post_calls: e.post_calls,
            batched: e.batched,
        }
    })
}

#[test]
fn every_command_completes_once_on_ults() {
    with_timeout(120, || {
        for workers in [1, 2, 4] {
            let rt = Runtime::builder().workers(workers).build().unwrap();
            let seen = rt.block_on(|| run::<Ult, _>(Emulated::new(8, None), 32, 8, 10_000));
            assert!(seen.refused > 0, "the full device queue was exercised");
        }
    });
}

#[test]
fn every_command_completes_once_on_os_threads() {
    with_timeout(120, || {
        let seen = run::<OsThreads, _>(Emulated::new(8, None), 32, 4, 5_000);
        assert!(seen.refused > 0, "the full device queue was exercised");
    });
}

/// A device that takes only part of a batch, refuses whole batches and
/// gives back a command it took, all at random: every command is still
/// posted once, in a later call, and called back once.
#[test]
fn partial_and_random_refusals_lose_and_repeat_nothing() {
    with_timeout(120, || {
        for (workers, seed) in [(1, 0x9e37_79b9_7f4a_7c15), (2, 0x2545_f491_4f6c_dd1d)] {
            let rt = Runtime::builder().workers(workers).build().unwrap();
            let seen =
                rt.block_on(move || run::<Ult, _>(Emulated::new(8, Some(seed)), 32, 8, 5_000));
            assert!(seen.refused > 0, "batches were refused or cut short");
        }
        let seen = run::<OsThreads, _>(Emulated::new(8, Some(12345)), 16, 4, 3_000);
        assert!(seen.refused > 0, "batches were refused or cut short");
    });
}

/// A device with only single `post` and `poll`: the trait's default batched
/// calls post each command once, stop at a refusal, and report completions.
#[test]
fn default_batched_calls_on_a_single_call_device() {
    with_timeout(120, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        let seen = rt.block_on(|| run::<Ult, _>(SingleOnly(Emulated::new(8, None)), 32, 8, 5_000));
        assert!(seen.refused > 0, "the full device queue was exercised");
        assert_eq!(seen.batched, 0, "posted through single calls");
        assert!(seen.post_calls >= 8 * 5_000);
    });
}

/// With requesters that submit faster than the device drains (one worker:
/// the executor runs only when the requesters yield at a full queue), the
/// executor hands the device several commands per call.
#[test]
fn executor_posts_several_commands_per_device_call() {
    with_timeout(120, || {
        let rt = Runtime::builder().workers(1).build().unwrap();
        let seen = rt.block_on(|| run::<Ult, _>(Emulated::new(64, None), 64, 4, 5_000));
        assert_eq!(seen.batched, 4 * 5_000, "every post was a batched call");
        assert!(
            seen.post_calls * 2 <= seen.batched,
            "{} device calls for {} commands: the executor does not batch",
            seen.post_calls,
            seen.batched
        );
    });
}

/// `PostBatch` hands out a prefix in order and takes back the last command.
#[test]
fn post_batch_takes_a_prefix_and_gives_back_the_last() {
    let mut q: VecDeque<(char, Tag)> = [('a', 10), ('b', 11), ('c', 12)].into();
    {
        let mut b = PostBatch::new(&mut q);
        assert_eq!(b.peek(), Some((&'a', 10)));
        assert_eq!(b.take(), Some(('a', 10)));
        assert_eq!(b.take(), Some(('b', 11)));
        b.give_back('b');
        assert_eq!((b.taken(), b.len()), (1, 2));
        assert_eq!(b.peek(), Some((&'b', 11)));
    }
    assert_eq!(q, VecDeque::from([('b', 11), ('c', 12)]));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut b = PostBatch::new(&mut q);
        b.take();
        b.give_back('x');
        // A second give-back without a take in between.
        b.give_back('y');
    }));
    assert!(r.is_err(), "only the command taken last can be given back");
}

#[test]
fn executors_come_and_go() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            let off = Offloader::<Emulated, Ult>::new(Emulated::new(8, None), 8);
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
