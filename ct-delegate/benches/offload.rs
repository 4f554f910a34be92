//! `offload`: latency, overhead and message rate of requests to a
//! non-thread-safe device (Endo 2020 §4.4, Listings 4.6 and 4.7), for three
//! ways of sharing the device between requester user-level threads:
//!
//! - **direct injection** — requesters lock the device (a ct-sync spinlock)
//!   and post themselves, one command per lock hold (a requester has one
//!   command). Completions are polled under the same lock either by a
//!   completer OS thread, as in the seed (`direct-completer`), or by the
//!   waiting requesters themselves (`direct-selfpoll`, no extra thread);
//! - **static offloading** (`static`) — one dedicated OS thread takes what is
//!   in a bounded lock-free queue (`std::sync::mpsc::sync_channel`), up to
//!   `ct_delegate::offload::BATCH` commands, posts it with one device call,
//!   and polls completions, always awake;
//! - **dynamic offloading** (`dynamic`) — `ct_delegate::Offloader`: the
//!   executor and completer are user-level threads spawned on demand; the
//!   executor posts up to a batch of commands per device call.
//!
//! The device is emulated with the cost model of a doorbell-batched NIC
//! (`ibv_post_send` with a chain of work requests, `ibv_poll_cq` for up to
//! `n` completions): a device call busy-waits a fixed time (300 ns by
//! default for `post` and `poll`) plus a small time for each command beyond
//! the first that it posts or reports (20 ns by default). Every method polls
//! with batched calls. A command becomes pollable a fixed latency after its
//! post, and an "in use" flag aborts the process if device calls ever
//! overlap. Every run checks that each command was posted and completed once
//! and that each callback ran once.
//!
//! Output: JSON lines (bench `offload`, `params.metric` = `latency`,
//! `overhead` or `rate`), one per method and configuration, plus the paired
//! ratios dynamic/direct (methods are interleaved run by run, so each ratio
//! compares runs that saw the same machine noise). A summary against the
//! issue's target goes to stderr.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, TryRecvError, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ct_bench::{Args, Param, Stats, emit};
use ct_delegate::offload::BATCH;
use ct_delegate::{Callback, Device, Offloader, PostBatch, Tag};
use ct_sync::SpinLock;
use ct_worker::Runtime;

const HELP: &str = "\
offload [--requesters 1,2,4,8] [--workers 1,2] [--runs 7] [--run-ms 25]
        [--batch 256] [--post-ns 300] [--post-item-ns 20] [--poll-ns 300]
        [--poll-item-ns 20] [--latency-ns 2000] [--depth 4096] [--queue 1024]
        [--metrics latency,rate]
        [--methods direct-completer,direct-selfpoll,static,dynamic] [--quick]

Requests from N requester user-level threads to an emulated non-thread-safe
device, on a ct-worker runtime with 1 and 2 workers. The device's cost model
is a doorbell-batched NIC's: a post call busy-waits --post-ns plus
--post-item-ns per command beyond the first that it posts (a full device
refuses at once); a poll call busy-waits --poll-ns plus --poll-item-ns per
completion beyond the first that it reports; a command completes --latency-ns
after its post; at most --depth commands in flight. Methods, interleaved run
by run (all poll with batched calls, up to 32 completions per call):
  direct-completer  requesters post, one command per call, under a spinlock;
                    a completer OS thread polls under it (the seed's direct
                    injection);
  direct-selfpoll   requesters post, and poll while they wait, under the
                    spinlock (no extra thread);
  static            a dedicated, always-awake OS thread takes what is in a
                    bounded queue (--queue), up to 32 commands, posts it with
                    one call, and polls;
  dynamic           ct_delegate::Offloader (command queue of --queue entries):
                    executor and completer ULTs spawned on demand; the
                    executor posts up to 32 queued commands per call.
