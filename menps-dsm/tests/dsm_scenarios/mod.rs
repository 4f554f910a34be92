//! The DSM scenarios shared by the shm suite (`dsm.rs`) and the MPI suite
//! (`dsm_mpi.rs`): what the job processes run, generic over the backend
//! through `AnyCom`.

#![allow(dead_code)]

use ct_worker::OsThreads;
use menps_dsm::com::AnyCom;
use menps_dsm::dsm::{Dsm, InvalidationPolicy, WriterPolicy};

use super::common::SCENARIO;

pub type D = Dsm<AnyCom<OsThreads>, OsThreads>;

/// Rank 0 creates a segment (collective) while the others call a barrier:
/// every rank gets an error from that collective, and exits non-zero.
fn mismatch(dsm: &D) -> ! {
    let me = dsm.rank();
    let r = if me == 0 {
        dsm.alloc_segment(4096, 4096).map(drop)
    } else {
        dsm.barrier()
    };
    match r {
        Ok(()) => println!("rank {me}: the mismatched collective passed"),
        Err(e) => println!("rank {me}: mismatch: {e}"),
    }
    // Fail-stop: the DSM's next operation reports the failure too.
    match dsm.barrier() {
        Ok(()) => println!("rank {me}: the next barrier passed"),
        Err(e) => println!("rank {me}: next: {e}"),
    }
    std::process::exit(5);
}

/// Runs the scenario named by `MENPS_TEST_SCENARIO` in a job process (a
/// no-op without it).
pub fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    if name == "ult_faults" {
        return ult_faults();
    }
    let dsm: D = super::common::start_dsm_job();
    let me = dsm.rank();
    match name.as_str() {
        "producer_consumer" => producer_consumer(&dsm),
        "false_sharing" => false_sharing(&dsm),
        "shared_block_rounds" => shared_block_rounds(&dsm),
        "mutex_increments" => mutex_increments(&dsm),
        "atomic_increments" => atomic_increments(&dsm),
        "atomics_at_home" => atomics_at_home(&dsm),
        "single_writer" => single_writer(&dsm),
        "phased_writers" => phased_writers(&dsm),
        "handed_parts" => handed_parts(&dsm),
        "deferred_pin_merges" => deferred_pin_merges(&dsm),
        "speculative_reads" => speculative_reads(&dsm),
        "rewritten_runs" => rewritten_runs(&dsm),
        "idle_limit" => idle_limit(&dsm),
        "silent_rewrites" => silent_rewrites(&dsm),
        "unchanged_rewrites" => unchanged_rewrites(&dsm),
        "taken_releases" => taken_releases(&dsm),
        "prefetch_invalidated" => prefetch_invalidated(&dsm),
        "hot_refresh" => hot_refresh(&dsm),
        "partial_reads" => partial_reads(&dsm),
        "dirty_scan" => dirty_scan(&dsm),
        "dirty_scan_threshold" => dirty_scan_threshold(&dsm),
        "barrier_after_touch" => barrier_after_touch(&dsm),
        "race" => race(&dsm),
        "races_reported" => races_reported(&dsm),
        "single_writer_mutex" => single_writer_mutex(&dsm),
        "flush_wavefront" => flush_wavefront(&dsm),
        "flush_while_publishing" => flush_while_publishing(&dsm),
        "pinned_stack" => pinned_stack(&dsm),
        "segv_outside" => segv_outside(&dsm),
        "segv_null" => segv_null(&dsm),
        "overflow" => overflow(&dsm),
        "disabled_thread" => disabled_thread(&dsm),
        "mismatch" => mismatch(&dsm),
        other => panic!("unknown scenario {other}"),
    }
    if std::env::var_os("MENPS_TEST_STATS").is_some() {
        eprintln!(
            "rank {me}: {:?} faults {}",
            dsm.stats(),
            menps_dsm::internals::fault_count()
        );
    }
    println!("rank {me}: ok");
    dsm.finalize().unwrap();
}

fn word(seed: u64, i: usize) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd)
}

/// Each round one process writes a pattern over the whole segment (several
/// blocks), then everybody checks it after a barrier.
fn producer_consumer(dsm: &D) {
    // 32 KiB blocks, then 4 KiB blocks: 256 blocks per round, so releases
    // and acquires also run in parallel.
    produce_consume(dsm, 256 * 1024, 32 * 1024);
    produce_consume(dsm, 1024 * 1024, 4096);
}

fn produce_consume(dsm: &D, len: usize, block: usize) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let p = dsm.alloc_segment(len, block).unwrap() as *mut u64;
    let words = len / 8;
    for round in 0..(4 * n) {
        let writer = round % n;
        let seed = round as u64 + 1;
        if me == writer {
            for i in 0..words {
                // SAFETY: DSM memory only this process writes this round.
                unsafe { p.add(i).write(word(seed, i)) };
            }
        }
        dsm.barrier().unwrap();
        for i in (0..words).step_by(7) {
            // SAFETY: written before the barrier.
            let v = unsafe { p.add(i).read() };
            assert_eq!(
                v,
                word(seed, i),
                "round {round}: word {i} from writer {writer}"
            );
        }
        dsm.barrier().unwrap();
    }
}

/// Writers own disjoint stripes of one 32 KiB block, cyclically by process;
/// after every round each process checks the whole block, and at the end
/// the contents are exact. Stripe sizes 1 B .. 32 KiB.
fn false_sharing(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let block = 32 * 1024;
    let base = dsm.alloc_segment(block * 7, block).unwrap();
    // Stripes of 1 and 2 bytes: processes write different bytes of the
    // same words (the merge must not lose a byte of one word).
    for (k, stripe) in [1usize, 2, 8, 64, 512, 4096, 32768].into_iter().enumerate() {
        // SAFETY: inside the segment.
        let p = unsafe { base.add(k * block) };
        let stripes = block / stripe;
        let value = |round: usize, i: usize| ((round * 131 + i * 7 + k) % 251) as u8 + 1;
        for round in 0..6 {
            for i in (0..stripes).filter(|i| i % n == me) {
                for b in 0..stripe {
                    // SAFETY: stripe `i` is written by this process only.
                    unsafe { p.add(i * stripe + b).write(value(round, i)) };
                }
            }
            dsm.barrier().unwrap();
            for i in 0..stripes {
                for b in [0, stripe / 2, stripe - 1] {
                    // SAFETY: written before the barrier.
                    let v = unsafe { p.add(i * stripe + b).read() };
                    assert_eq!(
                        v,
                        value(round, i),
                        "stripe {stripe}: round {round} byte {}",
                        i * stripe + b
                    );
                }
            }
            dsm.barrier().unwrap();
        }
        // The final contents, byte for byte.
        for i in 0..block {
            // SAFETY: written before the barrier.
            let v = unsafe { p.add(i).read() };
            assert_eq!(v, value(5, i / stripe), "stripe {stripe}: final byte {i}");
        }
    }
}

fn shared_mutex(dsm: &D) -> menps_dsm::dsm::DsmMutex {
    let mut id = [0u8; 4];
    if dsm.rank() == 0 {
        id = dsm.new_mutex().unwrap().0.to_le_bytes();
    }
    menps_dsm::com::Coll::broadcast(dsm.com(), 0, &mut id).unwrap();
    menps_dsm::dsm::DsmMutex(u32::from_le_bytes(id))
}

const INCREMENTS: u64 = 1000;

/// Every process increments a counter (and appends to a log) 10^3 times
/// under a DSM mutex.
fn mutex_increments(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs() as u64);
    let seg = dsm.alloc_segment(64 * 1024, 4096).unwrap() as *mut u64;
    let m = shared_mutex(dsm);
    // Word 0: the counter; word 1 + k: which process made increment k
    // (spread over several blocks).
    for _ in 0..INCREMENTS {
        let g = dsm.lock(m).unwrap();
        // SAFETY: DSM memory protected by the mutex.
        unsafe {
            let c = seg.read();
            seg.add(1 + c as usize).write(me as u64 + 1);
            seg.write(c + 1);
        }
        g.unlock().unwrap();
    }
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier.
    let total = unsafe { seg.read() };
    assert_eq!(total, n * INCREMENTS);
    let mut per = vec![0u64; n as usize];
    for k in 0..total as usize {
        // SAFETY: as above.
        let who = unsafe { seg.add(1 + k).read() };
        assert!((1..=n).contains(&who), "log entry {k} is {who}");
        per[who as usize - 1] += 1;
    }
    assert!(
        per.iter().all(|&c| c == INCREMENTS),
        "per-process counts {per:?}"
    );
    dsm.barrier().unwrap();
    if me == 0 {
        dsm.free_mutex(m).unwrap();
        // Freeing it again is a misuse, named as such.
        let e = dsm.free_mutex(m).unwrap_err().to_string();
        assert!(e.contains("is not allocated"), "{e}");
    }
}

/// Every process does 10^3 atomic increments of one word (and CAS
/// increments of another).
fn atomic_increments(dsm: &D) {
    let n = dsm.nprocs() as u64;
    let seg = dsm.alloc_segment(8192, 4096).unwrap() as *mut u64;
    // SAFETY: inside the segment.
    let (a, b) = (seg, unsafe { seg.add(600) });
    let mut seen = Vec::new();
    for _ in 0..INCREMENTS {
        seen.push(dsm.fetch_add(a, 1).unwrap());
        loop {
            let cur = dsm.load_acquire(b).unwrap();
            if dsm.compare_exchange(b, cur, cur + 1).unwrap().is_ok() {
                break;
            }
        }
    }
    // Fetched values are distinct and increasing per process.
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "fetch_add went backwards"
    );
    dsm.barrier().unwrap();
    assert_eq!(dsm.load_acquire(a).unwrap(), n * INCREMENTS);
    // SAFETY: written before the barrier (plain reads see the atomics too).
    unsafe {
        assert_eq!(a.read(), n * INCREMENTS);
        assert_eq!(b.read(), n * INCREMENTS);
    }
    dsm.barrier().unwrap();
}

