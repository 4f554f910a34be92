//! The doorbell bridge: a user-level thread that has to sleep until its
//! process's doorbell rings parks in a suspended-thread slot instead of
//! sleeping its worker's OS thread in `FUTEX_WAIT`, so the worker runs its
//! other threads meanwhile, and sleeps only when it has none.
//!
//! One *watcher* OS thread per communicator, started on first use, sleeps
//! on the doorbell for the parked threads:
//!
//! - **A waiter** (`ShmCom::wait_until`, after its spin and yield rounds)
//!   has counted itself in the slot's `sleepers` (so that ringers bump the
//!   doorbell and wake the watcher), read the doorbell value `seen`, and
//!   polled once more. It registers a [`Waiter`] holding `seen` and parks in
//!   it with `wait_with`, whose decision (run once the thread can be woken)
//!   fences and re-reads the doorbell: a ring since `seen` cancels the park.
//! - **The watcher**, while any waiter is registered, reads the doorbell
//!   (`now`), fences, wakes every registered waiter whose `seen` differs
//!   from `now` (a ring since it polled), and then `FUTEX_WAIT`s on `now`
//!   for at most [`HEARTBEAT`]. After a timeout it wakes every waiter
//!   regardless: a safety net, and the heartbeat by which parked waiters
//!   re-check peer failures, the watchdog and `/proc`, as the futex sleep's
//!   timeout makes an OS thread do. With no waiter registered it sleeps on
//!   a condition variable and costs nothing. It wakes a waiter from outside
//!   the runtime: ct-worker's `notify` called on a thread that is no worker
//!   puts the thread in its runtime's global queue and wakes a sleeping
//!   worker.
//!
//! **No lost wake-up.** A ring after the waiter read `seen` either precedes
//! the decision's read (which then sees it: no park), or follows it; then
//! the decision's fence precedes the ring, which precedes the watcher's read
//! of a value other than `seen` and its fence, so the watcher's wake-up
//! sees the waiter published in its slot (and its registration, made before
//! it parked) — the store-buffer pattern with `SeqCst` fences on both
//! sides, as between ringers and `FUTEX_WAIT` sleepers. A waiter the
//! watcher finds registered but not parked yet is kept for the next round
//! (its decision then sees the ring itself, by the same argument).
//!
//! **The end.** Dropping the bridge (the communicator) sets `stop`, wakes
//! the watcher (condition variable, and a doorbell bump for the futex) and
//! joins it; no waiter can be parked then, since waiters borrow the
//! communicator. The watcher never keeps the process alive: it is a plain
//! thread that `main`'s return ends like any other.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ct_worker::{SuspendedThreadItf, UltItf};

/// Longest a parked waiter stays parked without a ring: then it polls,
/// checks for failures and the watchdog, and looks at its peers in `/proc`
/// (every 64 ms) as after a futex sleep. Every condition a wait waits for
/// comes with a ring (so does a process's end, from the launcher or a peer
/// that saw it in `/proc`), so this only bounds what a stopped launcher
/// costs and is a safety net. Longer than the futex sleep's 1 ms timeout:
/// each wake-up of a parked thread also wakes its worker, and waking four
/// idle processes' workers every millisecond cost 5 times the CPU of their
/// futex sleeps (0.75 s against 0.15 s in 2 s,
/// `parked_user_level_threads_do_not_burn_cpu`).
pub(super) const HEARTBEAT: Duration = Duration::from_millis(16);

/// The watcher thread's name (`/proc/self/task/*/comm`).
pub(super) const WATCHER_NAME: &str = "menps-bell";

/// A parked (or parking) user-level thread, registered with the watcher.
struct Waiter<U: UltItf> {
    /// Where it parks.
    thread: U::SuspendedThread,
    /// The doorbell value it read before its last poll.
    seen: u32,
    /// Set by the waiter once it has left (woken, or did not park): the
    /// watcher then forgets it.
    done: AtomicBool,
}

/// What the watcher and the waiters share.
struct State<U: UltItf> {
    /// Registered waiters (some may be done, or not parked yet).
    waiters: Vec<Arc<Waiter<U>>>,
    /// The watcher sleeps on the condition variable (no waiter to watch for).
    idle: bool,
    /// The communicator is going away: the watcher returns.
    stop: bool,
}

/// The doorbell's address, for the watcher thread.
#[derive(Clone, Copy)]
struct BellPtr(*const AtomicU32);

