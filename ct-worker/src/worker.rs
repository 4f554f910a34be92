//! Workers: one per OS thread, each with a deque, the running task and the
//! scheduler's own continuation; and the worker operations every blocking
//! construct is built from.
//!
//! All operations follow one pattern: pick the next context, switch to it with
//! an ontop function that — running after the current thread's context has
//! been saved — records the saved context in the thread's descriptor and then
//! publishes the thread (on a deque, in a waiter slot, in a join state). A
//! thread therefore becomes visible to other workers only once nothing runs on
//! its stack any more.
//!
//! The switch hook ([`SwitchHook`]) follows the same pattern: a worker tells
//! it `entering` for the thread it is about to run before the switch (before
//! anything touches that thread's stack: in [`Worker::ctx_of_taken`], in the
//! start functions of unstarted threads, before a direct switch), and `left`
//! for the thread it leaves in the ontop function, before that thread is
//! published — so for each thread the calls alternate strictly, whichever
//! workers they happen on. With [`NoHook`](crate::NoHook) every call is
//! compiled out.
//!
//! A thread may resume on a different worker than the one it suspended on.
//! Code must never keep a `&Worker` across a switch; it fetches the current
//! worker again through [`current_base`], which is never inlined, so that the
//! compiler cannot cache a thread-local address across the switch.

use core::any::TypeId;
use core::cell::{Cell, UnsafeCell};
use core::ptr::{self, NonNull};
use std::sync::Arc;

use ct_context::{
    CondResult, Context, StackRegion, cond_swap_with, restore_with, save_with, swap_with,
};

use crate::aspect::Aspect;
use crate::config::Config;
use crate::deque::WorkerDeque;
use crate::error::Result;
use crate::hook::{LeaveReason, SwitchHook, UltThread};
use crate::idle::{IdleHooks, IdleMode};
use crate::local::LocalMap;
use crate::pool::{LocalPool, PoolItem};
use crate::remote_list::Linked;
use crate::rng::Rng;
use crate::runtime::Shared;
use crate::stack::StackSource;
use crate::task::{CANCELLED, RESUMED, StackOf, TaskDesc, TaskHead, TaskRef};

/// Where a thread keeps its ULT-locals.
pub(crate) type LocalsCell = NonNull<UnsafeCell<Option<Box<LocalMap>>>>;

/// A running thread's identity and hook word.
/// The running thread: its id, its hook word and its user word.
pub(crate) type ThreadInfo = (usize, NonNull<Cell<usize>>, NonNull<Cell<usize>>);

/// The configuration-independent head of every [`Worker`], which is what the
/// thread-local pointer refers to.
#[repr(C)]
pub(crate) struct WorkerBase {
    type_id: TypeId,
    pub(crate) runtime_id: usize,
    pub(crate) index: usize,
    pub(crate) workers: usize,
    /// The ULT-local map of the running thread, if a thread runs.
    locals: unsafe fn(*const WorkerBase) -> Option<LocalsCell>,
    /// The identity and hook word of the running thread, if a thread runs.
    thread: unsafe fn(*const WorkerBase) -> Option<ThreadInfo>,
    /// Hooks to run when this worker runs out of runnable threads.
    pub(crate) idle_hooks: IdleHooks,
    /// The configuration's operations on type-erased arguments.
    pub(crate) ops: &'static RuntimeOps,
}

/// The body of a thread started by [`RuntimeOps::spawn`]: runs the closure
/// at the pointer and stores its result in the head.
pub(crate) type RawBody = unsafe fn(*mut (), NonNull<TaskHead>);

/// What the functions that name one configuration (the free functions name
/// [`DefaultConfig`](crate::DefaultConfig)) do when the runtime running the
/// caller has another: they forward to the running runtime's functions,
/// type-erased, found through the worker's base.
pub(crate) struct RuntimeOps {
    /// `join` on closures behind references.
    pub(crate) join: fn(&mut (dyn FnMut() + Send), &mut (dyn FnMut() + Send)),
    /// `yield_now`.
    pub(crate) yield_now: fn(),
    /// Spawns a thread running `body(data, its head)` from the running
    /// thread; `data` is untouched on error.
    ///
    /// Safety: called from a user-level thread of this worker's runtime;
    /// everything `data` borrows outlives the thread.
    pub(crate) spawn: unsafe fn(RawBody, *mut ()) -> Result<NonNull<TaskHead>>,
    /// `scope`, its scope given to the body as a pointer to a `Scope` of
    /// this configuration (whose layout is that of any configuration's).
    pub(crate) scope: fn(&mut dyn FnMut(*const ())),
}

std::thread_local! {
    static CURRENT: Cell<*const WorkerBase> = const { Cell::new(ptr::null()) };
}

/// The worker running on this OS thread, if any. Never inlined: see the
/// module documentation.
#[inline(never)]
pub(crate) fn current_base() -> *const WorkerBase {
    CURRENT.with(|c| c.get())
}

#[inline(never)]
fn set_current_base(b: *const WorkerBase) {
    CURRENT.with(|c| c.set(b));
}

