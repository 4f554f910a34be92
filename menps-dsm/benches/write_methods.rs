//! `write-methods`: how to write the modified bytes of one DSM block back to
//! its home (Endo 2020 §3.2, Figure 3.1). One 32 KiB block, of which x
//! random bytes were modified since its twin was taken, is written to rank
//! 1's window on the shm backend as
//!
//! - `whole-block`: the whole block in one RMA write (ContiguousWrite; needs
//!   no twin);
//! - `per-run`: the runs of changed bytes, found by comparing the block with
//!   its twin, each in its own RMA write (DiscontiguousWrite, as Argo does);
//! - `packed-diff`: the same runs packed as (offset, length, bytes) records
//!   into a message, which rank 1 unpacks into its window before it
//!   acknowledges (PackDiff, as TreadMarks does);
//!
//! and, as the floor of the twin-based methods, `scan-only`: finding the runs
//! without sending anything. The time of a method includes finding the
//! changes (a word-wide XOR of block and twin) and ends when the data is in
//! place at the target: for RMA when the writes complete, for the packed diff
//! when rank 1's acknowledgement arrives. Setting up the modification and
//! refreshing the twin afterwards are not timed. With nothing changed (x =
//! 0), the twin-based methods find no run and send nothing.
//!
//! Rank 1 polls for packed diffs all along (also while rank 0 uses RMA), as
//! a home with a core of its own would.
//!
//! The modified bytes are `scattered` (x distinct random positions) or
//! `clustered` (random aligned runs of --run-len bytes). Every write is
//! checked by reading the target block back (untimed); the run finder is
//! checked against a byte-by-byte one at start-up.
//!
//! Output: JSON lines on stdout (rank 0), progress on stderr.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ct_bench::{Args, Param, Stats, emit};
use ct_worker::OsThreads;
use menps_dsm::com::{
    Coll, Comm, LocalWindow, P2p, RemotePtr, Rma, RmaRequest, ShmCom, Source, Windows,
};

const HELP: &str = "\
write-methods [--sizes 0,8,64,512,4096,32768] [--patterns clustered,scattered]
              [--block 32768] [--run-len 64] [--runs 7] [--run-ms 20]
              [--methods whole-block,per-run,packed-diff,scan-only]

Starts a job of 2 processes by itself (shm backend). Rank 0 holds a block of
--block bytes (the seed's 32 KiB) and its twin, modifies x bytes (each of
--sizes) and writes the block back to rank 1's window:
  whole-block   one RMA write of the whole block;
  per-run       twin comparison, then one RMA write per run of changed bytes;
  packed-diff   twin comparison, runs packed as offset/length/bytes records in
                one message (split only beyond the 64 KiB message limit),
                unpacked by rank 1, which acknowledges;
  scan-only     the twin comparison alone (no communication).
Patterns: scattered = x random distinct bytes; clustered = x bytes in random
aligned runs of --run-len bytes. ns per write-back (find + send + in place at
the target), averaged over one run of --run-ms; one warm-up, then --runs runs;
min/median/max. Every write-back is verified by reading the target back.
Defaults take about 10 s.";

/// Tag of the packed-diff messages to rank 1 (an empty one ends the server).
const TAG_DIFF: u32 = 0x5744;
/// Tag of rank 1's acknowledgements.
const TAG_ACK: u32 = 0x5745;
/// First byte of a diff message: more messages of the same diff follow.
const MORE: u8 = 0;
/// First byte of a diff message: the last message of a diff.
const LAST: u8 = 1;
/// Bytes of a packed record's header: offset and length − 1, both u16 LE.
const RECORD_HEADER: usize = 4;

type Com = ShmCom<OsThreads>;

/// A run of changed bytes, `start..end`.
type Run = (usize, usize);

// ---------------------------------------------------------------------------
// Finding the changes: word-wide XOR of block and twin.

/// `0x7f` in every byte.
const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
/// `0x80` in every byte.
const HI: u64 = !LO7;

