//! `gomp`: plain OpenMP C kernels (`tests/c/bench/*.c`), compiled once with
//! `gcc -fopenmp -O2`, run unmodified on GCC's libgomp and on our runtime
//! `libmenps_gomp.so` (preloaded) on P processes × T threads, in the same
//! run.
//!
//! ```text
//! cargo build --release -p menps-gomp
//! cargo bench -p tests --bench gomp_kernels
//! cargo bench -p tests --bench gomp_kernels -- --kernels ep,cg --classes S,W --runs 7
//! ```
//!
//! Kernels: `ep` (NPB EP: Gaussian pairs from the NPB generator, checked
//! against NPB's published sums), `cg` (conjugate gradient on a sparse
//! matrix), `fib` (task-parallel Fibonacci, no cutoff), `matmul` (dense
//! matrix multiply), `stencil` (2-D Jacobi heat sweeps with a
//! `reduction(max: …)` residual), `is` (NPB IS-like bucketed counting sort
//! with per-thread histograms), `mg` (NPB MG-like multigrid V-cycles on
//! `double ***` grids, a `parallel for` per operator), `ft` (NPB FT-like
//! 3-D FFT solver, strided lines gathered per thread), `lu` (NPB LU-like
//! SSOR whose sweeps are pipelined with a flag array and `flush`), `adi`
//! (SP/BT-like alternating-direction line solves, about five barriers per
//! time step), `barrier` (a barrier storm: the team barrier's own cost per
//! episode), `regions` (many short regions, each with a reduction into
//! `main`'s frame and a write to a heap array). Each verifies its own result and prints the seconds of its
//! timed part (`omp_get_wtime`, set-up and verification excluded); that is
//! the sample, so process start-up is not measured.
//!
//! Every round runs each implementation once, in turn: libgomp with 2
//! threads (`OMP_NUM_THREADS=2`, the baseline) and ours at every
//! configuration (`LD_PRELOAD=<lib> [MENPS_NPROCS=P] OMP_NUM_THREADS=P·T`);
//! one warm-up round, then `--runs` measured rounds, so the figures of one
//! kernel were taken close together in time.
//!
//! Output: for every kernel, class and implementation one JSON line of
//! seconds (min/median/max over the rounds); for every configuration of ours
//! also a line of per-round speed ratios, `"unit":"x-vs-libgomp"` (libgomp's
//! time divided by ours in the same round: above 1 is faster than libgomp),
//! as npb-like prints its `x-vs-1x2` ratios. Every line names the processor.
//! The exit status is non-zero if any run failed (crashed, hung, used the
//! wrong team size or failed its verification); the other measurements are
//! still printed.
//!
//! Our library is looked up like the C tests do ([`tests::our_library`]):
//! in the profile directory of this binary (`target/release/` under
//! `cargo bench`), or `MENPS_GOMP_LIB=<path>`.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ct_bench::{Args, Param, Stats, StealMeter, emit};
use tests::{OUR_LIBRARY, OUR_LIBRARY_ENV, Run, c_dir, gcc, profile_dir, run_libgomp, run_ours};

const HELP: &str = "\
gomp_kernels [--kernels ep,cg,fib,matmul,stencil,is,mg,ft,lu,adi,barrier,regions]
             [--classes S]
             [--configs 1x2,2x1,4x1] [--runs 5]

Plain OpenMP C kernels (tests/c/bench/), compiled once with gcc -fopenmp -O2,
on GCC's libgomp with 2 threads (the baseline) and on libmenps_gomp.so
(LD_PRELOAD) at P processes x T threads per process.
  --kernels  which kernels (default: all of ep, cg, fib, matmul, stencil,
             is, mg, ft, lu, adi, barrier, regions)
  --classes  size classes, S, W or A (default: S). With libgomp at 2 threads
             on an idle 2-core machine, S takes about 0.05-0.5 s per run, W
             about 0.3-3 s, A several seconds.
  --configs  our configurations as PxT (default: 1x2,2x1,4x1)
  --runs     measured rounds after one warm-up round (default: 5)
The sample is the kernel's own timing of its timed part. One JSON line of
seconds per kernel, class and implementation, plus a line of per-round
speed ratios vs libgomp (unit x-vs-libgomp) per configuration of ours.
Needs the release build of the library: cargo build --release -p menps-gomp
(or MENPS_GOMP_LIB=<path>). Exits non-zero if any run fails or is not
verified.";

/// The kernels, as `tests/c/bench/<name>.c`.
const KERNELS: [&str; 12] = [
    "ep", "cg", "fib", "matmul", "stencil", "is", "mg", "ft", "lu", "adi", "barrier", "regions",
];

/// The size classes the kernels accept.
const CLASSES: [&str; 3] = ["S", "W", "A"];

/// Team size of the libgomp baseline.
const LIBGOMP_THREADS: usize = 2;

