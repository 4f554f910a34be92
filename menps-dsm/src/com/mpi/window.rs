//! Windows on MPI: `MPI_Win_allocate` + `MPI_Win_lock_all`, in a fixed
//! table so that resolving a [`RemotePtr`] costs one acquire load and a
//! bounds check, as on shm.

use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use ::mpi::ffi;
use ct_worker::UltItf;

use super::raw::{self, Handle};
use super::{MpiCom, coll};
use crate::com::{Error, LocalWindow, RemotePtr, Result, WindowId, Windows};
use crate::sys;

/// Most windows a job can create over its lifetime.
pub const MAX_WINDOWS: usize = 4096;

const LIVE: u8 = 1;
const DESTROYED: u8 = 2;

#[derive(Default)]
struct Slot {
    state: AtomicU8,
    win: OnceLock<Handle<ffi::MPI_Win>>,
    base: AtomicUsize,
    size: AtomicUsize,
}

pub(crate) struct WindowTable {
    slots: Box<[Slot]>,
    /// Every window created (live or destroyed), in id order: (id, handle).
    /// Destroyed windows are freed with the communicator.
    created: Mutex<Vec<(u32, Handle<ffi::MPI_Win>)>>,
}

/// The signature shared by `MPI_Win_allocate` and `MPI_Win_allocate_shared`.
type AllocateFn = unsafe extern "C" fn(
    ffi::MPI_Aint,
    c_int,
    ffi::MPI_Info,
    ffi::MPI_Comm,
    *mut c_void,
    *mut ffi::MPI_Win,
) -> c_int;

#[cold]
fn unknown(window: u32) -> Error {
    Error::UnknownWindow { window }
}

impl WindowTable {
    pub(crate) fn new() -> Self {
        WindowTable {
            slots: (0..MAX_WINDOWS).map(|_| Slot::default()).collect(),
            created: Mutex::new(Vec::new()),
        }
    }

    /// The window of `p` after checking window, rank and bounds of an access
    /// of `len` bytes (in the same order as shm, so that the same misuse
    /// gives the same error).
    #[inline]
    pub(crate) fn resolve(&self, p: RemotePtr, len: usize, nprocs: usize) -> Result<ffi::MPI_Win> {
        let w = p.window().0;
        let Some(s) = self.slots.get(w as usize) else {
            return Err(unknown(w));
        };
        if s.state.load(Ordering::Acquire) != LIVE {
            return Err(unknown(w));
        }
        if p.rank() >= nprocs {
            return Err(Error::BadRank {
                rank: p.rank(),
                size: nprocs,
            });
        }
        let size = s.size.load(Ordering::Relaxed);
        let off = p.offset();
        if off > size as u64 || len > size - off as usize {
            return Err(Error::OutOfBounds {
                window: w,
                offset: off,
                len,
                size,
            });
        }
        Ok(s.win.get().expect("a live window has a handle").0)
    }

    fn live_slot(&self, id: WindowId) -> Result<&Slot> {
        match self.slots.get(id.0 as usize) {
            Some(s) if s.state.load(Ordering::Acquire) == LIVE => Ok(s),
            _ => Err(unknown(id.0)),
        }
    }

    /// Runs `f` on every live window.
    pub(crate) fn for_each_live(
        &self,
        mut f: impl FnMut(ffi::MPI_Win) -> Result<()>,
    ) -> Result<()> {
        let created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        for &(id, win) in created.iter() {
            if self.slots[id as usize].state.load(Ordering::Acquire) == LIVE {
                f(win.0)?;
            }
        }
        Ok(())
    }

    /// Frees every window (collective: all processes do it when their
    /// communicator is dropped, in the same id order).
    pub(crate) fn free_all(&self) {
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        for (id, mut win) in created.drain(..) {
            let slot = &self.slots[id as usize];
            if slot.state.swap(DESTROYED, Ordering::AcqRel) == LIVE {
                // SAFETY: a live window in its lock_all epoch, no RMA in
                // flight (the communicator is being dropped).
                unsafe { ffi::MPI_Win_unlock_all(win.0) };
            }
            // SAFETY: our window, no longer used.
            unsafe { ffi::MPI_Win_free(&mut win.0) };
        }
    }
}

