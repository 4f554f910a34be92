//! The runtime: worker OS threads, the global injector, idle backoff and
//! sleeping, and the builder.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crossbeam_deque::Injector;
use crossbeam_utils::CachePadded;
use ct_config::vars;

use crate::aspect::{Aspect, AspectInit};
use crate::config::{Config, DefaultConfig};
use crate::deque::WorkerDeque;
use crate::error::{Error, Result};
use crate::handle::JoinHandle;
use crate::hook::SwitchHook;
use crate::idle::IdleMode;
use crate::pool::SharedPool;
use crate::remote_list::RemoteList;
use crate::stack::StackSource;
use crate::task::{TaskDesc, TaskRef};
use crate::worker::{Worker, current_info};

/// Default usable stack size of a user-level thread: 128 KiB (with a guard
/// page below it, for the default [`MmapStacks`](crate::MmapStacks)). Only
/// touched pages cost memory.
///
/// This is MassiveThreads' default, and larger than Argobots' 16 KiB; it is
/// smaller than the 2 MiB of a rayon worker because here *every* thread
/// has a stack of its own (rayon's jobs run on their worker's stack), and
/// each live stack is a mapping of its own, of which Linux allows about
/// 65,000 per process by default. Code ported from rayon that recurses deeply
/// or keeps large arrays on the stack needs `CT_STACK_SIZE` (e.g. `1M`) or
/// [`Builder::stack_size`]; an overflow hits the guard page and the report
/// names both.
pub const DEFAULT_STACK_SIZE: usize = 128 * 1024;

static NEXT_RUNTIME_ID: AtomicUsize = AtomicUsize::new(1);

type Registered = (usize, std::sync::Weak<dyn std::any::Any + Send + Sync>);

/// Live runtimes by id, so that code outside a runtime (an OS thread waking a
/// user-level thread) can find where to queue it, and finds nothing once the
/// runtime is gone.
static REGISTRY: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

/// The runtime with id `id`, if it is still alive and of configuration `C`.
pub(crate) fn lookup<C: Config>(id: usize) -> Option<Arc<Shared<C>>> {
    let reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let (_, weak) = reg.iter().find(|(i, _)| *i == id)?;
    weak.upgrade()?.downcast::<Shared<C>>().ok()
}

/// Spin rounds (with exponential pause counts) before an idle worker yields.
const IDLE_SPINS: u32 = 12;
/// Idle rounds (126 pause instructions in all, about 3 µs here) before a
/// worker takes threads from other workers' home queues and inboxes: a
/// thread woken for the worker it parked on stays there if that worker gets
/// to it soon (its stack and data are in that core's cache; moving it costs
/// several cache-line transfers, 0.1-0.5 µs each), yet a busy worker cannot
/// keep it for long. Stealing from deques starts at once.
const HOME_STEAL_ROUNDS: u32 = 6;
/// Pause instructions between two runs of an idle worker's idle hooks while
/// it spins (about 0.1 µs here).
const HOOK_POLL_PAUSES: u32 = 4;
/// `thread::yield_now` rounds before an idle worker sleeps.
const IDLE_YIELDS: u32 = 6;
/// First and longest sleep of an idle worker. Sleeping is timed so that a
/// wake-up missed by the (deliberately unfenced) fork path costs at most this
/// much parallelism; an idle runtime wakes a few hundred times a second at
/// most.
const SLEEP_MIN: Duration = Duration::from_micros(200);
const SLEEP_MAX: Duration = Duration::from_millis(10);

/// Idle workers, and how to wake them.
pub(crate) struct Sleep {
    sleepers: CachePadded<AtomicUsize>,
    sleeping: Mutex<Vec<usize>>,
    threads: Vec<OnceLock<Thread>>,
}

impl Sleep {
    fn new(workers: usize) -> Self {
        Sleep {
            sleepers: CachePadded::new(AtomicUsize::new(0)),
            sleeping: Mutex::new(Vec::with_capacity(workers)),
            threads: (0..workers).map(|_| OnceLock::new()).collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.sleeping.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a local push: wakes a sleeping worker if one is seen. Without a
    /// fence, a worker falling asleep at this very moment can be missed; it
    /// then sleeps at most [`SLEEP_MAX`] before looking again.
    #[inline]
    pub(crate) fn notify_relaxed(&self) {
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake_one();
        }
    }

    /// After an injection from outside: never misses a sleeping worker.
    pub(crate) fn notify_fenced(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake_one();
        }
    }

