//! Other configurations (policies, deques, aspects) and the threading
//! interface on user-level and OS threads.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::with_timeout;
use ct_worker::{
    Config, Custom, JoinHandleItf, LockedKind, NoAspect, OsThreads, Runtime, StatsConfig,
    SuspendedThreadItf, TraceConfig, Ult, UltItf,
};

fn fib<C: Config>(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join_in::<C, _, _, _, _>(|| fib::<C>(n - 1), || fib::<C>(n - 2));
    a + b
}

#[test]
fn portable_policy_with_locked_deques() {
    type C = Custom<ct_context::Portable, LockedKind, NoAspect>;
    with_timeout(120, || {
        let rt = Runtime::builder().workers(2).build_with::<C>().unwrap();
        assert_eq!(rt.block_on(|| fib::<C>(20)), 6765);
        let hs: Vec<_> = (0..1000u64).map(|i| rt.spawn(move || i)).collect();
        assert_eq!(
            hs.into_iter().map(|h| h.join()).sum::<u64>(),
            999 * 1000 / 2
        );
    });
}

#[test]
fn stats_count_every_fork() {
    with_timeout(60, || {
        let rt = Runtime::builder()
            .workers(1)
            .build_with::<StatsConfig>()
            .unwrap();
        assert_eq!(rt.block_on(|| fib::<StatsConfig>(20)), 6765);
        let t = rt.aspect().total();
        // fib(20) joins fib(21) - 1 = 10945 times, each with one fork.
        assert_eq!(t.forks, 10945);
        assert!(t.switches >= 1, "{t:?}");
        let rt2 = Runtime::builder()
            .workers(2)
            .build_with::<StatsConfig>()
            .unwrap();
        assert_eq!(rt2.block_on(|| fib::<StatsConfig>(22)), 17711);
        let per_worker = rt2.aspect().snapshot();
        assert_eq!(per_worker.len(), 2);
        assert_eq!(per_worker.iter().map(|w| w.forks).sum::<u64>(), 28656);
    });
}

#[test]
fn trace_writes_chrome_json() {
    with_timeout(60, || {
        let path = std::env::temp_dir().join(format!("ct-trace-{}.json", std::process::id()));
        let rt = Runtime::builder()
            .workers(2)
            .trace_file(&path)
            .build_with::<TraceConfig>()
            .unwrap();
        assert_eq!(rt.block_on(|| fib::<TraceConfig>(15)), 610);
        drop(rt);
        let json = std::fs::read_to_string(&path).expect("trace written at shutdown");
        std::fs::remove_file(&path).ok();
        assert!(
            json.starts_with("{\"traceEvents\":["),
            "{}",
            &json[..80.min(json.len())]
        );
        assert!(json.contains("\"name\":\"ct-worker-0\""));
        assert!(json.contains("\"name\":\"ct-worker-1\""));
        assert!(
            json.contains("\"name\":\"ult\""),
            "user-level thread spans recorded"
        );
        assert!(json.contains("\"forks\":986"), "fib(15) forks 986 times");
        assert!(json.trim_end().ends_with('}'));
    });
}

/// fib through the free `join`, which names no configuration.
fn fib_free(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let (a, b) = ct_worker::join(|| fib_free(n - 1), || fib_free(n - 2));
    a + b
}

/// The free functions used as a user writes them, in whatever runtime runs
/// them: spawned threads that yield, a scope whose threads borrow, nested
/// joins. Returns the sum it computed (a fixed value when all ran).
fn free_functions_workload() -> u64 {
    let hs: Vec<_> = (0..100u64)
        .map(|i| {
            ct_worker::spawn(move || {
                ct_worker::yield_now();
                i
            })
        })
        .collect();
    let spawned: u64 = hs.into_iter().map(|h| h.join()).sum();
    let data: Vec<u64> = (1..=10).collect();
    let scoped = AtomicUsize::new(0);
    ct_worker::scope(|s| {
        for x in &data {
            let scoped = &scoped;
            s.spawn(move || {
                ct_worker::yield_now();
                scoped.fetch_add(*x as usize, Ordering::Relaxed)
            });
        }
    });
    let mut forked = 0;
    ct_worker::parallel_for(0..64, 1, |_| {
        let _ = fib_free(5);
    });
    forked += fib_free(15);
    spawned + scoped.into_inner() as u64 + forked
}

/// What `free_functions_workload` returns: 4950 + 55 + fib(15).
const WORKLOAD_SUM: u64 = 4950 + 55 + 610;

