//! Conjugate gradient on the MENPS DSM, verified: the runnable main job.
//!
//! A sparse symmetric positive-definite matrix (random symmetric pattern,
//! negative off-diagonal entries, strictly dominant diagonal) is generated
//! deterministically by rank 0 and written in CSR form into DSM segments,
//! with the right-hand side `b = A x*`. Every process then runs CG on its
//! block of rows: the sparse mat-vec reads the whole search direction `p`
//! from DSM memory (page faults fetch the other processes' parts), dot
//! products are reduced through one slot per process in a DSM segment and a
//! DSM barrier (summed in rank order, so every process computes the same
//! scalars), and barriers separate the phases. At the end rank 0 checks the
//! true residual `‖b − A x‖ / ‖b‖` against the tolerance and compares `x`
//! with a serial CG of the same number of iterations on private memory, and
//! prints a report with every process's DSM statistics. The exit status is
//! non-zero if the verification fails.
//!
//! ```text
//! cargo run --release -p menps-dsm --example cg
//! cargo run --release -p menps-dsm --example cg -- --n 200000 --nnz 12 --tol 1e-12
//! MENPS_NPROCS=2 MENPS_DSM_WRITER=fixed cargo run --release -p menps-dsm --example cg
//! ```
//!
//! It starts 4 processes by itself (`MENPS_NPROCS` overrides the count; the
//! `MENPS_DSM_*` variables choose the protocol). Built with the `mpi` feature
//! it joins an MPI job instead when started by `mpirun`:
//!
//! ```text
//! cargo build --release -p menps-dsm --features mpi --example cg
//! mpirun -n 4 --oversubscribe target/release/examples/cg
//! ```

use std::process::ExitCode;
use std::time::Instant;

use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, Coll};
use menps_dsm::dsm::{Dsm, DsmResult, StatsSnapshot};

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

const USAGE: &str = "usage: cg [--n ROWS] [--nnz PER_ROW] [--iters MAX] [--tol REL_RESIDUAL] \
                     [--shift S] [--seed SEED] [--block KiB]
  --n      rows of the matrix (default 100000)
  --nnz    off-diagonal entries per row, about (default 10)
  --iters  most CG iterations (default 500)
  --tol    stop when the relative residual is below this (default 1e-10)
  --shift  diagonal = sum of |off-diagonal| + shift: smaller is harder (default 0.1)
  --seed   seed of the matrix (default 1)
  --block  DSM block size of the vectors in KiB (default 64)
The job has 4 processes unless MENPS_NPROCS says otherwise.";

#[derive(Debug, Clone)]
struct Params {
    n: usize,
    nnz: usize,
    iters: usize,
    tol: f64,
    shift: f64,
    seed: u64,
    block: usize,
}

