//! The benchmark harness shared by the workspace's `cargo bench` targets.
//!
//! Every benchmark prints one JSON object per line on stdout (progress goes to
//! stderr):
//!
//! ```text
//! {"suite":"ct-context","bench":"ctx-switch","impl":"x86_64","params":{"round_trips":10000000},"unit":"ns","runs":7,"min":4.1,"median":4.3,"max":5.2}
//! ```
//!
//! Each measurement is repeated after one warm-up run; the minimum, median and
//! maximum are reported, since the machines this runs on are small and noisy.
//! Measurements made with [`repeat`] (or summarised with a [`StealMeter`]) on
//! Linux also report `"host_steal_pct"`: the share of the machine's CPU time
//! that the hypervisor gave to other guests while they ran (the `steal`
//! column of `/proc/stat`). A multi-worker figure taken while the host steals
//! time is not comparable with one taken while it does not.
//!
//! A benchmark reads its options with [`Args`] and calls [`Args::finish`],
//! which rejects unknown options (exit status 2), and ends with
//! [`print_summary`]: a table of its lines (median and min) on stderr.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
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

/// The processor's model name (`/proc/cpuinfo`'s first `model name`), or
/// `unknown`: benchmarks name the processor their figures came from.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
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

/// Measures how much CPU time the hypervisor stole over an interval, for
/// benchmarks that take their samples by hand (several implementations
/// interleaved run by run) instead of with [`repeat`]:
///
/// ```
/// let steal = ct_bench::StealMeter::start();
/// let samples = [1.0, 2.0, 3.0]; // measured meanwhile
/// let stats = ct_bench::Stats::from_samples(&samples).with_host_steal(steal.pct());
/// assert_eq!(stats.median, 2.0);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct StealMeter(Option<CpuTimes>);

impl StealMeter {
    /// Starts the interval now.
    pub fn start() -> Self {
        StealMeter(CpuTimes::now())
    }

    /// Percentage of all CPUs' time stolen since [`start`](Self::start);
    /// `None` where `/proc/stat` is unavailable or no tick passed.
    pub fn pct(&self) -> Option<f64> {
        self.0?.steal_pct_until(&CpuTimes::now()?)
    }
}

impl Stats {
    /// The same summary with `host_steal_pct` set to `pct` (see
    /// [`StealMeter`]).
    pub fn with_host_steal(mut self, pct: Option<f64>) -> Self {
        self.host_steal_pct = pct;
        self
    }
}

/// Runs `f` once to warm up, then `runs` more times, and summarises the values
/// it returns (each run measures and returns its own figure, e.g. ns per op).
pub fn repeat(runs: usize, mut f: impl FnMut() -> f64) -> Stats {
    let _ = f();
    let steal = StealMeter::start();
    let samples: Vec<f64> = (0..runs.max(1)).map(|_| f()).collect();
    Stats::from_samples(&samples).with_host_steal(steal.pct())
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

/// Prints one result line on stdout, and records it for
/// [`print_summary`].
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
    add_record(Record {
        suite: suite.to_string(),
        bench: bench.to_string(),
        implementation: implementation.to_string(),
        params: params
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Param::Str(s) => s.clone(),
                    p => param_json(p),
                };
                (k.to_string(), v)
            })
            .collect(),
        unit: unit.to_string(),
        median: stats.median,
        min: stats.min,
    });
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

/// One emitted result line, as the end-of-run summary shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The suite (crate).
    pub suite: String,
    /// The benchmark.
    pub bench: String,
    /// The implementation or baseline.
    pub implementation: String,
    /// The parameters, values as printed (strings unquoted).
    pub params: Vec<(String, String)>,
    /// The unit of `median` and `min`.
    pub unit: String,
    /// Median of the runs (NaN if the line had none).
    pub median: f64,
    /// Smallest run (NaN if the line had none).
    pub min: f64,
}

/// Lines emitted (or forwarded from a child process) so far in this process.
static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

fn add_record(r: Record) {
    RECORDS.lock().unwrap_or_else(|e| e.into_inner()).push(r);
}

