//! NAS Parallel Benchmarks' CG kernel (NPB 3.x semantics, classes S and W):
//! the inverse power method on NPB's random sparse symmetric matrix, each
//! step solved by 25 conjugate-gradient iterations, verified against NPB's
//! reference `zeta`.
//!
//! - The matrix is NPB's `makea`: for every row `i`, a random sparse vector
//!   of `nonzer` entries (`sprnvc`, from NPB's `randlc` generator, seed
//!   314159265, multiplier 5^13) plus the entry 0.5 at `i` (`vecset`); the
//!   matrix is the sum of their outer products, scaled by `rcond^(i/n)`,
//!   with `rcond - shift` added to the diagonal (NPB's `sparse`), stored as
//!   CSR with sorted columns. It is generated serially (untimed).
//! - `conj_grad` is NPB's: 25 CG iterations from `z = 0`, `r = p = x`, then
//!   the residual norm `‖x − A z‖`. The outer loop computes
//!   `zeta = shift + 1 / (x·z)` and `x = z / ‖z‖`; one untimed warm-up outer
//!   iteration from `x = 1`, then `x = 1` again and `niter` timed ones.
//! - Mop/s are NPB's count; the verification is NPB's (relative error of
//!   `zeta` at most 1e-10).
//!
//! The menps-omp version (no `unsafe`) runs the warm-up in one parallel
//! region and the timed iterations in a second one (two forks in all).
//! Each thread owns the block of rows NPB's static schedule gives it, the
//! same in every phase, and writes only its block of every vector.
//!
//! - Only `p` (read whole by every mat-vec) is shared, and the last `z`
//!   of each `conj_grad` (read whole by the residual's mat-vec) takes its
//!   place in the last CG iteration, where `p`'s update would be dead. It
//!   lives in one [`SharedMut`] with a row per thread (see [`TeamLayout`]),
//!   written by `rows_mut` loops, so each thread writes exactly its own
//!   row; rows are sized so that each process's rows start on a DSM page,
//!   and no page is written by two processes. The matrix the team uses has
//!   its column indices mapped to those positions, so the mat-vec reads
//!   the storage directly through a [`SharedMut::view`].
//! - A thread's blocks of `x`, `z`, `q` and `r`, touched by that thread
//!   alone, are in its process's private heap ([`menps_omp::private`]):
//!   DSM memory a thread writes is released at every barrier even when no
//!   other process reads it.
//! - Each thread copies what it uses into its own frame when the region
//!   starts (see [`Team`]).
//! - Dot products are all-reductions fused with the loop that produces
//!   their operands. Per CG iteration the team meets two all-reductions
//!   (`p·q`, `r·r`) and one barrier, the one ending the `rows_mut` loop of
//!   `p = r + beta p`, before the mat-vec reads the whole of `p`. The
//!   reductions also order every thread's reads of `p` before its owner
//!   writes it again (each thread drops its view before that loop, which
//!   waits for the views of the other threads of its process). The scalars
//!   (`rho`, `alpha`, `beta`, `zeta`) are computed identically by every
//!   thread from the reductions.
//!
//! The rayon version runs the same fused loops on one block of rows per
//! thread (`par_chunks`, three parallel loops per CG iteration).

use core::ops::Range;
use std::time::Instant;

use menps_omp::{SharedMut, Thread};
use rayon::prelude::*;

use super::report::{Class, KernelResult};

/// CG iterations per outer iteration (NPB's `cgitmax`).
const CGITMAX: usize = 25;
/// NPB's `rcond`: the smallest eigenvalue is bounded below by it.
const RCOND: f64 = 0.1;
/// NPB's verification tolerance (relative error of `zeta`).
const EPSILON: f64 = 1e-10;
/// Seed of NPB's generator in CG (`tran`).
const TRAN: u64 = 314_159_265;
/// Multiplier of NPB's generator (`amult` = 5^13).
const AMULT: u64 = 1_220_703_125;
/// `f64` elements in one 4 KiB DSM page.
const PAGE_ROWS: usize = 512;

/// One class's parameters.
#[derive(Debug, Clone, Copy)]
struct Params {
    class: Class,
    /// Rows (and columns) of the matrix.
    na: usize,
    /// Nonzeros of each random vector.
    nonzer: usize,
    /// Timed outer iterations.
    niter: usize,
    /// Diagonal shift (the eigenvalue estimate's offset).
    shift: f64,
    /// NPB's reference `zeta`.
    zeta_verify: f64,
}

