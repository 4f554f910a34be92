//! The DSM of this process, for code that cannot be generic.
//!
//! A [`Dsm`] is generic over its communication backend and threading
//! library; code with a fixed signature — a C ABI such as libgomp's entry
//! points, a `#[global_allocator]`, a signal handler's helpers — cannot name
//! those types. While a DSM runs (from [`Dsm::new`] to [`Dsm::finalize`] or
//! its drop) it is also reachable here, type-erased, as a
//! [`ProcessDsm`]:
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! # let com: menps_dsm::com::ShmCom<ct_worker::OsThreads> =
//! #     menps_dsm::launch::init_or_relaunch(2)?;
//! # let dsm: menps_dsm::dsm::Dsm<_> = menps_dsm::dsm::Dsm::new(com)?;
//! use menps_dsm::dsm::process;
//!
//! // Anywhere in the program, in any thread of a process whose DSM runs:
//! let (rank, n) = process::with(|d| (d.rank(), d.nprocs()))?;
//! assert!(rank < n);
//! process::with(|d| d.barrier())??;
//! # dsm.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Before the DSM starts and after it ends, [`with`] returns
//! [`DsmError::NotRunning`] — an error, never a crash. A process runs one
//! DSM at a time.

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use ct_worker::UltItf;

use crate::com::Communicator;

use super::error::{DsmError, DsmResult};
use super::memory::{MemState, SlotRegion};
use super::space::Space;
use super::{Dsm, DsmMutex};

/// What type-erased code can do with the DSM of this process. Every method
/// is the [`Dsm`] method of the same name.
pub trait ProcessDsm: Sync {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of processes.
    fn nprocs(&self) -> usize;
    /// [`Dsm::barrier`].
    fn barrier(&self) -> DsmResult<()>;
    /// [`Dsm::release_fence`].
    fn release_fence(&self) -> DsmResult<()>;
    /// [`Dsm::flush`].
    fn flush(&self) -> DsmResult<bool>;
    /// [`Dsm::stats`].
    fn stats(&self) -> super::StatsSnapshot;
    /// Where `addr` lies in this DSM's memory, in words: a heap object, a
    /// call stack, a segment ("" outside the DSM).
    fn describe(&self, addr: usize) -> String;
    /// [`Dsm::mutex_for_key`].
    fn mutex_for_key(&self, key: u64) -> DsmResult<DsmMutex>;
    /// Locks `m` (unlock with [`ProcessDsm::unlock`]).
    fn lock(&self, m: DsmMutex) -> DsmResult<()>;
    /// Unlocks `m`, locked by this process.
    fn unlock(&self, m: DsmMutex) -> DsmResult<()>;
    /// [`Dsm::fetch_add`].
    fn fetch_add(&self, word: *mut u64, delta: u64) -> DsmResult<u64>;
    /// [`Dsm::compare_exchange`].
    fn compare_exchange(
        &self,
        word: *mut u64,
        expected: u64,
        new: u64,
    ) -> DsmResult<Result<u64, u64>>;
    /// [`Dsm::alloc`].
    fn alloc(&self, size: usize, align: usize) -> DsmResult<*mut u8>;
    /// [`Dsm::alloc_zeroed`] (memory never used since start-up is zero
    /// already and is not written).
    fn alloc_zeroed(&self, size: usize, align: usize) -> DsmResult<*mut u8>;
    /// [`Dsm::free`].
    fn free(&self, ptr: *mut u8) -> DsmResult<()>;
    /// [`Dsm::usable_size`].
    fn usable_size(&self, ptr: *const u8) -> DsmResult<usize>;
    /// [`Dsm::heap_range`], as addresses.
    fn heap_range(&self) -> Option<(usize, usize)>;
    /// [`Dsm::pin`].
    fn pin(&self, addr: *mut u8, len: usize) -> DsmResult<()>;
    /// [`Dsm::unpin`].
    fn unpin(&self, addr: *mut u8, len: usize) -> DsmResult<()>;
    /// [`Dsm::stacks`].
    fn stacks(&self) -> Option<&SlotRegion>;
    /// Broadcasts `buf` from `root` to every process (collective).
    fn broadcast(&self, root: usize, buf: &mut [u8]) -> DsmResult<()>;
}

