//! Fork–join across processes (MEOMP's execution model, Endo 2020 §3.6).

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ct_context::DefaultPolicy;
use ct_worker::{ChaseLevKind, Custom, NoAspect, Runtime, Ult, UltItf};

use crate::com::{Communicator, Source, Tag};
use crate::dsm::Dsm;
use crate::dsm::allocator::{RuntimeGuard, user_code};
use crate::dsm::error::{DsmError, DsmResult};
use crate::dsm::space::DSM_TAG_BIT;

use super::TeamBarrier;
use super::stacks::{DsmStacks, PinHook};

/// The configuration of a team's runtime: ct-worker's default scheduler
/// with stacks from the DSM's stack region, pinned while they run.
pub type TeamConfig = Custom<DefaultPolicy, ChaseLevKind, NoAspect, DsmStacks, PinHook>;

/// The user-level threads of a team's runtime.
pub type TeamUlt = Ult<TeamConfig>;

/// Tag of the team's commands (rank 0 to the others): the last tag of the
/// range of DSM mutex hand-offs, far above any mutex id.
const TEAM_TAG: Tag = DSM_TAG_BIT | 0x7fff_fff0;
const CMD_FORK: u64 = 1;
const CMD_EXIT: u64 = 2;
/// A fork whose command carries process 0's release (a barrier record:
/// see [`Team::execute`]) right after its words, before the description.
const CMD_FORK_RELEASED: u64 = 3;
/// Bytes of the release a [`CMD_FORK_RELEASED`] command carries.
const RECORD_BYTES: usize = crate::dsm::sync::BARRIER_RECORD_BYTES;
/// Words of a command: kind, function, data, threads per process, target
/// process (`ALL`: every process).
const CMD_WORDS: usize = 5;
const ALL: u64 = u64::MAX;

/// Bytes of a fork's description at most that travel with its command
/// ([`Team::fork_team_sent`]).
pub const FORK_SENT_MAX: usize = 256;

/// A fork's description as received by a process other than 0, 16-byte
/// aligned.
#[repr(C, align(16))]
struct SentCopy([u8; FORK_SENT_MAX]);
/// Hook-word bit of the thread running the team's `main` (the allocator
/// uses the low 32 bits).
const MAIN_MARK: usize = 1 << 32;

/// A function forked onto the team: called once per team thread with the
/// thread's view of the team and the fork's data pointer.
pub type TeamFn = unsafe fn(&TeamThread<'_>, *mut u8);

/// What a team barrier offers a team thread, type-erased.
trait TeamSync: Sync + Send {
    /// The team barrier, called by a program whose stack pointer was
    /// `caller_sp` before its call, where known: the frames below it are
    /// the runtime's ([`Dsm::program_frames_end_at_call`]).
    fn wait(&self, caller_sp: Option<usize>) -> DsmResult<bool>;
    fn wait_local(&self) -> bool;
}

impl<C: Communicator + 'static, U: UltItf, T: UltItf> TeamSync for TeamBarrier<'_, C, U, T> {
    fn wait(&self, caller_sp: Option<usize>) -> DsmResult<bool> {
        let _frames = caller_sp.map(|sp| self.dsm_handle().program_frames_end_at_call(sp));
        TeamBarrier::wait(self)
    }

    fn wait_local(&self) -> bool {
        TeamBarrier::wait_local(self)
    }
}

/// One thread of a forked team, as the forked function sees it.
pub struct TeamThread<'a> {
    thread_num: usize,
    num_threads: usize,
    local_num: usize,
    threads_here: usize,
    rank: usize,
    nprocs: usize,
    barrier: &'a dyn TeamSync,
}

