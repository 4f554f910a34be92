//! Large objects: runs of whole chunks.

use ct_worker::UltItf;

use crate::com::Communicator;
use crate::dsm::error::DsmResult;
use crate::dsm::space::Space;

use super::table::*;
use super::{Got, Heap};

impl<U: UltItf> Heap<U> {
    // -----------------------------------------------------------------
    // Large objects.

    pub(super) fn alloc_large<C: Communicator + 'static>(
        &self,
        space: &Space<C, U>,
        size: usize,
    ) -> DsmResult<Got> {
        let com = &space.com;
        let n = size.div_ceil(self.chunk);
        if n > self.nchunks {
            return Err(self.out_of_memory(com, size));
        }
        for attempt in 0..2 {
            let got = self.with_table_lock(com, || {
                let table = self.read_table(com)?;
                let Some(first) = first_fit(&table, n) else {
                    return Ok(None);
                };
                let virgin = table[first..first + n].iter().all(|&e| e == E_FRESH);
                let mut run = vec![Entry::Tail { head: first }.encode(); n];
                run[0] = Entry::Head { n }.encode();
                self.write_entries(com, first, &run)?;
                Ok(Some((first, virgin)))
            })?;
            if let Some((first, virgin)) = got {
                let addr = self.chunk_addr(first);
                let len = n * self.chunk;
                if !virgin {
                    space.forget_range(addr, len)?;
                }
                return Ok(Got {
                    addr,
                    size: len,
                    fresh: virgin,
                    reused: !virgin,
                });
            }
            if attempt == 0 {
                let mut local = self.local.lock();
                self.reclaim_all(com, &mut local)?;
            }
        }
        Err(self.out_of_memory(com, size))
    }
}
