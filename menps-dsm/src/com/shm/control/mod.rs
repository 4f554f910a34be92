//! The control memory of a shm job: one `memfd` created by the launcher,
//! inherited by every process and mapped `MAP_SHARED`.
//!
//! Layout (all offsets page- or line-aligned; the memfd starts zero-filled,
//! and zero is a valid value of every atomic in it):
//!
//! ```text
//! header      magic, version, nprocs, sizes; `failed` (0, or 1 + first dead rank);
//!             the barrier algorithm, the central barrier's counter and
//!             release word
//! ranks[N]    per process: state (running / exited / died), pid,
//!             doorbell (futex word) and sleeper count, the dissemination
//!             barrier's arrival words
//! rings[N×N]  p2p byte ring from s to r: head, tail (own lines), data
//! scratch     2 parities × N slots of {header, chunk bytes} for collectives
//! ```
//!
//! The parts: [`layout`] (what the memory holds and where), [`mapping`]
//! (creating and attaching it, and the views of its parts), [`doorbells`]
//! (waking the threads of a process that wait for another) and
//! [`process_ends`] (how processes' ends and failures are recorded).

mod doorbells;
mod layout;
mod mapping;
mod process_ends;

pub(crate) use layout::Layout;
pub(crate) use layout::state;
pub use layout::{DEFAULT_CHUNK_BYTES, DEFAULT_RING_BYTES, MAX_PROCS};
pub(crate) use mapping::{Control, Ring};