/// The ULT-local map of the running user-level thread, if any.
pub(crate) fn current_locals() -> Option<LocalsCell> {
    let b = current_base();
    if b.is_null() {
        return None;
    }
    // SAFETY: a non-null base belongs to the live worker of this OS thread.
    unsafe { ((*b).locals)(b) }
}

/// The idle hooks of the worker running on this OS thread, if any. The
/// reference must not be kept beyond the caller's next context switch.
pub(crate) fn current_idle_hooks<'a>() -> Option<&'a IdleHooks> {
    let b = current_base();
    // SAFETY: a non-null base belongs to the live worker of this OS thread,
    // which outlives the caller's stretch of running on it.
    (!b.is_null()).then(|| unsafe { &(*b).idle_hooks })
}

/// Identity and hook word of the running user-level thread, if any.
pub(crate) fn current_thread() -> Option<ThreadInfo> {
    let b = current_base();
    if b.is_null() {
        return None;
    }
    // SAFETY: a non-null base belongs to the live worker of this OS thread.
    unsafe { ((*b).thread)(b) }
}

/// The type-erased operations of the runtime running a user-level thread on
/// this OS thread, if one does.
pub(crate) fn current_running_ops() -> Option<&'static RuntimeOps> {
    let b = current_base();
    if b.is_null() {
        return None;
    }
    // SAFETY: a non-null base belongs to the live worker of this OS thread.
    unsafe { ((*b).thread)(b).map(|_| (*b).ops) }
}

/// `(runtime id, worker index, worker count)` of the current worker.
pub(crate) fn current_info() -> Option<(usize, usize, usize)> {
    let b = current_base();
    // SAFETY: a non-null base belongs to the live worker of this OS thread.
    (!b.is_null()).then(|| unsafe { ((*b).runtime_id, (*b).index, (*b).workers) })
}

/// A worker of a runtime with configuration `C`.
#[repr(C)]
pub(crate) struct Worker<C: Config> {
    base: WorkerBase,
    pub(crate) shared: Arc<Shared<C>>,
    pub(crate) index: usize,
    pub(crate) deque: C::Deque<TaskRef<C>>,
    /// Threads woken and sent home to this worker ([`Worker::push_home`]):
    /// run before the deque's items, and stolen only by workers that have
    /// idled a while (`take_inboxes` in [`Worker::find_work`]), unlike the
    /// deque's items, which idle workers steal at once.
    home: C::Deque<TaskRef<C>>,
    /// Whether `home` may hold threads: set by this worker when it pushes
    /// there, cleared when it finds `home` empty (thieves never set it), so
    /// that a switch does not look at an empty home queue.
    home_hint: Cell<bool>,
    /// The thread running on this worker; `None` while the scheduler loop runs.
    running: Cell<Option<TaskRef<C>>>,
    /// The scheduler loop's continuation while a thread runs.
    sched_ctx: UnsafeCell<Option<Context<C::Policy>>>,
    rng: Rng,
    descs: UnsafeCell<LocalPool<TaskDesc<C>>>,
    /// This worker's state of the stack source.
    stacks: UnsafeCell<<C::Stacks as StackSource>::Local>,
    /// Per other worker, a chain (first, last) of woken threads collected by
    /// [`Worker::push_home_batched`] and not yet pushed to its inbox.
    home_chains: UnsafeCell<Box<[Chain<C>]>>,
}

/// A chain of thread descriptors linked through their link fields: (first, last).
type Chain<C> = (*mut TaskDesc<C>, *mut TaskDesc<C>);

unsafe fn locals_of<C: Config>(b: *const WorkerBase) -> Option<LocalsCell> {
    // SAFETY: `b` heads a `Worker<C>` (the function is stored per config).
    let w = unsafe { &*(b as *const Worker<C>) };
    w.running.get().map(|t| NonNull::from(&t.desc().locals))
}

unsafe fn thread_of<C: Config>(b: *const WorkerBase) -> Option<ThreadInfo> {
    // SAFETY: `b` heads a `Worker<C>` (the function is stored per config).
    let w = unsafe { &*(b as *const Worker<C>) };
    w.running.get().map(|t| {
        let d = t.desc();
        (
            t.word(),
            NonNull::from(&d.hook_data),
            NonNull::from(&d.user_word),
        )
    })
}

impl<C: Config> Worker<C> {
    pub(crate) fn new(
        shared: Arc<Shared<C>>,
        index: usize,
        deque: C::Deque<TaskRef<C>>,
        home: C::Deque<TaskRef<C>>,
    ) -> Self {
        Worker {
            base: WorkerBase {
                type_id: TypeId::of::<C>(),
                runtime_id: shared.id,
                index,
                workers: shared.workers,
                locals: locals_of::<C>,
                thread: thread_of::<C>,
                idle_hooks: IdleHooks::new(),
                ops: &const {
                    RuntimeOps {
                        join: crate::handle::join_erased::<C>,
                        yield_now: crate::handle::yield_now_in::<C>,
                        spawn: crate::handle::spawn_erased::<C>,
                        scope: crate::scope::scope_erased::<C>,
                    }
                },
            },
            index,
            deque,
            home,
            home_hint: Cell::new(false),
            running: Cell::new(None),
            sched_ctx: UnsafeCell::new(None),
            rng: Rng::new(index as u64 ^ (shared.id as u64) << 32),
            descs: UnsafeCell::new(LocalPool::new()),
            stacks: UnsafeCell::new(shared.stacks.local(index)),
            home_chains: UnsafeCell::new(
                vec![(ptr::null_mut(), ptr::null_mut()); shared.workers].into_boxed_slice(),
            ),
            shared,
        }
    }

