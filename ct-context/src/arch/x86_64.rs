//! Native x86-64 (System V) context switching in inline assembly.
//!
//! A saved context is a pointer to a small frame that the switch wrote just
//! below the stack pointer of the suspended code:
//!
//! ```text
//!                 X86_64 (24 bytes)      X86_64Fpu (32 bytes)
//! ctx + 0x00      rbx                    MXCSR (bits 0..32), x87 CW (bits 32..48)
//! ctx + 0x08      rbp                    rbx
//! ctx + 0x10      resume address         rbp
//! ctx + 0x18                             resume address
//! ```
//!
//! Every switch is one `asm!` block inlined at its call site that declares
//! every other register clobbered (see `switch_asm!`), so the compiler spills
//! just the values live across the switch, and the frame holds only the two
//! registers that inline assembly cannot declare clobbered. This is the cmpth
//! design (a switch the compiler sees as clobbering everything); it makes a
//! round trip much cheaper than saving all six callee-saved registers
//! unconditionally.
//!
//! The frame is written with plain stores below `rsp` and read back with plain
//! loads, not pushed and popped: a switch changes `rsp` explicitly, and mixing
//! that with `push`/`pop` costs the processor's stack engine synchronisation
//! work on both sides (measured: a plain round trip took 2.2 ns with
//! push/pop and a `call` into a shared switch routine, 1.2–1.4 ns inlined
//! with stores and loads, on an AMD EPYC of family 0x1a; the resume label
//! starts a 32-byte fetch block because the figure moved between 1.1 and 2.0
//! ns with where the label fell). Resuming a frame is
//! `[restore FPU words]; mov rbx, [ctx]; mov rbp, [ctx + 8]; lea rsp, [ctx +
//! 24]; jmp [ctx + 16]` with `rax` holding the transferred value, which
//! becomes the result of the suspended side's switch. The resume reads its
//! address just below the new `rsp`, inside the red zone, which signal
//! handlers never touch. It is an indirect jump rather than `ret`: a symmetric
//! switch never returns to the call site that entered it, so `ret` would be
//! mispredicted on every switch, while the indirect-branch predictor learns
//! regular switching patterns.
//!
//! Each switch block marks itself, for unwinders, as the end of the stack
//! (`.cfi_undefined rip` between `.cfi_remember_state` and
//! `.cfi_restore_state`): inside it `rsp` points into another stack, so the
//! enclosing function's unwind rule would be wrong. An ontop function is
//! called from inside the block, so a backtrace taken in it (or in a child
//! thread that work-first creation runs inside `save_context`'s function) ends
//! cleanly at the switch instead of walking garbage. This needs the unwind
//! tables that x86-64 Linux targets emit by default.
//!
//! An ontop switch costs a plain one plus the call and return of its
//! function, and nothing else: in the `ctx-switch` bench a round trip of two
//! switches with a trivial function exceeds a plain round trip by about what
//! two dependent calls of the same function cost without any switch (1.6 vs
//! 1.8 ns, the bench's `call-ret` line). A plain round trip is cheaper than
//! one such call and return, so the ratio of the two is above 2.
//!
//! An ontop function is called on the destination's stack directly below its
//! frame (16-byte aligned for the call): everything below a suspended frame is
//! dead, because a switch block is not `nostack`, so the compiler keeps nothing
//! below `rsp` there. `rbx` carries the destination frame across the call (the
//! function preserves it, and the resume reloads it from the frame).

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

