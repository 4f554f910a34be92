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
//! The menps-omp version runs the warm-up in one parallel region and the
//! timed iterations in a second one (two forks in all). Each thread owns
//! one contiguous block of rows — NPB's static schedule, except that where
//! two processes' blocks meet the boundary moves to a page boundary when
//! that costs little balance, so no DSM page is written by two processes —
//! the same block in every phase, so it writes only its block of every
//! vector. Only `p` (read whole by every mat-vec) and the final `z` of each
//! `conj_grad` (read whole by the residual's mat-vec) are shared DSM
//! vectors; a thread's blocks of `x`, `z`, `q` and `r` are touched by that
//! thread alone and live in its process's private memory. Dot products are
//! all-reductions fused with the loop that produces their operands. Per CG
//! iteration the team meets one barrier — after `p = r + beta p`, before
//! the mat-vec reads the whole of `p` — and two all-reductions (`p·q`,
//! `r·r`), which also order every thread's reads of `p` before the owner of
//! the rows writes them again. The scalars (`rho`, `alpha`, `beta`, `zeta`)
//! are computed identically by every thread from the reductions.
//!
//! Why it is written this way (measured with W on 2 processes × 1 thread):
//!
//! - `main`'s frame, where the region's captures and the runtime's region
//!   information live, is one 128 KiB DSM block (a call stack) that thread
//!   0 writes all the time. Any read of it by another process after a
//!   barrier fetches the whole block again. So each thread copies what it
//!   uses into its own frame ([`Ctx`]) when the region starts, and the
//!   phases do not start `t.for_range(..)` loops: every loop start reads the
//!   region's schedule there (two such loops per CG iteration made process
//!   1 fetch 74 MB instead of 22 MB and took 2-3 times as long).
//! - A DSM block a thread writes is released at every barrier even if no
//!   other process ever reads it; scratch vectors in the DSM heap (even
//!   allocated by the team thread) pushed the write set past the DSM's
//!   parallel-release threshold (64 blocks) and made each barrier cost
//!   1.5-2 ms. Hence [`PrivateVec`].
//! - `SharedMut` keeps a vector mutably borrowed for the whole region, so
//!   `p`, written by blocks in one phase and read whole in the next, is a
//!   [`TeamVec`] with `unsafe` accessors whose contracts are the phase
//!   discipline above.
//!
//! The rayon version runs the same fused loops on one block of rows per
//! thread (`par_chunks`, three parallel loops per CG iteration).

use core::alloc::{GlobalAlloc, Layout};
use core::marker::PhantomData;
use core::ops::Range;
use std::alloc::System;
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

