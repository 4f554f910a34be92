//! NAS Parallel Benchmarks' EP ("embarrassingly parallel") kernel, NPB 3.x
//! semantics, classes S and W.
//!
//! EP draws 2^(M+1) uniform numbers with NPB's linear congruential
//! generator (`x ← 5^13 · x mod 2^46`, seed 271828183), pairs them up,
//! turns every pair inside the unit disc into two Gaussian deviates by the
//! Marsaglia polar method, and accumulates their sums `sx`, `sy` and the
//! counts `q[l]` of pairs whose larger deviate in absolute value lies in
//! the annulus `l ≤ max(|X|, |Y|) < l + 1`.
//!
//! The numbers are consumed in 2^(M−16) batches of 2^16 pairs (NPB's `MK =
//! 16`). Batch `k` starts from the seed `s · a^(2^17·k) mod 2^46`, found by
//! NPB's binary skip-ahead, so any thread can run any batch: each thread
//! takes whole batches (static blocks), and the per-thread sums and counts
//! are combined by one reduction of a `Copy` value.
//!
//! The generator works on integers (a wrapping 64-bit product masked to 46
//! bits): NPB's `randlc`/`vranlc` compute exactly the same 46-bit integers
//! in double precision, so the numbers are bit-for-bit NPB's. Each batch
//! generates its numbers on the fly instead of filling NPB's `x` array
//! first (same sequence, no scratch memory).
//!
//! Verification: `sx` and `sy` against NPB's reference values with relative
//! tolerance 1e-8. Speed: Mop/s = 2^(M+1) / seconds / 10^6, as NPB counts.

use super::report::{Class, KernelResult};

/// log2 of the pairs in a batch (NPB's `MK`).
const MK: u32 = 16;
/// Pairs in a batch (NPB's `NK`).
const NK: usize = 1 << MK;
/// Annuli counted (NPB's `NQ`).
const NQ: usize = 10;
/// The generator's multiplier, 5^13.
const A: u64 = 1_220_703_125;
/// The seed of the whole sequence.
const SEED: u64 = 271_828_183;
/// 2^46 − 1: the generator works modulo 2^46.
const MASK46: u64 = (1 << 46) - 1;
/// 2^−46: turns a generator state into a uniform number in (0, 1).
const R46: f64 = 1.0 / (1u64 << 46) as f64;
/// NPB's relative tolerance of the verification.
const EPSILON: f64 = 1.0e-8;

/// The size (`M`: 2^(M+1) numbers) and NPB's reference `sx`, `sy` of a class.
fn params(class: Class) -> (u32, f64, f64) {
    match class {
        Class::S => (24, -3.24783465203474e3, -6.958407078382297e3),
        Class::W => (25, -2.863319731645753e3, -6.320053679109499e3),
    }
}

/// `a · b mod 2^46` for `a, b < 2^46`: the low 46 bits of the product are
/// those of its wrapping 64-bit value.
#[inline(always)]
fn mul46(a: u64, b: u64) -> u64 {
    a.wrapping_mul(b) & MASK46
}

/// What EP accumulates: the sums of the deviates and the annulus counts.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sums {
    sx: f64,
    sy: f64,
    q: [u64; NQ],
}

impl Sums {
    const ZERO: Sums = Sums {
        sx: 0.0,
        sy: 0.0,
        q: [0; NQ],
    };

    /// The sums of both (the reduction's combining operation).
    fn combine(mut self, other: Sums) -> Sums {
        self.sx += other.sx;
        self.sy += other.sy;
        for (a, b) in self.q.iter_mut().zip(other.q) {
            *a += b;
        }
        self
    }
}

/// `a^(2·NK) mod 2^46`: the multiplier that skips one batch (NPB squares
/// `a` MK + 1 times).
fn batch_multiplier() -> u64 {
    (0..=MK).fold(A, |t, _| mul46(t, t))
}

/// The state before batch `k`'s first number, `SEED · an^k mod 2^46`, by
/// NPB's right-to-left binary exponentiation.
fn batch_seed(k: usize, an: u64) -> u64 {
    let (mut t1, mut t2, mut kk) = (SEED, an, k);
    loop {
        if kk & 1 == 1 {
            t1 = mul46(t1, t2);
        }
        kk >>= 1;
        if kk == 0 {
            return t1;
        }
        t2 = mul46(t2, t2);
    }
}

