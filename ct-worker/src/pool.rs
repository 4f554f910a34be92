//! Per-worker pools of stacks and task descriptors that return memory to
//! the worker that allocated it.
//!
//! Each pooled item remembers its owner. Freeing on the owner puts it on the
//! owner's local free list (no synchronisation); freeing anywhere else pushes
//! it onto the owner's [`RemoteList`], which the owner takes in one swap when
//! its local list runs dry. Items made outside any worker belong to the
//! runtime's global cache. Memory therefore never drifts to the workers that
//! happen to free it — the failure mode of naive per-thread pools under
//! thread migration.

use core::ptr::NonNull;
use std::sync::Mutex;

use crate::remote_list::{Linked, RemoteList, drain};

/// Owner tag of items that belong to the runtime's global cache.
pub(crate) const GLOBAL: usize = usize::MAX;

/// Free items a worker keeps locally before unmapping the excess.
pub(crate) const LOCAL_CAP: usize = 256;

/// A pooled item.
///
/// # Safety
///
/// `owner` and `destroy` must be sound for every item the pool hands out.
pub(crate) unsafe trait PoolItem: Linked {
    /// The worker that owns this item (or [`GLOBAL`]).
    fn owner(this: NonNull<Self>) -> usize;
    /// Frees the item for good.
    ///
    /// # Safety
    ///
    /// The item must be owned by the caller and unused.
    unsafe fn destroy(this: NonNull<Self>);
}

/// The owner's side of a pool: a free list touched only by the owning worker.
#[derive(Debug)]
pub(crate) struct LocalPool<T: PoolItem> {
    free: Vec<NonNull<T>>,
}

impl<T: PoolItem> LocalPool<T> {
    pub(crate) fn new() -> Self {
        LocalPool { free: Vec::new() }
    }

    /// Takes a free item from the local list only.
    #[inline]
    pub(crate) fn pop_local(&mut self) -> Option<NonNull<T>> {
        self.free.pop()
    }

    /// Takes a free item, refilling from the remote list if needed.
    #[inline]
    pub(crate) fn take(&mut self, remote: &RemoteList<T>) -> Option<NonNull<T>> {
        if let Some(p) = self.free.pop() {
            return Some(p);
        }
        for p in drain(remote.take_all()) {
            // SAFETY: items in our remote list are valid and now ours.
            let p = unsafe { NonNull::new_unchecked(p) };
            self.put_local(p);
        }
        self.free.pop()
    }

    /// Returns an item owned by this worker.
    #[inline]
    pub(crate) fn put_local(&mut self, p: NonNull<T>) {
        if self.free.len() < LOCAL_CAP {
            self.free.push(p);
        } else {
            // SAFETY: the item is free and ours.
            unsafe { T::destroy(p) };
        }
    }

    /// Frees everything (worker shutdown).
    pub(crate) fn clear(&mut self) {
        for p in self.free.drain(..) {
            // SAFETY: free items are ours and unused.
            unsafe { T::destroy(p) };
        }
    }
}

impl<T: PoolItem> Drop for LocalPool<T> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The shared side of every worker's pool plus the global cache.
#[derive(Debug)]
pub(crate) struct SharedPool<T: PoolItem> {
    remote: Vec<crossbeam_utils::CachePadded<RemoteList<T>>>,
    global: Mutex<Vec<NonNull<T>>>,
}

// SAFETY: items move between threads only through the remote lists' atomics
// or the global mutex.
unsafe impl<T: PoolItem> Send for SharedPool<T> {}
// SAFETY: as above.
unsafe impl<T: PoolItem> Sync for SharedPool<T> {}

impl<T: PoolItem> SharedPool<T> {
    pub(crate) fn new(workers: usize) -> Self {
        SharedPool {
            remote: (0..workers)
                .map(|_| crossbeam_utils::CachePadded::new(RemoteList::new()))
                .collect(),
            global: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn remote(&self, w: usize) -> &RemoteList<T> {
        &self.remote[w]
    }

    /// Takes an item from the global cache (used outside workers).
    pub(crate) fn take_global(&self) -> Option<NonNull<T>> {
        self.global.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Frees `p` from worker `current` (`None`: from outside any worker).
    ///
    /// # Safety
    ///
    /// `p` must be a free item of this pool, owned by the caller. If `current`
    /// is `Some(w)` the caller must be worker `w` and pass its local pool.
    pub(crate) unsafe fn free(&self, p: NonNull<T>, current: Option<(usize, &mut LocalPool<T>)>) {
        let owner = T::owner(p);
        match current {
            Some((w, local)) if w == owner => local.put_local(p),
            _ if owner == GLOBAL => {
                let mut g = self.global.lock().unwrap_or_else(|e| e.into_inner());
                if g.len() < LOCAL_CAP {
                    g.push(p);
                } else {
                    drop(g);
                    // SAFETY: the item is free and ours.
                    unsafe { T::destroy(p) };
                }
            }
            // SAFETY: ownership passes to the owner's remote list.
            _ => unsafe { self.remote[owner].push(p.as_ptr()) },
        }
    }
}

impl<T: PoolItem> Drop for SharedPool<T> {
    fn drop(&mut self) {
        for list in &self.remote {
            for p in drain(list.take_all()) {
                // SAFETY: at runtime teardown every listed item is free.
                unsafe { T::destroy(NonNull::new_unchecked(p)) };
            }
        }
        for p in self
            .global
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: as above.
            unsafe { T::destroy(p) };
        }
    }
}
