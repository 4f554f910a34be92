//! `ctx-switch`: the round-trip time of two contexts switching to each other.
//!
//! For every context policy, three modes (`params.mode`):
//!
//! - `plain`: each switch is `swap_context` with no ontop function. Both sides
//!   switch from one call site at a fixed stack depth, so each side's saved
//!   context has a fixed address, learned once through an ontop switch and
//!   checked again after the measurement.
//! - `ontop`: each switch is `swap_context` with a trivial ontop function that
//!   hands the just-saved context to the destination as the transferred value
//!   (the destination checks it and switches back to it);
//! - `ontop-store`: the ontop function stores the saved context in a shared slot
//!   that the other side reads, the way a scheduler publishes a continuation.
//! - `ontop-trivial`: like `plain` (fixed destinations), but every switch runs
//!   a trivial ontop function (it returns the transferred value): the cost of
//!   the ontop call itself.
//! - `into`: like `ontop-store`, but with `swap_context_into`, which stores
//!   the saved context in the side's slot as part of the switch (no function
//!   call on native policies). (In `ontop` the next destination is the value the
//!   previous switch delivered, so that mode is a dependent chain of switches,
//!   bound by latency, while `plain` can be overlapped by the processor.)
//!
//! Baselines in the same run: corosensei's own `resume` + `suspend`, the safe
//! `ct_context::Coroutine` (resume + suspend) for comparison, and `call-ret`:
//! two indirect calls of a trivial `extern "C"` function per "round trip",
//! each taking the previous result (a dependent chain, as the two ontop calls
//! of an `ontop-trivial` round trip are), with no switch at all. It is the
//! floor of what an ontop function adds to a round trip: `ontop-trivial` −
//! `plain` ≈ `call-ret` means the switch adds nothing around the call.
//! Output: JSON lines, ns per round trip (two switches), each with the
//! best (`min`) and the median of the runs (a min far below the median means
//! the host disturbed some runs) and the processor's model in `params.cpu`
//! (the costs depend on it: see the FPU policy's notes). At the end, on
//! stderr, the goals of the crate measured against the baselines of the same
//! run, as ratios of medians and of minimums:
//!
//! | line | goal |
//! |---|---|
//! | `x86_64` plain | ≤ 1.0 × corosensei (two switches cost no more than corosensei's two) |
//! | `x86_64-fpu` plain, ontop-trivial | ≤ 1.5 × `x86_64` in the same mode, loading control words the way picked for the processor (`params.loads`; the other way is measured too) |
//! | `portable` plain | ≤ 3 × corosensei |
//! | `portable` ontop | ≤ 4 × corosensei |
//! | `ct-coroutine` | ≤ 1.3 × corosensei |

use std::convert::Infallible;
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ct_bench::{Args, emit, repeat};
use ct_context::{
    Context, ContextPolicy, Coroutine, MmapStack, OntopFn, Portable, Stack, make_context_with,
};

const SUITE: &str = "ct-context";
const BENCH: &str = "ctx-switch";

/// Saved contexts of the two sides, as raw addresses (published by the
/// `store_*` ontop functions).
static MAIN: AtomicUsize = AtomicUsize::new(0);
static CHILD: AtomicUsize = AtomicUsize::new(0);

const PLAIN: u8 = 0;
const ONTOP: u8 = 1;
const ONTOP_STORE: u8 = 2;
const ONTOP_TRIVIAL: u8 = 3;
const INTO: u8 = 4;

fn mode_name(mode: u8) -> &'static str {
    match mode {
        PLAIN => "plain",
        ONTOP => "ontop",
        ONTOP_TRIVIAL => "ontop-trivial",
        INTO => "into",
        _ => "ontop-store",
    }
}

unsafe extern "C" fn store_main<P: ContextPolicy>(prev: Context<P>, data: usize) -> usize {
    MAIN.store(prev.into_raw().as_ptr() as usize, Ordering::Relaxed);
    data
}

unsafe extern "C" fn store_child<P: ContextPolicy>(prev: Context<P>, data: usize) -> usize {
    CHILD.store(prev.into_raw().as_ptr() as usize, Ordering::Relaxed);
    data
}

unsafe extern "C" fn pass_prev<P: ContextPolicy>(prev: Context<P>, _data: usize) -> usize {
    prev.into_raw().as_ptr() as usize
}

/// The trivial ontop function: the saved context stays where it is (its
/// address is fixed and known), the value passes through.
unsafe extern "C" fn keep_data<P: ContextPolicy>(_prev: Context<P>, data: usize) -> usize {
    data
}

fn ctx<P: ContextPolicy>(addr: usize) -> Context<P> {
    // SAFETY: callers pass addresses of contexts of policy P saved by the
    // other side and not resumed since.
    unsafe { Context::from_raw(NonNull::new(addr as *mut u8).expect("context known")) }
}

