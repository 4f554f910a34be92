//! Suspended threads: a slot that holds at most one parked thread — the
//! universal blocking primitive every lock, condition variable and delegator
//! is built on.
//!
//! The slot holds a *waiter word*: a parked user-level thread, or (when the
//! waiting code runs outside any user-level thread) a parked OS thread. The
//! protocol on the word:
//!
//! - **park** (`wait_with`): store our word, then run the caller's decision
//!   function — *after* our context is saved. If it says not to park, take
//!   the word back with a CAS; if the CAS fails, a notifier already took us
//!   and will resume us, so we park after all.
//! - **wake** (`notify`, `enter`, `swap`): swap the word out; whoever gets a
//!   non-zero word owns the thread's wake-up.
//!
//! Exactly one of "the parker cancels" and "a notifier wakes it" happens.

use core::marker::PhantomData;

use crate::config::{Config, DefaultConfig};
use crate::hook::LeaveReason;
use crate::os_waiter;
use crate::sync::{AtomicUsize, Ordering};
use crate::task::TaskRef;
use crate::worker::Worker;

/// A slot holding at most one parked thread: a parker publishes itself and
/// then decides (after its context is saved) whether to park; a notifier
/// takes the slot with one swap, so exactly one of "the parker cancels" and
/// "a notifier wakes it" happens.
///
/// `SuspendedThread` is `Sync`: the parking thread and its notifiers use it
/// concurrently. It is meant to live inside a synchronisation object (a lock
/// queue node, a condition variable entry) whose protocol decides who parks in
/// it and who wakes it.
// `repr(C)`: one layout for all configurations (a `Scope` relies on it).
#[repr(C)]
pub struct SuspendedThread<C: Config = DefaultConfig> {
    word: AtomicUsize,
    _config: PhantomData<fn() -> C>,
}

impl<C: Config> Default for SuspendedThread<C> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<C: Config> core::fmt::Debug for SuspendedThread<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SuspendedThread")
            .field("parked", &!self.is_empty())
            .finish()
    }
}

/// What a slot can hold, decoded.
enum Parked<C: Config> {
    Ult(TaskRef<C>),
    Os(usize),
}

impl<C: Config> Parked<C> {
    fn word(&self) -> usize {
        match self {
            Parked::Ult(t) => t.word(),
            Parked::Os(w) => *w,
        }
    }
}

impl SuspendedThread {
    /// An empty slot for threads of a default-configuration runtime (for
    /// other configurations use [`SuspendedThread::empty`] or `default()`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self::empty()
    }

    /// An empty slot.
    #[cfg(loom)]
    pub fn new() -> Self {
        Self::empty()
    }
}

impl<C: Config> SuspendedThread<C> {
    /// An empty slot.
    #[cfg(not(loom))]
    pub const fn empty() -> Self {
        SuspendedThread {
            word: AtomicUsize::new(0),
            _config: PhantomData,
        }
    }

    /// An empty slot.
    #[cfg(loom)]
    pub fn empty() -> Self {
        SuspendedThread {
            word: AtomicUsize::new(0),
            _config: PhantomData,
        }
    }

    /// Whether no thread is parked here.
    pub fn is_empty(&self) -> bool {
        self.word.load(Ordering::Acquire) == 0
    }

    fn take(&self) -> Option<Parked<C>> {
        match self.word.swap(0, Ordering::AcqRel) {
            0 => None,
            // SAFETY: non-zero words with a clear low bit are parked threads of
            // this configuration, and the swap gave us their wake-up.
            w if w & 1 == 0 => Some(Parked::Ult(unsafe { TaskRef::from_word(w) })),
            w => Some(Parked::Os(w)),
        }
    }

    /// Stores `word` and asks `decide`; `true` means "park".
    ///
    /// The store is a swap (a read-modify-write), not a plain store: the
    /// parker publishes itself and then reads the condition in `decide`,
    /// while a notifier writes the condition and then takes the word (a
    /// swap). With a plain store the parker's read could be ordered before
    /// its publication (store buffering): it would see the old condition and
    /// park, while the notifier saw an empty slot — a lost wake-up. With two
    /// read-modify-writes on the word, whichever comes second reads the
    /// first's value, and the acquire/release pair makes the notifier's
    /// earlier writes visible to `decide`.
    fn park_decision(&self, word: usize, decide: impl FnOnce() -> bool) -> bool {
        let prev = self.word.swap(word, Ordering::AcqRel);
        debug_assert_eq!(prev, 0, "slot already holds a thread");
        decide()
            || self
                .word
                .compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
    }

