//! Parallel regions: `GOMP_parallel` (and the combined forms, through
//! `parallel_region`).
//!
//! A region started by the initial thread (`main`, process 0) forks a team
//! over every process: `num_threads` threads (or the `nthreads-var` ICV),
//! spread over the processes as evenly as they go, each a user-level
//! thread on a DSM call stack: on process 0 new threads while `main` waits,
//! elsewhere the first of them is the thread serving the fork (in a job of
//! one process, `main` itself, as libgomp's master thread). The outlined
//! function's data lives in `main`'s frame (DSM memory), so every process
//! reads it; the region's own description travels with the fork. A
//! region started inside a region runs on the encountering thread alone
//! (nested parallelism is off: `max-active-levels` is 1).

use core::cell::Cell;
use core::ffi::{c_uint, c_void};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use menps_dsm::dsm::allocator::RuntimeGuard;
use menps_dsm::dsm::team::{OpenFork, TeamThread};

use crate::{
    CThread, LoopKind, LoopState, Region, current_task, current_thread, die, enter_task,
    leave_task, rt,
};
use menps_omp::Schedule;

// A region's description travels with its fork (`Team::fork_team_sent`).
const _: () = assert!(size_of::<Region>() <= menps_dsm::dsm::team::FORK_SENT_MAX);

/// An outlined region body.
pub type OutlinedFn = unsafe extern "C" fn(*mut c_void);

/// `GOMP_parallel`: runs `f(data)` on every thread of a new team and
/// returns when all have finished.
///
/// A jump into the implementation with the caller's stack pointer before
/// its `call` as a fifth argument: across processes, the fork's and the
/// join's releases publish `main`'s frames and none of the runtime's below
/// them.
///
/// # Safety
///
/// Called by GCC's code with its outlined function and data.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GOMP_parallel(
    _f: OutlinedFn,
    _data: *mut c_void,
    _num_threads: c_uint,
    _flags: c_uint,
) {
    core::arch::naked_asm!(
        "lea r8, [rsp + 8]",
        "jmp {inner}",
        inner = sym parallel_from,
    )
}

/// `GOMP_parallel`, called by a program whose stack pointer was
/// `caller_sp`.
///
/// # Safety
///
/// As `GOMP_parallel`.
unsafe extern "C" fn parallel_from(
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
    _flags: c_uint,
    caller_sp: usize,
) {
    // SAFETY: forwarded.
    unsafe { region_from(f, data, num_threads, LoopState::default(), Some(caller_sp)) }
}

/// The thread that encounters a region (`what` names the construct for
/// the message if there is none), the team size it asks for, and whether
/// the region forks a team: only `main`'s initial task on process 0 does,
/// for more than one thread (nested regions run on one thread).
fn encountered(what: &str, num_threads: c_uint) -> (&'static CThread, usize, bool) {
    let me = current_thread().unwrap_or_else(|| {
        die(format_args!(
            "{what} outside the OpenMP program's threads (a thread the program created itself?)"
        ))
    });
    let n = if num_threads > 0 {
        num_threads as usize
    } else {
        me.nthreads_var.get()
    };
    let is_main = current_task().is_some_and(|t| core::ptr::eq(t, &me.task))
        && me.level == 0
        && rt().dsm.rank() == 0;
    (me, n, is_main && n > 1)
}

/// Keeps the block that holds a region's shared variables (`data`: GCC's
/// `.omp_data_o`, in the encountering thread's frame — `main`'s DSM stack,
/// which is pinned only while `main` runs) pinned while the team runs, in a
/// job of several processes: the region's `single`s and its thread 0 write
/// these variables, and reductions (emulated as DSM atomics) and the other
/// processes' writes change them, phase after phase. Pinned, the block
/// takes no fault and no `mprotect` here; another process's change is
/// merged into it in place at the next acquire. Returns what to unpin.
fn pin_shared(data: *mut c_void) -> Option<*mut u8> {
    let rt = rt();
    if data.is_null() || rt.dsm.nprocs() == 1 {
        return None;
    }
    let p = data.cast::<u8>();
    let _rt = RuntimeGuard::enter();
    rt.dsm.block_state(p)?;
    rt.dsm
        .pin(p, 1)
        .unwrap_or_else(|e| die(format_args!("parallel region: {e}")));
    Some(p)
}

