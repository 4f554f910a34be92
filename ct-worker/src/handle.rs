//! Spawning and joining user-level threads.

use core::convert::Infallible;
use core::marker::PhantomData;
use core::ptr::NonNull;
use std::panic::{self, AssertUnwindSafe};
use std::thread;

use ct_context::make_context_with;

use crate::aspect::Aspect;
use crate::config::{Config, DefaultConfig};
use crate::error::Result;
use crate::os_waiter;
use crate::pool::GLOBAL;
use crate::runtime::Shared;
use crate::stack::StackSource;
use crate::task::{StackOf, StartFn, TaskDesc, TaskHead, TaskRef};
use crate::worker::{RawBody, Worker};

/// An owned permission to join a user-level thread, like
/// [`std::thread::JoinHandle`]. Dropping it detaches the thread.
///
/// A handle may be joined from any user-level thread (the joiner is parked,
/// not its worker) or from a plain OS thread (which blocks).
///
/// The configuration parameter names the runtime the handle was asked of;
/// the handle works whatever runtime its thread belongs to (the free
/// [`spawn`] returns a `JoinHandle<T>` in a runtime of any configuration).
pub struct JoinHandle<T, C: Config = DefaultConfig> {
    head: NonNull<TaskHead>,
    _result: PhantomData<(T, fn() -> C)>,
}

// SAFETY: the handle only gives access to the result (a `T`), which is `Send`.
unsafe impl<T: Send, C: Config> Send for JoinHandle<T, C> {}
// SAFETY: `&JoinHandle` only allows `is_finished`, an atomic load.
unsafe impl<T: Send, C: Config> Sync for JoinHandle<T, C> {}

impl<T, C: Config> JoinHandle<T, C> {
    /// The handle of a fresh thread of any configuration.
    fn from_desc<D: Config>(desc: NonNull<TaskDesc<D>>) -> Self {
        // A descriptor starts with its head (`TaskHead`).
        Self::from_head(desc.cast())
    }

    /// The handle of a fresh thread, by its descriptor's head.
    fn from_head(head: NonNull<TaskHead>) -> Self {
        JoinHandle {
            head,
            _result: PhantomData,
        }
    }

    fn head(&self) -> &TaskHead {
        // SAFETY: the descriptor lives until the handle frees it (joined) or
        // gives it up (detached, on drop).
        unsafe { self.head.as_ref() }
    }

    /// Whether the thread has finished (joining will not block).
    pub fn is_finished(&self) -> bool {
        self.head().join.is_finished()
    }

    /// Waits for the thread and returns its result, or the payload of the
    /// panic that ended it.
    pub fn try_join(self) -> thread::Result<T> {
        let head = self.head;
        core::mem::forget(self);
        // SAFETY: the handle is the only joiner and is consumed; the
        // descriptor's own functions wait for and free it.
        unsafe {
            let h = head.as_ref();
            if !h.join.is_finished() {
                (h.ops.wait_finished)(head);
            }
            // Finished (acquire), and only we take the result; `head`
            // was cast from the descriptor's pointer.
            let r = crate::task::take_packet_at::<T>(head);
            (h.ops.free)(head);
            r
        }
    }

    /// Waits for the thread and returns its result; re-raises its panic.
    pub fn join(self) -> T {
        match self.try_join() {
            Ok(v) => v,
            Err(p) => panic::resume_unwind(p),
        }
    }
}

impl<T, C: Config> Drop for JoinHandle<T, C> {
    fn drop(&mut self) {
        let h = self.head();
        if !h.join.detach() {
            // Already finished: nobody else will free it.
            // SAFETY: the thread is finished and its handle is going away.
            unsafe { (h.ops.free)(self.head) };
        }
    }
}

impl<T, C: Config> core::fmt::Debug for JoinHandle<T, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

