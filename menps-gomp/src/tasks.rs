//! Tasks: `GOMP_task`, `GOMP_taskwait`, `GOMP_taskyield`,
//! `GOMP_taskgroup_start/end`.
//!
//! A deferred task is a job in the creating worker's deque (help-first):
//! the creator goes on, an idle worker of the process may steal the job and
//! run it as a user-level thread of its own, and a job nobody took by the
//! time the creator waits for it (`taskwait`, the end of a `taskgroup`, a
//! barrier) runs right there, on the creator's stack, without a thread. A
//! recursive program such as `fib` with `task`/`taskwait` thus costs a
//! deque push and pop per task instead of a trip through a shared queue.
//! Arguments up to 24 bytes travel in the job itself, larger ones (and
//! those GCC copies with a function) in a private buffer. An `if(0)` task,
//! the tasks of a `final` task, and a task created while the worker has
//! plenty of queued work for others to steal run at once (undeferred), as
//! OpenMP allows.
//!
//! Tasks run inside the process that created them. A task run inline nests
//! on its creator's stack: very deep recursions of tasks need a larger
//! `OMP_STACKSIZE`.
//!
//! Completion: a task waits for its own children before it completes, so
//! joining a task means joining everything it created; `taskwait` and the
//! end of a `taskgroup` join the children created since, and a team thread
//! joins its children before every barrier and at the region's end.

use crate::errno::KeepErrno;
use core::ffi::{c_int, c_long, c_uint, c_void};

use core::alloc::Layout;

use ct_worker::Deferred;
use menps_dsm::dsm::allocator::RuntimeGuard;
use menps_dsm::dsm::team::TeamConfig;

use crate::{Task, current_task, die};

/// A child task not joined yet: a job in its creator's deque (or a thread,
/// if an idle worker stole it).
pub(crate) struct Child(Deferred<TeamConfig>);

const FLAG_FINAL: c_uint = 1 << 1;
const FLAG_DEPEND: c_uint = 1 << 3;
/// Flags this runtime acts on or may ignore: untied, final, mergeable,
/// depend (refused below), priority.
const KNOWN_FLAGS: c_uint = 0x1f;

/// Jobs queued on a worker beyond which a new task runs at once: the
/// oldest queued jobs (the largest parts of a recursion) keep the other
/// workers busy, and the newest need no job of their own.
const QUEUED_ENOUGH: usize = 4;

/// Bytes of arguments a task carries in its job (which fits a ct-worker
/// descriptor with them: no allocation per task).
const INLINE_WORDS: usize = 3;

/// A copy-constructor of task arguments (`firstprivate` of C++ objects,
/// aggregates, VLAs).
type CopyFn = unsafe extern "C" fn(*mut c_void, *mut c_void);
/// A task body.
type TaskFn = unsafe extern "C" fn(*mut c_void);

const META_FINAL: u64 = 1;
const META_HEAP: u64 = 2;

/// A task ready to run: its function, its team thread, its arguments
/// (inline, or a private buffer of `[pointer, size, align]`).
struct Job {
    f: TaskFn,
    thread: *const crate::CThread,
    words: [u64; INLINE_WORDS],
    meta: u64,
}

// SAFETY: the arguments are bytes the task owns (GCC's copies of its
// firstprivate values and pointers to shared data); the team thread
// outlives its tasks (it joins them).
unsafe impl Send for Job {}

