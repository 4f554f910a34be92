//! The benchmark harness shared by the workspace's `cargo bench` targets.
//!
//! Every benchmark prints one JSON object per line on stdout (progress goes to
//! stderr), in the format of `shared/design/benchmarks.md`:
//!
//! ```text
//! {"suite":"ct-context","bench":"ctx-switch","impl":"x86_64","params":{"round_trips":10000000},"unit":"ns","runs":7,"min":4.1,"median":4.3,"max":5.2}
//! ```
//!
//! Each measurement is repeated after one warm-up run; the minimum, median and
//! maximum are reported, since the machines this runs on are small and noisy.
//! Measurements made with [`repeat`] on Linux also report
//! `"host_steal_pct"`: the share of the machine's CPU time that the
//! hypervisor gave to other guests while they ran (the `steal` column of
//! `/proc/stat`). A multi-worker figure taken while the host steals time is
//! not comparable with one taken while it does not.

use std::fmt::Write as _;
use std::time::Instant;

/// A parameter value in the `params` object.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
}

impl From<i64> for Param {
    fn from(v: i64) -> Self {
        Param::Int(v)
    }
}
impl From<usize> for Param {
    fn from(v: usize) -> Self {
        Param::Int(v as i64)
    }
}
impl From<u64> for Param {
    fn from(v: u64) -> Self {
        Param::Int(v as i64)
    }
}
impl From<u32> for Param {
    fn from(v: u32) -> Self {
        Param::Int(v as i64)
    }
}
impl From<f64> for Param {
    fn from(v: f64) -> Self {
        Param::Float(v)
    }
}
impl From<&str> for Param {
    fn from(v: &str) -> Self {
        Param::Str(v.to_string())
    }
}
impl From<String> for Param {
    fn from(v: String) -> Self {
        Param::Str(v)
    }
}

/// Summary of repeated measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// Number of measured runs (the warm-up is not counted).
    pub runs: usize,
    /// Smallest value.
    pub min: f64,
    /// Median value (mean of the two middle values for an even count).
    pub median: f64,
    /// Largest value.
    pub max: f64,
    /// Percentage of all CPUs' time stolen by the hypervisor during the
    /// measured runs (`None` where `/proc/stat` is unavailable).
    pub host_steal_pct: Option<f64>,
}

impl Stats {
    /// Summarises `samples`. Panics if it is empty or contains NaN.
    pub fn from_samples(samples: &[f64]) -> Self {
        assert!(!samples.is_empty(), "no samples");
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.partial_cmp(b).expect("NaN sample"));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stats {
            runs: n,
            min: v[0],
            median,
            max: v[n - 1],
            host_steal_pct: None,
        }
    }
}

/// A reading of the machine-wide CPU time counters of `/proc/stat`, to
/// tell how much time the hypervisor stole between two readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks stolen by the hypervisor (all CPUs).
    pub steal: u64,
    /// All ticks (all CPUs, all states).
    pub total: u64,
}

impl CpuTimes {
    /// Reads `/proc/stat`; `None` where it does not exist or cannot be parsed.
    pub fn now() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Parses the aggregate `cpu` line of a `/proc/stat` text: user, nice,
    /// system, idle, iowait, irq, softirq, steal, ... (the guest columns are
    /// already included in user and nice, so they are not added again).
    pub fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let cols: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|c| c.parse().ok())
            .collect::<Option<_>>()?;
        if cols.len() < 8 {
            return None;
        }
        Some(CpuTimes {
            steal: cols[7],
            total: cols[..8].iter().sum(),
        })
    }

    /// Percentage of the ticks between `self` and the later reading `later`
    /// that were stolen; `None` if no tick passed.
    pub fn steal_pct_until(&self, later: &CpuTimes) -> Option<f64> {
        let total = later.total.checked_sub(self.total)?;
        let steal = later.steal.checked_sub(self.steal)?;
        (total > 0).then(|| 100.0 * steal as f64 / total as f64)
    }
}

/// Runs `f` once to warm up, then `runs` more times, and summarises the values
/// it returns (each run measures and returns its own figure, e.g. ns per op).
pub fn repeat(runs: usize, mut f: impl FnMut() -> f64) -> Stats {
    let _ = f();
    let before = CpuTimes::now();
    let samples: Vec<f64> = (0..runs.max(1)).map(|_| f()).collect();
    let mut stats = Stats::from_samples(&samples);
    if let (Some(b), Some(a)) = (before, CpuTimes::now()) {
        stats.host_steal_pct = b.steal_pct_until(&a);
    }
    stats
}