Metrics (each run lasts --run-ms, plus the wait for outstanding requests):
  latency, overhead  Listing 4.6: each requester submits one request and waits
                     for its callback, repeatedly; ns per request from submit to
                     callback (latency) and for the submit alone (overhead);
  rate               Listing 4.7: each requester keeps up to --batch requests
                     in flight; completed requests per second (Mmsg/s).
Each figure: one warm-up, then --runs runs (min/median/max). Lines with impl
dynamic/direct-* (unit ratio) are per-run paired ratios. --quick: 5 runs of
10 ms. The defaults (the seed's batch of 256, 1..8 requesters, 1 and 2
workers) take about 15 s on a 2-core machine. Exits non-zero if a request is
lost or duplicated, or the device is used by two threads at once.
Target (issue 5): with >= 4 requesters, dynamic >= 2x the message rate of
direct injection.";

/// Parameters of the emulated device.
#[derive(Debug, Clone, Copy)]
struct DevParams {
    /// Busy time of one post call.
    post: Duration,
    /// Extra busy time of a post call per command beyond the first.
    post_item: Duration,
    /// Busy time of one poll call.
    poll: Duration,
    /// Extra busy time of a poll call per completion beyond the first.
    poll_item: Duration,
    /// Time from a post until the command can be polled as complete.
    latency: Duration,
    /// Commands in flight at most; `post` refuses beyond.
    depth: usize,
}

/// Busy-waits for `d` (the emulated cost of a device call).
fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        core::hint::spin_loop();
    }
}

/// An emulated device whose calls must never run concurrently.
struct EmuDevice {
    p: DevParams,
    /// Set while a device call runs; an overlap aborts the process.
    in_use: AtomicBool,
    /// Posted commands in post order, with the instant they complete.
    pending: VecDeque<(Tag, Instant)>,
    posted: u64,
    completed: u64,
    /// Post calls that posted something (single or batched).
    post_calls: u64,
    /// Poll calls (single or batched), successful or not.
    polls: u64,
    /// Wrapping sum of the posted command values (a checksum).
    sum: u64,
}

impl EmuDevice {
    fn new(p: DevParams) -> Self {
        EmuDevice {
            p,
            in_use: AtomicBool::new(false),
            pending: VecDeque::with_capacity(p.depth),
            posted: 0,
            completed: 0,
            post_calls: 0,
            polls: 0,
            sum: 0,
        }
    }

    fn enter(&self) {
        if self.in_use.swap(true, Ordering::AcqRel) {
            eprintln!("offload: the emulated device was used by two threads at once");
            std::process::abort();
        }
    }

    fn leave(&self) {
        self.in_use.store(false, Ordering::Release);
    }

    /// Extra cost of a call that handles `n` commands or completions.
    fn extra(item: Duration, n: usize) -> Duration {
        item * n.saturating_sub(1) as u32
    }

    fn push(&mut self, cmd: u64, tag: Tag, ready: Instant) {
        self.pending.push_back((tag, ready));
        self.posted += 1;
        self.sum = self.sum.wrapping_add(cmd);
    }

    /// Pops up to `tags.len()` completed commands (completion is in post
    /// order: every command has the same latency) after the call's busy
    /// time, which grows with their number.
    fn take_completed(&mut self, tags: &mut [Tag]) -> usize {
        busy(self.p.poll);
        self.polls += 1;
        let now = Instant::now();
        let n = self
            .pending
            .iter()
            .take(tags.len())
            .take_while(|&&(_, ready)| ready <= now)
            .count();
        busy(Self::extra(self.p.poll_item, n));
        for (t, (tag, _)) in tags.iter_mut().zip(self.pending.drain(..n)) {
            *t = tag;
        }
        self.completed += n as u64;
        n
    }
}

impl Device for EmuDevice {
    type Command = u64;

    fn post(&mut self, cmd: u64, tag: Tag) -> Result<(), u64> {
        self.enter();
        // A full device refuses at once (like a full send queue).
        let r = if self.pending.len() >= self.p.depth {
            Err(cmd)
        } else {
            busy(self.p.post);
            self.post_calls += 1;
            self.push(cmd, tag, Instant::now() + self.p.latency);
            Ok(())
        };
        self.leave();
        r
    }

