//! Dense matrix multiply `C = A·B` of `n × n` matrices of `f64` (row-major),
//! blocked for the cache, with the rows of `C` shared among the threads in
//! static blocks (each thread writes a contiguous block of rows).
//!
//! Sizes: class S `n = 256`, class W `n = 512`. `A` and `B` are
//! pseudo-random in `[-1, 1)` (a fixed-seed generator), generated serially
//! before the timed part. The timed part is [`reps`] multiplications after
//! one untimed warm-up multiplication (which, with the DSM, also brings `A`
//! and `B` to every process); the reported seconds are those of all
//! [`reps`] products. The matrices are `Vec<[f64; n]>` (one array a row, `n`
//! a const parameter), so that a `chunks_mut` loop over `0..n` hands every
//! thread whole rows of `C`.
//!
//! Verification, computed serially from `A` and `B` alone (never from the
//! kernel's loops): `C·v` against `A·(B·v)` for a pseudo-random vector `v`
//! (maximum difference relative to `‖A·(B·v)‖∞` at most `1e-10`), and a
//! sample of entries `C[i][j]` against their dot products (relative
//! `1e-10`).
//!
//! Mop/s = `2 n³ · reps / seconds / 1e6`.

use std::ops::Range;

use rayon::prelude::*;

use super::report::{Class, KernelResult};

/// Rows of a register tile of `C`.
const TR: usize = 4;
/// Columns of a register tile of `C`.
const TC: usize = 8;
/// Depth of a cache block (values of `k` handled together).
const KB: usize = 128;
/// Largest relative error the verification accepts.
const TOLERANCE: f64 = 1e-10;

/// Timed multiplications of `class` (a multiplication of class S is short).
fn reps(class: Class) -> usize {
    match class {
        Class::S => 10,
        Class::W => 3,
    }
}

/// Runs the kernel with menps-omp (called from `main` of `menps_omp::run`,
/// on process 0, outside parallel regions): set-up untimed, the timed part,
/// verification.
pub fn run_omp(class: Class) -> KernelResult {
    match class {
        Class::S => omp::<256>(class),
        Class::W => omp::<512>(class),
    }
}

/// The same algorithm with rayon on the current rayon thread pool (a normal
/// process, no DSM).
pub fn run_rayon(class: Class) -> KernelResult {
    match class {
        Class::S => rayon_version::<256>(class),
        Class::W => rayon_version::<512>(class),
    }
}

fn omp<const N: usize>(class: Class) -> KernelResult {
    let reps = reps(class);
    let (a, b) = inputs::<N>();
    let mut c = vec![[0.0f64; N]; N];
    let out = menps_omp::SharedMut::new(&mut c);
    let (a, b) = (&a[..], &b[..]);
    let multiply = |times: usize| {
        menps_omp::parallel(|t| {
            for _ in 0..times {
                // Static blocks of rows of C, a barrier after each product.
                t.for_range(0..N)
                    .chunks_mut(&out, |rows, c_rows| multiply_rows(a, b, rows, c_rows));
            }
        })
    };
    // Warm-up (untimed): A and B reach every process.
    multiply(1);
    let t0 = menps_omp::wtime();
    multiply(reps);
    let seconds = menps_omp::wtime() - t0;
    result(class, reps, seconds, a, b, &c)
}

fn rayon_version<const N: usize>(class: Class) -> KernelResult {
    let reps = reps(class);
    let (a, b) = inputs::<N>();
    let mut c = vec![[0.0f64; N]; N];
    let (a, b) = (&a[..], &b[..]);
    // The same static blocks of rows as menps-omp's static schedule.
    let threads = rayon::current_num_threads().max(1);
    let blocks: Vec<Range<usize>> = (0..threads)
        .map(|k| menps_omp::static_block(0..N, k, threads))
        .filter(|r| !r.is_empty())
        .collect();
    let mut multiply = || {
        let mut parts = Vec::with_capacity(blocks.len());
        let mut rest = &mut c[..];
        for r in &blocks {
            let (mine, tail) = rest.split_at_mut(r.len());
            parts.push((r.clone(), mine));
            rest = tail;
        }
        parts
            .into_par_iter()
            .for_each(|(rows, c_rows)| multiply_rows(a, b, rows, c_rows));
    };
    multiply();
    let t0 = std::time::Instant::now();
    for _ in 0..reps {
        multiply();
    }
    let seconds = t0.elapsed().as_secs_f64();
    result(class, reps, seconds, a, b, &c)
}

/// `A` and `B`: pseudo-random values in `[-1, 1)` from fixed seeds.
fn inputs<const N: usize>() -> (Vec<[f64; N]>, Vec<[f64; N]>) {
    let mut ga = Rng(0x243f_6a88_85a3_08d3);
    let mut gb = Rng(0x1319_8a2e_0370_7344);
    let a = (0..N)
        .map(|_| core::array::from_fn(|_| ga.next()))
        .collect();
    let b = (0..N)
        .map(|_| core::array::from_fn(|_| gb.next()))
        .collect();
    (a, b)
}

/// A small pseudo-random generator (SplitMix64) giving values in `[-1, 1)`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 53 random bits scaled to [0, 2), shifted to [-1, 1).
        (z >> 11) as f64 * (2.0 / (1u64 << 53) as f64) - 1.0
    }
}

