//! The default mutex protocol: a one-byte lock with barging, parked waiters
//! in a FIFO queue, and eventual hand-off.
//!
//! **Fast path.** Lock is one CAS of the `locked` byte from 0 to 1 (on one
//! worker, not even that: see "One worker" below). Unlock
//! stores 0, then loads the `flags` byte to see whether anybody is parked —
//! with only a *compiler* fence between the two. The store→load order that a
//! parking waiter relies on is supplied by the waiter: after publishing
//! itself it executes an asymmetric heavy fence (Linux `membarrier`, which
//! makes every running thread of the process execute a full barrier) and then
//! re-reads `locked`. Either the unlocker's load sees the waiter, or the
//! waiter's re-read sees the lock free (and the waiter does not park). An
//! uncontended lock/unlock therefore costs one atomic read-modify-write,
//! where a queue lock costs two. Without `membarrier` both sides use full
//! fences. The heavy fence is a system call that interrupts the other
//! workers, so only the first waiter of a burst pays for it: once one
//! waiter's fence has completed while the queue stayed non-empty, later
//! newcomers rely on it (the argument is at the fence in `park`), and park
//! without re-reading `locked`, until the queue empties again. A woken
//! waiter that lost the lock and parks again always fences: it has just
//! cleared `WAKING`, which an unlock may have seen set and therefore not
//! woken anybody.
//!
//! **One worker: no read-modify-write.** Threads of one OS thread never
//! run at the same time, so while every thread that takes the lock runs on
//! one OS thread, none needs an atomic read-modify-write to take it. The
//! first thread to lock a mutex of a one-worker threading library *biases*
//! it to its OS thread; from then on threads on that OS thread lock with
//! plain loads and stores: announce themselves in `busy`, check the bias
//! again after a (compiler-only) light fence, and store `locked` if it was
//! free. A thread on any other OS thread first *revokes* the bias for good:
//! it stores `REVOKED`, runs the heavy fence, and waits until `busy` is
//! clear — the Dekker pair of the unlock's fence again: either the biased
//! locker sees the revocation, or the revoker sees it busy and then its
//! store of `locked`. After that everybody uses the CAS. A mutex first used
//! with more than one worker (or without `membarrier`) is never biased. One
//! worker's lock round then costs about 40% of a bare CAS loop.
//!
//! **Waiting.** A waiter that finds the lock held (after a short spin when
//! there is more than one worker) parks in a node on its own stack, queued
//! FIFO under a small spinlock, and sets `PARKED` in `flags`. It publishes
//! itself from inside [`wait_with`]'s decision function, i.e. after its
//! context is saved, and the very last thing it does there is to mark its
//! node parked; a waker that dequeues a node not yet marked flips its state
//! instead of notifying it, and the waiter then does not park.
//!
//! **Waking.** An unlock that sees `PARKED` wakes the first waiter, unless a
//! woken waiter is already on its way (`WAKING`): only one woken thread
//! competes for the lock at a time, so a contended lock does not wake a herd.
//! A running thread may take a free lock before the woken one does
//! (*barging*: a thread that re-locks at once keeps the lock on its core,
//! which is what makes a contended lock fast). The woken thread keeps
//! `WAKING` and watches the lock for up to about a millisecond, yielding now
//! and then; it takes the lock only once it has gone quiet (free, and
//! released at most twice since the previous look), so it does not pull a
//! lock away from a thread on another core that keeps re-taking it, and it
//! asks for a hand-off if the lock never goes quiet. Newcomers spin only
//! briefly and only while nobody is parked, so that a contended lock
//! settles on one core instead of bouncing between two.
//!
//! **Two holders.** Newcomers park only when their CAS fails, and with very
//! short critical sections a CAS from a second core almost never fails: the
//! threads running on two cores both find the lock free and take it in
//! turn, every acquisition moving its cache line between the cores. Nothing
//! in that pattern made either side park, so whether a run of the mutex
//! benchmark settled there (four times slower than one core re-taking the
//! lock) depended on timing details down to code placement. So the lock
//! keeps a hint of the thread that took it last (the page of its stack
//! pointer, read without a memory access) and counts fast-path acquisitions
//! that find it changed; every 64th such acquisition, with more than one
//! worker, the thread backs off: it releases the lock and queues as a waiter
//! (if the lock is still free at the park's re-check, it takes it again at
//! once). Each back-off takes one thread off its core's run queue until one
//! core's threads all wait; the other core then re-takes the lock on its
//! own, and the waiting threads come back one at a time as woken waiters. A
//! lock whose fast-path holder rarely changes never backs off, and the fast
//! path pays a register read, a load from the lock's line and a compare.
//!
//! Woken waiters go back to the worker they parked on
//! ([`notify_home`](ct_worker::SuspendedThreadItf::notify_home)), so that a
//! contended lock does not pull every waiter onto the unlocker's worker,
//! where the other workers would steal them one by one.
//!
//! **No starvation.** A woken waiter that still loses parks again at the
//! *front* of the queue with `FAIR` set; the next unlock then does not
//! release the lock but hands it directly to the first waiter.
//!
//! **Lifetime.** After its store of 0 an unlock still reads `flags` (and may
//! wake someone), so the mutex must outlive the `unlock` call, as a borrow
//! guarantees. [`RawLock::unlock_and_wait`] releases from inside the parking
//! decision, so it waits for that release to finish before it returns.
//!
//! [`wait_with`]: ct_worker::SuspendedThreadItf::wait_with