    /// The worker of this OS thread, if it is a worker of a `C` runtime.
    ///
    /// The reference must not be kept across a context switch.
    #[inline]
    pub(crate) fn current<'a>() -> Option<&'a Worker<C>> {
        let b = current_base();
        if b.is_null() {
            return None;
        }
        // SAFETY: a non-null base belongs to the live worker of this thread.
        if unsafe { (*b).type_id } != TypeId::of::<C>() {
            return None;
        }
        // SAFETY: the type id says this base heads a `Worker<C>`.
        Some(unsafe { &*(b as *const Worker<C>) })
    }

    /// Makes this worker the current one of the calling OS thread.
    pub(crate) fn enter(&self) {
        set_current_base(&self.base);
    }

    pub(crate) fn leave(&self) {
        set_current_base(ptr::null());
    }

    /// The thread running on this worker.
    #[inline]
    pub(crate) fn running(&self) -> Option<TaskRef<C>> {
        self.running.get()
    }

    // --- pools -----------------------------------------------------------

    #[inline]
    pub(crate) fn alloc_desc(&self) -> NonNull<TaskDesc<C>> {
        // SAFETY: the local pool is only touched by this worker's OS thread.
        let local = unsafe { &mut *self.descs.get() };
        let d = local
            .take(self.shared.descs.remote(self.index))
            .unwrap_or_else(|| TaskDesc::create(self.index));
        // SAFETY: a free descriptor is ours.
        unsafe { d.as_ref().reset(self.shared.id) };
        d
    }

    /// A stack for a new thread, from the runtime's stack source.
    #[inline]
    pub(crate) fn alloc_stack(&self) -> Result<StackOf<C>> {
        // SAFETY: the source's local state is only touched by this worker's
        // OS thread, and not across this call.
        let local = unsafe { &mut *self.stacks.get() };
        self.shared.stacks.take(Some((self.index, local)))
    }

    /// Frees a finished thread's descriptor.
    ///
    /// # Safety
    ///
    /// Nobody may use `d` any more; `d` must be pooled.
    #[inline]
    pub(crate) unsafe fn free_desc(&self, d: NonNull<TaskDesc<C>>) {
        // SAFETY: the descriptor is ours (contract).
        unsafe { d.as_ref().clear() };
        if <TaskDesc<C> as PoolItem>::owner(d) == self.index {
            // SAFETY: the local pool is only touched by this worker's thread.
            unsafe { (*self.descs.get()).put_local(d) };
        } else {
            // SAFETY: forwarded contract.
            unsafe { self.shared.descs.free(d, None) };
        }
    }

    /// Gives a stack nothing runs on any more back to the stack source.
    ///
    /// # Safety
    ///
    /// Nothing may run on `s` any more; `s` came from the source and is
    /// given back once.
    #[inline]
    pub(crate) unsafe fn free_stack(&self, s: StackOf<C>) {
        // SAFETY: the source's local state is only touched by this worker's
        // OS thread; the stack is free (the contract).
        unsafe {
            self.shared
                .stacks
                .give_back(s, self.index, &mut *self.stacks.get())
        };
    }

    /// Frees the pools' cached memory (worker shutdown).
    pub(crate) fn clear_pools(&self) {
        // SAFETY: only this worker's OS thread touches its pools.
        unsafe {
            (*self.descs.get()).clear();
            self.shared
                .stacks
                .clear_local(self.index, &mut *self.stacks.get());
        }
    }

    // --- switch hook -----------------------------------------------------

    /// Tells the switch hook that `t` is about to run here on its stack.
    /// Compiles to nothing without a hook.
    #[inline(always)]
    pub(crate) fn hook_entering(&self, t: TaskRef<C>) {
        if <C::Hook as SwitchHook>::ACTIVE {
            self.hook_entering_on(t, Self::region_of(t));
        }
    }

    /// [`Worker::hook_entering`] for a thread about to run on `region`.
    #[inline(always)]
    fn hook_entering_on(&self, t: TaskRef<C>, region: StackRegion) {
        if <C::Hook as SwitchHook>::ACTIVE {
            let d = t.desc();
            self.shared.hook.entering(
                self.index,
                UltThread::new(t.word(), &d.hook_data, 0),
                region,
            );
        }
    }

    /// Tells the switch hook that `t` was switched away from, for `why`.
    /// Compiles to nothing without a hook.
    #[inline(always)]
    fn hook_left(&self, t: TaskRef<C>, why: LeaveReason) {
        if <C::Hook as SwitchHook>::ACTIVE {
            let d = t.desc();
            // SAFETY: the thread was just switched away from on this worker
            // and cannot be resumed before this returns (the hook's
            // contract): its context slot is not being written.
            let saved = unsafe { d.saved_ctx_addr() };
            self.shared.hook.left(
                self.index,
                UltThread::new(t.word(), &d.hook_data, saved),
                Self::region_of(t),
                why,
            );
        }
    }

