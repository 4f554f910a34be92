//! The team runtime's stack source and switch hook: user-level threads run
//! on call stacks of the DSM's stack region, pinned while they run.

use core::sync::atomic::{AtomicBool, Ordering};

use ct_context::StackRegion;
use ct_worker::{Error, LeaveReason, StackSource, SwitchHook, UltThread};

use crate::dsm::error::{DsmError, DsmResult};
use crate::dsm::memory::SlotRegion;

/// Hands out the slots of the DSM's stack region (this process's share) as
/// user-level thread stacks.
#[derive(Debug)]
pub struct DsmStacks {
    /// The stack region of the DSM (owned by the `Dsm`, which outlives every
    /// runtime built on it: a `Team` borrows the `Dsm`).
    slots: *const SlotRegion,
}

// SAFETY: `SlotRegion` is `Sync` (its free list is behind a mutex); the
// pointer is valid while the team runtime lives (see `slots`).
unsafe impl Send for DsmStacks {}
// SAFETY: as above.
unsafe impl Sync for DsmStacks {}

impl DsmStacks {
    /// A source over `slots`.
    ///
    /// # Safety
    ///
    /// `slots` must outlive the runtime the source is given to, and every
    /// stack the runtime took must be given back or abandoned before the
    /// region's memory goes away.
    pub(crate) unsafe fn new(slots: &SlotRegion) -> Self {
        DsmStacks { slots }
    }

    fn slots(&self) -> &SlotRegion {
        // SAFETY: valid while the runtime lives (`new`'s contract).
        unsafe { &*self.slots }
    }
}

/// Stacks a worker keeps for its next threads (they count as taken: a
/// process's `MENPS_DSM_STACKS` must leave room for them, two per worker).
pub const CACHED_STACKS: usize = 2;

/// A stack error for ct-worker.
fn stack_error(e: DsmError) -> Error {
    Error::StackSource(Box::new(e))
}

// SAFETY: a handed-out region is one slot of the stack region, which is DSM
// memory mapped read-write while pinned (the switch hook pins a stack before
// anything touches it); a taken slot is nobody else's until given back
// (`SlotRegion`), and the slot's memory stays mapped for the DSM's life.
unsafe impl StackSource for DsmStacks {
    type Stack = StackRegion;
    /// A few stacks this worker gave back, taken again first (no lock).
    type Local = Vec<StackRegion>;

    fn init(&mut self, stack_size: usize, _workers: usize) -> ct_worker::Result<()> {
        let slot = self.slots().slot_size();
        if stack_size > slot {
            return Err(stack_error(DsmError::Config(format!(
                "user-level threads need stacks of {stack_size} bytes, the DSM's are {slot} \
                 bytes (MENPS_DSM_STACK_SIZE)"
            ))));
        }
        Ok(())
    }

    fn local(&self, _worker: usize) -> Vec<StackRegion> {
        Vec::with_capacity(CACHED_STACKS)
    }

    fn take(&self, at: Option<(usize, &mut Vec<StackRegion>)>) -> ct_worker::Result<StackRegion> {
        if let Some(stack) = at.and_then(|(_, cache)| cache.pop()) {
            return Ok(stack);
        }
        let s = self.slots();
        let p = s.take().map_err(stack_error)? as usize;
        StackRegion::new(p, p + s.slot_size())
            .ok_or_else(|| stack_error(DsmError::Misuse("an empty stack slot".into())))
    }

    unsafe fn give_back(&self, stack: StackRegion, _worker: usize, cache: &mut Vec<StackRegion>) {
        if cache.len() < CACHED_STACKS {
            return cache.push(stack);
        }
        // Only fails for a slot that was not taken: a bug of the runtime.
        if let Err(e) = self.slots().give_back(stack.bottom() as *mut u8) {
            fatal(&e);
        }
    }

    fn clear_local(&self, _worker: usize, cache: &mut Vec<StackRegion>) {
        for stack in cache.drain(..) {
            if let Err(e) = self.slots().give_back(stack.bottom() as *mut u8) {
                fatal(&e);
            }
        }
    }

    fn region(stack: StackRegion) -> StackRegion {
        stack
    }
}

/// What the switch hook needs from the DSM (type-erased).
pub(crate) trait StackPinner: Sync {
    /// Pins `[addr, addr + len)`.
    fn pin_stack(&self, addr: usize, len: usize) -> DsmResult<()>;
    /// Unpins `[addr, addr + len)`.
    fn unpin_stack(&self, addr: usize, len: usize) -> DsmResult<()>;
    /// Records that nothing of the stack holding `addr` below `low` is
    /// live (`usize::MAX`: nothing at all, 0: everything).
    fn stack_live_from(&self, addr: usize, low: usize);
}

/// Pins the stack of every user-level thread while it runs (MENPS §3.5):
/// `entering` pins the stack before the thread's code touches it, `left`
/// unpins it once nothing runs on it, so the next release fence releases
/// what the thread wrote and faults never happen on a running stack. `left`
/// also records where the thread's live frames end (its saved context; a
/// finished thread has none), so that releases skip the blocks below.
pub struct PinHook {
    pinner: *const dyn StackPinner,
    /// A job of one process, where no other process ever reads a stack: a
    /// stack is pinned the first time a thread runs on it, for good, and
    /// switches pin nothing. The slots of this process, and which are
    /// pinned.
    pinned_for_good: Option<(*const SlotRegion, Box<[AtomicBool]>)>,
}