use core::ptr::{self, NonNull};
// Not the loom types: `releases`, `holder` and `holder_changes` are hints
// outside the modelled protocol.
use core::sync::atomic::AtomicU32 as PlainAtomicU32;

use ct_worker::{SuspendedThreadItf, Ult, UltItf};

use super::RawLock;
use crate::spinlock::SpinLock;
use crate::sync::{
    AtomicBool, AtomicU8, AtomicUsize, Backoff, Ordering, ProtocolCell, asymmetric_fences,
    const_unless_loom, heavy_fence, light_fence, os_thread_id,
};

/// Spin rounds before a newcomer parks (1 + 2 + 4 + 8 pause instructions),
/// with more than one worker and while nobody is parked.
const NEWCOMER_SPIN_ROUNDS: u32 = 4;

/// Polls of a woken waiter before it gives up and asks for a hand-off: the
/// gaps grow from 1 to [`WOKEN_MAX_GAP_SHIFT`] pause instructions, so the
/// whole wait is about 39,000 pauses (about 1 ms where a pause takes 25 ns,
/// as on the AMD EPYC this was tuned on), yielding every 8 polls.
const WOKEN_POLLS: u32 = 160;

/// Releases between two of a woken waiter's polls up to which it still
/// takes a free lock: a lock released this rarely is not being re-taken in a
/// tight loop, and waiting for a poll with none at all would keep a waiter
/// out of a lock that is free most of the time.
const WOKEN_QUIET_RELEASES: u32 = 2;

/// Longest gap between a woken waiter's polls: 2^8 = 256 pause
/// instructions (6.4 µs at 25 ns a pause). Each poll costs a holder on
/// another core one cache miss on its next acquisition.
const WOKEN_MAX_GAP_SHIFT: u32 = 8;

/// Fast-path acquisitions by another thread than the previous fast-path
/// acquirer, per back-off (see "Two holders" in the module docs).
const HOLDER_CHANGES_PER_BACK_OFF: u32 = 64;

/// Tells threads (user-level or OS) apart well enough for a hint, without a
/// memory access: the page the stack pointer is in. Each thread runs on its
/// own stack; a thread whose stack pointer crossed a page boundary since
/// its previous acquisition counts as a change, which is harmless, and so
/// do two stacks whose page numbers agree in their low 32 bits.
#[inline(always)]
fn holder_id() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        let sp: usize;
        // SAFETY: reads the stack pointer; no memory access, no flags.
        unsafe {
            core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
        };
        (sp >> 12) as u32
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let probe = 0u8;
        (core::ptr::addr_of!(probe) as usize >> 12) as u32
    }
}

