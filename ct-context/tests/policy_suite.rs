//! The generic test suite, instantiated for every context policy.

use std::cell::Cell;
use std::convert::Infallible;
use std::hint::black_box;
use std::process::{Command, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use std::rc::Rc;

use ct_context::{
    CondResult, Context, ContextPolicy, Coroutine, CoroutineResult, MmapStack, PooledStack,
    RawStack, Stack, StackPool, StackRegion, cond_swap_with, make_context_with, restore_with,
    save_with, swap_with,
};

/// A place to park one context, shareable between threads.
struct Slot<P: ContextPolicy>(AtomicPtr<u8>, std::marker::PhantomData<P>);

impl<P: ContextPolicy> Slot<P> {
    fn new() -> Self {
        Slot(
            AtomicPtr::new(std::ptr::null_mut()),
            std::marker::PhantomData,
        )
    }
    fn put(&self, c: Context<P>) {
        let old = self.0.swap(c.into_raw().as_ptr(), Ordering::AcqRel);
        assert!(old.is_null(), "slot already holds a context");
    }
    fn take(&self) -> Context<P> {
        let p = self.0.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: only contexts of policy P are stored here, each taken once.
        unsafe { Context::from_raw(NonNull::new(p).expect("slot is empty")) }
    }
    fn addr(&self) -> usize {
        self as *const Self as usize
    }
    /// # Safety
    /// `addr` must come from `Slot::addr` of a live slot.
    unsafe fn at<'a>(addr: usize) -> &'a Self {
        // SAFETY: forwarded contract.
        unsafe { &*(addr as *const Self) }
    }
}

/// Switch to the context in `to`, storing ourselves in `me`, delivering `v`.
fn switch<P: ContextPolicy>(to: &Slot<P>, me: &Slot<P>, v: usize) -> usize {
    let me = me.addr();
    // SAFETY: the slot protocol resumes every stored context exactly once.
    unsafe {
        swap_with(to.take(), move |prev| {
            Slot::<P>::at(me).put(prev);
            v
        })
    }
}

fn stack() -> MmapStack {
    MmapStack::new(256 * 1024).expect("map a stack")
}

/// Two contexts switch to each other 10^6 times; every value is checked on
/// both sides.
fn ping_pong<P: ContextPolicy>() {
    const ROUND_TRIPS: usize = 500_000;
    let st = stack();
    let main = Slot::<P>::new();
    let child = Slot::<P>::new();
    let (ma, ca) = (main.addr(), child.addr());
    // SAFETY: the stack outlives the context, which ends by restoring main.
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |first| -> Infallible {
            let (main, child) = (Slot::<P>::at(ma), Slot::<P>::at(ca));
            let mut expect = 0usize;
            let mut v = first;
            loop {
                assert_eq!(v, expect, "child received a wrong value");
                if v == 2 * ROUND_TRIPS {
                    break;
                }
                expect += 2;
                v = switch(main, child, v + 1);
            }
            restore_with(main.take(), || usize::MAX)
        })
    }
    .unwrap();
    child.put(ctx);
    let mut x = 0usize;
    for _ in 0..ROUND_TRIPS {
        let r = switch(&child, &main, x);
        assert_eq!(r, x + 1, "main received a wrong value");
        x = r + 1;
    }
    assert_eq!(switch(&child, &main, x), usize::MAX);
}

/// `swap_context_into` publishes the saved context in the slot and delivers
/// `data`: two contexts switch 10^5 times through two slots, every value
/// and every slot checked.
fn ping_pong_into<P: ContextPolicy>() {
    const ROUND_TRIPS: usize = 100_000;
    struct Slots<P: ContextPolicy> {
        main: Option<Context<P>>,
        child: Option<Context<P>>,
    }
    let st = stack();
    let mut slots = Slots::<P> {
        main: None,
        child: None,
    };
    let sp = &raw mut slots as usize;
    // SAFETY: the stack outlives the context, which ends by restoring main;
    // `slots` outlives both, and only the running context touches it.
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |first| -> Infallible {
            let s = sp as *mut Slots<P>;
            let mut v = first;
            for i in 0..ROUND_TRIPS {
                assert_eq!(v, 2 * i, "child received a wrong value");
                let main = (*s).main.take().expect("main published itself");
                v = P::swap_context_into(main, &raw mut (*s).child, v + 1);
            }
            let main = (*s).main.take().expect("main published itself");
            restore_with(main, || usize::MAX)
        })
    }
    .unwrap();
    let s = sp as *mut Slots<P>;
    // SAFETY: as above; each published context is taken and resumed once.
    unsafe {
        let mut r = P::swap_context_into(ctx, &raw mut (*s).main, 0);
        for i in 0..ROUND_TRIPS {
            assert_eq!(r, 2 * i + 1, "main received a wrong value");
            let child = (*s).child.take().expect("child published itself");
            r = P::swap_context_into(child, &raw mut (*s).main, r + 1);
        }
        assert_eq!(r, usize::MAX);
        assert!((*s).child.is_none() && (*s).main.is_none());
    }
}

