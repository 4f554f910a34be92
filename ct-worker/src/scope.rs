//! Scoped threads: user-level threads that may borrow from the enclosing
//! stack, because the scope waits for all of them before it returns.

use core::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use crate::config::{Config, DefaultConfig};
use crate::handle::{JoinHandle, spawn_unchecked_in};
use crate::suspended::SuspendedThread;

/// A scope in which threads borrowing from the caller can be spawned; see
/// [`scope`].
///
/// The configuration parameter names the runtime the scope was asked of; in
/// a runtime of another configuration the scope is that runtime's (see
/// [`scope_in`]).
// `repr(C)`: a scope of one configuration is used as a scope of another
// (its layout does not depend on it).
#[repr(C)]
pub struct Scope<'scope, 'env: 'scope, C: Config = DefaultConfig> {
    /// Threads not finished yet, plus one for the scope's owner.
    pending: AtomicUsize,
    /// Panics of threads whose handles were not joined.
    unhandled_panics: AtomicUsize,
    /// Where the owner parks, a `SuspendedThread` of the configuration of
    /// the runtime running the scope (`C` unless forwarded).
    owner: SuspendedThread<C>,
    /// Notifies `owner` as a slot of that configuration.
    notify_owner: fn(*const ()) -> bool,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// A handle to a scoped thread; see [`Scope::spawn`].
pub struct ScopedJoinHandle<'scope, T, C: Config = DefaultConfig> {
    inner: JoinHandle<thread::Result<T>, C>,
    scope: &'scope AtomicUsize,
}

/// Runs `f` with a [`Scope`] whose threads may borrow anything that outlives
/// the call; returns once `f` and every thread spawned in the scope have
/// finished. Like [`std::thread::scope`], for user-level threads.
///
/// If a spawned thread panics and its handle is not joined, `scope` panics
/// after all threads have finished. A panic of `f` itself is re-raised (after
/// the threads have finished).
///
/// Works in a runtime of any configuration (see [`scope_in`]).
///
/// # Panics
///
/// [`Scope::spawn`] panics if called outside a user-level thread.
///
/// ```
/// let rt = ct_worker::Runtime::new().unwrap();
/// let mut data = vec![1, 2, 3];
/// let total = rt.block_on(|| {
///     let sum = std::sync::atomic::AtomicI32::new(0);
///     ct_worker::scope(|s| {
///         for x in &data {
///             let sum = &sum;
///             s.spawn(move || sum.fetch_add(*x, std::sync::atomic::Ordering::Relaxed));
///         }
///     });
///     sum.into_inner()
/// });
/// data.push(total);
/// assert_eq!(data, [1, 2, 3, 6]);
/// ```
pub fn scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    scope_in::<DefaultConfig, F, T>(f)
}

/// [`scope`] for a runtime of configuration `C`. In a runtime of another
/// configuration it forwards to that runtime's `scope_in` (the fast path is
/// a runtime of configuration `C`).
pub fn scope_in<'env, C: Config, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env, C>) -> T,
{
    if crate::worker::Worker::<C>::current().is_none()
        && let Some(ops) = crate::worker::current_running_ops()
    {
        return scope_other::<C, F, T>(ops, f);
    }
    let scope = Scope::<C> {
        pending: AtomicUsize::new(1),
        unhandled_panics: AtomicUsize::new(0),
        owner: SuspendedThread::empty(),
        notify_owner: notify_slot::<C>,
        _scope: PhantomData,
        _env: PhantomData,
    };
    let r = panic::catch_unwind(AssertUnwindSafe(|| f(&scope)));
    // Drop our own count; unless we were last, the last thread wakes us (it
    // waits until we are parked, so it never touches the scope after we leave).
    if scope.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
        scope.owner.wait();
    }
    match r {
        Err(p) => panic::resume_unwind(p),
        Ok(_) if scope.unhandled_panics.load(Ordering::Acquire) != 0 => {
            panic!("a scoped thread panicked")
        }
        Ok(v) => v,
    }
}