/// One switch in mode `MODE`. `store` is the side's own slot-storing function.
#[inline(always)]
fn switch<P: ContextPolicy, const MODE: u8>(
    to: usize,
    store: OntopFn<P>,
    slot: &AtomicUsize,
    v: usize,
) -> usize {
    // SAFETY: the two contexts alternate strictly; each resumes the other's
    // most recently saved context exactly once.
    unsafe {
        match MODE {
            PLAIN => P::swap_context(ctx::<P>(to), None, v),
            ONTOP => P::swap_context(ctx::<P>(to), Some(pass_prev::<P>), v),
            ONTOP_TRIVIAL => P::swap_context(ctx::<P>(to), Some(keep_data::<P>), v),
            // An `Option<Context>` is a nullable pointer, like the slot's usize.
            INTO => P::swap_context_into(ctx::<P>(to), slot.as_ptr().cast(), v),
            _ => P::swap_context(ctx::<P>(to), Some(store), v),
        }
    }
}

/// Measures `round_trips` round trips of policy P in mode `MODE`; returns ns
/// per round trip. Every transferred value is checked.
fn run_policy<P: ContextPolicy, const MODE: u8>(round_trips: usize) -> f64 {
    let stack = MmapStack::new(64 * 1024).expect("map a stack");
    // SAFETY: the stack outlives the context, which is abandoned suspended
    // (nothing on its stack needs dropping).
    let child = unsafe {
        make_context_with::<P, _>(stack.region(), |v| -> Infallible {
            // Warm-up: publish our context, learn main's.
            let mut v = switch::<P, ONTOP_STORE>(
                MAIN.load(Ordering::Relaxed),
                store_child::<P>,
                &CHILD,
                v + 1,
            );
            let main = MAIN.load(Ordering::Relaxed);
            match MODE {
                // Both saved contexts have fixed addresses from here on: each
                // side switches from one call site at a fixed stack depth.
                PLAIN | ONTOP_TRIVIAL => loop {
                    v = switch::<P, MODE>(main, store_child::<P>, &CHILD, v + 1);
                },
                // Main sends its context; we send back ours.
                ONTOP => loop {
                    v = switch::<P, ONTOP>(v, store_child::<P>, &CHILD, 0);
                },
                // ONTOP_STORE and INTO: each side publishes itself.
                _ => loop {
                    v = switch::<P, MODE>(
                        MAIN.load(Ordering::Relaxed),
                        store_child::<P>,
                        &CHILD,
                        v + 1,
                    );
                },
            }
        })
    }
    .expect("context fits");
    // SAFETY: fresh context.
    let v = unsafe { P::swap_context(child, Some(store_main::<P>), 0) };
    assert_eq!(v, 1);
    let c = CHILD.load(Ordering::Relaxed);

    let start = Instant::now();
    match MODE {
        PLAIN | ONTOP_TRIVIAL => {
            // The first switch still lands in the child's warm-up call.
            let mut v = switch::<P, ONTOP_STORE>(c, store_main::<P>, &MAIN, v);
            let c = CHILD.load(Ordering::Relaxed);
            for i in 0..round_trips {
                let r = switch::<P, MODE>(c, store_main::<P>, &MAIN, v);
                if r != v + 1 {
                    fail(&format!("round trip {i}: sent {v}, got {r}"));
                }
                v = r;
            }
        }
        ONTOP => {
            // The child's warm-up switch receives our context as the value;
            // from then on it answers from its loop, whose context is fixed.
            let mut to = switch::<P, ONTOP>(c, store_main::<P>, &MAIN, 0);
            let expect = to;
            for i in 0..round_trips {
                let got = switch::<P, ONTOP>(to, store_main::<P>, &MAIN, 0);
                if got != expect {
                    fail(&format!(
                        "round trip {i}: child context {got:#x}, expected {expect:#x}"
                    ));
                }
                to = got;
            }
        }
        _ => {
            let mut v = switch::<P, ONTOP_STORE>(c, store_main::<P>, &MAIN, v);
            for i in 0..round_trips {
                let r = switch::<P, MODE>(CHILD.load(Ordering::Relaxed), store_main::<P>, &MAIN, v);
                if r != v + 1 {
                    fail(&format!("round trip {i}: sent {v}, got {r}"));
                }
                v = r;
            }
        }
    }
    let elapsed = start.elapsed();
    drop(stack);
    elapsed.as_nanos() as f64 / round_trips as f64
}

/// The `call-ret` baseline's function: what `keep_data` does, without a switch.
#[inline(never)]
extern "C" fn pass_value(_prev: usize, data: usize) -> usize {
    data
}

