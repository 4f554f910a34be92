//! Work-sharing loops (`GOMP_loop_*`, the `ull` forms, the combined
//! `GOMP_parallel_loop_*`), `ordered` (`GOMP_ordered_start/end`) and
//! `sections` (`GOMP_sections_*`, `GOMP_parallel_sections`).
//!
//! GCC hands the runtime a loop as (start, end, increment, chunk) and asks
//! for chunks: `*_start` begins the loop and gives the first chunk,
//! `*_next` the following ones, `GOMP_loop_end[_nowait]` ends it. Chunks
//! are ranges of iteration indices `0 .. n`, handed out like the Rust
//! API's loops (static blocks or round-robin chunks without communication;
//! dynamic and guided chunks from the team's shared counters) and turned
//! back into values of the loop variable. `long` and `unsigned long long`
//! loops share the arithmetic (two's complement).
//!
//! Ordered loops pass the turn chunk by chunk, as libgomp does: a chunk's
//! `ordered` parts wait until every earlier chunk is done.

use core::ffi::{c_long, c_uint, c_ulonglong, c_void};

use crate::caller_sp::with_caller_sp;
use crate::parallel::{OutlinedFn, parallel_region, parallel_start};
use crate::{CThread, LoopKind, LoopState, current_thread, die, rt};
use menps_omp::Schedule;
use menps_omp::internals::Waiter;
use menps_omp::internals::{NEXT, ORD};
use menps_omp::internals::{guided_chunk, static_block};

/// A loop as GCC describes it, counted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    pub n: u64,
    pub start: u64,
    pub incr: u64,
    pub end: u64,
}

/// Iterations of `for (i = start; i < end (or >); i += incr)` on `long`.
pub(crate) fn spec_long(start: c_long, end: c_long, incr: c_long) -> Spec {
    let (s, e, i) = (i128::from(start), i128::from(end), i128::from(incr));
    let n = if i > 0 && e > s {
        (e - s + i - 1) / i
    } else if i < 0 && e < s {
        (s - e - i - 1) / -i
    } else {
        0
    };
    Spec {
        n: n as u64,
        start: start as u64,
        incr: incr as u64,
        end: end as u64,
    }
}

/// Iterations of an `unsigned long long` loop counting up or down.
pub(crate) fn spec_ull(up: bool, start: u64, end: u64, incr: u64) -> Spec {
    let n = if up {
        if end > start && incr != 0 {
            u128::from(end - start).div_ceil(u128::from(incr))
        } else {
            0
        }
    } else {
        let step = incr.wrapping_neg();
        if start > end && step != 0 {
            u128::from(start - end).div_ceil(u128::from(step))
        } else {
            0
        }
    };
    Spec {
        n: n as u64,
        start,
        incr,
        end,
    }
}

/// The kind and chunk of a schedule (the run-time one resolved).
fn kind_of(ct: &CThread, s: Schedule) -> (LoopKind, u64) {
    match s.resolve(ct.schedule.get()) {
        Schedule::StaticChunk(c) => (LoopKind::Static, c as u64),
        Schedule::Dynamic(c) => (LoopKind::Dynamic, c.max(1) as u64),
        Schedule::Guided(c) => (LoopKind::Guided, c.max(1) as u64),
        _ => (LoopKind::Static, 0),
    }
}

/// GCC's schedule codes (`GOMP_loop_start`): runtime, static, dynamic,
/// guided, auto; the high bit marks `monotonic`.
fn schedule_code(sched: c_long, chunk: c_long) -> Schedule {
    let c = chunk.max(0) as usize;
    match sched & 0x7fff_ffff {
        0 => Schedule::Runtime,
        1 if c == 0 => Schedule::Static,
        1 => Schedule::StaticChunk(c),
        2 => Schedule::Dynamic(c.max(1)),
        3 => Schedule::Guided(c.max(1)),
        4 => Schedule::Auto,
        other => die(format_args!(
            "GOMP_loop_start: unknown schedule code {other}"
        )),
    }
}

/// A loop's state before any chunk is taken.
pub(crate) fn preset(ct: &CThread, spec: Spec, s: Schedule, ordered: bool) -> LoopState {
    let (kind, chunk) = kind_of(ct, s);
    LoopState {
        kind,
        seq: 0,
        shared: false,
        n: spec.n,
        chunk,
        start: spec.start,
        incr: spec.incr,
        end: spec.end,
        next_static: 0,
        ordered,
        ord_lo: 0,
        ord_hi: 0,
        ord_open: false,
    }
}

