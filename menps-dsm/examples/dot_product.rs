//! Dot product on the MENPS DSM in SPMD style, without `unsafe`: the
//! checked stripes of [`DsmVec`].
//!
//! Every process runs the same program on its own part of two DSM vectors
//! `x` and `y` of `N` elements:
//!
//! 1. it fills its stripes of `x` and `y` ([`DsmVec::my_part_mut`]), in
//!    chunks written by user-level threads of the process (ct-worker, two
//!    workers);
//! 2. after a DSM barrier, it computes the dot product of its parts, one
//!    partial sum per chunk and thread, and writes the result into its
//!    element of a vector of partial sums (one element per process);
//! 3. after another barrier every process adds all the partial sums up (in
//!    rank order, so every process gets the same number) through a view
//!    ([`DsmVec::view`]).
//!
//! Rank 0 verifies the result against a serial dot product over the whole
//! vectors, read through views from the DSM (the pages of the other
//! processes' stripes are fetched), and against a closed form computed
//! without the DSM; every process checks that it got the same result. The
//! values are small integers, so every sum is exact. The exit status is
//! non-zero if a check fails. The vectors are freed when the processes
//! drop their handles.
//!
//! ```text
//! cargo run --release -p menps-dsm --example dot_product
//! cargo run --release -p menps-dsm --example dot_product -- 10000000
//! MENPS_NPROCS=2 cargo run --release -p menps-dsm --example dot_product
//! ```
//!
//! It starts 4 processes by itself (`MENPS_NPROCS` overrides the count; the
//! `MENPS_DSM_*` variables choose the protocol). Built with the `mpi`
//! feature it joins an MPI job instead when started by `mpirun`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use ct_worker::OsThreads;
use menps_dsm::com::AnyCom;
use menps_dsm::dsm::{Dsm, DsmResult, DsmVec};

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

const USAGE: &str = "usage: dot_product [N]
  N  length of the vectors (default 1000000)
The job has 4 processes unless MENPS_NPROCS says otherwise.";

/// Elements per user-level thread.
const CHUNK: usize = 16 * 1024;

fn x_of(i: usize) -> f64 {
    (i % 7) as f64 + 1.0
}

fn y_of(i: usize) -> f64 {
    (i % 11) as f64 - 3.0
}

/// The dot product of `x` and `y` of length `n`, without the DSM (exact
/// integer arithmetic).
fn closed_form(n: usize) -> f64 {
    (0..n)
        .map(|i| (i % 7 + 1) as i64 * ((i % 11) as i64 - 3))
        .sum::<i64>() as f64
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// What one process found.
struct Outcome {
    total: f64,
    /// Rank 0: the serial dot product over the whole vectors.
    serial: Option<f64>,
    fill: Duration,
    compute: Duration,
}

/// The SPMD program, run by every process.
fn run(dsm: &D, n: usize) -> DsmResult<Outcome> {
    let rt = ct_worker::Runtime::builder()
        .workers(2)
        .build()
        .expect("cannot start the user-level thread runtime");
    let x: DsmVec<'_, f64, _, _> = DsmVec::new_collective(dsm, n)?;
    let y: DsmVec<'_, f64, _, _> = DsmVec::new_collective(dsm, n)?;
    let partials: DsmVec<'_, f64, _, _> = DsmVec::new_collective(dsm, dsm.nprocs())?;

    // 1. This process's stripes, a chunk per user-level thread.
    let t = Instant::now();
    {
        let mut xs = x.my_part_mut()?;
        let mut ys = y.my_part_mut()?;
        rt.block_on(|| {
            ct_worker::scope(|s| {
                for ((start, xc), (_, yc)) in xs
                    .indexed_chunks_mut(CHUNK)
                    .zip(ys.indexed_chunks_mut(CHUNK))
                {
                    s.spawn(move || {
                        for (k, (a, b)) in xc.iter_mut().zip(yc).enumerate() {
                            *a = x_of(start + k);
                            *b = y_of(start + k);
                        }
                    });
                }
            })
        });
    } // the stripes end here
    dsm.barrier()?;
    let fill = t.elapsed();

    // 2. The dot product of this process's parts, a partial sum per chunk.
    let t = Instant::now();
    let mine = x.my_range();
    let (xs, ys) = (x.stripe(mine.clone())?, y.stripe(mine)?);
    let mut sums = vec![0.0; xs.len().div_ceil(CHUNK)];
    rt.block_on(|| {
        ct_worker::scope(|s| {
            for ((a, b), out) in xs.chunks(CHUNK).zip(ys.chunks(CHUNK)).zip(&mut sums) {
                s.spawn(move || *out = dot(a, b));
            }
        })
    });
    // This process's part of `partials` is its one element.
    partials.my_part_mut()?[0] = sums.iter().sum();
    dsm.barrier()?;

    // 3. Everybody adds the partial sums up, in rank order.
    let total = partials.view()?.iter().sum::<f64>() + 0.0; // (+0 for no elements)
    let compute = t.elapsed();

    // Rank 0 reads both vectors whole (its views coexist with the stripes
    // for reading above).
    let serial = if dsm.rank() == 0 {
        Some(dot(&x.view()?, &y.view()?))
    } else {
        None
    };
    drop((xs, ys));
    // Each process is done with the vectors: dropping the handles (here, at
    // the end of the scope) frees them once the last process has.
    Ok(Outcome {
        total,
        serial,
        fill,
        compute,
    })
}

fn main() -> ExitCode {
    // Warnings the libraries report (through `log`) go to stderr.
    ct_worker::log_to_stderr();
    let mut n = 1_000_000;
    for a in std::env::args().skip(1) {
        match a.parse() {
            Ok(v) => n = v,
            Err(_) => {
                let help = a == "-h" || a == "--help";
                eprintln!(
                    "{}{USAGE}",
                    if help {
                        ""
                    } else {
                        "dot_product: bad argument\n"
                    }
                );
                return if help {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                };
            }
        }
    }
    let com: AnyCom<OsThreads> = match menps_dsm::launch::init_or_relaunch(4) {
        Ok(c) => c,
        Err(e) => {
            menps_dsm::launch::report_failure("dot_product", &e);
            return ExitCode::FAILURE;
        }
    };
    let dsm: D = match Dsm::new(com) {
        Ok(d) => d,
        Err(e) => {
            menps_dsm::launch::report_failure("dot_product", &e);
            return ExitCode::FAILURE;
        }
    };
    let (rank, nprocs) = (dsm.rank(), dsm.nprocs());
    let outcome = run(&dsm, n);
    let finalized = dsm.finalize();
    let o = match (outcome, finalized) {
        (Ok(o), Ok(())) => o,
        (Err(e), _) | (_, Err(e)) => {
            // One line per failure, from the process that failed.
            menps_dsm::launch::report_failure("dot_product", &e);
            return ExitCode::FAILURE;
        }
    };
    let expect = closed_form(n);
    let mut ok = o.total == expect;
    if !ok {
        eprintln!(
            "dot_product: rank {rank}: got {}, the closed form is {expect}",
            o.total
        );
    }
    if let Some(serial) = o.serial {
        if serial != expect {
            eprintln!(
                "dot_product: a serial dot product over the DSM vectors gives {serial}, not {expect}"
            );
            ok = false;
        }
        println!(
            "dot product of {n} elements on {nprocs} process{}: {} ({}; filled in {:.1} ms, \
             computed in {:.1} ms)",
            if nprocs == 1 { "" } else { "es" },
            o.total,
            if ok { "verified" } else { "WRONG" },
            o.fill.as_secs_f64() * 1e3,
            o.compute.as_secs_f64() * 1e3
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
