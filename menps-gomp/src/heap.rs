//! The C heap in the DSM: `malloc`, `calloc`, `realloc`, `free`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`,
//! `malloc_usable_size`, replacing libc's for the whole process.
//!
//! In a job of several processes, memory that the program's own threads
//! allocate — `main` and team threads and tasks, which run on DSM call
//! stacks — comes from the DSM heap, at an address valid in every process;
//! everything else (the runtime, libc before `main`, threads the program
//! creates itself) gets libc's memory, as does everything in a job of one
//! process. `free` and `realloc` follow the pointer: DSM memory goes back
//! to the DSM heap from any thread of any process, other memory to libc.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering};

use menps_dsm::dsm::allocator::{c_alloc, c_free, c_usable_size, is_dsm_pointer};

unsafe extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// Whether allocations of DSM code go to the DSM heap.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Starts serving DSM code from the DSM heap (a job of several processes).
pub(crate) fn activate() {
    ACTIVE.store(true, Ordering::Release);
}

/// Runtime code that may allocate, when the C heap routes allocations to
/// the DSM (several processes): a [`RuntimeGuard`] keeps them in the
/// private heap. With one process nothing reaches the DSM heap, and the
/// guard (a few thread-local accesses) is skipped.
#[inline]
pub(crate) fn private_allocations() -> Option<menps_dsm::dsm::allocator::RuntimeGuard> {
    ACTIVE
        .load(Ordering::Relaxed)
        .then(menps_dsm::dsm::allocator::RuntimeGuard::enter)
}

/// Stops it (the DSM ends).
pub(crate) fn deactivate() {
    ACTIVE.store(false, Ordering::Release);
}

/// The DSM heap's object for the running code, if it gets one.
#[inline]
fn dsm_alloc(size: usize, align: usize, zeroed: bool) -> Option<*mut c_void> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    let p = c_alloc(size, align, zeroed)?;
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    Some(p.cast())
}

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// `malloc`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    match dsm_alloc(size, 16, false) {
        Some(p) => p,
        // SAFETY: libc's allocator.
        None => unsafe { __libc_malloc(size) },
    }
}

/// `calloc`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return core::ptr::null_mut();
    };
    match dsm_alloc(total, 16, true) {
        Some(p) => p,
        // SAFETY: libc's allocator.
        None => unsafe { __libc_calloc(n, size) },
    }
}

/// `free`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller frees a live object it owns.
    if unsafe { c_free(p.cast()) } {
        return;
    }
    // SAFETY: not DSM memory, so libc's.
    unsafe { __libc_free(p) }
}

/// `realloc`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: as malloc.
        return unsafe { malloc(size) };
    }
    if size == 0 {
        // SAFETY: as free.
        unsafe { free(p) };
        return core::ptr::null_mut();
    }
    let in_dsm = is_dsm_pointer(p.cast());
    if !in_dsm && !ACTIVE.load(Ordering::Relaxed) {
        // SAFETY: libc's object.
        return unsafe { __libc_realloc(p, size) };
    }
    let old = if in_dsm {
        match c_usable_size(p.cast()) {
            Some(n) => n,
            None => crate::die(format_args!(
                "realloc({p:p}): not a live object of the DSM heap"
            )),
        }
    } else {
        // SAFETY: libc's object.
        unsafe { libc::malloc_usable_size(p) }
    };
    // SAFETY: as malloc.
    let q = match dsm_alloc(size, 16, false) {
        Some(q) => q,
        None if !in_dsm => {
            // SAFETY: libc's object, staying with libc.
            return unsafe { __libc_realloc(p, size) };
        }
        // SAFETY: libc's allocator.
        None => unsafe { __libc_malloc(size) },
    };
    if q.is_null() {
        return q;
    }
    // SAFETY: both objects hold at least `min(old, size)` bytes; the old one
    // is freed where it lives.
    unsafe {
        core::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size));
        free(p);
    }
    q
}