/// Bit 7 of each byte of `x` set iff the byte is non-zero (adding 0x7f to
/// the low seven bits carries into bit 7 unless they are all zero; no carry
/// crosses a byte).
#[inline(always)]
fn nonzero_hi(x: u64) -> u64 {
    (((x & LO7) + LO7) | x) & HI
}

/// Bit `i` set iff bit `8i + 7` of `hi` is (for `hi` from [`nonzero_hi`]).
#[inline(always)]
fn gather_hi(hi: u64) -> u64 {
    // The multiplier moves bit 8i of `hi >> 7` to bit 56 + i, and no two
    // partial products meet (so there are no carries).
    (hi >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

/// Bit `i` set iff byte `i` (little-endian order) of `x` is non-zero.
fn nonzero_bytes(x: u64) -> u64 {
    gather_hi(nonzero_hi(x))
}

/// Loads the 8 bytes at `i` of `a` and `b` and XORs them.
#[inline(always)]
fn xor_word(a: &[u8], b: &[u8], i: usize) -> u64 {
    let x = u64::from_le_bytes(a[i..i + 8].try_into().expect("8 bytes"));
    let y = u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    x ^ y
}

/// Extends the runs with the bytes at `base..base + 64` whose changed-byte
/// mask is `mask` (bit `b` for byte `base + b`); `open` is the start of the
/// run still open, if any. Costs one step per run boundary.
#[inline(always)]
fn mask_runs(mask: u64, base: usize, open: &mut Option<usize>, runs: &mut Vec<Run>) {
    // Bit b of `prev`: byte b - 1 changed (bit 0: the run open before).
    let prev = (mask << 1) | u64::from(open.is_some());
    let mut starts = mask & !prev;
    let mut ends = !mask & prev;
    // Starts and ends alternate, beginning with an end if a run is open.
    loop {
        if let Some(s) = *open {
            if ends == 0 {
                return;
            }
            runs.push((s, base + ends.trailing_zeros() as usize));
            ends &= ends - 1;
            *open = None;
        } else {
            if starts == 0 {
                return;
            }
            *open = Some(base + starts.trailing_zeros() as usize);
            starts &= starts - 1;
        }
    }
}

/// Appends to `runs` the maximal runs of bytes where `data` differs from
/// `twin`, scanning 64 bytes at a time: eight XORed words; a chunk with no
/// change, or with every byte changed, costs a few word operations; other
/// chunks get a 64-bit changed-byte mask whose run boundaries are found with
/// bit operations, one step per boundary.
fn find_runs(twin: &[u8], data: &[u8], runs: &mut Vec<Run>) {
    assert_eq!(twin.len(), data.len(), "block and twin differ in size");
    let n = data.len();
    let mut open = None;
    let mut i = 0;
    while i + 64 <= n {
        let x: [u64; 8] = core::array::from_fn(|k| xor_word(twin, data, i + 8 * k));
        if x.iter().fold(0, |a, &w| a | w) == 0 {
            if let Some(s) = open.take() {
                runs.push((s, i));
            }
        } else {
            let hi: [u64; 8] = x.map(nonzero_hi);
            if hi.iter().fold(HI, |a, &h| a & h) == HI {
                open.get_or_insert(i);
            } else {
                let mask = hi
                    .iter()
                    .enumerate()
                    .fold(0, |m, (k, &h)| m | (gather_hi(h) << (8 * k)));
                mask_runs(mask, i, &mut open, runs);
            }
        }
        i += 64;
    }
    if i < n {
        // The tail: bytes beyond the block count as unchanged, which closes
        // a run that reaches the end at `n`.
        let mask = (i..n).fold(0u64, |m, j| m | (u64::from(twin[j] != data[j]) << (j - i)));
        mask_runs(mask, i, &mut open, runs);
    }
    if let Some(s) = open {
        runs.push((s, n));
    }
}

/// Byte-by-byte reference of [`find_runs`], for the self-check.
fn find_runs_naive(twin: &[u8], data: &[u8]) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut open = None;
    for (j, (a, b)) in twin.iter().zip(data).enumerate() {
        match (a != b, open) {
            (true, None) => open = Some(j),
            (false, Some(s)) => {
                runs.push((s, j));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(s) = open {
        runs.push((s, data.len()));
    }
    runs
}

// ---------------------------------------------------------------------------
// Packed diffs: records of (offset u16, length − 1 u16, bytes), split into
// messages of at most `max` bytes, each starting with MORE or LAST.

/// Packs the `runs` of `data` into `out`; `ends` receives the end offset of
/// each message within `out`. A run that does not fit in the current message
/// continues in the next.
fn pack(runs: &[Run], data: &[u8], max: usize, out: &mut Vec<u8>, ends: &mut Vec<usize>) {
    assert!(max > 1 + RECORD_HEADER, "messages too small for a record");
    out.clear();
    ends.clear();
    let mut msg_start = 0;
    out.push(MORE);
    for &(mut s, e) in runs {
        while s < e {
            let room = max - (out.len() - msg_start);
            if room <= RECORD_HEADER {
                ends.push(out.len());
                msg_start = out.len();
                out.push(MORE);
                continue;
            }
            let len = (e - s).min(room - RECORD_HEADER).min(1 << 16);
            out.extend_from_slice(&(s as u16).to_le_bytes());
            out.extend_from_slice(&((len - 1) as u16).to_le_bytes());
            out.extend_from_slice(&data[s..s + len]);
            s += len;
        }
    }
    ends.push(out.len());
    out[msg_start] = LAST;
}

/// Applies the records of one diff message (without its first byte) to
/// `block`.
fn unpack(mut records: &[u8], block: &mut [u8]) {
    while !records.is_empty() {
        let off = usize::from(u16::from_le_bytes([records[0], records[1]]));
        let len = usize::from(u16::from_le_bytes([records[2], records[3]])) + 1;
        let bytes = &records[RECORD_HEADER..RECORD_HEADER + len];
        block[off..off + len].copy_from_slice(bytes);
        records = &records[RECORD_HEADER + len..];
    }
}

/// Rank 1: applies packed diffs to its part of the window until an empty
/// message arrives, acknowledging each complete diff. It polls all along,
/// like the message handler of a DSM home with a core of its own, so that the
/// packed diff is not charged the wake-up of a sleeping process; after a
/// while without messages it also yields its core between polls, in case
/// the machine has fewer free cores than processes.
fn serve_diffs(com: &Com, local: LocalWindow, block: usize) {
    let mut idle = 0u32;
    loop {
        let msg = match com.try_recv(Source::Rank(0), TAG_DIFF) {
            Ok(Some((_, msg))) => msg,
            Ok(None) => {
                idle = idle.saturating_add(1);
                if idle < 256 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            Err(e) => fail(&format!("recv: {e}")),
        };
        idle = 0;
        if msg.is_empty() {
            return;
        }
        // SAFETY: while a diff is in flight, rank 0 only waits for our
        // acknowledgement, and nobody else accesses the window: we are its
        // only user until we acknowledge.
        let dst = unsafe { &mut local.as_mut_slice()[..block] };
        unpack(&msg[1..], dst);
        if msg[0] == LAST {
            com.send(0, TAG_ACK, &[])
                .unwrap_or_else(|e| fail(&format!("send: {e}")));
        }
    }
}

// ---------------------------------------------------------------------------
// Modifications.

/// xorshift64*: a small deterministic generator (no dependency needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Clustered,
    Scattered,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Clustered => "clustered",
            Pattern::Scattered => "scattered",
        }
    }
}

/// `k` distinct random numbers below `n` (partial Fisher–Yates).
fn choose(rng: &mut Rng, n: usize, k: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    for i in 0..k.min(n) {
        let j = i + rng.below(n - i);
        all.swap(i, j);
    }
    all.truncate(k.min(n));
    all
}

/// One modification: positions and the non-zero values XORed into them.
struct Modification {
    positions: Vec<usize>,
    xors: Vec<u8>,
}

/// A modification of `x` bytes of a `block`-byte block.
fn modification(rng: &mut Rng, p: Pattern, block: usize, x: usize, run_len: usize) -> Modification {
    let x = x.min(block);
    let positions = match p {
        Pattern::Scattered => choose(rng, block, x),
        Pattern::Clustered => {
            let run_len = run_len.clamp(1, block);
            let slots = block / run_len;
            let full = x / run_len;
            let mut pos: Vec<usize> = Vec::with_capacity(x);
            let chosen = choose(rng, slots, full + usize::from(!x.is_multiple_of(run_len)));
            for (i, &slot) in chosen.iter().enumerate() {
                let len = if i < full { run_len } else { x % run_len };
                pos.extend(slot * run_len..slot * run_len + len);
            }
            pos
        }
    };
    let xors = positions.iter().map(|_| (rng.next() as u8) | 1).collect();
    Modification { positions, xors }
}

// ---------------------------------------------------------------------------
// The measurement.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    WholeBlock,
    PerRun,
    PackedDiff,
    ScanOnly,
}

impl Method {
    const ALL: [Method; 4] = [
        Method::WholeBlock,
        Method::PerRun,
        Method::PackedDiff,
        Method::ScanOnly,
    ];

    fn name(self) -> &'static str {
        match self {
            Method::WholeBlock => "whole-block",
            Method::PerRun => "per-run",
            Method::PackedDiff => "packed-diff",
            Method::ScanOnly => "scan-only",
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("write-methods: check failed: {msg}");
    std::process::exit(1)
}

/// Rank 0's block, twin and reusable buffers.
struct Writer<'a> {
    com: &'a Com,
    /// The block at rank 1.
    dst: RemotePtr,
    data: Vec<u8>,
    twin: Vec<u8>,
    runs: Vec<Run>,
    packed: Vec<u8>,
    ends: Vec<usize>,
    reqs: Vec<<Com as Rma>::Request>,
    check: Vec<u8>,
    /// Runs found over `seen_twin_based` twin-based write-backs, and bytes
    /// packed over `seen_packs` packed diffs (for the stderr summary).
    seen_runs: usize,
    seen_twin_based: usize,
    seen_packed: usize,
    seen_packs: usize,
}

impl Writer<'_> {
    /// Writes the block back with `m`; returns once it is in place.
    fn write_back(&mut self, m: Method) {
        let com = self.com;
        match m {
            Method::WholeBlock => com.write(self.dst, &self.data).unwrap(),
            Method::PerRun => {
                self.runs.clear();
                find_runs(&self.twin, &self.data, &mut self.runs);
                for &(s, e) in &self.runs {
                    // SAFETY: `data` is neither written nor dropped before
                    // the requests are waited for below.
                    let r = unsafe {
                        com.write_nb(self.dst.add(s as u64), self.data[s..].as_ptr(), e - s)
                    };
                    self.reqs.push(r.unwrap());
                }
                for r in self.reqs.drain(..) {
                    r.wait().unwrap();
                }
            }
            Method::PackedDiff => {
                self.runs.clear();
                find_runs(&self.twin, &self.data, &mut self.runs);
                if self.runs.is_empty() {
                    return;
                }
                pack(
                    &self.runs,
                    &self.data,
                    com.max_message_bytes(),
                    &mut self.packed,
                    &mut self.ends,
                );
                let mut start = 0;
                for &end in &self.ends {
                    com.send(1, TAG_DIFF, &self.packed[start..end]).unwrap();
                    start = end;
                }
                com.recv(Source::Rank(1), TAG_ACK).unwrap();
            }
            Method::ScanOnly => {
                self.runs.clear();
                find_runs(&self.twin, &self.data, &mut self.runs);
                black_box(&self.runs);
            }
        }
    }

    /// One run of `m`: for about `run_time`, apply the next modification,
    /// time the write-back, check the target and refresh the twin. Returns
    /// ns per write-back.
    fn run(&mut self, m: Method, mods: &[Modification], run_time: Duration) -> f64 {
        let start = Instant::now();
        let (mut timed, mut n) = (Duration::ZERO, 0u32);
        while n < 8 || start.elapsed() < run_time {
            let md = &mods[n as usize % mods.len()];
            for (&p, &v) in md.positions.iter().zip(&md.xors) {
                self.data[p] ^= v;
            }
            let t = Instant::now();
            self.write_back(m);
            timed += t.elapsed();
            n += 1;
            if m != Method::WholeBlock {
                self.seen_runs += self.runs.len();
                self.seen_twin_based += 1;
            }
            if m == Method::PackedDiff && !self.runs.is_empty() {
                self.seen_packed += self.packed.len();
                self.seen_packs += 1;
            }
            if m == Method::ScanOnly {
                // Nothing was sent: put the target in step untimed.
                self.com.write(self.dst, &self.data).unwrap();
                if self.runs != find_runs_naive(&self.twin, &self.data) {
                    fail("the runs found differ from the byte-by-byte reference");
                }
            }
            self.com.read(self.dst, &mut self.check).unwrap();
            if self.check != self.data {
                fail(&format!(
                    "{}: the target block differs from the written one",
                    m.name()
                ));
            }
            self.twin.copy_from_slice(&self.data);
        }
        timed.as_nanos() as f64 / f64::from(n)
    }
}

