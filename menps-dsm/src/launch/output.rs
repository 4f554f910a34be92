//! Rank prefixes on the processes' output (`[rank 2] text`).

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A thread copying one process's stream to ours, line by line.
pub(super) struct Printer {
    done: mpsc::Receiver<()>,
}

/// Copies `stream` (rank `rank`'s stdout, or stderr if `to_stderr`) to the
/// launcher's stdout/stderr, each line prefixed with `[rank N] `. Lines are
/// written whole, so lines of different ranks do not interleave.
pub(super) fn prefix_lines(
    rank: usize,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
) -> Printer {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("menps-out-{rank}"))
        .spawn(move || {
            let prefix = format!("[rank {rank}] ");
            let mut r = BufReader::new(stream);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let mut out = Vec::with_capacity(prefix.len() + line.len() + 1);
                        out.extend_from_slice(prefix.as_bytes());
                        out.extend_from_slice(&line);
                        if !line.ends_with(b"\n") {
                            out.push(b'\n');
                        }
                        let _ = if to_stderr {
                            std::io::stderr().lock().write_all(&out)
                        } else {
                            let mut o = std::io::stdout().lock();
                            o.write_all(&out).and_then(|_| o.flush())
                        };
                    }
                }
            }
            let _ = tx.send(());
        })
        .expect("spawn output thread");
    Printer { done: rx }
}

/// Waits (at most `limit` in all) for the printers to reach the end of their
/// streams — a process's own children may keep a stream open forever.
pub(super) fn finish(printers: Vec<Printer>, limit: Duration) {
    let end = Instant::now() + limit;
    for p in printers {
        let left = end.saturating_duration_since(Instant::now());
        let _ = p.done.recv_timeout(left);
    }
    let _ = std::io::stdout().flush();
}

/// Writes `msg` and a newline to stderr in one `write(2)` (retried only
/// for what a signal or a full pipe left unwritten), so that the lines of
/// several processes sharing the terminal or pipe never mix: `eprintln!`
/// writes its pieces one by one, and two processes failing at once
/// interleave them. Safe to call anywhere (it allocates once, takes no lock).
pub(crate) fn write_line(msg: &str) {
    let mut line = String::with_capacity(msg.len() + 1);
    line.push_str(msg);
    line.push('\n');
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: write(2) of a valid buffer to stderr.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n > 0 {
            rest = &rest[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            break;
        }
    }
}
