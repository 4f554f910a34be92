//! Shared by the multi-process test suites (`shm.rs`, `mpi.rs`, the DSM's
//! `dsm*.rs`): the scenarios every backend must pass, generic over
//! [`Communicator`](menps_dsm::com::Communicator), and the driver that runs a
//! job (directly or under `mpirun`) in its own process group with a time
//! limit and checks that nothing of it is left behind.

#![allow(dead_code)]

pub mod suite;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use menps_dsm::com::{
    CasOp, Communicator, Error, LocalWindow, RemotePtr, RmaRequest, Source, WindowId,
};

pub const SCENARIO: &str = "MENPS_TEST_SCENARIO";

/// The DSM of the job scenarios: any backend, OS threads.
pub type JobDsm = menps_dsm::dsm::Dsm<menps_dsm::com::AnyCom<ct_worker::OsThreads>>;

/// In a job process: joins the job as a `C` (2 processes unless
/// `MENPS_NPROCS` says otherwise, or the `mpirun` job; a 3 s grace after a
/// failure). A failure ends the process with status 3 and a message.
pub fn join_job<C: menps_dsm::launch::JoinJob>() -> C {
    menps_dsm::launch::Builder::new()
        .default_nprocs(2)
        .grace(Duration::from_secs(3))
        .init_or_relaunch()
        .unwrap_or_else(|e| {
            eprintln!("cannot join the job: {e}");
            std::process::exit(3)
        })
}

/// In a job process: joins the job (2 processes unless `MENPS_NPROCS` says
/// otherwise, or the `mpirun` job; a 3 s grace after a failure) and starts
/// the DSM. A failure ends the process with status 3 and a message.
pub fn start_dsm_job() -> JobDsm {
    JobDsm::new(join_job()).unwrap_or_else(|e| {
        eprintln!("cannot start the DSM: {e}");
        std::process::exit(3)
    })
}

/// The end of a race scenario: the DSM barrier that merges the racing
/// writes must report the race (the process exits 42 then, 43 on another
/// error, 44 if an error comes only later; it returns if nothing failed).
pub fn barrier_reporting_race(dsm: &JobDsm) {
    let me = dsm.rank();
    match dsm.barrier() {
        Err(menps_dsm::dsm::DsmError::DataRace(r)) => {
            println!("rank {me}: detected: {r}");
            std::process::exit(42);
        }
        Err(e) => {
            println!("rank {me}: other error: {e}");
            std::process::exit(43);
        }
        Ok(()) => {}
    }
    dsm.barrier().unwrap_or_else(|e| {
        println!("rank {me}: later error: {e}");
        std::process::exit(44);
    });
}

/// The DSM policy combinations every DSM suite runs its scenarios under:
/// writer, invalidation, and the fast paths: `"1"` fast release (the
/// default configuration), `"read"` fast release and fast read, `"0"`
/// neither.
pub const DSM_POLICIES: [(&str, &str, &str); 8] = [
    ("floating", "hybrid", "1"),
    ("floating", "hybrid", "read"),
    ("floating", "hybrid", "0"),
    ("floating", "timestamp", "1"),
    ("floating", "directory", "1"),
    ("fixed", "hybrid", "1"),
    ("fixed", "timestamp", "1"),
    ("fixed", "directory", "1"),
];

/// The values of `MENPS_DSM_FAST_RELEASE` and `MENPS_DSM_FAST_READ` for
/// the third field of a policy of [`DSM_POLICIES`].
pub fn fast_paths(fast: &str) -> (&'static str, &'static str) {
    match fast {
        "read" => ("1", "1"),
        "1" => ("1", "0"),
        _ => ("0", "0"),
    }
}

/// The `MENPS_DSM_*` variables that select a policy of [`DSM_POLICIES`].
pub fn dsm_policy_env<'a>(
    (writer, invalidation, fast): (&'a str, &'a str, &'a str),
) -> [(&'static str, &'a str); 4] {
    let (release, read) = fast_paths(fast);
    [
        ("MENPS_DSM_WRITER", writer),
        ("MENPS_DSM_INVALIDATION", invalidation),
        ("MENPS_DSM_FAST_RELEASE", release),
        ("MENPS_DSM_FAST_READ", read),
    ]
}

/// Asserts that a job succeeded and that every one of its `n` processes
/// printed `rank R: ok`.
pub fn assert_passed(run: &JobRun, what: &str, n: usize) {
    assert!(run.status.success(), "{what}: {}", run.dump());
    for r in 0..n {
        assert!(
            run.stdout.contains(&format!("rank {r}: ok")),
            "{what}: rank {r} did not finish: {}",
            run.dump()
        );
    }
}
pub const JOB_TAG: &str = "MENPS_TEST_JOB";
/// Longest a job may take before the driver calls it a hang, unless
/// `MENPS_TEST_JOB_LIMIT_SECS` says otherwise ([`job_limit`]).
pub const JOB_LIMIT: Duration = Duration::from_secs(60);

