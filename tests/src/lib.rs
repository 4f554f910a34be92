//! Harness for the C OpenMP test programs in `tests/c/`.
//!
//! Each program in `tests/c/*.c` is a small self-checking OpenMP program:
//! it prints output that does not depend on the team size, ends with a
//! `PASS` line and exit status 0 if its own checks pass, and prints
//! `FAIL: <what>` and exits with 1 otherwise. The integration tests
//! (`tests/tests/c_programs.rs`) compile every program with the system
//! `gcc -fopenmp -O2` and run it
//!
//! * with GCC's own libgomp at 2 and 4 threads (the reference output), and
//! * with our runtime, `libmenps_gomp.so`, on 1 process × 2 threads,
//!   2 × 1, 2 × 2 and 4 × 1 ([`run_ours`]): the output must equal
//!   libgomp's at the same total thread count;
//!
//! plus a run through the stand-alone `menps run` launcher
//! ([`run_ours_launcher`]), a program linked against our library instead of
//! libgomp ([`run_ours_linked`]) and a program that uses an entry point our
//! runtime does not provide (it must fail, naming it).
//!
//! The programs: `data_sharing` (main's locals, globals, heap from main
//! and from team threads), `loop_schedules` (every schedule, ull loops,
//! strides, collapse, nowait, lastprivate), `reductions`,
//! `sync_constructs` (critical, atomic, single, copyprivate, master,
//! barrier), `sections_ordered`, `locks`, `tasks`, `queries` (the `omp_*`
//! routines), `exit_call` (`exit(0)` from main), `exit_status` (main
//! returns 3), `cg_kernel` (a verified CG solve and matrix product),
//! `cancel_disabled` (`cancel for` with cancellation off; refused with
//! `OMP_CANCELLATION=true`) and `unsupported_doacross` (needs entry
//! points our runtime does not offer: it must abort naming one). `tests/harness.rs` tests
//! the harness itself (time limit, leftover processes).
//!
//! Run them with `cargo test -p tests`. Our library and the launcher are
//! looked up in the cargo profile directory of the test binary
//! (`target/debug/` or its `deps/`); build them first, e.g. with
//! `cargo test --workspace` or `cargo build --workspace`. A missing library
//! fails the tests (after their libgomp half ran); `MENPS_GOMP_LIB=<path>`
//! points them at another build of the library.
//!
//! Every run has a time limit ([`RUN_TIMEOUT`]): a hang fails the test,
//! and the program's process group and every process that inherited the
//! run's tag are killed, so nothing is left behind. Runs are serialized
//! (the machine may have few cores); compilations are not.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Time limit of one run; the program's process group is killed after it.
/// Longer than [`OURS_TIMEOUT_SECS`] so that our runtime's own time limit
/// (and its diagnostics) comes first.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(75);

/// `MENPS_TIMEOUT_SECS` of every run with our runtime.
pub const OURS_TIMEOUT_SECS: u64 = 60;

/// File name of our runtime library.
pub const OUR_LIBRARY: &str = "libmenps_gomp.so";

/// Environment variable naming our library explicitly (overrides the
/// lookup in the profile directory).
pub const OUR_LIBRARY_ENV: &str = "MENPS_GOMP_LIB";

/// Environment variable that tags every process of one run, so that
/// processes left behind can be found (and killed) whatever their process
/// group.
const RUN_TAG: &str = "CTESTS_RUN_TAG";

/// How long processes of a run may outlive its main process.
pub const LEFTOVER_GRACE: Duration = Duration::from_secs(5);

/// Directory of the C sources.
pub fn c_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("c")
}

/// Path of the C program `name` (`tests/c/<name>.c`).
pub fn c_source(name: &str) -> PathBuf {
    c_dir().join(format!("{name}.c"))
}

/// Every `.c` program in `tests/c/`, by name without extension.
pub fn all_programs() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(c_dir())
        .expect("read tests/c")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".c").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// Runs `gcc -fopenmp -O2 -o <out> <source> <extra...> -lm`, writing the
/// executable next to `out` first and renaming it into place (so tests, or
/// concurrent `cargo test` runs, never see a half-written file). Panics
/// with gcc's messages if the compilation fails.
pub fn gcc(source: &Path, out: &Path, extra: &[&OsStr]) -> PathBuf {
    build_into(out, "gcc (is gcc installed?)", |tmp| {
        let mut cmd = Command::new("gcc");
        cmd.args(["-fopenmp", "-O2", "-o"])
            .arg(tmp)
            .arg(source)
            .args(extra)
            .arg("-lm");
        cmd
    })
}

