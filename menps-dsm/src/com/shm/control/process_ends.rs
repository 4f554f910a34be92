//! How the ends of a job's processes and their failures are recorded: the
//! per-process state and end order, the job's first failure, and the claim
//! that lets a failure every process hits alike be reported once.

use std::sync::atomic::Ordering;

use super::Control;
use super::layout::state;

impl Control {
    /// Process `r` is about to report a failure whose text has fingerprint
    /// `fp` (non-zero): records that it reported, and returns whether the
    /// report should be written — `false` if another process of the job
    /// already reported the same text (a failure every process hits alike
    /// is reported once).
    pub fn claim_report(&self, r: usize, fp: u64) -> bool {
        self.slot(r).reported.store(1, Ordering::SeqCst);
        match self
            .header()
            .reported
            .compare_exchange(0, fp, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => true,
            Err(first) => first != fp,
        }
    }

    /// Records that process `r` ended (the launcher): `ok` for exit status
    /// 0. A failure also sets the job's `failed` word if it is the first.
    ///
    /// Idempotent: the launcher and the process's peers (which watch it
    /// themselves, in case the launcher cannot) may both report it.
    pub fn mark_ended(&self, r: usize, ok: bool) {
        let s = self.slot(r);
        if s.state.load(Ordering::SeqCst) != state::RUNNING {
            return;
        }
        let seq = self.header().ended.fetch_add(1, Ordering::SeqCst) + 1;
        s.ended_seq.store(seq, Ordering::SeqCst);
        if ok {
            s.state.store(state::EXITED, Ordering::SeqCst);
        } else {
            // The failure first: a waiter that sees the process gone must
            // already see that it died (PeerDied, not PeerExited).
            let _ = self.failed_word().compare_exchange(
                0,
                r as u64 + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            s.state.store(state::DIED, Ordering::SeqCst);
        }
        self.ring_all();
    }
}
