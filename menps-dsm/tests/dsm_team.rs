//! Multi-process tests of teams of threads across processes: fork–join on
//! user-level threads with DSM call stacks, the team barrier, keyed
//! mutexes, and the process-wide DSM handle (shm backend). The binary runs
//! with the DSM's global allocator.
//!
//! Each test drives jobs of this binary (see `common/`): the job processes
//! run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario.

use std::process::Command;

use ct_worker::OsThreads;
use menps_dsm::com::AnyCom;
use menps_dsm::dsm::allocator::is_dsm_pointer;
use menps_dsm::dsm::team::{FORK_SENT_MAX, Team, TeamBarrier, TeamThread};
use menps_dsm::dsm::{Dsm, DsmAllocator, DsmError, process};

#[global_allocator]
static ALLOC: DsmAllocator = DsmAllocator;

mod common;
use common::*;

type D = Dsm<AnyCom<OsThreads>, OsThreads>;

/// Threads per process of the team-barrier scenario.
const THREADS: usize = 2;
/// Team-barrier episodes.
const EPISODES: u64 = 10_000;

// ---------------------------------------------------------------------------
// The job side.

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    // Before the DSM starts, the handle says so.
    assert_eq!(process::with(|d| d.rank()), Err(DsmError::NotRunning));
    assert!(!process::is_running());
    let dsm: D = start_dsm_job();
    let me = dsm.rank();
    match name.as_str() {
        "team_barrier" => team_barrier(&dsm),
        "keyed" => keyed(&dsm),
        "handle" => handle(&dsm),
        "fork_main" => fork_main(&dsm),
        "team_barrier_ult" => team_barrier_ult(&dsm),
        "stack_intact" => stack_intact(&dsm),
        "fork_errors" => fork_errors(&dsm),
        "team_panic" => team_panic(&dsm),
        "fork_on" => fork_on(&dsm),
        "fork_team" => fork_team(&dsm),
        "fork_sent" => fork_sent(&dsm),
        "serve_idle" => serve_idle(&dsm),
        "fork_before_start" => fork_before_start(&dsm),
        "stack_overflow" => stack_overflow(&dsm),
        "dead_stack" => dead_stack(&dsm),
        "fork_chain" => fork_chain(&dsm),
        "plain_join" => plain_join(&dsm),
        other => panic!("unknown scenario {other}"),
    }
    dsm.finalize().unwrap();
    // After it ends, too.
    let e = process::with(|d| d.barrier()).unwrap_err();
    assert_eq!(e, DsmError::NotRunning);
    assert!(e.to_string().contains("no DSM is running"), "{e}");
    println!("rank {me}: ok");
}

/// `THREADS` OS threads per process meet `EPISODES` times; in episode `e`
/// every thread writes `e` into its slot of a DSM array (double-buffered by
/// parity) and, after the barrier, checks every slot of every process.
fn team_barrier(dsm: &D) {
    let (me, n) = (dsm.rank(), dsm.nprocs());
    let total = n * THREADS;
    let slots = dsm.alloc_segment(2 * 4096, 4096).unwrap() as usize;
    let barrier: TeamBarrier<'_, _, _, OsThreads> = TeamBarrier::new(dsm, THREADS);
    let leaders = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (barrier, leaders) = (&barrier, &leaders);
            s.spawn(move || {
                let id = me * THREADS + t;
                for e in 1..=EPISODES {
                    let buf = (slots + (e as usize % 2) * 4096) as *mut u64;
                    // SAFETY: slot `id` of this parity is this thread's.
                    unsafe { buf.add(id).write(e) };
                    if barrier.wait().unwrap() {
                        leaders.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    for k in 0..total {
                        // SAFETY: written before the barrier; nobody writes
                        // this parity again before the next barrier.
                        let v = unsafe { buf.add(k).read() };
                        assert_eq!(v, e, "episode {e}: thread {k} as seen by thread {id}");
                    }
                }
            });
        }
    });
    // One leader per episode in this process.
    assert_eq!(leaders.into_inner(), EPISODES);
}

/// Keyed mutexes: the same key is the same mutex everywhere, different keys
/// are different mutexes, without any exchange.
fn keyed(dsm: &D) {
    let me = dsm.rank();
    let counter = dsm.alloc_segment(4096, 4096).unwrap() as *mut u64;
    let keys = [0x1234u64, 0, 7, u64::MAX - 1];
    let ids: Vec<_> = keys
        .iter()
        .map(|&k| dsm.mutex_for_key(k).unwrap())
        .collect();
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            assert_ne!(a, b, "different keys, different mutexes");
        }
        assert_eq!(dsm.mutex_for_key(keys[i]).unwrap(), *a, "stable");
    }
    assert!(dsm.mutex_for_key(u64::MAX).is_err());
    assert!(
        dsm.free_mutex(ids[0]).is_err(),
        "keyed mutexes are not freed"
    );
    // Mutual exclusion through a key every process computes itself.
    for _ in 0..500 {
        let g = dsm
            .lock(dsm.mutex_for_key(counter as u64).unwrap())
            .unwrap();
        // SAFETY: DSM memory accessed under the keyed mutex only.
        unsafe { *counter += 1 };
        g.unlock().unwrap();
    }
    // Two keys held at once (nested critical sections with two names).
    let (a, b) = (dsm.mutex_for_key(1).unwrap(), dsm.mutex_for_key(2).unwrap());
    let ga = dsm.lock(a).unwrap();
    let gb = dsm.lock(b).unwrap();
    gb.unlock().unwrap();
    ga.unlock().unwrap();
    dsm.barrier().unwrap();
    // SAFETY: written before the barrier.
    assert_eq!(unsafe { *counter }, 500 * dsm.nprocs() as u64, "rank {me}");
    dsm.barrier().unwrap();
}