/// Process 0 writes a new value into one block every iteration; the others
/// read it after each barrier: never a stale value (the fast-release hole of
/// the original).
/// Atomics at the block's home: process 0 writes a block (and becomes its
/// home), then every other process adds 1 to a word of it `ROUNDS` times
/// with relaxed DSM atomics (a C reduction's `lock cmpxchg` loop: a guess
/// read locally, then compare-and-swap); after a barrier everybody checks
/// the total and the block's other words. Under the floating home (not
/// with the directory policy) an atomic runs on the home's word and moves
/// no block: the others fetch the block at most twice (a miss for the
/// first guess, the read after the barrier), and process 0, whose copy
/// stays the latest version, fetches nothing. Then program order: process
/// 1 rewrites a word (and becomes the home); process 0 writes the word and,
/// with its write still pending in its copy, compares and swaps it — the
/// operation must see that write, not the home's older value.
fn atomics_at_home(dsm: &D) {
    const ROUNDS: u64 = 100;
    const WORDS: usize = 1024; // an 8 KiB block
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let p = dsm.alloc_segment(WORDS * 8, WORDS * 8).unwrap() as *mut u64;
    let at = |w: usize| {
        // SAFETY: inside the segment.
        unsafe { p.add(w) }
    };
    if me == 0 {
        for w in 0..WORDS {
            // SAFETY: only process 0 writes, before the barrier.
            unsafe { at(w).write(word(7, w)) };
        }
    }
    dsm.barrier().unwrap();
    let before = dsm.stats();
    if me != 0 {
        for _ in 0..ROUNDS {
            // SAFETY: a guess of the counter's value (may be stale).
            let mut cur = unsafe { at(5).read_volatile() };
            while let Err(actual) = dsm.compare_exchange_relaxed(at(5), cur, cur + 1).unwrap() {
                cur = actual;
            }
        }
    }
    dsm.barrier().unwrap();
    let after = dsm.stats();
    for w in 0..WORDS {
        let want = if w == 5 {
            word(7, 5) + ROUNDS * (n as u64 - 1)
        } else {
            word(7, w)
        };
        // SAFETY: written before the barrier.
        assert_eq!(unsafe { at(w).read() }, want, "process {me}: word {w}");
    }
    let cfg = dsm.config();
    if cfg.writer == WriterPolicy::Floating
        && cfg.invalidation != menps_dsm::dsm::InvalidationPolicy::Directory
    {
        let fetched = after.bytes_fetched - before.bytes_fetched;
        let most = if me == 0 { 0 } else { 2 * WORDS * 8 };
        assert!(
            fetched <= most,
            "process {me}: {fetched} bytes fetched for {ROUNDS} atomics (at most {most} \
             expected): the atomics moved the block; {after}"
        );
    }
    dsm.barrier().unwrap();
    if me == 1 {
        // SAFETY: only process 1 writes the word, between barriers.
        unsafe { at(9).write(100) };
    }
    dsm.barrier().unwrap();
    if me == 0 {
        // SAFETY: only process 0 writes the word, between barriers.
        unsafe { at(9).write(5) };
        let r = dsm.compare_exchange_relaxed(at(9), 5, 6).unwrap();
        assert_eq!(r, Ok(5), "the atomic did not see this process's own write");
    }
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier.
    let v = unsafe { at(9).read() };
    assert_eq!(v, 6, "process {me}: the word after the atomic");
}

fn single_writer(dsm: &D) {
    let me = dsm.rank();
    let seg = dsm.alloc_segment(32 * 1024, 32 * 1024).unwrap() as *mut u64;
    for it in 1..=1000u64 {
        if me == 0 {
            // SAFETY: only process 0 writes, between barriers.
            unsafe {
                seg.write(it);
                seg.add(2000).write(it * 3);
            }
        }
        dsm.barrier().unwrap();
        // SAFETY: written before the barrier.
        let (x, y) = unsafe { (seg.read(), seg.add(2000).read()) };
        assert_eq!(
            (x, y),
            (it, it * 3),
            "process {me} read a stale value at iteration {it}"
        );
        dsm.barrier().unwrap();
    }
}

/// OpenMP-style phases: in each round every process writes its own block
/// (4 KiB blocks) in the first phase only, and every process reads every
/// block after each of the round's first five barriers (a sixth ends the
/// round). The values are checked
/// everywhere; under the default protocol (floating writer, hybrid
/// invalidation, fast release) a block nobody wrote since the last barrier
/// must not be announced again, so a reader's copy survives the round's
/// later barriers: one read miss per foreign block and round, not five.
/// Every round each process writes its own word of one block and adds to a
/// counter in the same block with a relaxed DSM atomic (a transaction: it leaves
/// the block clean, so the next plain write lists it for release again),
/// then a barrier — the pattern of a C reduction compiled to a `lock add`
/// into `main`'s frame. Release work must stay proportional to the rounds:
/// a block listed again while its old entry was still in the write set was
/// released once per entry, and the entries accumulated (1,800 releases
/// per parallel region after 2,000 regions of such a C program).
fn shared_block_rounds(dsm: &D) {
    const ROUNDS: usize = 200;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let p = dsm.alloc_segment(4096, 4096).unwrap() as *mut u64;
    let before = dsm.stats();
    for round in 1..=ROUNDS {
        // SAFETY: word `me + 1` of the block is written by this process only.
        unsafe { p.add(8 * (me + 1)).write((round * n + me) as u64) };
        // Word 0 is the counter: relaxed DSM atomics only (a C reduction's
        // `lock cmpxchg` loop), read after a barrier.
        let mut cur = 0;
        while let Err(actual) = dsm.compare_exchange_relaxed(p, cur, cur + 1).unwrap() {
            cur = actual;
        }
        // SAFETY: as above; written again after the atomic.
        unsafe { p.add(8 * (me + 1) + 1).write(round as u64) };
        dsm.barrier().unwrap();
        // SAFETY: written before the barrier, not before the next one.
        let count = unsafe { p.read() };
        assert_eq!(
            count,
            (round * n) as u64,
            "process {me}, round {round}: the counter"
        );
        for q in 0..n {
            // SAFETY: as above.
            let (v, r) = unsafe { (p.add(8 * (q + 1)).read(), p.add(8 * (q + 1) + 1).read()) };
            assert_eq!(
                v,
                (round * n + q) as u64,
                "process {me}, round {round}: word of {q}"
            );
            assert_eq!(
                r, round as u64,
                "process {me}, round {round}: second word of {q}"
            );
        }
        dsm.barrier().unwrap();
    }
    let after = dsm.stats();
    let work = (after.transactions - before.transactions)
        + (after.fast_releases - before.fast_releases)
        + (after.idle_releases - before.idle_releases);
    // A miss (or, once the block is pinned as write-shared, an in-place
    // refresh) and a release per round, at most a few more; a block listed
    // once per round it was written in would be released ROUNDS² / 2 times.
    let bound = 8 * ROUNDS + 20;
    assert!(
        work <= bound,
        "process {me}: {work} transactions and releases in {ROUNDS} rounds (at most {bound} \
         expected): the block was released more than once per fence; {after}"
    );
}

/// Parts of blocks handed from process to process, as a dynamic `for`
/// deals out an integer sort's buckets: every round, each eighth of each
/// 4 KiB block is rewritten whole by a process picked from the round and
/// the part (the same choice everywhere), then after a barrier every
/// process checks every word. The processes write each block in turn
/// and, within a round, write disjoint parts of it, so its copies go
/// through every path of write-shared pinning (pinned, merged in place at
/// releases and acquires, handed over between fast releases and
/// transactions, unpinned when idle — the last rounds leave some blocks
/// untouched). A part is cleared before it is written, and often written
/// with the values it held, so a process that takes a block in the middle
/// of another's rewrite gets zeros that no write notice replaces: a copy
/// kept from such a state, or a merge on a stale base, shows up as a wrong
/// word or a write-write race.
fn handed_parts(dsm: &D) {
    const ROUNDS: u64 = 120;
    const BLOCKS: usize = 6;
    const PARTS: usize = 8;
    const WORDS: usize = 512;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let p = dsm.alloc_segment(BLOCKS * 4096, 4096).unwrap() as *mut u64;
    let pw = WORDS / PARTS;
    // Neighbouring parts have different writers, and the parts move on
    // every round: every process writes every block every round (at most
    // seven processes), and rewrites words another one wrote last.
    let writer = |round: u64, part: usize| -> Option<usize> {
        let w = (part + round as usize * (part % 3 + 1)) % (n + 1);
        // Late rounds leave the first blocks alone: their pins go idle.
        let idle = round > ROUNDS - 30 && part < 2 * PARTS;
        (w < n && !idle).then_some(w)
    };
    // The same values three rounds running: a part rewritten with what it
    // held (after zeros, as a counting sort clears its counts first) is
    // unchanged at the release, while another process may have taken the
    // block in the middle of the rewrite.
    // (Not under the fixed home, which reads the home's copy as it is: see
    // `WriterPolicy::Fixed`.)
    let same = if dsm.config().writer == menps_dsm::dsm::WriterPolicy::Fixed {
        1
    } else {
        3
    };
    let value = move |round: u64, word: usize| (round / same + 1) << 32 | word as u64;
    let mut last = vec![0u64; BLOCKS * PARTS];
    for round in 1..=ROUNDS {
        for part in 0..BLOCKS * PARTS {
            if writer(round, part) == Some(me) {
                for w in part * pw..(part + 1) * pw {
                    // SAFETY: this part is written by this process only this
                    // round, and read by nobody before the barrier.
                    unsafe { p.add(w).write_volatile(0) };
                }
                std::thread::yield_now();
                for w in part * pw..(part + 1) * pw {
                    // SAFETY: as above.
                    unsafe { p.add(w).write_volatile(value(round, w)) };
                }
            }
        }
        dsm.barrier().unwrap();
        for (part, l) in last.iter_mut().enumerate() {
            if writer(round, part).is_some() {
                *l = round;
            }
            for w in part * pw..(part + 1) * pw {
                // SAFETY: written before the barrier, not before the next.
                let v = unsafe { p.add(w).read() };
                let want = if *l == 0 { 0 } else { value(*l, w) };
                assert_eq!(
                    v, want,
                    "process {me}, round {round}: word {w} (part {part})"
                );
            }
        }
        dsm.barrier().unwrap();
    }
    if let Some(st) = pinned_stats(dsm) {
        assert!(st.shared_pins > 0, "process {me}: no block pinned; {st}");
    }
}