/// An implementation measured for one kernel and class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    /// The system libgomp with [`LIBGOMP_THREADS`] threads.
    Libgomp,
    /// Our runtime on `procs` processes × `threads` threads each.
    Ours { procs: usize, threads: usize },
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Impl::Libgomp => "libgomp",
            Impl::Ours { .. } => "menps-gomp",
        }
    }

    /// (processes, threads per process).
    fn shape(self) -> (usize, usize) {
        match self {
            Impl::Libgomp => (1, LIBGOMP_THREADS),
            Impl::Ours { procs, threads } => (procs, threads),
        }
    }

    fn label(self) -> String {
        let (p, t) = self.shape();
        format!("{} {p}x{t}", self.name())
    }

    /// Runs `program class` once.
    fn run(self, program: &Path, class: &str) -> Run {
        match self {
            Impl::Libgomp => run_libgomp(program, &[class], LIBGOMP_THREADS),
            Impl::Ours { procs, threads } => run_ours(program, &[class], procs, threads),
        }
    }
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!("{HELP}");
        return;
    }
    let kernels: Vec<&str> = args.choices("kernels", "gomp_kernels", &KERNELS.map(|k| (k, k)));
    let classes: Vec<String> = args.list("classes", &["S".to_string()]);
    let configs: Vec<String> = args.list("configs", &["1x2", "2x1", "4x1"].map(String::from));
    let runs: usize = args.get("runs", 5);
    args.finish("gomp_kernels");
    if let Some(c) = classes.iter().find(|c| !CLASSES.contains(&c.as_str())) {
        eprintln!("gomp_kernels: unknown class {c:?} ({})", CLASSES.join(", "));
        std::process::exit(2);
    }
    if runs == 0 {
        eprintln!("gomp_kernels: --runs must be at least 1");
        std::process::exit(2);
    }
    let mut impls = vec![Impl::Libgomp];
    for c in &configs {
        let shape = c
            .split_once('x')
            .and_then(|(p, t)| Some((p.trim().parse().ok()?, t.trim().parse().ok()?)))
            .filter(|&(p, t): &(usize, usize)| p > 0 && t > 0);
        let Some((procs, threads)) = shape else {
            eprintln!("gomp_kernels: bad --configs entry {c:?} (expected PxT, e.g. 2x1)");
            std::process::exit(2);
        };
        impls.push(Impl::Ours { procs, threads });
    }

    check_library();
    let cpu = ct_bench::cpu_model();
    eprintln!(
        "gomp_kernels: processor {cpu}; library {}",
        tests::our_library().display()
    );
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gomp-kernels");
    let programs: BTreeMap<&str, PathBuf> = kernels
        .iter()
        .map(|&k| {
            let source = c_dir().join("bench").join(format!("{k}.c"));
            (k, gcc(&source, &out_dir.join(k), &[]))
        })
        .collect();

    let mut failures: Vec<String> = Vec::new();
    for &kernel in &kernels {
        for class in &classes {
            measure(
                kernel,
                class,
                &programs[kernel],
                &impls,
                runs,
                &cpu,
                &mut failures,
            );
        }
    }
    ct_bench::print_summary();
    if !failures.is_empty() {
        eprintln!("\ngomp_kernels: {} failed:", failures.len());
        for f in &failures {
            eprintln!("  {f}");
        }
        std::process::exit(1);
    }
}

/// Measures one kernel and class on every implementation, interleaved
/// round by round (round 0 is the warm-up), and prints its lines. An
/// implementation whose run fails is reported in `failures` and not run
/// again for this kernel and class.
fn measure(
    kernel: &str,
    class: &str,
    program: &Path,
    impls: &[Impl],
    runs: usize,
    cpu: &str,
    failures: &mut Vec<String>,
) {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); impls.len()];
    let mut failed = vec![false; impls.len()];
    let mut steal = StealMeter::start();
    for round in 0..=runs {
        if round == 1 {
            steal = StealMeter::start();
        }
        for (k, &imp) in impls.iter().enumerate() {
            if failed[k] {
                continue;
            }
            let what = format!("{kernel} {class} {}", imp.label());
            match run_once(kernel, class, program, imp) {
                Ok(secs) => {
                    let tag = if round == 0 {
                        "warm-up".to_string()
                    } else {
                        format!("run {round}")
                    };
                    eprintln!("gomp_kernels: {what} {tag}: {secs:.4} s");
                    if round > 0 {
                        times[k].push(secs);
                    }
                }
                Err(e) => {
                    eprintln!("gomp_kernels: {what} FAILED:\n{e}");
                    failures.push(format!("{what}: {}", e.lines().next().unwrap_or("")));
                    failed[k] = true;
                }
            }
        }
    }
    let steal = steal.pct();
    let base = impls
        .iter()
        .position(|&i| i == Impl::Libgomp)
        .filter(|&b| !failed[b]);
    for (k, &imp) in impls.iter().enumerate() {
        if failed[k] || times[k].is_empty() {
            continue;
        }
        let (procs, threads) = imp.shape();
        let params = |vs: bool| {
            let mut v: Vec<(&str, Param)> = vec![
                ("kernel", kernel.into()),
                ("class", class.into()),
                ("procs", procs.into()),
                ("threads_per_proc", threads.into()),
                ("cpu", cpu.into()),
            ];
            if vs {
                v.push(("vs", "libgomp".into()));
            }
            v
        };
        let stats = Stats::from_samples(&times[k]).with_host_steal(steal);
        emit(
            "menps-gomp",
            "gomp",
            imp.name(),
            &params(false),
            "s",
            &stats,
        );
        if let Some(b) = base.filter(|&b| b != k) {
            let ratios: Vec<f64> = times[b].iter().zip(&times[k]).map(|(l, o)| l / o).collect();
            let stats = Stats::from_samples(&ratios).with_host_steal(steal);
            emit(
                "menps-gomp",
                "gomp",
                imp.name(),
                &params(true),
                "x-vs-libgomp",
                &stats,
            );
        }
    }
}

