//! Doorbells: waking the threads of a process that wait for another.
//!
//! A thread that has to wait for another process (message, ring space,
//! barrier, window descriptor) spins briefly, yields, and then sleeps on
//! its process's doorbell with a short futex timeout. Whoever changes what
//! it waits for calls `Control::notify`: a `SeqCst` fence, then a bump and
//! `FUTEX_WAKE` only if the target has sleepers. The sleeper increments its
//! sleeper count, fences, reads the doorbell and re-checks its condition
//! before `FUTEX_WAIT` on the value read, so a wake-up cannot be lost
//! (store-buffer pattern with fences on both sides). The launcher rings
//! every doorbell when a process ends.
//!
//! A user-level thread does not sleep its worker in `FUTEX_WAIT`: it counts
//! itself a sleeper, reads the doorbell and re-checks alike, then parks, and
//! the communicator's doorbell watcher (an OS thread) sleeps on the futex in
//! its place and wakes it (`shm::bell`).

use std::sync::atomic::{Ordering, fence};

use super::Control;
use crate::sys;

impl Control {
    /// Wakes process `r`'s sleeping threads, if any, after the caller has
    /// published what they wait for (see the module docs).
    pub fn notify(&self, r: usize) {
        fence(Ordering::SeqCst);
        let s = self.slot(r);
        if s.sleepers.load(Ordering::Relaxed) > 0 {
            s.doorbell.fetch_add(1, Ordering::SeqCst);
            sys::futex_wake_all(&s.doorbell);
        }
    }

    /// Rings every doorbell unconditionally (the launcher, after a process
    /// ended).
    pub fn ring_all(&self) {
        fence(Ordering::SeqCst);
        for r in 0..self.layout.nprocs {
            let s = self.slot(r);
            s.doorbell.fetch_add(1, Ordering::SeqCst);
            sys::futex_wake_all(&s.doorbell);
        }
    }
}
