//! DSM benchmarks: `dsm-barrier`, `read`, `false-sharing`, `protocol`,
//! `fork-join`, `team-barrier` and `dsm-alloc`, on the shm backend with 2
//! and 4 processes (`team-barrier`: 2; `dsm-alloc`: 1 and 2).
//!
//! The binary is a driver: it starts one job per process count (and per
//! protocol variant for `protocol`) by running itself with `MENPS_NPROCS`
//! and `MENPS_DSM_*` set; rank 0 of each job prints JSON lines.
//!
//! With `--backend mpi` (build with `--features mpi`) each job is started
//! with `mpirun --oversubscribe -n P` instead and runs on the MPI backend;
//! its lines name the implementation with a `-mpi` suffix (`menps-mpi`,
//! `comm-barrier-mpi`, ...).
//!
//! Over a modelled network (`MENPS_NET_LATENCY`, `MENPS_NET_BANDWIDTH`; see
//! `com::netmodel`), set in the driver's environment and passed on to the
//! jobs, every line's params carry `net_latency_us` and `net_bandwidth_gbit`
//! (0: uncapped), and the `dsm-barrier`, `read` and `false-sharing` lines
//! the communication operations one operation took (`com_rma_per_op`:
//! one-sided reads, writes and atomics; `com_msgs_per_op`: messages sent;
//! `com_colls_per_op`: collectives) — on rank 0 for barriers and for
//! false-sharing iterations (over the last run), on the reading rank 1 for
//! reads.
//! `MENPS_STATS=1` adds the counts without a model.

use std::process::Command;

use ct_bench::{Args, Param, Stats, emit, repeat, time_secs};
use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, Coll, Comm, P2p, Source, Traffic};
use menps_dsm::dsm::allocator::in_dsm_context;
use menps_dsm::dsm::team::{Team, TeamThread};
use menps_dsm::dsm::{Dsm, DsmAllocator};

// The DSM's global allocator, for `dsm-alloc` (everything else allocates
// outside DSM context, from the system allocator).
#[global_allocator]
static ALLOC: DsmAllocator = DsmAllocator;

const HELP: &str = "\
dsm [--parts barrier,read,false-sharing,protocol,fork-join,team-barrier,alloc]
    [--procs 2,4] [--runs 7] [--backend shm|mpi]
    [--forks 2000] [--team-procs 2] [--team-threads 1,2] [--team-barriers 5000]
    [--alloc-procs 1,2] [--alloc-pairs 1000000]
    [--barriers 2000] [--touched 16777216] [--read-sizes 4096,65536,1048576,16777216]
    [--read-blocks 32768,4096] [--stripes 8,64,512,4096,32768] [--fs-iters 200]
    [--protocol-iters 30] [--wn-lists 16,1024]

dsm-barrier    empty DSM barrier (us), with no other DSM memory and with
               1 GiB of segments allocated, of which process 0 wrote and
               every other process read `--touched` bytes; baselines: the
               comm layer's barrier (on the shm backend its algorithm,
               `MENPS_SHM_BARRIER`, is in the params), and
               `comm-round-trip`: an 8-byte message from process 0 to 1
               and back.
read           process 0 writes S bytes, barrier, process 1 reads them all:
               `menps`, MB/s of the read phase, with the refresh of hot
               blocks off (MENPS_DSM_REFRESH=0: the reads fetch on demand);
               `menps-with-barrier`, the same job timed from the barrier
               (its release and acquire included); and
               `menps-refresh-with-barrier`, the default configuration
               timed from the barrier (the refresh fetches the data in the
               barrier's acquire, so its read phase alone would measure
               local memory); baselines: memcpy of S bytes, and
               `tcp-stream`: a TCP connection from process 0 to process 1
               (loopback on one machine, the link across hosts) streaming
               64 MiB in writes of S bytes.
false-sharing  every process writes its stripes of one 32 KiB block (stripes
               cyclic by process), then a barrier (us per iteration).
protocol       CG-like sparse mat-vec iterations (us per iteration) under
               {floating, fixed} x {hybrid, timestamp, directory}, and hybrid
               with several write-notice list lengths.
fork-join      consecutive forks of an empty function on one user-level
               thread per process (DSM call stacks, pinned), each joined
               (us per fork); baseline: the comm layer's barrier.
team-barrier   barrier of a team of T threads per process (us per episode),
               T = 1, 2; baseline: a ct-sync barrier of P*T user-level
               threads on P*T workers in one process.
dsm-alloc      malloc/free pairs of 64 B and 4 KiB through DsmAllocator from a
               thread in DSM context (ns per pair); baseline: the system
               allocator in the same run. Every process measures at once.
--backend mpi  start the jobs with mpirun (needs the `mpi` feature).
MENPS_NET_LATENCY=25us MENPS_NET_BANDWIDTH=10Gbit (environment): run over a
               modelled network; the lines carry the model and the
               communication operations per operation.
