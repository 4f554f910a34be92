//! Deferred jobs (`defer_in`): run by a thief as a thread, or inline by
//! the joiner; closures in the descriptor or boxed; panics; the thread
//! word.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::with_timeout;
use ct_worker::{DefaultConfig, Deferred, Runtime, defer_in};

fn rt(workers: usize) -> Runtime {
    Runtime::builder()
        .workers(workers)
        .build()
        .expect("runtime")
}

/// fib with help-first deferred jobs: the result lands in a shared cell.
fn fib(n: u64, out: Arc<AtomicUsize>) {
    if n < 2 {
        out.fetch_add(n as usize, Ordering::Relaxed);
        return;
    }
    let o = out.clone();
    let d: Deferred<DefaultConfig> =
        defer_in(move || fib(n - 1, o)).expect("inside a user-level thread");
    fib(n - 2, out);
    d.join();
}

#[test]
fn fib_with_deferred_jobs_on_1_and_2_workers() {
    with_timeout(120, || {
        for w in [1, 2] {
            let rt = rt(w);
            let out = Arc::new(AtomicUsize::new(0));
            let o = out.clone();
            rt.block_on(move || fib(22, o));
            assert_eq!(out.load(Ordering::Relaxed), 17711, "fib(22) on {w} workers");
        }
    });
}

#[test]
fn jobs_run_once_inline_or_stolen_with_small_and_large_closures() {
    with_timeout(120, || {
        let rt = rt(2);
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        rt.block_on(move || {
            let mut jobs = Vec::new();
            for i in 0..2000usize {
                let c = c.clone();
                // Every other closure is too large for the descriptor.
                let pad = [i as u8; 100];
                let job = if i % 2 == 0 {
                    defer_in::<DefaultConfig, _>(move || {
                        c.fetch_add(i, Ordering::Relaxed);
                    })
                } else {
                    defer_in::<DefaultConfig, _>(move || {
                        c.fetch_add(
                            i + usize::from(pad[99]) - (i as u8) as usize,
                            Ordering::Relaxed,
                        );
                    })
                };
                jobs.push(job.expect("inside a user-level thread"));
            }
            // Newest first, as the joiner should.
            while let Some(j) = jobs.pop() {
                j.join();
            }
        });
        assert_eq!(count.load(Ordering::Relaxed), (0..2000).sum::<usize>());
    });
}

#[test]
fn joining_out_of_order_and_dropping_also_wait() {
    with_timeout(60, || {
        let rt = rt(2);
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        rt.block_on(move || {
            let a = defer_in::<DefaultConfig, _>({
                let c = c.clone();
                move || {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            })
            .unwrap();
            let b = defer_in::<DefaultConfig, _>({
                let c = c.clone();
                move || {
                    c.fetch_add(10, Ordering::Relaxed);
                }
            })
            .unwrap();
            // `a` is not on top: it still runs (here or stolen) and is waited for.
            a.join();
            drop(b);
            assert_eq!(c.load(Ordering::Relaxed), 11);
        });
        assert_eq!(count.load(Ordering::Relaxed), 11);
    });
}

#[test]
fn a_panicking_job_reports_its_panic_to_the_joiner() {
    with_timeout(60, || {
        let rt = rt(1);
        let r = rt.block_on(|| {
            let d = defer_in::<DefaultConfig, _>(|| panic!("job failed")).unwrap();
            d.try_join()
        });
        let p = r.expect_err("the panic comes back");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"job failed"));
    });
}

#[test]
fn outside_a_runtime_there_is_no_job() {
    assert!(defer_in::<DefaultConfig, _>(|| ()).is_none());
}

#[test]
fn the_thread_word_is_per_thread_and_starts_at_zero() {
    with_timeout(60, || {
        assert_eq!(ct_worker::current_thread_word(), None);
        let rt = rt(2);
        rt.block_on(|| {
            assert_eq!(ct_worker::current_thread_word(), Some(0));
            assert_eq!(ct_worker::replace_current_thread_word(7), Some(0));
            let child = ct_worker::spawn(|| {
                let first = ct_worker::current_thread_word();
                ct_worker::set_current_thread_word(9);
                ct_worker::yield_now();
                (first, ct_worker::current_thread_word())
            });
            assert_eq!(child.join(), (Some(0), Some(9)));
            assert_eq!(ct_worker::current_thread_word(), Some(7));
        });
    });
}
