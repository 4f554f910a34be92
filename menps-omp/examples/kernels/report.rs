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
            if self.verified { "SUCCESSFUL" } else { "FAILED" },
            self.detail
        )
    }
}
