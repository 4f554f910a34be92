//! Adopted ranges: existing memory of the program (a `static`, an
//! executable's `.data`/`.bss`) that becomes DSM memory at its own address,
//! with process 0's contents as the shared initial image.

use crate::com::Communicator;
use crate::dsm::error::DsmResult;
use crate::dsm::segment::Fresh;

/// Largest single read of another process's system view.
const READ_PIECE: usize = 64 << 20;

/// Fills a fresh adopted segment at `base` with what process 0 has there
/// now (collective). Process 0 copies its memory into its system view and
/// twin and broadcasts which pages are not zero; the others read those
/// pages from its system view (windows start zeroed, so the zero pages of a
/// large `.bss` cost nothing); a barrier then keeps process 0 from changing
/// its system view (through the application view, once mapped) before
/// everybody has read it.
pub(crate) fn fill_from_root<C: Communicator>(
    com: &C,
    fresh: &Fresh,
    base: usize,
) -> DsmResult<()> {
    let page = crate::sys::page_size();
    let npages = fresh.size / page;
    let mut nonzero = vec![0u8; npages.div_ceil(8)];
    if com.rank() == 0 {
        // SAFETY: the map checked that `[base, base + size)` is mapped
        // readable and writable in this process; `Dsm::adopt_range`'s
        // contract is that no other thread accesses it during the call.
        let src = unsafe { core::slice::from_raw_parts(base as *const u8, fresh.size) };
        fresh.copy_image(src)?;
        for (i, pg) in src.chunks_exact(page).enumerate() {
            if pg.iter().any(|&b| b != 0) {
                nonzero[i / 8] |= 1 << (i % 8);
            }
        }
    }
    com.broadcast(0, &mut nonzero)?;
    if com.rank() != 0 {
        let set = |i: usize| nonzero[i / 8] & (1 << (i % 8)) != 0;
        let mut i = 0;
        while i < npages {
            if !set(i) {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < npages && set(j) && (j - i) * page < READ_PIECE {
                j += 1;
            }
            let (off, len) = (i * page, (j - i) * page);
            // SAFETY: `off + len <= size`: inside this process's fresh system
            // view and twin, which nobody else accesses before creation ends.
            let (dst, twin) = unsafe {
                (
                    core::slice::from_raw_parts_mut(fresh.data.add(off), len),
                    fresh.twin.add(off),
                )
            };
            com.read(fresh.data_win.at(0, off as u64), dst)?;
            // SAFETY: as above; the two window parts do not overlap.
            unsafe { core::ptr::copy_nonoverlapping(dst.as_ptr(), twin, len) };
            i = j;
        }
    }
    com.barrier()?;
    Ok(())
}