Targets (2 processes): barrier <= 5 us whatever the DSM size (4
processes: <= 3.5 us; across hosts: <= the round trip + 5 us); false sharing
<= 60 us at every stripe; read >= 2000 MB/s at 1 and 16 MiB, >= 400 MB/s at
4 KiB; with 4 processes every figure >= 2x better than ArgoDSM's; fork-join
<= 10 us; team barrier 2x1 <= 2 us; a DSM malloc/free pair <= 3x the system
allocator's.";

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

const CHILD: &str = "MENPS_DSM_BENCH_PART";

/// Message tag of the round-trip baseline (below the DSM's tags).
const RTT_TAG: menps_dsm::com::Tag = 7;

/// Bytes the TCP baseline streams per run.
const TCP_BYTES: usize = 64 << 20;

/// The options [`job`] reads (in the job processes; the driver checks them).
const JOB_OPTIONS: &[&str] = &[
    "runs",
    "barriers",
    "touched",
    "read-sizes",
    "read-blocks",
    "stripes",
    "fs-iters",
    "protocol-iters",
    "alloc-pairs",
    "forks",
    "team-threads",
    "team-barriers",
];

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!("{HELP}");
        return;
    }
    match std::env::var(CHILD) {
        Ok(part) => job(&part, &args),
        Err(_) => drive(&args),
    }
}

/// Runs one job per part, process count and variant.
fn drive(args: &Args) {
    const PARTS: [&str; 7] = [
        "barrier",
        "read",
        "false-sharing",
        "protocol",
        "fork-join",
        "team-barrier",
        "alloc",
    ];
    let parts: Vec<String> = args.list("parts", &PARTS.map(String::from));
    if let Some(p) = parts.iter().find(|p| !PARTS.contains(&p.as_str())) {
        eprintln!("dsm bench: unknown part {p} ({})", PARTS.join(", "));
        std::process::exit(2);
    }
    let procs: Vec<usize> = args.list("procs", &[2, 4]);
    let exe = std::env::current_exe().expect("current exe");
    let passthrough: Vec<String> = std::env::args().skip(1).collect();
    let backend: String = args.get("backend", "shm".to_string());
    if backend != "shm" && backend != "mpi" {
        eprintln!("dsm bench: --backend must be shm or mpi");
        std::process::exit(2);
    }
    let mut failed = false;
    let alloc_procs: Vec<usize> = args.list("alloc-procs", &[1, 2]);
    let team_procs: Vec<usize> = args.list("team-procs", &[2]);
    let wn_lists: Vec<usize> = args.list("wn-lists", &[16, 1024]);
    args.allow(JOB_OPTIONS);
    args.finish("dsm");
    for part in &parts {
        let procs = match part.as_str() {
            "alloc" => &alloc_procs,
            "team-barrier" => &team_procs,
            _ => &procs,
        };
        for &p in procs {
            let variants: Vec<Vec<(&str, String)>> = if part == "protocol" {
                let mut v = Vec::new();
                for w in ["floating", "fixed"] {
                    for i in ["hybrid", "timestamp", "directory"] {
                        v.push(vec![
                            ("MENPS_DSM_WRITER", w.to_string()),
                            ("MENPS_DSM_INVALIDATION", i.to_string()),
                        ]);
                    }
                }
                for &l in &wn_lists {
                    v.push(vec![
                        ("MENPS_DSM_WRITER", "floating".to_string()),
                        ("MENPS_DSM_INVALIDATION", "hybrid".to_string()),
                        ("MENPS_DSM_WN_LIST", l.to_string()),
                    ]);
                }
                v
            } else if part == "read" {
                // The read phase fetching on demand (refresh off: with it,
                // the runs after the first find their copies refreshed by
                // the barrier's acquire and read local memory), then the
                // default configuration, timed from the barrier on.
                vec![vec![("MENPS_DSM_REFRESH", "0".to_string())], vec![]]
            } else {
                vec![vec![]]
            };
            for vars in variants {
                // The second `read` job is the `read-refresh` part.
                let job_part = if part == "read" && vars.is_empty() {
                    "read-refresh"
                } else {
                    part.as_str()
                };
                let mut cmd = if backend == "mpi" {
                    let mut c = Command::new("mpirun");
                    c.args(["-n", &p.to_string(), "--oversubscribe"]);
                    // SAFETY: geteuid has no preconditions.
                    if unsafe { libc::geteuid() } == 0 {
                        c.arg("--allow-run-as-root");
                    }
                    // mpirun forwards the variables named with -x.
                    for k in [CHILD].iter().chain(vars.iter().map(|(k, _)| k)) {
                        c.args(["-x", k]);
                    }
                    for k in ["MENPS_NET_LATENCY", "MENPS_NET_BANDWIDTH", "MENPS_STATS"] {
                        if std::env::var_os(k).is_some() {
                            c.args(["-x", k]);
                        }
                    }
                    c.arg(&exe);
                    c
                } else {
                    Command::new(&exe)
                };
                cmd.args(&passthrough)
                    .env(CHILD, job_part)
                    .env("MENPS_NPROCS", p.to_string());
                for (k, v) in &vars {
                    cmd.env(k, v);
                }
                // The job's lines go to our stdout and into our summary.
                let st = ct_bench::run_forwarding(&mut cmd).expect("start a benchmark job");
                if !st.success() {
                    eprintln!("dsm bench: {part} with {p} processes {vars:?} failed: {st}");
                    failed = true;
                }
            }
        }
    }
    ct_bench::print_summary();
    if failed {
        std::process::exit(1);
    }
}