impl Region {
    /// The description of a region of `f(data)` that thread `me` starts, its
    /// threads at nesting level `level` (`active_level` active ones) and
    /// starting in loop `preset`; its work-sharing numbers start at the
    /// runtime's next one.
    fn new(
        me: &CThread,
        f: OutlinedFn,
        data: *mut c_void,
        preset: LoopState,
        level: u32,
        active_level: u32,
    ) -> Region {
        Region {
            seq_base: rt().next_seq.load(Ordering::Relaxed),
            schedule: me.schedule.get().encode(),
            fn_: f as usize,
            data: data as usize,
            preset,
            seq_end: AtomicU64::new(u64::MAX),
            level,
            active_level,
            nthreads_var: me.nthreads_var.get(),
            carrier0: crate::tls::current(),
        }
    }
}

/// Runs a region whose threads start in loop `preset` (none if its kind is
/// `None`).
///
/// # Safety
///
/// `f` and `data` are GCC's outlined function and its data.
pub(crate) unsafe fn parallel_region(
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
    preset: LoopState,
) {
    // SAFETY: forwarded.
    unsafe { region_from(f, data, num_threads, preset, None) }
}

/// [`parallel_region`] entered by a program whose stack pointer was
/// `caller_sp` before its call, where the entry point knows it.
///
/// # Safety
///
/// As [`parallel_region`].
unsafe fn region_from(
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
    preset: LoopState,
    caller_sp: Option<usize>,
) {
    let (me, n, forks) = encountered("a parallel region", num_threads);
    let rt = rt();
    if !forks {
        // SAFETY: forwarded.
        return unsafe { serial_region(me, f, data, preset) };
    }
    // The fork's and the join's releases need not publish this frame and
    // the runtime's below it: what other processes read of them travels
    // with the fork (`region`). Only across processes: in a job of one
    // process thread 0 runs on this stack, below `main`'s frames.
    let _frames = caller_sp
        .filter(|_| rt.dsm.nprocs() > 1)
        .map(|sp| rt.dsm.program_frames_end_at_call(sp));
    let region = Region::new(me, f, data, preset, 1, 1);
    rt.next_region.fetch_add(1, Ordering::Relaxed);
    crate::start::flush_output();
    // Thread 0 takes over this thread's thread-local area for the region:
    // this thread gives it up first, since it may still run (the fork's
    // bookkeeping, on another worker) while thread 0 does.
    crate::tls::leave();
    let pinned = pin_shared(data);
    // SAFETY: `region` lives in this frame until the fork returns;
    // `team_thread` reads it as a `Region`. It is plain data (numbers,
    // code and DSM addresses), so the other processes' threads read their
    // copy, sent with the fork, rather than `main`'s frame; only thread 0
    // (process 0, which gets `region` itself) writes it.
    unsafe {
        rt.team
            .fork_team_sent(
                n,
                team_thread,
                (&region as *const Region).cast_mut().cast(),
                size_of::<Region>(),
            )
            .unwrap_or_else(|e| die(format_args!("parallel region: {e}")));
    }
    if let Some(p) = pinned {
        let _rt = RuntimeGuard::enter();
        rt.dsm
            .unpin(p, 1)
            .unwrap_or_else(|e| die(format_args!("parallel region: {e}")));
    }
    if region.carrier0 != 0 {
        crate::tls::enter(region.carrier0 - 1);
    }
    let end = region.seq_end.load(Ordering::Relaxed);
    if end != u64::MAX {
        rt.next_seq.store(end, Ordering::Relaxed);
    }
}