/// This process's counters, if write-shared blocks must have been pinned
/// (pinning on, a floating home, and write notices to tell the processes
/// that the others wrote: with leases only, the merges tell it less
/// often).
fn pinned_stats(dsm: &D) -> Option<menps_dsm::dsm::StatsSnapshot> {
    let cfg = dsm.config();
    (cfg.pin_shared
        && cfg.writer == menps_dsm::dsm::WriterPolicy::Floating
        && cfg.invalidation == menps_dsm::dsm::InvalidationPolicy::Hybrid)
        .then(|| dsm.stats())
}

/// Deferred merges of write-shared pins (`BlockState::PinnedStale`), in
/// the pattern of an ADI solver's phases: each block has an owner, which
/// rewrites it whole in three phases of every round; in the fourth every
/// process reads every block and then writes its own words of each (word
/// `w` by process `w % n`), so that every block is written in turn by all
/// and pinned everywhere. The other processes then get three write notices
/// between two accesses of theirs: after the first merges (a pin starts
/// eager) they defer the merge, and the notices after the first find the
/// copy stale already (a merge saved). Every value read must be the
/// latest: a stale pin read or written without its merge, or merged on
/// the wrong base, shows as a wrong word (or a write-write race). The
/// last rounds leave block 0 to its owner alone, so that its stale pins
/// go idle and are dropped; the final reads of it must still be the
/// latest. Under a floating home and timestamp-based invalidation every
/// process must have deferred merges.
fn deferred_pin_merges(dsm: &D) {
    const ROUNDS: u64 = 40;
    /// Rounds at the end in which block 0 is left to its owner.
    const TAIL: u64 = 8;
    const WORDS: usize = 512;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let blocks = 2 * n;
    let p = dsm.alloc_segment(blocks * 4096, 4096).unwrap() as *mut u64;
    let at = |b: usize, w: usize| {
        // SAFETY: inside the segment.
        unsafe { p.add(b * WORDS + w) }
    };
    let owner = |b: usize| b % n;
    let value = |round: u64, phase: u64, b: usize, w: usize| word(round * 4 + phase, b * WORDS + w);
    for round in 1..=ROUNDS {
        let tail = round > ROUNDS - TAIL;
        for phase in 0..3 {
            for b in (0..blocks).filter(|&b| owner(b) == me) {
                for w in 0..WORDS {
                    // SAFETY: only the owner writes its blocks in this phase.
                    unsafe { at(b, w).write_volatile(value(round, phase, b, w)) };
                }
            }
            dsm.barrier().unwrap();
        }
        for b in (0..blocks).filter(|&b| !(tail && b == 0)) {
            for w in 0..WORDS {
                // SAFETY: written before the barrier, not before the next.
                let v = unsafe { at(b, w).read_volatile() };
                assert_eq!(
                    v,
                    value(round, 2, b, w),
                    "process {me}, round {round}: block {b} word {w} is stale"
                );
            }
        }
        dsm.barrier().unwrap();
        for b in (0..blocks).filter(|&b| !(tail && b == 0)) {
            for w in (me..WORDS).step_by(n) {
                // SAFETY: word `w` is this process's alone in this phase.
                unsafe { at(b, w).write_volatile(value(round, 3, b, w)) };
            }
        }
        dsm.barrier().unwrap();
    }
    for b in 0..blocks {
        for w in 0..WORDS {
            // Block 0's words are the owner's from the last round's third
            // phase; the others' the fourth phase's.
            let want = if b == 0 {
                value(ROUNDS, 2, b, w)
            } else {
                value(ROUNDS, 3, b, w)
            };
            // SAFETY: written before the last barrier.
            let v = unsafe { at(b, w).read_volatile() };
            assert_eq!(v, want, "process {me}, at the end: block {b} word {w}");
        }
    }
    if let Some(st) = pinned_stats(dsm) {
        assert!(st.shared_pins > 0, "process {me}: no block pinned; {st}");
        assert!(
            st.deferred_refreshes > 0,
            "process {me}: no merge of a stale pin deferred; {st}"
        );
    }
}

/// Speculative reads (a miss reads the block at the process its lock is
/// tried at, with the swap): each round a process rewrites two segments
/// (4 KiB blocks read whole and in order, so misses prefetch in batches;
/// 32 KiB blocks of which one word per block is read, backwards, so misses
/// read single pages), then the others read them one after the other,
/// with a barrier between two readers. So a reader finds the lock at the
/// writer (the speculation holds the latest version), or at an earlier
/// reader (not tried with a read), or finds that it moved on since its
/// swap was sent (void: the data must be read again from the writer).
/// Every value must be the latest; with two processes, under a floating
/// home without fast reads (and without the refresh of hot blocks, which
/// would fetch the blocks at the acquires), the reads must have been
/// speculative.
fn speculative_reads(dsm: &D) {
    const ROUNDS: u64 = 12;
    const SMALL: usize = 16;
    const LARGE: usize = 8;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let a = dsm.alloc_segment(SMALL * 4096, 4096).unwrap() as *mut u64;
    let b = dsm.alloc_segment(LARGE * 32768, 32768).unwrap() as *mut u64;
    let (a_words, b_words) = (SMALL * 512, LARGE * 4096);
    // A word of segment `b` for block `k`, in a different page each round.
    let probe = |round: u64, k: usize| k * 4096 + (round as usize % 8) * 512 + k;
    for round in 1..=ROUNDS {
        // A writer keeps its turn for three rounds: turns every round would
        // make the blocks write-shared (pinned), with no read misses.
        let writer = (round as usize - 1) / 3 % n;
        if me == writer {
            for i in 0..a_words {
                // SAFETY: only the writer writes, between two barriers.
                unsafe { a.add(i).write_volatile(word(round, i)) };
            }
            for i in 0..b_words {
                // SAFETY: as above.
                unsafe { b.add(i).write_volatile(word(round + 1000, i)) };
            }
        }
        dsm.barrier().unwrap();
        for reader in (0..n).filter(|&q| q != writer) {
            if me == reader {
                for i in 0..a_words {
                    // SAFETY: written before the barrier, not before the next.
                    let v = unsafe { a.add(i).read_volatile() };
                    assert_eq!(v, word(round, i), "process {me}, round {round}: word {i}");
                }
                for k in (0..LARGE).rev() {
                    let i = probe(round, k);
                    // SAFETY: as above.
                    let v = unsafe { b.add(i).read_volatile() };
                    assert_eq!(
                        v,
                        word(round + 1000, i),
                        "process {me}, round {round}: large-block word {i}"
                    );
                }
            }
            dsm.barrier().unwrap();
        }
    }
    // With two processes the reader finds the lock at the writer, from the
    // second round of a turn on (the first has no write notice yet) —
    // under a floating home, and unless fast reads, which take no lock,
    // serve the misses.
    let cfg = dsm.config();
    if n == 2 && cfg.writer == WriterPolicy::Floating && !cfg.fast_read_active() {
        let st = dsm.stats();
        assert!(
            st.speculative_reads > 0,
            "process {me}: no speculative read held the latest version; {st}"
        );
    }
}

/// Whether `dsm` runs the release protocol whose idle releases and idle
/// limits the scenarios count exactly: fast release, hybrid invalidation,
/// no fast read.
fn idle_releases_counted(dsm: &D) -> bool {
    let cfg = dsm.config();
    cfg.fast_release_active()
        && cfg.invalidation == menps_dsm::dsm::InvalidationPolicy::Hybrid
        && !cfg.fast_read_active()
}

fn phased_writers(dsm: &D) {
    const ROUNDS: u64 = 40;
    const PHASES: usize = 5;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let block = 4096;
    let p = dsm.alloc_segment(n * block, block).unwrap() as *mut u64;
    let words = block / 8;
    let before = dsm.stats();
    for round in 1..=ROUNDS {
        for phase in 0..PHASES {
            if phase == 0 {
                for i in 0..words {
                    // SAFETY: block `me` is written by this process only.
                    unsafe {
                        p.add(me * words + i)
                            .write(round * 1000 + (me * words + i) as u64)
                    };
                }
            }
            dsm.barrier().unwrap();
            for q in 0..n {
                for i in [0, words / 2, words - 1] {
                    let at = q * words + i;
                    // SAFETY: written before the barrier, not during this phase.
                    let v = unsafe { p.add(at).read() };
                    assert_eq!(
                        v,
                        round * 1000 + at as u64,
                        "process {me}, round {round} phase {phase}: block {q} word {i}"
                    );
                }
            }
        }
        // Everybody has read before the next round's writes.
        dsm.barrier().unwrap();
    }
    // Idle releases: fast release without fast read.
    if idle_releases_counted(dsm) {
        let after = dsm.stats();
        let misses = after.read_faults - before.read_faults;
        // One miss per foreign block and round, plus a few for leases and
        // the first round.
        let bound = (n - 1) * ROUNDS as usize + 4 * n;
        assert!(
            misses <= bound,
            "process {me}: {misses} read misses in {ROUNDS} rounds of {n} blocks (at most \
             {bound} expected): idle blocks were announced again; {after}"
        );
    }
}

