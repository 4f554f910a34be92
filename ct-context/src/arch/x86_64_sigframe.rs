//! Leaving a signal handler onto the interrupted thread's own stack, and
//! resuming the interrupted code from a relocated copy of its signal frame
//! (x86-64 Linux).
//!
//! The kernel delivers a signal by pushing a frame — `struct ucontext`
//! followed (elsewhere in the frame) by the saved FPU/vector state it points
//! to — and the handler returns through `rt_sigreturn`, which reloads every
//! register, the flags, the FPU state, the stack pointer, the signal mask and
//! the alternate-stack settings from that frame. [`run_on_interrupted_stack`]
//! moves that frame somewhere durable:
//!
//! ```text
//!  interrupted rsp ->  +----------------------------+  (interrupted code's data)
//!                      | red zone (128 bytes)       |
//!                      +----------------------------+  top
//!                      | FPU/xsave area (64-aligned)|  copied, `extended_size` bytes
//!                      +----------------------------+
//!                      | ucontext (16-aligned)      |  copied up to `uc_sigmask`;
//!                      +----------------------------+  its FPU pointer is redirected
//!                      | closure + ucontext pointer |
//!                      +----------------------------+
//!                      | 64 bytes of slack          |
//!        switch rsp -> +----------------------------+
//!                      | frames of the closure ...  |
//! ```
//!
//! The size of the FPU area is the `extended_size` word of its
//! software-reserved bytes (offset 464) when they carry `FP_XSTATE_MAGIC1`
//! (an xsave frame, whose trailing `FP_XSTATE_MAGIC2` is included), and the
//! 512 bytes of a legacy fxsave area otherwise. The kernel reads the area
//! with `xrstor`, so the copy is 64-byte aligned.
//!
//! If the handler itself runs on the interrupted stack (the thread has no
//! alternate stack), the kernel's frame and the handler's frames lie below
//! the interrupted stack pointer: the copy then goes at least a page below
//! the frame of [`run_on_interrupted_stack`], clear of it and of the calls it
//! still makes before switching.

use core::arch::naked_asm;
use core::mem::{align_of, offset_of, size_of};

/// Bytes of the kernel's `struct ucontext` that `rt_sigreturn` reads:
/// everything up to and including the 8-byte kernel signal mask (glibc's
/// `ucontext_t` shares this prefix and continues with a larger mask and an
/// FPU area of its own, which the kernel does not use).
const KERNEL_UC_BYTES: usize = offset_of!(libc::ucontext_t, uc_sigmask) + 8;
/// Offset of the software-reserved bytes (`struct _fpx_sw_bytes`) in the
/// FPU area.
const SW_RESERVED: usize = 464;
/// Magic of an extended (xsave) FPU frame, first word of the
/// software-reserved bytes; the second word is the frame's size.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
/// Size of the legacy (fxsave) FPU area.
const FXSAVE_BYTES: usize = 512;
/// Alignment `xrstor` requires of the FPU area.
const XSAVE_ALIGN: usize = 64;
/// Bytes below the interrupted stack pointer the compiled code may use.
const RED_ZONE: usize = 128;
/// Distance kept below this module's own frame when the handler runs on the
/// interrupted stack.
const HANDLER_GAP: usize = 4096;

/// Why [`run_on_interrupted_stack`] could not run its function: the
/// interrupted code was itself running on the current alternate signal stack
/// (it is a signal handler, or code called from one), so its stack is the
/// one this handler runs on, and nothing can be placed below it that would
/// outlive this handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the interrupted code was running on the alternate signal stack")]
pub struct InterruptedOnAltStack;

/// What the function run on the interrupted stack needs, placed just below
/// the copied `ucontext`.
#[repr(C)]
struct Call<F> {
    /// The copied `ucontext` (where `rt_sigreturn` starts).
    uc: *mut libc::ucontext_t,
    f: F,
}

/// Whether the fault described by `uctx` was a write: bit 1 of the
/// page-fault error code the kernel stores in the context of a `SIGSEGV`.
///
/// # Safety
///
/// `uctx` must be the third argument of an `SA_SIGINFO` handler of
/// `SIGSEGV` (a hook's `uctx`) that is still running.
pub unsafe fn fault_is_write(uctx: *const libc::c_void) -> bool {
    // SAFETY: per the contract `uctx` is the kernel's `ucontext` of a live
    // signal; `gregs` has `NGREG` (23) entries and `REG_ERR` is one of them.
    let err =
        unsafe { (*uctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] };
    err & 2 != 0
}

