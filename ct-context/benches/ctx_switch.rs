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
//!
//! Baselines in the same run: corosensei's own `resume` + `suspend`, and the
//! safe `ct_context::Coroutine` (resume + suspend) for comparison.
//! Output: JSON lines, ns per round trip (two switches).

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

/// Saved contexts of the two sides, as raw addresses.
static MAIN: AtomicUsize = AtomicUsize::new(0);
static CHILD: AtomicUsize = AtomicUsize::new(0);
/// The current mode, read by the child.
static MODE: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain = 0,
    Ontop = 1,
    OntopStore = 2,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Ontop => "ontop",
            Mode::OntopStore => "ontop-store",
        }
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

fn ctx<P: ContextPolicy>(addr: usize) -> Context<P> {
    // SAFETY: callers pass addresses of contexts of policy P saved by the
    // other side and not resumed since.
    unsafe { Context::from_raw(NonNull::new(addr as *mut u8).expect("context known")) }
}

/// One switch of either side: to the context at `to`, in mode `mode`; `store`
/// is the side's own slot-storing function. Returns the transferred value.
#[inline(always)]
fn switch<P: ContextPolicy>(mode: usize, to: usize, store: OntopFn<P>, v: usize) -> usize {
    // SAFETY: the two contexts alternate strictly; each resumes the other's
    // most recently saved context exactly once.
    unsafe {
        match mode {
            0 => P::swap_context(ctx::<P>(to), None, v),
            1 => P::swap_context(ctx::<P>(to), Some(pass_prev::<P>), v),
            _ => P::swap_context(ctx::<P>(to), Some(store), v),
        }
    }
}

/// Measures `round_trips` round trips of policy P; returns ns per round trip.
fn run_policy<P: ContextPolicy>(round_trips: usize, mode: Mode) -> f64 {
    let stack = MmapStack::new(64 * 1024).expect("map a stack");
    // SAFETY: the stack outlives the context, which is abandoned suspended
    // (nothing on its stack needs dropping).
    let child = unsafe {
        make_context_with::<P, _>(stack.region(), |mut v| -> Infallible {
            loop {
                let mode = MODE.load(Ordering::Relaxed);
                // In `ontop` mode the value is main's context; otherwise main
                // published it in MAIN.
                let to = if mode == 1 {
                    v
                } else {
                    MAIN.load(Ordering::Relaxed)
                };
                v = switch::<P>(mode, to, store_child::<P>, v.wrapping_add(1));
            }
        })
    }
    .expect("context fits");
    // Warm up in `ontop-store` mode, which publishes both contexts.
    MODE.store(2, Ordering::Relaxed);
    // SAFETY: fresh context.
    let mut v = unsafe { P::swap_context(child, Some(store_main::<P>), 0) };
    assert_eq!(v, 1);
    v = switch::<P>(2, CHILD.load(Ordering::Relaxed), store_main::<P>, v);
    assert_eq!(v, 2);
    let (m, c) = (MAIN.load(Ordering::Relaxed), CHILD.load(Ordering::Relaxed));
    let mode = mode as usize;
    MODE.store(mode, Ordering::Relaxed);

    let start = Instant::now();
    let mut to = c;
    for i in 0..round_trips {
        match mode {
            // The child receives main's context and sends back its own.
            1 => {
                let got = switch::<P>(1, to, store_main::<P>, 0);
                if got != c {
                    fail(&format!(
                        "round trip {i}: child context {got:#x}, expected {c:#x}"
                    ));
                }
                to = got;
            }
            0 => {
                let r = switch::<P>(0, c, store_main::<P>, v);
                if r != v.wrapping_add(1) {
                    fail(&format!("round trip {i}: sent {v}, got {r}"));
                }
                v = r;
            }
            _ => {
                let r = switch::<P>(2, CHILD.load(Ordering::Relaxed), store_main::<P>, v);
                if r != v.wrapping_add(1) {
                    fail(&format!("round trip {i}: sent {v}, got {r}"));
                }
                v = r;
            }
        }
    }
    let elapsed = start.elapsed();
    // Back to `ontop-store` once more to check that the saved contexts never
    // moved (the `plain` mode depends on it).
    MODE.store(2, Ordering::Relaxed);
    let next = if mode == 1 { to } else { c };
    let _ = switch::<P>(if mode == 1 { 1 } else { 2 }, next, store_main::<P>, v);
    if MAIN.load(Ordering::Relaxed) != m {
        fail("main's saved context moved: the plain mode's assumption does not hold");
    }
    drop(stack);
    elapsed.as_nanos() as f64 / round_trips as f64
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
             \x20          [--only x86_64,x86_64-fpu,portable,corosensei,ct-coroutine]\n\
             Prints one JSON line per policy and mode (plain, ontop, ontop-store),\n\
             plus corosensei's resume+suspend and ct_context::Coroutine, in ns per\n\
             round trip (two switches)."
        );
        return;
    }
    let n: usize = args.get("round-trips", 10_000_000);
    let runs: usize = args.get("runs", 7);
    let only: String = args.get("only", String::new());
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|o| o == name);
    let params = |mode: &str| vec![("round_trips", n.into()), ("mode", mode.into())];

    macro_rules! policy {
        ($p:ty) => {
            if wanted(<$p>::NAME) {
                for mode in [Mode::Plain, Mode::Ontop, Mode::OntopStore] {
                    eprintln!("{} {}...", <$p>::NAME, mode.name());
                    let s = repeat(runs, || run_policy::<$p>(n, mode));
                    emit(SUITE, BENCH, <$p>::NAME, &params(mode.name()), "ns", &s);
                }
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    {
        policy!(ct_context::X86_64);
        policy!(ct_context::X86_64Fpu);
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
    }
}