/// One run of `program class` on `imp`: the kernel's timed seconds, or
/// what went wrong (a crash, a hang, a wrong team size, a failed
/// verification) with the run's report.
fn run_once(kernel: &str, class: &str, program: &Path, imp: Impl) -> Result<f64, String> {
    // The harness panics on a hang or on processes left behind, after
    // killing them; its message (with the output) is on stderr already.
    let run = catch_unwind(AssertUnwindSafe(|| imp.run(program, class))).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let why = msg
            .lines()
            .find(|l| l.starts_with("hung") || l.contains("still running"))
            .unwrap_or("the run failed");
        format!("{why} (the harness's message above has the output)")
    })?;
    // The first line of the message says what happened (and the first
    // line of stderr, which names a runtime error); then the whole report.
    let fail = |why: String| {
        let first = run.stderr.lines().next().unwrap_or("no output on stderr");
        Err(format!("{why}: {first}\n{}", run.report()))
    };
    let fields = parse_result(&run.stdout).unwrap_or_default();
    let field = |k: &str| fields.get(k).map(String::as_str);
    if field("verified") == Some("no") {
        return fail(format!(
            "not verified ({})",
            tests::describe_status(run.status)
        ));
    }
    if !run.status.success() {
        return fail(tests::describe_status(run.status));
    }
    if field("verified") != Some("yes") {
        return fail("no result line with verified=yes".into());
    }
    let (p, t) = imp.shape();
    if field("kernel") != Some(kernel) || field("class") != Some(class) {
        return fail("the result line names another kernel or class".into());
    }
    if field("threads") != Some(&(p * t).to_string()) {
        return fail(format!(
            "team of {:?} threads instead of {}",
            field("threads"),
            p * t
        ));
    }
    match field("time").and_then(|s| s.parse::<f64>().ok()) {
        Some(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => fail("no valid time= in the result line".into()),
    }
}

/// The `key=value` words of the kernel's `result` line.
fn parse_result(stdout: &str) -> Option<BTreeMap<String, String>> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("result "))?;
    Some(
        line.split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// Ends the process with a message saying how to build our library if it
/// is not where [`tests::our_library`] looks; warns if it is older than
/// the sources it is built from.
fn check_library() {
    if std::env::var_os(OUR_LIBRARY_ENV).is_some() {
        return;
    }
    let dir = profile_dir();
    let Some(lib) = [dir.join(OUR_LIBRARY), dir.join("deps").join(OUR_LIBRARY)]
        .into_iter()
        .find(|p| p.is_file())
    else {
        eprintln!(
            "gomp_kernels: our OpenMP runtime {OUR_LIBRARY} is not built in {}: run \
             `cargo build --release -p menps-gomp` first (with the same target directory), \
             or set {OUR_LIBRARY_ENV}=<path>",
            dir.display()
        );
        std::process::exit(1);
    };
    let built = std::fs::metadata(&lib).and_then(|m| m.modified()).ok();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."));
    let newest = [
        "menps-gomp",
        "menps-omp",
        "menps-dsm",
        "ct-worker",
        "ct-sync",
        "ct-context",
        "ct-delegate",
    ]
    .iter()
    .filter_map(|c| newest_mtime(&workspace.join(c).join("src")))
    .max();
    if let (Some(built), Some(newest)) = (built, newest)
        && newest > built
    {
        eprintln!(
            "gomp_kernels: warning: {} is older than its sources; rebuild it with \
             `cargo build --release -p menps-gomp`",
            lib.display()
        );
    }
}

/// The latest modification time of the files under `dir`.
fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let path = e.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            e.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}
