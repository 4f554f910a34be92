//! `rma`: latency of one-sided read / write / compare-and-swap / fetch-add
//! on the shm backend between 2 processes (8 B .. 1 MiB), the rate of
//! asynchronous operations issued in batches, point-to-point latency and
//! message rate, and the barrier — each with its baseline on the same
//! shared mapping in the same run (`memcpy`, a raw volatile load, a raw
//! atomic). Rank 0 measures accesses to rank 1's window; rank 1 idles in a
//! barrier meanwhile, and both take part in the p2p and barrier parts.
//!
//! Output: JSON lines on stdout (rank 0 only), progress and a summary
//! against the targets on stderr.
//!
//! Built with `--features mpi` and started by `mpirun`, it measures the
//! `mpi` backend instead (see `mpi_bench` below):
//!
//! ```text
//! cargo bench -p menps-dsm --features mpi --bench rma --no-run
//! mpirun -n 2 --oversubscribe target/release/deps/rma-<hash>
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use ct_bench::{Args, Param, Stats, emit, repeat, time_secs};
use ct_worker::OsThreads;
use menps_dsm::com::{Coll, Comm, P2p, RemotePtr, Rma, RmaRequest, ShmCom, Source, Windows};

const HELP: &str = "\
rma [--sizes 8,64,512,4096,32768,262144,1048576] [--batch 256] [--runs 7]
    [--pingpongs 20000] [--barriers 20000]

Starts a job of 2 processes by itself (MENPS_NPROCS overrides; at least 2).
Rank 0 measures, against rank 1's window on the shm backend:
  read, write           latency per operation for each size (ns), with `memcpy`
                        from/to the same mapping as baseline, and a raw volatile
                        8-byte load (`raw-load`) for size 8;
  cas, fetch_add        latency per operation (ns), baseline: the same atomic
                        instruction on the mapping (`raw-atomic`);
  rate                  asynchronous 8-byte writes and fetch-adds issued in
                        batches of --batch, then waited for (Mop/s);
  p2p-latency           8-byte ping-pong between ranks 0 and 1, one way (ns);
  p2p-rate              --batch 8-byte messages, then one acknowledgement (Mmsg/s);
  barrier               one barrier of all processes (ns).
Each figure: one warm-up, then --runs runs; min/median/max. Defaults fit a
2-core machine in well under a minute. Results are checked; a wrong result
exits non-zero. Targets: 8-byte read <= 2x raw load, 1 MiB read >= 70% of
memcpy bandwidth, CAS <= 100 ns.";

type Com = ShmCom<OsThreads>;

struct Bench<'a> {
    com: &'a Com,
    runs: usize,
    procs: usize,
}

impl Bench<'_> {
    fn emit(&self, bench: &str, imp: &str, op: &str, size: usize, unit: &str, s: &Stats) {
        if self.com.rank() == 0 {
            let params: Vec<(&str, Param)> = vec![
                ("op", op.into()),
                ("size", size.into()),
                ("procs", self.procs.into()),
            ];
            emit("menps-dsm", bench, imp, &params, unit, s);
        }
    }

    /// ns per operation of `iters` calls of `f`.
    fn latency(&self, iters: usize, mut f: impl FnMut(usize)) -> Stats {
        repeat(self.runs, || {
            time_secs(|| {
                for i in 0..iters {
                    f(i);
                }
            }) * 1e9
                / iters as f64
        })
    }
}

fn iters_for(size: usize) -> usize {
    (64 * 1024 * 1024 / size.max(64)).clamp(20, 1_000_000)
}