/// The job time limit: [`JOB_LIMIT`], or `MENPS_TEST_JOB_LIMIT_SECS` seconds
/// (for slow set-ups, e.g. jobs across the simulated hosts of
/// `tests/multihost/`).
pub fn job_limit() -> Duration {
    std::env::var("MENPS_TEST_JOB_LIMIT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(JOB_LIMIT, Duration::from_secs)
}

/// Runs one of the shared scenarios; `false` if `name` is not one of them.
pub fn run_common_scenario<C: Communicator>(name: &str, com: &C) -> bool {
    match name {
        "hello" => println!("hello {} of {}", com.rank(), com.size()),
        "rma" => scenario_rma(com),
        "fetch_add" => scenario_fetch_add(com),
        "cas_lock" => scenario_cas_lock(com),
        "p2p" => scenario_p2p(com),
        "coll" => scenario_coll(com),
        "addresses" => scenario_addresses(com),
        _ => return false,
    }
    true
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub const SIZES: &[usize] = &[
    1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 127, 255, 256, 257, 1000, 4095, 4096, 4097, 8191,
    65535, 65536, 65537, 100_003, 262_144, 1_048_575, 1_048_576,
];
pub const OFFSETS: &[u64] = &[0, 1, 7, 8, 13, 4093];
pub const GUARD: usize = 64;

/// Checks the `Windows` guarantee the DSM relies on: the (fresh, not yet
/// accessed by anyone) local part is page-aligned and a shared mapping — a
/// second mapping of its pages (`mremap` with old size 0) sees its bytes
/// both ways.
pub fn assert_aliasable(local: &menps_dsm::com::LocalWindow) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let p = local.as_ptr();
    assert!(
        (p as usize).is_multiple_of(page),
        "local part at {p:p} is not page-aligned"
    );
    let len = local.len().next_multiple_of(page).min(4 * page);
    // SAFETY: duplicates (does not move) our own mapping of the local part
    // at an address the kernel chooses; nothing else is affected.
    let alias = unsafe { libc::mremap(p.cast(), 0, len, libc::MREMAP_MAYMOVE) };
    assert_ne!(
        alias,
        libc::MAP_FAILED,
        "local part at {p:p} cannot be aliased (not a shared mapping): {}",
        std::io::Error::last_os_error()
    );
    let alias = alias.cast::<u8>();
    // SAFETY: the first byte of the local part, which no other process
    // accesses before the scenario's first barrier, through both mappings
    // (volatile: the compiler must not assume they are distinct); restored
    // to 0 afterwards; then our alias is unmapped.
    unsafe {
        alias.write_volatile(0x5a);
        assert_eq!(p.read_volatile(), 0x5a, "the alias does not share memory");
        p.write_volatile(0);
        assert_eq!(alias.read_volatile(), 0, "the alias does not share memory");
        libc::munmap(alias.cast(), len);
    }
}

/// Put/get of every size class at odd offsets into the next rank's window,
/// checked at the target (including untouched guard bytes on both sides)
/// and read back remotely; then every misuse error.
/// `Rma::read_all` and `Rma::compare_and_swap_all` on `win` (of
/// [`scenario_rma`], at least 2 MiB + 4 KiB per process): reads of every
/// process at once, small ones (the served backend combines them into one
/// request per process) with a large one; compare-and-swaps on every
/// process's words, one that swaps and one that does not per process; and
/// their misuse.
fn rma_batches<C: Communicator>(com: &C, win: WindowId, local: &LocalWindow) {
    let (me, n) = (com.rank(), com.size());
    const BIG: usize = 70_000;
    const WORDS: u64 = 2 << 20;
    let data = |r: usize| pattern(0xba7c + r as u64, (1 << 20) + BIG);
    // SAFETY: nobody accesses our window between the barriers around this.
    unsafe {
        local.as_mut_slice()[..(1 << 20) + BIG].copy_from_slice(&data(me));
        local.as_mut_slice()[WORDS as usize..WORDS as usize + 24 * n].fill(0);
    }
    com.barrier().unwrap();
    let ranges: Vec<(usize, usize, usize)> = (0..n)
        .flat_map(|r| {
            [
                (r, 8 * r, 8),
                (r, 4096 + r, 100),
                (r, 1 << 20, BIG),
                (r, 3, 1),
            ]
        })
        .collect();
    let mut bufs: Vec<Vec<u8>> = ranges.iter().map(|&(_, _, len)| vec![0u8; len]).collect();
    let mut reads: Vec<_> = ranges
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&(r, off, _), b)| (win.at(r, off as u64), &mut b[..]))
        .collect();
    com.read_all(&mut reads).unwrap();
    for (&(r, off, len), b) in ranges.iter().zip(&bufs) {
        assert!(
            b[..] == data(r)[off..off + len],
            "rank {me}: read_all of {len} bytes at {off} of rank {r} wrong"
        );
    }
    // Word `me` of every process swaps from 0; word `n + me` stays 0.
    let mut ops: Vec<CasOp> = (0..n)
        .flat_map(|r| {
            [
                CasOp::new(win.at(r, WORDS + 8 * me as u64), 0, me as u64 + 1),
                CasOp::new(win.at(r, WORDS + 8 * (n + me) as u64), 7, 9),
            ]
        })
        .collect();
    com.compare_and_swap_all(&mut ops).unwrap();
    for (k, op) in ops.iter().enumerate() {
        assert_eq!(
            op.old, 0,
            "rank {me}: compare_and_swap_all op {k} found {}",
            op.old
        );
        assert_eq!(op.swapped(), k % 2 == 0, "rank {me}: op {k}");
    }
    com.barrier().unwrap();
    for r in 0..n {
        let at = |i: usize| {
            local
                .atomic_u64(WORDS as usize + 8 * i)
                .unwrap()
                .load(Ordering::SeqCst)
        };
        assert_eq!(at(r), r as u64 + 1, "rank {me}: word {r} after the batches");
        assert_eq!(at(n + r), 0, "rank {me}: word {} after the batches", n + r);
    }
    // Swaps, then reads in the same batch: every read sees the swap to its
    // process, also across requests (a read too large to share the swap's).
    let word = WORDS + 8 * (2 * n + me) as u64;
    let mut ops: Vec<CasOp> = (0..n)
        .map(|r| CasOp::new(win.at(r, word), 0, me as u64 + 10))
        .collect();
    let mut words = vec![[0u8; 8]; n];
    let mut bigs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; BIG]).collect();
    let mut reads: Vec<(RemotePtr, &mut [u8])> = Vec::new();
    for (r, (w, b)) in words.iter_mut().zip(bigs.iter_mut()).enumerate() {
        reads.push((win.at(r, 1 << 20), &mut b[..]));
        reads.push((win.at(r, word), &mut w[..]));
    }
    com.compare_and_swap_then_read_all(&mut ops, &mut reads)
        .unwrap();
    drop(reads);
    for r in 0..n {
        assert!(
            ops[r].swapped(),
            "rank {me}: swap at rank {r} found {}",
            ops[r].old
        );
        assert_eq!(
            u64::from_le_bytes(words[r]),
            me as u64 + 10,
            "rank {me}: the read behind the swap at rank {r} did not see it"
        );
        assert!(
            bigs[r][..] == data(r)[1 << 20..(1 << 20) + BIG],
            "rank {me}: the large read of rank {r} in the batch is wrong"
        );
    }
    // Misuse: the batch fails as its first bad operation would alone.
    let size = local.len();
    let target = (me + 1) % n;
    let mut ok = [0u8; 8];
    let mut over = [0u8; 16];
    let mut reads = [
        (win.at(target, 0), &mut ok[..]),
        (win.at(target, size as u64 - 8), &mut over[..]),
    ];
    assert!(matches!(
        com.read_all(&mut reads),
        Err(Error::OutOfBounds { len: 16, .. })
    ));
    let mut ops = [CasOp::new(win.at(target, WORDS + 4), 0, 1)];
    assert!(matches!(
        com.compare_and_swap_all(&mut ops),
        Err(Error::UnalignedAtomic { .. })
    ));
    com.barrier().unwrap();
}