    /// The stack region of a started thread.
    #[inline(always)]
    fn region_of(t: TaskRef<C>) -> StackRegion {
        let s = t.desc().stack.get().expect("a started thread has a stack");
        <C::Stacks as StackSource>::region(s)
    }

    // --- making threads runnable -------------------------------------------

    /// Makes a suspended thread runnable on this worker (and lets a sleeping
    /// worker know there is work to steal).
    #[inline]
    pub(crate) fn push(&self, t: TaskRef<C>) {
        self.deque.push(t);
        self.shared.sleep.notify_relaxed();
    }

    /// Wakes a waiter registered in a join state or waiter slot.
    ///
    /// # Safety
    ///
    /// `word` must be a waiter word whose wake-up the caller owns.
    pub(crate) unsafe fn wake_word(&self, word: usize) {
        if word & 1 == 0 {
            // SAFETY: per the contract, a suspended thread of this runtime.
            self.push(unsafe { TaskRef::from_word(word) });
        } else {
            // SAFETY: per the contract, a parked OS thread.
            unsafe { crate::os_waiter::wake(word) };
        }
    }

    /// The context to switch to when the running thread stops: the newest
    /// runnable thread of this worker, else the scheduler loop.
    #[inline]
    fn next_to_run(&self) -> (Context<C::Policy>, Option<TaskRef<C>>) {
        self.drain_inbox(self.index);
        match self.pop_local() {
            // SAFETY: a popped thread is ours to resume.
            Some(t) => (unsafe { self.ctx_of_taken(t) }, Some(t)),
            // SAFETY: while a thread runs, the scheduler's context is saved.
            None => (
                unsafe { (*self.sched_ctx.get()).take() }.expect("scheduler context is saved"),
                None,
            ),
        }
    }

    /// The context to run a task taken from a deque, after telling the
    /// switch hook that the task is entered: its saved context or, for a
    /// thread that has not started (a `join`'s job that nobody has started,
    /// or a thread spawned from outside the runtime), a new context made
    /// here (for a job, on a stack from this worker's source).
    ///
    /// # Safety
    ///
    /// The caller must have taken `t` from a deque (and so own its
    /// resumption), and must switch to the context (or cancel the switch and
    /// tell the hook so).
    #[inline]
    pub(crate) unsafe fn ctx_of_taken(&self, t: TaskRef<C>) -> Context<C::Policy> {
        match t.desc().start.take() {
            // SAFETY: an unstarted thread, ours to start (the contract); the
            // start function calls the hook once the thread has a stack.
            Some((start, data)) => unsafe { start(self, t, data) },
            None => {
                self.hook_entering(t);
                // SAFETY: as above, a suspended thread.
                unsafe { t.desc().take_ctx() }
            }
        }
    }

    /// The next thread of this worker's own: a thread sent home, else the
    /// newest item of the deque.
    #[inline]
    fn pop_local(&self) -> Option<TaskRef<C>> {
        if self.home_hint.get() {
            if let Some(t) = self.home.pop() {
                return Some(t);
            }
            self.home_hint.set(false);
        }
        self.deque.pop()
    }

    /// Makes `t`, woken and sent home to this worker, runnable here.
    #[inline]
    fn push_home_local(&self, t: TaskRef<C>) {
        self.home.push(t);
        self.home_hint.set(true);
    }

    /// Moves the threads sent home to worker `from` onto this worker's home
    /// queue (its own inbox) or its deque (a victim's), oldest on top.
    /// Returns whether there were any.
    #[inline]
    fn drain_inbox(&self, from: usize) -> bool {
        let inbox = &self.shared.inboxes[from];
        if inbox.is_empty() {
            return false;
        }
        self.drain_inbox_slow(from)
    }

    #[cold]
    fn drain_inbox_slow(&self, from: usize) -> bool {
        let first = self.shared.inboxes[from].take_all();
        let mut any = false;
        for d in crate::remote_list::drain(first) {
            // SAFETY: inbox entries are suspended threads whose wake-up was
            // handed to the inbox; taking them makes them ours.
            let t = TaskRef::new(unsafe { NonNull::new_unchecked(d) });
            if from == self.index {
                self.push_home_local(t);
            } else {
                self.deque.push(t);
            }
            any = true;
        }
        any
    }

    /// Makes a woken thread runnable on the worker it parked on: in this
    /// worker's home queue, or through that worker's inbox (waking the
    /// worker if it sleeps), which that worker drains into its home queue.
    pub(crate) fn push_home(&self, t: TaskRef<C>) {
        let home = t.desc().home.get();
        if home == self.index || home >= self.shared.workers {
            self.push_home_local(t);
            self.shared.sleep.notify_relaxed();
        } else {
            // SAFETY: we own the thread's wake-up and hand it to the inbox.
            unsafe { self.shared.inboxes[home].push(t.ptr().as_ptr()) };
            self.shared.sleep.wake_worker(home);
        }
    }