/// [`TaskOps::wait_finished`] of configuration `C`.
///
/// # Safety
///
/// `head` heads a `TaskDesc<C>`; the caller is its only joiner.
pub(crate) unsafe fn wait_finished_erased<C: Config>(head: NonNull<TaskHead>) {
    // SAFETY: forwarded contract.
    unsafe { wait_finished(TaskRef::<C>::new(head.cast())) }
}

/// [`TaskOps::free`] of configuration `C`.
///
/// # Safety
///
/// `head` heads a finished `TaskDesc<C>` that nobody uses any more.
pub(crate) unsafe fn free_desc_erased<C: Config>(head: NonNull<TaskHead>) {
    // SAFETY: forwarded contract.
    unsafe { free_desc::<C>(head.cast()) }
}

/// Frees a finished thread's descriptor from wherever we are.
///
/// # Safety
///
/// Nobody may use `d` any more.
unsafe fn free_desc<C: Config>(d: NonNull<TaskDesc<C>>) {
    match Worker::<C>::current() {
        // SAFETY: forwarded contract.
        Some(w) => unsafe { w.free_desc(d) },
        // Outside the runtime there is no pool at hand (descriptors do not
        // point back to their runtime): release the descriptor. The owning
        // worker simply allocates a fresh one when its pool runs dry.
        // SAFETY: forwarded contract; `destroy` frees a descriptor made by
        // `TaskDesc::create` (from the system allocator).
        None => unsafe { <TaskDesc<C> as crate::pool::PoolItem>::destroy(d) },
    }
}

/// The body of every user-level thread: runs `f` with panics caught, stores
/// the result, drops the thread's ULT-locals and exits.
fn thread_main<C: Config, F, T>(me: TaskRef<C>, f: F) -> Infallible
where
    F: FnOnce() -> T,
{
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    // ULT-local destructors run on the thread itself, like thread-locals'.
    // SAFETY: only the running thread touches its locals.
    let locals = unsafe { (*me.desc().locals.get()).take() };
    if panic::catch_unwind(AssertUnwindSafe(move || drop(locals))).is_err() {
        log::warn!("ct-worker: a ULT-local destructor panicked; the panic was ignored");
    }
    // SAFETY: stored once, by the thread itself, before it finishes.
    unsafe { me.desc().write_packet(r) };
    exit_thread(me)
}

/// Ends the running thread `me`, whose result is stored.
fn exit_thread<C: Config>(me: TaskRef<C>) -> Infallible {
    // The thread may have migrated: exit through the worker we are on now.
    let w = Worker::<C>::current().expect("a user-level thread runs on a worker");
    // SAFETY: our last action; nothing with a destructor is left on the stack.
    unsafe { w.exit(me) }
}

/// The body of a thread started by `RuntimeOps::spawn`: `body` runs the
/// closure at `data` and stores its result; then the thread's ULT-locals are
/// dropped and it exits.
fn thread_main_raw<C: Config>(me: TaskRef<C>, body: RawBody, data: *mut ()) -> Infallible {
    // SAFETY: `spawn_erased`'s caller gave us `body` and `data` together;
    // the head is our own, cast from the descriptor's pointer.
    unsafe { body(data, me.ptr().cast()) };
    // SAFETY: only the running thread touches its locals.
    let locals = unsafe { (*me.desc().locals.get()).take() };
    if panic::catch_unwind(AssertUnwindSafe(move || drop(locals))).is_err() {
        log::warn!("ct-worker: a ULT-local destructor panicked; the panic was ignored");
    }
    exit_thread(me)
}

/// [`RawBody`] of a boxed `F` returning `T`.
///
/// # Safety
///
/// `data` is a `Box<F>` from `Box::into_raw`, taken once; `head` is the
/// running thread's, whose result is not stored yet.
unsafe fn run_boxed<F: FnOnce() -> T, T>(data: *mut (), head: NonNull<TaskHead>) {
    // SAFETY: the contract.
    let f = unsafe { Box::from_raw(data.cast::<F>()) };
    let r = panic::catch_unwind(AssertUnwindSafe(*f));
    // SAFETY: stored once, by the thread itself, before it finishes.
    unsafe { crate::task::write_packet_at(head, r) };
}

