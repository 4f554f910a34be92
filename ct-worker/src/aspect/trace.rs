//! A Chrome trace-event recorder.

use std::cell::UnsafeCell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::{Aspect, AspectInit};

/// Events kept per worker; later events are counted as dropped.
const MAX_EVENTS: usize = 1 << 20;

#[derive(Debug, Clone, Copy)]
enum Ev {
    /// A user-level thread ran on the worker from `start` for `dur` µs.
    Run { start: f64, dur: f64 },
    /// The worker had no work from `start` for `dur` µs.
    Idle { start: f64, dur: f64 },
    /// The worker stole from `victim` (`usize::MAX`: the injector).
    Steal { at: f64, victim: usize },
}

#[derive(Debug, Default)]
struct WorkerTrace {
    events: Vec<Ev>,
    run_since: Option<f64>,
    idle_since: Option<f64>,
    forks: u64,
    dropped: u64,
}

impl WorkerTrace {
    fn push(&mut self, e: Ev) {
        if self.events.len() < MAX_EVENTS {
            self.events.push(e);
        } else {
            self.dropped += 1;
        }
    }

    fn end_run(&mut self, now: f64) {
        if let Some(start) = self.run_since.take() {
            self.push(Ev::Run {
                start,
                dur: now - start,
            });
        }
    }
}

/// Records, per worker, when user-level threads ran, when the worker was
/// idle and where it stole from, and writes them as Chrome trace-event JSON
/// (one track per worker) when the runtime shuts down.
///
/// The output file is the builder's [`trace_file`](crate::Builder::trace_file)
/// or the `CT_TRACE` environment variable; with neither, nothing is recorded.
/// Each worker keeps at most 2^20 events; the number dropped beyond that is
/// written to the file's `otherData`.
///
/// The file is created when the runtime is built: if it cannot be, the build
/// fails ([`Error::Aspect`](crate::Error::Aspect), naming the file and
/// where its name came from). If writing it at shutdown fails, the process
/// exits with status 1 after saying why: a run whose trace was asked for
/// and lost does not end as a success.
#[derive(Debug)]
pub struct TraceAspect {
    path: Option<PathBuf>,
    /// The file created at build time (`try_new`), written at shutdown.
    file: std::sync::Mutex<Option<std::fs::File>>,
    epoch: Instant,
    workers: Vec<CachePadded<UnsafeCell<WorkerTrace>>>,
}

// SAFETY: worker `w`'s trace is only touched by worker `w`'s OS thread (every
// hook runs there) until `finish`, which runs after all workers stopped.
unsafe impl Sync for TraceAspect {}
// SAFETY: as above; the buffers are plain data.
unsafe impl Send for TraceAspect {}

impl TraceAspect {
    /// Where the trace will be written, if anywhere.
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    #[inline]
    fn with<R>(&self, w: usize, f: impl FnOnce(&mut WorkerTrace, f64) -> R) -> Option<R> {
        self.path.as_ref()?;
        let now = self.epoch.elapsed().as_nanos() as f64 / 1000.0;
        // SAFETY: hooks for worker `w` only run on worker `w`'s thread.
        Some(f(unsafe { &mut *self.workers[w].get() }, now))
    }