    fn poll(&mut self) -> Option<Tag> {
        self.enter();
        let mut tag = [0];
        let n = self.take_completed(&mut tag);
        self.leave();
        (n == 1).then_some(tag[0])
    }

    /// One call: takes what fits in the device and pays the call's cost
    /// once, plus the per-command cost beyond the first (a chain of work
    /// requests and one doorbell). A full device refuses at once.
    fn post_batch(&mut self, batch: &mut PostBatch<'_, u64>) {
        self.enter();
        let n = batch.len().min(self.p.depth - self.pending.len());
        if n > 0 {
            busy(self.p.post + Self::extra(self.p.post_item, n));
            self.post_calls += 1;
            let ready = Instant::now() + self.p.latency;
            for _ in 0..n {
                let (cmd, tag) = batch.take().expect("n <= batch.len()");
                self.push(cmd, tag, ready);
            }
        }
        self.leave();
    }

    /// One call for up to `tags.len()` completions.
    fn poll_batch(&mut self, tags: &mut [Tag]) -> usize {
        self.enter();
        let n = self.take_completed(tags);
        self.leave();
        n
    }
}

/// Callbacks of the completions one batched poll reports.
type Completed = [Option<Callback>; BATCH];

/// The device with a tag → callback table, for the methods that drive it
/// without `Offloader` (direct injection and static offloading).
struct Tagged {
    dev: EmuDevice,
    callbacks: Vec<Option<Callback>>,
    free: Vec<Tag>,
    in_flight: usize,
}

impl Tagged {
    fn new(dev: EmuDevice) -> Self {
        Tagged {
            dev,
            callbacks: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
        }
    }

    fn tag(&mut self, cb: Callback) -> Tag {
        let tag = self.free.pop().unwrap_or_else(|| {
            self.callbacks.push(None);
            self.callbacks.len() - 1
        });
        self.callbacks[tag] = Some(cb);
        tag
    }

    /// Posts `cmd` with one device call; gives it back with its callback if
    /// the device is full.
    fn post(&mut self, cmd: u64, cb: Callback) -> Result<(), (u64, Callback)> {
        let tag = self.tag(cb);
        match self.dev.post(cmd, tag) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(cmd) => {
                self.free.push(tag);
                let cb = self.callbacks[tag].take().expect("set above");
                Err((cmd, cb))
            }
        }
    }

    /// Adds `cmd` to `staged`, the commands for the next
    /// [`Tagged::post_staged`].
    fn stage(&mut self, staged: &mut VecDeque<(u64, Tag)>, cmd: u64, cb: Callback) {
        let tag = self.tag(cb);
        staged.push_back((cmd, tag));
    }

    /// Posts a prefix of `staged` with one device call (what the device does
    /// not take stays there); returns how many were posted.
    fn post_staged(&mut self, staged: &mut VecDeque<(u64, Tag)>) -> usize {
        if staged.is_empty() {
            return 0;
        }
        let mut batch = PostBatch::new(staged);
        self.dev.post_batch(&mut batch);
        let n = batch.taken();
        self.in_flight += n;
        n
    }

    /// Polls once (one batched device call); puts the callbacks of the
    /// completed commands at the front of `done` and returns how many.
    fn poll(&mut self, done: &mut Completed) -> usize {
        let mut tags = [0; BATCH];
        let n = self.dev.poll_batch(&mut tags);
        for (&tag, cb) in tags[..n].iter().zip(done.iter_mut()) {
            self.free.push(tag);
            *cb = Some(
                self.callbacks[tag]
                    .take()
                    .expect("a completed command has a callback"),
            );
        }
        self.in_flight -= n;
        n
    }
}

/// Runs the first `n` callbacks of `done`.
fn run_callbacks(done: &mut Completed, n: usize) {
    for cb in &mut done[..n] {
        (cb.take().expect("filled by a poll"))();
    }
}