/// `q = A p` on the rows of `q` (starting at row `first`); returns `Σ p·q`
/// over them.
fn matvec_dot(m: CsrRef<'_>, first: usize, p: &[f64], q: &mut [f64]) -> f64 {
    let mut d = 0.0;
    for (k, qj) in q.iter_mut().enumerate() {
        let j = first + k;
        let s = m.row_dot(j, p);
        *qj = s;
        d += p[j] * s;
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

/// The residual `r = A z` on the rows of `r` (from row `first`) and the
/// outer loop's norms; returns `(Σ (x − r)², Σ x·z, Σ z²)` over them.
fn residual_norms(m: CsrRef<'_>, first: usize, z: &[f64], x: &[f64], r: &mut [f64]) -> Sums {
    let mut s = Sums::default();
    for (k, (rj, &xj)) in r.iter_mut().zip(x).enumerate() {
        let j = first + k;
        *rj = m.row_dot(j, z);
        let e = xj - *rj;
        s.res += e * e;
        s.xz += xj * z[j];
        s.zz += z[j] * z[j];
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

/// A page of vector elements: vectors are page-aligned, so the row blocks
/// of different processes can start on page boundaries.
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
struct Page([f64; PAGE_ROWS]);

/// A vector the team reads and writes under CG's discipline: in every
/// phase between two synchronisations (barrier or all-reduction) each
/// thread writes only the rows of its own block, and a thread reads rows of
/// other threads' blocks only in a phase where nobody writes the vector.
/// (`SharedMut` cannot express "written by blocks in one phase, read whole
/// in the next" inside one region: it keeps the vector mutably borrowed.)
#[derive(Clone, Copy)]
struct TeamVec<'a> {
    ptr: *mut f64,
    len: usize,
    /// The storage stays mutably borrowed (by `new`) for `'a`.
    _data: PhantomData<&'a [Page]>,
}

// SAFETY: the threads access the elements only through `all`, `rows` and
// `rows_mut`, whose contracts keep a write of an element apart from every
// other access to it by another thread (a barrier or an all-reduction
// separates them).
unsafe impl Sync for TeamVec<'_> {}
// SAFETY: as above.
unsafe impl Send for TeamVec<'_> {}

impl<'a> TeamVec<'a> {
    /// The first `len` elements of `pages`.
    fn new(pages: &'a mut [Page], len: usize) -> Self {
        assert!(len <= pages.len() * PAGE_ROWS);
        TeamVec {
            ptr: pages.as_mut_ptr().cast::<f64>(),
            len,
            _data: PhantomData,
        }
    }

    /// The whole vector, for reading.
    ///
    /// # Safety
    ///
    /// No thread writes the vector while the slice lives.
    unsafe fn all(&self) -> &'a [f64] {
        // SAFETY: `ptr` points to `len` initialised elements borrowed for
        // 'a; the caller excludes writers.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The rows `rows`, for reading.
    ///
    /// # Safety
    ///
    /// No thread writes these rows while the slice lives.
    unsafe fn rows(&self, rows: Range<usize>) -> &'a [f64] {
        assert!(rows.start <= rows.end && rows.end <= self.len);
        // SAFETY: in bounds (checked); the caller excludes writers.
        unsafe { core::slice::from_raw_parts(self.ptr.add(rows.start), rows.len()) }
    }

    /// The rows `rows`, for writing.
    ///
    /// # Safety
    ///
    /// No other thread reads or writes these rows while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn rows_mut(&self, rows: Range<usize>) -> &'a mut [f64] {
        assert!(rows.start <= rows.end && rows.end <= self.len);
        // SAFETY: in bounds (checked); the caller makes the access
        // exclusive.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(rows.start), rows.len()) }
    }
}

/// The team's row blocks, one per thread in thread order (the threads of a
/// process are consecutive): NPB's static split of the rows, except that
/// where two processes' blocks meet the boundary moves to the nearest page
/// boundary if that shifts it by at most 1/16 of a process's share.
fn row_blocks(n: usize, nprocs: usize, nthreads: usize) -> Vec<Range<usize>> {
    let tpp = nthreads / nprocs;
    let share = n / nprocs;
    let cut = |k: usize| {
        let even = menps_omp::static_block(0..n, k, nprocs).start;
        let paged = ((even + PAGE_ROWS / 2) / PAGE_ROWS * PAGE_ROWS).min(n);
        if even.abs_diff(paged) * 16 <= share {
            paged
        } else {
            even
        }
    };
    let mut blocks = Vec::with_capacity(nthreads);
    for k in 0..nprocs {
        let hi = if k + 1 == nprocs { n } else { cut(k + 1) };
        let lo = if k == 0 { 0 } else { cut(k) };
        for l in 0..tpp {
            blocks.push(menps_omp::static_block(lo..hi, l, tpp));
        }
    }
    blocks
}

/// The shared vectors of the menps-omp version: `p`, which the mat-vec
/// reads whole in every CG iteration, and `z`'s last value of a
/// `conj_grad`, which the residual's mat-vec reads whole.
#[derive(Clone, Copy)]
struct Shared<'a> {
    p: TeamVec<'a>,
    z: TeamVec<'a>,
}

/// One team thread's blocks of the vectors nobody else reads (`x`, `z`
/// during the CG iterations, `q`, `r`), in this process's private memory:
/// DSM blocks, even ones no other process touches, take part in every
/// release (see [`PrivateVec`]).
struct Own {
    x: PrivateVec,
    z: PrivateVec,
    q: PrivateVec,
    r: PrivateVec,
}

/// A zeroed vector in this process's private memory (the system
/// allocator), not in the DSM: a block of the DSM heap that a thread writes
/// stays in its process's write set and is released at every barrier even
/// when no other process ever reads it, so a thread's scratch vectors in
/// the DSM would add to the cost of every barrier. It must be dropped in
/// the process that made it (a team thread's local).
struct PrivateVec {
    ptr: core::ptr::NonNull<f64>,
    len: usize,
}

impl PrivateVec {
    fn layout(len: usize) -> Layout {
        Layout::array::<f64>(len.max(1)).expect("vector size")
    }

    /// `len` zeros.
    fn zeroed(len: usize) -> Self {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { System.alloc_zeroed(layout) };
        let ptr = core::ptr::NonNull::new(p.cast::<f64>())
            .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        PrivateVec { ptr, len }
    }
}

