//! Windows on MPI, in a fixed table so that resolving a [`RemotePtr`] costs
//! a few loads and a bounds check, as on shm.
//!
//! Every window's local part is page-aligned, a whole number of pages and a
//! `MAP_SHARED` mapping — the guarantee of [`Windows`], which the DSM needs
//! to map a segment's pages a second time as its application view — made in
//! one of two ways ([`WindowFlavor`]):
//!
//! - [`WindowFlavor::Shared`] (every process on one machine, `osc sm`):
//!   `MPI_Win_allocate_shared`, asking for one page more than needed. `osc
//!   sm` puts each part at an arbitrary offset in its shared segment (0x108
//!   into a page with OpenMPI 4.1); the local part we expose starts at the
//!   first page boundary inside the allocation. Every process publishes that
//!   distance (allgather at creation), and RMA adds the target's distance to
//!   the offset, so that offset 0 of rank `r` is the first byte of `r`'s
//!   local part.
//! - [`WindowFlavor::Created`] (any number of machines, `osc ucx`): a
//!   `memfd` of our own mapped `MAP_SHARED` (page-aligned and zero-filled by
//!   construction), registered with `MPI_Win_create`; offsets need no
//!   translation. (`MPI_Win_allocate` is no good here: `osc ucx` allocates
//!   private memory.)
//!
//! Both then get `MPI_Win_lock_all(MPI_MODE_NOCHECK)`: one passive-target
//! epoch for the window's life.
//!
//! Under served RMA (see `served`) no MPI one-sided operation is ever made,
//! so a [`WindowFlavor::Created`] window is our mapping alone: no
//! `MPI_Win_create` (a collective that duplicates the communicator and sets
//! up UCX endpoints), no epoch. Across 2 simulated hosts about one DSM job
//! in 300 on a quiet machine (more under load) sat for 10–80 s inside
//! `MPI_Win_create`'s communicator duplication (one process in
//! `ompi_comm_nextcid`, the other already past it), which served jobs no
//! longer enter.

use std::os::fd::AsFd;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock};

use ::mpi::ffi;
use ct_worker::UltItf;

use super::raw::{self, Handle};
use super::{MpiCom, coll};
use crate::com::slots::WindowSlots;
use crate::com::{Error, LocalWindow, RemotePtr, Result, WindowId, Windows};
use crate::sys::{self, Mapping};

/// How the `mpi` backend makes windows (`MENPS_MPI_WINDOWS`,
/// [`MpiConfig::windows`](super::MpiConfig::windows)). Either way the local
/// part is a page-aligned `MAP_SHARED` mapping and offset 0 of every rank is
/// the first byte of its local part, as [`Windows`] requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WindowFlavor {
    /// `MPI_Win_allocate_shared` (`osc sm`; every process must run on this
    /// machine), one page larger than needed: the local part starts at the
    /// first page boundary inside the allocation, and RMA adds the target's
    /// distance to it (exchanged at creation). The default on one machine.
    Shared,
    /// A `memfd` of our own mapped `MAP_SHARED`, registered with
    /// `MPI_Win_create` (`osc ucx`; any number of machines). The default
    /// across machines.
    Created,
}

impl WindowFlavor {
    /// Parses a `MENPS_MPI_WINDOWS` value: `shared`, `create` (or
    /// `created`); `auto` or empty is `None` (the backend chooses).
    pub fn parse(s: &str) -> Option<Option<Self>> {
        match s.trim() {
            "" | "auto" => Some(None),
            "shared" => Some(Some(WindowFlavor::Shared)),
            "create" | "created" => Some(Some(WindowFlavor::Created)),
            _ => None,
        }
    }
}

/// How RMA reaches a window's parts.
#[derive(Default)]
struct Target {
    win: OnceLock<Handle<ffi::MPI_Win>>,
    /// Per rank: the MPI displacement of the first byte of its local part.
    disp: OnceLock<Box<[ffi::MPI_Aint]>>,
}

/// A window as created: freed (collectively) with the communicator.
struct Created {
    id: u32,
    /// The MPI window (none under served RMA).
    win: Option<Handle<ffi::MPI_Win>>,
    /// The memory of a [`WindowFlavor::Created`] window.
    memory: Option<Mapping>,
}

pub(crate) struct WindowTable {
    slots: WindowSlots<Target>,
    /// Every window created (live or destroyed), in id order. Destroyed
    /// windows are freed with the communicator.
    created: Mutex<Vec<Created>>,
}

impl WindowTable {
    pub(crate) fn new() -> Self {
        WindowTable {
            slots: WindowSlots::new(),
            created: Mutex::new(Vec::new()),
        }
    }