/// How requesters reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    DirectCompleter,
    DirectSelfPoll,
    Static,
    Dynamic,
}

impl Method {
    const ALL: [Method; 4] = [
        Method::DirectCompleter,
        Method::DirectSelfPoll,
        Method::Static,
        Method::Dynamic,
    ];

    fn name(self) -> &'static str {
        match self {
            Method::DirectCompleter => "direct-completer",
            Method::DirectSelfPoll => "direct-selfpoll",
            Method::Static => "static",
            Method::Dynamic => "dynamic",
        }
    }
}

/// The requesters' side of one method.
// One per run, behind an `Arc`: the direct variant's size costs nothing, and
// boxing its device would add an indirection to every direct post.
#[allow(clippy::large_enum_variant)]
enum Chan {
    Direct {
        dev: SpinLock<Tagged>,
        /// Commands in flight (read without the lock by the completer).
        in_flight: AtomicUsize,
        /// Whether waiting requesters poll (otherwise a completer thread).
        self_poll: bool,
    },
    Static {
        tx: mpsc::SyncSender<(u64, Callback)>,
    },
    Dynamic(Arc<Offloader<EmuDevice>>),
}

impl Chan {
    /// Submits `cmd`; `cb` runs when it completes. Yields while the queue or
    /// the device is full.
    fn submit(&self, cmd: u64, cb: impl FnOnce() + Send + 'static) {
        match self {
            Chan::Direct { dev, in_flight, .. } => {
                let mut item: (u64, Callback) = (cmd, Box::new(cb));
                loop {
                    let r = {
                        let mut d = dev.lock();
                        let r = d.post(item.0, item.1);
                        if r.is_ok() {
                            in_flight.fetch_add(1, Ordering::Release);
                        }
                        r
                    };
                    match r {
                        Ok(()) => return,
                        Err(back) => {
                            // Full: completions free room (ours or the
                            // completer's polling).
                            item = back;
                            self.wait_step();
                        }
                    }
                }
            }
            Chan::Static { tx } => {
                let mut item: (u64, Callback) = (cmd, Box::new(cb));
                loop {
                    match tx.try_send(item) {
                        Ok(()) => return,
                        Err(TrySendError::Full(back)) => {
                            item = back;
                            ct_worker::yield_now();
                        }
                        Err(TrySendError::Disconnected(_)) => {
                            fail("the static offloading thread is gone")
                        }
                    }
                }
            }
            Chan::Dynamic(off) => off.submit(cmd, cb),
        }
    }

    /// One step of waiting for completions: yield, or poll the device when
    /// the requesters do the polling.
    fn wait_step(&self) {
        if let Chan::Direct {
            dev,
            in_flight,
            self_poll: true,
        } = self
        {
            // Someone else polling is as good as us polling.
            let mut done: Completed = [const { None }; BATCH];
            let n = dev.try_lock().map_or(0, |mut d| d.poll(&mut done));
            if n > 0 {
                in_flight.fetch_sub(n, Ordering::Release);
                run_callbacks(&mut done, n);
                return;
            }
        }
        ct_worker::yield_now();
    }
}

/// The completer OS thread of `direct-completer`: polls under the device lock
/// while commands are in flight, until `stop`.
fn direct_completer(chan: Arc<Chan>, stop: Arc<AtomicBool>) {
    let Chan::Direct { dev, in_flight, .. } = &*chan else {
        unreachable!()
    };
    let mut done: Completed = [const { None }; BATCH];
    while !stop.load(Ordering::Acquire) {
        if in_flight.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
            continue;
        }
        let n = dev.lock().poll(&mut done);
        if n > 0 {
            in_flight.fetch_sub(n, Ordering::Release);
            run_callbacks(&mut done, n);
        } else {
            std::thread::yield_now();
        }
    }
}