impl Params {
    fn of(class: Class) -> Params {
        match class {
            Class::S => Params {
                class,
                na: 1400,
                nonzer: 7,
                niter: 15,
                shift: 10.0,
                zeta_verify: 8.597_177_507_864_8,
            },
            Class::W => Params {
                class,
                na: 7000,
                nonzer: 8,
                niter: 15,
                shift: 12.0,
                zeta_verify: 10.362_595_087_124,
            },
        }
    }

    /// NPB's operation count of the timed part, per second, in millions.
    fn mops(&self, seconds: f64) -> f64 {
        let nz = (self.nonzer * (self.nonzer + 1)) as f64;
        let per_row = 3.0 + nz + CGITMAX as f64 * (5.0 + nz) + 3.0;
        2.0 * self.niter as f64 * self.na as f64 * per_row / seconds / 1e6
    }

    /// The result with NPB's verification of `zeta`.
    fn result(&self, zeta: f64, rnorm: f64, seconds: f64) -> KernelResult {
        let err = ((zeta - self.zeta_verify) / self.zeta_verify).abs();
        KernelResult {
            kernel: "cg",
            class: self.class,
            seconds,
            mops: self.mops(seconds),
            verified: err <= EPSILON,
            detail: format!(
                "zeta {zeta:.13} (reference {:.13}, relative error {err:.2e}, tolerance \
                 {EPSILON:.0e}); last residual norm {rnorm:.6e}",
                self.zeta_verify
            ),
        }
    }
}

// ---------------------------------------------------------------------------
// The matrix.

/// NPB's `randlc`: `x ← a·x mod 2^46`, returning `x / 2^46` (exact in
/// integers; NPB computes the same in split doubles).
struct Randlc {
    x: u64,
}

impl Randlc {
    fn next(&mut self) -> f64 {
        const MASK: u64 = (1 << 46) - 1;
        self.x = self.x.wrapping_mul(AMULT) & MASK;
        self.x as f64 * (1.0 / (1u64 << 46) as f64)
    }
}

/// A sparse matrix in compressed sparse rows.
struct Csr {
    rowstr: Vec<usize>,
    colidx: Vec<u32>,
    a: Vec<f64>,
}

impl Csr {
    /// The matrix borrowed, as the loops use it.
    fn view(&self) -> CsrRef<'_> {
        CsrRef {
            rowstr: &self.rowstr,
            colidx: &self.colidx,
            a: &self.a,
        }
    }
}

/// A borrowed [`Csr`] (small, copied where it is used).
#[derive(Clone, Copy)]
struct CsrRef<'a> {
    rowstr: &'a [usize],
    colidx: &'a [u32],
    a: &'a [f64],
}

impl CsrRef<'_> {
    /// Row `j` times `v`, summed in column order (NPB's inner loop).
    #[inline]
    fn row_dot(&self, j: usize, v: &[f64]) -> f64 {
        let k = self.rowstr[j]..self.rowstr[j + 1];
        let mut sum = 0.0;
        for (&a, &c) in self.a[k.clone()].iter().zip(&self.colidx[k]) {
            sum += a * v[c as usize];
        }
        sum
    }
}

/// NPB's `sprnvc`: `nz` distinct random 1-based positions in `1..=n`
/// (drawn as `1 + ⌊nn1·u⌋`, `nn1` the power of two not below `n`, values
/// outside rejected) with random values, into `v` as (position, value).
fn sprnvc(rng: &mut Randlc, n: usize, nz: usize, nn1: usize, v: &mut Vec<(usize, f64)>) {
    v.clear();
    while v.len() < nz {
        let vecelt = rng.next();
        let vecloc = rng.next();
        let i = (nn1 as f64 * vecloc) as usize + 1;
        if i > n || v.iter().any(|&(j, _)| j == i) {
            continue;
        }
        v.push((i, vecelt));
    }
}

/// NPB's `vecset`: sets position `i` of the sparse vector to `val`,
/// appending it if absent.
fn vecset(v: &mut Vec<(usize, f64)>, i: usize, val: f64) {
    let mut set = false;
    for e in v.iter_mut().filter(|e| e.0 == i) {
        e.1 = val;
        set = true;
    }
    if !set {
        v.push((i, val));
    }
}