/// `C[rows] = A[rows] · B`: `c` holds the rows `rows` of `C`.
///
/// Blocked over `k` (blocks of [`KB`]) so that a strip of `B` stays in the
/// first-level cache while it is used for every row of the block, with a
/// [`TR`] × [`TC`] tile of `C` kept in registers over a block of `k`.
fn multiply_rows<const N: usize>(
    a: &[[f64; N]],
    b: &[[f64; N]],
    rows: Range<usize>,
    c: &mut [[f64; N]],
) {
    debug_assert_eq!(rows.len(), c.len());
    let a = &a[rows];
    let mut k0 = 0;
    while k0 < N {
        let ks = k0..(k0 + KB).min(N);
        let first = k0 == 0;
        let mut j = 0;
        while j + TC <= N {
            let mut i = 0;
            while i + TR <= c.len() {
                tile::<N>(&a[i..i + TR], b, &mut c[i..i + TR], ks.clone(), j, first);
                i += TR;
            }
            // Rows left over (a block whose length is not a multiple of TR).
            for r in i..c.len() {
                tile_row::<N>(&a[r], b, &mut c[r], ks.clone(), j..j + TC, first);
            }
            j += TC;
        }
        // Columns left over (N is a multiple of TC for both classes).
        if j < N {
            for r in 0..c.len() {
                tile_row::<N>(&a[r], b, &mut c[r], ks.clone(), j..N, first);
            }
        }
        k0 += KB;
    }
}

/// One [`TR`] × [`TC`] tile of `C` at column `j` over the `k` of `ks`:
/// `c[r][j..j+TC] (=|+=) Σ_k a[r][k] · b[k][j..j+TC]`.
#[inline(always)]
fn tile<const N: usize>(
    a: &[[f64; N]],
    b: &[[f64; N]],
    c: &mut [[f64; N]],
    ks: Range<usize>,
    j: usize,
    first: bool,
) {
    let mut acc = [[0.0f64; TC]; TR];
    if !first {
        for (acc_r, c_r) in acc.iter_mut().zip(c.iter()) {
            acc_r.copy_from_slice(&c_r[j..j + TC]);
        }
    }
    for k in ks {
        let bk: &[f64; TC] = b[k][j..j + TC].try_into().expect("a strip of TC");
        for (acc_r, a_r) in acc.iter_mut().zip(a.iter()) {
            let x = a_r[k];
            for (s, &y) in acc_r.iter_mut().zip(bk) {
                *s += x * y;
            }
        }
    }
    for (acc_r, c_r) in acc.iter().zip(c.iter_mut()) {
        c_r[j..j + TC].copy_from_slice(acc_r);
    }
}

/// One row of `C` over columns `js` and the `k` of `ks` (the tiles' edges).
fn tile_row<const N: usize>(
    a: &[f64; N],
    b: &[[f64; N]],
    c: &mut [f64; N],
    ks: Range<usize>,
    js: Range<usize>,
    first: bool,
) {
    if first {
        c[js.clone()].fill(0.0);
    }
    for k in ks {
        let x = a[k];
        for (s, &y) in c[js.clone()].iter_mut().zip(&b[k][js.clone()]) {
            *s += x * y;
        }
    }
}

/// Verifies `c` against `A` and `B` and builds the result.
fn result<const N: usize>(
    class: Class,
    reps: usize,
    seconds: f64,
    a: &[[f64; N]],
    b: &[[f64; N]],
    c: &[[f64; N]],
) -> KernelResult {
    let (matvec_err, entry_err) = verify(a, b, c);
    let verified = matvec_err <= TOLERANCE && entry_err <= TOLERANCE;
    let flops = 2.0 * (N as f64).powi(3) * reps as f64;
    KernelResult {
        kernel: "matmul",
        class,
        seconds,
        mops: flops / seconds / 1e6,
        verified,
        detail: format!(
            "n = {N}, {reps} timed products; relative error of C·v vs A·(B·v) {matvec_err:.3e}, \
             of sampled entries {entry_err:.3e} (tolerance {TOLERANCE:e})"
        ),
    }
}

/// Relative errors of `C·v` against `A·(B·v)` (infinity norm) and of a
/// sample of entries against their dot products, computed serially.
fn verify<const N: usize>(a: &[[f64; N]], b: &[[f64; N]], c: &[[f64; N]]) -> (f64, f64) {
    let mut g = Rng(0xa409_3822_299f_31d0);
    let v: Vec<f64> = (0..N).map(|_| g.next()).collect();
    let matvec = |m: &[[f64; N]], x: &[f64]| -> Vec<f64> {
        m.iter()
            .map(|row| row.iter().zip(x).map(|(p, q)| p * q).sum())
            .collect()
    };
    let cv = matvec(c, &v);
    let abv = matvec(a, &matvec(b, &v));
    let scale = abv.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = cv
        .iter()
        .zip(&abv)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    let matvec_err = if scale > 0.0 { diff / scale } else { diff };
    // Entries on a spread of rows and columns, each against its dot product
    // relative to Σ|a·b| (the natural scale of its rounding error).
    let mut entry_err = 0.0f64;
    for s in 0..64 {
        let i = (s * 37 + 3) % N;
        let j = (s * 101 + 11) % N;
        let (mut dot, mut mag) = (0.0, 0.0);
        for (k, b_k) in b.iter().enumerate() {
            dot += a[i][k] * b_k[j];
            mag += (a[i][k] * b_k[j]).abs();
        }
        entry_err = entry_err.max((c[i][j] - dot).abs() / mag);
    }
    // A NaN anywhere fails the comparison.
    if cv.iter().any(|x| !x.is_finite()) {
        return (f64::INFINITY, f64::INFINITY);
    }
    (matvec_err, entry_err)
}
