//! A global allocator that gives DSM code DSM memory.
//!
//! With [`DsmAllocator`] as the program's `#[global_allocator]`, ordinary
//! Rust allocations — `Box`, `Vec`, `String`, collections — made by threads
//! *running DSM code* come from the DSM heap, at addresses valid in every
//! process; every other allocation comes from the system allocator:
//!
//! ```
//! #[global_allocator]
//! static ALLOC: menps_dsm::dsm::DsmAllocator = menps_dsm::dsm::DsmAllocator;
//!
//! // No DSM runs yet: this comes from the system allocator.
//! let v: Vec<u64> = (1..=100).collect();
//! assert!(!menps_dsm::dsm::allocator::is_dsm_pointer(v.as_ptr().cast()));
//! assert_eq!(v.iter().sum::<u64>(), 5050);
//! ```
//!
//! A thread runs DSM code while its stack is a DSM call stack (the stack
//! region of [`crate::dsm::memory`]: team threads, the program's `main` run
//! on a DSM stack), or inside [`in_dsm_context`]. The DSM runtime's own work
//! (fault resolution, barriers, locks, the heap itself) always uses the
//! system allocator, even on a DSM stack. Before the DSM starts and after it
//! ends, everything comes from the system allocator. A user-level thread
//! keeps that context (runtime depth, [`in_dsm_context`] depth) in the low 32
//! bits of its ct-worker hook word ([`ct_worker::current_thread_data`]), so
//! it follows the thread to whichever worker resumes it: a switch hook of a
//! runtime whose threads use the DSM must leave those bits alone.
//!
//! - **Freeing** follows the pointer, not the thread: DSM memory goes back
//!   to the DSM heap from any thread of any process (a `Vec` built on rank
//!   0 may be dropped on rank 1), system memory to the system allocator.
//!   `realloc` moves an object across the boundary when the thread's context
//!   differs from where the object lives.
//! - **Speed**: each OS thread keeps a small cache per size class (up to
//!   4 KiB) of DSM objects, refilled and flushed in batches, so an
//!   allocation and a free usually cost a few loads and stores.
//! - **After the DSM ends**, its heap stays mapped (read-write, this
//!   process's last copy), so objects the program still holds stay
//!   readable; freeing them then does nothing.
//!
//! The heap's rules apply to what the allocator hands out (see
//! [`crate::dsm::heap`]): an object written by several processes is
//! accessed data-race-free, and it is freed after every process is done
//! with it.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::{Cell, UnsafeCell};
use core::sync::atomic::{AtomicU64, Ordering};
use std::alloc::System;

use super::heap::SIZE_CLASSES;
use super::layout::{SEG_SLOT, segment_base};
use super::memory::RegionKind;
use super::process;

/// First address of the stack region (fixed).
const STACKS_LO: usize = segment_base(match RegionKind::Stacks.fixed_id() {
    Some(id) => id,
    None => panic!("the stack region has a fixed slot"),
});
/// First address of the heap (fixed).
const HEAP_LO: usize = segment_base(match RegionKind::Heap.fixed_id() {
    Some(id) => id,
    None => panic!("the heap has a fixed slot"),
});

/// Size classes the per-thread caches keep (16 B .. 4 KiB).
const CACHED: usize = 16;
/// Objects a cache keeps per class.
const CACHE_CAP: usize = 32;
/// Objects fetched or flushed at once.
const BATCH: usize = 16;
/// Largest cached size.
const MAX_CACHED: usize = SIZE_CLASSES[CACHED - 1];

/// Size class of each size in 16-byte steps up to [`MAX_CACHED`] (for
/// alignments up to 16: every class is a multiple of 16).
static CLASS_OF: [u8; MAX_CACHED / 16 + 1] = class_table();

const fn class_table() -> [u8; MAX_CACHED / 16 + 1] {
    let mut t = [0u8; MAX_CACHED / 16 + 1];
    let mut i = 0;
    while i < t.len() {
        let size = i * 16;
        let mut c = 0;
        while SIZE_CLASSES[c] < size {
            c += 1;
        }
        t[i] = c as u8;
        i += 1;
    }
    t
}

/// Incremented whenever a DSM starts: caches filled under an older heap are
/// stale.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Called when a DSM starts.
pub(crate) fn new_generation() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