/// Adds batch `k`'s 2^16 pairs to `acc`.
fn batch(k: usize, an: u64, mut acc: Sums) -> Sums {
    let mut x = batch_seed(k, an);
    let (mut sx, mut sy) = (0.0f64, 0.0f64);
    for _ in 0..NK {
        x = mul46(x, A);
        let x1 = 2.0 * (x as f64 * R46) - 1.0;
        x = mul46(x, A);
        let x2 = 2.0 * (x as f64 * R46) - 1.0;
        let t1 = x1 * x1 + x2 * x2;
        // A rejected pair (probability 1 − π/4) adds zeros and counts
        // nothing: updating the sums unconditionally measured twice as fast
        // as NPB's `if` around the whole update.
        let inside = t1 <= 1.0;
        let t2 = if inside {
            (-2.0 * t1.ln() / t1).sqrt()
        } else {
            0.0
        };
        let (t3, t4) = (x1 * t2, x2 * t2);
        // The annulus (never past NQ − 1 at these sizes: |deviates| < 7;
        // the `min` only spares a bounds check).
        let l = t3.abs().max(t4.abs()) as usize;
        acc.q[l.min(NQ - 1)] += u64::from(inside);
        sx += t3;
        sy += t4;
    }
    acc.sx += sx;
    acc.sy += sy;
    acc
}

/// Checks the sums and builds the report.
fn report(class: Class, seconds: f64, s: Sums) -> KernelResult {
    let (m, sx_ref, sy_ref) = params(class);
    let sx_err = ((s.sx - sx_ref) / sx_ref).abs();
    let sy_err = ((s.sy - sy_ref) / sy_ref).abs();
    let verified = sx_err <= EPSILON && sy_err <= EPSILON;
    let pairs: u64 = s.q.iter().sum();
    let counts = s.q.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    KernelResult {
        kernel: "ep",
        class,
        seconds,
        mops: 2f64.powi(m as i32 + 1) / seconds / 1e6,
        verified,
        detail: format!(
            "M = {m}: sx = {:.15e} (reference {sx_ref:.15e}, rel. error {sx_err:.1e}), \
             sy = {:.15e} (reference {sy_ref:.15e}, rel. error {sy_err:.1e}), \
             tolerance {EPSILON:.0e}; {pairs} Gaussian pairs, annuli: {counts}",
            s.sx, s.sy
        ),
    }
}

/// Runs the kernel with menps-omp (called from `main` of `menps_omp::run`, on process 0,
/// outside parallel regions): set-up untimed, the timed part, verification.
pub fn run_omp(class: Class) -> KernelResult {
    let (m, _, _) = params(class);
    let batches = 1usize << (m - MK);
    let start = menps_omp::wtime();
    let an = batch_multiplier();
    // #pragma omp parallel for reduction(+: sx, sy, q[:NQ])
    let sums = menps_omp::parallel_reduce(
        0..batches,
        Sums::ZERO,
        |acc, k| batch(k, an, acc),
        Sums::combine,
    );
    let seconds = menps_omp::wtime() - start;
    report(class, seconds, sums)
}

/// The same algorithm with rayon on the current rayon thread pool (a normal process, no DSM).
pub fn run_rayon(class: Class) -> KernelResult {
    use rayon::prelude::*;
    let (m, _, _) = params(class);
    let batches = 1usize << (m - MK);
    let start = std::time::Instant::now();
    let an = batch_multiplier();
    // Static blocks of batches, one per thread, as menps-omp's loop.
    let threads = rayon::current_num_threads().max(1);
    let sums = (0..threads)
        .into_par_iter()
        .map(|t| {
            let (lo, hi) = block(batches, t, threads);
            (lo..hi).fold(Sums::ZERO, |acc, k| batch(k, an, acc))
        })
        .reduce(|| Sums::ZERO, Sums::combine);
    let seconds = start.elapsed().as_secs_f64();
    report(class, seconds, sums)
}

/// Thread `t`'s static block of `0..len` among `n` threads.
fn block(len: usize, t: usize, n: usize) -> (usize, usize) {
    let (q, r) = (len / n, len % n);
    let lo = t * q + t.min(r);
    (lo, lo + q + usize::from(t < r))
}