    /// The window of `p` and the MPI displacement of `p` in its target,
    /// after checking window, rank and bounds of an access of `len` bytes
    /// (in the same order as shm, so that the same misuse gives the same
    /// error).
    #[inline]
    pub(crate) fn resolve(
        &self,
        p: RemotePtr,
        len: usize,
        nprocs: usize,
    ) -> Result<(ffi::MPI_Win, ffi::MPI_Aint)> {
        let s = self.slots.access(p, len, nprocs)?;
        let win = s.extra.win.get().expect("a live window has a handle").0;
        let start = s.extra.disp.get().expect("a live window has displacements")[p.rank()];
        Ok((win, start + p.offset() as ffi::MPI_Aint))
    }

    /// The address in this process of `len` bytes at `p`, which must be in
    /// this process's part of a live window (bounds checked).
    pub(crate) fn local_ptr(&self, p: RemotePtr, len: usize, nprocs: usize) -> Result<*mut u8> {
        let s = self.slots.access(p, len, nprocs)?;
        Ok((s.base() + p.offset() as usize) as *mut u8)
    }

    /// Whether window `id` was never made live in this process (see
    /// `WindowSlots::is_unborn`).
    pub(crate) fn is_unborn(&self, id: u32) -> bool {
        self.slots.is_unborn(id)
    }

    /// Runs `f` on every live window.
    pub(crate) fn for_each_live(
        &self,
        mut f: impl FnMut(ffi::MPI_Win) -> Result<()>,
    ) -> Result<()> {
        let created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        for c in created.iter() {
            if self.slots.is_live(c.id)
                && let Some(w) = &c.win
            {
                f(w.0)?;
            }
        }
        Ok(())
    }

    /// Frees every window (collective: all processes do it when their
    /// communicator is dropped, in the same id order).
    pub(crate) fn free_all(&self) {
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        for Created { id, win, memory } in created.drain(..) {
            let live = self.slots.slot(id).retire();
            if let Some(mut win) = win {
                if live {
                    // SAFETY: a live window in its lock_all epoch, no RMA in
                    // flight (the communicator is being dropped).
                    unsafe { ffi::MPI_Win_unlock_all(win.0) };
                }
                // SAFETY: our window, no longer used.
                unsafe { ffi::MPI_Win_free(&mut win.0) };
            }
            // Our own memory: released, its range kept reserved (stale
            // pointers fault).
            if let Some(m) = memory {
                m.retire();
            }
        }
    }
}

/// A freshly allocated window, before it is published.
struct NewWindow {
    /// The MPI window (none under served RMA).
    win: Option<ffi::MPI_Win>,
    /// The local part: page-aligned, `stride` bytes, zero-filled.
    part: *mut u8,
    /// MPI displacement of `part` in this process's part of `win`.
    disp: ffi::MPI_Aint,
    memory: Option<Mapping>,
    /// Why this process could not provide its memory (it then took part in
    /// the collective window creation with an empty part, so that nobody
    /// hangs; `create_window` undoes the window everywhere).
    failed: Option<Error>,
}

/// Zero-fills the fresh local part `part..part + len` (whole pages of a
/// shared mapping that nobody accesses yet) without touching every page: a
/// hole punched in the backing file (`MADV_REMOVE`; `osc sm` maps files in
/// `/dev/shm`) reads as zeros and costs nothing until written — the DSM's
/// segments are large (a 1 GiB heap by default) and mostly never touched.
/// Writes zeros where the file system cannot punch holes.
fn zero_fill(part: *mut u8, len: usize) {
    // SAFETY: `part..part + len` is page-aligned, whole pages of this
    // process's part of a shared window allocation, which nobody uses yet;
    // MADV_REMOVE only changes its contents to zeros.
    let punched = unsafe { libc::madvise(part.cast::<c_void>(), len, libc::MADV_REMOVE) } == 0;
    if !punched {
        // SAFETY: as above; the range is mapped read-write.
        unsafe { std::ptr::write_bytes(part, 0, len) };
    }
}

