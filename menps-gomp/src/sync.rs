//! Synchronisation: `GOMP_barrier`, `critical` (unnamed and named),
//! `atomic` (the generic form), `single` (and `copyprivate`), cancellation
//! points (cancellation is off), and the lock API (`omp_*_lock`,
//! `omp_*_nest_lock`).
//!
//! Critical sections and locks are DSM mutexes keyed by a name or by the
//! lock's address (the same in every process: locks live in DSM memory), so
//! what the previous holder wrote is visible to the next. A held mutex is
//! kept in this process's table until it is released.

use crate::caller_sp::with_caller_sp;
use crate::errno::KeepErrno;
use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::sync::Mutex;

use menps_dsm::dsm::allocator::RuntimeGuard;

use crate::{CThread, current_task, current_thread, die, rt};
use menps_omp::internals::{Held, lock, name_key, unlock};
use menps_omp::internals::{LOCK_SLOTS, NEXT, ORD};

/// Key of the mutex of ordered parts.
pub(crate) const ORDERED_KEY: u64 = (1 << 62) | 0x006f_7264_6572_6564;

/// Held DSM mutexes of this process, by key.
static HELD: Mutex<Option<HashMap<u64, Held>>> = Mutex::new(None);

/// Locks the DSM mutex of `key` and keeps it until [`release`].
pub(crate) fn hold(key: u64, what: &str) {
    let held = lock(rt(), key, what);
    let _rt = RuntimeGuard::enter();
    let old = HELD
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, held);
    if old.is_some() {
        die(format_args!("{what}: locked twice in one process"));
    }
}

/// Unlocks the DSM mutex [`hold`] locked.
pub(crate) fn release(key: u64, what: &str) {
    let held = {
        let _rt = RuntimeGuard::enter();
        HELD.lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&key))
    };
    match held {
        Some(h) => unlock(h, what),
        None => die(format_args!("{what}: released but not held")),
    }
}

/// The team barrier of `ct`: its tasks complete first, as every task of
/// the team must at a barrier. `caller_sp` is the program's stack pointer
/// before it called the runtime, where an entry point knows it
/// ([`crate::caller_sp`]).
pub(crate) fn team_barrier(ct: &CThread, caller_sp: Option<usize>) {
    let _errno = KeepErrno::new();
    crate::tasks::wait_children(&ct.task);
    if let Some(tt) = ct.team() {
        // The barrier's releases need not publish the runtime's frames
        // below the program's (they change at every barrier, and no other
        // thread reads them). Without the caller's stack pointer they end
        // about here.
        let here = 0u8;
        let dsm = rt().dsm;
        let _frames = match caller_sp {
            Some(sp) => dsm.program_frames_end_at_call(sp),
            None => dsm.program_frames_end(core::hint::black_box(&here) as *const u8 as usize),
        };
        crate::start::flush_output();
        tt.barrier()
            .unwrap_or_else(|e| die(format_args!("team barrier: {e}")));
    }
}

with_caller_sp!(
    /// `GOMP_barrier`.
    GOMP_barrier => barrier_from
);

/// `GOMP_barrier`, called from a program whose stack pointer was
/// `caller_sp`.
extern "C" fn barrier_from(caller_sp: usize) {
    if let Some(ct) = current_thread() {
        team_barrier(ct, Some(caller_sp));
    }
}

with_caller_sp!(
    /// `GOMP_barrier_cancel`: `GOMP_barrier` (cancellation is off).
    GOMP_barrier_cancel -> bool => barrier_cancel_from
);

/// `GOMP_barrier_cancel`, called from a program whose stack pointer was
/// `caller_sp`: never cancelled.
extern "C" fn barrier_cancel_from(caller_sp: usize) -> bool {
    barrier_from(caller_sp);
    false
}

/// Whether the program asked for cancellation (`OMP_CANCELLATION=true`),
/// which this runtime does not offer.
fn cancellation_requested() -> bool {
    let _rt = RuntimeGuard::enter();
    match ct_config::vars::OMP_CANCELLATION.flag() {
        Ok(on) => on.unwrap_or(false),
        Err(e) => die(e),
    }
}

/// `GOMP_cancellation_point`: never cancelled (cancellation is off).
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_cancellation_point(_which: c_int) -> bool {
    false
}

/// `GOMP_cancel`: with cancellation off (`OMP_CANCELLATION` unset, as by
/// default) a `cancel` construct does nothing, as in libgomp; with
/// `OMP_CANCELLATION=true` it aborts, since this runtime cannot cancel.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_cancel(_which: c_int, do_cancel: bool) -> bool {
    if do_cancel && cancellation_requested() {
        die("GOMP_cancel: cancellation (OMP_CANCELLATION=true) is not supported");
    }
    false
}

/// `GOMP_critical_start`: the unnamed critical section.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_critical_start() {
    let _errno = KeepErrno::new();
    hold(name_key(""), "critical section");
}