// The allocation context of the running code: how deep it is in DSM
// runtime code (bits 0..16; > 0: system allocator) and in `in_dsm_context`
// (bits 16..32). A user-level thread keeps it in the low 32 bits of its
// ct-worker hook word (it may resume on another OS thread in the middle of
// either); other code in a thread-local.
const RUNTIME_ONE: usize = 1;
const FORCED_ONE: usize = 1 << 16;
const RUNTIME_MASK: usize = 0xffff;
const FORCED_MASK: usize = 0xffff << 16;

thread_local! {
    static OS_CONTEXT: Cell<usize> = const { Cell::new(0) };
    /// Whether this OS thread's cache exists (a thread-local without a
    /// destructor, so reading it never allocates).
    static CACHE_READY: Cell<bool> = const { Cell::new(false) };
    static CACHE: CacheCell = const { CacheCell(UnsafeCell::new(Cache::EMPTY)) };
}

/// The context word of the running code.
#[inline]
fn context() -> usize {
    match ct_worker::current_thread_data() {
        Some(d) => d,
        None => OS_CONTEXT.try_with(Cell::get).unwrap_or(0),
    }
}

/// Adds `delta` to the context word of the running code (wrapping: a
/// matching subtraction follows).
#[inline]
fn context_add(delta: usize, add: bool) {
    let f = |v: usize| {
        if add {
            v.wrapping_add(delta)
        } else {
            v.wrapping_sub(delta)
        }
    };
    if let Some(d) = ct_worker::current_thread_data() {
        ct_worker::set_current_thread_data(f(d));
    } else {
        let _ = OS_CONTEXT.try_with(|c| c.set(f(c.get())));
    }
}

/// Marks runtime code while it lives (in the running user-level thread,
/// wherever it resumes, or in the OS thread): the [`DsmAllocator`] serves
/// it from the system heap, even on a DSM call stack. For a runtime built
/// on the DSM (its process-local bookkeeping must not land in the shared
/// heap).
#[derive(Debug)]
pub struct RuntimeGuard(());

impl RuntimeGuard {
    /// Enters runtime code.
    #[inline]
    #[must_use = "runtime code ends when the guard is dropped"]
    pub fn enter() -> Self {
        context_add(RUNTIME_ONE, true);
        RuntimeGuard(())
    }
}

impl Drop for RuntimeGuard {
    #[inline]
    fn drop(&mut self) {
        context_add(RUNTIME_ONE, false);
    }
}

/// Runs `f` — user code called from runtime code — in the allocation context
/// of user code (the runtime depth of the running code is set aside while
/// it runs).
pub(crate) fn user_code<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            context_add(self.0, true);
        }
    }
    let depth = context() & RUNTIME_MASK;
    context_add(depth, false);
    let _restore = Restore(depth);
    f()
}

/// Runs `f` with the caller's allocations served from the DSM heap (when a
/// DSM runs), as if it ran on a DSM stack: for code that runs DSM work
/// without being a user-level thread on a DSM stack (a program's own OS
/// threads, tests). Nests; holds for the running user-level thread wherever
/// it resumes.
pub fn in_dsm_context<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            context_add(FORCED_ONE, false);
        }
    }
    context_add(FORCED_ONE, true);
    let _leave = Leave;
    f()
}

/// Whether an allocation made now by the running code would come from the
/// DSM heap (if a DSM runs): it runs on a DSM call stack or inside
/// [`in_dsm_context`], and not inside the DSM runtime.
#[inline]
pub fn is_dsm_context() -> bool {
    let sp: usize;
    // SAFETY: reads the stack pointer; no memory access, no flags changed.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    let on_dsm_stack = sp.wrapping_sub(STACKS_LO) < SEG_SLOT;
    let c = context();
    c & RUNTIME_MASK == 0 && (on_dsm_stack || c & FORCED_MASK != 0)
}

/// Whether the running code is runtime code (inside a [`RuntimeGuard`],
/// and not in user code it called).
#[inline]
pub fn in_runtime_code() -> bool {
    context() & RUNTIME_MASK != 0
}

/// Whether `p` points into the DSM heap.
#[inline]
pub fn is_dsm_pointer(p: *const u8) -> bool {
    (p as usize).wrapping_sub(HEAP_LO) < SEG_SLOT
}

/// The cached size class of a layout, if it has one.
#[inline]
fn cached_class(l: Layout) -> Option<usize> {
    (l.size() <= MAX_CACHED && l.align() <= 16).then(|| CLASS_OF[l.size().div_ceil(16)] as usize)
}

