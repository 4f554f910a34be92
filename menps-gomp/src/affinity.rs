//! The initial thread's processors, kept from libgomp's start-up.
//!
//! A program built with `gcc -fopenmp` loads the system libgomp too (it
//! is one of the executable's libraries; this library only comes first).
//! libgomp's start-up runs before ours and, with `OMP_PROC_BIND` set, binds
//! the initial thread to the first place. Every thread our runtime starts
//! would inherit that one processor. So the library provides
//! `pthread_setaffinity_np`, which libgomp calls for that: before our
//! runtime starts, it notes the initial thread's processors, then passes
//! the call on to libc; when the program starts (our `__libc_start_main`),
//! the initial thread gets those processors back. (Our runtime binds its
//! own workers, as `OMP_PROC_BIND` asks.)

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::start::next_symbol;

/// Whether the program started (set by [`restore_initial_thread`]): calls
/// after that are the program's own and are only passed on.
static STARTED: AtomicBool = AtomicBool::new(false);

/// The initial thread's processors before the first call that changed
/// them.
static INITIAL: OnceLock<libc::cpu_set_t> = OnceLock::new();

type SetAffinity = unsafe extern "C" fn(libc::pthread_t, usize, *const libc::cpu_set_t) -> c_int;

/// `pthread_setaffinity_np`: notes the initial thread's processors first,
/// before the program starts, then libc's.
///
/// # Safety
///
/// As libc's `pthread_setaffinity_np`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pthread_setaffinity_np(
    thread: libc::pthread_t,
    size: usize,
    set: *const libc::cpu_set_t,
) -> c_int {
    // SAFETY: no arguments.
    let initial = unsafe { libc::gettid() == libc::getpid() };
    if initial && !STARTED.load(Ordering::Relaxed) && INITIAL.get().is_none() {
        // SAFETY: an all-zero set is the empty set.
        let mut mask: libc::cpu_set_t = unsafe { core::mem::zeroed() };
        // SAFETY: `mask` is writable and of the size passed; 0 is the
        // calling thread.
        let r = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut mask) };
        if r == 0 {
            let _ = INITIAL.set(mask);
        }
    }
    let real = next_symbol(c"pthread_setaffinity_np");
    if real.is_null() {
        return libc::ENOSYS;
    }
    // SAFETY: libc's function of this signature.
    let real: SetAffinity = unsafe { core::mem::transmute::<*mut c_void, SetAffinity>(real) };
    // SAFETY: forwarded arguments.
    unsafe { real(thread, size, set) }
}

/// At the program's start, on the initial thread: gives it back the
/// processors it had before libgomp's start-up bound it (if it did), so
/// that the runtime's threads may run on all of them.
pub(crate) fn restore_initial_thread() {
    STARTED.store(true, Ordering::Relaxed);
    if let Some(mask) = INITIAL.get() {
        // SAFETY: a valid set of the size passed; 0 is this (the initial)
        // thread. A failure leaves the thread as libgomp bound it.
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), mask) };
    }
}
