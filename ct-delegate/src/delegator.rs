//! The delegator: a lock that either runs a critical section inline or hands
//! it to whoever holds the lock, with a consumer thread that owns the lock
//! while there is delegated work.
//!
//! Every thread that wants the resource enters one queue
//! ([`DelegationQueue`]). An entry is either a *lock request* (its thread
//! parks in the entry, and is published only after it has parked) or a
//! *delegated request* (a [`Consumer::Request`] published at once; its thread
//! goes on). The holder, when it is done, passes the lock on
//! ([`Delegator::unlock`]):
//!
//! - to the next lock request, waking its thread;
//! - to the consumer thread, if the next entry is a delegated request or the
//!   consumer has outstanding work ([`Consumer::is_active`]);
//! - or it frees the lock.
//!
//! The consumer thread ([`Delegator::start_consumer`]) executes delegated
//! requests in queue order, calls [`Consumer::progress`], hands the lock to
//! lock requests it meets, and parks — releasing the lock in the same step —
//! when idle. Invariant: the consumer either holds the lock or is parked, so a
//! holder that passes the lock to it always finds it.
//!
//! Without a consumer, delegating threads take the lock themselves, and a
//! holder that meets a delegated request executes it.
//!
//! **The gate.** Access to the resource is guarded by a one-byte *gate* in
//! front of the queue. Whoever holds the queue lock holds the gate (a thread
//! that takes the free queue lock then takes the gate; hand-offs pass both),
//! and [`Delegator::execute_or_delegate`] on a free delegator takes only the
//! gate: one CAS, the critical section, one store — as cheap as an
//! uncontended mutex, with no queue entry. A queue holder that finds the
//! gate taken by such an inline section waits the few nanoseconds until it
//! is released.
//!
//! A request the consumer refuses ([`Consumer::execute`] returns it) stays at
//! the head of the queue and is retried after [`Consumer::progress`]: requests
//! are never dropped. (The original cmpth lost an immediately executed request
//! reporting "not executed", and `execute_or_delegate` always returned
//! `false`; see `original-menps-design.md` §7.2.)

use core::cell::Cell;
use core::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use ct_worker::{JoinHandleItf, SuspendedThreadItf, Ult, UltItf};

use crate::completion::{Completion, CompletionRef};
use crate::consumer::Consumer;
use crate::queue::{DelegationQueue, Enqueued, McsQueue};
use crate::sync::{AtomicBool, AtomicU8, Backoff, Ordering, ProtocolCell};

const LOCK: u8 = 0;
const DELEGATED: u8 = 1;
const DONE: u8 = 2;

const NO_CONSUMER: u8 = 0;
const RUNNING: u8 = 1;
const STOPPING: u8 = 2;

/// An entry of a delegator's queue: a lock request or a delegated request.
pub struct Entry<C: Consumer<U>, U: UltItf> {
    kind: Cell<u8>,
    waiter: U::SuspendedThread,
    request: ProtocolCell<Option<C::Request>>,
}

// SAFETY: an entry is written by its producer before it is published and used
// by one lock holder at a time afterwards (the queue protocol).
unsafe impl<C: Consumer<U>, U: UltItf> Send for Entry<C, U> {}

impl<C: Consumer<U>, U: UltItf> Entry<C, U> {
    fn lock_request() -> Self {
        Entry {
            kind: Cell::new(LOCK),
            waiter: U::SuspendedThread::default(),
            request: ProtocolCell::new(None),
        }
    }

    fn delegated(request: C::Request) -> Self {
        Entry {
            kind: Cell::new(DELEGATED),
            waiter: U::SuspendedThread::default(),
            request: ProtocolCell::new(Some(request)),
        }
    }
}

/// Where the lock goes after the holder is done.
enum Next<H> {
    /// To the thread waiting in this lock request.
    Lock(H),
    /// The caller must execute the (new) head's delegated request.
    Execute,
    /// To the consumer thread.
    Consumer,
    /// The consumer keeps the lock to poll its outstanding work.
    Poll,
    /// Nowhere: the lock is free.
    Freed,
}