/// The process-wide handle reaches the running DSM from code that does not
/// know its types.
fn handle(dsm: &D) {
    let me = dsm.rank();
    assert!(process::is_running());
    let (r, n) = process::with(|d| (d.rank(), d.nprocs())).unwrap();
    assert_eq!((r, n), (me, dsm.nprocs()));
    let word = dsm.alloc_segment(4096, 4096).unwrap() as *mut u64;
    // Atomics, keyed locks and barriers through the handle.
    process::with(|d| {
        for _ in 0..100 {
            d.fetch_add(word, 1).unwrap();
        }
        let m = d.mutex_for_key(99).unwrap();
        assert_eq!(m, dsm.mutex_for_key(99).unwrap());
        d.lock(m).unwrap();
        d.unlock(m).unwrap();
        assert!(d.unlock(m).is_err(), "not locked");
        d.barrier().unwrap();
    })
    .unwrap();
    // SAFETY: the adds happened before the barrier.
    assert_eq!(unsafe { *word }, 100 * n as u64);
    // The heap through the handle, freed by another process.
    let mut b = [0u8; 8];
    if me == 0 {
        let p = process::with(|d| d.alloc(64, 8)).unwrap().unwrap();
        // SAFETY: a fresh heap object of 64 bytes.
        unsafe { p.cast::<u64>().write(4242) };
        b = (p as u64).to_le_bytes();
    }
    process::with(|d| d.broadcast(0, &mut b)).unwrap().unwrap();
    process::with(|d| d.barrier()).unwrap().unwrap();
    let p = u64::from_le_bytes(b) as *mut u8;
    // SAFETY: written before the barrier.
    assert_eq!(unsafe { p.cast::<u64>().read() }, 4242);
    let (lo, len) = process::with(|d| d.heap_range()).unwrap().unwrap();
    assert!((lo..lo + len).contains(&(p as usize)));
    assert_eq!(process::with(|d| d.usable_size(p)).unwrap().unwrap(), 64);
    process::with(|d| d.barrier()).unwrap().unwrap();
    if me == n - 1 {
        process::with(|d| d.free(p)).unwrap().unwrap();
    }
    assert_eq!(
        process::with(|d| d.stacks().map(|s| s.slot_size())).unwrap(),
        None,
        "no stack region before it is asked for"
    );
    dsm.create_stacks().unwrap();
    assert_eq!(
        process::with(|d| d.stacks().map(|s| s.slot_size())).unwrap(),
        Some(128 * 1024)
    );
    dsm.barrier().unwrap();
}

/// `main` on rank 0 runs on a DSM stack, builds a `Vec<String>` (DSM heap)
/// and a local array, forks a closure using both onto every process; each
/// team thread checks the strings and writes its part of the array; `main`
/// checks the array after the join.
fn fork_main(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    const TPP: usize = 2;
    let out = team
        .run_main(|| {
            let stacks = dsm.stacks().unwrap();
            let mut local = [0u64; 64];
            assert_eq!(
                stacks.owner_of(local.as_ptr().cast()).map(|(r, _)| r),
                Some(0),
                "main runs on one of rank 0's DSM stacks"
            );
            let names: Vec<String> = (0..50).map(|i| format!("name {i}")).collect();
            assert!(is_dsm_pointer(names.as_ptr().cast()));
            assert!(names.iter().all(|s| is_dsm_pointer(s.as_ptr())));
            let arr = local.as_mut_ptr() as usize;
            let names_ref = &names;
            let work = |t: &TeamThread<'_>| {
                // Every thread reads main's strings (DSM heap) ...
                for (i, s) in names_ref.iter().enumerate() {
                    assert_eq!(s, &format!("name {i}"));
                }
                // ... runs on a DSM stack of its own process ...
                let here = 0u8;
                let (r, _) = t_owner(&here);
                assert_eq!(r, t.rank());
                // ... and writes its part of main's array.
                let a = arr as *mut u64;
                for k in (t.thread_num()..64).step_by(t.num_threads()) {
                    // SAFETY: element k belongs to this thread.
                    unsafe { a.add(k).write(1000 * t.rank() as u64 + k as u64) };
                }
            };
            // SAFETY: the closure, `names` and `local` are in main's frame or
            // the DSM heap; threads write disjoint elements.
            unsafe { team.parallel(TPP, &work) }.unwrap();
            let n = dsm.nprocs();
            for (k, &v) in local.iter().enumerate() {
                let writer_rank = (k % (n * TPP)) / TPP;
                assert_eq!(v, 1000 * writer_rank as u64 + k as u64, "element {k}");
            }
            // A second fork sees the first one's results.
            // Main's heap vector (DSM heap), one word per thread.
            let mut sums = vec![0u64; dsm.nprocs()];
            let sum_addr = sums.as_mut_ptr() as usize;
            let check = |t: &TeamThread<'_>| {
                let a = arr as *const u64;
                // SAFETY: written by the previous fork, joined since.
                let s: u64 = (0..64).map(|k| unsafe { a.add(k).read() }).sum();
                // SAFETY: one word per thread of main's heap vector.
                unsafe { (sum_addr as *mut u64).add(t.thread_num()).write(s) };
            };
            // SAFETY: as above.
            unsafe { team.parallel(1, &check) }.unwrap();
            let want: u64 = local.iter().sum();
            assert_eq!(sums, vec![want; n]);
            (team.forks(), want)
        })
        .unwrap();
    match out {
        Some((forks, _)) => {
            assert_eq!(dsm.rank(), 0);
            assert_eq!(forks, 2);
        }
        None => assert_ne!(dsm.rank(), 0),
    }
    drop(team);
}

