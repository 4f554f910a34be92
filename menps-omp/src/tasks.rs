//! Tasks (`#pragma omp task`, `taskwait`) on the work-stealing scheduler
//! of the process: [`task_scope`].

use core::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;

use ct_worker::JoinHandle;
use menps_dsm::dsm::allocator::RuntimeGuard;
use menps_dsm::dsm::team::TeamConfig;

use crate::runtime::runtime;

type Handle = JoinHandle<(), TeamConfig>;

/// A scope of tasks: every task spawned in it has finished when
/// [`task_scope`] returns (like the end of a `taskgroup`), and
/// [`TaskScope::taskwait`] waits for those spawned so far.
///
/// Tasks run as user-level threads of the calling thread's process, on its
/// work-stealing workers (they do not move to other processes). A task the
/// runtime cannot give a stack to (all of the process's DSM stacks are in
/// use, `MENPS_DSM_STACKS`) runs at once on the spawning thread instead, as
/// OpenMP allows (an *undeferred* task).
pub struct TaskScope<'scope> {
    handles: Mutex<Vec<Handle>>,
    panic: Mutex<Option<Box<dyn core::any::Any + Send>>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
}

/// Runs `f` with a new task scope and returns once `f` and every task
/// spawned in the scope have finished; a panic of a task is re-raised then.
///
/// ```no_run
/// fn fib(n: u64) -> u64 {
///     if n < 20 {
///         return if n < 2 { n } else { fib(n - 1) + fib(n - 2) };
///     }
///     let (mut a, mut b) = (0, 0);
///     menps_omp::task_scope(|s| {
///         s.spawn(|_| a = fib(n - 1));
///         b = fib(n - 2);
///     });
///     a + b
/// }
/// ```
pub fn task_scope<'scope, R>(f: impl FnOnce(&TaskScope<'scope>) -> R) -> R {
    let s = TaskScope {
        handles: Mutex::new(Vec::new()),
        panic: Mutex::new(None),
        _scope: PhantomData,
    };
    let r = catch_unwind(AssertUnwindSafe(|| f(&s)));
    s.join_all();
    let p = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    match (r, p) {
        (Err(p), _) | (Ok(_), Some(p)) => resume_unwind(p),
        (Ok(v), None) => v,
    }
}

impl<'scope> TaskScope<'scope> {
    /// Spawns a task (`#pragma omp task`): `f` runs, possibly in parallel
    /// with the caller, before the scope ends. It may borrow what outlives
    /// the scope and spawn more tasks into it.
    pub fn spawn<F>(&self, f: F)
    where
        F: FnOnce(&TaskScope<'scope>) + Send + 'scope,
    {
        if runtime().is_none() || ct_worker::current_thread_id().is_none() {
            return self.run_task(f);
        }
        let scope = self as *const Self as usize;
        // The task's closure waits in a box that either the new thread or,
        // when no thread can be made, we ourselves take.
        let cell = Box::into_raw(Box::new(Some(f))) as usize;
        let job = move || {
            // SAFETY: the box above; the thread is the only one to take it
            // once it was created (the spawn succeeded).
            let f = unsafe { Box::from_raw(cell as *mut Option<F>) };
            // SAFETY: the scope outlives every task of it (`task_scope`
            // joins them before returning).
            let scope = unsafe { &*(scope as *const TaskScope<'scope>) };
            if let Some(f) = *f {
                scope.run_task(f);
            }
        };
        // The job's boxes are the scheduler's memory: keep them out of the
        // DSM heap (ct-worker takes its descriptors from the system
        // allocator itself), where they would cost faults and releases.
        let rt_guard = RuntimeGuard::enter();
        let job: Box<dyn FnOnce() + Send + 'scope> = Box::new(job);
        // SAFETY: the closure (and what it borrows, 'scope) outlives the
        // thread: `task_scope` joins every handle before 'scope ends.
        let job: Box<dyn FnOnce() + Send + 'static> = unsafe { core::mem::transmute(job) };
        let spawned = ct_worker::try_spawn_in::<TeamConfig, _, _>(job);
        drop(rt_guard);
        match spawned {
            Ok(h) => {
                let _g = RuntimeGuard::enter();
                self.handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(h);
            }
            Err(_) => {
                // No stack: the job was dropped unrun; the task runs here.
                // SAFETY: the box was not taken (the job never ran).
                let f = unsafe { Box::from_raw(cell as *mut Option<F>) };
                if let Some(f) = *f {
                    self.run_task(f);
                }
            }
        }
    }

    /// Waits for every task spawned in this scope so far (`taskwait`), and
    /// for the tasks they spawned into it.
    pub fn taskwait(&self) {
        self.join_all();
    }

    fn run_task<F: FnOnce(&TaskScope<'scope>)>(&self, f: F) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(self))) {
            let _g = RuntimeGuard::enter();
            self.panic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(p);
        }
    }

    fn join_all(&self) {
        loop {
            let batch = {
                let _g = RuntimeGuard::enter();
                core::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner()))
            };
            if batch.is_empty() {
                return;
            }
            for h in batch {
                // Task panics were caught in `run_task`.
                let _ = h.try_join();
            }
        }
    }
}

impl core::fmt::Debug for TaskScope<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TaskScope").finish_non_exhaustive()
    }
}
