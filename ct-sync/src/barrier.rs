//! A reusable barrier whose waiters are woken worker by worker.
//!
//! Waiters are kept in *groups*, one per OS thread that runs them (a
//! worker): the first thread of an OS thread to wait claims a free group for
//! it, and later threads that find no free group share a last one. Arrival
//! bumps the group's count, which gives the thread a slot in the group's
//! slot array (a plain load and store in an owned group: its threads never
//! run at the same time), and then the barrier's count with one `fetch_add`,
//! which finds the last arriver. The last arriver flips the generation,
//! wakes the waiters of its own group one by one, and for every other group
//! records the group's count and wakes only the thread in its last slot,
//! the *local leader*, which wakes the rest of its group where they parked.
//! So a wake-up crosses cores once per worker, not once per thread, and a
//! waiter's slot, its descriptor and the woken thread stay on its worker
//! (ct-worker also sends woken threads home, and other workers take them
//! only after idling a while). With every waiter in one slot array, the last
//! arriver pulled each slot written on another core into its cache, one
//! serial miss after another: 50 threads × 300,000 episodes on two workers
//! took 1.8–2.8 s instead of 0.5–1.0 s when the host placed the two vCPUs
//! far apart and the threads were spread over both workers.
//!
//! On a single worker groups gain nothing and cost a few nanoseconds per
//! wait, so the first thread to wait decides for good: if its threading
//! library has one worker, the barrier runs *flat* — every waiter parks at
//! its arrival number in one slot array and the last arriver wakes them all.
//!
//! Counters and slots are double-buffered by generation parity ("sense
//! reversal"): threads released from generation `g` may arrive at `g + 1`
//! while `g`'s waiters are still being woken, without touching `g`'s state.
//!
//! The condition-variable barrier of the original cmpth got 2.9× *slower*
//! with two workers than with one (every waiter went through a mutex and a
//! LIFO list). Here a waiter costs one atomic increment, one park and one
//! wake-up, on any number of workers.

use crossbeam_utils::CachePadded;
use ct_worker::{OsThreads, SuspendedThreadItf, Ult, UltItf};

use crate::sync::{AtomicUsize, Ordering};

/// Result of [`Barrier::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarrierWaitResult {
    leader: bool,
}

impl BarrierWaitResult {
    /// `true` for exactly one thread per episode (the last to arrive).
    pub fn is_leader(&self) -> bool {
        self.leader
    }
}

/// Most slots (over all groups and both parities) a barrier allocates: with
/// many participants, fewer groups (down to one).
const MAX_SLOTS: usize = 1 << 20;

// `Barrier::mode` values.
const UNDECIDED: usize = 0;
/// Every waiter in the shared group's slots, at its arrival number; the last
/// arriver wakes them all (one worker: nothing to gain from groups).
const FLAT: usize = 1;
/// Waiters grouped by the OS thread that runs them.
const GROUPED: usize = 2;

