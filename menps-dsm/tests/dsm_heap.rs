//! Multi-process tests of the DSM heap, its typed helpers and DSM globals
//! (shm backend), under the default protocol and the fixed-home writer.
//!
//! Each test drives jobs of this binary (see `common/`): the job processes
//! run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario.

use std::collections::HashSet;
use std::process::Command;

use ct_worker::OsThreads;
use menps_dsm::com::{AnyCom, Coll};
use menps_dsm::dsm::{Dsm, DsmBox, DsmError, DsmMutex, DsmVec};

mod common;
use common::*;

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

/// Most processes a job of this file has.
const MAXP: usize = 4;
/// Objects one process can send another per round.
const SEND_MAX: usize = 6;
/// Mailbox words per (sender, receiver) pair: a count, then (address, size,
/// seed) triples.
const PAIR_WORDS: usize = 1 + 3 * SEND_MAX;
/// Two mailboxes (by round parity) of `MAXP × MAXP` pairs.
const MAILBOX_WORDS: usize = 2 * MAXP * MAXP * PAIR_WORDS;

menps_dsm::dsm_global! {
    /// Incremented under a DSM mutex by every process.
    static COUNTER: u64 = 0;
    /// Pointers passed between processes.
    static MAILBOX: [u64; MAILBOX_WORDS] = [0; MAILBOX_WORDS];
    /// A global with a non-zero initial value.
    static INITIAL: [u32; 3] = [7, 8, 9];
}

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let dsm: D = start_dsm_job();
    let me = dsm.rank();
    match name.as_str() {
        "churn" => churn(&dsm),
        "reuse" => reuse_and_errors(&dsm),
        "oom" => out_of_memory(&dsm),
        "typed" => typed(&dsm),
        "global_counter" => global_counter(&dsm),
        other => panic!("unknown scenario {other}"),
    }
    println!("rank {me}: ok");
    dsm.finalize().unwrap();
}

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn byte(seed: u64, i: usize) -> u8 {
    let x = seed.wrapping_mul(0xff51_afd7_ed55_8ccd) ^ (i as u64).wrapping_mul(0x9e37_79b9);
    (x ^ (x >> 29)) as u8
}

/// The byte ranges of an object of `size` bytes that carry its pattern: all
/// of a small object, 64-byte samples of a big one (every 256 KiB and the
/// end).
fn samples(size: usize) -> Vec<(usize, usize)> {
    if size <= 8192 {
        return vec![(0, size)];
    }
    let mut v: Vec<_> = (0..size - 64)
        .step_by(256 * 1024)
        .map(|o| (o, 64))
        .collect();
    v.push((size - 64, 64));
    v
}

fn fill(p: *mut u8, size: usize, seed: u64) {
    for (o, len) in samples(size) {
        for i in o..o + len {
            // SAFETY: `p` is a live heap object of `size` bytes that this
            // process may write now (the scenario's protocol).
            unsafe { p.add(i).write(byte(seed, i)) };
        }
    }
}

fn check(p: *const u8, size: usize, seed: u64, what: &str) {
    for (o, len) in samples(size) {
        for i in o..o + len {
            // SAFETY: a live heap object whose writer released it before our
            // acquire.
            let v = unsafe { p.add(i).read() };
            assert_eq!(
                v,
                byte(seed, i),
                "{what}: object {p:p} of {size} bytes (seed {seed:#x}) differs at byte {i}"
            );
        }
    }
}

fn mailbox(dsm: &D, parity: usize, from: usize, to: usize) -> *mut u64 {
    let pair = (parity * MAXP + from) * MAXP + to;
    // SAFETY: inside the MAILBOX global.
    unsafe { MAILBOX.get(dsm).cast::<u64>().add(pair * PAIR_WORDS) }
}

#[derive(Clone, Copy, Debug)]
struct Obj {
    addr: usize,
    size: usize,
    seed: u64,
}

const ROUNDS: u64 = 40;
const PER_ROUND: usize = 14;
/// Objects of a round that are large.
const LARGE_PER_ROUND: usize = 2;
const KEEP: usize = 10;