    /// After a push to worker `w`'s inbox: wakes `w` if it sleeps (fenced, so
    /// a worker falling asleep at this moment sees the push or is seen here).
    pub(crate) fn wake_worker(&self, w: usize) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut s = self.lock();
        if let Some(pos) = s.iter().position(|&x| x == w) {
            s.swap_remove(pos);
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
            drop(s);
            if let Some(t) = self.threads[w].get() {
                t.unpark();
            }
        }
    }

    fn wake_one(&self) {
        let mut s = self.lock();
        if let Some(w) = s.pop() {
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
            drop(s);
            if let Some(t) = self.threads[w].get() {
                t.unpark();
            }
        }
    }

    fn wake_all(&self) {
        let mut s = self.lock();
        self.sleepers.fetch_sub(s.len(), Ordering::Relaxed);
        s.clear();
        drop(s);
        for t in self.threads.iter().filter_map(|t| t.get()) {
            t.unpark();
        }
    }

    /// Worker `w` sleeps for up to `timeout` unless `work_visible` (checked
    /// after announcing the sleep) finds something to do.
    fn sleep(&self, w: usize, timeout: Duration, work_visible: impl FnOnce() -> bool) {
        {
            let mut s = self.lock();
            s.push(w);
            // A full fence (locked RMW): pairs with `notify_fenced`.
            self.sleepers.fetch_add(1, Ordering::SeqCst);
        }
        if !work_visible() {
            thread::park_timeout(timeout);
        }
        let mut s = self.lock();
        if let Some(pos) = s.iter().position(|&x| x == w) {
            s.swap_remove(pos);
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The stealer of a `C` runtime's worker deque.
pub(crate) type Stealer<C> = <<C as Config>::Deque<TaskRef<C>> as WorkerDeque<TaskRef<C>>>::Stealer;

/// State shared by the workers of one runtime.
pub(crate) struct Shared<C: Config> {
    pub(crate) id: usize,
    pub(crate) workers: usize,
    pub(crate) stealers: Vec<Stealer<C>>,
    /// Stealers of the workers' home queues (threads sent home).
    pub(crate) home_stealers: Vec<Stealer<C>>,
    /// Per worker: threads woken elsewhere and sent home to it
    /// (`notify_home`); drained by the worker into its home queue, or taken
    /// by workers that have idled a while.
    pub(crate) inboxes: Box<[CachePadded<RemoteList<TaskDesc<C>>>]>,
    pub(crate) injector: Injector<TaskRef<C>>,
    pub(crate) descs: SharedPool<TaskDesc<C>>,
    /// Where threads' stacks come from.
    pub(crate) stacks: C::Stacks,
    /// Told of every switch into and out of a thread.
    pub(crate) hook: C::Hook,
    pub(crate) stack_size: usize,
    pub(crate) sleep: Sleep,
    /// [`Runtime::set_stay_awake`], in nanoseconds.
    stay_awake_ns: AtomicU64,
    shutdown: AtomicBool,
    pub(crate) aspect: C::Aspect,
}

/// Configures and starts a [`Runtime`].
///
/// ```
/// let rt = ct_worker::Runtime::builder().workers(2).stack_size(64 * 1024).build().unwrap();
/// assert_eq!(rt.block_on(|| ct_worker::num_workers()), 2);
/// ```
///
/// The type parameters record whether a [stack source](Builder::stack_source)
/// and a [switch hook](Builder::switch_hook) were given ([`Given`]) or are
/// left to the configuration's default-constructed types ([`DefaultPart`]);
/// they are checked against the configuration at
/// [`build_with`](Builder::build_with).
#[derive(Debug, Clone)]
pub struct Builder<S = DefaultPart, H = DefaultPart> {
    workers: Option<usize>,
    stack_size: Option<usize>,
    name: String,
    trace_path: Option<PathBuf>,
    stacks: S,
    hook: H,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            workers: None,
            stack_size: None,
            name: "ct-worker".to_string(),
            trace_path: None,
            stacks: DefaultPart,
            hook: DefaultPart,
        }
    }
}

/// A part of a [`Builder`] left to the configuration: its type,
/// default-constructed.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultPart;

/// A part given to a [`Builder`] (see [`Builder::stack_source`]).
#[derive(Debug, Clone)]
pub struct Given<T>(T);

/// What a [`Builder`] holds for a part of type `T` of the configuration:
/// [`DefaultPart`] (for a `T: Default`) or [`Given<T>`].
pub trait BuilderPart<T> {
    /// The part.
    fn into_part(self) -> T;
}

