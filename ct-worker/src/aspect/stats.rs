//! Per-worker counters.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::{Aspect, AspectInit};

/// Counters of one worker, as returned by [`StatsAspect::snapshot`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Threads forked by this worker.
    pub forks: u64,
    /// Successful steals (from other workers and from the global injector).
    pub steals: u64,
    /// Switches into user-level threads.
    pub switches: u64,
    /// Nanoseconds spent without work (backing off or asleep).
    pub idle_ns: u64,
}

#[derive(Debug, Default)]
struct Counters {
    forks: AtomicU64,
    steals: AtomicU64,
    switches: AtomicU64,
    idle_ns: AtomicU64,
}

thread_local! {
    static IDLE_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Counts scheduler events per worker. Each worker only writes its own
/// counters (a load and a store, no atomic read-modify-write), so counting
/// costs about a nanosecond per event; [`StatsAspect::snapshot`] may be read
/// at any time from any thread.
#[derive(Debug)]
pub struct StatsAspect {
    workers: Vec<CachePadded<Counters>>,
}

#[inline(always)]
fn bump(c: &AtomicU64, by: u64) {
    // Only the owning worker writes: a plain increment is enough.
    c.store(c.load(Ordering::Relaxed) + by, Ordering::Relaxed);
}

impl StatsAspect {
    /// Current counters, one entry per worker.
    pub fn snapshot(&self) -> Vec<WorkerStats> {
        self.workers
            .iter()
            .map(|c| WorkerStats {
                forks: c.forks.load(Ordering::Relaxed),
                steals: c.steals.load(Ordering::Relaxed),
                switches: c.switches.load(Ordering::Relaxed),
                idle_ns: c.idle_ns.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The sum over all workers.
    pub fn total(&self) -> WorkerStats {
        self.snapshot()
            .into_iter()
            .fold(WorkerStats::default(), |a, b| WorkerStats {
                forks: a.forks + b.forks,
                steals: a.steals + b.steals,
                switches: a.switches + b.switches,
                idle_ns: a.idle_ns + b.idle_ns,
            })
    }
}

impl Aspect for StatsAspect {
    fn new(init: &AspectInit) -> Self {
        StatsAspect {
            workers: (0..init.workers)
                .map(|_| CachePadded::new(Counters::default()))
                .collect(),
        }
    }

    #[inline(always)]
    fn fork(&self, w: usize) {
        bump(&self.workers[w].forks, 1);
    }

    #[inline(always)]
    fn steal(&self, w: usize, _victim: Option<usize>) {
        bump(&self.workers[w].steals, 1);
    }

    #[inline(always)]
    fn switch(&self, w: usize) {
        bump(&self.workers[w].switches, 1);
    }

    fn idle_begin(&self, _w: usize) {
        IDLE_SINCE.with(|s| s.set(Some(Instant::now())));
    }

    fn idle_end(&self, w: usize) {
        if let Some(t) = IDLE_SINCE.with(|s| s.take()) {
            bump(&self.workers[w].idle_ns, t.elapsed().as_nanos() as u64);
        }
    }
}