/// `GOMP_critical_end`.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_critical_end() {
    let _errno = KeepErrno::new();
    release(name_key(""), "critical section");
}

/// `GOMP_critical_name_start`: the critical section whose name GCC
/// represents by the variable at `pptr` (a global of the program: the same
/// address in every process).
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_critical_name_start(pptr: *mut *mut c_void) {
    let _errno = KeepErrno::new();
    hold(pptr as u64, "named critical section");
}

/// `GOMP_critical_name_end`.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_critical_name_end(pptr: *mut *mut c_void) {
    let _errno = KeepErrno::new();
    release(pptr as u64, "named critical section");
}

/// `GOMP_atomic_start`: the section of `atomic` updates GCC cannot do with
/// one instruction.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_atomic_start() {
    let _errno = KeepErrno::new();
    hold(name_key("\0atomic"), "atomic");
}

/// `GOMP_atomic_end`.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_atomic_end() {
    let _errno = KeepErrno::new();
    release(name_key("\0atomic"), "atomic");
}

/// Whether this thread is the first of its team to reach the next
/// `single` (its work-sharing number is taken either way); `Some(seq)` for
/// a team of several threads, whose slot the caller still holds.
fn single_first(ct: &CThread) -> (bool, Option<u64>) {
    if ct.num_threads == 1 {
        return (true, None);
    }
    let rt = rt();
    let seq = ct.next_seq();
    rt.ring.enter(rt.dsm, seq);
    let first = rt.ring.fetch_add(rt.dsm, seq, NEXT, 1) == 0;
    (first, Some(seq))
}

/// `GOMP_single_start`: true on the one thread that runs the `single`. In
/// a team across processes that is thread 0 (the construct lets any thread
/// run it): no counter is taken, and the region's shared variables, which
/// the `single` often writes, are usually in thread 0's frame, on process
/// 0 — a first arriver on another process would fault on them. Within a
/// process, the first thread to arrive (as libgomp).
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_single_start() -> bool {
    let _errno = KeepErrno::new();
    let Some(ct) = current_thread() else {
        return true;
    };
    if ct
        .team()
        .is_some_and(|t| t.threads_here() < t.num_threads())
    {
        return ct.thread_num == 0;
    }
    let (first, seq) = single_first(ct);
    if let Some(seq) = seq {
        let rt = rt();
        rt.ring.leave(rt.dsm, seq, ct.num_threads);
    }
    first
}

/// `GOMP_single_copy_start`: null on the thread that runs the `single`
/// (it then calls `GOMP_single_copy_end`); on the others, once it has, the
/// address of the data it copies out.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_single_copy_start() -> *mut c_void {
    let _errno = KeepErrno::new();
    let Some(ct) = current_thread() else {
        return core::ptr::null_mut();
    };
    let (first, seq) = single_first(ct);
    let Some(seq) = seq else {
        return core::ptr::null_mut();
    };
    if first {
        ct.copy_seq.set(seq);
        return core::ptr::null_mut();
    }
    // The runner publishes its data (in its frame: DSM memory) and the
    // address, then meets us at this barrier.
    team_barrier(ct, None);
    let rt = rt();
    let p = rt.ring.load(rt.dsm, seq, ORD);
    rt.ring.leave(rt.dsm, seq, ct.num_threads);
    p as usize as *mut c_void
}

/// `GOMP_single_copy_end`: the runner of a `single copyprivate` hands
/// `data` to the other threads.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_single_copy_end(data: *mut c_void) {
    let _errno = KeepErrno::new();
    let Some(ct) = current_thread() else { return };
    if ct.num_threads == 1 {
        return;
    }
    let rt = rt();
    let seq = ct.copy_seq.get();
    rt.ring.fetch_add(rt.dsm, seq, ORD, data as u64);
    team_barrier(ct, None);
    rt.ring.leave(rt.dsm, seq, ct.num_threads);
}

// ---------------------------------------------------------------------
// Locks