/// The free functions in a runtime of another configuration than the
/// default do their work there: a plain `join` forks (the trace counts the
/// forks; it used to run sequentially, `forks: 0`), a plain `spawn` and
/// `scope` spawn (they used to panic).
#[test]
fn free_functions_in_a_trace_runtime() {
    with_timeout(60, || {
        let path = std::env::temp_dir().join(format!("ct-trace-free-{}.json", std::process::id()));
        let rt = Runtime::builder()
            .workers(2)
            .trace_file(&path)
            .build_with::<TraceConfig>()
            .unwrap();
        assert_eq!(rt.block_on(|| fib_free(15)), 610);
        drop(rt);
        let json = std::fs::read_to_string(&path).expect("trace written at shutdown");
        std::fs::remove_file(&path).ok();
        assert!(
            json.contains("\"forks\":986"),
            "fib(15) through the free join forks 986 times in the trace: {}",
            &json[json.len().saturating_sub(100)..]
        );

        let rt = Runtime::builder()
            .workers(2)
            .build_with::<TraceConfig>()
            .unwrap();
        assert_eq!(rt.block_on(free_functions_workload), WORKLOAD_SUM);
    });
}

/// The same in runtimes of a custom configuration (statistics on, so the
/// forks of the free functions can be counted) on one and two workers.
#[test]
fn free_functions_in_a_custom_runtime() {
    type C = Custom<ct_context::DefaultPolicy, ct_worker::ChaseLevKind, ct_worker::StatsAspect>;
    with_timeout(60, || {
        for workers in [1, 2] {
            let rt = Runtime::builder()
                .workers(workers)
                .build_with::<C>()
                .unwrap();
            assert_eq!(rt.block_on(|| fib_free(20)), 6765);
            // fib(20) joins 10945 times; the block_on thread itself is no fork.
            assert_eq!(rt.aspect().total().forks, 10945, "{workers} workers");
            assert_eq!(rt.block_on(free_functions_workload), WORKLOAD_SUM);
            // 100 spawns and 10 scoped threads were forked on the runtime.
            assert!(
                rt.aspect().total().forks >= 10945 + 110,
                "{:?}",
                rt.aspect().total()
            );
        }
        let rt = Runtime::builder()
            .workers(2)
            .build_with::<StatsConfig>()
            .unwrap();
        assert_eq!(rt.block_on(free_functions_workload), WORKLOAD_SUM);
        assert!(
            rt.aspect().total().forks >= 110,
            "{:?}",
            rt.aspect().total()
        );
    });
}

/// The free functions in a default runtime still work (the fast path).
#[test]
fn free_functions_in_a_default_runtime() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        assert_eq!(rt.block_on(free_functions_workload), WORKLOAD_SUM);
        // And a handle typed for another configuration works here too.
        let v = rt.block_on(|| ct_worker::spawn_in::<StatsConfig, _, _>(|| 7).join());
        assert_eq!(v, 7);
    });
}

/// A handshake written once against the interface: two threads alternate
/// through two suspended-thread slots.
fn handshake<U: UltItf>() -> usize {
    const ROUNDS: usize = 1000;
    let slots = Arc::new((U::SuspendedThread::default(), U::SuspendedThread::default()));
    let turn = Arc::new(AtomicUsize::new(0));
    let (s2, t2) = (slots.clone(), turn.clone());
    let other = U::spawn(move || {
        for i in 0..ROUNDS {
            s2.1.wait_with(|| t2.load(Ordering::Acquire) != 2 * i + 1);
            t2.store(2 * i + 2, Ordering::Release);
            s2.0.notify();
        }
    });
    for i in 0..ROUNDS {
        slots.0.wait_with(|| turn.load(Ordering::Acquire) != 2 * i);
        turn.store(2 * i + 1, Ordering::Release);
        slots.1.notify();
    }
    other.join();
    turn.load(Ordering::Acquire)
}

#[test]
fn interface_on_user_level_threads() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        assert_eq!(rt.block_on(handshake::<Ult>), 2000);
        assert_eq!(rt.block_on(<Ult as UltItf>::num_workers), 2);
    });
}

#[test]
fn interface_on_os_threads() {
    with_timeout(60, || {
        assert_eq!(handshake::<OsThreads>(), 2000);
        assert!(OsThreads::worker_index() < OsThreads::num_workers());
        let h = OsThreads::spawn(|| 5);
        assert_eq!(JoinHandleItf::join(h), 5);
    });
}

#[test]
fn suspended_thread_swap_and_enter() {
    with_timeout(60, || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        let order = rt.block_on(|| {
            let a = Arc::new(ct_worker::SuspendedThread::new());
            let b = Arc::new(ct_worker::SuspendedThread::new());
            let log = Arc::new(std::sync::Mutex::new(Vec::new()));
            let (a2, b2, l2) = (a.clone(), b.clone(), log.clone());
            let t = ct_worker::spawn(move || {
                l2.lock().unwrap().push("t parks in a");
                a2.wait();
                l2.lock().unwrap().push("t resumed, swaps into b's owner");
                // Park in a again and switch to whoever is parked in b.
                a2.swap(&b2);
                l2.lock().unwrap().push("t done");
            });
            // Wait until t is parked, then park ourselves in b while entering t.
            while a.is_empty() {
                ct_worker::yield_now();
            }
            log.lock().unwrap().push("main enters t");
            b.swap(&a);
            log.lock().unwrap().push("main resumed by t's swap");
            assert!(a.enter(), "t parked in a again");
            t.join();
            log.lock().unwrap().clone()
        });
        assert_eq!(
            order,
            [
                "t parks in a",
                "main enters t",
                "t resumed, swaps into b's owner",
                "main resumed by t's swap",
                "t done"
            ]
        );
    });
}

