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

// ---------------------------------------------------------------------------
// Control words through every primitive, on one OS thread and migrating
// between two. MXCSR is compared without its exception flags (bits 0-5),
// which `X86_64Fpu` does not keep per context.
// ---------------------------------------------------------------------------

mod every_primitive {
    use super::{fpu_cw, mxcsr, set_fpu_cw, set_mxcsr};
    use ct_context::{
        CondResult, Context, ContextPolicy, FpuLoads, MmapStack, Stack, StackRegion, X86_64Fpu,
        cond_swap_with, make_context_with, restore_with, save_with, swap_with,
    };
    use std::convert::Infallible;
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    type P = X86_64Fpu;

    /// A floating-point environment: MXCSR's control bits and the x87
    /// control word.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Env {
        mxcsr: u32,
        cw: u16,
    }

    const CTRL: u32 = 0xffc0;
    /// What a fresh context starts with.
    const DEFAULT: Env = Env {
        mxcsr: 0x1f80,
        cw: 0x037f,
    };
    /// The child's: round toward zero and flush to zero in SSE; single
    /// precision, round up in x87.
    const CHILD: Env = Env {
        mxcsr: 0x1f80 | 0x6000 | 0x8000,
        cw: 0x007f | 0x0800,
    };
    /// What `save_context`'s function sets: round down, double precision.
    const OTHER: Env = Env {
        mxcsr: 0x1f80 | 0x2000,
        cw: 0x027f | 0x0400,
    };

    /// The environment of the home context of OS thread `i`: round up,
    /// double precision (and, for thread 1, denormals are zero).
    fn home_env(i: u32) -> Env {
        Env {
            mxcsr: 0x1f80 | 0x4000 | (i << 6),
            cw: 0x027f | 0x0800,
        }
    }

    fn env() -> Env {
        Env {
            mxcsr: mxcsr() & CTRL,
            cw: fpu_cw(),
        }
    }

    fn set_env(e: Env) {
        set_mxcsr((mxcsr() & !CTRL) | e.mxcsr);
        set_fpu_cw(e.cw);
    }

    /// A context slot shared between contexts (and threads).
    struct Slot(AtomicUsize);

    impl Slot {
        const fn new() -> Self {
            Self(AtomicUsize::new(0))
        }
        fn put(&self, c: Context<P>) {
            let old = self
                .0
                .swap(c.into_raw().as_ptr() as usize, Ordering::AcqRel);
            assert_eq!(old, 0, "slot already holds a context");
        }
        fn take(&self) -> Context<P> {
            let p = self.0.swap(0, Ordering::AcqRel);
            // SAFETY: the slot held a suspended context of P, now taken once.
            unsafe { Context::from_raw(NonNull::new(p as *mut u8).expect("a context")) }
        }
        fn ptr(&self) -> *mut Option<Context<P>> {
            // `Option<Context>` is a nullable pointer, like the slot's usize.
            self.0.as_ptr().cast()
        }
    }

    /// Where each side parks while the other runs: `home` for the main
    /// context of whichever OS thread resumed the child last, `child` for
    /// the child.
    struct Links {
        home: Slot,
        child: Slot,
        /// Environment checks the child passed.
        checks: AtomicUsize,
    }

    fn child_check(links: &Links, what: &str) {
        assert_eq!(env(), CHILD, "the child's environment {what}");
        links.checks.fetch_add(1, Ordering::Relaxed);
    }

    /// The value the child's last switch delivers.
    const DONE: usize = 99;

    /// The child: starts with the default words, sets its own, then switches
    /// back to its home through every primitive, `rounds` times (the home
    /// may be on another OS thread each time), and ends with
    /// `restore_context`. Three of each round's primitives come back to the
    /// home: `swap_context_into`, `swap_context` with an ontop function and
    /// `cond_swap_context` that proceeds; a cancelled `cond_swap_context` and
    /// `save_context` (whose function changes the words) come back to the
    /// child at once.
    fn make_child(
        stack: &MmapStack,
        extra: StackRegion,
        links: &'static Links,
        rounds: usize,
    ) -> Context<P> {
        // SAFETY: the stack outlives the context, which ends by restoring
        // its home; `extra` is a second stack, used only by save_context.
        unsafe {
            make_context_with::<P, _>(stack.region(), move |_| -> Infallible {
                assert_eq!(
                    env(),
                    DEFAULT,
                    "a fresh context starts with the default words"
                );
                set_env(CHILD);
                for _ in 0..rounds {
                    P::swap_context_into(links.home.take(), links.child.ptr(), 1);
                    child_check(links, "after swap_context_into");

                    swap_with(links.home.take(), |me| {
                        links.child.put(me);
                        2
                    });
                    child_check(links, "after swap_context with an ontop function");

                    cond_swap_with(links.home.take(), |me| {
                        links.child.put(me);
                        CondResult::proceed(3)
                    });
                    child_check(links, "after cond_swap_context (proceeding)");

                    let home = links.home.take();
                    let home_raw = home.as_raw();
                    let v = cond_swap_with(home, |_| CondResult::cancel(4));
                    assert_eq!(v, 4);
                    // Still suspended: the switch was cancelled.
                    links.home.put(Context::from_raw(home_raw));
                    child_check(links, "after cond_swap_context (cancelled)");

                    let v = save_with::<P, _>(extra, |_saved| {
                        let inherited = env() == CHILD;
                        set_env(OTHER);
                        usize::from(inherited) + 10
                    });
                    assert_eq!(v, 11, "save_context's function runs in the saver's words");
                    child_check(links, "after save_context (its function changed them)");
                }
                restore_with(links.home.take(), || DONE)
            })
        }
        .unwrap()
    }

    /// Resumes the child from `links.child`, way `kind` of four (ontop
    /// `swap_context`, `swap_context_into`, `cond_swap_context`, plain
    /// `swap_context`), and checks `mine` once it comes back. Returns the
    /// value it came back with.
    fn resume_child(links: &Links, kind: usize, mine: Env) -> usize {
        assert_eq!(env(), mine);
        let child = links.child.take();
        // SAFETY: the child is parked; every way in leaves our context in
        // `links.home` for the child to come back to.
        let v = unsafe {
            match kind % 4 {
                0 => swap_with(child, |me| {
                    links.home.put(me);
                    0
                }),
                1 => P::swap_context_into(child, links.home.ptr(), 0),
                2 => cond_swap_with(child, |me| {
                    links.home.put(me);
                    CondResult::proceed(0)
                }),
                _ => plain_into(links, child),
            }
        };
        assert_eq!(env(), mine, "the home's words after the child came back");
        v
    }

    /// A plain swap into `child`: we park in a helper context through an
    /// ontop switch that publishes us, and the helper switches plainly into
    /// the child (whose environment differs from the helper's default).
    fn plain_into(links: &Links, child: Context<P>) -> usize {
        let stack = MmapStack::new(64 * 1024).unwrap();
        let child_raw = child.into_raw().as_ptr() as usize;
        // SAFETY: the helper runs once, switches plainly into the child and
        // is abandoned suspended (nothing on its stack needs dropping); its
        // stack is freed only after the child came back to us.
        let helper = unsafe {
            make_context_with::<P, _>(stack.region(), move |_| -> Infallible {
                let child = Context::from_raw(NonNull::new(child_raw as *mut u8).unwrap());
                P::swap_context(child, None, 0);
                unreachable!("the helper is never resumed");
            })
        }
        .unwrap();
        // SAFETY: fresh helper; we publish ourselves where the child looks.
        let v = unsafe {
            swap_with(helper, |me| {
                links.home.put(me);
                0
            })
        };
        drop(stack);
        v
    }

    /// Starts the child (through an ontop switch) on this thread.
    fn start_child(links: &Links, child: Context<P>, mine: Env) -> usize {
        // SAFETY: fresh context; we publish ourselves for it.
        let v = unsafe {
            swap_with(child, |me| {
                links.home.put(me);
                0
            })
        };
        assert_eq!(env(), mine, "the home's words after the child's first run");
        v
    }

    fn leak_links() -> &'static Links {
        Box::leak(Box::new(Links {
            home: Slot::new(),
            child: Slot::new(),
            checks: AtomicUsize::new(0),
        }))
    }

    const ROUNDS: usize = 8;
    /// Environment checks the child makes over its life.
    const CHECKS: usize = ROUNDS * 5;

    /// Both ways of loading control words (switches of other tests running
    /// meanwhile may use either: any mix is correct).
    const LOADS: [FpuLoads; 2] = [FpuLoads::Compare, FpuLoads::Always];

    #[test]
    fn control_words_survive_every_primitive_on_one_thread() {
        for loads in LOADS {
            X86_64Fpu::set_loads(loads);
            one_thread();
        }
    }

    fn one_thread() {
        let saved = (mxcsr(), fpu_cw());
        let links = leak_links();
        let stack = MmapStack::new(64 * 1024).unwrap();
        let extra = MmapStack::new(64 * 1024).unwrap();
        let mine = home_env(0);
        set_env(mine);
        let child = make_child(&stack, extra.region(), links, ROUNDS);
        let mut v = start_child(links, child, mine);
        let mut kind = 0;
        while v != DONE {
            v = resume_child(links, kind, mine);
            kind += 1;
        }
        set_mxcsr(saved.0);
        set_fpu_cw(saved.1);
        assert_eq!(links.checks.load(Ordering::Relaxed), CHECKS);
        assert_eq!(kind, 3 * ROUNDS);
    }

    #[test]
    fn control_words_survive_every_primitive_across_two_threads() {
        for loads in LOADS {
            X86_64Fpu::set_loads(loads);
            two_threads();
        }
    }

    /// Two OS threads take turns resuming the child, which therefore changes
    /// OS thread after every switch back to its home; each thread's main
    /// context has its own words.
    fn two_threads() {
        let links = leak_links();
        let stack = MmapStack::new(64 * 1024).unwrap();
        let extra = MmapStack::new(64 * 1024).unwrap();
        let child = make_child(&stack, extra.region(), links, ROUNDS);
        let child_raw = child.into_raw().as_ptr() as usize;
        let (to_1, from_0) = mpsc::channel::<Option<usize>>();
        let (to_0, from_1) = mpsc::channel::<Option<usize>>();
        let resumes = std::thread::scope(|s| {
            let t1 = s.spawn(move || {
                let mine = home_env(1);
                set_env(mine);
                let mut n = 0;
                while let Ok(Some(kind)) = from_0.recv() {
                    let v = resume_child(links, kind, mine);
                    n += 1;
                    let next = (v != DONE).then_some(kind + 1);
                    to_0.send(next).unwrap();
                    if next.is_none() {
                        break;
                    }
                }
                n
            });
            let t0 = s.spawn(move || {
                let mine = home_env(0);
                set_env(mine);
                // SAFETY: the fresh child, made on the test's thread and
                // resumed only here.
                let child =
                    unsafe { Context::<P>::from_raw(NonNull::new(child_raw as *mut u8).unwrap()) };
                let mut v = start_child(links, child, mine);
                let mut n = 0;
                let mut kind = 0;
                while v != DONE {
                    // Thread 1's turn, then ours.
                    to_1.send(Some(kind)).unwrap();
                    match from_1.recv().unwrap() {
                        None => break,
                        Some(k) => kind = k,
                    }
                    v = resume_child(links, kind, mine);
                    n += 1;
                    kind += 1;
                }
                to_1.send(None).ok();
                n
            });
            t0.join().unwrap() + t1.join().unwrap()
        });
        assert_eq!(links.checks.load(Ordering::Relaxed), CHECKS);
        assert_eq!(resumes, 3 * ROUNDS);
    }
}