/// Runs the compiler command `make(tmp)` writing a temporary file next to
/// `out`, then renames it to `out` (so that concurrent test runs never see
/// a half-written executable); returns `out`. Panics with the compiler's
/// messages if it fails (`what` names it).
fn build_into(out: &Path, what: &str, make: impl FnOnce(&Path) -> Command) -> PathBuf {
    let dir = out.parent().expect("output has a directory");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let mut cmd = make(&tmp);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        output.status.success(),
        "compiling {} failed ({cmd:?}):\n{}",
        out.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&tmp, out)
        .unwrap_or_else(|e| panic!("rename {} -> {}: {e}", tmp.display(), out.display()));
    out.to_path_buf()
}

/// Compiles `tests/c/<name>.c` with `gcc -fopenmp -O2` (against the system
/// libgomp) into `<out_dir>/c-programs/<name>[-<variant>]`; `variant` keeps
/// the executables of different tests of one program apart.
pub fn compile(out_dir: &Path, name: &str, variant: &str) -> PathBuf {
    let file = if variant.is_empty() {
        name.to_owned()
    } else {
        format!("{name}-{variant}")
    };
    gcc(&c_source(name), &out_dir.join("c-programs").join(file), &[])
}

/// Compiles `tests/c/<name>.c` with `menps cc` — `gcc -fopenmp` linked
/// against our library instead of libgomp — into
/// `<out_dir>/c-programs/<name>-linked`:
///
/// ```text
/// <profile>/menps cc -O2 -o <out> <name>.c -lm
/// ```
///
/// Panics if the launcher or our library is missing, or if compiling
/// fails.
pub fn compile_linked_to_ours(out_dir: &Path, name: &str) -> PathBuf {
    let lib = our_library();
    let out = out_dir.join("c-programs").join(format!("{name}-linked"));
    build_into(&out, "menps cc", |tmp| {
        let mut cmd = Command::new(menps_launcher());
        cmd.args(["cc", "-O2", "-o"])
            .arg(tmp)
            .arg(c_source(name))
            .arg("-lm")
            .env("MENPS_GOMP_LIB", &lib);
        cmd
    })
}

/// The shared libraries a program needs (`DT_NEEDED`, via `readelf -d`).
pub fn needed_libraries(program: &Path) -> Vec<String> {
    tool_output("readelf", "-d", program)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_owned()))
        .collect()
}

/// The undefined symbols of a program (`nm -u`), without symbol versions.
pub fn undefined_symbols(program: &Path) -> Vec<String> {
    tool_output("nm", "-u", program)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|s| s.split('@').next().unwrap_or(s).to_owned())
        .collect()
}

/// The standard output of `tool option program` (binutils); panics if it
/// cannot run or fails.
fn tool_output(tool: &str, option: &str, program: &Path) -> String {
    let out = Command::new(tool)
        .arg(option)
        .arg(program)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool} ({e})"));
    assert!(
        out.status.success(),
        "{tool} {option} {} failed",
        program.display()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cargo profile directory (`target/<profile>/`) of the running test
/// binary, which lives in its `deps/` subdirectory.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("test binary has a directory");
    if dir.file_name() == Some(OsStr::new("deps")) {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Our runtime library: `$MENPS_GOMP_LIB`, else the newer of
/// `libmenps_gomp.so` in the profile directory and in its `deps/`. Panics
/// (fails the test) if there is none: a missing library is a failure, not a
/// skip.
pub fn our_library() -> PathBuf {
    if let Some(path) = std::env::var_os(OUR_LIBRARY_ENV) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{OUR_LIBRARY_ENV}={} is not a file",
            path.display()
        );
        return std::path::absolute(&path).unwrap_or(path);
    }
    let profile = profile_dir();
    let candidates = [
        profile.join(OUR_LIBRARY),
        profile.join("deps").join(OUR_LIBRARY),
    ];
    // The newer of the two: `cargo build` leaves the library in the profile
    // directory, `cargo test` only in `deps/`, so after a `cargo build` the
    // first can be an old one that a later `cargo test` did not replace.
    let newest = candidates
        .iter()
        .filter_map(|c| Some((c.metadata().ok()?.modified().ok()?, c)))
        .max_by_key(|&(t, _)| t);
    if let Some((_, c)) = newest {
        return c.clone();
    }
    panic!(
        "our OpenMP runtime {OUR_LIBRARY} is missing (looked for {} and {}); build it \
         first (`cargo build --workspace`, or `cargo test --workspace`), or set \
         {OUR_LIBRARY_ENV}=<path>",
        candidates[0].display(),
        candidates[1].display()
    );
}