/// `RuntimeOps::spawn` of configuration `C`.
///
/// # Safety
///
/// Called from a user-level thread of a `C` runtime; `body` may be called
/// with `data` (once); everything `data` borrows outlives the thread.
pub(crate) unsafe fn spawn_erased<C: Config>(
    body: RawBody,
    data: *mut (),
) -> Result<NonNull<TaskHead>> {
    let w = Worker::<C>::current()
        .filter(|w| w.running().is_some())
        .expect("spawn_erased runs on a user-level thread of its configuration");
    let stack = w.alloc_stack()?;
    let desc = w.alloc_desc();
    let child = TaskRef::new(desc);
    child.desc().stack.set(Some(stack));
    // SAFETY: called from `w`'s running thread; `child` is fresh and runs on
    // `stack`; `data` outlives the thread per the contract.
    unsafe {
        w.suspend_to_new(child, stack, move || {
            thread_main_raw::<C>(child, body, data)
        })
    };
    Ok(desc.cast())
}

/// Work-first spawn on worker `w`, from its running thread. Fails (before
/// anything else happens) if the stack source has no stack.
///
/// # Safety
///
/// Everything `f` borrows must outlive the thread.
pub(crate) unsafe fn spawn_on<C: Config, F, T>(w: &Worker<C>, f: F) -> Result<JoinHandle<T, C>>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let stack = w.alloc_stack()?;
    let desc = w.alloc_desc();
    // SAFETY: forwarded contract; the descriptor and the stack are fresh.
    unsafe { fork_on::<C, F, T>(w, TaskRef::new(desc), stack, f) };
    Ok(JoinHandle::from_desc(desc))
}

/// Forks `f` as thread `child` (a fresh descriptor) on `w`, on `stack`.
///
/// # Safety
///
/// Called from `w`'s running thread; everything `f` borrows must outlive the
/// thread; `child` must stay valid until it is joined; `stack` is fresh from
/// the runtime's source.
unsafe fn fork_on<C: Config, F, T>(w: &Worker<C>, child: TaskRef<C>, stack: StackOf<C>, f: F)
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    child.desc().stack.set(Some(stack));
    // SAFETY: called from `w`'s running thread; `child` is fresh and runs on
    // `stack`.
    unsafe { w.suspend_to_new(child, stack, move || thread_main::<C, F, T>(child, f)) };
}

/// Spawn from outside the runtime: the thread gets its stack now, is put on
/// the global injector unstarted, and starts on the worker that takes it
/// (which writes its first frame only after telling the switch hook).
///
/// # Safety
///
/// Everything `f` borrows must outlive the thread.
pub(crate) unsafe fn spawn_injected<C: Config, F, T>(
    shared: &Shared<C>,
    f: F,
) -> Result<JoinHandle<T, C>>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let stack = shared.stacks.take(None)?;
    let desc = match shared.descs.take_global() {
        Some(d) => {
            // SAFETY: a cached descriptor is free and ours.
            unsafe { d.as_ref().reset(shared.id) };
            d
        }
        None => {
            let d = TaskDesc::<C>::create(GLOBAL);
            // SAFETY: fresh and ours.
            unsafe { d.as_ref().reset(shared.id) };
            d
        }
    };
    let child = TaskRef::new(desc);
    child.desc().stack.set(Some(stack));
    let f = Box::into_raw(Box::new(f));
    child.desc().start.set(Some((
        start_injected::<C, F, T>,
        f.cast_const().cast::<()>(),
    )));
    shared.inject(child);
    Ok(JoinHandle::from_desc(desc))
}

