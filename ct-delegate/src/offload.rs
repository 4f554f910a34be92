//! Dynamic offloading of a non-thread-safe device (MECOM 1, Endo 2020 §4.3).
//!
//! Three roles, as in the seed:
//!
//! - **Requesters** (application threads) put commands into a bounded
//!   command queue with one CAS on its tail counter and go on; they never
//!   touch the device.
//! - An **executor** thread takes commands in order and posts them to the
//!   device. It is *dynamic*: the tail counter's low bit says whether one is
//!   running. A requester whose CAS sets the bit spawns one; an executor that
//!   finds the queue empty clears the bit with a CAS and exits (the CAS fails,
//!   and it goes on, if a command arrived meanwhile). So exactly one executor
//!   runs while commands are queued, and none spins on an empty queue.
//! - A **completer** thread polls the device for completions and runs the
//!   commands' callbacks. It is spawned when the number of commands in flight
//!   goes from 0 to 1 and exits when it drops back to 0.
//!
//! # Batched device calls
//!
//! The executor takes up to [`BATCH`] queued commands at a time and hands
//! them to the device in **one** call, [`Device::post_batch`]; the completer
//! collects up to [`BATCH`] completions with one [`Device::poll_batch`]. This
//! is how real devices are driven — `ibv_post_send` takes a chain of work
//! requests and rings the doorbell once, `ibv_poll_cq` returns up to `n`
//! completions — and it is why offloading beats direct injection on message
//! rate even on one core (Endo 2020 §4.4.2: "an executor in our system
//! retrieves multiple communication requests from a command queue and puts
//! them in a single call of the post function"): a requester that posts its
//! own command pays a device call per command, the executor one per batch.
//! The defaults of the batched calls make one `post`/`poll` per command, so a
//! device that cannot batch loses nothing but gains nothing either.
//!
//! Commands reach the device in submission order, and each exactly once: a
//! device that takes only a prefix of a batch (its queue is full) leaves the
//! rest, which the executor offers again — first, before any newer command —
//! after yielding to let completions free room.
//!
//! The device itself is behind a spinlock: its calls are not thread-safe, and
//! the executor and completer may run on different workers. Each of them
//! makes one (batched) device call per hold of the lock, and yields (rather
//! than spins) while the other one holds it.
//!
//! Executors and completers are threads of the threading interface `U` —
//! user-level threads by default, so an idle offloader costs nothing. Spawns
//! are work-first (the child runs at once), so a new executor or completer
//! first yields: the requester returns from [`Offloader::submit`] at once, as
//! with the seed's parent-first spawn, and the executor then finds a batch.

use core::mem::MaybeUninit;
use std::collections::VecDeque;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use ct_sync::{SpinLock, SpinLockGuard};
use ct_worker::{Ult, UltItf};

use crate::sync::{AtomicBool, AtomicUsize, Backoff, Ordering, ProtocolCell};

/// Most commands the executor offers the device in one
/// [`Device::post_batch`] call, and most completions the completer asks for
/// in one [`Device::poll_batch`] call.
pub const BATCH: usize = 32;

/// Identifies a command in flight on a [`Device`].
pub type Tag = usize;