pub fn scenario_rma<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let bytes = 2 * 1024 * 1024 + 2 * 4096;
    let win = com.create_window(bytes).unwrap();
    let local = com.local_window(win).unwrap();
    assert_eq!(local.len(), bytes);
    assert_aliasable(&local);
    let target = (me + 1) % n;
    let writer = (me + n - 1) % n;
    let mut iteration = 0u64;
    for &size in SIZES {
        for &off in OFFSETS {
            iteration += 1;
            let lo = off as usize;
            // Reset our window's region (and guards) before anyone writes.
            // SAFETY: nobody accesses our window between these barriers.
            unsafe { local.as_mut_slice()[lo.saturating_sub(GUARD)..lo + size + GUARD].fill(0) };
            com.barrier().unwrap();
            let data = pattern(iteration * 1000 + me as u64, size);
            if iteration.is_multiple_of(2) {
                com.write(win.at(target, off), &data).unwrap();
            } else {
                // SAFETY: `data` lives until the request is waited for.
                let r = unsafe { com.write_nb(win.at(target, off), data.as_ptr(), size) }.unwrap();
                assert_eq!(r.wait().unwrap(), 0);
            }
            com.flush(target).unwrap();
            com.barrier().unwrap();
            // Check what our writer put into our window.
            // SAFETY: nobody writes our window until the next barrier.
            let mine = unsafe { local.as_slice() };
            let expect = pattern(iteration * 1000 + writer as u64, size);
            assert!(
                mine[lo..lo + size] == expect[..],
                "rank {me}: data from rank {writer} wrong (size {size}, offset {off})"
            );
            assert!(
                mine[lo.saturating_sub(GUARD)..lo].iter().all(|&b| b == 0)
                    && mine[lo + size..lo + size + GUARD].iter().all(|&b| b == 0),
                "rank {me}: guard bytes around size {size} offset {off} were overwritten"
            );
            // Read back remotely into an odd destination alignment.
            let mut back = vec![0u8; size + 3];
            let dst = &mut back[3..];
            if iteration.is_multiple_of(3) {
                // SAFETY: `dst` lives and is untouched until the wait.
                let r =
                    unsafe { com.read_nb(win.at(target, off), dst.as_mut_ptr(), size) }.unwrap();
                r.wait().unwrap();
            } else {
                com.read(win.at(target, off), dst).unwrap();
            }
            assert!(
                dst == &data[..],
                "rank {me}: read-back wrong (size {size}, offset {off})"
            );
            com.barrier().unwrap();
        }
    }

    rma_batches(com, win, &local);

    // Misuse gives clear errors.
    let w = win.0;
    let size = bytes;
    let mut b4 = [0u8; 4];
    assert_eq!(
        com.read(win.at(target, size as u64 - 3), &mut b4),
        Err(Error::OutOfBounds {
            window: w,
            offset: size as u64 - 3,
            len: 4,
            size
        })
    );
    assert!(matches!(
        com.read(win.at(target, u64::MAX), &mut b4[..1]),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        com.write(win.at(target, size as u64 + 1), &[]),
        Err(Error::OutOfBounds { .. })
    ));
    com.write(win.at(target, size as u64), &[]).unwrap(); // empty access at the end is fine
    assert_eq!(
        com.compare_and_swap(win.at(target, 4), 0, 1),
        Err(Error::UnalignedAtomic {
            window: w,
            offset: 4
        })
    );
    assert_eq!(
        com.fetch_add(win.at(target, 12), 1),
        Err(Error::UnalignedAtomic {
            window: w,
            offset: 12
        })
    );
    assert!(matches!(
        com.fetch_add(win.at(target, size as u64), 1),
        Err(Error::OutOfBounds { len: 8, .. })
    ));
    assert_eq!(
        com.read(WindowId(999).at(target, 0), &mut b4),
        Err(Error::UnknownWindow { window: 999 })
    );
    assert_eq!(
        com.read(win.at(n, 0), &mut b4),
        Err(Error::BadRank { rank: n, size: n })
    );
    assert!(matches!(
        local.atomic_u64(3),
        Err(Error::UnalignedAtomic { .. })
    ));
    assert!(matches!(
        local.atomic_u64(size),
        Err(Error::OutOfBounds { .. })
    ));
    let big = vec![0u8; com.max_message_bytes() + 1];
    assert_eq!(
        com.send(target, 1, &big),
        Err(Error::MessageTooLarge {
            len: big.len(),
            max: 64 * 1024
        })
    );
    // Error messages name what is wrong.
    let msg = Error::OutOfBounds {
        window: 1,
        offset: 9,
        len: 8,
        size: 16,
    }
    .to_string();
    assert!(
        msg.contains("offset 9") && msg.contains("16 bytes"),
        "{msg}"
    );

    // More windows: ids agree everywhere; an empty window works; destroy.
    let empty = com.create_window(0).unwrap();
    let small = com.create_window(24).unwrap();
    let ids = u64s(
        &com.allgather(
            &[u64::from(empty.0), u64::from(small.0)]
                .map(u64::to_le_bytes)
                .concat(),
        )
        .unwrap(),
    );
    for r in 0..n {
        assert_eq!(
            (ids[2 * r], ids[2 * r + 1]),
            (u64::from(empty.0), u64::from(small.0))
        );
    }
    com.read(empty.at(target, 0), &mut []).unwrap();
    assert!(matches!(
        com.read(empty.at(target, 0), &mut b4),
        Err(Error::OutOfBounds { .. })
    ));
    com.fetch_add(small.at(0, 16), 1).unwrap();
    com.barrier().unwrap();
    assert_eq!(com.atomic_load(small.at(0, 16)).unwrap(), n as u64);
    com.barrier().unwrap();
    com.destroy_window(small).unwrap();
    assert_eq!(
        com.fetch_add(small.at(0, 16), 1),
        Err(Error::UnknownWindow { window: small.0 })
    );
    assert!(matches!(
        com.destroy_window(small),
        Err(Error::UnknownWindow { .. })
    ));
    // Mismatched sizes: every process gets the error, and the next window
    // still gets the next id everywhere.
    let r = com.create_window(100 + me);
    if n > 1 {
        assert!(matches!(r, Err(Error::CollectiveMismatch(_))), "{r:?}");
    }
    let after = com.create_window(8).unwrap();
    let ids = u64s(&com.allgather(&u64::from(after.0).to_le_bytes()).unwrap());
    assert!(ids.iter().all(|&i| i == u64::from(after.0)));
    com.barrier().unwrap();
    println!("rank {me}: rma ok ({iteration} put/get cases)");
}

