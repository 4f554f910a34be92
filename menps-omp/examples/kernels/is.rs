//! NAS Parallel Benchmarks' IS ("integer sort") kernel, NPB 3.x semantics,
//! classes S and W.
//!
//! IS ranks `2^k` integer keys in `[0, max_key)`: class S has 2^16 keys
//! below 2^11, class W 2^20 keys below 2^16. The keys come from NPB's
//! `create_seq`: NPB's linear congruential generator (`x ← 5^13 · x mod
//! 2^46`, seed 314159265), each key the average of four uniform numbers
//! scaled to the key range (`⌊max_key/4 · (r1 + r2 + r3 + r4)⌋`), which
//! gives a roughly Gaussian distribution.
//!
//! Each of the 10 timed iterations (after NPB's one untimed iteration)
//! changes two keys as NPB does (`key[i] = i`, `key[i + 10] = max_key −
//! i`), then ranks all keys by a counting sort — NPB's ranking without
//! buckets: every thread counts the keys of its static block into its own
//! histogram of `max_key` counters (its own page-aligned block of one shared
//! array); after a barrier every thread takes a static block of key values,
//! sums the threads' histograms over it and turns the sums into a running
//! count, offset by the keys below its block (the blocks' totals are
//! exchanged through one reduction). The result, NPB's `key_buff1`, holds
//! for every key value `k` the number of keys `≤ k`: the rank of a key `k`
//! is `key_buff1[k − 1]`.
//!
//! Verification, as NPB's: at every iteration, the ranks of five test keys
//! (`test_index_array`) against NPB's `test_rank_array` shifted by the
//! iteration number, class by class; at the end, the full verification
//! places every key at its rank (the keys sorted) and checks the order. The
//! run passes if all 5 × 10 + 1 checks pass. Speed: Mop/s = keys × 10 /
//! seconds / 10^6, as NPB counts.
//!
//! # On the DSM
//!
//! The keys and the histograms live in one shared array of rows, one row
//! per thread, each page-aligned: thread `t`'s static block of the keys,
//! then its histogram. Thread `t` generates its keys there (NPB 3.x's
//! parallel `create_seq`, untimed), changes the two keys of an iteration
//! if they are among its own, and counts them into its histogram — all in
//! its own row (`Loop::rows_mut` over the rows `0..threads`, whose static
//! schedule gives thread `t` row `t`), so only its process writes those
//! pages. After that loop's barrier every thread reads the histograms
//! through a view of the array (`SharedMut::view`), sums its static block
//! of key values into a running count, its block of NPB's `key_buff1`,
//! kept in the thread's private memory (`menps_omp::private`: no DSM work
//! at barriers), and drops the view before the reduction that exchanges
//! the blocks' totals and the test keys; so the next iteration's loop,
//! which writes the rows again, finds no view alive. Every timed iteration
//! thus costs one barrier and one reduction in one parallel region (the
//! DSM releases every page a process has written at every barrier, so
//! barriers are what costs). After the last iteration each thread copies
//! its block into the shared `key_buff1` (a page-aligned array) with one
//! static `Loop::chunks_mut`. The thread whose block of `key_buff1` holds
//! a test key's rank checks it. No `unsafe`.

use core::ops::{Range, RangeInclusive};

use menps_omp::{SharedMut, static_block};

use super::report::{Class, KernelResult};

/// Timed iterations (NPB's `MAX_ITERATIONS`).
const MAX_ITERATIONS: usize = 10;
/// Test keys of the partial verification (NPB's `TEST_ARRAY_SIZE`).
const TEST_ARRAY_SIZE: usize = 5;
/// The seed of the key sequence.
const SEED: u64 = 314_159_265;
/// The generator's multiplier, 5^13.
const A: u64 = 1_220_703_125;
/// 2^46 − 1: the generator works modulo 2^46.
const MASK46: u64 = (1 << 46) - 1;
/// 2^−46: turns a generator state into a uniform number in (0, 1).
const R46: f64 = 1.0 / (1u64 << 46) as f64;
/// Counters (`u32`) in a page of the DSM (4 KiB).
const PAGE_WORDS: usize = 1024;
/// Largest team: the block totals travel as one `[u32; MAX_THREADS]`.
const MAX_THREADS: usize = 256;

/// A class's problem: sizes and NPB's partial-verification data.
struct Params {
    /// Keys (NPB's `NUM_KEYS`).
    keys: usize,
    /// Keys lie in `0..max_key` (NPB's `MAX_KEY`).
    max_key: usize,
    /// Where the test keys are (NPB's `test_index_array`).
    test_index: [usize; TEST_ARRAY_SIZE],
    /// Their ranks before the iteration shifts (NPB's `test_rank_array`).
    test_rank: [i64; TEST_ARRAY_SIZE],
}

