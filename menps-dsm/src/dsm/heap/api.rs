//! The heap's public operations on [`Dsm`].

use ct_worker::UltItf;

use crate::com::Communicator;
use crate::dsm::Dsm;
use crate::dsm::error::DsmResult;

use super::{Heap, HeapStats, HeapUsage};

impl<C: Communicator + 'static, U: UltItf> Dsm<C, U> {
    fn heap(&self) -> DsmResult<&Heap<U>> {
        self.mem.heap()
    }

    /// Allocates `size` bytes aligned to `align` (a power of two, at most
    /// the chunk size) in the DSM heap; the address is valid in every process
    /// until the object is freed. Not collective: any process may allocate at
    /// any time. The contents are unspecified.
    ///
    /// Objects up to `chunk / 8` bytes (128 KiB with the default heap) take
    /// their size class; larger ones take whole chunks.
    pub fn alloc(&self, size: usize, align: usize) -> DsmResult<*mut u8> {
        let h = self.heap()?;
        h.alloc(self.space, size, align).map(|g| g.addr as *mut u8)
    }

    /// [`Dsm::alloc`], with the first `size` bytes of the object zeroed
    /// (memory never used since start-up is zero already and is not
    /// written).
    pub fn alloc_zeroed(&self, size: usize, align: usize) -> DsmResult<*mut u8> {
        let h = self.heap()?;
        h.alloc_zeroed(self.space, size, align)
            .map(|a| a as *mut u8)
    }

    /// Frees the heap object at `ptr` (allocated by any process; see the
    /// [rules](crate::dsm::heap#rules)): this process's writes to it are released
    /// first, then its memory becomes reusable. A pointer that is not the
    /// start of a live heap object gives [`DsmError::InvalidArgument`](crate::dsm::DsmError::InvalidArgument).
    pub fn free(&self, ptr: *mut u8) -> DsmResult<()> {
        let h = self.heap()?;
        h.free(self.space, ptr as usize)
    }

    /// The usable size of the live heap object at `ptr` (its size class, or
    /// its whole chunks).
    pub fn usable_size(&self, ptr: *const u8) -> DsmResult<usize> {
        self.heap()?.usable_size(&self.space.com, ptr as usize)
    }

    /// Gives this process's empty chunks back to the chunk table, so that
    /// other processes (and large objects) can use them; returns how many.
    /// The heap also does this now and then, and any process that runs out
    /// of chunks takes back the empty chunks of all.
    pub fn heap_trim(&self) -> DsmResult<usize> {
        let h = self.heap()?;
        let _rt = self.space.enter()?;
        let mut local = h.local.lock();
        h.trim_locked(&self.space.com, &mut local, false)
    }

    /// Heap statistics of this process (zero without a heap).
    pub fn heap_stats(&self) -> HeapStats {
        self.mem.heap.as_ref().map(Heap::stats).unwrap_or_default()
    }

    /// The heap's occupancy, from the chunk table (a snapshot; objects
    /// allocated or freed concurrently may or may not show).
    pub fn heap_usage(&self) -> DsmResult<HeapUsage> {
        let h = self.heap()?;
        h.usage(&self.space.com)
    }

    /// The heap's address range, if the DSM has a heap.
    pub fn heap_range(&self) -> Option<(*mut u8, usize)> {
        self.mem.heap.as_ref().map(|h| (h.base as *mut u8, h.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        fn sync<T: Sync>() {}
        type C = crate::com::ShmCom<ct_worker::OsThreads>;
        send_sync::<Dsm<C>>();
        send_sync::<crate::dsm::DsmBox<'static, u64, C>>();
        send_sync::<crate::dsm::DsmVec<'static, u64, C>>();
        // Globals may hold DSM pointers.
        sync::<crate::dsm::DsmGlobal<*mut u8>>();
    }
}