/// Begins loop `lp` on this thread: takes its work-sharing number if it
/// uses the team's counters.
pub(crate) fn begin(ct: &CThread, mut lp: LoopState) {
    if ct.lp.get().kind != LoopKind::None {
        die("a work-sharing loop started inside another one of the same team thread");
    }
    lp.shared = ct.num_threads > 1 && (lp.kind != LoopKind::Static || lp.ordered);
    if lp.shared {
        let rt = rt();
        lp.seq = ct.next_seq();
        rt.ring.enter(rt.dsm, lp.seq);
    }
    ct.lp.set(lp);
}

/// The next chunk of this thread (iteration indices), if any.
pub(crate) fn next_chunk(ct: &CThread) -> Option<(u64, u64)> {
    let mut lp = ct.lp.get();
    if lp.kind == LoopKind::None {
        die("GOMP_loop_*_next outside a work-sharing loop");
    }
    if lp.ord_open {
        pass_turn(&lp);
        lp.ord_open = false;
    }
    let (n, nth, tid) = (lp.n, ct.num_threads as u64, ct.thread_num as u64);
    let got = match lp.kind {
        LoopKind::Static if lp.chunk == 0 => {
            if lp.next_static == 0 {
                lp.next_static = 1;
                let b = static_block(0..n as usize, tid as usize, nth as usize);
                (!b.is_empty()).then_some((b.start as u64, b.end as u64))
            } else {
                None
            }
        }
        LoopKind::Static => {
            let c = lp.chunk;
            let k = (tid + lp.next_static.saturating_mul(nth)).saturating_mul(c);
            lp.next_static += 1;
            (k < n).then(|| (k, k.saturating_add(c).min(n)))
        }
        LoopKind::Dynamic if !lp.shared => {
            let k = lp.next_static;
            lp.next_static = k.saturating_add(lp.chunk).min(n);
            (k < n).then_some((k, lp.next_static))
        }
        LoopKind::Dynamic => {
            let rt = rt();
            let k = rt.ring.fetch_add(rt.dsm, lp.seq, NEXT, lp.chunk);
            (k < n).then(|| (k, k.saturating_add(lp.chunk).min(n)))
        }
        LoopKind::Guided if !lp.shared => {
            let k = lp.next_static;
            let c = guided_chunk((n - k.min(n)) as usize, 1, lp.chunk as usize) as u64;
            lp.next_static = (k + c).min(n);
            (k < n).then_some((k, lp.next_static))
        }
        LoopKind::Guided => {
            let rt = rt();
            let mut cur = rt.ring.load(rt.dsm, lp.seq, NEXT);
            loop {
                if cur >= n {
                    break None;
                }
                let c = guided_chunk((n - cur) as usize, nth as usize, lp.chunk as usize) as u64;
                let found = rt.ring.cas(rt.dsm, lp.seq, NEXT, cur, cur + c);
                if found == cur {
                    break Some((cur, cur + c));
                }
                cur = found;
            }
        }
        LoopKind::None => None,
    };
    if let (true, Some((lo, hi))) = (lp.ordered, got) {
        lp.ord_lo = lo;
        lp.ord_hi = hi;
        lp.ord_open = true;
    }
    ct.lp.set(lp);
    got
}

/// Waits until every chunk before this thread's current one is done, then
/// passes the turn past it.
fn pass_turn(lp: &LoopState) {
    if !lp.shared {
        return;
    }
    wait_turn(lp);
    let rt = rt();
    rt.ring
        .fetch_add(rt.dsm, lp.seq, ORD, lp.ord_hi - lp.ord_lo);
}

/// Waits until the ordered turn reaches this thread's chunk.
fn wait_turn(lp: &LoopState) {
    let rt = rt();
    let mut w = Waiter::new();
    while rt.ring.load(rt.dsm, lp.seq, ORD) != lp.ord_lo {
        w.wait();
    }
}

