//! What the ct-worker benchmarks share: a switch hook that stands in for a
//! DSM's pin/unpin bookkeeping.

use std::sync::atomic::{AtomicU64, Ordering};

use ct_context::{DefaultPolicy, StackRegion};
use ct_worker::{ChaseLevKind, Custom, LeaveReason, MmapStacks, NoAspect, SwitchHook, UltThread};

/// A switch hook that counts its calls per worker.
#[derive(Default)]
pub struct CountingHook {
    counts: [Padded; 32],
}

#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl SwitchHook for CountingHook {
    fn entering(&self, worker: usize, _: UltThread<'_>, _: StackRegion) {
        self.counts[worker % 32].0.fetch_add(1, Ordering::Relaxed);
    }
    fn left(&self, worker: usize, _: UltThread<'_>, _: StackRegion, _: LeaveReason) {
        self.counts[worker % 32].0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The default configuration with [`CountingHook`].
pub type HookConfig = Custom<DefaultPolicy, ChaseLevKind, NoAspect, MmapStacks, CountingHook>;
