//! Work-sharing loops (`#pragma omp for`): [`Loop`], started with
//! [`Thread::for_range`] or [`Thread::for_each`].

use core::cell::Cell;
use core::ops::Range;

use crate::region::Thread;
use crate::schedule::{Schedule, guided_chunk, static_block};
use crate::shared::{MutLoopGuard, SharedMut};
use crate::sync::ordered_lock;
use crate::wait::Waiter;
use crate::worksharing::{NEXT, ORD};

/// A work-sharing loop over a range of iterations: every iteration runs
/// exactly once, on some thread of the team. Every thread of the team must
/// start the same loop (same range, same schedule), as in OpenMP.
///
/// ```no_run
/// # fn f(t: &menps_omp::Thread<'_>, v: &[f64]) {
/// use menps_omp::Schedule;
/// let sum = t
///     .for_range(0..v.len())
///     .schedule(Schedule::Dynamic(64))
///     .reduce(0.0, |acc, i| acc + v[i], |a, b| a + b);
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a loop runs when one of its `each`, `chunks`, `reduce` … methods is called"]
pub struct Loop<'t, 'r> {
    t: &'t Thread<'r>,
    range: Range<usize>,
    schedule: Schedule,
    nowait: bool,
}

impl<'r> Thread<'r> {
    /// A work-sharing loop over `range` (static schedule, a barrier at the
    /// end) to configure and run.
    pub fn for_range(&self, range: Range<usize>) -> Loop<'_, 'r> {
        Loop {
            t: self,
            range,
            schedule: Schedule::Static,
            nowait: false,
        }
    }

    /// Runs `f(i)` for every `i` of `range`, shared among the team (static
    /// blocks, then a barrier): `#pragma omp for`.
    pub fn for_each(&self, range: Range<usize>, f: impl FnMut(usize)) {
        self.for_range(range).each(f)
    }
}

impl Loop<'_, '_> {
    /// The loop's schedule (`schedule` clause; default static).
    pub fn schedule(mut self, s: Schedule) -> Self {
        self.schedule = s;
        self
    }

    /// No barrier at the end (`nowait`): a thread that finishes its part
    /// goes on at once; nothing the loop wrote is published.
    pub fn nowait(mut self) -> Self {
        self.nowait = true;
        self
    }

    /// Runs `f(i)` for this thread's iterations.
    pub fn each(self, mut f: impl FnMut(usize)) {
        self.chunks(|r| r.for_each(&mut f))
    }

    /// Runs `f(chunk)` for each chunk of consecutive iterations this thread
    /// gets (one block per thread under static scheduling).
    pub fn chunks(self, f: impl FnMut(Range<usize>)) {
        let nowait = self.nowait;
        let t = self.t;
        self.drive(f);
        if !nowait {
            t.barrier();
        }
    }

    /// A loop with a reduction: every thread folds its iterations into a
    /// value starting from `identity` with `fold`, the values are combined
    /// with the associative `combine` ([`Thread::reduce`]), and every thread
    /// gets the result (`reduction` clause). Then the loop's barrier, unless
    /// [`Loop::nowait`].
    pub fn reduce<T: Copy + Send>(
        self,
        identity: T,
        mut fold: impl FnMut(T, usize) -> T,
        combine: impl Fn(T, T) -> T,
    ) -> T {
        let (nowait, t) = (self.nowait, self.t);
        let mut acc = identity;
        self.drive(|r| {
            for i in r {
                acc = fold(acc, i);
            }
        });
        let v = t.reduce(acc, combine);
        if !nowait {
            t.barrier();
        }
        v
    }

    /// Runs `f(i, &mut data[i])` for this thread's iterations: mutable
    /// work-sharing over a slice, without `unsafe`. The loop's range must
    /// lie within `data`; the barrier at the end cannot be dropped (it ends
    /// the exclusive access).
    ///
    /// # Panics
    ///
    /// If the range exceeds `data`, after [`Loop::nowait`], or inside
    /// another work-sharing loop over the same `data`.
    pub fn each_mut<T: Send>(self, data: &SharedMut<'_, T>, mut f: impl FnMut(usize, &mut T)) {
        self.chunks_mut(data, |r, s| {
            for (k, x) in s.iter_mut().enumerate() {
                f(r.start + k, x)
            }
        })
    }

    /// Runs `f(chunk, &mut data[chunk])` for each chunk of this thread's
    /// iterations. As [`Loop::each_mut`].
    pub fn chunks_mut<T: Send>(
        self,
        data: &SharedMut<'_, T>,
        f: impl FnMut(Range<usize>, &mut [T]),
    ) {
        self.rows_mut(data, 1, f)
    }