/// The lines emitted so far by [`emit`] or recorded by [`record_json_line`].
pub fn records() -> Vec<Record> {
    RECORDS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Records a JSON result line that another process printed (a benchmark
/// that runs its measurements in child processes forwards their stdout and
/// records it, so its summary covers them). Returns `false`, recording
/// nothing, if the line is not a result line.
pub fn record_json_line(line: &str) -> bool {
    match parse_record(line) {
        Some(r) => {
            add_record(r);
            true
        }
        None => false,
    }
}

/// Runs `cmd` with its stdout piped through this process: every line is
/// printed on this process's stdout as it comes and recorded for the
/// summary ([`record_json_line`]). Stderr is left as it is.
pub fn run_forwarding(cmd: &mut Command) -> std::io::Result<ExitStatus> {
    let mut child = cmd.stdout(Stdio::piped()).spawn()?;
    let out = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(out).lines() {
        let line = line?;
        println!("{line}");
        record_json_line(&line);
    }
    child.wait()
}

/// Prints the [`summary_table`] of every line emitted so far on stderr
/// (nothing if there was none). Every benchmark calls it at the end of its
/// run; stdout keeps only the JSON lines.
pub fn print_summary() {
    let r = records();
    if !r.is_empty() {
        eprint!("{}", summary_table(&r));
    }
}

/// A human-readable table of `records`: bench, impl, params, median, min,
/// unit, one row per line. Parameters that every line has with the same
/// value are shown once above the table instead of in every row.
pub fn summary_table(records: &[Record]) -> String {
    let common: Vec<&(String, String)> = match records.first() {
        Some(first) if records.len() > 1 => first
            .params
            .iter()
            .filter(|p| records.iter().all(|r| r.params.contains(p)))
            .collect(),
        _ => Vec::new(),
    };
    let header = ["bench", "impl", "params", "median", "min", "unit"];
    let rows: Vec<[String; 6]> = records
        .iter()
        .map(|r| {
            let params: Vec<String> = r
                .params
                .iter()
                .filter(|p| !common.contains(p))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            [
                r.bench.clone(),
                r.implementation.clone(),
                clip(&params.join(" "), 60),
                short_num(r.median),
                short_num(r.min),
                r.unit.clone(),
            ]
        })
        .collect();
    let mut width = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = format!(
        "\nsummary: {} result line{}",
        records.len(),
        if records.len() == 1 { "" } else { "s" }
    );
    if !common.is_empty() {
        let c: Vec<String> = common.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(out, "; all with {}", clip(&c.join(" "), 200)).unwrap();
    }
    out.push('\n');
    let header = header.map(String::from);
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (c, w)) in row.iter().zip(width).enumerate() {
            let pad = w - c.chars().count();
            // Numbers right-aligned, text left-aligned.
            if i == 3 || i == 4 {
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            } else {
                line.push_str(c);
                line.push_str(&" ".repeat(pad));
            }
            line.push_str("  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `s` cut to `max` chars, with `…` marking the cut.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut c: String = s.chars().take(max - 1).collect();
        c.push('…');
        c
    }
}

/// About four significant digits, without an exponent.
fn short_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_string();
    }
    let a = v.abs();
    let decimals = if a >= 1000.0 || a == 0.0 {
        0
    } else {
        (3 - a.log10().floor() as i32).clamp(0, 9) as usize
    };
    format!("{v:.decimals$}")
}

/// Parses a result line in [`json_line`]'s format.
fn parse_record(line: &str) -> Option<Record> {
    let Json::Obj(fields) = Json::parse(line)? else {
        return None;
    };
    let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v);
    let text = |k: &str| match get(k)? {
        Json::Str(s) => Some(s.clone()),
        _ => None,
    };
    let number = |k: &str| match get(k) {
        Some(Json::Num(n)) => n.parse().unwrap_or(f64::NAN),
        _ => f64::NAN,
    };
    let params = match get("params")? {
        Json::Obj(ps) => ps.iter().map(|(k, v)| (k.clone(), v.show())).collect(),
        _ => return None,
    };
    Some(Record {
        suite: text("suite")?,
        bench: text("bench")?,
        implementation: text("impl")?,
        params,
        unit: text("unit")?,
        median: number("median"),
        min: number("min"),
    })
}