/// The waiters of one group: the threads of one worker, or (the last group)
/// of any OS thread that found its worker's group owned by another.
struct Group<U: UltItf> {
    /// The OS thread whose threads use this group ([`os_thread_id`]; 0:
    /// none yet, and always for the shared last group). Threads on one OS
    /// thread never run at the same time and are never suspended between a
    /// load and a store below, so they count arrivals with a plain load and
    /// store instead of a read-modify-write.
    owner: AtomicUsize,
    /// Per parity: arrivals in the current episode (reset by the last
    /// arriver), and the count the last arriver recorded for the group's
    /// local leader.
    count: [AtomicUsize; 2],
    released: [AtomicUsize; 2],
    /// Per parity: one slot per possible waiter of the group. Not padded:
    /// only the group's own worker writes them while the barrier fills.
    slots: [Box<[U::SuspendedThread]>; 2],
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

/// A non-zero number that differs between OS threads alive at the same
/// time (under loom: between loom threads, which share an OS thread).
#[cfg(not(loom))]
fn os_thread_id() -> usize {
    std::thread_local! {
        static ID: u8 = const { 0 };
    }
    ID.with(|b| core::ptr::from_ref(b) as usize)
}

#[cfg(loom)]
fn os_thread_id() -> usize {
    // The thread's number within the execution (its `Debug` form is
    // `ThreadId(n)`); hashing the id itself would differ between executions.
    let name = format!("{:?}", loom::thread::current().id());
    let n: usize = name
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0);
    (n + 1) * 64
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
        // One group per worker index, and the shared one.
        Barrier {
            n,
            mode: AtomicUsize::new(GROUPED),
            generation: CachePadded::new(AtomicUsize::new(0)),
            arrived: [
                CachePadded::new(AtomicUsize::new(0)),
                CachePadded::new(AtomicUsize::new(0)),
            ],
            groups: (0..=groups)
                .map(|_| {
                    CachePadded::new(Group {
                        owner: AtomicUsize::new(0),
                        count: [AtomicUsize::new(0), AtomicUsize::new(0)],
                        released: [AtomicUsize::new(0), AtomicUsize::new(0)],
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
    /// claim, else the shared last group.
    #[inline]
    fn group_of_caller(&self) -> (usize, bool) {
        let shared = self.groups.len() - 1;
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
    /// worker. (Every episode sees one mode, so threads of another library
    /// may still use the barrier, only without the benefit of groups.)
    #[inline]
    fn grouped(&self) -> bool {
        match self.mode.load(Ordering::Relaxed) {
            FLAT => false,
            GROUPED => true,
            _ => {
                let m = if U::num_workers() > 1 { GROUPED } else { FLAT };
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
    /// Panics if more threads than the barrier's count wait in one episode.
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
        let (mine, exclusive) = self.group_of_caller();
        let group = &self.groups[mine];
        // Relaxed: published to the last arriver by the AcqRel increment
        // below (every increment of `arrived` is a read-modify-write, so the
        // last arriver's synchronizes with all of them). The last arriver
        // resets the count only after every arrival of this episode, and
        // nobody counts again at this parity before it has woken them.
        let j = if exclusive {
            let c = group.count[parity].load(Ordering::Relaxed);
            group.count[parity].store(c + 1, Ordering::Relaxed);
            c
        } else {
            group.count[parity].fetch_add(1, Ordering::Relaxed)
        };
        let i = self.arrived[parity].fetch_add(1, Ordering::AcqRel);
        assert!(
            i < self.n,
            "more than {} threads waited on a barrier in one episode",
            self.n
        );
        if i + 1 < self.n {
            group.slots[parity][j].wait_with(|| true);
            // The last arriver stored this group's count before waking its
            // local leader, which wakes the others after reading it: so every
            // waiter of the group reads this episode's value, and the local
            // leader (the group's last arriver) is the one that finds its
            // own slot last.
            if group.released[parity].load(Ordering::Acquire) == j + 1 {
                U::SuspendedThread::notify_home_each(&group.slots[parity][..j]);
            }
            return BarrierWaitResult { leader: false };
        }
        // Last to arrive: open the next generation, then wake this episode's
        // waiters. Each is parked or about to park (nothing between its
        // arrival and its parking can block). The counts of this parity are
        // reset on the way: nobody uses them again before the next episode
        // of this parity, which needs every thread woken here.
        self.arrived[parity].store(0, Ordering::Relaxed);
        self.generation.store(g.wrapping_add(1), Ordering::Release);
        for (u, grp) in self.groups.iter().enumerate() {
            if u == mine {
                continue;
            }
            let c = grp.count[parity].swap(0, Ordering::Relaxed);
            if c > 0 {
                // Its local leader (the thread in its last slot) wakes the
                // rest, on its own worker.
                grp.released[parity].store(c, Ordering::Release);
                U::SuspendedThread::notify_home_each(&grp.slots[parity][c - 1..c]);
            }
        }
        // Our own group: no local leader (0 matches no slot); we wake them.
        let c = group.count[parity].swap(0, Ordering::Relaxed);
        group.released[parity].store(0, Ordering::Release);
        let own = &group.slots[parity];
        U::SuspendedThread::notify_home_each(own[..j].iter().chain(&own[j + 1..c]));
        BarrierWaitResult { leader: true }
    }
}

impl<U: UltItf> Barrier<U> {
    /// [`Barrier::wait`] in [`FLAT`] mode, in generation `g`.
    #[inline]
    fn wait_flat(&self, g: usize) -> BarrierWaitResult {
        let parity = g & 1;
        let i = self.arrived[parity].fetch_add(1, Ordering::AcqRel);
        assert!(
            i < self.n,
            "more than {} threads waited on a barrier in one episode",
            self.n
        );
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
