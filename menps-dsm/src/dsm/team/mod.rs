//! Teams of threads across processes: fork–join on user-level threads
//! whose call stacks live in the DSM ([`Team`]), and the team barrier
//! ([`TeamBarrier`]).
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! use ct_worker::OsThreads;
//! use menps_dsm::com::ShmCom;
//! use menps_dsm::dsm::Dsm;
//! use menps_dsm::dsm::team::Team;
//!
//! let com: ShmCom<OsThreads> = menps_dsm::launch::init_or_relaunch(2)?;
//! let dsm: Dsm<_> = Dsm::new(com)?;
//! let team = Team::new(&dsm, 1)?;
//! let total = team.run_main(|| {
//!     // Process 0's main, on a DSM call stack.
//!     let mut parts = [0u64; 8]; // one per team thread (2 per process)
//!     let p = parts.as_mut_ptr() as usize;
//!     // SAFETY: `parts` is in main's frame (DSM memory), each thread writes
//!     // its own element, and the fork joins before `parts` is read.
//!     unsafe {
//!         team.parallel(2, &|t| {
//!             (p as *mut u64).add(t.thread_num()).write(10 + t.thread_num() as u64);
//!         })
//!     }
//!     .unwrap();
//!     parts.iter().sum::<u64>()
//! })?;
//! if dsm.rank() == 0 {
//!     assert_eq!(total, Some(10 + 11 + 12 + 13));
//! }
//! drop(team);
//! dsm.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod barrier;
mod fork;
mod stacks;

pub use barrier::TeamBarrier;
pub use fork::{FORK_SENT_MAX, OpenFork, Team, TeamConfig, TeamFn, TeamThread, TeamUlt};
pub use stacks::{DsmStacks, PinHook, SwitchExtension, set_switch_extension};

use ct_worker::UltItf;

use crate::com::Communicator;
use crate::dsm::error::DsmResult;
use crate::dsm::space::Space;

/// Writes `msg` and a newline to stderr in one `write` (a line other
/// processes' output cannot split; called before the process ends).
pub(crate) fn report_line(msg: &str) {
    crate::launch::output::write_line(msg);
}

impl<C: Communicator + 'static, U: UltItf> stacks::StackPinner for Space<C, U> {
    fn pin_stack(&self, addr: usize, len: usize) -> DsmResult<()> {
        self.pin(addr, len)
    }

    fn unpin_stack(&self, addr: usize, len: usize) -> DsmResult<()> {
        self.unpin(addr, len)
    }

    fn stack_live_from(&self, addr: usize, low: usize) {
        self.set_stack_low(addr, low)
    }
}
