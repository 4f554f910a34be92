//! Global variables that live in the DSM, declared with
//! [`dsm_global!`](crate::dsm_global).
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! use menps_dsm::dsm::Dsm;
//! use menps_dsm::com::ShmCom;
//! use ct_worker::OsThreads;
//!
//! menps_dsm::dsm_global! {
//!     /// Incremented by every process.
//!     static COUNTER: u64 = 0;
//!     static TABLE: [u32; 4] = [1, 2, 3, 4];
//! }
//!
//! let com: ShmCom<OsThreads> = menps_dsm::launch::init_or_relaunch(2)?;
//! let dsm: Dsm<_> = Dsm::new(com)?;
//! let counter: *mut u64 = COUNTER.get(&dsm);
//! if dsm.rank() == 0 {
//!     // SAFETY: DSM memory only process 0 writes before the barrier.
//!     unsafe { *counter += 1 };
//! }
//! dsm.barrier()?;
//! // SAFETY: written before the barrier.
//! assert_eq!(unsafe { *counter }, 1);
//! dsm.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How it works
//!
//! Every declaration registers its handle in a link-time list (a `linkme`
//! distributed slice). At start-up [`Dsm::with_config`] lays the globals
//! out in the list's order — the same in every process, which runs the same
//! binary (checked: processes whose lists differ fail to start) — creates a
//! segment for them collectively in a reserved slot (4 KiB blocks), has
//! process 0 write the initial values, and ends with a DSM barrier, so every
//! process sees the initial values.
//!
//! # Rules
//!
//! - A global's address ([`DsmGlobal::get`]) is the same in every process
//!   and valid while the DSM lives (from [`Dsm::with_config`] to
//!   [`Dsm::finalize`]); a new DSM in the same process gets the same
//!   address, with the initial value again.
//! - Initial values are constant expressions of a `Copy + 'static` type.
//! - Access is through the raw pointer under the DSM's rules (release
//!   consistency): synchronise (barrier, DSM mutex, acquire/release
//!   atomics) between conflicting accesses by different processes, as for
//!   any DSM memory. A value that a process stores must make sense in the
//!   other processes (plain data, DSM addresses, addresses of statics —
//!   never pointers to process-local heap memory).

use core::alloc::Layout;
use core::sync::atomic::{AtomicUsize, Ordering};

use ct_worker::UltItf;

use crate::com::Communicator;

use super::config::MIN_BLOCK_SIZE;
use super::error::{DsmError, DsmResult};
use super::layout;
use super::memory::map::{RegionKind, Request};
use super::space::{Init, Space};
use super::{Dsm, fingerprint};

#[doc(hidden)]
pub mod __private {
    pub use linkme;
}

/// Every global declared with [`dsm_global!`](crate::dsm_global) in the
/// program (filled in by the linker).
#[doc(hidden)]
#[linkme::distributed_slice]
pub static DSM_GLOBALS: [&'static dyn GlobalSlot];

/// The type-erased view of a [`DsmGlobal`] that the start-up code lays out.
///
/// # Safety
/// `layout` must describe the value `write_initial` writes.
#[doc(hidden)]
pub unsafe trait GlobalSlot: Sync {
    /// Size and alignment of the value.
    fn layout(&self) -> Layout;
    /// Name of the value's type (for the agreement check).
    fn type_name(&self) -> &'static str;
    /// Records the global's offset in the globals segment.
    fn set_offset(&self, offset: usize);
    /// Writes the initial value at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `layout().size()` bytes and
    /// aligned to `layout().align()`.
    unsafe fn write_initial(&self, dst: *mut u8);
}

/// Offset of a global not laid out (yet).
const UNSET: usize = usize::MAX;

/// The handle of a global that lives in the DSM (declare it with
/// [`dsm_global!`](crate::dsm_global)); [`DsmGlobal::get`] gives its
/// address.
pub struct DsmGlobal<T: Copy + 'static> {
    init: T,
    offset: AtomicUsize,
}

// SAFETY: the handle holds the initial value, which is only ever copied
// out by value (never referenced mutably or handed out by reference), and
// an atomic offset; sharing the handle between threads shares nothing else.
unsafe impl<T: Copy + 'static> Sync for DsmGlobal<T> {}

impl<T: Copy + 'static> DsmGlobal<T> {
    /// A handle with initial value `init`. Use
    /// [`dsm_global!`](crate::dsm_global), which also registers it: an
    /// unregistered handle has no address.
    #[doc(hidden)]
    pub const fn new(init: T) -> Self {
        DsmGlobal {
            init,
            offset: AtomicUsize::new(UNSET),
        }
    }

    /// The global's address in the DSM, the same in every process.
    ///
    /// # Panics
    /// If the global was not declared with
    /// [`dsm_global!`](crate::dsm_global) (see [`DsmGlobal::try_get`]).
    pub fn get<C: Communicator + 'static, U: UltItf>(&self, dsm: &Dsm<C, U>) -> *mut T {
        self.try_get(dsm).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`DsmGlobal::get`], with an error for a handle that was not
    /// registered.
    pub fn try_get<C: Communicator + 'static, U: UltItf>(
        &self,
        dsm: &Dsm<C, U>,
    ) -> DsmResult<*mut T> {
        let off = self.offset.load(Ordering::Acquire);
        if off == UNSET || !dsm.mem.globals {
            return Err(DsmError::Misuse(format!(
                "a DSM global of type {} was not laid out (declare it with dsm_global!)",
                core::any::type_name::<T>()
            )));
        }
        Ok((globals_base() + off) as *mut T)
    }

    /// The initial value.
    pub fn initial_value(&self) -> T {
        self.init
    }
}

