//! The FPU-preserving policy keeps MXCSR and the x87 control word per context;
//! the plain native policy does not (by design).
#![cfg(target_arch = "x86_64")]

use std::cell::Cell;
use std::convert::Infallible;

use ct_context::{
    Context, ContextPolicy, MmapStack, Stack, X86_64, X86_64Fpu, make_context_with, restore_with,
    swap_with,
};

fn mxcsr() -> u32 {
    let mut v = 0u32;
    // SAFETY: stmxcsr only stores the register into `v`.
    unsafe { core::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack)) };
    v
}

fn set_mxcsr(v: u32) {
    // SAFETY: loading a valid MXCSR value (reserved bits clear).
    unsafe { core::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack)) };
}

fn fpu_cw() -> u16 {
    let mut v = 0u16;
    // SAFETY: fnstcw only stores the control word into `v`.
    unsafe { core::arch::asm!("fnstcw [{}]", in(reg) &mut v, options(nostack)) };
    v
}

fn set_fpu_cw(v: u16) {
    // SAFETY: loading a valid x87 control word.
    unsafe { core::arch::asm!("fldcw [{}]", in(reg) &v, options(nostack)) };
}

const ROUND_TOWARD_ZERO: u32 = 0x6000;
const X87_ROUND_UP: u16 = 0x0800;

/// A context sets non-default control words; they travel with it across
/// switches, and the main context keeps its own. Returns what each side saw.
fn control_words_across_switches<P: ContextPolicy>() -> (u32, u16, u32, u16) {
    let stack = MmapStack::new(64 * 1024).unwrap();
    let main: Cell<Option<Context<P>>> = Cell::new(None);
    let child: Cell<Option<Context<P>>> = Cell::new(None);
    let (ma, ca) = (
        &main as *const Cell<Option<Context<P>>> as usize,
        &child as *const Cell<Option<Context<P>>> as usize,
    );
    let (m0, c0) = (mxcsr(), fpu_cw());
    // SAFETY: the stack outlives the context, which ends by restoring main.
    let ctx = unsafe {
        make_context_with::<P, _>(stack.region(), move |_| -> Infallible {
            let main = &*(ma as *const Cell<Option<Context<P>>>);
            set_mxcsr(m0 | ROUND_TOWARD_ZERO);
            set_fpu_cw(c0 | X87_ROUND_UP);
            swap_with(main.take().unwrap(), move |me| {
                (*(ca as *const Cell<Option<Context<P>>>)).set(Some(me));
                0
            });
            // Back in the child: report what we see now.
            let seen = (mxcsr() as usize) | ((fpu_cw() as usize) << 32);
            set_mxcsr(m0);
            set_fpu_cw(c0);
            restore_with(main.take().unwrap(), move || seen)
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    unsafe {
        swap_with(ctx, move |me| {
            (*(ma as *const Cell<Option<Context<P>>>)).set(Some(me));
            0
        })
    };
    let (main_mx, main_cw) = (mxcsr(), fpu_cw());
    // Restore ours before resuming, so the plain policy's leak is visible as
    // the child seeing *our* values.
    set_mxcsr(m0);
    set_fpu_cw(c0);
    // SAFETY: the child is parked in `child`.
    let seen = unsafe {
        swap_with(child.take().unwrap(), move |me| {
            (*(ma as *const Cell<Option<Context<P>>>)).set(Some(me));
            0
        })
    };
    set_mxcsr(m0);
    set_fpu_cw(c0);
    (main_mx, main_cw, seen as u32, (seen >> 32) as u16)
}

#[test]
fn fpu_policy_preserves_control_words() {
    let (m0, c0) = (mxcsr(), fpu_cw());
    let (main_mx, main_cw, child_mx, child_cw) = control_words_across_switches::<X86_64Fpu>();
    assert_eq!(main_mx, m0, "main's MXCSR must be restored on return");
    assert_eq!(
        main_cw, c0,
        "main's x87 control word must be restored on return"
    );
    assert_eq!(
        child_mx,
        m0 | ROUND_TOWARD_ZERO,
        "the child's MXCSR must survive the switch"
    );
    assert_eq!(
        child_cw,
        c0 | X87_ROUND_UP,
        "the child's x87 control word must survive"
    );
}

#[test]
fn plain_policy_does_not_save_control_words() {
    let (m0, c0) = (mxcsr(), fpu_cw());
    let (main_mx, main_cw, child_mx, _) = control_words_across_switches::<X86_64>();
    // The plain policy leaves the control words as they are: main sees the
    // child's settings, and the child sees main's.
    assert_eq!(main_mx, m0 | ROUND_TOWARD_ZERO);
    assert_eq!(main_cw, c0 | X87_ROUND_UP);
    assert_eq!(child_mx, m0);
}

#[test]
fn fresh_fpu_context_starts_with_default_control_words() {
    type P = X86_64Fpu;
    let stack = MmapStack::new(64 * 1024).unwrap();
    let main: Cell<Option<Context<P>>> = Cell::new(None);
    let ma = &main as *const Cell<Option<Context<P>>> as usize;
    let (m0, c0) = (mxcsr(), fpu_cw());
    set_mxcsr(m0 | ROUND_TOWARD_ZERO);
    // SAFETY: as above.
    let ctx = unsafe {
        make_context_with::<P, _>(stack.region(), move |_| -> Infallible {
            let seen = mxcsr() as usize | ((fpu_cw() as usize) << 32);
            restore_with(
                (*(ma as *const Cell<Option<Context<P>>>)).take().unwrap(),
                move || seen,
            )
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    let seen = unsafe {
        swap_with(ctx, move |me| {
            (*(ma as *const Cell<Option<Context<P>>>)).set(Some(me));
            0
        })
    };
    let after = mxcsr();
    set_mxcsr(m0);
    assert_eq!(
        seen as u32, 0x1f80,
        "a fresh context starts with the default MXCSR"
    );
    assert_eq!(
        (seen >> 32) as u16,
        0x037f,
        "and the default x87 control word"
    );
    assert_eq!(
        after,
        m0 | ROUND_TOWARD_ZERO,
        "the caller's MXCSR is restored"
    );
    let _ = c0;
}
