//! The team barrier: many threads per process, one DSM barrier per process
//! per episode.

use ct_sync::Barrier;
use ct_worker::UltItf;

use crate::com::Communicator;
use crate::dsm::Dsm;
use crate::dsm::error::DsmResult;

/// A barrier for a team of threads spread over every process of the DSM,
/// `threads_here` of them in this process (the count may differ between
/// processes).
///
/// An episode is the threads of this process meeting at an in-process
/// barrier of their threading library `T`, one of them (the leader) running
/// one [`Dsm::barrier`] for the whole process, and the threads meeting
/// again. So every write any team thread made before the barrier is
/// visible to every team thread after it, and the DSM barriers of all
/// processes match one for one (MEOMP's scheme). With one thread per
/// process the in-process barriers are skipped.
///
/// `U` is the DSM's threading library, `T` the team threads' (user-level
/// threads of a runtime, or OS threads).
pub struct TeamBarrier<'d, C: Communicator + 'static, U: UltItf, T: UltItf = U> {
    dsm: &'d Dsm<C, U>,
    local: Barrier<T>,
    threads_here: usize,
    /// The team lives in this process only: no DSM barrier (its threads
    /// share this process's copy of every block).
    local_only: bool,
}

impl<'d, C: Communicator + 'static, U: UltItf, T: UltItf> TeamBarrier<'d, C, U, T> {
    /// A team barrier for `threads_here` threads of this process (in a job
    /// of one process, the in-process barrier alone).
    ///
    /// # Panics
    ///
    /// Panics if `threads_here` is 0.
    pub fn new(dsm: &'d Dsm<C, U>, threads_here: usize) -> Self {
        TeamBarrier {
            dsm,
            local: Barrier::new_in(threads_here),
            threads_here,
            // With one process, its threads share its copy of every block:
            // the in-process barrier is all a team barrier needs.
            local_only: dsm.nprocs() == 1,
        }
    }

    /// A barrier for a team whose `threads` all run in this process: the
    /// in-process barrier alone (the threads of one process share its copy
    /// of every block, so no DSM barrier is needed among them).
    ///
    /// # Panics
    ///
    /// Panics if `threads` is 0.
    pub fn local(dsm: &'d Dsm<C, U>, threads: usize) -> Self {
        TeamBarrier {
            local_only: true,
            ..Self::new(dsm, threads)
        }
    }

    /// Threads of this process in the team.
    pub fn threads_here(&self) -> usize {
        self.threads_here
    }

    /// Whether the barrier is the in-process one alone (a team of one
    /// process, or a job of one process).
    pub fn is_local_only(&self) -> bool {
        self.local_only
    }

    /// Waits until every thread of the team, in every process, has arrived.
    /// Returns `Ok(true)` in exactly one thread per process (the one that
    /// ran the DSM barrier).
    ///
    /// An error of the DSM barrier (a dead peer …) is returned by every
    /// thread of the process: the DSM is fail-stop, so the threads that did
    /// not run it find the recorded failure.
    pub fn wait(&self) -> DsmResult<bool> {
        if self.local_only {
            return Ok(self.local.wait().is_leader());
        }
        if self.threads_here == 1 {
            return self.dsm.barrier().map(|()| true);
        }
        let leader = self.local.wait().is_leader();
        let r = if leader { self.dsm.barrier() } else { Ok(()) };
        self.local.wait();
        r?;
        self.dsm.check()?;
        Ok(leader)
    }
}

impl<'d, C: Communicator + 'static, U: UltItf, T: UltItf> TeamBarrier<'d, C, U, T> {
    /// The DSM this barrier synchronises.
    pub(crate) fn dsm_handle(&self) -> &'d Dsm<C, U> {
        self.dsm
    }

    /// Waits until every thread of the team *in this process* has arrived
    /// (no DSM barrier, no memory made visible to other processes). Returns
    /// `true` in exactly one of them.
    pub fn wait_local(&self) -> bool {
        self.threads_here == 1 || self.local.wait().is_leader()
    }
}

impl<C: Communicator + 'static, U: UltItf, T: UltItf> core::fmt::Debug
    for TeamBarrier<'_, C, U, T>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TeamBarrier")
            .field("threads_here", &self.threads_here)
            .field("local_only", &self.local_only)
            .finish()
    }
}