impl<T: Default> BuilderPart<T> for DefaultPart {
    fn into_part(self) -> T {
        T::default()
    }
}

impl<T> BuilderPart<T> for Given<T> {
    fn into_part(self) -> T {
        self.0
    }
}

impl<S, H> Builder<S, H> {
    /// Number of worker OS threads (this value wins over `CT_NUM_WORKERS`;
    /// without either, the number of CPUs available to the process).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// Usable stack size of each user-level thread (a guard page is added).
    /// This value wins over `CT_STACK_SIZE` (a size: `4096`, `64k`, `1M`);
    /// without either, [`DEFAULT_STACK_SIZE`].
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = Some(bytes);
        self
    }

    /// Prefix of the worker threads' names (default `ct-worker`; workers are
    /// named `<prefix>-<index>`).
    pub fn thread_name(mut self, prefix: impl Into<String>) -> Self {
        self.name = prefix.into();
        self
    }

    /// Where a [`TraceAspect`](crate::TraceAspect) writes its trace (overrides
    /// `CT_TRACE`). Ignored by other aspects.
    pub fn trace_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.trace_path = Some(path.into());
        self
    }

    /// The stack source the threads of the runtime get their stacks from
    /// (of the configuration's [`Config::Stacks`] type; without this call,
    /// that type's `Default`). Its [`init`](StackSource::init) runs in
    /// [`build_with`](Builder::build_with), whose error it may become.
    ///
    /// ```
    /// let rt = ct_worker::Runtime::builder()
    ///     .workers(1)
    ///     .stack_source(ct_worker::MmapStacks::default())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(rt.block_on(|| 6 * 7), 42);
    /// ```
    pub fn stack_source<S2: StackSource>(self, source: S2) -> Builder<Given<S2>, H> {
        Builder {
            workers: self.workers,
            stack_size: self.stack_size,
            name: self.name,
            trace_path: self.trace_path,
            stacks: Given(source),
            hook: self.hook,
        }
    }

    /// The switch hook of the runtime (of the configuration's
    /// [`Config::Hook`] type; without this call, that type's `Default`).
    pub fn switch_hook<H2: SwitchHook>(self, hook: H2) -> Builder<S, Given<H2>> {
        Builder {
            workers: self.workers,
            stack_size: self.stack_size,
            name: self.name,
            trace_path: self.trace_path,
            stacks: self.stacks,
            hook: Given(hook),
        }
    }

    /// Starts a runtime with the default configuration.
    pub fn build(self) -> Result<Runtime>
    where
        S: BuilderPart<<DefaultConfig as Config>::Stacks>,
        H: BuilderPart<<DefaultConfig as Config>::Hook>,
    {
        self.build_with::<DefaultConfig>()
    }

    /// Starts a runtime with configuration `C` (whose stack source and switch
    /// hook are those given to the builder, if any).
    ///
    /// # Errors
    ///
    /// An invalid worker count or stack size (from the builder or the
    /// environment), a stack source that refuses the stack size, an aspect
    /// that cannot be set up (a trace file that cannot be created), or a
    /// worker thread that cannot be started.
    pub fn build_with<C: Config>(self) -> Result<Runtime<C>>
    where
        S: BuilderPart<C::Stacks>,
        H: BuilderPart<C::Hook>,
    {
        // Builder > environment > default (ct-config's precedence).
        let (workers, _) = ct_config::pick(
            self.workers,
            || vars::CT_NUM_WORKERS.count_usize(),
            || thread::available_parallelism().map_or(1, |n| n.get()),
        )?;
        if workers == 0 {
            return Err(Error::InvalidWorkers("0".into()));
        }
        let (stack_size, _) = ct_config::pick(
            self.stack_size,
            || vars::CT_STACK_SIZE.size(),
            || DEFAULT_STACK_SIZE,
        )?;
        let mut stacks: C::Stacks = self.stacks.into_part();
        stacks.init(stack_size, workers)?;
        let hook: C::Hook = self.hook.into_part();
        let mut deques = Vec::with_capacity(workers);
        let mut stealers = Vec::with_capacity(workers);
        let mut home_stealers = Vec::with_capacity(workers);
        for _ in 0..workers {
            let (d, s) = <C::Deque<TaskRef<C>> as WorkerDeque<TaskRef<C>>>::new();
            let (h, hs) = <C::Deque<TaskRef<C>> as WorkerDeque<TaskRef<C>>>::new();
            deques.push((d, h));
            stealers.push(s);
            home_stealers.push(hs);
        }
        let aspect = C::Aspect::try_new(&AspectInit {
            workers,
            trace_path: self.trace_path.clone(),
        })
        .map_err(Error::Aspect)?;
        let shared = Arc::new(Shared::<C> {
            id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
            workers,
            stealers,
            home_stealers,
            inboxes: (0..workers)
                .map(|_| CachePadded::new(RemoteList::new()))
                .collect(),
            injector: Injector::new(),
            descs: SharedPool::new(workers),
            stacks,
            hook,
            stack_size,
            sleep: Sleep::new(workers),
            stay_awake_ns: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            aspect,
        });
        {
            let any: Arc<dyn std::any::Any + Send + Sync> = shared.clone();
            REGISTRY
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((shared.id, Arc::downgrade(&any)));
        }

        let mut threads = Vec::with_capacity(workers);
        for (index, (deque, home)) in deques.into_iter().enumerate() {
            let sh = shared.clone();
            let spawned = thread::Builder::new()
                .name(format!("{}-{index}", self.name))
                .spawn(move || worker_main(sh, index, deque, home));
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    let rt = Runtime { shared, threads };
                    drop(rt);
                    return Err(Error::Spawn(e));
                }
            }
        }
        Ok(Runtime { shared, threads })
    }
}