/// The process holding the DSM stack slot of `x`.
fn t_owner(x: &u8) -> (usize, usize) {
    process::with(|d| d.stacks().unwrap().owner_of(x).expect("on a DSM stack")).unwrap()
}

/// 2 team threads per process through 10,000 team-barrier episodes inside
/// one fork, with per-episode checks.
fn team_barrier_ult(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    let slots = dsm.alloc_segment(2 * 4096, 4096).unwrap() as usize;
    team.run_main(|| {
        let work = |t: &TeamThread<'_>| {
            let mut leaders = 0u64;
            for e in 1..=EPISODES {
                let buf = (slots + (e as usize % 2) * 4096) as *mut u64;
                // SAFETY: this thread's slot of this parity.
                unsafe { buf.add(t.thread_num()).write(e) };
                if t.barrier().unwrap() {
                    leaders += 1;
                }
                for k in 0..t.num_threads() {
                    // SAFETY: written before the barrier, not rewritten
                    // before the next one.
                    let v = unsafe { buf.add(k).read() };
                    assert_eq!(v, e, "episode {e}: thread {k} seen by {}", t.thread_num());
                }
            }
            // Exactly one leader per process and episode: every thread adds
            // its count to its process's word with a DSM atomic.
            let counts = slots as *mut u64;
            // SAFETY: word 1000 + rank of the segment, outside both buffers.
            process::with(|d| d.fetch_add(unsafe { counts.add(1000 + t.rank()) }, leaders))
                .unwrap()
                .unwrap();
        };
        // SAFETY: the closure captures addresses of DSM segments only.
        unsafe { team.parallel(THREADS, &work) }.unwrap();
        for r in 0..dsm.nprocs() {
            // SAFETY: written by the fork's atomics, joined.
            let leaders = unsafe { (slots as *const u64).add(1000 + r).read() };
            assert_eq!(leaders, EPISODES, "leaders of rank {r}");
        }
    })
    .unwrap();
}

/// Forks without barriers inside pass writes between any two processes: in
/// fork `r` the thread of process `r % n` writes word `r` of a segment (in
/// a block of its own, and in a block all writers share), and in every
/// later fork every thread checks every word written so far, whichever
/// process wrote it. `main` checks them between forks too.
fn fork_chain(dsm: &D) {
    const FORKS: usize = 60;
    let team = Team::new(dsm, 1).unwrap();
    let seg = dsm.alloc_segment(64 * 4096, 4096).unwrap() as usize;
    let value = |r: usize| (r as u64 + 1) * 0x1_0001;
    team.run_main(|| {
        for r in 0..FORKS {
            let work = |t: &TeamThread<'_>| {
                let own = seg as *mut u64;
                let shared = (seg + 63 * 4096) as *mut u64;
                for k in 0..r {
                    // SAFETY: written in an earlier fork.
                    let (a, b) = unsafe { (own.add((k % 63) * 512).read(), shared.add(k).read()) };
                    assert_eq!(
                        (a, b),
                        (value(k), value(k)),
                        "fork {r}: thread {} (process {}) sees word {k} stale",
                        t.thread_num(),
                        t.rank()
                    );
                }
                if t.rank() == r % t.nprocs() {
                    // SAFETY: only this process writes word r, in this fork.
                    unsafe {
                        own.add((r % 63) * 512).write(value(r));
                        shared.add(r).write(value(r));
                    }
                }
            };
            // SAFETY: the closure captures a segment address and numbers.
            unsafe { team.parallel(1, &work) }.unwrap();
            for k in 0..=r {
                // SAFETY: written by a fork that has ended.
                let v = unsafe { ((seg + 63 * 4096) as *const u64).add(k).read() };
                assert_eq!(v, value(k), "main after fork {r}: word {k}");
            }
        }
    })
    .unwrap();
}