impl<U: UltItf> MpiCom<U> {
    /// Allocates, zero-fills and locks the MPI window with local parts of
    /// `stride` bytes (a multiple of the page size; the caller holds the
    /// collective lock and has agreed on `stride` with everyone).
    fn allocate_window(&self, stride: usize) -> Result<NewWindow> {
        let page = sys::page_size();
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        let mut failed = None;
        let (part, disp, memory) = match self.window_flavor {
            WindowFlavor::Shared => {
                let mut info = std::mem::MaybeUninit::<ffi::MPI_Info>::uninit();
                // SAFETY: out-parameter.
                raw::check("MPI_Info_create", unsafe {
                    ffi::MPI_Info_create(info.as_mut_ptr())
                })?;
                // SAFETY: MPI_Info_create succeeded.
                let mut info = unsafe { info.assume_init() };
                // Each part in its own pages (not packed after the previous
                // rank's).
                // SAFETY: a valid info object and NUL-terminated strings.
                raw::check("MPI_Info_set", unsafe {
                    ffi::MPI_Info_set(info, c"alloc_shared_noncontig".as_ptr(), c"true".as_ptr())
                })?;
                // One page more, so that a page-aligned part of `stride`
                // bytes fits wherever MPI puts the allocation.
                let ask = if stride == 0 { 0 } else { stride + page };
                let mut base: *mut u8 = std::ptr::null_mut();
                // SAFETY: `base` receives the address of the local part (a
                // pointer, as the `void *baseptr` parameter requires); `win`
                // is an out-parameter; the communicator is valid.
                let rc = unsafe {
                    ffi::MPI_Win_allocate_shared(
                        ask as ffi::MPI_Aint,
                        1,
                        info,
                        self.comms.coll.0,
                        (&mut base as *mut *mut u8).cast::<c_void>(),
                        win.as_mut_ptr(),
                    )
                };
                // SAFETY: our info object.
                unsafe { ffi::MPI_Info_free(&mut info) };
                raw::check("MPI_Win_allocate_shared", rc)?;
                if stride == 0 {
                    (NonNull::<u64>::dangling().as_ptr().cast::<u8>(), 0, None)
                } else {
                    if base.is_null() {
                        return Err(Error::Transport(
                            "MPI_Win_allocate_shared returned a null local part".into(),
                        ));
                    }
                    let skip = (base as usize).next_multiple_of(page) - base as usize;
                    // SAFETY: `skip < page`, so `base + skip .. + stride` lies
                    // inside the `stride + page` bytes MPI allocated.
                    (unsafe { base.add(skip) }, skip as ffi::MPI_Aint, None)
                }
            }
            WindowFlavor::Created => {
                let memory = if stride == 0 {
                    None
                } else {
                    // The mapping keeps the memory alive; the descriptor can
                    // go.
                    match sys::memfd(c"menps-mpi-window", stride)
                        .and_then(|fd| Mapping::shared(fd.as_fd(), stride))
                    {
                        Ok(m) => Some(m),
                        Err(e) => {
                            failed = Some(e);
                            None
                        }
                    }
                };
                let part = memory.as_ref().map_or(
                    NonNull::<u64>::dangling().as_ptr().cast::<u8>(),
                    Mapping::ptr,
                );
                if self.server.is_some() {
                    // Served RMA: our mapping is the whole window.
                    return Ok(NewWindow {
                        win: None,
                        part,
                        disp: 0,
                        memory,
                        failed,
                    });
                }
                let len = if memory.is_some() { stride } else { 0 };
                // SAFETY: `part` is our own mapping of `len` bytes (or
                // nothing), which stays mapped until after MPI_Win_free
                // (`free_all`, or `create_window` on failure); `win` is an
                // out-parameter; the communicator is valid.
                raw::check("MPI_Win_create", unsafe {
                    ffi::MPI_Win_create(
                        part.cast::<c_void>(),
                        len as ffi::MPI_Aint,
                        1,
                        ffi::RSMPI_INFO_NULL,
                        self.comms.coll.0,
                        win.as_mut_ptr(),
                    )
                })?;
                (part, 0, memory)
            }
        };
        // SAFETY: the allocation succeeded, so MPI wrote the handle.
        let win = unsafe { win.assume_init() };
        // SAFETY: our new window.
        raw::check("MPI_Win_set_errhandler", unsafe {
            ffi::MPI_Win_set_errhandler(win, raw::errors_return())
        })?;
        if stride > 0 && self.window_flavor == WindowFlavor::Shared {
            zero_fill(part, stride);
        }
        // SAFETY: a new window; NOCHECK is right since no process ever takes
        // an exclusive lock.
        raw::check("MPI_Win_lock_all", unsafe {
            ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, win)
        })?;
        Ok(NewWindow {
            win: Some(win),
            part,
            disp,
            memory,
            failed,
        })
    }
}