fn params(class: Class) -> Params {
    match class {
        Class::S => Params {
            keys: 1 << 16,
            max_key: 1 << 11,
            test_index: [48427, 17148, 23627, 62548, 4431],
            test_rank: [0, 18, 346, 64917, 65463],
        },
        Class::W => Params {
            keys: 1 << 20,
            max_key: 1 << 16,
            test_index: [357773, 934767, 875723, 898999, 404505],
            test_rank: [1249, 11698, 1039987, 1043896, 1048018],
        },
    }
}

/// The expected rank of test key `i` at `iteration` (NPB's class-specific
/// shifts).
fn expected_rank(class: Class, p: &Params, i: usize, iteration: usize) -> i64 {
    let (base, it) = (p.test_rank[i], iteration as i64);
    match class {
        Class::S if i <= 2 => base + it,
        Class::S => base - it,
        Class::W if i < 2 => base + it - 2,
        Class::W => base - it,
    }
}

/// NPB's `create_seq` for the keys `first..first + keys.len()`: key `i`
/// is `⌊max_key/4 · (r1 + r2 + r3 + r4)⌋` of the generator's numbers `4i +
/// 1 ..= 4i + 4`; a part starts from the seed found by skipping `4 · first`
/// numbers (NPB's `find_my_seed`), so threads can fill their own parts. The
/// numbers are computed on integers, bit for bit NPB's double-precision
/// `randlc`.
fn create_seq(first: usize, keys: &mut [u32], max_key: usize) {
    // x ← SEED · A^(4·first) mod 2^46, by binary exponentiation.
    let (mut x, mut a, mut e) = (SEED, A, 4 * first as u64);
    while e > 0 {
        if e & 1 == 1 {
            x = x.wrapping_mul(a) & MASK46;
        }
        a = a.wrapping_mul(a) & MASK46;
        e >>= 1;
    }
    let mut next = move || {
        x = x.wrapping_mul(A) & MASK46;
        x as f64 * R46
    };
    let k = (max_key / 4) as f64;
    for key in keys {
        let mut s = next();
        s += next();
        s += next();
        s += next();
        *key = (k * s) as u32;
    }
}

/// One thread's histogram of its keys (NPB's `work_buff`).
fn count_keys(keys: &[u32], hist: &mut [u32]) {
    hist.fill(0);
    for &k in keys {
        hist[k as usize] += 1;
    }
}

/// Key values `block` of the ranking: sums the `threads` histograms over
/// them into `out` and turns the sums into a running count from 0; returns
/// the block's total. Counter `k` of histogram `j` is `hist[at + j * stride
/// + k]`.
fn sum_block(
    hist: &[u32],
    at: usize,
    stride: usize,
    threads: usize,
    block: Range<usize>,
    out: &mut [u32],
) -> u32 {
    let row = |j: usize| &hist[at + j * stride + block.start..at + j * stride + block.end];
    out.copy_from_slice(row(0));
    for j in 1..threads {
        for (o, &c) in out.iter_mut().zip(row(j)) {
            *o += c;
        }
    }
    let mut acc = 0u32;
    for o in out.iter_mut() {
        acc += *o;
        *o = acc;
    }
    acc
}

/// Adds the keys below a block to its running count.
fn add_offset(out: &mut [u32], offset: u32) {
    if offset != 0 {
        for o in out {
            *o += offset;
        }
    }
}

/// What the partial verification found (NPB's `passed_verification`
/// and its failure messages), as one `Copy` value that reductions combine.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    /// Checks passed.
    passed: u32,
    /// Checks failed.
    failed: u32,
    /// The first failure: iteration, test key, rank found, rank expected.
    first_failure: Option<(u32, u32, u32, i64)>,
}

impl Outcome {
    /// The outcomes of both (first failure: `self`'s if any).
    fn combine(self, other: Outcome) -> Outcome {
        Outcome {
            passed: self.passed + other.passed,
            failed: self.failed + other.failed,
            first_failure: self.first_failure.or(other.first_failure),
        }
    }

