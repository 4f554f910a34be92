//! MENPS: a page-based software distributed shared memory, in Rust.
//!
//! Three layers:
//!
//! - [`dsm`]: the **DSM** itself — shared segments at the same address in
//!   every process, page-protection faults resolved by the MENPS coherence
//!   protocol (floating home, hybrid lease + write-notice invalidation, fast
//!   release, XOR merges with write-write race detection), barriers, DSM
//!   mutexes, atomics, pinned call stacks, a heap and a global allocator on
//!   it, one address map for every shared address, and fork–join across
//!   processes on user-level threads whose stacks live in the DSM.
//! - [`com`] defines what the DSM needs from the network as traits — ranks,
//!   one-sided RMA on registered windows addressed by fat pointers (read,
//!   write, compare-and-swap, fetch-and-add, asynchronous forms, flush),
//!   small tagged messages, and collectives — and implements them with the
//!   embedded `shm` backend ([`com::ShmCom`]): processes on one machine,
//!   windows in `memfd`s mapped by everyone, atomics on the shared mapping.
//!   Cargo features add the `mpi` backend (`com::MpiCom`, MPI-3 RMA under
//!   `mpirun`) and the `verbs` backend (`com::VerbsCom`, InfiniBand / RoCE
//!   RC queue pairs); [`com::AnyCom`] is whichever backend the job runs on.
//!   [`com::netmodel`] runs any of them as if over a network of a given
//!   latency and link rate (`MENPS_NET_LATENCY`, `MENPS_NET_BANDWIDTH`) and
//!   counts their operations.
//! - [`launch`] starts a job: a library call that re-executes the current
//!   program N times ([`launch::init_or_relaunch`]), and the `menps` binary
//!   (`menps run -n 4 -- ./prog args`). When any process dies, the others
//!   get [`com::Error::PeerDied`] and the launcher stops the job with a
//!   non-zero status.
//!
//! # Example
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! use menps_dsm::com::{AnyCom, Coll, Comm, Rma, Windows};
//!
//! // Starts 4 processes running this program (MENPS_NPROCS overrides 4);
//! // in each of them, returns the communicator. Under `mpirun` (feature
//! // `mpi`) it joins the MPI job instead.
//! let com: AnyCom<ct_worker::OsThreads> = menps_dsm::launch::init_or_relaunch(4)?;
//! let win = com.create_window(4096)?;
//! com.fetch_add(win.at(0, 0), 1)?; // one-sided atomic on rank 0's window
//! com.barrier()?;
//! if com.rank() == 0 {
//!     assert_eq!(com.atomic_load(win.at(0, 0))?, com.size() as u64);
//! }
//! # Ok::<(), menps_dsm::com::Error>(())
//! ```
//!
//! # Public API
//!
//! What programs are written against, and what this crate keeps stable:
//!
//! - [`com`]: the communication traits ([`com::Comm`], [`com::Windows`],
//!   [`com::Rma`], [`com::P2p`], [`com::Coll`], [`com::Communicator`]), the
//!   backends ([`com::ShmCom`], [`com::AnyCom`]; `MpiCom` and `VerbsCom`
//!   with their features), the network model ([`com::NetCom`]), fat
//!   pointers, requests and [`com::Error`].
//! - [`launch`]: starting and joining jobs ([`launch::init_or_relaunch`],
//!   [`launch::Builder`], [`launch::run_job`], [`launch::report_failure`])
//!   and the names of the environment variables ([`launch::env`]).
//! - [`dsm`]: [`dsm::Dsm`] and its configuration, errors, mutexes and
//!   statistics; the heap and its typed helpers ([`dsm::DsmBox`],
//!   [`dsm::DsmVec`]), DSM globals (`dsm_global!`), the global allocator,
//!   the address map's regions, fork–join teams ([`dsm::team`]) and race
//!   reports ([`dsm::race`]); for language runtimes on the DSM (a C ABI such
//!   as `menps-gomp`), the type-erased [`dsm::process`] and the allocator's
//!   `c_alloc` family.
//!
//! There are two error types, one per layer: [`com::Error`] (what the
//! network and the launcher report: a dead peer, a bad window access, a
//! backend failure) and [`dsm::DsmError`] (what the DSM reports: a data
//! race, bad arguments or configuration, exhausted DSM memory, misuse; it
//! wraps a [`com::Error`] when the network failed underneath). The crate
//! root re-exports neither, so a signature always says which one it means.
//!
//! The protocol's pieces — diffs and merges, the `SIGSEGV` hook, the
//! address-range layout, write-notice signatures, per-block metadata — are
//! private. [`internals`] re-exports the few of them the workspace's own
//! tests look at (the DSM's base address, fault counters); it is
//! **unstable**: it may change in any release.
//!
//! # Examples
//!
//! `menps-dsm/examples/` holds programs that start their own job (4
//! processes unless `MENPS_NPROCS` says otherwise):
//!
//! - `dot_product`: SPMD code on the DSM without `unsafe` — every process
//!   fills its own stripe of two [`dsm::DsmVec`]s (checked, borrow-tracked
//!   access: [`dsm::DsmVec::my_part_mut`]) with user-level threads, and
//!   everybody reads every stripe after a barrier ([`dsm::DsmVec::view`]);
//!   verified against a closed form.
//! - `cg`: conjugate gradient on DSM segments, verified against a serial
//!   solve.
//! - `hello_shm`: the communication layer alone (RMA, atomics, collectives).
//!
//! ```text
//! cargo run --release -p menps-dsm --example dot_product
//! ```
//!
//! # Environment variables
//!
//! See [`launch`] for the full table (`MENPS_NPROCS`, `MENPS_PREFIX_OUTPUT`,
//! `MENPS_GRACE_MS`, `MENPS_TIMEOUT_SECS`, `MENPS_RING_BYTES`,
//! `MENPS_COLL_CHUNK_BYTES`, the `mpi` backend's `OMPI_MCA_osc` and
//! `MENPS_MPI_*`, and the variables the launcher sets for each process).

pub mod com;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod dsm;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod internals;
pub mod launch;
mod sys;