/// Blocks of a stack below the live frames are not merged at releases. A
/// running thread's stack is pinned, and every pinned block used to be
/// merged at every release (the 16 blocks of a 128 KiB stack per barrier):
/// a team thread (one per process) passes barriers before and after
/// dirtying 12 blocks of its stack in a deep call, and each barrier merges
/// a few blocks only (its live frames and the data). Then it dirties a
/// deep frame again and shares it with its peer through a barrier: blocks
/// that are live again are published (the peer reads the frame's data).
fn dead_stack(dsm: &D) {
    const EPISODES: usize = 50;
    let team = Team::new(dsm, 1).unwrap();
    let share = dsm.alloc_segment(4096, 4096).unwrap() as usize;
    #[inline(never)]
    fn dirty(depth: u32) -> u64 {
        // 8 KiB per level: about one stack block each.
        let mut frame = [0u64; 1024];
        for (i, x) in frame.iter_mut().enumerate() {
            *x = u64::from(depth) ^ i as u64;
        }
        let below = if depth == 0 { 0 } else { dirty(depth - 1) };
        core::hint::black_box(&frame)[depth as usize] + below
    }
    team.run_main(|| {
        let work = |t: &TeamThread<'_>| {
            let merges = || {
                let s = process::with(|d| d.stats()).unwrap();
                s.transactions + s.fast_releases
            };
            let per_barrier = || {
                let before = merges();
                for _ in 0..EPISODES {
                    t.barrier().unwrap();
                }
                (merges() - before) as f64 / EPISODES as f64
            };
            let shallow = per_barrier();
            core::hint::black_box(dirty(11));
            let after_deep = per_barrier();
            // On x86-64 the barrier knows where the caller's frames end,
            // so the runtime's frames below (whose saved registers change
            // at every call) are not published either: about none in an
            // optimised build (a debug build keeps the loop's counter in
            // this frame, which is the program's and changes every time).
            let most = if cfg!(target_arch = "x86_64") && !cfg!(debug_assertions) {
                0.5
            } else {
                4.0
            };
            assert!(
                shallow <= most && after_deep <= most,
                "thread {}: {after_deep} merges per barrier after a deep call, {shallow} before \
                 (a stack has {} blocks)",
                t.thread_num(),
                128 / 8
            );
            // A deep frame shared through the barrier: its blocks are live.
            #[inline(never)]
            fn share_deep(t: &TeamThread<'_>, share: usize, depth: u32) {
                let mut frame = [0u64; 1024];
                if depth > 0 {
                    return share_deep(t, share, depth - 1);
                }
                for (i, x) in frame.iter_mut().enumerate() {
                    *x = (t.thread_num() as u64) << 32 | i as u64;
                }
                let slots = share as *mut u64;
                // SAFETY: this thread's slot of the shared segment.
                unsafe { slots.add(t.thread_num()).write(frame.as_ptr() as u64) };
                t.barrier().unwrap();
                let peer = (t.thread_num() + 1) % t.num_threads();
                // SAFETY: the peer's frame address, published before the
                // barrier; the peer's frame lives until the next barrier.
                let theirs = unsafe { slots.add(peer).read() } as *const u64;
                for i in (0..1024).step_by(97) {
                    // SAFETY: as above.
                    let v = unsafe { theirs.add(i).read() };
                    assert_eq!(
                        v,
                        (peer as u64) << 32 | i as u64,
                        "word {i} of {peer}'s frame"
                    );
                }
                t.barrier().unwrap();
            }
            share_deep(t, share, 6);
        };
        // SAFETY: the closure captures a DSM segment's address only.
        unsafe { team.parallel(1, &work) }.unwrap();
    })
    .unwrap();
}

/// A thread that blocks (parks in the team barrier and yields), letting the
/// other thread of its worker run and use its own stack heavily, resumes
/// with its stack intact.
fn stack_intact(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    team.run_main(|| {
        let work = |t: &TeamThread<'_>| {
            let seed = t.thread_num() as u64 * 7919 + 1;
            let mut mine = [0u64; 2048];
            for (i, x) in mine.iter_mut().enumerate() {
                *x = seed.wrapping_mul(i as u64 + 1);
            }
            for round in 0..50u64 {
                // Parks (the barrier) and yields: the other thread of this
                // worker runs meanwhile, on its own stack.
                t.barrier().unwrap();
                ct_worker::yield_now_in::<menps_dsm::dsm::team::TeamConfig>();
                for (i, x) in mine.iter_mut().enumerate() {
                    assert_eq!(
                        *x,
                        seed.wrapping_mul(i as u64 + 1).wrapping_add(round),
                        "thread {} round {round} word {i}",
                        t.thread_num()
                    );
                    *x = x.wrapping_add(1);
                }
                std::hint::black_box(&mut mine);
            }
        };
        // SAFETY: the closure captures nothing.
        unsafe { team.parallel(3, &work) }.unwrap();
    })
    .unwrap();
}