fn job(part: &str, args: &Args) {
    let com: AnyCom<OsThreads> = menps_dsm::launch::init_or_relaunch(2).unwrap_or_else(|e| {
        eprintln!("dsm bench: {e}");
        std::process::exit(2)
    });
    let dsm = D::new(com).unwrap_or_else(|e| {
        eprintln!("dsm bench: {e}");
        std::process::exit(2)
    });
    let b = Bench {
        suffix: if dsm.com().backend_name() == "shm" {
            ""
        } else {
            "-mpi"
        },
        dsm: &dsm,
        runs: args.get("runs", 7),
    };
    match part {
        "barrier" => b.barrier(args.get("barriers", 2000), args.get("touched", 16 << 20)),
        "read" | "read-refresh" => b.read(
            &args.list("read-sizes", &[4096, 65536, 1 << 20, 16 << 20]),
            &args.list("read-blocks", &[32768, 4096]),
            part == "read",
        ),
        "false-sharing" => b.false_sharing(
            &args.list("stripes", &[8, 64, 512, 4096, 32768]),
            args.get("fs-iters", 200),
        ),
        "protocol" => b.protocol(args.get("protocol-iters", 30)),
        "alloc" => b.alloc(args.get("alloc-pairs", 1_000_000)),
        "fork-join" => b.fork_join(args.get("forks", 2000)),
        "team-barrier" => b.team_barrier(
            &args.list("team-threads", &[1, 2]),
            args.get("team-barriers", 5000),
        ),
        other => {
            eprintln!("dsm bench: unknown part {other}");
            std::process::exit(2)
        }
    }
    if b.dsm.rank() == 0 {
        eprintln!("dsm bench {part}: rank 0 stats {:?}", b.dsm.stats());
    }
    dsm.finalize().unwrap();
}

struct Bench<'a> {
    dsm: &'a D,
    runs: usize,
    /// Appended to the implementation's name (`-mpi` on the MPI backend).
    suffix: &'static str,
}