// A mutex and a word of data fit in one 64-byte cache line: the bias word
// pushed `Mutex<u64>`'s data onto a second line, which moved back and forth
// between cores with the first (50 OS threads on one mutex: 0.065 -> 0.10 s).
#[cfg(all(not(loom), target_pointer_width = "64"))]
const _: () = assert!(core::mem::size_of::<RawMutex<Ult>>() <= 56);

// `RawMutex::bias` values besides an OS thread's id (see "One worker" in
// the module docs).
/// Not decided yet: the first locker decides.
const UNBIASED: usize = 0;
/// Never (again) biased: everybody takes the lock with a CAS.
const REVOKED: usize = 1;

// `flags` bits.
/// The wait queue is not empty.
const PARKED: u8 = 1;
/// A woken waiter is on its way to try the lock.
const WAKING: u8 = 2;
/// A waiter asked for a direct hand-off.
const FAIR: u8 = 4;

// `Waiter::state` values.
/// Queued, still inside its decision function (not yet parked).
const ARRIVING: u8 = 0;
/// Parked in its slot: a waker must notify it.
const ASLEEP: u8 = 1;
/// Dequeued by an unlock: try the lock again.
const WOKEN: u8 = 2;
/// Dequeued by an unlock that handed it the lock.
const HANDED_OFF: u8 = 3;

/// A queued waiter, on the waiting thread's stack.
struct Waiter<U: UltItf> {
    slot: U::SuspendedThread,
    state: AtomicU8,
    /// The next waiter; only accessed under the queue lock.
    next: ProtocolCell<*const Waiter<U>>,
}

/// FIFO of waiters (intrusive, singly linked); lives under the spinlock.
struct WaitQueue<U: UltItf> {
    head: *const Waiter<U>,
    tail: *const Waiter<U>,
    /// A parker's heavy fence has completed since the queue last became
    /// non-empty (so `PARKED` has been set continuously since before it).
    /// Later parkers skip their own fence; see [`RawMutex::park`].
    fenced: bool,
    /// Counts the times the queue became empty (and `fenced` was reset).
    epoch: u32,
}

// SAFETY: the queue only holds pointers to waiters, which are parked (or
// about to park) and unlinked only under the queue's spinlock.
unsafe impl<U: UltItf> Send for WaitQueue<U> {}

impl<U: UltItf> WaitQueue<U> {
    #[cfg(not(loom))]
    const fn new() -> Self {
        WaitQueue {
            head: ptr::null(),
            tail: ptr::null(),
            fenced: false,
            epoch: 0,
        }
    }