/// Every process allocates objects of random sizes (small ones of 12
/// classes, large ones of 1–3 chunks), writes a pattern into each, passes
/// some to other processes through DSM memory and a barrier. In the next
/// round the receivers check them, overwrite them and free them (remote
/// frees) while, in the same epoch, the owners allocate again — reusing
/// slots whose last writer has not passed a barrier since. Every process
/// keeps some small objects alive across rounds and checks they stay intact
/// (no memory handed out twice, no stale write merged over them); large
/// ones it keeps are checked and freed in the next round. Over the run the
/// processes allocate several times the heap: memory is reused.
fn churn(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    assert!(n <= MAXP);
    let (_, heap_size) = dsm.heap_range().expect("a heap");
    let mut rng = Rng::new(me as u64 + 1);
    let mut live: Vec<Obj> = Vec::new();
    let mut transient: Vec<Obj> = Vec::new();
    let mut seen = HashSet::new();
    let mut repeats = 0usize;
    for round in 0..=ROUNDS {
        if round > 0 {
            // Receive what was sent last round: check, overwrite, free.
            let parity = (round - 1) as usize % 2;
            for from in (0..n).filter(|&f| f != me) {
                let slot = mailbox(dsm, parity, from, me);
                // SAFETY: written by `from` before the barrier.
                let count = unsafe { slot.read() } as usize;
                for j in 0..count {
                    // SAFETY: as above.
                    let (addr, size, seed) = unsafe {
                        let w = slot.add(1 + 3 * j);
                        (w.read() as usize, w.add(1).read() as usize, w.add(2).read())
                    };
                    check(addr as *const u8, size, seed, "received object");
                    fill(addr as *mut u8, size, !seed);
                    dsm.free(addr as *mut u8).unwrap_or_else(|e| {
                        panic!("rank {me}: free of {addr:#x} from rank {from} failed: {e}")
                    });
                }
            }
        }
        for o in &live {
            check(o.addr as *const u8, o.size, o.seed, "kept object");
        }
        for o in transient.drain(..) {
            check(o.addr as *const u8, o.size, o.seed, "kept large object");
            dsm.free(o.addr as *mut u8).unwrap();
        }
        // Free the oldest objects we kept (local frees).
        while live.len() > KEEP {
            let o = live.remove(0);
            dsm.free(o.addr as *mut u8).unwrap();
        }
        if round == ROUNDS {
            break;
        }
        let parity = round as usize % 2;
        let mut sent = vec![0usize; n];
        for k in 0..PER_ROUND {
            let large = k < LARGE_PER_ROUND;
            let size = if large {
                128 * 1024 + 1 + rng.below((3 << 20) - 128 * 1024) as usize
            } else {
                1 + rng.below(1024) as usize
            };
            let align = 1 << rng.below(5);
            let p = dsm.alloc(size, align).unwrap_or_else(|e| {
                panic!("rank {me} round {round}: alloc({size}, {align}) failed: {e}")
            });
            assert!((p as usize).is_multiple_of(align));
            assert!(dsm.usable_size(p).unwrap() >= size);
            if !seen.insert(p as usize) {
                repeats += 1;
            }
            let seed = (me as u64) << 48 | round << 24 | k as u64;
            fill(p, size, seed);
            let obj = Obj {
                addr: p as usize,
                size,
                seed,
            };
            let to = rng.below(n as u64) as usize;
            if to != me && sent[to] < SEND_MAX {
                let slot = mailbox(dsm, parity, me, to);
                // SAFETY: our row of this round's mailbox; its readers read
                // it after the barrier below, and its previous readers
                // finished before the last barrier.
                unsafe {
                    let w = slot.add(1 + 3 * sent[to]);
                    w.write(obj.addr as u64);
                    w.add(1).write(obj.size as u64);
                    w.add(2).write(obj.seed);
                }
                sent[to] += 1;
            } else if large {
                transient.push(obj);
            } else {
                live.push(obj);
            }
        }
        for (to, &c) in sent.iter().enumerate() {
            if to != me {
                // SAFETY: as above.
                unsafe { mailbox(dsm, parity, me, to).write(c as u64) };
            }
        }
        dsm.barrier().unwrap();
    }
    for o in live.drain(..) {
        check(
            o.addr as *const u8,
            o.size,
            o.seed,
            "kept object at the end",
        );
        dsm.free(o.addr as *mut u8).unwrap();
    }
    let st = dsm.heap_stats();
    assert_eq!(st.allocs, ROUNDS * PER_ROUND as u64);
    assert!(
        st.reused > 0 && repeats > 0,
        "rank {me}: no memory was reused: {st:?}, {repeats} repeated addresses"
    );
    dsm.barrier().unwrap();
    dsm.heap_trim().unwrap();
    dsm.barrier().unwrap();
    // Every object was freed, every chunk given back.
    let u = dsm.heap_usage().unwrap();
    assert_eq!(
        (u.small_chunks, u.large_chunks, u.free_chunks),
        (0, 0, u.chunks),
        "rank {me}: chunks still in use at the end: {u:?}"
    );
    let all = dsm
        .com()
        .allgather(
            &[st.bytes_allocated, st.bytes_freed, st.frees]
                .map(u64::to_le_bytes)
                .concat(),
        )
        .unwrap();
    let all = u64s(&all);
    let total: u64 = all.chunks(3).map(|c| c[0]).sum();
    let freed: u64 = all.chunks(3).map(|c| c[1]).sum();
    let frees: u64 = all.chunks(3).map(|c| c[2]).sum();
    assert_eq!(total, freed, "bytes allocated and freed differ");
    assert_eq!(frees, ROUNDS * PER_ROUND as u64 * n as u64);
    assert!(
        total >= 5 * heap_size as u64 / 2,
        "the run allocated only {total} bytes with a heap of {heap_size}"
    );
    println!(
        "rank {me}: churn allocated {total} bytes in all with a heap of {heap_size}; here \
         {st:?}, {repeats} repeated addresses"
    );
    dsm.barrier().unwrap();
}

