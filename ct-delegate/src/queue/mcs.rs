//! The MCS-list delegation queue.

use core::ptr::{self, NonNull};

use crossbeam_utils::CachePadded;

use super::{DelegationQueue, Enqueued};
use crate::sync::{AtomicPtr, Ordering, ProtocolCell};

struct ListNode<E> {
    next: AtomicPtr<ListNode<E>>,
    /// The predecessor, kept from enqueue to publish.
    prev: ProtocolCell<*mut ListNode<E>>,
    /// Written before the node is published, read by holders after
    /// (loom-checked).
    entry: ProtocolCell<E>,
}

/// Handle of an [`McsQueue`] entry.
pub struct NodeRef<E>(NonNull<ListNode<E>>);

impl<E> Clone for NodeRef<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for NodeRef<E> {}
impl<E> PartialEq for NodeRef<E> {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0
    }
}
impl<E> core::fmt::Debug for NodeRef<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "NodeRef({:p})", self.0)
    }
}
// SAFETY: a handle is a pointer passed along the queue protocol, which gives
// one thread at a time the right to use the node.
unsafe impl<E: Send> Send for NodeRef<E> {}

/// An MCS list of entries: unbounded and FIFO. Each entry is a node allocated
/// when it is enqueued (from `ct-sync`'s per-thread block cache when small
/// enough) and freed when the holder moves past it.
pub struct McsQueue<E> {
    tail: CachePadded<AtomicPtr<ListNode<E>>>,
}

// SAFETY: entries move between threads only through the queue protocol.
unsafe impl<E: Send> Send for McsQueue<E> {}
// SAFETY: as above.
unsafe impl<E: Send> Sync for McsQueue<E> {}

impl<E> core::fmt::Debug for McsQueue<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("McsQueue")
            .field("locked", &!self.tail.load(Ordering::Relaxed).is_null())
            .finish()
    }
}

const fn pooled<E>() -> bool {
    !cfg!(loom)
        && size_of::<ListNode<E>>() <= ct_sync::node_pool::BLOCK_SIZE
        && align_of::<ListNode<E>>() <= 16
}

fn alloc<E>(entry: E) -> NonNull<ListNode<E>> {
    let node = ListNode {
        next: AtomicPtr::new(ptr::null_mut()),
        prev: ProtocolCell::new(ptr::null_mut()),
        entry: ProtocolCell::new(entry),
    };
    if pooled::<E>() {
        let p = ct_sync::node_pool::take().cast::<ListNode<E>>();
        // SAFETY: the block is large and aligned enough (`pooled`).
        unsafe { p.as_ptr().write(node) };
        p
    } else {
        NonNull::from(Box::leak(Box::new(node)))
    }
}

/// Frees a node, returning its entry.
///
/// # Safety
///
/// `p` must come from `alloc` and be used by nobody else.
unsafe fn free<E>(p: NonNull<ListNode<E>>) -> E {
    if pooled::<E>() {
        // SAFETY: per the contract; the entry is moved out and the block
        // returned.
        unsafe {
            let node = ptr::read(p.as_ptr());
            ct_sync::node_pool::put(p.cast());
            node.entry.into_inner()
        }
    } else {
        // SAFETY: per the contract, a leaked box.
        unsafe { Box::from_raw(p.as_ptr()) }.entry.into_inner()
    }
}

// SAFETY: the tail swap linearises arrivals (FIFO); a queued node becomes
// visible to its predecessor's holder only through the release store of
// `publish`; nodes are freed only by the holder moving past them.
unsafe impl<E: Send + 'static> DelegationQueue<E> for McsQueue<E> {
    type Handle = NodeRef<E>;

    fn new() -> Self {
        McsQueue {
            tail: CachePadded::new(AtomicPtr::new(ptr::null_mut())),
        }
    }

    #[inline]
    fn try_acquire(&self, entry: E) -> Result<NodeRef<E>, E> {
        if !self.tail.load(Ordering::Relaxed).is_null() {
            return Err(entry);
        }
        let node = alloc(entry);
        match self.tail.compare_exchange(
            ptr::null_mut(),
            node.as_ptr(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(NodeRef(node)),
            // SAFETY: the node never entered the queue.
            Err(_) => Err(unsafe { free(node) }),
        }
    }

    #[inline]
    fn enqueue(&self, entry: E) -> Result<Enqueued<NodeRef<E>>, E> {
        let node = alloc(entry);
        let prev = self.tail.swap(node.as_ptr(), Ordering::AcqRel);
        if prev.is_null() {
            return Ok(Enqueued::Acquired(NodeRef(node)));
        }
        // SAFETY: the node is ours until published.
        unsafe { node.as_ref().prev.with_mut(|p| *p = prev) };
        Ok(Enqueued::Queued(NodeRef(node)))
    }

    #[inline]
    unsafe fn publish(&self, h: NodeRef<E>) {
        // SAFETY: the predecessor stays alive until its holder sees this link.
        unsafe {
            let prev = h.0.as_ref().prev.with(|p| *p);
            (*prev).next.store(h.0.as_ptr(), Ordering::Release);
        }
    }

    #[inline]
    unsafe fn entry(&self, h: NodeRef<E>) -> &E {
        // SAFETY: per the contract the node is alive, and its entry is only
        // read from now on.
        unsafe { h.0.as_ref().entry.with(|p| &*p) }
    }

    #[inline]
    unsafe fn next(&self, head: NodeRef<E>) -> Option<NodeRef<E>> {
        // SAFETY: the holder's node is alive.
        NonNull::new(unsafe { head.0.as_ref().next.load(Ordering::Acquire) }).map(NodeRef)
    }

    #[inline]
    unsafe fn advance(&self, head: NodeRef<E>, _next: NodeRef<E>) {
        // SAFETY: nobody refers to the old head once the lock moved on.
        drop(unsafe { free(head.0) });
    }

    #[inline]
    unsafe fn try_unlock(&self, head: NodeRef<E>) -> bool {
        let ok = self
            .tail
            .compare_exchange(
                head.0.as_ptr(),
                ptr::null_mut(),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok();
        if ok {
            // SAFETY: the queue is empty; nobody refers to the head.
            drop(unsafe { free(head.0) });
        }
        ok
    }

    #[inline]
    fn is_locked(&self) -> bool {
        !self.tail.load(Ordering::Relaxed).is_null()
    }
}
