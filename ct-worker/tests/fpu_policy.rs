//! The FPU-preserving context policy under the scheduler: each user-level
//! thread's rounding mode and x87 precision stay its own across yields,
//! forks, joins and steals, on one worker and on two (where threads migrate
//! between the workers' OS threads).
#![cfg(target_arch = "x86_64")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::with_timeout;
use ct_context::{FpuLoads, X86_64Fpu};
use ct_worker::{Custom, Runtime};

type C = Custom<X86_64Fpu>;

/// MXCSR's control bits (its exception flags, bits 0-5, are not kept per
/// context by this policy) and the x87 control word.
fn env() -> (u32, u16) {
    let (mut mx, mut cw) = (0u32, 0u16);
    // SAFETY: stmxcsr and fnstcw only store the registers into the locals.
    unsafe {
        core::arch::asm!("stmxcsr [{}]", in(reg) &mut mx, options(nostack));
        core::arch::asm!("fnstcw [{}]", in(reg) &mut cw, options(nostack));
    }
    (mx & 0xffc0, cw)
}

fn set_env((mx, cw): (u32, u16)) {
    let mut cur = 0u32;
    // SAFETY: stores MXCSR into `cur`, then loads valid control words (the
    // reserved bits clear, the exception flags kept).
    unsafe {
        core::arch::asm!("stmxcsr [{}]", in(reg) &mut cur, options(nostack));
        let new = (cur & 0x3f) | mx;
        core::arch::asm!("ldmxcsr [{}]", in(reg) &new, options(nostack));
        core::arch::asm!("fldcw [{}]", in(reg) &cw, options(nostack));
    }
}

/// Thread `i`'s environment: one of the four rounding modes in both units,
/// and one of three x87 precisions.
fn env_of(i: usize) -> (u32, u16) {
    let rc = (i % 4) as u32;
    let pc = [0u16, 2, 3][i % 3];
    (
        0x1f80 | (rc << 13),
        0x007f | (pc << 8) | ((rc as u16) << 10),
    )
}

fn fib(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join_in::<C, _, _, _, _>(|| fib(n - 1), || fib(n - 2));
    a + b
}

fn run(workers: usize) -> usize {
    let rt = Runtime::builder()
        .workers(workers)
        .build_with::<C>()
        .unwrap();
    let checks = AtomicUsize::new(0);
    let checks = &checks;
    rt.block_on(|| {
        ct_worker::scope_in::<C, _, _>(|s| {
            for i in 0..16usize {
                s.spawn(move || {
                    let mine = env_of(i);
                    set_env(mine);
                    for round in 0..40 {
                        ct_worker::yield_now_in::<C>();
                        assert_eq!(env(), mine, "thread {i} after a yield (round {round})");
                        // Forks and joins, whose halves may be stolen and
                        // set other words meanwhile.
                        let (a, b) = ct_worker::join_in::<C, _, _, _, _>(
                            || fib(12),
                            move || {
                                let other = env_of(i + 1 + round);
                                set_env(other);
                                ct_worker::yield_now_in::<C>();
                                assert_eq!(env(), other, "a forked half after a yield");
                                fib(11)
                            },
                        );
                        assert_eq!((a, b), (144, 89));
                        // The second half may have run inline, in our
                        // context: restore ours if so, and check it
                        // survives the next switches either way.
                        set_env(mine);
                        ct_worker::yield_now_in::<C>();
                        assert_eq!(env(), mine, "thread {i} after a join (round {round})");
                        checks.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
    });
    checks.load(Ordering::Relaxed)
}

/// Runs with each way of loading control words (any mix is correct, so
/// tests running meanwhile do not matter).
fn run_both(workers: usize) {
    for loads in [FpuLoads::Compare, FpuLoads::Always] {
        X86_64Fpu::set_loads(loads);
        assert_eq!(run(workers), 16 * 40);
    }
}

#[test]
fn fpu_policy_keeps_each_threads_control_words_on_one_worker() {
    with_timeout(120, || run_both(1));
}

#[test]
fn fpu_policy_keeps_each_threads_control_words_on_two_workers() {
    with_timeout(120, || run_both(2));
}
