//! Atomics for the delegation protocols, swappable for `loom`'s under
//! `--cfg loom`; ct-sync's loom-checked cell for data the protocols (not
//! locks) keep apart; and the workspace's one back-off.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

pub(crate) use ct_sync::{Backoff, ProtocolCell};