/// NPB's `makea` (with `sparse`): the class's matrix. Every entry sums its
/// contributions in the order of NPB's generation loop, so the values are
/// NPB's bit for bit.
fn makea(prm: &Params) -> Csr {
    let n = prm.na;
    let mut rng = Randlc { x: TRAN };
    // NPB's main draws one number (its initial `zeta`) before `makea`.
    rng.next();
    let nn1 = n.next_power_of_two().max(2);
    // Row j: (column, value), sorted by column.
    let mut rows: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
    let mut vc = Vec::with_capacity(prm.nonzer + 1);
    let ratio = RCOND.powf(1.0 / n as f64);
    let mut size = 1.0;
    for i in 0..n {
        // NPB first makes all the vectors, then sums their outer products in
        // the same order; the sums draw no random numbers, so doing both per
        // vector is the same computation.
        sprnvc(&mut rng, n, prm.nonzer, nn1, &mut vc);
        vecset(&mut vc, i + 1, 0.5);
        for &(j, vj) in &vc {
            let scale = size * vj;
            let row = &mut rows[j - 1];
            for &(jcol, vcol) in &vc {
                let mut va = vcol * scale;
                if jcol == j && j == i + 1 {
                    va = va + RCOND - prm.shift;
                }
                let col = (jcol - 1) as u32;
                match row.binary_search_by_key(&col, |e| e.0) {
                    Ok(k) => row[k].1 += va,
                    Err(k) => row.insert(k, (col, 0.0 + va)),
                }
            }
        }
        size *= ratio;
    }
    let nnz = rows.iter().map(Vec::len).sum();
    let mut m = Csr {
        rowstr: Vec::with_capacity(n + 1),
        colidx: Vec::with_capacity(nnz),
        a: Vec::with_capacity(nnz),
    };
    m.rowstr.push(0);
    for row in rows {
        for (c, v) in row {
            m.colidx.push(c);
            m.a.push(v);
        }
        m.rowstr.push(m.a.len());
    }
    m
}

// ---------------------------------------------------------------------------
// The fused vector loops on one block of rows (both versions).

/// `conj_grad`'s start on a block: `q = z = 0`, `r = x` (and `p = x`,
/// done by the caller); returns `Σ r²`.
fn init_block(x: &[f64], q: &mut [f64], z: &mut [f64], r: &mut [f64]) -> f64 {
    q.fill(0.0);
    z.fill(0.0);
    r.copy_from_slice(x);
    r.iter().fold(0.0, |s, &v| s + v * v)
}

/// `q = A p` on the rows of `q` (starting at row `first`), `p` being the
/// whole vector as `m`'s column indices address it and `p_own` the block's
/// rows of `p`; returns `Σ p·q` over the block.
fn matvec_dot(m: CsrRef<'_>, first: usize, p: &[f64], p_own: &[f64], q: &mut [f64]) -> f64 {
    let mut d = 0.0;
    for ((qj, &pj), j) in q.iter_mut().zip(p_own).zip(first..) {
        let s = m.row_dot(j, p);
        *qj = s;
        d += pj * s;
    }
    d
}

/// `z += alpha p`, `r −= alpha q` on a block; returns `Σ r²`.
fn update_zr(alpha: f64, p: &[f64], q: &[f64], z: &mut [f64], r: &mut [f64]) -> f64 {
    let mut rho = 0.0;
    for (((zj, rj), &pj), &qj) in z.iter_mut().zip(r.iter_mut()).zip(p).zip(q) {
        *zj += alpha * pj;
        *rj -= alpha * qj;
        rho += *rj * *rj;
    }
    rho
}

/// `p = r + beta p` on a block.
fn update_p(beta: f64, r: &[f64], p: &mut [f64]) {
    for (pj, &rj) in p.iter_mut().zip(r) {
        *pj = rj + beta * *pj;
    }
}

/// The residual `r = A z` on the rows of `r` (from row `first`; `z` whole
/// as `m` addresses it, `z_own` the block's rows) and the outer loop's
/// norms; returns `(Σ (x − r)², Σ x·z, Σ z²)` over the block.
fn residual_norms(
    m: CsrRef<'_>,
    first: usize,
    z: &[f64],
    z_own: &[f64],
    x: &[f64],
    r: &mut [f64],
) -> Sums {
    let mut s = Sums::default();
    for (((rj, &xj), &zj), j) in r.iter_mut().zip(x).zip(z_own).zip(first..) {
        *rj = m.row_dot(j, z);
        let e = xj - *rj;
        s.res += e * e;
        s.xz += xj * zj;
        s.zz += zj * zj;
    }
    s
}

