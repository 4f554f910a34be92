//! The threading interface higher layers are written against, with two
//! implementations: this crate's user-level threads ([`Ult`]) and plain OS
//! threads ([`OsThreads`]).
//!
//! `ct-sync`, `ct-delegate` and the DSM are generic over [`UltItf`], so the
//! same mutex or delegator runs on user-level threads or on OS threads — the
//! seed's "composable on top of another scheduler".

use core::marker::PhantomData;

use crate::config::{Config, DefaultConfig};
use crate::handle::{JoinHandle, spawn_in, yield_now_in};
use crate::idle::IdleHook;
use crate::suspended::SuspendedThread;
use crate::worker::current_info;

/// A slot for one parked thread; see [`SuspendedThread`] for the semantics.
pub trait SuspendedThreadItf: Default + Send + Sync + 'static {
    /// Parks the caller here unless `decide` (run once the caller can be woken)
    /// returns `false`. Returns whether the caller parked.
    fn wait_with(&self, decide: impl FnOnce() -> bool) -> bool;
    /// Makes the parked thread runnable. Returns whether one was parked.
    fn notify(&self) -> bool;
    /// Makes the parked thread runnable where it parked, if the
    /// implementation has such a notion (otherwise like `notify`).
    fn notify_home(&self) -> bool {
        self.notify()
    }
    /// Wakes the thread parked in each of `slots` with `notify_home`, waiting
    /// at a slot until a thread has parked in it. Implementations may batch
    /// the wake-ups (ct-worker's threads go to their workers' inboxes one
    /// batch per worker).
    fn notify_home_each<'a>(slots: impl IntoIterator<Item = &'a Self>)
    where
        Self: 'a,
    {
        for slot in slots {
            let mut backoff = crate::Backoff::new();
            while !slot.notify_home() {
                backoff.snooze(std::thread::yield_now);
            }
        }
    }
    /// Runs the parked thread now if the implementation can switch to it
    /// (otherwise like `notify`). Returns whether one was parked.
    fn enter(&self) -> bool;
    /// Parks the caller in `self` and runs the thread parked in `next`.
    fn swap(&self, next: &Self) {
        self.swap_with(next, || true);
    }
    /// Conditional `swap`; returns whether the caller parked. By default the
    /// caller parks with `decide`, which wakes `next` once it says yes
    /// (an implementation that can switch straight to `next` does that).
    fn swap_with(&self, next: &Self, decide: impl FnOnce() -> bool) -> bool {
        self.wait_with(|| {
            if decide() {
                next.notify();
                true
            } else {
                false
            }
        })
    }
    /// Whether no thread is parked here.
    fn is_empty(&self) -> bool;
}

/// A handle to join a spawned thread.
pub trait JoinHandleItf<T>: Send {
    /// Waits for the thread; re-raises its panic.
    fn join(self) -> T;
    /// Whether the thread has finished.
    fn is_finished(&self) -> bool;
}