impl Job {
    /// Copies `size` bytes of arguments from `data` (with `copy`, if
    /// given).
    ///
    /// # Safety
    ///
    /// `data` holds the arguments GCC prepared (`size` bytes).
    unsafe fn new(
        f: TaskFn,
        thread: *const crate::CThread,
        data: *mut c_void,
        copy: Option<CopyFn>,
        size: usize,
        align: usize,
        is_final: bool,
    ) -> Job {
        let mut j = Job {
            f,
            thread,
            words: [0; INLINE_WORDS],
            meta: u64::from(is_final),
        };
        let dst: *mut u8 = if copy.is_none() && size <= 8 * INLINE_WORDS && align <= 8 {
            j.words.as_mut_ptr().cast()
        } else {
            let layout = Layout::from_size_align(size.max(1), align.max(1).next_power_of_two())
                .unwrap_or_else(|_| die("GOMP_task: invalid argument size or alignment"));
            let _rt = RuntimeGuard::enter();
            // SAFETY: a non-zero layout.
            let p = unsafe { std::alloc::alloc(layout) };
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            j.words = [p as u64, layout.size() as u64, layout.align() as u64];
            j.meta |= META_HEAP;
            p
        };
        // SAFETY: `dst` has room for `size` bytes; `data` holds them (or
        // `copy` builds them from it).
        unsafe {
            match copy {
                Some(c) => c(dst.cast(), data),
                None => core::ptr::copy_nonoverlapping(data.cast::<u8>(), dst, size),
            }
        }
        j
    }

    /// Runs the task (on whichever thread takes it).
    fn run(self) {
        let mut job = Some(self);
        ct_worker::with_current_thread_word_in::<TeamConfig, _>(|word, _| {
            if let Some(j) = job.take() {
                j.run_with(word)
            }
        });
        // Outside the runtime's threads: no task context to set.
        if let Some(j) = job {
            let (args, heap) = j.args();
            // SAFETY: GCC's task function on its arguments.
            unsafe { (j.f)(args.cast()) };
            j.free(args, heap);
        }
    }

    /// Where the arguments are, and whether they are a private buffer.
    fn args(&self) -> (*mut u8, bool) {
        let heap = self.meta & META_HEAP != 0;
        let args = if heap {
            self.words[0] as *mut u8
        } else {
            self.words.as_ptr().cast_mut().cast()
        };
        (args, heap)
    }

    /// Frees a private argument buffer.
    fn free(&self, args: *mut u8, heap: bool) {
        if heap {
            let _rt = RuntimeGuard::enter();
            // SAFETY: allocated in `new` with this layout.
            unsafe {
                std::alloc::dealloc(
                    args,
                    Layout::from_size_align_unchecked(
                        self.words[1] as usize,
                        self.words[2] as usize,
                    ),
                )
            };
        }
    }

    /// Runs the task as the running thread's task (`word`: that thread's
    /// word, which points to its current task).
    fn run_with(self, word: &core::cell::Cell<usize>) {
        let (args, heap) = self.args();
        let node = Task::new(self.thread, self.meta & META_FINAL != 0);
        let old = word.replace(&node as *const Task as usize);
        // SAFETY: GCC's task function on its arguments.
        unsafe { (self.f)(args.cast()) };
        wait_children(&node);
        word.set(old);
        self.free(args, heap);
    }
}