/// Plain switches (no ontop function) deliver `data` itself.
fn plain_switch_delivers_data<P: ContextPolicy>() {
    for use_restore in [false, true] {
        let st = stack();
        let main = Slot::<P>::new();
        let ma = main.addr();
        // SAFETY: the context's stack outlives it. The context switches to main
        // without saving itself anywhere, so it is never resumed again; nothing
        // on its stack needs dropping.
        let ctx = unsafe {
            make_context_with::<P, _>(st.region(), move |v| -> Infallible {
                let main = Slot::<P>::at(ma).take();
                if use_restore {
                    P::restore_context(main, None, v * 3)
                } else {
                    P::swap_context(main, None, v * 3);
                    unreachable!("never resumed")
                }
            })
        }
        .unwrap();
        // SAFETY: fresh context.
        let r = unsafe {
            swap_with(ctx, move |me| {
                Slot::<P>::at(ma).put(me);
                14
            })
        };
        assert_eq!(
            r, 42,
            "plain switch (restore: {use_restore}) must deliver data"
        );
    }
}

/// `cond_swap_context` whose function cancels: the caller continues with the
/// function's value, the destination does not run and stays resumable.
fn cond_swap_cancel<P: ContextPolicy>() {
    let st = stack();
    let main = Slot::<P>::new();
    let ran = Cell::new(0usize);
    let (ma, ra) = (main.addr(), &ran as *const Cell<usize> as usize);
    // SAFETY: as in `ping_pong`.
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |v| -> Infallible {
            let ran = &*(ra as *const Cell<usize>);
            ran.set(ran.get() + v);
            restore_with(Slot::<P>::at(ma).take(), || 77)
        })
    }
    .unwrap();
    let raw = ctx.as_raw();
    let saw_prev = Cell::new(false);
    // SAFETY: the function cancels without publishing `prev`.
    let r = unsafe {
        cond_swap_with(ctx, |prev| {
            saw_prev.set(prev.as_raw() != raw);
            CondResult::cancel(9)
        })
    };
    assert_eq!(r, 9, "cancelled cond_swap returns the function's value");
    assert!(saw_prev.get(), "the function received the caller's context");
    assert_eq!(ran.get(), 0, "the destination must not run when cancelled");

    // The destination is still resumable: proceed this time.
    // SAFETY: `raw` is still suspended (never resumed).
    let ctx = unsafe { Context::<P>::from_raw(raw) };
    // SAFETY: the function publishes `prev` and proceeds.
    let r = unsafe {
        cond_swap_with(ctx, move |prev| {
            Slot::<P>::at(ma).put(prev);
            CondResult::proceed(5)
        })
    };
    assert_eq!(r, 77);
    assert_eq!(ran.get(), 5);
}

/// The function of `cond_swap_context` runs after the caller is saved: when
/// it proceeds, the caller resumes only through the published context.
fn cond_swap_proceed_from_context<P: ContextPolicy>() {
    let st = stack();
    let main = Slot::<P>::new();
    let child = Slot::<P>::new();
    let (ma, ca) = (main.addr(), child.addr());
    // SAFETY: as in `ping_pong`.
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |_| -> Infallible {
            let (main, child) = (Slot::<P>::at(ma), Slot::<P>::at(ca));
            let mut results = [0usize; 2];
            for (i, proceed) in [false, true].into_iter().enumerate() {
                let target = main.take();
                let keep = target.as_raw();
                let r = cond_swap_with(target, move |prev| {
                    if proceed {
                        Slot::<P>::at(ca).put(prev);
                        CondResult::proceed(100)
                    } else {
                        CondResult::cancel(200)
                    }
                });
                if !proceed {
                    // Cancelled: the target is still suspended; put it back.
                    main.put(Context::from_raw(keep));
                }
                results[i] = r;
            }
            let _ = &child;
            restore_with(main.take(), move || results[0] * 10 + results[1])
        })
    }
    .unwrap();
    child.put(ctx);
    let r = switch(&child, &main, 0);
    assert_eq!(r, 100, "proceeding delivers the value to the destination");
    let r = switch(&child, &main, 3);
    assert_eq!(
        r, 2003,
        "cancel returned 200 to the child, proceed returned 3"
    );
}

