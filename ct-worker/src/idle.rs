//! Idle hooks: actions a worker runs when it runs out of runnable threads.
//!
//! A synchronization object can leave work for the worker's idle time
//! instead of doing it in every thread: a barrier counts the arrivals of the
//! threads of one worker locally and publishes them in one atomic operation
//! once they have all parked (the worker then has nothing else to run), and
//! while the worker idles it watches the barrier's generation, so that its
//! threads are woken by their own worker instead of across cores.
//!
//! A hook is queued on the worker of the OS thread that calls
//! [`defer_until_idle`]. The worker runs its hooks whenever it finds no
//! runnable thread of its own — before it looks at the global queue or at
//! other workers — and keeps running them, in short intervals, while it spins
//! idle. A hook stays queued until it reports that it is done. Before the
//! worker sleeps it runs its hooks in [`IdleMode::Sleep`]: a hook that is not
//! done must then make sure that whatever it waits for wakes the worker (for
//! example by letting the event wake a thread parked on that worker, which
//! puts the thread in the worker's inbox and wakes the worker).
//!
//! Hooks run on the worker's scheduler stack, not in a user-level thread:
//! they may wake parked threads, but must not block or park; a hook that
//! panics aborts the process.

use core::cell::Cell;
use core::ptr;

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleMode {
    /// The worker has no runnable thread and keeps looking for one.
    Poll,
    /// The worker is about to sleep (it has registered as a sleeper, so a
    /// wake-up sent from now on reaches it). A hook that is not done must
    /// make sure an event it waits for wakes the worker.
    Sleep,
}

/// The function of an [`IdleHook`]: called with the data pointer given to
/// [`defer_until_idle`] and the mode; returns whether the hook is done (and
/// leaves the worker's queue).
///
/// # Safety
///
/// Called only by the worker that the hook was queued on, while it is queued.
pub type IdleFn = unsafe fn(*const (), IdleMode) -> bool;

/// An action queued on a worker with [`defer_until_idle`] and run when the
/// worker runs out of runnable threads; usually embedded in the object that
/// needs it, whose address is the hook's data pointer.
pub struct IdleHook {
    run: IdleFn,
    /// The argument of `run`, set when the hook is queued.
    data: Cell<*const ()>,
    /// The next hook in the worker's queue (only touched by that worker's OS
    /// thread while the hook is queued).
    next: Cell<*const IdleHook>,
}

// SAFETY: `data` and `next` are only accessed by the OS thread that queues
// the hook and runs it, while it is queued (`defer_until_idle`'s contract);
// `run` is immutable.
unsafe impl Sync for IdleHook {}
// SAFETY: as above.
unsafe impl Send for IdleHook {}

impl core::fmt::Debug for IdleHook {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IdleHook").finish_non_exhaustive()
    }
}

impl IdleHook {
    /// A hook that runs `run`.
    pub const fn new(run: IdleFn) -> Self {
        IdleHook {
            run,
            data: Cell::new(ptr::null()),
            next: Cell::new(ptr::null()),
        }
    }

    /// Sets the data pointer that the hook's function gets.
    ///
    /// # Safety
    ///
    /// The hook must not be queued, or be queued by the calling OS thread.
    pub unsafe fn set_data(&self, data: *const ()) {
        self.data.set(data);
    }

    /// Runs the hook's function in `mode`; returns whether the hook is done.
    /// For threading libraries other than this crate's that implement
    /// [`UltItf::defer_until_idle`](crate::UltItf::defer_until_idle) with
    /// their own queue.
    ///
    /// # Safety
    ///
    /// Only the worker (scheduler) that the hook was handed to may run it,
    /// on the OS thread that handed it over, and only until it is done.
    pub unsafe fn run(&self, mode: IdleMode) -> bool {
        // SAFETY: forwarded contract.
        unsafe { (self.run)(self.data.get(), mode) }
    }
}

/// The idle hooks queued on one worker (a stack, run in one pass).
#[derive(Debug)]
pub(crate) struct IdleHooks {
    head: Cell<*const IdleHook>,
}

impl IdleHooks {
    pub(crate) const fn new() -> Self {
        IdleHooks {
            head: Cell::new(ptr::null()),
        }
    }

    /// Whether any hook is queued.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.head.get().is_null()
    }

    /// Queues `hook`.
    ///
    /// # Safety
    ///
    /// As for [`defer_until_idle`].
    pub(crate) unsafe fn push(&self, hook: &IdleHook) {
        hook.next.set(self.head.get());
        self.head.set(hook);
    }

    /// Runs every queued hook once, in `mode`, and dequeues those that are
    /// done. Returns whether any was done (and so may have woken threads).
    pub(crate) fn run(&self, mode: IdleMode) -> bool {
        // Hooks run on the scheduler's stack: a panic there cannot reach
        // any thread's joiner and would stop the worker for good.
        struct AbortOnPanic;
        impl Drop for AbortOnPanic {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    eprintln!("ct-worker: an idle hook panicked; aborting");
                    std::process::abort();
                }
            }
        }
        let _guard = AbortOnPanic;
        // Take the whole queue: a hook may queue hooks (not itself) while
        // it runs; those are kept and run next time.
        let mut h = self.head.replace(ptr::null());
        let mut any_done = false;
        while !h.is_null() {
            // SAFETY: queued hooks stay valid until they are done (the
            // contract of `defer_until_idle`).
            let hook = unsafe { &*h };
            h = hook.next.get();
            // SAFETY: run by the worker the hook is queued on.
            if unsafe { hook.run(mode) } {
                any_done = true;
            } else {
                // SAFETY: still queued, so still valid.
                unsafe { self.push(hook) };
            }
        }
        any_done
    }
}

/// Queues `hook` on the worker running the caller, to run (with `data`)
/// when that worker runs out of runnable threads (see the [module
/// documentation](self)). Returns `false`, without queueing it, if the
/// caller does not run on a worker of any runtime.
///
/// # Safety
///
/// `hook` must not be queued already, and `hook` and whatever its function
/// uses through `data` must stay valid until the function has reported the
/// hook done; the function must uphold the rules of the module documentation
/// (not block or park). If the worker's runtime shuts down first, the hook is
/// never run again.
pub unsafe fn defer_until_idle(hook: &IdleHook, data: *const ()) -> bool {
    match crate::worker::current_idle_hooks() {
        // SAFETY: forwarded contract; not queued, so ours to set.
        Some(hooks) => unsafe {
            hook.set_data(data);
            hooks.push(hook);
            true
        },
        None => false,
    }
}

/// Whether the caller runs on a worker, which runs idle hooks
/// ([`defer_until_idle`] would queue one).
pub fn runs_idle_hooks() -> bool {
    crate::worker::current_idle_hooks().is_some()
}