/// A thread's cache of free DSM objects.
struct Cache {
    generation: u64,
    len: [u8; CACHED],
    slots: [[usize; CACHE_CAP]; CACHED],
}

impl Cache {
    const EMPTY: Cache = Cache {
        generation: 0,
        len: [0; CACHED],
        slots: [[0; CACHE_CAP]; CACHED],
    };

    /// Forgets objects of an earlier DSM's heap.
    #[inline]
    fn sync_generation(&mut self) {
        let g = GENERATION.load(Ordering::Relaxed);
        if self.generation != g {
            self.generation = g;
            self.len = [0; CACHED];
        }
    }
}

struct CacheCell(UnsafeCell<Cache>);

impl Drop for CacheCell {
    fn drop(&mut self) {
        // The thread exits: give its cached objects back to the heap.
        let c = self.0.get_mut();
        if c.generation != GENERATION.load(Ordering::Relaxed) {
            return;
        }
        for class in 0..CACHED {
            let n = c.len[class] as usize;
            c.len[class] = 0;
            free_slow(&c.slots[class][..n]);
        }
    }
}

/// Gives `objs` back to the DSM heap (ignored if no DSM runs any more).
fn free_slow(objs: &[usize]) {
    if objs.is_empty() {
        return;
    }
    let _rt = RuntimeGuard::enter();
    let _ = process::with(|d| {
        for &p in objs {
            // A failure here (a dead peer) is recorded by the DSM and
            // returned by its next operation; a destructor cannot report it.
            let _ = d.free(p as *mut u8);
        }
    });
}

/// Allocates from the DSM heap; null if that fails (no DSM, out of memory).
fn alloc_dsm(l: Layout) -> *mut u8 {
    if let Some(class) = cached_class(l) {
        // SAFETY: the cache is this thread's; nothing below re-enters it
        // while the reference lives (no allocation, no call out).
        let hit = CACHE.try_with(|c| unsafe {
            let c = &mut *c.0.get();
            c.sync_generation();
            let n = c.len[class] as usize;
            if n > 0 {
                c.len[class] -= 1;
                Some(c.slots[class][n - 1])
            } else {
                None
            }
        });
        match hit {
            Ok(Some(p)) => return p as *mut u8,
            Ok(None) => return refill(class),
            Err(_) => {}
        }
    }
    let _rt = RuntimeGuard::enter();
    process::with(|d| d.alloc(l.size(), l.align()))
        .ok()
        .and_then(Result::ok)
        .unwrap_or(core::ptr::null_mut())
}