/// `restore_context` abandons the current stack, and its ontop function frees
/// that very stack.
fn restore_frees_abandoned_stack<P: ContextPolicy>() {
    let main = Slot::<P>::new();
    let ma = main.addr();
    let st = Box::into_raw(Box::new(stack()));
    // SAFETY: `st` is a live heap stack until the ontop function frees it.
    let region = unsafe { (*st).region() };
    let st_addr = st as usize;
    // SAFETY: the context ends by restoring main; its stack is freed only by
    // the ontop function, after the switch away from it.
    let ctx = unsafe {
        make_context_with::<P, _>(region, move |_| -> Infallible {
            let on_stack = black_box([7u8; 64]);
            assert_eq!(on_stack[63], 7);
            restore_with(Slot::<P>::at(ma).take(), move || {
                drop(Box::from_raw(st_addr as *mut MmapStack));
                0xfeed
            })
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    let r = unsafe {
        swap_with(ctx, move |me| {
            Slot::<P>::at(ma).put(me);
            0
        })
    };
    assert_eq!(r, 0xfeed);
    // The stack's pages are unmapped: mincore reports ENOMEM for them.
    let page = ct_context::stack::page_size();
    let mut vec = [0u8; 1];
    // SAFETY: mincore only inspects the address range.
    let rc = unsafe {
        libc::mincore(
            (region.top() - page) as *mut libc::c_void,
            page,
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, -1, "the abandoned stack must have been unmapped");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOMEM)
    );
}

/// A context creates another context and switches into it; both return.
/// `save_context` nests, and its functions run on the fresh stacks.
fn nested_contexts<P: ContextPolicy>() {
    let (s1, s2) = (stack(), stack());
    let r2 = s2.region();
    let main = Slot::<P>::new();
    let outer = Slot::<P>::new();
    let (ma, oa) = (main.addr(), outer.addr());
    // SAFETY: each context ends by restoring the one that started it.
    let ctx = unsafe {
        make_context_with::<P, _>(s1.region(), move |v| -> Infallible {
            let inner_ctx = make_context_with::<P, _>(r2, move |w| -> Infallible {
                let local = 0u8;
                assert!(
                    r2.contains(&local as *const u8 as usize),
                    "inner runs on its stack"
                );
                restore_with(Slot::<P>::at(oa).take(), move || w * 2)
            })
            .unwrap();
            let got = swap_with(inner_ctx, move |me| {
                Slot::<P>::at(oa).put(me);
                v + 1
            });
            restore_with(Slot::<P>::at(ma).take(), move || got + 1)
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    let r = unsafe {
        swap_with(ctx, move |me| {
            Slot::<P>::at(ma).put(me);
            10
        })
    };
    assert_eq!(r, 23);

    let (f1, f2) = (stack(), stack());
    let (fr1, fr2) = (f1.region(), f2.region());
    // SAFETY: the functions return without publishing their saved contexts.
    let r = unsafe {
        save_with::<P, _>(fr1, move |_prev| {
            let a = 0u8;
            assert!(
                fr1.contains(&a as *const u8 as usize),
                "f runs on the fresh stack"
            );
            let inner = save_with::<P, _>(fr2, move |_prev2| {
                let b = 0u8;
                assert!(fr2.contains(&b as *const u8 as usize));
                40
            });
            inner + 2
        })
    };
    assert_eq!(r, 42);
}

/// Recursion that uses nearly all of a context's stack, then unwinds with the
/// right result.
fn deep_recursion<P: ContextPolicy>() {
    #[inline(never)]
    fn recurse(depth: usize, limit: usize) -> (usize, usize) {
        let pad = black_box([depth as u8; 512]);
        let here = &pad as *const _ as usize;
        if here < limit {
            return (depth, pad[0] as usize);
        }
        let (d, s) = recurse(depth + 1, limit);
        (d, s + pad[1] as usize)
    }
    let st = stack();
    let region = st.region();
    let main = Slot::<P>::new();
    let ma = main.addr();
    // Stop 8 KiB above the bottom: "near the stack size".
    let limit = region.bottom() + 8 * 1024;
    // SAFETY: as in `ping_pong`.
    let ctx = unsafe {
        make_context_with::<P, _>(region, move |_| -> Infallible {
            let (depth, sum) = recurse(0, limit);
            let expect: usize = (0..=depth).map(|d| d % 256).sum();
            assert_eq!(sum, expect, "stack contents corrupted during recursion");
            restore_with(Slot::<P>::at(ma).take(), move || depth)
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    let depth = unsafe {
        swap_with(ctx, move |me| {
            Slot::<P>::at(ma).put(me);
            0
        })
    };
    assert!(depth > 100, "recursion went {depth} levels deep");
}

/// A context suspended on one OS thread is resumed on another and sees its
/// locals intact.
fn resume_on_other_thread<P: ContextPolicy>() {
    let st = stack();
    let main = Box::leak(Box::new(Slot::<P>::new()));
    let child = Box::leak(Box::new(Slot::<P>::new()));
    let (ma, ca) = (main.addr(), child.addr());
    // SAFETY: the context's stack outlives it; every switch goes through slots.
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |_| -> Infallible {
            let (main, child) = (Slot::<P>::at(ma), Slot::<P>::at(ca));
            let before = std::thread::current().id();
            let locals = black_box([0x5au8; 256]);
            let v = switch(main, child, 1);
            let after = std::thread::current().id();
            assert!(locals.iter().all(|&b| b == 0x5a));
            let moved = usize::from(before != after);
            restore_with(main.take(), move || v * 10 + moved)
        })
    }
    .unwrap();
    child.put(ctx);
    assert_eq!(switch(child, main, 0), 1);
    // The child is parked in `child`; resume it from another OS thread.
    let r = std::thread::spawn(move || {
        // SAFETY: both slots are leaked, so they live forever.
        let (main, child) = unsafe { (Slot::<P>::at(ma), Slot::<P>::at(ca)) };
        switch(child, main, 4)
    })
    .join()
    .unwrap();
    assert_eq!(r, 41, "resumed with 4 on a different thread");
}

/// A backtrace taken inside a context reaches the context's entry.
fn backtrace_reaches_entry<P: ContextPolicy>() {
    #[inline(never)]
    fn capture() -> String {
        black_box(std::backtrace::Backtrace::force_capture().to_string())
    }
    let st = stack();
    let main = Slot::<P>::new();
    let ma = main.addr();
    let out = Cell::new(String::new());
    let oa = &out as *const Cell<String> as usize;
    // SAFETY: as in `ping_pong`; `out` outlives the context.
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |_| -> Infallible {
            (*(oa as *const Cell<String>)).set(capture());
            restore_with(Slot::<P>::at(ma).take(), || 0)
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    unsafe {
        swap_with(ctx, move |me| {
            Slot::<P>::at(ma).put(me);
            0
        })
    };
    let bt = out.take();
    assert!(
        bt.contains("capture"),
        "backtrace lacks the capturing frame:\n{bt}"
    );
    assert!(
        bt.contains("entry_trampoline"),
        "backtrace does not reach the context entry:\n{bt}"
    );
}

/// Backtraces taken inside the ontop function of every primitive end cleanly:
/// they contain the capturing frame and no frame the unwinder could not
/// resolve (an unwinder that walks on from the switch with the wrong stack
/// pointer reads garbage return addresses, or crashes). Work-first thread
/// creation runs a whole child thread inside `save_context`'s function, so
/// this is what every panic message and backtrace in such a thread does.
fn backtrace_in_ontop_functions<P: ContextPolicy>() {
    type Seen = std::sync::Mutex<Vec<(&'static str, String)>>;
    #[inline(never)]
    fn record(seen: usize, what: &'static str) {
        let bt = black_box(std::backtrace::Backtrace::force_capture().to_string());
        // SAFETY: `seen` is the address of the test's `Seen`, which outlives
        // every context of the test.
        let seen = unsafe { &*(seen as *const Seen) };
        seen.lock().unwrap().push((what, bt));
    }
    let seen = Seen::new(Vec::new());
    let sa = &seen as *const Seen as usize;

    let st = stack();
    // SAFETY: the function returns, and nobody else resumes the saved context.
    let r = unsafe {
        save_with::<P, _>(st.region(), move |_parent| {
            record(sa, "save_context");
            7
        })
    };
    assert_eq!(r, 7);

    let main = Slot::<P>::new();
    let child = Slot::<P>::new();
    let (ma, ca) = (main.addr(), child.addr());
    // SAFETY: the stack outlives the context, which ends by restoring main.
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |_| -> Infallible {
            let main = Slot::<P>::at(ma).take();
            let raw = main.as_raw();
            let v = cond_swap_with(main, move |_me| {
                record(sa, "cond_swap_context cancelled");
                CondResult::cancel(5)
            });
            assert_eq!(v, 5);
            let main = Context::<P>::from_raw(raw);
            cond_swap_with(main, move |me| {
                Slot::<P>::at(ca).put(me);
                record(sa, "cond_swap_context");
                CondResult::proceed(1)
            });
            restore_with(Slot::<P>::at(ma).take(), move || {
                record(sa, "restore_context");
                3
            })
        })
    }
    .unwrap();
    // SAFETY: the slots resume every stored context exactly once.
    unsafe {
        let v = swap_with(ctx, move |me| {
            Slot::<P>::at(ma).put(me);
            record(sa, "swap_context");
            0
        });
        assert_eq!(v, 1);
        let v = swap_with(child.take(), move |me| {
            Slot::<P>::at(ma).put(me);
            record(sa, "swap_context again");
            0
        });
        assert_eq!(v, 3);
    }
    let seen = seen.into_inner().unwrap();
    let names: Vec<&str> = seen.iter().map(|s| s.0).collect();
    assert_eq!(
        names,
        [
            "save_context",
            "swap_context",
            "cond_swap_context cancelled",
            "cond_swap_context",
            "swap_context again",
            "restore_context"
        ]
    );
    for (what, bt) in &seen {
        assert!(
            bt.contains("record"),
            "{what}: backtrace lacks the capturing frame:\n{bt}"
        );
        assert!(
            !bt.contains("<unknown>"),
            "{what}: backtrace walked into garbage:\n{bt}"
        );
    }
}

/// Contexts on caller-provided memory (here a heap buffer, as the DSM will use
/// a segment).
fn raw_stack<P: ContextPolicy>() {
    let mut buf = vec![0u8; 128 * 1024];
    // SAFETY: `buf` outlives the context and is not otherwise used meanwhile.
    let raw = unsafe { RawStack::new(buf.as_mut_ptr(), buf.len()) }.unwrap();
    let region = raw.region();
    let main = Slot::<P>::new();
    let ma = main.addr();
    // SAFETY: as in `ping_pong`.
    let ctx = unsafe {
        make_context_with::<P, _>(region, move |v| -> Infallible {
            let here = 0u8;
            let inside = region.contains(&here as *const u8 as usize);
            restore_with(Slot::<P>::at(ma).take(), move || v + usize::from(inside))
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    let r = unsafe {
        swap_with(ctx, move |me| {
            Slot::<P>::at(ma).put(me);
            1
        })
    };
    assert_eq!(r, 2, "the context ran on the caller's memory");
    drop(buf);
}

/// A stack too small for the closure and the policy's minimum is refused.
fn too_small_stack_is_refused<P: ContextPolicy>() {
    let mut buf = vec![0u8; 8192];
    let big = [0u64; 1024];
    let region =
        StackRegion::new(buf.as_mut_ptr() as usize, buf.as_ptr() as usize + buf.len()).unwrap();
    // SAFETY: never resumed.
    let ctx = unsafe {
        make_context_with::<P, _>(region, move |_| -> Infallible {
            black_box(big);
            unreachable!()
        })
    };
    assert!(
        ctx.is_none(),
        "an 8 KiB closure cannot fit with a frame in 8 KiB"
    );
}

/// Runs in a child process: overflow a context's stack.
fn overflow_child<P: ContextPolicy>() {
    #[inline(never)]
    #[allow(unconditional_recursion)]
    fn smash(n: usize) -> usize {
        let pad = black_box([n as u8; 1024]);
        smash(n + 1) + pad[7] as usize
    }
    let st = MmapStack::new(64 * 1024).unwrap();
    assert!(st.overflow_detected());
    let main = Slot::<P>::new();
    let ma = main.addr();
    // SAFETY: the context never returns (it overflows).
    let ctx = unsafe {
        make_context_with::<P, _>(st.region(), move |_| -> Infallible {
            let n = smash(0);
            restore_with(Slot::<P>::at(ma).take(), move || n)
        })
    }
    .unwrap();
    // SAFETY: fresh context.
    unsafe {
        swap_with(ctx, move |me| {
            Slot::<P>::at(ma).put(me);
            0
        })
    };
    unreachable!("the overflow must end the process");
}

/// Runs `filter` (an ignored test of this binary) in a child process and
/// returns its exit status and stderr. A hang is killed after 60 s.
fn run_child(filter: &str) -> (std::process::ExitStatus, String) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            filter,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status, err);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("child test {filter} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn overflow_is_reported(filter: &str) {
    use std::os::unix::process::ExitStatusExt;
    let (status, err) = run_child(filter);
    assert_eq!(
        status.signal(),
        Some(libc::SIGABRT),
        "the overflow must abort the process (status {status:?}, stderr:\n{err})"
    );
    assert!(
        err.contains("stack overflow in user-level thread"),
        "missing overflow message in stderr:\n{err}"
    );
    // No layer set an overflow hint in the child: the generic advice.
    assert!(
        err.contains("); use a larger stack size\n"),
        "missing advice in stderr:\n{err}"
    );
}

#[test]
#[ignore = "helper: runs in a child process of `overflow_report_ends_with_the_hint`"]
fn overflow_hint_child() {
    ct_context::trap::set_overflow_hint(c"raise TEST_STACK_SIZE");
    overflow_child::<ct_context::DefaultPolicy>();
}

/// A layer's overflow hint replaces the generic advice.
#[test]
fn overflow_report_ends_with_the_hint() {
    let (_, err) = run_child("overflow_hint_child");
    assert!(
        err.contains("stack overflow in user-level thread"),
        "missing overflow message in stderr:\n{err}"
    );
    assert!(
        err.contains("); raise TEST_STACK_SIZE\n"),
        "missing hint in stderr:\n{err}"
    );
}

// --- The safe coroutine layer, on every policy. ---------------------------------

fn pool() -> StackPool {
    StackPool::with_options(64 * 1024, 1, 8).unwrap()
}

fn coroutine_values<P: ContextPolicy>() {
    let pool = pool();
    let mut co = Coroutine::<u64, u64, String, PooledStack, P>::with_stack(
        pool.get().unwrap(),
        |y, mut x| {
            let mut total = 0;
            while x != 0 {
                total += x;
                x = y.suspend(total);
            }
            format!("total {total}")
        },
    )
    .unwrap();
    assert!(!co.started());
    assert_eq!(co.resume(5), CoroutineResult::Yield(5));
    assert!(co.started() && !co.done());
    for i in 1..1000u64 {
        assert_eq!(co.resume(1), CoroutineResult::Yield(5 + i));
    }
    assert_eq!(
        co.resume(0),
        CoroutineResult::Return("total 1004".to_string())
    );
    assert!(co.done());
}

fn coroutine_panic_propagates<P: ContextPolicy>() {
    let pool = pool();
    let mut co =
        Coroutine::<(), u32, (), PooledStack, P>::with_stack(pool.get().unwrap(), |y, ()| {
            y.suspend(1);
            panic!("boom in coroutine");
        })
        .unwrap();
    assert_eq!(co.resume(()), CoroutineResult::Yield(1));
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| co.resume(())))
        .expect_err("the panic must reach the resumer");
    assert_eq!(err.downcast_ref::<&str>(), Some(&"boom in coroutine"));
    assert!(co.done(), "a panicked coroutine is finished");
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| co.resume(())));
    assert!(again.is_err(), "resuming a finished coroutine panics");
    drop(co);
    assert_eq!(pool.cached(), 1, "the stack went back to the pool");
}

fn coroutine_drop_unwinds<P: ContextPolicy>() {
    struct Count(Rc<Cell<u32>>);
    impl Drop for Count {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }
    let pool = pool();
    let drops = Rc::new(Cell::new(0));
    // Suspended with a live local: dropping the coroutine unwinds its stack.
    let d = drops.clone();
    let mut co =
        Coroutine::<(), (), (), PooledStack, P>::with_stack(pool.get().unwrap(), move |y, ()| {
            let _guard = Count(d);
            loop {
                y.suspend(());
            }
        })
        .unwrap();
    co.resume(());
    co.resume(());
    assert_eq!(drops.get(), 0);
    drop(co);
    assert_eq!(
        drops.get(),
        1,
        "dropping a suspended coroutine runs its destructors"
    );
    // Never started: the captured values are dropped without running the body.
    let d = Count(drops.clone());
    let co =
        Coroutine::<(), (), (), PooledStack, P>::with_stack(pool.get().unwrap(), move |_, ()| {
            let _keep = &d;
            unreachable!("never resumed")
        })
        .unwrap();
    drop(co);
    assert_eq!(drops.get(), 2, "an unstarted coroutine drops its closure");
    assert_eq!(pool.cached(), 1, "the reused stack went back to the pool");
}

fn coroutine_swallowed_unwind_leaks_stack<P: ContextPolicy>() {
    let pool = pool();
    let mut co =
        Coroutine::<(), (), (), PooledStack, P>::with_stack(pool.get().unwrap(), |y, ()| {
            loop {
                // Swallowing the forced unwind and suspending again leaves live
                // frames on the stack forever.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| y.suspend(())));
            }
        })
        .unwrap();
    co.resume(());
    drop(co);
    assert_eq!(
        pool.cached(),
        0,
        "a stack with live frames must never be reused"
    );
}

fn coroutine_iterator_and_into_stack<P: ContextPolicy>() {
    let pool = pool();
    let mut co =
        Coroutine::<(), u32, (), PooledStack, P>::with_stack(pool.get().unwrap(), |y, ()| {
            for i in 0..5 {
                y.suspend(i * i);
            }
        })
        .unwrap();
    let got: Vec<u32> = co.by_ref().collect();
    assert_eq!(got, [0, 1, 4, 9, 16]);
    assert_eq!(co.next(), None);
    let stack = co
        .into_stack()
        .expect("a finished coroutine gives its stack back");
    assert_eq!(stack.region().len(), 64 * 1024);
}

macro_rules! suite {
    ($module:ident, $policy:ty) => {
        mod $module {
            type P = $policy;

            #[test]
            fn ping_pong() {
                super::ping_pong::<P>();
            }
            #[test]
            fn ping_pong_into() {
                super::ping_pong_into::<P>();
            }
            #[test]
            fn plain_switch_delivers_data() {
                super::plain_switch_delivers_data::<P>();
            }
            #[test]
            fn cond_swap_cancel() {
                super::cond_swap_cancel::<P>();
            }
            #[test]
            fn cond_swap_proceed_from_context() {
                super::cond_swap_proceed_from_context::<P>();
            }
            #[test]
            fn restore_frees_abandoned_stack() {
                super::restore_frees_abandoned_stack::<P>();
            }
            #[test]
            fn nested_contexts() {
                super::nested_contexts::<P>();
            }
            #[test]
            fn deep_recursion() {
                super::deep_recursion::<P>();
            }
            #[test]
            fn resume_on_other_thread() {
                super::resume_on_other_thread::<P>();
            }
            #[test]
            fn backtrace_reaches_entry() {
                super::backtrace_reaches_entry::<P>();
            }
            #[test]
            fn backtrace_in_ontop_functions() {
                super::backtrace_in_ontop_functions::<P>();
            }
            #[test]
            fn raw_stack() {
                super::raw_stack::<P>();
            }
            #[test]
            fn too_small_stack_is_refused() {
                super::too_small_stack_is_refused::<P>();
            }
            #[test]
            #[ignore = "helper: runs in a child process of `overflow_is_reported`"]
            fn overflow_child() {
                super::overflow_child::<P>();
            }
            #[test]
            fn coroutine_values() {
                super::coroutine_values::<P>();
            }
            #[test]
            fn coroutine_panic_propagates() {
                super::coroutine_panic_propagates::<P>();
            }
            #[test]
            fn coroutine_drop_unwinds() {
                super::coroutine_drop_unwinds::<P>();
            }
            #[test]
            fn coroutine_swallowed_unwind_leaks_stack() {
                super::coroutine_swallowed_unwind_leaks_stack::<P>();
            }
            #[test]
            fn coroutine_iterator_and_into_stack() {
                super::coroutine_iterator_and_into_stack::<P>();
            }
            #[test]
            fn overflow_is_reported() {
                super::overflow_is_reported(concat!(stringify!($module), "::overflow_child"));
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
suite!(x86_64, ct_context::X86_64);
#[cfg(target_arch = "x86_64")]
suite!(x86_64_fpu, ct_context::X86_64Fpu);
suite!(portable, ct_context::Portable);