/// `x = scale · z` on a block.
fn normalize(scale: f64, z: &[f64], x: &mut [f64]) {
    for (xj, &zj) in x.iter_mut().zip(z) {
        *xj = scale * zj;
    }
}

/// The sums ending an outer iteration.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    /// `Σ (x − A z)²`.
    res: f64,
    /// `x·z` (NPB's `norm_temp1`).
    xz: f64,
    /// `z·z` (NPB's `norm_temp2` before the square root).
    zz: f64,
}

impl Sums {
    fn add(self, o: Sums) -> Sums {
        Sums {
            res: self.res + o.res,
            xz: self.xz + o.xz,
            zz: self.zz + o.zz,
        }
    }
}

/// The outer loop's state after one `conj_grad`: the residual norm, `zeta`
/// (if timed) and the scale of `x = scale · z`.
fn outer_step(prm: &Params, s: Sums, timed: bool, zeta: &mut f64) -> (f64, f64) {
    if timed {
        *zeta = prm.shift + 1.0 / s.xz;
    }
    (s.res.sqrt(), 1.0 / s.zz.sqrt())
}

// ---------------------------------------------------------------------------
// menps-omp.

/// Where the team keeps the vector it reads whole — `p`, and at the end of
/// a `conj_grad` the final `z` in its place — as one row of `row_len`
/// elements per thread (a `rows_mut` loop over the rows gives each thread
/// exactly its own), the thread's block of NPB's static split of the rows
/// at the row's start. `row_len` is the longest block rounded up so that
/// the rows of a process fill whole DSM pages, and the storage starts on a
/// page: no page is written by two processes.
#[derive(Debug, Clone, Copy)]
struct TeamLayout {
    /// Rows of the matrix.
    n: usize,
    /// Threads of the team.
    nthreads: usize,
    /// Elements of a thread's row.
    row_len: usize,
}

impl TeamLayout {
    /// The layout for `nthreads` threads over `nprocs` processes (the
    /// threads of a process are consecutive).
    fn new(n: usize, nthreads: usize, nprocs: usize) -> Self {
        let per_process = nthreads / nprocs;
        // The process's rows fill whole pages if a row is a multiple of
        // this.
        let unit = PAGE_ROWS / gcd(PAGE_ROWS, per_process);
        TeamLayout {
            n,
            nthreads,
            row_len: n.div_ceil(nthreads).next_multiple_of(unit),
        }
    }

    /// Elements of the storage.
    fn len(&self) -> usize {
        self.nthreads * self.row_len
    }

    /// Thread `tid`'s block of rows of the matrix.
    fn block(&self, tid: usize) -> Range<usize> {
        menps_omp::static_block(0..self.n, tid, self.nthreads)
    }

    /// Maps the column indices of `m` to where the storage keeps those
    /// elements of the vector.
    fn map_columns(&self, m: &mut Csr) {
        let mut pos = vec![0u32; self.n];
        for tid in 0..self.nthreads {
            for (k, j) in self.block(tid).enumerate() {
                pos[j] = u32::try_from(tid * self.row_len + k).expect("vector storage size");
            }
        }
        for c in &mut m.colidx {
            *c = pos[*c as usize];
        }
    }
}

/// The greatest common divisor.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// What the team works with. Each thread copies it into its own frame when
/// the region starts: `main`'s frame is DSM memory, which the other
/// processes fetch again whenever process 0 changed it, so
/// the hot loops should not read through it. (While a team runs, the
/// runtime leaves `main`'s frame alone; an earlier runtime wrote its team
/// barrier there, and reading the captures in every CG iteration then made
/// process 1 fetch 73 MB instead of 20 MB at W, 2 processes x 2 threads.)
#[derive(Clone, Copy)]
struct Team<'a, 's> {
    prm: Params,
    /// The matrix, columns mapped by `lay`.
    m: CsrRef<'a>,
    lay: TeamLayout,
    /// `p` (and each `conj_grad`'s final `z`), laid out by `lay`.
    pv: &'a SharedMut<'s, f64>,
}

/// One team thread's blocks of the vectors nobody else reads (`x`, `z`
/// during the CG iterations, `q`, `r`), in this process's private heap.
struct Own {
    x: Vec<f64>,
    z: Vec<f64>,
    q: Vec<f64>,
    r: Vec<f64>,
}

