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
//! `[FPU words]; mov rbx, [ctx]; mov rbp, [ctx + 8]; lea rsp, [ctx +
//! 24]; jmp [ctx + 16]` with `rax` holding the transferred value, which
//! becomes the result of the suspended side's switch. The resume reads its
//! address just below the new `rsp`, inside the red zone, which signal
//! handlers never touch. It is an indirect jump rather than `ret`: a symmetric
//! switch never returns to the call site that entered it, so `ret` would be
//! mispredicted on every switch, while the indirect-branch predictor learns
//! regular switching patterns.
//!
//! The FPU policy's switch stores the suspending context's MXCSR and x87
//! control word (`stmxcsr`, `fnstcw`) and then loads the destination's, in
//! one of two ways chosen once per process by the processor's vendor:
//!
//! - *compare* (Intel and others): load only when the destination's control
//!   bits differ from the current ones. Loading on every switch is what made
//!   the policy slow on an Intel Xeon (family 6, model 207, KVM, AVX-512): a
//!   plain round trip took 147–156 ns there loading always, against 3.0–3.5
//!   ns for the plain policy and 5.7 ns comparing. `ldmxcsr` and `fldcw` are
//!   serialising there, while `stmxcsr` and `fnstcw` are stores, so where
//!   every thread keeps the same settings a switch costs a plain one plus
//!   two stores and a comparison. The stores are not free either: a
//!   version that stored both words and never compared or loaded took 5.0–6.0
//!   ns, and one that stored only MXCSR as long, so `stmxcsr` is what the
//!   remaining 1.7–1.9× costs on that processor too.
//! - *load always* (AMD, Hygon): on AMD Zen 3 (EPYC, family 0x19) the loads
//!   are cheap but `stmxcsr` is not: back to back it issues once per ~15
//!   cycles and it holds up younger instructions, so a switch that reads
//!   MXCSR costs about 8 ns more per round trip than a plain one there (a
//!   version that only stored the words and never loaded them took 10.5 ns
//!   against 3 ns plain). Comparing the stored word makes every switch wait
//!   for `stmxcsr`'s result (about 20 cycles) as well: measured by thread
//!   CPU time over all five modes, 12 ns a round trip loading always and
//!   15 ns comparing. Reading MXCSR is what keeping it per context requires
//!   (the thread may have changed it since it was resumed), so there is no
//!   cheaper correct switch on that processor.
//!
//! The comparison ignores MXCSR's exception flags: they differ between
//! threads all the time (the precision flag is set by most floating-point
//! arithmetic), and comparing them would load on nearly every switch. So
//! the flags are not kept per context (see [`X86_64Fpu`]).
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
//! 1.8 ns, the bench's `call-ret` line, on the family 0x1a EPYC above; on an
//! EPYC of family 0x19 (Zen 3) 1.7–2.6 vs 3.2 ns, less than the calls alone).
//! A plain round trip costs about one such call and return (less on the
//! family 0x1a EPYC), so the ratio of the two is about 2 or above.
//!
//! An ontop function is called on the destination's stack directly below its
//! frame (16-byte aligned for the call): everything below a suspended frame is
//! dead, because a switch block is not `nostack`, so the compiler keeps nothing
//! below `rsp` there. `rbx` carries the destination frame across the call (the
//! function preserves it, and the resume reloads it from the frame).

use core::arch::naked_asm;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::context::{CondOntopFn, Context, EntryFn, OntopFn, RestoreFn};
use crate::policy::ContextPolicy;
use crate::stack::StackRegion;

/// Default MXCSR (all exceptions masked, round to nearest) and x87 control word
/// (all exceptions masked, 64-bit precision, round to nearest), as at process start.
const DEFAULT_FPU_WORD: u64 = 0x1f80 | (0x037f << 32);

/// How [`X86_64Fpu`] switches load the destination's control words:
/// [`FPU_UNKNOWN`] until the first FPU context is made, then
/// [`FPU_COMPARE`] or [`FPU_LOAD_ALWAYS`] for this processor (see the module
/// documentation). Read by every switch of that policy; both strategies are
/// correct, so a switch that still sees it unknown (compares) is too.
static FPU_STRATEGY: AtomicU8 = AtomicU8::new(FPU_UNKNOWN);
const FPU_UNKNOWN: u8 = 0;
/// Load only the words whose control bits differ from the current ones.
const FPU_COMPARE: u8 = 1;
/// Load both words on every switch, without reading the current ones.
const FPU_LOAD_ALWAYS: u8 = 2;

