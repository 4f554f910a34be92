//! Lock delegation, consumer threads and dynamic offloading for user-level
//! threads (Endo 2020, §2.5, §4.3, §5.2.5, §5.3.2).
//!
//! - [`Delegator`]: a lock around a resource (a [`Consumer`]) whose users
//!   either run their critical section inline when the lock is free — as
//!   cheap as an uncontended mutex — or hand it, as a request, to whoever
//!   holds the lock ([`Delegator::execute_or_delegate`],
//!   [`Delegator::lock_or_delegate`]). A consumer thread owns the lock while
//!   delegated or outstanding work exists and polls progress.
//! - Two queue variants behind [`DelegationQueue`]: [`McsQueue`] (fair,
//!   unbounded) and [`RingQueue`] (bounded, no allocation).
//! - [`Offloader`]: MECOM's dynamic offloading of a non-thread-safe device — a
//!   command queue whose executor thread is spawned by the first requester
//!   that finds none running and exits when the queue drains (the tail
//!   counter's low bit says whether one runs), plus a completer thread that
//!   polls completions and runs callbacks. Both make batched device calls
//!   ([`Device::post_batch`] with up to a [`PostBatch`] of commands per call,
//!   [`Device::poll_batch`]), as a NIC takes a chain of work requests per
//!   doorbell.
//!
//! Everything is generic over the threading interface
//! ([`UltItf`](ct_worker::UltItf)): user-level threads by default, or OS
//! threads ([`OsThreads`](ct_worker::OsThreads)).

#![warn(missing_docs)]

mod completion;
mod consumer;
pub mod delegator;
pub mod offload;
pub mod queue;
mod sync;

pub use completion::{Completion, CompletionRef};
pub use consumer::Consumer;
pub use delegator::{Delegator, DelegatorGuard, Entry};
pub use offload::{Callback, Device, Offloader, PostBatch, Tag};
pub use queue::{DelegationQueue, Enqueued, McsQueue, RingQueue};
