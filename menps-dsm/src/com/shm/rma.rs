//! RMA on shm: every window of every process is mapped here, so reads and
//! writes are memory copies on the mapping and compare-and-swap /
//! fetch-and-add are hardware atomics on it, after the shared checks; each
//! completes before the call returns.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use ct_worker::UltItf;

use super::ShmCom;
use crate::com::{RemotePtr, Request, Result, Rma, check};

impl<U: UltItf> ShmCom<U> {
    #[inline]
    fn atomic_at(&self, p: RemotePtr) -> Result<&AtomicU64> {
        self.check_alive()?;
        check::aligned_word(p)?;
        let a = self.windows.resolve(p, 8, self.size)?;
        // SAFETY: `resolve` checked that the 8 bytes lie inside a live
        // window mapping; window bases are page-aligned and the offset is a
        // multiple of 8, so the word is aligned; any bit pattern is a valid
        // AtomicU64, and the mapping outlives `&self` (destroyed windows stay
        // reserved).
        Ok(unsafe { &*(a as *const AtomicU64) })
    }

    /// Blocking read (the hot path, without a request).
    #[inline]
    fn do_read(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<()> {
        self.check_alive()?;
        let s = self.windows.resolve(src, len, self.size)?;
        // SAFETY: `s..s+len` is inside a live mapping (checked); the caller
        // guarantees `dst` is valid for `len` bytes. `copy` tolerates overlap
        // (a read from one's own window into itself). Concurrent conflicting
        // remote writes give unspecified bytes, as with RDMA; the DSM's
        // protocol excludes them.
        unsafe { copy_bytes(s, dst, len) };
        Ok(())
    }

    /// Blocking write (the hot path, without a request).
    #[inline]
    fn do_write(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<()> {
        self.check_alive()?;
        let d = self.windows.resolve(dst, len, self.size)?;
        // SAFETY: as in `do_read`, with the roles swapped.
        unsafe { copy_bytes(src, d, len) };
        Ok(())
    }
}

/// `memmove` with a fast path for word-sized copies.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes.
#[inline(always)]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: per the contract; unaligned accesses are allowed by
    // read/write_unaligned, and a single load-then-store is overlap-safe.
    unsafe {
        match len {
            8 => ptr::write_unaligned(dst.cast::<u64>(), ptr::read_unaligned(src.cast::<u64>())),
            4 => ptr::write_unaligned(dst.cast::<u32>(), ptr::read_unaligned(src.cast::<u32>())),
            16 => ptr::write_unaligned(dst.cast::<u128>(), ptr::read_unaligned(src.cast::<u128>())),
            _ => ptr::copy(src, dst, len),
        }
    }
}

impl<U: UltItf> Rma for ShmCom<U> {
    type Request = Request<U>;

    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Request<U>> {
        self.do_read(src, dst, len)?;
        Ok(Request::ready(Ok(0)))
    }

    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Request<U>> {
        self.do_write(dst, src, len)?;
        Ok(Request::ready(Ok(0)))
    }

    fn compare_and_swap_nb(&self, at: RemotePtr, expected: u64, new: u64) -> Result<Request<U>> {
        self.compare_and_swap(at, expected, new)
            .map(|v| Request::ready(Ok(v)))
    }

    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Request<U>> {
        self.fetch_add(target, delta).map(|v| Request::ready(Ok(v)))
    }

    fn flush(&self, rank: usize) -> Result<()> {
        check::rank(rank, self.size)?;
        fence(Ordering::SeqCst);
        self.check_alive()
    }

    fn flush_all(&self) -> Result<()> {
        fence(Ordering::SeqCst);
        self.check_alive()
    }

    #[inline]
    fn read(&self, src: RemotePtr, dst: &mut [u8]) -> Result<()> {
        self.do_read(src, dst.as_mut_ptr(), dst.len())
    }

    #[inline]
    fn write(&self, dst: RemotePtr, src: &[u8]) -> Result<()> {
        self.do_write(dst, src.as_ptr(), src.len())
    }

    #[inline]
    fn compare_and_swap(&self, target: RemotePtr, expected: u64, new: u64) -> Result<u64> {
        let w = self.atomic_at(target)?;
        Ok(
            match w.compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    #[inline]
    fn fetch_add(&self, target: RemotePtr, delta: u64) -> Result<u64> {
        Ok(self.atomic_at(target)?.fetch_add(delta, Ordering::SeqCst))
    }

    #[inline]
    fn atomic_load(&self, target: RemotePtr) -> Result<u64> {
        Ok(self.atomic_at(target)?.load(Ordering::SeqCst))
    }
}