/// Checks `find_runs`, `nonzero_bytes`, `pack` and `unpack` against simple
/// references on random blocks.
fn self_check(block: usize, run_len: usize) {
    let mut rng = Rng(0x5eed);
    // Every byte value at every position, and random words with random zero
    // bytes.
    let words = (0..=255u64)
        .flat_map(|x| (0..8).map(move |k| x << (8 * k)))
        .chain((0..10_000).map(|_| {
            let (w, zeros) = (rng.next(), rng.next());
            (0..8).fold(w, |w, k| {
                if zeros >> k & 1 == 1 {
                    w & !(0xff << (8 * k))
                } else {
                    w
                }
            })
        }))
        .collect::<Vec<u64>>();
    for w in words {
        let expect: u64 = (0..8)
            .map(|i| u64::from((w >> (8 * i)) & 0xff != 0) << i)
            .sum();
        if nonzero_bytes(w) != expect {
            fail(&format!("nonzero_bytes({w:#x})"));
        }
    }
    for round in 0..200 {
        // Odd lengths exercise the 8-byte and 1-byte tails.
        let n = if round % 2 == 0 {
            block
        } else {
            1 + rng.below(300)
        };
        let twin: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let mut data = twin.clone();
        let x = rng.below(n + 1);
        let p = if round % 3 == 0 {
            Pattern::Clustered
        } else {
            Pattern::Scattered
        };
        let md = modification(&mut rng, p, n, x, run_len.min(n));
        for (&q, &v) in md.positions.iter().zip(&md.xors) {
            data[q] ^= v;
        }
        let mut runs = Vec::new();
        find_runs(&twin, &data, &mut runs);
        if runs != find_runs_naive(&twin, &data) {
            fail(&format!("find_runs on {n} bytes with {x} changed"));
        }
        if n <= 1 << 16 {
            let (mut out, mut ends) = (Vec::new(), Vec::new());
            // Small messages force runs to be split across messages.
            let max = if round % 4 == 0 { 64 } else { 64 * 1024 };
            pack(&runs, &data, max, &mut out, &mut ends);
            let mut rebuilt = twin.clone();
            let mut start = 0;
            for (i, &end) in ends.iter().enumerate() {
                let msg = &out[start..end];
                let last = i + 1 == ends.len();
                if msg.len() > max || msg[0] != if last { LAST } else { MORE } {
                    fail("pack: message size or flag");
                }
                unpack(&msg[1..], &mut rebuilt);
                start = end;
            }
            if rebuilt != data {
                fail("pack/unpack does not rebuild the block");
            }
        }
    }
}