/// The registered DSM: a thin pointer to a leaked fat reference.
static CURRENT: AtomicPtr<&'static dyn ProcessDsm> = AtomicPtr::new(core::ptr::null_mut());
/// Calls of [`with`] under way (the DSM waits for them when it ends).
static USERS: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` with the DSM of this process; [`DsmError::NotRunning`] if no
/// DSM runs (not started yet, finalized, or dropped). Calls may nest and
/// run on any thread; the DSM waits for the calls under way when it ends,
/// so `f` must not wait for the DSM to end.
pub fn with<R>(f: impl FnOnce(&dyn ProcessDsm) -> R) -> DsmResult<R> {
    USERS.fetch_add(1, Ordering::SeqCst);
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            USERS.fetch_sub(1, Ordering::Release);
        }
    }
    let _leave = Leave;
    // SeqCst with the unregistering store and the user count: either this
    // load sees null, or `unregister` sees this call in `USERS`.
    let p = CURRENT.load(Ordering::SeqCst);
    if p.is_null() {
        return Err(DsmError::NotRunning);
    }
    // SAFETY: a registered pointer stays valid until `unregister` has
    // cleared it and seen `USERS` drop to zero, which cannot happen while
    // this call is counted.
    Ok(f(unsafe { *p }))
}

/// Whether a DSM runs in this process.
pub fn is_running() -> bool {
    !CURRENT.load(Ordering::Acquire).is_null()
}

/// The type-erased view of one DSM.
pub(crate) struct Handle<C: Communicator + 'static, U: UltItf> {
    space: &'static Space<C, U>,
    mem: *const MemState<U>,
}

// SAFETY: the space is `Sync`; `mem` points to the DSM's boxed memory
// state, which is `Sync` and outlives the handle (see `register`).
unsafe impl<C: Communicator + 'static, U: UltItf> Sync for Handle<C, U> {}

impl<C: Communicator + 'static, U: UltItf> Handle<C, U> {
    fn mem(&self) -> &MemState<U> {
        // SAFETY: see the `Sync` impl: alive while the handle is registered.
        unsafe { &*self.mem }
    }
}

/// Registers `dsm` as the DSM of this process.
///
/// # Safety
///
/// `dsm.mem` must stay at its address (it is boxed) until [`unregister`]
/// returns, which the DSM calls before it ends.
pub(crate) unsafe fn register<C: Communicator + 'static, U: UltItf>(
    dsm: &Dsm<C, U>,
) -> DsmResult<()> {
    let h: &'static Handle<C, U> = Box::leak(Box::new(Handle {
        space: dsm.space,
        mem: &*dsm.mem,
    }));
    let fat: &'static dyn ProcessDsm = h;
    let boxed = Box::into_raw(Box::new(fat));
    if CURRENT
        .compare_exchange(
            core::ptr::null_mut(),
            boxed,
            Ordering::SeqCst,
            Ordering::SeqCst,
        )
        .is_err()
    {
        // SAFETY: both came from Box::into_raw / Box::leak above and were
        // never published.
        unsafe {
            drop(Box::from_raw(boxed));
            drop(Box::from_raw(h as *const Handle<C, U> as *mut Handle<C, U>));
        }
        return Err(DsmError::Misuse(
            "a DSM is already running in this process (one per process)".into(),
        ));
    }
    Ok(())
}

/// Unregisters the DSM of this process (if any) and waits until no call of
/// [`with`] uses it any more.
pub(crate) fn unregister() {
    let p = CURRENT.swap(core::ptr::null_mut(), Ordering::SeqCst);
    if p.is_null() {
        return;
    }
    // Per-thread caches of the global allocator hold objects of this DSM.
    super::allocator::new_generation();
    let mut backoff = ct_sync::Backoff::new();
    while USERS.load(Ordering::SeqCst) != 0 {
        backoff.snooze(std::thread::yield_now);
    }
    // SAFETY: published by `register` from Box::into_raw; nobody can reach
    // it any more. The handle it points to is leaked on purpose (a few
    // words per DSM started in the process): a `&dyn` cannot be freed
    // without knowing its type here.
    drop(unsafe { Box::from_raw(p) });
}

impl<C: Communicator + 'static, U: UltItf> ProcessDsm for Handle<C, U> {
    fn rank(&self) -> usize {
        self.space.rank
    }
    fn nprocs(&self) -> usize {
        self.space.nprocs
    }
    fn barrier(&self) -> DsmResult<()> {
        self.space.barrier()
    }
    fn release_fence(&self) -> DsmResult<()> {
        self.space.release_fence()
    }
    fn flush(&self) -> DsmResult<bool> {
        self.space.flush()
    }
    fn stats(&self) -> super::StatsSnapshot {
        self.space.stats()
    }
    fn describe(&self, addr: usize) -> String {
        let mem = self.mem();
        if let Some((start, size)) = mem
            .heap()
            .ok()
            .and_then(|h| h.containing(&self.space.com, addr))
        {
            return format!(
                "in a heap object of {size} bytes at {start:#x}, byte {}",
                addr - start
            );
        }
        if let Some((rank, slot)) = mem.stacks.get().and_then(|s| s.owner_of(addr as *const u8)) {
            return format!("on call stack {slot} of process {rank}");
        }
        if self.space.block_size_at(addr).is_some() {
            return "in DSM memory".into();
        }
        String::new()
    }
    fn mutex_for_key(&self, key: u64) -> DsmResult<DsmMutex> {
        self.space.mutex_for_key(key).map(DsmMutex)
    }
    fn lock(&self, m: DsmMutex) -> DsmResult<()> {
        self.space.mutex_lock(m.0)
    }
    fn unlock(&self, m: DsmMutex) -> DsmResult<()> {
        self.space.mutex_unlock(m.0)
    }
    fn fetch_add(&self, word: *mut u64, delta: u64) -> DsmResult<u64> {
        self.space
            .atomic(word as usize, super::space::AtomicOp::FetchAdd(delta), true)
    }
    fn compare_exchange(
        &self,
        word: *mut u64,
        expected: u64,
        new: u64,
    ) -> DsmResult<Result<u64, u64>> {
        self.space.compare_exchange(word as usize, expected, new)
    }
    fn alloc(&self, size: usize, align: usize) -> DsmResult<*mut u8> {
        let h = self.mem().heap()?;
        h.alloc(self.space, size, align).map(|g| g.addr as *mut u8)
    }
    fn alloc_zeroed(&self, size: usize, align: usize) -> DsmResult<*mut u8> {
        let h = self.mem().heap()?;
        h.alloc_zeroed(self.space, size, align)
            .map(|a| a as *mut u8)
    }
    fn free(&self, ptr: *mut u8) -> DsmResult<()> {
        self.mem().heap()?.free(self.space, ptr as usize)
    }
    fn usable_size(&self, ptr: *const u8) -> DsmResult<usize> {
        self.mem()
            .heap()?
            .usable_size(&self.space.com, ptr as usize)
    }
    fn heap_range(&self) -> Option<(usize, usize)> {
        self.mem().heap.as_ref().map(|h| h.range())
    }
    fn pin(&self, addr: *mut u8, len: usize) -> DsmResult<()> {
        self.space.pin(addr as usize, len)
    }
    fn unpin(&self, addr: *mut u8, len: usize) -> DsmResult<()> {
        self.space.unpin(addr as usize, len)
    }
    fn stacks(&self) -> Option<&SlotRegion> {
        self.mem().stacks.get()
    }
    fn broadcast(&self, root: usize, buf: &mut [u8]) -> DsmResult<()> {
        self.space.check()?;
        self.space.com.broadcast(root, buf).map_err(Into::into)
    }
}