/// Expands to one inline-assembly switch.
///
/// The block declares every register except `rbx`, `rbp` and `rsp` clobbered
/// (`rbx` and `rbp` cannot be named; the block saves them in the frame), so
/// the compiler spills only the values that are live across the switch. It is
/// not `nostack` and not `nomem`: the compiler keeps `rsp` 16-byte aligned at
/// the block, and the block may write below `rsp` (the frame) and reads memory.
/// Inputs: `next` (rdx), `f` (rcx) and `data` (rsi); output: the transferred
/// value (rax), delivered by whichever switch resumes this block's frame.
macro_rules! switch_asm {
    (next: $next:expr, f: $f:expr, data: $data:expr, [$($code:expr),* $(,)?]) => {{
        let ret: usize;
        core::arch::asm!(
            // Unwinders stop inside the switch (see the module docs).
            ".cfi_remember_state",
            ".cfi_undefined rip",
            $($code,)*
            ".cfi_restore_state",
            // Where the saved frame resumes, at the start of a 32-byte fetch
            // block (the padding follows an unconditional jump, so it never
            // runs): round trips measured 1.1-2.0 ns depending on where the
            // label fell.
            ".p2align 5",
            "2:",
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
        $policy:ident, $name:literal, frame: $size:literal,
        // Writes the frame below rsp (rax is scratch); the continuation is
        // label `2`. The saved context is then `rsp - frame`.
        save: [$($save:literal),*],
        // The saved context, into rdi.
        saved_to_rdi: $saved:literal,
        // Resumes the frame that rdx points to, with rax as the transferred value.
        resume: [$($resume:literal),*],
        // Points rsp below the destination frame rdx, 16-byte aligned for a call.
        enter_dest: $enter:literal
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $policy;

        // SAFETY: the inline switches below implement the documented semantics:
        // every register the compiler may keep live across a switch is saved
        // (rbx and rbp in the frame, the rest by the compiler, which treats
        // them as clobbered); the frame lies below the stack pointer the block
        // was entered with, which resuming the frame restores exactly; the
        // stack is 16-byte aligned at every call; and the ontop function runs
        // on the destination stack, below its frame, between the save and the
        // resume.
        unsafe impl ContextPolicy for $policy {
            const NAME: &'static str = $name;
            const MIN_STACK_SIZE: usize = 256;

            #[inline]
            unsafe fn make_context(stack: StackRegion, entry: EntryFn, arg: usize) -> Context<Self> {
                // SAFETY: forwarded contract (stack writable and large enough).
                unsafe { Context::from_raw(make_frame(stack, entry, arg, $size == 32)) }
            }

            #[inline(always)]
            unsafe fn save_context(stack: StackRegion, f: OntopFn<Self>, data: usize) -> usize {
                // SAFETY: forwarded contract. rbx (restored from the frame on
                // resume) keeps the saved context across `f`, which preserves it.
                unsafe {
                    switch_asm!(next: stack.top(), f: f as *const () as usize, data: data, [
                        $($save,)*
                        $saved,
                        "mov rbx, rdi",
                        "and rdx, -16",
                        "mov rsp, rdx",
                        "call rcx",
                        // `f` returned: resume the saved context with its result.
                        "mov rdx, rbx",
                        $($resume,)*
                    ])
                }
            }

            #[inline(always)]
            unsafe fn swap_context(next: Context<Self>, f: Option<OntopFn<Self>>, data: usize) -> usize {
                let next = next.into_raw().as_ptr() as usize;
                // SAFETY: forwarded contract; `next` is a frame made by this policy.
                unsafe {
                    match f {
                        None => switch_asm!(next: next, f: 0usize, data: data, [
                            $($save,)*
                            "mov rax, rsi",
                            $($resume,)*
                        ]),
                        Some(f) => switch_asm!(next: next, f: f as *const () as usize, data: data, [
                            $($save,)*
                            $saved,
                            // rbx (restored from the frame on resume, preserved
                            // by `f`) keeps the destination across `f`.
                            "mov rbx, rdx",
                            $enter,
                            "call rcx",
                            "mov rdx, rbx",
                            $($resume,)*
                        ]),
                    }
                }
            }

            #[inline(always)]
            unsafe fn swap_context_into(
                next: Context<Self>,
                slot: *mut Option<Context<Self>>,
                data: usize,
            ) -> usize {
                let next = next.into_raw().as_ptr() as usize;
                // SAFETY: forwarded contract; `next` is a frame made by this
                // policy. The slot is written after the frame: once it is
                // visible, the suspended stack is complete (and the rest of
                // the switch touches only registers and `next`'s frame).
                unsafe {
                    switch_asm!(next: next, f: slot as usize, data: data, [
                        $($save,)*
                        $saved,
                        "mov [rcx], rdi",
                        "mov rax, rsi",
                        $($resume,)*
                    ])
                }
            }

            #[inline(always)]
            unsafe fn cond_swap_context(next: Context<Self>, f: CondOntopFn<Self>, data: usize) -> usize {
                let next = next.into_raw().as_ptr() as usize;
                // SAFETY: forwarded contract; `next` is a frame made by this policy.
                // `f` returns `{value: rax, proceed: dl}`; rbx keeps the saved
                // context across it.
                unsafe {
                    switch_asm!(next: next, f: f as *const () as usize, data: data, [
                        $($save,)*
                        $saved,
                        "mov rbx, rdi",
                        "mov rbp, rdx",
                        $enter,
                        "call rcx",
                        "test dl, dl",
                        "jz 3f",
                        "mov rdx, rbp",
                        "jmp 4f",
                        // Cancelled: resume the saved context.
                        "3:",
                        "mov rdx, rbx",
                        "4:",
                        $($resume,)*
                    ])
                }
            }

            #[inline(always)]
            unsafe fn restore_context(next: Context<Self>, f: Option<RestoreFn>, data: usize) -> ! {
                let f = f.map_or(0, |f| f as *const () as usize);
                // SAFETY: forwarded contract; `next` is a frame made by this policy.
                // Nothing is saved.
                unsafe {
                    core::arch::asm!(
                        ".cfi_remember_state",
                        ".cfi_undefined rip",
                        "mov rax, rsi",
                        "test rcx, rcx",
                        "jz 3f",
                        "mov rbx, rdx",
                        $enter,
                        "mov rdi, rsi",
                        "call rcx",
                        "mov rdx, rbx",
                        "3:",
                        $($resume,)*
                        ".cfi_restore_state",
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
    X86_64, "x86_64", frame: 24,
    save: [
        "lea rax, [rip + 2f]",
        "mov [rsp - 8], rax",
        "mov [rsp - 16], rbp",
        "mov [rsp - 24], rbx"
    ],
    saved_to_rdi: "lea rdi, [rsp - 24]",
    resume: [
        "mov rbx, [rdx]",
        "mov rbp, [rdx + 8]",
        "lea rsp, [rdx + 24]",
        "jmp [rdx + 16]"
    ],
    enter_dest: "lea rsp, [rdx - 8]"
}

x86_64_policy! {
    /// The native x86-64 policy that also preserves MXCSR and the x87 control
    /// word per context (the seed's "customised register saving"), for code that
    /// changes rounding modes or floating-point exception masks per thread.
    /// Its frames are 32 bytes, so a context pointer is 16-byte aligned.
    X86_64Fpu, "x86_64-fpu", frame: 32,
    save: [
        "lea rax, [rip + 2f]",
        "mov [rsp - 8], rax",
        "mov [rsp - 16], rbp",
        "mov [rsp - 24], rbx",
        "stmxcsr [rsp - 32]",
        "fnstcw [rsp - 28]"
    ],
    saved_to_rdi: "lea rdi, [rsp - 32]",
    resume: [
        "ldmxcsr [rdx]",
        "fldcw [rdx + 4]",
        "mov rbx, [rdx + 8]",
        "mov rbp, [rdx + 16]",
        "lea rsp, [rdx + 32]",
        "jmp [rdx + 24]"
    ],
    enter_dest: "mov rsp, rdx"
}
