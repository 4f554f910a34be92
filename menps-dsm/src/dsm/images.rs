//! The program's images (the executable and the shared libraries it was
//! started with) and the check that every process of a job has them at the
//! same addresses.
//!
//! DSM memory holds pointers into the images: a C program's function
//! pointers and `FILE *`s, `main`'s frame pointing at globals, the team's
//! forked functions. They mean the same on every process only if every
//! process mapped the same files at the same addresses. The launchers turn
//! address randomisation off, which makes the layout depend on the rest:
//! the binaries themselves (a different libc on another host), the limits
//! the kernel places libraries by (`ulimit -s`: a stack limit above 128 MiB
//! moves every library) and the dynamic loader's environment (its own
//! allocations for an `LD_LIBRARY_PATH` shift the libraries mapped after
//! them). [`check_same_layout`] compares the layouts
//! when the DSM starts and refuses to run on a difference, naming the first
//! image that differs.
//!
//! The layout is the one the program was started with, read by a
//! constructor of this library before `main` (or, for a library that is
//! preloaded, when it is loaded): libraries opened later with `dlopen` (an
//! MPI library's plugins, which may differ between hosts) are not part of
//! it, and nothing of theirs is expected in DSM memory.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::com::Communicator;

use super::error::{DsmError, DsmResult};

/// The layout read at start: one line per mapping of a file,
/// `start-end perms offset path`.
static AT_START: OnceLock<String> = OnceLock::new();

/// Reads the layout before `main`, when only the images the program was
/// started with are mapped (a function in `.init_array`, which the dynamic
/// loader runs for every loaded object, executables and preloaded
/// libraries alike).
#[used]
#[unsafe(link_section = ".init_array")]
static READ_AT_START: extern "C" fn() = read_at_start;

/// The constructor ran (the layout is the one at start).
static READ_BEFORE_MAIN: AtomicBool = AtomicBool::new(false);

extern "C" fn read_at_start() {
    let _ = AT_START.set(current_layout());
    READ_BEFORE_MAIN.store(true, Ordering::Relaxed);
}

/// The file mappings of this process now, one line each (anonymous memory,
/// shared-memory files and devices left out: they are the job's, not the
/// program's).
fn current_layout() -> String {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return String::new();
    };
    let mut out = String::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), Some(_dev), Some(_inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.collect::<Vec<_>>().join(" ");
        let is_image = path.starts_with('/')
            && !path.starts_with("/memfd:")
            && !path.starts_with("/dev/")
            && !path.starts_with("/SYSV")
            && !path.ends_with("(deleted)");
        if is_image {
            out.push_str(&format!("{range} {perms} {offset} {path}\n"));
        }
    }
    out
}

/// This process's layout at start (read now if the constructor did not
/// run, as when this library was opened with `dlopen`).
pub(crate) fn layout_at_start() -> &'static str {
    // Keeps the constructor's static in every link of this crate.
    core::hint::black_box(&READ_AT_START);
    AT_START.get_or_init(current_layout)
}

/// 64-bit FNV-1a.
fn fingerprint(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Collectively checks that every process of `com` was started with the
/// same images at the same addresses; on a difference every process gets
/// the same [`DsmError::Config`], naming the first process that differs
/// from process 0 and the first mapping where they differ.
pub(crate) fn check_same_layout<C: Communicator>(com: &C) -> DsmResult<()> {
    if com.size() == 1 {
        return Ok(());
    }
    let mine = layout_at_start();
    let all = com.allgather(&fingerprint(mine).to_le_bytes())?;
    if all.chunks_exact(8).all(|c| c == &all[..8]) {
        return Ok(());
    }
    // They differ: gather the layouts themselves, padded to the longest.
    let lens = com.allgather(&(mine.len() as u64).to_le_bytes())?;
    let longest = lens
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
        .max()
        .unwrap_or(0);
    let mut padded = mine.as_bytes().to_vec();
    padded.resize(longest, 0);
    let layouts = com.allgather(&padded)?;
    let layout = |r: usize| {
        let bytes = &layouts[r * longest..(r + 1) * longest];
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(longest);
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    let first = layout(0);
    let (rank, theirs) = (1..com.size())
        .map(|r| (r, layout(r)))
        .find(|(_, l)| *l != first)
        .unwrap_or_else(|| (1, layout(1)));
    Err(DsmError::Config(format!(
        "the processes were started with different address-space layouts, so \
         pointers into code and globals would not mean the same everywhere: {}; \
         every process must run the same binaries and libraries, with the same \
         limits (`ulimit -s`), the same `LD_LIBRARY_PATH` and `LD_PRELOAD`, and \
         without address randomisation",
        first_difference(&first, &theirs, rank)
    )))
}

/// The first mapping where `theirs` (process `rank`'s layout) differs from
/// process 0's, in words.
fn first_difference(ours: &str, theirs: &str, rank: usize) -> String {
    let describe = |line: Option<&str>| match line {
        Some(l) => {
            let mut f = l.splitn(4, ' ');
            let range = f.next().unwrap_or("");
            let start = range.split('-').next().unwrap_or("");
            let path = f.nth(2).unwrap_or("");
            format!("{path} at 0x{start}")
        }
        None => "nothing".to_string(),
    };
    let (mut a, mut b) = (ours.lines(), theirs.lines());
    loop {
        match (a.next(), b.next()) {
            (None, None) => {
                return format!("process {rank}'s layout differs from process 0's");
            }
            (x, y) if x != y => {
                return format!(
                    "process 0 has {} where process {rank} has {}",
                    describe(x),
                    describe(y)
                );
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_at_start_holds_the_executable_and_libc() {
        let l = layout_at_start();
        let exe = std::env::current_exe().unwrap();
        assert!(
            l.contains(exe.to_str().unwrap()),
            "no mapping of {exe:?} in\n{l}"
        );
        assert!(l.contains("libc"), "no libc in\n{l}");
        // Read before main: a library opened later is not in it.
        assert!(READ_BEFORE_MAIN.load(Ordering::Relaxed));
    }

    #[test]
    fn the_first_difference_names_the_image_and_both_addresses() {
        let ours = "1000-2000 r-xp 00000000 /bin/prog\n7000-8000 r-xp 00000000 /lib/libc.so.6\n";
        let theirs = "1000-2000 r-xp 00000000 /bin/prog\n6000-7000 r-xp 00000000 /lib/libc.so.6\n";
        assert_eq!(
            first_difference(ours, theirs, 3),
            "process 0 has /lib/libc.so.6 at 0x7000 where process 3 has /lib/libc.so.6 at 0x6000"
        );
        assert_eq!(
            first_difference(ours, "1000-2000 r-xp 00000000 /bin/prog\n", 1),
            "process 0 has /lib/libc.so.6 at 0x7000 where process 1 has nothing"
        );
        assert_ne!(fingerprint(ours), fingerprint(theirs));
    }
}
