//! The table of windows every backend keeps: a fixed number of slots, one
//! per window id, that never move or shrink, so that resolving a
//! [`RemotePtr`] costs one acquire load of the slot's state and a bounds
//! check, without locks or reference counting.
//!
//! A slot goes from unused to live ([`Slot::publish`]) to destroyed
//! ([`Slot::retire`]) once; ids are never reused. Besides this process's
//! part of the window, a slot holds what the backend needs to reach the
//! other processes' parts (`X`: addresses, MPI handles, remote keys).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use super::{Error, LocalWindow, RemotePtr, Result, WindowId, check};

/// Most windows a job can create over its lifetime.
pub const MAX_WINDOWS: usize = 4096;

// Slot states: 0 = never used (the default), then LIVE, then DESTROYED.
const LIVE: u8 = 1;
const DESTROYED: u8 = 2;

/// One window of the table.
#[derive(Default)]
pub(crate) struct Slot<X> {
    state: AtomicU8,
    /// This process's part.
    base: AtomicUsize,
    /// Bytes of every process's part.
    size: AtomicUsize,
    /// What the backend needs to reach the parts of the other processes;
    /// written before [`Slot::publish`].
    pub(crate) extra: X,
}

impl<X> Slot<X> {
    /// Bytes of every process's part.
    #[inline]
    pub(crate) fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// This process's part.
    pub(crate) fn base(&self) -> usize {
        self.base.load(Ordering::Relaxed)
    }

    /// Makes the window live, with this process's part of `size` bytes at
    /// `base`; everything written to the slot before is seen by whoever
    /// finds it live.
    ///
    /// # Safety
    /// `base..base + size` must be this process's part of the window and
    /// follow the rules of [`Windows`](super::Windows) (page-aligned shared
    /// mapping unless `size` is 0, kept reserved after destruction), as
    /// [`LocalWindow::from_raw`] requires.
    pub(crate) unsafe fn publish(&self, base: usize, size: usize) {
        self.base.store(base, Ordering::Relaxed);
        self.size.store(size, Ordering::Relaxed);
        self.state.store(LIVE, Ordering::Release);
    }

    /// Marks the window destroyed; whether it was live.
    pub(crate) fn retire(&self) -> bool {
        self.state.swap(DESTROYED, Ordering::AcqRel) == LIVE
    }

    #[inline]
    fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) == LIVE
    }
}

/// The table: [`MAX_WINDOWS`] slots.
pub(crate) struct WindowSlots<X> {
    slots: Box<[Slot<X>]>,
}

impl<X: Default> WindowSlots<X> {
    /// A table of unused slots.
    pub(crate) fn new() -> Self {
        WindowSlots {
            slots: (0..MAX_WINDOWS).map(|_| Slot::default()).collect(),
        }
    }
}

#[cold]
fn unknown(window: u32) -> Error {
    Error::UnknownWindow { window }
}

impl<X> WindowSlots<X> {
    /// `Ok` if a new window may get id `id` (one of the first
    /// [`MAX_WINDOWS`]), else [`Error::BadConfig`].
    pub(crate) fn check_new(&self, id: u32) -> Result<()> {
        if id as usize >= self.slots.len() {
            return Err(Error::BadConfig(format!(
                "too many windows: a job can create at most {MAX_WINDOWS}"
            )));
        }
        Ok(())
    }

    /// The slot of window `id`, live or not (ids below [`MAX_WINDOWS`],
    /// checked at creation).
    pub(crate) fn slot(&self, id: u32) -> &Slot<X> {
        &self.slots[id as usize]
    }

    /// Whether window `id` is live.
    pub(crate) fn is_live(&self, id: u32) -> bool {
        self.slots.get(id as usize).is_some_and(Slot::is_live)
    }

    /// Whether window `id` (below [`MAX_WINDOWS`]) was never made live here:
    /// a window another process may have created already while this one is
    /// still creating it.
    #[cfg(feature = "mpi")]
    pub(crate) fn is_unborn(&self, id: u32) -> bool {
        self.slots
            .get(id as usize)
            .is_some_and(|s| s.state.load(Ordering::Acquire) == 0)
    }

    /// The slot of live window `id`, else [`Error::UnknownWindow`].
    #[inline]
    pub(crate) fn live(&self, id: WindowId) -> Result<&Slot<X>> {
        match self.slots.get(id.0 as usize) {
            Some(s) if s.is_live() => Ok(s),
            _ => Err(unknown(id.0)),
        }
    }

    /// The slot of `p`'s window, after checking window, rank (of `nprocs`)
    /// and the bounds of an access of `len` bytes, in this order on every
    /// backend, so that the same misuse gives the same error.
    #[inline]
    pub(crate) fn access(&self, p: RemotePtr, len: usize, nprocs: usize) -> Result<&Slot<X>> {
        let s = self.live(p.window())?;
        check::rank(p.rank(), nprocs)?;
        check::bounds(p.window().0, p.offset(), len, s.size())?;
        Ok(s)
    }

    /// This process's part of live window `id`.
    pub(crate) fn local_window(&self, id: WindowId) -> Result<LocalWindow> {
        let s = self.live(id)?;
        // SAFETY: the part was published with the guarantees
        // `LocalWindow::from_raw` needs (see `Slot::publish`).
        Ok(unsafe { LocalWindow::from_raw(id, s.base() as *mut u8, s.size()) })
    }

    /// Bytes of every process's part of live window `id`.
    pub(crate) fn window_size(&self, id: WindowId) -> Result<usize> {
        Ok(self.live(id)?.size())
    }

    /// What this process says it destroys in a collective
    /// `destroy_window(id)`: the id if the window is live here, else
    /// `u64::MAX`.
    pub(crate) fn destroy_claim(&self, id: WindowId) -> u64 {
        if self.is_live(id.0) {
            u64::from(id.0)
        } else {
            u64::MAX
        }
    }
}

/// Word `i` (little-endian) of `b`: the collectives that create and destroy
/// windows exchange such words.
pub(crate) fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}

/// What a process says in a collective `create_window`: the id it expects
/// the window to get and the size it asks for.
pub(crate) fn create_claim(id: u32, bytes: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&u64::from(id).to_le_bytes());
    b[8..].copy_from_slice(&(bytes as u64).to_le_bytes());
    b
}

/// Checks the allgathered [`create_claim`]s of every process against this
/// one's (process `me`, window `id` of `bytes` bytes):
/// [`Error::CollectiveMismatch`] unless every process creates the same
/// window.
pub(crate) fn check_create_claims(all: &[u8], me: usize, id: u32, bytes: usize) -> Result<()> {
    for r in 0..all.len() / 16 {
        let (rid, rbytes) = (u64_at(all, 2 * r), u64_at(all, 2 * r + 1));
        if rid != u64::from(id) || rbytes != bytes as u64 {
            return Err(Error::CollectiveMismatch(format!(
                "create_window: rank {r} asked for window {rid} of {rbytes} bytes, rank {me} for \
                 window {id} of {bytes} bytes (every process must create the same windows in \
                 the same order)"
            )));
        }
    }
    Ok(())
}
