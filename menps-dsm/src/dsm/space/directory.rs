//! The directory policy's invalidation queues: a written release posts
//! "drop block b" into each sharer's queue (a ring in a window); an acquire
//! drains its own.

use core::cmp::Reverse;

use ct_worker::UltItf;

use crate::com::Communicator;

use super::super::error::DsmResult;
use super::{INVAL_CAP, INVAL_HEADER, Space};

impl<C: Communicator + 'static, U: UltItf> Space<C, U> {
    // ---------------------------------------------------------------
    // Directory invalidation queues

    /// Posts "drop block `block`" into process `q`'s invalidation queue: a
    /// ring of (sequence, block) slots. Posters never wait; a consumer that
    /// finds a slot overwritten (it lagged by a whole ring) drops every copy
    /// instead.
    pub(super) fn post_invalidation(&self, q: usize, block: usize) -> DsmResult<()> {
        let win = self
            .inval_win
            .expect("directory policy has an invalidation window");
        let t = self.com.fetch_add(win.at(q, 0), 1)?;
        let slot = Self::inval_slot(t);
        self.com
            .write(win.at(q, slot + 8), &(block as u64).to_le_bytes())?;
        self.com.flush(q)?;
        // Publish the sequence number last (monotonically: a later poster of
        // the same slot may already have written a larger one).
        let seq = win.at(q, slot);
        let mut cur = self.com.atomic_load(seq)?;
        while cur < t + 1 {
            let old = self.com.compare_and_swap(seq, cur, t + 1)?;
            if old == cur {
                break;
            }
            cur = old;
        }
        Ok(())
    }

    pub(super) fn inval_slot(t: u64) -> u64 {
        (INVAL_HEADER + (t as usize % INVAL_CAP) * 16) as u64
    }

    /// Applies the invalidations posted to this process.
    /// How many entries of our invalidation queue were drained so far.
    pub(crate) fn invalidations_drained(&self) -> u64 {
        *self.inval_head.lock()
    }

    pub(super) fn drain_invalidations(&self) -> DsmResult<()> {
        let win = self
            .inval_win
            .expect("directory policy has an invalidation window");
        let me = self.rank;
        let mut head = self.inval_head.lock();
        let tail = self.com.atomic_load(win.at(me, 0))?;
        let mut overflow = tail - *head > INVAL_CAP as u64;
        let mut blocks = Vec::new();
        let mut t = *head;
        while !overflow && t < tail {
            let slot = Self::inval_slot(t);
            let mut backoff = ct_sync::Backoff::new();
            loop {
                let s = self.com.atomic_load(win.at(me, slot))?;
                if s == t + 1 {
                    let mut b = [0u8; 8];
                    self.com.read(win.at(me, slot + 8), &mut b)?;
                    if self.com.atomic_load(win.at(me, slot))? == t + 1 {
                        blocks.push(u64::from_le_bytes(b) as usize);
                    } else {
                        overflow = true;
                    }
                    break;
                }
                if s > t + 1 {
                    overflow = true;
                    break;
                }
                // Reserved, not written yet: the poster is in the middle of
                // its transaction.
                backoff.snooze(U::yield_now);
            }
            t += 1;
        }
        *head = tail;
        drop(head);
        if overflow {
            let everything: Vec<usize> = {
                let mut rs = self.read_set.lock();
                let v = rs.iter().map(|Reverse((_, a))| *a).collect();
                rs.clear();
                v
            };
            for addr in everything {
                if let Some((seg, idx)) = self.locate(addr) {
                    let mut m = seg.entry(idx).lock();
                    m.in_read_set = false;
                    if !self.is_fixed_home(seg, idx) {
                        self.invalidate(seg, idx, &mut m)?;
                    }
                    if m.state.readable() {
                        self.add_to_read_set(seg, idx, &mut m);
                    }
                }
            }
            return Ok(());
        }
        for addr in blocks {
            if let Some((seg, idx)) = self.locate(addr) {
                if self.is_fixed_home(seg, idx) {
                    continue;
                }
                let mut m = seg.entry(idx).lock();
                self.invalidate(seg, idx, &mut m)?;
            }
        }
        Ok(())
    }
}
