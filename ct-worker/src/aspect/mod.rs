//! Aspects: hooks the scheduler calls on its events, chosen at compile time.
//!
//! [`NoAspect`] compiles to nothing. [`StatsAspect`] counts forks, steals,
//! switches and idle time per worker; [`TraceAspect`] records a Chrome
//! trace-event file (open it in Perfetto or `chrome://tracing`).
//!
//! Hooks run on the worker's own OS thread, on hot paths: an aspect must keep
//! them short and must never block or switch contexts.

mod stats;
mod trace;

pub use stats::{StatsAspect, WorkerStats};
pub use trace::TraceAspect;

/// What an aspect learns about the runtime it is attached to.
#[derive(Debug, Clone)]
pub struct AspectInit {
    /// Number of workers.
    pub workers: usize,
    /// Where a tracing aspect should write (builder option, else `CT_TRACE`).
    pub trace_path: Option<std::path::PathBuf>,
}

/// Scheduler event hooks. Every method has an empty default.
pub trait Aspect: Send + Sync + Sized + 'static {
    /// Creates the aspect for a runtime.
    fn new(init: &AspectInit) -> Self;

    /// Creates the aspect for a runtime, or says why it cannot (the
    /// runtime's build then fails with [`Error::Aspect`](crate::Error::Aspect)).
    /// The runtime calls this; the default is [`Aspect::new`].
    fn try_new(init: &AspectInit) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self::new(init))
    }

    /// Worker `w` forked a thread.
    #[inline(always)]
    fn fork(&self, w: usize) {
        let _ = w;
    }
    /// Worker `w` stole work from `victim` (`None`: from the global injector).
    #[inline(always)]
    fn steal(&self, w: usize, victim: Option<usize>) {
        let _ = (w, victim);
    }
    /// Worker `w` switched into a user-level thread.
    #[inline(always)]
    fn switch(&self, w: usize) {
        let _ = w;
    }
    /// Worker `w` found no work and starts backing off.
    #[inline(always)]
    fn idle_begin(&self, w: usize) {
        let _ = w;
    }
    /// Worker `w` found work again (or stops).
    #[inline(always)]
    fn idle_end(&self, w: usize) {
        let _ = w;
    }
    /// The runtime is shutting down; all workers have stopped.
    fn finish(&self) {}
}

/// The zero-cost default: no hooks.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAspect;

impl Aspect for NoAspect {
    fn new(_: &AspectInit) -> Self {
        NoAspect
    }
}