/// A device with non-thread-safe calls (a NIC queue pair, an MPI library in
/// serialised mode, an emulation). Every method is one *device call*: the
/// offloader makes them one at a time, under a lock.
///
/// Only [`post`](Device::post) and [`poll`](Device::poll) are required. A
/// device whose hardware or library takes several commands per call (a chain
/// of work requests and one doorbell) or reports several completions per call
/// should also implement [`post_batch`](Device::post_batch) and
/// [`poll_batch`](Device::poll_batch): the offloader only uses those.
pub trait Device: Send + 'static {
    /// A command to post.
    type Command: Send + 'static;

    /// Posts `command`, to be reported by `poll` with `tag` when it completes.
    /// Returns the command if the device cannot take it now (e.g. its queue is
    /// full); it is posted again after polling.
    fn post(&mut self, command: Self::Command, tag: Tag) -> Result<(), Self::Command>;

    /// Returns the tag of one completed command, if any.
    fn poll(&mut self) -> Option<Tag>;

    /// Posts a prefix of `batch` in **one** device call: everything the
    /// device [takes](PostBatch::take) from the batch is handed to the
    /// hardware or library together (one doorbell, one library call), so
    /// that the call's fixed cost is paid once for the whole prefix.
    ///
    /// The device takes commands in order with [`PostBatch::take`]; each
    /// one taken is posted, to be reported by `poll`/`poll_batch` with its
    /// tag, unless it is [given back](PostBatch::give_back). Whatever is left
    /// in the batch — because the device is full, or gave back the command it
    /// took last — was not posted: the caller offers it again, first, after
    /// polling, exactly as it does with a command a refused [`post`]
    /// returns. Taking nothing refuses the whole batch. A command is thus
    /// never posted twice nor dropped, and commands are posted in batch order.
    ///
    /// The default makes one [`post`] per command and stops at the first
    /// refusal (no saving over single posts).
    ///
    /// [`post`]: Device::post
    fn post_batch(&mut self, batch: &mut PostBatch<'_, Self::Command>) {
        while let Some((command, tag)) = batch.take() {
            if let Err(command) = self.post(command, tag) {
                batch.give_back(command);
                return;
            }
        }
    }

    /// Reports completed commands in **one** device call (e.g. one
    /// `ibv_poll_cq` for up to `tags.len()` completions): writes the tags of
    /// up to `tags.len()` of them to the front of `tags` and returns how
    /// many. Each posted command is reported once, by this or by
    /// [`poll`](Device::poll).
    ///
    /// The default calls `poll` until it finds nothing or `tags` is full.
    fn poll_batch(&mut self, tags: &mut [Tag]) -> usize {
        let mut n = 0;
        while n < tags.len() {
            let Some(tag) = self.poll() else { break };
            tags[n] = tag;
            n += 1;
        }
        n
    }
}

/// The commands offered to one [`Device::post_batch`] call: a view of a
/// queue of `(command, tag)` pairs from which the device takes a prefix, in
/// order. What it does not take stays in the queue, in order.
///
/// Built by the caller of `post_batch` (the [`Offloader`]'s executor, or any
/// code that drives a device directly) over its own queue, which it reuses
/// from call to call: no allocation in steady state.
#[derive(Debug)]
pub struct PostBatch<'a, C> {
    queue: &'a mut VecDeque<(C, Tag)>,
    taken: usize,
    /// Tag of the command `take` returned last, while it may be given back.
    returnable: Option<Tag>,
}

impl<'a, C> PostBatch<'a, C> {
    /// A batch of the commands in `queue`, front first.
    pub fn new(queue: &'a mut VecDeque<(C, Tag)>) -> Self {
        PostBatch {
            queue,
            taken: 0,
            returnable: None,
        }
    }

    /// Takes the next command and its tag: the device must now post it or
    /// [give it back](Self::give_back).
    pub fn take(&mut self) -> Option<(C, Tag)> {
        let (command, tag) = self.queue.pop_front()?;
        self.taken += 1;
        self.returnable = Some(tag);
        Some((command, tag))
    }

    /// The next command and its tag, without taking it.
    pub fn peek(&self) -> Option<(&C, Tag)> {
        self.queue.front().map(|(c, t)| (c, *t))
    }

    /// Gives back `command`, which must be the one [`take`](Self::take)
    /// returned last, unposted: it goes back to the front of the batch, with
    /// its tag, as if never taken. A device does this when it finds it cannot
    /// post the command after all (its queue or a resource is exhausted);
    /// it should then take no more in this call.
    ///
    /// # Panics
    ///
    /// If nothing was taken since the last give-back (only the command taken
    /// last can be given back, once).
    pub fn give_back(&mut self, command: C) {
        let tag = self
            .returnable
            .take()
            .expect("PostBatch::give_back without a command taken just before");
        self.taken -= 1;
        self.queue.push_front((command, tag));
    }