/// `GOMP_task`: creates a task running `f` on a copy of `data`.
///
/// # Safety
///
/// Called by GCC's code with its task function and argument block.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn GOMP_task(
    f: TaskFn,
    data: *mut c_void,
    copy: Option<CopyFn>,
    arg_size: c_long,
    arg_align: c_long,
    if_clause: bool,
    flags: c_uint,
    _depend: *mut *mut c_void,
    _priority: c_int,
) {
    if flags & FLAG_DEPEND != 0 {
        die("GOMP_task: the depend clause is not supported");
    }
    if flags & !KNOWN_FLAGS != 0 {
        die(format_args!(
            "GOMP_task: task flags {flags:#x} are not supported (detach, in_reduction?)"
        ));
    }
    let size = arg_size.max(0) as usize;
    let align = arg_align.max(1) as usize;
    // One lookup finds the running task and how much work is queued here.
    let ran = ct_worker::with_current_thread_word_in::<TeamConfig, _>(|word, queued| {
        let p = word.get() as *const Task;
        // SAFETY: the word is 0 or points to the running task (`enter_task`).
        let parent = (!p.is_null()).then(|| unsafe { &*p });
        let is_final = parent.is_some_and(|p| p.is_final) || flags & FLAG_FINAL != 0;
        let thread = parent.map_or(core::ptr::null(), |p| p.thread.get());
        // SAFETY: the caller's contract; copied before the creator goes on.
        let job = unsafe { Job::new(f, thread, data, copy, size, align, is_final) };
        // Undeferred: outside the program's tasks, `if(0)`, a final parent,
        // or enough queued work here for idle workers to steal (libgomp
        // throttles task creation alike).
        let Some(parent) = parent else {
            return job.run_with(word);
        };
        if !if_clause || parent.is_final || queued >= QUEUED_ENOUGH {
            return job.run_with(word);
        }
        // The scheduler's own allocations stay out of the DSM heap.
        let _private = crate::heap::private_allocations();
        match ct_worker::defer_in::<TeamConfig, _>(move || job.run()) {
            // SAFETY: only the task's own code touches its children.
            Some(d) => unsafe { (*parent.children.get()).push(Child(d)) },
            None => die("GOMP_task called outside the runtime's threads"),
        }
    });
    if ran.is_none() {
        // Outside the runtime's threads (a thread the program created
        // itself): run it here.
        // SAFETY: the caller's contract.
        unsafe { Job::new(f, core::ptr::null(), data, copy, size, align, true) }.run();
    }
}

/// Joins the children of `task` created after its first `from`.
fn join_from(task: &Task, from: usize) {
    loop {
        // Newest first: a job not stolen is then on top of our deque, and
        // runs here without a thread of its own.
        let next = {
            // SAFETY: only the task's own code touches its children.
            let children = unsafe { &mut *task.children.get() };
            if children.len() <= from {
                return;
            }
            children.pop()
        };
        if let Some(c) = next {
            // A task's failure ends the process (GCC's task bodies do not
            // unwind); nothing to report here.
            let _ = c.0.try_join();
        }
    }
}

/// Waits for every child of `task` (and so for every descendant).
pub(crate) fn wait_children(task: &Task) {
    // SAFETY: only the task's own code touches its children.
    if unsafe { (*task.children.get()).is_empty() } {
        return;
    }
    join_from(task, 0);
}

/// `GOMP_taskwait`: waits for the children of the running task.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_taskwait() {
    let _errno = KeepErrno::new();
    if let Some(t) = current_task() {
        wait_children(t);
    }
}

/// `GOMP_taskyield`: lets other tasks run.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_taskyield() {
    let _errno = KeepErrno::new();
    if ct_worker::current_thread_id().is_some() {
        ct_worker::yield_now_in::<TeamConfig>();
    }
}

/// `GOMP_taskgroup_start`.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_taskgroup_start() {
    if let Some(t) = current_task() {
        let _rt = RuntimeGuard::enter();
        // SAFETY: only the task's own code touches its groups and children.
        unsafe {
            let n = (*t.children.get()).len();
            (*t.groups.get()).push(n);
        }
    }
}

/// `GOMP_taskgroup_end`: waits for the tasks created in the group and
/// their descendants.
#[unsafe(no_mangle)]
pub extern "C" fn GOMP_taskgroup_end() {
    let _errno = KeepErrno::new();
    let Some(t) = current_task() else { return };
    let from = {
        let _rt = RuntimeGuard::enter();
        // SAFETY: as above.
        unsafe { (*t.groups.get()).pop() }
    };
    match from {
        Some(from) => join_from(t, from),
        None => die("GOMP_taskgroup_end without GOMP_taskgroup_start"),
    }
}

/// `omp_in_final`: whether the running task is final.
#[unsafe(no_mangle)]
pub extern "C" fn omp_in_final() -> c_int {
    c_int::from(current_task().is_some_and(|t| t.is_final))
}