impl<U: UltItf> MpiCom<U> {
    /// Allocates, zero-fills and locks the MPI window (the caller holds the
    /// collective lock and has agreed on `stride` with everyone).
    fn allocate_window(&self, stride: usize) -> Result<(ffi::MPI_Win, *mut u8)> {
        let mut info = std::mem::MaybeUninit::<ffi::MPI_Info>::uninit();
        // SAFETY: out-parameter.
        raw::check("MPI_Info_create", unsafe {
            ffi::MPI_Info_create(info.as_mut_ptr())
        })?;
        // SAFETY: MPI_Info_create succeeded.
        let mut info = unsafe { info.assume_init() };
        // Page-strided local parts (osc sm).
        // SAFETY: a valid info object and NUL-terminated strings.
        raw::check("MPI_Info_set", unsafe {
            ffi::MPI_Info_set(info, c"alloc_shared_noncontig".as_ptr(), c"true".as_ptr())
        })?;
        let mut base: *mut u8 = std::ptr::null_mut();
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        // On one machine, a shared-memory window: the same `osc sm` RMA, and
        // every part is also mapped in every process (`shared_ptr`).
        let (call, allocate) = if self.single_node {
            (
                "MPI_Win_allocate_shared",
                ffi::MPI_Win_allocate_shared as AllocateFn,
            )
        } else {
            ("MPI_Win_allocate", ffi::MPI_Win_allocate as AllocateFn)
        };
        // SAFETY: `base` receives the address of the local part (a pointer,
        // as the `void *baseptr` parameter requires); `win` is an
        // out-parameter; the communicator is valid.
        let rc = unsafe {
            allocate(
                stride as ffi::MPI_Aint,
                1,
                info,
                self.comms.coll.0,
                (&mut base as *mut *mut u8).cast::<c_void>(),
                win.as_mut_ptr(),
            )
        };
        // SAFETY: our info object.
        unsafe { ffi::MPI_Info_free(&mut info) };
        raw::check(call, rc)?;
        // SAFETY: MPI_Win_allocate succeeded.
        let win = unsafe { win.assume_init() };
        // SAFETY: our new window.
        raw::check("MPI_Win_set_errhandler", unsafe {
            ffi::MPI_Win_set_errhandler(win, raw::errors_return())
        })?;
        if stride > 0 {
            if base.is_null() || !(base as usize).is_multiple_of(8) {
                return Err(Error::Transport(format!(
                    "MPI_Win_allocate returned a local part at {base:p}, which is not 8-byte \
                     aligned"
                )));
            }
            // SAFETY: the local part has `stride` bytes; nobody accesses it
            // before the barrier below.
            unsafe { std::ptr::write_bytes(base, 0, stride) };
        }
        // SAFETY: a new window; NOCHECK is right since no process ever takes
        // an exclusive lock.
        raw::check("MPI_Win_lock_all", unsafe {
            ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, win)
        })?;
        Ok((win, base))
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
        if id as usize >= MAX_WINDOWS {
            return Err(Error::BadConfig(format!(
                "too many windows: a job can create at most {MAX_WINDOWS}"
            )));
        }
        let stride = sys::round_up(bytes, sys::page_size())
            .filter(|&s| s <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("window of {bytes} bytes is too large"))
            })?;
        let (win, base) = self.allocate_window(stride)?;
        // Nobody may access a part before its owner zero-filled it.
        self.barrier_locked()?;
        let base = if stride == 0 {
            NonNull::<u64>::dangling().as_ptr() as usize
        } else {
            base as usize
        };
        let slot = &self.windows.slots[id as usize];
        slot.base.store(base, Ordering::Relaxed);
        slot.size.store(bytes, Ordering::Relaxed);
        let _ = slot.win.set(Handle(win));
        self.windows
            .created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, Handle(win)));
        slot.state.store(LIVE, Ordering::Release);
        st.next_window += 1;
        Ok(WindowId(id))
    }

    fn destroy_window(&self, id: WindowId) -> Result<()> {
        let mut st = self.coll.lock();
        let mine = match self.windows.live_slot(id) {
            Ok(_) => u64::from(id.0),
            Err(_) => u64::MAX,
        };
        let all = self.exchange_headers(&mut st, [coll::OP_WIN_DESTROY, mine, 0])?;
        if mine == u64::MAX {
            return Err(unknown(id.0));
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
        let slot = &self.windows.slots[id.0 as usize];
        let win = slot.win.get().expect("a live window has a handle").0;
        slot.state.store(DESTROYED, Ordering::Release);
        // SAFETY: a live window in its lock_all epoch; every process has
        // entered destroy_window, hence finished its RMA to it.
        raw::check("MPI_Win_unlock_all", unsafe {
            ffi::MPI_Win_unlock_all(win)
        })?;
        // Stale local pointers fault from now on; the memory itself stays
        // allocated (never reused) until the communicator is dropped, when
        // MPI_Win_free releases it.
        let (base, size) = (
            slot.base.load(Ordering::Relaxed),
            slot.size.load(Ordering::Relaxed),
        );
        let page = sys::page_size();
        if size > 0 && base.is_multiple_of(page) {
            let len = sys::round_up(size, page).expect("checked at creation");
            // SAFETY: exactly the page-aligned local part of the window,
            // which MPI allocated for us and nothing else uses.
            unsafe { libc::mprotect(base as *mut c_void, len, libc::PROT_NONE) };
        }
        Ok(())
    }

    fn local_window(&self, id: WindowId) -> Result<LocalWindow> {
        let s = self.windows.live_slot(id)?;
        // SAFETY: our part of a live window: read-write, 8-byte aligned
        // (checked at creation; page-aligned with osc sm), and kept allocated
        // (inaccessible) after destruction until the communicator is dropped.
        Ok(unsafe {
            LocalWindow::from_raw(
                id,
                s.base.load(Ordering::Relaxed) as *mut u8,
                s.size.load(Ordering::Relaxed),
            )
        })
    }

    fn window_size(&self, id: WindowId) -> Result<usize> {
        Ok(self.windows.live_slot(id)?.size.load(Ordering::Relaxed))
    }
}