/// Refresh of hot blocks: every round one process (the writer changes every
/// `STRETCH` rounds) rewrites a whole 4 KiB block and, after a barrier, the
/// others read all of it; a copy that an acquire refreshed in place
/// instead of dropping shows stale data if the refresh missed a change.
/// With refresh on (and write notices or leases to find stale copies: not
/// under the directory policy), a reader misses on the block only when it
/// is new to it and when a hot copy is dropped once after its refreshes to
/// test it: at most `rounds / (refreshes + 1)` plus a few per change of
/// writer, against once per round read with refresh off. Each reader also
/// writes its own word of the next block every round it reads, so that a
/// refreshed copy sits next to a written, falsely shared one.
fn hot_refresh(dsm: &D) {
    const ROUNDS: u64 = 60;
    const STRETCH: u64 = 20;
    const WORDS: usize = 512; // per 4 KiB block
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let seg = dsm.alloc_segment(2 * 4096, 4096).unwrap() as *mut u64;
    let at = |w: usize| {
        // SAFETY: inside the segment (block 1 from word `WORDS`).
        unsafe { seg.add(w) }
    };
    let before = dsm.stats();
    let mut read_rounds = 0;
    // Per process: the last round it read (and wrote its word of block 1).
    let mut last_read = vec![0u64; n];
    for round in 1..=ROUNDS {
        let writer = (round / STRETCH) as usize % n;
        if me == writer {
            for w in 0..WORDS {
                // SAFETY: only the writer writes the block, between barriers.
                unsafe { at(w).write(word(round, w)) };
            }
        }
        dsm.barrier().unwrap();
        if me != writer {
            read_rounds += 1;
            for w in 0..WORDS {
                // SAFETY: written before the barrier.
                let v = unsafe { at(w).read() };
                assert_eq!(v, word(round, w), "round {round}: word {w} is stale");
            }
            // SAFETY: word `me` of block 1 is this process's alone.
            unsafe { at(WORDS + me).write(round) };
        }
        for (p, last) in last_read.iter_mut().enumerate() {
            if p != writer {
                *last = round;
            }
        }
        dsm.barrier().unwrap();
    }
    let after = dsm.stats();
    for (p, &last) in last_read.iter().enumerate() {
        // SAFETY: written before the last barrier.
        let v = unsafe { at(WORDS + p).read() };
        assert_eq!(v, last, "process {p}'s word of the falsely shared block");
    }
    let cfg = dsm.config();
    let misses = after.read_faults - before.read_faults;
    let refreshed = after.refreshed - before.refreshed;
    let finds_stale = cfg.invalidation != menps_dsm::dsm::InvalidationPolicy::Directory;
    let home_here = cfg.writer == WriterPolicy::Fixed && misses == 0;
    if cfg.refreshes == 0 || !finds_stale {
        assert_eq!(
            refreshed, 0,
            "process {me}: refreshed with refresh off; {after}"
        );
    } else if !home_here {
        let changes = (ROUNDS / STRETCH) as usize + 1;
        let bound = ROUNDS as usize / (usize::from(cfg.refreshes) + 1) + 2 * changes;
        assert!(
            misses <= bound,
            "process {me}: {misses} read misses in {read_rounds} rounds read (at most {bound} \
             expected with {} refreshes): hot copies were dropped; {after}",
            cfg.refreshes
        );
        // Most rounds read find a refreshed copy (not all: a copy dropped
        // to be tested is missed on, and a release that merges a new version
        // into a copy brings it up to date without either).
        assert!(
            refreshed >= read_rounds / 2,
            "process {me}: {refreshed} refreshes in {read_rounds} rounds read; {after}"
        );
    }
}

/// Sequential prefetch meets invalidation: every round one process (in
/// turn) writes a pattern over a segment of 4 KiB blocks; after a barrier
/// the others read the first two blocks only — a sequential run, so with
/// prefetching on (checked with a floating home: the block after them is
/// readable, untouched) the next blocks are fetched ahead; after another barrier the writer
/// rewrites the blocks the readers never touched, and after a third the
/// readers read them all: a prefetched copy that the acquire did not drop
/// shows as stale data. Rounds alternate between reading the rewritten
/// blocks in order (prefetching again) and backwards. (The driver runs it
/// with the refresh of hot blocks off too: with it on, the blocks read
/// every round are refreshed by the acquires rather than missed on.)
fn prefetch_invalidated(dsm: &D) {
    const BLOCKS: usize = 48;
    const WORDS: usize = 512; // per 4 KiB block
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let seg = dsm.alloc_segment(BLOCKS * 4096, 4096).unwrap() as *mut u64;
    let at = |b: usize, w: usize| {
        // SAFETY: inside the segment.
        unsafe { seg.add(b * WORDS + w) }
    };
    let prefetching = dsm.config().prefetch_bytes >= 4 * 4096;
    let before = dsm.stats().prefetched;
    for round in 1..=24u64 {
        // A writer keeps its turn for three rounds: turns every round would
        // make the blocks write-shared (pinned), with no read misses.
        let writer = (round as usize - 1) / 3 % n;
        if me == writer {
            for b in 0..BLOCKS {
                for w in 0..WORDS {
                    // SAFETY: only the writer writes, between barriers.
                    unsafe { at(b, w).write(word(round, b * WORDS + w)) };
                }
            }
        }
        dsm.barrier().unwrap();
        if me != writer {
            let misses = dsm.stats().read_faults;
            for b in 0..2 {
                // SAFETY: written before the barrier.
                let v = unsafe { at(b, 7).read() };
                assert_eq!(v, word(round, b * WORDS + 7), "round {round}: block {b}");
            }
            let missed_both = dsm.stats().read_faults - misses >= 2;
            // (With a fixed home, one of the two may be this process's own
            // block: a hit, not a miss; with refresh on, the acquire may
            // have refreshed them: hits too.)
            if prefetching && missed_both && dsm.config().writer == WriterPolicy::Floating {
                assert!(
                    dsm.block_state(at(2, 0) as *const u8)
                        .is_some_and(|s| s.readable()),
                    "round {round}: block 2 was not prefetched after two sequential misses {:?}",
                    (0..5)
                        .map(|b| dsm.block_state(at(b, 0) as *const u8))
                        .collect::<Vec<_>>()
                );
            }
        }
        dsm.barrier().unwrap();
        let again = round + 1000;
        if me == writer {
            for b in 2..BLOCKS {
                for w in (0..WORDS).step_by(3) {
                    // SAFETY: only the writer writes, between barriers.
                    unsafe { at(b, w).write(word(again, b * WORDS + w)) };
                }
            }
        }
        dsm.barrier().unwrap();
        if me != writer {
            let order: Vec<usize> = if round % 2 == 0 {
                (2..BLOCKS).collect()
            } else {
                (2..BLOCKS).rev().collect()
            };
            for b in order {
                for w in 0..WORDS {
                    let want = if w % 3 == 0 {
                        word(again, b * WORDS + w)
                    } else {
                        word(round, b * WORDS + w)
                    };
                    // SAFETY: written before the barrier.
                    let v = unsafe { at(b, w).read() };
                    assert_eq!(v, want, "round {round}: block {b} word {w} is stale");
                }
            }
        }
        dsm.barrier().unwrap();
    }
    let fetched = dsm.stats().prefetched - before;
    if prefetching && me != 0 {
        assert!(fetched > 0, "process {me} prefetched nothing");
    }
    if !prefetching {
        assert_eq!(fetched, 0, "process {me} prefetched with prefetching off");
    }
}

/// Partial reads (`MENPS_DSM_PARTIAL_READ`) meet invalidation, writes and
/// atomics, over blocks of 32 KiB (8 pages). Every round one process (in
/// turn) rewrites pages 0-5 of every block; after a barrier the others
/// read one word of one page of each block, in an order that forms no
/// sequential run (a miss that fetches only that page, where partial reads
/// apply), then a word of another page of every
/// other block (the miss that reads the block whole), write their own word
/// on page 7 of one block (a write to a partial copy, on a page it lacks)
/// and add 1 to the counter word on page 6 of another (an atomic on a
/// partial copy). Every value read must be the round's: a partial copy
/// that kept a page of an older version, or a miss that trusted a page
/// it never fetched, shows as stale data. At the end everybody checks the
/// page-7 words and the counters. Partial reads are counted only when they
/// are on; with the refresh of hot blocks off, a floating home and no fast
/// read, every reader makes some (blocks read again after each
/// invalidation are hot, and refreshed whole, when the refresh is on; a
/// fast read copies a whole block without the block's lock).
fn partial_reads(dsm: &D) {
    const BLOCKS: usize = 16;
    const PAGES: usize = 8;
    const PW: usize = 512; // words per page
    const ROUNDS: usize = 24;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let seg = dsm
        .alloc_segment(BLOCKS * PAGES * 4096, PAGES * 4096)
        .unwrap() as *mut u64;
    let at = |b: usize, p: usize, w: usize| {
        // SAFETY: inside the segment.
        unsafe { seg.add((b * PAGES + p) * PW + w) }
    };
    let index = |b: usize, p: usize, w: usize| (b * PAGES + p) * PW + w;
    let before = dsm.stats();
    for round in 1..=ROUNDS {
        let writer = round % n;
        if me == writer {
            for b in 0..BLOCKS {
                for p in 0..6 {
                    for w in (0..PW).step_by(5) {
                        // SAFETY: only the writer writes pages 0-5, between
                        // barriers.
                        unsafe { at(b, p, w).write(word(round as u64, index(b, p, w))) };
                    }
                }
            }
        }
        dsm.barrier().unwrap();
        if me != writer {
            let check = |b: usize, p: usize, w: usize| {
                // SAFETY: written before the barrier.
                let v = unsafe { at(b, p, w).read() };
                assert_eq!(
                    v,
                    word(round as u64, index(b, p, w)),
                    "round {round}: block {b} page {p} word {w} is stale"
                );
            };
            // Blocks 7 apart: no two misses in a row are neighbours, so no
            // sequential run forms (a prefetch reads its blocks whole).
            for b in (0..BLOCKS).map(|k| k * 7 % BLOCKS) {
                check(b, (round + b) % 6, 10);
            }
            for b in (0..BLOCKS).step_by(2) {
                check(b, (round + b + 3) % 6, 15);
            }
            // SAFETY: word `me` of page 7 is this process's alone.
            unsafe { at(round % BLOCKS, 7, me).write(round as u64) };
            dsm.fetch_add(at((round + 5) % BLOCKS, 6, 0), 1).unwrap();
        }
        dsm.barrier().unwrap();
    }
    for b in 0..BLOCKS {
        for p in 0..n {
            // The last round in which `p` wrote its word of block `b`.
            let last = (1..=ROUNDS)
                .filter(|&r| r % BLOCKS == b && r % n != p)
                .max()
                .unwrap_or(0);
            // SAFETY: written before the last barrier.
            let v = unsafe { at(b, 7, p).read() };
            assert_eq!(v, last as u64, "process {p}'s word of block {b}");
        }
        let adds = (1..=ROUNDS).filter(|&r| (r + 5) % BLOCKS == b).count() * (n - 1);
        // SAFETY: written before the last barrier.
        let v = unsafe { at(b, 6, 0).read() };
        assert_eq!(v, adds as u64, "block {b}'s counter");
    }
    let partial = dsm.stats().partial_reads - before.partial_reads;
    let cfg = dsm.config();
    if cfg.partial_reads
        && cfg.refreshes == 0
        && !cfg.fast_read
        && cfg.writer == WriterPolicy::Floating
    {
        assert!(partial > 0, "process {me} made no partial read");
    }
    if !cfg.partial_reads {
        assert_eq!(partial, 0, "process {me}: partial reads with them off");
    }
    dsm.barrier().unwrap();
}