/// Notifies a `SuspendedThread<C>` at `p`.
fn notify_slot<C: Config>(p: *const ()) -> bool {
    // SAFETY: `p` is the `owner` of a live `Scope<C>` (see `finish_one`).
    unsafe { &*p.cast::<SuspendedThread<C>>() }.notify()
}

/// [`scope_in`] in a runtime of another configuration than `C`: runs `f` in
/// that runtime's scope.
#[inline(never)]
fn scope_other<'env, C: Config, F, T>(ops: &crate::worker::RuntimeOps, f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env, C>) -> T,
{
    let mut f = Some(f);
    let mut r = None;
    (ops.scope)(&mut |p| {
        // SAFETY: `p` is a live scope of the running runtime's configuration,
        // which outlives this call; scopes of all configurations have one
        // layout (`repr(C)`, the configuration only in `SuspendedThread`'s
        // phantom), and `notify_owner` notifies with the right one.
        let s = unsafe { scope_ref::<C>(p) };
        if let Some(f) = f.take() {
            r = Some(f(s));
        }
    });
    r.expect("scope runs its body")
}

/// The scope at `p`, as a `Scope<C>` for the duration of the caller's body.
///
/// # Safety
///
/// `p` is a live `Scope` (of any configuration) that outlives `'a`.
unsafe fn scope_ref<'a, 'env, C: Config>(p: *const ()) -> &'a Scope<'a, 'env, C> {
    // SAFETY: the contract.
    unsafe { &*p.cast::<Scope<'a, 'env, C>>() }
}

/// `RuntimeOps::scope` of configuration `C`.
pub(crate) fn scope_erased<C: Config>(body: &mut dyn FnMut(*const ())) {
    scope_in::<C, _, ()>(|s| body(core::ptr::from_ref(s).cast::<()>()));
}

impl<'scope, 'env, C: Config> Scope<'scope, 'env, C> {
    /// Spawns a thread that may borrow from outside the scope. It runs at once
    /// (work-first); the caller continues when it blocks or finishes, or when
    /// another worker steals the caller.
    pub fn spawn<F, T>(&'scope self, f: F) -> ScopedJoinHandle<'scope, T, C>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        assert!(
            crate::worker::current_running_ops().is_some(),
            "ct-worker: Scope::spawn called outside a user-level thread"
        );
        self.pending.fetch_add(1, Ordering::Relaxed);
        let scope = self;
        let body = move || {
            let r = panic::catch_unwind(AssertUnwindSafe(f));
            if r.is_err() {
                scope.unhandled_panics.fetch_add(1, Ordering::AcqRel);
            }
            scope.finish_one();
            r
        };
        // SAFETY: the scope does not return before every thread spawned in it
        // has called `finish_one`, which is each thread's last use of borrowed
        // data; the result itself is `'scope`.
        let inner = unsafe { spawn_unchecked_in::<C, _, _>(body) };
        ScopedJoinHandle {
            inner,
            scope: &self.unhandled_panics,
        }
    }

    /// A thread of this scope is done with everything it borrows.
    fn finish_one(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Last one out: the owner has dropped its own count and is parking
            // (or parked). Wake it; until it is parked, keep trying. After a
            // successful notify we never touch the scope again.
            let mut backoff = crate::Backoff::new();
            while !(self.notify_owner)(core::ptr::from_ref(&self.owner).cast::<()>()) {
                backoff.snooze(std::thread::yield_now);
            }
        }
    }
}

impl<T, C: Config> ScopedJoinHandle<'_, T, C> {
    /// Waits for the thread; returns its result or its panic's payload. A
    /// panic returned here no longer makes the scope panic.
    pub fn join(self) -> thread::Result<T> {
        let r = self.inner.join();
        if r.is_err() {
            self.scope.fetch_sub(1, Ordering::AcqRel);
        }
        r
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }
}

impl<T, C: Config> core::fmt::Debug for ScopedJoinHandle<'_, T, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ScopedJoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl<C: Config> core::fmt::Debug for Scope<'_, '_, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Scope")
            .field("pending", &self.pending.load(Ordering::Relaxed))
            .finish()
    }
}
