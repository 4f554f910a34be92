//! A reusable barrier whose waiters are counted and woken worker by worker.
//!
//! Waiters are kept in *groups*, one per worker (OS thread) that runs them:
//! the first thread of a worker to wait claims a free group for it. An
//! arrival only counts itself in its group (a plain load and store: the
//! group's threads never run at the same time) and parks; the first arrival
//! of an episode in the group also queues the group's *idle hook* on the
//! worker ([`ct_worker::idle`]). When the worker has nothing left to run —
//! every thread of the group that was going to arrive has parked — the hook
//! adds the group's arrivals to the barrier's count in one atomic operation.
//! The hook that completes the count opens the next generation and wakes its
//! own group; on every other worker, its own hook has been watching the
//! generation since it published its count, and wakes its group where it
//! parked. So an episode moves a handful of cache lines between cores
//! (the count, once per worker, and the generation), however many threads
//! each worker runs; a waiter's slot, its descriptor and its stack stay on
//! its worker. When the barrier counted and woke every thread across cores
//! (its first design), 50 threads × 300,000 episodes on two workers took
//! 1.8–2.8 s when the host placed the two vCPUs far apart (a cache-line
//! round trip of 400–500 ns); with per-worker wake-up but per-thread
//! counting, 0.8–1.1 s; as described here, 0.4–0.6 s (and 0.3–0.45 s with
//! the vCPUs close together, faster than on one worker).
//!
//! A worker about to sleep cannot watch: its hook then marks the group
//! asleep (and looks at the generation once more), and whoever completes
//! the episode (a hook, or a thread of the shared group) wakes the thread
//! in the group's last slot instead, through the worker's inbox, which wakes
//! the worker; that *local leader* wakes the rest of its group.
//!
//! A thread that arrives first in its group, on a worker with nothing else
//! to run whose runtime keeps idle workers awake anyway
//! ([`UltItf::may_wait_awake`]), *waits awake* instead: it adds itself to
//! the barrier's count at once and polls the generation for a few
//! microseconds ([`AWAKE_POLLS`] rounds of the workspace's back-off),
//! completing the episode if it is the last. Most episodes of a team with a
//! thread per worker then cost what a spinning barrier costs: parking,
//! running the hook, waking and resuming the thread took 0.48–0.67 µs per
//! episode of two threads on two workers, against 0.31–0.47 µs for
//! libgomp's; waiting awake, 0.31–0.40 µs (Intel Xeon, KVM, 2 vCPUs,
//! OpenMP `barrier` kernel, libgomp and both interleaved). A wait that
//! outlasts the polls (or sees other work arrive on its worker) parks in
//! its group like any other arrival, marked as already published, and its
//! group's hook wakes it.
//!
//! Threads that cannot queue hooks (OS threads, or more workers than groups)
//! share a last group: they count themselves in it and in the barrier with
//! `fetch_add`, and the last arriver wakes them one by one.
//!
//! On a single worker groups gain nothing and cost a few nanoseconds per
//! wait, so the first thread to wait decides for good: if its threading
//! library has one worker (or no idle hooks), the barrier runs *flat* —
//! every waiter counts itself in the barrier, parks at its arrival number in
//! one slot array, and the last arriver wakes them all.
//!
//! Counters and slots are double-buffered by generation parity ("sense
//! reversal"): threads released from generation `g` may arrive at `g + 1`
//! while `g`'s waiters are still being woken, without touching `g`'s state.
//!
//! The condition-variable barrier of the original cmpth got 2.9× *slower*
//! with two workers than with one (every waiter went through a mutex and a
//! LIFO list).
//!
//! A thread that occupies a worker without ever parking or yielding delays
//! the episodes of the barrier's waiters on that worker until it does (their
//! arrivals are published when the worker runs out of runnable threads).

use crossbeam_utils::CachePadded;
use ct_worker::{IdleHook, IdleMode, OsThreads, SuspendedThreadItf, Ult, UltItf};

use crate::sync::{AtomicPtr, AtomicUsize, Backoff, Ordering, fence, os_thread_id};

/// Result of [`Barrier::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarrierWaitResult {
    leader: bool,
}