    /// Like [`Worker::push_home`], but collects the thread in a chain per
    /// worker, made runnable by [`Worker::flush_home`]: one atomic operation
    /// and one wake-up check per other worker instead of one per thread (what
    /// a barrier's last arriver needs). The caller must call `flush_home`
    /// before it switches or returns to user code.
    pub(crate) fn push_home_batched(&self, t: TaskRef<C>) {
        let home = t.desc().home.get();
        let home = if home < self.shared.workers {
            home
        } else {
            self.index
        };
        let item = t.ptr().as_ptr();
        // SAFETY: the chains are only touched by this worker's OS thread, in
        // this function and `flush_home`, neither of which runs other code
        // in between; we own `item`'s wake-up, so its link field is ours.
        unsafe {
            let (first, last) = &mut (*self.home_chains.get())[home];
            if home == self.index {
                // Our own threads: appended, to keep the order of `push`.
                *<TaskDesc<C> as Linked>::link(item) = ptr::null_mut();
                if first.is_null() {
                    *first = item;
                } else {
                    *<TaskDesc<C> as Linked>::link(*last) = item;
                }
                *last = item;
            } else {
                // Another worker's: prepended, so that the inbox (a stack)
                // ends up as if they had been pushed one by one.
                *<TaskDesc<C> as Linked>::link(item) = *first;
                if first.is_null() {
                    *last = item;
                }
                *first = item;
            }
        }
    }

    /// Makes the threads collected by [`Worker::push_home_batched`]
    /// runnable: first the other workers' (pushed to their inboxes, waking
    /// those workers if they sleep), then this worker's own (into its home
    /// queue).
    pub(crate) fn flush_home(&self) {
        for home in (0..self.shared.workers).filter(|&h| h != self.index) {
            // SAFETY: as in `push_home_batched`.
            let (first, last) = unsafe { &mut (*self.home_chains.get())[home] };
            if first.is_null() {
                continue;
            }
            // SAFETY: the chain runs from `first` to `last` through the
            // threads' links, and we own every thread in it.
            unsafe { self.shared.inboxes[home].push_chain(*first, *last) };
            *first = ptr::null_mut();
            *last = ptr::null_mut();
            self.shared.sleep.wake_worker(home);
        }
        // SAFETY: as in `push_home_batched`.
        let (first, last) = unsafe { &mut (*self.home_chains.get())[self.index] };
        let chain = core::mem::replace(first, ptr::null_mut());
        *last = ptr::null_mut();
        let any = !chain.is_null();
        for d in crate::remote_list::drain(chain) {
            // SAFETY: chained by `push_home_batched`: suspended threads
            // whose wake-up we own.
            self.push_home_local(TaskRef::new(unsafe { NonNull::new_unchecked(d) }));
        }
        if any {
            self.shared.sleep.notify_relaxed();
        }
    }

    /// Owner: how many items this worker's deque holds.
    #[inline]
    pub(crate) fn queue_len(&self) -> usize {
        self.deque.len()
    }

    /// Owner: takes the newest item of this worker's deque.
    #[inline]
    pub(crate) fn pop_own(&self) -> Option<TaskRef<C>> {
        self.deque.pop()
    }

    /// Owner: puts an item taken with [`Worker::pop_own`] back, unchanged.
    #[inline]
    pub(crate) fn push_back_own(&self, t: TaskRef<C>) {
        self.deque.push(t);
    }

    /// Puts back what [`Worker::next_to_run`] took, after a cancelled switch.
    ///
    /// # Safety
    ///
    /// `raw` must be the context returned with `next`, still suspended.
    unsafe fn unpop(&self, raw: NonNull<u8>, next: Option<TaskRef<C>>) {
        // SAFETY: per the contract.
        let ctx = unsafe { Context::from_raw(raw) };
        match next {
            Some(t) => {
                // SAFETY: `t` was suspended and is ours again.
                unsafe { t.desc().set_ctx(ctx) };
                // (A thread taken from the home queue goes back onto the
                // deque: a cancelled switch is rare, and it stays runnable.)
                self.deque.push(t);
            }
            // SAFETY: the scheduler's slot is empty since we took it.
            None => unsafe { *self.sched_ctx.get() = Some(ctx) },
        }
    }

    #[inline]
    fn note_switch(&self, next: Option<TaskRef<C>>) {
        if next.is_some() {
            self.shared.aspect.switch(self.index);
        }
    }

    /// The running thread, which an operation is about to suspend.
    #[inline(always)]
    fn suspending(&self) -> TaskRef<C> {
        self.running
            .get()
            .expect("suspend from a user-level thread")
    }

    /// The switch of the `suspend_to_*` operations: from the running thread
    /// `me` to `next_ctx`, the context of thread `next` (`None`: of the
    /// scheduler). On top of `next_ctx`, once `me`'s context is stored and
    /// the switch hook told that `me` left for `why`, `next` becomes the
    /// running thread and `publish(me)` runs. Returns when `me` is resumed.
    ///
    /// # Safety
    ///
    /// Must be called from `me`, the running thread of this worker, with
    /// `next_ctx` ours to resume (and the hook told `next` is entered).
    #[inline(always)]
    unsafe fn switch_away(
        &self,
        me: TaskRef<C>,
        next_ctx: Context<C::Policy>,
        next: Option<TaskRef<C>>,
        why: LeaveReason,
        publish: impl FnOnce(TaskRef<C>),
    ) {
        // SAFETY: `next_ctx` is ours to resume (the caller's contract); the
        // ontop function stores our context before publishing us.
        unsafe {
            swap_with(next_ctx, move |my_ctx| {
                me.desc().set_ctx(my_ctx);
                self.hook_left(me, why);
                self.running.set(next);
                self.note_switch(next);
                publish(me);
                RESUMED
            })
        };
    }