pub const ADDS: u64 = 10_000;

/// Every process does 10^4 fetch-adds of 1 on one word of rank 0; the total
/// is exact and the old values are exactly 0..N·10^4, each seen once.
pub fn scenario_fetch_add<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let win = com.create_window(64).unwrap();
    let word = win.at(0, 8);
    com.barrier().unwrap();
    let seen = std::sync::Arc::new(Mutex::new(Vec::with_capacity(ADDS as usize)));
    for i in 0..ADDS {
        match i % 3 {
            // (The lock is taken after the operation: a callback of an
            // earlier operation may still need it to complete.)
            0 => {
                let v = com.fetch_add(word, 1).unwrap();
                seen.lock().unwrap().push(v);
            }
            1 => {
                let v = com.fetch_add_nb(word, 1).unwrap().wait().unwrap();
                seen.lock().unwrap().push(v);
            }
            _ => {
                let s = seen.clone();
                com.fetch_add_nb(word, 1)
                    .unwrap()
                    .on_complete(move |v| s.lock().unwrap().push(v.unwrap()));
            }
        }
    }
    com.flush(0).unwrap();
    com.barrier().unwrap();
    let total = com.atomic_load(word).unwrap();
    assert_eq!(total, n as u64 * ADDS, "rank {me}: fetch_add total");
    let olds = seen.lock().unwrap().clone();
    assert_eq!(olds.len(), ADDS as usize);
    assert!(
        olds.windows(2).all(|w| w[0] < w[1]),
        "old values must increase per process"
    );
    // Chunked allgather of 80 KB per process.
    let all = u64s(
        &com.allgather(
            &olds
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        )
        .unwrap(),
    );
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert!(
        sorted.iter().copied().eq(0..n as u64 * ADDS),
        "every old value 0..{} exactly once",
        n as u64 * ADDS
    );
    com.barrier().unwrap();
    println!("rank {me}: fetch_add ok, total {total}");
}

