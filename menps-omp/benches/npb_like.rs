//! `npb-like`: the EP, CG and IS kernels of the NAS Parallel Benchmarks, a
//! dense matrix multiply and a 2-D stencil, verified, with menps-omp on
//! P processes × T threads against the same program on 1 process × 2
//! threads and against a rayon version with 2 threads, in the same run.
//!
//! ```text
//! cargo bench -p menps-omp --bench npb_like
//! cargo bench -p menps-omp --bench npb_like -- --kernels ep,cg --classes S,W --rounds 7
//! ```
//!
//! Options: `--kernels` (ep, cg, is, matmul, stencil; default all),
//! `--classes` (S, W; default W), `--configs` (processes x threads; default
//! `1x2,2x1,4x1`), `--rounds` (measured rounds, default 5, after one
//! warm-up run inside every job). Every round runs each configuration as a
//! job of this executable (the processes are started afresh; set-up and a
//! warm-up run are untimed) and the rayon version in this process, so a
//! round's figures were taken close together in time.
//!
//! Output: for every kernel, class and implementation one JSON line of the
//! kernel's timed seconds; then, for every configuration and for rayon, one
//! line of speed ratios `"unit":"x-vs-1x2"` (time at 1×2 divided by the
//! time here, per round: above 1 is faster than one process with two
//! threads). Every line names the processor. The exit status is non-zero if
//! any run failed its verification.

use std::process::{Command, Stdio};

use ct_bench::{Args, Param, Stats, emit};

// The examples' drivers (`report::example_main`) are not used here.
#[allow(dead_code)]
#[path = "../examples/kernels/mod.rs"]
mod kernels;

use kernels::report::Class;

const CHILD_KERNEL: &str = "NPB_LIKE_KERNEL";
const CHILD_CLASS: &str = "NPB_LIKE_CLASS";
const RESULT: &str = "npb-like-result";