/// Dirty scans (`MENPS_DSM_DIRTY_SCAN`): a release that learns from the
/// kernel which blocks were written must never take a written block for an
/// idle one. Two segments, of 4 KiB blocks (one page) and 16 KiB blocks
/// (four pages, one written at a time); block `b` belongs to process
/// `b % n`. Its owner writes it every other round, so that it stays listed
/// and armed, idle in between (an idle release known from the scan), and
/// each write lands on a block the last scan armed. The writes vary: plain
/// stores on any page, a `read` from a pipe (the kernel writes, on a page
/// of a larger block made writable by a store to another page), and stores
/// from another OS thread that run while this one is in the barrier (the
/// thread is joined after it, so the next barrier must publish them: they
/// may fall between a fence's scan and its comparisons, or between the
/// protection of an idle run and the look at it). After every barrier every
/// process checks every word of both segments. With the scans on and the
/// kernel keeping the record, the owners know idle releases from it; with
/// them off, no scan is made.
fn dirty_scan(dsm: &D) {
    const ROUNDS: usize = 40;
    const PW: usize = 512; // words per page
    let (me, n) = (dsm.rank(), dsm.nprocs());
    // (base, blocks, pages per block)
    let segs: Vec<(*mut u64, usize, usize)> = [(48usize, 1usize), (16, 4)]
        .iter()
        .map(|&(blocks, pages)| {
            let base = dsm
                .alloc_segment(blocks * pages * 4096, pages * 4096)
                .unwrap() as *mut u64;
            (base, blocks, pages)
        })
        .collect();
    let words = |s: usize| segs[s].1 * segs[s].2 * PW;
    // The model: every word's value, the same in every process.
    let mut model: Vec<Vec<u64>> = (0..segs.len()).map(|s| vec![0u64; words(s)]).collect();
    // `pending`: words whose late write may or may not be visible yet.
    let check = |model: &[Vec<u64>], round: usize, pending: &[(usize, usize, u64)]| {
        for (s, &(base, _, _)) in segs.iter().enumerate() {
            for (i, &want) in model[s].iter().enumerate() {
                // SAFETY: inside the segment; written before the barrier.
                let v = unsafe { base.add(i).read() };
                if pending.contains(&(s, i, v)) {
                    continue;
                }
                assert_eq!(
                    v,
                    want,
                    "process {me}, round {round}: segment {s} word {i} (block {}) is stale",
                    i / (segs[s].2 * PW)
                );
            }
        }
    };
    let before = dsm.stats();
    for round in 0..ROUNDS {
        // What every owner writes this round: (segment, word index, value,
        // means: 0 store, 1 pipe, 2 other thread).
        let mut writes = Vec::new();
        for (s, &(_, blocks, pages)) in segs.iter().enumerate() {
            for b in 0..blocks {
                if round > 0 && (round + b) % 2 != 0 {
                    continue;
                }
                let page = (round * 3 + b) % pages;
                let w = (round * 7 + b * 13) % PW;
                let i = (b * pages + page) * PW + w;
                let means = if round == 0 { 0 } else { (round / 2 + b) % 3 };
                writes.push((s, i, word(round as u64 + 1, i), means, b % n));
            }
        }
        // Round 0 writes one word of every block (every block listed).
        let mine: Vec<_> = writes.iter().filter(|w| w.4 == me).copied().collect();
        let late: Vec<(usize, u64)> = mine
            .iter()
            .filter(|w| w.3 == 2)
            .map(|&(s, i, v, _, _)| (segs[s].0 as usize + i * 8, v))
            .collect();
        for &(s, i, v, means, _) in mine.iter().filter(|w| w.3 != 2) {
            // SAFETY: word `i` of segment `s` is inside it, and only its
            // block's owner writes it, between barriers.
            let at = unsafe { segs[s].0.add(i) };
            let pages = segs[s].2;
            if means == 0 || pages == 1 {
                // SAFETY: as above.
                unsafe { at.write(v) };
            } else {
                // The kernel cannot fault a protected block in for us: a
                // store to another page of the block (of the value it
                // holds) makes it writable, and leaves this page armed.
                let other = (i + PW) % (pages * PW) + (i / (pages * PW)) * pages * PW;
                // SAFETY: inside the same block, ours to write.
                unsafe { segs[s].0.add(other).write(model[s][other]) };
                let mut fds = [0; 2];
                // SAFETY: a pipe of our own; `read` writes 8 bytes at `at`,
                // which is ours to write (above).
                unsafe {
                    assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
                    assert_eq!(libc::write(fds[1], (&v as *const u64).cast(), 8), 8);
                    assert_eq!(libc::read(fds[0], at.cast(), 8), 8);
                    libc::close(fds[0]);
                    libc::close(fds[1]);
                }
            }
        }
        // The late writes: from another thread, while this one is in the
        // barrier below; published by the next one.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_micros(50 * (round as u64 % 4)));
            for (addr, v) in late {
                // SAFETY: as above; joined before the next barrier.
                unsafe { (addr as *mut u64).write(v) };
            }
        });
        dsm.barrier().unwrap();
        writer.join().unwrap();
        // Every write but the late ones is visible now; those may be.
        let mut pending = Vec::new();
        for &(s, i, v, means, _) in &writes {
            if means != 2 {
                model[s][i] = v;
            } else {
                pending.push((s, i, v));
            }
        }
        check(&model, round, &pending);
        dsm.barrier().unwrap();
        for &(s, i, v) in &pending {
            model[s][i] = v;
        }
        check(&model, round, &[]);
        // Nobody writes the next round's words before everybody checked.
        dsm.barrier().unwrap();
    }
    let after = dsm.stats();
    let (scans, known) = (
        after.dirty_scans - before.dirty_scans,
        after.scanned_idle - before.scanned_idle,
    );
    if !dsm.config().dirty_scan {
        assert_eq!(
            (scans, known),
            (0, 0),
            "process {me}: dirty scans with them off"
        );
    } else if scans > 0 && dsm.config().writer == WriterPolicy::Floating && !dsm.config().fast_read
    {
        // (A fixed home's other processes merge at its copy every release,
        // and fast read compares no idle block: it re-announces them.)
        assert!(
            known > 0,
            "process {me}: {scans} scans, no idle release known from one"
        );
    }
    dsm.barrier().unwrap();
}

/// The dirty scans' threshold (`MENPS_DSM_DIRTY_SCAN_MIN`, 1 MiB by
/// default): a release fence whose listed blocks total less compares them
/// and asks the kernel nothing; one whose listed blocks reach it scans them
/// (where the kernel keeps the record) and knows idle blocks from the scan.
/// Every process writes one word of each of 16 blocks of its part of a
/// segment of 4 KiB blocks (64 KiB), then of each of 512 (2 MiB); after
/// each, two barriers (at the second every block is idle), then every
/// process checks every process's words.
fn dirty_scan_threshold(dsm: &D) {
    const BLOCK: usize = 4096;
    const PART: usize = 512;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let base = dsm.alloc_segment(n * PART * BLOCK, BLOCK).unwrap() as *mut u64;
    let at = |q: usize, b: usize| (q * PART + b) * BLOCK / 8;
    // (scans, idle releases known from one) of a phase writing `blocks`.
    let phase = |blocks: usize, seed: u64| {
        let before = dsm.stats();
        for b in 0..blocks {
            // SAFETY: word 0 of block `b` of our part, which only we write.
            unsafe { base.add(at(me, b)).write(word(seed, b)) };
        }
        dsm.barrier().unwrap();
        dsm.barrier().unwrap();
        let after = dsm.stats();
        for q in 0..n {
            for b in 0..blocks {
                // SAFETY: inside the segment; written before the barriers.
                let v = unsafe { base.add(at(q, b)).read() };
                assert_eq!(v, word(seed, b), "process {me}: block {b} of process {q}");
            }
        }
        dsm.barrier().unwrap();
        (
            after.dirty_scans - before.dirty_scans,
            after.scanned_idle - before.scanned_idle,
        )
    };
    let small = phase(16, 1);
    let large = phase(PART, 2);
    let min = dsm.config().dirty_scan_min;
    let tracks = menps_dsm::internals::tracks_writes(dsm);
    if min > 16 * BLOCK {
        assert_eq!(
            small,
            (0, 0),
            "process {me}: scans of a write set under the threshold ({min} bytes)"
        );
    }
    if min > PART * BLOCK {
        assert_eq!(
            large,
            (0, 0),
            "process {me}: scans of a write set under the threshold ({min} bytes)"
        );
    } else if tracks {
        assert!(
            large.0 > 0,
            "process {me}: no scan of a write set of {} bytes (threshold {min})",
            PART * BLOCK
        );
        // (A fixed home's other processes merge at its copy every release,
        // fast read compares no idle block, and the acquire of a timestamp
        // or directory policy may drop our copies between the barriers.)
        let cfg = dsm.config();
        if cfg.writer == WriterPolicy::Floating
            && cfg.invalidation == InvalidationPolicy::Hybrid
            && !cfg.fast_read
        {
            assert!(
                large.1 > 0,
                "process {me}: {} scans, no idle release known from one",
                large.0
            );
        }
    }
    if !tracks {
        assert_eq!(
            (small, large),
            ((0, 0), (0, 0)),
            "process {me}: scans without a record"
        );
    }
    dsm.barrier().unwrap();
}