// SAFETY: the pointer is only dereferenced as a `&AtomicU32` (which is
// `Sync`) while the communicator that owns the mapping lives; see `bell`.
unsafe impl Send for BellPtr {}
// SAFETY: as above.
unsafe impl Sync for BellPtr {}

/// The watcher's side of the bridge.
struct Shared<U: UltItf> {
    state: Mutex<State<U>>,
    wake: Condvar,
    doorbell: BellPtr,
}

impl<U: UltItf> Shared<U> {
    fn lock(&self) -> MutexGuard<'_, State<U>> {
        // Nothing panics while holding the lock; a poisoned one is still
        // consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The doorbell.
    fn bell(&self) -> &AtomicU32 {
        // SAFETY: the doorbell lives in the control memory mapping, which
        // the communicator owning this bridge unmaps only after dropping the
        // bridge, which joins the watcher first (`Bell::shutdown`); waiters
        // use it while they borrow the communicator.
        unsafe { &*self.doorbell.0 }
    }
}

/// A running watcher: what it shares with the waiters, and its thread.
struct Watcher<U: UltItf> {
    shared: Arc<Shared<U>>,
    thread: JoinHandle<()>,
}

/// The bridge from a process's doorbell to parked user-level threads: the
/// registry of parked waiters and the watcher thread, started lazily (see
/// the [module docs](self)).
pub(super) struct Bell<U: UltItf> {
    /// `None` inside: the watcher could not be started (waiters then sleep
    /// on the futex, as OS threads do).
    watcher: OnceLock<Option<Watcher<U>>>,
}

impl<U: UltItf> Bell<U> {
    /// A bridge whose watcher is not started yet.
    pub(super) fn new() -> Self {
        Bell {
            watcher: OnceLock::new(),
        }
    }

    /// Parks the calling user-level thread until the watcher wakes it: the
    /// doorbell rang since it read `seen` (before its last poll, after
    /// counting itself in the slot's sleepers), or [`HEARTBEAT`] passed, or
    /// spuriously. Returns at once if the doorbell already moved on from
    /// `seen`. Returns `false`, without waiting, if the watcher cannot run
    /// (the caller then sleeps on the futex).
    ///
    /// `doorbell` must be the doorbell of the communicator owning `self`,
    /// the same every call.
    pub(super) fn park(&self, doorbell: &AtomicU32, seen: u32) -> bool {
        let Some(Watcher { shared, .. }) = self.watcher.get_or_init(|| start::<U>(doorbell)) else {
            return false;
        };
        debug_assert!(std::ptr::eq(shared.doorbell.0, doorbell));
        let me = Arc::new(Waiter::<U> {
            thread: U::SuspendedThread::default(),
            seen,
            done: AtomicBool::new(false),
        });
        {
            let mut st = shared.lock();
            st.waiters.push(me.clone());
            if st.idle {
                st.idle = false;
                shared.wake.notify_one();
            }
        }
        // `move`: the decision may still run after we are resumed elsewhere
        // (see `wait_with`); it holds a reference into the control mapping
        // (borrowed for the whole wait) and a copy of `seen`.
        me.thread.wait_with(move || {
            fence(Ordering::SeqCst);
            doorbell.load(Ordering::SeqCst) == seen
        });
        me.done.store(true, Ordering::Release);
        true
    }

    /// Stops and joins the watcher, if it was started. Idempotent.
    ///
    /// Called with no waiter parked (waiters borrow the communicator).
    pub(super) fn shutdown(&mut self) {
        let Some(Some(Watcher { shared, thread })) = self.watcher.take() else {
            return;
        };
        {
            let mut st = shared.lock();
            st.stop = true;
            shared.wake.notify_one();
        }
        // Out of its futex sleep at once: the value it sleeps on changes.
        // (Nobody else sleeps on this process's doorbell now; a bump is a
        // spurious wake-up to anyone who does.)
        let bell = shared.bell();
        bell.fetch_add(1, Ordering::SeqCst);
        crate::sys::futex_wake_all(bell);
        if thread.join().is_err() {
            log::error!("menps: the shm doorbell watcher panicked");
        }
    }
}