/// The dedicated OS thread of `static`: posts what is queued (up to a batch,
/// with one device call), polls completions and runs callbacks, until `stop`
/// with nothing left in flight. Returns the device for the final checks.
fn static_thread(
    dev: EmuDevice,
    rx: mpsc::Receiver<(u64, Callback)>,
    stop: Arc<AtomicBool>,
) -> EmuDevice {
    let mut t = Tagged::new(dev);
    let mut done: Completed = [const { None }; BATCH];
    // Commands taken from the queue and not yet accepted by the device, in
    // order (their callbacks are in `t`).
    let mut staged = VecDeque::with_capacity(BATCH);
    loop {
        // Top the commands the device has not taken yet up to a batch
        // (bounded, so that completions keep flowing), and post them.
        while staged.len() < BATCH {
            match rx.try_recv() {
                Ok((cmd, cb)) => t.stage(&mut staged, cmd, cb),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let mut progress = t.post_staged(&mut staged) > 0;
        if t.in_flight > 0 {
            let n = t.poll(&mut done);
            run_callbacks(&mut done, n);
            progress |= n > 0;
        }
        if !progress {
            if stop.load(Ordering::Acquire) && t.in_flight == 0 && staged.is_empty() {
                return t.dev;
            }
            std::thread::yield_now();
        }
    }
}

/// One method set up for one run: the requesters' channel and its helper
/// OS thread, if any.
struct Setup {
    chan: Arc<Chan>,
    stop: Arc<AtomicBool>,
    helper: Option<JoinHandle<Option<EmuDevice>>>,
}

impl Setup {
    fn new(m: Method, p: DevParams, queue: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let dev = EmuDevice::new(p);
        let (chan, helper) = match m {
            Method::DirectCompleter | Method::DirectSelfPoll => {
                let chan = Arc::new(Chan::Direct {
                    dev: SpinLock::new(Tagged::new(dev)),
                    in_flight: AtomicUsize::new(0),
                    self_poll: m == Method::DirectSelfPoll,
                });
                let helper = (m == Method::DirectCompleter).then(|| {
                    let (c, s) = (chan.clone(), stop.clone());
                    std::thread::spawn(move || {
                        direct_completer(c, s);
                        None
                    })
                });
                (chan, helper)
            }
            Method::Static => {
                let (tx, rx) = mpsc::sync_channel(queue);
                let s = stop.clone();
                let helper = std::thread::spawn(move || Some(static_thread(dev, rx, s)));
                (Arc::new(Chan::Static { tx }), Some(helper))
            }
            Method::Dynamic => (Arc::new(Chan::Dynamic(Offloader::new(dev, queue))), None),
        };
        Setup { chan, stop, helper }
    }

    /// Stops the helper and checks the device's counters: `expect` commands
    /// posted and completed once each, with command values summing to `sum`.
    /// Returns the device's call counts and the number of executors the
    /// dynamic offloader spawned.
    fn finish(self, expect: u64, sum: u64) -> (Calls, usize) {
        self.stop.store(true, Ordering::Release);
        let from_helper = self.helper.map(|h| h.join().expect("helper thread"));
        let check = |d: &EmuDevice| {
            if d.posted != expect || d.completed != expect || d.sum != sum {
                fail(&format!(
                    "device saw {} posts and {} completions (checksum {}), expected {expect} \
                     (checksum {sum})",
                    d.posted, d.completed, d.sum
                ));
            }
            Calls {
                posts: d.post_calls,
                polls: d.polls,
            }
        };
        match &*self.chan {
            Chan::Direct { dev, .. } => (check(&dev.lock().dev), 0),
            Chan::Static { .. } => (
                check(
                    &from_helper
                        .flatten()
                        .expect("the static thread returns the device"),
                ),
                0,
            ),
            Chan::Dynamic(off) => (off.with_device(|d| check(d)), off.executors_spawned()),
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("offload: check failed: {msg}");
    std::process::exit(1)
}

/// Runs done so far; a watchdog thread exits the process if it stalls
/// (a lost completion would otherwise hang the benchmark).
static PROGRESS: AtomicU64 = AtomicU64::new(0);

fn start_watchdog(limit: Duration) {
    std::thread::spawn(move || {
        let mut last = PROGRESS.load(Ordering::Relaxed);
        let mut since = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = PROGRESS.load(Ordering::Relaxed);
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() > limit {
                fail(&format!(
                    "no run finished in {} s: a request was lost",
                    limit.as_secs()
                ));
            }
        }
    });
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    /// Listing 4.6 (gives latency and overhead).
    Latency,
    /// Listing 4.7.
    Rate,
}

/// Device calls in one run.
#[derive(Clone, Copy)]
struct Calls {
    /// Post calls that posted (single or batched).
    posts: u64,
    /// Poll calls, successful or not.
    polls: u64,
}

/// What one run measured.
struct Sample {
    /// ns per request (latency) or million messages per second (rate).
    value: f64,
    /// ns per submit (latency runs only).
    overhead: f64,
    /// Executors spawned by the dynamic offloader.
    spawns: usize,
    /// Device calls.
    calls: Calls,
    /// Requests in the run.
    requests: u64,
}

struct Cfg {
    p: DevParams,
    queue: usize,
    batch: u64,
    /// How long requesters keep submitting in one run.
    run_time: Duration,
}

/// What one requester did in a run.
#[derive(Default)]
struct Done {
    /// Requests submitted (and completed).
    count: u64,
    /// Summed latency and overhead, ns (latency runs).
    lat: u128,
    ovh: u128,
}

/// Command value `i` of requester `r` (distinct over the run).
fn command(r: u64, i: u64) -> u64 {
    (r << 32) | i
}

/// Listing 4.6 for requester `r`: until `end`, submit one request and wait
/// for its callback.
fn latency_requester(chan: &Chan, r: u64, end: Instant) -> Done {
    let flag = Arc::new(AtomicBool::new(false));
    let mut d = Done::default();
    loop {
        flag.store(false, Ordering::Relaxed);
        let f = flag.clone();
        let t0 = Instant::now();
        chan.submit(command(r, d.count), move || {
            f.store(true, Ordering::Release)
        });
        let t1 = Instant::now();
        while !flag.load(Ordering::Acquire) {
            chan.wait_step();
        }
        let t2 = Instant::now();
        d.count += 1;
        d.lat += (t2 - t0).as_nanos();
        d.ovh += (t1 - t0).as_nanos();
        if t2 >= end {
            return d;
        }
    }
}

/// Listing 4.7 for requester `r`: until `end`, submit requests, keeping at
/// most `batch` incomplete; then wait for all.
fn rate_requester(chan: &Chan, r: u64, batch: u64, end: Instant) -> Done {
    let completed = Arc::new(AtomicU64::new(0));
    let mut n = 0u64;
    // Look at the clock once per 16 requests.
    while !n.is_multiple_of(16) || Instant::now() < end {
        while n - completed.load(Ordering::Acquire) >= batch {
            chan.wait_step();
        }
        let c = completed.clone();
        chan.submit(command(r, n), move || {
            c.fetch_add(1, Ordering::Release);
        });
        n += 1;
    }
    while completed.load(Ordering::Acquire) < n {
        chan.wait_step();
    }
    if completed.load(Ordering::Acquire) != n {
        fail("a callback ran twice");
    }
    Done {
        count: n,
        ..Done::default()
    }
}

fn run_once(rt: &Runtime, m: Method, metric: Metric, requesters: usize, cfg: &Cfg) -> Sample {
    let setup = Setup::new(m, cfg.p, cfg.queue);
    let chan = setup.chan.clone();
    let (batch, run_time) = (cfg.batch, cfg.run_time);
    let (elapsed, done) = rt.block_on(move || {
        let t = Instant::now();
        let end = t + run_time;
        let hs: Vec<_> = (0..requesters as u64)
            .map(|r| {
                let chan = chan.clone();
                ct_worker::spawn(move || match metric {
                    Metric::Latency => latency_requester(&chan, r, end),
                    Metric::Rate => rate_requester(&chan, r, batch, end),
                })
            })
            .collect();
        let done: Vec<Done> = hs.into_iter().map(|h| h.join()).collect();
        let elapsed = t.elapsed().as_secs_f64();
        // Let the dynamic offloader's threads exit before the checks.
        if let Chan::Dynamic(off) = &*chan {
            while off.is_executor_running() || off.in_flight() > 0 {
                ct_worker::yield_now();
            }
        }
        (elapsed, done)
    });
    let total: u64 = done.iter().map(|d| d.count).sum();
    // The device's checksum: the sum of every command value submitted.
    let sum = done.iter().enumerate().fold(0u64, |acc, (r, d)| {
        let n = d.count;
        acc.wrapping_add(command(r as u64, 0).wrapping_mul(n))
            .wrapping_add(n * n.saturating_sub(1) / 2)
    });
    let (calls, spawns) = setup.finish(total, sum);
    PROGRESS.fetch_add(1, Ordering::Relaxed);
    let (lat, ovh): (u128, u128) = done
        .iter()
        .map(|d| (d.lat, d.ovh))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    Sample {
        value: match metric {
            Metric::Latency => lat as f64 / total as f64,
            Metric::Rate => total as f64 / elapsed / 1e6,
        },
        overhead: ovh as f64 / total as f64,
        spawns,
        calls,
        requests: total,
    }
}

/// A reported figure: metric name, unit, and how to get it from a sample.
type Figure = (&'static str, &'static str, fn(&Sample) -> f64);

/// Measures every method in `methods` for one configuration, interleaved
/// run by run (run 0 is the warm-up), prints the JSON lines, and returns
/// the summary lines against the target.
fn measure(
    rt: &Runtime,
    methods: &[Method],
    metric: Metric,
    r: usize,
    w: usize,
    runs: usize,
    cfg: &Cfg,
) -> Vec<String> {
    let mut samples: Vec<Vec<Sample>> = methods.iter().map(|_| Vec::new()).collect();
    let mut steal = ct_bench::StealMeter::start();
    for run in 0..=runs {
        if run == 1 {
            // Host steal over the measured runs, as `repeat` reports it.
            steal = ct_bench::StealMeter::start();
        }
        for (i, &m) in methods.iter().enumerate() {
            let s = run_once(rt, m, metric, r, cfg);
            if run > 0 {
                samples[i].push(s);
            }
        }
    }
    let steal = steal.pct();
    let params = |name: &str| -> Vec<(&str, Param)> {
        let mut v: Vec<(&str, Param)> = vec![
            ("metric", name.into()),
            ("requesters", r.into()),
            ("workers", w.into()),
        ];
        if metric == Metric::Rate {
            v.push(("batch", cfg.batch.into()));
        }
        v.extend([
            ("post_ns", (cfg.p.post.as_nanos() as u64).into()),
            ("post_item_ns", (cfg.p.post_item.as_nanos() as u64).into()),
            ("poll_ns", (cfg.p.poll.as_nanos() as u64).into()),
            ("poll_item_ns", (cfg.p.poll_item.as_nanos() as u64).into()),
            ("latency_ns", (cfg.p.latency.as_nanos() as u64).into()),
            ("run_ms", (cfg.run_time.as_millis() as u64).into()),
        ]);
        v
    };
    // (metric name, unit, figure) triples this configuration reports.
    let value: fn(&Sample) -> f64 = |s| s.value;
    let overhead: fn(&Sample) -> f64 = |s| s.overhead;
    let figures: Vec<Figure> = match metric {
        Metric::Latency => vec![("latency", "ns", value), ("overhead", "ns", overhead)],
        Metric::Rate => vec![("rate", "Mmsg/s", value)],
    };
    for (i, m) in methods.iter().enumerate() {
        for &(name, unit, f) in &figures {
            let v: Vec<f64> = samples[i].iter().map(f).collect();
            emit(
                "ct-delegate",
                "offload",
                m.name(),
                &params(name),
                unit,
                &Stats::from_samples(&v).with_host_steal(steal),
            );
        }
    }
    // Paired per-run ratios dynamic / direct injection.
    let mut summary = Vec::new();
    let dyn_i = methods.iter().position(|&m| m == Method::Dynamic);
    for (i, m) in methods.iter().enumerate() {
        let Some(d) = dyn_i else { break };
        if !matches!(m, Method::DirectCompleter | Method::DirectSelfPoll) {
            continue;
        }
        let imp = format!("dynamic/{}", m.name());
        for &(name, _, f) in &figures {
            let v: Vec<f64> = samples[d]
                .iter()
                .zip(&samples[i])
                .map(|(a, b)| f(a) / f(b))
                .collect();
            let rs = Stats::from_samples(&v).with_host_steal(steal);
            emit("ct-delegate", "offload", &imp, &params(name), "ratio", &rs);
            if metric == Metric::Rate && r >= 4 {
                summary.push(format!(
                    "rate, {r} requesters, {w} workers: {imp} = {:.2}x (target >= 2x: {})",
                    rs.median,
                    if rs.median >= 2.0 { "met" } else { "NOT met" }
                ));
            }
        }
    }
    for (i, m) in methods.iter().enumerate() {
        let reqs: u64 = samples[i].iter().map(|s| s.requests).sum();
        let posts: u64 = samples[i].iter().map(|s| s.calls.posts).sum();
        let polls: u64 = samples[i].iter().map(|s| s.calls.polls).sum();
        let spawns: usize = samples[i].iter().map(|s| s.spawns).sum();
        eprint!(
            "  {}: {:.3} post calls, {:.3} poll calls",
            m.name(),
            posts as f64 / reqs as f64,
            polls as f64 / reqs as f64
        );
        if *m == Method::Dynamic {
            eprint!(", {:.4} executor spawns", spawns as f64 / reqs as f64);
        }
        eprintln!(" per request");
    }
    summary
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!("{HELP}");
        return;
    }
    let quick: bool = args.get("quick", false);
    let requesters: Vec<usize> = args.list("requesters", &[1, 2, 4, 8]);
    let workers: Vec<usize> = args.list("workers", &[1, 2]);
    let runs: usize = args.get("runs", if quick { 5 } else { 7 });
    let cfg = Cfg {
        p: DevParams {
            post: Duration::from_nanos(args.get("post-ns", 300)),
            post_item: Duration::from_nanos(args.get("post-item-ns", 20)),
            poll: Duration::from_nanos(args.get("poll-ns", 300)),
            poll_item: Duration::from_nanos(args.get("poll-item-ns", 20)),
            latency: Duration::from_nanos(args.get("latency-ns", 2000)),
            depth: args.get("depth", 4096),
        },
        queue: args.get("queue", 1024),
        batch: args.get("batch", 256),
        run_time: Duration::from_millis(args.get("run-ms", if quick { 10 } else { 25 })),
    };
    let metrics = args.choices(
        "metrics",
        "offload",
        &[("latency", Metric::Latency), ("rate", Metric::Rate)],
    );
    let named: Vec<(&str, Method)> = Method::ALL.iter().map(|&m| (m.name(), m)).collect();
    let methods = args.choices("methods", "offload", &named);
    args.finish("offload");
    if cfg.queue < 2 || cfg.batch == 0 || cfg.p.depth == 0 || runs == 0 {
        eprintln!("offload: --queue must be >= 2; --batch, --depth and --runs >= 1");
        std::process::exit(2);
    }
    start_watchdog(Duration::from_secs(30));

    let mut summary = Vec::new();
    for &w in &workers {
        let rt = Runtime::builder().workers(w).build().expect("runtime");
        for &metric in &metrics {
            for &r in &requesters {
                eprintln!("{metric:?}, {r} requesters, {w} workers...");
                summary.extend(measure(&rt, &methods, metric, r, w, runs, &cfg));
            }
        }
    }
    ct_bench::print_summary();
    for line in summary {
        eprintln!("offload: {line}");
    }
}
