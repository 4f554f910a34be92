//! Parallel Fibonacci on user-level threads, with the scheduler's statistics,
//! or a trace of the run.
//!
//! ```sh
//! cargo run --release -p ct-worker --example fib -- 32        # n (default 30)
//! CT_NUM_WORKERS=1 cargo run --release -p ct-worker --example fib
//! CT_TRACE=/tmp/fib.json cargo run --release -p ct-worker --example fib -- 20
//! ```
//!
//! With `CT_TRACE` set, the run uses a tracing runtime and writes a Chrome
//! trace to that file (open it in Perfetto); otherwise one that counts
//! forks and steals. `fib` is written once, with the plain `ct_worker::join`,
//! which works in a runtime of any configuration.

use std::time::Instant;

use ct_worker::{Runtime, StatsConfig, TraceConfig};

fn fib(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join(|| fib(n - 1), || fib(n - 2));
    a + b
}

fn main() {
    // Warnings the libraries report (through `log`) go to stderr.
    ct_worker::log_to_stderr();
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(30);

    // The tracing runtime reads CT_TRACE itself (and fails to build if the
    // file cannot be created); here we only choose it when a trace is asked.
    if std::env::var_os("CT_TRACE").is_some() {
        let rt = match Runtime::builder().build_with::<TraceConfig>() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("fib: {e}");
                std::process::exit(1);
            }
        };
        let r = rt.block_on(|| fib(n));
        let path = rt.aspect().path().map(|p| p.display().to_string());
        drop(rt);
        println!("fib({n}) = {r}; trace: {}", path.unwrap_or_default());
        return;
    }

    let rt = Runtime::builder()
        .build_with::<StatsConfig>()
        .expect("runtime");
    let t = Instant::now();
    let r = rt.block_on(|| fib(n));
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
