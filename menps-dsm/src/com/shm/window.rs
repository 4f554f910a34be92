//! Windows on shm: one `memfd` per window holding every process's part
//! (`size` bytes each, at a page-aligned stride), created by rank 0, sent to
//! the others with `SCM_RIGHTS`, and mapped `MAP_SHARED` by every process.
//!
//! The table of windows is fixed-size and never shrinks: the RMA fast path
//! resolves a [`RemotePtr`] with one acquire load of the slot's state and a
//! bounds check, without reference counting. Destroying a window replaces
//! its mapping with an inaccessible reservation, so a racing or stale access
//! faults instead of touching memory reused for something else.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use ct_worker::UltItf;

use super::coll::CollState;
use super::{ShmCom, Watch};
use crate::com::{Error, LocalWindow, RemotePtr, Result, WindowId, Windows};
use crate::sys::{self, Mapping, Received};

/// Most windows a job can create over its lifetime.
pub const MAX_WINDOWS: usize = 4096;

// Slot states: 0 = never used (the default), then LIVE, then DESTROYED.
const LIVE: u8 = 1;
const DESTROYED: u8 = 2;

#[derive(Default)]
struct Slot {
    state: AtomicU8,
    base: AtomicUsize,
    stride: AtomicUsize,
    size: AtomicUsize,
}

pub(crate) struct WindowTable {
    slots: Box<[Slot]>,
    mappings: Mutex<Vec<Option<Mapping>>>,
}

/// Status word of the descriptor packet rank 0 sends.
const PACKET_OK: u64 = 0;

impl WindowTable {
    pub(crate) fn new() -> Self {
        WindowTable {
            slots: (0..MAX_WINDOWS).map(|_| Slot::default()).collect(),
            mappings: Mutex::new(Vec::new()),
        }
    }

    /// The address of `len` bytes at `p`, after checking window, rank and
    /// bounds.
    #[inline]
    pub(crate) fn resolve(&self, p: RemotePtr, len: usize, nprocs: usize) -> Result<*mut u8> {
        let w = p.window().0;
        let Some(s) = self.slots.get(w as usize) else {
            return Err(unknown(w));
        };
        if s.state.load(Ordering::Acquire) != LIVE {
            return Err(unknown(w));
        }
        let size = s.size.load(Ordering::Relaxed);
        let off = p.offset();
        if p.rank() >= nprocs {
            return Err(bad_rank(p.rank(), nprocs));
        }
        if off > size as u64 || len > size - off as usize {
            return Err(out_of_bounds(w, off, len, size));
        }
        let addr = s.base.load(Ordering::Relaxed)
            + p.rank() * s.stride.load(Ordering::Relaxed)
            + off as usize;
        Ok(addr as *mut u8)
    }

    fn live_slot(&self, id: WindowId) -> Result<&Slot> {
        match self.slots.get(id.0 as usize) {
            Some(s) if s.state.load(Ordering::Acquire) == LIVE => Ok(s),
            _ => Err(unknown(id.0)),
        }
    }
}

#[cold]
fn unknown(window: u32) -> Error {
    Error::UnknownWindow { window }
}

#[cold]
fn bad_rank(rank: usize, size: usize) -> Error {
    Error::BadRank { rank, size }
}

#[cold]
fn out_of_bounds(window: u32, offset: u64, len: usize, size: usize) -> Error {
    Error::OutOfBounds {
        window,
        offset,
        len,
        size,
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
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
        let mine = [u64::from(id).to_le_bytes(), (bytes as u64).to_le_bytes()].concat();
        let all = self.allgather_locked(&mut st, &mine)?;
        for r in 0..self.size {
            let (rid, rbytes) = (u64_at(&all, 2 * r), u64_at(&all, 2 * r + 1));
            if rid != u64::from(id) || rbytes != bytes as u64 {
                return Err(Error::CollectiveMismatch(format!(
                    "create_window: rank {r} asked for window {rid} of {rbytes} bytes, \
                     rank {} for window {id} of {bytes} bytes (every process must create the \
                     same windows in the same order)",
                    self.rank
                )));
            }
        }
        if id as usize >= MAX_WINDOWS {
            return Err(Error::BadConfig(format!(
                "too many windows: a job can create at most {MAX_WINDOWS}"
            )));
        }
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
        let slot = &self.windows.slots[id as usize];
        slot.base.store(base, Ordering::Relaxed);
        slot.stride.store(stride, Ordering::Relaxed);
        slot.size.store(bytes, Ordering::Relaxed);
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
        slot.state.store(LIVE, Ordering::Release);
        st.next_window += 1;
        Ok(WindowId(id))
    }

    fn destroy_window(&self, id: WindowId) -> Result<()> {
        let mut st = self.coll.lock();
        // Everyone states which window it destroys (u64::MAX: not a live
        // window here), so misuse is reported everywhere alike.
        let mine = match self.windows.live_slot(id) {
            Ok(_) => u64::from(id.0),
            Err(_) => u64::MAX,
        };
        let all = self.allgather_locked(&mut st, &mine.to_le_bytes())?;
        if mine == u64::MAX {
            return Err(unknown(id.0));
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
        let slot = &self.windows.slots[id.0 as usize];
        slot.state.store(DESTROYED, Ordering::Release);
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
        let s = self.windows.live_slot(id)?;
        let base = s.base.load(Ordering::Relaxed) + self.rank * s.stride.load(Ordering::Relaxed);
        // SAFETY: this is our part of a live window: mapped read-write,
        // page-aligned, and retired (not unmapped) on destruction.
        Ok(unsafe { LocalWindow::from_raw(id, base as *mut u8, s.size.load(Ordering::Relaxed)) })
    }

    fn window_size(&self, id: WindowId) -> Result<usize> {
        Ok(self.windows.live_slot(id)?.size.load(Ordering::Relaxed))
    }
}
