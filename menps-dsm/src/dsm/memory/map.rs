//! The address map: which region of shared memory lives where.
//!
//! Every region is a DSM segment with an id (its index in the space's
//! segment table, also used in message tags). Regions inside the reserved
//! DSM range take the 64 GiB slot of their id, so an address finds its
//! segment with one subtraction and one shift; user segments take ids from
//! the bottom, the runtime's regions fixed ids at the top (so a user
//! segment's address does not depend on which runtime regions exist).
//! Adopted ranges keep their own addresses outside the range; a short
//! table, readable from the signal handler, finds them.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::dsm::error::{DsmError, DsmResult};
use crate::dsm::layout::{self, DSM_BASE, DSM_SPAN, MAX_SEGMENTS, SEG_SLOT};

/// What a region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// A segment the application created ([`Dsm::alloc_segment`](crate::dsm::Dsm::alloc_segment)).
    Segment,
    /// The DSM heap ([`crate::dsm::heap`]).
    Heap,
    /// The [`dsm_global!`](crate::dsm_global) variables.
    Globals,
    /// Call stacks of user-level threads ([`super::SlotRegion`]).
    Stacks,
    /// Thread-local blocks of team threads ([`super::SlotRegion`]).
    ThreadLocal,
    /// An existing range of the program kept at its own address
    /// ([`Dsm::adopt_range`](crate::dsm::Dsm::adopt_range)).
    Adopted,
}

impl core::fmt::Display for RegionKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RegionKind::Segment => "segment",
            RegionKind::Heap => "heap",
            RegionKind::Globals => "globals segment",
            RegionKind::Stacks => "stack region",
            RegionKind::ThreadLocal => "thread-local region",
            RegionKind::Adopted => "adopted range",
        })
    }
}

impl RegionKind {
    /// The fixed segment id of a runtime region; `None` for the kinds that
    /// take ids in creation order.
    pub(crate) const fn fixed_id(self) -> Option<usize> {
        match self {
            RegionKind::Heap => Some(MAX_SEGMENTS - 1),
            RegionKind::Globals => Some(MAX_SEGMENTS - 2),
            RegionKind::Stacks => Some(MAX_SEGMENTS - 3),
            RegionKind::ThreadLocal => Some(MAX_SEGMENTS - 4),
            RegionKind::Segment | RegionKind::Adopted => None,
        }
    }

    fn code(self) -> u64 {
        self as u64
    }
}

/// Segment ids from here on belong to the runtime's regions.
pub(crate) const FIRST_RUNTIME_ID: usize = MAX_SEGMENTS - 4;

/// Most adopted ranges a process can have at once.
pub const MAX_ADOPTED: usize = 8;

/// One region of the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// What it holds.
    pub kind: RegionKind,
    /// First address (the same in every process).
    pub base: usize,
    /// Size in bytes.
    pub size: usize,
    /// Coherence block size.
    pub block_size: usize,
    /// Segment id.
    pub(crate) id: usize,
}

impl Region {
    /// One past the last address.
    pub fn end(&self) -> usize {
        self.base + self.size
    }

    /// Whether `addr` lies in the region.
    pub fn contains(&self, addr: usize) -> bool {
        (self.base..self.end()).contains(&addr)
    }