fn worker_main<C: Config>(
    shared: Arc<Shared<C>>,
    index: usize,
    deque: C::Deque<TaskRef<C>>,
    home: C::Deque<TaskRef<C>>,
) {
    ct_context::trap::ensure_alt_stack();
    let _ = shared.sleep.threads[index].set(thread::current());
    let worker = Box::new(Worker::new(shared.clone(), index, deque, home));
    worker.enter();
    run_loop(&worker);
    worker.leave();
    worker.clear_pools();
}

/// The scheduler loop of one worker.
fn run_loop<C: Config>(w: &Worker<C>) {
    let shared = &*w.shared;
    let mut idle_rounds = 0u32;
    // When this worker's current idle spell began (taken once it starts
    // yielding, and only with a stay-awake time set).
    let mut idle_since: Option<Instant> = None;
    loop {
        // Other workers' home queues and inboxes: once idle for a while, and
        // always when shutting down (their owners may have exited already).
        // A worker whose idle hooks wait for an event (a barrier's release)
        // expects threads of its own back soon: it leaves the others' home
        // queues alone until it stops spinning, for looking at one makes its
        // owner's next pop (a store and a fence) wait for the line to come
        // back across cores.
        let take_inboxes = idle_rounds
            >= if w.has_idle_hooks() {
                IDLE_SPINS
            } else {
                HOME_STEAL_ROUNDS
            }
            || shared.shutdown.load(Ordering::Relaxed);
        if let Some(t) = w.find_work(take_inboxes) {
            if idle_rounds != 0 {
                shared.aspect.idle_end(w.index);
                idle_rounds = 0;
                idle_since = None;
            }
            // SAFETY: found work is suspended and ours to run.
            unsafe { w.execute(t) };
            continue;
        }
        if shared.shutdown.load(Ordering::Acquire) {
            break;
        }
        if idle_rounds == 0 {
            shared.aspect.idle_begin(w.index);
        }
        idle_rounds += 1;
        if idle_rounds <= IDLE_SPINS {
            let pauses = 1u32 << idle_rounds.min(6);
            if w.has_idle_hooks() {
                // Hooks wait for events (a barrier's release): look every
                // few pauses, not once per round.
                for _ in 0..pauses.div_ceil(HOOK_POLL_PAUSES) {
                    for _ in 0..HOOK_POLL_PAUSES {
                        core::hint::spin_loop();
                    }
                    if w.run_idle_hooks(IdleMode::Poll) {
                        break;
                    }
                }
            } else {
                for _ in 0..pauses {
                    core::hint::spin_loop();
                }
            }
        } else if idle_rounds <= IDLE_SPINS + IDLE_YIELDS {
            thread::yield_now();
        } else if stays_awake(shared, &mut idle_since) {
            // Counted as the last yielding round, so that the sleeps below
            // start at their shortest.
            idle_rounds = IDLE_SPINS + IDLE_YIELDS;
            thread::yield_now();
        } else {
            let doublings = (idle_rounds - IDLE_SPINS - IDLE_YIELDS).min(16);
            let timeout = SLEEP_MIN.saturating_mul(1 << doublings).min(SLEEP_MAX);
            shared.sleep.sleep(w.index, timeout, || {
                // Registered as a sleeper: hooks arrange their wake-ups now.
                w.run_idle_hooks(IdleMode::Sleep)
                    || w.work_visible()
                    || shared.shutdown.load(Ordering::Acquire)
            });
        }
    }
    if idle_rounds != 0 {
        shared.aspect.idle_end(w.index);
    }
}

