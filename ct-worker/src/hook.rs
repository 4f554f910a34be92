//! Switch hooks: told when a worker switches into a user-level thread and
//! after it has switched away from one.
//!
//! A [`SwitchHook`] is part of the compile-time [`Config`](crate::Config) (its
//! `Hook` type); its instance is given to the runtime's
//! [`Builder`](crate::Builder) (or default-constructed). The default,
//! [`NoHook`], compiles to nothing.
//!
//! The calls follow the order a DSM needs to keep the stack of every running
//! thread pinned (MENPS §3.5): on a switch from thread `a` to thread `b`, the
//! worker calls `entering(b)` (pin `b`'s stack) *before* anything touches
//! `b`'s stack, switches, and calls `left(a)` (unpin `a`'s stack) once
//! nothing runs on `a`'s stack any more — and before `a` is published where
//! another worker could resume it. So for every thread the calls alternate
//! strictly, `entering`, `left`, `entering`, `left`, …, whatever workers they
//! happen on, and the thread's code only runs between an `entering` and the
//! following `left`. Both calls see the same stack for the whole life of the
//! thread.

use core::cell::Cell;

use ct_context::StackRegion;

/// Why a worker switched away from a user-level thread
/// ([`SwitchHook::left`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaveReason {
    /// The thread stays runnable and may be resumed by any worker: it forked
    /// a child that runs first (work-first `spawn`), or switched straight to
    /// another thread ([`SuspendedThread::enter`](crate::SuspendedThread::enter)).
    Suspended,
    /// The thread yielded ([`yield_now`](crate::yield_now)); it is runnable.
    Yielded,
    /// The thread blocked: it waits in a join, a
    /// [`SuspendedThread`](crate::SuspendedThread) (a lock, a condition, a
    /// barrier) until someone wakes it. If it turns out not to block after
    /// all (its wait condition was already met), `entering` follows at once,
    /// on the same worker, before its code runs again.
    Blocked,
    /// The thread finished. Its stack goes back to the
    /// [`StackSource`](crate::StackSource) right after this call, and its
    /// identity may be reused by a later thread.
    Finished,
    /// `entering` was called for a switch into this thread that was then
    /// called off before any of its code ran (the thread that was to block
    /// did not). The thread is suspended as before, and will be entered
    /// again when it runs.
    Cancelled,
}

/// A user-level thread as a [`SwitchHook`] sees it: a stable identity and a
/// word the hook may keep per thread.
#[derive(Debug, Clone, Copy)]
pub struct UltThread<'a> {
    id: usize,
    data: &'a Cell<usize>,
    /// Address of the saved context (0: none).
    saved: usize,
}

impl<'a> UltThread<'a> {
    #[inline(always)]
    pub(crate) fn new(id: usize, data: &'a Cell<usize>, saved: usize) -> Self {
        UltThread { id, data, saved }
    }

    /// In [`SwitchHook::left`], for a thread that will run again: where its
    /// saved context is. With the native context policies that is its stack
    /// pointer at the switch, so everything of its stack below that
    /// address is dead until it runs again (a DSM need not publish it);
    /// other policies may keep the context elsewhere, so check that the
    /// address lies in the thread's stack before relying on it. `None` in
    /// `entering`, for a finished thread, and for a cancelled switch.
    #[inline(always)]
    pub fn saved_context(&self) -> Option<usize> {
        (self.saved != 0).then_some(self.saved)
    }

    /// An opaque identity, the same for every call about this thread from
    /// its start until it finishes (the address of its descriptor). A later
    /// thread may get the same identity once this one has finished.
    #[inline(always)]
    pub fn id(&self) -> usize {
        self.id
    }

    /// The thread's hook word: 0 when the thread starts, then whatever the
    /// hook (or the thread itself, through
    /// [`set_current_thread_data`](crate::set_current_thread_data)) stored.
    #[inline(always)]
    pub fn data(&self) -> usize {
        self.data.get()
    }

    /// Stores the thread's hook word (e.g. a team-thread index, or the
    /// address of a per-thread block the hook frees when the thread
    /// finishes).
    #[inline(always)]
    pub fn set_data(&self, v: usize) {
        self.data.set(v);
    }
}

/// Told when a worker switches into a user-level thread and after it has
/// switched away from one.
///
/// The calls follow the order a DSM needs to keep the stack of every running
/// thread pinned (MENPS §3.5): on a switch from thread `a` to thread `b`, the
/// worker calls `entering(b)` (pin `b`'s stack) *before* anything touches
/// `b`'s stack, switches, and calls `left(a)` (unpin `a`'s stack) once
/// nothing runs on `a`'s stack any more — and before `a` is published where
/// another worker could resume it. So for every thread the calls alternate
/// strictly, `entering`, `left`, `entering`, `left`, …, whatever workers they
/// happen on, and the thread's code only runs between an `entering` and the
/// following `left`, on the worker that called `entering`. Both calls see
/// the same stack for the whole life of the thread. Every path reports:
/// the first start of a thread (spawned work-first, from outside the
/// runtime, or a stolen `join` job), every resumption, direct switches
/// (an exiting child handing its worker to its joiner,
/// [`SuspendedThread::enter`](crate::SuspendedThread::enter) /
/// [`swap`](crate::SuspendedThread::swap), a work-first fork), and switches
/// that are called off ([`LeaveReason::Cancelled`]).
///
/// Both methods run on the worker's OS thread, in the middle of a switch
/// (on the stack of the thread being left, of the thread being entered, or
/// of the scheduler), possibly inside an ontop function. They must not
/// switch contexts, park or yield, spawn threads, use ULT-locals, or panic
/// (no unwinding can cross a switch); they may block the OS thread (e.g.
/// wait for a page to arrive), and they may run concurrently on different
/// workers. The scheduler's own stack is not a thread's and is never
/// reported.
pub trait SwitchHook: Send + Sync + 'static {
    /// Whether the runtime calls the hook at all. Only [`NoHook`]-like hooks,
    /// whose methods do nothing, set it to `false`; the calls (and the
    /// loads that feed them) then vanish from the scheduler's paths.
    const ACTIVE: bool = true;

    /// Worker `worker` is about to run `thread` on `stack`: called before
    /// anything touches that stack — before a new thread's first frame is
    /// written to it, before a suspended thread is resumed (on whichever
    /// worker resumes it), before the first instruction of a child forked
    /// work-first.
    fn entering(&self, worker: usize, thread: UltThread<'_>, stack: StackRegion);

    /// Worker `worker` has switched away from `thread`, which ran on `stack`,
    /// for `why`: nothing runs on that stack any more, and no other worker
    /// can resume the thread before this call returns.
    fn left(&self, worker: usize, thread: UltThread<'_>, stack: StackRegion, why: LeaveReason);
}

/// The default hook: does nothing and costs nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHook;

impl SwitchHook for NoHook {
    const ACTIVE: bool = false;

    #[inline(always)]
    fn entering(&self, _: usize, _: UltThread<'_>, _: StackRegion) {}

    #[inline(always)]
    fn left(&self, _: usize, _: UltThread<'_>, _: StackRegion, _: LeaveReason) {}
}