    fn render(&self) -> String {
        let mut out = String::from("{\"traceEvents\":[\n");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
        };
        let mut dropped = 0;
        let mut forks = 0;
        for (w, cell) in self.workers.iter().enumerate() {
            // SAFETY: all workers have stopped (see `finish`).
            let t = unsafe { &*cell.get() };
            dropped += t.dropped;
            forks += t.forks;
            sep(&mut out);
            write!(
                out,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{w},\"args\":{{\"name\":\"ct-worker-{w}\"}}}}"
            )
            .unwrap();
            for e in &t.events {
                sep(&mut out);
                match *e {
                    Ev::Run { start, dur } => write!(
                        out,
                        "{{\"name\":\"ult\",\"cat\":\"run\",\"ph\":\"X\",\"pid\":0,\"tid\":{w},\"ts\":{start:.3},\"dur\":{dur:.3}}}"
                    ),
                    Ev::Idle { start, dur } => write!(
                        out,
                        "{{\"name\":\"idle\",\"cat\":\"idle\",\"ph\":\"X\",\"pid\":0,\"tid\":{w},\"ts\":{start:.3},\"dur\":{dur:.3}}}"
                    ),
                    Ev::Steal { at, victim } => {
                        let from = if victim == usize::MAX {
                            "\"injector\"".to_string()
                        } else {
                            victim.to_string()
                        };
                        write!(
                            out,
                            "{{\"name\":\"steal\",\"cat\":\"steal\",\"ph\":\"i\",\"s\":\"t\",\"pid\":0,\"tid\":{w},\"ts\":{at:.3},\"args\":{{\"from\":{from}}}}}"
                        )
                    }
                }
                .unwrap();
            }
        }
        write!(
            out,
            "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"forks\":{forks},\"dropped_events\":{dropped}}}}}\n"
        )
        .unwrap();
        out
    }
}

impl Aspect for TraceAspect {
    fn new(init: &AspectInit) -> Self {
        let path = init.trace_path.clone().or_else(|| {
            // Builder > environment; an empty value is refused by
            // `try_new`.
            ct_config::vars::CT_TRACE
                .raw()
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        TraceAspect {
            path,
            file: std::sync::Mutex::new(None),
            epoch: Instant::now(),
            workers: (0..init.workers)
                .map(|_| CachePadded::new(UnsafeCell::new(WorkerTrace::default())))
                .collect(),
        }
    }

    fn try_new(init: &AspectInit) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        if init.trace_path.is_none()
            && ct_config::vars::CT_TRACE
                .raw()
                .is_some_and(|v| v.to_string_lossy().trim().is_empty())
        {
            // Set but empty: the parser's error, naming the variable.
            ct_config::vars::CT_TRACE.text()?;
        }
        let this = Self::new(init);
        if let Some(path) = &this.path {
            let from = if init.trace_path.is_some() {
                "Builder::trace_file"
            } else {
                "CT_TRACE"
            };
            let file = std::fs::File::create(path).map_err(|e| {
                format!(
                    "cannot create the trace file {} (from {from}): {e}",
                    path.display()
                )
            })?;
            *this.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
        }
        Ok(this)
    }

    fn fork(&self, w: usize) {
        self.with(w, |t, _| t.forks += 1);
    }

    fn steal(&self, w: usize, victim: Option<usize>) {
        self.with(w, |t, now| {
            t.push(Ev::Steal {
                at: now,
                victim: victim.unwrap_or(usize::MAX),
            })
        });
    }

    fn switch(&self, w: usize) {
        self.with(w, |t, now| {
            t.end_run(now);
            t.run_since = Some(now);
        });
    }

    fn idle_begin(&self, w: usize) {
        self.with(w, |t, now| {
            t.end_run(now);
            t.idle_since = Some(now);
        });
    }

    fn idle_end(&self, w: usize) {
        self.with(w, |t, now| {
            if let Some(start) = t.idle_since.take() {
                t.push(Ev::Idle {
                    start,
                    dur: now - start,
                });
            }
        });
    }

    fn finish(&self) {
        let Some(path) = &self.path else { return };
        let now = self.epoch.elapsed().as_nanos() as f64 / 1000.0;
        for cell in &self.workers {
            // SAFETY: all workers have stopped.
            unsafe { (*cell.get()).end_run(now) };
        }
        let json = self.render();
        let file = self.file.lock().unwrap_or_else(|e| e.into_inner()).take();
        let written = match file {
            Some(f) => Ok(f),
            None => std::fs::File::create(path),
        }
        .and_then(|mut f| f.write_all(json.as_bytes()));
        if let Err(e) = written {
            eprintln!("ct-worker: cannot write trace to {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