/// The stand-alone `menps` launcher in the profile directory. Panics if it
/// is missing.
pub fn menps_launcher() -> PathBuf {
    let path = profile_dir().join("menps");
    assert!(
        path.is_file(),
        "the menps launcher {} is missing: run `cargo build -p menps-dsm --bin menps` \
         (with the same profile and target directory as the tests)",
        path.display()
    );
    path
}

/// The outcome of one run of a program.
#[derive(Debug)]
pub struct Run {
    /// What ran (environment settings and command line), for messages.
    pub description: String,
    /// Exit status.
    pub status: ExitStatus,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
    /// Wall-clock time from start to exit.
    pub elapsed: Duration,
}

impl Run {
    /// A report of the run for assertion messages.
    pub fn report(&self) -> String {
        format!(
            "{}\nstatus: {} ({:.2?})\n--- stdout\n{}--- stderr\n{}---",
            self.description,
            describe_status(self.status),
            self.elapsed,
            self.stdout,
            self.stderr
        )
    }

    /// The last line of stdout.
    pub fn last_line(&self) -> Option<&str> {
        self.stdout.lines().last()
    }

    /// Asserts that the program passed its own checks: stdout ends with a
    /// `PASS` line and the exit status is `expected_status`.
    pub fn assert_passed(&self, expected_status: i32) {
        assert_eq!(
            self.last_line(),
            Some("PASS"),
            "the program's last line is not PASS\n{}",
            self.report()
        );
        assert_eq!(
            self.status.code(),
            Some(expected_status),
            "exit status {} instead of {expected_status}\n{}",
            describe_status(self.status),
            self.report()
        );
    }
}

/// `exit code N` or `signal N`.
pub fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => format!("{status:?}"),
    }
}

/// A command for `program` without any OpenMP, libgomp or menps setting of
/// the test's own environment (`OMP_*`, `GOMP_*`, `KMP_*`, `MENPS_*`,
/// `LD_PRELOAD`), so runs do not depend on the caller's shell.
pub fn clean_command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if ["OMP_", "GOMP_", "KMP_", "MENPS_"]
            .iter()
            .any(|p| k.starts_with(p))
            || k == "LD_PRELOAD"
        {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// One run at a time: the machine may have only a couple of cores, and a
/// 4-process run next to a 4-thread run would make both slow.
static RUN_LOCK: Mutex<()> = Mutex::new(());
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

/// What the reader threads collected of a run's stdout and stderr (empty
/// if a reader does not deliver within 5 s).
fn collected(out: &mpsc::Receiver<String>, err: &mpsc::Receiver<String>) -> (String, String) {
    let get =
        |rx: &mpsc::Receiver<String>| rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    (get(out), get(err))
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) in its own process
/// group, with the time limit [`RUN_TIMEOUT`]. On timeout, or if processes
/// of the run are still alive [`LEFTOVER_GRACE`] after the main process
/// exited, kills them all and panics with the output so far.
pub fn run_command(cmd: Command) -> Run {
    run_command_limited(cmd, RUN_TIMEOUT, LEFTOVER_GRACE)
}

/// [`run_command`] with another time limit and another grace period for the
/// run's other processes to exit after the main one.
pub fn run_command_limited(mut cmd: Command, timeout: Duration, leftover_grace: Duration) -> Run {
    let guard = RUN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let tag = format!(
        "{}-{}",
        std::process::id(),
        NEXT_RUN.fetch_add(1, Ordering::Relaxed)
    );
    let description = describe_command(&cmd);
    cmd.env(RUN_TAG, &tag)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {description}: {e}"));
    let pgid = child.id() as i32;
    let (out_tx, out_rx) = mpsc::channel();
    let (err_tx, err_rx) = mpsc::channel();
    let stdout = collect(child.stdout.take().expect("piped stdout"), out_tx);
    let stderr = collect(child.stderr.take().expect("piped stderr"), err_tx);

    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the program") {
            break Some(status);
        }
        if start.elapsed() > timeout {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    let Some(status) = status else {
        kill_run(pgid, &tag);
        let _ = child.wait();
        let (out, err) = collected(&out_rx, &err_rx);
        drop(guard);
        panic!(
            "{description}\nhung: killed after {timeout:?}\n--- stdout\n{out}--- stderr\n{err}---"
        );
    };
    // Processes of the run may take a moment to exit after the main one.
    let grace_end = Instant::now() + leftover_grace;
    let mut left = tagged_processes(&tag);
    while !left.is_empty() && Instant::now() < grace_end {
        std::thread::sleep(Duration::from_millis(20));
        left = tagged_processes(&tag);
    }
    if !left.is_empty() {
        kill_run(pgid, &tag);
    }
    // Every writer is gone now, so the pipes reach end of file.
    let (out, err) = collected(&out_rx, &err_rx);
    drop((stdout, stderr));
    drop(guard);
    let run = Run {
        description,
        status,
        stdout: out,
        stderr: err,
        elapsed,
    };
    assert!(
        left.is_empty(),
        "processes {left:?} were still running {leftover_grace:?} after the program \
         exited (killed)\n{}",
        run.report()
    );
    run
}

/// Reads `r` to its end on a thread and sends the text.
fn collect(
    mut r: impl Read + Send + 'static,
    tx: mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    })
}

