//! Parallel Fibonacci on user-level threads, with the scheduler's statistics.
//!
//! ```sh
//! cargo run --release -p ct-worker --example fib -- 32        # n (default 30)
//! CT_NUM_WORKERS=1 cargo run --release -p ct-worker --example fib
//! CT_TRACE=/tmp/fib.json cargo run --release -p ct-worker --example fib -- 20 trace
//! ```
//!
//! With `trace`, the run uses a tracing runtime and writes a Chrome trace to
//! the file named by `CT_TRACE` (open it in Perfetto).

use std::time::Instant;

use ct_worker::{Config, Runtime, StatsConfig, TraceConfig};

fn fib<C: Config>(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join_in::<C, _, _, _, _>(|| fib::<C>(n - 1), || fib::<C>(n - 2));
    a + b
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(30);
    let trace = args.next().as_deref() == Some("trace");

    if trace {
        let rt = Runtime::builder()
            .build_with::<TraceConfig>()
            .expect("runtime");
        let r = rt.block_on(|| fib::<TraceConfig>(n));
        let path = rt.aspect().path().map(|p| p.display().to_string());
        drop(rt);
        println!(
            "fib({n}) = {r}; trace: {}",
            path.unwrap_or_else(|| "none (set CT_TRACE)".into())
        );
        return;
    }

    let rt = Runtime::builder()
        .build_with::<StatsConfig>()
        .expect("runtime");
    let t = Instant::now();
    let r = rt.block_on(|| fib::<StatsConfig>(n));
    let secs = t.elapsed().as_secs_f64();
    let total = rt.aspect().total();
    println!(
        "fib({n}) = {r} in {secs:.3} s on {} workers: {} forks ({:.1} ns per fork+join), {} steals",
        rt.num_workers(),
        total.forks,
        secs * 1e9 / total.forks.max(1) as f64,
        total.steals
    );
    for (i, w) in rt.aspect().snapshot().iter().enumerate() {
        println!(
            "  worker {i}: {} forks, {} steals, {} switches, idle {:.3} s",
            w.forks,
            w.steals,
            w.switches,
            w.idle_ns as f64 * 1e-9
        );
    }
}