/// Runs `f` on the interrupted thread's own stack, below its red zone, then
/// resumes the interrupted code exactly — every register, the flags, the FPU
/// and vector state and the stack pointer as the kernel saved them — through
/// `rt_sigreturn`, with the signal mask and alternate-stack settings of the OS
/// thread that is running *when `f` returns* written into the frame.
///
/// This is how a fault hook ([`crate::trap::add_fault_hook`]) runs ordinary
/// code to resolve a fault: a hook runs on the per-OS-thread alternate
/// signal stack, where nothing may block, and whatever it leaves there is
/// overwritten by the next signal of that OS thread. `f` instead runs on the
/// faulting thread's stack as if called by the faulting instruction: it may
/// take locks, allocate, and switch contexts — the user-level thread it runs
/// in may be suspended and resumed later, on another OS thread. When it
/// returns, the interrupted instruction runs again (so `f` should have made
/// it succeed, or the signal comes again).
///
/// Everything up to the switch (copying the kernel's frame) is
/// allocation-free and async-signal-safe, and makes no system call. `f` runs
/// with the signal mask the handler runs with (for the handler of
/// [`crate::trap`], installed with `SA_NODEFER` and an empty `sa_mask`, the
/// interrupted code's own); the interrupted code resumes with the mask in
/// force when `f` returns. Backtraces taken in `f` end at the switch. A panic
/// escaping `f` aborts the process.
///
/// Returns only if the interrupted code was running on the current
/// alternate signal stack, without running `f` (which is dropped).
///
/// # Safety
///
/// - `uctx` must be the third argument of the running `SA_SIGINFO` signal
///   handler on the calling OS thread (a hook's `uctx`), unchanged.
/// - The interrupted stack must have room, below its stack pointer and red
///   zone, for the copied frame (a few KiB with AVX-512 state), `f` and
///   `f`'s own use, as for a function call made at the faulting instruction;
///   if the handler runs on that stack, one more page below the handler.
/// - The frames of the handler and its callers (the hook) are abandoned:
///   they must hold nothing whose destructor has to run.
/// - The interrupted code resumes on the OS thread on which `f` returns: if
///   `f` lets its user-level thread migrate, the interrupted code must
///   tolerate that (see "Thread-locals and migration" in the crate docs).
pub unsafe fn run_on_interrupted_stack<F: FnOnce()>(
    uctx: *mut libc::c_void,
    f: F,
) -> InterruptedOnAltStack {
    // SAFETY: forwarded contract.
    unsafe { run_on_interrupted_stack_with(uctx, move |_| f()) }
}

/// [`run_on_interrupted_stack`], with `f` given the relocated frame: the
/// registers the interrupted code resumes with, which `f` may change (to
/// emulate the interrupted instruction and resume after it, say).
///
/// # Safety
///
/// As for [`run_on_interrupted_stack`]; what `f` writes into the frame must
/// be a state the interrupted code can resume in.
pub unsafe fn run_on_interrupted_stack_with<F: FnOnce(*mut libc::ucontext_t)>(
    uctx: *mut libc::c_void,
    f: F,
) -> InterruptedOnAltStack {
    let uc = uctx.cast::<libc::ucontext_t>();
    // SAFETY: per the contract `uc` is the kernel's live `ucontext`.
    let interrupted_sp = unsafe { (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] } as usize;
    let here_marker = 0u8;
    let here = &raw const here_marker as usize;
    // The thread's alternate stack as the kernel saved it in the frame when
    // the signal came (no system call): the handler runs on it if it lies
    // there. (A query here would report it disabled while a handler runs
    // on a stack installed with `SS_AUTODISARM`.)
    // SAFETY: per the contract `uc` is the kernel's live `ucontext`.
    let ss = unsafe { (*uc).uc_stack };
    let alt = if ss.ss_flags & libc::SS_DISABLE != 0 {
        0..0
    } else {
        ss.ss_sp as usize..ss.ss_sp as usize + ss.ss_size
    };
    let on_alt = alt.contains(&here);
    if on_alt && alt.contains(&interrupted_sp) {
        return InterruptedOnAltStack;
    }
    // Below everything live on the interrupted stack: its red zone, and,
    // when the handler runs on that stack, the handler's frames.
    let top = if on_alt {
        interrupted_sp - RED_ZONE
    } else {
        (interrupted_sp - RED_ZONE).min(here - HANDLER_GAP)
    };
    // SAFETY: `uc` and the FPU area it points to are the kernel's frame of
    // the running handler, readable. The destinations lie below `top`,
    // hence below everything live on the interrupted stack, and inside its
    // mapping by the caller's guarantee of room; they are written before
    // anything else uses that memory (the switch puts the stack pointer
    // below them). The FPU area is 64-byte aligned, the `ucontext` and the
    // call 16-byte (or more, as `F` needs) aligned, and `sp` 16-byte
    // aligned with slack above it, as `switch_and_sigreturn` requires.
    unsafe {
        let fp = (*uc).uc_mcontext.fpregs as *const u8;
        let fp_bytes = if fp.is_null() {
            0
        } else if core::ptr::read_unaligned(fp.add(SW_RESERVED).cast::<u32>()) == FP_XSTATE_MAGIC1 {
            core::ptr::read_unaligned(fp.add(SW_RESERVED + 4).cast::<u32>()) as usize
        } else {
            FXSAVE_BYTES
        };
        let fp_dst = (top - fp_bytes) & !(XSAVE_ALIGN - 1);
        let uc_dst = (fp_dst - size_of::<libc::ucontext_t>()) & !15;
        let call_align = align_of::<Call<F>>().max(16);
        let call_dst = (uc_dst - size_of::<Call<F>>()) & !(call_align - 1);
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
        let call = call_dst as *mut Call<F>;
        call.write(Call { uc: ucd, f });
        switch_and_sigreturn(sp, call.cast(), call_on_interrupted_stack::<F>)
    }
}

