//! A 2-D 5-point Jacobi relaxation of Laplace's equation on an
//! `(n+2) × (n+2)` grid of `f64` with fixed boundary values: every sweep
//! sets each interior point to the mean of its four neighbours in the
//! previous grid; two grids swap roles every sweep.
//!
//! Sizes: class S `n = 256`, class W `n = 1024`; 100 sweeps each. The
//! boundary holds the harmonic function `u = x² − y²` (`x = j/(n+1)`,
//! `y = i/(n+1)`), whose values at the grid points solve the discrete
//! problem exactly; the interior starts at 0.
//!
//! With menps-omp the sweeps run in one parallel region: in every sweep
//! each thread computes a contiguous block of rows of the new grid (a
//! static schedule, `Loop::rows_mut`), reading its rows of the old grid
//! and one halo row on each side through a view (`SharedMut::view`) —
//! rows which, across processes, its neighbour wrote in the sweep before
//! (a fetch per halo row per sweep). No `unsafe`.
//!
//! Verification: (1) the result equals a serial run of the same sweeps
//! (the same arithmetic in the same order, so bit for bit; at most `1e-12`
//! accepted); (2) physics: the error against `x² − y²` and the residual
//! shrink, in the 2-norm, by at least `ρ^sweeps`, where `ρ = cos(π/(n+1))`
//! is the spectral radius of the Jacobi iteration, and every value lies
//! between the boundary's minimum and maximum (maximum principle).
//!
//! Mop/s = `5 n² · sweeps / seconds / 1e6` (about 5 operations a point).

use std::ops::Range;

use rayon::prelude::*;

use menps_omp::SharedMut;

use super::report::{Class, KernelResult};

/// Sweeps of every class.
const SWEEPS: usize = 100;
/// Largest difference from the serial run the verification accepts.
const TOLERANCE: f64 = 1e-12;

/// The interior size `n` of `class`.
fn size(class: Class) -> usize {
    match class {
        Class::S => 256,
        Class::W => 1024,
    }
}

/// Runs the kernel with menps-omp (called from `main` of `menps_omp::run`,
/// on process 0, outside parallel regions): set-up untimed, the timed part,
/// verification.
pub fn run_omp(class: Class) -> KernelResult {
    let n = size(class);
    let w = n + 2;
    let (mut a, mut b) = (vec![0.0; w * w], vec![0.0; w * w]);
    // The boundary rows (0 and n + 1) come from main; nobody writes them
    // later.
    for g in [&mut a, &mut b] {
        initial_row(n, 0, &mut g[..w]);
        initial_row(n, n + 1, &mut g[(n + 1) * w..]);
    }
    let seconds = {
        let grids = [SharedMut::new(&mut a), SharedMut::new(&mut b)];
        // Set-up (untimed): every thread initialises, in both grids, the
        // rows it computes in every sweep (the same static blocks), so they
        // start out in its process, last written there.
        menps_omp::parallel(|t| {
            for g in &grids {
                t.for_range(1..n + 1).rows_mut(g, w, |rows, mine| {
                    for (i, row) in rows.zip(mine.chunks_exact_mut(w)) {
                        initial_row(n, i, row);
                    }
                });
            }
        });
        let t0 = menps_omp::wtime();
        menps_omp::parallel(|t| {
            for sweep in 0..SWEEPS {
                let (src, dst) = (&grids[sweep % 2], &grids[(sweep + 1) % 2]);
                // The previous sweep's grid, read whole (halo rows included);
                // static blocks of rows of the new one, which the loop's
                // barrier publishes before the next sweep reads them.
                let old = src.view();
                t.for_range(1..n + 1)
                    .rows_mut(dst, w, |rows, new| relax_rows(&old, new, rows, w));
            }
        });
        menps_omp::wtime() - t0
    };
    let result = if SWEEPS.is_multiple_of(2) { &a } else { &b };
    finish(class, seconds, result)
}

/// The same algorithm with rayon on the current rayon thread pool (a normal
/// process, no DSM).
pub fn run_rayon(class: Class) -> KernelResult {
    let n = size(class);
    let w = n + 2;
    let mut old = initial_grid(n);
    let mut new = initial_grid(n);
    // The same static blocks of rows as menps-omp's static schedule.
    let threads = rayon::current_num_threads().max(1);
    let blocks: Vec<Range<usize>> = (0..threads)
        .map(|k| menps_omp::static_block(1..n + 1, k, threads))
        .filter(|r| !r.is_empty())
        .collect();
    let t0 = std::time::Instant::now();
    for _ in 0..SWEEPS {
        let mut parts = Vec::with_capacity(blocks.len());
        let mut rest = &mut new[w..(n + 1) * w];
        for r in &blocks {
            let (mine, tail) = rest.split_at_mut(r.len() * w);
            parts.push((r.clone(), mine));
            rest = tail;
        }
        let src = &old;
        parts
            .into_par_iter()
            .for_each(|(rows, new_rows)| relax_rows(src, new_rows, rows, w));
        std::mem::swap(&mut old, &mut new);
    }
    let seconds = t0.elapsed().as_secs_f64();
    finish(class, seconds, &old)
}