    #[cfg(loom)]
    fn new() -> Self {
        WaitQueue {
            head: ptr::null(),
            tail: ptr::null(),
            fenced: false,
            epoch: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.head.is_null()
    }

    /// Records that the queue became empty (the caller clears `PARKED`): a
    /// fence from before does not cover the next parker.
    fn emptied(&mut self) {
        self.fenced = false;
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// # Safety (for all the link operations)
    ///
    /// Queued waiters stay alive while queued, and `w` is not queued.
    unsafe fn push_back(&mut self, w: &Waiter<U>) {
        // SAFETY: under the queue lock; `w` and the tail are alive.
        unsafe {
            w.next.with_mut(|n| *n = ptr::null());
            match self.tail.as_ref() {
                None => self.head = w,
                Some(t) => t.next.with_mut(|n| *n = w),
            }
        }
        self.tail = w;
    }

    unsafe fn push_front(&mut self, w: &Waiter<U>) {
        // SAFETY: under the queue lock; `w` is alive.
        unsafe { w.next.with_mut(|n| *n = self.head) };
        if self.head.is_null() {
            self.tail = w;
        }
        self.head = w;
    }

    unsafe fn pop_front(&mut self) -> Option<NonNull<Waiter<U>>> {
        let w = NonNull::new(self.head.cast_mut())?;
        // SAFETY: queued waiters are alive until woken, which the caller
        // does after this returns; links change under the queue lock.
        self.head = unsafe { w.as_ref().next.with_mut(|n| *n) };
        if self.head.is_null() {
            self.tail = ptr::null();
        }
        Some(w)
    }

    /// Unlinks `w` if it is queued; `false` if a waker already took it.
    unsafe fn remove(&mut self, w: &Waiter<U>) -> bool {
        let target: *const Waiter<U> = w;
        let mut prev: *const Waiter<U> = ptr::null();
        let mut cur = self.head;
        while !cur.is_null() {
            // SAFETY: queued waiters are alive; links change under the lock.
            let next = unsafe { (*cur).next.with_mut(|n| *n) };
            if cur == target {
                // SAFETY: `prev` is null or a queued (alive) waiter.
                match unsafe { prev.as_ref() } {
                    None => self.head = next,
                    // SAFETY: as above.
                    Some(p) => unsafe { p.next.with_mut(|n| *n = next) },
                }
                if self.tail == target {
                    self.tail = prev;
                }
                return true;
            }
            prev = cur;
            cur = next;
        }
        false
    }
}

/// How a parking attempt ended.
enum Woke {
    /// The lock looked free before we parked: we did not park.
    Cancelled,
    /// An unlock woke us to try again.
    Woken,
    /// An unlock handed us the lock: we hold it.
    HandedOff,
}

/// Ends a dequeued waiter's wait with `how` (`WOKEN` or `HANDED_OFF`).
///
/// # Safety
///
/// `w` must have been taken off the queue by the caller, and is not touched
/// afterwards: once it sees `how` its thread may return and free it.
unsafe fn wake<U: UltItf>(w: NonNull<Waiter<U>>, how: u8) {
    // SAFETY: the waiter is alive until it sees `how` (the contract).
    let w = unsafe { w.as_ref() };
    // The waiter marks itself ASLEEP as the last step before parking; if it
    // has not yet, it sees `how` there and does not park.
    if w.state.swap(how, Ordering::AcqRel) == ASLEEP {
        // Parked: the slot holds it, and it stays parked (with `w` alive)
        // until this notify.
        w.slot.notify_home();
    }
}

/// The default lock protocol under [`Mutex`](super::Mutex): one CAS to
/// lock, a store and a load to unlock, parked waiters in FIFO order with
/// barging and eventual hand-off. See the [module docs](self).
pub struct RawMutex<U: UltItf = Ult> {
    locked: AtomicU8,
    flags: AtomicU8,
    /// Set by a thread of the bias OS thread while it takes the lock
    /// without a CAS.
    busy: AtomicU8,
    /// [`UNBIASED`], [`REVOKED`], or the [`os_thread_id`] of the OS thread
    /// whose threads lock without a CAS.
    bias: AtomicUsize,
    /// Releases counted while a woken waiter watches the lock (wrapping):
    /// it tells a lock that is being re-taken all the time from one that
    /// has gone quiet. A hint outside the protocol, so it is a plain atomic
    /// even under loom.
    releases: PlainAtomicU32,
    /// The [`holder_id`] of the thread that last took the lock, and how
    /// often a fast-path acquisition found it changed (hints outside the
    /// protocol, written only by lock holders; plain atomics under loom).
    holder: PlainAtomicU32,
    holder_changes: PlainAtomicU32,
    queue: SpinLock<WaitQueue<U>>,
}

impl<U: UltItf> core::fmt::Debug for RawMutex<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RawMutex")
            .field("locked", &self.is_locked())
            .finish()
    }
}

impl<U: UltItf> Default for RawMutex<U> {
    fn default() -> Self {
        Self::new()
    }
}

impl<U: UltItf> RawMutex<U> {
    const_unless_loom! {
        /// An unlocked mutex.
        pub fn new() -> Self {
            RawMutex {
                locked: AtomicU8::new(0),
                flags: AtomicU8::new(0),
                busy: AtomicU8::new(0),
                bias: AtomicUsize::new(UNBIASED),
                releases: PlainAtomicU32::new(0),
                holder: PlainAtomicU32::new(0),
                holder_changes: PlainAtomicU32::new(0),
                queue: SpinLock::new(WaitQueue::new()),
            }
        }
    }