fn run_call_ret(round_trips: usize) -> f64 {
    // Through `black_box`, so the call stays an indirect call, as the ontop
    // call is.
    let f: extern "C" fn(usize, usize) -> usize = black_box(pass_value);
    let mut v = 0usize;
    let start = Instant::now();
    for i in 0..round_trips {
        v = f(i, v);
        v = f(i, v) + 1;
    }
    let ns = start.elapsed().as_nanos() as f64 / round_trips as f64;
    if v != round_trips {
        fail("call-ret computed a wrong value");
    }
    ns
}

fn fail(msg: &str) -> ! {
    eprintln!("ctx_switch: {msg}");
    std::process::exit(1);
}

fn run_corosensei(round_trips: usize) -> f64 {
    let mut co = corosensei::Coroutine::new(|y: &corosensei::Yielder<usize, usize>, mut v| {
        loop {
            v = y.suspend(v + 1);
        }
    });
    let mut v = 0usize;
    let start = Instant::now();
    for _ in 0..round_trips {
        match co.resume(v) {
            corosensei::CoroutineResult::Yield(r) if r == v + 1 => v = r,
            _ => fail("corosensei returned a wrong value"),
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / round_trips as f64;
    black_box(v);
    // The coroutine never finishes; forget it instead of force-unwinding.
    std::mem::forget(co);
    ns
}

fn run_coroutine<P: ContextPolicy>(round_trips: usize) -> f64 {
    let stack = MmapStack::new(64 * 1024).expect("map a stack");
    let mut co = Coroutine::<usize, usize, (), MmapStack, P>::with_stack(stack, |y, mut v| {
        loop {
            v = y.suspend(v + 1);
        }
    })
    .expect("coroutine");
    let mut v = 0usize;
    let start = Instant::now();
    for _ in 0..round_trips {
        match co.resume(v).as_yield() {
            Some(r) if r == v + 1 => v = r,
            _ => fail("Coroutine returned a wrong value"),
        }
    }
    start.elapsed().as_nanos() as f64 / round_trips as f64
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "ctx_switch [--round-trips N (default 10000000)] [--runs R (default 7)]\n\
             \x20          [--only x86_64,x86_64-fpu,portable,corosensei,ct-coroutine,call-ret]\n\
             Prints one JSON line per policy and mode (plain, ontop-trivial, ontop,\n\
             ontop-store, into), plus corosensei's resume+suspend, ct_context::Coroutine\n\
             and two calls of a trivial function (call-ret),\n\
             in ns per round trip (two switches): best (min) and median of the runs,\n\
             with the processor model in params.cpu. Then, on stderr, the crate's\n\
             goals as ratios to the baselines of the same run."
        );
        return;
    }
    let n: usize = args.get("round-trips", 10_000_000);
    let runs: usize = args.get("runs", 7);
    let only: String = args.get("only", String::new());
    args.finish("ctx_switch");
    const NAMES: [&str; 6] = [
        "x86_64",
        "x86_64-fpu",
        "portable",
        "corosensei",
        "ct-coroutine",
        "call-ret",
    ];
    if let Some(bad) = only
        .split(',')
        .find(|o| !o.is_empty() && !NAMES.contains(o))
    {
        eprintln!(
            "ctx_switch: unknown --only name {bad} ({})",
            NAMES.join(", ")
        );
        std::process::exit(2);
    }
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|o| o == name);
    let cpu = ct_bench::cpu_model();
    let params = |mode: &str| {
        vec![
            ("round_trips", n.into()),
            ("mode", mode.into()),
            ("cpu", cpu.as_str().into()),
        ]
    };
    // (impl, mode, stats) of every line, for the goals at the end.
    let mut results: Vec<(&str, &str, ct_bench::Stats)> = Vec::new();

    macro_rules! policy {
        ($p:ty) => {
            policy!($p, <$p>::NAME, [])
        };
        // `label` names the line in the goals; `extra` are more params.
        ($p:ty, $label:expr, [$($extra:expr),*]) => {
            if wanted(<$p>::NAME) {
                let modes: [(u8, fn(usize) -> f64); 5] = [
                    (PLAIN, run_policy::<$p, PLAIN>),
                    (ONTOP_TRIVIAL, run_policy::<$p, ONTOP_TRIVIAL>),
                    (ONTOP, run_policy::<$p, ONTOP>),
                    (ONTOP_STORE, run_policy::<$p, ONTOP_STORE>),
                    (INTO, run_policy::<$p, INTO>),
                ];
                for (mode, run) in modes {
                    eprintln!("{} {}...", <$p>::NAME, mode_name(mode));
                    let s = repeat(runs, || run(n));
                    let mut p = params(mode_name(mode));
                    p.extend([$($extra),*]);
                    emit(SUITE, BENCH, <$p>::NAME, &p, "ns", &s);
                    results.push(($label, mode_name(mode), s));
                }
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    {
        policy!(ct_context::X86_64);
        // The FPU policy both ways of loading control words, the one picked
        // for this processor first (the goals' line); the other's lines are
        // named with it.
        use ct_context::{FpuLoads, X86_64Fpu};
        let picked = X86_64Fpu::loads();
        let name = |l: FpuLoads| match l {
            FpuLoads::Compare => "compare",
            FpuLoads::Always => "always",
        };
        let other = match picked {
            FpuLoads::Compare => FpuLoads::Always,
            FpuLoads::Always => FpuLoads::Compare,
        };
        policy!(X86_64Fpu, "x86_64-fpu", [("loads", name(picked).into())]);
        X86_64Fpu::set_loads(other);
        let label = match other {
            FpuLoads::Compare => "x86_64-fpu loads=compare",
            FpuLoads::Always => "x86_64-fpu loads=always",
        };
        policy!(X86_64Fpu, label, [("loads", name(other).into())]);
        X86_64Fpu::set_loads(picked);
    }
    policy!(Portable);

    if wanted("corosensei") {
        eprintln!("corosensei...");
        let s = repeat(runs, || run_corosensei(n));
        emit(
            SUITE,
            BENCH,
            "corosensei",
            &params("resume-suspend"),
            "ns",
            &s,
        );
        results.push(("corosensei", "resume-suspend", s));
    }
    if wanted("ct-coroutine") {
        eprintln!("ct_context::Coroutine...");
        let s = repeat(runs, || run_coroutine::<ct_context::DefaultPolicy>(n));
        emit(
            SUITE,
            BENCH,
            "ct-coroutine",
            &params("resume-suspend"),
            "ns",
            &s,
        );
        results.push(("ct-coroutine", "resume-suspend", s));
    }
    if wanted("call-ret") {
        eprintln!("call-ret...");
        let s = repeat(runs, || run_call_ret(n));
        emit(SUITE, BENCH, "call-ret", &params("two-calls"), "ns", &s);
    }
    ct_bench::print_summary();
    print_goals(&results);
}

/// Prints, on stderr, each goal of the crate whose lines were measured: the
/// ratio of the medians and of the minimums, and whether each meets it.
fn print_goals(results: &[(&str, &str, ct_bench::Stats)]) {
    let find = |i: &str, m: &str| {
        results
            .iter()
            .find(|(ri, rm, _)| *ri == i && *rm == m)
            .map(|r| r.2)
    };
    const COROSENSEI: (&str, &str) = ("corosensei", "resume-suspend");
    /// (impl, mode) of a line.
    type Line = (&'static str, &'static str);
    let goals: [(Line, Line, f64); 11] = [
        (("x86_64", "plain"), COROSENSEI, 1.0),
        (("x86_64-fpu", "plain"), ("x86_64", "plain"), 1.5),
        (
            ("x86_64-fpu", "ontop-trivial"),
            ("x86_64", "ontop-trivial"),
            1.5,
        ),
        // The way of loading not picked for this processor, for comparison.
        (
            ("x86_64-fpu loads=compare", "plain"),
            ("x86_64", "plain"),
            1.5,
        ),
        (
            ("x86_64-fpu loads=compare", "ontop-trivial"),
            ("x86_64", "ontop-trivial"),
            1.5,
        ),
        (
            ("x86_64-fpu loads=always", "plain"),
            ("x86_64", "plain"),
            1.5,
        ),
        (
            ("x86_64-fpu loads=always", "ontop-trivial"),
            ("x86_64", "ontop-trivial"),
            1.5,
        ),
        (("portable", "plain"), COROSENSEI, 3.0),
        (("portable", "ontop"), COROSENSEI, 4.0),
        (("ct-coroutine", "resume-suspend"), COROSENSEI, 1.3),
        (("x86_64", "into"), COROSENSEI, 1.3),
    ];
    let mut lines = Vec::new();
    for ((i, m), (bi, bm), goal) in goals {
        let (Some(s), Some(b)) = (find(i, m), find(bi, bm)) else {
            continue;
        };
        let (med, min) = (s.median / b.median, s.min / b.min);
        let verdict = |r: f64| if r <= goal { "met" } else { "NOT met" };
        lines.push(format!(
            "{i} {m} / {bi} {bm}: median {med:.2}x ({}), min {min:.2}x ({}); goal <= {goal}x",
            verdict(med),
            verdict(min)
        ));
    }
    if !lines.is_empty() {
        eprintln!("\ngoals (ratios in this run):");
        for l in lines {
            eprintln!("  {l}");
        }
    }
}