/// Kills the process group `pgid` and every process tagged `tag`.
fn kill_run(pgid: i32, tag: &str) {
    // SAFETY: kill has no memory-safety preconditions; the group is the
    // one created for this run (process_group(0) made the child its
    // leader, and the child is not reaped yet or was reaped just now).
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    for _ in 0..50 {
        let left = tagged_processes(tag);
        if left.is_empty() {
            return;
        }
        for pid in left {
            // SAFETY: as above; `pid` carries this run's tag.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Live (non-zombie) processes whose environment contains `RUN_TAG=tag`.
fn tagged_processes(tag: &str) -> Vec<u32> {
    let needle = format!("{RUN_TAG}={tag}\0");
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !env.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state != Some("Z") && !stat.is_empty() {
            found.push(pid);
        }
    }
    found
}

/// `VAR=value ... program args` of a command, for messages.
fn describe_command(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            let _ = write!(s, "{}={} ", k.to_string_lossy(), v.to_string_lossy());
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `program args` with the system libgomp and `OMP_NUM_THREADS=threads`.
pub fn run_libgomp(program: &Path, args: &[&str], threads: usize) -> Run {
    let mut cmd = clean_command(program);
    cmd.args(args).env("OMP_NUM_THREADS", threads.to_string());
    run_command(cmd)
}

/// Runs `program args` with our runtime on `processes` processes of
/// `threads` threads each:
///
/// ```text
/// LD_PRELOAD=<libmenps_gomp.so> [MENPS_NPROCS=<processes>] OMP_NUM_THREADS=<processes*threads> MENPS_TIMEOUT_SECS=60 program args
/// ```
///
/// (`MENPS_NPROCS` only for more than one process: the library makes the
/// program start that many copies of itself.) Panics if the library is
/// missing.
pub fn run_ours(program: &Path, args: &[&str], processes: usize, threads: usize) -> Run {
    run_ours_env(program, args, processes, threads, &[])
}

/// [`run_ours`] with extra environment variables.
pub fn run_ours_env(
    program: &Path,
    args: &[&str],
    processes: usize,
    threads: usize,
    env: &[(&str, &str)],
) -> Run {
    let lib = our_library();
    let mut cmd = ours_command(program, args, processes, threads, env);
    cmd.env("LD_PRELOAD", &lib);
    run_command(cmd)
}

/// `program args` on `processes` × `threads` of our runtime, started by
/// the program itself: `env`, then `OMP_NUM_THREADS`, `MENPS_TIMEOUT_SECS`
/// and `MENPS_NPROCS` (for more than one process) over it.
fn ours_command(
    program: &Path,
    args: &[&str],
    processes: usize,
    threads: usize,
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = clean_command(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .env("OMP_NUM_THREADS", (processes * threads).to_string())
        .env("MENPS_TIMEOUT_SECS", OURS_TIMEOUT_SECS.to_string());
    if processes > 1 {
        cmd.env("MENPS_NPROCS", processes.to_string());
    }
    cmd
}

/// Runs a program built by [`compile_linked_to_ours`] (no `LD_PRELOAD`) on
/// `processes` × `threads`:
///
/// ```text
/// [MENPS_NPROCS=<processes>] OMP_NUM_THREADS=<processes*threads> MENPS_TIMEOUT_SECS=60 program args
/// ```
pub fn run_ours_linked(program: &Path, args: &[&str], processes: usize, threads: usize) -> Run {
    run_command(ours_command(program, args, processes, threads, &[]))
}

/// Runs `program args` (built against libgomp) with our runtime under the
/// stand-alone launcher, which preloads the runtime into the job's
/// processes itself:
///
/// ```text
/// OMP_NUM_THREADS=<processes*threads> MENPS_TIMEOUT_SECS=60 MENPS_GOMP_LIB=<libmenps_gomp.so> \
///     <profile>/menps run -n <processes> -- program args
/// ```
///
/// Panics if the launcher or the library is missing.
pub fn run_ours_launcher(program: &Path, args: &[&str], processes: usize, threads: usize) -> Run {
    let lib = our_library();
    let launcher = menps_launcher();
    let mut cmd = clean_command(launcher);
    cmd.args(["run", "-n", &processes.to_string(), "--"])
        .arg(program)
        .args(args)
        .env("MENPS_GOMP_LIB", &lib)
        .env("OMP_NUM_THREADS", (processes * threads).to_string())
        .env("MENPS_TIMEOUT_SECS", OURS_TIMEOUT_SECS.to_string());
    run_command(cmd)
}

/// Total thread counts of the libgomp reference runs.
pub const LIBGOMP_THREADS: [usize; 2] = [2, 4];

/// The (processes, threads per process) configurations of our runtime.
pub const OUR_CONFIGS: [(usize, usize); 4] = [(1, 2), (2, 1), (2, 2), (4, 1)];

/// The libgomp reference runs of `program` at every count of
/// [`LIBGOMP_THREADS`], each checked ([`Run::assert_passed`] with
/// `expected_status`, nothing on stderr) and all with the same stdout;
/// keyed by thread count.
pub fn libgomp_reference(program: &Path, expected_status: i32) -> BTreeMap<usize, Run> {
    let mut runs = BTreeMap::new();
    for threads in LIBGOMP_THREADS {
        let run = run_libgomp(program, &[], threads);
        run.assert_passed(expected_status);
        assert!(
            run.stderr.is_empty(),
            "the program wrote to stderr under libgomp\n{}",
            run.report()
        );
        runs.insert(threads, run);
    }
    let mut it = runs.values();
    let first = it.next().expect("at least one reference run");
    for other in it {
        assert_eq!(
            first.stdout,
            other.stdout,
            "the program's output depends on the thread count under libgomp\n{}\n{}",
            first.report(),
            other.report()
        );
    }
    runs
}

/// Asserts that `ours` passed with `expected_status` and printed exactly
/// what libgomp printed in `reference`.
pub fn assert_same_as_reference(ours: &Run, reference: &Run, expected_status: i32) {
    ours.assert_passed(expected_status);
    assert_eq!(
        ours.stdout,
        reference.stdout,
        "output differs from libgomp's\n--- ours\n{}\n--- libgomp\n{}",
        ours.report(),
        reference.report()
    );
}

/// The full check of one program: compile it, take the libgomp reference
/// ([`libgomp_reference`]), then run it with our runtime in every
/// configuration of [`OUR_CONFIGS`] ([`run_ours`]) and compare with the
/// reference at the same total thread count. Returns the runs' times (for
/// the test output).
pub fn check_program(out_dir: &Path, name: &str, expected_status: i32) -> Vec<(String, Duration)> {
    let program = compile(out_dir, name, "");
    let reference = libgomp_reference(&program, expected_status);
    let mut times: Vec<(String, Duration)> = reference
        .iter()
        .map(|(t, r)| (format!("libgomp {t}"), r.elapsed))
        .collect();
    for (processes, threads) in OUR_CONFIGS {
        let ours = run_ours(&program, &[], processes, threads);
        assert_same_as_reference(&ours, &reference[&(processes * threads)], expected_status);
        times.push((format!("ours {processes}x{threads}"), ours.elapsed));
    }
    times
}