/// A barrier's work is proportional to what changed, not to what was
/// touched before: process 0 writes 16 MiB (512 blocks of 32 KiB), every
/// process reads it all; once the writer's blocks settled (a few
/// barriers), further barriers with nothing written release, invalidate
/// and fetch nothing — no protocol counter moves.
fn barrier_after_touch(dsm: &D) {
    let me = dsm.rank();
    let len = 16 << 20;
    let seg = dsm.alloc_segment(len, 32 * 1024).unwrap();
    if me == 0 {
        for i in (0..len).step_by(4096) {
            // SAFETY: only process 0 writes, before the barrier.
            unsafe { seg.add(i).write(1) };
        }
    }
    dsm.barrier().unwrap();
    for i in (0..len).step_by(4096) {
        // SAFETY: written before the barrier.
        assert_eq!(unsafe { seg.add(i).read() }, 1);
    }
    // The writer's blocks stay writable for a few releases (protected once
    // they were released unchanged several times in a row).
    for _ in 0..16 {
        dsm.barrier().unwrap();
    }
    // The counters of per-block work (not the barrier count and times).
    let work = || {
        let s = dsm.stats();
        [
            s.read_faults,
            s.write_faults,
            s.transactions,
            s.fast_releases,
            s.idle_releases,
            s.fast_reads,
            s.invalidations,
            s.bytes_fetched,
            s.prefetched,
        ]
    };
    let before = work();
    for _ in 0..50 {
        dsm.barrier().unwrap();
    }
    // Under fast read a writable block is announced at every release until
    // it is protected (idle releases are off: see `DsmConfig::fast_read`).
    if dsm.config().fast_read_active() {
        return;
    }
    assert_eq!(
        before,
        work(),
        "process {me}: barriers with nothing written did per-block work: {}",
        dsm.stats()
    );
}

/// Each process rewrites its own run of 32 blocks (4 KiB) after the run
/// went idle and was protected: the values are checked everywhere, and
/// under the default protocol a rewrite takes about one write fault per 16
/// blocks (write-ahead), not one per block.
fn rewritten_runs(dsm: &D) {
    const RUN: usize = 32;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let block = 4096;
    let words = block / 8;
    let p = dsm.alloc_segment(n * RUN * block, block).unwrap() as *mut u64;
    let mine = me * RUN * words;
    let value = |round: u64, at: usize| round * 1_000_000 + at as u64;
    let mut rewrite_faults = Vec::new();
    for round in 1..=3u64 {
        let before = dsm.stats().write_faults;
        for i in 0..RUN * words {
            // SAFETY: this process's own run of blocks.
            unsafe { p.add(mine + i).write(value(round, mine + i)) };
        }
        rewrite_faults.push(dsm.stats().write_faults - before);
        // Enough barriers for the run to go idle and be protected again.
        for _ in 0..12 {
            dsm.barrier().unwrap();
        }
        for q in 0..n {
            for b in 0..RUN {
                let at = q * RUN * words + b * words + 7;
                // SAFETY: written before the barriers.
                let v = unsafe { p.add(at).read() };
                assert_eq!(
                    v,
                    value(round, at),
                    "process {me}, round {round}: word {at}"
                );
            }
        }
        dsm.barrier().unwrap();
    }
    if idle_releases_counted(dsm) {
        // The first write of the run fetches and faults block by block;
        // the rewrites of a run we last wrote go ahead 16 blocks a fault.
        for (k, &f) in rewrite_faults.iter().enumerate().skip(1) {
            assert!(
                f <= RUN / 16 + 2,
                "process {me}: rewrite {k} of a run of {RUN} blocks took {f} write faults \
                 (write-ahead should need about {}): {rewrite_faults:?}; {}",
                RUN / 16,
                dsm.stats()
            );
        }
    }
}

/// How long a written block stays listed once nobody writes it (the
/// adaptive idle-release limit). Each process has two blocks of 4 KiB. One
/// is written once and then left alone: it is compared with its released
/// version at only a few releases before it is protected (a fixed limit of
/// 8 compared it at 8). The other is rewritten every third release: after
/// a round or two it stays writable, and later rewrites take no write
/// fault (with the start limit alone, each would be protected and fault
/// again). The values are checked everywhere at the end.
/// Process 1 rewrites blocks that process 0 wrote last with the values they
/// hold (silent stores: a sweep writing zeros over zeros), round after
/// round, while process 0 changes one word of one of them per round. Every
/// process checks every word after each round. A release of a block that
/// is unchanged since the version this process took needs no transaction,
/// whoever wrote it last: process 1's transactions are its read misses on
/// the changed blocks, about one per round (before, every release of every
/// rewritten block was a transaction that merged nothing, and protected
/// the block, so the next round's stores faulted again).
fn silent_rewrites(dsm: &D) {
    const BLOCKS: usize = 8;
    const ROUNDS: usize = 24;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let words = BLOCKS * 4096 / 8;
    let p = dsm.alloc_segment(BLOCKS * 4096, 4096).unwrap() as *mut u64;
    let at = |w: usize| {
        // SAFETY: inside the segment.
        unsafe { p.add(w) }
    };
    let mut want: Vec<u64> = (0..words).map(|w| word(3, w)).collect();
    if me == 0 {
        for (w, v) in want.iter().enumerate() {
            // SAFETY: only process 0 writes, before the barrier.
            unsafe { at(w).write(*v) };
        }
    }
    dsm.barrier().unwrap();
    let before = dsm.stats();
    for round in 0..ROUNDS {
        // Process 0 changes one word of one block.
        let changed = (round % BLOCKS) * 512 + round;
        want[changed] = word(100 + round as u64, changed);
        if me == 0 {
            // SAFETY: only process 0 writes this round, before the barrier.
            unsafe { at(changed).write(want[changed]) };
        }
        dsm.barrier().unwrap();
        // Process 1 stores every word's value back.
        if me == 1 {
            for w in 0..words {
                // SAFETY: only process 1 touches the segment in this phase.
                unsafe { at(w).write_volatile(at(w).read_volatile()) };
            }
        }
        dsm.barrier().unwrap();
        for (w, v) in want.iter().enumerate() {
            // SAFETY: written before the barrier, not before the next.
            let got = unsafe { at(w).read() };
            assert_eq!(got, *v, "process {me}, round {round}: word {w}");
        }
        dsm.barrier().unwrap();
    }
    let after = dsm.stats();
    let cfg = dsm.config();
    if me == 1 && cfg.fast_release_active() && !cfg.fast_read_active() && n >= 2 {
        // Transactions other than fetches (read misses, and the blocks
        // prefetched with them: leases make process 1 fetch blocks again).
        let tx = after.transactions - before.transactions;
        let fetches =
            (after.read_faults - before.read_faults) + (after.prefetched - before.prefetched);
        let others = tx.saturating_sub(fetches);
        assert!(
            others <= ROUNDS,
            "process 1: {others} transactions besides {fetches} fetches in {ROUNDS} rounds of \
             rewriting {BLOCKS} blocks with their own values (at most {ROUNDS} expected); {after}"
        );
    }
}

/// A block the processes write in turn, one per round: each turn's writer
/// first takes the version the previous writer published (a read miss, or
/// a refresh of a hot or pinned copy: a transaction that leaves the
/// block's lock here), then changes its own words and some of the
/// previous writer's, and releases at the barrier. Nobody took the lock
/// in between, so the version it took is still the latest and the release
/// publishes its changes on top of it without a transaction (a *taken*
/// release; before, every turn was a second transaction that read the
/// previous writer's copy again and merged it) — with two processes, where
/// the next writer is the one that took the version. Everyone checks every
/// word after every round: a release that published a stale base would
/// lose the other writers' words.
fn taken_releases(dsm: &D) {
    const ROUNDS: usize = 60;
    const WORDS: usize = 512;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let p = dsm.alloc_segment(4096, 4096).unwrap() as *mut u64;
    let mut want = [0u64; WORDS];
    let before = dsm.stats();
    for round in 0..ROUNDS {
        let writer = round % n;
        // The writer's own eighth, and one word of the previous writer's.
        let (own, theirs) = (
            writer * WORDS / 8,
            ((writer + n - 1) % n) * WORDS / 8 + round % 64,
        );
        let prev = want[theirs];
        for (w, v) in want.iter_mut().enumerate().skip(own).take(64) {
            *v = word(round as u64, w);
        }
        want[theirs] = word(1000 + round as u64, theirs);
        if me == writer {
            // A read first: the turn takes the latest version, then writes.
            // SAFETY: inside the segment; only the writer touches it in
            // this phase.
            let seen = unsafe { p.add(theirs).read() };
            assert_eq!(
                seen, prev,
                "process {me}, round {round}: the previous writer's word"
            );
            for (w, v) in want.iter().enumerate().skip(own).take(64) {
                // SAFETY: as above.
                unsafe { p.add(w).write(*v) };
            }
            // SAFETY: as above.
            unsafe { p.add(theirs).write(want[theirs]) };
        }
        dsm.barrier().unwrap();
        for (w, v) in want.iter().enumerate() {
            // SAFETY: written before the barrier, not before the next.
            let got = unsafe { p.add(w).read() };
            assert_eq!(got, *v, "process {me}, round {round}: word {w}");
        }
        dsm.barrier().unwrap();
    }
    let after = dsm.stats();
    let taken = after.taken_releases - before.taken_releases;
    let cfg = dsm.config();
    if !cfg.fast_release_active() {
        assert_eq!(
            taken, 0,
            "process {me}: taken releases without fast release; {after}"
        );
    } else if !cfg.fast_read_active() && n == 2 {
        // Every turn but the first few (the first has no previous writer).
        // With more processes the lock goes wherever the last of the
        // others' read misses (or refreshes) of the new version took it,
        // which is the next writer only by chance. A debug build's slow
        // runtime, with prefetch, refresh and shared pins off, releases
        // some turns with a transaction (13 to 27 of 30 taken in repeated
        // runs, before and after partial reads and forks without a
        // barrier, not understood yet); there a third must be taken. CI
        // runs this test in a release build too, where almost every turn
        // is taken: 29 or 30 of 30 on a quiet machine, and once 27 in a
        // loaded CI run (the same timing effect, rarely); four in five
        // must be. Without taken releases none would be.
        let turns = ROUNDS / n;
        let least = if cfg!(debug_assertions) {
            turns / 3
        } else {
            turns * 4 / 5
        };
        assert!(
            taken >= least,
            "process {me}: {taken} of its {turns} turns released without a transaction \
             (at least {least} expected); {after}"
        );
    }
}