impl Bench<'_> {
    fn emit(&self, bench: &str, imp: &str, params: &[(&str, Param)], unit: &str, s: &Stats) {
        if self.dsm.rank() == 0 {
            let mut p: Vec<(&str, Param)> = vec![("procs", self.dsm.nprocs().into())];
            p.extend(params.iter().cloned());
            if let Some(t) = self.dsm.com().traffic() {
                p.push((
                    "net_latency_us",
                    Param::Float(t.model.latency.as_secs_f64() * 1e6),
                ));
                p.push((
                    "net_bandwidth_gbit",
                    Param::Float(t.model.bandwidth.map_or(0.0, |b| b as f64 / 1e9)),
                ));
            }
            emit(
                "menps-dsm",
                bench,
                &format!("{imp}{}", self.suffix),
                &p,
                unit,
                s,
            );
        }
    }

    /// The communication operations per operation between two snapshots
    /// of this process's counters, as params (none without counters).
    fn per_op(
        before: Option<Traffic>,
        after: Option<Traffic>,
        ops: usize,
    ) -> Vec<(&'static str, Param)> {
        let (Some(b), Some(a)) = (before, after) else {
            return Vec::new();
        };
        let d = a.since(&b);
        let per = |n: u64| Param::Float(n as f64 / ops.max(1) as f64);
        vec![
            ("com_rma_per_op", per(d.rma_ops())),
            ("com_msgs_per_op", per(d.msgs_sent)),
            ("com_colls_per_op", per(d.collectives())),
        ]
    }

    /// A figure measured on every process and agreed on: each run's value is
    /// rank 0's (broadcast), so every process runs the same number of runs.
    fn agreed(&self, mut f: impl FnMut() -> f64) -> Stats {
        repeat(self.runs, || {
            let mut v = f().to_le_bytes();
            self.dsm.com().broadcast(0, &mut v).unwrap();
            f64::from_le_bytes(v)
        })
    }

    fn barrier(&self, n: usize, touched: usize) {
        let com = self.dsm.com();
        let plain = self
            .agreed(|| time_secs(|| (0..n).for_each(|_| com.barrier().unwrap())) * 1e6 / n as f64);
        let mut params = vec![("dsm_bytes", 0usize.into())];
        if let Some(shm) = com.as_shm() {
            params.push(("algorithm", shm.barrier_algorithm().into()));
        }
        self.emit("dsm-barrier", "comm-barrier", &params, "us", &plain);
        let counted = |k: usize| {
            let before = com.traffic();
            (0..k).for_each(|_| self.dsm.barrier().unwrap());
            Self::per_op(before, com.traffic(), k)
        };
        let empty = self.agreed(|| {
            time_secs(|| (0..n).for_each(|_| self.dsm.barrier().unwrap())) * 1e6 / n as f64
        });
        // Counted after the timed runs: the steady state they measured.
        let counts = counted(n.min(100));
        let mut params = vec![("dsm_bytes", 0usize.into())];
        params.extend(counts);
        self.emit("dsm-barrier", "menps", &params, "us", &empty);
        // 1 GiB of segments, some of it used.
        let gib = 1usize << 30;
        let p = self.dsm.alloc_segment(gib, 32 * 1024).unwrap();
        let touched = touched.min(gib);
        if self.dsm.rank() == 0 {
            for i in (0..touched).step_by(4096) {
                // SAFETY: DSM memory only rank 0 writes before the barrier.
                unsafe { p.add(i).write(1) };
            }
        }
        self.dsm.barrier().unwrap();
        for i in (0..touched).step_by(4096) {
            // SAFETY: written before the barrier.
            assert_eq!(unsafe { p.add(i).read() }, 1);
        }
        self.dsm.barrier().unwrap();
        let big = self.agreed(|| {
            time_secs(|| (0..n).for_each(|_| self.dsm.barrier().unwrap())) * 1e6 / n as f64
        });
        let counts = counted(n.min(100));
        let mut params = vec![("dsm_bytes", gib.into())];
        params.extend(counts);
        self.emit("dsm-barrier", "menps", &params, "us", &big);
        let rtt = self.round_trip(n);
        self.emit(
            "dsm-barrier",
            "comm-round-trip",
            &[("dsm_bytes", 0usize.into())],
            "us",
            &rtt,
        );
        if self.dsm.rank() == 0 {
            eprintln!(
                "dsm-barrier: {:.2} us empty, {:.2} us with 1 GiB (comm barrier {:.2} us, \
                 round trip {:.2} us); target <= 5 us on one machine (4 processes: <= 3.5 us), \
                 <= round trip + 5 us across hosts",
                empty.median, big.median, plain.median, rtt.median
            );
        }
    }

    /// Round trip of an 8-byte message between ranks 0 and 1 through the
    /// communication layer (us; the others wait).
    fn round_trip(&self, n: usize) -> Stats {
        let com = self.dsm.com();
        let me = com.rank();
        let msg = 0x5eed_u64.to_le_bytes();
        self.agreed(|| {
            if me > 1 {
                return 0.0;
            }
            let peer = 1 - me;
            time_secs(|| {
                for _ in 0..n {
                    if me == 0 {
                        com.send(peer, RTT_TAG, &msg).unwrap();
                        let (_, m) = com.recv(Source::Rank(peer), RTT_TAG).unwrap();
                        assert_eq!(m, msg, "round trip: wrong payload");
                    } else {
                        let (_, m) = com.recv(Source::Rank(peer), RTT_TAG).unwrap();
                        com.send(peer, RTT_TAG, &m).unwrap();
                    }
                }
            }) * 1e6
                / n as f64
        })
    }

    /// The `read` part (with `baselines`, the baselines too). Rank 1 times
    /// its read phase and, from a communication barrier that rank 0 enters
    /// once it has written, the DSM barrier and the read phase together.
    /// With the refresh of hot blocks on (the default configuration), the
    /// data is fetched in the barrier's acquire from the second run on, so
    /// only the second figure is emitted (`menps-refresh-with-barrier`);
    /// with it off (`MENPS_DSM_REFRESH=0`, as the driver's first job runs),
    /// both (`menps`, `menps-with-barrier`).
    fn read(&self, sizes: &[usize], blocks: &[usize], baselines: bool) {
        let me = self.dsm.rank();
        let max = sizes.iter().copied().max().unwrap_or(4096);
        if baselines {
            self.read_baselines(sizes, max);
        }
        let refresh = self.dsm.config().refreshes > 0;
        let refreshes = Param::from(usize::from(self.dsm.config().refreshes));
        for &bs in blocks {
            let seg = self
                .dsm
                .alloc_segment(max.next_multiple_of(bs), bs)
                .unwrap() as *mut u64;
            for &s in sizes {
                let words = s / 8;
                let mut round = 0u64;
                // Rank 1's operations in its last read phase.
                let mut counts = [0u64; 3];
                // MB/s from the barrier, per run (the first is the warm-up).
                let mut with_barrier = Vec::new();
                let st = self.agreed(|| {
                    round += 1;
                    if me == 0 {
                        for i in 0..words {
                            // SAFETY: only rank 0 writes, before the barrier.
                            unsafe { seg.add(i).write(round + i as u64) };
                        }
                    }
                    self.dsm.com().barrier().unwrap();
                    let start = std::time::Instant::now();
                    self.dsm.barrier().unwrap();
                    let mut mbs = [0.0f64; 2];
                    if me == 1 {
                        let mut sum = 0u64;
                        let before = self.dsm.com().traffic();
                        let t = time_secs(|| {
                            for i in 0..words {
                                // SAFETY: written before the barrier.
                                sum = sum.wrapping_add(unsafe { seg.add(i).read() });
                            }
                        });
                        let from_barrier = start.elapsed().as_secs_f64();
                        let want = (0..words as u64).fold(0u64, |a, i| a.wrapping_add(round + i));
                        assert_eq!(sum, want, "read bench: wrong data");
                        mbs = [s as f64 / t / 1e6, s as f64 / from_barrier / 1e6];
                        if let (Some(b), Some(a)) = (before, self.dsm.com().traffic()) {
                            let d = a.since(&b);
                            counts = [d.rma_ops(), d.msgs_sent, d.collectives()];
                        }
                    }
                    self.dsm.barrier().unwrap();
                    // Rank 1's figures and counts, sent to rank 0.
                    let mut v = [0u8; 40];
                    for (i, w) in mbs.iter().map(|m| m.to_bits()).chain(counts).enumerate() {
                        v[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
                    }
                    self.dsm.com().broadcast(1, &mut v).unwrap();
                    let w = |i: usize| u64::from_le_bytes(v[8 * i..8 * i + 8].try_into().unwrap());
                    for (i, c) in counts.iter_mut().enumerate() {
                        *c = w(2 + i);
                    }
                    with_barrier.push(f64::from_bits(w(1)));
                    f64::from_bits(w(0))
                });
                let mut params = vec![
                    ("size", s.into()),
                    ("block", bs.into()),
                    ("refreshes", refreshes.clone()),
                ];
                let from_barrier = Stats::from_samples(&with_barrier[1..]);
                if refresh {
                    self.emit(
                        "read",
                        "menps-refresh-with-barrier",
                        &params,
                        "MB/s",
                        &from_barrier,
                    );
                    continue;
                }
                self.emit("read", "menps-with-barrier", &params, "MB/s", &from_barrier);
                // The counts are the read phase's (on rank 1).
                if self.dsm.com().traffic().is_some() {
                    let names = ["com_rma_per_op", "com_msgs_per_op", "com_colls_per_op"];
                    for (name, c) in names.into_iter().zip(counts) {
                        params.push((name, Param::Float(c as f64)));
                    }
                }
                self.emit("read", "menps", &params, "MB/s", &st);
            }
        }
    }

    /// The `read` part's baselines: memcpy of S bytes, and a TCP stream
    /// from process 0 to process 1 in writes of S bytes.
    fn read_baselines(&self, sizes: &[usize], max: usize) {
        // memcpy baseline.
        let src = vec![1u8; max];
        let mut dst = vec![0u8; max];
        for &s in sizes {
            let base = self.agreed(|| {
                let reps = (64 << 20) / s;
                let t = time_secs(|| {
                    for _ in 0..reps {
                        dst[..s].copy_from_slice(std::hint::black_box(&src[..s]));
                    }
                });
                (s * reps) as f64 / t / 1e6
            });
            self.emit("read", "memcpy", &[("size", s.into())], "MB/s", &base);
        }
        // TCP baseline: the link's bandwidth from process 0 to process 1
        // (loopback on one machine), streamed in writes of S bytes.
        let tcp = tcp::Link::open(self.dsm.com());
        for &s in sizes {
            let st = self.agreed(|| {
                tcp.as_ref()
                    .map_or(0.0, |l| l.stream_mbs(s, TCP_BYTES.max(s)))
            });
            self.emit("read", "tcp-stream", &[("size", s.into())], "MB/s", &st);
        }
    }

    fn false_sharing(&self, stripes: &[usize], iters: usize) {
        let (me, n) = (self.dsm.rank(), self.dsm.nprocs());
        let block = 32 * 1024;
        let seg = self.dsm.alloc_segment(block, block).unwrap();
        for &stripe in stripes {
            let mut round = 0u8;
            // Rank 0's communication operations per iteration, over the
            // last run (with a network model, which counts them).
            let mut counts = Vec::new();
            let st = self.agreed(|| {
                let before = self.dsm.com().traffic();
                let t = time_secs(|| {
                    for _ in 0..iters {
                        round = round.wrapping_add(1);
                        for i in (0..block / stripe).filter(|i| i % n == me) {
                            // SAFETY: stripe `i` belongs to this process.
                            unsafe { seg.add(i * stripe).write_bytes(round, stripe) };
                        }
                        self.dsm.barrier().unwrap();
                    }
                });
                counts = Self::per_op(before, self.dsm.com().traffic(), iters);
                t * 1e6 / iters as f64
            });
            // The block is exact.
            for i in 0..block {
                // SAFETY: written before the last barrier.
                let v = unsafe { seg.add(i).read() };
                assert_eq!(v, round, "false sharing: byte {i} wrong");
            }
            self.dsm.barrier().unwrap();
            let mut params = vec![("stripe", stripe.into())];
            params.extend(counts);
            self.emit("false-sharing", "menps", &params, "us", &st);
        }
    }

    /// Sparse mat-vec iterations on a banded matrix with a few far entries
    /// per row (the access pattern of CG's mat-vec): x and y in the DSM, rows
    /// split by process; each iteration computes y = A x for the own rows, a
    /// barrier, then x = y / |y|max for the own rows, a barrier.
    fn protocol(&self, iters: usize) {
        let (me, n) = (self.dsm.rank(), self.dsm.nprocs());
        let rows = 1 << 16;
        let per_row = 12;
        let bs = 4096;
        let x = self.dsm.alloc_segment(rows * 8, bs).unwrap() as *mut f64;
        let y = self.dsm.alloc_segment(rows * 8, bs).unwrap() as *mut f64;
        let chunk = rows / n;
        let mine = me * chunk..if me == n - 1 { rows } else { (me + 1) * chunk };
        // The matrix is private (every process generates its rows).
        let mut cols = Vec::with_capacity(mine.len() * per_row);
        let mut rng = 0x2545_f491_4f6c_dd1du64 ^ me as u64;
        for r in mine.clone() {
            for k in 0..per_row {
                let c = if k < per_row - 2 {
                    (r + k).saturating_sub(per_row / 2).min(rows - 1)
                } else {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng % rows as u64) as usize
                };
                cols.push(c);
            }
        }
        for r in mine.clone() {
            // SAFETY: own rows.
            unsafe { x.add(r).write(1.0) };
        }
        self.dsm.barrier().unwrap();
        let st = self.agreed(|| {
            time_secs(|| {
                for _ in 0..iters {
                    for (i, r) in mine.clone().enumerate() {
                        let mut s = 0.0;
                        for &c in &cols[i * per_row..(i + 1) * per_row] {
                            // SAFETY: x is only written in the other phase.
                            s += unsafe { x.add(c).read() } * 0.1;
                        }
                        // SAFETY: own rows of y.
                        unsafe { y.add(r).write(s) };
                    }
                    self.dsm.barrier().unwrap();
                    for r in mine.clone() {
                        // SAFETY: own rows; y is only read here in this phase.
                        unsafe { x.add(r).write(y.add(r).read() / 1.2) };
                    }
                    self.dsm.barrier().unwrap();
                }
            }) * 1e6
                / iters as f64
        });
        let cfg = self.dsm.config();
        let variant = format!("{:?}-{:?}", cfg.writer, cfg.invalidation).to_lowercase();
        self.emit(
            "protocol",
            &variant,
            &[
                ("rows", rows.into()),
                ("wn_list", cfg.effective_wn_list_len().into()),
                (
                    "fast_release",
                    usize::from(cfg.fast_release_active()).into(),
                ),
            ],
            "us",
            &st,
        );
    }

    /// malloc/free pairs through the global allocator in DSM context, and
    /// the system allocator's in the same run.
    fn alloc(&self, pairs: usize) {
        use std::alloc::{GlobalAlloc, Layout, System};
        for size in [64usize, 4096] {
            let l = Layout::from_size_align(size, 8).unwrap();
            let pair = |a: &dyn GlobalAlloc| {
                time_secs(|| {
                    for _ in 0..pairs {
                        // SAFETY: a valid layout; freed at once with it.
                        unsafe {
                            let p = a.alloc(l);
                            assert!(!p.is_null());
                            std::hint::black_box(p).write(1);
                            a.dealloc(p, l);
                        }
                    }
                }) * 1e9
                    / pairs as f64
            };
            let sys = self.agreed(|| pair(&System));
            self.emit("dsm-alloc", "system", &[("bytes", size.into())], "ns", &sys);
            let dsm = self.agreed(|| in_dsm_context(|| pair(&ALLOC)));
            self.emit("dsm-alloc", "menps", &[("bytes", size.into())], "ns", &dsm);
            // The objects really are DSM memory.
            let b = in_dsm_context(|| vec![0u8; size]);
            assert!(menps_dsm::dsm::allocator::is_dsm_pointer(b.as_ptr()));
            if self.dsm.rank() == 0 {
                eprintln!(
                    "dsm-alloc {size} B: {:.1} ns vs system {:.1} ns ({:.2}x; target <= 3x)",
                    dsm.median,
                    sys.median,
                    dsm.median / sys.median
                );
            }
        }
    }

    /// Consecutive empty forks on one thread per process.
    fn fork_join(&self, forks: usize) {
        let com = self.dsm.com();
        let plain = self.agreed(|| {
            time_secs(|| (0..forks).for_each(|_| com.barrier().unwrap())) * 1e6 / forks as f64
        });
        self.emit("fork-join", "comm-barrier", &[], "us", &plain);
        let team = Team::new(self.dsm, 1).unwrap();
        fn empty(_: &TeamThread<'_>, _: *mut u8) {}
        let out = team
            .run_main(|| {
                repeat(self.runs, || {
                    time_secs(|| {
                        for _ in 0..forks {
                            // SAFETY: the function touches no data.
                            unsafe { team.fork(1, empty, core::ptr::null_mut()) }.unwrap();
                        }
                    }) * 1e6
                        / forks as f64
                })
            })
            .unwrap();
        if let Some(st) = out {
            self.emit(
                "fork-join",
                "menps",
                &[("threads_per_proc", 1usize.into())],
                "us",
                &st,
            );
            eprintln!(
                "fork-join: {:.2} us per fork (comm barrier {:.2} us); target <= 10 us",
                st.median, plain.median
            );
        }
    }

    /// Team barriers of T threads per process, inside one fork per run.
    fn team_barrier(&self, threads: &[usize], episodes: usize) {
        let n = self.dsm.nprocs();
        for &t in threads {
            // Baseline: the same number of threads, one process, ct-sync.
            if self.dsm.rank() == 0 {
                let rt = ct_worker::Runtime::builder()
                    .workers(n * t)
                    .build()
                    .unwrap();
                let st = repeat(self.runs, || {
                    let b = ct_sync::Barrier::new(n * t);
                    rt.block_on(|| {
                        time_secs(|| {
                            ct_worker::scope(|s| {
                                for _ in 0..n * t {
                                    s.spawn(|| {
                                        (0..episodes).for_each(|_| {
                                            b.wait();
                                        })
                                    });
                                }
                            })
                        })
                    }) * 1e6
                        / episodes as f64
                });
                self.emit(
                    "team-barrier",
                    "ct-sync-one-process",
                    &[("threads_per_proc", t.into()), ("threads", (n * t).into())],
                    "us",
                    &st,
                );
            }
            self.dsm.barrier().unwrap();
            let team = Team::new(self.dsm, 1).unwrap();
            let out = team
                .run_main(|| {
                    repeat(self.runs, || {
                        let mut secs = 0.0f64;
                        let at = &mut secs as *mut f64 as usize;
                        // `move`: the closure (in main's frame, DSM memory)
                        // holds copies; a reference to `episodes` would
                        // point into this OS thread's stack, which the other
                        // processes cannot see.
                        let work = move |th: &TeamThread<'_>| {
                            let s = time_secs(|| {
                                for _ in 0..episodes {
                                    th.barrier().unwrap();
                                }
                            });
                            if th.thread_num() == 0 {
                                // SAFETY: main's local, written by thread 0
                                // (main itself) only.
                                unsafe { (at as *mut f64).write(s) };
                            }
                        };
                        // SAFETY: the closure holds copies and an address in
                        // main's frame that only thread 0 (main) writes.
                        unsafe { team.parallel(t, &work) }.unwrap();
                        secs * 1e6 / episodes as f64
                    })
                })
                .unwrap();
            if let Some(st) = out {
                self.emit(
                    "team-barrier",
                    "menps",
                    &[("threads_per_proc", t.into())],
                    "us",
                    &st,
                );
                eprintln!(
                    "team-barrier {n}x{t}: {:.2} us per episode; target (2x1) <= 2 us",
                    st.median
                );
            }
        }
    }
}