    /// The conditional switch of the `cond_suspend_to_*` operations: as
    /// [`Worker::switch_away`] (the thread left as `Blocked`), but `decide(me)`
    /// runs in place of the publication and may refuse. Then the switch is
    /// cancelled: `me`'s context is dropped from its descriptor (the
    /// primitive resumes it itself), the hook hears that `me` is entered
    /// again, and this returns `false` at once with `next_ctx` unresumed
    /// (the caller gives it back). Returns `true` once `me` was resumed after
    /// the switch.
    ///
    /// # Safety
    ///
    /// As for [`Worker::switch_away`]; `decide` must not publish `me` when it
    /// returns `false`.
    #[inline(always)]
    unsafe fn cond_switch_away(
        &self,
        me: TaskRef<C>,
        next_ctx: Context<C::Policy>,
        next: Option<TaskRef<C>>,
        decide: impl FnOnce(TaskRef<C>) -> bool,
    ) -> bool {
        // SAFETY: `next_ctx` is ours to resume (the caller's contract). The
        // hook hears that we left before `decide` can publish us, and that
        // we are entered again before a cancelled switch returns to our
        // stack.
        let r = unsafe {
            cond_swap_with(next_ctx, move |my_ctx| {
                me.desc().set_ctx(my_ctx);
                self.hook_left(me, LeaveReason::Blocked);
                if decide(me) {
                    self.running.set(next);
                    self.note_switch(next);
                    CondResult::proceed(RESUMED)
                } else {
                    let _ = me.desc().take_ctx();
                    self.hook_entering(me);
                    CondResult::cancel(CANCELLED)
                }
            })
        };
        r != CANCELLED
    }

    // --- worker operations ---------------------------------------------------

    /// Work-first fork (`suspend_to_new`): suspends the running thread, makes
    /// it stealable at the owner end of the deque, and runs `body` at once as
    /// thread `child` on `stack`. `body` must end the child with
    /// [`Worker::exit`].
    ///
    /// Returns when the parent is resumed (possibly on another worker).
    ///
    /// # Safety
    ///
    /// Must be called from the running thread of this worker; `child` must be
    /// a fresh descriptor whose stack is `stack`.
    #[inline]
    pub(crate) unsafe fn suspend_to_new<F>(&self, child: TaskRef<C>, stack: StackOf<C>, body: F)
    where
        F: FnOnce() -> core::convert::Infallible,
    {
        let parent = self.running.get().expect("fork from a user-level thread");
        let region = <C::Stacks as StackSource>::region(stack);
        self.hook_entering_on(child, region);
        // SAFETY: the child's stack is fresh; the ontop function publishes the
        // parent only after its context is stored (and the hook told).
        unsafe {
            save_with::<C::Policy, _>(region, move |parent_ctx| {
                parent.desc().set_ctx(parent_ctx);
                self.hook_left(parent, LeaveReason::Suspended);
                self.running.set(Some(child));
                self.push(parent);
                self.shared.aspect.fork(self.index);
                match body() {}
            })
        };
    }

    /// Suspends the running thread, runs `publish(me)` once its context is
    /// saved (and the switch hook told it was left for `why`), and switches
    /// to the next runnable thread or the scheduler (`suspend_to_sched`).
    /// `publish` must make the thread resumable by someone (or the thread is
    /// lost).
    ///
    /// # Safety
    ///
    /// Must be called from the running thread of this worker.
    #[inline]
    pub(crate) unsafe fn suspend_to_sched(
        &self,
        why: LeaveReason,
        publish: impl FnOnce(TaskRef<C>),
    ) {
        let me = self.suspending();
        let (next_ctx, next) = self.next_to_run();
        // SAFETY: we are the running thread; `next_ctx` is ours to resume.
        unsafe { self.switch_away(me, next_ctx, next, why, publish) };
    }

    /// Like [`Worker::suspend_to_sched`], but `decide(me)` (run after the save)
    /// may refuse to park: then the thread continues at once and this returns
    /// `false` (`cond_suspend_to_sched`). Returns `true` once the parked thread
    /// was resumed.
    ///
    /// # Safety
    ///
    /// Must be called from the running thread of this worker. If `decide`
    /// returns `false` it must not have published the thread.
    #[inline]
    pub(crate) unsafe fn cond_suspend_to_sched(
        &self,
        decide: impl FnOnce(TaskRef<C>) -> bool,
    ) -> bool {
        let me = self.suspending();
        let (next_ctx, next) = self.next_to_run();
        let raw = next_ctx.as_raw();
        // SAFETY: we are the running thread; `next_ctx` is ours to resume;
        // `decide` publishes us only if it says yes (the caller's contract).
        if unsafe { self.cond_switch_away(me, next_ctx, next, decide) } {
            return true;
        }
        // Still on the same worker: the switch never happened.
        if let Some(t) = next {
            self.hook_left(t, LeaveReason::Cancelled);
        }
        // SAFETY: `raw` is the context `next_to_run` gave us, unresumed.
        unsafe { self.unpop(raw, next) };
        false
    }