impl core::ops::Deref for PrivateVec {
    type Target = [f64];
    fn deref(&self) -> &[f64] {
        // SAFETY: `len` zero-initialised elements, owned by `self`.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl core::ops::DerefMut for PrivateVec {
    fn deref_mut(&mut self) -> &mut [f64] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PrivateVec {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed` with this layout, in this process.
        unsafe { System.dealloc(self.ptr.as_ptr().cast(), Self::layout(self.len)) }
    }
}

/// What one team thread works with. Each thread copies it into its own
/// frame when the region starts: `main`'s frame — where the closure's
/// captures live — is one DSM block that thread 0 writes all the time, so
/// reading it after every barrier would fetch the whole block again in
/// every other process.
struct Ctx<'a> {
    prm: Params,
    m: CsrRef<'a>,
    v: Shared<'a>,
    /// This thread's block of rows.
    rows: Range<usize>,
}

/// What a team computes: the last `zeta` and residual norm.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    zeta: f64,
    rnorm: f64,
}

/// NPB's `conj_grad` for one team thread: returns the sums that end the
/// outer iteration (residual, `x·z`, `z·z`), the same on every thread.
///
/// Each phase works on this thread's block of rows (the static schedule of
/// NPB's loops) and ends with an all-reduction or a barrier.
/// `t.for_range` is not used here because each loop start reads the
/// region's information in thread 0's frame (see `Ctx`).
fn conj_grad_omp(t: &Thread<'_>, c: &Ctx<'_>, o: &mut Own) -> Sums {
    let (m, v, b) = (c.m, c.v, c.rows.clone());
    let add = |a: f64, b: f64| a + b;
    // q = z = 0, r = p = x; rho = r·r.
    {
        // SAFETY: the block is this thread's; nobody reads other blocks of
        // p before the barrier below.
        let p = unsafe { v.p.rows_mut(b.clone()) };
        p.copy_from_slice(&o.x);
    }
    let mut rho = t.reduce(init_block(&o.x, &mut o.q, &mut o.z, &mut o.r), add);
    // The whole of p is read next.
    t.barrier();
    for it in 0..CGITMAX {
        // q = A p; d = p·q.
        // SAFETY: p was written before the last barrier and is written
        // next after the second reduction below, which every thread
        // reaches after this phase.
        let p_all = unsafe { v.p.all() };
        let d = t.reduce(matvec_dot(m, b.start, p_all, &mut o.q), add);
        let alpha = rho / d;
        let rho0 = rho;
        // z += alpha p; r -= alpha q; rho = r·r.
        // SAFETY: p is not written in this phase.
        let p = unsafe { v.p.rows(b.clone()) };
        rho = t.reduce(update_zr(alpha, p, &o.q, &mut o.z, &mut o.r), add);
        let beta = rho / rho0;
        // p = r + beta p.
        // SAFETY: every thread finished reading p (the mat-vec) before the
        // reduction above; the block is this thread's.
        let p = unsafe { v.p.rows_mut(b.clone()) };
        update_p(beta, &o.r, p);
        if it + 1 == CGITMAX {
            // The residual reads z whole: publish this block.
            // SAFETY: this thread's block; every thread read the shared z
            // last in the previous `conj_grad`'s residual, before its
            // reduction.
            unsafe { v.z.rows_mut(b.clone()) }.copy_from_slice(&o.z);
        }
        // The next mat-vec (or the residual) reads p (z) whole.
        t.barrier();
    }
    // r = A z; the residual and the norms.
    // SAFETY: z was written before the barrier above and is next written
    // after this reduction.
    let z_all = unsafe { v.z.all() };
    t.reduce(residual_norms(m, b.start, z_all, &o.x, &mut o.r), Sums::add)
}

/// One team thread's outer iterations (`timed`: NPB's timed loop, else the
/// warm-up): starts from `x = 1`, returns the last outcome.
fn outer_omp(t: &Thread<'_>, c: &Ctx<'_>, timed: bool) -> Outcome {
    let len = c.rows.len();
    let mut own = Own {
        x: PrivateVec::zeroed(len),
        z: PrivateVec::zeroed(len),
        q: PrivateVec::zeroed(len),
        r: PrivateVec::zeroed(len),
    };
    own.x.fill(1.0);
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
    let m = makea(&prm);
    let n = prm.na;
    let nthreads = menps_omp::max_threads();
    let blocks = row_blocks(n, menps_omp::num_processes(), nthreads);
    let pages = n.div_ceil(PAGE_ROWS);
    let zero = Page([0.0; PAGE_ROWS]);
    let (mut ps, mut zs) = (vec![zero; pages], vec![zero; pages]);
    let v = Shared {
        p: TeamVec::new(&mut ps, n),
        z: TeamVec::new(&mut zs, n),
    };
    let mref = m.view();
    let mut outcomes = vec![Outcome::default(); nthreads];
    let mut seconds = 0.0;
    for timed in [false, true] {
        let out = SharedMut::new(&mut outcomes);
        let t0 = menps_omp::wtime();
        menps_omp::parallel(|t| {
            let c = Ctx {
                prm,
                m: mref,
                v,
                rows: blocks[t.thread_num()].clone(),
            };
            let o = outer_omp(t, &c, timed);
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
            .map(|(k, q)| matvec_dot(m, k * chunk, pr, q))
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
        r.par_chunks(chunk)
            .zip(p.par_chunks_mut(chunk))
            .for_each(|(r, p)| update_p(beta, r, p));
    }
    let zr: &[f64] = z;
    r.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .enumerate()
        .map(|(k, (r, x))| residual_norms(m, k * chunk, zr, x, r))
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