/// The TCP baseline of `read`.
mod tcp {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
    use std::time::Duration;

    use ct_bench::time_secs;
    use ct_worker::OsThreads;
    use menps_dsm::com::{AnyCom, Coll, Comm};

    /// Addresses process 0 offers at most.
    const MAX_ADDRS: usize = 16;

    /// One end of a TCP connection between processes 0 and 1.
    pub struct Link {
        stream: TcpStream,
        sender: bool,
    }

    /// Process 0's IPv4 addresses, loopback last.
    fn own_addrs() -> Vec<Ipv4Addr> {
        let mut out = Vec::new();
        let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `ifs` with a list we free below.
        if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
            return vec![Ipv4Addr::LOCALHOST];
        }
        let mut p = ifs;
        while !p.is_null() {
            // SAFETY: `p` is an element of the list getifaddrs returned.
            let ifa = unsafe { &*p };
            if !ifa.ifa_addr.is_null()
                // SAFETY: a non-null address of the list.
                && i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET
            {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            p = ifa.ifa_next;
        }
        // SAFETY: the list from getifaddrs, freed once.
        unsafe { libc::freeifaddrs(ifs) };
        out.sort_by_key(|a| a.is_loopback());
        out.truncate(MAX_ADDRS);
        out
    }

    impl Link {
        /// Connects process 1 to process 0 (collective; `None` on the other
        /// processes, or if no address of process 0 was reachable).
        pub fn open(com: &AnyCom<OsThreads>) -> Option<Link> {
            let me = com.rank();
            let listener = (me == 0).then(|| TcpListener::bind(("0.0.0.0", 0)).expect("bind"));
            // Port, count, addresses.
            let mut offer = [0u8; 8 + 4 * MAX_ADDRS];
            if let Some(l) = &listener {
                let addrs = own_addrs();
                let port = l.local_addr().expect("local address").port();
                offer[..4].copy_from_slice(&u32::from(port).to_le_bytes());
                offer[4..8].copy_from_slice(&(addrs.len() as u32).to_le_bytes());
                for (i, a) in addrs.iter().enumerate() {
                    offer[8 + 4 * i..12 + 4 * i].copy_from_slice(&a.octets());
                }
            }
            com.broadcast(0, &mut offer).expect("broadcast");
            let word = |i: usize| u32::from_le_bytes(offer[i..i + 4].try_into().expect("4"));
            let link = match me {
                0 => {
                    let l = listener.expect("listener");
                    l.set_nonblocking(true).expect("nonblocking");
                    // Process 1 says whether it connected, after trying.
                    let mut stream = None;
                    let mut ok = [0u8; 1];
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    while stream.is_none() && std::time::Instant::now() < deadline {
                        match l.accept() {
                            Ok((s, _)) => stream = Some(s),
                            Err(_) => std::thread::sleep(Duration::from_millis(1)),
                        }
                    }
                    com.broadcast(1, &mut ok).expect("broadcast");
                    stream.filter(|_| ok[0] == 1).map(|s| Link {
                        stream: s,
                        sender: true,
                    })
                }
                1 => {
                    let port = word(0) as u16;
                    let n = (word(4) as usize).min(MAX_ADDRS);
                    let stream = (0..n).find_map(|i| {
                        let o = &offer[8 + 4 * i..12 + 4 * i];
                        let a = SocketAddr::from((Ipv4Addr::new(o[0], o[1], o[2], o[3]), port));
                        TcpStream::connect_timeout(&a, Duration::from_secs(1)).ok()
                    });
                    let mut ok = [u8::from(stream.is_some())];
                    com.broadcast(1, &mut ok).expect("broadcast");
                    stream.map(|s| Link {
                        stream: s,
                        sender: false,
                    })
                }
                _ => {
                    com.broadcast(1, &mut [0u8; 1]).expect("broadcast");
                    None
                }
            };
            if let Some(l) = &link {
                l.stream.set_nonblocking(false).expect("blocking");
                l.stream.set_nodelay(true).expect("nodelay");
            } else if me < 2 {
                eprintln!(
                    "dsm bench: no TCP connection from process 1 to process 0; no tcp baseline"
                );
            }
            link
        }

