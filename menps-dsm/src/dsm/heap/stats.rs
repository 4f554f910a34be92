//! Heap statistics and occupancy.

use core::sync::atomic::{AtomicU64, Ordering};

use ct_worker::UltItf;

use crate::com::Communicator;
use crate::dsm::error::DsmResult;

use super::Heap;
use super::table::Entry;

/// Counters of this process's heap activity.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) allocs: AtomicU64,
    pub(super) frees: AtomicU64,
    pub(super) bytes_allocated: AtomicU64,
    pub(super) bytes_freed: AtomicU64,
    pub(super) reused: AtomicU64,
    pub(super) chunks_acquired: AtomicU64,
    pub(super) chunks_returned: AtomicU64,
    pub(super) chunks_reclaimed: AtomicU64,
}

pub(super) fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

/// Heap statistics of this process (see [`Dsm::heap_stats`](crate::dsm::Dsm::heap_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Successful allocations made by this process.
    pub allocs: u64,
    /// Successful frees made by this process (of objects any process
    /// allocated).
    pub frees: u64,
    /// Bytes of the objects this process allocated (usable sizes: the size
    /// class, or whole chunks for large objects).
    pub bytes_allocated: u64,
    /// Bytes of the objects this process freed.
    pub bytes_freed: u64,
    /// Allocations that reused memory an earlier object had occupied.
    pub reused: u64,
    /// Chunks this process took from the chunk table for its small objects.
    pub chunks_acquired: u64,
    /// Empty chunks of its own this process gave back to the table.
    pub chunks_returned: u64,
    /// Empty chunks of other processes this process gave back to the table
    /// because it ran out of chunks.
    pub chunks_reclaimed: u64,
}

impl HeapStats {
    /// Bytes this process allocated minus the bytes it freed. Summed over
    /// all processes it is the heap's usage in bytes; per process it is
    /// negative when a process frees more than it allocates.
    pub fn net_bytes(&self) -> i64 {
        self.bytes_allocated as i64 - self.bytes_freed as i64
    }
}

/// The heap's global occupancy, read from the chunk table (see
/// [`Dsm::heap_usage`](crate::dsm::Dsm::heap_usage)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapUsage {
    /// Size of the heap in bytes.
    pub heap_size: usize,
    /// Chunk size in bytes.
    pub chunk_size: usize,
    /// Number of chunks.
    pub chunks: usize,
    /// Free chunks.
    pub free_chunks: usize,
    /// Chunks holding small objects (of any process).
    pub small_chunks: usize,
    /// Chunks holding large objects.
    pub large_chunks: usize,
    /// Chunks holding small objects of this process.
    pub own_small_chunks: usize,
}

impl<U: UltItf> Heap<U> {
    pub(super) fn usage<C: Communicator + 'static>(&self, com: &C) -> DsmResult<HeapUsage> {
        let table = self.read_table(com)?;
        let mut u = HeapUsage {
            heap_size: self.size,
            chunk_size: self.chunk,
            chunks: self.nchunks,
            ..HeapUsage::default()
        };
        for &e in &table {
            match Entry::decode(e) {
                Entry::Free { .. } => u.free_chunks += 1,
                Entry::Small { owner, .. } => {
                    u.small_chunks += 1;
                    if owner == self.rank {
                        u.own_small_chunks += 1;
                    }
                }
                Entry::Head { .. } | Entry::Tail { .. } => u.large_chunks += 1,
                Entry::Bad(_) => {}
            }
        }
        Ok(u)
    }

    pub(super) fn stats(&self) -> HeapStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.stats;
        HeapStats {
            allocs: g(&s.allocs),
            frees: g(&s.frees),
            bytes_allocated: g(&s.bytes_allocated),
            bytes_freed: g(&s.bytes_freed),
            reused: g(&s.reused),
            chunks_acquired: g(&s.chunks_acquired),
            chunks_returned: g(&s.chunks_returned),
            chunks_reclaimed: g(&s.chunks_reclaimed),
        }
    }
}
