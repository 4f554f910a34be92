//! A threading interface made of loom threads, so that the mutex, condition
//! variable and barrier protocols are model-checked as written (loom cannot
//! run user-level threads, so parking is modelled with loom's park/unpark).
//!
//! Each loom thread is also its own worker: it queues idle hooks, and when
//! it parks (its only thread stops running) it runs them, once as a worker
//! that looks for work and once as one about to sleep, then sleeps.

use core::cell::RefCell;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread::{self, Thread};

use ct_worker::{IdleHook, IdleMode, JoinHandleItf, SuspendedThreadItf, UltItf};

loom::thread_local! {
    /// The idle hooks queued on this loom thread (as a worker).
    static HOOKS: RefCell<Vec<usize>> = RefCell::new(Vec::new());
    /// What [`UltItf::may_wait_awake`] answers on this loom thread
    /// ([`set_may_wait_awake`]).
    static AWAKE: core::cell::Cell<bool> = core::cell::Cell::new(false);
}

/// Makes [`UltItf::may_wait_awake`] answer `yes` on the calling loom thread.
pub fn set_may_wait_awake(yes: bool) {
    AWAKE.with(|a| a.set(yes));
}

/// Runs this loom thread's idle hooks in `mode`, keeping those not done.
fn run_idle_hooks(mode: IdleMode) {
    let hooks = HOOKS.with(|h| core::mem::take(&mut *h.borrow_mut()));
    for h in hooks {
        // SAFETY: queued by this thread and not reported done, so valid
        // (the contract of `defer_until_idle`).
        let hook = unsafe { &*(h as *const IdleHook) };
        // SAFETY: run by the thread that queued it, while queued.
        if !unsafe { hook.run(mode) } {
            HOOKS.with(|q| q.borrow_mut().push(h));
        }
    }
}

/// Loom threads as a threading interface.
pub struct LoomItf;

/// A slot for one parked loom thread and its wake-up flag.
#[derive(Default)]
pub struct LoomSlot {
    parked: Mutex<Option<(Thread, Arc<AtomicBool>)>>,
}

impl SuspendedThreadItf for LoomSlot {
    fn wait_with(&self, decide: impl FnOnce() -> bool) -> bool {
        let flag = Arc::new(AtomicBool::new(false));
        *self.parked.lock().unwrap() = Some((thread::current(), flag.clone()));
        let park = decide() || self.parked.lock().unwrap().take().is_none();
        if !park {
            return false;
        }
        // This thread's worker has nothing else to run: its idle hooks run,
        // then it sleeps (a hook not done after `Sleep` must have arranged a
        // wake-up of this thread, or loom reports a deadlock).
        run_idle_hooks(IdleMode::Poll);
        run_idle_hooks(IdleMode::Sleep);
        while !flag.load(Ordering::Acquire) {
            thread::park();
        }
        true
    }

    fn notify(&self) -> bool {
        // Release the slot's lock before waking: the woken thread may free
        // the slot (e.g. a waiter node on its stack) as soon as it sees `f`.
        let parked = self.parked.lock().unwrap().take();
        match parked {
            Some((t, f)) => {
                f.store(true, Ordering::Release);
                t.unpark();
                true
            }
            None => false,
        }
    }

    fn enter(&self) -> bool {
        self.notify()
    }

    fn is_empty(&self) -> bool {
        self.parked.lock().unwrap().is_none()
    }
}

/// Join handle of a loom thread.
pub struct LoomJoin<T>(thread::JoinHandle<T>);

impl<T: Send + 'static> JoinHandleItf<T> for LoomJoin<T> {
    fn join(self) -> T {
        self.0.join().unwrap()
    }
    fn is_finished(&self) -> bool {
        false
    }
}

impl UltItf for LoomItf {
    type SuspendedThread = LoomSlot;
    type JoinHandle<T: Send + 'static> = LoomJoin<T>;

    fn spawn<F, T>(f: F) -> LoomJoin<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        LoomJoin(thread::spawn(f))
    }

    fn yield_now() {
        thread::yield_now();
    }

    fn worker_index() -> usize {
        0
    }

    fn num_workers() -> usize {
        1
    }

    fn runs_idle_hooks() -> bool {
        true
    }

    unsafe fn defer_until_idle(hook: &IdleHook, data: *const ()) -> bool {
        // SAFETY: not queued (the caller's contract), so ours to set.
        unsafe { hook.set_data(data) };
        HOOKS.with(|h| h.borrow_mut().push(core::ptr::from_ref(hook) as usize));
        true
    }

    fn may_wait_awake() -> bool {
        AWAKE.with(|a| a.get()) && HOOKS.with(|h| h.borrow().is_empty())
    }
}