/// Ends this thread's part of the loop; then the barrier unless `nowait`
/// (`caller_sp`: see [`crate::sync::team_barrier`]).
pub(crate) fn end(ct: &CThread, nowait: bool, caller_sp: Option<usize>) {
    let lp = ct.lp.get();
    if lp.kind == LoopKind::None {
        die("GOMP_loop_end outside a work-sharing loop");
    }
    if lp.ord_open {
        pass_turn(&lp);
    }
    if lp.shared {
        let rt = rt();
        rt.ring.leave(rt.dsm, lp.seq, ct.num_threads);
    }
    ct.lp.set(LoopState::default());
    if !nowait {
        crate::sync::team_barrier(ct, caller_sp);
    }
}

/// The loop variable's values of chunk `lo .. hi`: (first, end).
fn values(lp: &LoopState, lo: u64, hi: u64) -> (u64, u64) {
    let first = lp.start.wrapping_add(lo.wrapping_mul(lp.incr));
    let end = if hi >= lp.n {
        lp.end
    } else {
        lp.start.wrapping_add(hi.wrapping_mul(lp.incr))
    };
    (first, end)
}

/// The caller's team thread (a loop outside any region is a team of one).
fn me(what: &str) -> &'static CThread {
    current_thread().unwrap_or_else(|| {
        die(format_args!(
            "{what} called outside the OpenMP program's threads"
        ))
    })
}

/// A loop variable of GCC's loops, `long` or `unsigned long long`: the
/// chunks' bounds are handed back in it.
trait LoopVar: Copy {
    /// The variable of two's-complement bits `v`.
    fn from_bits(v: u64) -> Self;
}

impl LoopVar for c_long {
    #[inline]
    fn from_bits(v: u64) -> Self {
        v as c_long
    }
}

impl LoopVar for c_ulonglong {
    #[inline]
    fn from_bits(v: u64) -> Self {
        v
    }
}

/// Next chunk into `istart`/`iend`.
///
/// # Safety
///
/// `istart` and `iend` are valid for writes (or null: nothing written).
unsafe fn next_into<T: LoopVar>(ct: &CThread, istart: *mut T, iend: *mut T) -> bool {
    match next_chunk(ct) {
        Some((lo, hi)) => {
            let (a, b) = values(&ct.lp.get(), lo, hi);
            if !istart.is_null() {
                // SAFETY: the caller's contract.
                unsafe {
                    *istart = T::from_bits(a);
                    *iend = T::from_bits(b);
                }
            }
            true
        }
        None => false,
    }
}

/// The chunk argument of a `long` entry point (negative: none).
fn chunk_of(chunk: c_long) -> usize {
    chunk.max(0) as usize
}

/// The chunk argument of an `unsigned long long` entry point.
fn chunk_of_ull(chunk: c_ulonglong) -> usize {
    chunk.min(usize::MAX as u64) as usize
}

/// `schedule(static)` with chunk `chunk` (0: none, one block a thread).
fn static_schedule(chunk: usize) -> Schedule {
    if chunk == 0 {
        Schedule::Static
    } else {
        Schedule::StaticChunk(chunk)
    }
}

/// `schedule([nonmonotonic:]dynamic)` with chunk `chunk` (at least 1).
fn dynamic_schedule(chunk: usize) -> Schedule {
    Schedule::Dynamic(chunk.max(1))
}

/// `schedule([nonmonotonic:]guided)` with chunk `chunk` (at least 1).
fn guided_schedule(chunk: usize) -> Schedule {
    Schedule::Guided(chunk.max(1))
}

/// Refuses the task-reduction and shared-memory arguments of the generic
/// loop entry points.
fn plain_only(what: &str, reductions: *mut usize, mem: *mut *mut c_void) {
    if !reductions.is_null() {
        die(format_args!(
            "{what} with task reductions (reduction(task/inscan)) is not supported"
        ));
    }
    if !mem.is_null() {
        die(format_args!(
            "{what} with team memory (lastprivate(conditional:) or scan) is not supported"
        ));
    }
}

/// `GOMP_loop[_ull]_*_start` (`what`): begins loop `spec` of schedule `s`
/// on the calling thread and takes its first chunk.
///
/// # Safety
///
/// `istart` and `iend` are valid for writes (or null: nothing written).
unsafe fn loop_start<T: LoopVar>(
    what: &str,
    spec: Spec,
    s: Schedule,
    ordered: bool,
    istart: *mut T,
    iend: *mut T,
) -> bool {
    let ct = me(what);
    begin(ct, preset(ct, spec, s, ordered));
    // SAFETY: forwarded.
    unsafe { next_into(ct, istart, iend) }
}