/// A tree of plain `ct_worker::join`s (the free function, which names no
/// configuration) inside a team thread: its leaves run on DSM stacks, and
/// on both of the process's workers (the idle one steals halves), so the
/// joins fork for real in the team's runtime.
fn plain_join(dsm: &D) {
    /// Leaves of the tree under it, and a bit per worker that ran a leaf;
    /// every leaf checks that it runs on a DSM stack of this process.
    fn spread(depth: u32) -> (u64, u64) {
        if depth == 0 {
            let here = 0u8;
            let (r, _) = t_owner(&here);
            assert_eq!(r, process::with(|d| d.rank()).unwrap());
            // Work long enough for the other worker to steal the sibling.
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_micros(200) {
                std::hint::spin_loop();
            }
            let w = ct_worker::current_worker_index().expect("on a worker");
            return (1, 1 << w);
        }
        let ((a, wa), (b, wb)) = ct_worker::join(|| spread(depth - 1), || spread(depth - 1));
        (a + b, wa | wb)
    }
    let team = Team::new(dsm, 2).unwrap();
    team.run_main(|| {
        let work = |t: &TeamThread<'_>| {
            let (leaves, workers) = spread(8);
            assert_eq!(leaves, 256);
            assert_eq!(
                workers,
                0b11,
                "thread {}: the leaves ran on workers {workers:#b}, not on both",
                t.thread_num()
            );
        };
        // SAFETY: the closure captures nothing.
        unsafe { team.parallel(1, &work) }.unwrap();
    })
    .unwrap();
}

/// A team thread of the last process panics while the others wait at a
/// team barrier: its process ends with a message, the others fail with a
/// dead peer; nobody hangs.
fn team_panic(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    let r = team.run_main(|| {
        let work = |t: &TeamThread<'_>| {
            if t.thread_num() == t.num_threads() - 1 {
                panic!("team thread {} gives up", t.thread_num());
            }
            let e = t.barrier().unwrap_err();
            say(format!("rank {}: barrier failed: {e}", t.rank()));
            std::process::exit(1);
        };
        // SAFETY: the closure captures nothing.
        unsafe { team.parallel(2, &work) }
    });
    say(format!("rank {}: unexpected end: {r:?}", dsm.rank()));
    std::process::exit(1);
}