/// ns per one-way 8-byte message of a ping-pong between ranks 0 and 1 (the
/// payload is checked).
fn p2p_pingpong<C: P2p>(com: &C, runs: usize, pingpongs: usize) -> Stats {
    let (me, peer) = (com.rank(), 1 - com.rank());
    let msg = 0x0123_4567_89ab_cdefu64.to_le_bytes();
    repeat(runs, || {
        time_secs(|| {
            for _ in 0..pingpongs {
                if me == 0 {
                    com.send(peer, 1, &msg).unwrap();
                    let (_, m) = com.recv(Source::Rank(peer), 2).unwrap();
                    if m != msg {
                        fail("ping-pong payload");
                    }
                } else {
                    let (_, m) = com.recv(Source::Rank(peer), 1).unwrap();
                    com.send(peer, 2, &m).unwrap();
                }
            }
        }) * 1e9
            / (2 * pingpongs) as f64
    })
}

/// Millions of 8-byte messages per second from rank 0 to rank 1, in
/// `batches` batches of `batch` messages each acknowledged once (order and
/// contents are checked).
fn p2p_rate<C: P2p>(com: &C, runs: usize, batches: usize, batch: usize) -> Stats {
    let (me, peer) = (com.rank(), 1 - com.rank());
    repeat(runs, || {
        let t = time_secs(|| {
            for k in 0..batches {
                if me == 0 {
                    for i in 0..batch {
                        com.send(peer, 3, &((k * batch + i) as u64).to_le_bytes())
                            .unwrap();
                    }
                    com.recv(Source::Rank(peer), 4).unwrap();
                } else {
                    for i in 0..batch {
                        let (_, m) = com.recv(Source::Rank(peer), 3).unwrap();
                        if m != ((k * batch + i) as u64).to_le_bytes() {
                            fail("message order or content");
                        }
                    }
                    com.send(peer, 4, &[]).unwrap();
                }
            }
        });
        (batches * batch) as f64 / t / 1e6
    })
}