    /// An unlocked mutex that is never biased (as if first locked with
    /// several workers), for the loom models of the waiting protocol.
    #[cfg(loom)]
    pub(crate) fn unbiased() -> Self {
        let m = Self::new();
        m.bias.store(REVOKED, Ordering::Relaxed);
        m
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        self.locked.load(Ordering::Relaxed) == 0 && self.cas_allowed() && self.cas_lock()
    }

    #[inline]
    fn cas_lock(&self) -> bool {
        self.locked
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Makes sure that no thread takes the lock without a CAS while the
    /// caller tries one: the bias is revoked, or it is the caller's OS
    /// thread (whose threads do not run while the caller does). Returns
    /// `true`, for use in conditions.
    #[inline]
    fn cas_allowed(&self) -> bool {
        let b = self.bias.load(Ordering::Relaxed);
        if b != REVOKED && b != os_thread_id() {
            self.settle_bias(b);
        }
        true
    }

    /// The biased acquisition (see "One worker" in the module docs), for
    /// threads of the bias OS thread: `true` if it took the lock. `false`
    /// leaves the caller free to use the CAS (the bias is its OS thread's
    /// or revoked).
    #[inline]
    fn lock_biased(&self, b: usize) -> bool {
        let me = os_thread_id();
        if b != me {
            self.settle_bias(b);
            return false;
        }
        self.busy.store(1, Ordering::Relaxed);
        // Dekker with `revoke`: our `busy` store vs the revoker's `bias`
        // store (the revoker runs the heavy fence).
        light_fence();
        // Acquire: the previous holder may have released on another OS
        // thread (a thread that migrated while it held the lock).
        let took =
            self.bias.load(Ordering::Relaxed) == me && self.locked.load(Ordering::Acquire) == 0;
        if took {
            self.locked.store(1, Ordering::Relaxed);
        }
        // Release: a revoker that sees `busy` clear sees `locked` too.
        self.busy.store(0, Ordering::Release);
        took
    }

    /// Decides a bias that is not the caller's OS thread: an undecided one
    /// goes to the caller's OS thread if the threading library has one
    /// worker (and light fences are cheap), else it is revoked for good.
    /// Afterwards it is the caller's OS thread or [`REVOKED`].
    #[cold]
    #[inline(never)]
    fn settle_bias(&self, b: usize) {
        if b == UNBIASED {
            let me = os_thread_id();
            let want = if U::num_workers() == 1 && asymmetric_fences() {
                me
            } else {
                REVOKED
            };
            match self
                .bias
                .compare_exchange(UNBIASED, want, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) if now == me || now == REVOKED => return,
                Err(_) => {}
            }
        }
        // Another OS thread's: revoke it, and wait until no biased
        // acquisition is under way.
        self.bias.store(REVOKED, Ordering::Relaxed);
        heavy_fence();
        let mut backoff = Backoff::new();
        // Acquire: pairs with the biased locker's release of `busy`.
        while self.busy.load(Ordering::Acquire) != 0 {
            backoff.snooze(std::thread::yield_now);
        }
    }

    /// A newcomer's short spin ([`NEWCOMER_SPIN_ROUNDS`] rounds of 1, 2, 4,
    /// 8 pause instructions) for a lock held on another core. Stops as soon
    /// as threads are parked: once waiters queue up, a newcomer that spun and
    /// won would keep the lock bouncing between cores, so it parks instead
    /// and the holder runs on undisturbed.
    fn newcomer_spin(&self) -> bool {
        for round in 0..NEWCOMER_SPIN_ROUNDS {
            if self.flags.load(Ordering::Relaxed) & PARKED != 0 {
                return false;
            }
            for _ in 0..1u32 << round {
                core::hint::spin_loop();
            }
            if self.try_acquire() {
                return true;
            }
        }
        false
    }