    /// Parks the calling thread in this slot unless `decide` — called once
    /// the thread can be woken, i.e. after its context is saved — returns
    /// `false`. Returns `true` if the thread parked (and has now been woken),
    /// `false` if it did not park.
    ///
    /// `decide` runs on another stack (a user-level thread's context is saved
    /// at that point): it must be short, must not block or switch, and must
    /// not panic. Outside a user-level thread the OS thread parks instead.
    ///
    /// Once `decide` has made the thread wakeable by others (e.g. released a
    /// lock whose next holder notifies this slot), the thread may be resumed
    /// on another worker *while `decide` is still running*, and its stack
    /// frames may be reused. From that point `decide` must not read the
    /// waiting thread's locals: write it as a `move` closure, so that it
    /// holds copies (a non-`move` closure captures locals by reference, into
    /// the waiting thread's stack).
    pub fn wait_with(&self, decide: impl FnOnce() -> bool) -> bool {
        match Worker::<C>::current().filter(|w| w.running().is_some()) {
            // SAFETY: we are `w`'s running thread; `park_decision` publishes us
            // only after our context is saved and takes us back on refusal.
            Some(w) => unsafe {
                w.cond_suspend_to_sched(|me| {
                    me.desc().home.set(w.index);
                    self.park_decision(me.word(), decide)
                })
            },
            None => os_waiter::park_if(|word| self.park_decision(word, decide)),
        }
    }

    /// Parks the calling thread here until notified.
    pub fn wait(&self) {
        self.wait_with(|| true);
    }

    /// Makes the parked thread runnable (on the calling worker's deque; or on
    /// its runtime's global queue when called from outside), without
    /// switching to it. Returns whether a thread was parked.
    pub fn notify(&self) -> bool {
        match self.take() {
            None => false,
            Some(p) => {
                wake::<C>(p);
                true
            }
        }
    }

    /// Like [`SuspendedThread::notify`], but makes the thread runnable on the
    /// worker it parked on, in that worker's home queue (through its inbox,
    /// waking it if it sleeps, when called on another worker), instead of on
    /// the caller's deque: for wake-ups of many threads at once (a barrier),
    /// which would otherwise all land on the waker's deque and be stolen one
    /// by one. Other workers take a thread from a home queue only once they
    /// have idled a while, so a woken thread stays where its data is unless
    /// its worker stays busy. Returns whether a thread was parked.
    pub fn notify_home(&self) -> bool {
        match self.take() {
            None => false,
            Some(Parked::Ult(t)) => {
                match Worker::<C>::current() {
                    Some(w) if w.shared.id == t.desc().runtime_id.get() => w.push_home(t),
                    _ => wake::<C>(Parked::Ult(t)),
                }
                true
            }
            Some(p) => {
                wake::<C>(p);
                true
            }
        }
    }

    /// Wakes the thread parked in each of `slots` in turn, like
    /// [`SuspendedThread::notify_home`], waiting at a slot until a thread has
    /// parked in it (for a barrier's last arriver, whose fellow waiters have
    /// arrived but may still be on their way to parking). Called on a
    /// worker, it pushes the threads for each other worker to that worker's
    /// inbox with one atomic operation (and one wake-up check), instead of
    /// one per thread: the inbox's cache line crosses cores once per batch;
    /// the caller's own threads go into its home queue last.
    ///
    /// The wait at an empty slot spins (and yields the OS thread), so every
    /// slot's thread must already be on its way to parking without needing
    /// the caller's worker: on one worker, a thread that has not yet run
    /// would never park.
    pub fn notify_home_each<'a>(slots: impl IntoIterator<Item = &'a Self>)
    where
        C: 'a,
    {
        let w = Worker::<C>::current();
        for slot in slots {
            let mut backoff = crate::Backoff::new();
            loop {
                match slot.take() {
                    Some(Parked::Ult(t)) => {
                        match w {
                            Some(w) if w.shared.id == t.desc().runtime_id.get() => {
                                w.push_home_batched(t)
                            }
                            _ => wake::<C>(Parked::Ult(t)),
                        }
                        break;
                    }
                    Some(p) => {
                        wake::<C>(p);
                        break;
                    }
                    None => {
                        // Not parked yet: let the threads collected so far
                        // go, then wait (spinning first, then yielding the
                        // OS thread; the waiter is about to park and cannot
                        // need this worker).
                        if let Some(w) = w {
                            w.flush_home();
                        }
                        backoff.snooze(std::thread::yield_now);
                    }
                }
            }
        }
        if let Some(w) = w {
            w.flush_home();
        }
    }

    /// Switches to the parked thread *now*; the caller becomes runnable on
    /// its worker's deque (and may be stolen). Outside a user-level thread this
    /// is [`SuspendedThread::notify`]. Returns whether a thread was parked.
    pub fn enter(&self) -> bool {
        let Some(p) = self.take() else { return false };
        match (p, Worker::<C>::current().filter(|w| w.running().is_some())) {
            // SAFETY: we are `w`'s running thread and own `t`'s wake-up; the
            // ontop function makes us runnable after our context is saved.
            (Parked::Ult(t), Some(w)) => unsafe {
                w.suspend_to_cont(t, LeaveReason::Suspended, |me| w.push(me))
            },
            (p, _) => wake::<C>(p),
        }
        true
    }

    /// Parks the caller in `self` and switches to the thread parked in
    /// `next` in one step (if `next` is empty, just parks). The caller is
    /// stored in `self` only after its context is saved, so a notifier of
    /// `self` can never resume it too early.
    pub fn swap(&self, next: &SuspendedThread<C>) {
        self.swap_with(next, || true);
    }

    /// Conditional [`SuspendedThread::swap`]: `decide` (run after the caller's
    /// context is saved, with the caller already stored in `self`) may refuse,
    /// in which case the caller continues and `next`'s thread stays parked in
    /// `next`. Returns whether the caller parked.
    pub fn swap_with(&self, next: &SuspendedThread<C>, decide: impl FnOnce() -> bool) -> bool {
        let w = Worker::<C>::current().filter(|w| w.running().is_some());
        match (next.take(), w) {
            (Some(Parked::Ult(t)), Some(w)) => {
                // SAFETY: we are `w`'s running thread and own `t`'s wake-up.
                let switched = unsafe {
                    w.cond_suspend_to_cont(t, |me| {
                        me.desc().home.set(w.index);
                        self.park_decision(me.word(), decide)
                    })
                };
                if !switched {
                    // Give `next` its thread back.
                    next.word.store(t.word(), Ordering::Release);
                }
                switched
            }
            (None, _) => self.wait_with(decide),
            (Some(p), _) => {
                // Not on a worker, or `next` holds an OS thread: wake it from
                // the decision function instead of switching to it.
                let word = p.word();
                let mut woke = false;
                let woke_ref = &mut woke;
                let parked = self.wait_with(move || {
                    if decide() {
                        wake::<C>(p);
                        *woke_ref = true;
                        true
                    } else {
                        false
                    }
                });
                if !woke {
                    next.word.store(word, Ordering::Release);
                }
                parked
            }
        }
    }
}

