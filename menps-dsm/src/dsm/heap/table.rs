//! The chunk table: its entries, its lock, and reads and writes of it.

use ct_worker::UltItf;

use crate::com::Communicator;
use crate::dsm::error::{DsmError, DsmResult};

use super::Heap;
use super::classes::SIZE_CLASSES;

// ---------------------------------------------------------------------------
// Chunk-table entries.

/// Entry of a chunk never handed out (its memory is still zero everywhere).
pub(super) const E_FRESH: u64 = 0;
/// Entry of a free chunk used before.
pub(super) const E_USED: u64 = 1;
const KIND_SHIFT: u32 = 60;
const K_SMALL: u64 = 2;
const K_HEAD: u64 = 3;
const K_TAIL: u64 = 4;
const LOW_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// A decoded chunk-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Free; `used` if it held objects before.
    Free {
        /// Whether the chunk was handed out before (its memory is stale).
        used: bool,
    },
    /// Small objects of size class `class`, owned by process `owner`.
    Small {
        /// Size-class index.
        class: usize,
        /// Owner rank.
        owner: usize,
    },
    /// First chunk of a large object of `n` chunks.
    Head {
        /// Chunks of the object.
        n: usize,
    },
    /// Later chunk of the large object that starts at chunk `head`.
    Tail {
        /// Index of the head chunk.
        head: usize,
    },
    /// Not a valid entry (corrupted metadata).
    Bad(u64),
}

impl Entry {
    pub(crate) fn encode(self) -> u64 {
        match self {
            Entry::Free { used: false } => E_FRESH,
            Entry::Free { used: true } => E_USED,
            Entry::Small { class, owner } => {
                (K_SMALL << KIND_SHIFT) | ((owner as u64) << 8) | class as u64
            }
            Entry::Head { n } => (K_HEAD << KIND_SHIFT) | n as u64,
            Entry::Tail { head } => (K_TAIL << KIND_SHIFT) | head as u64,
            Entry::Bad(v) => v,
        }
    }

    pub(crate) fn decode(v: u64) -> Entry {
        let low = v & LOW_MASK;
        match v >> KIND_SHIFT {
            0 if v == E_FRESH => Entry::Free { used: false },
            0 if v == E_USED => Entry::Free { used: true },
            K_SMALL if ((low & 0xff) as usize) < SIZE_CLASSES.len() => Entry::Small {
                class: (low & 0xff) as usize,
                owner: (low >> 8) as usize,
            },
            K_HEAD if low > 0 => Entry::Head { n: low as usize },
            K_TAIL => Entry::Tail { head: low as usize },
            _ => Entry::Bad(v),
        }
    }
}

impl<U: UltItf> Heap<U> {
    // -----------------------------------------------------------------
    // The chunk table and its lock.

    pub(super) fn read_entry<C: Communicator + 'static>(
        &self,
        com: &C,
        idx: usize,
    ) -> DsmResult<u64> {
        let mut b = [0u8; 8];
        com.read(self.table_win.at(0, 8 + 8 * idx as u64), &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub(super) fn read_table<C: Communicator + 'static>(&self, com: &C) -> DsmResult<Vec<u64>> {
        let mut b = vec![0u8; 8 * self.nchunks];
        com.read(self.table_win.at(0, 8), &mut b)?;
        Ok(b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
            .collect())
    }

    pub(super) fn write_entries<C: Communicator + 'static>(
        &self,
        com: &C,
        first: usize,
        e: &[u64],
    ) -> DsmResult<()> {
        let b: Vec<u8> = e.iter().flat_map(|v| v.to_le_bytes()).collect();
        com.write(self.table_win.at(0, 8 + 8 * first as u64), &b)?;
        Ok(())
    }

    /// Runs `f` holding the chunk-table lock (a CAS spin lock at rank 0 with
    /// yielding backoff). Every write to the table happens under it.
    pub(super) fn with_table_lock<C: Communicator, R>(
        &self,
        com: &C,
        f: impl FnOnce() -> DsmResult<R>,
    ) -> DsmResult<R> {
        let word = self.table_win.at(0, 0);
        let me = self.rank as u64 + 1;
        // Long waits (the holder may be descheduled on an oversubscribed
        // machine) park an OS thread; a worker keeps yielding.
        let mut backoff = ct_sync::Backoff::parking(64);
        while com.compare_and_swap(word, 0, me)? != 0 {
            backoff.snooze(U::yield_now);
        }
        let r = f();
        let old = com.compare_and_swap(word, me, 0)?;
        if old != me {
            return Err(DsmError::Misuse(format!(
                "DSM heap: the chunk-table lock was {old:#x} instead of {me:#x} at unlock"
            )));
        }
        r
    }
}

/// First index of `n` consecutive free entries.
pub(crate) fn first_fit(table: &[u64], n: usize) -> Option<usize> {
    let mut run = 0;
    for (i, &e) in table.iter().enumerate() {
        if matches!(Entry::decode(e), Entry::Free { .. }) {
            run += 1;
            if run == n {
                return Some(i + 1 - n);
            }
        } else {
            run = 0;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::small::{ACTIVE, COUNT_MASK};
    use super::*;

    #[test]
    fn entries_round_trip() {
        for e in [
            Entry::Free { used: false },
            Entry::Free { used: true },
            Entry::Small { class: 0, owner: 0 },
            Entry::Small {
                class: 25,
                owner: 4095,
            },
            Entry::Head { n: 1 },
            Entry::Head { n: 1 << 20 },
            Entry::Tail { head: 0 },
            Entry::Tail { head: 77 },
        ] {
            assert_eq!(Entry::decode(e.encode()), e, "{e:?}");
        }
        assert!(matches!(Entry::decode(2), Entry::Bad(2)));
        assert!(matches!(Entry::decode(K_HEAD << KIND_SHIFT), Entry::Bad(_)));
        assert!(matches!(
            Entry::decode((K_SMALL << KIND_SHIFT) | 26),
            Entry::Bad(_)
        ));
        // The header's active bit and count do not overlap.
        assert_eq!(ACTIVE & COUNT_MASK, 0);
    }

    #[test]
    fn first_fit_finds_runs() {
        let s = Entry::Small { class: 1, owner: 0 }.encode();
        let t = [s, E_FRESH, E_USED, s, E_FRESH, E_FRESH, E_USED, s];
        assert_eq!(first_fit(&t, 1), Some(1));
        assert_eq!(first_fit(&t, 2), Some(1));
        assert_eq!(first_fit(&t, 3), Some(4));
        assert_eq!(first_fit(&t, 4), None);
        assert_eq!(first_fit(&[], 1), None);
    }
}