/// How [`X86_64Fpu`] switches load the destination context's floating-point
/// control words. Both ways are correct; which is cheaper depends on the
/// processor (see [`X86_64Fpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FpuLoads {
    /// Load them only where their control bits differ from the current
    /// ones: cheaper where loading is expensive (Intel).
    Compare,
    /// Load them on every switch: cheaper where waiting for the stored
    /// words to compare them is expensive (AMD).
    Always,
}

impl X86_64Fpu {
    /// How this process's switches load control words: as set by
    /// [`X86_64Fpu::set_loads`], otherwise as picked for the processor
    /// ([`FpuLoads::Always`] on AMD and Hygon, [`FpuLoads::Compare`]
    /// elsewhere).
    pub fn loads() -> FpuLoads {
        init_fpu_strategy();
        match FPU_STRATEGY.load(Ordering::Relaxed) {
            FPU_LOAD_ALWAYS => FpuLoads::Always,
            _ => FpuLoads::Compare,
        }
    }

    /// Sets how this process's switches load control words, from the next
    /// switch on (for benchmarks, and processors the default does not suit).
    /// Any mix of the two is correct, so this may be called at any time.
    pub fn set_loads(loads: FpuLoads) {
        let v = match loads {
            FpuLoads::Compare => FPU_COMPARE,
            FpuLoads::Always => FPU_LOAD_ALWAYS,
        };
        FPU_STRATEGY.store(v, Ordering::Relaxed);
    }
}