/// A lock around a [`Consumer`] that can run critical sections inline or
/// delegate them. See the [module docs](self).
///
/// `U` is the threading library (user-level threads by default), `Q` the
/// queue variant: [`McsQueue`] (default, unbounded) or
/// [`RingQueue`](crate::RingQueue) (bounded).
///
/// ```
/// use ct_delegate::{Consumer, Delegator};
/// use std::sync::Arc;
///
/// /// Counts the requests it executes.
/// struct Counter(u64);
/// impl Consumer<ct_worker::Ult> for Counter {
///     type Request = u64;
///     fn execute(&mut self, n: u64) -> Result<(), u64> {
///         self.0 += n;
///         Ok(())
///     }
/// }
///
/// let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
/// let d: Arc<Delegator<Counter>> = Arc::new(Delegator::new(Counter(0)));
/// rt.block_on(|| {
///     d.start_consumer();
///     ct_worker::scope(|s| {
///         for _ in 0..4 {
///             s.spawn(|| {
///                 for _ in 0..1000 {
///                     d.execute_or_delegate(|c| { c.0 += 1; true }, || 1);
///                 }
///             });
///         }
///     });
///     d.stop_consumer();
/// });
/// assert_eq!(d.lock().0, 4000);
/// ```
pub struct Delegator<C, U = Ult, Q = McsQueue<Entry<C, U>>>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    queue: Q,
    /// The holder's entry (only the holder touches it).
    head: ProtocolCell<Option<Q::Handle>>,
    /// Held by the queue holder, or by an inline `execute_or_delegate`
    /// while the queue lock is free; see the module docs.
    gate: AtomicBool,
    /// The resource (only the gate's holder touches it).
    consumer: ProtocolCell<C>,
    /// The consumer thread parks here when it does not hold the lock.
    consumer_slot: U::SuspendedThread,
    consumer_state: AtomicU8,
    consumer_thread: Mutex<Option<U::JoinHandle<()>>>,
}

// SAFETY: the consumer is touched only by the lock holder; entries move
// through the queue protocol.
unsafe impl<C, U, Q> Send for Delegator<C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
}
// SAFETY: as above.
unsafe impl<C, U, Q> Sync for Delegator<C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
}

