//! Atomics for the lock-free protocols, swappable for `loom`'s under
//! `--cfg loom` so that the protocols are model-checked as written.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
