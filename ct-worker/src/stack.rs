//! Stack sources: where a runtime's user-level threads get their call stacks.
//!
//! A [`StackSource`] is part of the compile-time [`Config`](crate::Config)
//! (its `Stacks` type); its instance is given to the runtime's
//! [`Builder`](crate::Builder) (or default-constructed). Every user-level
//! thread of the runtime — including the root thread of
//! [`Runtime::block_on`](crate::Runtime::block_on) — runs on a stack taken
//! from it, and the stack goes back to it the moment the thread finishes.
//!
//! The default, [`MmapStacks`], maps each stack with a guard page and keeps
//! freed stacks in per-worker pools that return memory to the worker that
//! mapped it. A DSM carves stacks out of a shared address range instead
//! (memory it owns; [`ct_context::RawStack`] describes such memory).

use core::ffi::CStr;
use core::mem::ManuallyDrop;
use core::ptr::{self, NonNull};

use ct_context::{MmapStack, Stack, StackRegion};

use crate::error::{Error, Result};
use crate::pool::{GLOBAL, LocalPool, PoolItem, SharedPool};
use crate::remote_list::Linked;

/// Where a runtime's user-level threads get their call stacks.
///
/// The runtime calls [`init`](StackSource::init) once, from
/// [`Builder::build_with`](crate::Builder::build_with), with the configured
/// stack size; an error there fails the build. It then [`take`]s a stack for
/// every thread it starts and [`give_back`]s it on the worker where the thread
/// finished, once nothing runs on it any more. Each worker has a
/// [`Local`](StackSource::Local) value that only its OS thread touches (a
/// cache of free stacks, or `()`).
///
/// Calls happen on hot paths (every fork of a user-level thread): a source
/// should serve most of them without synchronisation. They run on a worker's
/// OS thread, sometimes on the stack of another user-level thread (in the
/// middle of a switch), so they must not switch contexts or park; they may
/// block the OS thread briefly.
///
/// [`take`]: StackSource::take
/// [`give_back`]: StackSource::give_back
///
/// # Safety
///
/// Every stack handed out by [`take`](StackSource::take) must be memory that is
/// readable and writable over the whole of [`region`](StackSource::region)
/// (whose top is 16-byte aligned), that nothing else uses until the stack is
/// given back, and that stays valid until then — even if the source itself is
/// dropped first (the runtime drops its source after its workers stopped; the
/// stacks of threads abandoned blocked at shutdown are never given back). The
/// region should hold at least the stack size passed to `init`; the runtime
/// trusts it to (user code overflowing a smaller stack is the source's fault).
pub unsafe trait StackSource: Send + Sync + Sized + 'static {
    /// A stack handed out: a small handle (a pointer to a header, an index, or
    /// the region itself), kept in the thread's descriptor while it runs.
    type Stack: Copy;

    /// Per-worker state, touched only by its worker's OS thread.
    type Local;

    /// Prepares the source for a runtime of `workers` workers whose threads
    /// need `stack_size` usable bytes each. Called once, before any other
    /// method. An error (the size is invalid, or more than the source can
    /// give) fails [`Builder::build_with`](crate::Builder::build_with).
    fn init(&mut self, stack_size: usize, workers: usize) -> Result<()>;

    /// The local state of worker `worker` (called once, on that worker's OS
    /// thread).
    fn local(&self, worker: usize) -> Self::Local;

    /// Takes a stack of at least the size given to `init`: on worker `w`
    /// with its local state when `at` is `Some((w, local))`, or outside any
    /// worker (a thread spawned from a plain OS thread) when `at` is `None`.
    ///
    /// An error becomes the error of
    /// [`try_spawn_in`](crate::try_spawn_in) /
    /// [`Runtime::try_spawn`](crate::Runtime::try_spawn) (and the panic of
    /// the spawn functions that return no `Result`).
    fn take(&self, at: Option<(usize, &mut Self::Local)>) -> Result<Self::Stack>;

    /// Takes back a stack that nothing runs on any more, on worker `worker`
    /// (its local state is `local`); it may have been taken on another
    /// worker or outside any.
    ///
    /// # Safety
    ///
    /// `stack` must come from this source's [`take`](StackSource::take) and
    /// be given back once.
    unsafe fn give_back(&self, stack: Self::Stack, worker: usize, local: &mut Self::Local);

    /// The memory of `stack` that a thread runs on (it grows down from the
    /// top). The runtime's [`SwitchHook`](crate::SwitchHook) sees this range.
    fn region(stack: Self::Stack) -> StackRegion;

    /// Worker `worker` stops: releases what its local state still holds.
    /// Stacks given back later on other workers still reach the source.
    fn clear_local(&self, worker: usize, local: &mut Self::Local) {
        let _ = (worker, local);
    }
}