fn main() {
    if std::env::var(CHILD_KERNEL).is_ok() {
        return child();
    }
    let args = Args::from_env();
    if args.help() {
        eprintln!(
            "npb_like [--kernels ep,cg,is,matmul,stencil] [--classes W] [--configs 1x2,2x1,4x1] \
             [--rounds 5]\n  menps-omp at P processes x T threads vs 1x2 vs rayon (2 threads); \
             JSON lines on stdout"
        );
        return;
    }
    let names: Vec<String> = args.list("kernels", &kernels::KERNELS.map(String::from));
    let classes: Vec<String> = args.list("classes", &["W".to_string()]);
    let configs: Vec<String> = args.list(
        "configs",
        &["1x2".to_string(), "2x1".to_string(), "4x1".to_string()],
    );
    let rounds: usize = args.get("rounds", 5).max(1);
    args.finish("npb_like");
    let configs: Vec<(usize, usize)> = configs
        .iter()
        .map(|c| {
            c.split_once('x')
                .and_then(|(p, t)| Some((p.parse().ok()?, t.parse().ok()?)))
                .filter(|&(p, t): &(usize, usize)| p > 0 && t > 0)
                .unwrap_or_else(|| {
                    eprintln!("npb_like: bad --configs entry {c:?} (expected PxT, e.g. 2x1)");
                    std::process::exit(2)
                })
        })
        .collect();
    // Every name is checked before anything runs.
    if let Some(name) = names
        .iter()
        .find(|n| !kernels::KERNELS.contains(&n.as_str()))
    {
        eprintln!(
            "npb_like: unknown kernel {name:?} ({})",
            kernels::KERNELS.join(", ")
        );
        std::process::exit(2);
    }
    let classes: Vec<Class> = classes
        .iter()
        .map(|c| {
            Class::parse(c).unwrap_or_else(|e| {
                eprintln!("npb_like: {e}");
                std::process::exit(2)
            })
        })
        .collect();
    let cpu = ct_bench::cpu_model();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("rayon pool");
    let mut failed = false;
    for name in &names {
        for &class in &classes {
            // times[c][round]; the last entry is rayon.
            let mut times = vec![Vec::new(); configs.len() + 1];
            let steal = ct_bench::StealMeter::start();
            for round in 0..rounds {
                for (k, &(p, t)) in configs.iter().enumerate() {
                    eprintln!("npb_like: {name} {class} {p}x{t} round {round}");
                    match job(name, class, p, t) {
                        Ok((secs, ok)) => {
                            failed |= !ok;
                            times[k].push(secs);
                        }
                        Err(e) => {
                            eprintln!("npb_like: {name} {class} {p}x{t}: {e}");
                            failed = true;
                        }
                    }
                }
                eprintln!("npb_like: {name} {class} rayon round {round}");
                let secs = pool.install(|| {
                    // One warm-up run, one measured.
                    let _ = kernels::run_rayon(name, class);
                    let r = kernels::run_rayon(name, class).expect("known kernel");
                    if !r.verified {
                        eprintln!("npb_like: rayon {}", r.summary());
                    }
                    failed |= !r.verified;
                    r.seconds
                });
                times[configs.len()].push(secs);
            }
            let steal = steal.pct();
            let base = configs.iter().position(|&c| c == (1, 2));
            for (k, ts) in times.iter().enumerate() {
                if ts.is_empty() {
                    continue;
                }
                let (implementation, procs, threads) = match configs.get(k) {
                    Some(&(p, t)) => ("menps-omp", p, t),
                    None => ("rayon", 1, 2),
                };
                let params = |extra: Option<&str>| {
                    let mut v: Vec<(&str, Param)> = vec![
                        ("kernel", name.as_str().into()),
                        ("class", class.to_string().into()),
                        ("procs", procs.into()),
                        ("threads_per_proc", threads.into()),
                        ("cpu", cpu.as_str().into()),
                    ];
                    if let Some(e) = extra {
                        v.push(("vs", e.into()));
                    }
                    v
                };
                emit(
                    "menps-omp",
                    "npb-like",
                    implementation,
                    &params(None),
                    "s",
                    &Stats::from_samples(ts).with_host_steal(steal),
                );
                if let Some(b) = base.filter(|&b| b != k) {
                    let ratios: Vec<f64> = times[b]
                        .iter()
                        .zip(ts)
                        .map(|(base, here)| base / here)
                        .collect();
                    if !ratios.is_empty() {
                        emit(
                            "menps-omp",
                            "npb-like",
                            implementation,
                            &params(Some("1x2")),
                            "x-vs-1x2",
                            &Stats::from_samples(&ratios).with_host_steal(steal),
                        );
                    }
                }
            }
        }
    }
    ct_bench::print_summary();
    if failed {
        eprintln!("npb_like: a run failed its verification");
        std::process::exit(1);
    }
}

/// Runs one job of `p` processes × `t` threads: a warm-up run and a
/// measured one; returns the measured seconds and whether both verified.
fn job(name: &str, class: Class, p: usize, t: usize) -> Result<(f64, bool), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("MENPS_") || k.starts_with("OMP_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env(CHILD_KERNEL, name)
        .env(CHILD_CLASS, class.to_string())
        .env("MENPS_NPROCS", p.to_string())
        .env("OMP_NUM_THREADS", (p * t).to_string())
        .env("MENPS_TIMEOUT_SECS", "600")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start the job: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let results: Vec<(f64, bool)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix(RESULT))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()? == "ok"))
        })
        .collect();
    if !out.status.success() || results.len() != 2 {
        return Err(format!("the job failed ({}):\n{stdout}", out.status));
    }
    Ok((results[1].0, results.iter().all(|r| r.1)))
}

/// A job process: runs the kernel twice in `menps_omp::run`.
fn child() {
    let r = menps_omp::run(|| {
        let name = std::env::var(CHILD_KERNEL).unwrap_or_default();
        let class = Class::parse(&std::env::var(CHILD_CLASS).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..2 {
            let r = kernels::run_omp(&name, class).unwrap_or_else(|| panic!("kernel {name}?"));
            if !r.verified {
                eprintln!("npb_like: {}", r.summary());
            }
            println!(
                "{RESULT} {} {}",
                r.seconds,
                if r.verified { "ok" } else { "failed" }
            );
        }
    });
    if let Err(e) = r {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
