//! Call stacks for contexts.
//!
//! A [`Stack`] owns (or borrows) a memory region that a context runs on. Three
//! implementations are provided:
//!
//! - [`MmapStack`]: an `mmap`'d stack with a guard page below it. Running off the
//!   end of it ends the process with `stack overflow in user-level thread`
//!   instead of silently corrupting memory (see [`crate::trap`]).
//! - [`RawStack`]: a stack in memory the caller provides (for example inside a
//!   DSM segment, so that the stack has the same address in every process).
//! - [`StackPool`] / [`PooledStack`]: reuse of `MmapStack`s, since creating one
//!   costs two system calls and a page fault per touched page.

mod mmap;
mod pool;
mod raw;

pub use mmap::MmapStack;
pub use pool::{PooledStack, StackPool};
pub use raw::RawStack;

/// Alignment of every stack top handed to a context policy.
pub const STACK_ALIGN: usize = 16;

/// The default usable size of a stack: 256 KiB.
///
/// Large enough for ordinary Rust code in debug builds; user-level thread
/// runtimes that create millions of threads pick smaller stacks explicitly.
pub const DEFAULT_STACK_SIZE: usize = 256 * 1024;

/// Returns the system page size.
pub fn page_size() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let p = PAGE.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let p = if p > 0 { p as usize } else { 4096 };
    PAGE.store(p, Ordering::Relaxed);
    p
}

/// The usable address range of a stack: `bottom .. top`, growing down from `top`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackRegion {
    top: usize,
    bottom: usize,
}

impl StackRegion {
    /// Describes the range `bottom .. top`. `top` is aligned down to
    /// [`STACK_ALIGN`]; returns `None` if the range is empty or inverted.
    pub fn new(bottom: usize, top: usize) -> Option<Self> {
        let top = top & !(STACK_ALIGN - 1);
        (bottom != 0 && top > bottom).then_some(Self { top, bottom })
    }

    /// The highest address (exclusive); the stack grows down from here.
    #[inline]
    pub fn top(&self) -> usize {
        self.top
    }

    /// The lowest usable address.
    #[inline]
    pub fn bottom(&self) -> usize {
        self.bottom
    }

    /// Usable size in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.top - self.bottom
    }

    /// Whether the region is empty (never true for a region built by [`StackRegion::new`]).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.top == self.bottom
    }

    /// Whether `addr` lies inside the region.
    #[inline]
    pub fn contains(&self, addr: usize) -> bool {
        (self.bottom..self.top).contains(&addr)
    }

    /// Splits off `size` bytes aligned to `align` at the top of the region and
    /// returns a pointer to them and the remaining region below (its top aligned
    /// to [`STACK_ALIGN`]). Returns `None` if the region is too small.
    pub fn carve_top(&self, size: usize, align: usize) -> Option<(*mut u8, StackRegion)> {
        let align = align.max(1);
        let start = self.top.checked_sub(size)? & !(align - 1);
        if start < self.bottom {
            return None;
        }
        let rest = StackRegion::new(self.bottom, start)?;
        Some((start as *mut u8, rest))
    }
}

/// Memory a context can run on.
///
/// # Safety
///
/// [`Stack::region`] must describe memory that is readable and writable, is not
/// used for anything else while a context runs on it, and stays valid for as
/// long as the implementor is alive. The region must not change over the
/// implementor's lifetime.
pub unsafe trait Stack {
    /// The usable memory of this stack.
    fn region(&self) -> StackRegion;
}