    /// Commands taken (and not given back) so far: those this call posts.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Commands left to take.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether every command was taken.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// What runs when a command completes.
pub type Callback = Box<dyn FnOnce() + Send>;

struct CmdSlot<C> {
    visible: AtomicBool,
    cmd: ProtocolCell<MaybeUninit<(C, Callback)>>,
}

struct DeviceState<D: Device> {
    dev: D,
    callbacks: Vec<Option<Callback>>,
    free_tags: Vec<Tag>,
    /// Commands the executor took from the queue and the device has not
    /// accepted yet, in order, each with its tag (its callback is already in
    /// `callbacks`). Only the executor changes it.
    staged: VecDeque<(D::Command, Tag)>,
}

/// A dynamically offloaded device; see the [module docs](self). Use it
/// through an `Arc` (executor and completer threads hold references).
pub struct Offloader<D: Device, U: UltItf = Ult> {
    /// `(commands ever submitted << 1) | executor running`.
    tail: CachePadded<AtomicUsize>,
    /// Commands taken by the executor.
    head: CachePadded<AtomicUsize>,
    slots: Box<[CmdSlot<D::Command>]>,
    device: SpinLock<DeviceState<D>>,
    /// Commands posted and not completed; a completer runs iff non-zero.
    in_flight: CachePadded<AtomicUsize>,
    executors_spawned: AtomicUsize,
    /// Executors currently running (at most one; checked).
    executors_running: AtomicUsize,
    _threads: core::marker::PhantomData<fn() -> U>,
}

// SAFETY: commands move from requesters to the executor through the slots'
// `visible` flags (release/acquire); the device is behind a spinlock.
unsafe impl<D: Device, U: UltItf> Send for Offloader<D, U> {}
// SAFETY: as above.
unsafe impl<D: Device, U: UltItf> Sync for Offloader<D, U> {}

impl<D: Device, U: UltItf> core::fmt::Debug for Offloader<D, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Offloader")
            .field("capacity", &self.slots.len())
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<D: Device, U: UltItf> Offloader<D, U> {
    /// An offloader for `device` with a command queue of `capacity` entries
    /// (at least 2).
    pub fn new(device: D, capacity: usize) -> Arc<Self> {
        assert!(
            capacity >= 2,
            "the command queue needs at least two entries"
        );
        Arc::new(Offloader {
            tail: CachePadded::new(AtomicUsize::new(0)),
            head: CachePadded::new(AtomicUsize::new(0)),
            slots: (0..capacity)
                .map(|_| CmdSlot {
                    visible: AtomicBool::new(false),
                    cmd: ProtocolCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            device: SpinLock::new(DeviceState {
                dev: device,
                callbacks: Vec::new(),
                free_tags: Vec::new(),
                staged: VecDeque::with_capacity(BATCH),
            }),
            in_flight: CachePadded::new(AtomicUsize::new(0)),
            executors_spawned: AtomicUsize::new(0),
            executors_running: AtomicUsize::new(0),
            _threads: core::marker::PhantomData,
        })
    }

    fn slot(&self, i: usize) -> &CmdSlot<D::Command> {
        &self.slots[i % self.slots.len()]
    }

    /// Queues `command`; `on_complete` runs (on the completer thread) when
    /// the device reports it done. Yields while the command queue is full.
    pub fn submit(
        self: &Arc<Self>,
        command: D::Command,
        on_complete: impl FnOnce() + Send + 'static,
    ) {
        let cap = self.slots.len();
        let mut t = self.tail.load(Ordering::Relaxed);
        loop {
            let c = t >> 1;
            if c.wrapping_sub(self.head.load(Ordering::Acquire)) >= cap {
                U::yield_now();
                t = self.tail.load(Ordering::Relaxed);
                continue;
            }
            match self.tail.compare_exchange_weak(
                t,
                ((c + 1) << 1) | 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(cur) => t = cur,
            }
        }
        let c = t >> 1;
        let slot = self.slot(c);
        // SAFETY: the CAS reserved index c; its slot is free (c - head < cap).
        unsafe {
            slot.cmd
                .with_mut(|p| (*p).write((command, Box::new(on_complete))))
        };
        slot.visible.store(true, Ordering::Release);
        if t & 1 == 0 {
            // We set the "executor running" bit: start one.
            self.executors_spawned.fetch_add(1, Ordering::Relaxed);
            let me = self.clone();
            drop(U::spawn(move || me.executor_main()));
        }
    }

    /// Number of executor threads started so far (how often the executor
    /// had exited because the queue drained).
    pub fn executors_spawned(&self) -> usize {
        self.executors_spawned.load(Ordering::Relaxed)
    }

    /// Whether an executor thread is running (the tail's low bit).
    pub fn is_executor_running(&self) -> bool {
        self.tail.load(Ordering::Acquire) & 1 == 1
    }

    /// Commands posted to the device and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Runs `f` on the device, under its lock (e.g. to inspect it).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.device.lock().dev)
    }

    /// Locks the device for the executor or the completer. Each holds it
    /// for a batch of device calls; while the other one (on another worker)
    /// has it, let other threads of this worker run instead of spinning.
    fn lock_device(&self) -> SpinLockGuard<'_, DeviceState<D>> {
        loop {
            if let Some(g) = self.device.try_lock() {
                return g;
            }
            U::yield_now();
        }
    }

    fn executor_main(self: Arc<Self>) {
        // Spawning is work-first: we run before the requester that spawned
        // us returns from `submit`. Let it go on first (the seed spawns
        // parent-first for this reason), so that `submit` costs a spawn
        // rather than a device post, and we find a batch of commands when we
        // run.
        U::yield_now();
        let others = self.executors_running.fetch_add(1, Ordering::AcqRel);
        assert_eq!(others, 0, "two executors ran at once");
        let mut h = self.head.load(Ordering::Acquire);
        // Commands taken from the queue that the device has not accepted
        // yet (`DeviceState::staged`, which only we change): offered again,
        // before any newer command, after the completer has freed room.
        let mut staged = 0;
        let mut backoff = Backoff::new();
        loop {
            let t = self.tail.load(Ordering::Acquire);
            if staged == 0 && h == t >> 1 {
                // Empty: clear the running bit and exit, unless a command
                // arrived since (then the CAS fails and we go on).
                // Leave the count first: once the bit is clear, a requester
                // may start the next executor.
                self.executors_running.fetch_sub(1, Ordering::AcqRel);
                if self
                    .tail
                    .compare_exchange(t, t & !1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                self.executors_running.fetch_add(1, Ordering::AcqRel);
                continue;
            }
            // Top the staged commands up to a batch from the queue, in order,
            // and offer them to the device in one call. One lock hold per
            // batch: the lock and the device state move between the
            // executor's and the completer's workers once per batch.
            let (posted, was_idle) = {
                let mut guard = self.lock_device();
                let st = &mut *guard;
                let h0 = h;
                while st.staged.len() < BATCH && h != t >> 1 {
                    let slot = self.slot(h);
                    // A requester reserved the slot and may still be filling
                    // it: post what we have, wait outside.
                    if !slot.visible.load(Ordering::Acquire) {
                        break;
                    }
                    // SAFETY: visible means written; we are the only
                    // executor.
                    let (cmd, cb) = unsafe { slot.cmd.with_mut(|p| (*p).assume_init_read()) };
                    slot.visible.store(false, Ordering::Relaxed);
                    h += 1;
                    let tag = match st.free_tags.pop() {
                        Some(tag) => tag,
                        None => {
                            st.callbacks.push(None);
                            st.callbacks.len() - 1
                        }
                    };
                    st.callbacks[tag] = Some(cb);
                    st.staged.push_back((cmd, tag));
                }
                if h != h0 {
                    // The slots are free for requesters again.
                    self.head.store(h, Ordering::Release);
                }
                let posted = if st.staged.is_empty() {
                    0
                } else {
                    let mut batch = PostBatch::new(&mut st.staged);
                    st.dev.post_batch(&mut batch);
                    batch.taken()
                };
                staged = st.staged.len();
                // Count the commands before the completer can poll them (it
                // polls under this lock), so that its count never runs below
                // what it has polled.
                (
                    posted,
                    posted > 0 && self.in_flight.fetch_add(posted, Ordering::AcqRel) == 0,
                )
            };
            if was_idle {
                self.spawn_completer();
            }
            if staged > 0 {
                // The device did not take everything: it is full, so either
                // commands are in flight and a completer is draining it, or
                // it refuses for a while. Retry shortly.
                U::yield_now();
            } else if posted == 0 {
                // The next command is still being written.
                backoff.snooze(U::yield_now);
            } else {
                backoff = Backoff::new();
            }
        }
    }

    fn spawn_completer(self: &Arc<Self>) {
        let me = self.clone();
        drop(U::spawn(move || me.completer_main()));
    }

    fn completer_main(self: Arc<Self>) {
        // Spawned work-first by the executor right after its first post:
        // let the executor go on posting; the command just posted has
        // hardly completed yet.
        U::yield_now();
        let mut tags: [Tag; BATCH] = [0; BATCH];
        let mut done: [Option<Callback>; BATCH] = [const { None }; BATCH];
        loop {
            let n = {
                // Poll up to a batch of completions in one device call, but
                // ask for no more than are in flight.
                let mut guard = self.lock_device();
                let st = &mut *guard;
                let limit = BATCH.min(self.in_flight.load(Ordering::Acquire)).max(1);
                let n = st.dev.poll_batch(&mut tags[..limit]);
                assert!(n <= limit, "Device::poll_batch reported more than asked");
                for (&tag, cb) in tags[..n].iter().zip(&mut done) {
                    *cb = Some(
                        st.callbacks[tag]
                            .take()
                            .expect("a completed command was posted and has a callback"),
                    );
                    st.free_tags.push(tag);
                }
                n
            };
            if n == 0 {
                U::yield_now();
                continue;
            }
            for cb in &mut done[..n] {
                (cb.take().expect("filled above"))();
            }
            // The executor counts what it posts in the same lock hold, and
            // only we decrease the count, so `n` never exceeds it.
            if self.in_flight.fetch_sub(n, Ordering::AcqRel) == n {
                return;
            }
        }
    }
}

impl<D: Device, U: UltItf> Drop for Offloader<D, U> {
    fn drop(&mut self) {
        // Executors and completers hold an `Arc`: when we get here none runs,
        // and every submitted command was taken by an executor.
        debug_assert_eq!(
            self.tail.load(Ordering::Relaxed) >> 1,
            self.head.load(Ordering::Relaxed)
        );
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use ct_sync::loom_itf::{LoomItf, model};
    use std::sync::Arc;

    /// Completes every command at the next poll, and checks at the end (when
    /// the last executor or completer lets go of the offloader) that both
    /// commands were posted, completed and called back exactly once. With
    /// `one_per_call`, a batched post takes one command only (it takes a
    /// second one and gives it back), so that the executor is left with
    /// commands the device did not accept; otherwise the trait's default
    /// batched calls are used.
    struct Instant {
        one_per_call: bool,
        ready: Vec<Tag>,
        posted: usize,
        completed: usize,
        callbacks: Arc<loom::sync::Mutex<usize>>,
    }
    impl Device for Instant {
        type Command = ();
        fn post(&mut self, (): (), tag: Tag) -> Result<(), ()> {
            self.posted += 1;
            self.ready.push(tag);
            Ok(())
        }
        fn poll(&mut self) -> Option<Tag> {
            let t = self.ready.pop()?;
            self.completed += 1;
            Some(t)
        }
        fn post_batch(&mut self, batch: &mut PostBatch<'_, ()>) {
            if !self.one_per_call {
                // The trait's default.
                while let Some((c, tag)) = batch.take() {
                    if let Err(c) = self.post(c, tag) {
                        batch.give_back(c);
                        return;
                    }
                }
                return;
            }
            if let Some(((), tag)) = batch.take() {
                self.post((), tag).unwrap();
            }
            if let Some((c, _)) = batch.take() {
                batch.give_back(c);
            }
        }
    }
    impl Drop for Instant {
        fn drop(&mut self) {
            assert_eq!(self.posted, 2, "every command posted once");
            assert_eq!(self.completed, 2, "every command completed once");
            // (A loom mutex, so that the model sees the callbacks happen
            // before this check; the `Arc`s' own atomics are invisible to it.)
            assert_eq!(
                *self.callbacks.lock().unwrap(),
                2,
                "every callback ran once"
            );
        }
    }

    /// Two submissions from one requester (see the tests below).
    fn two_submissions(one_per_call: bool) {
        model(2, move || {
            let callbacks = Arc::new(loom::sync::Mutex::new(0usize));
            let off = Offloader::<Instant, LoomItf>::new(
                Instant {
                    one_per_call,
                    ready: Vec::new(),
                    posted: 0,
                    completed: 0,
                    callbacks: callbacks.clone(),
                },
                4,
            );
            let submit = move |off: &Arc<Offloader<Instant, LoomItf>>,
                               cbs: Arc<loom::sync::Mutex<usize>>| {
                off.submit((), move || {
                    let mut n = cbs.lock().unwrap();
                    *n += 1;
                    assert!(*n <= 2, "a callback ran twice");
                });
            };
            // The second submission races with the first executor's exit.
            // (One requester keeps the thread count within loom's limit:
            // up to two executors and two completers may come and go.)
            submit(&off, callbacks.clone());
            submit(&off, callbacks);
        });
    }

    /// Submissions race with executors starting and exiting (and with
    /// completers): no command is lost or run twice, and two executors never
    /// run at once (asserted inside the executor). Every thread ends on its
    /// own — none is left spinning on an empty queue — which is what lets the
    /// model finish.
    #[test]
    fn loom_executor_spawn_or_exit() {
        two_submissions(false);
    }

    /// As above with a device that accepts one command per batched post:
    /// an executor with a command the device left must not exit, and posts
    /// it (once) in a later call.
    #[test]
    fn loom_executor_partial_batches() {
        two_submissions(true);
    }
}