#[test]
fn asymmetric_deques_under_heavy_stealing() {
    use ct_worker::AsymmetricConfig as A;
    with_timeout(120, || {
        // Four workers on this machine's two cores: many steals.
        let rt = Runtime::builder().workers(4).build_with::<A>().unwrap();
        for _ in 0..5 {
            assert_eq!(rt.block_on(|| fib::<A>(24)), 46368);
        }
        let total = rt.block_on(|| {
            let hs: Vec<_> = (0..50_000u64)
                .map(|i| ct_worker::spawn_in::<A, _, _>(move || i))
                .collect();
            hs.into_iter().map(|h| h.join()).sum::<u64>()
        });
        assert_eq!(total, 50_000 * 49_999 / 2);
    });
}

#[test]
fn asymmetric_deque_accounts_every_item() {
    use ct_worker::unstable::{AsymmetricChaseLev, DequeStealer, Steal, WorkerDeque};
    with_timeout(120, || {
        let mut stolen = 0;
        for round in 0..10u32 {
            let (d, s) = AsymmetricChaseLev::<u32>::new();
            let s = Arc::new(s);
            let n = 50_000u32;
            let thieves: Vec<_> = (0..3)
                .map(|_| {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let mut got = Vec::new();
                        let mut empty = 0;
                        while empty < 20_000 {
                            match s.steal() {
                                Steal::Success(v) => {
                                    got.push(v);
                                    empty = 0;
                                }
                                Steal::Retry => {}
                                Steal::Empty => empty += 1,
                            }
                        }
                        got
                    })
                })
                .collect();
            let mut mine = Vec::new();
            for i in 0..n {
                d.push(i);
                // Give thieves time to take items, and pop often, so that the
                // race for the last item is exercised.
                for _ in 0..(i % 64) {
                    std::hint::spin_loop();
                }
                if i % (2 + round) == 0 {
                    mine.extend(d.pop());
                }
            }
            while let Some(v) = d.pop() {
                mine.push(v);
            }
            let mut all: Vec<u32> = thieves
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect();
            stolen += all.len();
            all.extend(mine);
            all.sort_unstable();
            assert_eq!(
                all.len(),
                n as usize,
                "round {round}: items lost or duplicated"
            );
            assert!(all.iter().enumerate().all(|(i, &v)| v == i as u32));
        }
        assert!(
            stolen > 0,
            "the thieves must have stolen something for the test to mean anything"
        );
        eprintln!("stolen: {stolen} of {}", 10 * 50_000);
    });
}

#[test]
#[ignore = "helper: runs in a child process of `unwritable_trace_file_fails_the_run`"]
fn trace_child() {
    // A program as a user writes it: the runtime's trace file comes from
    // CT_TRACE (set by the parent).
    let rt = Runtime::builder()
        .workers(2)
        .build_with::<TraceConfig>()
        .expect("runtime");
    assert_eq!(rt.block_on(|| fib_free(12)), 144);
    drop(rt);
    println!("trace_child done");
}

/// Runs `trace_child` with `CT_TRACE=path`: (exit code, stdout, stderr).
fn run_trace_child(path: &std::path::Path) -> (Option<i32>, String, String) {
    let exe = std::env::current_exe().unwrap();
    let path = path.to_owned();
    let out = with_timeout(60, move || {
        std::process::Command::new(exe)
            .args(["trace_child", "--exact", "--ignored", "--nocapture"])
            .env("CT_TRACE", path)
            .output()
            .unwrap()
    });
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A trace file that cannot be created fails the run (the runtime's build
/// fails, naming the file and CT_TRACE), and one that cannot be written at
/// shutdown (`/dev/full`) ends the process with status 1: neither prints a
/// message and exits 0. A writable one is written and the run succeeds.
#[test]
fn unwritable_trace_file_fails_the_run() {
    let dir = std::env::temp_dir().join(format!("ct-trace-missing-{}", std::process::id()));
    let missing = dir.join("trace.json");
    let (code, out, err) = run_trace_child(&missing);
    assert_ne!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains("trace_child done"), "stdout:\n{out}");
    assert!(
        err.contains("cannot create the trace file") && err.contains("CT_TRACE"),
        "stderr:\n{err}"
    );
    assert!(err.contains(&*missing.to_string_lossy()), "stderr:\n{err}");

    let full = std::path::Path::new("/dev/full");
    if full.exists() {
        let (code, out, err) = run_trace_child(full);
        assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
        assert!(
            err.contains("cannot write trace to /dev/full"),
            "stderr:\n{err}"
        );
    }

    let ok = std::env::temp_dir().join(format!("ct-trace-ok-{}.json", std::process::id()));
    let (code, out, err) = run_trace_child(&ok);
    let json = std::fs::read_to_string(&ok).unwrap_or_default();
    std::fs::remove_file(&ok).ok();
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        json.contains("\"forks\":232"),
        "fib(12) forks 232 times: {json}"
    );
}