/// `GOMP_loop[_ull]_*_next` (`what`): the calling thread's next chunk.
///
/// # Safety
///
/// `istart` and `iend` are valid for writes (or null: nothing written).
unsafe fn loop_next<T: LoopVar>(what: &str, istart: *mut T, iend: *mut T) -> bool {
    // SAFETY: forwarded.
    unsafe { next_into(me(what), istart, iend) }
}

/// `GOMP_loop[_ull][_ordered]_start` (`what`), the generic entry points of
/// GCC 9 and later: [`loop_start`] with the schedule as GCC's code
/// ([`schedule_code`]); task reductions and team memory are refused.
///
/// # Safety
///
/// `istart` and `iend` are valid for writes (or null: nothing written).
#[allow(clippy::too_many_arguments)]
unsafe fn loop_start_coded<T: LoopVar>(
    what: &str,
    spec: Spec,
    sched: c_long,
    chunk: c_long,
    ordered: bool,
    istart: *mut T,
    iend: *mut T,
    reductions: *mut usize,
    mem: *mut *mut c_void,
) -> bool {
    plain_only(what, reductions, mem);
    let s = schedule_code(sched, chunk);
    // SAFETY: forwarded.
    unsafe { loop_start(what, spec, s, ordered, istart, iend) }
}

/// How a combined entry point runs its region: [`parallel_region`] (to its
/// end) or [`parallel_start`] (GCC before 4.9: the caller goes on as thread
/// 0 until `GOMP_parallel_end`).
type RunRegion = unsafe fn(OutlinedFn, *mut c_void, c_uint, LoopState);

/// The combined entry points (`what`: `GOMP_parallel_loop_*`,
/// `GOMP_parallel_sections[_start]`): `run` runs a region of `f(data)`
/// whose threads start in the work-sharing construct `construct` gives the
/// state of (before any chunk is taken).
///
/// # Safety
///
/// `f` and `data` are GCC's outlined function and its data.
unsafe fn combined(
    what: &str,
    run: RunRegion,
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
    construct: impl FnOnce(&CThread) -> LoopState,
) {
    let ct = me(what);
    let lp = construct(ct);
    // SAFETY: forwarded.
    unsafe { run(f, data, num_threads, lp) }
}