// SAFETY: the pinner and the slot region are `Sync` and valid while the
// team runtime lives (the `Team` borrows the `Dsm` that owns both); the
// pinned flags are atomics.
unsafe impl Send for PinHook {}
// SAFETY: as above.
unsafe impl Sync for PinHook {}

impl PinHook {
    /// A hook pinning through `pinner`.
    ///
    /// # Safety
    ///
    /// `pinner` must outlive the runtime the hook is given to.
    pub(crate) unsafe fn new(pinner: &dyn StackPinner) -> Self {
        // SAFETY: only the lifetime is erased; `new`'s contract keeps the
        // pinner alive as long as the hook is used.
        let pinner: &'static dyn StackPinner = unsafe { core::mem::transmute(pinner) };
        PinHook {
            pinner,
            pinned_for_good: None,
        }
    }

    /// A hook that pins each stack of `slots` the first time a thread
    /// runs on it and never unpins it (a job of one process): switches then
    /// cost one load.
    ///
    /// # Safety
    ///
    /// As [`PinHook::new`], and `slots` must outlive the runtime too.
    pub(crate) unsafe fn pinned_for_good(pinner: &dyn StackPinner, slots: &SlotRegion) -> Self {
        // SAFETY: forwarded.
        let mut h = unsafe { Self::new(pinner) };
        let flags = (0..slots.slots_per_process())
            .map(|_| AtomicBool::new(false))
            .collect();
        h.pinned_for_good = Some((slots, flags));
        h
    }

    /// Pins `stack` unless it was pinned for good already (one-process
    /// mode); `true` if the hook works in that mode.
    #[inline]
    fn pin_once(&self, stack: StackRegion) -> bool {
        let Some((slots, flags)) = &self.pinned_for_good else {
            return false;
        };
        // SAFETY: the slot region outlives the runtime (`pinned_for_good`).
        let slots = unsafe { &**slots };
        let Some((_, i)) = slots.owner_of(stack.bottom() as *const u8) else {
            return true;
        };
        // A slot runs one thread at a time: no race on its flag.
        if !flags[i].load(Ordering::Acquire) {
            if let Err(e) = self
                .pinner()
                .pin_stack(stack.bottom(), stack.top() - stack.bottom())
            {
                fatal(&e);
            }
            flags[i].store(true, Ordering::Release);
        }
        true
    }

    fn pinner(&self) -> &dyn StackPinner {
        // SAFETY: valid while the runtime lives (`new`'s contract).
        unsafe { &*self.pinner }
    }
}

impl core::fmt::Debug for PinHook {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PinHook")
    }
}

impl SwitchHook for PinHook {
    #[inline]
    fn entering(&self, worker: usize, thread: UltThread<'_>, stack: StackRegion) {
        if self.pin_once(stack) {
            if let Some(e) = EXTENSION.get() {
                e.entering(worker, thread);
            }
            return;
        }
        // Running: any of it may be live.
        self.pinner().stack_live_from(stack.bottom(), 0);
        if let Err(e) = self
            .pinner()
            .pin_stack(stack.bottom(), stack.top() - stack.bottom())
        {
            fatal(&e);
        }
        if let Some(e) = EXTENSION.get() {
            e.entering(worker, thread);
        }
    }

    #[inline]
    fn left(&self, worker: usize, thread: UltThread<'_>, stack: StackRegion, why: LeaveReason) {
        if let Some(e) = EXTENSION.get() {
            e.left(worker, thread);
        }
        if self.pinned_for_good.is_some() {
            return;
        }
        // What lies below the thread's saved context is dead until it runs
        // again; a finished thread's whole stack is.
        let low = match (why, thread.saved_context()) {
            (LeaveReason::Finished, _) => usize::MAX,
            (_, Some(sp)) if (stack.bottom()..stack.top()).contains(&sp) => sp,
            _ => 0,
        };
        self.pinner().stack_live_from(stack.bottom(), low);
        if let Err(e) = self
            .pinner()
            .unpin_stack(stack.bottom(), stack.top() - stack.bottom())
        {
            fatal(&e);
        }
    }
}

/// More work on every switch of a team's user-level threads, for the
/// program layer (menps-gomp gives each team thread its own thread-local
/// storage this way). Called after the stack is pinned in `entering` and
/// before it is unpinned in `left`, under [`SwitchHook`]'s rules.
pub trait SwitchExtension: Sync + Send {
    /// See [`SwitchHook::entering`].
    fn entering(&self, worker: usize, thread: UltThread<'_>);
    /// See [`SwitchHook::left`].
    fn left(&self, worker: usize, thread: UltThread<'_>);
}

static EXTENSION: std::sync::OnceLock<&'static dyn SwitchExtension> = std::sync::OnceLock::new();

/// Installs the switch extension of this process's teams (once; it must be
/// installed before any team thread runs that needs it). Returns `false`
/// if one was installed already.
pub fn set_switch_extension(e: &'static dyn SwitchExtension) -> bool {
    EXTENSION.set(e).is_ok()
}

/// A stack cannot be pinned or given back: the DSM has failed (fail-stop),
/// and a thread cannot run on an unpinned stack. Ends the process like an
/// unresolvable fault does.
#[cold]
fn fatal(e: &DsmError) -> ! {
    super::report_line(&format!(
        "menps-dsm: fatal: cannot pin a user-level thread's DSM stack: {e}"
    ));
    match e {
        // SAFETY: ends the process without running destructors that could
        // wait for a dead peer.
        DsmError::Com(_) => unsafe { libc::_exit(1) },
        _ => std::process::abort(),
    }
}