fn main() {
    let args = Args::from_env();
    if args.help() {
        eprintln!("{HELP}");
        return;
    }
    let sizes: Vec<usize> = args.list("sizes", &[0, 8, 64, 512, 4096, 32768]);
    let patterns = args.choices(
        "patterns",
        "write-methods",
        &[
            ("clustered", Pattern::Clustered),
            ("scattered", Pattern::Scattered),
        ],
    );
    let named: Vec<(&str, Method)> = Method::ALL.iter().map(|&m| (m.name(), m)).collect();
    let methods = args.choices("methods", "write-methods", &named);
    let block: usize = args.get("block", 32 * 1024);
    let run_len: usize = args.get("run-len", 64);
    let runs: usize = args.get("runs", 7);
    let run_time = Duration::from_millis(args.get("run-ms", 20));
    args.finish("write_methods");
    if !(1..=1 << 16).contains(&block) || run_len == 0 || runs == 0 {
        eprintln!("write-methods: --block must be 1..=65536, --run-len and --runs >= 1");
        std::process::exit(2);
    }

    let com: Com = menps_dsm::launch::init_or_relaunch(2).unwrap_or_else(|e| {
        eprintln!("write-methods: {e}");
        std::process::exit(2)
    });
    if com.size() < 2 {
        eprintln!("write-methods: needs at least 2 processes (MENPS_NPROCS)");
        std::process::exit(2);
    }
    let win = com.create_window(block).unwrap();
    com.barrier().unwrap();
    match com.rank() {
        0 => {
            self_check(block, run_len);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let data: Vec<u8> = (0..block).map(|_| rng.next() as u8).collect();
            let mut w = Writer {
                com: &com,
                dst: win.at(1, 0),
                twin: data.clone(),
                data,
                runs: Vec::with_capacity(block / 2 + 1),
                packed: Vec::with_capacity(2 * block + 64),
                ends: Vec::new(),
                reqs: Vec::with_capacity(block / 2 + 1),
                check: vec![0; block],
                seen_runs: 0,
                seen_twin_based: 0,
                seen_packed: 0,
                seen_packs: 0,
            };
            com.write(w.dst, &w.data).unwrap();
            for &x in &sizes {
                for &p in &patterns {
                    // A cycle of distinct modifications, so that no run sees
                    // the same bytes change twice in a row.
                    let mods: Vec<Modification> = (0..16)
                        .map(|_| modification(&mut rng, p, block, x, run_len))
                        .collect();
                    eprintln!("x = {x} B, {}...", p.name());
                    let params: Vec<(&str, Param)> = vec![
                        ("x", x.into()),
                        ("pattern", p.name().into()),
                        ("block", block.into()),
                        ("procs", com.size().into()),
                    ];
                    (w.seen_runs, w.seen_twin_based, w.seen_packed, w.seen_packs) = (0, 0, 0, 0);
                    let mut samples: Vec<Vec<f64>> = methods.iter().map(|_| Vec::new()).collect();
                    // Methods interleaved run by run; run 0 is the warm-up.
                    let mut steal = ct_bench::StealMeter::start();
                    for run in 0..=runs {
                        if run == 1 {
                            // Host steal over the measured runs.
                            steal = ct_bench::StealMeter::start();
                        }
                        for (i, &m) in methods.iter().enumerate() {
                            let v = w.run(m, &mods, run_time);
                            if run > 0 {
                                samples[i].push(v);
                            }
                        }
                    }
                    let steal = steal.pct();
                    for (i, &m) in methods.iter().enumerate() {
                        let s = Stats::from_samples(&samples[i]).with_host_steal(steal);
                        emit("menps-dsm", "write-methods", m.name(), &params, "ns", &s);
                    }
                    eprintln!(
                        "  per write-back: {:.1} runs of changed bytes, {:.0} packed bytes",
                        w.seen_runs as f64 / w.seen_twin_based.max(1) as f64,
                        w.seen_packed as f64 / w.seen_packs.max(1) as f64
                    );
                }
            }
            // Ends rank 1's server.
            com.send(1, TAG_DIFF, &[]).unwrap();
        }
        1 => serve_diffs(&com, com.local_window(win).unwrap(), block),
        _ => {}
    }
    com.barrier().unwrap();
    // Rank 0 emitted every line; the others print nothing.
    ct_bench::print_summary();
}