/// Defines libgomp's loop entry points from the table below: each a
/// `#[unsafe(no_mangle)] pub unsafe extern "C" fn` of GCC's signature whose
/// body is one call of the shared implementation above, given the entry
/// point's name for messages. The rows, by kind:
///
/// - `chunked(schedule, ordered) start, next, ull_start, ull_next;`:
///   `GOMP_loop_<kind>_start(start, end, incr, chunk, istart, iend)` and
///   `_next(istart, iend)` on `long`, and their `unsigned long long` forms
///   `GOMP_loop_ull_<kind>_*` (with the direction `up` first); `schedule`
///   turns the chunk into the [`Schedule`];
/// - `runtime(ordered) start, next, ull_start, ull_next;`: the same of the
///   run-time schedule, without the chunk;
/// - `coded(ordered) name, ull_name;`: GCC 9's generic
///   `GOMP_loop[_ull][_ordered]_start`, the schedule given as a code;
/// - `parallel(schedule) name;`, `parallel_runtime name;`: the combined
///   `GOMP_parallel_loop_*` (with `flags`), which run the region to its end;
/// - `parallel_start(schedule) name;`, `parallel_runtime_start name;`: the
///   old combined `GOMP_parallel_loop_*_start` (no `flags`), after which the
///   caller goes on as the region's thread 0.
macro_rules! loop_entry_points {
    () => {};
    (chunked($sched:path, $ordered:literal) $start:ident, $next:ident, $ull_start:ident, $ull_next:ident; $($rest:tt)*) => {
        loop_entry_points!(@fn $start, "begins a loop and takes the first chunk", LOOP_SAFETY,
            (start: c_long, end: c_long, incr: c_long, chunk: c_long, istart: *mut c_long, iend: *mut c_long) -> bool,
            loop_start(stringify!($start), spec_long(start, end, incr), $sched(chunk_of(chunk)), $ordered, istart, iend));
        loop_entry_points!(@fn $ull_start, "begins an `unsigned long long` loop", LOOP_SAFETY,
            (up: bool, start: c_ulonglong, end: c_ulonglong, incr: c_ulonglong, chunk: c_ulonglong, istart: *mut c_ulonglong, iend: *mut c_ulonglong) -> bool,
            loop_start(stringify!($ull_start), spec_ull(up, start, end, incr), $sched(chunk_of_ull(chunk)), $ordered, istart, iend));
        loop_entry_points!(@next $next, $ull_next);
        loop_entry_points!($($rest)*);
    };
    (runtime($ordered:literal) $start:ident, $next:ident, $ull_start:ident, $ull_next:ident; $($rest:tt)*) => {
        loop_entry_points!(@fn $start, "begins a loop of the run-time schedule", LOOP_SAFETY,
            (start: c_long, end: c_long, incr: c_long, istart: *mut c_long, iend: *mut c_long) -> bool,
            loop_start(stringify!($start), spec_long(start, end, incr), Schedule::Runtime, $ordered, istart, iend));
        loop_entry_points!(@fn $ull_start, "begins an `unsigned long long` loop of the run-time schedule", LOOP_SAFETY,
            (up: bool, start: c_ulonglong, end: c_ulonglong, incr: c_ulonglong, istart: *mut c_ulonglong, iend: *mut c_ulonglong) -> bool,
            loop_start(stringify!($ull_start), spec_ull(up, start, end, incr), Schedule::Runtime, $ordered, istart, iend));
        loop_entry_points!(@next $next, $ull_next);
        loop_entry_points!($($rest)*);
    };
    (coded($ordered:literal) $name:ident, $ull_name:ident; $($rest:tt)*) => {
        loop_entry_points!(@fn $name, "a loop entry point of GCC 9 and later", LOOP_SAFETY,
            (start: c_long, end: c_long, incr: c_long, sched: c_long, chunk: c_long, istart: *mut c_long, iend: *mut c_long, reductions: *mut usize, mem: *mut *mut c_void) -> bool,
            loop_start_coded(stringify!($name), spec_long(start, end, incr), sched, chunk, $ordered, istart, iend, reductions, mem));
        loop_entry_points!(@fn $ull_name, "an `unsigned long long` loop entry point of GCC 9 and later", LOOP_SAFETY,
            (up: bool, start: c_ulonglong, end: c_ulonglong, incr: c_ulonglong, sched: c_long, chunk: c_ulonglong, istart: *mut c_ulonglong, iend: *mut c_ulonglong, reductions: *mut usize, mem: *mut *mut c_void) -> bool,
            loop_start_coded(stringify!($ull_name), spec_ull(up, start, end, incr), sched, chunk.min(c_long::MAX as u64) as c_long, $ordered, istart, iend, reductions, mem));
        loop_entry_points!($($rest)*);
    };
    (parallel($sched:path) $name:ident; $($rest:tt)*) => {
        loop_entry_points!(@fn $name, "a parallel region whose threads start in a loop", REGION_SAFETY,
            (f: OutlinedFn, data: *mut c_void, num_threads: c_uint, start: c_long, end: c_long, incr: c_long, chunk: c_long, _flags: c_uint),
            combined(stringify!($name), parallel_region, f, data, num_threads, |ct| preset(ct, spec_long(start, end, incr), $sched(chunk_of(chunk)), false)));
        loop_entry_points!($($rest)*);
    };
    (parallel_runtime $name:ident; $($rest:tt)*) => {
        loop_entry_points!(@fn $name, "a parallel region whose threads start in a loop of the run-time schedule", REGION_SAFETY,
            (f: OutlinedFn, data: *mut c_void, num_threads: c_uint, start: c_long, end: c_long, incr: c_long, _flags: c_uint),
            combined(stringify!($name), parallel_region, f, data, num_threads, |ct| preset(ct, spec_long(start, end, incr), Schedule::Runtime, false)));
        loop_entry_points!($($rest)*);
    };
    (parallel_start($sched:path) $name:ident; $($rest:tt)*) => {
        loop_entry_points!(@fn $name, "begins a region whose threads start in a loop; the caller is its thread 0 (GCC before 4.9)", REGION_SAFETY,
            (f: OutlinedFn, data: *mut c_void, num_threads: c_uint, start: c_long, end: c_long, incr: c_long, chunk: c_long),
            combined(stringify!($name), parallel_start, f, data, num_threads, |ct| preset(ct, spec_long(start, end, incr), $sched(chunk_of(chunk)), false)));
        loop_entry_points!($($rest)*);
    };
    (parallel_runtime_start $name:ident; $($rest:tt)*) => {
        loop_entry_points!(@fn $name, "begins a region whose threads start in a loop of the run-time schedule; the caller is its thread 0 (GCC before 4.9)", REGION_SAFETY,
            (f: OutlinedFn, data: *mut c_void, num_threads: c_uint, start: c_long, end: c_long, incr: c_long),
            combined(stringify!($name), parallel_start, f, data, num_threads, |ct| preset(ct, spec_long(start, end, incr), Schedule::Runtime, false)));
        loop_entry_points!($($rest)*);
    };
    // `GOMP_loop_*_next` and `GOMP_loop_ull_*_next`.
    (@next $next:ident, $ull_next:ident) => {
        loop_entry_points!(@fn $next, "the next chunk", LOOP_SAFETY,
            (istart: *mut c_long, iend: *mut c_long) -> bool, loop_next(stringify!($next), istart, iend));
        loop_entry_points!(@fn $ull_next, "the next chunk", LOOP_SAFETY,
            (istart: *mut c_ulonglong, iend: *mut c_ulonglong) -> bool, loop_next(stringify!($ull_next), istart, iend));
    };
    // One entry point: its name, what it does, its safety contract (the
    // kind of arguments GCC passes valid), its parameters and its body.
    (@fn $name:ident, $does:literal, LOOP_SAFETY, $($tail:tt)*) => {
        loop_entry_points!(@emit $name, $does, "Called by GCC's code with valid pointers for the chunk.", $($tail)*);
    };
    (@fn $name:ident, $does:literal, REGION_SAFETY, $($tail:tt)*) => {
        loop_entry_points!(@emit $name, $does, "Called by GCC's code with its outlined function and data.", $($tail)*);
    };
    (@emit $name:ident, $does:literal, $safety:literal, ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?, $body:expr) => {
        #[doc = concat!("`", stringify!($name), "`: ", $does, ".")]
        ///
        /// # Safety
        ///
        #[doc = $safety]
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: forwarded (the caller's contract).
            unsafe { $body }
        }
    };
}