    /// NPB's partial verification after the ranking of `iteration`, for
    /// the test keys `vals` whose rank lies in `ranks`, the ranks of the key
    /// values `first..first + ranks.len()`.
    fn partial(
        &mut self,
        class: Class,
        p: &Params,
        iteration: usize,
        vals: &[u32; TEST_ARRAY_SIZE],
        first: usize,
        ranks: &[u32],
    ) {
        for (i, &k) in vals.iter().enumerate() {
            let k = k as usize;
            if !(0 < k && k < p.keys && (first..first + ranks.len()).contains(&(k - 1))) {
                continue;
            }
            let rank = ranks[k - 1 - first];
            let expected = expected_rank(class, p, i, iteration);
            if i64::from(rank) == expected {
                self.passed += 1;
            } else {
                self.failed += 1;
                self.first_failure
                    .get_or_insert((iteration as u32, i as u32, rank, expected));
            }
        }
    }
}

/// NPB's full verification: puts every key at its rank (decrementing
/// `ranks`, as NPB does) and returns the keys out of order.
fn full_verify(keys: &mut [u32], ranks: &mut [u32]) -> usize {
    let copy = keys.to_vec();
    let mut bad = 0usize;
    for &k in &copy {
        match ranks[k as usize].checked_sub(1) {
            Some(r) if (r as usize) < keys.len() => {
                ranks[k as usize] = r;
                keys[r as usize] = k;
            }
            _ => bad += 1,
        }
    }
    bad + keys.windows(2).filter(|w| w[0] > w[1]).count()
}

/// The verdict and the report.
fn report(class: Class, p: &Params, seconds: f64, o: Outcome, out_of_order: usize) -> KernelResult {
    let expected = TEST_ARRAY_SIZE * MAX_ITERATIONS + 1;
    let passed = o.passed as usize + usize::from(out_of_order == 0);
    let mut detail = format!(
        "{} keys below {}, {MAX_ITERATIONS} iterations: {passed} of {expected} checks passed \
         (5 test ranks per iteration, then the full sort)",
        p.keys, p.max_key
    );
    if let Some((it, i, rank, exp)) = o.first_failure {
        detail.push_str(&format!(
            "; {} partial checks failed, first: iteration {it}, test key {i}: rank {rank}, \
             expected {exp}",
            o.failed
        ));
    }
    if out_of_order != 0 {
        detail.push_str(&format!(
            "; full verification: {out_of_order} keys out of sort"
        ));
    }
    KernelResult {
        kernel: "is",
        class,
        seconds,
        mops: (p.keys * MAX_ITERATIONS) as f64 / seconds / 1e6,
        verified: passed == expected && o.failed == 0,
        detail,
    }
}

/// Index of the first `u32` of `v` that starts a DSM page.
fn page_start(v: &[u32]) -> usize {
    let misalign = v.as_ptr() as usize % (4 * PAGE_WORDS);
    (4 * PAGE_WORDS - misalign) % (4 * PAGE_WORDS) / 4
}

/// What threads exchange after the counting: each block's number of keys
/// and the test keys (NPB's `partial_verify_vals`; each filled in by the
/// thread whose keys hold it, zeros elsewhere).
#[derive(Clone, Copy)]
struct Exchange {
    totals: [u32; MAX_THREADS],
    vals: [u32; TEST_ARRAY_SIZE],
}

impl Exchange {
    /// Nothing yet.
    const ZERO: Exchange = Exchange {
        totals: [0; MAX_THREADS],
        vals: [0; TEST_ARRAY_SIZE],
    };

    /// The element-wise sum.
    fn add(mut self, other: Exchange) -> Exchange {
        for (a, b) in self.totals.iter_mut().zip(other.totals) {
            *a += b;
        }
        for (a, b) in self.vals.iter_mut().zip(other.vals) {
            *a += b;
        }
        self
    }
}

/// The menps-omp ranking's arrays: one page-aligned row per thread (its
/// keys, then its histogram, each part page-aligned) and the ranks.
struct OmpState {
    threads: usize,
    keys: usize,
    max_key: usize,
    /// Keys per row: the largest static block of the keys, rounded up to
    /// whole pages; the histogram follows.
    key_stride: usize,
    /// Elements per row: `key_stride` plus `max_key` rounded up to whole
    /// pages.
    row_len: usize,
    rows: Vec<u32>,
    rows_at: usize,
    ranks: Vec<u32>,
    ranks_at: usize,
}