/// Picks the FPU strategy of this processor, once: loading always on AMD
/// (and Hygon) processors, where `ldmxcsr` and `fldcw` are cheap and waiting
/// for `stmxcsr`'s result is not; comparing first elsewhere (Intel), where
/// the loads are the expensive part.
#[inline]
fn init_fpu_strategy() {
    if FPU_STRATEGY.load(Ordering::Relaxed) != FPU_UNKNOWN {
        return;
    }
    // A racing `set_loads` wins: only an unknown strategy is replaced.
    #[allow(unused_unsafe)]
    // SAFETY: cpuid leaf 0 exists on every x86-64 processor.
    let id = unsafe { core::arch::x86_64::__cpuid(0) };
    let vendor = [id.ebx, id.edx, id.ecx];
    let is = |name: &[u8; 12]| {
        vendor
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .eq(name.iter().copied())
    };
    let strategy = if is(b"AuthenticAMD") || is(b"HygonGenuine") {
        FPU_LOAD_ALWAYS
    } else {
        FPU_COMPARE
    };
    let _ =
        FPU_STRATEGY.compare_exchange(FPU_UNKNOWN, strategy, Ordering::Relaxed, Ordering::Relaxed);
}

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
    if fpu {
        init_fpu_strategy();
    }
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
            // (The FPU policy's strategy, read by its resume sequences.)
            "# {fpu_strategy}",
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
            fpu_strategy = sym FPU_STRATEGY,
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
        // The FPU policy's "where are the current control words" for
        // `resume` (r8 points to them): right after `save`, with rsp
        // unchanged (`env_saved`); in rbp, kept across an ontop function
        // while rdi holds the saved context (`env_keep`, then `env_kept`);
        // the saved context in rbx (`env_rbx`); read afresh, with rsp
        // pointing above dead stack (`env_live`).
        env_saved: [$($env_saved:literal),*],
        env_keep: [$($env_keep:literal),*],
        env_kept: [$($env_kept:literal),*],
        env_rbx: [$($env_rbx:literal),*],
        env_live: [$($env_live:literal),*],
        // Resumes the frame that rdx points to, with rax as the transferred
        // value (and r8 as above); rcx, rsi, rdi and r8-r11 are scratch.
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
                // `f` may have run any code (a whole child thread), so the
                // control words are read afresh.
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
                        $($env_live,)*
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
                            $($env_saved,)*
                            $($resume,)*
                        ]),
                        Some(f) => switch_asm!(next: next, f: f as *const () as usize, data: data, [
                            $($save,)*
                            $saved,
                            // rbx (restored from the frame on resume, preserved
                            // by `f`) keeps the destination across `f`.
                            "mov rbx, rdx",
                            $($env_keep,)*
                            $enter,
                            "call rcx",
                            "mov rdx, rbx",
                            $($env_kept,)*
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
                // the switch touches only registers, `next`'s frame and the
                // dead stack below the saved frame).
                unsafe {
                    switch_asm!(next: next, f: slot as usize, data: data, [
                        $($save,)*
                        $saved,
                        "mov [rcx], rdi",
                        "mov rax, rsi",
                        $($env_saved,)*
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
                        $($env_rbx,)*
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
                // Nothing is saved; everything below rsp is dead on both paths
                // (the abandoned stack's, or below the destination frame).
                unsafe {
                    core::arch::asm!(
                        ".cfi_remember_state",
                        ".cfi_undefined rip",
                        "# {fpu_strategy}",
                        "mov rax, rsi",
                        "test rcx, rcx",
                        "jz 3f",
                        "mov rbx, rdx",
                        $enter,
                        "mov rdi, rsi",
                        "call rcx",
                        "mov rdx, rbx",
                        "3:",
                        $($env_live,)*
                        $($resume,)*
                        ".cfi_restore_state",
                        in("rdx") next.into_raw().as_ptr(),
                        in("rcx") f,
                        in("rsi") data,
                        fpu_strategy = sym FPU_STRATEGY,
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
    env_saved: [],
    env_keep: [],
    env_kept: [],
    env_rbx: [],
    env_live: [],
    resume: [
        "mov rbx, [rdx]",
        "mov rbp, [rdx + 8]",
        "lea rsp, [rdx + 24]",
        "jmp [rdx + 16]"
    ],
    enter_dest: "lea rsp, [rdx - 8]"
}

x86_64_policy! {
    /// The native x86-64 policy that also keeps the floating-point control
    /// settings per context — MXCSR's control bits (rounding, flush-to-zero,
    /// denormals-are-zero, exception masks) and the x87 control word
    /// (precision, rounding, exception masks) — for code that changes
    /// rounding modes or exception masks per thread (the seed's "customised
    /// register saving"). Its frames are 32 bytes, so a context pointer is
    /// 16-byte aligned.
    ///
    /// A switch stores both words of the suspending context and loads the
    /// destination's: on Intel processors only where their control bits
    /// differ from the current ones (the loads are expensive there, the
    /// comparison is not), on AMD processors always (there, waiting for the
    /// stored word to compare it costs more than loading). A fresh context
    /// starts with the default words (round to nearest, all exceptions
    /// masked, x87 extended precision).
    ///
    /// The exception flags (MXCSR bits 0–5, and the x87 status word) are not
    /// kept per context: after a switch a context sees either the flags it
    /// had when it was suspended or those of the OS thread it resumed on, so
    /// test them (`fetestexcept`) only between switches. Ontop functions must
    /// leave the control words as they found them.
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
    // The words just saved are the current ones.
    env_saved: ["lea r8, [rsp - 32]"],
    // Ontop functions leave the words alone: the saved context's are the
    // current ones after the function too.
    env_keep: ["mov rbp, rdi"],
    env_kept: ["mov r8, rbp"],
    env_rbx: ["mov r8, rbx"],
    env_live: [
        "stmxcsr [rsp - 16]",
        "fnstcw [rsp - 12]",
        "lea r8, [rsp - 16]"
    ],
    // With FPU_LOAD_ALWAYS, loads the destination's words (label 5).
    // Otherwise compares their control bits with the current words' at [r8]
    // (each with a load of its store's width, so that a just-stored word is
    // forwarded) and loads them, out of line, only if they differ.
    resume: [
        "cmp byte ptr [rip + {fpu_strategy}], 2",
        "je 5f",
        "mov ecx, [rdx]",
        "xor ecx, [r8]",
        "test ecx, 0xffc0",
        "jnz 5f",
        "movzx ecx, word ptr [rdx + 4]",
        "cmp cx, [r8 + 4]",
        "jne 5f",
        "6:",
        "mov rbx, [rdx + 8]",
        "mov rbp, [rdx + 16]",
        "lea rsp, [rdx + 32]",
        "jmp [rdx + 24]",
        "5:",
        "ldmxcsr [rdx]",
        "fldcw [rdx + 4]",
        "jmp 6b"
    ],
    enter_dest: "mov rsp, rdx"
}