loop_entry_points! {
    chunked(static_schedule, false) GOMP_loop_static_start, GOMP_loop_static_next, GOMP_loop_ull_static_start, GOMP_loop_ull_static_next;
    chunked(dynamic_schedule, false) GOMP_loop_dynamic_start, GOMP_loop_dynamic_next, GOMP_loop_ull_dynamic_start, GOMP_loop_ull_dynamic_next;
    chunked(guided_schedule, false) GOMP_loop_guided_start, GOMP_loop_guided_next, GOMP_loop_ull_guided_start, GOMP_loop_ull_guided_next;
    chunked(dynamic_schedule, false) GOMP_loop_nonmonotonic_dynamic_start, GOMP_loop_nonmonotonic_dynamic_next, GOMP_loop_ull_nonmonotonic_dynamic_start, GOMP_loop_ull_nonmonotonic_dynamic_next;
    chunked(guided_schedule, false) GOMP_loop_nonmonotonic_guided_start, GOMP_loop_nonmonotonic_guided_next, GOMP_loop_ull_nonmonotonic_guided_start, GOMP_loop_ull_nonmonotonic_guided_next;
    chunked(static_schedule, true) GOMP_loop_ordered_static_start, GOMP_loop_ordered_static_next, GOMP_loop_ull_ordered_static_start, GOMP_loop_ull_ordered_static_next;
    chunked(dynamic_schedule, true) GOMP_loop_ordered_dynamic_start, GOMP_loop_ordered_dynamic_next, GOMP_loop_ull_ordered_dynamic_start, GOMP_loop_ull_ordered_dynamic_next;
    chunked(guided_schedule, true) GOMP_loop_ordered_guided_start, GOMP_loop_ordered_guided_next, GOMP_loop_ull_ordered_guided_start, GOMP_loop_ull_ordered_guided_next;
    runtime(false) GOMP_loop_runtime_start, GOMP_loop_runtime_next, GOMP_loop_ull_runtime_start, GOMP_loop_ull_runtime_next;
    runtime(false) GOMP_loop_nonmonotonic_runtime_start, GOMP_loop_nonmonotonic_runtime_next, GOMP_loop_ull_nonmonotonic_runtime_start, GOMP_loop_ull_nonmonotonic_runtime_next;
    runtime(false) GOMP_loop_maybe_nonmonotonic_runtime_start, GOMP_loop_maybe_nonmonotonic_runtime_next, GOMP_loop_ull_maybe_nonmonotonic_runtime_start, GOMP_loop_ull_maybe_nonmonotonic_runtime_next;
    runtime(true) GOMP_loop_ordered_runtime_start, GOMP_loop_ordered_runtime_next, GOMP_loop_ull_ordered_runtime_start, GOMP_loop_ull_ordered_runtime_next;
    coded(false) GOMP_loop_start, GOMP_loop_ull_start;
    coded(true) GOMP_loop_ordered_start, GOMP_loop_ull_ordered_start;
    parallel(static_schedule) GOMP_parallel_loop_static;
    parallel(dynamic_schedule) GOMP_parallel_loop_dynamic;
    parallel(guided_schedule) GOMP_parallel_loop_guided;
    parallel(dynamic_schedule) GOMP_parallel_loop_nonmonotonic_dynamic;
    parallel(guided_schedule) GOMP_parallel_loop_nonmonotonic_guided;
    parallel_runtime GOMP_parallel_loop_runtime;
    parallel_runtime GOMP_parallel_loop_nonmonotonic_runtime;
    parallel_runtime GOMP_parallel_loop_maybe_nonmonotonic_runtime;
    parallel_start(static_schedule) GOMP_parallel_loop_static_start;
    parallel_start(dynamic_schedule) GOMP_parallel_loop_dynamic_start;
    parallel_start(guided_schedule) GOMP_parallel_loop_guided_start;
    parallel_runtime_start GOMP_parallel_loop_runtime_start;
}