/// One thread of a forked team.
unsafe fn team_thread(tt: &TeamThread<'_>, data: *mut u8) {
    // SAFETY: `parallel_region` passed its `Region`, alive until the fork
    // returns.
    let region = unsafe { &*(data as *const Region) };
    let rt = rt();
    rt.active.fetch_add(1, Ordering::AcqRel);
    let ct = {
        let _rt = RuntimeGuard::enter();
        // SAFETY: the team thread outlives this state (dropped below, before
        // the fork's thread ends); only its lifetime is erased.
        let (thread_num, num_threads) = (tt.thread_num(), tt.num_threads());
        let tt: NonNull<TeamThread<'static>> = NonNull::from(tt).cast();
        let ct = Box::new(CThread {
            tt: Some(tt),
            thread_num,
            num_threads,
            level: region.level,
            active_level: region.active_level,
            seq: Cell::new(region.seq_base),
            ..CThread::initial(region.nthreads_var, Schedule::decode(region.schedule))
        });
        ct.task.thread.set(&*ct);
        ct
    };
    // Thread `k`'s thread-locals are carrier `k`'s; thread 0 has those of
    // the thread that started the region (which waits meanwhile).
    crate::tls::enter(match ct.thread_num {
        0 => region.carrier0.saturating_sub(1),
        k => k,
    });
    // SAFETY: forwarded from `parallel_region`.
    unsafe { run_body(&ct, region.fn_, region.data, region.preset) };
    crate::tls::leave();
    crate::start::flush_output();
    if ct.thread_num == 0 {
        region.seq_end.store(ct.seq.get(), Ordering::Relaxed);
    }
    {
        let _rt = RuntimeGuard::enter();
        drop(ct);
    }
    rt.active.fetch_sub(1, Ordering::AcqRel);
}

/// Runs the region's body as thread `ct`: its loop first if the region is
/// a combined one, then `f(data)`, then waits for its tasks.
unsafe fn run_body(ct: &CThread, f: usize, data: usize, preset: LoopState) {
    let old = enter_task(&ct.task);
    if preset.kind != LoopKind::None {
        crate::loops::begin(ct, preset);
    }
    // SAFETY: GCC's outlined function and data (the caller's contract).
    unsafe {
        let f: OutlinedFn = core::mem::transmute::<usize, OutlinedFn>(f);
        f(data as *mut c_void);
    }
    crate::tasks::wait_children(&ct.task);
    leave_task(old);
}

/// A region of one thread: the encountering thread runs it.
unsafe fn serial_region(me: &CThread, f: OutlinedFn, data: *mut c_void, preset: LoopState) {
    let ct = {
        let _rt = RuntimeGuard::enter();
        let ct = Box::new(CThread {
            level: me.level + 1,
            active_level: me.active_level,
            parent: Some(NonNull::from(me)),
            ..CThread::initial(me.nthreads_var.get(), me.schedule.get())
        });
        ct.task.thread.set(&*ct);
        ct
    };
    // SAFETY: forwarded.
    unsafe { run_body(&ct, f as usize, data as usize, preset) };
    let _rt = RuntimeGuard::enter();
    drop(ct);
}

/// A region begun with `GOMP_parallel_start` (GCC before 4.9), whose
/// thread 0 is the encountering thread itself.
pub struct OpenRegion {
    /// The fork (none: a region of one thread).
    fork: Option<OpenFork>,
    /// The region's shared description (DSM heap: other processes read it).
    region: *mut Region,
    /// The encountering thread's state as thread 0.
    master: *mut CThread,
    /// The encountering thread's task word before the region.
    old_word: usize,
}