impl OmpState {
    fn new(p: &Params) -> Self {
        let threads = menps_omp::max_threads();
        assert!(
            threads <= MAX_THREADS && threads <= p.max_key,
            "is: at most {MAX_THREADS} threads"
        );
        let key_stride = p.keys.div_ceil(threads).next_multiple_of(PAGE_WORDS);
        let row_len = key_stride + p.max_key.next_multiple_of(PAGE_WORDS);
        let rows = vec![0u32; threads * row_len + PAGE_WORDS];
        let ranks = vec![0u32; p.max_key + PAGE_WORDS];
        let (rows_at, ranks_at) = (page_start(&rows), page_start(&ranks));
        OmpState {
            threads,
            keys: p.keys,
            max_key: p.max_key,
            key_stride,
            row_len,
            rows,
            rows_at,
            ranks,
            ranks_at,
        }
    }

    /// The rows, page-aligned.
    fn rows(&mut self) -> &mut [u32] {
        &mut self.rows[self.rows_at..self.rows_at + self.threads * self.row_len]
    }

    /// The keys that row `j` holds (thread `j`'s static block).
    fn key_block(&self, j: usize) -> Range<usize> {
        static_block(0..self.keys, j, self.threads)
    }

    /// NPB's `create_seq`, in parallel (NPB 3.x): every thread generates
    /// the keys of its row, so its process holds their pages.
    fn generate(&mut self) {
        let (threads, row_len, max_key) = (self.threads, self.row_len, self.max_key);
        let n = self.keys;
        let rows = SharedMut::new(self.rows());
        menps_omp::parallel(|t| {
            t.for_range(0..threads)
                .rows_mut(&rows, row_len, |js, mine| {
                    for (j, row) in js.zip(mine.chunks_exact_mut(row_len)) {
                        let r = static_block(0..n, j, threads);
                        create_seq(r.start, &mut row[..r.len()], max_key);
                    }
                });
        });
    }

    /// NPB's `rank` for `iterations`, in one parallel region; returns the
    /// partial verification, and leaves the last iteration's ranks in
    /// [`OmpState::ranks`].
    fn rank(&mut self, class: Class, p: &Params, iterations: RangeInclusive<usize>) -> Outcome {
        let (threads, n, max_key) = (self.threads, self.keys, self.max_key);
        let (key_stride, row_len) = (self.key_stride, self.row_len);
        let mut result = [Outcome::default()];
        let result_out = SharedMut::new(&mut result);
        let (rows_at, ranks_at) = (self.rows_at, self.ranks_at);
        let rows = SharedMut::new(&mut self.rows[rows_at..rows_at + threads * row_len]);
        let ranks = SharedMut::new(&mut self.ranks[ranks_at..ranks_at + max_key]);
        menps_omp::parallel(|t| {
            assert_eq!(t.num_threads(), threads, "is: the team changed size");
            let tid = t.thread_num();
            let my_values = static_block(0..max_key, tid, threads);
            let mut outcome = Outcome::default();
            // This thread's block of `key_buff1`, ranked every iteration in
            // private memory (only this thread touches it) and published in
            // `ranks` once, after the last iteration.
            let mut out = menps_omp::private(|| vec![0u32; my_values.len()]);
            for iteration in iterations.clone() {
                let mut mine = Exchange::ZERO;
                let changes = [
                    (iteration, iteration),
                    (iteration + MAX_ITERATIONS, max_key - iteration),
                ];
                // Row `j` (thread `j`'s under the static schedule): change
                // the keys of the iteration that lie in it, note the test
                // keys, count the keys into the row's histogram.
                t.for_range(0..threads)
                    .rows_mut(&rows, row_len, |js, mine_rows| {
                        for (j, row) in js.zip(mine_rows.chunks_exact_mut(row_len)) {
                            let r = static_block(0..n, j, threads);
                            let (keys, hist) = row.split_at_mut(key_stride);
                            let keys = &mut keys[..r.len()];
                            for (at, key) in changes {
                                if r.contains(&at) {
                                    keys[at - r.start] = key as u32;
                                }
                            }
                            for (v, &at) in mine.vals.iter_mut().zip(&p.test_index) {
                                if r.contains(&at) {
                                    *v = keys[at - r.start];
                                }
                            }
                            count_keys(keys, &mut hist[..max_key]);
                        }
                    });
                // Every histogram is complete (the loop's barrier); the
                // view ends before the reduction, so before any thread
                // writes its row again.
                mine.totals[tid] = {
                    let all = rows.view();
                    sum_block(
                        &all,
                        key_stride,
                        row_len,
                        threads,
                        my_values.clone(),
                        &mut out,
                    )
                };
                let all = t.reduce(mine, Exchange::add);
                add_offset(&mut out, all.totals[..tid].iter().sum());
                outcome.partial(class, p, iteration, &all.vals, my_values.start, &out);
            }
            // The static schedule gives this thread `my_values` again.
            t.for_range(0..max_key).chunks_mut(&ranks, |values, dst| {
                assert_eq!(values, my_values, "is: not the static block");
                dst.copy_from_slice(&out);
            });
            let outcome = t.reduce(outcome, Outcome::combine);
            t.for_range(0..1).each_mut(&result_out, |_, r| *r = outcome);
        });
        result[0]
    }