impl TeamThread<'_> {
    /// This thread's number in the team, `0 .. num_threads()`: each
    /// process runs consecutive numbers, process 0 the first (thread 0 runs
    /// on process 0).
    pub fn thread_num(&self) -> usize {
        self.thread_num
    }

    /// Threads in the team (all processes).
    pub fn num_threads(&self) -> usize {
        self.num_threads
    }

    /// This thread's number among the team threads of its process.
    pub fn local_num(&self) -> usize {
        self.local_num
    }

    /// Team threads of this process (the same in every process unless the
    /// team was forked with [`Team::fork_team`] and its size is not a
    /// multiple of the processes).
    pub fn threads_here(&self) -> usize {
        self.threads_here
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes.
    pub fn nprocs(&self) -> usize {
        self.nprocs
    }

    /// The team barrier: returns once every thread of the team has called
    /// it; every write made before it by any team thread is visible after
    /// it. `Ok(true)` in one thread per process.
    ///
    /// On x86-64 it enters the runtime through a trampoline that passes the
    /// caller's stack pointer, so the barrier's release publishes the
    /// caller's frames and none of the runtime's below them (the registers
    /// those save change from call to call: a loop of barriers would
    /// otherwise publish a block of the thread's stack at every one).
    #[inline(always)]
    pub fn barrier(&self) -> DsmResult<bool> {
        #[cfg(target_arch = "x86_64")]
        {
            let mut out = core::mem::MaybeUninit::<DsmResult<bool>>::uninit();
            // SAFETY: the trampoline calls `barrier_from` with these two
            // pointers unchanged (and the caller's stack pointer), which
            // writes `out` before it returns.
            unsafe {
                barrier_trampoline((self as *const Self).cast(), out.as_mut_ptr().cast());
                out.assume_init()
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self.barrier.wait(None)
        }
    }

    /// The in-process part of the team barrier: returns once every team
    /// thread of *this process* has called it (true in one of them). It
    /// makes nothing visible to other processes; for combining values
    /// within a process before one thread exchanges them.
    pub fn local_barrier(&self) -> bool {
        self.barrier.wait_local()
    }
}

/// [`TeamThread::barrier`]'s way into the runtime: a tail jump to
/// [`barrier_from`] with the caller's stack pointer before its `call` (the
/// address just above the return address) as the third argument. It keeps
/// no frame of its own, so a panic unwinds from `barrier_from` straight to
/// the caller, as from the plain call it replaces.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C-unwind" fn barrier_trampoline(
    _thread: *const core::ffi::c_void,
    _out: *mut core::ffi::c_void,
) {
    core::arch::naked_asm!(
        "lea rdx, [rsp + 8]",
        "jmp {from}",
        from = sym barrier_from,
    )
}

/// The team barrier of the [`TeamThread`] at `thread`, called by a program
/// whose stack pointer was `caller_sp`; writes its result to `out`.
///
/// # Safety
///
/// `thread` points to a live `TeamThread` and `out` to writable room for a
/// `DsmResult<bool>` (as [`TeamThread::barrier`] passes them).
#[cfg(target_arch = "x86_64")]
unsafe extern "C-unwind" fn barrier_from(
    thread: *const core::ffi::c_void,
    out: *mut core::ffi::c_void,
    caller_sp: usize,
) {
    // SAFETY: the caller's contract.
    let thread = unsafe { &*thread.cast::<TeamThread<'_>>() };
    let r = thread.barrier.wait(Some(caller_sp));
    // SAFETY: the caller's contract.
    unsafe { out.cast::<DsmResult<bool>>().write(r) };
}

impl core::fmt::Debug for TeamThread<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TeamThread")
            .field("thread_num", &self.thread_num)
            .field("num_threads", &self.num_threads)
            .field("rank", &self.rank)
            .finish()
    }
}

/// A fork in which `main` takes part ([`Team::fork_begin`]): holds the
/// team's other threads of this process until [`Team::fork_end`].
pub struct OpenFork {
    barrier: *mut (dyn TeamSync + 'static),
    threads: *mut [TeamThread<'static>],
    handles: Vec<ct_worker::JoinHandle<(), TeamConfig>>,
}

impl OpenFork {
    /// `main`'s place in the team: thread 0.
    pub fn thread(&self) -> &TeamThread<'_> {
        // SAFETY: the descriptions live until `fork_end` consumes the fork.
        unsafe { &(*self.threads)[0] }
    }
}

impl core::fmt::Debug for OpenFork {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OpenFork")
            .field("thread", self.thread())
            .finish()
    }
}

/// Fork–join across the processes of a DSM, on user-level threads whose
/// call stacks live in the DSM.
///
/// Every process creates a `Team` over its [`Dsm`] and calls
/// [`Team::run_main`]. On process 0 the `main` closure runs as a user-level
/// thread on a DSM call stack; the other processes wait (asleep, not
/// spinning) for its commands. From `main`, [`Team::fork`] (or
/// [`Team::parallel`]) starts a function on `threads_per_process` user-level
/// threads in **every** process — on process 0 new threads, each with its
/// own DSM stack, while `main` waits; on the others, and in a job of one
/// process, the first of them is the thread that serves the fork (`main`
/// itself in a job of one process), the rest new threads — and returns
/// when all have finished. Because stacks, heap and
/// globals are DSM memory at the same address everywhere, the function may
/// use pointers into `main`'s frame: a local array of `main`, a `Vec` built
/// by `main` with the [`DsmAllocator`](crate::dsm::DsmAllocator).
///
/// A fork publishes what `main` wrote before its threads start — a
/// release of process 0 that travels with the fork's command and that the
/// other processes acquire (a DSM barrier if it does not fit) — and costs
/// one DSM barrier after they end (it publishes what they wrote);
/// [`TeamThread::barrier`] inside costs one DSM barrier per process.
///
/// A team thread that panics ends its process (status 101) with a message:
/// the other threads of the team could never pass their next barrier. The
/// other processes then fail with [`DsmError::Com`] (a dead peer).
pub struct Team<'d, C: Communicator + 'static, U: UltItf> {
    dsm: &'d Dsm<C, U>,
    rt: Runtime<TeamConfig>,
    running: AtomicBool,
    /// A fork runs (on process 0: `main` waits for its team).
    forking: AtomicBool,
    forks: AtomicU64,
    /// The team barrier of the last fork, kept for the next one with the
    /// same shape (forks run one at a time in a process; a barrier is
    /// reusable once every thread has left it).
    spare_barrier: std::sync::Mutex<Option<Box<TeamBarrier<'d, C, U, TeamUlt>>>>,
}