/// Makes a parked thread runnable from wherever we are.
fn wake<C: Config>(p: Parked<C>) {
    match p {
        Parked::Os(word) => {
            // SAFETY: we took the word from a slot, so we own its wake-up.
            unsafe { os_waiter::wake(word) }
        }
        Parked::Ult(t) => match Worker::<C>::current() {
            Some(w) if w.shared.id == t.desc().runtime_id.get() => w.push(t),
            _ => match crate::runtime::lookup::<C>(t.desc().runtime_id.get()) {
                Some(shared) => shared.inject(t),
                None => log::warn!(
                    "ct-worker: a thread of a runtime that no longer exists was notified; ignored"
                ),
            },
        },
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// The condition handshake: the notifier sets a flag and then takes the
    /// slot; the parker publishes itself and parks unless the flag is set.
    /// Either the parker sees the flag or the notifier gets the parker — never
    /// neither (a lost wake-up). Loom checks the interleavings; it does not
    /// model store buffering, which is why publication is a swap (see
    /// `park_decision`), and why `tests/scheduler.rs`'s handshake test, run
    /// under load, is the regression test for that part.
    #[test]
    fn loom_condition_is_never_missed() {
        use loom::sync::atomic::AtomicBool;
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let slot = Arc::new(SuspendedThread::<DefaultConfig>::empty());
            let flag = Arc::new(AtomicBool::new(false));
            let notifier = {
                let (slot, flag) = (slot.clone(), flag.clone());
                loom::thread::spawn(move || {
                    loom::thread::yield_now();
                    flag.store(true, Ordering::Release);
                    slot.word.swap(0, Ordering::AcqRel)
                })
            };
            let parked = slot.park_decision(64, || !flag.load(Ordering::Acquire));
            let got = notifier.join().unwrap();
            if parked {
                assert_eq!(got, 64, "parked but nobody will wake us");
            }
        });
    }

    /// A parker that changes its mind races with a notifier: exactly one of
    /// "the parker took itself back" and "the notifier got the thread" happens.
    #[test]
    fn loom_cancel_vs_notify() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let slot = Arc::new(SuspendedThread::<DefaultConfig>::empty());
            let notifier = {
                let slot = slot.clone();
                loom::thread::spawn(move || {
                    // loom mis-orders a swap that races with a plain store
                    // (tokio-rs/loom#254: the swap may read the old value yet
                    // be ordered after the store); yielding first avoids it.
                    loom::thread::yield_now();
                    slot.word.swap(0, Ordering::AcqRel)
                })
            };
            let parked = slot.park_decision(64, || false);
            let got = notifier.join().unwrap();
            if parked {
                assert_eq!(
                    got, 64,
                    "a parker that stays parked was taken by the notifier"
                );
            } else {
                assert_eq!(got, 0, "a parker that left cannot be woken");
            }
            assert_eq!(slot.word.load(Ordering::Relaxed), 0);
        });
    }
}