/// A JSON value (numbers kept as their text).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Parses one whole JSON text; `None` if it is not valid JSON.
    fn parse(s: &str) -> Option<Json> {
        let mut p = JsonParser {
            s: s.as_bytes(),
            i: 0,
        };
        let v = p.value(0)?;
        p.ws();
        (p.i == p.s.len()).then_some(v)
    }

    /// The value as the summary shows it (strings without quotes).
    fn show(&self) -> String {
        match self {
            Json::Null => "null".into(),
            Json::Bool(b) => b.to_string(),
            Json::Num(n) => n.clone(),
            Json::Str(s) => s.clone(),
            Json::Arr(a) => format!(
                "[{}]",
                a.iter().map(Json::show).collect::<Vec<_>>().join(",")
            ),
            Json::Obj(o) => format!(
                "{{{}}}",
                o.iter()
                    .map(|(k, v)| format!("{k}:{}", v.show()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Json> {
        if depth > 32 {
            return None;
        }
        self.ws();
        match *self.s.get(self.i)? {
            b'{' => self
                .sequence(b'}', |p| {
                    p.ws();
                    let k = p.string()?;
                    if !p.eat(b':') {
                        return None;
                    }
                    Some((k, p.value(depth + 1)?))
                })
                .map(Json::Obj),
            b'[' => self.sequence(b']', |p| p.value(depth + 1)).map(Json::Arr),
            b'"' => self.string().map(Json::Str),
            b'n' => self.word("null", Json::Null),
            b't' => self.word("true", Json::Bool(true)),
            b'f' => self.word("false", Json::Bool(false)),
            b'-' | b'0'..=b'9' => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                t.parse::<f64>().ok()?;
                Some(Json::Num(t.to_string()))
            }
            _ => None,
        }
    }

    /// The items of an object or array whose opening bracket is the current
    /// byte, up to and including `close`: `item` parses one, and items are
    /// separated by commas.
    fn sequence<T>(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        self.i += 1;
        let mut items = Vec::new();
        if self.eat(close) {
            return Some(items);
        }
        loop {
            items.push(item(self)?);
            if self.eat(close) {
                return Some(items);
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    fn word(&mut self, w: &str, v: Json) -> Option<Json> {
        if self.s[self.i..].starts_with(w.as_bytes()) {
            self.i += w.len();
            Some(v)
        } else {
            None
        }
    }

    /// A string starting at the current `"`.
    fn string(&mut self) -> Option<String> {
        if self.s.get(self.i) != Some(&b'"') {
            return None;
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let c = *self.s.get(self.i)?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
                            self.i += 4;
                            char::from_u32(u32::from_str_radix(hex, 16).ok()?).unwrap_or('\u{fffd}')
                        }
                        _ => return None,
                    };
                    out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                }
                c => out.push(c),
            }
        }
    }
}

/// Minimal `--name value` argument parsing for benchmark binaries (on `lexopt`), which
/// rejects what it does not know.
///
/// Values are given as `--name value` or `--name=value`; a `--name` without
/// a value is `true`. `cargo bench` passes `--bench` to harness-less targets;
/// it is ignored. `--help` (or `-h`) sets [`help`](Args::help).
///
/// Every option a benchmark reads ([`get`](Args::get), [`list`](Args::list),
/// [`choices`](Args::choices)) or declares ([`allow`](Args::allow)) is
/// *known*. After reading its options, a benchmark calls
/// [`finish`](Args::finish), which ends the process with status 2 and a
/// message naming the known options if the command line holds anything else
/// — a misspelled `--workerz 1` or a stray positional argument — instead of
/// running with the defaults:
///
/// ```
/// let args = ct_bench::Args::parse(["--bench", "--workers", "1,2"].map(String::from));
/// let workers: Vec<usize> = args.list("workers", &[1]);
/// let runs: usize = args.get("runs", 7);
/// args.finish("example"); // exits with status 2 on an unknown option
/// assert_eq!((workers, runs), (vec![1, 2], 7));
///
/// let typo = ct_bench::Args::parse(["--workerz", "1"].map(String::from));
/// let _: Vec<usize> = typo.list("workers", &[1]);
/// assert_eq!(
///     typo.check("example").unwrap_err(),
///     "example: unknown option --workerz (did you mean --workers?); \
///      options: --workers; --help describes them"
/// );
/// ```
#[derive(Debug, Default)]
pub struct Args {
    pairs: Vec<(String, String)>,
    /// Arguments that are not options (positional words, single-dash flags).
    stray: Vec<String>,
    help: bool,
    /// Option names read or declared so far, in that order.
    known: RefCell<Vec<String>>,
}

impl Args {
    /// Parses `std::env::args()`. A benchmark is a program: this also
    /// sends the warnings the libraries report through `log` to stderr
    /// (unless a logger is installed already).
    pub fn from_env() -> Self {
        static WARNINGS: WarningsToStderr = WarningsToStderr;
        if log::set_logger(&WARNINGS).is_ok() {
            log::set_max_level(log::LevelFilter::Warn);
        }
        Self::parse(std::env::args().skip(1))
    }

    /// Parses an argument list (with `lexopt`: `--name value`,
    /// `--name=value`, `-h`; after `--`, everything is positional).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Self {
        use lexopt::Arg::{Long, Short, Value};
        let mut out = Args::default();
        let mut p = lexopt::Parser::from_args(args);
        loop {
            let name = match p.next() {
                Ok(None) => break,
                Ok(Some(Short('h') | Long("help"))) => {
                    out.help = true;
                    continue;
                }
                // Passed by `cargo bench` to harness-less targets.
                Ok(Some(Long("bench"))) => continue,
                Ok(Some(Long(name))) => name.to_string(),
                Ok(Some(Short(c))) => {
                    out.stray.push(format!("-{c}"));
                    continue;
                }
                Ok(Some(Value(v))) => {
                    out.stray.push(v.to_string_lossy().into_owned());
                    continue;
                }
                Err(e) => {
                    out.stray.push(e.to_string());
                    continue;
                }
            };
            // `--name=value`, else the next argument unless it is an option
            // (`--name` alone is `true`).
            let value = p.optional_value().or_else(|| {
                p.try_raw_args()?
                    .next_if(|v| !v.to_str().is_some_and(|v| v.starts_with("--")))
            });
            let value =
                value.map_or_else(|| "true".to_string(), |v| v.to_string_lossy().into_owned());
            out.pairs.push((name, value));
        }
        out
    }

    /// Whether `--help` was given.
    pub fn help(&self) -> bool {
        self.help
    }

    /// Declares options that this benchmark reads elsewhere (in another
    /// process, or only on some paths), so [`finish`](Args::finish) accepts
    /// them.
    pub fn allow(&self, names: &[&str]) {
        for n in names {
            self.know(n);
        }
    }

    fn know(&self, name: &str) {
        let mut k = self.known.borrow_mut();
        if !k.iter().any(|x| x == name) {
            k.push(name.to_string());
        }
    }

    /// The last value of `--name`, marking the option known.
    fn value(&self, name: &str) -> Option<&str> {
        self.know(name);
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `--name`, parsed; `default` if absent. Exits with a message
    /// if the value does not parse.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.value(name) {
            None => default,
            Some(v) => v.parse().unwrap_or_else(|_| {
                eprintln!("invalid value for --{name}: {v}");
                std::process::exit(2)
            }),
        }
    }

    /// A comma-separated list, e.g. `--workers 1,2`.
    pub fn list<T: std::str::FromStr + Clone>(&self, name: &str, default: &[T]) -> Vec<T> {
        match self.value(name) {
            None => default.to_vec(),
            Some(v) => v
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

    /// What [`finish`](Args::finish) checks: `Err` with the message (naming
    /// `bench`) if the command line holds an option that was neither read
    /// nor [allowed](Args::allow), or an argument that is not an option.
    pub fn check(&self, bench: &str) -> Result<(), String> {
        let known = self.known.borrow();
        let mut problems: Vec<String> = Vec::new();
        for (k, _) in &self.pairs {
            if known.iter().any(|x| x == k) {
                continue;
            }
            let p = match closest(k, &known) {
                Some(c) => format!("unknown option --{k} (did you mean --{c}?)"),
                None => format!("unknown option --{k}"),
            };
            if !problems.contains(&p) {
                problems.push(p);
            }
        }
        for a in &self.stray {
            problems.push(format!(
                "unexpected argument {a:?} (options are --name value)"
            ));
        }
        if problems.is_empty() {
            return Ok(());
        }
        let options = if known.is_empty() {
            "this benchmark takes no options".to_string()
        } else {
            let names: Vec<String> = known.iter().map(|k| format!("--{k}")).collect();
            format!("options: {}", names.join(", "))
        };
        Err(format!(
            "{bench}: {}; {options}; --help describes them",
            problems.join(", ")
        ))
    }

    /// Ends the process with status 2 and [`check`](Args::check)'s message
    /// on stderr if the command line holds an unknown option or a stray
    /// argument. Call it after reading every option (and
    /// [allowing](Args::allow) those read elsewhere), before measuring.
    pub fn finish(&self, bench: &str) {
        if let Err(msg) = self.check(bench) {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    }
}

/// The benchmarks' `log` backend: warnings and errors on stderr, a line
/// each.
struct WarningsToStderr;

impl log::Log for WarningsToStderr {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("{}", r.args());
        }
    }
    fn flush(&self) {}
}

/// The known name closest to `name` by edit distance, if it is close enough
/// to be a typo of it.
fn closest<'a>(name: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), k))
        .filter(|&(d, k)| d <= 2 && d < k.len().max(name.len()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k.as_str())
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
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

    fn args(a: &[&str]) -> Args {
        Args::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn args_unknown_option_rejected() {
        let a = args(&["--workerz", "1", "--runs", "3"]);
        assert_eq!(a.list("workers", &[1usize, 2]), vec![1, 2]);
        assert_eq!(a.get("runs", 7usize), 3);
        let e = a.check("fib").unwrap_err();
        assert_eq!(
            e,
            "fib: unknown option --workerz (did you mean --workers?); \
             options: --workers, --runs; --help describes them"
        );
        // Far from every known name: no suggestion.
        let a = args(&["--frobnicate=1"]);
        let _ = a.get("runs", 7usize);
        let e = a.check("fib").unwrap_err();
        assert!(
            e.starts_with("fib: unknown option --frobnicate; options: --runs"),
            "{e}"
        );
    }

    #[test]
    fn args_stray_argument_rejected() {
        let a = args(&["--runs", "3", "extra", "-x"]);
        let _ = a.get("runs", 7usize);
        let e = a.check("b").unwrap_err();
        assert!(e.contains("unexpected argument \"extra\""), "{e}");
        assert!(e.contains("unexpected argument \"-x\""), "{e}");
        let e = args(&["x"]).check("b").unwrap_err();
        assert!(e.contains("this benchmark takes no options"), "{e}");
    }

    #[test]
    fn args_known_options_accepted() {
        let a = args(&[
            "--bench",
            "--n=5",
            "--workers",
            "1,2",
            "--quick",
            "--later",
            "x",
        ]);
        assert_eq!(a.get("n", 0usize), 5);
        assert_eq!(a.list("workers", &[9usize]), vec![1, 2]);
        assert!(a.get("quick", false));
        // Not given: still known, and no error.
        assert_eq!(a.get("runs", 7usize), 7);
        assert!(a.check("b").unwrap_err().contains("--later"));
        // Read elsewhere (another process): declared.
        a.allow(&["later"]);
        assert_eq!(a.check("b"), Ok(()));
        a.finish("b");
    }

    #[test]
    fn args_help_and_cargo_bench_flag() {
        // `cargo bench` passes `--bench`: neither an option nor an error.
        let a = args(&["--bench"]);
        assert!(!a.help());
        assert_eq!(a.check("b"), Ok(()));
        for h in ["--help", "-h"] {
            let a = args(&["--bench", h]);
            assert!(a.help());
            assert_eq!(a.check("b"), Ok(()));
        }
    }

    #[test]
    #[ignore = "helper: runs in a child process of `args_finish_exits_with_status_2`"]
    fn finish_child() {
        let a = args(&["--bench", "--workerz", "1"]);
        let _: Vec<usize> = a.list("workers", &[1]);
        a.finish("fib");
        println!("finish returned");
    }

    #[test]
    fn args_finish_exits_with_status_2() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["tests::finish_child", "--exact", "--ignored", "--nocapture"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "stderr:\n{err}");
        assert!(
            err.contains("fib: unknown option --workerz (did you mean --workers?)"),
            "stderr:\n{err}"
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("finish returned"));
    }

    #[test]
    fn edit_distance_and_suggestions() {
        assert_eq!(edit_distance("workerz", "workers"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("rnus", "runs"), 2);
        let known = ["runs".to_string(), "n".to_string()];
        assert_eq!(closest("rusn", &known), Some("runs"));
        assert_eq!(closest("m", &known), None);
        assert_eq!(closest("threads", &known), None);
    }

    #[test]
    fn json_line_parses_back() {
        let mut s = Stats::from_samples(&[1.5, 2.0, 2.25]);
        s.host_steal_pct = Some(3.0);
        let line = json_line(
            "ct-worker",
            "fib",
            "ct\"worker\\x\u{1}",
            &[
                ("n", 30usize.into()),
                ("mode", "a b".into()),
                ("f", 0.5.into()),
            ],
            "s",
            &s,
        );
        let r = parse_record(&line).expect("a result line");
        assert_eq!(
            r,
            Record {
                suite: "ct-worker".into(),
                bench: "fib".into(),
                implementation: "ct\"worker\\x\u{1}".into(),
                params: vec![
                    ("n".into(), "30".into()),
                    ("mode".into(), "a b".into()),
                    ("f".into(), "0.5".into())
                ],
                unit: "s".into(),
                median: 2.0,
                min: 1.5,
            }
        );
        assert_eq!(parse_record("npb-like-result 1.0 ok"), None);
        assert_eq!(parse_record(r#"{"suite":"a"}"#), None);
        assert_eq!(parse_record(r#"{"suite":"a","#), None);
        let nan = Stats::from_samples(&[f64::NAN.max(1.0)]);
        let r = parse_record(&json_line("a", "b", "c", &[], "s", &nan)).unwrap();
        assert_eq!(r.median, 1.0);
        let r = parse_record(
            r#"{"suite":"a","bench":"b","impl":"c","params":{},"unit":"s","min":null}"#,
        )
        .unwrap();
        assert!(r.min.is_nan() && r.median.is_nan());
    }

    fn rec(bench: &str, imp: &str, params: &[(&str, &str)], median: f64) -> Record {
        Record {
            suite: "s".into(),
            bench: bench.into(),
            implementation: imp.into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            unit: "ns".into(),
            median,
            min: median / 2.0,
        }
    }

    #[test]
    fn summary_table_layout() {
        let t = summary_table(&[
            rec("fib", "ct-worker", &[("n", "30"), ("cpu", "X")], 1234.5678),
            rec("fib", "rayon", &[("n", "35"), ("cpu", "X")], 0.012345),
        ]);
        assert_eq!(
            t,
            "\nsummary: 2 result lines; all with cpu=X\n\
             bench  impl       params   median       min  unit\n\
             fib    ct-worker  n=30       1235     617.3  ns\n\
             fib    rayon      n=35    0.01235  0.006173  ns\n"
        );
        // A single line keeps its parameters in its row.
        let t = summary_table(&[rec("b", "i", &[("k", "v")], f64::NAN)]);
        assert_eq!(
            t,
            "\nsummary: 1 result line\n\
             bench  impl  params  median  min  unit\n\
             b      i     k=v          -    -  ns\n"
        );
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short_num(4.3), "4.300");
        assert_eq!(short_num(75025.0), "75025");
        assert_eq!(short_num(0.0), "0");
        assert_eq!(short_num(-12.5), "-12.50");
        assert_eq!(short_num(f64::INFINITY), "-");
    }

    #[test]
    fn forwarded_lines_are_printed_and_recorded() {
        let line = json_line(
            "s",
            "forwarded-test",
            "i",
            &[],
            "ns",
            &Stats::from_samples(&[1.0]),
        );
        let st = run_forwarding(Command::new("printf").arg(format!("progress\n{line}\n"))).unwrap();
        assert!(st.success());
        let got: Vec<Record> = records()
            .into_iter()
            .filter(|r| r.bench == "forwarded-test")
            .collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].median, 1.0);
    }
}