    /// A loop over the rows of a row-major matrix stored in `data`, rows of
    /// `row_len` elements: iteration `i` owns row `i`, elements
    /// `i * row_len .. (i + 1) * row_len`; `f(rows, elements)` runs for each
    /// chunk of this thread's rows. As [`Loop::each_mut`].
    ///
    /// # Panics
    ///
    /// As [`Loop::each_mut`], or if `row_len` is 0.
    pub fn rows_mut<T: Send>(
        self,
        data: &SharedMut<'_, T>,
        row_len: usize,
        mut f: impl FnMut(Range<usize>, &mut [T]),
    ) {
        assert!(
            !self.nowait,
            "menps-omp: a work-sharing loop over a SharedMut always ends with its barrier"
        );
        assert!(row_len > 0, "menps-omp: rows of 0 elements");
        assert!(
            self.range.is_empty() || self.range.end.saturating_mul(row_len) <= data.len(),
            "menps-omp: loop range {:?} of rows of {row_len} exceeds the SharedMut of {} elements",
            self.range,
            data.len()
        );
        let t = self.t;
        let guard = MutLoopGuard::enter(t, data.addr());
        self.drive(|r| {
            // SAFETY: the work-sharing loop hands every row of the range
            // to exactly one thread once, the guard keeps any other use of
            // `data` in this process (another loop, a view) out until the
            // barrier below, and `SharedMut` gives no other access.
            let s = unsafe { data.slice_mut(r.start * row_len..r.end * row_len) };
            f(r, s)
        });
        drop(guard);
        t.barrier();
    }

    /// An ordered loop (`ordered` clause): `f(i, ordered)` runs for this
    /// thread's iterations, and the part of each iteration run through
    /// [`Ordered::run`] runs in iteration order across the whole team, with
    /// what the previous iterations' ordered parts wrote visible.
    pub fn each_ordered(self, mut f: impl FnMut(usize, &Ordered<'_>)) {
        let t = self.t;
        let nowait = self.nowait;
        let shared = t.num_threads() > 1;
        let seq = if shared { t.next_seq() } else { 0 };
        let rt = t.rt();
        if shared {
            rt.ring.enter(rt.dsm, seq);
        }
        let start = self.range.start;
        self.drive(|r| {
            for i in r {
                let o = Ordered {
                    t,
                    seq,
                    index: (i - start) as u64,
                    shared,
                    done: Cell::new(false),
                };
                f(i, &o);
                // An iteration without an ordered part still takes its turn.
                if shared && !o.done.get() {
                    o.wait_turn();
                    rt.ring.fetch_add(rt.dsm, seq, ORD, 1);
                }
            }
        });
        if shared {
            rt.ring.leave(rt.dsm, seq, t.num_threads());
        }
        if !nowait {
            t.barrier();
        }
    }

    /// Hands this thread its chunks.
    fn drive(self, mut body: impl FnMut(Range<usize>)) {
        let t = self.t;
        let (n, tid) = (t.num_threads(), t.thread_num());
        let range = self.range;
        if range.is_empty() {
            return;
        }
        let len = range.end - range.start;
        let schedule = self.schedule.resolve(t.runtime_schedule());
        if n == 1 {
            return body(range);
        }
        match schedule {
            Schedule::StaticChunk(c) => {
                let mut k = tid * c;
                while k < len {
                    body(range.start + k..range.start + (k + c).min(len));
                    k = k.saturating_add(n * c);
                }
            }
            Schedule::Dynamic(c) => {
                let rt = t.rt();
                let seq = t.next_seq();
                rt.ring.enter(rt.dsm, seq);
                loop {
                    let k = rt.ring.fetch_add(rt.dsm, seq, NEXT, c as u64) as usize;
                    if k >= len {
                        break;
                    }
                    body(range.start + k..range.start + (k + c).min(len));
                }
                rt.ring.leave(rt.dsm, seq, n);
            }
            Schedule::Guided(min) => {
                let rt = t.rt();
                let seq = t.next_seq();
                rt.ring.enter(rt.dsm, seq);
                let mut cur = rt.ring.load(rt.dsm, seq, NEXT) as usize;
                while cur < len {
                    let c = guided_chunk(len - cur, n, min);
                    let found =
                        rt.ring.cas(rt.dsm, seq, NEXT, cur as u64, (cur + c) as u64) as usize;
                    if found == cur {
                        body(range.start + cur..range.start + cur + c);
                        cur += c;
                    } else {
                        cur = found;
                    }
                }
                rt.ring.leave(rt.dsm, seq, n);
            }
            // Static blocks (and what `resolve` maps to them).
            _ => {
                let b = static_block(range, tid, n);
                if !b.is_empty() {
                    body(b)
                }
            }
        }
    }
}

/// The ordered part of one iteration of an ordered loop
/// ([`Loop::each_ordered`]).
#[derive(Debug)]
pub struct Ordered<'a> {
    t: &'a Thread<'a>,
    seq: u64,
    index: u64,
    shared: bool,
    done: Cell<bool>,
}

impl Ordered<'_> {
    /// Runs `f` once every earlier iteration's ordered part has run
    /// (`#pragma omp ordered`); at most once per iteration.
    ///
    /// # Panics
    ///
    /// If called twice for the same iteration.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        assert!(
            !self.done.replace(true),
            "menps-omp: an iteration ran its ordered part twice"
        );
        if !self.shared {
            return f();
        }
        self.wait_turn();
        let rt = self.t.rt();
        let r = ordered_lock(f);
        rt.ring.fetch_add(rt.dsm, self.seq, ORD, 1);
        r
    }

    fn wait_turn(&self) {
        let rt = self.t.rt();
        let mut w = Waiter::new();
        while rt.ring.load(rt.dsm, self.seq, ORD) != self.index {
            w.wait();
        }
    }
}