    /// How a woken waiter (holding `WAKING`) tries for the lock: it polls,
    /// with growing gaps, and takes the lock only when it is free *and* at
    /// most [`WOKEN_QUIET_RELEASES`] releases happened since the previous
    /// poll. A lock that a thread on
    /// another core keeps re-taking (free for a few nanoseconds at a time)
    /// is left to it: winning it would move the lock, and that thread would
    /// become a waiter, to be woken in turn, moving it back — with two
    /// workers every wake-up was a migration, about 25,000 per run of the
    /// mutex bench. Meanwhile `WAKING` keeps further unlocks from waking
    /// anybody (they only count themselves in `releases`), so the holder's
    /// unlocks stay cheap. When the lock goes quiet
    /// the waiter takes it within one gap; if it stays busy for all of
    /// [`WOKEN_POLLS`], the waiter asks for a hand-off, which bounds how long
    /// a busy lock can pass it over (about 1 ms).
    fn woken_acquire(&self) -> bool {
        use Ordering::Relaxed;
        let mut seen = self.releases.load(Relaxed);
        for poll in 0..WOKEN_POLLS {
            for _ in 0..1u32 << poll.min(WOKEN_MAX_GAP_SHIFT) {
                core::hint::spin_loop();
            }
            let now = self.releases.load(Relaxed);
            if now.wrapping_sub(seen) <= WOKEN_QUIET_RELEASES && self.try_acquire() {
                return true;
            }
            seen = now;
            if poll % 8 == 7 {
                U::yield_now();
                // Other threads ran meanwhile, for an unknown time, so the
                // last look says nothing about the lock now: start anew.
                seen = self.releases.load(Relaxed);
            }
        }
        false
    }

    /// A fast-path acquisition found the lock last taken by another thread.
    /// Every [`HOLDER_CHANGES_PER_BACK_OFF`]th time, with more than one
    /// worker, the thread backs off (see "Two holders" in the module docs).
    #[cold]
    #[inline(never)]
    fn holder_changed(&self, me: u32) {
        self.holder.store(me, Ordering::Relaxed);
        let n = self.holder_changes.load(Ordering::Relaxed).wrapping_add(1);
        self.holder_changes.store(n, Ordering::Relaxed);
        if n.is_multiple_of(HOLDER_CHANGES_PER_BACK_OFF) && U::num_workers() > 1 {
            self.back_off();
            self.holder.store(me, Ordering::Relaxed);
        }
    }

    /// Called holding the lock: releases it and takes it again as a
    /// waiter would, parking first (the park's re-check of the lock means a
    /// lock that nobody took meanwhile is simply taken again).
    pub(crate) fn back_off(&self) {
        // SAFETY: the caller holds the lock.
        unsafe { self.unlock() };
        self.lock_contended(true);
    }

    /// Takes a lock found held (`back_off`: released by us just now; then
    /// park at once instead of spinning or trying first).
    #[cold]
    #[inline(never)]
    fn lock_contended(&self, back_off: bool) {
        let waiter = Waiter::<U> {
            slot: U::SuspendedThread::default(),
            state: AtomicU8::new(ARRIVING),
            next: ProtocolCell::new(ptr::null()),
        };
        // With one worker the holder cannot run while we spin.
        let multi = U::num_workers() > 1;
        let mut woken = false;
        let mut back_off = back_off;
        loop {
            if !core::mem::take(&mut back_off)
                && ((multi && self.newcomer_spin()) || self.try_acquire())
            {
                return;
            }
            match self.park(&waiter, woken) {
                Woke::HandedOff => return,
                Woke::Woken => {
                    // We were woken to take the lock: keep WAKING (no other
                    // waiter is woken meanwhile) and try for a while.
                    let won = multi && self.woken_acquire();
                    self.flags.fetch_and(!WAKING, Ordering::Relaxed);
                    if won {
                        return;
                    }
                    woken = true;
                }
                Woke::Cancelled => {}
            }
        }
    }