fn parse_args() -> Result<Params, String> {
    let mut p = Params {
        n: 100_000,
        nnz: 10,
        iters: 500,
        tol: 1e-10,
        shift: 0.1,
        seed: 1,
        block: 64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "-h" || a == "--help" {
            return Err(String::new());
        }
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        let bad = |_| format!("bad value {v:?} for {a}");
        match a.as_str() {
            "--n" => p.n = v.parse().map_err(bad)?,
            "--nnz" => p.nnz = v.parse().map_err(bad)?,
            "--iters" => p.iters = v.parse().map_err(bad)?,
            "--tol" => p.tol = v.parse().map_err(|_| format!("bad value {v:?} for {a}"))?,
            "--shift" => p.shift = v.parse().map_err(|_| format!("bad value {v:?} for {a}"))?,
            "--seed" => p.seed = v.parse().map_err(bad)?,
            "--block" => p.block = v.parse().map_err(bad)?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if p.n < 2 || p.n > u32::MAX as usize {
        return Err("--n must be in 2..2^32".into());
    }
    if !(p.tol > 0.0 && p.shift > 0.0) {
        return Err("--tol and --shift must be positive".into());
    }
    if !(4..=1024).contains(&p.block) || !p.block.is_power_of_two() {
        return Err("--block must be a power of two between 4 and 1024 (KiB)".into());
    }
    Ok(p)
}

// ---------------------------------------------------------------------------
// The matrix (private memory of rank 0).

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A matrix in compressed sparse row form.
struct Csr {
    n: usize,
    row_ptr: Vec<u64>,
    cols: Vec<u32>,
    vals: Vec<f64>,
}

impl Csr {
    /// `y = A x` on rows `lo..hi` (`y` indexed from `lo`).
    fn matvec(&self, x: &[f64], y: &mut [f64], lo: usize) {
        for (k, yi) in y.iter_mut().enumerate() {
            let i = lo + k;
            let (a, b) = (self.row_ptr[i] as usize, self.row_ptr[i + 1] as usize);
            *yi = (a..b)
                .map(|e| self.vals[e] * x[self.cols[e] as usize])
                .sum();
        }
    }
}

/// A random symmetric matrix with negative off-diagonal entries and
/// diagonal `sum |off-diagonal| + shift`: symmetric positive definite (its
/// eigenvalues lie in `[shift, 2 max_row_sum + shift]`).
fn generate(p: &Params) -> Csr {
    let n = p.n;
    let mut rng = Rng(p.seed ^ 0x6367_5f6d_656e_7073);
    let mut rows: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
    for i in 0..n {
        for _ in 0..p.nnz / 2 {
            let j = rng.below(n);
            if j == i {
                continue;
            }
            let v = -(0.1 + 0.9 * rng.unit());
            rows[i].push((j as u32, v));
            rows[j].push((i as u32, v));
        }
    }
    let mut row_ptr = Vec::with_capacity(n + 1);
    let mut cols = Vec::new();
    let mut vals = Vec::new();
    row_ptr.push(0);
    for (i, row) in rows.iter_mut().enumerate() {
        row.push((i as u32, 0.0));
        row.sort_by_key(|e| e.0);
        // Merge duplicate columns, then set the diagonal.
        let start = cols.len();
        for &(j, v) in row.iter() {
            if cols.len() > start && *cols.last().unwrap() == j {
                *vals.last_mut().unwrap() += v;
            } else {
                cols.push(j);
                vals.push(v);
            }
        }
        let off: f64 = (start..cols.len())
            .filter(|&e| cols[e] as usize != i)
            .map(|e| f64::abs(vals[e]))
            .sum();
        let d = (start..cols.len())
            .find(|&e| cols[e] as usize == i)
            .unwrap();
        vals[d] = off + p.shift;
        row_ptr.push(cols.len() as u64);
    }
    Csr {
        n,
        row_ptr,
        cols,
        vals,
    }
}

/// The exact solution the right-hand side is made from.
fn x_star(i: usize) -> f64 {
    1.0 + (i % 17) as f64 / 16.0
}

/// Serial CG on private memory, `iters` iterations from `x = 0`.
fn serial_cg(a: &Csr, b: &[f64], iters: usize) -> Vec<f64> {
    let n = a.n;
    let mut x = vec![0.0; n];
    let mut r = b.to_vec();
    let mut p = b.to_vec();
    let mut q = vec![0.0; n];
    let mut rho: f64 = r.iter().map(|v| v * v).sum();
    for _ in 0..iters {
        a.matvec(&p, &mut q, 0);
        let pq: f64 = p.iter().zip(&q).map(|(a, b)| a * b).sum();
        let alpha = rho / pq;
        for i in 0..n {
            x[i] += alpha * p[i];
            r[i] -= alpha * q[i];
        }
        let rho_new: f64 = r.iter().map(|v| v * v).sum();
        let beta = rho_new / rho;
        rho = rho_new;
        for i in 0..n {
            p[i] = r[i] + beta * p[i];
        }
    }
    x
}

// ---------------------------------------------------------------------------
// DSM memory.

/// An array of `len` `T`s in a DSM segment of its own.
#[derive(Clone, Copy)]
struct DArray<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy> DArray<T> {
    /// Collectively allocates the array (zeroed).
    fn new(dsm: &D, len: usize, block: usize) -> DsmResult<Self> {
        let bytes = (len * size_of::<T>()).next_multiple_of(block).max(block);
        let ptr = dsm.alloc_segment(bytes, block)?.cast::<T>();
        Ok(DArray { ptr, len })
    }

    #[inline]
    fn get(&self, i: usize) -> T {
        debug_assert!(i < self.len);
        // SAFETY: `i` is in bounds of the segment; the caller synchronised
        // with the element's last writer (the algorithm is data-race-free);
        // a miss is resolved by the DSM.
        unsafe { self.ptr.add(i).read() }
    }

    #[inline]
    fn set(&self, i: usize, v: T) {
        debug_assert!(i < self.len);
        // SAFETY: as in `get`; only this element's owner writes it in the
        // current phase.
        unsafe { self.ptr.add(i).write(v) }
    }

    /// Copies `src` into the array from element `at` (one process, no
    /// other accesses meanwhile).
    fn write_from(&self, at: usize, src: &[T]) {
        assert!(at + src.len() <= self.len);
        // SAFETY: in bounds (checked); nobody else accesses these elements
        // until the next barrier.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) };
    }

    /// Copies the whole array out of the DSM.
    fn copy_out(&self) -> Vec<T> {
        let mut v = Vec::with_capacity(self.len);
        // SAFETY: in bounds; written before a barrier this process passed;
        // `v` has capacity `len` and every element is initialised by the
        // copy before `set_len`.
        unsafe {
            core::ptr::copy_nonoverlapping(self.ptr, v.as_mut_ptr(), self.len);
            v.set_len(self.len);
        }
        v
    }
}

/// Dot-product slots: one 64-byte line per process.
const SLOT: usize = 8;

/// Sum of the slots `slot` of every process, in rank order.
fn reduce(sums: &DArray<f64>, nprocs: usize, slot: usize) -> f64 {
    (0..nprocs).map(|q| sums.get(q * SLOT + slot)).sum()
}

/// What every process sends rank 0 at the end.
fn encode(s: &StatsSnapshot, solve_secs: f64, rows: usize) -> Vec<u8> {
    [
        s.read_faults as u64,
        s.write_faults as u64,
        s.transactions as u64,
        s.fast_releases as u64,
        s.fast_reads as u64,
        s.invalidations as u64,
        s.bytes_fetched as u64,
        solve_secs.to_bits(),
        rows as u64,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect()
}

const STAT_WORDS: usize = 9;

fn main() -> ExitCode {
    // Warnings the libraries report (through `log`) go to stderr.
    ct_worker::log_to_stderr();
    let params = match parse_args() {
        Ok(p) => p,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("cg: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // In the launcher this never returns; in each process it returns the
    // communicator.
    let com: AnyCom<OsThreads> = match menps_dsm::launch::init_or_relaunch(4) {
        Ok(c) => c,
        Err(e) => {
            menps_dsm::launch::report_failure("cg", &e);
            return ExitCode::from(3);
        }
    };
    match run(com, &params) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            // One line per failure, from the process that failed (not from
            // the others, which only learn that it died).
            menps_dsm::launch::report_failure("cg", &e);
            ExitCode::FAILURE
        }
    }
}

/// Runs the job's part of this process; `Ok(false)` if the verification
/// failed (rank 0 only).
fn run(com: AnyCom<OsThreads>, p: &Params) -> DsmResult<bool> {
    let backend = com.backend_name();
    let dsm = D::new(com)?;
    let (me, np) = (dsm.rank(), dsm.nprocs());
    let n = p.n;
    let block = p.block * 1024;
    let t_setup = Instant::now();

    // Rank 0 builds the matrix; everybody learns its number of entries.
    let matrix = (me == 0).then(|| generate(p));
    let mut nnz = [0u8; 8];
    if let Some(a) = &matrix {
        nnz = (a.cols.len() as u64).to_le_bytes();
    }
    dsm.com().broadcast(0, &mut nnz)?;
    let nnz = u64::from_le_bytes(nnz) as usize;

    let row_ptr = DArray::<u64>::new(&dsm, n + 1, block)?;
    let cols = DArray::<u32>::new(&dsm, nnz, block)?;
    let vals = DArray::<f64>::new(&dsm, nnz, block)?;
    let b = DArray::<f64>::new(&dsm, n, block)?;
    let x = DArray::<f64>::new(&dsm, n, block)?;
    let r = DArray::<f64>::new(&dsm, n, block)?;
    let pv = DArray::<f64>::new(&dsm, n, block)?;
    let q = DArray::<f64>::new(&dsm, n, block)?;
    let sums = DArray::<f64>::new(&dsm, np * SLOT, 4096)?;
    let mut b_private = Vec::new();
    if let Some(a) = &matrix {
        row_ptr.write_from(0, &a.row_ptr);
        cols.write_from(0, &a.cols);
        vals.write_from(0, &a.vals);
        let xs: Vec<f64> = (0..n).map(x_star).collect();
        b_private = vec![0.0; n];
        a.matvec(&xs, &mut b_private, 0);
        b.write_from(0, &b_private);
    }
    dsm.barrier()?;

    // This process's rows.
    let (lo, hi) = (n * me / np, n * (me + 1) / np);
    // r = b, p = b (x = 0); ‖b‖² = ‖r‖².
    let mut part = 0.0;
    for i in lo..hi {
        let v = b.get(i);
        r.set(i, v);
        pv.set(i, v);
        part += v * v;
    }
    sums.set(me * SLOT + 1, part);
    dsm.barrier()?;
    let mut rho = reduce(&sums, np, 1);
    let b_norm = rho.sqrt();
    let setup_secs = t_setup.elapsed().as_secs_f64();

    let t_solve = Instant::now();
    let mut iters = 0;
    let mut rel = 1.0;
    while iters < p.iters && rel >= p.tol {
        iters += 1;
        // q = A p on our rows, and our part of p·q.
        let mut pq = 0.0;
        for i in lo..hi {
            let (a, e) = (row_ptr.get(i) as usize, row_ptr.get(i + 1) as usize);
            let mut s = 0.0;
            for k in a..e {
                s += vals.get(k) * pv.get(cols.get(k) as usize);
            }
            q.set(i, s);
            pq += pv.get(i) * s;
        }
        sums.set(me * SLOT, pq);
        dsm.barrier()?;
        let alpha = rho / reduce(&sums, np, 0);
        // x += alpha p, r -= alpha q, and our part of r·r.
        let mut rr = 0.0;
        for i in lo..hi {
            x.set(i, x.get(i) + alpha * pv.get(i));
            let ri = r.get(i) - alpha * q.get(i);
            r.set(i, ri);
            rr += ri * ri;
        }
        sums.set(me * SLOT + 1, rr);
        dsm.barrier()?;
        let rho_new = reduce(&sums, np, 1);
        rel = rho_new.sqrt() / b_norm;
        if rel < p.tol {
            break;
        }
        // p = r + beta p.
        let beta = rho_new / rho;
        rho = rho_new;
        for i in lo..hi {
            pv.set(i, r.get(i) + beta * pv.get(i));
        }
        dsm.barrier()?;
    }
    let solve_secs = t_solve.elapsed().as_secs_f64();

    // Everybody's statistics to rank 0.
    let all = dsm
        .com()
        .allgather(&encode(&dsm.stats(), solve_secs, hi - lo))?;
    let mut ok = true;
    if let Some(a) = &matrix {
        // The true residual of the DSM's x, and a serial CG of the same
        // number of iterations on private memory.
        let xd = x.copy_out();
        let mut ax = vec![0.0; n];
        a.matvec(&xd, &mut ax, 0);
        let res = ax
            .iter()
            .zip(&b_private)
            .map(|(u, v)| (v - u) * (v - u))
            .sum::<f64>()
            .sqrt()
            / b_norm;
        let t_serial = Instant::now();
        let xs = serial_cg(a, &b_private, iters);
        let serial_secs = t_serial.elapsed().as_secs_f64();
        let max_abs = |v: &mut dyn Iterator<Item = f64>| v.fold(0.0f64, |m, e| m.max(e.abs()));
        let x_scale = max_abs(&mut xs.iter().copied());
        let diff = max_abs(&mut xd.iter().zip(&xs).map(|(u, v)| u - v)) / x_scale;
        let err = max_abs(&mut xd.iter().enumerate().map(|(i, v)| v - x_star(i)));
        let converged = rel < p.tol;
        let residual_ok = res < 10.0 * p.tol;
        let serial_ok = diff < 1e-8;
        ok = converged && residual_ok && serial_ok;

        let cfg = dsm.config();
        println!(
            "CG on the MENPS DSM: {np} processes ({backend} backend); writer {:?}, invalidation \
             {:?}, fast release {}, fast read {}",
            cfg.writer,
            cfg.invalidation,
            on_off(cfg.fast_release_active()),
            on_off(cfg.fast_read_active())
        );
        println!(
            "  matrix: n = {n}, {nnz} nonzeros ({:.1} per row), symmetric positive definite \
             (diagonal shift {}), seed {}; {:.1} MB in the DSM (vectors in {} KiB blocks)",
            nnz as f64 / n as f64,
            p.shift,
            p.seed,
            ((n + 1) * 8 + nnz * 12 + 5 * n * 8) as f64 / 1e6,
            p.block
        );
        println!("  setup: {setup_secs:.3} s (rank 0 built the matrix and wrote it into the DSM)");
        println!(
            "  solve: {iters} iterations in {solve_secs:.3} s ({:.2} ms per iteration, 3 DSM \
             barriers each); relative residual {rel:.3e} (recurrence), {res:.3e} (true \
             ‖b − Ax‖/‖b‖); tolerance {:.1e}{}",
            1e3 * solve_secs / iters.max(1) as f64,
            p.tol,
            if converged { "" } else { " NOT reached" }
        );
        println!(
            "  serial check (rank 0, private memory, {iters} iterations in {serial_secs:.3} s): \
             max |x − x_serial| / max |x_serial| = {diff:.3e}; max |x − x*| = {err:.3e}"
        );
        println!("  per-process DSM statistics:");
        println!(
            "    rank     rows  solve_s  read_faults  write_faults  transactions  fast_releases  \
             fast_reads  invalidations  MB_fetched"
        );
        for (rank, w) in all.chunks_exact(8 * STAT_WORDS).enumerate() {
            let v: Vec<u64> = w
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            println!(
                "    {rank:>4} {:>8} {:>8.3} {:>12} {:>13} {:>13} {:>14} {:>11} {:>14} {:>11.1}",
                v[8],
                f64::from_bits(v[7]),
                v[0],
                v[1],
                v[2],
                v[3],
                v[4],
                v[5],
                v[6] as f64 / 1e6
            );
        }
        println!(
            "  verification {}{}",
            if ok { "PASSED" } else { "FAILED" },
            if ok {
                String::new()
            } else {
                format!(
                    " (converged: {converged}, true residual below 10 × tolerance: \
                     {residual_ok}, equal to the serial CG: {serial_ok})"
                )
            }
        );
    }
    dsm.finalize()?;
    Ok(ok)
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}