fn idle_limit(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let words = 4096 / 8;
    let p = dsm.alloc_segment(n * 2 * 4096, 4096).unwrap() as *mut u64;
    let once = me * 2 * words;
    let periodic = once + words;
    let check = idle_releases_counted(dsm);

    let idle_before = dsm.stats().idle_releases;
    // SAFETY: this process's own block.
    unsafe { p.add(once).write(1 + me as u64) };
    for _ in 0..20 {
        dsm.barrier().unwrap();
    }
    let idle = dsm.stats().idle_releases - idle_before;

    const ROUNDS: u64 = 12;
    let mut faults = Vec::new();
    for round in 1..=ROUNDS {
        let before = dsm.stats().write_faults;
        // SAFETY: this process's own block.
        unsafe { p.add(periodic).write(round) };
        faults.push(dsm.stats().write_faults - before);
        for _ in 0..3 {
            dsm.barrier().unwrap();
        }
    }
    for q in 0..n {
        // SAFETY: written before the barriers above.
        let (a, b) = unsafe {
            (
                p.add(q * 2 * words).read(),
                p.add(q * 2 * words + words).read(),
            )
        };
        assert_eq!(
            (a, b),
            (1 + q as u64, ROUNDS),
            "process {me}: blocks of process {q}"
        );
    }
    dsm.barrier().unwrap();
    if check {
        assert!(
            idle <= 3,
            "process {me}: a block written once was released idle {idle} times before \
             it was protected; {}",
            dsm.stats()
        );
        let late: usize = faults[ROUNDS as usize / 2..].iter().sum();
        assert_eq!(
            late,
            0,
            "process {me}: a block rewritten every third release still faults \
             ({faults:?}); {}",
            dsm.stats()
        );
    }
}

/// A block its process keeps writing without changing it: every third
/// release each process stores the same value into its own 4 KiB block
/// again (a converged vector that `x += alpha * p` no longer moves). Every
/// release finds the block idle, so the idle releases protect it, and the
/// next store faults; the limit grows with each fault that came soon after
/// the protection, and once it has reached its largest value a block that
/// still faults that soon stays listed. The later rounds must take no write
/// fault (before, the block was protected every 16 releases and faulted
/// again, forever). The values are checked everywhere at the end.
fn unchanged_rewrites(dsm: &D) {
    const ROUNDS: usize = 48;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let words = 4096 / 8;
    let p = dsm.alloc_segment(n * 4096, 4096).unwrap() as *mut u64;
    let check = idle_releases_counted(dsm);
    let mut faults = Vec::new();
    for _ in 0..ROUNDS {
        let before = dsm.stats().write_faults;
        for i in [0, words / 2] {
            // SAFETY: this process's own block.
            unsafe { p.add(me * words + i).write_volatile(7 + me as u64) };
        }
        faults.push(dsm.stats().write_faults - before);
        for _ in 0..3 {
            dsm.barrier().unwrap();
        }
    }
    for q in 0..n {
        for i in [0, words / 2] {
            // SAFETY: written before the barriers above.
            let v = unsafe { p.add(q * words + i).read() };
            assert_eq!(v, 7 + q as u64, "process {me}: block {q} word {i}");
        }
    }
    dsm.barrier().unwrap();
    if check {
        let early: usize = faults[..ROUNDS / 2].iter().sum();
        let late: usize = faults[ROUNDS / 2..].iter().sum();
        assert!(
            early > 1,
            "process {me}: the idle releases never protected a block rewritten unchanged \
             ({faults:?}); {}",
            dsm.stats()
        );
        assert_eq!(
            late,
            0,
            "process {me}: a block rewritten unchanged every third release still faults \
             ({faults:?}); {}",
            dsm.stats()
        );
    }
}

/// Flushes only, no barrier or lock in common: a token goes round the
/// processes `ROUNDS` times (the pipeline of LU-style wavefronts). The
/// holder checks the data of the previous holder, writes its own pattern
/// over the data blocks (4 KiB, several per round), flushes, raises its
/// flag and flushes again; the next process flushes in a loop until it sees
/// the flag, and once more before it reads the data — OpenMP's rules for
/// flag synchronisation (a flush between the data and the flag on both
/// sides: with a fixed home, the flag may reach the home's copy before the
/// writer's second flush). A flush that failed to publish or to acquire
/// leaves a stale flag (the wait times out) or stale data (the check
/// fails). At the end, flushes with nothing new to acquire report so (the
/// signal to back off).
/// A flag seen while its writer's flush is still publishing (process 0's
/// flush slot is marked as being rewritten for 300 ms after it set the
/// flag): process 1's flush must still acquire what process 0 published
/// before setting the flag — it waits for the publication in progress
/// instead of passing it over, and the data is not stale.
fn flush_while_publishing(dsm: &D) {
    use menps_dsm::com::{P2p, Source};
    const TAG: u32 = 7;
    let me = dsm.rank();
    // Block 0: the data; block 1: the flag.
    let seg = dsm.alloc_segment(2 * 4096, 4096).unwrap() as *mut u64;
    // SAFETY: inside the segment.
    let (data, flag) = (seg, unsafe { seg.add(512) });
    if me == 0 {
        // The flag's block then comes from process 0 at its next access
        // everywhere.
        // SAFETY: DSM memory only process 0 writes.
        unsafe { flag.write(7) };
    } else if me == 1 {
        // Process 1 holds a valid copy of the data's block.
        // SAFETY: DSM memory nobody writes before the barrier.
        assert_eq!(unsafe { data.read() }, 0);
    }
    dsm.barrier().unwrap();
    if me == 0 {
        // SAFETY: written by process 0 only, read by process 1 after the
        // flush that publishes it.
        unsafe { data.write(42) };
        dsm.flush().unwrap();
        // SAFETY: as above.
        unsafe { flag.write_volatile(1) };
        menps_dsm::internals::flush_publishing_during(dsm, || {
            dsm.com().send(1, TAG, &[]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
        })
        .unwrap();
    } else if me == 1 {
        dsm.com().recv(Source::Rank(0), TAG).unwrap();
        // SAFETY: the flag word, written by process 0 only.
        let mut seen = unsafe { flag.read_volatile() };
        if dsm.config().writer == WriterPolicy::Floating {
            // Fetched from process 0's copy, before its flush completed.
            assert_eq!(seen, 1, "the flag's block was not fetched from process 0");
        }
        // Under a fixed home the flag may only arrive with that flush.
        while seen != 1 {
            dsm.flush().unwrap();
            // SAFETY: as above.
            seen = unsafe { flag.read_volatile() };
        }
        dsm.flush().unwrap();
        // SAFETY: written by process 0 before its flag.
        let v = unsafe { data.read() };
        assert_eq!(
            v, 42,
            "data published before the flag is stale after a flush"
        );
    }
    dsm.barrier().unwrap();
}

fn flush_wavefront(dsm: &D) {
    const ROUNDS: u64 = 60;
    const DATA_WORDS: usize = 3 * 512;
    let (me, n) = (dsm.rank(), dsm.nprocs());
    // Block 0: one flag per process (8 words apart); blocks 1..4: the data.
    let seg = dsm.alloc_segment(4 * 4096, 4096).unwrap() as *mut u64;
    // SAFETY: inside the segment.
    let (flags, data) = unsafe { (seg, seg.add(512)) };
    let flag = |p: usize| {
        // SAFETY: inside block 0.
        unsafe { flags.add(8 * p) }
    };
    dsm.barrier().unwrap();
    let pattern = |step: u64, i: usize| step.wrapping_mul(0x9e37_79b9) ^ i as u64;
    for round in 0..ROUNDS {
        let step = round * n as u64 + me as u64 + 1;
        if step > 1 {
            // Wait for the previous holder's flag.
            let prev = (me + n - 1) % n;
            let started = std::time::Instant::now();
            // SAFETY: a flag word, written by `prev` only.
            while unsafe { flag(prev).read_volatile() } != step - 1 {
                dsm.flush().unwrap();
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(20),
                    "process {me}: no flag {} from process {prev} after 20 s",
                    step - 1
                );
                std::thread::yield_now();
            }
            dsm.flush().unwrap();
            for i in 0..DATA_WORDS {
                // SAFETY: written by `prev` before its flag.
                let v = unsafe { data.add(i).read() };
                assert_eq!(
                    v,
                    pattern(step - 1, i),
                    "step {step}: data word {i} is stale"
                );
            }
        }
        for i in 0..DATA_WORDS {
            // SAFETY: only the token holder writes the data.
            unsafe { data.add(i).write(pattern(step, i)) };
        }
        dsm.flush().unwrap();
        // SAFETY: our own flag.
        unsafe { flag(me).write_volatile(step) };
        dsm.flush().unwrap();
    }
    dsm.barrier().unwrap();
    let mut last = Vec::new();
    for _ in 0..6 {
        last.push(dsm.flush().unwrap());
        dsm.barrier().unwrap();
    }
    // Under fast read a written block is announced again at every release
    // until a transaction protects it (idle releases are off).
    if !dsm.config().fast_read_active() {
        assert!(
            !last.last().unwrap(),
            "flushes with nothing new still report news: {last:?}"
        );
    }
}

/// The same through a mutex: process 0 publishes version `v` (data in one
/// block, the version in another) once every reader acknowledged `v - 1`;
/// readers poll under the mutex and check the data of every version they
/// see. Lock hand-offs carry signatures, so a stale data block shows.
fn single_writer_mutex(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs() as u64);
    let seg = dsm.alloc_segment(64 * 1024, 32 * 1024).unwrap() as *mut u64;
    // Block 0: the data; block 1: version and acknowledgement count.
    // SAFETY: inside the segment.
    let (data, version, acks) = unsafe { (seg, seg.add(4096), seg.add(4097)) };
    let m = shared_mutex(dsm);
    const VERSIONS: u64 = 300;
    let mut seen = 0;
    loop {
        let g = dsm.lock(m).unwrap();
        // SAFETY: DSM memory protected by the mutex.
        unsafe {
            let v = version.read();
            if me == 0 {
                if v == VERSIONS && acks.read() == n - 1 {
                    g.unlock().unwrap();
                    break;
                }
                if v < VERSIONS && (v == 0 || acks.read() == n - 1) {
                    data.write(v + 1);
                    data.add(3000).write((v + 1) * 7);
                    version.write(v + 1);
                    acks.write(0);
                }
            } else if v > seen {
                assert_eq!(
                    (data.read(), data.add(3000).read()),
                    (v, v * 7),
                    "process {me} read stale data for version {v}"
                );
                seen = v;
                acks.write(acks.read() + 1);
            }
        }
        g.unlock().unwrap();
        if me != 0 && seen == VERSIONS {
            break;
        }
    }
    dsm.barrier().unwrap();
}