    /// The keys, gathered from the rows into one vector.
    fn gather_keys(&self) -> Vec<u32> {
        let mut keys = Vec::with_capacity(self.keys);
        for j in 0..self.threads {
            let r = self.key_block(j);
            let at = self.rows_at + j * self.row_len;
            keys.extend_from_slice(&self.rows[at..at + r.len()]);
        }
        keys
    }

    /// The ranks (NPB's `key_buff1`).
    fn ranks(&mut self) -> &mut [u32] {
        &mut self.ranks[self.ranks_at..self.ranks_at + self.max_key]
    }
}

/// Runs the kernel with menps-omp (called from `main` of `menps_omp::run`, on process 0,
/// outside parallel regions): set-up untimed, the timed part, verification.
pub fn run_omp(class: Class) -> KernelResult {
    let p = params(class);
    let mut st = OmpState::new(&p);
    st.generate();
    // NPB's free iteration: every page touched once, untimed.
    st.rank(class, &p, 1..=1);

    let start = menps_omp::wtime();
    let outcome = st.rank(class, &p, 1..=MAX_ITERATIONS);
    let seconds = menps_omp::wtime() - start;

    let mut keys = st.gather_keys();
    let out_of_order = full_verify(&mut keys, st.ranks());
    report(class, &p, seconds, outcome, out_of_order)
}

/// The rayon ranking's arrays.
struct RayonState {
    threads: usize,
    hist: Vec<u32>,
    ranks: Vec<u32>,
}

impl RayonState {
    /// NPB's `rank` for one iteration, the same algorithm with rayon.
    fn rank(&mut self, keys: &mut [u32], class: Class, p: &Params, iteration: usize) -> Outcome {
        use rayon::prelude::*;
        let (threads, n, max_key) = (self.threads, p.keys, p.max_key);
        keys[iteration] = iteration as u32;
        keys[iteration + MAX_ITERATIONS] = (max_key - iteration) as u32;
        let vals = p.test_index.map(|i| keys[i]);
        let keys = &*keys;
        self.hist
            .par_chunks_mut(max_key)
            .enumerate()
            .for_each(|(tid, row)| {
                count_keys(&keys[static_block(0..n, tid, threads)], row);
            });
        let hist = &self.hist;
        let mut blocks = Vec::with_capacity(threads);
        let mut rest = &mut self.ranks[..];
        for tid in 0..threads {
            let range = static_block(0..max_key, tid, threads);
            let (b, r) = rest.split_at_mut(range.len());
            blocks.push((range, b));
            rest = r;
        }
        let totals: Vec<u32> = blocks
            .par_iter_mut()
            .map(|(range, out)| sum_block(hist, 0, max_key, threads, range.clone(), out))
            .collect();
        blocks
            .into_par_iter()
            .enumerate()
            .for_each(|(tid, (_, out))| add_offset(out, totals[..tid].iter().sum()));
        let mut outcome = Outcome::default();
        outcome.partial(class, p, iteration, &vals, 0, &self.ranks);
        outcome
    }
}

/// The same algorithm with rayon on the current rayon thread pool (a normal process, no DSM).
pub fn run_rayon(class: Class) -> KernelResult {
    let p = params(class);
    let mut keys = vec![0u32; p.keys];
    {
        use rayon::prelude::*;
        let chunk = p.keys.div_ceil(rayon::current_num_threads().max(1));
        keys.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(j, part)| create_seq(j * chunk, part, p.max_key));
    }
    let threads = rayon::current_num_threads().clamp(1, p.max_key);
    let mut st = RayonState {
        threads,
        hist: vec![0u32; threads * p.max_key],
        ranks: vec![0u32; p.max_key],
    };
    // NPB's free iteration, untimed.
    st.rank(&mut keys, class, &p, 1);

    let start = std::time::Instant::now();
    let mut outcome = Outcome::default();
    for iteration in 1..=MAX_ITERATIONS {
        outcome = outcome.combine(st.rank(&mut keys, class, &p, iteration));
    }
    let seconds = start.elapsed().as_secs_f64();

    let out_of_order = full_verify(&mut keys, &mut st.ranks);
    report(class, &p, seconds, outcome, out_of_order)
}