impl<C, U, Q> Delegator<C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    /// A delegator around `consumer`, with no consumer thread yet.
    pub fn new(consumer: C) -> Self {
        Delegator {
            queue: Q::new(),
            head: ProtocolCell::new(None),
            gate: AtomicBool::new(false),
            consumer: ProtocolCell::new(consumer),
            consumer_slot: U::SuspendedThread::default(),
            consumer_state: AtomicU8::new(NO_CONSUMER),
            consumer_thread: Mutex::new(None),
        }
    }

    // --- holder-only state ----------------------------------------------

    /// # Safety
    ///
    /// Only the holder may call this.
    #[inline]
    unsafe fn head(&self) -> Q::Handle {
        // SAFETY: the holder's entry is set while the lock is held.
        unsafe {
            self.head
                .with(|p| (*p).expect("the holder has a head entry"))
        }
    }

    /// # Safety
    ///
    /// Only the (new) holder may call this.
    #[inline]
    unsafe fn set_head(&self, h: Q::Handle) {
        // SAFETY: exclusive per the contract.
        unsafe { self.head.with_mut(|p| *p = Some(h)) };
    }

    /// # Safety
    ///
    /// Only the holder may call this, and not re-entrantly.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn consumer_mut(&self) -> &mut C {
        // SAFETY: exclusive per the contract.
        unsafe { self.consumer.with_mut(|p| &mut *p) }
    }

    /// Whether a consumer thread exists (running or being stopped).
    pub fn is_consumer_running(&self) -> bool {
        self.consumer_state.load(Ordering::Acquire) != NO_CONSUMER
    }

    /// Whether the lock is held (a hint).
    pub fn is_locked(&self) -> bool {
        self.queue.is_locked()
    }

    // --- the protocol -----------------------------------------------------

    /// Takes the gate if it is free.
    #[inline]
    fn try_gate(&self) -> bool {
        self.gate
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the gate after taking the free queue lock: only an inline
    /// critical section (which never waits for the queue) can hold it, so
    /// this is short.
    fn take_gate(&self) {
        let mut backoff = Backoff::new();
        while !self.try_gate() {
            backoff.snooze(U::yield_now);
        }
    }

    /// Releases the gate (with the queue lock, or after an inline section).
    #[inline]
    fn open_gate(&self) {
        self.gate.store(false, Ordering::Release);
    }

    /// Holder: decides where the lock goes next, moving the head.
    ///
    /// # Safety
    ///
    /// The caller must hold the lock. Never blocks or switches user-level
    /// threads, so it may run in a parking decision.
    unsafe fn pass_on(&self, by_consumer: bool) -> Next<Q::Handle> {
        let mut backoff = Backoff::new();
        loop {
            // SAFETY: we hold the lock.
            unsafe {
                let head = self.head();
                if let Some(next) = self.queue.next(head) {
                    self.queue.advance(head, next);
                    self.set_head(next);
                    return match self.queue.entry(next).kind.get() {
                        LOCK => Next::Lock(next),
                        DELEGATED if by_consumer || !self.is_consumer_running() => Next::Execute,
                        DELEGATED => Next::Consumer,
                        k => unreachable!("queued entry of kind {k}"),
                    };
                }
                if self.is_consumer_running() && self.consumer_mut().is_active() {
                    return if by_consumer {
                        Next::Poll
                    } else {
                        Next::Consumer
                    };
                }
                if self.queue.try_unlock(head) {
                    self.open_gate();
                    return Next::Freed;
                }
            }
            // An entry is queued but not published yet; its producer is
            // running (nothing between enqueueing and publishing blocks).
            backoff.snooze(std::thread::yield_now);
        }
    }

    /// Holder: executes the head's request if it is a pending delegated one,
    /// retrying refusals after progress. `yield_now` is how to wait between
    /// retries (an OS-level yield inside a parking decision).
    ///
    /// # Safety
    ///
    /// The caller must hold the lock.
    unsafe fn run_head(&self, yield_now: fn()) {
        // SAFETY: we hold the lock, so the head entry and the consumer are ours.
        unsafe {
            let e = self.queue.entry(self.head());
            if e.kind.get() != DELEGATED {
                return;
            }
            let mut req = e
                .request
                .with_mut(|p| (*p).take())
                .expect("pending request");
            let c = self.consumer_mut();
            loop {
                match c.execute(req) {
                    Ok(()) => break,
                    Err(back) => {
                        req = back;
                        if let Some(t) = c.progress() {
                            t.notify();
                        }
                        yield_now();
                    }
                }
            }
            e.kind.set(DONE);
        }
    }

    /// Acquires the lock (parking while it is held) and returns a guard that
    /// gives access to the consumer.
    pub fn lock(&self) -> DelegatorGuard<'_, C, U, Q> {
        self.lock_raw();
        DelegatorGuard { d: self }
    }

    fn lock_raw(&self) {
        let mut entry = Entry::lock_request();
        let mut backoff = Backoff::new();
        loop {
            match self.queue.enqueue(entry) {
                Ok(Enqueued::Acquired(h)) => {
                    // SAFETY: we hold the lock.
                    unsafe { self.set_head(h) };
                    self.take_gate();
                    return;
                }
                Ok(Enqueued::Queued(h)) => {
                    // SAFETY: our entry is alive until we hold the lock; we
                    // publish it only once parked, so a holder that sees it can
                    // wake us.
                    unsafe {
                        let e = self.queue.entry(h);
                        // `move`: once published we may be resumed at
                        // once, and our stack may change under the closure.
                        e.waiter.wait_with(move || {
                            self.queue.publish(h);
                            true
                        });
                    }
                    // Woken by a holder that made `h` the head.
                    return;
                }
                Err(back) => {
                    // The ring is full: its holder (or the consumer) is
                    // draining it, on another worker or — once we yield —
                    // on ours.
                    entry = back;
                    backoff.snooze(U::yield_now);
                }
            }
        }
    }

    /// Acquires the lock if it is free.
    pub fn try_lock(&self) -> Option<DelegatorGuard<'_, C, U, Q>> {
        // The gate first: a queue holder always holds it, so this fails fast
        // when the lock is taken.
        if !self.try_gate() {
            return None;
        }
        match self.queue.try_acquire(Entry::lock_request()) {
            Ok(h) => {
                // SAFETY: we hold the lock.
                unsafe { self.set_head(h) };
                Some(DelegatorGuard { d: self })
            }
            Err(_) => {
                self.open_gate();
                None
            }
        }
    }

    /// Releases the lock: passes it to the next waiting thread or to the
    /// consumer thread, or frees it. Without a consumer thread, the caller
    /// first executes the delegated requests it meets.
    ///
    /// # Safety
    ///
    /// The caller must hold the lock (a [`DelegatorGuard`] forgotten with
    /// `mem::forget`, or a lock taken by [`Delegator::lock_raw_unguarded`]).
    pub unsafe fn unlock(&self) {
        loop {
            // SAFETY: we hold the lock.
            match unsafe { self.pass_on(false) } {
                Next::Freed => return,
                Next::Lock(n) => {
                    // SAFETY: the new holder's entry is alive until it runs.
                    unsafe { self.queue.entry(n).waiter.notify() };
                    return;
                }
                Next::Consumer => {
                    // The consumer is parked (it holds the lock or is parked,
                    // and we hold the lock). Run it now: while it waits to be
                    // scheduled it holds the lock, and everybody delegates.
                    self.consumer_slot.enter();
                    return;
                }
                // SAFETY: still holding the lock.
                Next::Execute => unsafe { self.run_head(U::yield_now) },
                Next::Poll => unreachable!("only the consumer polls"),
            }
        }
    }

    /// Acquires the lock without a guard (for code that must release it
    /// elsewhere, e.g. with [`Delegator::unlock_and_wait`]).
    pub fn lock_raw_unguarded(&self) {
        self.lock_raw();
    }

    /// Releases the lock and parks the caller in `slot` in one step (for
    /// condition variables): the caller is in `slot` before anyone else can
    /// take the lock.
    ///
    /// # Safety
    ///
    /// The caller must hold the lock.
    pub unsafe fn unlock_and_wait(&self, slot: &U::SuspendedThread) {
        slot.wait_with(|| {
            // Runs once we are in `slot`; must not switch user-level threads,
            // so delegated requests met here are retried with OS yields.
            loop {
                // SAFETY: we hold the lock until a branch below gives it away.
                match unsafe { self.pass_on(false) } {
                    Next::Freed => return true,
                    Next::Lock(n) => {
                        // SAFETY: as in `unlock`.
                        unsafe { self.queue.entry(n).waiter.notify() };
                        return true;
                    }
                    Next::Consumer => {
                        self.consumer_slot.notify();
                        return true;
                    }
                    // SAFETY: still holding the lock.
                    Next::Execute => unsafe { self.run_head(std::thread::yield_now) },
                    Next::Poll => unreachable!("only the consumer polls"),
                }
            }
        });
    }

    /// Runs `imm` on the consumer inline if the lock is free (the common,
    /// uncontended case: as cheap as a mutex lock/unlock); otherwise
    /// delegates the request made by `del` to the lock holder or consumer
    /// thread and returns at once. `imm` returns whether it could execute; if
    /// not (e.g. a resource is exhausted) the request from `del` is queued
    /// instead and retried later — never dropped.
    ///
    /// Returns `true` iff the request was executed before this call returned.
    /// Without a consumer thread a request is always executed before this
    /// call returns (by the caller, once it has the lock), so this returns
    /// `true`; only a running consumer thread takes requests off the caller.
    #[inline]
    pub fn execute_or_delegate(
        &self,
        imm: impl FnOnce(&mut C) -> bool,
        del: impl FnOnce() -> C::Request,
    ) -> bool {
        // Inline through the gate alone when the queue lock is free. The
        // queue check is not redundant with the gate: between a holder
        // freeing the queue (and opening the gate) and the next queue holder
        // taking the gate, the gate is open while requests may be queued
        // behind that new holder — possibly our own earlier ones, which must
        // run first. With the queue free, all our earlier requests have run.
        // This fast path is inlined into the caller; everything else is not.
        if !self.queue.is_locked() && self.try_gate() {
            // SAFETY: the gate gives us the resource.
            let done = imm(unsafe { self.consumer_mut() });
            self.open_gate();
            if done {
                return true;
            }
            // Refused inline: hand the request on as the contended path does
            // (to the holder or consumer thread if one runs; without a
            // consumer we take the lock and execute it before returning).
            return self.execute_or_delegate_contended(|_| false, del);
        }
        self.execute_or_delegate_contended(imm, del)
    }

    /// [`Delegator::execute_or_delegate`] when the fast path failed.
    #[inline(never)]
    fn execute_or_delegate_contended(
        &self,
        imm: impl FnOnce(&mut C) -> bool,
        del: impl FnOnce() -> C::Request,
    ) -> bool {
        let mut g = match self.try_lock() {
            Some(g) => g,
            None if self.is_consumer_running() => return self.delegate(del()),
            // Nobody to delegate to: wait for the lock and run it ourselves.
            None => self.lock(),
        };
        if imm(&mut g) {
            return true;
        }
        // Refused inline: make it the head's pending request.
        // SAFETY: we hold the lock (the guard).
        unsafe {
            let e = self.queue.entry(self.head());
            let r = del();
            e.request.with_mut(|p| *p = Some(r));
            e.kind.set(DELEGATED);
            if self.is_consumer_running() {
                core::mem::forget(g);
                // The consumer is parked; it now holds the lock and runs the
                // head's request first.
                self.consumer_slot.enter();
                return false;
            }
            self.run_head(U::yield_now);
        }
        true
    }

    /// Queues `request` for the holder or the consumer thread. Returns `true`
    /// if the lock turned out to be free and the request ran inline.
    fn delegate(&self, request: C::Request) -> bool {
        let mut entry = Entry::delegated(request);
        let mut backoff = Backoff::new();
        loop {
            match self.queue.enqueue(entry) {
                Ok(Enqueued::Queued(h)) => {
                    // SAFETY: the entry is ours until published.
                    unsafe { self.queue.publish(h) };
                    return false;
                }
                Ok(Enqueued::Acquired(h)) => {
                    // SAFETY: we hold the lock with our request as the head.
                    unsafe {
                        self.set_head(h);
                        self.take_gate();
                        self.run_head(U::yield_now);
                        self.unlock();
                    }
                    return true;
                }
                Err(back) => {
                    // The ring is full: its holder (or the consumer) is
                    // draining it, on another worker or — once we yield —
                    // on ours.
                    entry = back;
                    backoff.snooze(U::yield_now);
                }
            }
        }
    }

    /// Takes the lock if it is free (returning the guard); otherwise hands
    /// the request made by `del` to the holder or consumer thread and returns
    /// `None` at once.
    pub fn lock_or_delegate(
        &self,
        del: impl FnOnce() -> C::Request,
    ) -> Option<DelegatorGuard<'_, C, U, Q>> {
        if let Some(g) = self.try_lock() {
            return Some(g);
        }
        if self.is_consumer_running() {
            self.delegate(del());
            None
        } else {
            Some(self.lock())
        }
    }

    /// Like [`Delegator::lock_or_delegate`], but when the request is delegated
    /// the caller parks until whoever executes it calls
    /// [`CompletionRef::complete`] on the handle given to `del`.
    pub fn lock_or_delegate_and_wait(
        &self,
        del: impl FnOnce(CompletionRef<U>) -> C::Request,
    ) -> Option<DelegatorGuard<'_, C, U, Q>> {
        if let Some(g) = self.try_lock() {
            return Some(g);
        }
        if !self.is_consumer_running() {
            return Some(self.lock());
        }
        let done = Completion::<U>::new();
        self.delegate(del(done.handle()));
        done.wait();
        None
    }

    /// Starts the consumer thread (a user-level thread under [`Ult`], so call
    /// it from inside the runtime), which owns the lock while there is
    /// delegated or outstanding work. Does nothing if it is already running.
    pub fn start_consumer(self: &Arc<Self>) {
        let mut th = self
            .consumer_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if th.is_some() {
            return;
        }
        // Take the lock and give it to the new thread.
        self.lock_raw();
        self.consumer_state.store(RUNNING, Ordering::Release);
        let me = self.clone();
        // SAFETY: the lock is ours, and passes to the consumer thread.
        *th = Some(U::spawn(move || unsafe { me.consumer_main() }));
    }

    /// Stops the consumer thread after it has executed everything queued so
    /// far; later delegations are executed by lock holders. Does nothing if
    /// no consumer runs.
    pub fn stop_consumer(&self) {
        let th = self
            .consumer_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(th) = th else { return };
        // With the lock held, the consumer is parked: wake it holding the lock
        // and with the stop flag set.
        self.lock_raw();
        self.consumer_state.store(STOPPING, Ordering::Release);
        self.consumer_slot.notify();
        th.join();
    }

    /// The consumer thread.
    ///
    /// # Safety
    ///
    /// Must start holding the lock.
    unsafe fn consumer_main(&self) {
        loop {
            // SAFETY: we hold the lock at the top of every iteration.
            unsafe {
                self.run_head(U::yield_now);
                let c = self.consumer_mut();
                if let Some(t) = c.progress() {
                    t.notify();
                }
                if self.consumer_state.load(Ordering::Acquire) == STOPPING {
                    self.consumer_state.store(NO_CONSUMER, Ordering::Release);
                    // Release as an ordinary holder (executing whatever was
                    // delegated to us in the meantime).
                    self.unlock();
                    return;
                }
                if self.queue.next(self.head()).is_some() {
                    match self.pass_on(true) {
                        Next::Execute => {}
                        Next::Lock(n) => {
                            // Hand the lock over and park, in one switch.
                            self.consumer_slot.swap(&self.queue.entry(n).waiter);
                        }
                        _ => unreachable!("a successor was queued"),
                    }
                    continue;
                }
                if self.consumer_mut().is_active() {
                    U::yield_now();
                    continue;
                }
                // Idle: release the lock and park in one step. Only a holder
                // wakes `consumer_slot`, and we hold the lock until the
                // decision gives it away, so refusing is race-free.
                self.consumer_slot.wait_with(|| match self.pass_on(true) {
                    Next::Freed => true,
                    Next::Lock(n) => {
                        self.queue.entry(n).waiter.notify();
                        true
                    }
                    Next::Execute | Next::Poll => false,
                    Next::Consumer => unreachable!("the consumer holds the lock"),
                });
            }
        }
    }
}

