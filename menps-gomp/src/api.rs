//! The `omp_*` API: team and thread queries, the ICVs a program may set
//! (`nthreads-var`, `run-sched-var`, `dyn-var`, `max-active-levels-var`),
//! time. Locks are in [`crate::sync`], `omp_in_final` in [`crate::tasks`].

use core::ffi::{c_double, c_int};
use core::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::{CThread, current_thread};
use menps_omp::Schedule;

/// Threads the job's processors give: the default team size.
fn processors() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let nprocs = menps_omp::num_processes();
    nprocs * (cpus / nprocs).max(1)
}

fn count(n: usize) -> c_int {
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

/// `omp_get_thread_num`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_thread_num() -> c_int {
    current_thread().map_or(0, |t| count(t.thread_num))
}

/// `omp_get_num_threads`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_num_threads() -> c_int {
    current_thread().map_or(1, |t| count(t.num_threads))
}

/// `omp_get_max_threads`: the team size of a region started now.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_max_threads() -> c_int {
    // The nthreads-var ICV, also inside a region (as libgomp: a nested
    // region would still run on one thread).
    current_thread().map_or_else(|| count(processors()), |t| count(t.nthreads_var.get()))
}

/// `omp_set_num_threads`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_num_threads(n: c_int) {
    if let Some(t) = current_thread() {
        t.nthreads_var.set(n.max(1) as usize);
    }
}

/// `omp_get_num_procs`: processors of the job (its processes' share of
/// their hosts').
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_num_procs() -> c_int {
    count(processors())
}

/// `omp_in_parallel`: inside an active region (more than one thread).
#[unsafe(no_mangle)]
pub extern "C" fn omp_in_parallel() -> c_int {
    c_int::from(current_thread().is_some_and(|t| t.active_level > 0))
}

/// `omp_get_level`: enclosing regions, active or not.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_level() -> c_int {
    current_thread().map_or(0, |t| t.level as c_int)
}

/// `omp_get_active_level`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_active_level() -> c_int {
    current_thread().map_or(0, |t| t.active_level as c_int)
}

/// The thread state at nesting `level` on the way to the caller.
fn at_level(level: c_int) -> Option<(usize, usize)> {
    let me = current_thread();
    let cur = me.map_or(0, |t| t.level as c_int);
    if level < 0 || level > cur {
        return None;
    }
    if level == 0 {
        return Some((0, 1));
    }
    let mut t: &CThread = me?;
    while t.level as c_int > level {
        // SAFETY: a serial region's parent outlives it (it runs it).
        t = unsafe { t.parent?.as_ref() };
    }
    Some((t.thread_num, t.num_threads))
}

/// `omp_get_ancestor_thread_num`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_ancestor_thread_num(level: c_int) -> c_int {
    at_level(level).map_or(-1, |(n, _)| count(n))
}

/// `omp_get_team_size`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_team_size(level: c_int) -> c_int {
    at_level(level).map_or(-1, |(_, s)| count(s))
}

/// `omp_get_wtime`: seconds of a monotonic clock.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_wtime() -> c_double {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// `omp_get_wtick`: the clock's resolution in seconds.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_wtick() -> c_double {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_getres into a valid timespec.
    unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9).max(1e-9)
}

/// `dyn-var`: recorded, without effect (teams always get the threads they
/// ask for).
static DYNAMIC: AtomicBool = AtomicBool::new(false);
static DYNAMIC_READ: std::sync::Once = std::sync::Once::new();

fn dynamic_var() -> &'static AtomicBool {
    DYNAMIC_READ.call_once(|| {
        let _rt = menps_dsm::dsm::allocator::RuntimeGuard::enter();
        let on = ct_config::vars::OMP_DYNAMIC.flag().unwrap_or_else(|e| {
            // As libgomp: a malformed value is reported and ignored.
            eprintln!("menps-gomp: {e}; using false");
            None
        });
        let on = on.unwrap_or(false);
        DYNAMIC.store(on, Ordering::Relaxed);
    });
    &DYNAMIC
}

/// `omp_set_dynamic`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_dynamic(on: c_int) {
    dynamic_var().store(on != 0, Ordering::Relaxed);
}

/// `omp_get_dynamic`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_dynamic() -> c_int {
    c_int::from(dynamic_var().load(Ordering::Relaxed))
}

/// Active levels this runtime supports: nested regions run on one thread.
const SUPPORTED_ACTIVE_LEVELS: c_int = 1;
static MAX_ACTIVE_LEVELS: AtomicI32 = AtomicI32::new(SUPPORTED_ACTIVE_LEVELS);

/// `omp_set_nested`: nested parallelism is not supported (at most one
/// active level), so this changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_nested(_on: c_int) {}

/// `omp_get_nested`: 0 (one active level at most).
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_nested() -> c_int {
    c_int::from(MAX_ACTIVE_LEVELS.load(Ordering::Relaxed) > 1)
}

/// `omp_set_max_active_levels`: clamped to the one level supported.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_max_active_levels(n: c_int) {
    MAX_ACTIVE_LEVELS.store(n.clamp(0, SUPPORTED_ACTIVE_LEVELS), Ordering::Relaxed);
}

/// `omp_get_max_active_levels`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_max_active_levels() -> c_int {
    MAX_ACTIVE_LEVELS.load(Ordering::Relaxed)
}