impl<'d, C: Communicator + 'static, U: UltItf> Team<'d, C, U> {
    /// Collectively creates a team runtime of `workers` worker OS threads
    /// in this process (every process calls it; the first team creates the
    /// DSM's stack region, [`Dsm::create_stacks`]). Its threads take their
    /// stacks from that region, so at most `stacks_per_process` of them
    /// (`MENPS_DSM_STACKS`) can exist at once in a process, `main` included.
    pub fn new(dsm: &'d Dsm<C, U>, workers: usize) -> DsmResult<Self> {
        let stacks = dsm.create_stacks()?;
        // One process: no other process ever reads a stack, so a stack is
        // pinned the first time it is used, for good, and switching threads
        // pins nothing (every switch would otherwise take a block lock
        // twice).
        let one = dsm.nprocs() == 1;
        // SAFETY: the team borrows `dsm` for 'd and owns the runtime, which
        // it stops (drops) before the borrow ends; the stack region and the
        // space live as long as the `Dsm`.
        let (source, hook) = unsafe {
            let hook = if one {
                PinHook::pinned_for_good(dsm.space, stacks)
            } else {
                PinHook::new(dsm.space)
            };
            (DsmStacks::new(stacks), hook)
        };
        let rt = Runtime::builder()
            .workers(workers)
            .stack_size(stacks.slot_size())
            .thread_name("menps-team")
            .stack_source(source)
            .switch_hook(hook)
            .build_with::<TeamConfig>()
            .map_err(|e| DsmError::Config(format!("cannot start the team runtime: {e}")))?;
        Ok(Team {
            dsm,
            rt,
            running: AtomicBool::new(false),
            forking: AtomicBool::new(false),
            forks: AtomicU64::new(0),
            spare_barrier: std::sync::Mutex::new(None),
        })
    }

    /// The DSM of the team.
    pub fn dsm(&self) -> &'d Dsm<C, U> {
        self.dsm
    }

    /// Worker OS threads of this process's team runtime.
    pub fn workers(&self) -> usize {
        self.rt.num_workers()
    }

    /// How long this process's idle team workers keep looking for work
    /// before they sleep ([`ct_worker::Runtime::set_stay_awake`]): an
    /// OpenMP-style wait policy.
    pub fn set_stay_awake(&self, t: core::time::Duration) {
        self.rt.set_stay_awake(t);
    }

    /// Binds this process's team worker `index` to the processors `cpus`
    /// ([`ct_worker::Runtime::bind_worker`]).
    pub fn bind_worker(&self, index: usize, cpus: &[usize]) -> DsmResult<()> {
        self.rt
            .bind_worker(index, cpus)
            .map_err(|e| DsmError::Config(e.to_string()))
    }

    /// Forks started so far (on process 0; forks served elsewhere).
    pub fn forks(&self) -> u64 {
        self.forks.load(Ordering::Relaxed)
    }

    /// Collectively runs the program: `main` as a user-level thread on a DSM
    /// call stack on process 0, which returns `Some(main's value)`; the
    /// other processes serve its forks until it returns, and get `None`.
    /// Ends with a DSM barrier, so what `main` wrote is visible everywhere.
    ///
    /// A panic in `main` is re-raised on process 0 after the other processes
    /// were told to stop.
    pub fn run_main<R: Send>(&self, main: impl FnOnce() -> R + Send) -> DsmResult<Option<R>> {
        self.check_code_addresses()?;
        if self.running.swap(true, Ordering::AcqRel) {
            return Err(DsmError::Misuse("Team::run_main is already running".into()));
        }
        let r = self.run_main_inner(main);
        self.running.store(false, Ordering::Release);
        let r = r?;
        self.dsm.barrier()?;
        Ok(r)
    }

    fn run_main_inner<R: Send>(&self, main: impl FnOnce() -> R + Send) -> DsmResult<Option<R>> {
        if self.dsm.rank() != 0 {
            self.rt
                .try_block_on(|| self.serve())
                .map_err(|e| DsmError::Config(format!("cannot start the team's thread: {e}")))??;
            return Ok(None);
        }
        let out = self.rt.try_block_on(|| {
            let d = ct_worker::current_thread_data().unwrap_or(0);
            ct_worker::set_current_thread_data(d | MAIN_MARK);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(main));
            let d = ct_worker::current_thread_data().unwrap_or(0);
            ct_worker::set_current_thread_data(d & !MAIN_MARK);
            r
        });
        // The others stop serving whatever happened to `main`.
        let stopped = self.command([CMD_EXIT, 0, 0, 0, ALL], &[]);
        let out =
            out.map_err(|e| DsmError::Config(format!("cannot start the team's main: {e}")))?;
        match out {
            Ok(v) => stopped.map(|()| Some(v)),
            Err(p) => std::panic::resume_unwind(p),
        }
    }

    /// Function pointers go from process 0 to the others: every process must
    /// run the same binary at the same addresses.
    fn check_code_addresses(&self) -> DsmResult<()> {
        let f: fn(&Self) -> DsmResult<()> = Self::check_code_addresses;
        let mine = (f as usize as u64).to_le_bytes();
        let all = self.dsm.com().allgather(&mine)?;
        if all.chunks_exact(8).any(|c| c != mine) {
            return Err(DsmError::Config(
                "code addresses differ between the processes (address-space randomisation is \
                 on, or they run different binaries): functions cannot be forked"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The loop of the processes other than 0: runs forks until `main` ends.
    fn serve(&self) -> DsmResult<()> {
        loop {
            // The fork's description, if one travels with the command.
            let mut sent = SentCopy([0; FORK_SENT_MAX]);
            let cmd = {
                // Runtime work: the message is not DSM memory.
                let _rt = RuntimeGuard::enter();
                let mut b = [0u8; 8 * CMD_WORDS + RECORD_BYTES + FORK_SENT_MAX];
                let (_, len) = self
                    .dsm
                    .com()
                    .recv_into(Source::Rank(0), TEAM_TAG, &mut b)?;
                let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8"));
                let mut head = 8 * CMD_WORDS;
                let released = len >= head && w(0) == CMD_FORK_RELEASED;
                if released {
                    // Process 0's release, acquired before the fork runs.
                    if len < head + RECORD_BYTES {
                        return Err(DsmError::Misuse(format!(
                            "a corrupt team command from process 0 ({len} bytes, with a release)"
                        )));
                    }
                    self.dsm.fork_acquire(&b[head..head + RECORD_BYTES])?;
                    head += RECORD_BYTES;
                }
                let extra = len.saturating_sub(head);
                if extra > FORK_SENT_MAX {
                    return Err(DsmError::Misuse(format!(
                        "a corrupt team command from process 0 ({len} bytes: a description \
                         of {extra} bytes, at most {FORK_SENT_MAX})"
                    )));
                }
                sent.0[..extra].copy_from_slice(&b[head..head + extra]);
                let kind = if released { CMD_FORK } else { w(0) };
                (
                    len.min(8 * CMD_WORDS),
                    extra,
                    released,
                    [kind, w(1), w(2), w(3), w(4)],
                )
            };
            match cmd {
                (40, extra, released, [CMD_FORK, f, data, tpp, target]) => {
                    // SAFETY: process 0 sent the address of a `TeamFn` of
                    // this binary (same code addresses, checked by
                    // `run_main`) with the data pointer and thread count its
                    // `fork` caller vouched for; a description that came
                    // with it stands for the bytes at `data`
                    // (`fork_team_sent`), and lives until the fork ends.
                    let f: TeamFn = unsafe { core::mem::transmute::<usize, TeamFn>(f as usize) };
                    let data = if extra > 0 {
                        sent.0.as_mut_ptr() as usize
                    } else {
                        data as usize
                    };
                    self.execute(f, data, tpp as usize, target, released)?;
                }
                (40, 0, false, [CMD_EXIT, ..]) => return Ok(()),
                (len, _, _, w) => {
                    return Err(DsmError::Misuse(format!(
                        "a corrupt team command from process 0 ({len} bytes: {w:?})"
                    )));
                }
            }
        }
    }

    /// Sends a command, and the bytes `sent` after it, to every other
    /// process (`sent` holds a release record first, for
    /// [`CMD_FORK_RELEASED`]).
    fn command(&self, w: [u64; CMD_WORDS], sent: &[&[u8]]) -> DsmResult<()> {
        let _rt = RuntimeGuard::enter();
        let mut bytes = [0u8; 8 * CMD_WORDS + RECORD_BYTES + FORK_SENT_MAX];
        for (b, v) in bytes.chunks_exact_mut(8).zip(w) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        let mut len = 8 * CMD_WORDS;
        for part in sent {
            bytes[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        for p in 1..self.dsm.nprocs() {
            self.dsm.com().send(p, TEAM_TAG, &bytes[..len])?;
        }
        Ok(())
    }

    /// Starts `f(thread, data)` on `threads_per_process` user-level threads
    /// in every process (on process 0 new user-level threads while the
    /// calling `main` waits; see [`Team`] for the others) and returns once
    /// all have returned, their writes visible to `main`.
    ///
    /// Only `main` of [`Team::run_main`] on process 0 may fork (a fork from
    /// anywhere else — before `run_main`, from a team thread — is an
    /// error). `threads_per_process` is at least 1 and, with `main` or the
    /// serving thread, must fit the process's stack slots.
    ///
    /// # Safety
    ///
    /// `f` runs in every process with the same `data`: `data` (and whatever
    /// `f` reaches through it) must be valid in every process — DSM memory
    /// (`main`'s stack, the DSM heap, DSM globals, adopted ranges) or
    /// immutable statics — and `f` must access it data-race-free under the
    /// DSM's rules (synchronising through [`TeamThread::barrier`], DSM
    /// mutexes or atomics).
    pub unsafe fn fork(
        &self,
        threads_per_process: usize,
        f: TeamFn,
        data: *mut u8,
    ) -> DsmResult<()> {
        let total = threads_per_process.saturating_mul(self.dsm.nprocs());
        // SAFETY: forwarded contract.
        unsafe { self.fork_to(ALL, total, f, data, &[]) }
    }

    /// [`Team::fork`] of a team of `num_threads` threads in all, spread over
    /// the processes as evenly as they go: process `r` runs
    /// `num_threads / nprocs` threads, one more if `r < num_threads %
    /// nprocs`, and thread numbers follow the processes' order. A team
    /// smaller than the number of processes runs on process 0 alone (the
    /// others take part in the fork's synchronization only, as in
    /// [`Team::fork_on`]), since every process of a team must take part in
    /// its barriers.
    ///
    /// # Safety
    ///
    /// As for [`Team::fork`].
    pub unsafe fn fork_team(&self, num_threads: usize, f: TeamFn, data: *mut u8) -> DsmResult<()> {
        // SAFETY: forwarded contract.
        unsafe { self.fork_to(self.team_target(num_threads), num_threads, f, data, &[]) }
    }

    /// [`Team::fork_team`] whose `data` is a small description of the fork
    /// (at most [`FORK_SENT_MAX`] bytes, `len`) that its threads only read:
    /// it travels with the fork's command, and the team threads of the other
    /// processes get a pointer to their process's copy (16-byte aligned)
    /// instead of `data`, so they do not read it from `main`'s frame —
    /// whose blocks they would otherwise fetch again at every fork, since
    /// `main` writes them. Process 0's threads get `data` itself (so only
    /// they may write what it points to). With `len` 0 this is
    /// [`Team::fork_team`].
    ///
    /// # Safety
    ///
    /// As for [`Team::fork`], and the `len` bytes at `data` must be
    /// readable and mean the same in every process when copied as bytes
    /// (plain data: no pointers to process-private memory).
    ///
    /// # Errors
    ///
    /// [`DsmError::InvalidArgument`] if `len` exceeds [`FORK_SENT_MAX`]; as
    /// [`Team::fork_team`] otherwise.
    pub unsafe fn fork_team_sent(
        &self,
        num_threads: usize,
        f: TeamFn,
        data: *mut u8,
        len: usize,
    ) -> DsmResult<()> {
        if len > FORK_SENT_MAX {
            return Err(DsmError::InvalidArgument(format!(
                "a fork's description of {len} bytes: at most {FORK_SENT_MAX} travel with the fork"
            )));
        }
        let sent = if len == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's contract: `len` readable bytes at `data`.
            unsafe { core::slice::from_raw_parts(data.cast_const(), len) }
        };
        // SAFETY: forwarded contract.
        unsafe { self.fork_to(self.team_target(num_threads), num_threads, f, data, sent) }
    }

    /// Where [`Team::fork_team`] runs a team of `num_threads` threads.
    fn team_target(&self, num_threads: usize) -> u64 {
        if num_threads < self.dsm.nprocs() {
            0
        } else {
            ALL
        }
    }

    /// [`Team::fork`] onto process `rank` only: `threads` user-level
    /// threads there, and
    /// the team barrier among them is an in-process barrier. The other
    /// processes take part in the fork's synchronization only, so what `main`
    /// wrote before is visible to the threads, and what they wrote is
    /// visible to `main` after.
    ///
    /// # Safety
    ///
    /// As for [`Team::fork`].
    pub unsafe fn fork_on(
        &self,
        rank: usize,
        threads: usize,
        f: TeamFn,
        data: *mut u8,
    ) -> DsmResult<()> {
        if rank >= self.dsm.nprocs() {
            return Err(DsmError::InvalidArgument(format!(
                "fork_on process {rank}: the job has {} processes",
                self.dsm.nprocs()
            )));
        }
        // SAFETY: forwarded contract.
        unsafe { self.fork_to(rank as u64, threads, f, data, &[]) }
    }

    /// A fork to every process (`ALL`) or to one, with the description
    /// `sent` (empty: none; see [`Team::fork_team_sent`]).
    unsafe fn fork_to(
        &self,
        target: u64,
        threads: usize,
        f: TeamFn,
        data: *mut u8,
        sent: &[u8],
    ) -> DsmResult<()> {
        let released = self.announce(target, threads, f, data, sent, true)?;
        let r = self.execute(f, data as usize, threads, target, released);
        self.forking.store(false, Ordering::Release);
        r
    }

    /// Checks that a fork may start here, tells the other processes, and
    /// marks the fork running. With `release`, the command carries this
    /// process's release where it fits (see [`Team::execute`]); returns
    /// whether it did.
    fn announce(
        &self,
        target: u64,
        threads: usize,
        f: TeamFn,
        data: *mut u8,
        sent: &[u8],
        release: bool,
    ) -> DsmResult<bool> {
        let in_main = self.dsm.rank() == 0
            && self.running.load(Ordering::Acquire)
            && !self.forking.load(Ordering::Acquire)
            && ct_worker::current_thread_data().is_some_and(|d| d & MAIN_MARK != 0);
        if !in_main {
            return Err(DsmError::Misuse(
                "Team::fork is called from the main function given to Team::run_main, on \
                 process 0 (not before run_main, nor from a team thread)"
                    .into(),
            ));
        }
        let slots = self.dsm.stacks().map_or(0, |s| s.slots_per_process());
        let most = if target == ALL {
            threads.div_ceil(self.dsm.nprocs())
        } else {
            threads
        };
        if threads == 0 || most >= slots {
            return Err(DsmError::InvalidArgument(format!(
                "{most} team threads per process: use 1 .. {} (one stack slot is main's; \
                 raise MENPS_DSM_STACKS for more)",
                slots.saturating_sub(1)
            )));
        }
        self.forks.fetch_add(1, Ordering::Relaxed);
        let record = if release && self.dsm.nprocs() > 1 {
            self.dsm.fork_release()?
        } else {
            None
        };
        let words = |kind| [kind, f as usize as u64, data as u64, threads as u64, target];
        match &record {
            Some(r) => self.command(words(CMD_FORK_RELEASED), &[r, sent])?,
            None => self.command(words(CMD_FORK), &[sent])?,
        }
        self.forking.store(true, Ordering::Release);
        Ok(record.is_some())
    }

    /// Begins a fork in which the caller — `main` — takes part as thread 0
    /// (libgomp's old `GOMP_parallel_start`): the team's other threads start
    /// `f(thread, data)` as [`Team::fork_team`]'s would, while `main` goes on
    /// with the returned [`OpenFork`], whose [`OpenFork::thread`] is its place
    /// in the team; [`Team::fork_end`] joins them. Prefer [`Team::fork_team`]:
    /// there `main` only waits, so its frame, which the other processes
    /// read, does not change while the team runs.
    ///
    /// # Safety
    ///
    /// As for [`Team::fork`]; `data` must stay valid until `fork_end`.
    pub unsafe fn fork_begin(
        &self,
        num_threads: usize,
        f: TeamFn,
        data: *mut u8,
    ) -> DsmResult<OpenFork> {
        let dsm = self.dsm;
        let (rank, nprocs) = (dsm.rank(), dsm.nprocs());
        let target = self.team_target(num_threads);
        self.announce(target, num_threads, f, data, &[], false)?;
        let r = (|| {
            let _rt = RuntimeGuard::enter();
            if nprocs > 1 {
                dsm.barrier()?;
            }
            let all = target == ALL;
            let (tpp, first) = if all {
                let (base, extra) = (num_threads / nprocs, num_threads % nprocs);
                (
                    base + usize::from(rank < extra),
                    rank * base + rank.min(extra),
                )
            } else {
                (num_threads, 0)
            };
            let barrier: Box<dyn TeamSync + '_> = Box::new(if all {
                TeamBarrier::<'_, C, U, TeamUlt>::new(dsm, tpp)
            } else {
                TeamBarrier::<'_, C, U, TeamUlt>::local(dsm, tpp)
            });
            // SAFETY: only the lifetime is erased; `fork_end` frees the
            // barrier after every thread using it has been joined, and the
            // team (with its DSM) outlives the fork.
            let barrier: Box<dyn TeamSync + 'static> = unsafe { core::mem::transmute(barrier) };
            let barrier = Box::into_raw(barrier);
            let threads: Box<[TeamThread<'static>]> = (0..tpp)
                .map(|local| TeamThread {
                    thread_num: first + local,
                    num_threads,
                    local_num: local,
                    threads_here: tpp,
                    rank,
                    nprocs,
                    // SAFETY: freed only by `fork_end`, after the threads.
                    barrier: unsafe { &*barrier },
                })
                .collect();
            let threads = Box::into_raw(threads);
            let mut handles = Vec::with_capacity(tpp.saturating_sub(1));
            for local in 1..tpp {
                // SAFETY: the threads' descriptions live until `fork_end`,
                // which joins every thread before freeing them.
                let t = unsafe { &(*threads)[local] } as *const TeamThread<'static> as usize;
                let d = data as usize;
                let h = ct_worker::try_spawn_in::<TeamConfig, _, _>(move || {
                    // SAFETY: as above.
                    run_team_thread(f, unsafe { &*(t as *const TeamThread<'static>) }, d)
                })
                .map_err(|e| DsmError::Config(format!("cannot start a team thread: {e}")))?;
                handles.push(h);
            }
            Ok(OpenFork {
                barrier,
                threads,
                handles,
            })
        })();
        if r.is_err() {
            self.forking.store(false, Ordering::Release);
        }
        r
    }

    /// Ends a fork begun with [`Team::fork_begin`] once `main` (thread 0)
    /// is done: joins the team's other threads and ends with the fork's
    /// DSM barrier, so what they wrote is visible to `main`.
    pub fn fork_end(&self, fork: OpenFork) -> DsmResult<()> {
        let _rt = RuntimeGuard::enter();
        let OpenFork {
            barrier,
            threads,
            handles,
        } = fork;
        for h in handles {
            // A panicking team thread ends the process (`run_team_thread`).
            let _ = h.try_join();
        }
        // SAFETY: every thread that used them has been joined; both came
        // from `Box::into_raw` in `fork_begin`.
        unsafe {
            drop(Box::from_raw(threads));
            drop(Box::from_raw(barrier));
        }
        let r = if self.dsm.nprocs() == 1 {
            self.dsm.check()
        } else {
            self.dsm.barrier()
        };
        self.forking.store(false, Ordering::Release);
        r
    }

    /// [`Team::fork`] of a closure: `f(thread)` runs on every team thread.
    ///
    /// # Safety
    ///
    /// As for [`Team::fork`], with `f`'s captures as `data`: the closure
    /// object lives in `main`'s frame (DSM memory), and everything it
    /// captures must be valid in every process. Captured *values* are (they
    /// are in the closure); captured *references* are only if they point to
    /// DSM memory — locals of `main`, heap objects allocated in DSM context,
    /// globals and adopted ranges. A closure that borrows a local of code
    /// running on an ordinary OS-thread stack (the caller of
    /// [`Team::run_main`], say) reads another process's unrelated memory
    /// there: capture such values with `move`.
    pub unsafe fn parallel<F>(&self, threads_per_process: usize, f: &F) -> DsmResult<()>
    where
        F: Fn(&TeamThread<'_>) + Sync,
    {
        let at = (f as *const F).cast::<u8>();
        if size_of::<F>() != 0 && self.dsm.block_state(at).is_none() {
            return Err(DsmError::InvalidArgument(format!(
                "the closure given to Team::parallel is at {at:p}, not in DSM memory (define \
                 it in main, which runs on a DSM stack)"
            )));
        }
        unsafe fn call<F: Fn(&TeamThread<'_>) + Sync>(t: &TeamThread<'_>, data: *mut u8) {
            // SAFETY: `data` is the `&F` that `parallel` passed, alive until
            // the fork returns (it is joined before `parallel` returns).
            let f = unsafe { &*data.cast::<F>() };
            f(t)
        }
        // SAFETY: forwarded contract.
        unsafe {
            self.fork(
                threads_per_process,
                call::<F>,
                (f as *const F).cast_mut().cast(),
            )
        }
    }

    /// Runs one fork in this process: process 0's writes so far become
    /// visible, the team threads run (if the fork is for this process),
    /// and a DSM barrier ends it. `threads` is the team's size: all
    /// processes together for a fork to `ALL`, else the threads of the one
    /// process.
    ///
    /// The writes of process 0 (`main`'s, before the fork) are the only
    /// ones to make visible at the start: the other processes wrote nothing
    /// since the barrier that ended the last fork. So process 0 releases
    /// them into a barrier record that travels with the fork's command
    /// (`released`: the others acquired it when the command came), and the
    /// fork needs no collective at its start — one DSM barrier per fork
    /// instead of two. A signature too long for a record (or the directory
    /// policy) makes it a DSM barrier as before.
    fn execute(
        &self,
        f: TeamFn,
        data: usize,
        threads: usize,
        target: u64,
        released: bool,
    ) -> DsmResult<()> {
        // The team's own bookkeeping is not DSM memory; the team threads'
        // code is user code again (`run_team_thread`).
        let _rt = RuntimeGuard::enter();
        let dsm = self.dsm;
        // One process: its threads share its copy of every block; the
        // scope's join orders their writes before `main`'s later reads.
        let one = dsm.nprocs() == 1;
        if !one && !released {
            dsm.barrier()?;
        }
        let (rank, nprocs) = (dsm.rank(), dsm.nprocs());
        let all = target == ALL;
        // This process's share: the first `threads % nprocs` processes run
        // one thread more than the others.
        let (tpp, first) = if all {
            let (base, extra) = (threads / nprocs, threads % nprocs);
            (
                base + usize::from(rank < extra),
                rank * base + rank.min(extra),
            )
        } else {
            (threads, 0)
        };
        if all || target == rank as u64 {
            // In process-private memory (this is runtime code), not in this
            // frame: every team barrier writes it, and this frame is on a
            // DSM stack whose block the other processes read (the fork's
            // closure and what it borrows live in the frames above).
            let spare = self
                .spare_barrier
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .filter(|b| b.threads_here() == tpp && b.is_local_only() == (!all || one));
            let barrier: Box<TeamBarrier<'_, C, U, TeamUlt>> = spare.unwrap_or_else(|| {
                Box::new(if all {
                    TeamBarrier::new(dsm, tpp)
                } else {
                    TeamBarrier::local(dsm, tpp)
                })
            });
            let thread = |local: usize| TeamThread {
                thread_num: first + local,
                num_threads: threads,
                local_num: local,
                threads_here: tpp,
                rank,
                nprocs,
                barrier: &*barrier,
            };
            // On process 0 of a job of several processes, every team thread
            // is a new user-level thread: `main` only waits, so its frame —
            // where the fork's closure and what it borrows live, and which
            // every process reads — is not written while the team runs (a
            // `main` busy in its own frame would make the others fetch its
            // blocks again after every team barrier). Elsewhere no other
            // process reads the calling thread's frames (the serving thread
            // of a process other than 0; `main` of a job of one process), so
            // it runs the first of this process's team threads itself, as
            // libgomp's master does: one thread fewer to create and join.
            let inline_first = one || rank != 0;
            ct_worker::scope_in::<TeamConfig, _, _>(|s| {
                for local in usize::from(inline_first)..tpp {
                    let thread = &thread;
                    s.spawn(move || run_team_thread(f, &thread(local), data));
                }
                if inline_first {
                    run_team_thread(f, &thread(0), data);
                }
            });
            // Every thread that used it has been joined.
            *self.spare_barrier.lock().unwrap_or_else(|e| e.into_inner()) = Some(barrier);
        }
        if one { dsm.check() } else { dsm.barrier() }
    }
}

/// Runs one team thread. A panic cannot be recovered from (the other
/// threads of the team, in every process, would wait for this one at their
/// next barrier forever): it ends the process, whose death the other
/// processes then see as a failed peer.
fn run_team_thread(f: TeamFn, t: &TeamThread<'_>, data: usize) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the `fork` caller's contract.
        user_code(|| unsafe { f(t, data as *mut u8) })
    }));
    if r.is_err() {
        // The report comes from the private heap: the DSM's may have failed.
        let _rt = RuntimeGuard::enter();
        super::report_line(&format!(
            "menps-dsm: team thread {} (process {}) panicked: ending the process",
            t.thread_num, t.rank
        ));
        // SAFETY: ends the process at once; other threads may be blocked
        // in DSM waits that would never end.
        unsafe { libc::_exit(101) };
    }
}

impl<C: Communicator + 'static, U: UltItf> core::fmt::Debug for Team<'_, C, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Team")
            .field("rank", &self.dsm.rank())
            .field("workers", &self.workers())
            .finish()
    }
}
