//! Acquire fences: write notices and the minimum write timestamp drop stale
//! copies (Endo 2020 §3.4.5).

use core::cmp::Reverse;
use core::sync::atomic::Ordering;

use ct_worker::{JoinHandleItf, UltItf};

use crate::com::Communicator;

use super::super::config::InvalidationPolicy;
use super::super::error::DsmResult;
use super::super::segment::{BlockMeta, BlockState, Segment};
use super::super::signature::{Signature, WriteNotice};
use super::{PARALLEL_RELEASE_MIN as PARALLEL_MIN, Space, TxKind, bump, parallel_min};

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    // ---------------------------------------------------------------
    // Invalidation and acquire

    /// Drops our copy of block `idx` (pinned blocks are refreshed in place).
    pub(super) fn invalidate(
        &self,
        seg: &Segment<U>,
        idx: usize,
        m: &mut BlockMeta,
    ) -> DsmResult<()> {
        let new = match m.state {
            BlockState::ReadonlyClean => BlockState::InvalidClean,
            BlockState::ReadonlyDirty | BlockState::Writable => BlockState::InvalidDirty,
            BlockState::Pinned => {
                bump(&self.stats.invalidations);
                self.transaction(seg, idx, m, TxKind::PinnedRefresh)?;
                return Ok(());
            }
            BlockState::InvalidClean | BlockState::InvalidDirty => return Ok(()),
        };
        bump(&self.stats.invalidations);
        m.state = new;
        self.protect(seg, idx, new)
    }

    /// Acquire fence with a signature: drops every copy a write notice or
    /// the minimum write timestamp makes stale.
    pub fn acquire(&self, sig: &mut Signature) -> DsmResult<()> {
        let _rt = self.enter()?;
        let r = self.acquire_inner(sig);
        self.guard(r)
    }

    pub(crate) fn acquire_inner(&self, sig: &mut Signature) -> DsmResult<()> {
        let _t = self.stats.timed(&self.stats.acquire_ns);
        if self.cfg.invalidation == InvalidationPolicy::Directory {
            return self.drain_invalidations();
        }
        let notices = sig.notices();
        if notices.len() >= parallel_min::<U>() && U::num_workers() > 1 {
            self.apply_notices_parallel(notices.to_vec())?;
        } else {
            self.apply_notices(notices)?;
        }
        self.self_invalidate(sig.min_wr_ts())
    }

    /// Invalidates the copies that `notices` make stale, remembering each
    /// notice's writer and interval for a later fast read.
    fn apply_notices(&self, notices: &[WriteNotice]) -> DsmResult<()> {
        for wn in notices {
            if wn.writer() == self.rank {
                continue;
            }
            let Some((seg, idx)) = self.locate(wn.block()) else {
                continue;
            };
            if self.is_fixed_home(seg, idx) {
                continue;
            }
            let mut m = seg.entry(idx).lock();
            if wn.wr_ts > m.cur_rd {
                self.invalidate(seg, idx, &mut m)?;
                if !m.state.readable() {
                    m.home = wn.writer() as u32 + 1;
                    m.cur_wr = wn.wr_ts;
                    m.cur_rd = wn.rd_ts;
                }
            }
        }
        Ok(())
    }

    /// [`Self::apply_notices`] in strided chunks on threads of `U` (Endo 2020
    /// §3.5.3: invalidations of an acquire fence run in parallel; the
    /// kernel serialises much of `mprotect`, so the gain is modest).
    fn apply_notices_parallel(&self, notices: Vec<WriteNotice>) -> DsmResult<()> {
        let tasks = (U::num_workers() * 4)
            .min(notices.len() / (PARALLEL_MIN / 4))
            .max(2);
        // SAFETY: as in `release_parallel`: the space outlives every task
        // (it is only freed by `Dsm::finalize`, which cannot run while this
        // call borrows it), and every task is joined before we return.
        let me: &'static Self = unsafe { &*(self as *const Self) };
        let notices = std::sync::Arc::new(notices);
        let handles: Vec<_> = (1..tasks)
            .map(|t| {
                let notices = notices.clone();
                U::spawn(move || {
                    let mine: Vec<WriteNotice> =
                        notices.iter().copied().skip(t).step_by(tasks).collect();
                    me.apply_notices(&mine)
                })
            })
            .collect();
        let mine: Vec<WriteNotice> = notices.iter().copied().step_by(tasks).collect();
        let mut result = self.apply_notices(&mine);
        for h in handles {
            let r = h.join();
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Raises the acquire timestamp to `min` and drops every copy whose
    /// lease ends before it.
    pub(super) fn self_invalidate(&self, min: u64) -> DsmResult<()> {
        let prev = self.acq_ts.fetch_max(min, Ordering::AcqRel);
        if min <= prev {
            return Ok(());
        }
        let mut expired = Vec::new();
        {
            let mut rs = self.read_set.lock();
            while let Some(&Reverse((rd, addr))) = rs.peek() {
                if rd >= min {
                    break;
                }
                rs.pop();
                expired.push(addr);
            }
        }
        let mut back = Vec::new();
        for addr in expired {
            let Some((seg, idx)) = self.locate(addr) else {
                continue;
            };
            let mut m = seg.entry(idx).lock();
            if !m.state.readable() {
                m.in_read_set = false;
                continue;
            }
            if self.is_fixed_home(seg, idx) || m.cur_rd >= min {
                back.push(Reverse((m.cur_rd.max(min), addr)));
                continue;
            }
            self.invalidate(seg, idx, &mut m)?;
            if m.state.readable() {
                back.push(Reverse((m.cur_rd.max(min), addr)));
            } else {
                m.in_read_set = false;
            }
        }
        if !back.is_empty() {
            self.read_set.lock().extend(back);
        }
        Ok(())
    }
}