/// What the report of an overflow of an [`MmapStacks`] stack advises (see
/// [`ct_context::trap::set_overflow_hint`]).
pub(crate) const OVERFLOW_HINT: &CStr = c"raise the stack size of a ct-worker runtime's \
    user-level threads: Builder::stack_size, or CT_STACK_SIZE when the builder sets none \
    (k/M suffixes, e.g. CT_STACK_SIZE=1M; default 128k)";

/// The default stack source: each stack is an [`MmapStack`] (a guard page
/// below it; an overflow ends the process with a message naming
/// `CT_STACK_SIZE` and [`Builder::stack_size`](crate::Builder::stack_size))
/// of the configured size, pooled per worker — a stack freed on another worker goes back to the
/// one that mapped it; stacks made outside any worker go to a global cache.
#[derive(Debug)]
pub struct MmapStacks {
    size: usize,
    pool: SharedPool<StackBlock>,
}

impl Default for MmapStacks {
    fn default() -> Self {
        MmapStacks {
            size: crate::DEFAULT_STACK_SIZE,
            pool: SharedPool::new(0),
        }
    }
}

/// A stack of [`MmapStacks`] (a pointer to its header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapStackHandle(NonNull<StackBlock>);

/// A worker's cache of free [`MmapStacks`] stacks.
#[derive(Debug)]
pub struct MmapStackCache(LocalPool<StackBlock>);

impl MmapStacks {
    #[cold]
    #[inline(never)]
    fn take_slow(&self, w: usize, local: &mut MmapStackCache) -> Result<MmapStackHandle> {
        match local.0.take(self.pool.remote(w)) {
            Some(s) => Ok(MmapStackHandle(s)),
            None => StackBlock::create(self.size, w).map(MmapStackHandle),
        }
    }

    #[cold]
    fn take_global(&self) -> Result<MmapStackHandle> {
        match self.pool.take_global() {
            Some(s) => Ok(MmapStackHandle(s)),
            None => StackBlock::create(self.size, GLOBAL).map(MmapStackHandle),
        }
    }
}

// SAFETY: every handle points to the header of a live `MmapStack` mapping
// whose region below the header is read-write, owned by the block and handed
// to one thread at a time (free blocks sit only in the pools). A block that
// is never given back keeps its mapping (it is only unmapped by `destroy`).
unsafe impl StackSource for MmapStacks {
    type Stack = MmapStackHandle;
    type Local = MmapStackCache;

    fn init(&mut self, stack_size: usize, workers: usize) -> Result<()> {
        if stack_size < MmapStack::MIN_SIZE {
            return Err(Error::InvalidStackSize(stack_size.to_string()));
        }
        self.size = stack_size;
        self.pool = SharedPool::new(workers);
        ct_context::trap::set_overflow_hint(OVERFLOW_HINT);
        // Check that such a stack can be mapped now rather than at the first
        // spawn; it becomes the first cached stack.
        let probe = StackBlock::create(stack_size, GLOBAL)?;
        // SAFETY: the fresh block is unused and owned by the global cache.
        unsafe { self.pool.free(probe, None) };
        Ok(())
    }