impl BarrierWaitResult {
    /// `true` for exactly one thread per episode (the last to arrive, or,
    /// when a worker's idle hook completes the episode, the last thread of
    /// that worker to arrive).
    pub fn is_leader(&self) -> bool {
        self.leader
    }
}

/// Rounds a thread waiting awake polls the generation, one pause hint each
/// (the back-off's [`Backoff::polling`]: about 5 µs), before it parks.
#[cfg(not(loom))]
const AWAKE_POLLS: u32 = 128;
#[cfg(loom)]
const AWAKE_POLLS: u32 = 2;
/// A thread waiting awake asks every this many rounds whether it still may
/// ([`UltItf::may_wait_awake`]: work may have come to its worker).
const AWAKE_RECHECK: u32 = 16;

/// Who completes an episode (see [`Barrier::complete`]).
#[derive(Clone, Copy)]
enum Completer {
    /// The thread in this slot of the shared group.
    Shared(usize),
    /// The idle hook of the completing group; the group's last arriver
    /// leads.
    Hook,
    /// A thread waiting awake: its group has no waiter at this parity.
    Awake,
}

/// Most slots (over all groups and both parities) a barrier allocates: with
/// many participants, fewer groups (down to one).
const MAX_SLOTS: usize = 1 << 20;

// `Barrier::mode` values.
const UNDECIDED: usize = 0;
/// Every waiter in the shared group's slots, at its arrival number; the last
/// arriver wakes them all (one worker: nothing to gain from groups).
const FLAT: usize = 1;
/// Waiters grouped by the worker that runs them.
const GROUPED: usize = 2;

// `Group::watch` values, per parity: who wakes the group's waiters.
/// The group's idle hook watches the generation and wakes them.
const WATCHING: usize = 0;
/// The worker went to sleep: the completer wakes the local leader. (Set by
/// the hook; taken back by it with a CAS if it sees the release first.)
const ASLEEP: usize = 1;
/// The completer took over from `ASLEEP` (and wakes the local leader); the
/// group's next arrival at this parity resets it to `WATCHING`.
const CLAIMED: usize = 2;

/// The waiters of one group: the threads of one worker, or (the last group)
/// of any thread that cannot use an owned group.
struct Group<U: UltItf> {
    /// Publishes the group's arrivals and wakes its waiters (owned groups;
    /// its data pointer is the group).
    hook: IdleHook,
    /// The barrier, for the hook (set before each queueing).
    barrier: AtomicPtr<()>,
    /// This group's index in the barrier.
    index: usize,
    /// The OS thread whose threads use this group ([`os_thread_id`](crate::sync::os_thread_id); 0:
    /// none yet, and always for the shared last group). Only that OS thread
    /// touches `queued`, `episode`, `count` and `flushed` of an owned group
    /// (besides a completer that claims the group from its sleeping worker,
    /// and then reads and resets the counts its hook has published and left
    /// alone), and nothing suspends its threads between their loads and
    /// stores.
    /// On a line of its own: threads of other OS threads read it at every
    /// arrival (looking for their group); next to the owner's counts, each
    /// such read made the owner's next count miss, and the fence of its next
    /// deque pop wait for the line to come back across cores.
    owner: CachePadded<AtomicUsize>,
    /// Whether the hook is queued (owned groups).
    queued: AtomicUsize,
    /// Per parity: the generation the group's arrivals at that parity are for.
    episode: [AtomicUsize; 2],
    /// Per parity: arrivals in the current episode, and (owned groups) how
    /// many of them the hook has added to the barrier's count.
    count: [AtomicUsize; 2],
    flushed: [AtomicUsize; 2],
    /// Per parity: the count the completer recorded for the local leader
    /// when it claimed the group (0: not claimed), and the slot number + 1
    /// of the episode's leader when the group's own hook completed it.
    released: [AtomicUsize; 2],
    leader: [AtomicUsize; 2],
    /// Per parity: [`WATCHING`], [`ASLEEP`] or [`CLAIMED`]. On a line of its
    /// own: the completer reads it every episode, the owner writes it only
    /// when its worker goes to sleep, so it stays cached on both sides.
    watch: CachePadded<[AtomicUsize; 2]>,
    /// Per parity: one slot per possible waiter of the group. Not padded:
    /// only the group's own worker writes them while the barrier fills.
    slots: [Box<[U::SuspendedThread]>; 2],
}