/// Starts a thread spawned from outside the runtime (its closure boxed at
/// `data`, its stack already in the descriptor) as thread `t` on worker `w`.
///
/// # Safety
///
/// The caller took `t` from a queue (so nobody else starts it) and switches
/// to the returned context; `data` is `t`'s boxed `F`, which the new thread
/// takes.
unsafe fn start_injected<C: Config, F, T>(
    w: &Worker<C>,
    t: TaskRef<C>,
    data: *const (),
) -> ct_context::Context<C::Policy>
where
    F: FnOnce() -> T,
{
    let stack = t.desc().stack.get().expect("a spawned thread has a stack");
    w.hook_entering(t);
    let f = data.cast::<F>().cast_mut();
    let entry = move |_| {
        // SAFETY: per the contract, the box is ours to take, once.
        let f = unsafe { Box::from_raw(f) };
        thread_main::<C, F, T>(t, *f)
    };
    // SAFETY: the stack is the thread's own (unused so far) and lives until
    // the thread exits.
    unsafe { make_context_with::<C::Policy, _>(<C::Stacks as StackSource>::region(stack), entry) }
        .unwrap_or_else(|| fatal("a thread's first frame does not fit on its stack"))
}

/// Ends the process with `msg`: for failures in the middle of a switch,
/// where neither a panic nor an error could reach anyone.
#[cold]
fn fatal(msg: &str) -> ! {
    eprintln!("ct-worker: {msg}; aborting");
    std::process::abort()
}

/// Spawns a user-level thread on the runtime running the caller, whatever its
/// configuration ([`spawn_in`] says how).
///
/// The child runs at once on this worker (work-first); the caller's
/// continuation can be stolen by other workers meanwhile.
///
/// # Panics
///
/// Panics if called outside a user-level thread (use
/// [`Runtime::spawn`](crate::Runtime::spawn) from OS threads), or if the
/// stack source cannot provide a stack (see [`try_spawn_in`]).
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_in::<DefaultConfig, F, T>(f)
}

/// [`spawn`], typed for a runtime of configuration `C`: the fast path is a
/// runtime of configuration `C`; in a runtime of another configuration the
/// thread is that runtime's (its closure boxed on the way), and the handle
/// works all the same.
pub fn spawn_in<C: Config, F, T>(f: F) -> JoinHandle<T, C>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    try_spawn_in(f).unwrap_or_else(|e| panic!("ct-worker: cannot spawn a thread: {e}"))
}

/// [`spawn_in`], with an error instead of a panic when the runtime's stack
/// source cannot provide a stack (the closure is dropped then).
///
/// # Panics
///
/// Panics if called outside a user-level thread.
pub fn try_spawn_in<C: Config, F, T>(f: F) -> Result<JoinHandle<T, C>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: `F` and `T` are 'static.
    unsafe { try_spawn_unchecked_in::<C, F, T>(f) }
}

/// Spawns without lifetime bounds, from a user-level thread (of a `C`
/// runtime, or forwarded to the running one).
///
/// # Safety
///
/// Everything `f` borrows must outlive the thread.
pub(crate) unsafe fn spawn_unchecked_in<C: Config, F, T>(f: F) -> JoinHandle<T, C>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    // SAFETY: forwarded contract.
    unsafe { try_spawn_unchecked_in(f) }
        .unwrap_or_else(|e| panic!("ct-worker: cannot spawn a thread: {e}"))
}