/// Runs on the interrupted stack: calls the function, then makes the copied
/// frame restore the current OS thread's signal mask and alternate stack,
/// and returns the frame's address for `rt_sigreturn`.
///
/// # Safety
///
/// `call` must point to a `Call<F>` written by [`run_on_interrupted_stack`],
/// read here once.
unsafe extern "C" fn call_on_interrupted_stack<F: FnOnce(*mut libc::ucontext_t)>(
    call: *mut libc::c_void,
) -> usize {
    // SAFETY: per the contract; the memory is not used again.
    let Call { uc, f } = unsafe { call.cast::<Call<F>>().read() };
    f(uc);
    // SAFETY: `uc` is the copied frame, which nothing else uses; the calls
    // only query the current thread's settings.
    unsafe { adopt_current_thread_state(uc) };
    uc as usize
}

/// Writes the calling OS thread's signal mask and alternate-stack settings
/// into `uc`, so that `rt_sigreturn` keeps them (the interrupted code may
/// have been suspended and resumed on another OS thread meanwhile, and the
/// function run on its stack may have changed the mask on purpose).
///
/// # Safety
///
/// `uc` must point to a writable kernel-layout `ucontext`.
unsafe fn adopt_current_thread_state(uc: *mut libc::ucontext_t) {
    // SAFETY: `sigset_t` and `stack_t` are plain data; the queries write
    // only the locals; the kernel's mask is the first 8 bytes of glibc's
    // `sigset_t`, which is what `uc_sigmask` holds in the kernel's layout;
    // `uc` is writable per the contract.
    unsafe {
        let mut mask: libc::sigset_t = core::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, core::ptr::null(), &mut mask);
        core::ptr::copy_nonoverlapping(
            (&raw const mask).cast::<u8>(),
            (&raw mut (*uc).uc_sigmask).cast::<u8>(),
            8,
        );
        let mut ss: libc::stack_t = core::mem::zeroed();
        if libc::sigaltstack(core::ptr::null(), &mut ss) == 0 {
            // The flag describes where the thread runs, not a setting.
            ss.ss_flags &= !libc::SS_ONSTACK;
            (*uc).uc_stack = ss;
        }
    }
}

/// Switches the stack pointer to `sp`, calls `entry(call)`, then sets the
/// stack pointer to the `ucontext` address `entry` returned and issues
/// `rt_sigreturn`, which reads the frame there (the kernel expects the stack
/// pointer at the `ucontext`, its return-address slot just popped).
///
/// Unwinders stop here (`.cfi_undefined rip`), and so do frame-pointer
/// walkers (`rbp` is zeroed, and the fake return address is zero).
///
/// # Safety
///
/// `sp` must be 16-byte aligned with enough stack below it for `entry`, and
/// `entry` must return the address of a valid kernel-layout signal frame.
#[unsafe(naked)]
unsafe extern "C" fn switch_and_sigreturn(
    sp: usize,
    call: *mut libc::c_void,
    entry: unsafe extern "C" fn(*mut libc::c_void) -> usize,
) -> ! {
    naked_asm!(
        ".cfi_startproc",
        ".cfi_undefined rip",
        "mov rsp, rdi",
        "mov rdi, rsi",
        "xor ebp, ebp",
        // A zero return address above the entry's frame; the second push
        // keeps the stack 16-byte aligned at the call.
        "push 0",
        "push 0",
        "call rdx",
        "mov rsp, rax",
        "mov eax, 15", // SYS_rt_sigreturn
        "syscall",
        "ud2",
        ".cfi_endproc",
    )
}
