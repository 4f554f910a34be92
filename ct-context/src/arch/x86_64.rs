//! Native x86-64 (System V) context switching in naked functions.
//!
//! A saved context is a pointer to a small frame that the switch pushed on the
//! suspended stack:
//!
//! ```text
//!                 X86_64 (24 bytes)      X86_64Fpu (32 bytes)
//! ctx + 0x00      rbx                    MXCSR (bits 0..32), x87 CW (bits 32..48)
//! ctx + 0x08      rbp                    rbx
//! ctx + 0x10      return address         rbp
//! ctx + 0x18                             return address
//! ```
//!
//! The switch is entered from an inline-assembly `call` that tells the compiler
//! every other register is clobbered (see `switch_call!`), so the compiler
//! spills just the values live across the switch, and the frame holds only the
//! two registers that inline assembly cannot declare clobbered. This is the
//! cmpth design (a switch the compiler sees as clobbering everything); it makes
//! a round trip much cheaper than saving all six callee-saved registers
//! unconditionally.
//!
//! Resuming a frame is `[restore FPU word]; pop rbx; pop rbp; pop rcx; jmp rcx`
//! with `rax` holding the transfer value, which becomes the result of the
//! suspended side's switch. The resume is an indirect jump rather than `ret`:
//! a symmetric switch never returns to the call site that entered it, so `ret`
//! would be mispredicted on every switch, while the indirect-branch predictor
//! learns regular switching patterns.
//!
//! An ontop function runs on the destination's stack directly below its frame
//! (16-byte aligned for the call): everything below a suspended frame is dead,
//! because the suspended code is inside a call made with nothing in its red
//! zone.

use core::arch::naked_asm;
use core::ptr::NonNull;

use crate::context::{CondOntopFn, Context, EntryFn, OntopFn, RestoreFn};
use crate::policy::ContextPolicy;
use crate::stack::StackRegion;

/// Default MXCSR (all exceptions masked, round to nearest) and x87 control word
/// (all exceptions masked, 64-bit precision, round to nearest), as at process start.
const DEFAULT_FPU_WORD: u64 = 0x1f80 | (0x037f << 32);

/// First code a fresh context runs, "returned into" from the frame built by
/// `make_frame`: `rbx` holds the entry function, `rbp` its argument and `rax`
/// the value delivered by the first switch. The CFI marks the end of the call
/// chain so that unwinders and backtraces stop cleanly at the context's entry.
#[unsafe(naked)]
unsafe extern "C" fn context_trampoline() {
    naked_asm!(
        ".cfi_startproc",
        ".cfi_undefined rip",
        "mov rdi, rbp",
        "xor ebp, ebp",
        "mov rsi, rax",
        "call rbx",
        "ud2",
        ".cfi_endproc",
    )
}

/// Writes the initial frame of a fresh context at the top of `stack`: after the
/// frame is popped, the stack pointer is the (16-byte aligned) top, so the
/// trampoline calls the entry with an aligned stack.
///
/// # Safety
///
/// `stack` must be writable and at least 32 bytes long.
unsafe fn make_frame(stack: StackRegion, entry: EntryFn, arg: usize, fpu: bool) -> NonNull<u8> {
    let words: [u64; 3] = [
        entry as *const () as u64,              // rbx: entry function
        arg as u64,                             // rbp: entry argument
        context_trampoline as *const () as u64, // return address
    ];
    let size = if fpu { 32 } else { 24 };
    let frame = stack.top() - size;
    assert!(
        frame >= stack.bottom(),
        "stack too small for a context frame"
    );
    let mut p = frame as *mut u64;
    // SAFETY: `frame .. stack.top()` lies inside the caller's stack region and
    // is 8-byte aligned (the top is 16-byte aligned).
    unsafe {
        if fpu {
            p.write(DEFAULT_FPU_WORD);
            p = p.add(1);
        }
        for w in words {
            p.write(w);
            p = p.add(1);
        }
        NonNull::new_unchecked(frame as *mut u8)
    }
}

