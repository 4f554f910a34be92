//! Stack sources and switch hooks: every thread runs on a stack of the
//! configured source, and the switch hook sees every switch in the order a
//! DSM needs (enter the target before touching its stack, leave the old one
//! once nothing runs on it), whatever path the switch takes.

mod common;

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::with_timeout;
use ct_context::{DefaultPolicy, StackRegion};
use ct_worker::{
    ChaseLevKind, Custom, Error, LeaveReason, MmapStacks, NoAspect, NoHook, Runtime, StackSource,
    SuspendedThread, SwitchHook, UltThread,
};

// --- a stack source carving stacks out of one region it owns ---------------

/// How many stacks a [`RegionStacks`] handed out and got back.
#[derive(Debug, Default)]
struct Counts {
    taken: AtomicUsize,
    returned: AtomicUsize,
}

/// Stacks carved out of one big mapping owned by the source: fixed slots of
/// `slot` bytes (the size the source chooses, at least the requested one),
/// handed out from a free list and taken back when their thread finishes.
struct RegionStacks {
    base: usize,
    slot: usize,
    slots: usize,
    free: Mutex<Vec<usize>>,
    counts: Arc<Counts>,
}

impl RegionStacks {
    fn new(slots: usize, slot: usize) -> (Self, Arc<Counts>) {
        let len = slots * slot;
        // SAFETY: a fresh anonymous private mapping aliases nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap of the stack region");
        let counts = Arc::new(Counts::default());
        let s = RegionStacks {
            base: p as usize,
            slot,
            slots,
            free: Mutex::new((0..slots).rev().collect()),
            counts: counts.clone(),
        };
        (s, counts)
    }

    fn range(&self) -> (usize, usize) {
        (self.base, self.base + self.slots * self.slot)
    }
}

impl Drop for RegionStacks {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; the runtime drops its source only
        // after its workers stopped, and every stack was given back.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.slots * self.slot) };
    }
}

// SAFETY: every region handed out is a distinct read-write slot of the
// mapping, handed out again only after it was given back; the mapping lives
// until the source is dropped.
unsafe impl StackSource for RegionStacks {
    type Stack = StackRegion;
    type Local = ();

    fn init(&mut self, stack_size: usize, _workers: usize) -> ct_worker::Result<()> {
        if stack_size > self.slot {
            return Err(Error::StackSource(
                format!(
                    "stacks of {stack_size} bytes requested, this region has {} byte slots",
                    self.slot
                )
                .into(),
            ));
        }
        Ok(())
    }

    fn local(&self, _worker: usize) {}

    fn take(&self, _at: Option<(usize, &mut ())>) -> ct_worker::Result<StackRegion> {
        let i = self.free.lock().unwrap().pop().ok_or_else(|| {
            Error::StackSource(format!("all {} stacks in use", self.slots).into())
        })?;
        self.counts.taken.fetch_add(1, Ordering::Relaxed);
        let bottom = self.base + i * self.slot;
        Ok(StackRegion::new(bottom, bottom + self.slot).expect("non-empty slot"))
    }

    unsafe fn give_back(&self, stack: StackRegion, _worker: usize, _local: &mut ()) {
        let i = (stack.bottom() - self.base) / self.slot;
        assert!(
            i < self.slots && stack.len() == self.slot,
            "not one of ours"
        );
        self.free.lock().unwrap().push(i);
        self.counts.returned.fetch_add(1, Ordering::Relaxed);
    }

    fn region(stack: StackRegion) -> StackRegion {
        stack
    }
}

// --- a switch hook recording every call ------------------------------------

/// What the recorder knows about one live thread.
#[derive(Debug, Clone, Copy)]
struct Live {
    stack: StackRegion,
    serial: usize,
    /// The worker it is entered on, or `None` between `left` and `entering`.
    entered: Option<usize>,
    /// The worker of its last `left`.
    last: usize,
}

#[derive(Debug, Default)]
struct Record {
    threads: HashMap<usize, Live>,
    next_serial: usize,
    enterings: usize,
    lefts: HashMap<LeaveReason, usize>,
    /// Resumptions on another worker than the one the thread was left on.
    migrations: usize,
    errors: Vec<String>,
}

/// Shared between the hook (in the runtime) and the test's threads.
#[derive(Debug)]
struct RecState {
    region: (usize, usize),
    rec: Mutex<Record>,
}

