//! The DSM's fixed address range.
//!
//! Every process reserves the same range, `[DSM_BASE, DSM_BASE +
//! DSM_SPAN)`, inaccessible, at start-up; segment `s` gets the slot
//! `DSM_BASE + s * SEG_SLOT` and maps its application view there. Because
//! the launcher disables address-space randomisation and every process runs
//! the same binary, DSM addresses, code addresses and the addresses of
//! globals are the same everywhere: a pointer into the DSM, a function
//! pointer or a `&'static` can be passed between processes.

use std::sync::OnceLock;

use super::error::{DsmError, DsmResult};

/// First address of the DSM.
pub const DSM_BASE: usize = 0x1000_0000_0000;
/// Address space per segment (64 GiB): the largest segment.
pub const SEG_SLOT: usize = 64 << 30;
/// Number of segment slots; the last slot number is kept for mutex tags.
pub const MAX_SEGMENTS: usize = 127;
/// Size of the reserved range.
pub const DSM_SPAN: usize = SEG_SLOT * (MAX_SEGMENTS + 1);
/// Most blocks a segment may have (block indices fit in 24 bits of a p2p
/// tag).
pub const MAX_BLOCKS_PER_SEGMENT: usize = 1 << 24;

static RESERVED: OnceLock<Result<(), String>> = OnceLock::new();

/// Reserves the DSM range in this process (once; later calls return the
/// first result).
pub fn reserve() -> DsmResult<()> {
    RESERVED
        .get_or_init(|| {
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping;
            // the range becomes an inaccessible reservation owned by the DSM
            // for the life of the process.
            let p = unsafe {
                libc::mmap(
                    DSM_BASE as *mut libc::c_void,
                    DSM_SPAN,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE
                        | libc::MAP_ANONYMOUS
                        | libc::MAP_NORESERVE
                        | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(format!(
                    "cannot reserve {:#x}..{:#x}: {}",
                    DSM_BASE,
                    DSM_BASE + DSM_SPAN,
                    std::io::Error::last_os_error()
                ));
            }
            if p as usize != DSM_BASE {
                // An old kernel that ignores MAP_FIXED_NOREPLACE placed it
                // elsewhere.
                // SAFETY: unmapping the mapping we just made.
                unsafe { libc::munmap(p, DSM_SPAN) };
                return Err(format!(
                    "the kernel placed the DSM reservation at {p:p} instead of {DSM_BASE:#x} \
                     (MAP_FIXED_NOREPLACE unsupported?)"
                ));
            }
            Ok(())
        })
        .clone()
        .map_err(DsmError::AddressSpace)
}

/// Base address of segment slot `id`.
pub const fn segment_base(id: usize) -> usize {
    DSM_BASE + id * SEG_SLOT
}

/// Segment slot of `addr`, if it lies in the DSM range.
#[inline]
pub fn slot_of(addr: usize) -> Option<usize> {
    if (DSM_BASE..DSM_BASE + SEG_SLOT * MAX_SEGMENTS).contains(&addr) {
        Some((addr - DSM_BASE) / SEG_SLOT)
    } else {
        None
    }
}

/// Whether `addr` lies in the reserved DSM range.
pub fn in_dsm_range(addr: usize) -> bool {
    (DSM_BASE..DSM_BASE + DSM_SPAN).contains(&addr)
}

/// Changes the protection of `[addr, addr + len)`, with an error that says
/// what to do when the kernel runs out of mappings.
pub fn protect(addr: usize, len: usize, prot: libc::c_int) -> DsmResult<()> {
    // SAFETY: callers pass ranges of DSM application views, which only the
    // DSM maps and whose contents are never Rust objects the compiler
    // assumes accessible (application code reaches them through raw
    // pointers and faults are resolved by the DSM).
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) } != 0 {
        let e = std::io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::ENOMEM) {
            " (too many memory mappings: raise vm.max_map_count or use larger blocks)"
        } else {
            ""
        };
        return Err(DsmError::AddressSpace(format!(
            "mprotect({addr:#x}, {len}) failed: {e}{hint}"
        )));
    }
    Ok(())
}
