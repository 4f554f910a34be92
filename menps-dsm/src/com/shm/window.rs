//! Windows on shm: one `memfd` per window holding every process's part
//! (`size` bytes each, at a page-aligned stride), created by rank 0, sent to
//! the others with `SCM_RIGHTS`, and mapped `MAP_SHARED` by every process.
//!
//! The table of windows is the backends' shared one (`com::slots`): the RMA
//! fast path resolves a [`RemotePtr`] with one acquire load of the slot's
//! state and a bounds check, without reference counting. Destroying a window replaces
//! its mapping with an inaccessible reservation, so a racing or stale access
//! faults instead of touching memory reused for something else.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ct_worker::UltItf;

use super::ShmCom;
use super::coll::CollState;
pub use crate::com::slots::MAX_WINDOWS;
use crate::com::slots::{self, WindowSlots, u64_at};
use crate::com::wait::Watch;
use crate::com::{Error, LocalWindow, RemotePtr, Result, WindowId, Windows};
use crate::sys::{self, Mapping, Received};

/// Where the parts of a window are: one mapping of every process's part,
/// at a page-aligned stride.
#[derive(Default)]
pub(crate) struct Parts {
    /// Rank 0's part.
    first: AtomicUsize,
    stride: AtomicUsize,
}

pub(crate) struct WindowTable {
    slots: WindowSlots<Parts>,
    mappings: Mutex<Vec<Option<Mapping>>>,
}

/// Status word of the descriptor packet rank 0 sends.
const PACKET_OK: u64 = 0;

impl WindowTable {
    pub(crate) fn new() -> Self {
        WindowTable {
            slots: WindowSlots::new(),
            mappings: Mutex::new(Vec::new()),
        }
    }

    /// The address of `len` bytes at `p`, after checking window, rank and
    /// bounds.
    #[inline]
    pub(crate) fn resolve(&self, p: RemotePtr, len: usize, nprocs: usize) -> Result<*mut u8> {
        let s = self.slots.access(p, len, nprocs)?;
        let addr = s.extra.first.load(Ordering::Relaxed)
            + p.rank() * s.extra.stride.load(Ordering::Relaxed)
            + p.offset() as usize;
        Ok(addr as *mut u8)
    }
}

impl<U: UltItf> ShmCom<U> {
    /// Rank 0: creates the memory object and sends it to every other process.
    fn share_new_window(&self, st: &CollState, id: u32, total: usize) -> Result<OwnedFd> {
        let created = sys::memfd(c"menps-window", total);
        let status = match &created {
            Ok(_) => PACKET_OK,
            Err(_) => 1,
        };
        let mut packet = [0u8; 24];
        packet[0..8].copy_from_slice(&u64::from(id).to_le_bytes());
        packet[8..16].copy_from_slice(&(total as u64).to_le_bytes());
        packet[16..24].copy_from_slice(&status.to_le_bytes());
        let mut first_err = None;
        for k in 1..self.size {
            let sock = st.peers[k]
                .as_ref()
                .expect("rank 0 has a socket to every rank");
            let fd = created.as_ref().ok().map(|f| f.as_fd());
            if let Err(e) = sys::send_with_fd(sock.as_fd(), &packet, fd) {
                let err = self
                    .failure(Watch::Rank(k))
                    .unwrap_or_else(|| sys::io_error("sendmsg(window descriptor)", &e));
                first_err.get_or_insert(err);
            }
            self.control.notify(k);
        }
        let fd = created?;
        match first_err {
            Some(e) => Err(e),
            None => Ok(fd),
        }
    }