    /// Suspends the running thread and switches straight to the suspended
    /// thread `next` (`suspend_to_cont`), running `publish(me)` ontop (after
    /// telling the switch hook the thread was left for `why`).
    ///
    /// # Safety
    ///
    /// Must be called from the running thread; the caller must own the right
    /// to resume `next`.
    #[inline]
    pub(crate) unsafe fn suspend_to_cont(
        &self,
        next: TaskRef<C>,
        why: LeaveReason,
        publish: impl FnOnce(TaskRef<C>),
    ) {
        let me = self.suspending();
        self.hook_entering(next);
        // SAFETY: per the contract.
        let next_ctx = unsafe { next.desc().take_ctx() };
        // SAFETY: we are the running thread; `next_ctx` is ours to resume.
        unsafe { self.switch_away(me, next_ctx, Some(next), why, publish) };
    }

    /// Like [`Worker::suspend_to_cont`] but conditional
    /// (`cond_suspend_to_cont`): if `decide(me)` says no, the running thread
    /// continues, `next` stays suspended and the caller keeps the right to
    /// resume it. Returns whether the switch happened.
    ///
    /// # Safety
    ///
    /// As for [`Worker::suspend_to_cont`]; `decide` must not publish the thread
    /// when it returns `false`.
    #[inline]
    pub(crate) unsafe fn cond_suspend_to_cont(
        &self,
        next: TaskRef<C>,
        decide: impl FnOnce(TaskRef<C>) -> bool,
    ) -> bool {
        let me = self.suspending();
        self.hook_entering(next);
        // SAFETY: per the contract.
        let next_ctx = unsafe { next.desc().take_ctx() };
        let raw = next_ctx.as_raw();
        // SAFETY: we are the running thread; `next_ctx` is ours to resume;
        // `decide` publishes us only if it says yes (the caller's contract).
        if unsafe { self.cond_switch_away(me, next_ctx, Some(next), decide) } {
            return true;
        }
        self.hook_left(next, LeaveReason::Cancelled);
        // SAFETY: `next` was not resumed; give its context back.
        unsafe { next.desc().set_ctx(Context::from_raw(raw)) };
        false
    }

    /// Ends the running thread `me` (`exit_to_cont` / `exit_to_sched`): hands
    /// control straight to a joiner that is already waiting, else to the next
    /// runnable thread or the scheduler. Once off the thread's stack, frees the
    /// stack and completes the join protocol.
    ///
    /// # Safety
    ///
    /// Must be called by the running thread `me` as its very last action, with
    /// its result stored and nothing left alive on its stack.
    pub(crate) unsafe fn exit(&self, me: TaskRef<C>) -> ! {
        let desc = me.desc();
        if let Some(word) = desc.join.waiter().filter(|w| w & 1 == 0) {
            // A thread already waits to join us: switch straight to it.
            // SAFETY: a registered joiner cannot leave; we own its wake-up.
            let joiner = unsafe { TaskRef::<C>::from_word(word) };
            self.hook_entering(joiner);
            // SAFETY: the joiner is suspended and ours to resume.
            let ctx = unsafe { joiner.desc().take_ctx() };
            // SAFETY: we are off our stack in the ontop function; our
            // descriptor lives until the join state says finished.
            unsafe {
                restore_with(ctx, move || {
                    self.hook_left(me, LeaveReason::Finished);
                    if let Some(s) = me.desc().stack.take() {
                        self.free_stack(s);
                    }
                    me.desc().join.finish_for_waiter();
                    self.running.set(Some(joiner));
                    self.note_switch(Some(joiner));
                    RESUMED
                })
            }
        }
        let (next_ctx, next) = self.next_to_run();
        // SAFETY: as above.
        unsafe {
            restore_with(next_ctx, move || {
                self.hook_left(me, LeaveReason::Finished);
                if let Some(s) = me.desc().stack.take() {
                    self.free_stack(s);
                }
                self.running.set(next);
                self.note_switch(next);
                match me.desc().join.finish() {
                    crate::join_state::Finish::Nobody => {}
                    crate::join_state::Finish::Detached => self.free_desc(me.ptr()),
                    crate::join_state::Finish::Wake(w) => self.wake_word(w),
                }
                RESUMED
            })
        }
    }

    /// Yields the running thread: it goes to the back of the runtime's global
    /// FIFO queue, so every other runnable thread (local ones first, then
    /// older yielders and injected threads) runs before it again.
    ///
    /// # Safety
    ///
    /// Must be called from the running thread of this worker.
    pub(crate) unsafe fn yield_running(&self) {
        // SAFETY: forwarded contract; the ontop function makes us runnable.
        unsafe {
            self.suspend_to_sched(LeaveReason::Yielded, |me| {
                self.shared.injector.push(me);
                self.shared.sleep.notify_relaxed();
            })
        };
    }