fn fail(msg: &str) -> ! {
    eprintln!("rma: result check failed: {msg}");
    std::process::exit(1)
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!("{HELP}");
        #[cfg(feature = "mpi")]
        eprintln!("{}", mpi_bench::HELP);
        return;
    }
    #[cfg(feature = "mpi")]
    if menps_dsm::launch::under_mpirun() {
        mpi_bench::run(&args);
        return;
    }
    let sizes: Vec<usize> = args.list("sizes", &[8, 64, 512, 4096, 32768, 262_144, 1_048_576]);
    let batch: usize = args.get("batch", 256);
    let runs: usize = args.get("runs", 7);
    let pingpongs: usize = args.get("pingpongs", 20_000);
    let barriers: usize = args.get("barriers", 20_000);
    args.finish("rma");

    let com: Com = menps_dsm::launch::init_or_relaunch(2).unwrap_or_else(|e| {
        eprintln!("rma: {e}");
        std::process::exit(2)
    });
    if com.size() < 2 {
        eprintln!("rma: needs at least 2 processes (MENPS_NPROCS)");
        std::process::exit(2);
    }
    let me = com.rank();
    let b = Bench {
        com: &com,
        runs,
        procs: com.size(),
    };
    let max = sizes.iter().copied().max().unwrap_or(8).max(64);
    let win = com.create_window(max + 4096).unwrap();
    // A window holding a cycle of word offsets, for dependent-load chains.
    const CHASE_WORDS: usize = 2048;
    let chase = com.create_window(CHASE_WORDS * 8).unwrap();
    let target = 1;
    // Rank 1 fills its window with a pattern rank 0 checks.
    if me == target {
        let local = com.local_window(win).unwrap();
        // SAFETY: nobody else accesses the window before the barrier.
        let s = unsafe { local.as_mut_slice() };
        for (i, x) in s.iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        let local = com.local_window(chase).unwrap();
        for i in 0..CHASE_WORDS {
            let next = ((i + 1031) % CHASE_WORDS * 8) as u64;
            local
                .atomic_u64(i * 8)
                .unwrap()
                .store(next, Ordering::Relaxed);
        }
    }
    com.barrier().unwrap();

    let mut summary = Vec::new();
    if me == 0 {
        let data_ptr = win.at(target, 0);
        let atom_ptr = win.at(target, (max + 64) as u64 & !7);
        let raw = |p: RemotePtr, len: usize| com.translate(p, len).unwrap();
        let mut buf = vec![0u8; max];
        let mut read8 = (0.0, 0.0);
        for &size in &sizes {
            let iters = iters_for(size);
            eprintln!("read/write {size} B x {iters}...");
            let s = b.latency(iters, |_| {
                com.read(data_ptr, &mut buf[..size]).unwrap();
                black_box(&buf);
            });
            b.emit("rma", "shm", "read", size, "ns", &s);
            if buf[..size]
                .iter()
                .enumerate()
                .any(|(i, &x)| x != (i % 251) as u8)
            {
                fail("read returned wrong data");
            }
            let src = raw(data_ptr, size);
            let m = b.latency(iters, |_| {
                // SAFETY: `src` is `size` bytes of the live window; `buf` has room.
                unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), black_box(size)) };
                black_box(&buf);
            });
            b.emit("rma", "memcpy", "read", size, "ns", &m);
            if size == 8 {
                let p = src as *const u64;
                let l = b.latency(iters, |_| {
                    // SAFETY: an aligned word inside the live window.
                    black_box(unsafe { std::ptr::read_volatile(p) });
                });
                b.emit("rma", "raw-load", "read", size, "ns", &l);
                read8 = (s.median, l.median);
            }
            if size == 1_048_576 {
                summary.push(format!(
                    "1 MiB read: {:.1} GB/s vs memcpy {:.1} GB/s = {:.0}% (target >= 70%)",
                    size as f64 / s.median,
                    size as f64 / m.median,
                    100.0 * m.median / s.median
                ));
            }

            // Writes of the same pattern keep the window's content intact.
            let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let s = b.latency(iters, |_| com.write(data_ptr, black_box(&pattern)).unwrap());
            b.emit("rma", "shm", "write", size, "ns", &s);
            let dst = raw(data_ptr, size);
            let m = b.latency(iters, |_| {
                // SAFETY: `dst` is `size` bytes of the live window.
                unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), dst, black_box(size)) }
            });
            b.emit("rma", "memcpy", "write", size, "ns", &m);
        }
        // Latency of dependent reads: each address comes from the last value.
        let iters = 1_000_000;
        eprintln!("read chains x {iters}...");
        let mut off = 0u64;
        let s = b.latency(iters, |_| {
            let mut w = [0u8; 8];
            com.read(chase.at(target, off), &mut w).unwrap();
            off = u64::from_le_bytes(w);
        });
        b.emit("rma", "shm", "read-chase", 8, "ns", &s);
        let base = raw(chase.at(target, 0), CHASE_WORDS * 8);
        let mut roff = 0u64;
        let l = b.latency(iters, |_| {
            // SAFETY: every stored offset is an aligned word of the window.
            roff = unsafe { std::ptr::read_volatile(base.add(roff as usize) as *const u64) };
        });
        b.emit("rma", "raw-load", "read-chase", 8, "ns", &l);
        if off != roff || !off.is_multiple_of(8) || off as usize >= CHASE_WORDS * 8 {
            fail("pointer chase through the API and raw disagree");
        }
        summary.push(format!(
            "8-byte dependent read (latency): {:.2} ns vs raw load {:.2} ns = {:.2}x (target <= 2x)",
            s.median,
            l.median,
            s.median / l.median
        ));
        if read8 != (0.0, 0.0) {
            summary.insert(
                0,
                format!(
                    "8-byte back-to-back reads (throughput): {:.2} ns vs raw load {:.2} ns = {:.2}x \
                     (target <= 2x)",
                    read8.0,
                    read8.1,
                    read8.0 / read8.1
                ),
            );
        }

        // Atomics. Each measured loop adds a known amount, checked at the end.
        let iters = 1_000_000;
        let word = raw(atom_ptr, 8) as *const AtomicU64;
        // SAFETY: an aligned word inside the live window, accessed atomically
        // by everyone.
        let word = unsafe { &*word };
        let mut expected_total = word.load(Ordering::SeqCst);
        eprintln!("atomics x {iters}...");
        // Each CAS succeeds: the expected value follows the returned one.
        let mut next = word.load(Ordering::SeqCst);
        let cas = b.latency(iters, |_| {
            let old = com.compare_and_swap(atom_ptr, next, next + 1).unwrap();
            next = if old == next { next + 1 } else { old };
        });
        expected_total = expected_total.wrapping_add((runs as u64 + 1) * iters as u64);
        b.emit("rma", "shm", "cas", 8, "ns", &cas);
        let mut next = word.load(Ordering::SeqCst);
        let r = b.latency(iters, |_| {
            match word.compare_exchange(next, next + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => next += 1,
                Err(v) => next = v,
            }
        });
        expected_total = expected_total.wrapping_add((runs as u64 + 1) * iters as u64);
        b.emit("rma", "raw-atomic", "cas", 8, "ns", &r);
        summary.push(format!(
            "CAS: {:.1} ns (raw {:.1} ns; target <= 100 ns)",
            cas.median, r.median
        ));
        let s = b.latency(iters, |_| {
            black_box(com.fetch_add(atom_ptr, 1).unwrap());
        });
        b.emit("rma", "shm", "fetch_add", 8, "ns", &s);
        let r = b.latency(iters, |_| {
            black_box(word.fetch_add(1, Ordering::SeqCst));
        });
        b.emit("rma", "raw-atomic", "fetch_add", 8, "ns", &r);
        expected_total = expected_total.wrapping_add(2 * (runs as u64 + 1) * iters as u64);

        // Rates of asynchronous operations in batches.
        let batches = (200_000 / batch.max(1)).max(10);
        eprintln!("rates: {batches} batches of {batch}...");
        let mut reqs = Vec::with_capacity(batch);
        let one = 7u64.to_le_bytes();
        let rate = |f: &mut dyn FnMut()| {
            repeat(runs, || {
                let t = time_secs(|| {
                    for _ in 0..batches {
                        f();
                    }
                });
                (batches * batch) as f64 / t / 1e6
            })
        };
        let s = rate(&mut || {
            for i in 0..batch {
                let p = data_ptr.add((i * 8 % max) as u64 & !7);
                // SAFETY: `one` outlives the requests, waited for below.
                reqs.push(unsafe { com.write_nb(p, one.as_ptr(), 8) }.unwrap());
            }
            for r in reqs.drain(..) {
                r.wait().unwrap();
            }
        });
        b.emit("rma-rate", "shm", "write_nb", 8, "Mop/s", &s);
        let s = rate(&mut || {
            for _ in 0..batch {
                reqs.push(com.fetch_add_nb(atom_ptr, 1).unwrap());
            }
            com.flush(target).unwrap();
            for r in reqs.drain(..) {
                r.wait().unwrap();
            }
        });
        expected_total = expected_total.wrapping_add(((runs + 1) * batches * batch) as u64);
        b.emit("rma-rate", "shm", "fetch_add_nb", 8, "Mop/s", &s);
        let s = rate(&mut || {
            for _ in 0..batch {
                black_box(word.fetch_add(1, Ordering::SeqCst));
            }
        });
        expected_total = expected_total.wrapping_add(((runs + 1) * batches * batch) as u64);
        b.emit("rma-rate", "raw-atomic", "fetch_add", 8, "Mop/s", &s);
        if word.load(Ordering::SeqCst) != expected_total {
            fail(&format!(
                "atomic counter is {}, expected {expected_total}",
                word.load(Ordering::SeqCst)
            ));
        }
    }
    com.barrier().unwrap();

    // Point-to-point between ranks 0 and 1 (others idle).
    if me < 2 {
        eprintln!("p2p ping-pong x {pingpongs}...");
        let s = p2p_pingpong(&com, runs, pingpongs);
        b.emit("p2p-latency", "shm", "send-recv", 8, "ns", &s);
        let s = p2p_rate(&com, runs, 200, batch);
        b.emit("p2p-rate", "shm", "send-recv", 8, "Mmsg/s", &s);
    }
    com.barrier().unwrap();

    eprintln!("barrier x {barriers}...");
    let s = repeat(runs, || {
        time_secs(|| {
            for _ in 0..barriers {
                com.barrier().unwrap();
            }
        }) * 1e9
            / barriers as f64
    });
    b.emit("barrier", "shm", "barrier", 0, "ns", &s);
    com.barrier().unwrap();
    if me == 0 {
        ct_bench::print_summary();
        for line in summary {
            eprintln!("rma: {line}");
        }
    }
}