/// [`spawn_unchecked_in`] with an error when no stack is available.
///
/// # Safety
///
/// Everything `f` borrows must outlive the thread.
unsafe fn try_spawn_unchecked_in<C: Config, F, T>(f: F) -> Result<JoinHandle<T, C>>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    if let Some(w) = Worker::<C>::current().filter(|w| w.running().is_some()) {
        // SAFETY: forwarded contract.
        return unsafe { spawn_on(w, f) };
    }
    // A runtime of another configuration (or none).
    let Some(ops) = crate::worker::current_running_ops() else {
        panic!(
            "ct-worker: spawn called outside a user-level thread; start the program with \
             Runtime::block_on or use Runtime::spawn"
        )
    };
    let data = Box::into_raw(Box::new(f)).cast::<()>();
    // SAFETY: we run a user-level thread of the runtime `ops` belong to;
    // `run_boxed::<F, T>` takes the box at `data`; borrows: forwarded
    // contract.
    match unsafe { (ops.spawn)(run_boxed::<F, T>, data) } {
        Ok(head) => Ok(JoinHandle::from_head(head)),
        Err(e) => {
            // SAFETY: on error the box was not touched.
            drop(unsafe { Box::from_raw(data.cast::<F>()) });
            Err(e)
        }
    }
}

/// Runs `a` and `b`, potentially in parallel, and returns both results, like
/// `rayon::join`: `a` runs at once on the calling thread while `b` waits in
/// the worker's deque as a *job*, which an idle worker may steal — it then
/// starts as a user-level thread of its own. If nobody has taken it when `a`
/// returns, the caller runs `b` itself, and no thread is created at all.
/// Unlike with rayon, both closures may block (park) anywhere, and the caller
/// may resume on another worker. Both may borrow from the caller. Outside a
/// runtime both run sequentially; in a runtime of any configuration they run
/// as described ([`join_in`] says how).
///
/// `a` runs on the caller's stack: nested joins recurse on it like plain
/// calls — about 250 bytes per level in release builds, 1.3 KB in debug
/// builds, so the default 128 KiB stack holds some 500 (debug: 100) levels;
/// raise [`Builder::stack_size`](crate::Builder::stack_size) for deeper
/// nesting. A stolen `b` gets a fresh stack.
///
/// If either panics, the panic is re-raised after both have finished (`a`'s
/// first).
///
/// A stolen `b` takes its stack from the runtime's stack source on the thief;
/// if the source fails there, nobody could be told, and the process aborts
/// with a message.
pub fn join<A, B, RA, RB>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    join_in::<DefaultConfig, A, B, RA, RB>(a, b)
}

/// [`join`], fastest in a runtime of configuration `C` (one thread-local
/// load and compare find the worker). In a runtime of another configuration
/// it forwards to that runtime's `join_in`, through references to the
/// closures.
pub fn join_in<C: Config, A, B, RA, RB>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    match Worker::<C>::current() {
        Some(w) => join_on(w, a, b),
        None => join_other(a, b),
    }
}

/// [`join_in`] where the running runtime's configuration is not `C`: forwards
/// to the running runtime's `join` (sequential outside any).
#[inline(never)]
fn join_other<A, B, RA, RB>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    let Some(ops) = crate::worker::current_running_ops() else {
        return (a(), b());
    };
    let (mut a, mut b) = (Some(a), Some(b));
    let (mut ra, mut rb) = (None, None);
    (ops.join)(&mut || ra = a.take().map(|a| a()), &mut || {
        rb = b.take().map(|b| b())
    });
    match (ra, rb) {
        (Some(ra), Some(rb)) => (ra, rb),
        _ => unreachable!("join runs both closures"),
    }
}

/// `RuntimeOps::join` of configuration `C`.
pub(crate) fn join_erased<C: Config>(a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send)) {
    join_in::<C, _, _, _, _>(a, b);
}

