//! `idle`: CPU time an idle runtime uses. The runtime runs a short burst of
//! work (so that workers are warm and then go idle), then sits idle for the
//! measured period; the process's user+system CPU time over that period is
//! reported, in seconds and as a fraction of one core. There is no baseline:
//! the ideal is zero.

use std::time::{Duration, Instant};

use ct_bench::{Args, emit, repeat};

fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn fib(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join(|| fib(n - 1), || fib(n - 2));
    a + b
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "idle [--secs 2] [--workers 2] [--runs 5]\n\
             Prints JSON lines: CPU seconds used by an idle runtime over --secs seconds."
        );
        return;
    }
    let secs: f64 = args.get("secs", 2.0);
    let workers: usize = args.get("workers", 2);
    let runs: usize = args.get("runs", 5);
    args.finish("idle");
    let rt = ct_worker::Runtime::builder()
        .workers(workers)
        .build()
        .expect("runtime");
    let s = repeat(runs, || {
        if rt.block_on(|| fib(20)) != 6765 {
            eprintln!("wrong fib result");
            std::process::exit(1);
        }
        let c0 = cpu_seconds();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        let cpu = cpu_seconds() - c0;
        let wall = t0.elapsed().as_secs_f64();
        cpu / wall
    });
    emit(
        "ct-worker",
        "idle",
        "ct-worker",
        &[("secs", secs.into()), ("workers", workers.into())],
        "cores",
        &s,
    );
    ct_bench::print_summary();
}