/// The lock table entry of `key` (claimed on first use).
fn lock_slot(key: u64) -> u64 {
    static SLOTS: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);
    let _rt = RuntimeGuard::enter();
    let mut map = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    let map = map.get_or_insert_with(HashMap::new);
    if let Some(&s) = map.get(&key) {
        return s;
    }
    let rt = rt();
    let h = (key ^ (key >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let start = (h ^ (h >> 32)) % LOCK_SLOTS;
    for i in 0..LOCK_SLOTS {
        let slot = (start + i) % LOCK_SLOTS;
        let found = rt.ring.lock_cas(rt.dsm, slot, 0, 0, key + 1);
        if found == 0 || found == key + 1 {
            map.insert(key, slot);
            return slot;
        }
    }
    die(format_args!(
        "more than {LOCK_SLOTS} OpenMP locks are in use"
    ))
}

/// Marks the lock of `key` held (`busy`) or free in the lock table.
fn set_busy(slot: u64, busy: bool) {
    let rt = rt();
    let (from, to) = if busy { (0, 1) } else { (1, 0) };
    let mut cur = rt.ring.lock_load(rt.dsm, slot, 1);
    loop {
        if cur == to {
            return;
        }
        let found = rt.ring.lock_cas(rt.dsm, slot, 1, from, to);
        if found == from {
            return;
        }
        cur = found;
    }
}

/// Takes the lock at `lock`, waiting (parked) while another task holds it.
fn lock_acquire(lock: *const c_void, what: &str) {
    let key = lock as u64;
    let slot = lock_slot(key);
    hold(key, what);
    set_busy(slot, true);
}

/// Tries to take the lock at `lock` without waiting for another holder.
fn lock_try(lock: *const c_void, what: &str) -> bool {
    let key = lock as u64;
    let slot = lock_slot(key);
    let rt = rt();
    if rt.ring.lock_cas(rt.dsm, slot, 1, 0, 1) != 0 {
        return false;
    }
    hold(key, what);
    true
}

/// Releases the lock at `lock`.
fn lock_release(lock: *const c_void, what: &str) {
    let key = lock as u64;
    let slot = lock_slot(key);
    set_busy(slot, false);
    release(key, what);
}

/// `omp_init_lock`: a lock needs no set-up (its mutex is found by address).
#[unsafe(no_mangle)]
pub extern "C" fn omp_init_lock(_lock: *mut c_void) {}

/// `omp_destroy_lock`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_destroy_lock(_lock: *mut c_void) {}

/// `omp_set_lock`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_lock(lock: *mut c_void) {
    let _errno = KeepErrno::new();
    lock_acquire(lock, "omp_set_lock");
}

/// `omp_unset_lock`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_unset_lock(lock: *mut c_void) {
    let _errno = KeepErrno::new();
    lock_release(lock, "omp_unset_lock");
}

/// `omp_test_lock`: 1 if the lock was free and is now held.
#[unsafe(no_mangle)]
pub extern "C" fn omp_test_lock(lock: *mut c_void) -> c_int {
    let _errno = KeepErrno::new();
    c_int::from(lock_try(lock, "omp_test_lock"))
}

/// Owners and depths of the nested locks held in this process.
static NESTED: Mutex<Option<HashMap<u64, (usize, c_int)>>> = Mutex::new(None);

/// The identity of the running task (a nested lock's owner).
fn task_id() -> usize {
    current_task().map_or(1, |t| t as *const crate::Task as usize)
}

/// The nested lock at `key`: (owner, depth), if held in this process.
fn nested_state(key: u64) -> Option<(usize, c_int)> {
    let _rt = RuntimeGuard::enter();
    NESTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key).copied())
}

fn set_nested_state(key: u64, v: Option<(usize, c_int)>) {
    let _rt = RuntimeGuard::enter();
    let mut m = NESTED.lock().unwrap_or_else(|e| e.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    match v {
        Some(v) => m.insert(key, v),
        None => m.remove(&key),
    };
}

/// `omp_init_nest_lock`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_init_nest_lock(_lock: *mut c_void) {}

/// `omp_destroy_nest_lock`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_destroy_nest_lock(_lock: *mut c_void) {}

/// `omp_set_nest_lock`: the owner may set it again.
#[unsafe(no_mangle)]
pub extern "C" fn omp_set_nest_lock(lock: *mut c_void) {
    let _errno = KeepErrno::new();
    let (key, me) = (lock as u64, task_id());
    if let Some((owner, depth)) = nested_state(key)
        && owner == me
    {
        return set_nested_state(key, Some((me, depth + 1)));
    }
    lock_acquire(lock, "omp_set_nest_lock");
    set_nested_state(key, Some((me, 1)));
}

/// `omp_unset_nest_lock`.
#[unsafe(no_mangle)]
pub extern "C" fn omp_unset_nest_lock(lock: *mut c_void) {
    let _errno = KeepErrno::new();
    let (key, me) = (lock as u64, task_id());
    match nested_state(key) {
        Some((owner, depth)) if owner == me && depth > 1 => {
            set_nested_state(key, Some((me, depth - 1)))
        }
        Some((owner, _)) if owner == me => {
            set_nested_state(key, None);
            lock_release(lock, "omp_unset_nest_lock");
        }
        _ => die("omp_unset_nest_lock: the lock is not held by this task"),
    }
}

/// `omp_test_nest_lock`: the new depth if the lock is now held by the
/// caller, 0 otherwise.
#[unsafe(no_mangle)]
pub extern "C" fn omp_test_nest_lock(lock: *mut c_void) -> c_int {
    let _errno = KeepErrno::new();
    let (key, me) = (lock as u64, task_id());
    if let Some((owner, depth)) = nested_state(key) {
        if owner == me {
            set_nested_state(key, Some((me, depth + 1)));
            return depth + 1;
        }
        return 0;
    }
    if lock_try(lock, "omp_test_nest_lock") {
        set_nested_state(key, Some((me, 1)));
        1
    } else {
        0
    }
}