/// `reallocarray`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as realloc.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            set_errno(libc::ENOMEM);
            core::ptr::null_mut()
        }
    }
}

/// An aligned allocation (`align` a power of two).
fn aligned(align: usize, size: usize) -> *mut c_void {
    match dsm_alloc(size, align, false) {
        Some(p) => p,
        // SAFETY: libc's allocator.
        None => unsafe { __libc_memalign(align, size) },
    }
}

/// `posix_memalign`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(size_of::<usize>()) {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid place for the pointer.
    unsafe { *out = p };
    0
}

/// `aligned_alloc`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    aligned(align, size)
}

/// `memalign`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: as aligned_alloc.
    unsafe { aligned_alloc(align.max(1).next_power_of_two(), size) }
}

/// `valloc`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(4096, size)
}

/// `pvalloc`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(4096, size.next_multiple_of(4096).max(4096))
}

/// `malloc_usable_size`.
///
/// # Safety
///
/// As libc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if is_dsm_pointer(p.cast()) {
        return c_usable_size(p.cast()).unwrap_or(0);
    }
    type Usable = unsafe extern "C" fn(*mut c_void) -> usize;
    static REAL: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) } as usize;
        REAL.store(f, Ordering::Relaxed);
    }
    if f == 0 {
        return 0;
    }
    // SAFETY: libc's function of this signature.
    unsafe { core::mem::transmute::<usize, Usable>(f)(p) }
}

/// `omp_alloc`: OpenMP's allocators all serve from the C heap above.
///
/// # Safety
///
/// As libc's `malloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_alloc(size: usize, _allocator: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { malloc(size) }
}

/// `omp_aligned_alloc`.
///
/// # Safety
///
/// As libc's `aligned_alloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_aligned_alloc(
    align: usize,
    size: usize,
    _allocator: usize,
) -> *mut c_void {
    aligned(align.max(16).next_power_of_two(), size)
}

/// `omp_calloc`.
///
/// # Safety
///
/// As libc's `calloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_calloc(n: usize, size: usize, _allocator: usize) -> *mut c_void {
    // SAFETY: as calloc.
    unsafe { calloc(n, size) }
}

/// `omp_aligned_calloc`.
///
/// # Safety
///
/// As libc's `calloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_aligned_calloc(
    align: usize,
    n: usize,
    size: usize,
    _allocator: usize,
) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        return core::ptr::null_mut();
    };
    let p = aligned(align.max(16).next_power_of_two(), total);
    if !p.is_null() {
        // SAFETY: a fresh object of `total` bytes.
        unsafe { core::ptr::write_bytes(p.cast::<u8>(), 0, total) };
    }
    p
}

/// `omp_realloc`.
///
/// # Safety
///
/// As libc's `realloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_realloc(
    p: *mut c_void,
    size: usize,
    _to: usize,
    _from: usize,
) -> *mut c_void {
    // SAFETY: as realloc.
    unsafe { realloc(p, size) }
}

/// `omp_free`.
///
/// # Safety
///
/// As libc's `free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_free(p: *mut c_void, _allocator: usize) {
    // SAFETY: as free.
    unsafe { free(p) }
}

/// `GOMP_alloc` (the `allocate` directive).
///
/// # Safety
///
/// As libc's `aligned_alloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GOMP_alloc(align: usize, size: usize, _allocator: usize) -> *mut c_void {
    aligned(align.max(16).next_power_of_two(), size)
}

/// `GOMP_free`.
///
/// # Safety
///
/// As libc's `free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GOMP_free(p: *mut c_void, _allocator: usize) {
    // SAFETY: as free.
    unsafe { free(p) }
}

/// `omp_get_default_allocator`: `omp_default_mem_alloc`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_default_allocator() -> usize {
    1
}

/// `omp_set_default_allocator`: every allocator is the C heap.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_default_allocator(_allocator: usize) {}