pub const LOCK_ITERS: u64 = 20_000;

/// A CAS spinlock on rank 0's window protecting a plain (non-atomic)
/// counter updated with RMA read + write; mutual exclusion is also checked
/// with an occupancy word.
pub fn scenario_cas_lock<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let win = com.create_window(4096).unwrap();
    let (lock, occupancy, counter) = (win.at(0, 0), win.at(0, 64), win.at(0, 128));
    com.barrier().unwrap();
    let me_tag = me as u64 + 1;
    for _ in 0..LOCK_ITERS {
        let mut spins = 0u32;
        while com.compare_and_swap(lock, 0, me_tag).unwrap() != 0 {
            spins += 1;
            if spins < 32 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        assert_eq!(
            com.fetch_add(occupancy, 1).unwrap(),
            0,
            "two holders at once"
        );
        let mut b = [0u8; 8];
        com.read(counter, &mut b).unwrap();
        let v = u64::from_le_bytes(b) + 1;
        com.write(counter, &v.to_le_bytes()).unwrap();
        assert_eq!(com.fetch_add(occupancy, u64::MAX).unwrap(), 1); // -1
        assert_eq!(
            com.compare_and_swap(lock, me_tag, 0).unwrap(),
            me_tag,
            "lock stolen"
        );
    }
    com.barrier().unwrap();
    let mut b = [0u8; 8];
    com.read(counter, &mut b).unwrap();
    let total = u64::from_le_bytes(b);
    assert_eq!(
        total,
        n as u64 * LOCK_ITERS,
        "rank {me}: counter under the CAS lock"
    );
    com.barrier().unwrap();
    println!("rank {me}: cas_lock ok, total {total}");
}

pub const PAIR_MSGS: u32 = 3_000;

pub fn msg(sender: usize, tag: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(len.max(12));
    m.extend_from_slice(&(sender as u32).to_le_bytes());
    m.extend_from_slice(&tag.to_le_bytes());
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend(pattern(
        u64::from(seq) * 31 + sender as u64,
        len.saturating_sub(12),
    ));
    m
}

