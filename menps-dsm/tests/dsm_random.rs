//! Random data-race-free programs on the DSM, checked against a sequential
//! model, under every policy combination with 2, 3 and 4 processes.
//!
//! # The programs
//!
//! A program is generated from a 64-bit seed by a SplitMix64 generator. It
//! works on the job's [`SEGMENTS`] (block sizes 4 KiB .. 64 KiB) and is a
//! sequence of *epochs* separated by DSM barriers:
//!
//! - epoch 0 rewrites every byte of every segment (so a program does not
//!   depend on what ran before it in the same job);
//! - in every epoch each segment is cut into random chunks (1 B .. two
//!   blocks, often ending a few bytes around a block boundary), and each
//!   chunk is given to at most one writer process (random, striped, one
//!   process for the whole segment, or the previous epoch's layout again,
//!   possibly rotated) — *disjoint writers*. A writer stores its chunks
//!   byte by byte, as unaligned 8-byte words, with one `memcpy`, or sparsely
//!   (a third of the bytes);
//! - some epochs have *counters*: 8-byte words (unaligned, some across a
//!   block boundary) that processes increment in plain read-modify-write
//!   sections under one of [`MUTEXES`] DSM mutexes; and *atomic words*
//!   updated with `fetch_add`, `load_acquire` + `compare_exchange` loops
//!   and read with `load_acquire`. Process `p` always adds `1 << 16p`, so
//!   every value seen can be checked: this process's field must equal its
//!   own increments so far, every other field must not exceed that
//!   process's total;
//! - every process reads random ranges before and after its writes, clipped
//!   to the bytes nobody else writes in the epoch (data-race-free).
//!
//! Every process generates the whole program (all processes' parts) from
//! the seed, so it knows the expected contents of every byte before and
//! after every epoch — the sequential model — and checks every read against
//! it, and the full contents of every segment at the end of the program.
//! Many programs run in one job, one after the other in the same segments.
//!
//! # Replaying a failure
//!
//! A failure names the seed, the process count, the policy, the program,
//! the epoch and the rank, with the command that replays that program alone:
//!
//! ```text
//! MENPS_RAND_SEED=0x… MENPS_RAND_NPROCS=3 MENPS_RAND_POLICY=floating,hybrid,1,1 \
//!     cargo test -p menps-dsm --test dsm_random replay_one_seed -- --nocapture
//! ```
//!
//! (without `MENPS_RAND_NPROCS` / `MENPS_RAND_POLICY` it replays the seed with
//! 2, 3 and 4 processes / under every policy). A failure that needs the state
//! earlier programs of the same job left in the DSM (block homes, leases)
//! replays with `MENPS_RAND_JOB_BASE=0x… MENPS_RAND_PROGRAMS=<k>` instead of
//! `MENPS_RAND_SEED` (the report prints that command too).
//! `MENPS_RAND_BASE=<u64>` picks other programs for the whole suite and
//! `MENPS_RAND_PROGRAMS=<n>` sets the number of programs per job (soak runs);
//! `MENPS_RAND_TRACE=segment:offset[:length]` makes rank 0 print what every
//! epoch does to those bytes.
//!
//! `rewritten_block_is_never_stale_after_a_barrier` is the reduced form of
//! the stale copies these programs found with the floating home (a read
//! transaction copied the home's unreleased writes into its twin, so its
//! release announced nothing; the copy back now happens only when the block
//! migrates).

use std::process::Command;
use std::time::Instant;

use ct_worker::OsThreads;
use menps_dsm::com::{Coll, ShmCom};
use menps_dsm::dsm::{Dsm, DsmMutex};

mod common;
use common::*;

type D = Dsm<ShmCom<OsThreads>, OsThreads>;

/// The segments of every job: (size, block size).
const SEGMENTS: [(usize, usize); 5] = [
    (32 << 10, 4 << 10),
    (32 << 10, 8 << 10),
    (64 << 10, 16 << 10),
    (64 << 10, 32 << 10),
    (128 << 10, 64 << 10),
];
/// DSM mutexes guarding the counters (counter `i` by mutex `i % MUTEXES`).
const MUTEXES: usize = 3;
/// Bits of a process's field in a counter.
const FIELD: u32 = 16;
/// Programs per job in CI (7 policies × 3 process counts × 48 = 1008).
const PROGRAMS_PER_JOB: usize = 48;
/// Base of the seeds of the CI programs.
const BASE_SEED: u64 = 0x00d5_a000_2024_0007;

/// Seed of one program to replay.
const ENV_SEED: &str = "MENPS_RAND_SEED";
/// Process count of the replay (default: 2, 3 and 4).
const ENV_NPROCS: &str = "MENPS_RAND_NPROCS";
/// Policy of the replay, `writer,invalidation,fast` (default: all).
const ENV_POLICY: &str = "MENPS_RAND_POLICY";
/// Base of the suite's program seeds (driver), or of a job's (job side).
const ENV_BASE: &str = "MENPS_RAND_BASE";
/// A job's base to replay (its first `MENPS_RAND_PROGRAMS` programs, in
/// order: a failure that depends on what earlier programs left in the DSM).
const ENV_JOB_BASE: &str = "MENPS_RAND_JOB_BASE";
/// Programs per job.
const ENV_PROGRAMS: &str = "MENPS_RAND_PROGRAMS";
/// Deliberate fault in the job (checks of the checker): `corrupt` or
/// `skip_barrier`.
const ENV_INJECT: &str = "MENPS_RAND_INJECT";
/// `segment:offset[:length]`: rank 0 prints what every epoch does to
/// those bytes (diagnosis of a failure).
const ENV_TRACE: &str = "MENPS_RAND_TRACE";