/// 32 user-level threads per process on 2 workers write and read DSM blocks
/// they share with each other: faults resolve on the faulting ULT's stack,
/// park it while another ULT holds the block, and resume it — possibly on
/// the other worker.
fn ult_faults() {
    use ct_worker::Ult;
    let com: AnyCom<Ult> = menps_dsm::launch::Builder::new()
        .default_nprocs(2)
        .init_or_relaunch()
        .unwrap_or_else(|e| {
            eprintln!("cannot join the job: {e}");
            std::process::exit(3)
        });
    let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
    rt.block_on(move || {
        let dsm = Dsm::<AnyCom<Ult>, Ult>::new(com).unwrap();
        let (me, n) = (dsm.rank(), dsm.nprocs());
        let ults = 32;
        let bytes = 512 * 1024;
        let seg = dsm.alloc_segment(bytes, 4096).unwrap() as usize;
        let words = bytes / 8;
        let per_proc = words / n;
        let value = |p: usize, i: usize| ((p as u64) << 40) | i as u64;
        for round in 0..3usize {
            // Each ULT writes every `ults`-th word of this process's part:
            // all ULTs share all of its blocks.
            ct_worker::scope(|s| {
                for t in 0..ults {
                    s.spawn(move || {
                        let p = seg as *mut u64;
                        for i in (me * per_proc + t..(me + 1) * per_proc).step_by(ults) {
                            // SAFETY: word i belongs to this process and ULT.
                            unsafe { p.add(i).write(value(me, i) + round as u64) };
                        }
                    });
                }
            });
            dsm.barrier().unwrap();
            ct_worker::scope(|s| {
                for t in 0..ults {
                    s.spawn(move || {
                        let p = seg as *const u64;
                        for i in (t..n * per_proc).step_by(ults) {
                            // SAFETY: written before the barrier.
                            let v = unsafe { p.add(i).read() };
                            assert_eq!(v, value(i / per_proc, i) + round as u64, "word {i}");
                        }
                    });
                }
            });
            dsm.barrier().unwrap();
        }
        println!("rank {me}: ok");
        dsm.finalize().unwrap();
    });
}

/// A coroutine runs on a call stack inside the DSM, pinned while it runs:
/// its frames are never protected, faults on other blocks resolve on it, and
/// a barrier inside it refreshes its own (pinned) blocks in place. While it
/// is suspended, its stack is unpinned and released, and another process
/// reads an array that lives in its frame.
fn pinned_stack(dsm: &D) {
    use ct_context::{Coroutine, RawStack};
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let stack_bytes = 256 * 1024;
    let stacks = dsm.alloc_segment(stack_bytes * n, 4096).unwrap();
    let data = dsm.alloc_segment(64 * 1024, 4096).unwrap() as *mut u64;
    // SAFETY: inside the segment; word 0 .. n: where each process's array is.
    let slots = data;
    // SAFETY: this process's stack, used by nobody else.
    let mine = unsafe { stacks.add(me * stack_bytes) };
    dsm.pin(mine, stack_bytes).unwrap();
    // SAFETY: the range is DSM memory reserved for this coroutine's stack,
    // pinned (always writable) while the coroutine runs.
    let stack = unsafe { RawStack::new(mine, stack_bytes) }.unwrap();
    let d = dsm as *const D as usize;
    let slots_addr = slots as usize;
    let mut co: Coroutine<(), (), u64, RawStack> = Coroutine::with_stack(stack, move |y, ()| {
        // SAFETY: the Dsm outlives the coroutine (it is dropped below).
        let dsm = unsafe { &*(d as *const D) };
        let slots = slots_addr as *mut u64;
        let mut local = [0u64; 512];
        for (i, x) in local.iter_mut().enumerate() {
            *x = (me as u64 + 1) * 1000 + i as u64;
        }
        // Faults on another segment's blocks, resolved on this stack.
        // SAFETY: word `me` of the slots belongs to this process.
        unsafe { slots.add(me).write(local.as_ptr() as u64) };
        // A barrier while pinned: acquires refresh the pinned blocks in
        // place.
        dsm.barrier().unwrap();
        assert_eq!(
            dsm.block_state(local.as_ptr() as *const u8),
            Some(menps_dsm::dsm::BlockState::Pinned)
        );
        y.suspend(());
        // Resumed: the array is intact.
        local.iter().sum::<u64>()
    })
    .unwrap();
    co.resume(());
    // Suspended: unpin the stack, so the next release publishes it.
    dsm.unpin(mine, stack_bytes).unwrap();
    dsm.barrier().unwrap();
    // Everybody reads everybody's array, which lives on a DSM stack.
    for p in 0..n {
        // SAFETY: written before the barrier.
        let arr = unsafe { slots.add(p).read() } as *const u64;
        for i in (0..512).step_by(37) {
            // SAFETY: the array is in process p's suspended coroutine's frame
            // (DSM memory), written before the barrier.
            let v = unsafe { arr.add(i).read() };
            assert_eq!(v, (p as u64 + 1) * 1000 + i as u64, "array of process {p}");
        }
    }
    dsm.barrier().unwrap();
    dsm.pin(mine, stack_bytes).unwrap();
    let sum = match co.resume(()) {
        ct_context::CoroutineResult::Return(s) => s,
        _ => panic!("the coroutine should have finished"),
    };
    let want: u64 = (0..512).map(|i| (me as u64 + 1) * 1000 + i).sum();
    assert_eq!(sum, want);
    dsm.unpin(mine, stack_bytes).unwrap();
    drop(co);
    dsm.barrier().unwrap();
}

/// An access inside the DSM range but outside every segment is an ordinary
/// segmentation fault (with a hint on stderr).
fn segv_outside(dsm: &D) {
    let _seg = dsm.alloc_segment(64 * 1024, 4096).unwrap();
    let p = (menps_dsm::internals::DSM_BASE + (64 << 30) * 5) as *const u64;
    eprintln!("about to fault");
    // SAFETY: deliberately invalid (the test expects the crash).
    let v = unsafe { p.read_volatile() };
    println!("read {v}: not reached");
}

/// A null dereference still crashes as usual while the DSM is active.
fn segv_null(dsm: &D) {
    let _seg = dsm.alloc_segment(64 * 1024, 4096).unwrap();
    let p = std::hint::black_box(core::ptr::null::<u64>());
    // SAFETY: deliberately invalid (the test expects the crash).
    let v = unsafe { p.read_volatile() };
    println!("read {v}: not reached");
}

fn recurse(n: u64) -> u64 {
    let pad = std::hint::black_box([n; 64]);
    if n == u64::MAX {
        return pad[0];
    }
    recurse(n + 1).wrapping_add(pad[1])
}

/// A user-level thread's stack overflow is still reported as such while the
/// DSM's fault hook is installed.
fn overflow(dsm: &D) {
    let _seg = dsm.alloc_segment(64 * 1024, 4096).unwrap();
    let stack = ct_context::MmapStack::new(64 * 1024).unwrap();
    let mut co: ct_context::Coroutine<(), (), u64, ct_context::MmapStack> =
        ct_context::Coroutine::with_stack(stack, |_, ()| recurse(0)).unwrap();
    co.resume(());
    println!("not reached");
}

/// A thread with DSM fault handling disabled crashes, with a message, when
/// it touches a protected block.
fn disabled_thread(dsm: &D) {
    let seg = dsm.alloc_segment(64 * 1024, 4096).unwrap();
    menps_dsm::internals::disable_on_this_thread();
    assert!(!menps_dsm::internals::is_enabled_on_this_thread());
    // SAFETY: deliberately touching a protected block (the test expects the
    // crash).
    let v = unsafe { seg.read_volatile() };
    println!("read {v}: not reached");
}

/// Offset of the byte the race scenario writes: in block 2, whose fixed
/// home is process 2 (with 3 processes), so that under both writer
/// policies the racing writers merge into a third copy.
pub const RACE_OFFSET: usize = 2 * 4096 + 100;

/// Processes 0 and 1 write the same byte, both before either releases: the
/// second merge must report the race. (A write that follows another
/// process's release without synchronisation can go unnoticed: detection
/// compares against the version a process started from.)
/// Races that go on (`MENPS_DSM_ON_RACE=report`): processes 0 and 1 write
/// the same byte of a segment word and of a heap object word in each of 5
/// rounds, with different values, both before either releases; every
/// barrier passes, and after each every process reads the same value, one
/// of the two written.
fn races_reported(dsm: &D) {
    let me = dsm.rank();
    let seg = dsm.alloc_segment(32 * 1024, 4096).unwrap();
    let mut p = [0u8; 8];
    if me == 0 {
        p = (dsm.alloc(256, 8).unwrap() as u64).to_le_bytes();
    }
    menps_dsm::com::Coll::broadcast(dsm.com(), 0, &mut p).unwrap();
    let obj = u64::from_le_bytes(p) as *mut u8;
    dsm.barrier().unwrap();
    for round in 0..5u8 {
        if me < 2 {
            let v = 10 * round + me as u8 + 1;
            // SAFETY: deliberately racing writes to DSM memory (the test).
            unsafe {
                seg.add(RACE_OFFSET).write(v);
                obj.add(RACE_HEAP_OFFSET).write(v);
            }
        }
        // Both wrote (from the same version) before either releases.
        menps_dsm::com::Coll::barrier(dsm.com()).unwrap();
        dsm.barrier().unwrap();
        // SAFETY: read after the barrier (the race was resolved in it).
        let (a, b) = unsafe {
            (
                seg.add(RACE_OFFSET).read(),
                obj.add(RACE_HEAP_OFFSET).read(),
            )
        };
        let written = [10 * round + 1, 10 * round + 2];
        assert!(
            written.contains(&a) && written.contains(&b),
            "round {round}: {a} {b}"
        );
        println!("rank {me}: round {round}: {a} {b}");
        dsm.barrier().unwrap();
    }
}

/// Offset of the racing byte in the heap object of `races_reported`.
pub const RACE_HEAP_OFFSET: usize = 100;

fn race(dsm: &D) {
    let me = dsm.rank();
    let seg = dsm.alloc_segment(32 * 1024, 4096).unwrap();
    if me < 2 {
        // SAFETY: deliberately racing writes to DSM memory (the test).
        unsafe { seg.add(RACE_OFFSET).write(me as u8 + 1) };
    }
    menps_dsm::com::Coll::barrier(dsm.com()).unwrap();
    super::common::barrier_reporting_race(dsm);
}