/// What a team computes: the last `zeta` and residual norm.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    zeta: f64,
    rnorm: f64,
}

/// Writes thread `t`'s block of the shared vector with `f` (a `rows_mut`
/// loop over the threads' rows, whose barrier publishes it).
fn write_row(t: &Thread<'_>, c: &Team<'_, '_>, len: usize, mut f: impl FnMut(&mut [f64])) {
    let (lay, me) = (c.lay, t.thread_num());
    t.for_range(0..lay.nthreads)
        .rows_mut(c.pv, lay.row_len, |rows, row| {
            debug_assert_eq!(rows, me..me + 1);
            f(&mut row[..len]);
        });
}

/// NPB's `conj_grad` for team thread `me`: returns the sums that end the
/// outer iteration (residual, `x·z`, `z·z`), the same on every thread.
///
/// Each phase works on this thread's block of rows and ends with an
/// all-reduction or with the barrier of the `rows_mut` loop that writes
/// this thread's row of the shared `p` (and, in the last iteration, `z`).
fn conj_grad_omp(t: &Thread<'_>, c: &Team<'_, '_>, o: &mut Own) -> Sums {
    let (m, lay, pv) = (c.m, c.lay, c.pv);
    let me = t.thread_num();
    let (first, len) = (lay.block(me).start, o.x.len());
    let own = me * lay.row_len;
    let add = |a: f64, b: f64| a + b;
    // q = z = 0, r = p = x; rho = r·r.
    let mut rho = t.reduce(init_block(&o.x, &mut o.q, &mut o.z, &mut o.r), add);
    write_row(t, c, len, |p| p.copy_from_slice(&o.x));
    for it in 0..CGITMAX {
        let rho0 = rho;
        {
            let v = pv.view();
            let p_own = &v[own..own + len];
            // q = A p; d = p·q.
            let d = t.reduce(matvec_dot(m, first, &v, p_own, &mut o.q), add);
            let alpha = rho / d;
            // z += alpha p; r -= alpha q; rho = r·r.
            rho = t.reduce(update_zr(alpha, p_own, &o.q, &mut o.z, &mut o.r), add);
        }
        let beta = rho / rho0;
        if it + 1 < CGITMAX {
            // p = r + beta p.
            write_row(t, c, len, |p| update_p(beta, &o.r, p));
        } else {
            // The residual reads z whole: it takes p's place (p's last
            // update is never read: the next conj_grad starts from p = x).
            write_row(t, c, len, |p| p.copy_from_slice(&o.z));
        }
    }
    // r = A z; the residual and the norms.
    let z_all = pv.view();
    let s = residual_norms(m, first, &z_all, &o.z, &o.x, &mut o.r);
    t.reduce(s, Sums::add)
}

/// One team thread's outer iterations (`timed`: NPB's timed loop, else the
/// warm-up): starts from `x = 1`, returns the last outcome.
fn outer_omp(t: &Thread<'_>, c: &Team<'_, '_>, timed: bool) -> Outcome {
    let len = c.lay.block(t.thread_num()).len();
    let mut own = menps_omp::private(|| Own {
        x: vec![1.0; len],
        z: vec![0.0; len],
        q: vec![0.0; len],
        r: vec![0.0; len],
    });
    let mut out = Outcome::default();
    let iters = if timed { c.prm.niter } else { 1 };
    for _ in 0..iters {
        let sums = conj_grad_omp(t, c, &mut own);
        let (rnorm, scale) = outer_step(&c.prm, sums, timed, &mut out.zeta);
        out.rnorm = rnorm;
        normalize(scale, &own.z, &mut own.x);
    }
    out
}

