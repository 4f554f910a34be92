//! Which pages of the application view were written since a release last
//! looked: the kernel's record of writes, instead of comparing blocks with
//! their twins.
//!
//! A release fence must tell, for every block listed in the write set,
//! whether the program changed it since the version it last released (its
//! twin). Comparing the two costs a read of the whole block, and most of
//! the listed blocks of an OpenMP program are idle at most fences: a grid
//! written in one phase is listed at every barrier until idle releases
//! protect it. On Linux 6.7 and later, a `userfaultfd` registered for
//! *asynchronous* write protection (`UFFD_FEATURE_WP_ASYNC`) has the
//! kernel note a write to a protected page in its page table — no signal,
//! no message, the write goes on — and the `PAGEMAP_SCAN` ioctl reports the
//! pages of a range written since they were protected and protects them
//! again, page by page atomically (a write either lands before the page's
//! check and is reported, or after it and is left for the next scan).
//!
//! The protection is independent of `mprotect` (a page keeps it through
//! `PROT_NONE` and back) and concerns only this mapping: writes through the
//! system view (the DSM's own merges and fetches) are not noted, so the
//! protocol forgets what a scan told it about a block whenever it changes
//! the copy or its twin itself (see `BlockMeta::armed`). A page the scan
//! never protected, or whose page-table entry the kernel dropped after a
//! write, is reported as written: the record errs on the side of a
//! comparison.
//!
//! Where the kernel lacks the feature (or forbids `userfaultfd`), the
//! tracker is simply absent and every release compares.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `UFFD_API`, the protocol version of `UFFDIO_API`.
const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY`: the descriptor handles user-mode faults only
/// (allowed to unprivileged processes; asynchronous write protection
/// resolves every fault in the kernel anyway).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
/// `UFFD_FEATURE_WP_ASYNC`.
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
/// `UFFDIO_REGISTER_MODE_WP`.
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
/// `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
/// `_IOWR(0xAA, 0x00, struct uffdio_register)`.
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
/// `_IOR(0xAA, 0x01, struct uffdio_range)`.
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_AA01;
/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
/// `PM_SCAN_WP_MATCHING`: protect the pages reported.
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// `PM_SCAN_CHECK_WPASYNC`: fail on a page without asynchronous write
/// protection (a range that is not registered).
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
/// `PAGE_IS_WRITTEN`: written since last protected (or never protected).
const PAGE_IS_WRITTEN: u64 = 1 << 1;

/// `struct uffdio_api`.
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `struct pm_scan_arg`.
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// Regions one scan call can return; a range with more written runs takes
/// more calls.
const SCAN_VEC: usize = 64;

/// The process's write tracker: one `userfaultfd` for every tracked range,
/// and `/proc/self/pagemap` to scan them.
pub(crate) struct DirtyTracker {
    uffd: OwnedFd,
    pagemap: File,
}

