//! Small objects: claims in owned chunks, chunk acquisition, trimming.

use ct_worker::UltItf;

use crate::com::Communicator;
use crate::dsm::error::{DsmError, DsmResult};
use crate::dsm::space::Space;

use super::classes::*;
use super::stats::add;
use super::table::*;
use super::{Got, Heap, Local, Owned, TRIM_PERIOD};

/// Header bit of a chunk its owner allocates from.
pub(super) const ACTIVE: u64 = 1 << 63;
/// Header bits counting the chunk's live objects.
pub(super) const COUNT_MASK: u64 = (1 << 32) - 1;

impl<U: UltItf> Heap<U> {
    // -----------------------------------------------------------------
    // Small objects.

    /// Claims slot `slot` of our chunk `idx`; `false` if the chunk was taken
    /// back in the meantime.
    pub(super) fn claim<C: Communicator + 'static>(
        &self,
        com: &C,
        idx: usize,
        slot: usize,
    ) -> DsmResult<bool> {
        let hdr = self.owner_win.at(self.rank, self.header_off(idx));
        let old = com.fetch_add(hdr, 1)?;
        if old & ACTIVE == 0 {
            com.fetch_add(hdr, u64::MAX)?;
            return Ok(false);
        }
        let (w, mask) = bit_of(slot);
        let word = self.owner_win.at(self.rank, self.word_off(idx, w));
        let mut v = com.atomic_load(word)?;
        loop {
            if v & mask != 0 {
                return Err(DsmError::Misuse(format!(
                    "DSM heap metadata corrupt: slot {slot} of chunk {idx} is allocated twice"
                )));
            }
            let o = com.compare_and_swap(word, v, v | mask)?;
            if o == v {
                return Ok(true);
            }
            v = o;
        }
    }

    /// A clear bit of chunk `o` below its high-water mark, searching from
    /// its cursor.
    pub(super) fn find_freed<C: Communicator + 'static>(
        &self,
        com: &C,
        o: &Owned,
    ) -> DsmResult<Option<usize>> {
        let words = o.hwm.div_ceil(64);
        for k in 0..words {
            let w = (o.cursor + k) % words;
            let limit = (o.hwm - w * 64).min(64);
            let v = com.atomic_load(self.owner_win.at(self.rank, self.word_off(o.idx, w)))?;
            if let Some(b) = first_clear_bit(v, limit) {
                return Ok(Some(w * 64 + b));
            }
        }
        Ok(None)
    }

    pub(super) fn alloc_small<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        class: usize,
    ) -> DsmResult<Got> {
        let com = &space.com;
        let cs = SIZE_CLASSES[class];
        let slots = self.slots(class);
        let mut local = self.local.lock();
        local.since_trim += 1;
        if local.since_trim >= TRIM_PERIOD {
            local.since_trim = 0;
            self.trim_locked(com, &mut local, true)?;
        }
        let list = &mut local.classes[class];
        let mut i = list.len();
        while i > 0 {
            i -= 1;
            let o = list[i];
            let h = com.atomic_load(self.owner_win.at(self.rank, self.header_off(o.idx)))?;
            if h & ACTIVE == 0 {
                // Taken back by a process that ran out of chunks.
                list.remove(i);
                continue;
            }
            let live = (h & COUNT_MASK) as usize;
            let (slot, bump) = if live < o.hwm {
                // Bits set ≤ live count < hwm, and we alone set bits: a
                // freed slot exists below the high-water mark.
                match self.find_freed(com, &o)? {
                    Some(s) => (s, false),
                    None => {
                        return Err(DsmError::Misuse(format!(
                            "DSM heap metadata corrupt: chunk {} counts {live} objects but has \
                             no free slot below {}",
                            o.idx, o.hwm
                        )));
                    }
                }
            } else if o.hwm < slots {
                (o.hwm, true)
            } else {
                continue;
            };
            if !self.claim(com, o.idx, slot)? {
                list.remove(i);
                continue;
            }
            let o = &mut list[i];
            if bump {
                o.hwm += 1;
            } else {
                o.cursor = slot / 64;
            }
            let fresh = bump && o.virgin;
            let addr = self.chunk_addr(o.idx) + slot * cs;
            drop(local);
            if !bump {
                // Reused: drop our possibly stale copies (module docs).
                space.forget_range(addr, cs)?;
            }
            return Ok(Got {
                addr,
                size: cs,
                fresh,
                reused: !bump,
            });
        }
        let (idx, virgin) = self.acquire_chunk(com, &mut local, class)?;
        local.classes[class].push(Owned {
            idx,
            hwm: 1,
            cursor: 0,
            virgin,
        });
        drop(local);
        let addr = self.chunk_addr(idx);
        if !virgin {
            // Used before: forget the whole chunk once; slots handed out for
            // the first time since then need no forget.
            space.forget_range(addr, self.chunk)?;
        }
        Ok(Got {
            addr,
            size: cs,
            fresh: virgin,
            reused: !virgin,
        })
    }

    /// Takes a free chunk for size class `class`, with its slot 0 claimed;
    /// returns its index and whether it was never used. Runs out of chunks
    /// only after taking back every empty chunk of every process.
    pub(super) fn acquire_chunk<C: Communicator + 'static>(
        &self,
        com: &C,
        local: &mut Local,
        class: usize,
    ) -> DsmResult<(usize, bool)> {
        for attempt in 0..2 {
            let got = self.with_table_lock(com, || {
                let table = self.read_table(com)?;
                let Some(idx) = table
                    .iter()
                    .position(|&e| matches!(Entry::decode(e), Entry::Free { .. }))
                else {
                    return Ok(None);
                };
                let virgin = table[idx] == E_FRESH;
                // Header and bit first, so the chunk cannot be taken back
                // before its first object is handed out.
                let hdr = self.owner_win.at(self.rank, self.header_off(idx));
                let old = com.compare_and_swap(hdr, 0, ACTIVE | 1)?;
                let word = self.owner_win.at(self.rank, self.word_off(idx, 0));
                let old_bits = com.compare_and_swap(word, 0, 1)?;
                if old != 0 || old_bits != 0 {
                    return Err(DsmError::Misuse(format!(
                        "DSM heap metadata corrupt: free chunk {idx} has header {old:#x} and \
                         bitmap word {old_bits:#x} at process {}",
                        self.rank
                    )));
                }
                let e = Entry::Small {
                    class,
                    owner: self.rank,
                };
                self.write_entries(com, idx, &[e.encode()])?;
                Ok(Some((idx, virgin)))
            })?;
            if let Some((idx, virgin)) = got {
                // Any record of this chunk from an earlier ownership is
                // stale.
                for l in &mut local.classes {
                    l.retain(|o| o.idx != idx);
                }
                add(&self.stats.chunks_acquired, 1);
                return Ok((idx, virgin));
            }
            if attempt == 0 {
                self.reclaim_all(com, local)?;
            }
        }
        Err(self.out_of_memory(com, SIZE_CLASSES[class]))
    }

    /// Gives back our empty chunks (except the current one of each class if
    /// `keep_current`). Returns how many.
    pub(super) fn trim_locked<C: Communicator + 'static>(
        &self,
        com: &C,
        local: &mut Local,
        keep_current: bool,
    ) -> DsmResult<usize> {
        let mut empty = Vec::new();
        for l in &local.classes {
            let n = if keep_current {
                l.len().saturating_sub(1)
            } else {
                l.len()
            };
            for o in &l[..n] {
                let h = com.atomic_load(self.owner_win.at(self.rank, self.header_off(o.idx)))?;
                if h == ACTIVE || h & ACTIVE == 0 {
                    // Empty, or already taken back (dropped below).
                    empty.push(o.idx);
                }
            }
        }
        if empty.is_empty() {
            return Ok(0);
        }
        let returned = self.with_table_lock(com, || {
            let mut returned = 0;
            for &idx in &empty {
                if self.take_back(com, self.rank, idx)? {
                    returned += 1;
                }
            }
            Ok(returned)
        })?;
        for l in &mut local.classes {
            l.retain(|o| !empty.contains(&o.idx));
        }
        add(&self.stats.chunks_returned, returned as u64);
        Ok(returned)
    }

    /// Takes back chunk `idx` of `owner` if it is empty (holding the table
    /// lock).
    pub(super) fn take_back<C: Communicator + 'static>(
        &self,
        com: &C,
        owner: usize,
        idx: usize,
    ) -> DsmResult<bool> {
        let hdr = self.owner_win.at(owner, self.header_off(idx));
        if com.compare_and_swap(hdr, ACTIVE, 0)? != ACTIVE {
            return Ok(false);
        }
        self.write_entries(com, idx, &[E_USED])?;
        Ok(true)
    }

    /// Out of chunks: gives back every empty chunk of every process.
    pub(super) fn reclaim_all<C: Communicator + 'static>(
        &self,
        com: &C,
        local: &mut Local,
    ) -> DsmResult<()> {
        self.trim_locked(com, local, false)?;
        let stolen = self.with_table_lock(com, || {
            let table = self.read_table(com)?;
            let mut n = 0;
            for (idx, &e) in table.iter().enumerate() {
                if let Entry::Small { owner, .. } = Entry::decode(e)
                    && owner != self.rank
                    && owner < self.nprocs
                    && self.take_back(com, owner, idx)?
                {
                    n += 1;
                }
            }
            Ok(n)
        })?;
        add(&self.stats.chunks_reclaimed, stolen);
        Ok(())
    }

    pub(super) fn out_of_memory<C: Communicator + 'static>(
        &self,
        com: &C,
        size: usize,
    ) -> DsmError {
        let free = self
            .read_table(com)
            .map(|t| {
                t.iter()
                    .filter(|&&e| matches!(Entry::decode(e), Entry::Free { .. }))
                    .count()
            })
            .unwrap_or(0);
        DsmError::OutOfMemory(format!(
            "the DSM heap cannot hold an object of {size} bytes: {free} of its {} chunks of {} \
             bytes are free ({} bytes in all; raise MENPS_DSM_HEAP_SIZE or free memory)",
            self.nchunks, self.chunk, self.size
        ))
    }
}
