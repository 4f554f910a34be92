//! A tiny round-robin scheduler built directly on the ontop primitives, plus a
//! generator built on the safe `Coroutine`.
//!
//! Each fiber yields by switching to the scheduler with an ontop function that
//! pushes the fiber's just-saved context onto the run queue — the pattern every
//! user-level thread scheduler in this workspace uses. When a fiber finishes it
//! switches away with `restore_context`, whose ontop function returns its stack
//! to the pool: the stack it is leaving.
//!
//! Run with `cargo run --release -p ct-context --example round_robin [fibers] [steps]`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;

use ct_context::{
    Context, Coroutine, DefaultPolicy, PooledStack, Stack, StackPool, make_context_with,
    restore_with, swap_with,
};

type P = DefaultPolicy;

/// Scheduler state, owned by the main thread.
struct Sched {
    /// Runnable fibers.
    ready: VecDeque<Context<P>>,
    /// The scheduler's own context while a fiber runs.
    home: Option<Context<P>>,
    /// Stacks of running fibers, indexed by fiber id.
    stacks: Vec<Option<PooledStack>>,
    log: Vec<String>,
}

thread_local! {
    static SCHED: RefCell<Sched> = const {
        RefCell::new(Sched { ready: VecDeque::new(), home: None, stacks: Vec::new(), log: Vec::new() })
    };
}

/// Called from a fiber: go back to the scheduler, re-queueing ourselves.
fn yield_now() {
    let home = SCHED.with(|s| {
        s.borrow_mut()
            .home
            .take()
            .expect("running under the scheduler")
    });
    // SAFETY: `home` is the suspended scheduler; the ontop function runs after
    // this fiber is saved and makes it runnable again.
    unsafe {
        swap_with(home, |me| {
            SCHED.with(|s| s.borrow_mut().ready.push_back(me));
            0
        })
    };
}

/// Called from a fiber as its last act: free our stack from the scheduler's
/// side and never come back.
fn exit(id: usize) -> ! {
    let home = SCHED.with(|s| {
        s.borrow_mut()
            .home
            .take()
            .expect("running under the scheduler")
    });
    // SAFETY: everything on this fiber's stack is dead; the ontop function runs
    // on the scheduler's stack, so it may return our stack to the pool.
    unsafe {
        restore_with(home, move || {
            SCHED.with(|s| drop(s.borrow_mut().stacks[id].take()));
            0
        })
    }
}

fn fiber_body(id: usize, steps: usize) -> ! {
    let mut acc = 0u64;
    for step in 0..steps {
        acc += (id * 1000 + step) as u64;
        SCHED.with(|s| s.borrow_mut().log.push(format!("fiber {id} step {step}")));
        yield_now();
    }
    SCHED.with(|s| {
        s.borrow_mut()
            .log
            .push(format!("fiber {id} done, sum {acc}"))
    });
    exit(id)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let fibers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let steps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);

    let pool = StackPool::new(64 * 1024).expect("map stacks");
    for id in 0..fibers {
        let stack = pool.get().expect("map a stack");
        // SAFETY: the stack is kept in `stacks[id]` until the fiber exits.
        let ctx = unsafe {
            make_context_with::<P, _>(stack.region(), move |_| -> Infallible {
                fiber_body(id, steps)
            })
        }
        .expect("stack large enough");
        SCHED.with(|s| {
            let mut s = s.borrow_mut();
            s.stacks.push(Some(stack));
            s.ready.push_back(ctx);
        });
    }

    // The scheduler loop: run the next fiber until none is left.
    let mut switches = 0;
    while let Some(next) = SCHED.with(|s| s.borrow_mut().ready.pop_front()) {
        // SAFETY: `next` is runnable; the ontop function records the scheduler's
        // context where the fiber will look for it.
        unsafe {
            swap_with(next, |me| {
                SCHED.with(|s| s.borrow_mut().home = Some(me));
                0
            })
        };
        switches += 1;
    }
    for line in SCHED.with(|s| std::mem::take(&mut s.borrow_mut().log)) {
        println!("{line}");
    }
    let live = SCHED.with(|s| s.borrow().stacks.iter().filter(|s| s.is_some()).count());
    assert_eq!(live, 0, "every fiber freed its stack");
    println!(
        "{fibers} fibers, {switches} switches into fibers, {} stacks back in the pool",
        pool.cached()
    );

    // The same idea, safely: a generator of Collatz sequences.
    let collatz = Coroutine::new(|y, mut n: u64| {
        let mut len = 0;
        while n != 1 {
            y.suspend(n);
            n = if n.is_multiple_of(2) {
                n / 2
            } else {
                3 * n + 1
            };
            len += 1;
        }
        len
    });
    let seq: Vec<u64> = collatz_run(collatz, 27);
    println!(
        "collatz(27): {} steps, peak {}",
        seq.len(),
        seq.iter().max().unwrap()
    );
}

fn collatz_run(mut co: Coroutine<u64, u64, u32>, start: u64) -> Vec<u64> {
    use ct_context::CoroutineResult;
    let mut out = Vec::new();
    let mut r = co.resume(start);
    loop {
        match r {
            CoroutineResult::Yield(v) => {
                out.push(v);
                r = co.resume(0);
            }
            CoroutineResult::Return(len) => {
                assert_eq!(len as usize, out.len());
                return out;
            }
        }
    }
}