impl RecState {
    fn new(region: (usize, usize)) -> &'static RecState {
        Box::leak(Box::new(RecState {
            region,
            rec: Mutex::new(Record::default()),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn left_count(&self, why: LeaveReason) -> usize {
        self.lock().lefts.get(&why).copied().unwrap_or(0)
    }

    /// Called by a thread's own code: the thread was entered on this worker
    /// (before this code ran), on the stack this code runs on, inside the
    /// source's region, and its hook word is the one the hook gave it.
    #[track_caller]
    fn check_here(&self) {
        let local = 0u8;
        let sp = black_box(&local) as *const u8 as usize;
        assert!(
            (self.region.0..self.region.1).contains(&sp),
            "a thread runs outside the source's region: {sp:#x}"
        );
        let id = ct_worker::current_thread_id().expect("a user-level thread");
        let w = ct_worker::current_worker_index().expect("on a worker");
        let data = ct_worker::current_thread_data().expect("a user-level thread");
        let rec = self.lock();
        let t = rec
            .threads
            .get(&id)
            .expect("entering was called before the thread's code ran");
        assert_eq!(
            t.entered,
            Some(w),
            "the thread runs but is not entered here"
        );
        assert!(
            t.stack.contains(sp),
            "the thread runs on another stack than entered"
        );
        assert_eq!(t.serial, data, "the thread's hook word changed");
    }
}

/// The recording hook: checks, per thread, strict alternation of `entering`
/// and `left`, the same stack and hook word throughout, and that neither
/// call runs on the stack it is about.
struct Recorder(&'static RecState);

impl SwitchHook for Recorder {
    fn entering(&self, worker: usize, thread: UltThread<'_>, stack: StackRegion) {
        let local = 0u8;
        let sp = black_box(&local) as *const u8 as usize;
        let mut rec = self.0.lock();
        rec.enterings += 1;
        if stack.contains(sp) {
            rec.errors
                .push(format!("entering runs on the stack it enters ({sp:#x})"));
        }
        if stack.bottom() < self.0.region.0 || stack.top() > self.0.region.1 {
            rec.errors
                .push(format!("stack {stack:?} is not the source's"));
        }
        let id = thread.id();
        if thread.data() == 0 {
            // A thread's first entering: its hook word starts at 0.
            if rec.threads.contains_key(&id) {
                rec.errors
                    .push(format!("live thread {id:#x} lost its hook word"));
            }
            rec.next_serial += 1;
            let serial = rec.next_serial;
            thread.set_data(serial);
            rec.threads.insert(
                id,
                Live {
                    stack,
                    serial,
                    entered: Some(worker),
                    last: worker,
                },
            );
            return;
        }
        let Some(t) = rec.threads.get(&id).copied() else {
            rec.errors.push(format!("unknown thread {id:#x} entered"));
            return;
        };
        let mut err = Vec::new();
        if t.entered.is_some() {
            err.push(format!("thread {id:#x} entered twice without left"));
        }
        if t.stack != stack {
            err.push(format!(
                "thread {id:#x} entered on {stack:?}, not {:?}",
                t.stack
            ));
        }
        if t.serial != thread.data() {
            err.push(format!("thread {id:#x}'s hook word changed"));
        }
        if t.last != worker {
            rec.migrations += 1;
        }
        rec.errors.extend(err);
        rec.threads.get_mut(&id).expect("present").entered = Some(worker);
    }

    fn left(&self, worker: usize, thread: UltThread<'_>, stack: StackRegion, why: LeaveReason) {
        let local = 0u8;
        let sp = black_box(&local) as *const u8 as usize;
        let mut rec = self.0.lock();
        *rec.lefts.entry(why).or_default() += 1;
        if stack.contains(sp) {
            rec.errors
                .push(format!("left runs on the stack it left ({sp:#x}, {why:?})"));
        }
        let id = thread.id();
        let Some(t) = rec.threads.get(&id).copied() else {
            rec.errors.push(format!("unknown thread {id:#x} left"));
            return;
        };
        let mut err = Vec::new();
        if t.entered != Some(worker) {
            err.push(format!(
                "thread {id:#x} left on worker {worker} but entered on {:?} ({why:?})",
                t.entered
            ));
        }
        if t.stack != stack {
            err.push(format!("thread {id:#x} left {stack:?}, not {:?}", t.stack));
        }
        if t.serial != thread.data() {
            err.push(format!("thread {id:#x}'s hook word changed"));
        }
        // The native policy saves a context on the thread's own stack: the
        // stack pointer at the switch, which a DSM uses to skip dead frames.
        match (why, thread.saved_context()) {
            (LeaveReason::Finished | LeaveReason::Cancelled, None) => {}
            (LeaveReason::Finished, Some(c)) => {
                err.push(format!(
                    "finished thread {id:#x} has a saved context {c:#x}"
                ));
            }
            (LeaveReason::Cancelled, Some(_)) => {}
            (_, Some(c)) if stack.contains(c) => {}
            (_, c) => err.push(format!(
                "thread {id:#x} left ({why:?}) with its context at {c:x?}, not on {stack:?}"
            )),
        }
        rec.errors.extend(err);
        if why == LeaveReason::Finished {
            rec.threads.remove(&id);
        } else {
            let t = rec.threads.get_mut(&id).expect("present");
            t.entered = None;
            t.last = worker;
        }
    }
}

type Cfg = Custom<DefaultPolicy, ChaseLevKind, NoAspect, RegionStacks, Recorder>;

/// A runtime of `workers` workers on a fresh region of `slots` 64 KiB stacks
/// with a fresh recorder.
fn runtime(workers: usize, slots: usize) -> (Runtime<Cfg>, Arc<Counts>, &'static RecState) {
    let (src, counts) = RegionStacks::new(slots, 64 * 1024);
    let st = RecState::new(src.range());
    let rt = Runtime::builder()
        .workers(workers)
        .stack_size(60 * 1024)
        .stack_source(src)
        .switch_hook(Recorder(st))
        .build_with::<Cfg>()
        .expect("runtime");
    (rt, counts, st)
}

/// Drops the runtime and checks the books: every stack back, every thread
/// finished, as many `left`s as `entering`s, and no error recorded.
fn finish(rt: Runtime<Cfg>, counts: &Counts, st: &RecState) {
    drop(rt);
    let taken = counts.taken.load(Ordering::Relaxed);
    assert!(taken > 0);
    assert_eq!(
        counts.returned.load(Ordering::Relaxed),
        taken,
        "every stack goes back to the source"
    );
    let rec = st.lock();
    assert!(rec.errors.is_empty(), "{:#?}", rec.errors);
    assert!(rec.threads.is_empty(), "unfinished: {:?}", rec.threads);
    assert_eq!(rec.enterings, rec.lefts.values().sum::<usize>());
    // The source does not pool: one stack per thread.
    assert_eq!(rec.lefts.get(&LeaveReason::Finished).copied(), Some(taken));
}

fn fib_join(n: u64, st: &RecState) -> u64 {
    if n < 2 {
        st.check_here();
        return n;
    }
    let (a, b) = ct_worker::join_in::<Cfg, _, _, _, _>(
        || fib_join(n - 1, st),
        || {
            st.check_here();
            fib_join(n - 2, st)
        },
    );
    a + b
}

fn fib_spawn(n: u64, st: &'static RecState) -> u64 {
    st.check_here();
    if n < 2 {
        return n;
    }
    let h = ct_worker::spawn_in::<Cfg, _, _>(move || fib_spawn(n - 1, st));
    let b = fib_spawn(n - 2, st);
    st.check_here();
    let a = h.join();
    st.check_here();
    a + b
}

#[test]
fn every_thread_runs_on_a_stack_of_the_source() {
    with_timeout(120, || {
        for workers in [1, 2, 4] {
            let (rt, counts, st) = runtime(workers, 512);
            for _ in 0..3 {
                let r = rt.block_on(|| {
                    st.check_here();
                    let a = fib_join(18, st);
                    st.check_here();
                    let b = fib_spawn(14, st);
                    st.check_here();
                    a + b
                });
                assert_eq!(r, 2584 + 377);
            }
            // Threads spawned from outside, joined from outside.
            let hs: Vec<_> = (0..64)
                .map(|i| {
                    rt.spawn(move || {
                        st.check_here();
                        ct_worker::yield_now_in::<Cfg>();
                        st.check_here();
                        i
                    })
                })
                .collect();
            assert_eq!(hs.into_iter().map(|h| h.join()).sum::<u64>(), 63 * 64 / 2);
            assert!(
                st.left_count(LeaveReason::Suspended) > 0,
                "work-first forks"
            );
            finish(rt, &counts, st);
        }
    });
}

/// Threads that block (in a suspended thread, a hand-off, a join), yield and
/// are resumed, often on other workers: each resumption is entered on the
/// same stack, with the same hook word.
#[test]
fn blocked_threads_resume_on_their_stack() {
    with_timeout(120, || {
        for workers in [2, 4] {
            let (rt, counts, st) = runtime(workers, 256);
            let mut rounds = 0;
            while rounds < 4 || (st.lock().migrations == 0 && rounds < 200) {
                rounds += 1;
                rt.block_on(|| ping_pong(st, 100));
                rt.block_on(|| yielders(st, 8, 50));
            }
            let rec = st.lock();
            assert!(
                rec.migrations > 0,
                "no thread ever resumed on another worker"
            );
            assert!(rec.lefts.get(&LeaveReason::Blocked).copied().unwrap_or(0) > 0);
            assert!(rec.lefts.get(&LeaveReason::Yielded).copied().unwrap_or(0) > 0);
            drop(rec);
            finish(rt, &counts, st);
        }
    });
}

/// Two threads hand control to each other through suspended threads:
/// `swap` (park in mine, switch straight to the thread parked in the
/// other's), `enter` (switch to it, staying runnable), `wait`/`notify`, with
/// yields mixed in.
fn ping_pong(st: &'static RecState, rounds: usize) {
    let slots: &'static [SuspendedThread<Cfg>; 2] = Box::leak(Box::new([
        SuspendedThread::empty(),
        SuspendedThread::empty(),
    ]));
    // Work-first: `other` runs at once and parks in slot 1.
    let other = ct_worker::spawn_in::<Cfg, _, _>(move || {
        st.check_here();
        slots[1].wait();
        st.check_here();
        for i in 0..rounds {
            if i % 7 == 0 {
                ct_worker::yield_now_in::<Cfg>();
                st.check_here();
            }
            // The first thread is parked in slot 0 (it parked there before
            // it switched to us): park in slot 1 and switch to it.
            slots[1].swap(&slots[0]);
            st.check_here();
        }
        // The first thread entered us and stays runnable; it parks in slot
        // 0 next.
        while !slots[0].notify() {
            ct_worker::yield_now_in::<Cfg>();
        }
        st.check_here();
    });
    st.check_here();
    while slots[1].is_empty() {
        ct_worker::yield_now_in::<Cfg>();
    }
    for _ in 0..rounds {
        // The other thread is parked in slot 1: park in slot 0, switch to it.
        slots[0].swap(&slots[1]);
        st.check_here();
    }
    // The other thread is parked in slot 1 again.
    assert!(slots[1].enter());
    st.check_here();
    slots[0].wait();
    st.check_here();
    other.join();
    st.check_here();
}

/// `n` threads that yield `k` times each.
fn yielders(st: &'static RecState, n: usize, k: usize) {
    let hs: Vec<_> = (0..n)
        .map(|_| {
            ct_worker::spawn_in::<Cfg, _, _>(move || {
                for _ in 0..k {
                    st.check_here();
                    ct_worker::yield_now_in::<Cfg>();
                }
                st.check_here();
            })
        })
        .collect();
    for h in hs {
        h.join();
        st.check_here();
    }
}

/// The conditional switches whose decision says "do not park": the hook
/// hears the caller left and entered again, and the thread that was about to
/// be entered hears `Cancelled`.
#[test]
fn cancelled_switches_are_reported() {
    with_timeout(60, || {
        let (rt, counts, st) = runtime(1, 64);
        rt.block_on(|| {
            let slot = SuspendedThread::<Cfg>::empty();
            // Work-first: the child runs at once and the parent's
            // continuation is the next thread this worker would run.
            let h = ct_worker::spawn_in::<Cfg, _, _>(move || {
                st.check_here();
                assert!(!slot.wait_with(|| false), "the decision refuses");
                st.check_here();
            });
            st.check_here();
            h.join();
            // `swap_with` that refuses: a thread is parked in `next`.
            let next: &'static SuspendedThread<Cfg> = Box::leak(Box::new(SuspendedThread::empty()));
            let parked = ct_worker::spawn_in::<Cfg, _, _>(move || {
                next.wait();
                st.check_here();
            });
            let mine = SuspendedThread::<Cfg>::empty();
            while next.is_empty() {
                ct_worker::yield_now_in::<Cfg>();
            }
            assert!(!mine.swap_with(next, || false));
            st.check_here();
            assert!(next.notify());
            parked.join();
            st.check_here();
        });
        assert!(
            st.left_count(LeaveReason::Cancelled) >= 2,
            "{:?}",
            st.lock().lefts
        );
        finish(rt, &counts, st);
    });
}

/// The hook word belongs to the thread: it starts at 0, follows the thread
/// across switches and workers, and is not shared with other threads.
#[test]
fn hook_word_follows_the_thread() {
    with_timeout(60, || {
        assert_eq!(ct_worker::current_thread_data(), None);
        assert!(!ct_worker::set_current_thread_data(1));
        assert_eq!(ct_worker::current_thread_id(), None);
        let rt = Runtime::builder().workers(2).build().unwrap();
        rt.block_on(|| {
            let hs: Vec<_> = (1..=16usize)
                .map(|i| {
                    ct_worker::spawn(move || {
                        assert_eq!(ct_worker::current_thread_data(), Some(0));
                        let id = ct_worker::current_thread_id().unwrap();
                        assert!(ct_worker::set_current_thread_data(i * 1000));
                        for _ in 0..20 {
                            ct_worker::yield_now();
                            let (a, b) = ct_worker::join(
                                ct_worker::current_thread_data,
                                ct_worker::current_thread_data,
                            );
                            // `a` runs on this thread; so does `b` when it
                            // runs inline, but a stolen `b` is a thread of
                            // its own, with its own word.
                            assert_eq!(a, Some(i * 1000));
                            assert!(b == Some(i * 1000) || b == Some(0), "{b:?}");
                            assert_eq!(ct_worker::current_thread_data(), Some(i * 1000));
                            assert_eq!(ct_worker::current_thread_id(), Some(id));
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join();
            }
        });
    });
}

/// A source that cannot serve the stack size fails the build; a source that
/// runs out fails `try_spawn_in` / `Runtime::try_spawn` with its error, and
/// `spawn_in` panics with it.
#[test]
fn source_errors_are_runtime_errors() {
    with_timeout(60, || {
        let (src, _) = RegionStacks::new(4, 64 * 1024);
        let e = Runtime::builder()
            .workers(1)
            .stack_size(1 << 20)
            .stack_source(src)
            .build_with::<Custom<DefaultPolicy, ChaseLevKind, NoAspect, RegionStacks, NoHook>>()
            .unwrap_err();
        assert!(matches!(e, Error::StackSource(_)), "{e:?}");
        assert!(e.to_string().contains("65536 byte slots"), "{e}");

        // The default source refuses tiny stacks as before.
        let e = Runtime::builder()
            .workers(1)
            .stack_source(MmapStacks::default())
            .stack_size(100)
            .build()
            .unwrap_err();
        assert!(matches!(e, Error::InvalidStackSize(_)), "{e:?}");

        // Three stacks: the root, two children parked; then none is left.
        let (rt, counts, st) = runtime(2, 3);
        let gates: &'static [SuspendedThread<Cfg>; 2] = Box::leak(Box::new([
            SuspendedThread::empty(),
            SuspendedThread::empty(),
        ]));
        let out = rt.block_on(|| {
            let hs: Vec<_> = gates
                .iter()
                .map(|g| ct_worker::try_spawn_in::<Cfg, _, _>(move || g.wait()).unwrap())
                .collect();
            let e = ct_worker::try_spawn_in::<Cfg, _, _>(|| ()).unwrap_err();
            let msg = e.to_string();
            let p = std::panic::catch_unwind(|| ct_worker::spawn_in::<Cfg, _, _>(|| ()))
                .expect_err("spawn panics without a stack");
            let p = p.downcast_ref::<String>().cloned().unwrap_or_default();
            for g in gates {
                while !g.notify() {
                    ct_worker::yield_now_in::<Cfg>();
                }
            }
            for h in hs {
                h.join();
            }
            // Stacks are back: spawning works again.
            ct_worker::try_spawn_in::<Cfg, _, _>(|| 5).unwrap().join();
            (matches!(e, Error::StackSource(_)), msg, p)
        });
        assert!(out.0, "{}", out.1);
        assert!(out.1.contains("all 3 stacks in use"), "{}", out.1);
        assert!(out.2.contains("cannot spawn a thread"), "{}", out.2);
        // From outside: threads take their stacks when spawned; three
        // threads that wait for `go` hold every stack.
        let go = Arc::new(AtomicBool::new(false));
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let go = go.clone();
                rt.try_spawn(move || {
                    while !go.load(Ordering::Acquire) {
                        ct_worker::yield_now_in::<Cfg>();
                    }
                })
                .unwrap()
            })
            .collect();
        let e = rt.try_spawn(|| ()).unwrap_err();
        assert!(matches!(e, Error::StackSource(_)), "{e:?}");
        assert!(rt.try_block_on(|| ()).is_err());
        go.store(true, Ordering::Release);
        for h in hs {
            h.join();
        }
        assert_eq!(rt.try_block_on(|| 7).unwrap(), 7);
        finish(rt, &counts, st);
    });
}