/// Calls one of the naked switch functions from inline assembly.
///
/// The call is hidden from the compiler in an `asm!` block that declares every
/// register except `rbx`, `rbp` and `rsp` clobbered (`rbx` and `rbp` cannot be
/// named; the naked code saves them in the frame). The compiler therefore
/// spills only the values that are live across the switch, instead of the
/// switch saving all six callee-saved registers every time. Without
/// `options(nostack)`, the compiler keeps `rsp` 16-byte aligned at the block
/// and keeps nothing in the red zone, so the `call` may push freely.
macro_rules! switch_call {
    ($func:path, next: $next:expr, f: $f:expr, data: $data:expr) => {{
        let ret: usize;
        core::arch::asm!(
            "lea rax, [rip + 2f]",
            "push rax",
            "jmp {sw}",
            "2:",
            sw = sym $func,
            inout("rdx") $next => _,
            inout("rcx") $f => _,
            inout("rsi") $data => _,
            out("rax") ret,
            out("r12") _,
            out("r13") _,
            out("r14") _,
            out("r15") _,
            clobber_abi("C"),
        );
        ret
    }};
}

macro_rules! x86_64_policy {
    (
        $(#[$doc:meta])*
        $policy:ident, $name:literal, fpu: $fpu:literal,
        // Pushes the FPU word (if any) after rbp and rbx.
        save: [$($save:literal),*],
        // Pops it again.
        restore: [$($restore:literal),*],
        // Points rsp at the destination frame `rdx`, 16-byte aligned for a call.
        enter_dest: $enter:literal,
        // Undoes `enter_dest` after the call, so rsp is the frame again.
        leave_dest: [$($leave:literal),*]
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $policy;

        impl $policy {
            /// Plain switch: `(next: rdx, _, data: rsi) -> rax = data`. The saved
            /// context is not handed to anyone.
            #[unsafe(naked)]
            unsafe extern "C" fn raw_jump() {
                naked_asm!(
                    "push rbp",
                    "push rbx",
                    $($save,)*
                    "mov rsp, rdx",
                    "mov rax, rsi",
                    $($restore,)*
                    "pop rbx",
                    "pop rbp",
                    "pop rcx",
                    "jmp rcx",
                )
            }

            /// `swap_context(next: rdx, f: rcx, data: rsi) -> rax`; calls
            /// `f(prev: rdi, data: rsi)` on the destination stack.
            #[unsafe(naked)]
            unsafe extern "C" fn raw_swap() {
                naked_asm!(
                    "push rbp",
                    "push rbx",
                    $($save,)*
                    "mov rdi, rsp",
                    $enter,
                    "call rcx",
                    $($leave,)*
                    $($restore,)*
                    "pop rbx",
                    "pop rbp",
                    "pop rcx",
                    "jmp rcx",
                )
            }

            /// `save_context(stack_top: rdx, f: rcx, data: rsi) -> rax`
            #[unsafe(naked)]
            unsafe extern "C" fn raw_save() {
                naked_asm!(
                    "push rbp",
                    "push rbx",
                    $($save,)*
                    // rbx keeps the saved context across `f` (callee-saved).
                    "mov rbx, rsp",
                    "mov rdi, rsp",
                    "and rdx, -16",
                    "mov rsp, rdx",
                    "call rcx",
                    // `f` returned: resume the saved context with its result.
                    "mov rsp, rbx",
                    $($restore,)*
                    "pop rbx",
                    "pop rbp",
                    "pop rcx",
                    "jmp rcx",
                )
            }

            /// `cond_swap_context(next: rdx, f: rcx, data: rsi) -> rax`;
            /// `f` returns `{value: rax, proceed: dl}`.
            #[unsafe(naked)]
            unsafe extern "C" fn raw_cond_swap() {
                naked_asm!(
                    "push rbp",
                    "push rbx",
                    $($save,)*
                    "mov rbx, rsp",
                    "mov rdi, rsp",
                    $enter,
                    "call rcx",
                    $($leave,)*
                    "test dl, dl",
                    "jnz 2f",
                    // Cancelled: go back to the saved context.
                    "mov rsp, rbx",
                    "2:",
                    $($restore,)*
                    "pop rbx",
                    "pop rbp",
                    "pop rcx",
                    "jmp rcx",
                )
            }

            /// `restore_context(next: rdx, f: rcx (0 = none), data: rsi) -> !`;
            /// calls `f(data: rdi)` on the destination stack.
            #[unsafe(naked)]
            unsafe extern "C" fn raw_restore() {
                naked_asm!(
                    "mov rax, rsi",
                    "test rcx, rcx",
                    "jz 2f",
                    $enter,
                    "mov rdi, rsi",
                    "call rcx",
                    $($leave,)*
                    "jmp 3f",
                    "2:",
                    "mov rsp, rdx",
                    "3:",
                    $($restore,)*
                    "pop rbx",
                    "pop rbp",
                    "pop rcx",
                    "jmp rcx",
                )
            }
        }

        // SAFETY: the naked functions above, entered through `switch_call!`,
        // implement the documented semantics: every register the compiler may
        // keep live across the call is saved (rbx and rbp in the frame, the rest
        // by the compiler, which treats them as clobbered), the stack is 16-byte
        // aligned at every call, and the ontop function runs between the save
        // and the resume.
        unsafe impl ContextPolicy for $policy {
            const NAME: &'static str = $name;
            const MIN_STACK_SIZE: usize = 256;

            #[inline]
            unsafe fn make_context(stack: StackRegion, entry: EntryFn, arg: usize) -> Context<Self> {
                // SAFETY: forwarded contract (stack writable and large enough).
                unsafe { Context::from_raw(make_frame(stack, entry, arg, $fpu)) }
            }

            #[inline(always)]
            unsafe fn save_context(stack: StackRegion, f: OntopFn<Self>, data: usize) -> usize {
                // SAFETY: forwarded contract.
                unsafe { switch_call!(Self::raw_save, next: stack.top(), f: f as *const () as usize, data: data) }
            }

            #[inline(always)]
            unsafe fn swap_context(next: Context<Self>, f: Option<OntopFn<Self>>, data: usize) -> usize {
                let next = next.into_raw().as_ptr() as usize;
                // SAFETY: forwarded contract; `next` is a frame made by this policy.
                unsafe {
                    match f {
                        None => switch_call!(Self::raw_jump, next: next, f: 0usize, data: data),
                        Some(f) => {
                            switch_call!(Self::raw_swap, next: next, f: f as *const () as usize, data: data)
                        }
                    }
                }
            }

            #[inline(always)]
            unsafe fn cond_swap_context(next: Context<Self>, f: CondOntopFn<Self>, data: usize) -> usize {
                let next = next.into_raw().as_ptr() as usize;
                // SAFETY: forwarded contract; `next` is a frame made by this policy.
                unsafe { switch_call!(Self::raw_cond_swap, next: next, f: f as *const () as usize, data: data) }
            }

            #[inline(always)]
            unsafe fn restore_context(next: Context<Self>, f: Option<RestoreFn>, data: usize) -> ! {
                let f = f.map_or(0, |f| f as *const () as usize);
                // SAFETY: forwarded contract; `next` is a frame made by this policy.
                // Nothing is saved, so a plain jump suffices.
                unsafe {
                    core::arch::asm!(
                        "jmp {sw}",
                        sw = sym Self::raw_restore,
                        in("rdx") next.into_raw().as_ptr(),
                        in("rcx") f,
                        in("rsi") data,
                        options(noreturn),
                    )
                }
            }
        }
    };
}

x86_64_policy! {
    /// The native x86-64 policy: saves what the compiler keeps live plus `rbx`,
    /// `rbp` and the stack pointer. The fastest policy, and the default on
    /// x86-64. Its frames are 24 bytes, so a context pointer is 8 mod 16.
    X86_64, "x86_64", fpu: false,
    save: [],
    restore: [],
    enter_dest: "lea rsp, [rdx - 8]",
    leave_dest: ["add rsp, 8"]
}

x86_64_policy! {
    /// The native x86-64 policy that also preserves MXCSR and the x87 control
    /// word per context (the seed's "customised register saving"), for code that
    /// changes rounding modes or floating-point exception masks per thread.
    X86_64Fpu, "x86_64-fpu", fpu: true,
    save: ["sub rsp, 8", "stmxcsr [rsp]", "fnstcw [rsp + 4]"],
    restore: ["ldmxcsr [rsp]", "fldcw [rsp + 4]", "add rsp, 8"],
    enter_dest: "mov rsp, rdx",
    leave_dest: []
}
