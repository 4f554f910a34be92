//! A thread-safe pool that reuses `mmap`'d stacks.

use std::sync::{Arc, Mutex, OnceLock};

use super::{DEFAULT_STACK_SIZE, MmapStack, Stack, StackRegion};
use crate::error::Result;

#[derive(Debug)]
struct PoolInner {
    stack_size: usize,
    guard_pages: usize,
    max_cached: usize,
    cached: Mutex<Vec<MmapStack>>,
}

/// A pool of [`MmapStack`]s of one size.
///
/// Creating an `MmapStack` costs an `mmap`, an `mprotect` and a `munmap` when it
/// is dropped (about 15 µs); taking one from the pool costs a lock and a vector
/// pop. A [`PooledStack`] goes back to its pool when dropped, unless the pool
/// already caches `max_cached` stacks, in which case it is unmapped.
///
/// Cloning a `StackPool` gives another handle to the same pool. User-level
/// thread schedulers keep per-worker pools on top of this (see `ct-worker`).
#[derive(Debug, Clone)]
pub struct StackPool {
    inner: Arc<PoolInner>,
}

impl StackPool {
    /// A pool of stacks with `stack_size` usable bytes and one guard page that
    /// caches at most 1024 free stacks.
    pub fn new(stack_size: usize) -> Result<Self> {
        Self::with_options(stack_size, 1, 1024)
    }

    /// A pool with explicit guard-page count and cache limit. Fails if an
    /// `MmapStack` of these parameters cannot be built (the first one is created
    /// eagerly to check).
    pub fn with_options(stack_size: usize, guard_pages: usize, max_cached: usize) -> Result<Self> {
        let first = MmapStack::with_guard_pages(stack_size, guard_pages)?;
        let pool = Self {
            inner: Arc::new(PoolInner {
                stack_size,
                guard_pages,
                max_cached,
                cached: Mutex::new(Vec::new()),
            }),
        };
        pool.put(first);
        Ok(pool)
    }

    /// The process-wide pool of [`DEFAULT_STACK_SIZE`] stacks used by
    /// [`crate::Coroutine::new`].
    pub fn global() -> &'static StackPool {
        static GLOBAL: OnceLock<StackPool> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            StackPool::new(DEFAULT_STACK_SIZE).expect("cannot map the default coroutine stack")
        })
    }

    /// The usable size requested for this pool's stacks.
    pub fn stack_size(&self) -> usize {
        self.inner.stack_size
    }

    /// Number of free stacks currently cached.
    pub fn cached(&self) -> usize {
        self.lock().len()
    }

    /// Takes a stack from the pool, mapping a new one if the pool is empty.
    pub fn get(&self) -> Result<PooledStack> {
        let cached = self.lock().pop();
        let stack = match cached {
            Some(s) => s,
            None => MmapStack::with_guard_pages(self.inner.stack_size, self.inner.guard_pages)?,
        };
        Ok(PooledStack {
            stack: Some(stack),
            pool: self.clone(),
        })
    }

    fn put(&self, stack: MmapStack) {
        let mut cached = self.lock();
        if cached.len() < self.inner.max_cached {
            cached.push(stack);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<MmapStack>> {
        // A panic while holding this lock cannot leave the vector inconsistent.
        self.inner.cached.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A stack borrowed from a [`StackPool`]; returns to the pool when dropped.
#[derive(Debug)]
pub struct PooledStack {
    stack: Option<MmapStack>,
    pool: StackPool,
}

impl PooledStack {
    /// Takes the stack out of the pool's custody: it will be unmapped, not
    /// returned, when dropped.
    pub fn into_inner(mut self) -> MmapStack {
        self.stack.take().expect("present until drop")
    }

    fn stack(&self) -> &MmapStack {
        self.stack.as_ref().expect("present until drop")
    }

    /// Whether an overflow into this stack's guard page will be reported.
    pub fn overflow_detected(&self) -> bool {
        self.stack().overflow_detected()
    }
}

// SAFETY: delegates to the owned `MmapStack`, which lives as long as `self`.
unsafe impl Stack for PooledStack {
    fn region(&self) -> StackRegion {
        self.stack().region()
    }
}

impl Drop for PooledStack {
    fn drop(&mut self) {
        if let Some(stack) = self.stack.take() {
            self.pool.put(stack);
        }
    }
}