/// [`join_in`] on worker `w` of a `C` runtime, the current one.
#[inline]
fn join_on<C: Config, A, B, RA, RB>(w: &Worker<C>, a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    if w.running().is_none() {
        return (a(), b());
    }
    // `b`'s descriptor and closure live in this frame: whoever runs `b`
    // (a thief, as a thread, or we ourselves) is done before we return. The
    // descriptor needs no destructor (a result is always taken; a job thread
    // drops its own ULT-locals); the closure is moved out by whoever runs it.
    let desc = core::mem::ManuallyDrop::new(TaskDesc::<C>::new_unpooled(w.shared.id));
    let b = core::mem::ManuallyDrop::new(b);
    let job = TaskRef::new(NonNull::from(&*desc));
    let b_ptr: *const B = &*b;
    desc.start
        .set(Some((start_job::<C, B, RB>, b_ptr.cast::<()>())));
    w.push(job);
    w.shared.aspect.fork(w.index);
    let ra = panic::catch_unwind(AssertUnwindSafe(a));
    // Take the job back if it is still where we left it: on top of our
    // worker's deque (we may have migrated, or it may have been stolen).
    let mut inline = false;
    if let Some(now) = Worker::<C>::current().filter(|now| core::ptr::eq(*now, w)) {
        match now.pop_own() {
            Some(t) if t == job => inline = true,
            Some(other) => now.push_back_own(other),
            None => {}
        }
    }
    let rb = if inline {
        desc.start.set(None);
        // SAFETY: we took the job off the deque, so nobody else reads `b`.
        let b = unsafe { core::ptr::read(b_ptr) };
        panic::catch_unwind(AssertUnwindSafe(b))
    } else {
        // SAFETY: `job` is ours to join, once; whoever took it runs it.
        unsafe { wait_and_take::<C, RB>(job) }
    };
    match (ra, rb) {
        (Ok(ra), Ok(rb)) => (ra, rb),
        (Err(p), _) | (_, Err(p)) => panic::resume_unwind(p),
    }
}

/// Starts a `join`'s job `b` (at `data`) as thread `t` on worker `w`.
///
/// # Safety
///
/// The caller took `t` from a deque (so nobody else runs the job); `data`
/// points to the join's `B`, which the new thread moves out.
unsafe fn start_job<C: Config, B, RB>(
    w: &Worker<C>,
    t: TaskRef<C>,
    data: *const (),
) -> ct_context::Context<C::Policy>
where
    B: FnOnce() -> RB,
{
    let stack = w
        .alloc_stack()
        .unwrap_or_else(|e| fatal(&format!("a stolen join job cannot get a stack: {e}")));
    t.desc().stack.set(Some(stack));
    w.hook_entering(t);
    let data = data.cast::<B>();
    let entry = move |_| {
        // SAFETY: per the contract, the closure is ours to move out; the
        // joiner keeps it alive until we finish.
        let b = unsafe { core::ptr::read(data) };
        thread_main::<C, B, RB>(t, b)
    };
    // SAFETY: the stack is fresh and lives until the thread exits.
    unsafe { make_context_with::<C::Policy, _>(<C::Stacks as StackSource>::region(stack), entry) }
        .unwrap_or_else(|| fatal("a join job's first frame does not fit on its stack"))
}

/// Waits until `task` has finished and takes its result.
///
/// # Safety
///
/// The caller must be the only joiner of `task`, and join it once.
#[inline]
unsafe fn wait_and_take<C: Config, T>(task: TaskRef<C>) -> thread::Result<T> {
    let desc = task.desc();
    if !desc.join.is_finished() {
        // SAFETY: forwarded contract.
        unsafe { wait_finished(task) };
    }
    // SAFETY: finished (acquire), and only we take the result.
    unsafe { desc.take_packet::<T>() }
}

/// Parks the caller until `task` has finished.
///
/// # Safety
///
/// As for [`wait_and_take`].
#[inline(never)]
unsafe fn wait_finished<C: Config>(task: TaskRef<C>) {
    let desc = task.desc();
    match Worker::<C>::current().filter(|w| w.running().is_some()) {
        // SAFETY: we run on `w` as its running thread; registering happens
        // after our context is saved.
        Some(w) => unsafe {
            w.cond_suspend_to_sched(|me| desc.join.register(me.word()));
        },
        None => {
            os_waiter::park_if(|word| desc.join.register(word));
        }
    }
    debug_assert!(desc.join.is_finished());
}