    /// Scheduler loop: runs thread `t` until control comes back (`execute`).
    /// The switch hook hears of `t` being entered here, and of it being left
    /// in the operation that ends its turn.
    ///
    /// # Safety
    ///
    /// Must be called from this worker's scheduler loop, with `t` suspended and
    /// ours to resume.
    pub(crate) unsafe fn execute(&self, t: TaskRef<C>) {
        self.running.set(Some(t));
        self.shared.aspect.switch(self.index);
        // SAFETY: per the contract; the ontop function saves the scheduler.
        unsafe {
            let ctx = self.ctx_of_taken(t);
            swap_with(ctx, |sched| {
                *self.sched_ctx.get() = Some(sched);
                RESUMED
            });
        }
    }

    /// Scheduler loop: looks for a runnable thread — own home queue, deque
    /// and inbox, then the global injector, then other workers' deques in
    /// random order, and (with `take_inboxes`, once this worker has idled a
    /// while) their home queues and inboxes. Threads sent home stay home
    /// while their worker keeps up, so a barrier's waiters do not migrate
    /// every episode (a worker that has just run out of work would otherwise
    /// steal the other's woken threads at once), yet a busy worker cannot
    /// strand them.
    pub(crate) fn find_work(&self, take_inboxes: bool) -> Option<TaskRef<C>> {
        use crate::deque::{DequeStealer, Steal};
        if let Some(t) = self.pop_local() {
            return Some(t);
        }
        if self.drain_inbox(self.index) {
            return self.pop_local();
        }
        // Before anything else: what this worker's own idle hooks wake.
        if self.run_idle_hooks(IdleMode::Poll) {
            self.drain_inbox(self.index);
            if let Some(t) = self.pop_local() {
                return Some(t);
            }
        }
        let shared = &*self.shared;
        loop {
            let mut retry = false;
            // Look before stealing from the injector: a steal pins the epoch
            // (a full fence) even when there is nothing to take, and the
            // injector is usually empty. A look that misses new work is
            // repeated in the next round, and `work_visible` looks again
            // before sleeping. (Workers' deques are stolen from directly:
            // looking at them first made idle workers scan them so often
            // that their owners slowed down.)
            let from_injector = if shared.injector.is_empty() {
                crossbeam_deque::Steal::Empty
            } else {
                shared.injector.steal()
            };
            match from_injector {
                crossbeam_deque::Steal::Success(t) => {
                    shared.aspect.steal(self.index, None);
                    return Some(t);
                }
                crossbeam_deque::Steal::Retry => retry = true,
                crossbeam_deque::Steal::Empty => {}
            }
            let n = shared.workers;
            if n > 1 {
                let start = self.rng.below(n);
                for i in 0..n {
                    let v = (start + i) % n;
                    if v == self.index {
                        continue;
                    }
                    match shared.stealers[v].steal() {
                        Steal::Success(t) => {
                            shared.aspect.steal(self.index, Some(v));
                            return Some(t);
                        }
                        // Threads sent home stay there while their worker
                        // keeps up; after idling a while, take them too.
                        Steal::Empty if take_inboxes => {
                            if let Steal::Success(t) = shared.home_stealers[v].steal() {
                                shared.aspect.steal(self.index, Some(v));
                                return Some(t);
                            }
                            if self.drain_inbox(v) {
                                shared.aspect.steal(self.index, Some(v));
                                return self.deque.pop();
                            }
                        }
                        Steal::Retry => retry = true,
                        Steal::Empty => {}
                    }
                }
            }
            if !retry {
                return None;
            }
            core::hint::spin_loop();
        }
    }

    /// Whether the running thread may keep this worker busy waiting, awake,
    /// for a few microseconds (see [`UltItf::may_wait_awake`]): the runtime
    /// keeps idle workers awake, and nothing else waits for this worker —
    /// no thread in its deque, home queue or inbox, and no idle hook.
    ///
    /// [`UltItf::may_wait_awake`]: crate::UltItf::may_wait_awake
    #[inline]
    pub(crate) fn may_wait_awake(&self) -> bool {
        self.shared.keeps_idle_workers_awake() && !self.has_own_work() && !self.has_idle_hooks()
    }

    /// Whether a thread waits in this worker's deque, home queue or inbox.
    #[inline]
    fn has_own_work(&self) -> bool {
        !self.deque.is_empty()
            || !self.home.is_empty()
            || !self.shared.inboxes[self.index].is_empty()
    }

    /// Whether idle hooks are queued on this worker.
    #[inline]
    pub(crate) fn has_idle_hooks(&self) -> bool {
        self.base.idle_hooks.any()
    }

    /// Runs this worker's idle hooks (if any) in `mode`; returns whether any
    /// finished (and so may have made threads runnable).
    #[inline]
    pub(crate) fn run_idle_hooks(&self, mode: IdleMode) -> bool {
        self.has_idle_hooks() && self.base.idle_hooks.run(mode)
    }

    /// Whether any work is visible anywhere (used before falling asleep).
    pub(crate) fn work_visible(&self) -> bool {
        use crate::deque::DequeStealer;
        self.has_own_work()
            || self.shared.home_stealers.iter().any(|s| !s.is_empty())
            || !self.shared.injector.is_empty()
            || self.shared.stealers.iter().any(|s| !s.is_empty())
    }
}