with_caller_sp!(
    /// `GOMP_loop_end`: this thread's part of the loop is done; the barrier.
    GOMP_loop_end => loop_end_from
);

/// `GOMP_loop_end`, called from a program whose stack pointer was
/// `caller_sp`.
extern "C" fn loop_end_from(caller_sp: usize) {
    end(me("GOMP_loop_end"), false, Some(caller_sp))
}

/// `GOMP_loop_end_nowait`: as `GOMP_loop_end` without the barrier.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_loop_end_nowait() {
    end(me("GOMP_loop_end_nowait"), true, None)
}

with_caller_sp!(
    /// `GOMP_loop_end_cancel`: `GOMP_loop_end`; cancellation is off, so the
    /// region is never cancelled.
    GOMP_loop_end_cancel -> bool => loop_end_cancel_from
);

/// `GOMP_loop_end_cancel`, called from a program whose stack pointer was
/// `caller_sp`.
extern "C" fn loop_end_cancel_from(caller_sp: usize) -> bool {
    end(me("GOMP_loop_end_cancel"), false, Some(caller_sp));
    false
}

/// `GOMP_ordered_start`: waits for this chunk's turn.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_ordered_start() {
    let _errno = crate::errno::KeepErrno::new();
    let ct = me("GOMP_ordered_start");
    let lp = ct.lp.get();
    if !lp.ordered || !lp.ord_open {
        die("GOMP_ordered_start outside the chunk of an ordered loop");
    }
    if lp.shared {
        wait_turn(&lp);
        // What earlier ordered parts wrote comes with the lock (processes).
        if rt().dsm.nprocs() > 1 {
            crate::sync::hold(crate::sync::ORDERED_KEY, "ordered");
        }
    }
}

/// `GOMP_ordered_end`: the ordered part of this iteration is done.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_ordered_end() {
    let _errno = crate::errno::KeepErrno::new();
    let ct = me("GOMP_ordered_end");
    if ct.lp.get().shared && rt().dsm.nprocs() > 1 {
        crate::sync::release(crate::sync::ORDERED_KEY, "ordered");
    }
}

/// The state of `sections` of `count` sections: a dynamic loop over the
/// section numbers.
fn sections_preset(ct: &CThread, count: c_uint) -> LoopState {
    preset(
        ct,
        spec_long(1, c_long::from(count) + 1, 1),
        Schedule::Dynamic(1),
        false,
    )
}