/// The `mpi` backend's measurements (feature `mpi`, under `mpirun`).
#[cfg(feature = "mpi")]
mod mpi_bench {
    use std::hint::black_box;
    use std::sync::atomic::{AtomicU64, Ordering};

    use ct_bench::{Args, Param, Stats, emit, repeat, time_secs};
    use ct_worker::Ult;
    use menps_dsm::com::{Coll, Comm, MpiCom, RemotePtr, Rma, RmaRequest, WindowId, Windows};

    pub const HELP: &str = "\
Under mpirun (built with --features mpi): the same figures on the mpi backend,
rank 0 against rank 1's window, for two ways of issuing RMA:
  impl mpi            direct MPI calls from the calling thread
                      (Rget + MPI_Test, Put/CAS/Fetch_and_op + MPI_Win_flush);
  impl mpi-offload    through ct-delegate's offloading component (executor and
                      completer user-level threads; the caller parks);
with memcpy / raw-load / raw-atomic on the same mapping (MPI_Win_shared_query,
one machine with osc sm) as the physical limit. Everything runs on one
user-level thread worker per process. Iterations are 1/20 of shm's;
--atomics N (default 50000) sets the CAS and fetch-add iterations (fewer
across hosts, where an emulated atomic takes hundreds of microseconds).";

    type Com = MpiCom<Ult>;

    fn fail(msg: &str) -> ! {
        eprintln!("rma (mpi): result check failed: {msg}");
        std::process::exit(1)
    }

    struct Bench<'a> {
        com: &'a Com,
        runs: usize,
    }

    impl Bench<'_> {
        fn emit(&self, bench: &str, imp: &str, op: &str, size: usize, unit: &str, s: &Stats) {
            if self.com.rank() == 0 {
                let params: Vec<(&str, Param)> = vec![
                    ("op", op.into()),
                    ("size", size.into()),
                    ("procs", self.com.size().into()),
                ];
                emit("menps-dsm", bench, imp, &params, unit, s);
            }
        }

        fn latency(&self, iters: usize, mut f: impl FnMut(usize)) -> Stats {
            repeat(self.runs, || {
                time_secs(|| {
                    for i in 0..iters {
                        f(i);
                    }
                }) * 1e9
                    / iters as f64
            })
        }

        fn rate(&self, batches: usize, batch: usize, f: &mut dyn FnMut()) -> Stats {
            repeat(self.runs, || {
                let t = time_secs(|| {
                    for _ in 0..batches {
                        f();
                    }
                });
                (batches * batch) as f64 / t / 1e6
            })
        }
    }

    fn iters_for(size: usize) -> usize {
        (64 * 1024 * 1024 / size.max(64) / 20).clamp(20, 50_000)
    }

    pub fn run(args: &Args) {
        let sizes: Vec<usize> = args.list("sizes", &[8, 64, 512, 4096, 32768, 262_144, 1_048_576]);
        let batch: usize = args.get("batch", 256);
        let runs: usize = args.get("runs", 7);
        let pingpongs: usize = args.get("pingpongs", 20_000) / 4;
        let barriers: usize = args.get("barriers", 20_000) / 4;
        let atomics: usize = args.get("atomics", 50_000);
        args.finish("rma (mpi)");
        let com: Com = menps_dsm::launch::init().unwrap_or_else(|e| {
            eprintln!("rma (mpi): {e}");
            std::process::exit(2)
        });
        if com.size() < 2 {
            eprintln!("rma (mpi): needs at least 2 processes (mpirun -n 2)");
            std::process::exit(2);
        }
        if com.rank() == 0 {
            eprintln!("rma (mpi): {}", com.library_version());
        }
        let rt = ct_worker::Runtime::builder().workers(1).build().unwrap();
        let counts = Counts {
            pingpongs,
            barriers,
            atomics: atomics.max(1),
        };
        rt.block_on(|| body(&com, &sizes, batch.max(1), runs, &counts));
        // Rank 0 emitted every line; the others print nothing.
        ct_bench::print_summary();
    }

    /// Iterations of the parts with a fixed count.
    struct Counts {
        pingpongs: usize,
        barriers: usize,
        atomics: usize,
    }

    fn body(com: &Com, sizes: &[usize], batch: usize, runs: usize, counts: &Counts) {
        let Counts {
            pingpongs,
            barriers,
            atomics,
        } = *counts;
        let me = com.rank();
        let b = Bench { com, runs };
        let max = sizes.iter().copied().max().unwrap_or(8).max(64);
        let win: WindowId = com.create_window(max + 4096).unwrap();
        let target = 1;
        if me == target {
            let local = com.local_window(win).unwrap();
            // SAFETY: nobody else accesses the window before the barrier.
            let s = unsafe { local.as_mut_slice() };
            for (i, x) in s.iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
        }
        com.barrier().unwrap();
        if me == 0 {
            measure_rma(&b, win, target, sizes, max, batch, atomics);
        }
        com.set_offloaded(false);
        com.barrier().unwrap();

        if me < 2 {
            eprintln!("p2p ping-pong x {pingpongs}...");
            let s = super::p2p_pingpong(com, runs, pingpongs);
            b.emit("p2p-latency", "mpi", "send-recv", 8, "ns", &s);
            let s = super::p2p_rate(com, runs, 50, batch);
            b.emit("p2p-rate", "mpi", "send-recv", 8, "Mmsg/s", &s);
        }
        com.barrier().unwrap();
        eprintln!("barrier x {barriers}...");
        let s = b.latency(barriers, |_| com.barrier().unwrap());
        b.emit("barrier", "mpi", "barrier", 0, "ns", &s);
        com.barrier().unwrap();
    }

    fn measure_rma(
        b: &Bench<'_>,
        win: WindowId,
        target: usize,
        sizes: &[usize],
        max: usize,
        batch: usize,
        atomics: usize,
    ) {
        let com = b.com;
        let data_ptr = win.at(target, 0);
        let atom_ptr: RemotePtr = win.at(target, (max + 64) as u64 & !7);
        let mut buf = vec![0u8; max];
        let shared = com.shared_ptr(data_ptr, max).unwrap();
        let word = com.shared_ptr(atom_ptr, 8).unwrap().map(|p| {
            // SAFETY: an aligned word inside the live window, accessed
            // atomically by everyone.
            unsafe { &*(p as *const AtomicU64) }
        });
        let mut expected_total = com.atomic_load(atom_ptr).unwrap();
        for (imp, offload) in [("mpi", false), ("mpi-offload", true)] {
            com.set_offloaded(offload);
            for &size in sizes {
                let iters = iters_for(size);
                eprintln!("{imp}: read/write {size} B x {iters}...");
                buf[..size].fill(0);
                let s = b.latency(iters, |_| {
                    com.read(data_ptr, &mut buf[..size]).unwrap();
                    black_box(&buf);
                });
                b.emit("rma", imp, "read", size, "ns", &s);
                if buf[..size]
                    .iter()
                    .enumerate()
                    .any(|(i, &x)| x != (i % 251) as u8)
                {
                    fail("read returned wrong data");
                }
                let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
                let s = b.latency(iters, |_| com.write(data_ptr, black_box(&pattern)).unwrap());
                b.emit("rma", imp, "write", size, "ns", &s);
            }
            let iters = atomics;
            eprintln!("{imp}: atomics x {iters}...");
            let mut next = com.atomic_load(atom_ptr).unwrap();
            let s = b.latency(iters, |_| {
                let old = com.compare_and_swap(atom_ptr, next, next + 1).unwrap();
                next = if old == next { next + 1 } else { old };
            });
            expected_total += ((b.runs + 1) * iters) as u64;
            b.emit("rma", imp, "cas", 8, "ns", &s);
            let s = b.latency(iters, |_| {
                black_box(com.fetch_add(atom_ptr, 1).unwrap());
            });
            expected_total += ((b.runs + 1) * iters) as u64;
            b.emit("rma", imp, "fetch_add", 8, "ns", &s);

            let batches = (20_000 / batch).max(4);
            eprintln!("{imp}: rates, {batches} batches of {batch}...");
            let one = 7u64.to_le_bytes();
            let mut reqs = Vec::with_capacity(batch);
            let s = b.rate(batches, batch, &mut || {
                for i in 0..batch {
                    let p = data_ptr.add((i * 8 % max) as u64 & !7);
                    // SAFETY: `one` outlives the requests, waited for below.
                    reqs.push(unsafe { com.write_nb(p, one.as_ptr(), 8) }.unwrap());
                }
                for r in reqs.drain(..) {
                    r.wait().unwrap();
                }
            });
            b.emit("rma-rate", imp, "write_nb", 8, "Mop/s", &s);
            let s = b.rate(batches, batch, &mut || {
                for _ in 0..batch {
                    reqs.push(com.fetch_add_nb(atom_ptr, 1).unwrap());
                }
                com.flush(target).unwrap();
                for r in reqs.drain(..) {
                    r.wait().unwrap();
                }
            });
            expected_total += ((b.runs + 1) * batches * batch) as u64;
            b.emit("rma-rate", imp, "fetch_add_nb", 8, "Mop/s", &s);
            // Restore the pattern the rate loop overwrote.
            let pattern: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
            com.write(data_ptr, &pattern).unwrap();
        }
        com.set_offloaded(false);
        let total = com.atomic_load(atom_ptr).unwrap();
        if total != expected_total {
            fail(&format!(
                "atomic counter is {total}, expected {expected_total}"
            ));
        }

        // The physical limit on the same mapping, where MPI exposes it.
        let (Some(base), Some(word)) = (shared, word) else {
            eprintln!("rma (mpi): no shared mapping (osc is not sm): no raw baselines");
            return;
        };
        for &size in sizes {
            let iters = iters_for(size) * 20;
            let m = b.latency(iters, |_| {
                // SAFETY: `size` bytes of the live window; `buf` has room.
                unsafe { std::ptr::copy_nonoverlapping(base, buf.as_mut_ptr(), black_box(size)) };
                black_box(&buf);
            });
            b.emit("rma", "memcpy", "read", size, "ns", &m);
            if size == 8 {
                let l = b.latency(iters, |_| {
                    // SAFETY: an aligned word inside the live window.
                    black_box(unsafe { std::ptr::read_volatile(base as *const u64) });
                });
                b.emit("rma", "raw-load", "read", size, "ns", &l);
            }
        }
        let iters = 1_000_000;
        let mut next = word.load(Ordering::SeqCst);
        let r = b.latency(iters, |_| {
            match word.compare_exchange(next, next + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => next += 1,
                Err(v) => next = v,
            }
        });
        b.emit("rma", "raw-atomic", "cas", 8, "ns", &r);
        let r = b.latency(iters, |_| {
            black_box(word.fetch_add(1, Ordering::SeqCst));
        });
        b.emit("rma", "raw-atomic", "fetch_add", 8, "ns", &r);
    }
}