/// What a threading library offers to the layers above it.
pub trait UltItf: Send + Sync + 'static {
    /// Parked-thread slot.
    type SuspendedThread: SuspendedThreadItf;
    /// Join handle of a spawned thread.
    type JoinHandle<T: Send + 'static>: JoinHandleItf<T>;
    /// Starts a thread.
    fn spawn<F, T>(f: F) -> Self::JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static;
    /// Lets other threads run.
    fn yield_now();
    /// Index of the worker (or OS thread slot) running the caller, below
    /// [`UltItf::num_workers`] for user-level threads.
    fn worker_index() -> usize;
    /// Number of workers.
    fn num_workers() -> usize;
    /// Whether [`UltItf::spawn`] is cheap enough to fork a few helpers
    /// for a job of some hundred microseconds (user-level threads: yes;
    /// OS threads, whose creation costs tens of microseconds and competes
    /// with the caller's peers for the processors: no).
    const CHEAP_SPAWN: bool = false;
    /// Whether the caller runs on a worker that runs idle hooks
    /// ([`crate::idle`]); `false` for libraries without them.
    fn runs_idle_hooks() -> bool {
        false
    }
    /// Queues `hook` to run (with `data`) when the caller's worker runs out
    /// of runnable threads, like [`crate::defer_until_idle`]. Returns `false` (and does
    /// nothing) where [`UltItf::runs_idle_hooks`] is `false`.
    ///
    /// # Safety
    ///
    /// As for [`crate::defer_until_idle`].
    unsafe fn defer_until_idle(hook: &IdleHook, data: *const ()) -> bool {
        let _ = (hook, data);
        false
    }
    /// Whether the caller may wait for a short while (a few microseconds)
    /// by polling, keeping its worker busy, instead of parking: where
    /// parking and being woken cost more than such a wait usually lasts
    /// (a barrier whose other threads run on other processors). `true`
    /// only where that wastes nothing: the caller is a user-level thread
    /// whose worker has no other thread ready to run and no idle hook
    /// queued, and whose runtime keeps idle workers awake anyway
    /// ([`Runtime::set_stay_awake`](crate::Runtime::set_stay_awake)); a
    /// waiter should ask again now and then while it polls. `false` for
    /// libraries that cannot tell.
    fn may_wait_awake() -> bool {
        false
    }
}

/// This crate's user-level threads, for a runtime of configuration `C`.
#[derive(Debug)]
pub struct Ult<C: Config = DefaultConfig>(PhantomData<fn() -> C>);

impl<C: Config> SuspendedThreadItf for SuspendedThread<C> {
    fn wait_with(&self, decide: impl FnOnce() -> bool) -> bool {
        SuspendedThread::wait_with(self, decide)
    }
    fn notify(&self) -> bool {
        SuspendedThread::notify(self)
    }
    fn notify_home(&self) -> bool {
        SuspendedThread::notify_home(self)
    }
    fn notify_home_each<'a>(slots: impl IntoIterator<Item = &'a Self>)
    where
        Self: 'a,
    {
        SuspendedThread::notify_home_each(slots)
    }
    fn enter(&self) -> bool {
        SuspendedThread::enter(self)
    }
    fn swap(&self, next: &Self) {
        SuspendedThread::swap(self, next)
    }
    fn swap_with(&self, next: &Self, decide: impl FnOnce() -> bool) -> bool {
        SuspendedThread::swap_with(self, next, decide)
    }
    fn is_empty(&self) -> bool {
        SuspendedThread::is_empty(self)
    }
}

impl<T: Send + 'static, C: Config> JoinHandleItf<T> for JoinHandle<T, C> {
    fn join(self) -> T {
        JoinHandle::join(self)
    }
    fn is_finished(&self) -> bool {
        JoinHandle::is_finished(self)
    }
}

impl<C: Config> UltItf for Ult<C> {
    type SuspendedThread = SuspendedThread<C>;
    type JoinHandle<T: Send + 'static> = JoinHandle<T, C>;

    fn spawn<F, T>(f: F) -> JoinHandle<T, C>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        spawn_in::<C, F, T>(f)
    }

    fn yield_now() {
        yield_now_in::<C>();
    }

    fn worker_index() -> usize {
        current_info().map_or(0, |(_, i, _)| i)
    }

    fn num_workers() -> usize {
        current_info().map_or(1, |(_, _, n)| n)
    }

    const CHEAP_SPAWN: bool = true;

    fn runs_idle_hooks() -> bool {
        crate::idle::runs_idle_hooks()
    }

    unsafe fn defer_until_idle(hook: &IdleHook, data: *const ()) -> bool {
        // SAFETY: forwarded contract.
        unsafe { crate::idle::defer_until_idle(hook, data) }
    }

    fn may_wait_awake() -> bool {
        crate::worker::Worker::<C>::current()
            .filter(|w| w.running().is_some())
            .is_some_and(|w| w.may_wait_awake())
    }
}