        /// Process 1 asks for `total` bytes; process 0 sends them in writes
        /// of `chunk` bytes; MB/s as process 1 measured it (on both ends).
        pub fn stream_mbs(&self, chunk: usize, total: usize) -> f64 {
            let mut s = &self.stream;
            let mut buf = vec![0x5au8; chunk];
            if self.sender {
                let mut go = [0u8; 1];
                s.read_exact(&mut go).expect("tcp baseline: read");
                let mut left = total;
                while left > 0 {
                    let k = left.min(chunk);
                    s.write_all(&buf[..k]).expect("tcp baseline: write");
                    left -= k;
                }
                // The receiver's figure.
                let mut v = [0u8; 8];
                s.read_exact(&mut v).expect("tcp baseline: read");
                f64::from_le_bytes(v)
            } else {
                let t = time_secs(|| {
                    s.write_all(&[1]).expect("tcp baseline: write");
                    let mut left = total;
                    while left > 0 {
                        let k = s
                            .read(&mut buf[..left.min(chunk)])
                            .expect("tcp baseline: read");
                        assert!(k > 0, "tcp baseline: connection closed");
                        left -= k;
                    }
                });
                let mbs = total as f64 / t / 1e6;
                s.write_all(&mbs.to_le_bytes())
                    .expect("tcp baseline: write");
                mbs
            }
        }
    }
}