/// Fetches a batch of class `class` from the heap: one for the caller, the
/// rest for the cache.
#[cold]
fn refill(class: usize) -> *mut u8 {
    let size = SIZE_CLASSES[class];
    let mut got = [0usize; BATCH];
    let n = {
        let _rt = RuntimeGuard::enter();
        process::with(|d| {
            let mut n = 0;
            while n < BATCH {
                match d.alloc(size, 16) {
                    Ok(p) => {
                        got[n] = p as usize;
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
            n
        })
        .unwrap_or(0)
    };
    if n == 0 {
        return core::ptr::null_mut();
    }
    // The thread may have moved to another OS thread while the heap
    // waited: this is the cache of the one it runs on now.
    let rest = &got[1..n];
    let overflow = CACHE
        .try_with(|c| {
            // SAFETY: this thread's cache; no re-entry while it is borrowed.
            let c = unsafe { &mut *c.0.get() };
            c.sync_generation();
            let have = c.len[class] as usize;
            let take = rest.len().min(CACHE_CAP - have);
            c.slots[class][have..have + take].copy_from_slice(&rest[..take]);
            c.len[class] += take as u8;
            take
        })
        .unwrap_or(0);
    free_slow(&rest[overflow..]);
    got[0] as *mut u8
}

/// Frees DSM object `p` of layout `l` (a DSM runs).
fn free_dsm(p: *mut u8, l: Layout) {
    let Some(class) = cached_class(l) else {
        return free_slow(&[p as usize]);
    };
    let mut flush = [0usize; BATCH];
    let cached = CACHE.try_with(|c| {
        // SAFETY: this thread's cache; no re-entry while it is borrowed.
        let c = unsafe { &mut *c.0.get() };
        c.sync_generation();
        let full = c.len[class] as usize == CACHE_CAP;
        if full {
            // The oldest half goes back to the heap.
            flush.copy_from_slice(&c.slots[class][..BATCH]);
            c.slots[class].copy_within(BATCH.., 0);
            c.len[class] -= BATCH as u8;
        }
        let n = c.len[class] as usize;
        c.slots[class][n] = p as usize;
        c.len[class] += 1;
        full
    });
    match cached {
        Ok(true) => free_slow(&flush),
        Ok(false) => {}
        // The thread is exiting and its cache is gone.
        Err(_) => free_slow(&[p as usize]),
    }
}

/// Reports why the DSM heap cannot serve `l` before the allocation fails
/// (the allocation error itself says nothing about the DSM).
#[cold]
fn report_exhausted(l: Layout) {
    // The message comes from the system heap: formatting it in DSM context
    // would ask the failing heap again, and again.
    let _rt = RuntimeGuard::enter();
    // Ask once more, to learn the reason (and give back what a retry got).
    let why = match process::with(|d| {
        d.alloc(l.size(), l.align()).map(|p| {
            let _ = d.free(p);
        })
    }) {
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
        Ok(Ok(())) => "it was exhausted for a moment".to_string(),
    };
    let msg = format!(
        "menps-dsm: the DSM heap cannot serve {} bytes: {why} (MENPS_DSM_HEAP_SIZE sets its size)\n",
        l.size()
    );
    // SAFETY: write(2) of a valid buffer to stderr.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// `malloc`'s half of the routing, for a runtime that interposes the C
/// heap (`malloc`, `calloc`, `posix_memalign` …) of a program whose code runs
/// on DSM stacks: `Some` (the object, or null if the DSM heap is exhausted,
/// with a message on stderr) when the running code gets DSM memory, exactly
/// when [`DsmAllocator`] would serve it from the DSM heap; `None` when the
/// caller must use the system allocator. `align` is a power of two.
#[inline]
pub fn c_alloc(size: usize, align: usize, zeroed: bool) -> Option<*mut u8> {
    if !(is_dsm_context() && process::is_running()) {
        return None;
    }
    // The cache's first use registers its destructor with libc, which
    // allocates — through the caller's `malloc`, back here: create it as
    // runtime code, whose allocations go to the system heap.
    if !CACHE_READY.with(Cell::get) {
        let _rt = RuntimeGuard::enter();
        let _ = CACHE.try_with(|_| ());
        CACHE_READY.with(|r| r.set(true));
    }
    let l = Layout::from_size_align(size.max(1), align.max(16)).ok()?;
    // SAFETY: a valid layout of non-zero size.
    Some(unsafe {
        if zeroed {
            DsmAllocator.alloc_zeroed(l)
        } else {
            DsmAllocator.alloc(l)
        }
    })
}

/// `free`'s half of the routing ([`c_alloc`]): frees `p` and returns `true`
/// if it is a DSM heap object (from any process; ignored once the DSM has
/// ended), returns `false` (and does nothing) for any other pointer, which
/// belongs to the system allocator.
///
/// # Safety
///
/// A DSM pointer must be the start of a live object of the DSM heap, not
/// used after this call by any process.
#[inline]
pub unsafe fn c_free(p: *mut u8) -> bool {
    if !is_dsm_pointer(p) {
        return false;
    }
    if process::is_running() {
        match c_usable_size(p) {
            Some(size) => free_dsm(
                p,
                Layout::from_size_align(size, 16).unwrap_or(Layout::new::<u8>()),
            ),
            // Not a live object: the heap's own check reports it.
            None => free_slow(&[p as usize]),
        }
    }
    true
}

/// The usable size of the DSM heap object at `p` (`malloc_usable_size`), or
/// `None` if `p` is not a live DSM heap object (or no DSM runs).
pub fn c_usable_size(p: *const u8) -> Option<usize> {
    if !is_dsm_pointer(p) {
        return None;
    }
    let _rt = RuntimeGuard::enter();
    process::with(|d| d.usable_size(p))
        .ok()
        .and_then(Result::ok)
}

/// The global allocator: DSM heap for DSM code, the system allocator
/// otherwise (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, Default)]
pub struct DsmAllocator;

// SAFETY: every pointer handed out is either the system allocator's (for
// the layout asked) or a DSM heap object of at least `layout.size()` bytes
// aligned to `layout.align()` (the heap's size classes are multiples of 16
// and aligned to their largest power-of-two divisor; larger alignments take
// the heap's aligned path); `dealloc` and `realloc` route a pointer by where
// it lies, so each allocator only ever frees its own memory.
unsafe impl GlobalAlloc for DsmAllocator {
    #[inline]
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if is_dsm_context() && process::is_running() {
            let p = alloc_dsm(l);
            if p.is_null() {
                report_exhausted(l);
            }
            return p;
        }
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if is_dsm_context() && process::is_running() {
            if cached_class(l).is_none() {
                // A large object: the heap skips zeroing memory that was
                // never used (still zero everywhere), which saves a write
                // fault per page.
                let _rt = RuntimeGuard::enter();
                let p = process::with(|d| d.alloc_zeroed(l.size(), l.align()))
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(core::ptr::null_mut());
                if p.is_null() {
                    report_exhausted(l);
                }
                return p;
            }
            let p = alloc_dsm(l);
            if p.is_null() {
                report_exhausted(l);
            } else {
                // SAFETY: a fresh object of at least `l.size()` bytes.
                unsafe { core::ptr::write_bytes(p, 0, l.size()) };
            }
            return p;
        }
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if is_dsm_pointer(p) {
            // Objects of a DSM that ended are left alone.
            if process::is_running() {
                free_dsm(p, l);
            }
        } else {
            // SAFETY: a system pointer of layout `l` (forwarded contract).
            unsafe { System.dealloc(p, l) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let dsm_here = is_dsm_context() && process::is_running();
        if is_dsm_pointer(p) == dsm_here {
            if !dsm_here {
                // SAFETY: a system pointer of layout `l` (forwarded contract).
                return unsafe { System.realloc(p, l, new_size) };
            }
            // Stays in the same class: nothing to move.
            if let (Some(a), Ok(nl)) = (
                cached_class(l),
                Layout::from_size_align(new_size, l.align()),
            ) && cached_class(nl) == Some(a)
            {
                return p;
            }
        }
        // Across the boundary (or to another DSM size): allocate where this
        // thread allocates, copy, free where the old object lives.
        // SAFETY: the caller guarantees a valid layout for `new_size`.
        let nl = unsafe { Layout::from_size_align_unchecked(new_size, l.align()) };
        // SAFETY: `nl` has a non-zero size (the caller's contract).
        let q = unsafe { self.alloc(nl) };
        if !q.is_null() {
            // SAFETY: both objects are at least `min(old, new)` bytes and
            // distinct; `p` is freed with its own layout.
            unsafe {
                core::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                self.dealloc(p, l);
            }
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsm::heap::SIZE_CLASSES;

    #[test]
    fn class_table_matches_the_heap() {
        for size in 1..=MAX_CACHED {
            let l = Layout::from_size_align(size, 8).unwrap();
            let c = cached_class(l).unwrap();
            assert!(SIZE_CLASSES[c] >= size);
            assert!(c == 0 || SIZE_CLASSES[c - 1] < size, "{size}");
        }
        assert_eq!(
            cached_class(Layout::from_size_align(MAX_CACHED + 1, 8).unwrap()),
            None
        );
        assert_eq!(cached_class(Layout::from_size_align(64, 32).unwrap()), None);
    }

    #[test]
    fn contexts_and_pointers() {
        assert!(!is_dsm_context(), "an ordinary test thread");
        assert!(in_dsm_context(is_dsm_context));
        assert!(!is_dsm_context());
        in_dsm_context(|| {
            let _rt = RuntimeGuard::enter();
            assert!(!is_dsm_context(), "runtime code never gets DSM memory");
        });
        assert!(is_dsm_pointer(HEAP_LO as *const u8));
        assert!(!is_dsm_pointer(STACKS_LO as *const u8));
        let b = Box::new(1u8);
        assert!(!is_dsm_pointer(&*b));
    }

    #[test]
    fn without_a_dsm_everything_is_system_memory() {
        // No DSM runs in the unit-test process: DSM context falls back.
        let v = in_dsm_context(|| vec![7u64; 100]);
        assert!(!is_dsm_pointer(v.as_ptr().cast()));
        let p = in_dsm_context(|| {
            // SAFETY: a valid non-zero layout; freed below.
            unsafe { DsmAllocator.alloc(Layout::from_size_align(24, 8).unwrap()) }
        });
        assert!(!p.is_null() && !is_dsm_pointer(p));
        // SAFETY: allocated above with this layout.
        unsafe { DsmAllocator.dealloc(p, Layout::from_size_align(24, 8).unwrap()) };
    }
}