impl<U: UltItf> Group<U> {
    /// The owner's hook takes back the wake-up of `parity` that it handed
    /// over when its worker went to sleep; fails if a completer claimed it.
    fn take_back(&self, parity: usize) -> bool {
        self.watch[parity]
            .compare_exchange(ASLEEP, WATCHING, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// A completer takes over the wake-up of `parity` from a sleeping
    /// worker; fails if the group is watched (or its hook took it back).
    fn claim(&self, parity: usize) -> bool {
        self.watch[parity].load(Ordering::Relaxed) == ASLEEP
            && self.watch[parity]
                .compare_exchange(ASLEEP, CLAIMED, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// A barrier for a fixed number of threads, reusable for any number of
/// episodes, like [`std::sync::Barrier`]. Waiting threads park. Everything a
/// thread wrote before `wait` is visible to every thread after it.
///
/// Memory: two arrays of `n` slots (a word each) per group, with as many
/// groups as CPUs (as the OS reports them) or workers, whichever is more
/// (rounded up to a power of two), plus a shared group, but at most about a
/// million slots in all (with more participants, fewer groups).
///
/// ```
/// use ct_sync::Barrier;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
/// let barrier = Barrier::new(4);
/// let phase1 = AtomicUsize::new(0);
/// rt.block_on(|| {
///     ct_worker::scope(|s| {
///         for _ in 0..4 {
///             s.spawn(|| {
///                 phase1.fetch_add(1, Ordering::Relaxed);
///                 barrier.wait();
///                 assert_eq!(phase1.load(Ordering::Relaxed), 4);
///             });
///         }
///     })
/// });
/// ```
pub struct Barrier<U: UltItf = Ult> {
    n: usize,
    /// [`UNDECIDED`], [`FLAT`] or [`GROUPED`]; decided at the first wait.
    mode: AtomicUsize,
    /// Set when more than `n` arrivals were counted in one episode (found by
    /// an idle hook, which cannot panic): every waiter then panics.
    overflow: AtomicUsize,
    generation: CachePadded<AtomicUsize>,
    arrived: [CachePadded<AtomicUsize>; 2],
    groups: Box<[CachePadded<Group<U>>]>,
}

impl Barrier {
    /// A barrier for `n` user-level threads of a default-configuration
    /// runtime. For other threading libraries use [`Barrier::new_in`].
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    pub fn new(n: usize) -> Self {
        Self::new_in(n)
    }
}

/// The idle hook of an owned group: `data` is the group.
///
/// # Safety
///
/// Run by the worker of the group's owner while the hook is queued: then
/// the group has waiters that have not been woken, which keep the barrier
/// (whose address the group holds) alive.
unsafe fn group_hook<U: UltItf>(data: *const (), mode: IdleMode) -> bool {
    // SAFETY: per the contract, a live group of a live barrier.
    let group = unsafe { &*data.cast::<Group<U>>() };
    // SAFETY: as above; set before the hook was queued.
    let barrier = unsafe { &*group.barrier.load(Ordering::Relaxed).cast::<Barrier<U>>() };
    barrier.run_hook(group.index, mode)
}

impl<U: UltItf> Barrier<U> {
    /// A barrier for `n` threads of `U`.
    ///
    /// # Panics
    ///
    /// Panics if `n` is 0.
    pub fn new_in(n: usize) -> Self {
        assert!(n > 0, "a barrier needs at least one participant");
        let by_memory = (MAX_SLOTS / (2 * n)).saturating_sub(1).max(1);
        let b = Self::with_groups(
            n,
            OsThreads::num_workers()
                .max(U::num_workers())
                .min(by_memory),
        );
        b.mode.store(UNDECIDED, Ordering::Relaxed);
        b
    }

    /// A barrier for `n` threads with `groups` groups (rounded up to a
    /// power of two, at most `n`) and the shared one.
    pub(crate) fn with_groups(n: usize, groups: usize) -> Self {
        assert!(n > 0, "a barrier needs at least one participant");
        let groups = groups.clamp(1, n).next_power_of_two();
        // A group's count orders its arrivals, the barrier's count finds
        // the last one; the two orders differ, so any of the `n` arrivals of
        // a group may park, in any of `n` slots.
        let slots = || (0..n).map(|_| U::SuspendedThread::default()).collect();
        let pair = || [AtomicUsize::new(0), AtomicUsize::new(0)];
        Barrier {
            n,
            mode: AtomicUsize::new(GROUPED),
            overflow: AtomicUsize::new(0),
            generation: CachePadded::new(AtomicUsize::new(0)),
            arrived: [
                CachePadded::new(AtomicUsize::new(0)),
                CachePadded::new(AtomicUsize::new(0)),
            ],
            // One group per worker index, and the shared one.
            groups: (0..=groups)
                .map(|index| {
                    CachePadded::new(Group {
                        hook: IdleHook::new(group_hook::<U>),
                        barrier: AtomicPtr::new(core::ptr::null_mut()),
                        index,
                        owner: CachePadded::new(AtomicUsize::new(0)),
                        queued: AtomicUsize::new(0),
                        episode: pair(),
                        count: pair(),
                        flushed: pair(),
                        released: pair(),
                        leader: pair(),
                        watch: CachePadded::new(pair()),
                        slots: [slots(), slots()],
                    })
                })
                .collect(),
        }
    }

    /// Number of participants.
    pub fn participants(&self) -> usize {
        self.n
    }

    /// The caller's group, and whether its OS thread owns it: one of two
    /// groups picked by hashing the OS thread's id, whichever it owns or can
    /// claim, else (or if the caller cannot queue idle hooks) the shared
    /// last group.
    #[inline]
    fn group_of_caller(&self) -> (usize, bool) {
        let shared = self.groups.len() - 1;
        if !U::runs_idle_hooks() {
            return (shared, false);
        }
        let me = os_thread_id();
        // `shared` is a power of two: two candidates from the id's hash.
        let h = me.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
        for k in 0..2 {
            let candidate = (h + k) & (shared - 1);
            let owner = &self.groups[candidate].owner;
            match owner.load(Ordering::Relaxed) {
                o if o == me => return (candidate, true),
                0 if owner
                    .compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok() =>
                {
                    return (candidate, true);
                }
                _ => {}
            }
        }
        (shared, false)
    }

    /// Whether waiters are grouped: decided by the first thread to wait, for
    /// good: grouped if it runs on a threading library with more than one
    /// worker and idle hooks. (Every episode sees one mode, so threads of
    /// another library may still use the barrier, in the shared group.)
    #[inline]
    fn grouped(&self) -> bool {
        match self.mode.load(Ordering::Relaxed) {
            FLAT => false,
            GROUPED => true,
            _ => {
                let m = if U::num_workers() > 1 && U::runs_idle_hooks() {
                    GROUPED
                } else {
                    FLAT
                };
                match self
                    .mode
                    .compare_exchange(UNDECIDED, m, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => m == GROUPED,
                    Err(now) => now == GROUPED,
                }
            }
        }
    }

    /// Waits until all participants have called `wait` in this episode.
    ///
    /// # Panics
    ///
    /// Panics if more threads than the barrier's count wait in one episode
    /// (when a worker's idle hook finds that out, every waiter of the episode
    /// panics, and so does every later `wait`).
    #[inline]
    pub fn wait(&self) -> BarrierWaitResult {
        if self.n == 1 {
            return BarrierWaitResult { leader: true };
        }
        let g = self.generation.load(Ordering::Acquire);
        if !self.grouped() {
            return self.wait_flat(g);
        }
        self.wait_grouped(g)
    }

    /// [`Barrier::wait`] in [`GROUPED`] mode, in generation `g` (out of
    /// line: inlined next to the flat mode, it made that 5% slower).
    #[inline(never)]
    fn wait_grouped(&self, g: usize) -> BarrierWaitResult {
        let parity = g & 1;
        // Nothing between here and parking can suspend this thread, so the
        // group is that of the worker it parks on.
        let (mine, owned) = self.group_of_caller();
        let group = &self.groups[mine];
        let j = if owned {
            // Only this OS thread counts in this group, and its hook, which
            // publishes the count, runs on it later: plain and relaxed.
            // The hook watches this parity's release (a claim by the
            // completer two episodes ago, or a sleep in this episode, is
            // over: nobody looks at it before this arrival is published).
            if group.watch[parity].load(Ordering::Relaxed) != WATCHING {
                group.watch[parity].store(WATCHING, Ordering::Relaxed);
            }
            let first = group.count[parity].load(Ordering::Relaxed) == 0;
            let published = first && U::may_wait_awake();
            if published && let Some(r) = self.wait_awake(g, mine) {
                return r;
            }
            self.enlist(group, g, published)
        } else {
            let j = group.count[parity].fetch_add(1, Ordering::Relaxed);
            if self.count_arrival(parity) + 1 == self.n {
                self.complete(g, mine, Completer::Shared(j));
                return BarrierWaitResult { leader: true };
            }
            j
        };
        group.slots[parity][j].wait_with(|| true);
        // Woken as the local leader of a group the completer claimed (which
        // has reset its counts): wake the rest.
        if group.released[parity].load(Ordering::Relaxed) == j + 1 {
            group.released[parity].store(0, Ordering::Relaxed);
            U::SuspendedThread::notify_home_each(&group.slots[parity][..j]);
        }
        self.check_overflow();
        let leader = group.leader[parity].load(Ordering::Relaxed) == j + 1;
        if leader {
            group.leader[parity].store(0, Ordering::Relaxed);
        }
        BarrierWaitResult { leader }
    }

    /// Counts the caller, a thread of the group's owner arriving in
    /// generation `g`, in its owned `group`, and queues the group's hook if
    /// it is not queued; returns the caller's slot. `published`: the
    /// arrival is already in the barrier's count (a thread that waited
    /// awake), so the hook must not add it again.
    fn enlist(&self, group: &Group<U>, g: usize, published: bool) -> usize {
        let parity = g & 1;
        let j = group.count[parity].load(Ordering::Relaxed);
        self.check_count(j);
        group.count[parity].store(j + 1, Ordering::Relaxed);
        if published {
            // Only an arrival that found the group empty waits awake, so
            // the hook has published nothing of this episode yet.
            group.flushed[parity].store(j + 1, Ordering::Relaxed);
        }
        group.episode[parity].store(g, Ordering::Relaxed);
        if group.queued.load(Ordering::Relaxed) == 0 {
            group.queued.store(1, Ordering::Relaxed);
            group.barrier.store(
                core::ptr::from_ref(self).cast_mut().cast(),
                Ordering::Relaxed,
            );
            let data = core::ptr::from_ref::<Group<U>>(group).cast();
            // SAFETY: not queued (`queued` is cleared only when the hook
            // reports itself done); the hook reports done only when the
            // group has no waiter left to wake, and until then the waiters
            // (this thread first) keep the barrier and its groups alive; the
            // hook neither blocks nor parks.
            let ok = unsafe { U::defer_until_idle(&group.hook, data) };
            debug_assert!(ok, "groups are owned by workers with idle hooks");
        }
        j
    }

    /// Waits awake (see the module docs) in generation `g`, as the first
    /// arrival of owned group `mine`, which has no waiter at this parity:
    /// adds the caller to the barrier's count, completes the episode if it
    /// is the last, else polls for its end. Returns `None` if the polls ran
    /// out (or the worker got other work) first: the caller is counted and
    /// must park in its group ([`Barrier::enlist`] with `published`).
    fn wait_awake(&self, g: usize, mine: usize) -> Option<BarrierWaitResult> {
        if self.count_arrival(g & 1) + 1 == self.n {
            self.complete(g, mine, Completer::Awake);
            return Some(BarrierWaitResult { leader: true });
        }
        let mut backoff = Backoff::polling(AWAKE_POLLS, 0);
        for round in 1..=AWAKE_POLLS {
            // Acquire: the completer's release of the episode.
            if self.generation.load(Ordering::Acquire) != g {
                self.check_overflow();
                return Some(BarrierWaitResult { leader: false });
            }
            if round % AWAKE_RECHECK == 0 && !U::may_wait_awake() {
                break;
            }
            // Spins only (these are the back-off's polling rounds), and
            // never yields: a yield could move this thread to another
            // worker, away from its group.
            backoff.snooze(|| {});
        }
        None
    }

    /// Adds the caller to the barrier's count of `parity`; returns how many
    /// had arrived before it. AcqRel: every increment is a
    /// read-modify-write, so the last arriver's synchronizes with all of
    /// them (and the hooks').
    #[inline]
    fn count_arrival(&self, parity: usize) -> usize {
        let i = self.arrived[parity].fetch_add(1, Ordering::AcqRel);
        self.check_count(i);
        i
    }

    /// Panics unless `i` arrivals before the caller's leave room for it.
    #[inline]
    fn check_count(&self, i: usize) {
        assert!(
            i < self.n,
            "more than {} threads waited on a barrier in one episode",
            self.n
        );
    }

    /// Panics if more arrivals than participants were counted in this
    /// episode (found by a hook, which cannot panic itself).
    #[inline]
    fn check_overflow(&self) {
        if self.overflow.load(Ordering::Relaxed) != 0 {
            self.check_count(self.n);
        }
    }

    /// The idle hook of owned group `mine`, run by its worker: adds the
    /// arrivals not yet published to the barrier's count (completing the
    /// episode if they are the last), and wakes the group's waiters once
    /// their episode is over. Before the worker sleeps (`mode`), hands the
    /// wake-up to the completer instead. Returns whether it is done: no
    /// waiter of the group left to watch for.
    fn run_hook(&self, mine: usize, mode: IdleMode) -> bool {
        let group = &self.groups[mine];
        let mut pending = false;
        let mut wake = None;
        for parity in 0..2 {
            // The state first: a completer may claim an ASLEEP parity and
            // reset its counts at any moment, so they are read only when
            // nobody else can write them — WATCHING (only the owner sets
            // ASLEEP), or ASLEEP taken back with a CAS. (Reading the counts
            // first, a hook saw the old count and the reset `flushed`, and
            // published the group's arrivals twice.)
            let state = group.watch[parity].load(Ordering::Relaxed);
            if state == CLAIMED {
                // The completer has reset the counts and woken the local
                // leader, which wakes the rest.
                continue;
            }
            let c = group.count[parity].load(Ordering::Relaxed);
            if c == 0 {
                continue;
            }
            let e = group.episode[parity].load(Ordering::Relaxed);
            if state == ASLEEP {
                // Handed over, with every arrival published: take the
                // wake-up back if the episode is over and the completer has
                // not claimed it; else keep watching while awake.
                if self.generation.load(Ordering::Acquire) != e {
                    if group.take_back(parity) {
                        wake = Some((parity, c));
                    }
                } else if mode == IdleMode::Poll {
                    pending = true;
                }
                continue;
            }
            let published = group.flushed[parity].load(Ordering::Relaxed);
            if published != c {
                group.flushed[parity].store(c, Ordering::Relaxed);
                let d = c - published;
                // AcqRel: publishes this worker's waiters' writes, and the
                // last one synchronizes with every other publication.
                let i = self.arrived[parity].fetch_add(d, Ordering::AcqRel);
                if i + d >= self.n {
                    if i + d > self.n {
                        // Every waiter of the episode panics when woken.
                        self.overflow.store(1, Ordering::Relaxed);
                    }
                    // The last: nothing else is pending (the other parity's
                    // waiters would be participants of this episode).
                    group.queued.store(0, Ordering::Relaxed);
                    self.complete(e, mine, Completer::Hook);
                    return true;
                }
            }
            if self.generation.load(Ordering::Acquire) != e {
                wake = Some((parity, c));
            } else if mode == IdleMode::Sleep {
                // Hand the wake-up over, then look again: a store, a full
                // fence and a load on both sides, so either we see the new
                // generation or the completer sees ASLEEP (and claims).
                // (Acquire: if released, the completer's writes, and those
                // it acquired, are this group's waiters' to see.)
                group.watch[parity].store(ASLEEP, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if self.generation.load(Ordering::Acquire) != e && group.take_back(parity) {
                    wake = Some((parity, c));
                }
            } else {
                pending = true;
            }
        }
        if !pending {
            group.queued.store(0, Ordering::Relaxed);
        }
        if let Some((parity, c)) = wake {
            group.count[parity].store(0, Ordering::Relaxed);
            group.flushed[parity].store(0, Ordering::Relaxed);
            // The last use of the barrier unless waiters remain pending
            // (which keep it alive): the woken threads may end it.
            U::SuspendedThread::notify_home_each(&group.slots[parity][..c]);
        }
        !pending
    }

    /// Ends episode `g`: opens the next generation and wakes the waiters —
    /// the shared group's one by one, each claimed group's local leader, and
    /// finally the completer's own group `mine` (`me` says who completes).
    fn complete(&self, g: usize, mine: usize, me: Completer) {
        let parity = g & 1;
        let shared = self.groups.len() - 1;
        self.arrived[parity].store(0, Ordering::Relaxed);
        self.generation.store(g.wrapping_add(1), Ordering::Release);
        // Against a hook going to sleep (see `run_hook`).
        fence(Ordering::SeqCst);
        for (u, grp) in self.groups.iter().enumerate() {
            if u == mine {
                continue;
            }
            if u == shared {
                // Looked at before the swap, which would pull the line here.
                if grp.count[parity].load(Ordering::Relaxed) != 0 {
                    let c = grp.count[parity].swap(0, Ordering::Relaxed);
                    U::SuspendedThread::notify_home_each(&grp.slots[parity][..c]);
                }
            } else if grp.claim(parity) {
                // Its worker sleeps: reset its counts (its hook skips a
                // claimed parity) and wake its local leader (the thread in
                // its last slot), which wakes the rest where they parked.
                let c = grp.count[parity].load(Ordering::Relaxed);
                grp.count[parity].store(0, Ordering::Relaxed);
                grp.flushed[parity].store(0, Ordering::Relaxed);
                grp.released[parity].store(c, Ordering::Relaxed);
                U::SuspendedThread::notify_home_each(&grp.slots[parity][c - 1..c]);
            }
            // Otherwise its hook sees the new generation and wakes it.
        }
        // Our own group last: its waiters keep the barrier alive until here.
        let group = &self.groups[mine];
        let own = &group.slots[parity];
        match me {
            Completer::Shared(j) => {
                let c = group.count[parity].swap(0, Ordering::Relaxed);
                U::SuspendedThread::notify_home_each(own[..j].iter().chain(&own[j + 1..c]));
            }
            // Nothing counted in the group at this parity, nor parked.
            Completer::Awake => {}
            Completer::Hook => {
                let c = group.count[parity].load(Ordering::Relaxed);
                group.count[parity].store(0, Ordering::Relaxed);
                group.flushed[parity].store(0, Ordering::Relaxed);
                group.watch[parity].store(WATCHING, Ordering::Relaxed);
                group.leader[parity].store(c, Ordering::Relaxed);
                U::SuspendedThread::notify_home_each(&own[..c]);
            }
        }
    }
}

impl<U: UltItf> Barrier<U> {
    /// [`Barrier::wait`] in [`FLAT`] mode, in generation `g`.
    #[inline]
    fn wait_flat(&self, g: usize) -> BarrierWaitResult {
        let parity = g & 1;
        let i = self.count_arrival(parity);
        let slots = &self.groups[self.groups.len() - 1].slots[parity];
        if i + 1 < self.n {
            slots[i].wait_with(|| true);
            return BarrierWaitResult { leader: false };
        }
        self.arrived[parity].store(0, Ordering::Relaxed);
        self.generation.store(g.wrapping_add(1), Ordering::Release);
        U::SuspendedThread::notify_home_each(&slots[..i]);
        BarrierWaitResult { leader: true }
    }
}

impl<U: UltItf> core::fmt::Debug for Barrier<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Barrier")
            .field("participants", &self.n)
            .field("grouped", &(self.mode.load(Ordering::Relaxed) == GROUPED))
            .field("groups", &self.groups.len())
            .finish_non_exhaustive()
    }
}