/// Runs a loom model with a preemption bound (and a raised branch limit).
pub fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.max_branches = 100_000;
    b.check(f);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::ProtocolCell;
    use crate::{Barrier, RawFairMutex, RawLock, RawMutex};

    /// One loom thread per entry of `plans` takes the mutex `rounds` times
    /// (preemption bound `bound`), calling `back_off` right after each lock
    /// if the entry says so: the protected counter is updated without a data
    /// race (loom checks causality) and counts every critical section,
    /// nobody stays parked (loom reports a deadlock otherwise), and the lock
    /// ends free.
    fn contend<R: RawLock<LoomItf> + 'static>(
        bound: usize,
        plans: Vec<(u32, bool)>,
        back_off: fn(&R),
    ) {
        contend_on(bound, plans, back_off, R::unlocked);
    }

    /// [`contend`] on a lock made by `make`.
    fn contend_on<R: RawLock<LoomItf> + 'static>(
        bound: usize,
        plans: Vec<(u32, bool)>,
        back_off: fn(&R),
        make: fn() -> R,
    ) {
        let total: u32 = plans.iter().map(|&(rounds, _)| rounds).sum();
        model(bound, move || {
            let m = Arc::new(make());
            let counter = Arc::new(ProtocolCell::new(0u32));
            let ths: Vec<_> = plans
                .iter()
                .map(|&(rounds, backs_off)| {
                    let (m, counter) = (m.clone(), counter.clone());
                    thread::spawn(move || {
                        for _ in 0..rounds {
                            m.lock();
                            if backs_off {
                                back_off(&m);
                            }
                            // SAFETY: the mutex is held.
                            unsafe { counter.with_mut(|c| *c += 1) };
                            // SAFETY: locked above.
                            unsafe { m.unlock() };
                        }
                    })
                })
                .collect();
            for t in ths {
                t.join().unwrap();
            }
            // SAFETY: all threads joined.
            assert_eq!(unsafe { counter.with_mut(|c| *c) }, total);
            assert!(!m.is_locked());
        });
    }

    /// `threads` threads take the mutex once each. With three threads and
    /// the barging protocol, a woken waiter that loses asks for and gets a
    /// hand-off.
    fn mutex_threads<R: RawLock<LoomItf> + 'static>(threads: usize, bound: usize, make: fn() -> R) {
        contend_on(bound, vec![(1, false); threads], |_| {}, make);
    }

    /// The barging mutex as a library with several workers gets it (never
    /// biased): the models of its waiting and waking protocol, which the
    /// bias does not touch, keep their cost.
    fn unbiased() -> RawMutex<LoomItf> {
        RawMutex::unbiased()
    }

    #[test]
    fn loom_mutex_handoff() {
        mutex_threads(2, 3, unbiased);
        mutex_threads(2, 3, RawFairMutex::<LoomItf>::unlocked);
    }

    /// Three threads, one of which takes the mutex twice: its second lock
    /// can barge in right after its first unlock woke a waiter, so that the
    /// woken waiter loses and parks again while a newcomer, which skipped its
    /// own heavy fence relying on the first waiter's, is queued. Both must
    /// still be woken.
    #[test]
    fn loom_mutex_woken_waiter_parks_again() {
        contend_on(
            2,
            vec![(2, false), (1, false), (1, false)],
            |_| {},
            unbiased,
        );
    }

    /// A holder that backs off (releases the lock and takes it again as a
    /// waiter, parking first) while another thread takes the lock: both
    /// critical sections run exactly once.
    #[test]
    fn loom_mutex_back_off() {
        contend_on(2, vec![(1, true), (1, false)], RawMutex::back_off, unbiased);
    }

    /// The biased fast path against revocation: the first thread to lock
    /// biases the mutex to its (loom) thread — a one-worker library — and
    /// takes it again without a CAS, while another thread revokes the bias
    /// and takes the lock with a CAS; with three threads, two revoke at
    /// once. The critical sections never overlap (loom checks the counter's
    /// accesses for causality), and nobody is left parked.
    #[test]
    fn loom_mutex_bias_revocation() {
        contend::<RawMutex<LoomItf>>(2, vec![(2, false), (1, false)], |_| {});
        mutex_threads(3, 1, RawMutex::<LoomItf>::unlocked);
    }

    #[test]
    fn loom_mutex_three_threads() {
        mutex_threads(3, 1, unbiased);
        mutex_threads(3, 1, RawFairMutex::<LoomItf>::unlocked);
    }

    /// `unlock_and_wait` vs a waker that takes the lock: when the waker holds
    /// the lock after the waiter released it, the waiter is in its slot.
    fn unlock_and_wait<R: RawLock<LoomItf> + 'static>() {
        model(3, || {
            let m = Arc::new(R::unlocked());
            let slot = Arc::new(LoomSlot::default());
            let released = Arc::new(AtomicBool::new(false));
            let waker = {
                let (m, slot, released) = (m.clone(), slot.clone(), released.clone());
                thread::spawn(move || {
                    loop {
                        m.lock();
                        let r = released.swap(false, Ordering::Relaxed);
                        if r {
                            assert!(slot.notify(), "the waiter was not parked");
                        }
                        // SAFETY: locked above.
                        unsafe { m.unlock() };
                        if r {
                            return;
                        }
                        thread::yield_now();
                    }
                })
            };
            m.lock();
            released.store(true, Ordering::Relaxed);
            // SAFETY: locked above.
            unsafe { m.unlock_and_wait(&slot) };
            waker.join().unwrap();
            assert!(!m.is_locked());
        });
    }

    #[test]
    fn loom_unlock_and_wait() {
        unlock_and_wait::<RawMutex<LoomItf>>();
        unlock_and_wait::<RawFairMutex<LoomItf>>();
    }

    /// Two threads, two barrier episodes: writes before the barrier are seen
    /// after it, and each episode has one leader. Grouped: with two groups,
    /// each thread (a worker of its own) owns one, and its idle hook
    /// publishes its arrival, completes the episode or watches for its end,
    /// and before "sleeping" hands the wake-up to the completer (the races
    /// of all three are explored; bound 3 found a wake-up after a sleep that
    /// did not acquire the completer's writes). Flat (what a one-worker
    /// library gets): the last arriver wakes every slot.
    ///
    /// `awake[t]`: thread t may wait awake (grouped only): it counts itself
    /// in the barrier at once, completes the episode or polls for its end,
    /// and parks in its group, already counted, when the polls run out.
    fn barrier_two_threads(grouped: bool, awake: [bool; 2]) {
        model(4, move || {
            let b = Arc::new(if grouped {
                Barrier::<LoomItf>::with_groups(2, 2)
            } else {
                Barrier::<LoomItf>::new_in(2)
            });
            let cells = Arc::new([ProtocolCell::new(0u32), ProtocolCell::new(0u32)]);
            let leaders = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
            let ths: Vec<_> = (0..2)
                .map(|t| {
                    let (b, cells, leaders) = (b.clone(), cells.clone(), leaders.clone());
                    thread::spawn(move || {
                        set_may_wait_awake(awake[t]);
                        for e in 1..=2u32 {
                            // SAFETY: cell t is written only by thread t, and
                            // read by others only after a barrier.
                            unsafe { cells[t].with_mut(|c| *c = e) };
                            if b.wait().is_leader() {
                                leaders.fetch_add(1, Ordering::Relaxed);
                            }
                            for c in cells.iter() {
                                // SAFETY: as above.
                                assert_eq!(unsafe { c.with(|c| *c) }, e);
                            }
                            b.wait();
                        }
                    })
                })
                .collect();
            for t in ths {
                t.join().unwrap();
            }
            assert_eq!(leaders.load(Ordering::Relaxed), 2);
        });
    }

    #[test]
    fn loom_barrier() {
        barrier_two_threads(true, [false; 2]);
        barrier_two_threads(false, [false; 2]);
    }

    #[test]
    fn loom_barrier_awake() {
        barrier_two_threads(true, [true, false]);
        barrier_two_threads(true, [true, true]);
    }

    /// Three threads, one episode, one owned group: the first thread to
    /// arrive owns it (it counts with a plain load and store and its hook
    /// publishes the count), the others share the last group (and count
    /// themselves in the barrier with `fetch_add`); the completer is a hook
    /// or a thread of the shared group, and wakes the sleeping owner's local
    /// leader or leaves it to the owner's hook. Everybody leaves (loom
    /// reports a deadlock otherwise), with one leader.
    #[test]
    fn loom_barrier_shared_group() {
        model(2, || {
            let b = Arc::new(Barrier::<LoomItf>::with_groups(3, 1));
            let leaders = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
            let ths: Vec<_> = (0..3)
                .map(|_| {
                    let (b, leaders) = (b.clone(), leaders.clone());
                    thread::spawn(move || {
                        if b.wait().is_leader() {
                            leaders.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            for t in ths {
                t.join().unwrap();
            }
            assert_eq!(leaders.load(Ordering::Relaxed), 1);
        });
    }
}
