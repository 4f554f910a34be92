//! Resolving DSM misses from the `SIGSEGV` handler, on the faulting thread's
//! own stack.
//!
//! ct-context owns the process's `SIGSEGV` handler. It runs on the
//! alternate signal stack (so a user-level thread's stack overflow can be
//! reported) and offers every fault to the registered hooks first; ours
//! claims faults inside a live DSM segment. Resolving a miss is ordinary
//! runtime code: it takes locks, communicates and may park the faulting
//! user-level thread, which may then resume on another OS thread. None of
//! that is possible on the per-OS-thread alternate stack, so the hook
//! (design: `architecture.md`, "One SIGSEGV handler, two needs"):
//!
//! 1. copies the kernel's signal frame — the kernel part of the `ucontext`
//!    and the extended FPU state it points to (its size is in the FPU area's
//!    software-reserved bytes) — onto the faulting thread's stack, below its
//!    128-byte red zone, and points the copy's FPU pointer at the copied
//!    area (64-byte aligned);
//! 2. switches to that stack and calls the resolver there;
//! 3. when the resolver returns, writes the *current* OS thread's signal
//!    mask and alternate-stack settings into the copied frame (the thread
//!    may have migrated) and issues `rt_sigreturn` with the stack pointer at
//!    the copy, which restores every register, the flags, the FPU state and
//!    the exact stack pointer, so the faulting instruction runs again.
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
    /// Whether `addr` is inside a live segment (called in the signal
    /// handler: must be async-signal-safe — lock-free reads only).
    fn owns(&self, addr: usize) -> bool;
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

/// Bytes of the kernel's `struct ucontext` that `rt_sigreturn` reads:
/// everything up to and including the 8-byte kernel signal mask.
const KERNEL_UC_BYTES: usize = core::mem::offset_of!(libc::ucontext_t, uc_sigmask) + 8;
/// Magic of an extended (xsave) FPU frame, at offset 464 of the FPU area.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
/// Size of the legacy (fxsave) FPU area.
const FXSAVE_BYTES: usize = 512;
/// Bytes below the faulting stack pointer the compiled code may use.
const RED_ZONE: usize = 128;

/// What the resolver needs, placed on the faulting stack next to the
/// copied frame.
#[repr(C)]
struct FaultCall {
    addr: usize,
    write: bool,
    /// The copied `ucontext` (where `rt_sigreturn` starts).
    uc: *mut libc::ucontext_t,
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
    let uc = uctx as *mut libc::ucontext_t;
    // SAFETY: `uc` is the kernel's ucontext of this signal; gregs is an
    // array of 23 registers.
    let (fault_sp, err) = unsafe {
        let g = &(*uc).uc_mcontext.gregs;
        (
            g[libc::REG_RSP as usize] as usize,
            g[libc::REG_ERR as usize] as u64,
        )
    };
    let write = err & 2 != 0;

    // Where the copy goes: below the red zone of the faulting stack when
    // this handler runs on the alternate stack; below this handler's own
    // frame if the kernel delivered the signal on the faulting stack itself
    // (a thread without an alternate stack).
    let here = &addr as *const usize as usize;
    // SAFETY: querying the alternate stack is async-signal-safe.
    let ss = unsafe {
        let mut ss: libc::stack_t = core::mem::zeroed();
        libc::sigaltstack(core::ptr::null(), &mut ss);
        ss
    };
    let on_alt = ss.ss_flags & libc::SS_ONSTACK != 0;
    let alt = ss.ss_sp as usize..ss.ss_sp as usize + ss.ss_size;
    if on_alt && alt.contains(&fault_sp) {
        write_stderr(
            b"menps-dsm: fatal: DSM access from a signal handler running on the alternate \
              signal stack\n",
        );
        return false;
    }
    let top = if on_alt {
        fault_sp - RED_ZONE
    } else {
        (fault_sp - RED_ZONE).min(here - 4096)
    };
    // SAFETY: `uc` and the FPU area it points to are the kernel's frame,
    // readable; the destination lies below everything live on the faulting
    // stack (red zone or this handler's frame), inside the stack's mapping
    // as long as the stack has room (as for any function call).
    unsafe {
        let fp = (*uc).uc_mcontext.fpregs as *const u8;
        let fp_bytes = if fp.is_null() {
            0
        } else {
            let magic = core::ptr::read_unaligned(fp.add(464).cast::<u32>());
            if magic == FP_XSTATE_MAGIC1 {
                core::ptr::read_unaligned(fp.add(468).cast::<u32>()) as usize
            } else {
                FXSAVE_BYTES
            }
        };
        let fp_dst = (top - fp_bytes) & !63;
        let uc_dst = (fp_dst - core::mem::size_of::<libc::ucontext_t>()) & !15;
        let call_dst = (uc_dst - core::mem::size_of::<FaultCall>()) & !15;
        let sp = (call_dst - 64) & !15;
        if fp_bytes != 0 {
            core::ptr::copy_nonoverlapping(fp, fp_dst as *mut u8, fp_bytes);
        }
        core::ptr::copy_nonoverlapping(uc as *const u8, uc_dst as *mut u8, KERNEL_UC_BYTES);
        let ucd = uc_dst as *mut libc::ucontext_t;
        (*ucd).uc_mcontext.fpregs = if fp_bytes == 0 {
            core::ptr::null_mut()
        } else {
            fp_dst as *mut libc::_libc_fpstate
        };
        let call = call_dst as *mut FaultCall;
        call.write(FaultCall {
            addr,
            write,
            uc: ucd,
        });
        switch_and_sigreturn(sp, call, resolve_entry);
    }
}

/// Runs on the faulting stack: resolves, fixes up the copied frame for the
/// current OS thread and returns the address `rt_sigreturn` needs.
unsafe extern "C" fn resolve_entry(call: *mut FaultCall) -> usize {
    // SAFETY: `call` was written by `hook` just below the copied frame.
    let FaultCall { addr, write, uc } = unsafe { call.read() };
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
    // SAFETY: querying the current thread's mask and alternate stack into
    // the copied frame, which nobody else uses.
    unsafe {
        let mut mask: libc::sigset_t = core::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, core::ptr::null(), &mut mask);
        core::ptr::copy_nonoverlapping(
            (&mask as *const libc::sigset_t).cast::<u8>(),
            (&raw mut (*uc).uc_sigmask).cast::<u8>(),
            8,
        );
        let mut ss: libc::stack_t = core::mem::zeroed();
        if libc::sigaltstack(core::ptr::null(), &mut ss) == 0 {
            ss.ss_flags &= !libc::SS_ONSTACK;
            (*uc).uc_stack = ss;
        }
    }
    uc as usize
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

/// Switches the stack pointer to `sp` (16-byte aligned), calls `f(call)`,
/// then sets the stack pointer to the `ucontext` address `f` returned and
/// issues `rt_sigreturn`.
///
/// # Safety
/// `sp` must be a 16-byte aligned address with enough stack below it, and
/// `f` must return the address of a valid copied signal frame.
#[unsafe(naked)]
unsafe extern "C" fn switch_and_sigreturn(
    sp: usize,
    call: *mut FaultCall,
    f: unsafe extern "C" fn(*mut FaultCall) -> usize,
) -> ! {
    core::arch::naked_asm!(
        "mov rsp, rdi",
        "mov rdi, rsi",
        // A zero return address ends backtraces here.
        "push 0",
        "push 0",
        "call rdx",
        "mov rsp, rax",
        "mov eax, 15", // SYS_rt_sigreturn
        "syscall",
        "ud2",
    )
}