/// Round-trip time of one cache line between two OS threads (each waits for
/// the other's store), in ns: what a lock hand-off or a wake-up between two
/// cores costs on this machine *now*. On a virtual machine it changes with
/// where the host places the vCPUs (tens of ns on cores sharing a cache,
/// hundreds across sockets or dies), and every multi-worker figure with it,
/// so the multi-worker benchmarks print it alongside.
pub fn line_round_trip_ns(round_trips: u64) -> f64 {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let line = Arc::new(AtomicU64::new(0));
    let other = line.clone();
    let echo = std::thread::spawn(move || {
        for i in 0..round_trips {
            while other.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            other.store(2 * i + 2, Ordering::Release);
        }
    });
    let t = Instant::now();
    for i in 0..round_trips {
        line.store(2 * i + 1, Ordering::Release);
        while line.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / round_trips as f64;
    echo.join().expect("echo thread");
    ns
}

/// Emits the [`line_round_trip_ns`] baseline (`impl` = `line-round-trip`,
/// 100,000 round trips per run) for benchmark `bench` of `suite`.
pub fn emit_line_round_trip(suite: &str, bench: &str, runs: usize) {
    let s = repeat(runs, || line_round_trip_ns(100_000));
    emit(
        suite,
        bench,
        "line-round-trip",
        &[("threads", 2usize.into())],
        "ns",
        &s,
    );
}

/// Seconds taken by `f`.
pub fn time_secs(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Formats one result line.
pub fn json_line(
    suite: &str,
    bench: &str,
    implementation: &str,
    params: &[(&str, Param)],
    unit: &str,
    stats: &Stats,
) -> String {
    let mut s = String::new();
    write!(
        s,
        "{{\"suite\":{},\"bench\":{},\"impl\":{},\"params\":{{",
        quote(suite),
        quote(bench),
        quote(implementation)
    )
    .unwrap();
    for (i, (k, v)) in params.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        write!(s, "{}:{}", quote(k), param_json(v)).unwrap();
    }
    write!(
        s,
        "}},\"unit\":{},\"runs\":{},\"min\":{},\"median\":{},\"max\":{}",
        quote(unit),
        stats.runs,
        num(stats.min),
        num(stats.median),
        num(stats.max)
    )
    .unwrap();
    if let Some(p) = stats.host_steal_pct {
        write!(s, ",\"host_steal_pct\":{}", num(p)).unwrap();
    }
    s.push('}');
    s
}

/// Prints one result line on stdout.
pub fn emit(
    suite: &str,
    bench: &str,
    implementation: &str,
    params: &[(&str, Param)],
    unit: &str,
    stats: &Stats,
) {
    println!(
        "{}",
        json_line(suite, bench, implementation, params, unit, stats)
    );
}

fn param_json(p: &Param) -> String {
    match p {
        Param::Int(i) => i.to_string(),
        Param::Float(f) => num(*f),
        Param::Str(s) => quote(s),
    }
}

fn num(f: f64) -> String {
    if f.is_finite() {
        // Four significant decimals are plenty for noisy timings.
        let s = format!("{f:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        "null".to_string()
    }
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Minimal `--name value` argument parsing for benchmark binaries.
///
/// `cargo bench` passes `--bench` to harness-less targets; it is ignored.
#[derive(Debug, Default)]
pub struct Args {
    pairs: Vec<(String, String)>,
    help: bool,
}

impl Args {
    /// Parses `std::env::args()`.
    pub fn from_env() -> Self {
        Self::parse(std::env::args().skip(1))
    }

    /// Parses an argument list.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Self {
        let mut out = Args::default();
        let mut it = args.into_iter().peekable();
        while let Some(a) = it.next() {
            if a == "--help" || a == "-h" {
                out.help = true;
            } else if a == "--bench" {
                continue;
            } else if let Some(name) = a.strip_prefix("--") {
                if let Some((k, v)) = name.split_once('=') {
                    out.pairs.push((k.to_string(), v.to_string()));
                } else if let Some(v) = it.next_if(|v| !v.starts_with("--")) {
                    out.pairs.push((name.to_string(), v));
                } else {
                    out.pairs.push((name.to_string(), "true".to_string()));
                }
            }
        }
        out
    }

    /// Whether `--help` was given.
    pub fn help(&self) -> bool {
        self.help
    }

    /// The value of `--name`, parsed; `default` if absent. Exits with a message
    /// if the value does not parse.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.pairs.iter().rev().find(|(k, _)| k == name) {
            None => default,
            Some((_, v)) => v.parse().unwrap_or_else(|_| {
                eprintln!("invalid value for --{name}: {v}");
                std::process::exit(2)
            }),
        }
    }

    /// A comma-separated list, e.g. `--workers 1,2`.
    pub fn list<T: std::str::FromStr + Clone>(&self, name: &str, default: &[T]) -> Vec<T> {
        match self.pairs.iter().rev().find(|(k, _)| k == name) {
            None => default.to_vec(),
            Some((_, v)) => v
                .split(',')
                .map(|x| {
                    x.trim().parse().unwrap_or_else(|_| {
                        eprintln!("invalid value in --{name}: {x}");
                        std::process::exit(2)
                    })
                })
                .collect(),
        }
    }

    /// A comma-separated list of names among `choices` (`name`, value),
    /// e.g. `--methods direct,dynamic`; all of them if absent. Exits with a
    /// message naming `bench` and the valid names on an unknown name.
    pub fn choices<T: Copy>(&self, name: &str, bench: &str, choices: &[(&str, T)]) -> Vec<T> {
        let all: Vec<String> = choices.iter().map(|(n, _)| n.to_string()).collect();
        self.list(name, &all)
            .iter()
            .map(|n| {
                choices
                    .iter()
                    .find(|(c, _)| c == n)
                    .map(|&(_, v)| v)
                    .unwrap_or_else(|| {
                        eprintln!("{bench}: unknown --{name} value {n} ({})", all.join(", "));
                        std::process::exit(2)
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_pick_named_values() {
        let a = Args::parse(["--methods".to_string(), "b,a".to_string()]);
        assert_eq!(a.choices("methods", "t", &[("a", 1), ("b", 2)]), vec![2, 1]);
        assert_eq!(a.choices("other", "t", &[("a", 1), ("b", 2)]), vec![1, 2]);
    }

    #[test]
    fn stats_median() {
        let s = Stats::from_samples(&[3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max, s.runs), (1.0, 2.0, 3.0, 3));
        let s = Stats::from_samples(&[4.0, 1.0, 2.0, 3.0]);
        assert_eq!(s.median, 2.5);
    }

    #[test]
    fn json_format() {
        let s = Stats::from_samples(&[1.5, 2.0, 2.25]);
        let line = json_line(
            "ct-worker",
            "fib",
            "ct\"worker",
            &[("n", 30usize.into()), ("mode", "x".into())],
            "s",
            &s,
        );
        assert_eq!(
            line,
            r#"{"suite":"ct-worker","bench":"fib","impl":"ct\"worker","params":{"n":30,"mode":"x"},"unit":"s","runs":3,"min":1.5,"median":2,"max":2.25}"#
        );
    }

    #[test]
    fn json_reports_host_steal() {
        let mut s = Stats::from_samples(&[1.0]);
        s.host_steal_pct = Some(12.5);
        let line = json_line("a", "b", "c", &[], "s", &s);
        assert_eq!(
            line,
            r#"{"suite":"a","bench":"b","impl":"c","params":{},"unit":"s","runs":1,"min":1,"median":1,"max":1,"host_steal_pct":12.5}"#
        );
    }

    #[test]
    fn cpu_times_parse_and_steal() {
        let before = "cpu  100 0 50 800 10 0 5 35 7 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n";
        let after = "cpu  200 0 100 1500 10 0 10 85 9 0\n";
        let b = CpuTimes::parse(before).unwrap();
        assert_eq!(
            b,
            CpuTimes {
                steal: 35,
                total: 1000
            }
        );
        let a = CpuTimes::parse(after).unwrap();
        // 905 more ticks, 50 of them stolen.
        let pct = b.steal_pct_until(&a).unwrap();
        assert!((pct - 100.0 * 50.0 / 905.0).abs() < 1e-9, "{pct}");
        assert_eq!(b.steal_pct_until(&b), None);
        assert_eq!(CpuTimes::parse("cpu0 1 2 3\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 3 4 5 6 7\n"), None);
    }

    #[test]
    fn repeat_reports_host_steal_on_linux() {
        let s = repeat(2, || {
            let t = Instant::now();
            while t.elapsed().as_millis() < 30 {}
            1.0
        });
        if cfg!(target_os = "linux") {
            let p = s.host_steal_pct.expect("steal measured");
            assert!((0.0..=100.0).contains(&p), "{p}");
        }
    }

    #[test]
    fn args_parse() {
        let a = Args::parse(
            ["--bench", "--n", "5", "--workers=1,2", "--quick"]
                .iter()
                .map(|s| s.to_string()),
        );
        assert_eq!(a.get("n", 0usize), 5);
        assert_eq!(a.list("workers", &[9usize]), vec![1, 2]);
        assert!(a.get("quick", false));
        assert_eq!(a.get("absent", 7u32), 7);
    }
}