impl<U: UltItf> Windows for MpiCom<U> {
    fn create_window(&self, bytes: usize) -> Result<WindowId> {
        let mut st = self.coll.lock();
        let id = st.next_window;
        let all =
            self.exchange_headers(&mut st, [coll::OP_WIN_CREATE, u64::from(id), bytes as u64])?;
        for (r, h) in all.iter().enumerate() {
            if h[1..] != [u64::from(id), bytes as u64] || h[0] != coll::OP_WIN_CREATE {
                return Err(Error::CollectiveMismatch(format!(
                    "create_window: rank {r} asked for window {} of {} bytes, rank {} for \
                     window {id} of {bytes} bytes (every process must create the same windows \
                     in the same order)",
                    h[1], h[2], self.rank
                )));
            }
        }
        self.windows.slots.check_new(id)?;
        let page = sys::page_size();
        let stride = sys::round_up(bytes, page)
            .filter(|&s| s <= isize::MAX as usize - page)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("window of {bytes} bytes is too large"))
            })?;
        let mut new = self.allocate_window(stride)?;
        // Every process learns where every part starts (MPI displacement)
        // and whether everyone could allocate; the exchange is also the
        // barrier after which parts may be accessed (each owner has
        // zero-filled its own).
        let failed = u64::from(new.failed.is_some());
        let all = self.exchange_headers(&mut st, [coll::OP_WIN_CREATE, new.disp as u64, failed])?;
        if let Some(r) = all.iter().position(|h| h[2] != 0) {
            if let Some(mut win) = new.win {
                // SAFETY: the window just created, in its lock_all epoch,
                // never published (no RMA); every process frees it here,
                // collectively.
                unsafe {
                    ffi::MPI_Win_unlock_all(win);
                    ffi::MPI_Win_free(&mut win);
                }
            }
            return Err(new.failed.take().unwrap_or_else(|| {
                Error::Transport(format!(
                    "create_window of {bytes} bytes: rank {r} could not allocate its part"
                ))
            }));
        }
        let disp: Box<[ffi::MPI_Aint]> = all.iter().map(|h| h[1] as ffi::MPI_Aint).collect();
        let slot = self.windows.slots.slot(id);
        // SAFETY: reading an MPI constant (the null window: served RMA
        // never resolves a window for an MPI call).
        let handle = new.win.unwrap_or(unsafe { ffi::RSMPI_WIN_NULL });
        let _ = slot.extra.win.set(Handle(handle));
        let _ = slot.extra.disp.set(disp);
        self.windows
            .created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Created {
                id,
                win: new.win.map(Handle),
                memory: new.memory,
            });
        // SAFETY: our part of a live window: read-write, page-aligned, a
        // shared mapping (see the module docs), and kept allocated
        // (inaccessible) after destruction until the communicator is
        // dropped.
        unsafe { slot.publish(new.part as usize, bytes) };
        st.next_window += 1;
        Ok(WindowId(id))
    }

    fn destroy_window(&self, id: WindowId) -> Result<()> {
        let mut st = self.coll.lock();
        let mine = self.windows.slots.destroy_claim(id);
        let all = self.exchange_headers(&mut st, [coll::OP_WIN_DESTROY, mine, 0])?;
        if mine == u64::MAX {
            return Err(Error::UnknownWindow { window: id.0 });
        }
        for (r, h) in all.iter().enumerate() {
            if h[0] != coll::OP_WIN_DESTROY || h[1] == u64::MAX {
                return Err(Error::CollectiveMismatch(format!(
                    "destroy_window({id:?}): window unknown on rank {r}"
                )));
            }
            if h[1] != mine {
                return Err(Error::CollectiveMismatch(format!(
                    "destroy_window: rank {r} destroys window {}, rank {} window {}",
                    h[1], self.rank, id.0
                )));
            }
        }
        let slot = self.windows.slots.slot(id.0);
        let win = slot.extra.win.get().expect("a live window has a handle").0;
        slot.retire();
        if self.server.is_none() {
            // SAFETY: a live window in its lock_all epoch; every process has
            // entered destroy_window, hence finished its RMA to it.
            raw::check("MPI_Win_unlock_all", unsafe {
                ffi::MPI_Win_unlock_all(win)
            })?;
        }
        // Stale local pointers fault from now on; the memory itself stays
        // allocated (never reused) until the communicator is dropped, when
        // MPI_Win_free releases it.
        let (base, size) = (slot.base(), slot.size());
        if size > 0 {
            let len = sys::round_up(size, sys::page_size()).expect("checked at creation");
            // SAFETY: exactly the page-aligned local part of the window,
            // which nothing but the window uses.
            unsafe { libc::mprotect(base as *mut c_void, len, libc::PROT_NONE) };
        }
        Ok(())
    }

    fn local_window(&self, id: WindowId) -> Result<LocalWindow> {
        self.windows.slots.local_window(id)
    }

    fn window_size(&self, id: WindowId) -> Result<usize> {
        self.windows.slots.window_size(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavor_settings_are_parsed() {
        assert_eq!(WindowFlavor::parse(""), Some(None));
        assert_eq!(WindowFlavor::parse(" auto "), Some(None));
        assert_eq!(
            WindowFlavor::parse("shared"),
            Some(Some(WindowFlavor::Shared))
        );
        assert_eq!(
            WindowFlavor::parse("create"),
            Some(Some(WindowFlavor::Created))
        );
        assert_eq!(
            WindowFlavor::parse("created"),
            Some(Some(WindowFlavor::Created))
        );
        assert_eq!(WindowFlavor::parse("allocate"), None);
    }
}
