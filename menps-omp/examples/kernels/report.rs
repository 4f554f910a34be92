//! What every kernel of the examples and of the `npb_like` benchmark
//! reports: problem class, time, speed, verification.

use std::fmt;

/// A problem size in the NAS Parallel Benchmarks' naming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Small: a quick test.
    S,
    /// Workstation size.
    W,
}

impl Class {
    /// Parses `S` or `W` (either case).
    pub fn parse(s: &str) -> Result<Class, String> {
        match s.trim() {
            "S" | "s" => Ok(Class::S),
            "W" | "w" => Ok(Class::W),
            other => Err(format!("unknown class {other:?}: expected S or W")),
        }
    }

    /// The class from `--class X` on the command line or the `NPB_CLASS`
    /// variable (default `default`).
    pub fn from_args_or_env(default: Class) -> Result<Class, String> {
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            if a == "--class" {
                let v = args.next().ok_or("--class needs a value (S or W)")?;
                return Class::parse(&v);
            }
        }
        match std::env::var("NPB_CLASS") {
            Ok(v) if !v.trim().is_empty() => Class::parse(&v),
            _ => Ok(default),
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Class::S => "S",
            Class::W => "W",
        })
    }
}

/// The outcome of one run of a kernel.
#[derive(Debug, Clone)]
pub struct KernelResult {
    /// Kernel name (`ep`, `cg`, `is`, `matmul`, `stencil`).
    pub kernel: &'static str,
    /// Problem class.
    pub class: Class,
    /// Seconds of the timed part.
    pub seconds: f64,
    /// Millions of operations per second, in the kernel's own counting
    /// (NPB's for EP, CG and IS).
    pub mops: f64,
    /// Whether the result matched the reference values.
    pub verified: bool,
    /// What was compared (values found and expected).
    pub detail: String,
}

impl KernelResult {
    /// A short human-readable summary (several lines).
    pub fn summary(&self) -> String {
        format!(
            "{} class {}: {:.3} s, {:.1} Mop/s, verification {}\n  {}",
            self.kernel,
            self.class,
            self.seconds,
            self.mops,
            if self.verified {
                "SUCCESSFUL"
            } else {
                "FAILED"
            },
            self.detail
        )
    }
}

/// A kernel's two versions.
pub type Kernel = fn(Class) -> KernelResult;

/// The class and the menps-omp version of the example's kernel (set by
/// [`example_main`] in every process before the job starts, read by `main`
/// of the job on process 0: a `fn` job entry cannot capture them).
static OMP_KERNEL: std::sync::OnceLock<(Class, Kernel)> = std::sync::OnceLock::new();

/// The `main` of a kernel's example: `--class S|W` (or `NPB_CLASS`; default
/// `default_class`), `--rayon` (the rayon version in this process, no DSM);
/// otherwise a job of `procs` processes (unless `MENPS_NPROCS` says
/// otherwise) runs the menps-omp version and process 0 prints the result,
/// the team's shape and every process's DSM statistics. The exit status is
/// 1 if the verification failed.
pub fn example_main(
    name: &'static str,
    default_class: Class,
    procs: usize,
    omp: Kernel,
    rayon: Kernel,
) -> std::process::ExitCode {
    let class = Class::from_args_or_env(default_class).unwrap_or_else(|e| {
        eprintln!("{name}: {e}");
        std::process::exit(2)
    });
    let verified = if std::env::args().any(|a| a == "--rayon") {
        let r = rayon(class);
        say(&r.summary());
        say(&format!(
            "  rayon: {} threads",
            ::rayon::current_num_threads()
        ));
        r.verified
    } else {
        // The same value in every process of the job (they run this `main`).
        let _ = OMP_KERNEL.set((class, omp));
        match menps_omp::Builder::new().processes(procs).run(job_main) {
            Ok(v) => v,
            Err(e) => {
                menps_dsm::launch::report_failure(name, &e);
                false
            }
        }
    };
    if verified {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// `main` of the job (process 0): runs the kernel, prints the result and
/// the DSM statistics; returns whether it verified.
fn job_main() -> bool {
    let (class, omp) = *OMP_KERNEL.get().expect("example_main sets the kernel");
    let r = omp(class);
    say(&r.summary());
    let (procs, threads) = (menps_omp::num_processes(), menps_omp::max_threads());
    say(&format!(
        "  menps-omp: {procs} processes x {} threads (team of {threads})",
        threads / procs
    ));
    for (rank, s) in menps_omp::process_stats().iter().enumerate() {
        say(&format!(
            "  process {rank}: read faults {}, write faults {}, fetched {} KiB, invalidations {}, \
             transactions {}, fast releases {}, fast reads {}",
            s.read_faults,
            s.write_faults,
            s.bytes_fetched / 1024,
            s.invalidations,
            s.transactions,
            s.fast_releases,
            s.fast_reads
        ));
    }
    r.verified
}

/// Prints a line on stdout; a closed stdout (`| head`) is not an error of
/// the kernel.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}