/// A fork onto one process: only its threads run, their barrier is local,
/// and main sees what they wrote.
fn fork_on(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    let target = dsm.nprocs() - 1;
    team.run_main(|| {
        for target in [target, 0] {
            let mut seen = [u64::MAX; 8];
            let out = seen.as_mut_ptr() as usize;
            let work = move |t: &TeamThread<'_>| {
                assert_eq!(t.num_threads(), 3);
                assert_eq!(t.thread_num(), t.local_num());
                let a = out as *mut u64;
                // SAFETY: element thread_num of main's array is this
                // thread's; element 4 + thread_num after the barrier too.
                unsafe { a.add(t.thread_num()).write(t.rank() as u64) };
                t.barrier().unwrap();
                // SAFETY: written before the (in-process) barrier.
                let sum: u64 = (0..3).map(|k| unsafe { a.add(k).read() }).sum();
                // SAFETY: as above.
                unsafe { a.add(4 + t.thread_num()).write(sum) };
            };
            // SAFETY: the closure holds copies only; threads write disjoint
            // elements of main's array.
            unsafe {
                team.fork_on(
                    target,
                    3,
                    |t, d| (*d.cast::<&dyn Fn(&TeamThread<'_>)>())(t),
                    (&(&work as &dyn Fn(&TeamThread<'_>))) as *const _ as *mut u8,
                )
            }
            .unwrap();
            let r = target as u64;
            assert_eq!(seen, [r, r, r, u64::MAX, 3 * r, 3 * r, 3 * r, u64::MAX]);
        }
        // SAFETY: nothing is touched.
        let e = unsafe { team.fork_on(99, 1, |_, _| {}, core::ptr::null_mut()) }.unwrap_err();
        assert!(e.to_string().contains("the job has"), "{e}");
    })
    .unwrap();
}

/// Teams whose size is not a multiple of the processes: every thread
/// number appears once, processes run consecutive numbers (process 0 the
/// first, the first `n % nprocs` processes one thread more), the team
/// barrier passes, and a team smaller than the job runs on process 0.
fn fork_team(dsm: &D) {
    let nprocs = dsm.nprocs();
    let team = Team::new(dsm, 2).unwrap();
    team.run_main(|| {
        for n in [1, nprocs - 1, nprocs + 1, 2 * nprocs - 1] {
            // (rank, local number, threads here) of every thread, then what
            // each saw after the barrier.
            let mut seen = [(u64::MAX, u64::MAX, u64::MAX); 16];
            let mut after = [0u64; 16];
            let (out, out2) = (seen.as_mut_ptr() as usize, after.as_mut_ptr() as usize);
            let work = move |t: &TeamThread<'_>| {
                assert_eq!(t.num_threads(), n);
                let me = t.thread_num();
                let a = out as *mut (u64, u64, u64);
                // SAFETY: element `me` of main's array is this thread's.
                unsafe {
                    a.add(me).write((
                        t.rank() as u64,
                        t.local_num() as u64,
                        t.threads_here() as u64,
                    ))
                };
                t.barrier().unwrap();
                // SAFETY: every element was written before the barrier.
                let ranks: u64 = (0..n).map(|k| unsafe { a.add(k).read() }.0).sum();
                // SAFETY: element `me` of the second array is this thread's.
                unsafe { (out2 as *mut u64).add(me).write(ranks) };
            };
            // SAFETY: the closure holds copies only; threads write disjoint
            // elements of main's arrays.
            unsafe {
                team.fork_team(
                    n,
                    |t, d| (*d.cast::<&dyn Fn(&TeamThread<'_>)>())(t),
                    (&(&work as &dyn Fn(&TeamThread<'_>))) as *const _ as *mut u8,
                )
            }
            .unwrap();
            let mut expect = Vec::new();
            if n < nprocs {
                expect.extend((0..n).map(|k| (0, k as u64, n as u64)));
            } else {
                for r in 0..nprocs {
                    let here = n / nprocs + usize::from(r < n % nprocs);
                    expect.extend((0..here).map(|k| (r as u64, k as u64, here as u64)));
                }
            }
            assert_eq!(
                &seen[..n],
                &expect[..],
                "a team of {n} over {nprocs} processes"
            );
            let ranks: u64 = expect.iter().map(|e| e.0).sum();
            assert!(after[..n].iter().all(|&r| r == ranks), "{:?}", &after[..n]);
        }
    })
    .unwrap();
}

/// A fork's description, sent with the fork (`fork_team_sent`).
#[repr(C)]
struct Sent {
    /// The fork's number.
    seed: u64,
    /// `seed * (i + 1)` each.
    words: [u64; 24],
    /// Where the description lies in main's frame.
    main_at: usize,
    /// Where every team thread reports (main's array): the seed it saw,
    /// whether the words were whole, and whether its description was
    /// main's own.
    report: usize,
}

/// `fork_team_sent`: every fork's description, rewritten by `main` in its
/// frame before each fork, reaches every team thread whole — process 0's as
/// main's own bytes, the other processes' as a copy that came with the
/// fork — and a description over the limit is refused before any process
/// starts the fork.
fn fork_sent(dsm: &D) {
    let nprocs = dsm.nprocs();
    let team = Team::new(dsm, 2).unwrap();
    team.run_main(|| {
        unsafe fn body(t: &TeamThread<'_>, d: *mut u8) {
            // SAFETY: a `Sent`, main's or this process's copy.
            let s = unsafe { &*d.cast::<Sent>() };
            let whole = s
                .words
                .iter()
                .enumerate()
                .all(|(i, &w)| w == s.seed * (i as u64 + 1));
            // SAFETY: element `thread_num` of main's array is this
            // thread's.
            unsafe {
                (s.report as *mut (u64, bool, bool))
                    .add(t.thread_num())
                    .write((s.seed, whole, d as usize == s.main_at))
            };
        }
        let mut seen = [(0u64, false, false); 16];
        // Two threads per process: threads 0 and 1 are process 0's.
        let n = 2 * nprocs;
        for fork in 1..=20u64 {
            let mut sent = Sent {
                seed: fork,
                words: [0; 24],
                main_at: 0,
                report: seen.as_mut_ptr() as usize,
            };
            for (i, w) in sent.words.iter_mut().enumerate() {
                *w = fork * (i as u64 + 1);
            }
            let at = &raw mut sent;
            // SAFETY: `at` points to `sent`, alive and not borrowed.
            unsafe { (*at).main_at = at as usize };
            let at = at.cast::<u8>();
            // SAFETY: `sent` is plain data and lives until the fork ends;
            // the threads write disjoint elements of `seen`.
            unsafe { team.fork_team_sent(n, body, at, size_of::<Sent>()) }.unwrap();
            for (k, &(seed, whole, own)) in seen[..n].iter().enumerate() {
                assert_eq!(seed, fork, "thread {k} saw the description of fork {seed}");
                assert!(whole, "thread {k}: a torn description");
                assert_eq!(own, k < 2, "thread {k}: main's own description or a copy");
            }
        }
        let mut big = [0u8; FORK_SENT_MAX + 1];
        // SAFETY: refused before anything runs.
        let e = unsafe { team.fork_team_sent(n, body, big.as_mut_ptr(), big.len()) }.unwrap_err();
        assert!(matches!(e, DsmError::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("at most"), "{e}");
    })
    .unwrap();
}

/// A team thread of the last process recurses without end on its DSM call
/// stack: the guard block below the stack ends that process with a
/// message (never a write into another thread's stack).
fn stack_overflow(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    fn deep(n: u64) -> u64 {
        let frame = [n; 512];
        std::hint::black_box(&frame);
        if n == u64::MAX {
            0
        } else {
            deep(n + 1) + frame[7]
        }
    }
    let r = team.run_main(|| {
        let work = |t: &TeamThread<'_>| {
            if t.rank() == t.nprocs() - 1 {
                std::hint::black_box(deep(0));
            }
            let e = t.barrier().unwrap_err();
            say(format!("rank {}: {e}", t.rank()));
            std::process::exit(1);
        };
        // SAFETY: the closure captures nothing.
        unsafe { team.parallel(1, &work) }
    });
    say(format!("rank {}: unexpected end: {r:?}", dsm.rank()));
    std::process::exit(1);
}

/// A program whose process 0 forks before `run_main` and gives up with the
/// error: every process ends non-zero (the others find process 0 dead).
fn fork_before_start(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    if dsm.rank() == 0 {
        fn nothing(_: &TeamThread<'_>, _: *mut u8) {}
        // SAFETY: `nothing` touches no data.
        let e = unsafe { team.fork(1, nothing, core::ptr::null_mut()) }.unwrap_err();
        say(format!("rank 0: {e}"));
        std::process::exit(1);
    }
    let e = team.run_main(|| ()).unwrap_err();
    say(format!("rank {}: run_main failed: {e}", dsm.rank()));
    std::process::exit(1);
}

/// While `main` computes without forking, the other processes sleep: a
/// process serving forks uses little CPU time.
fn serve_idle(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    let me = dsm.rank();
    let watcher = (me != 0).then(|| {
        std::thread::spawn(|| {
            // Let the serving thread reach its wait, then measure 1 s.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let c0 = process_cpu();
            std::thread::sleep(std::time::Duration::from_secs(1));
            process_cpu() - c0
        })
    });
    team.run_main(|| {
        std::thread::sleep(std::time::Duration::from_millis(1600));
    })
    .unwrap();
    if let Some(w) = watcher {
        let used = w.join().unwrap();
        println!("rank {me}: cpu while serving idle {used:.3} s");
        assert!(
            used < 0.25,
            "rank {me} used {used:.3} s of CPU in 1 s while waiting for forks"
        );
    }
}

/// CPU time of this process so far.
fn process_cpu() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Writes a line to stderr in one `write`, so that the output of the other
/// processes of the job cannot split it.
fn say(msg: String) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{msg}\n").as_bytes());
}

/// This process's team, for `fork_errors`' nested fork.
static TEAM: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Forks from the wrong place and with bad counts are clear errors, in
/// every process, and the team goes on working.
fn fork_errors(dsm: &D) {
    let team = Team::new(dsm, 1).unwrap();
    TEAM.store(
        &team as *const _ as usize,
        std::sync::atomic::Ordering::Release,
    );
    fn nothing(_: &TeamThread<'_>, _: *mut u8) {}
    // Before run_main ("before start-up").
    // SAFETY: `nothing` touches no data.
    let e = unsafe { team.fork(1, nothing, core::ptr::null_mut()) }.unwrap_err();
    assert!(
        e.to_string().contains("called from the main function"),
        "{e}"
    );
    let done = team
        .run_main(|| {
            // SAFETY: as above.
            let e = unsafe { team.fork(0, nothing, core::ptr::null_mut()) }.unwrap_err();
            assert!(e.to_string().contains("team threads per process"), "{e}");
            // SAFETY: as above.
            let e = unsafe { team.fork(1000, nothing, core::ptr::null_mut()) }.unwrap_err();
            assert!(e.to_string().contains("MENPS_DSM_STACKS"), "{e}");
            // From a team thread (nested): each process reaches its own team
            // through a static.
            let nested = |_: &TeamThread<'_>| {
                let team = TEAM.load(std::sync::atomic::Ordering::Acquire) as *const Team<'_, _, _>;
                // SAFETY: this process's team, alive until run_main returns.
                let team: &Team<'_, AnyCom<OsThreads>, OsThreads> = unsafe { &*team };
                // SAFETY: `nothing` touches no data.
                let e = unsafe { team.fork(1, nothing, core::ptr::null_mut()) }.unwrap_err();
                assert!(
                    e.to_string()
                        .contains("not before run_main, nor from a team thread")
                );
            };
            // SAFETY: the closure captures nothing.
            unsafe { team.parallel(2, &nested) }.unwrap();
            // A closure that is not in DSM memory (here: the system heap).
            let x = 5u64;
            let off_dsm = move |t: &TeamThread<'_>| assert!(t.num_threads() > 0 && x == 5);
            let layout = std::alloc::Layout::for_value(&off_dsm);
            // SAFETY: a fresh system allocation of the closure's layout,
            // written once and freed below.
            let e = unsafe {
                use std::alloc::GlobalAlloc;
                let p = std::alloc::System.alloc(layout).cast::<_>();
                core::ptr::write(p, off_dsm);
                let e = team.parallel(1, &*p).unwrap_err();
                std::alloc::System.dealloc(p.cast(), layout);
                e
            };
            assert!(e.to_string().contains("not in DSM memory"), "{e}");
            // Still working.
            // SAFETY: as above.
            unsafe { team.fork(2, nothing, core::ptr::null_mut()) }.unwrap();
            true
        })
        .unwrap();
    assert_eq!(done.is_some(), dsm.rank() == 0);
}

// ---------------------------------------------------------------------------
// The driver side.

fn run(scenario: &str, procs: &[usize]) {
    for &n in procs {
        let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
        entry_args(&mut cmd);
        cmd.env(SCENARIO, scenario)
            .env("MENPS_NPROCS", n.to_string())
            .env("MENPS_DSM_HEAP_SIZE", "64M");
        let tag = new_tag(scenario);
        let run = drive(cmd, &tag, |_, _| false);
        let what = format!("{scenario} with {n} processes");
        assert_passed(&run, &what, n);
        eprintln!("{what}: {:?}", run.elapsed);
    }
}

#[test]
fn team_barrier_10k_episodes_2_threads_per_process() {
    run("team_barrier", &[2]);
}

#[test]
fn keyed_mutexes_are_the_same_everywhere() {
    run("keyed", &[2, 3]);
}

#[test]
fn fork_join_main_on_a_dsm_stack_with_heap_and_stack_data() {
    run("fork_main", &[2, 4]);
}

#[test]
fn team_barrier_10k_episodes_2_team_threads_per_process() {
    run("team_barrier_ult", &[2]);
}

#[test]
fn forks_pass_writes_between_any_processes() {
    run("fork_chain", &[2, 3, 4]);
}

#[test]
fn dead_stack_blocks_are_not_merged_live_ones_are() {
    run("dead_stack", &[2, 3]);
}

#[test]
fn blocked_thread_resumes_with_its_stack_intact() {
    run("stack_intact", &[2]);
}

#[test]
fn plain_join_in_a_team_thread_forks_on_dsm_stacks() {
    run("plain_join", &[1, 2]);
}

#[test]
fn a_forks_description_travels_with_it() {
    run("fork_sent", &[2, 3]);
}

#[test]
fn forks_from_the_wrong_place_are_errors() {
    run("fork_errors", &[2]);
}

#[test]
fn a_panicking_team_thread_fails_the_job_without_hanging() {
    for n in [2, 3] {
        let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
        entry_args(&mut cmd);
        cmd.env(SCENARIO, "team_panic")
            .env("MENPS_NPROCS", n.to_string())
            .env("MENPS_DSM_HEAP_SIZE", "64M");
        let run = drive(cmd, &new_tag("team_panic"), |_, _| false);
        assert!(!run.status.success(), "{}", run.dump());
        assert!(
            run.stderr.contains("panicked: ending the process"),
            "{}",
            run.dump()
        );
        assert!(!run.stderr.contains("unexpected end"), "{}", run.dump());
    }
}

#[test]
fn fork_before_start_up_fails_every_process() {
    for n in [2, 3] {
        let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
        entry_args(&mut cmd);
        cmd.env(SCENARIO, "fork_before_start")
            .env("MENPS_NPROCS", n.to_string())
            .env("MENPS_DSM_HEAP_SIZE", "16M");
        let run = drive(cmd, &new_tag("fork_before_start"), |_, _| false);
        assert!(!run.status.success(), "{}", run.dump());
        assert!(
            run.stderr
                .contains("called from the main function given to Team::run_main"),
            "{}",
            run.dump()
        );
        for r in 1..n {
            assert!(
                run.stderr.contains(&format!("rank {r}: run_main failed")),
                "{}",
                run.dump()
            );
        }
    }
}

#[test]
fn dsm_stack_overflow_is_reported() {
    let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, "stack_overflow")
        .env("MENPS_NPROCS", "2")
        .env("MENPS_DSM_HEAP_SIZE", "16M");
    let run = drive(cmd, &new_tag("stack_overflow"), |_, _| false);
    assert!(!run.status.success(), "{}", run.dump());
    assert!(
        run.stderr.contains("stack overflow in user-level thread")
            && run.stderr.contains("guard block below a DSM call stack"),
        "{}",
        run.dump()
    );
    assert!(!run.stderr.contains("unexpected end"), "{}", run.dump());
}

#[test]
fn fork_onto_one_process() {
    run("fork_on", &[2, 3]);
}

#[test]
fn teams_of_any_size_spread_over_the_processes() {
    run("fork_team", &[2, 3]);
}

#[test]
fn non_zero_ranks_sleep_while_no_fork_is_pending() {
    run("serve_idle", &[2, 3]);
}

#[test]
fn process_handle_before_during_and_after() {
    run("handle", &[2, 4]);
}

/// Fork–join, the team barrier on user-level threads, keyed mutexes and the
/// process handle on the `mpi` backend: the same scenarios as jobs of
/// `mpirun` (they join as `AnyCom`).
#[cfg(feature = "mpi")]
#[test]
fn team_scenarios_under_mpirun() {
    for scenario in [
        "fork_main",
        "team_barrier_ult",
        "stack_intact",
        "fork_errors",
        "fork_on",
        "keyed",
        "handle",
    ] {
        let run = mpirun_job(scenario, 2, &[("MENPS_DSM_HEAP_SIZE", "64M")]);
        assert_passed(&run, &format!("{scenario} under mpirun"), 2);
    }
}