    /// A digest of the region, compared between processes.
    pub(crate) fn fingerprint(&self) -> u64 {
        [
            self.kind.code(),
            self.base as u64,
            self.size as u64,
            self.block_size as u64,
            self.id as u64,
        ]
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &v| {
            (h ^ v).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
}

/// A request for a region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub kind: RegionKind,
    pub size: usize,
    pub block_size: usize,
    /// The address an adopted range keeps.
    pub at: Option<usize>,
}

/// The map of one process (behind the space's creation lock).
#[derive(Debug, Default)]
pub(crate) struct AddressMap {
    regions: Vec<Region>,
    next_user_id: usize,
}

/// The adopted ranges, readable without a lock (signal handler): base, end
/// and segment id per entry; an entry is valid once `end` is non-zero.
struct AdoptedTable {
    base: [AtomicUsize; MAX_ADOPTED],
    end: [AtomicUsize; MAX_ADOPTED],
    id: [AtomicUsize; MAX_ADOPTED],
}

static ADOPTED: AdoptedTable = AdoptedTable {
    base: [const { AtomicUsize::new(0) }; MAX_ADOPTED],
    end: [const { AtomicUsize::new(0) }; MAX_ADOPTED],
    id: [const { AtomicUsize::new(0) }; MAX_ADOPTED],
};

/// The segment id of the adopted range holding `addr`, if any
/// (async-signal-safe).
#[inline]
pub(crate) fn adopted_id(addr: usize) -> Option<usize> {
    for i in 0..MAX_ADOPTED {
        let end = ADOPTED.end[i].load(Ordering::Acquire);
        if end != 0 && addr < end && addr >= ADOPTED.base[i].load(Ordering::Relaxed) {
            return Some(ADOPTED.id[i].load(Ordering::Relaxed));
        }
    }
    None
}

/// Forgets every adopted range (the space that owned them is gone).
pub(crate) fn clear_adopted() {
    for i in 0..MAX_ADOPTED {
        ADOPTED.end[i].store(0, Ordering::Release);
    }
}

impl AddressMap {
    /// Decides where `req` goes, checking it against every region; nothing
    /// is recorded until [`AddressMap::commit`].
    pub fn place(&self, req: Request) -> DsmResult<Region> {
        if req.size == 0 {
            return Err(DsmError::InvalidArgument(format!(
                "a {} of 0 bytes",
                req.kind
            )));
        }
        let (id, base) = match (req.kind, req.at) {
            (RegionKind::Adopted, Some(at)) => {
                let Some(end) = at.checked_add(req.size) else {
                    return Err(DsmError::InvalidArgument(format!(
                        "range {at:#x} + {} overflows",
                        req.size
                    )));
                };
                if at < DSM_BASE + DSM_SPAN && DSM_BASE < end {
                    return Err(DsmError::AddressSpace(format!(
                        "the adopted range {at:#x}..{end:#x} overlaps the DSM's own range \
                         {DSM_BASE:#x}..{:#x}",
                        DSM_BASE + DSM_SPAN
                    )));
                }
                (self.user_id()?, at)
            }
            (RegionKind::Adopted, None) => {
                return Err(DsmError::Misuse(
                    "an adopted range needs its address".into(),
                ));
            }
            (kind, Some(at)) => {
                return Err(DsmError::Misuse(format!(
                    "a {kind} cannot be placed at {at:#x}: only adopted ranges keep their own \
                     address"
                )));
            }
            (kind, None) => {
                let id = match kind.fixed_id() {
                    Some(id) => id,
                    None => self.user_id()?,
                };
                if req.size > SEG_SLOT {
                    return Err(DsmError::InvalidArgument(format!(
                        "a {kind} of {} bytes exceeds the limit of {SEG_SLOT} bytes",
                        req.size
                    )));
                }
                (id, layout::segment_base(id))
            }
        };
        let region = Region {
            kind: req.kind,
            base,
            size: req.size,
            block_size: req.block_size,
            id,
        };
        if let Some(other) = self
            .regions
            .iter()
            .find(|r| r.id == id || (r.base < region.end() && region.base < r.end()))
        {
            return Err(DsmError::AddressSpace(format!(
                "the {} at {:#x}..{:#x} would overlap the {} at {:#x}..{:#x}",
                region.kind,
                region.base,
                region.end(),
                other.kind,
                other.base,
                other.end()
            )));
        }
        if region.kind == RegionKind::Adopted {
            Self::check_adoptable(region.base, region.size)?;
        }
        Ok(region)
    }

    /// Records a region whose segment now exists.
    pub fn commit(&mut self, r: Region) -> DsmResult<()> {
        if r.kind == RegionKind::Adopted {
            let i = (0..MAX_ADOPTED)
                .find(|&i| ADOPTED.end[i].load(Ordering::Relaxed) == 0)
                .ok_or_else(|| {
                    DsmError::OutOfMemory(format!("at most {MAX_ADOPTED} adopted ranges"))
                })?;
            ADOPTED.base[i].store(r.base, Ordering::Relaxed);
            ADOPTED.id[i].store(r.id, Ordering::Relaxed);
            ADOPTED.end[i].store(r.end(), Ordering::Release);
        }
        if r.kind.fixed_id().is_none() {
            self.next_user_id += 1;
        }
        self.regions.push(r);
        Ok(())
    }

    /// Every region, in creation order.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    fn user_id(&self) -> DsmResult<usize> {
        if self.next_user_id >= FIRST_RUNTIME_ID {
            return Err(DsmError::OutOfMemory(format!(
                "at most {FIRST_RUNTIME_ID} segments and adopted ranges can exist"
            )));
        }
        Ok(self.next_user_id)
    }

    /// An adopted range must be page-aligned, outside the DSM's own range,
    /// and mapped readable and writable in this process.
    fn check_adoptable(at: usize, size: usize) -> DsmResult<()> {
        let page = crate::sys::page_size();
        let end = at + size;
        if !at.is_multiple_of(page) || !size.is_multiple_of(page) {
            return Err(DsmError::InvalidArgument(format!(
                "an adopted range must start and end on page boundaries ({page} bytes): \
                 {at:#x}..{end:#x}"
            )));
        }
        check_mapped_rw(at, end)
    }
}