/// Begins a region whose thread 0 is the caller, its threads starting in
/// loop `preset` (none if its kind is `None`).
///
/// # Safety
///
/// `f` and `data` are GCC's outlined function and its data.
pub(crate) unsafe fn parallel_start(
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
    preset: LoopState,
) {
    let (me, n, team) = encountered("GOMP_parallel_start", num_threads);
    let rt = rt();
    // The region's description goes where every process can read it: the
    // caller's allocations are DSM memory (process 0's `main`).
    let region = Box::into_raw(Box::new(Region::new(
        me,
        f,
        data,
        preset,
        me.level + 1,
        me.active_level + u32::from(team),
    )));
    let fork = if team {
        crate::start::flush_output();
        // SAFETY: the region lives in the DSM heap until `GOMP_parallel_end`
        // ends the fork; `team_thread` reads it as a `Region`.
        Some(
            unsafe { rt.team.fork_begin(n, team_thread, region.cast()) }
                .unwrap_or_else(|e| die(format_args!("parallel region: {e}"))),
        )
    } else {
        None
    };
    let master = {
        let _rt = RuntimeGuard::enter();
        let (tt, thread_num, num_threads) = match &fork {
            Some(f) => {
                let t = f.thread();
                let (num, size) = (t.thread_num(), t.num_threads());
                (
                    Some(NonNull::from(t).cast::<TeamThread<'static>>()),
                    num,
                    size,
                )
            }
            None => (None, 0, 1),
        };
        Box::into_raw(Box::new(CThread {
            tt,
            thread_num,
            num_threads,
            level: me.level + 1,
            active_level: me.active_level + u32::from(team),
            parent: (!team).then(|| NonNull::from(me)),
            seq: Cell::new(if team {
                rt.next_seq.load(Ordering::Relaxed)
            } else {
                0
            }),
            ..CThread::initial(me.nthreads_var.get(), me.schedule.get())
        }))
    };
    // SAFETY: freshly boxed; freed by `GOMP_parallel_end`.
    let m = unsafe { &*master };
    m.task.thread.set(m);
    let old_word = enter_task(&m.task);
    let open = {
        let _rt = RuntimeGuard::enter();
        Box::into_raw(Box::new(OpenRegion {
            fork,
            region,
            master,
            old_word,
        }))
    };
    m.open.set(open);
    if preset.kind != LoopKind::None {
        crate::loops::begin(m, preset);
    }
}

/// `GOMP_parallel_start` (GCC before 4.9): begins a region of `f(data)`
/// whose thread 0 is the caller; the caller then calls `f(data)` itself,
/// and `GOMP_parallel_end`.
///
/// # Safety
///
/// Called by GCC's code with its outlined function and data.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn GOMP_parallel_start(
    f: OutlinedFn,
    data: *mut c_void,
    num_threads: c_uint,
) {
    // SAFETY: forwarded.
    unsafe { parallel_start(f, data, num_threads, LoopState::default()) }
}

/// `GOMP_parallel_end`: ends the region `GOMP_parallel_start` began, once
/// the caller (thread 0) is done with it.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_parallel_end() {
    let m = current_thread()
        .unwrap_or_else(|| die("GOMP_parallel_end outside the OpenMP program's threads"));
    let open = m.open.replace(core::ptr::null_mut());
    if open.is_null() {
        die("GOMP_parallel_end without GOMP_parallel_start");
    }
    crate::tasks::wait_children(&m.task);
    // SAFETY: boxed by `parallel_start`, taken once.
    let open = unsafe { Box::from_raw(open) };
    // SAFETY: the region lives until freed below.
    let region = unsafe { &*open.region };
    if let Some(fork) = open.fork {
        crate::start::flush_output();
        region.seq_end.store(m.seq.get(), Ordering::Relaxed);
        let rt = rt();
        rt.team
            .fork_end(fork)
            .unwrap_or_else(|e| die(format_args!("parallel region: {e}")));
        rt.next_seq
            .store(region.seq_end.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    leave_task(open.old_word);
    // SAFETY: both boxed by `parallel_start`; no thread uses them any more.
    unsafe {
        drop(Box::from_raw(open.region));
        let _rt = RuntimeGuard::enter();
        drop(Box::from_raw(open.master));
    }
}