impl DirtyTracker {
    /// The tracker, if this kernel records writes asynchronously (`None`:
    /// no `userfaultfd`, no `UFFD_FEATURE_WP_ASYNC`, or no `PAGEMAP_SCAN`,
    /// which [`DirtyTracker::track`] finds out on its first range).
    pub(crate) fn open() -> Option<Self> {
        // SAFETY: the userfaultfd system call takes flags and returns a new
        // descriptor or -1; no memory is passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is a descriptor we own from here on.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_WP_ASYNC,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes the `uffdio_api` we pass.
        let r = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, &mut api) };
        if r != 0 || api.features & UFFD_FEATURE_WP_ASYNC == 0 {
            return None;
        }
        let pagemap = File::open("/proc/self/pagemap").ok()?;
        Some(DirtyTracker { uffd, pagemap })
    }

    /// Tracks writes to `[base, base + len)` (page-aligned, one shared
    /// mapping of this process). Returns whether the range is tracked: a
    /// kernel that cannot track this memory, or cannot scan it, leaves it
    /// untracked (and unregistered).
    pub(crate) fn track(&self, base: usize, len: usize) -> bool {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: base as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads the range and mode and writes the
        // `ioctls` field of the struct we pass; it changes no memory
        // contents, only how the kernel handles write faults there.
        let r = unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) };
        if r != 0 {
            return false;
        }
        // Scanning must work too (`PAGEMAP_SCAN` came after the feature).
        let page = crate::sys::page_size();
        if self
            .written(base, base + page.min(len), &mut Vec::new())
            .is_err()
        {
            let mut range = UffdioRange {
                start: base as u64,
                len: len as u64,
            };
            // SAFETY: UFFDIO_UNREGISTER reads the range we pass.
            unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_UNREGISTER, &mut range) };
            return false;
        }
        true
    }

    /// Appends to `out` the page ranges `(start, end)` of `[start, end)`
    /// (page-aligned, tracked) written since a scan last protected them
    /// (or never protected), in address order, and — with `protect` —
    /// protects them again: each page is looked at and protected under its
    /// page-table lock, so a write is either reported now or noted for the
    /// next scan.
    fn scan(
        &self,
        mut start: usize,
        end: usize,
        protect: bool,
        out: &mut Vec<(usize, usize)>,
    ) -> io::Result<usize> {
        let mut vec = [PageRegion::default(); SCAN_VEC];
        let mut calls = 0;
        while start < end {
            let mut arg = PmScanArg {
                size: core::mem::size_of::<PmScanArg>() as u64,
                flags: PM_SCAN_CHECK_WPASYNC | if protect { PM_SCAN_WP_MATCHING } else { 0 },
                start: start as u64,
                end: end as u64,
                walk_end: 0,
                vec: vec.as_mut_ptr() as u64,
                vec_len: SCAN_VEC as u64,
                max_pages: 0,
                category_inverted: 0,
                category_mask: 0,
                category_anyof_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
            };
            // SAFETY: PAGEMAP_SCAN reads `arg`, writes at most `vec_len`
            // regions into `vec` (ours, that long) and `walk_end`; with
            // WP_MATCHING it changes page-table write protection of the
            // tracked range only, never memory contents.
            let n = unsafe { libc::ioctl(self.pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
            calls += 1;
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            out.extend(
                vec[..n as usize]
                    .iter()
                    .map(|r| (r.start as usize, r.end as usize)),
            );
            let walked = arg.walk_end as usize;
            if walked <= start {
                return Err(io::Error::other("PAGEMAP_SCAN made no progress"));
            }
            start = walked;
        }
        Ok(calls)
    }

    /// [`DirtyTracker::scan`] that protects what it reports: the pages of
    /// `[start, end)` written since the last such scan. Returns the number
    /// of ioctl calls made.
    pub(crate) fn written_and_protect(
        &self,
        start: usize,
        end: usize,
        out: &mut Vec<(usize, usize)>,
    ) -> io::Result<usize> {
        self.scan(start, end, true, out)
    }

    /// [`DirtyTracker::scan`] that only reports (nothing is protected, so
    /// what it reports is reported again by the next scan).
    pub(crate) fn written(
        &self,
        start: usize,
        end: usize,
        out: &mut Vec<(usize, usize)>,
    ) -> io::Result<usize> {
        self.scan(start, end, false, out)
    }
}

/// What one release fence's scan found: the ranges it scanned (and
/// protected) and the page ranges in them written before the scan, both in
/// address order.
#[derive(Default)]
pub(crate) struct ScanResult {
    /// Scanned ranges, disjoint and sorted.
    pub covered: Vec<(usize, usize)>,
    /// Written page ranges inside them, sorted.
    pub written: Vec<(usize, usize)>,
}

impl ScanResult {
    /// Forgets the last fence's result, keeping the buffers.
    pub(crate) fn clear(&mut self) {
        self.covered.clear();
        self.written.clear();
    }

    /// Whether `[addr, addr + len)` lies in a scanned range and none of
    /// its pages was written before the scan.
    pub(crate) fn clean(&self, addr: usize, len: usize) -> bool {
        self.covers(addr, len) && !self.touched(addr, len)
    }

    /// Whether `[addr, addr + len)` lies in one scanned range.
    pub(crate) fn covers(&self, addr: usize, len: usize) -> bool {
        let i = self.covered.partition_point(|&(s, _)| s <= addr);
        i > 0 && self.covered[i - 1].1 >= addr + len
    }

    /// Whether a page of `[addr, addr + len)` was reported written.
    pub(crate) fn touched(&self, addr: usize, len: usize) -> bool {
        // The first written range ending after `addr`.
        let i = self.written.partition_point(|&(_, e)| e <= addr);
        self.written.get(i).is_some_and(|&(s, _)| s < addr + len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 4096;

    fn mapping(len: usize) -> (usize, usize) {
        // A shared mapping, and a second view of it (the "system view").
        // SAFETY: fresh anonymous shared mapping of `len` bytes.
        let sys = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(sys, libc::MAP_FAILED);
        // SAFETY: duplicates the shared mapping elsewhere (old_size 0).
        let app = unsafe { libc::mremap(sys, 0, len, libc::MREMAP_MAYMOVE) };
        assert_ne!(app, libc::MAP_FAILED);
        (app as usize, sys as usize)
    }

    fn write(addr: usize, v: u8) {
        // SAFETY: `addr` is inside one of the test's live mappings.
        unsafe { core::ptr::write_volatile(addr as *mut u8, v) };
    }

    fn pages(t: &DirtyTracker, app: usize, len: usize, protect: bool) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        if protect {
            t.written_and_protect(app, app + len, &mut out).unwrap();
        } else {
            t.written(app, app + len, &mut out).unwrap();
        }
        out.iter()
            .map(|&(s, e)| ((s - app) / P, (e - app) / P))
            .collect()
    }

    #[test]
    fn scans_report_writes_through_the_tracked_view_only() {
        if crate::sys::page_size() != P {
            return;
        }
        let Some(t) = DirtyTracker::open() else {
            eprintln!("asynchronous write protection unavailable: nothing to test");
            return;
        };
        let len = 16 * P;
        let (app, sys) = mapping(len);
        if !t.track(app, len) {
            eprintln!("this kernel cannot scan shared memory: nothing to test");
            return;
        }
        // Never protected: all written.
        assert_eq!(pages(&t, app, len, false), vec![(0, 16)]);
        assert_eq!(pages(&t, app, len, true), vec![(0, 16)]);
        assert_eq!(pages(&t, app, len, true), vec![]);
        write(app + 3 * P + 5, 1);
        write(app + 4 * P, 1);
        write(app + 9 * P, 1);
        // The system view's writes are not reported.
        write(sys + 12 * P, 1);
        assert_eq!(pages(&t, app, len, false), vec![(3, 5), (9, 10)]);
        assert_eq!(pages(&t, app, len, true), vec![(3, 5), (9, 10)]);
        assert_eq!(pages(&t, app, len, true), vec![]);
        // Protection survives mprotect.
        // SAFETY: pages of our own test mapping.
        unsafe {
            libc::mprotect((app + 6 * P) as *mut _, P, libc::PROT_NONE);
            libc::mprotect(
                (app + 6 * P) as *mut _,
                P,
                libc::PROT_READ | libc::PROT_WRITE,
            );
        }
        assert_eq!(pages(&t, app, len, true), vec![]);
        write(app + 6 * P, 2);
        assert_eq!(pages(&t, app, len, true), vec![(6, 7)]);
        // More written runs than one call returns.
        for p in (0..16).step_by(2) {
            write(app + p * P, 3);
        }
        let mut out = Vec::new();
        let calls = t.scan(app, app + len, true, &mut out).unwrap();
        assert_eq!(out.len(), 8);
        assert!(calls >= 1);
        assert_eq!(pages(&t, app, len, false), vec![]);
        // A range that is not tracked is an error, not a silent "clean".
        let (other, _) = mapping(P);
        assert!(t.written(other, other + P, &mut Vec::new()).is_err());
    }

    #[test]
    fn scan_results_tell_clean_blocks() {
        let r = ScanResult {
            covered: vec![(0x1000, 0x9000), (0x10000, 0x12000)],
            written: vec![(0x3000, 0x4000), (0x11000, 0x12000)],
        };
        assert!(r.clean(0x1000, 0x2000));
        assert!(!r.clean(0x2000, 0x2000), "its second page was written");
        assert!(r.clean(0x4000, 0x2000));
        assert!(!r.clean(0x8000, 0x2000), "not covered in full");
        assert!(!r.clean(0xa000, 0x1000), "not covered");
        assert!(r.clean(0x10000, 0x1000));
        assert!(!r.clean(0x11000, 0x1000));
        assert!(!ScanResult::default().clean(0x1000, 0x1000));
    }
}