// ---------------------------------------------------------------------------
// Random numbers.

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p` %.
    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------
// Programs.

/// Owner of bytes nobody writes in an epoch.
const FREE: u8 = u8::MAX;
/// Owner of a counter's or atomic word's bytes.
const SPECIAL: u8 = u8::MAX - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteStyle {
    Bytes,
    Words,
    Memcpy,
    /// Only the bytes of the mask.
    Sparse,
}

#[derive(Clone, Copy, Debug)]
enum ReadStyle {
    Bytes,
    Words,
    Memcpy,
}

/// One writer's store of `data` at `off` of segment `seg`.
struct Run {
    writer: usize,
    seg: usize,
    off: usize,
    /// The bytes after the store (for a sparse run, the bytes outside the
    /// mask are the old ones).
    data: Vec<u8>,
    /// Bytes a sparse run stores.
    mask: Vec<bool>,
    style: WriteStyle,
}

#[derive(Clone, Copy, Debug)]
struct ReadOp {
    seg: usize,
    off: usize,
    len: usize,
    style: ReadStyle,
}

/// An 8-byte word (a counter or an atomic word).
#[derive(Clone, Copy, Debug)]
struct Word {
    seg: usize,
    off: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AtomicKind {
    FetchAdd,
    CasLoop,
    Load,
}

enum Op {
    /// `Epoch::runs[i]`.
    Write(usize),
    /// Under mutex `mutex`, add this process's delta to these counters.
    Section { mutex: usize, counters: Vec<usize> },
    /// An atomic operation on `Epoch::atomics[word]`.
    Atomic { word: usize, kind: AtomicKind },
}

/// What one process does in an epoch, in this order.
#[derive(Default)]
struct Plan {
    pre_reads: Vec<ReadOp>,
    ops: Vec<Op>,
    post_reads: Vec<ReadOp>,
}

/// Chunks of a segment: `(start, end, writer)`.
type Chunks = Vec<(usize, usize, Option<usize>)>;

struct Epoch {
    runs: Vec<Run>,
    counters: Vec<Word>,
    atomics: Vec<Word>,
    plans: Vec<Plan>,
    /// `[counter][process]`: increments in the epoch.
    counter_totals: Vec<Vec<u64>>,
    /// `[atomic word][process]`: increments in the epoch.
    atomic_totals: Vec<Vec<u64>>,
}

/// The segments' contents (the model).
type Image = Vec<Vec<u8>>;

fn zero_image() -> Image {
    SEGMENTS.iter().map(|&(size, _)| vec![0u8; size]).collect()
}

fn word_at(img: &Image, w: Word) -> u64 {
    u64::from_le_bytes(img[w.seg][w.off..w.off + 8].try_into().unwrap())
}

fn add_to_word(img: &mut Image, w: Word, delta: u64) {
    let v = word_at(img, w).wrapping_add(delta);
    img[w.seg][w.off..w.off + 8].copy_from_slice(&v.to_le_bytes());
}

fn delta_of(rank: usize) -> u64 {
    1u64 << (FIELD * rank as u32)
}

/// Cuts every segment into chunks and picks their writers.
fn gen_layout(rng: &mut Rng, n: usize, full: bool) -> Vec<Chunks> {
    SEGMENTS
        .iter()
        .map(|&(size, bs)| {
            let density = if full {
                100
            } else {
                [0, 5, 25, 50, 90, 100][rng.below(6)]
            };
            // 0, 1: random writers; 2: stripes; 3: one writer.
            let mode = rng.below(4);
            let one = rng.below(n);
            let mut chunks = Vec::new();
            let mut pos = 0;
            while pos < size {
                let len = match rng.below(100) {
                    0..40 => rng.between(1, 16),
                    40..65 => rng.between(17, 512),
                    65..85 => rng.between(513, 4096),
                    _ => rng.between(4097, 2 * bs),
                };
                let mut end = (pos + len).min(size);
                if rng.percent(25) {
                    // End a few bytes around the next block boundary.
                    let b = (pos / bs + 1) * bs;
                    let e = (b + rng.below(17)).saturating_sub(8);
                    end = e.clamp(pos + 1, size);
                }
                let writer = if rng.percent(density) {
                    Some(match mode {
                        2 => chunks.len() % n,
                        3 => one,
                        _ => rng.below(n),
                    })
                } else {
                    None
                };
                chunks.push((pos, end, writer));
                pos = end;
            }
            chunks
        })
        .collect()
}

/// A word that overlaps none of `taken`.
fn pick_word(rng: &mut Rng, taken: &mut Vec<Word>, aligned: bool) -> Option<Word> {
    for _ in 0..16 {
        let seg = rng.below(SEGMENTS.len());
        let (size, bs) = SEGMENTS[seg];
        let off = if aligned {
            rng.below(size / 8) * 8
        } else if rng.percent(40) {
            // Across a block boundary.
            rng.between(1, size / bs - 1) * bs - rng.between(1, 7)
        } else {
            rng.below(size - 7)
        };
        if taken
            .iter()
            .all(|w| w.seg != seg || w.off + 8 <= off || off + 8 <= w.off)
        {
            let w = Word { seg, off };
            taken.push(w);
            return Some(w);
        }
    }
    None
}

/// The chunks with the special words cut out, as owner intervals.
fn carve(chunks: &Chunks, specials: &[(usize, usize)]) -> Vec<(usize, usize, u8)> {
    let mut out = Vec::with_capacity(chunks.len() + 2 * specials.len());
    for &(a, b, w) in chunks {
        let owner = w.map_or(FREE, |w| w as u8);
        let mut x = a;
        for &(s, e) in specials {
            if e <= x || s >= b {
                continue;
            }
            if s > x {
                out.push((x, s, owner));
            }
            out.push((s.max(x), e.min(b), SPECIAL));
            x = e.min(b);
        }
        if x < b {
            out.push((x, b, owner));
        }
    }
    out
}

/// Random reads by `me`, clipped to the bytes it may read (nobody else
/// writes them in the epoch).
fn gen_reads(
    rng: &mut Rng,
    owners: &[Vec<(usize, usize, u8)>],
    me: usize,
    count: usize,
) -> Vec<ReadOp> {
    let mut out = Vec::new();
    for _ in 0..count {
        let seg = rng.below(SEGMENTS.len());
        let (size, bs) = SEGMENTS[seg];
        let off = rng.below(size);
        let len = match rng.below(100) {
            0..35 => rng.between(1, 64),
            35..75 => rng.between(65, 4096),
            _ => rng.between(4097, 2 * bs),
        };
        let end = (off + len).min(size);
        let style = match rng.below(3) {
            0 => ReadStyle::Bytes,
            1 => ReadStyle::Words,
            _ => ReadStyle::Memcpy,
        };
        let iv = &owners[seg];
        let first = iv.partition_point(|&(_, b, _)| b <= off);
        for &(a, b, o) in &iv[first..] {
            if a >= end {
                break;
            }
            if o == FREE || o == me as u8 {
                out.push(ReadOp {
                    seg,
                    off: a.max(off),
                    len: b.min(end) - a.max(off),
                    style,
                });
            }
        }
    }
    out
}

/// Generates the next epoch of a program whose contents are `pre`.
fn gen_epoch(
    rng: &mut Rng,
    n: usize,
    pre: &Image,
    first: bool,
    prev: &mut Option<Vec<Chunks>>,
) -> Epoch {
    let layout = match prev.take() {
        Some(mut l) if !first && rng.percent(40) => {
            if rng.percent(30) {
                for c in l.iter_mut().flatten() {
                    c.2 = c.2.map(|w| (w + 1) % n);
                }
            }
            l
        }
        _ => gen_layout(rng, n, first),
    };
    let mut taken = Vec::new();
    let mut counters = Vec::new();
    let mut atomics = Vec::new();
    if !first && rng.percent(40) {
        for _ in 0..rng.between(1, 6) {
            counters.extend(pick_word(rng, &mut taken, false));
        }
    }
    if !first && rng.percent(35) {
        for _ in 0..rng.between(1, 4) {
            atomics.extend(pick_word(rng, &mut taken, true));
        }
    }
    let owners: Vec<_> = layout
        .iter()
        .enumerate()
        .map(|(seg, chunks)| {
            let mut sp: Vec<(usize, usize)> = taken
                .iter()
                .filter(|w| w.seg == seg)
                .map(|w| (w.off, w.off + 8))
                .collect();
            sp.sort_unstable();
            carve(chunks, &sp)
        })
        .collect();
    *prev = Some(layout);

    let mut runs = Vec::new();
    for (seg, iv) in owners.iter().enumerate() {
        for &(a, b, o) in iv {
            if o == FREE || o == SPECIAL {
                continue;
            }
            let style = match rng.below(if first { 3 } else { 4 }) {
                0 => WriteStyle::Bytes,
                1 => WriteStyle::Words,
                2 => WriteStyle::Memcpy,
                _ => WriteStyle::Sparse,
            };
            let mut data = vec![0u8; b - a];
            let mut mask = Vec::new();
            if style == WriteStyle::Sparse {
                data.copy_from_slice(&pre[seg][a..b]);
                mask = vec![false; b - a];
                for i in 0..b - a {
                    let r = rng.next();
                    if r.is_multiple_of(3) {
                        data[i] = (r >> 8) as u8;
                        mask[i] = true;
                    }
                }
            } else {
                rng.fill(&mut data);
            }
            runs.push(Run {
                writer: usize::from(o),
                seg,
                off: a,
                data,
                mask,
                style,
            });
        }
    }

    let mut counter_totals = vec![vec![0u64; n]; counters.len()];
    let mut atomic_totals = vec![vec![0u64; n]; atomics.len()];
    let mut plans = Vec::with_capacity(n);
    for me in 0..n {
        let pre_reads = if first {
            Vec::new()
        } else {
            let k = rng.between(0, 4);
            gen_reads(rng, &owners, me, k)
        };
        let mut ops: Vec<Op> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.writer == me)
            .map(|(i, _)| Op::Write(i))
            .collect();
        if !counters.is_empty() {
            for _ in 0..rng.between(0, 4) {
                let c = rng.below(counters.len());
                let mutex = c % MUTEXES;
                let set: Vec<usize> = (0..counters.len())
                    .filter(|&i| i % MUTEXES == mutex && (i == c || rng.percent(60)))
                    .collect();
                for &i in &set {
                    counter_totals[i][me] += 1;
                }
                ops.push(Op::Section {
                    mutex,
                    counters: set,
                });
            }
        }
        if !atomics.is_empty() {
            for _ in 0..rng.between(0, 4) {
                let word = rng.below(atomics.len());
                let kind = match rng.below(3) {
                    0 => AtomicKind::FetchAdd,
                    1 => AtomicKind::CasLoop,
                    _ => AtomicKind::Load,
                };
                if kind != AtomicKind::Load {
                    atomic_totals[word][me] += 1;
                }
                ops.push(Op::Atomic { word, kind });
            }
        }
        rng.shuffle(&mut ops);
        let k = rng.between(0, 3);
        let post_reads = gen_reads(rng, &owners, me, k);
        plans.push(Plan {
            pre_reads,
            ops,
            post_reads,
        });
    }
    Epoch {
        runs,
        counters,
        atomics,
        plans,
        counter_totals,
        atomic_totals,
    }
}

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(scenario) = std::env::var(SCENARIO) else {
        return;
    };
    let com: ShmCom<OsThreads> = join_job();
    let dsm = D::new(com).unwrap_or_else(|e| {
        eprintln!("cannot start the DSM: {e}");
        std::process::exit(3)
    });
    if scenario == "rewrite" {
        rewrite(&dsm);
        dsm.finalize().unwrap();
        return;
    }
    let (me, n) = (dsm.rank(), dsm.nprocs());
    assert!(n <= 64 / FIELD as usize, "at most 4 processes");
    let bases: Vec<*mut u8> = SEGMENTS
        .iter()
        .map(|&(size, bs)| dsm.alloc_segment(size, bs).unwrap())
        .collect();
    let mut ids = [0u8; 4 * MUTEXES];
    if me == 0 {
        for c in ids.chunks_mut(4) {
            c.copy_from_slice(&dsm.new_mutex().unwrap().0.to_le_bytes());
        }
    }
    dsm.com().broadcast(0, &mut ids).unwrap();
    let mutexes: Vec<DsmMutex> = ids
        .chunks(4)
        .map(|c| DsmMutex(u32::from_le_bytes(c.try_into().unwrap())))
        .collect();

    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let job_base = var(ENV_BASE).map_or(BASE_SEED, |s| parse_u64(&s));
    let seeds: Vec<u64> = match var(ENV_SEED) {
        Some(s) => vec![parse_u64(&s)],
        None => {
            let count = var(ENV_PROGRAMS).map_or(PROGRAMS_PER_JOB, |s| s.parse().unwrap());
            (0..count as u64).map(|i| mix(job_base ^ mix(i))).collect()
        }
    };
    let job_base = var(ENV_SEED).is_none().then_some(job_base);
    let cfg = dsm.config();
    let policy = format!(
        "{},{},{},{}",
        format!("{:?}", cfg.writer).to_lowercase(),
        format!("{:?}", cfg.invalidation).to_lowercase(),
        u8::from(cfg.fast_release),
        u8::from(cfg.fast_read)
    );
    let mut ctx = Ctx {
        dsm: &dsm,
        bases,
        mutexes,
        me,
        n,
        policy,
        inject: var(ENV_INJECT),
        job_base,
        corrupted: false,
        trace: var(ENV_TRACE).map(|t| {
            let v: Vec<usize> = t.split(':').map(|x| x.trim().parse().unwrap()).collect();
            assert!(
                v.len() >= 2 && v.len() <= 3,
                "{ENV_TRACE}=segment:offset[:length]"
            );
            (v[0], v[1], v.get(2).copied().unwrap_or(1))
        }),
        seed: 0,
        program: 0,
        epoch: 0,
        counts: Counts::default(),
    };
    let mut image = zero_image();
    let start = Instant::now();
    for (k, &seed) in seeds.iter().enumerate() {
        ctx.seed = seed;
        ctx.program = k;
        run_program(&mut ctx, &mut image);
    }
    let c = &ctx.counts;
    println!(
        "rank {me}: ok: {} programs, {} epochs, {} reads ({} bytes), {} writes ({} bytes), {} \
         mutex sections, {} atomics, in {:.2} s; {:?}",
        seeds.len(),
        c.epochs,
        c.reads,
        c.read_bytes,
        c.writes,
        c.write_bytes,
        c.sections,
        c.atomics,
        start.elapsed().as_secs_f64(),
        dsm.stats()
    );
    dsm.finalize().unwrap();
}

/// Iterations of [`rewrite`].
const REWRITE_ITERS: u32 = 1000;

/// The pattern the random programs found stale copies with, reduced: rank
/// 1 writes the same bytes of a block in two consecutive epochs; in the
/// second the others read *other* bytes of that block; after the barrier
/// everybody reads the rewritten bytes, and must see the second value.
fn rewrite(dsm: &D) {
    let me = dsm.rank();
    let bs = 16 * 1024;
    let p = dsm.alloc_segment(bs, bs).unwrap();
    let mut stale = 0;
    for it in 1..=REWRITE_ITERS {
        let v = (it % 100) as u8 * 2 + 1;
        for (k, value) in [v, v + 1].into_iter().enumerate() {
            if me == 1 {
                for i in 0..64 {
                    // SAFETY: bytes only rank 1 writes in this epoch.
                    unsafe { p.add(i).write(value) };
                }
            } else if k == 1 {
                // SAFETY: bytes nobody writes.
                let x = unsafe { p.add(8000).read() };
                assert_eq!(x, 0);
            }
            dsm.barrier().unwrap();
        }
        // SAFETY: written before the barrier.
        let got = unsafe { p.read() };
        if got != v + 1 {
            stale += 1;
            if stale <= 3 {
                println!(
                    "rank {me}: iteration {it}: read {got:#04x} after the barrier, expected \
                     {:#04x} (block state {:?})",
                    v + 1,
                    dsm.block_state(p)
                );
            }
        }
        dsm.barrier().unwrap();
    }
    println!("rank {me}: rewrite: {stale} stale reads in {REWRITE_ITERS} iterations");
}

fn parse_u64(s: &str) -> u64 {
    let s = s.trim();
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.unwrap_or_else(|_| panic!("{s:?} is not a 64-bit number"))
}

#[derive(Default)]
struct Counts {
    epochs: usize,
    reads: usize,
    read_bytes: usize,
    writes: usize,
    write_bytes: usize,
    sections: usize,
    atomics: usize,
}

struct Ctx<'a> {
    dsm: &'a D,
    bases: Vec<*mut u8>,
    mutexes: Vec<DsmMutex>,
    me: usize,
    n: usize,
    policy: String,
    inject: Option<String>,
    /// Base of the job's seeds (none when it runs one given seed).
    job_base: Option<u64>,
    corrupted: bool,
    trace: Option<(usize, usize, usize)>,
    seed: u64,
    program: usize,
    epoch: usize,
    counts: Counts,
}

impl Ctx<'_> {
    /// Ends this process with a report that allows a replay.
    fn fail(&self, what: &str) -> ! {
        let job = match self.job_base {
            Some(b) => format!(
                "\n  replay the job up to this program (if the program alone passes): \
                 {ENV_JOB_BASE}={b:#x} {ENV_PROGRAMS}={} {ENV_NPROCS}={} {ENV_POLICY}={} cargo \
                 test -p menps-dsm --test dsm_random replay_one_seed -- --nocapture",
                self.program + 1,
                self.n,
                self.policy
            ),
            None => String::new(),
        };
        panic!(
            "\nRANDOM DRF PROGRAM FAILED: seed {:#018x} (program {} of the job), {} processes, \
             policy {}, epoch {}, rank {}:\n  {what}\n  replay: {ENV_SEED}={:#x} {ENV_NPROCS}={} \
             {ENV_POLICY}={} cargo test -p menps-dsm --test dsm_random replay_one_seed -- \
             --nocapture{job}\n",
            self.seed,
            self.program,
            self.n,
            self.policy,
            self.epoch,
            self.me,
            self.seed,
            self.n,
            self.policy
        )
    }

    fn addr(&self, seg: usize, off: usize) -> *mut u8 {
        // SAFETY: `off` is inside segment `seg` (generated so).
        unsafe { self.bases[seg].add(off) }
    }

    fn barrier(&self) {
        self.dsm
            .barrier()
            .unwrap_or_else(|e| self.fail(&format!("DSM barrier failed: {e}")));
    }

    /// Reads `r` and compares it with `expect` (the whole segment).
    fn check_read(&mut self, r: &ReadOp, expect: &[u8], when: &str) {
        let p = self.addr(r.seg, r.off);
        let mut got = vec![0u8; r.len];
        // In every branch, `[p, p + len)` is DSM memory inside the segment
        // that nobody else writes in this epoch (the program is
        // data-race-free); faults are resolved by the DSM.
        match r.style {
            ReadStyle::Bytes => {
                for (i, g) in got.iter_mut().enumerate() {
                    // SAFETY: see above; `i < len`.
                    *g = unsafe { p.add(i).read() };
                }
            }
            ReadStyle::Words => {
                let words = r.len / 8;
                for i in 0..words {
                    // SAFETY: see above; `8 i + 8 <= len`.
                    let v = unsafe { p.add(8 * i).cast::<u64>().read_unaligned() };
                    got[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
                }
                for (i, g) in got.iter_mut().enumerate().skip(8 * words) {
                    // SAFETY: see above; `i < len`.
                    *g = unsafe { p.add(i).read() };
                }
            }
            // SAFETY: see above; `got` has `len` bytes.
            ReadStyle::Memcpy => unsafe {
                core::ptr::copy_nonoverlapping(p.cast_const(), got.as_mut_ptr(), r.len);
            },
        }
        self.counts.reads += 1;
        self.counts.read_bytes += r.len;
        let want = &expect[r.off..r.off + r.len];
        if got != want {
            self.fail(&self.mismatch(r, want, &got, when));
        }
    }

    fn mismatch(&self, r: &ReadOp, want: &[u8], got: &[u8], when: &str) -> String {
        let bad: Vec<usize> = (0..want.len()).filter(|&i| want[i] != got[i]).collect();
        let i = bad[0];
        let off = r.off + i;
        let (size, bs) = SEGMENTS[r.seg];
        let addr = self.addr(r.seg, off);
        let lo = i.saturating_sub(4);
        let hi = (i + 12).min(want.len());
        format!(
            "{when}: {:?} read of segment {} ({} KiB, {} KiB blocks) bytes {}..{}: {} of {} bytes \
             differ; first at offset {off} (address {addr:p}, block {}, state {:?}): expected \
             {:#04x}, got {:#04x}; bytes {}..{} expected {:02x?} got {:02x?}",
            r.style,
            r.seg,
            size >> 10,
            bs >> 10,
            r.off,
            r.off + r.len,
            bad.len(),
            want.len(),
            off / bs,
            self.dsm.block_state(addr),
            want[i],
            got[i],
            r.off + lo,
            r.off + hi,
            &want[lo..hi],
            &got[lo..hi],
        )
    }

    fn write(&mut self, run: &Run) {
        let p = self.addr(run.seg, run.off);
        let d = &run.data;
        // In every branch, `[p, p + len)` is DSM memory inside the segment
        // that only this process writes in this epoch, and nobody else
        // reads (disjoint writers); faults are resolved by the DSM.
        match run.style {
            WriteStyle::Bytes => {
                for (i, &b) in d.iter().enumerate() {
                    // SAFETY: see above; `i < len`.
                    unsafe { p.add(i).write(b) };
                }
            }
            WriteStyle::Words => {
                let words = d.len() / 8;
                for i in 0..words {
                    let v = u64::from_le_bytes(d[8 * i..8 * i + 8].try_into().unwrap());
                    // SAFETY: see above; `8 i + 8 <= len`.
                    unsafe { p.add(8 * i).cast::<u64>().write_unaligned(v) };
                }
                for (i, &b) in d.iter().enumerate().skip(8 * words) {
                    // SAFETY: see above; `i < len`.
                    unsafe { p.add(i).write(b) };
                }
            }
            // SAFETY: see above; `d` has `len` bytes.
            WriteStyle::Memcpy => unsafe {
                core::ptr::copy_nonoverlapping(d.as_ptr(), p, d.len());
            },
            WriteStyle::Sparse => {
                for (i, &b) in d.iter().enumerate() {
                    if run.mask[i] {
                        // SAFETY: see above; `i < len`.
                        unsafe { p.add(i).write(b) };
                    }
                }
            }
        }
        self.counts.writes += 1;
        self.counts.write_bytes += d.len();
    }

    /// Checks a value of a counter or atomic word seen by this process:
    /// its own field must be exactly `mine`, every field at most its
    /// process's total in the epoch.
    fn check_word(&self, what: &str, w: Word, v: u64, pre: u64, mine: u64, totals: &[u64]) {
        let diff = v.wrapping_sub(pre);
        let field = |q: usize| (diff >> (FIELD * q as u32)) & ((1 << FIELD) - 1);
        let fields: Vec<u64> = (0..self.n).map(field).collect();
        let high = if self.n * (FIELD as usize) < 64 {
            diff >> (FIELD as usize * self.n)
        } else {
            0
        };
        let bad =
            fields[self.me] != mine || fields.iter().zip(totals).any(|(f, t)| f > t) || high != 0;
        if bad {
            self.fail(&format!(
                "{what} at segment {} offset {} (address {:p}): value {v:#018x}, {pre:#018x} \
                 before the epoch: increments seen per process {fields:?} (high bits \
                 {high:#x}), but this process made {mine} so far and the totals of the epoch \
                 are {totals:?}",
                w.seg,
                w.off,
                self.addr(w.seg, w.off)
            ));
        }
    }
}

/// Prints what epoch `e` does to the bytes `t = (segment, offset, len)`.
fn trace(t: &(usize, usize, usize), program: usize, e: usize, ep: &Epoch, pre: &Image) {
    let &(seg, off, len) = t;
    let hit = |a: usize, b: usize| a < off + len && off < b;
    let mut what = vec![format!("byte {off} before {:#04x}", pre[seg][off])];
    for r in &ep.runs {
        if r.seg == seg && hit(r.off, r.off + r.data.len()) {
            let stores = if (r.off..r.off + r.data.len()).contains(&off)
                && (r.style != WriteStyle::Sparse || r.mask[off - r.off])
            {
                format!(", stores {:#04x} at {off}", r.data[off - r.off])
            } else {
                String::new()
            };
            what.push(format!(
                "rank {} writes {:?} {}..{}{stores}",
                r.writer,
                r.style,
                r.off,
                r.off + r.data.len(),
            ));
        }
    }
    for (kind, words) in [("counter", &ep.counters), ("atomic word", &ep.atomics)] {
        for (i, w) in words.iter().enumerate() {
            if w.seg == seg && hit(w.off, w.off + 8) {
                let totals = if kind == "counter" {
                    &ep.counter_totals[i]
                } else {
                    &ep.atomic_totals[i]
                };
                what.push(format!("{kind} {i} at {}: increments {totals:?}", w.off));
            }
        }
    }
    for (q, plan) in ep.plans.iter().enumerate() {
        for (when, reads) in [("before", &plan.pre_reads), ("after", &plan.post_reads)] {
            for r in reads.iter() {
                if r.seg == seg && hit(r.off, r.off + r.len) {
                    what.push(format!(
                        "rank {q} reads {when} its writes {:?} {}..{}",
                        r.style,
                        r.off,
                        r.off + r.len
                    ));
                }
            }
        }
    }
    println!(
        "trace {seg}:{off}:{len} program {program} epoch {e}: {}",
        what.join("; ")
    );
}

/// Runs one program from `ctx.seed`; `image` holds the contents before it
/// and gets the contents after it.
fn run_program(ctx: &mut Ctx<'_>, image: &mut Image) {
    let mut rng = Rng::new(ctx.seed);
    let epochs = 1 + rng.between(2, 6);
    let mut prev = None;
    let inject_here = ctx.program == 0;
    for e in 0..epochs {
        ctx.epoch = e;
        let ep = gen_epoch(&mut rng, ctx.n, image, e == 0, &mut prev);
        if ctx.me == 0
            && let Some(t) = &ctx.trace
        {
            trace(t, ctx.program, e, &ep, image);
        }
        // The model after the plain writes of the epoch.
        let mut post = image.clone();
        for r in &ep.runs {
            post[r.seg][r.off..r.off + r.data.len()].copy_from_slice(&r.data);
        }
        let me = ctx.me;
        let plan = &ep.plans[me];
        for r in &plan.pre_reads {
            ctx.check_read(r, &image[r.seg], "before this process's writes");
        }
        let mut done_counter = vec![0u64; ep.counters.len()];
        let mut done_atomic = vec![0u64; ep.atomics.len()];
        let delta = delta_of(me);
        for op in &plan.ops {
            match op {
                Op::Write(i) => ctx.write(&ep.runs[*i]),
                Op::Section { mutex, counters } => {
                    let g = ctx
                        .dsm
                        .lock(ctx.mutexes[*mutex])
                        .unwrap_or_else(|err| ctx.fail(&format!("DSM lock failed: {err}")));
                    for &c in counters {
                        let w = ep.counters[c];
                        let p = ctx.addr(w.seg, w.off).cast::<u64>();
                        // SAFETY: a counter: DSM memory accessed only under
                        // its mutex in this epoch.
                        let v = unsafe { p.read_unaligned() };
                        ctx.check_word(
                            "counter (read under its mutex)",
                            w,
                            v,
                            word_at(image, w),
                            done_counter[c],
                            &ep.counter_totals[c],
                        );
                        // SAFETY: as above.
                        unsafe { p.write_unaligned(v.wrapping_add(delta)) };
                        done_counter[c] += 1;
                    }
                    g.unlock()
                        .unwrap_or_else(|err| ctx.fail(&format!("DSM unlock failed: {err}")));
                    ctx.counts.sections += 1;
                }
                Op::Atomic { word, kind } => {
                    let w = ep.atomics[*word];
                    let p = ctx.addr(w.seg, w.off).cast::<u64>();
                    let pre = word_at(image, w);
                    let totals = &ep.atomic_totals[*word];
                    let dsm_err =
                        |what: &str, err| -> ! { ctx.fail(&format!("DSM {what} failed: {err}")) };
                    match kind {
                        AtomicKind::FetchAdd => {
                            let old = ctx
                                .dsm
                                .fetch_add(p, delta)
                                .unwrap_or_else(|err| dsm_err("fetch_add", err));
                            ctx.check_word(
                                "fetch_add result",
                                w,
                                old,
                                pre,
                                done_atomic[*word],
                                totals,
                            );
                        }
                        AtomicKind::CasLoop => {
                            let mut cur = ctx
                                .dsm
                                .load_acquire(p)
                                .unwrap_or_else(|err| dsm_err("load_acquire", err));
                            loop {
                                ctx.check_word(
                                    "value before compare_exchange",
                                    w,
                                    cur,
                                    pre,
                                    done_atomic[*word],
                                    totals,
                                );
                                match ctx
                                    .dsm
                                    .compare_exchange(p, cur, cur.wrapping_add(delta))
                                    .unwrap_or_else(|err| dsm_err("compare_exchange", err))
                                {
                                    Ok(_) => break,
                                    Err(actual) => cur = actual,
                                }
                            }
                        }
                        AtomicKind::Load => {
                            let v = ctx
                                .dsm
                                .load_acquire(p)
                                .unwrap_or_else(|err| dsm_err("load_acquire", err));
                            ctx.check_word(
                                "load_acquire result",
                                w,
                                v,
                                pre,
                                done_atomic[*word],
                                totals,
                            );
                        }
                    }
                    if *kind != AtomicKind::Load {
                        done_atomic[*word] += 1;
                    }
                    ctx.counts.atomics += 1;
                }
            }
        }
        if !ctx.corrupted
            && e == epochs - 1
            && me == ctx.n - 1
            && ctx.inject.as_deref() == Some("corrupt")
            && let Some(r) = ep.runs.iter().find(|r| r.writer == me)
        {
            // A wrong value in a byte this process owns, in the last epoch
            // of the first program where it writes: the final check must
            // notice.
            let p = ctx.addr(r.seg, r.off);
            // SAFETY: a byte only this process writes in this epoch.
            unsafe { p.write(r.data[0] ^ 0x5a) };
            ctx.corrupted = true;
            println!(
                "rank {me}: injected a corrupted byte at segment {} offset {} in epoch {e}",
                r.seg, r.off
            );
        }
        for r in &plan.post_reads {
            ctx.check_read(r, &post[r.seg], "after this process's writes");
        }
        // Counters and atomic words: the sum of every process's increments.
        for (c, &w) in ep.counters.iter().enumerate() {
            let total: u64 = (0..ctx.n)
                .map(|q| ep.counter_totals[c][q] * delta_of(q))
                .sum();
            add_to_word(&mut post, w, total);
        }
        for (a, &w) in ep.atomics.iter().enumerate() {
            let total: u64 = (0..ctx.n)
                .map(|q| ep.atomic_totals[a][q] * delta_of(q))
                .sum();
            add_to_word(&mut post, w, total);
        }
        drop(ep);
        if inject_here && e == epochs - 1 && ctx.inject.as_deref() == Some("skip_barrier") {
            // Synchronise without the DSM: no release, no acquire.
            println!("rank {me}: injected: epoch {e} ends without a DSM barrier");
            ctx.dsm
                .com()
                .barrier()
                .unwrap_or_else(|err| ctx.fail(&format!("barrier failed: {err}")));
        } else {
            ctx.barrier();
        }
        *image = post;
        ctx.counts.epochs += 1;
    }
    // The full contents.
    ctx.epoch = epochs;
    for (seg, &(size, _)) in SEGMENTS.iter().enumerate() {
        let r = ReadOp {
            seg,
            off: 0,
            len: size,
            style: ReadStyle::Memcpy,
        };
        ctx.check_read(&r, &image[seg], "final contents (after the last barrier)");
    }
    // Nobody writes the next program's data before everyone checked.
    ctx.barrier();
}

// ---------------------------------------------------------------------------
// The driver side.

/// The policy combinations (as in `tests/dsm.rs`): writer, invalidation,
/// fast release and fast read.
const POLICIES: [(&str, &str, &str); 8] = DSM_POLICIES;

/// A policy: writer, invalidation, fast release, fast read.
type Policy<'a> = (&'a str, &'a str, &'a str, &'a str);

fn policy4(p: (&'static str, &'static str, &'static str)) -> Policy<'static> {
    let (release, read) = common::fast_paths(p.2);
    (p.0, p.1, release, read)
}

fn job(nprocs: usize, policy: Policy<'_>, env: &[(&str, String)]) -> JobRun {
    job_of("random", nprocs, policy, env)
}

fn job_of(scenario: &str, nprocs: usize, policy: Policy<'_>, env: &[(&str, String)]) -> JobRun {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", nprocs.to_string())
        .env("MENPS_DSM_WRITER", policy.0)
        .env("MENPS_DSM_INVALIDATION", policy.1)
        .env("MENPS_DSM_FAST_RELEASE", policy.2)
        .env("MENPS_DSM_FAST_READ", policy.3);
    for (k, v) in env {
        cmd.env(k, v);
    }
    drive(cmd, &new_tag("random"), |_, _| false)
}

/// Number of programs every rank of `run` reports.
fn programs_ran(run: &JobRun, n: usize, what: &str) -> usize {
    assert!(run.status.success(), "{what}: {}", run.dump());
    let mut programs = None;
    for r in 0..n {
        let prefix = format!("rank {r}: ok: ");
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("{what}: rank {r} did not finish: {}", run.dump()));
        let k: usize = line[prefix.len()..]
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap();
        assert!(
            programs.is_none_or(|p| p == k),
            "{what}: ranks ran different numbers of programs"
        );
        programs = Some(k);
    }
    programs.unwrap()
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// Every policy with `n` processes, [`PROGRAMS_PER_JOB`] programs each.
fn random_programs(n: usize) {
    let base = var(ENV_BASE).map_or(BASE_SEED, |s| parse_u64(&s));
    let programs = var(ENV_PROGRAMS).unwrap_or_else(|| PROGRAMS_PER_JOB.to_string());
    let start = Instant::now();
    let mut total = 0;
    for (i, &pol) in POLICIES.iter().enumerate() {
        let job_base = mix(base ^ ((n as u64) << 32) ^ ((i as u64) << 40));
        let run = job(
            n,
            policy4(pol),
            &[
                (ENV_BASE, format!("{job_base:#x}")),
                (ENV_PROGRAMS, programs.clone()),
            ],
        );
        let what = format!("random programs with {n} processes under {pol:?} (base {job_base:#x})");
        total += programs_ran(&run, n, &what);
        let summary = run.stdout.lines().find(|l| l.starts_with("rank 0: ok: "));
        eprintln!(
            "{what}: ok in {:.2} s\n  {}",
            run.elapsed.as_secs_f64(),
            summary.unwrap_or_default()
        );
    }
    eprintln!(
        "{total} random data-race-free programs with {n} processes under {} policies in {:.1} s",
        POLICIES.len(),
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn random_drf_programs_2_procs() {
    random_programs(2);
}

#[test]
fn random_drf_programs_3_procs() {
    random_programs(3);
}

#[test]
fn random_drf_programs_4_procs() {
    random_programs(4);
}

/// Replays `MENPS_RAND_SEED`, or the job of base `MENPS_RAND_JOB_BASE` (a
/// no-op without either).
#[test]
fn replay_one_seed() {
    let what = match (var(ENV_SEED), var(ENV_JOB_BASE)) {
        (Some(seed), _) => (ENV_SEED, seed),
        (None, Some(base)) => (ENV_BASE, base),
        (None, None) => return,
    };
    let seed = format!("{}={}", what.0, what.1);
    let procs: Vec<usize> = match var(ENV_NPROCS) {
        Some(s) => vec![s.trim().parse().unwrap()],
        None => vec![2, 3, 4],
    };
    let policies: Vec<Vec<String>> = match var(ENV_POLICY) {
        Some(s) => {
            let mut p: Vec<String> = s.split(',').map(|w| w.trim().to_string()).collect();
            assert!(
                p.len() == 3 || p.len() == 4,
                "{ENV_POLICY}=writer,invalidation,fast_release[,fast_read]"
            );
            if p.len() == 3 {
                p.push(p[2].clone());
            }
            vec![p]
        }
        None => POLICIES
            .iter()
            .map(|&p| {
                let q = policy4(p);
                vec![q.0.into(), q.1.into(), q.2.into(), q.3.into()]
            })
            .collect(),
    };
    for &n in &procs {
        for p in &policies {
            let pol = (p[0].as_str(), p[1].as_str(), p[2].as_str(), p[3].as_str());
            let mut env = vec![(what.0, what.1.clone())];
            env.extend(var(ENV_TRACE).map(|t| (ENV_TRACE, t)));
            env.extend(var(ENV_PROGRAMS).map(|t| (ENV_PROGRAMS, t)));
            let run = job(n, pol, &env);
            // The trace, and every rank's summary (its protocol counters).
            for l in run
                .stdout
                .lines()
                .filter(|l| l.starts_with("trace ") || l.contains(": ok: "))
            {
                eprintln!("{l}");
            }
            programs_ran(
                &run,
                n,
                &format!("seed {seed} with {n} processes under {pol:?}"),
            );
            eprintln!("seed {seed} with {n} processes under {pol:?}: ok");
        }
    }
}

/// The first failure report of a job (two lines).
fn first_report(run: &JobRun) -> String {
    let mut lines = run.stderr.lines();
    match lines.find(|l| l.starts_with("RANDOM DRF PROGRAM FAILED")) {
        Some(l) => format!("{l}\n  {}", lines.next().unwrap_or_default().trim()),
        None => String::new(),
    }
}

/// The checker catches a wrong byte: rank 2 of 3 corrupts one byte it owns.
#[test]
fn checker_detects_a_corrupted_byte() {
    for &pol in &[POLICIES[0], POLICIES[7]] {
        let run = job(
            3,
            policy4(pol),
            &[(ENV_INJECT, "corrupt".into()), (ENV_PROGRAMS, "3".into())],
        );
        assert!(
            run.stdout.contains("injected a corrupted byte"),
            "{}",
            run.dump()
        );
        assert!(
            !run.status.success(),
            "corruption not detected: {}",
            run.dump()
        );
        assert!(
            run.stderr.contains("RANDOM DRF PROGRAM FAILED: seed 0x")
                && run.stderr.contains("differ; first at offset")
                && run.stderr.contains("replay: MENPS_RAND_SEED=0x"),
            "no report of the corruption: {}",
            run.dump()
        );
        eprintln!("{pol:?}: {}", first_report(&run));
    }
}

/// The checker catches stale data: the last epoch of the first program
/// ends with a plain barrier of the communication layer instead of a DSM
/// barrier, so the final check runs without the release and the acquire.
#[test]
fn checker_detects_a_missing_dsm_barrier() {
    for &pol in &POLICIES {
        let run = job(
            3,
            policy4(pol),
            &[
                (ENV_INJECT, "skip_barrier".into()),
                (ENV_PROGRAMS, "2".into()),
            ],
        );
        assert!(
            run.stdout.contains("without a DSM barrier"),
            "{}",
            run.dump()
        );
        assert!(
            !run.status.success(),
            "missing barrier not detected under {pol:?}: {}",
            run.dump()
        );
        assert!(
            run.stderr.contains("RANDOM DRF PROGRAM FAILED: seed 0x"),
            "no report under {pol:?}: {}",
            run.dump()
        );
        eprintln!("{pol:?}: {}", first_report(&run));
    }
}

/// The reduced form of the stale copies the random programs find with the
/// floating home (see [`rewrite`]), with 4 processes under every policy.
#[test]
fn rewritten_block_is_never_stale_after_a_barrier() {
    let mut bad = Vec::new();
    for &pol in &POLICIES {
        let run = job_of("rewrite", 4, policy4(pol), &[]);
        assert!(run.status.success(), "{pol:?}: {}", run.dump());
        for r in 0..4 {
            let want = format!("rank {r}: rewrite: 0 stale reads");
            if !run.stdout.contains(&want) {
                bad.push(format!("{pol:?}:\n{}", run.stdout));
                break;
            }
        }
    }
    assert!(bad.is_empty(), "stale reads:\n{}", bad.join("\n"));
}

/// The generator itself (no DSM): every epoch's writers are disjoint,
/// counters and atomic words are nobody's plain bytes, every read avoids
/// the bytes others write, and epoch 0 rewrites everything.
#[test]
fn generated_programs_are_data_race_free() {
    for n in 2..=4 {
        for k in 0..60u64 {
            let mut rng = Rng::new(mix(0xd1f ^ mix(k) ^ ((n as u64) << 40)));
            let epochs = 1 + rng.between(2, 6);
            let mut prev = None;
            let mut image = zero_image();
            for e in 0..epochs {
                let ep = gen_epoch(&mut rng, n, &image, e == 0, &mut prev);
                let mut owner: Vec<Vec<u8>> =
                    SEGMENTS.iter().map(|&(size, _)| vec![FREE; size]).collect();
                for r in &ep.runs {
                    assert!(r.writer < n);
                    for b in &mut owner[r.seg][r.off..r.off + r.data.len()] {
                        assert_eq!(*b, FREE, "program {k} epoch {e}: two writers");
                        *b = r.writer as u8;
                    }
                    image[r.seg][r.off..r.off + r.data.len()].copy_from_slice(&r.data);
                }
                if e == 0 {
                    assert!(owner.iter().flatten().all(|&o| o != FREE));
                    assert!(ep.counters.is_empty() && ep.atomics.is_empty());
                }
                for w in ep.counters.iter().chain(&ep.atomics) {
                    for b in &mut owner[w.seg][w.off..w.off + 8] {
                        assert_eq!(*b, FREE, "program {k} epoch {e}: special word shared");
                        *b = SPECIAL;
                    }
                }
                assert!(ep.atomics.iter().all(|w| w.off % 8 == 0));
                for (q, plan) in ep.plans.iter().enumerate() {
                    for r in plan.pre_reads.iter().chain(&plan.post_reads) {
                        assert!(r.len > 0);
                        for &o in &owner[r.seg][r.off..r.off + r.len] {
                            assert!(
                                o == FREE || o == q as u8,
                                "program {k} epoch {e}: rank {q} reads bytes of {o}"
                            );
                        }
                    }
                }
            }
        }
    }
}
