//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on a helper thread and fails the test if it does not finish within
/// `secs` seconds (a hang is a failure, not a wait). Panics of `f` propagate.
pub fn with_timeout<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => match h.join().expect("helper thread") {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => panic!("test did not finish within {secs} s (hang)"),
    }
}

/// A small deterministic generator for randomized tests.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Process CPU time (user + system), in seconds.
/// CPU time (user + system) used so far by this process's threads whose name
/// starts with `prefix` (from `/proc/self/task`): a figure other tests
/// running in parallel in the same process do not disturb.
#[allow(dead_code)]
pub fn threads_cpu_seconds(prefix: &str) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut total = 0.0;
    for t in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, utime 14,
        // stime 15.
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        total += (num(11) + num(12)) / tick;
    }
    total
}

#[allow(dead_code)]
pub fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}