impl<U: UltItf> Drop for Bell<U> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the watcher of `doorbell`; `None` (with a warning) if the thread
/// cannot be created.
fn start<U: UltItf>(doorbell: &AtomicU32) -> Option<Watcher<U>> {
    let shared = Arc::new(Shared::<U> {
        state: Mutex::new(State {
            waiters: Vec::new(),
            idle: false,
            stop: false,
        }),
        wake: Condvar::new(),
        doorbell: BellPtr(doorbell),
    });
    let theirs = shared.clone();
    match std::thread::Builder::new()
        .name(WATCHER_NAME.into())
        .spawn(move || watch(&theirs))
    {
        Ok(thread) => Some(Watcher { shared, thread }),
        Err(e) => {
            log::warn!(
                "menps: cannot start the shm doorbell watcher ({e}); \
                 user-level threads will sleep their workers while they wait"
            );
            None
        }
    }
}

/// The watcher thread: wakes the registered waiters on every ring and
/// every [`HEARTBEAT`]; sleeps on the condition variable while there are none.
fn watch<U: UltItf>(shared: &Shared<U>) {
    let bell = shared.bell();
    // Waiters taken out of the registry for one round (its allocation is
    // reused).
    let mut round: Vec<Arc<Waiter<U>>> = Vec::new();
    // Whether the last futex sleep ended without a ring (a timeout, or a
    // spurious return): then every waiter is woken.
    let mut everyone = false;
    loop {
        {
            let mut st = shared.lock();
            loop {
                if st.stop {
                    return;
                }
                if !st.waiters.is_empty() {
                    break;
                }
                st.idle = true;
                // Waiters registered from now on have read the doorbell
                // after the last futex sleep: no timeout concerns them.
                everyone = false;
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.idle = false;
            std::mem::swap(&mut round, &mut st.waiters);
        }
        // Read and fence before looking at the slots (see the module docs).
        let now = bell.load(Ordering::SeqCst);
        fence(Ordering::SeqCst);
        round.retain(|w| {
            if w.done.load(Ordering::Acquire) {
                return false;
            }
            if !everyone && w.seen == now {
                return true;
            }
            // Not parked yet: it sees the ring itself, or parks and is
            // woken next round.
            !w.thread.notify()
        });
        if !round.is_empty() {
            shared.lock().waiters.append(&mut round);
        }
        crate::sys::futex_wait(bell, now, HEARTBEAT);
        everyone = bell.load(Ordering::Relaxed) == now;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ct_worker::Ult;

    use crate::com::shm::ShmCom;
    use crate::com::{P2p, Source};

    /// Two user-level threads ping-pong through messages to self, every
    /// wait parking at once (no spin or yield rounds), on one worker (the
    /// parked thread's worker runs the other) and on two (the parked
    /// thread's worker sleeps): every exchange goes through the doorbell's
    /// watcher, and each round trip must arrive (a wake-up the watcher
    /// never delivers hangs the exchange; the test gives up after a minute).
    #[test]
    fn parked_threads_ping_pong() {
        const ROUNDS: u32 = 2000;
        for workers in [1, 2] {
            let mut com = ShmCom::<Ult>::single().unwrap();
            (com.spin_rounds, com.yield_rounds) = (0, 0);
            let com = Arc::new(com);
            let (done, finished) = std::sync::mpsc::channel();
            let runner = {
                let com = com.clone();
                std::thread::spawn(move || {
                    let rt = ct_worker::Runtime::builder()
                        .workers(workers)
                        .build()
                        .unwrap();
                    rt.block_on(|| {
                        let pong = {
                            let com = com.clone();
                            ct_worker::spawn(move || {
                                for i in 0..ROUNDS {
                                    let (_, m) = com.recv(Source::Rank(0), 1).unwrap();
                                    assert_eq!(m, i.to_le_bytes());
                                    com.send(0, 2, &m).unwrap();
                                }
                            })
                        };
                        for i in 0..ROUNDS {
                            com.send(0, 1, &i.to_le_bytes()).unwrap();
                            let (_, m) = com.recv(Source::Rank(0), 2).unwrap();
                            assert_eq!(m, i.to_le_bytes());
                        }
                        pong.join();
                    });
                    let _ = done.send(());
                })
            };
            assert!(
                finished.recv_timeout(Duration::from_secs(60)).is_ok(),
                "{workers} worker(s): the ping-pong hung"
            );
            runner.join().unwrap();
            assert!(Arc::into_inner(com).is_some());
        }
    }
}