/// The next section of this thread (0: none left).
fn next_section(ct: &CThread) -> c_uint {
    let mut a: c_long = 0;
    let mut b: c_long = 0;
    // SAFETY: valid places for the chunk.
    if unsafe { next_into(ct, &mut a, &mut b) } {
        a as c_uint
    } else {
        0
    }
}

/// `GOMP_sections_start`: begins `sections` and returns this thread's
/// first section (1-based; 0: none).
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_sections_start(count: c_uint) -> c_uint {
    let ct = me("GOMP_sections_start");
    begin(ct, sections_preset(ct, count));
    next_section(ct)
}

/// `GOMP_sections2_start`: `GOMP_sections_start` of GCC 9 and later.
///
/// # Safety
///
/// Called by GCC's code.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GOMP_sections2_start(
    count: c_uint,
    reductions: *mut usize,
    mem: *mut *mut c_void,
) -> c_uint {
    plain_only("GOMP_sections2_start", reductions, mem);
    GOMP_sections_start(count)
}

/// `GOMP_sections_next`: this thread's next section (0: none).
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_sections_next() -> c_uint {
    next_section(me("GOMP_sections_next"))
}

with_caller_sp!(
    /// `GOMP_sections_end`: ends `sections`, with its barrier.
    GOMP_sections_end => sections_end_from
);

/// `GOMP_sections_end`, called from a program whose stack pointer was
/// `caller_sp`.
extern "C" fn sections_end_from(caller_sp: usize) {
    end(me("GOMP_sections_end"), false, Some(caller_sp))
}

/// `GOMP_sections_end_nowait`: ends `sections` without the barrier.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_sections_end_nowait() {
    end(me("GOMP_sections_end_nowait"), true, None)
}

with_caller_sp!(
    /// `GOMP_sections_end_cancel`: `GOMP_sections_end` (cancellation is off).
    GOMP_sections_end_cancel -> bool => sections_end_cancel_from
);

/// `GOMP_sections_end_cancel`, called from a program whose stack pointer
/// was `caller_sp`.
extern "C" fn sections_end_cancel_from(caller_sp: usize) -> bool {
    end(me("GOMP_sections_end_cancel"), false, Some(caller_sp));
    false
}

/// `GOMP_parallel_sections`: a parallel region whose threads start in
/// `sections` of `count` sections.
///
/// # Safety
///
/// Called by GCC's code with its outlined function and data.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GOMP_parallel_sections(
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
    count: c_uint,
    _flags: c_uint,
) {
    // SAFETY: forwarded.
    unsafe {
        combined(
            "GOMP_parallel_sections",
            parallel_region,
            f,
            data,
            num_threads,
            |ct| sections_preset(ct, count),
        )
    }
}

/// `GOMP_parallel_sections_start` (GCC before 4.9): a region whose
/// threads start in `sections`; the caller is thread 0.
///
/// # Safety
///
/// Called by GCC's code with its outlined function and data.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GOMP_parallel_sections_start(
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
    count: c_uint,
) {
    // SAFETY: forwarded.
    unsafe {
        combined(
            "GOMP_parallel_sections_start",
            parallel_start,
            f,
            data,
            num_threads,
            |ct| sections_preset(ct, count),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trip_counts() {
        assert_eq!(spec_long(0, 10, 1).n, 10);
        assert_eq!(spec_long(0, 10, 3).n, 4);
        assert_eq!(spec_long(10, 0, -1).n, 10);
        assert_eq!(spec_long(10, 0, -4).n, 3);
        assert_eq!(spec_long(5, 5, 1).n, 0);
        assert_eq!(spec_long(5, 0, 1).n, 0);
        assert_eq!(spec_long(c_long::MIN, c_long::MAX, c_long::MAX).n, 3);
        assert_eq!(spec_ull(true, 0, 10, 3).n, 4);
        assert_eq!(spec_ull(false, 10, 0, 2u64.wrapping_neg()).n, 5);
        assert_eq!(spec_ull(true, 0, u64::MAX, 1).n, u64::MAX);
    }

    #[test]
    fn chunk_values_end_at_the_loop_end() {
        let s = spec_long(10, 0, -4);
        let lp = LoopState {
            n: s.n,
            start: s.start,
            incr: s.incr,
            end: s.end,
            ..LoopState::default()
        };
        assert_eq!(values(&lp, 0, 1), (10, 6));
        assert_eq!(values(&lp, 1, 3), (6, 0));
    }
}