pub fn check_msg(m: &[u8], sender: usize, tag: u32, seq: u32) {
    let f = |i: usize| u32::from_le_bytes(m[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!(
        (f(0), f(1), f(2)),
        (sender as u32, tag, seq),
        "wrong message (sender, tag, seq)"
    );
    assert!(m[12..] == pattern(u64::from(seq) * 31 + sender as u64, m.len() - 12)[..]);
}

/// Tag matching, per-pair FIFO order under load (ring wrap-around and
/// back-pressure), size limits, `recv_into`, self-messages.
pub fn scenario_p2p<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);

    // Tag matching: A0 B0 A1 B1 A2 to the next rank; it takes the Bs first.
    let (ta, tb) = (10, 20);
    for (tag, seq) in [(ta, 0), (tb, 0), (ta, 1), (tb, 1), (ta, 2)] {
        com.send(next, tag, &msg(me, tag, seq, 40)).unwrap();
    }
    for seq in 0..2 {
        let (s, m) = com.recv(Source::Rank(prev), tb).unwrap();
        assert_eq!(s, prev);
        check_msg(&m, prev, tb, seq);
    }
    assert_eq!(com.try_recv(Source::Rank(prev), 30).unwrap(), None);
    assert_eq!(com.try_recv(Source::Any, tb).unwrap(), None);
    for seq in 0..3 {
        let (s, m) = com.recv(Source::Any, ta).unwrap();
        assert_eq!(s, prev);
        check_msg(&m, prev, ta, seq);
    }
    com.barrier().unwrap();

    // Sizes: empty and maximal messages; recv_into leaves a too-long message.
    com.send(next, 3, &[]).unwrap();
    let big = pattern(me as u64, com.max_message_bytes());
    com.send(next, 4, &big).unwrap();
    assert_eq!(com.recv(Source::Rank(prev), 3).unwrap(), (prev, vec![]));
    let mut small = [0u8; 100];
    assert_eq!(
        com.recv_into(Source::Rank(prev), 4, &mut small),
        Err(Error::BufferTooSmall {
            len: big.len(),
            capacity: 100
        })
    );
    let mut full = vec![0u8; big.len() + 5];
    let (s, len) = com.recv_into(Source::Any, 4, &mut full).unwrap();
    assert_eq!((s, len), (prev, big.len()));
    assert!(full[..len] == pattern(prev as u64, len)[..]);
    // To oneself.
    com.send(me, 5, b"self").unwrap();
    assert_eq!(
        com.recv(Source::Rank(me), 5).unwrap(),
        (me, b"self".to_vec())
    );
    com.barrier().unwrap();

    // Every process sends PAIR_MSGS messages (0..300 bytes) to every other,
    // interleaved, on tag 7 while a second thread receives them; per sender
    // the sequence must be exactly 0, 1, 2, …
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut next_seq = vec![0u32; n];
            for i in 0..PAIR_MSGS as usize * (n - 1) {
                let (src, m) = if i % 2 == 0 {
                    com.recv(Source::Any, 7).unwrap()
                } else {
                    // Alternate a specific source that still has messages.
                    let src = (0..n)
                        .map(|k| (me + 1 + (i / 2 + k) % (n - 1).max(1)) % n)
                        .find(|&r| r != me && next_seq[r] < PAIR_MSGS);
                    match src {
                        Some(r) => com.recv(Source::Rank(r), 7).unwrap(),
                        None => com.recv(Source::Any, 7).unwrap(),
                    }
                };
                check_msg(&m, src, 7, next_seq[src]);
                next_seq[src] += 1;
            }
            next_seq
        });
        for seq in 0..PAIR_MSGS {
            for k in 1..n {
                let to = (me + k) % n;
                com.send(to, 7, &msg(me, 7, seq, 12 + (seq as usize * 37) % 290))
                    .unwrap();
            }
        }
        let got = receiver.join().unwrap();
        for (r, &c) in got.iter().enumerate() {
            assert_eq!(c, if r == me { 0 } else { PAIR_MSGS });
        }
    });
    com.barrier().unwrap();
    println!("rank {me}: p2p ok");
}