    fn local(&self, _worker: usize) -> MmapStackCache {
        MmapStackCache(LocalPool::new())
    }

    #[inline]
    fn take(&self, at: Option<(usize, &mut MmapStackCache)>) -> Result<MmapStackHandle> {
        match at {
            Some((w, local)) => match local.0.pop_local() {
                Some(s) => Ok(MmapStackHandle(s)),
                None => self.take_slow(w, local),
            },
            None => self.take_global(),
        }
    }

    #[inline]
    unsafe fn give_back(&self, stack: MmapStackHandle, worker: usize, local: &mut MmapStackCache) {
        if <StackBlock as PoolItem>::owner(stack.0) == worker {
            local.0.put_local(stack.0);
        } else {
            // SAFETY: the block is free (the contract) and passes to its
            // owner's remote list or the global cache.
            unsafe { self.pool.free(stack.0, None) };
        }
    }

    #[inline]
    fn region(stack: MmapStackHandle) -> StackRegion {
        StackBlock::region(stack.0)
    }

    fn clear_local(&self, _worker: usize, local: &mut MmapStackCache) {
        local.0.clear();
    }
}

/// A stack of [`MmapStacks`]: an [`MmapStack`] with this header written at
/// its top.
#[derive(Debug)]
pub(crate) struct StackBlock {
    next: *mut StackBlock,
    owner: usize,
    region: StackRegion,
    mem: ManuallyDrop<MmapStack>,
}

// SAFETY: `next` is a field of the block.
unsafe impl Linked for StackBlock {
    fn link(this: *mut Self) -> *mut *mut Self {
        // SAFETY: `this` is a valid block per the caller.
        unsafe { &raw mut (*this).next }
    }
}

// SAFETY: `owner` is set at creation; `destroy` unmaps the block's own stack.
unsafe impl PoolItem for StackBlock {
    fn owner(this: NonNull<Self>) -> usize {
        // SAFETY: pooled blocks are valid.
        unsafe { this.as_ref().owner }
    }

    unsafe fn destroy(this: NonNull<Self>) {
        // SAFETY: move the mapping out of the block that lives inside it, then
        // unmap it; the block is not touched afterwards.
        let mem = unsafe { ptr::read(&this.as_ref().mem) };
        drop(ManuallyDrop::into_inner(mem));
    }
}

impl StackBlock {
    /// Maps a new stack of `size` usable bytes owned by `owner`.
    fn create(size: usize, owner: usize) -> Result<NonNull<StackBlock>> {
        let mem = MmapStack::new(size).map_err(Error::Stack)?;
        let (slot, region) = mem
            .region()
            .carve_top(size_of::<StackBlock>(), align_of::<StackBlock>())
            .ok_or(Error::StackTooSmall { requested: size })?;
        let block = slot as *mut StackBlock;
        // SAFETY: `slot` is aligned memory at the top of the mapping we own.
        unsafe {
            block.write(StackBlock {
                next: ptr::null_mut(),
                owner,
                region,
                mem: ManuallyDrop::new(mem),
            });
            Ok(NonNull::new_unchecked(block))
        }
    }

    /// The usable stack below the header.
    #[inline]
    fn region(this: NonNull<Self>) -> StackRegion {
        // SAFETY: handed-out and pooled blocks are valid.
        unsafe { this.as_ref().region }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_hint_names_the_knobs_and_the_default() {
        let hint = OVERFLOW_HINT.to_str().unwrap();
        assert!(hint.contains("CT_STACK_SIZE"), "{hint}");
        assert!(hint.contains("Builder::stack_size"), "{hint}");
        let default = format!("default {}k", crate::DEFAULT_STACK_SIZE / 1024);
        assert!(hint.contains(&default), "{hint}");
    }

    #[test]
    fn building_the_default_source_sets_the_hint() {
        let mut s = MmapStacks::default();
        s.init(64 * 1024, 1).unwrap();
        assert_eq!(ct_context::trap::overflow_hint(), Some(OVERFLOW_HINT));
    }
}
