//! Resolving DSM misses from the `SIGSEGV` handler, on the faulting thread's
//! own stack.
//!
//! ct-context owns the process's `SIGSEGV` handler. It runs on the
//! alternate signal stack (so a user-level thread's stack overflow can be
//! reported) and offers every fault to the registered hooks first; ours
//! claims faults inside a live DSM segment. Resolving a miss is ordinary
//! runtime code: it takes locks, communicates and may park the faulting
//! user-level thread, which may then resume on another OS thread. None of
//! that is possible on the per-OS-thread alternate stack, so the hook hands
//! the resolution to [`ct_context::trap::run_on_interrupted_stack`] (design:
//! `architecture.md`, "One SIGSEGV handler, two needs"), which
//!
//! 1. copies the kernel's signal frame onto the faulting thread's stack,
//!    below its red zone;
//! 2. switches to that stack and calls the resolver there;
//! 3. when the resolver returns, writes the *current* OS thread's signal
//!    mask and alternate-stack settings into the copied frame (the thread
//!    may have migrated) and issues `rt_sigreturn`, which restores every
//!    register, the flags, the FPU state and the exact stack pointer, so the
//!    faulting instruction runs again.
//!
//! The handler is installed with `SA_NODEFER` (by ct-context), so faults of
//! other threads resolved meanwhile on the same OS thread are handled too.
//!
//! If resolution fails (a peer died, a data race was found), the faulting
//! access cannot complete: the process prints the error and exits (status
//! 1 for communication failures, abort for races and internal errors).

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::cell::Cell;

use super::error::{DsmError, DsmResult};

/// What the hook needs from the DSM.
pub trait FaultResolver: Sync {
    /// Whether `addr` is inside a live segment, and not in a guard block
    /// (called in the signal handler: must be async-signal-safe — lock-free
    /// reads only).
    fn owns(&self, addr: usize) -> bool;
    /// Whether `addr` is in the guard block below a DSM call stack
    /// (async-signal-safe).
    fn is_stack_guard(&self, addr: usize) -> bool;
    /// Makes `addr` readable (and writable if `write`).
    fn resolve(&self, addr: usize, write: bool) -> DsmResult<()>;
}

/// The registered resolver: a thin pointer to a leaked fat reference.
static RESOLVER: AtomicPtr<&'static dyn FaultResolver> = AtomicPtr::new(core::ptr::null_mut());

/// Number of faults resolved by this process (statistics).
static FAULTS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// > 0: DSM fault handling is disabled on this OS thread.
    static DISABLED: Cell<u32> = const { Cell::new(0) };
}

/// Registers the resolver and the hook. Fails if one is registered already.
pub(crate) fn register(r: &'static dyn FaultResolver) -> DsmResult<()> {
    let boxed = Box::into_raw(Box::new(r));
    if RESOLVER
        .compare_exchange(
            core::ptr::null_mut(),
            boxed,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // SAFETY: `boxed` came from Box::into_raw above and was not published.
        drop(unsafe { Box::from_raw(boxed) });
        return Err(DsmError::Misuse(
            "a DSM is already active in this process (one per process)".into(),
        ));
    }
    // SAFETY: `hook` only claims faults inside live segments of the
    // registered resolver and resolves them as described in the module docs.
    if unsafe { ct_context::trap::add_fault_hook(hook) }.is_err() {
        unregister();
        return Err(DsmError::Misuse(
            "the SIGSEGV hook table of ct-context is full".into(),
        ));
    }
    Ok(())
}

