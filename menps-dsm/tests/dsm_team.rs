//! Multi-process tests of what teams of threads across processes use: the
//! team barrier, keyed mutexes, and the process-wide DSM handle (shm
//! backend).
//!
//! Each test drives jobs of this binary (see `common/`): the job processes
//! run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the scenario.

use std::process::Command;

use ct_worker::OsThreads;
use menps_dsm::com::AnyCom;
use menps_dsm::dsm::team::TeamBarrier;
use menps_dsm::dsm::{Dsm, DsmError, process};

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
    let com: AnyCom<OsThreads> = menps_dsm::launch::Builder::new()
        .nprocs(2)
        .grace(std::time::Duration::from_secs(3))
        .init_or_relaunch()
        .unwrap_or_else(|e| {
            eprintln!("cannot join the job: {e}");
            std::process::exit(3)
        });
    let dsm = D::new(com).unwrap_or_else(|e| {
        eprintln!("cannot start the DSM: {e}");
        std::process::exit(3)
    });
    let me = dsm.rank();
    match name.as_str() {
        "team_barrier" => team_barrier(&dsm),
        "keyed" => keyed(&dsm),
        "handle" => handle(&dsm),
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
        Some(128 * 1024)
    );
    dsm.barrier().unwrap();
}

// ---------------------------------------------------------------------------
// The driver side.

fn run(scenario: &str, procs: &[usize]) {
    for &n in procs {
        let mut cmd: Command = clean_cmd(std::env::current_exe().unwrap());
        entry_args(&mut cmd);
        cmd.env(SCENARIO, scenario)
            .env("MENPS_NPROCS", n.to_string())
            .env("MENPS_DSM_HEAP_SIZE", "16M");
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
fn process_handle_before_during_and_after() {
    run("handle", &[2, 4]);
}
