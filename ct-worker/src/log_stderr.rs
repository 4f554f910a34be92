//! A minimal `log` backend for programs that install none.
//!
//! The workspace's libraries report non-fatal trouble (a runtime dropped
//! from one of its own threads, a panicking ULT-local destructor, a job
//! whose processes never joined it) through the `log` facade, at `warn`
//! level, so a program decides where those reports go. A program without a
//! logger of its own calls [`log_to_stderr`] at start-up to see them; the
//! workspace's binaries (the `menps` launcher, the examples) do.

use log::{LevelFilter, Log, Metadata, Record};

/// Writes warnings and errors to stderr, one line each, as they are.
struct Stderr;

impl Log for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &Record<'_>) {
        if self.enabled(r.metadata()) {
            // One write per line: lines of several threads never mix.
            let line = format!("{}\n", r.args());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }

    fn flush(&self) {}
}

/// Installs a logger that prints warnings and errors on stderr (each
/// message already names its source, e.g. `ct-worker: …`). Returns `false`,
/// changing nothing, if the program has a logger already.
pub fn log_to_stderr() -> bool {
    static LOGGER: Stderr = Stderr;
    let ok = log::set_logger(&LOGGER).is_ok();
    if ok {
        log::set_max_level(LevelFilter::Warn);
    }
    ok
}