impl<C: Config> Shared<C> {
    /// Whether idle workers stay awake a while before sleeping
    /// ([`Runtime::set_stay_awake`] above zero).
    #[inline]
    pub(crate) fn keeps_idle_workers_awake(&self) -> bool {
        self.stay_awake_ns.load(Ordering::Relaxed) != 0
    }
}

/// Whether an idle worker whose spell began at `since` (set on the first
/// call) should keep yielding instead of sleeping: until the runtime's
/// stay-awake time has passed.
#[inline]
fn stays_awake<C: Config>(shared: &Shared<C>, since: &mut Option<Instant>) -> bool {
    let ns = shared.stay_awake_ns.load(Ordering::Relaxed);
    if ns == 0 {
        return false;
    }
    let start = *since.get_or_insert_with(Instant::now);
    start.elapsed() < Duration::from_nanos(ns)
}

/// The processors the calling OS thread may run on (its affinity mask), in
/// ascending order: what [`Runtime::bind_worker`] may bind workers to, as
/// threads inherit the mask of the thread that starts them.
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `set` is a writable set of the size passed; 0 is the caller.
    let r =
        unsafe { libc::sched_getaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let max = 8 * core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: every index is below the set's capacity.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// A pool of worker OS threads running user-level threads.
///
/// Dropping the runtime lets the workers finish every runnable thread, then
/// stops them. Threads that are blocked forever at that point are abandoned
/// (their memory is leaked, their destructors do not run), as with OS threads
/// at process exit.
pub struct Runtime<C: Config = DefaultConfig> {
    shared: Arc<Shared<C>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Runtime {
    /// A runtime with the default configuration and worker count.
    pub fn new() -> Result<Runtime> {
        Builder::default().build()
    }

    /// A builder for a runtime.
    pub fn builder() -> Builder {
        Builder::default()
    }
}

impl<C: Config> Runtime<C> {
    /// Number of workers.
    pub fn num_workers(&self) -> usize {
        self.shared.workers
    }

    /// How long an idle worker keeps looking for work — yielding its
    /// processor between looks — before it sleeps, beyond the few
    /// microseconds of spinning and yielding it always does first (the
    /// default, zero, adds nothing).
    ///
    /// A sleeping worker takes a wake-up to run again (a system call by the
    /// waker, and tens to hundreds of microseconds in a virtual machine
    /// whose idle processor was halted). Meanwhile an awake worker runs the
    /// threads meant for it, so threads that should run in parallel end up
    /// on one worker. Programs whose workers idle only briefly between bursts
    /// of work (a team of threads meeting at barriers, as OpenMP's
    /// `OMP_WAIT_POLICY=active` asks) keep them awake with a time above the
    /// usual gap. A yielding worker still gives way to every other runnable
    /// thread of its processor, but it does use the processor while nothing
    /// else wants it.
    ///
    /// Takes effect at each worker's next idle spell; may be changed at any
    /// time, from any thread.
    pub fn set_stay_awake(&self, t: Duration) {
        let ns = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        self.shared.stay_awake_ns.store(ns, Ordering::Relaxed);
    }

    /// Binds worker `index`'s OS thread to the processors `cpus` (it runs
    /// only on them from now on), as `sched_setaffinity` does.
    ///
    /// User-level threads still move between workers (stealing), so this
    /// places workers, not the threads they run.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`]: no such worker, no processor given, a processor
    /// number beyond what the system can name, or the system's refusal (a
    /// processor outside the process's allowed set).
    pub fn bind_worker(&self, index: usize, cpus: &[usize]) -> Result<()> {
        let bind_err = |why: String| Error::Bind {
            worker: index,
            cpus: cpus.to_vec(),
            why,
        };
        let Some(handle) = self.threads.get(index) else {
            return Err(bind_err(format!(
                "the runtime has {} workers",
                self.threads.len()
            )));
        };
        if cpus.is_empty() {
            return Err(bind_err("no processor given".into()));
        }
        // SAFETY: an all-zero `cpu_set_t` is the empty set.
        let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
        let max = 8 * core::mem::size_of::<libc::cpu_set_t>();
        for &c in cpus {
            if c >= max {
                return Err(bind_err(format!("processor numbers end at {}", max - 1)));
            }
            // SAFETY: `c` is below the set's capacity (checked above).
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        use std::os::unix::thread::JoinHandleExt;
        // SAFETY: the worker's thread is joined only when the runtime is
        // dropped, so its pthread handle is valid; `set` is a valid set of
        // the size passed.
        let r = unsafe {
            libc::pthread_setaffinity_np(
                handle.as_pthread_t(),
                core::mem::size_of::<libc::cpu_set_t>(),
                &set,
            )
        };
        if r != 0 {
            return Err(bind_err(std::io::Error::from_raw_os_error(r).to_string()));
        }
        Ok(())
    }

    /// The time set by [`Runtime::set_stay_awake`].
    pub fn stay_awake(&self) -> Duration {
        Duration::from_nanos(self.shared.stay_awake_ns.load(Ordering::Relaxed))
    }

    /// The aspect instance (e.g. to read [`StatsAspect`](crate::StatsAspect)
    /// counters).
    pub fn aspect(&self) -> &C::Aspect {
        &self.shared.aspect
    }

    /// Whether the calling code runs on one of this runtime's workers.
    pub fn is_current(&self) -> bool {
        current_info().is_some_and(|(id, _, _)| id == self.shared.id)
    }

    /// Runs `f` as a user-level thread (on a stack from the runtime's stack
    /// source) and returns its value on the calling OS thread, which blocks
    /// meanwhile. A panic in `f` is re-raised here.
    ///
    /// Called from one of this runtime's own threads, it simply runs `f`.
    ///
    /// # Panics
    ///
    /// Panics if the stack source cannot provide a stack (see
    /// [`Runtime::try_block_on`]).
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        self.try_block_on(f)
            .unwrap_or_else(|e| panic!("ct-worker: cannot start a thread: {e}"))
    }

    /// [`Runtime::block_on`], with an error instead of a panic when the stack
    /// source cannot provide a stack.
    pub fn try_block_on<F, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        if self.is_current() {
            return Ok(f());
        }
        // SAFETY: we join the thread before returning, so everything `f`
        // borrows outlives it.
        let h = unsafe { self.spawn_unchecked(f) }?;
        Ok(h.join())
    }

    /// Starts `f` as a user-level thread from anywhere: work-first when called
    /// on one of this runtime's workers, otherwise through the global queue.
    ///
    /// # Panics
    ///
    /// Panics if the stack source cannot provide a stack (see
    /// [`Runtime::try_spawn`]).
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T, C>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.try_spawn(f)
            .unwrap_or_else(|e| panic!("ct-worker: cannot spawn a thread: {e}"))
    }

    /// [`Runtime::spawn`], with an error instead of a panic when the stack
    /// source cannot provide a stack.
    pub fn try_spawn<F, T>(&self, f: F) -> Result<JoinHandle<T, C>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // SAFETY: `F` and `T` are 'static.
        unsafe { self.spawn_unchecked(f) }
    }

    /// [`Runtime::try_spawn`] without the `'static` bounds.
    ///
    /// # Safety
    ///
    /// Everything `f` borrows must outlive the thread (join it before the
    /// borrows end).
    pub(crate) unsafe fn spawn_unchecked<F, T>(&self, f: F) -> Result<JoinHandle<T, C>>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        if let Some(w) = Worker::<C>::current().filter(|w| w.shared.id == self.shared.id) {
            // SAFETY: forwarded contract.
            return unsafe { crate::handle::spawn_on(w, f) };
        }
        // SAFETY: forwarded contract.
        unsafe { crate::handle::spawn_injected(&self.shared, f) }
    }
}

impl<C: Config> Shared<C> {
    pub(crate) fn inject(&self, t: TaskRef<C>) {
        self.injector.push(t);
        self.sleep.notify_fenced();
    }
}

impl<C: Config> Drop for Runtime<C> {
    fn drop(&mut self) {
        if self.is_current() {
            // Joining our own worker would deadlock.
            log::warn!(
                "ct-worker: a runtime was dropped from one of its own threads; its workers are leaked"
            );
            return;
        }
        REGISTRY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(id, _)| *id != self.shared.id);
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.sleep.wake_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.shared.aspect.finish();
    }
}

impl<C: Config> core::fmt::Debug for Runtime<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Runtime")
            .field("workers", &self.shared.workers)
            .field("stack_size", &self.shared.stack_size)
            .finish()
    }
}