/// Reuse of memory another process wrote and freed without any DSM
/// synchronisation in between (only a plain barrier of the communication
/// layer): the owner must get the same address back, zeroed, and its new
/// contents must reach everybody without a false race. Then the error
/// cases: double frees (local and remote), interior, foreign and
/// unallocated pointers, large objects.
fn reuse_and_errors(dsm: &D) {
    let me = dsm.rank();
    let mb = mailbox(dsm, 0, 0, 0);
    let mut abc = [0usize; 3];
    if me == 0 {
        for x in &mut abc {
            *x = dsm.alloc(200, 8).unwrap() as usize;
        }
        assert_eq!(abc[1], abc[0] + 256, "class-256 slots are contiguous");
        assert_eq!(abc[2], abc[1] + 256);
        fill(abc[1] as *mut u8, 200, 1);
        check(abc[1] as *const u8, 200, 1, "own object");
        // SAFETY: process 0's mailbox word, read after the barrier.
        unsafe { mb.write(abc[1] as u64) };
    }
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier.
    let b = unsafe { mb.read() } as usize;
    if me == 1 {
        check(b as *const u8, 200, 1, "received object");
        fill(b as *mut u8, 200, 2);
        dsm.free(b as *mut u8).unwrap();
    }
    // No DSM acquire for process 0: it still has its old copy.
    dsm.com().barrier().unwrap();
    if me == 0 {
        let b2 = dsm.alloc_zeroed(200, 8).unwrap() as usize;
        assert_eq!(b2, b, "the freed slot is reused");
        for i in 0..200 {
            // SAFETY: our new object.
            assert_eq!(unsafe { (b2 as *const u8).add(i).read() }, 0, "byte {i}");
        }
        fill(b2 as *mut u8, 200, 3);
        assert!(dsm.heap_stats().reused >= 1);
    }
    dsm.barrier().unwrap();
    check(b as *const u8, 200, 3, "reused object");
    dsm.barrier().unwrap();

    let bad = |r: Result<(), DsmError>, what: &str| match r {
        Err(DsmError::InvalidArgument(m)) => println!("rank {me}: {what}: {m}"),
        other => panic!("rank {me}: {what}: expected InvalidArgument, got {other:?}"),
    };
    // Foreign pointers.
    let mut local = 0u64;
    bad(dsm.free(&mut local as *mut u64 as *mut u8), "stack pointer");
    let seg = dsm.alloc_segment(4096, 4096).unwrap();
    bad(dsm.free(seg), "segment pointer");
    let (base, size) = dsm.heap_range().unwrap();
    // SAFETY: address arithmetic inside the heap range.
    bad(
        dsm.free(unsafe { base.add(size - 16) }),
        "unallocated chunk",
    );
    if me == 0 {
        bad(dsm.free((abc[0] + 8) as *mut u8), "interior pointer");
        dsm.free(abc[2] as *mut u8).unwrap();
        bad(dsm.free(abc[2] as *mut u8), "local double free");
        // A slot never allocated in a live chunk.
        bad(dsm.free((abc[2] + 256) as *mut u8), "free slot");
    }
    // Large objects: interior (tail) pointers and double frees.
    let big = dsm.alloc(3 << 20, 64).unwrap();
    assert_eq!(dsm.usable_size(big).unwrap(), 3 << 20);
    // SAFETY: inside the object.
    bad(dsm.free(unsafe { big.add(1 << 20) }), "large tail pointer");
    // SAFETY: inside the object.
    bad(dsm.free(unsafe { big.add(64) }), "large interior pointer");
    dsm.free(big).unwrap();
    bad(dsm.free(big), "large double free");
    // Remote double free: process 1 frees an object of process 0 twice.
    dsm.barrier().unwrap();
    if me == 0 {
        let x = dsm.alloc(40, 8).unwrap();
        // SAFETY: process 0's mailbox word, read after the barrier.
        unsafe { mb.write(x as u64) };
    }
    dsm.barrier().unwrap();
    if me == 1 {
        // SAFETY: written before the barrier.
        let x = unsafe { mb.read() } as *mut u8;
        dsm.free(x).unwrap();
        bad(dsm.free(x), "remote double free");
    }
    // Bad alignments.
    assert!(matches!(dsm.alloc(8, 3), Err(DsmError::InvalidArgument(_))));
    assert!(matches!(
        dsm.alloc(8, 2 << 20),
        Err(DsmError::InvalidArgument(_))
    ));
    dsm.barrier().unwrap();
    if me == 0 {
        dsm.free(abc[0] as *mut u8).unwrap();
        dsm.free(b as *mut u8).unwrap();
    }
    dsm.barrier().unwrap();
}

