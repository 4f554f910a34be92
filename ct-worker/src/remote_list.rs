//! A lock-free list that other threads push items onto and the owner takes
//! all at once: how pooled memory goes back to the worker that allocated it.
//!
//! Pushing is a Treiber-stack push. The owner never pops single items; it
//! swaps the whole list out, so there is no ABA problem.

use core::ptr;

use crate::sync::{AtomicPtr, Ordering};

/// An item that can sit in a [`RemoteList`]: it has a link field.
///
/// # Safety
///
/// `link` must return a pointer to a field of `*this` that nothing else uses
/// while the item is in a list.
pub(crate) unsafe trait Linked: Sized {
    /// The link field of `this`.
    fn link(this: *mut Self) -> *mut *mut Self;
}

/// A multi-producer, take-all list of `T`.
#[derive(Debug)]
pub(crate) struct RemoteList<T> {
    head: AtomicPtr<T>,
}

// SAFETY: the list only moves ownership of items between threads through
// atomic operations with release/acquire ordering.
unsafe impl<T> Send for RemoteList<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for RemoteList<T> {}

impl<T: Linked> RemoteList<T> {
    pub(crate) fn new() -> Self {
        RemoteList {
            head: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Pushes `item`, whose ownership passes to the list.
    ///
    /// # Safety
    ///
    /// `item` must be valid and owned by the caller, and not be in any list.
    pub(crate) unsafe fn push(&self, item: *mut T) {
        // SAFETY: a chain of one item; forwarded contract.
        unsafe { self.push_chain(item, item) }
    }

    /// Pushes the chain `first ..= last` (linked through their link fields;
    /// `last`'s link is overwritten) with one atomic operation; ownership of
    /// every item passes to the list.
    ///
    /// # Safety
    ///
    /// Every item of the chain must be valid, owned by the caller and in no
    /// list, and following the links from `first` must reach `last`.
    pub(crate) unsafe fn push_chain(&self, first: *mut T, last: *mut T) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: we own the chain until the CAS publishes it.
            unsafe { *T::link(last) = head };
            match self
                .head
                .compare_exchange_weak(head, first, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Whether the list looks empty (a hint).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed).is_null()
    }

    /// Takes every item; returns the first (follow the links to the rest).
    pub(crate) fn take_all(&self) -> *mut T {
        if self.head.load(Ordering::Relaxed).is_null() {
            return ptr::null_mut();
        }
        self.head.swap(ptr::null_mut(), Ordering::Acquire)
    }
}

/// Iterates over a chain returned by [`RemoteList::take_all`], reading each
/// link before yielding the item (so the caller may reuse or free it).
pub(crate) fn drain<T: Linked>(mut first: *mut T) -> impl Iterator<Item = *mut T> {
    core::iter::from_fn(move || {
        if first.is_null() {
            return None;
        }
        let item = first;
        // SAFETY: items taken from the list are owned by the taker and valid.
        first = unsafe { *T::link(item) };
        Some(item)
    })
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    struct Node {
        next: *mut Node,
        value: usize,
    }
    // SAFETY: `next` is a field of the node.
    unsafe impl Linked for Node {
        fn link(this: *mut Self) -> *mut *mut Self {
            // SAFETY: `this` is valid per the caller.
            unsafe { &raw mut (*this).next }
        }
    }

    /// Two producers push while the owner takes: every item arrives exactly once.
    #[test]
    fn loom_push_and_take_all() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let list = Arc::new(RemoteList::<Node>::new());
            let producers: Vec<_> = (0..2)
                .map(|i| {
                    let list = list.clone();
                    loom::thread::spawn(move || {
                        let n = Box::into_raw(Box::new(Node {
                            next: core::ptr::null_mut(),
                            value: 1 << i,
                        }));
                        // SAFETY: we own the fresh node.
                        unsafe { list.push(n) };
                    })
                })
                .collect();
            let mut seen = 0;
            let mut collect = |first: *mut Node| {
                for n in drain(first) {
                    // SAFETY: taken nodes are ours.
                    let n = unsafe { Box::from_raw(n) };
                    assert_eq!(seen & n.value, 0, "item seen twice");
                    seen |= n.value;
                }
            };
            collect(list.take_all());
            for p in producers {
                p.join().unwrap();
            }
            collect(list.take_all());
            assert_eq!(seen, 0b11, "every item arrives");
        });
    }
}