/// Runs CG with menps-omp (from `main` of `menps_omp::run`, on process 0,
/// outside parallel regions): the matrix is made serially, an untimed
/// warm-up region runs one outer iteration, then a second region runs the
/// timed ones; NPB's verification.
pub fn run_omp(class: Class) -> KernelResult {
    let prm = Params::of(class);
    let nthreads = menps_omp::max_threads();
    let lay = TeamLayout::new(prm.na, nthreads, menps_omp::num_processes());
    let mut m = makea(&prm);
    lay.map_columns(&mut m);
    // The storage of `p`, from a page boundary on.
    let mut store = vec![0.0; lay.len() + PAGE_ROWS];
    let skip = store.as_ptr().align_offset(PAGE_ROWS * size_of::<f64>());
    assert!(skip < PAGE_ROWS, "an f64 vector aligns to a page");
    let pv = SharedMut::new(&mut store[skip..skip + lay.len()]);
    let team = Team {
        prm,
        m: m.view(),
        lay,
        pv: &pv,
    };
    let mut outcomes = vec![Outcome::default(); nthreads];
    let mut seconds = 0.0;
    for timed in [false, true] {
        let out = SharedMut::new(&mut outcomes);
        let t0 = menps_omp::wtime();
        menps_omp::parallel(|t| {
            let team: Team<'_, '_> = team;
            let o = outer_omp(t, &team, timed);
            t.for_range(0..nthreads).each_mut(&out, |_, slot| *slot = o);
        });
        seconds = menps_omp::wtime() - t0;
    }
    let o = outcomes[0];
    prm.result(o.zeta, o.rnorm, seconds)
}

// ---------------------------------------------------------------------------
// rayon.

/// NPB's `conj_grad` with rayon, on row chunks of `chunk` rows.
fn conj_grad_rayon(
    m: CsrRef<'_>,
    chunk: usize,
    x: &[f64],
    z: &mut [f64],
    p: &mut [f64],
    q: &mut [f64],
    r: &mut [f64],
) -> Sums {
    let mut rho: f64 = x
        .par_chunks(chunk)
        .zip(q.par_chunks_mut(chunk))
        .zip(z.par_chunks_mut(chunk))
        .zip(r.par_chunks_mut(chunk))
        .zip(p.par_chunks_mut(chunk))
        .map(|((((x, q), z), r), p)| {
            p.copy_from_slice(x);
            init_block(x, q, z, r)
        })
        .sum();
    for _ in 0..CGITMAX {
        let pr: &[f64] = p;
        let d: f64 = q
            .par_chunks_mut(chunk)
            .enumerate()
            .map(|(k, q)| {
                let first = k * chunk;
                matvec_dot(m, first, pr, &pr[first..first + q.len()], q)
            })
            .sum();
        let alpha = rho / d;
        let rho0 = rho;
        rho = p
            .par_chunks(chunk)
            .zip(q.par_chunks(chunk))
            .zip(z.par_chunks_mut(chunk))
            .zip(r.par_chunks_mut(chunk))
            .map(|(((p, q), z), r)| update_zr(alpha, p, q, z, r))
            .sum();
        let beta = rho / rho0;
        // (The last iteration's update of p is dead — the next conj_grad
        // starts from p = x — and the menps-omp version puts z there
        // instead; skipping it here made this version slower: W, 2
        // threads, median 0.21 s instead of 0.16 s.)
        r.par_chunks(chunk)
            .zip(p.par_chunks_mut(chunk))
            .for_each(|(r, p)| update_p(beta, r, p));
    }
    let zr: &[f64] = z;
    r.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .enumerate()
        .map(|(k, (r, x))| {
            let first = k * chunk;
            residual_norms(m, first, zr, &zr[first..first + r.len()], x, r)
        })
        .reduce(Sums::default, Sums::add)
}

/// Runs CG with rayon on the current thread pool: the same matrix, warm-up,
/// timed iterations and verification as [`run_omp`].
pub fn run_rayon(class: Class) -> KernelResult {
    let prm = Params::of(class);
    let m = makea(&prm);
    let n = prm.na;
    // One block of rows per thread, as the static schedule.
    let chunk = n.div_ceil(rayon::current_num_threads()).max(1);
    let (mut x, mut z, mut p, mut q, mut r) = (
        vec![0.0; n],
        vec![0.0; n],
        vec![0.0; n],
        vec![0.0; n],
        vec![0.0; n],
    );
    let mut out = Outcome::default();
    let mut seconds = 0.0;
    for timed in [false, true] {
        x.fill(1.0);
        let t0 = Instant::now();
        let iters = if timed { prm.niter } else { 1 };
        for _ in 0..iters {
            let sums = conj_grad_rayon(m.view(), chunk, &x, &mut z, &mut p, &mut q, &mut r);
            let (rnorm, scale) = outer_step(&prm, sums, timed, &mut out.zeta);
            out.rnorm = rnorm;
            x.par_chunks_mut(chunk)
                .zip(z.par_chunks(chunk))
                .for_each(|(x, z)| normalize(scale, z, x));
        }
        seconds = t0.elapsed().as_secs_f64();
    }
    prm.result(out.zeta, out.rnorm, seconds)
}