    /// Queues `w` and parks in it, unless the lock turns out to be free.
    /// A waiter that was woken before and lost (`lost`) goes to the front
    /// and asks for a hand-off.
    fn park(&self, w: &Waiter<U>, lost: bool) -> Woke {
        w.state.store(ARRIVING, Ordering::Relaxed);
        let parked_flags = if lost { PARKED | FAIR } else { PARKED };
        // The decision function runs once our context is saved. Everything
        // it touches (`self`, `w`) stays alive until its last step: nobody
        // can wake us before the final CAS marks us ASLEEP (a waker that
        // dequeues us earlier only flips `state`), and after that CAS the
        // function returns without touching memory.
        w.slot.wait_with(move || {
            let (fenced, epoch) = {
                let mut q = self.queue.lock();
                // SAFETY: `w` lives on our stack until we are woken or have
                // taken it back out of the queue; it is not queued now.
                unsafe {
                    if lost {
                        q.push_front(w);
                    } else {
                        q.push_back(w);
                    }
                }
                if self.flags.load(Ordering::Relaxed) & parked_flags != parked_flags {
                    self.flags.fetch_or(parked_flags, Ordering::Relaxed);
                }
                // A woken waiter that lost (`lost`) has just cleared WAKING,
                // which an unlock may have seen set and therefore not woken
                // anybody: that store is newer than any earlier fence, so it
                // always fences itself.
                (q.fenced && !lost, q.epoch)
            };
            // Dekker with `unlock`: our PARKED store vs its `locked` store.
            // Skipped by a newcomer when an earlier parker's fence completed
            // while PARKED stayed set: every unlock that loads `flags` after
            // that fence sees PARKED and wakes the queue's head (or leaves it
            // to a woken waiter on its way, which clears WAKING before it
            // unlocks or re-parks with a fence), and one that loaded before
            // it had released `locked` before it, so that parker's re-check
            // saw the lock free, and it took itself out and went back to take
            // the lock — and a release after that sees PARKED. Either way
            // somebody keeps waking the queue in order, so a parker that
            // skips the fence also skips the re-check and parks even if the
            // lock is free right now (a re-check without a fence would prove
            // nothing, and one that sends the parker back to take a free lock
            // keeps the lock bouncing between cores: with 2 workers the mutex
            // bench took 0.12-0.14 s with it and 0.10 s without, measured
            // alternately in a period of slow cross-core transfers).
            if !fenced {
                heavy_fence();
                if self.locked.load(Ordering::Relaxed) == 0 {
                    let mut q = self.queue.lock();
                    // SAFETY: `w` is alive; we only unlink it.
                    if unsafe { q.remove(w) } {
                        if q.is_empty() {
                            self.flags.fetch_and(!(PARKED | FAIR), Ordering::Relaxed);
                            q.emptied();
                        }
                        return false;
                    }
                    // A waker already took us: let it finish the wake-up.
                } else {
                    let mut q = self.queue.lock();
                    // The queue has not been empty since we joined it, so
                    // PARKED has been set since before our fence.
                    if q.epoch == epoch {
                        q.fenced = true;
                    }
                }
            }
            w.state
                .compare_exchange(ARRIVING, ASLEEP, Ordering::Release, Ordering::Relaxed)
                .is_ok()
        });
        match w.state.load(Ordering::Acquire) {
            HANDED_OFF => Woke::HandedOff,
            WOKEN => Woke::Woken,
            _ => Woke::Cancelled,
        }
    }

    /// Takes the first waiter off the queue, keeping `flags` in step: clears
    /// `PARKED` and `FAIR` if the queue is now empty, else `also_clear`. The
    /// caller wakes the waiter (after the queue lock is released here) and
    /// does not touch it afterwards.
    fn dequeue_first(&self, also_clear: u8) -> Option<NonNull<Waiter<U>>> {
        let mut q = self.queue.lock();
        // SAFETY: queued waiters are alive until woken, which the caller
        // does after this returns.
        let w = unsafe { q.pop_front() };
        let clear = if q.is_empty() {
            q.emptied();
            PARKED | FAIR
        } else {
            also_clear
        };
        if clear != 0 {
            self.flags.fetch_and(!clear, Ordering::Relaxed);
        }
        w
    }

