//! The program's own OS threads: `pthread_create`, watched.
//!
//! Every thread of an OpenMP program — `main`, team threads, tasks — is a
//! user-level thread of the runtime. In a job of several processes with
//! one worker per process, all of the program's code then runs on that one
//! OS thread, and the DSM may merge other processes' changes into the
//! blocks it keeps writable for the program with plain stores instead of
//! atomic ones ([`Dsm::set_single_writer_thread`]): no store of the
//! program can land while the worker is busy merging.
//!
//! A program may start OS threads of its own all the same. The library
//! therefore stands in for `pthread_create`: a call from the program (not
//! from the runtime, which starts its workers and carriers inside a
//! [`RuntimeGuard`]) turns that promise off for good before the thread
//! exists, so the DSM goes back to atomic merges; the call itself goes on
//! to libc's `pthread_create` unchanged.
//!
//! [`Dsm::set_single_writer_thread`]: menps_dsm::dsm::Dsm::set_single_writer_thread

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use menps_dsm::dsm::allocator::{RuntimeGuard, in_runtime_code};

use crate::die;

/// Set once the program started an OS thread of its own.
static PROGRAM_THREADS: AtomicBool = AtomicBool::new(false);

/// libc's `pthread_create`.
type Create = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;

/// Whether the program has started no OS thread of its own so far (the
/// runtime's start hook, see `StartHooks::no_program_threads`).
pub(crate) fn no_program_threads() -> bool {
    !PROGRAM_THREADS.load(Ordering::SeqCst)
}

/// `pthread_create`: libc's, after noting a thread the program starts
/// itself (see the [module docs](self)).
///
/// # Safety
///
/// libc's `pthread_create` contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    if !in_runtime_code() && !PROGRAM_THREADS.swap(true, Ordering::SeqCst) {
        // Before the thread exists: the DSM merges atomically from now on.
        // No merge is in progress, the program's only thread being here.
        if let Some(rt) = menps_omp::internals::runtime() {
            rt.dsm.set_single_writer_thread(false);
        }
    }
    static REAL: OnceLock<usize> = OnceLock::new();
    let real = *REAL.get_or_init(|| {
        let _rt = RuntimeGuard::enter();
        crate::start::next_symbol(c"pthread_create") as usize
    });
    if real == 0 {
        die("cannot find libc's pthread_create");
    }
    // SAFETY: libc's `pthread_create`, found by `dlsym`, with the caller's
    // arguments.
    unsafe { core::mem::transmute::<usize, Create>(real)(thread, attr, start, arg) }
}