/// Lets other user-level threads of this worker run (in a runtime of any
/// configuration). Outside a runtime, yields the OS thread.
pub fn yield_now() {
    yield_now_in::<DefaultConfig>();
}

/// [`yield_now`], fastest in a runtime of configuration `C`.
pub fn yield_now_in<C: Config>() {
    match Worker::<C>::current().filter(|w| w.running().is_some()) {
        // SAFETY: we are `w`'s running thread; the ontop function makes us
        // runnable again after our context is saved.
        Some(w) => unsafe { w.yield_running() },
        None => match crate::worker::current_running_ops() {
            Some(ops) => (ops.yield_now)(),
            None => thread::yield_now(),
        },
    }
}

/// Runs a deferred job's closure inline (and frees its box, if any).
type RunInline = unsafe fn(*const ()) -> thread::Result<()>;

/// A task waiting in a worker's deque as a *job* ([`defer_in`]): an idle
/// worker may steal it and start it as a user-level thread of its own; if
/// nobody has when it is joined, the joiner runs it itself, on its own
/// stack, and no thread is ever created. Help-first tasks for runtimes
/// whose tasks outlive the call that creates them (OpenMP's `task`), where
/// [`join`] needs both closures in one call.
///
/// Joining (or dropping, which joins) cheaply runs the job inline only when
/// it is still on top of the joiner's deque: join jobs in the reverse order
/// of their creation, from the thread that deferred them.
#[must_use = "a deferred job runs at the latest when it is joined"]
pub struct Deferred<C: Config = DefaultConfig> {
    desc: NonNull<TaskDesc<C>>,
    /// Runs the closure at `data` inline (and frees its box, if any).
    run_inline: RunInline,
    data: *const (),
}

// SAFETY: the job's closure is `Send`; the descriptor is the runtime's.
unsafe impl<C: Config> Send for Deferred<C> {}

/// Defers `f` as a job of the calling worker ([`Deferred`]); `None` outside
/// a user-level thread of a `C` runtime (run `f` yourself then).
///
/// The closure lives in the job's descriptor when it fits (48 bytes),
/// otherwise in a box of the global allocator.
pub fn defer_in<C: Config, F>(f: F) -> Option<Deferred<C>>
where
    F: FnOnce() + Send + 'static,
{
    let w = Worker::<C>::current().filter(|w| w.running().is_some())?;
    let desc = w.alloc_desc();
    let d = TaskRef::<C>::new(desc);
    let inline = size_of::<F>() <= crate::task::PACKET_BYTES && align_of::<F>() <= 16;
    let (data, start, run_inline): (*const (), StartFn<C>, RunInline) = if inline {
        let p = d.desc().packet_ptr().cast::<F>();
        // SAFETY: the packet of a fresh descriptor holds an `F` (checked
        // by `inline_packet`); it is moved out by whoever runs the job.
        unsafe { p.write(f) };
        (
            p.cast::<()>(),
            start_deferred::<C, F, false>,
            run_deferred::<F, false>,
        )
    } else {
        let b = Box::into_raw(Box::new(f));
        (
            b.cast::<()>().cast_const(),
            start_deferred::<C, F, true>,
            run_deferred::<F, true>,
        )
    };
    d.desc().start.set(Some((start, data)));
    w.push(d);
    w.shared.aspect.fork(w.index);
    Some(Deferred {
        desc,
        run_inline,
        data,
    })
}

impl<C: Config> Deferred<C> {
    /// Waits for the job, running it here if nobody took it; returns its
    /// panic's payload if it panicked.
    pub fn try_join(self) -> thread::Result<()> {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: consumed once.
        unsafe { this.join_inner() }
    }

    /// Waits for the job (running it here if nobody took it); re-raises its
    /// panic.
    pub fn join(self) {
        if let Err(p) = self.try_join() {
            panic::resume_unwind(p)
        }
    }

