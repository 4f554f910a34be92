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
//! The device itself is behind a spinlock: its `post` and `poll` are not
//! thread-safe, and the executor and completer may run on different workers.
//! Each of them makes up to [`BATCH`] device calls per hold of the lock, so
//! that the lock and the device state change cores once per batch, and
//! yields (rather than spins) while the other one holds it.
//!
//! Executors and completers are threads of the threading interface `U` —
//! user-level threads by default, so an idle offloader costs nothing. Spawns
//! are work-first (the child runs at once), so a new executor or completer
//! first yields: the requester returns from [`Offloader::submit`] at once, as
//! with the seed's parent-first spawn, and the executor then finds a batch.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use ct_sync::{SpinLock, SpinLockGuard};
use ct_worker::{Ult, UltItf};

use crate::sync::{AtomicBool, AtomicUsize, Backoff, Ordering};

/// Most commands the executor posts, or completions the completer polls,
/// per hold of the device lock.
pub const BATCH: usize = 32;

/// Identifies a command in flight on a [`Device`].
pub type Tag = usize;

/// A device with non-thread-safe `post` and `poll` (a NIC queue pair, an MPI
/// library in serialised mode, an emulation).
pub trait Device: Send + 'static {
    /// A command to post.
    type Command: Send + 'static;
    /// Posts `command`, to be reported by `poll` with `tag` when it completes.
    /// Returns the command if the device cannot take it now (e.g. its queue is
    /// full); it is posted again after polling.
    fn post(&mut self, command: Self::Command, tag: Tag) -> Result<(), Self::Command>;
    /// Returns the tag of one completed command, if any.
    fn poll(&mut self) -> Option<Tag>;
}

/// What runs when a command completes.
pub type Callback = Box<dyn FnOnce() + Send>;

struct CmdSlot<C> {
    visible: AtomicBool,
    cmd: UnsafeCell<MaybeUninit<(C, Callback)>>,
}

struct DeviceState<D> {
    dev: D,
    callbacks: Vec<Option<Callback>>,
    free_tags: Vec<Tag>,
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
                    cmd: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            device: SpinLock::new(DeviceState {
                dev: device,
                callbacks: Vec::new(),
                free_tags: Vec::new(),
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
        unsafe { (*slot.cmd.get()).write((command, Box::new(on_complete))) };
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
        // A command the device refused, to post again before any other.
        let mut held: Option<(D::Command, Callback)> = None;
        let mut backoff = Backoff::new();
        loop {
            let t = self.tail.load(Ordering::Acquire);
            if held.is_none() && h == t >> 1 {
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
            // Post the held command and then the queued ones, in order, up to
            // a batch per lock hold: the lock and the device state then move
            // between the executor's and the completer's workers once per
            // batch rather than once per command.
            let mut posted = 0;
            let mut refused = false;
            let was_idle = {
                let mut st = self.lock_device();
                while posted < BATCH {
                    let (cmd, cb) = match held.take() {
                        Some(c) => c,
                        None => {
                            if h == t >> 1 {
                                break;
                            }
                            let slot = self.slot(h);
                            // A requester reserved the slot and may still be
                            // filling it: post what we have, wait outside.
                            if !slot.visible.load(Ordering::Acquire) {
                                break;
                            }
                            // SAFETY: visible means written; we are the only
                            // executor.
                            let c = unsafe { (*slot.cmd.get()).assume_init_read() };
                            slot.visible.store(false, Ordering::Relaxed);
                            h += 1;
                            self.head.store(h, Ordering::Release);
                            c
                        }
                    };
                    let tag = match st.free_tags.pop() {
                        Some(tag) => tag,
                        None => {
                            st.callbacks.push(None);
                            st.callbacks.len() - 1
                        }
                    };
                    match st.dev.post(cmd, tag) {
                        Ok(()) => {
                            st.callbacks[tag] = Some(cb);
                            posted += 1;
                        }
                        Err(back) => {
                            st.free_tags.push(tag);
                            held = Some((back, cb));
                            refused = true;
                            break;
                        }
                    }
                }
                // Count the commands before the completer can poll them (it
                // polls under this lock), so that its count never runs below
                // what it has polled.
                posted > 0 && self.in_flight.fetch_add(posted, Ordering::AcqRel) == 0
            };
            if was_idle {
                self.spawn_completer();
            }
            if refused {
                // The device is full, so commands are in flight and a
                // completer is draining it: retry shortly.
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
        let mut done: [Option<Callback>; BATCH] = [const { None }; BATCH];
        loop {
            let n = {
                // Poll up to a batch of completions per lock hold, but no
                // more than are in flight: a poll that cannot succeed would
                // only delay the callbacks.
                let mut st = self.lock_device();
                let limit = BATCH.min(self.in_flight.load(Ordering::Acquire)).max(1);
                let mut n = 0;
                while n < limit {
                    let Some(tag) = st.dev.poll() else { break };
                    st.free_tags.push(tag);
                    done[n] = Some(
                        st.callbacks[tag]
                            .take()
                            .expect("a posted command has a callback"),
                    );
                    n += 1;
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
    /// commands were posted, completed and called back exactly once.
    struct Instant {
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

    /// Submissions race with executors starting and exiting (and with
    /// completers): no command is lost or run twice, and two executors never
    /// run at once (asserted inside the executor). Every thread ends on its
    /// own — none is left spinning on an empty queue — which is what lets the
    /// model finish.
    #[test]
    fn loom_executor_spawn_or_exit() {
        model(2, || {
            let callbacks = Arc::new(loom::sync::Mutex::new(0usize));
            let off = Offloader::<Instant, LoomItf>::new(
                Instant {
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
}