/// Checks that `[start, end)` is covered by readable and writable mappings
/// of this process (from `/proc/self/maps`).
fn check_mapped_rw(start: usize, end: usize) -> DsmResult<()> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| DsmError::AddressSpace(format!("cannot read /proc/self/maps: {e}")))?;
    let mut covered = start;
    let mut spans: Vec<(usize, usize, bool)> = maps
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (range, perms) = (it.next()?, it.next()?);
            let (a, b) = range.split_once('-')?;
            let a = usize::from_str_radix(a, 16).ok()?;
            let b = usize::from_str_radix(b, 16).ok()?;
            Some((a, b, perms.starts_with("rw")))
        })
        .filter(|&(a, b, _)| a < end && start < b)
        .collect();
    spans.sort_unstable();
    for (a, b, rw) in spans {
        if a > covered {
            break;
        }
        if !rw {
            return Err(DsmError::AddressSpace(format!(
                "the adopted range {start:#x}..{end:#x} includes {a:#x}..{b:#x}, which is not \
                 mapped readable and writable"
            )));
        }
        covered = covered.max(b);
        if covered >= end {
            return Ok(());
        }
    }
    Err(DsmError::AddressSpace(format!(
        "the adopted range {start:#x}..{end:#x} is not entirely mapped (first hole at \
         {covered:#x})"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: RegionKind, size: usize) -> Request {
        Request {
            kind,
            size,
            block_size: 4096,
            at: None,
        }
    }

    #[test]
    fn user_segments_count_up_runtime_regions_take_fixed_slots() {
        let mut m = AddressMap::default();
        let heap = m.place(req(RegionKind::Heap, 1 << 20)).unwrap();
        m.commit(heap).unwrap();
        let a = m.place(req(RegionKind::Segment, 4096)).unwrap();
        m.commit(a).unwrap();
        let b = m.place(req(RegionKind::Segment, 8192)).unwrap();
        m.commit(b).unwrap();
        assert_eq!(a.base, layout::segment_base(0));
        assert_eq!(b.base, layout::segment_base(1));
        assert_eq!(heap.id, MAX_SEGMENTS - 1);
        // A second heap is refused, naming both regions.
        let e = m.place(req(RegionKind::Heap, 4096)).unwrap_err();
        assert!(e.to_string().contains("overlap the heap"), "{e}");
        assert_eq!(m.regions()[0], heap);
        assert_eq!(m.regions().len(), 3);
    }

    #[test]
    fn bad_requests_are_refused() {
        let m = AddressMap::default();
        assert!(m.place(req(RegionKind::Segment, 0)).is_err());
        assert!(m.place(req(RegionKind::Segment, SEG_SLOT + 1)).is_err());
        let mut r = req(RegionKind::Adopted, 4096);
        assert!(m.place(r).is_err(), "no address");
        r.at = Some(DSM_BASE);
        let e = m.place(r).unwrap_err();
        assert!(e.to_string().contains("DSM's own range"), "{e}");
        r.at = Some(0x1234);
        let e = m.place(r).unwrap_err();
        assert!(e.to_string().contains("page boundaries"), "{e}");
        let mut s = req(RegionKind::Segment, 4096);
        s.at = Some(1 << 30);
        assert!(m.place(s).is_err(), "only adopted ranges keep addresses");
        // An unmapped range (the first page is never mapped).
        r.at = Some(0);
        let e = m.place(r).unwrap_err();
        assert!(e.to_string().contains("not entirely mapped"), "{e}");
    }

    #[test]
    fn mapped_ranges_are_checked() {
        let page = crate::sys::page_size();
        let v = vec![0u8; 8 * page];
        let at = (v.as_ptr() as usize).next_multiple_of(page);
        check_mapped_rw(at, at + 4 * page).unwrap();
        // Code is not writable.
        let code = (check_mapped_rw as fn(usize, usize) -> DsmResult<()>) as usize;
        let code = code - code % page;
        assert!(check_mapped_rw(code, code + page).is_err());
    }

    #[test]
    fn ids_run_out_with_a_clear_error() {
        let mut m = AddressMap::default();
        for _ in 0..FIRST_RUNTIME_ID {
            let r = m.place(req(RegionKind::Segment, 4096)).unwrap();
            m.commit(r).unwrap();
        }
        let e = m.place(req(RegionKind::Segment, 4096)).unwrap_err();
        assert!(matches!(e, DsmError::OutOfMemory(_)), "{e}");
    }
}