/// Unregisters the hook and the resolver. No fault may be in resolution.
pub(crate) fn unregister() {
    ct_context::trap::remove_fault_hook(hook);
    let p = RESOLVER.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !p.is_null() {
        // SAFETY: `p` came from Box::into_raw in `register`; the hook no
        // longer sees it (it was swapped out), and the caller guarantees no
        // resolution is running.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Number of DSM faults resolved so far in this process.
pub fn fault_count() -> usize {
    FAULTS.load(Ordering::Relaxed)
}

/// Disables DSM fault handling on the calling OS thread until the matching
/// [`enable_on_this_thread`]: an access to a protected DSM block then
/// crashes the process with a message instead of being resolved. Nests.
pub fn disable_on_this_thread() {
    DISABLED.with(|d| d.set(d.get() + 1));
}

/// Undoes one [`disable_on_this_thread`].
pub fn enable_on_this_thread() {
    DISABLED.with(|d| d.set(d.get().saturating_sub(1)));
}

/// Whether DSM fault handling is enabled on the calling OS thread.
pub fn is_enabled_on_this_thread() -> bool {
    DISABLED.with(|d| d.get() == 0)
}

/// Writes `msg` to stderr (async-signal-safe).
fn write_stderr(msg: &[u8]) {
    // SAFETY: write(2) on fd 2 with a valid buffer is async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// The `SIGSEGV` hook (runs on the alternate signal stack).
unsafe fn hook(_sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) -> bool {
    let r = RESOLVER.load(Ordering::Acquire);
    if r.is_null() {
        return false;
    }
    // SAFETY: a registered resolver stays valid until `unregister`, which
    // the DSM calls only when no access can fault any more.
    let resolver: &'static dyn FaultResolver = unsafe { *r };
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if !resolver.owns(addr) {
        if resolver.is_stack_guard(addr) {
            let mut buf = [0u8; 256];
            let mut w = ct_context::trap::BufWriter::new(&mut buf);
            w.put(b"stack overflow in user-level thread: access to ");
            w.hex(addr);
            w.put(b", in the guard block below a DSM call stack (raise MENPS_DSM_STACK_SIZE)");
            if !uctx.is_null() {
                // SAFETY: the kernel passes a valid ucontext for SA_SIGINFO
                // handlers; reading two saved registers.
                let (ip, sp) = unsafe {
                    let g = &(*uctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs;
                    (g[libc::REG_RIP as usize], g[libc::REG_RSP as usize])
                };
                w.put(b"; instruction ");
                w.hex(ip as usize);
                w.put(b", stack pointer ");
                w.hex(sp as usize);
            }
            w.put(b"\n");
            w.write_to_stderr();
            std::process::abort();
        }
        if super::layout::in_dsm_range(addr) {
            let mut buf = [0u8; 128];
            let mut w = ct_context::trap::BufWriter::new(&mut buf);
            w.put(b"menps-dsm: segmentation fault at ");
            w.hex(addr);
            w.put(b", inside the DSM range but in no segment\n");
            w.write_to_stderr();
        }
        return false;
    }
    if !is_enabled_on_this_thread() {
        write_stderr(
            b"menps-dsm: fatal: access to a protected DSM block from a thread with DSM fault \
              handling disabled (disable_on_this_thread)\n",
        );
        return false;
    }
    // SAFETY: `uctx` is the kernel's context of this SIGSEGV, whose handler
    // is running.
    let write = unsafe { ct_context::trap::fault_is_write(uctx) };
    // Returns only if the faulting code runs on the alternate stack.
    // SAFETY: `uctx` is this handler's, unchanged; the faulting stack has
    // room for the copied frame and the resolver as long as it has room for
    // a call made at the faulting access; the hook and the handler hold
    // nothing that needs dropping; code run by the DSM's user-level threads
    // is migration-safe.
    let ct_context::trap::InterruptedOnAltStack = unsafe {
        ct_context::trap::run_on_interrupted_stack(uctx, move || {
            resolve_on_faulting_stack(addr, write)
        })
    };
    write_stderr(
        b"menps-dsm: fatal: DSM access from a signal handler running on the alternate \
          signal stack\n",
    );
    false
}

/// Runs on the faulting stack: resolves the miss (or ends the process).
///
/// The interrupted code's `errno` is kept: resolving makes system calls
/// (`mprotect`, futex waits …) that may set it, and the program may be
/// between a failing call and its look at `errno`. The value is written back
/// through the location of the thread that finishes the fault (a user-level
/// thread may resume on another OS thread).
fn resolve_on_faulting_stack(addr: usize, write: bool) {
    // SAFETY: the calling thread's errno.
    let saved_errno = unsafe { *libc::__errno_location() };
    let r = RESOLVER.load(Ordering::Acquire);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: as in `hook`: the resolver outlives every fault.
        let resolver: &'static dyn FaultResolver = unsafe { *r };
        resolver.resolve(addr, write)
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => fail(addr, &e),
        Err(_) => {
            write_stderr(b"menps-dsm: fatal: panic while resolving a DSM fault\n");
            std::process::abort();
        }
    }
    FAULTS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = saved_errno };
}

fn fail(addr: usize, e: &DsmError) -> ! {
    eprintln!("menps-dsm: fatal: cannot resolve the access to {addr:#x}: {e}");
    match e {
        DsmError::Com(_) => {
            // SAFETY: ends the process without running destructors that
            // could wait for the dead peer.
            unsafe { libc::_exit(1) }
        }
        _ => std::process::abort(),
    }
}