/// The exact solution `x² − y²` at grid point `(i, j)` of an `n × n`
/// interior.
fn harmonic(n: usize, i: usize, j: usize) -> f64 {
    let h = 1.0 / (n + 1) as f64;
    let (x, y) = (j as f64 * h, i as f64 * h);
    x * x - y * y
}

/// A grid of `(n+2)²` values, row-major: the boundary from
/// [`harmonic`], the interior 0.
fn initial_grid(n: usize) -> Vec<f64> {
    let w = n + 2;
    let mut g = vec![0.0; w * w];
    for (i, row) in g.chunks_exact_mut(w).enumerate() {
        initial_row(n, i, row);
    }
    g
}

/// Row `i` of the initial grid: the boundary from [`harmonic`], the
/// interior 0.
fn initial_row(n: usize, i: usize, row: &mut [f64]) {
    let w = n + 2;
    for (j, x) in row.iter_mut().enumerate() {
        *x = if i == 0 || j == 0 || i == w - 1 || j == w - 1 {
            harmonic(n, i, j)
        } else {
            0.0
        };
    }
}

/// One Jacobi sweep over the grid rows `rows` (interior rows, `1..=n`):
/// `new` holds those rows (the boundary columns are left alone), `old` is
/// the whole previous grid of width `w`.
fn relax_rows(old: &[f64], new: &mut [f64], rows: Range<usize>, w: usize) {
    for (i, new_row) in rows.zip(new.chunks_exact_mut(w)) {
        let up = &old[(i - 1) * w..i * w];
        let mid = &old[i * w..(i + 1) * w];
        let down = &old[(i + 1) * w..(i + 2) * w];
        // Point (i, j) for j in 1..=n: north, south, west, east.
        let (north, south) = (&up[1..w - 1], &down[1..w - 1]);
        let (west, east) = (&mid[..w - 2], &mid[2..]);
        let inner = &mut new_row[1..w - 1];
        for ((x, (&nv, &sv)), (&wv, &ev)) in inner
            .iter_mut()
            .zip(north.iter().zip(south))
            .zip(west.iter().zip(east))
        {
            *x = ((nv + sv) + (wv + ev)) * 0.25;
        }
    }
}

/// `SWEEPS` sweeps serially on this thread alone, in memory no other
/// thread or process touches.
fn serial(n: usize) -> Vec<f64> {
    let w = n + 2;
    let (mut old, mut new) = (initial_grid(n), initial_grid(n));
    for _ in 0..SWEEPS {
        relax_rows(&old, &mut new[w..(n + 1) * w], 1..n + 1, w);
        std::mem::swap(&mut old, &mut new);
    }
    old
}

/// 2-norms over the interior of the error against [`harmonic`] and of the
/// residual `4u − Σ neighbours`.
fn norms(g: &[f64], n: usize) -> (f64, f64) {
    let w = n + 2;
    let (mut err, mut res) = (0.0, 0.0);
    for i in 1..=n {
        for j in 1..=n {
            let u = g[i * w + j];
            let e = u - harmonic(n, i, j);
            let r = 4.0 * u
                - g[(i - 1) * w + j]
                - g[(i + 1) * w + j]
                - g[i * w + j - 1]
                - g[i * w + j + 1];
            err += e * e;
            res += r * r;
        }
    }
    (f64::sqrt(err), f64::sqrt(res))
}

/// Verifies `result` and builds the kernel's result.
fn finish(class: Class, seconds: f64, result: &[f64]) -> KernelResult {
    let n = size(class);
    let reference = serial(n);
    let diff = result
        .iter()
        .zip(&reference)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    let same = diff <= TOLERANCE && result.iter().all(|x| x.is_finite());
    // Physics: contraction of error and residual, maximum principle.
    let start = initial_grid(n);
    let (e0, r0) = norms(&start, n);
    let (e, r) = norms(result, n);
    let rho = (std::f64::consts::PI / (n + 1) as f64).cos();
    let bound = rho.powi(SWEEPS as i32) * (1.0 + 1e-9);
    let (lo, hi) = (-1.0, 1.0); // min and max of x² − y² on the unit square
    let bounded = result.iter().all(|&u| (lo..=hi).contains(&u));
    let physical = e <= bound * e0 && r <= bound * r0 && bounded;
    KernelResult {
        kernel: "stencil",
        class,
        seconds,
        mops: 5.0 * (n * n) as f64 * SWEEPS as f64 / seconds / 1e6,
        verified: same && physical,
        detail: format!(
            "n = {n}, {SWEEPS} sweeps; max |result - serial run| = {diff:e} (tolerance \
             {TOLERANCE:e}); error vs x²-y² {e0:.6e} -> {e:.6e}, residual {r0:.6e} -> {r:.6e} \
             (each must shrink by ρ^{SWEEPS} = {:.6}); values within [{lo}, {hi}]: {bounded}",
            rho.powi(SWEEPS as i32)
        ),
    }
}