/// A heap of 8 chunks of 1 MiB: too-large requests fail with OutOfMemory;
/// all processes fill it concurrently with large and then small objects
/// (exactly 8 chunks' worth), free everything, and the whole heap is
/// available as one object again — the small chunks of the other processes
/// are taken back when process 0 runs out.
fn out_of_memory(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let (_, heap_size) = dsm.heap_range().unwrap();
    assert_eq!(heap_size, 8 << 20);
    match dsm.alloc(16 << 20, 8) {
        Err(DsmError::OutOfMemory(m)) => {
            assert!(m.contains("DSM heap"), "{m}");
            println!("rank {me}: too large: {m}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    dsm.barrier().unwrap();
    let fill_up = |size: usize| {
        let mut got = Vec::new();
        loop {
            match dsm.alloc(size, 8) {
                Ok(p) => got.push(p),
                Err(DsmError::OutOfMemory(_)) => break got,
                Err(e) => panic!("rank {me}: {e}"),
            }
        }
    };
    let sum = |k: usize| -> u64 {
        u64s(&dsm.com().allgather(&(k as u64).to_le_bytes()).unwrap())
            .iter()
            .sum()
    };
    // Large objects of one chunk each.
    let got = fill_up(1 << 20);
    assert_eq!(sum(got.len()), 8, "large objects in a heap of 8 chunks");
    for p in got {
        dsm.free(p).unwrap();
    }
    dsm.barrier().unwrap();
    if me == 0 {
        let p = dsm.alloc(8 << 20, 8).unwrap();
        dsm.free(p).unwrap();
    }
    dsm.barrier().unwrap();
    // Small objects of 64 KiB: 16 per chunk. Every process takes a chunk
    // first, so that every process owns one when the heap is full.
    let first = dsm.alloc(64 * 1024, 8).unwrap();
    dsm.barrier().unwrap();
    let mut got = fill_up(64 * 1024);
    got.push(first);
    assert_eq!(
        sum(got.len()),
        8 * 16,
        "64 KiB objects in a heap of 8 chunks"
    );
    assert!(dsm.heap_usage().unwrap().own_small_chunks >= 1);
    for p in got {
        dsm.free(p).unwrap();
    }
    dsm.barrier().unwrap();
    if me == 0 {
        // Every chunk is owned (empty) by some process: running out, we take
        // them back.
        let p = dsm.alloc(8 << 20, 8).unwrap();
        let st = dsm.heap_stats();
        if n > 1 {
            assert!(st.chunks_reclaimed > 0, "{st:?}");
        }
        dsm.free(p).unwrap();
    }
    dsm.barrier().unwrap();
    // The others' records of the chunks taken from them are stale now: they
    // must not allocate from them.
    let p = dsm.alloc(64 * 1024, 8).unwrap();
    assert_eq!(dsm.usable_size(p).unwrap(), 64 * 1024);
    fill(p, 64 * 1024, me as u64);
    dsm.barrier().unwrap();
    let u = dsm.heap_usage().unwrap();
    assert_eq!(u.own_small_chunks, 1, "rank {me}: {u:?}");
    assert_eq!(u.small_chunks, n, "rank {me}: {u:?}");
    check(p, 64 * 1024, me as u64, "after reclaim");
    dsm.free(p).unwrap();
    dsm.barrier().unwrap();
    dsm.heap_trim().unwrap();
    dsm.barrier().unwrap();
    let u = dsm.heap_usage().unwrap();
    assert_eq!(u.free_chunks, 8, "{u:?}");
    dsm.barrier().unwrap();
}

#[derive(Clone, Copy, Debug, PartialEq, Default)]
struct Point {
    x: f64,
    y: f64,
    tag: u32,
}

/// `DsmBox` moved between processes and dropped remotely; `DsmVec` written
/// in stripes by every process; the initial value of a global.
fn typed(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    // SAFETY: a DSM global nobody writes.
    assert_eq!(unsafe { INITIAL.get(dsm).read() }, [7, 8, 9]);
    let mb = mailbox(dsm, 0, 0, 0);
    if me == 0 {
        let mut b = DsmBox::new(dsm, Point::default()).unwrap();
        b.x = 1.5;
        b.y = -2.0;
        b.tag = 42;
        assert_eq!(
            *b,
            Point {
                x: 1.5,
                y: -2.0,
                tag: 42
            }
        );
        // SAFETY: process 0's mailbox word, read after the barrier.
        unsafe { mb.write(b.into_raw() as u64) };
    }
    dsm.barrier().unwrap();
    if me == n - 1 {
        // SAFETY: the pointer came from `into_raw` in process 0, which wrote
        // the value before the barrier and no longer owns it.
        let mut b = unsafe { DsmBox::from_raw(dsm, mb.read() as *mut Point) };
        assert_eq!(
            *b,
            Point {
                x: 1.5,
                y: -2.0,
                tag: 42
            }
        );
        b.tag += 1;
        drop(b);
    }
    dsm.barrier().unwrap();
    let used = dsm.heap_stats();
    // Boxes of a ZST and of a big array; explicit free.
    let z = DsmBox::new(dsm, ()).unwrap();
    z.free().unwrap();
    let big = DsmBox::new(dsm, [me as u64; 1000]).unwrap();
    assert!(big.iter().all(|&v| v == me as u64));
    drop(big);
    assert_eq!(dsm.heap_stats().frees, used.frees + 2);

    const LEN: usize = 20_000;
    let v: DsmVec<u64, _, _> = DsmVec::new_collective(dsm, LEN).unwrap();
    assert_eq!(v.len(), LEN);
    for i in (0..LEN).filter(|i| i % n == me) {
        // SAFETY: element `i` is written by this process only.
        unsafe { v.write(i, i as u64 * 3 + 1) };
    }
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier; nobody writes now.
    let s = unsafe { v.as_slice() };
    assert!(s.iter().enumerate().all(|(i, &x)| x == i as u64 * 3 + 1));
    let addrs = u64s(
        &dsm.com()
            .allgather(&(v.as_ptr() as u64).to_le_bytes())
            .unwrap(),
    );
    assert!(addrs.iter().all(|&a| a == v.as_ptr() as u64), "{addrs:x?}");
    v.free_collective().unwrap();
    let w: DsmVec<[u8; 3], _, _> = DsmVec::new_collective_with(dsm, 999, [1, 2, 3]).unwrap();
    // SAFETY: filled by process 0 before the barrier inside the constructor.
    assert!(unsafe { w.as_slice() }.iter().all(|&e| e == [1, 2, 3]));
    // SAFETY: as above.
    assert_eq!(unsafe { w.read(998) }, [1, 2, 3]);
    w.free_collective().unwrap();
    dsm.barrier().unwrap();
}

fn shared_mutex(dsm: &D) -> DsmMutex {
    let mut id = [0u8; 4];
    if dsm.rank() == 0 {
        id = dsm.new_mutex().unwrap().0.to_le_bytes();
    }
    dsm.com().broadcast(0, &mut id).unwrap();
    DsmMutex(u32::from_le_bytes(id))
}

const INCREMENTS: u64 = 500;

/// Every process increments a global declared with `dsm_global!` under a
/// DSM mutex.
fn global_counter(dsm: &D) {
    let n = dsm.nprocs() as u64;
    let c = COUNTER.get(dsm);
    let addrs = u64s(&dsm.com().allgather(&(c as u64).to_le_bytes()).unwrap());
    assert!(addrs.iter().all(|&a| a == c as u64), "{addrs:x?}");
    // SAFETY: nobody writes before the first lock.
    assert_eq!(unsafe { c.read() }, 0);
    dsm.barrier().unwrap();
    let m = shared_mutex(dsm);
    for _ in 0..INCREMENTS {
        let g = dsm.lock(m).unwrap();
        // SAFETY: DSM memory protected by the mutex.
        unsafe { c.write(c.read() + 1) };
        g.unlock().unwrap();
    }
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier.
    assert_eq!(unsafe { c.read() }, n * INCREMENTS);
    dsm.barrier().unwrap();
}

// ---------------------------------------------------------------------------
// The driver side.

/// The policies every scenario runs under: the default protocol and the
/// fixed-home writer.
const POLICIES: &[&str] = &["floating", "fixed"];

fn job(scenario: &str, nprocs: usize, writer: &str, heap: &str) -> JobRun {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", nprocs.to_string())
        .env("MENPS_DSM_WRITER", writer)
        .env("MENPS_DSM_HEAP_SIZE", heap);
    let tag = new_tag(scenario);
    drive(cmd, &tag, |_, _| false)
}

fn run(scenario: &str, procs: &[usize], heap: &str) {
    for &n in procs {
        for &writer in POLICIES {
            let run = job(scenario, n, writer, heap);
            let what = format!("{scenario} with {n} processes, writer {writer}");
            assert_passed(&run, &what, n);
            eprintln!("{what}: {:?}", run.elapsed);
        }
    }
}

#[test]
fn heap_churn_with_reuse_and_remote_frees() {
    run("churn", &[2, 3, 4], "96M");
}

#[test]
fn heap_reuse_is_coherent_and_bad_frees_are_errors() {
    run("reuse", &[2, 3], "1G");
}

#[test]
fn heap_out_of_memory_and_reclaim() {
    run("oom", &[1, 2, 4], "8M");
}

#[test]
fn typed_helpers() {
    run("typed", &[2, 3], "64M");
}

#[test]
fn dsm_global_counter_under_mutex() {
    run("global_counter", &[2, 4], "64M");
}

/// The heap, the typed helpers and globals on the `mpi` backend: the same
/// scenarios as jobs of `mpirun` (they join as `AnyCom`), under the default
/// protocol and the fixed home.
#[cfg(feature = "mpi")]
#[test]
fn heap_typed_and_globals_under_mpirun() {
    for scenario in ["churn", "reuse", "typed", "global_counter"] {
        for writer in POLICIES {
            let run = mpirun_job(
                scenario,
                3,
                &[("MENPS_DSM_WRITER", writer), ("MENPS_DSM_HEAP_SIZE", "96M")],
            );
            assert_passed(
                &run,
                &format!("{scenario} under mpirun, writer {writer}"),
                3,
            );
        }
    }
}