    /// # Safety
    ///
    /// Called once.
    unsafe fn join_inner(&self) -> thread::Result<()> {
        let job = TaskRef::<C>::new(self.desc);
        let mut inline = false;
        if let Some(now) = Worker::<C>::current().filter(|w| w.running().is_some()) {
            match now.pop_own() {
                Some(t) if t == job => inline = true,
                Some(other) => now.push_back_own(other),
                None => {}
            }
        }
        let r = if inline {
            job.desc().start.set(None);
            // SAFETY: we took the job off the deque: the closure is ours.
            unsafe { (self.run_inline)(self.data) }
        } else {
            // SAFETY: we are the only joiner; whoever took the job runs it.
            unsafe { wait_and_take::<C, ()>(job) }
        };
        // SAFETY: the job is done (or was never started) and joined.
        unsafe { free_desc(self.desc) };
        r
    }
}

impl<C: Config> Drop for Deferred<C> {
    fn drop(&mut self) {
        // SAFETY: dropping consumes the handle.
        let _ = unsafe { self.join_inner() };
    }
}

/// Runs `f` with the running user-level thread's word (the cell behind
/// [`current_thread_word`](crate::current_thread_word)) and the number of
/// threads and jobs queued on its worker, found with one lookup; `None`
/// (without calling `f`) outside a user-level thread of a `C` runtime.
///
/// The cell belongs to the thread, so it stays valid in `f` even if the
/// thread blocks and resumes on another worker (the queue length is a
/// snapshot). For runtimes that keep their per-thread context in the word
/// and look it up on hot paths (an OpenMP task creation).
#[inline]
pub fn with_current_thread_word_in<C: Config, R>(
    f: impl FnOnce(&core::cell::Cell<usize>, usize) -> R,
) -> Option<R> {
    let w = Worker::<C>::current()?;
    let t = w.running()?;
    let queued = w.queue_len();
    Some(f(&t.desc().user_word, queued))
}

/// Runs a deferred closure inline.
///
/// # Safety
///
/// `data` holds an `F` (boxed if `BOXED`) that nobody else runs.
unsafe fn run_deferred<F: FnOnce(), const BOXED: bool>(data: *const ()) -> thread::Result<()> {
    // SAFETY: the contract.
    let f = unsafe {
        if BOXED {
            *Box::from_raw(data.cast::<F>().cast_mut())
        } else {
            core::ptr::read(data.cast::<F>())
        }
    };
    panic::catch_unwind(AssertUnwindSafe(f))
}

/// Starts a stolen deferred job as thread `t` on worker `w`.
///
/// # Safety
///
/// The caller took `t` from a deque (so nobody else runs the job); `data`
/// holds the job's `F` (boxed if `BOXED`).
unsafe fn start_deferred<C: Config, F, const BOXED: bool>(
    w: &Worker<C>,
    t: TaskRef<C>,
    data: *const (),
) -> ct_context::Context<C::Policy>
where
    F: FnOnce(),
{
    let stack = w
        .alloc_stack()
        .unwrap_or_else(|e| fatal(&format!("a stolen deferred job cannot get a stack: {e}")));
    t.desc().stack.set(Some(stack));
    w.hook_entering(t);
    let data = data as usize;
    let entry = move |_| {
        // SAFETY: per the contract, the closure is ours to move out (before
        // the thread's result overwrites the packet it may live in).
        let f = unsafe {
            if BOXED {
                *Box::from_raw(data as *mut F)
            } else {
                core::ptr::read(data as *const F)
            }
        };
        thread_main::<C, F, ()>(t, f)
    };
    // SAFETY: the stack is fresh and lives until the thread exits.
    unsafe { make_context_with::<C::Policy, _>(<C::Stacks as StackSource>::region(stack), entry) }
        .unwrap_or_else(|| fatal("a deferred job's first frame does not fit on its stack"))
}