    /// Other ranks: receives the memory object of window `id` from rank 0.
    fn receive_new_window(&self, st: &CollState, id: u32, total: usize) -> Result<OwnedFd> {
        let sock = st.peers[0]
            .as_ref()
            .expect("every rank has a socket to rank 0");
        let mut buf = [0u8; 24];
        let what = || format!("the memory of window {id}");
        let (len, fd) = self.wait_until(
            Watch::Rank(0),
            Some(&what),
            || match sys::try_recv_with_fd(sock.as_fd(), &mut buf) {
                Ok(Received::Nothing) => Ok(None),
                Ok(Received::Packet { len, fd }) => Ok(Some((len, fd))),
                Ok(Received::Closed) => Err(self.departure_of(0)),
                Err(e) => Err(sys::io_error("recvmsg(window descriptor)", &e)),
            },
        )?;
        let ok =
            len == buf.len() && u64_at(&buf, 0) == u64::from(id) && u64_at(&buf, 1) == total as u64;
        if !ok {
            return Err(Error::CollectiveMismatch(format!(
                "create_window: rank 0 sent the descriptor of another window \
                 (expected window {id} of {total} bytes)"
            )));
        }
        if u64_at(&buf, 2) != PACKET_OK {
            return Err(Error::Os {
                call: "memfd_create (on rank 0, for a new window)",
                errno: libc::ENOMEM,
            });
        }
        fd.ok_or_else(|| {
            Error::CollectiveMismatch(format!(
                "create_window: rank 0's message for window {id} carried no descriptor"
            ))
        })
    }
}

impl<U: UltItf> Windows for ShmCom<U> {
    fn create_window(&self, bytes: usize) -> Result<WindowId> {
        let mut st = self.coll.lock();
        let id = st.next_window;
        // Agree on the id and the size (this also lets every process know
        // that all have entered the call).
        let all = self.allgather_locked(&mut st, &slots::create_claim(id, bytes))?;
        slots::check_create_claims(&all, self.rank, id, bytes)?;
        self.windows.slots.check_new(id)?;
        let too_big = || Error::InvalidArgument(format!("window of {bytes} bytes is too large"));
        let stride = sys::round_up(bytes, sys::page_size()).ok_or_else(too_big)?;
        let total = stride.checked_mul(self.size).ok_or_else(too_big)?;
        let mapping = if total == 0 {
            None
        } else {
            let fd = if self.rank == 0 {
                self.share_new_window(&st, id, total)?
            } else {
                self.receive_new_window(&st, id, total)?
            };
            Some(Mapping::shared(fd.as_fd(), total)?)
        };
        let base = mapping
            .as_ref()
            .map_or(NonNull::<u64>::dangling().as_ptr() as usize, |m| {
                m.ptr() as usize
            });
        let slot = self.windows.slots.slot(id);
        slot.extra.first.store(base, Ordering::Relaxed);
        slot.extra.stride.store(stride, Ordering::Relaxed);
        {
            let mut maps = self
                .windows
                .mappings
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if maps.len() <= id as usize {
                maps.resize_with(id as usize + 1, || None);
            }
            maps[id as usize] = mapping;
        }
        // SAFETY: our part of the new window's mapping: read-write,
        // page-aligned (the stride is a whole number of pages) and shared,
        // and retired (not unmapped) on destruction.
        unsafe { slot.publish(base + self.rank * stride, bytes) };
        st.next_window += 1;
        Ok(WindowId(id))
    }

    fn destroy_window(&self, id: WindowId) -> Result<()> {
        let mut st = self.coll.lock();
        // Everyone states which window it destroys (u64::MAX: not a live
        // window here), so misuse is reported everywhere alike.
        let mine = self.windows.slots.destroy_claim(id);
        let all = self.allgather_locked(&mut st, &mine.to_le_bytes())?;
        if mine == u64::MAX {
            return Err(Error::UnknownWindow { window: id.0 });
        }
        for r in 0..self.size {
            let theirs = u64_at(&all, r);
            if theirs == u64::MAX {
                return Err(Error::CollectiveMismatch(format!(
                    "destroy_window({id:?}): window unknown on rank {r}"
                )));
            }
            if theirs != mine {
                return Err(Error::CollectiveMismatch(format!(
                    "destroy_window: rank {r} destroys window {theirs}, rank {} window {}",
                    self.rank, id.0
                )));
            }
        }
        // Every process has entered the call, hence finished its RMA to the
        // window (the rule of `destroy_window`).
        self.windows.slots.slot(id.0).retire();
        let mapping = {
            let mut maps = self
                .windows
                .mappings
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            maps.get_mut(id.0 as usize).and_then(Option::take)
        };
        if let Some(m) = mapping {
            m.retire();
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
