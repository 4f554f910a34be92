//! Atomics for the delegation protocols, swappable for `loom`'s under
//! `--cfg loom`, and ct-sync's back-off helper for short waits.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

pub(crate) use ct_sync::Backoff;