/// `omp_get_supported_active_levels`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_supported_active_levels() -> c_int {
    SUPPORTED_ACTIVE_LEVELS
}

/// `omp_get_thread_limit`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_thread_limit() -> c_int {
    c_int::MAX
}

/// `omp_get_cancellation`: cancellation is off.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_cancellation() -> c_int {
    0
}

/// `omp_sched_t` codes.
const SCHED_STATIC: c_int = 1;
const SCHED_DYNAMIC: c_int = 2;
const SCHED_GUIDED: c_int = 3;
const SCHED_AUTO: c_int = 4;
const SCHED_MONOTONIC: c_int = c_int::MIN;

/// `omp_set_schedule`: the run-time schedule of later loops and regions.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_schedule(kind: c_int, chunk: c_int) {
    let Some(t) = current_thread() else { return };
    let c = usize::try_from(chunk).unwrap_or(0);
    let s = match kind & !SCHED_MONOTONIC {
        SCHED_STATIC if c == 0 => Schedule::Static,
        SCHED_STATIC => Schedule::StaticChunk(c),
        SCHED_DYNAMIC => Schedule::Dynamic(c.max(1)),
        SCHED_GUIDED => Schedule::Guided(c.max(1)),
        SCHED_AUTO => Schedule::Auto,
        _ => return,
    };
    t.schedule.set(s);
}

/// `omp_get_schedule`.
///
/// # Safety
///
/// `kind` and `chunk` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_get_schedule(kind: *mut c_int, chunk: *mut c_int) {
    let s = current_thread().map_or(Schedule::Static, |t| t.schedule.get());
    let (k, c) = match s {
        Schedule::StaticChunk(c) => (SCHED_STATIC, c),
        Schedule::Dynamic(c) => (SCHED_DYNAMIC, c),
        Schedule::Guided(c) => (SCHED_GUIDED, c),
        Schedule::Auto => (SCHED_AUTO, 0),
        Schedule::Static | Schedule::Runtime => (SCHED_STATIC, 0),
    };
    // SAFETY: the caller's contract.
    unsafe {
        *kind = k;
        *chunk = count(c);
    }
}

/// The workers' binding (`OMP_PROC_BIND`), if they are bound.
fn binding() -> Option<&'static menps_omp::internals::Binding> {
    menps_omp::internals::runtime()?.binding.as_ref()
}

/// `omp_get_proc_bind`: the `OMP_PROC_BIND` policy the team's workers are
/// bound by (`omp_proc_bind_false` when they are not).
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_proc_bind() -> c_int {
    binding().map_or(0, |b| b.policy.code())
}

/// `omp_get_num_places`: places of `OMP_PLACES` when the workers are bound,
/// else none.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_num_places() -> c_int {
    binding().map_or(0, |b| count(b.places.len()))
}

/// The processors of place `p`, if there is such a place.
fn place(p: c_int) -> Option<&'static [usize]> {
    let b = binding()?;
    b.places.get(usize::try_from(p).ok()?).map(Vec::as_slice)
}

/// `omp_get_place_num_procs`: processors of place `p` (0: no such place).
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_place_num_procs(p: c_int) -> c_int {
    place(p).map_or(0, |cpus| count(cpus.len()))
}

/// `omp_get_place_proc_ids`: writes the processors of place `p` to `ids`
/// (nothing for no such place).
///
/// # Safety
///
/// `ids` has room for `omp_get_place_num_procs(p)` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_get_place_proc_ids(p: c_int, ids: *mut c_int) {
    for (k, &c) in place(p).unwrap_or_default().iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { *ids.add(k) = count(c) };
    }
}

/// `omp_get_place_num`: the place of the worker running the caller, or -1
/// when the workers are not bound. (A team thread normally stays on its
/// worker, but another worker of its process may run it for a while.)
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_place_num() -> c_int {
    menps_omp::internals::place_num().map_or(-1, count)
}

/// `omp_get_partition_num_places`: every place (the runtime does not split
/// the place list between nested teams).
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_partition_num_places() -> c_int {
    omp_get_num_places()
}

/// `omp_get_partition_place_nums`: writes `0 .. omp_get_partition_num_places()`
/// to `nums`.
///
/// # Safety
///
/// `nums` has room for `omp_get_partition_num_places()` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_get_partition_place_nums(nums: *mut c_int) {
    for k in 0..omp_get_partition_num_places() {
        // SAFETY: the caller's contract.
        unsafe { *nums.add(k as usize) = k };
    }
}

/// `omp_get_num_devices`: no target devices.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_num_devices() -> c_int {
    0
}

/// `omp_get_default_device`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_default_device() -> c_int {
    0
}

/// `omp_set_default_device`: only the host exists.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_default_device(_d: c_int) {}

/// `omp_get_initial_device`: the host (numbered after the 0 devices).
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_initial_device() -> c_int {
    0
}

/// `omp_get_device_num`: the host.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_device_num() -> c_int {
    0
}

/// `omp_is_initial_device`: code runs on the host.
#[unsafe(no_mangle)]
pub extern "C" fn omp_is_initial_device() -> c_int {
    1
}

/// `omp_get_max_task_priority`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_max_task_priority() -> c_int {
    0
}

/// `omp_get_num_teams`: one league.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_num_teams() -> c_int {
    1
}

/// `omp_get_team_num`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_get_team_num() -> c_int {
    0
}