impl<T: Copy + 'static> core::fmt::Debug for DsmGlobal<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let off = self.offset.load(Ordering::Relaxed);
        let mut d = f.debug_struct("DsmGlobal");
        d.field("type", &core::any::type_name::<T>());
        if off != UNSET {
            d.field("addr", &((globals_base() + off) as *const T));
        }
        d.finish()
    }
}

// SAFETY: `layout` is the layout of `T`, the type `write_initial` writes.
unsafe impl<T: Copy + 'static> GlobalSlot for DsmGlobal<T> {
    fn layout(&self) -> Layout {
        Layout::new::<T>()
    }

    fn type_name(&self) -> &'static str {
        core::any::type_name::<T>()
    }

    fn set_offset(&self, offset: usize) {
        self.offset.store(offset, Ordering::Release);
    }

    unsafe fn write_initial(&self, dst: *mut u8) {
        // SAFETY: the caller passes memory valid and aligned for a `T`.
        unsafe { dst.cast::<T>().write(self.init) };
    }
}

/// Declares globals that live in the DSM, one `static` per item:
///
/// ```
/// menps_dsm::dsm_global! {
///     /// A counter every process updates under a DSM mutex.
///     pub static COUNTER: u64 = 0;
///     static POINTS: [(i32, i32); 3] = [(0, 0), (1, 2), (3, 4)];
/// }
/// ```
///
/// Each `static` is a [`DsmGlobal<T>`](crate::dsm::DsmGlobal) handle;
/// `NAME.get(&dsm)` is the global's address (a `*mut T`), the same in every
/// process, valid while the DSM lives. The initial value must be a constant
/// expression of a `Copy + 'static` type. See [`crate::dsm::globals`].
#[macro_export]
macro_rules! dsm_global {
    ($($(#[$attr:meta])* $vis:vis static $name:ident : $ty:ty = $init:expr ;)+) => {
        $(
            $(#[$attr])*
            $vis static $name: $crate::dsm::DsmGlobal<$ty> = {
                #[$crate::dsm::globals::__private::linkme::distributed_slice(
                    $crate::dsm::globals::DSM_GLOBALS
                )]
                #[linkme(crate = $crate::dsm::globals::__private::linkme)]
                static ENTRY: &'static dyn $crate::dsm::globals::GlobalSlot = &$name;
                $crate::dsm::DsmGlobal::new($init)
            };
        )+
    };
}

/// Offsets of values with `layouts`, laid out in order, and the total size.
pub(crate) fn layout_in_order(layouts: impl IntoIterator<Item = Layout>) -> (Vec<usize>, usize) {
    let mut end = 0usize;
    let offsets = layouts
        .into_iter()
        .map(|l| {
            let off = end.next_multiple_of(l.align());
            end = off + l.size();
            off
        })
        .collect();
    (offsets, end)
}

/// Lays out the registered globals, creates their segment and initialises
/// it (collective). Returns whether there are globals.
pub(crate) fn init<C: Communicator + 'static, U: UltItf>(space: &Space<C, U>) -> DsmResult<bool> {
    let slots: &[&'static dyn GlobalSlot] = &DSM_GLOBALS;
    let desc: String = slots
        .iter()
        .map(|s| {
            let l = s.layout();
            format!("{}:{}:{};", s.type_name(), l.size(), l.align())
        })
        .collect();
    let mine = fingerprint(&desc).to_le_bytes();
    let all = space.com.allgather(&mine)?;
    if all.chunks_exact(8).any(|c| c != mine) {
        return Err(DsmError::Config(
            "the processes declare different DSM globals (dsm_global!): they must run the same \
             program"
                .into(),
        ));
    }
    if slots.is_empty() {
        return Ok(false);
    }
    let (offsets, total) = layout_in_order(slots.iter().map(|s| s.layout()));
    let bs = MIN_BLOCK_SIZE.max(crate::sys::page_size());
    let size = total.next_multiple_of(bs).max(bs);
    let base = space
        .create_region(
            Ok(Request {
                kind: RegionKind::Globals,
                size,
                block_size: bs,
                at: None,
            }),
            Init::Zero,
        )?
        .base;
    debug_assert_eq!(base, globals_base());
    for (s, &off) in slots.iter().zip(&offsets) {
        s.set_offset(off);
    }
    if space.rank == 0 {
        for (s, &off) in slots.iter().zip(&offsets) {
            // SAFETY: `off` was laid out for `s.layout()` inside the new
            // segment (whose base is block-aligned, so `off`'s alignment is
            // the address's); nobody else accesses the segment before the
            // barrier below, and our writes fault into the DSM as usual.
            unsafe { s.write_initial((base + off) as *mut u8) };
        }
    }
    space.barrier()?;
    Ok(true)
}

/// Base address of the globals segment (fixed).
pub(crate) fn globals_base() -> usize {
    layout::segment_base(RegionKind::Globals.fixed_id().expect("a runtime region"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_order_and_alignment() {
        let (offs, total) = layout_in_order([
            Layout::new::<u8>(),
            Layout::new::<u64>(),
            Layout::new::<[u8; 3]>(),
            Layout::new::<u32>(),
            Layout::new::<()>(),
            Layout::from_size_align(64, 64).unwrap(),
        ]);
        assert_eq!(offs, [0, 8, 16, 20, 24, 64]);
        assert_eq!(total, 128);
        assert_eq!(layout_in_order([]), (vec![], 0));
    }
}