    /// Hands the lock (still held) to the first waiter. `false` if nobody
    /// waits.
    #[cold]
    fn hand_off(&self) -> bool {
        match self.dequeue_first(FAIR) {
            // SAFETY: dequeued just now.
            Some(w) => unsafe {
                wake(w, HANDED_OFF);
                true
            },
            None => false,
        }
    }

    /// The part of an unlock that looks at `flags` (`f`, loaded after the
    /// release): while a woken waiter watches the lock (`WAKING`), count the
    /// release for it (see [`RawMutex::woken_acquire`]); otherwise wake the
    /// first parked waiter, if any.
    #[cold]
    #[inline(never)]
    fn after_release(&self, f: u8) {
        if f & WAKING != 0 {
            // After our release another thread may bump it too and one
            // increment may be lost: the count is a hint, and a lock that is
            // being re-taken changes it many times between two looks.
            let n = self.releases.load(Ordering::Relaxed);
            self.releases.store(n.wrapping_add(1), Ordering::Relaxed);
        } else if f & PARKED != 0 {
            self.wake_one();
        }
    }

    /// Wakes the first waiter after a release, unless another woken waiter
    /// is already on its way.
    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        let mut f = self.flags.load(Ordering::Relaxed);
        loop {
            if f & (PARKED | WAKING) != PARKED {
                return;
            }
            match self.flags.compare_exchange_weak(
                f,
                f | WAKING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => f = now,
            }
        }
        match self.dequeue_first(0) {
            // SAFETY: dequeued above. The woken thread clears WAKING.
            Some(w) => unsafe { wake(w, WOKEN) },
            None => {
                self.flags.fetch_and(!WAKING, Ordering::Relaxed);
            }
        }
    }
}

// SAFETY: `locked` is taken by a CAS from 0 to 1 (acquire) and released by a
// store of 0 (release), or kept at 1 and passed to a dequeued waiter by a
// hand-off whose `state` swap (release) the waiter reads (acquire). Waiters
// are never lost: see the module docs for the fence argument.
unsafe impl<U: UltItf> RawLock<U> for RawMutex<U> {
    #[cfg(not(loom))]
    const INIT: Self = Self::new();

    fn unlocked() -> Self {
        Self::new()
    }

    #[inline]
    fn lock(&self) {
        let b = self.bias.load(Ordering::Relaxed);
        if b != REVOKED && self.lock_biased(b) {
            return;
        }
        if self.cas_lock() {
            let me = holder_id();
            if self.holder.load(Ordering::Relaxed) != me {
                self.holder_changed(me);
            }
        } else {
            self.lock_contended(false);
            self.holder.store(holder_id(), Ordering::Relaxed);
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.try_acquire()
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed) != 0
    }

    #[inline]
    unsafe fn unlock(&self) {
        if self.flags.load(Ordering::Relaxed) & FAIR != 0 && self.hand_off() {
            return;
        }
        self.locked.store(0, Ordering::Release);
        // Dekker with `park`: our `locked` store vs a waiter's PARKED store.
        light_fence();
        let f = self.flags.load(Ordering::Relaxed);
        if f != 0 {
            self.after_release(f);
        }
    }

    unsafe fn unlock_and_wait(&self, slot: &U::SuspendedThread) {
        // Release from the decision function, i.e. once we are in `slot`.
        // It only wakes or hands off to other threads, never switches. A
        // notifier may wake us while the release is still finishing on the
        // worker we left (the unlock reads `flags` after freeing `locked`);
        // since the release touches `self`, we do not return — and end the
        // caller's borrow of the mutex — before it has finished.
        let released = AtomicBool::new(false);
        let released_ref = &released;
        // `move`: the closure holds copies of its pointers, not references to
        // our locals, which may change once a notifier resumes us.
        slot.wait_with(move || {
            // SAFETY: we hold the lock (the caller's contract).
            unsafe { self.unlock() };
            // Last touch: `released` lives on our stack until we see it set.
            released_ref.store(true, Ordering::Release);
            true
        });
        let mut backoff = Backoff::new();
        while !released.load(Ordering::Acquire) {
            backoff.snooze(U::yield_now);
        }
    }
}