impl<C, U, Q> Drop for Delegator<C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    fn drop(&mut self) {
        // A running consumer holds an `Arc` to us, so dropping means it was
        // stopped (or never started).
        debug_assert!(!self.is_consumer_running());
    }
}

impl<C, U, Q> core::fmt::Debug for Delegator<C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Delegator")
            .field("locked", &self.is_locked())
            .field("consumer_running", &self.is_consumer_running())
            .finish()
    }
}

/// Holds a [`Delegator`]'s lock and gives access to its consumer; releases
/// the lock when dropped.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct DelegatorGuard<'a, C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    d: &'a Delegator<C, U, Q>,
}

impl<C, U, Q> Deref for DelegatorGuard<'_, C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    type Target = C;
    fn deref(&self) -> &C {
        // SAFETY: the guard proves we hold the lock.
        unsafe { self.d.consumer.with(|p| &*p) }
    }
}

impl<C, U, Q> DerefMut for DelegatorGuard<'_, C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    fn deref_mut(&mut self) -> &mut C {
        // SAFETY: the guard proves we hold the lock.
        unsafe { self.d.consumer.with_mut(|p| &mut *p) }
    }
}

impl<C, U, Q> Drop for DelegatorGuard<'_, C, U, Q>
where
    C: Consumer<U>,
    U: UltItf,
    Q: DelegationQueue<Entry<C, U>>,
{
    fn drop(&mut self) {
        // SAFETY: the guard proves we hold the lock.
        unsafe { self.d.unlock() };
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::queue::RingQueue;
    use ct_sync::loom_itf::{LoomItf, model};
    use std::sync::Arc;

    struct Count(u64);
    impl Consumer<LoomItf> for Count {
        type Request = u64;
        fn execute(&mut self, n: u64) -> Result<(), u64> {
            self.0 += n;
            Ok(())
        }
    }

    /// Two requesters and a consumer thread: both requests are executed once,
    /// whether inline or delegated, and the lock ends free.
    fn with_consumer<Q: DelegationQueue<Entry<Count, LoomItf>>>() {
        let d = Arc::new(Delegator::<Count, LoomItf, Q>::new(Count(0)));
        d.start_consumer();
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let d = d.clone();
                loom::thread::spawn(move || {
                    d.execute_or_delegate(
                        |c| {
                            c.0 += 1;
                            true
                        },
                        || 1,
                    );
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        d.stop_consumer();
        assert_eq!(d.lock().0, 2);
        assert!(!d.is_locked());
    }

    #[test]
    fn loom_delegator_mcs() {
        model(2, with_consumer::<McsQueue<Entry<Count, LoomItf>>>);
    }

    #[test]
    fn loom_delegator_ring() {
        model(2, with_consumer::<RingQueue<Entry<Count, LoomItf>, 4>>);
    }

    /// A thread that takes the lock and adds 10.
    fn spawn_lock_user(d: &Arc<Delegator<Count, LoomItf>>) -> loom::thread::JoinHandle<()> {
        let d = d.clone();
        loom::thread::spawn(move || {
            let mut g = d.lock();
            g.0 += 10;
        })
    }

    /// A lock user and a delegating thread, no consumer: the holder executes
    /// the delegated request.
    #[test]
    fn loom_delegator_without_consumer() {
        model(2, || {
            let d = Arc::new(Delegator::<Count, LoomItf>::new(Count(0)));
            let t = spawn_lock_user(&d);
            d.execute_or_delegate(
                |c| {
                    c.0 += 1;
                    true
                },
                || 1,
            );
            t.join().unwrap();
            assert_eq!(d.lock().0, 11);
        });
    }

    /// No consumer, and the inline attempt refuses: the request is still
    /// executed before `execute_or_delegate` returns, even when a lock user
    /// takes the lock between the refusal and the hand-over.
    #[test]
    fn loom_refused_inline_without_consumer_runs_before_return() {
        model(2, || {
            let d = Arc::new(Delegator::<Count, LoomItf>::new(Count(0)));
            let t = spawn_lock_user(&d);
            let ran = d.execute_or_delegate(|_| false, || 1);
            assert!(ran, "without a consumer the request runs before return");
            assert!(d.lock().0 % 10 == 1, "executed exactly once");
            t.join().unwrap();
            assert_eq!(d.lock().0, 11);
        });
    }
}