/// Barrier ordering, broadcast from every root, allgather of many sizes
/// (multi-chunk included), and mismatch detection.
pub fn scenario_coll<C: Communicator>(com: &C) {
    let (me, n) = (com.rank(), com.size());
    let win = com.create_window(8).unwrap();
    let local = com.local_window(win).unwrap();
    let word = local.atomic_u64(0).unwrap();
    for round in 1..=200u64 {
        word.store(round, Ordering::SeqCst);
        com.barrier().unwrap();
        for r in 0..n {
            assert_eq!(
                com.atomic_load(win.at(r, 0)).unwrap(),
                round,
                "barrier let rank {me} through early"
            );
        }
        com.barrier().unwrap();
    }
    for root in 0..n {
        for len in [0usize, 1, 13, 4096, 65536, 65537, 300_001] {
            let want = pattern((root * 7 + len) as u64, len);
            let mut buf = if me == root {
                want.clone()
            } else {
                vec![0xAA; len]
            };
            com.broadcast(root, &mut buf).unwrap();
            assert!(buf == want, "broadcast from {root} of {len} bytes");
        }
    }
    for len in [0usize, 1, 8, 1000, 65536, 100_000] {
        let all = com
            .allgather(&pattern((me * 1000 + len) as u64, len))
            .unwrap();
        assert_eq!(all.len(), n * len);
        for r in 0..n {
            assert!(all[r * len..(r + 1) * len] == pattern((r * 1000 + len) as u64, len)[..]);
        }
    }
    // Records of which a prefix matters: the first byte says how many
    // bytes (at least 1); the rest of each record must arrive up to there,
    // whatever the backend does with the bytes after it. Empty ones too.
    com.allgather_prefix_into(&[], 0, &|_| 0, &mut []).unwrap();
    for len in [1usize, 8, 200, 100_000] {
        for round in 0..3 {
            let used_by = |r: usize| 1 + (r * 37 + round * 11 + len) % len.min(255);
            let mut rec = pattern((me * 77 + round + len) as u64, len);
            rec[0] = used_by(me) as u8;
            let mut all = vec![0x5A; n * len];
            com.allgather_prefix_into(&rec, 1, &|h| usize::from(h[0]), &mut all)
                .unwrap();
            for r in 0..n {
                let want = pattern((r * 77 + round + len) as u64, len);
                let got = &all[r * len..(r + 1) * len];
                let u = used_by(r);
                assert_eq!(usize::from(got[0]), u, "rank {me}: prefix of rank {r}");
                assert!(
                    got[1..u] == want[1..u],
                    "rank {me}: the first {u} of {len} bytes of rank {r}'s record"
                );
            }
        }
    }
    if n > 1 {
        let e = com.allgather(&vec![1u8; 8 + me]).unwrap_err();
        assert!(matches!(e, Error::CollectiveMismatch(_)), "{e}");
        let mut b = [0u8; 4];
        let e = com.broadcast(me % 2, &mut b).unwrap_err();
        assert!(matches!(e, Error::CollectiveMismatch(_)), "{e}");
        let e = com.allgather_into(&[1, 2], &mut [0u8; 3]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    // Still in step after the errors.
    let ranks = com.allgather(&[me as u8]).unwrap();
    assert_eq!(ranks, (0..n as u8).collect::<Vec<_>>());
    println!("rank {me}: coll ok");
}

pub static A_STATIC: AtomicU64 = AtomicU64::new(0);

/// Every process has the same addresses for code and globals
/// (`ADDR_NO_RANDOMIZE`).
pub fn scenario_addresses<C: Communicator>(com: &C) {
    let persona = std::fs::read_to_string("/proc/self/personality").unwrap();
    let persona = u64::from_str_radix(persona.trim(), 16).unwrap();
    assert_ne!(persona & 0x0040000, 0, "ADDR_NO_RANDOMIZE not set");
    let addrs = [
        scenario_addresses::<C> as *const () as u64,
        &A_STATIC as *const AtomicU64 as u64,
    ];
    let all = u64s(
        &com.allgather(&addrs.map(u64::to_le_bytes).concat())
            .unwrap(),
    );
    for r in 0..com.size() {
        assert_eq!(
            &all[2 * r..2 * r + 2],
            &addrs,
            "rank {r} has other addresses"
        );
    }
    println!("rank {}: addresses identical {addrs:x?}", com.rank());
}

/// User-level threads: 16 ULTs per process on 2 workers exchange messages
/// in reverse order (so most must wait while others run), use fetch-add, and
/// the main ULT runs collectives.
pub fn scenario_ult<C: Communicator + 'static>(com: C) {
    let com = std::sync::Arc::new(com);
    let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
    let (me, n) = (com.rank(), com.size());
    let win = com.create_window(64).unwrap();
    const K: u32 = 16;
    rt.block_on(|| {
        for round in 0..5u32 {
            let handles: Vec<_> = (0..K)
                .map(|i| {
                    let com = com.clone();
                    ct_worker::spawn(move || {
                        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                        com.send(next, i, &msg(me, i, round, 64)).unwrap();
                        let want = K - 1 - i;
                        let (s, m) = com.recv(Source::Rank(prev), want).unwrap();
                        assert_eq!(s, prev);
                        check_msg(&m, prev, want, round);
                        com.fetch_add(RemotePtr::new(0, win, 0), 1).unwrap();
                    })
                })
                .collect();
            for h in handles {
                h.join();
            }
            com.barrier().unwrap();
        }
        let total = com.atomic_load(win.at(0, 0)).unwrap();
        assert_eq!(total, u64::from(5 * K) * n as u64);
    });
    com.barrier().unwrap();
    println!("rank {me}: ult ok");
}

// ---------------------------------------------------------------------------
// The driver side.

pub static SERIAL: Mutex<()> = Mutex::new(());
pub static NEXT_JOB: AtomicU64 = AtomicU64::new(0);

pub struct JobRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl JobRun {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn dump(&self) -> String {
        format!(
            "status {:?} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Processes whose environment carries `tag`.
pub fn processes_tagged(tag: &str) -> Vec<u32> {
    let needle = format!("{JOB_TAG}={tag}\0");
    let me = std::process::id();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ"))
            && env.windows(needle.len()).any(|w| w == needle.as_bytes())
        {
            // Zombies that are already reaped-pending still count; check state.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if !stat.contains(") Z ") {
                out.push(pid);
            }
        }
    }
    out
}

pub fn assert_no_leftovers(tag: &str) {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let left = processes_tagged(tag);
        if left.is_empty() {
            break;
        }
        if Instant::now() > until {
            for &p in &left {
                // SAFETY: killing leftover test processes by pid.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
            panic!("processes of job {tag} left behind: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let shm: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().contains("menps"))
                .map(|e| e.file_name())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        shm.is_empty(),
        "named shared memory left in /dev/shm: {shm:?}"
    );
}

/// Starts a job command in its own process group; `during` may act on it
/// while it runs (gets the launcher pid and the stdout so far).
pub fn drive(mut cmd: Command, tag: &str, mut during: impl FnMut(u32, &str) -> bool) -> JobRun {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    cmd.env(JOB_TAG, tag)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let limit = job_limit();
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn job");
    let pid = child.id();
    let read_all = |mut r: Box<dyn Read + Send>| {
        let buf = std::sync::Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        let t = std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(k) = r.read(&mut chunk) {
                if k == 0 {
                    break;
                }
                b.lock().unwrap().extend_from_slice(&chunk[..k]);
            }
        });
        (buf, t)
    };
    let (out, tout) = read_all(Box::new(child.stdout.take().unwrap()));
    let (err, terr) = read_all(Box::new(child.stderr.take().unwrap()));
    let mut acted = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if !acted {
            let so_far = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
            acted = during(pid, &so_far);
        }
        if start.elapsed() > limit {
            // SAFETY: killing the job's process group, which we created.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            let _ = child.wait();
            assert_no_leftovers(tag);
            panic!(
                "job {tag} hung: killed after {limit:?}\n--- stdout\n{}\n--- stderr\n{}",
                String::from_utf8_lossy(&out.lock().unwrap()),
                String::from_utf8_lossy(&err.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    assert_no_leftovers(tag);
    // Leftovers are gone, so the pipes reach EOF.
    tout.join().unwrap();
    terr.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err.lock().unwrap()).into_owned();
    JobRun {
        status,
        stdout,
        stderr,
        elapsed,
    }
}

/// Variables of the driver's environment its jobs keep: the suites run
/// with sequential prefetch, partial reads, the refresh of hot blocks,
/// the pinning of write-shared blocks and dirty scans on (the default) and
/// off (`MENPS_DSM_PREFETCH=0 MENPS_DSM_PARTIAL_READ=0 MENPS_DSM_REFRESH=0
/// MENPS_DSM_PIN_SHARED=0 MENPS_DSM_DIRTY_SCAN=0 cargo test ...`), with
/// dirty scans at every fence, however small its write set
/// (`MENPS_DSM_DIRTY_SCAN_MIN=0 cargo test ...`: the tests' write sets are
/// mostly below the default threshold), and over a modelled network
/// (`MENPS_NET_LATENCY=20us cargo test ...`, see `com::netmodel`; the
/// suites' timing expectations are those of one machine, though).
pub const PASSED_ON: &[&str] = &[
    "MENPS_DSM_PREFETCH",
    "MENPS_DSM_PARTIAL_READ",
    "MENPS_DSM_REFRESH",
    "MENPS_DSM_PIN_SHARED",
    "MENPS_DSM_DIRTY_SCAN",
    "MENPS_DSM_DIRTY_SCAN_MIN",
    "MENPS_NET_LATENCY",
    "MENPS_NET_BANDWIDTH",
];

/// The network model's variables, which tests of the model set themselves.
pub const NET_VARS: [&str; 2] = ["MENPS_NET_LATENCY", "MENPS_NET_BANDWIDTH"];

/// Runs a job of this test binary's `scenario` on `nprocs` processes with
/// exactly the network model `env` sets (the driver's [`NET_VARS`] are not
/// passed on), plus `env`'s other variables.
pub fn job_with_own_net_model(scenario: &str, nprocs: usize, env: &[(&str, &str)]) -> JobRun {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    for v in NET_VARS {
        cmd.env_remove(v);
    }
    cmd.env(SCENARIO, scenario)
        .env("MENPS_NPROCS", nprocs.to_string())
        .envs(env.iter().copied());
    drive(cmd, &new_tag(scenario), |_, _| false)
}

/// A command without any `MENPS_*` variable of the driver's environment
/// (but those of [`PASSED_ON`]).
pub fn clean_cmd(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k_str = k.to_string_lossy();
        if k_str.starts_with("MENPS_") && !PASSED_ON.contains(&&*k_str) {
            cmd.env_remove(k);
        }
    }
    cmd
}

pub fn new_tag(scenario: &str) -> String {
    format!(
        "{}-{}-{}",
        std::process::id(),
        NEXT_JOB.fetch_add(1, Ordering::Relaxed),
        scenario
    )
}

pub fn entry_args(cmd: &mut Command) {
    cmd.args([
        "job_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ]);
}

/// The `mpirun` program (`MENPS_TEST_MPIRUN` overrides `mpirun`).
pub fn mpirun_program() -> String {
    std::env::var("MENPS_TEST_MPIRUN").unwrap_or_else(|_| "mpirun".into())
}

/// Runs this test binary's `job_entry` as `mpirun --oversubscribe -n n`
/// (plus `--allow-run-as-root` as root), with [`SCENARIO`] = `scenario` and
/// `env` set in every process (forwarded with `-x`), driven like every job
/// ([`drive`]: time limit, no leftovers).
pub fn mpirun_job(scenario: &str, n: usize, env: &[(&str, &str)]) -> JobRun {
    let tag = new_tag(scenario);
    let mut cmd = clean_cmd(mpirun_program());
    cmd.args(["-n", &n.to_string(), "--oversubscribe"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--allow-run-as-root");
    }
    let mut vars: Vec<(String, String)> = vec![
        (SCENARIO.into(), scenario.into()),
        (JOB_TAG.into(), tag.clone()),
    ];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, v) in &vars {
        cmd.env(k, v).args(["-x", k]);
    }
    cmd.arg(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    drive(cmd, &tag, |_, _| true)
}

pub fn assert_ok(run: &JobRun, n: usize, line: &str) {
    assert!(run.status.success(), "job failed: {}", run.dump());
    for r in 0..n {
        let want = format!("rank {r}: {line}");
        assert!(
            run.stdout.contains(&want),
            "missing {want:?}: {}",
            run.dump()
        );
    }
}
