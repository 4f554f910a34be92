//! Windows on verbs: page-aligned anonymous shared memory registered with
//! the adapter for remote read, write and atomic access; the (address,
//! rkey) of every process's part is allgathered through the bootstrap at
//! creation and kept in the backends' shared window table (`com::slots`).
//! Destroying a window deregisters it and replaces the memory with an
//! inaccessible reservation (never reused), so a stale pointer faults.

use std::sync::OnceLock;

use ct_worker::UltItf;

use super::registration::{self, Mr};
use super::{VerbsCom, memory};
use crate::com::slots::{self, u64_at};
use crate::com::{
    Comm, Communicator, Error, LocalWindow, RemotePtr, Result, WindowId, Windows, check,
};

/// Where the other processes' parts of a window are.
#[derive(Default)]
pub(super) struct Remote {
    /// (address, rkey) of every process's part.
    parts: OnceLock<Box<[(u64, u32)]>>,
}

/// A registered window part of this process.
pub(super) struct Part {
    id: u32,
    base: *mut u8,
    len: usize,
    mr: Option<Mr>,
}

// SAFETY: the part is an address range and a registration handle.
unsafe impl Send for Part {}

impl Part {
    /// Deregisters the part and retires its memory: replaced by an
    /// inaccessible reservation that is never unmapped, so a stale pointer
    /// faults.
    fn retire(self) {
        drop(self.mr);
        // SAFETY: exactly our window's mapping, now unregistered; the
        // window is destroyed, so nothing accesses it through the
        // communicator any more.
        unsafe { memory::retire(self.base, self.len) };
    }

    /// Deregisters and unmaps the part (the communicator is going away).
    pub(super) fn release(self) {
        drop(self.mr);
        // SAFETY: our window memory, deregistered; the communicator is
        // going away, so no access through it remains.
        unsafe { memory::unmap(self.base, self.len) };
    }
}

impl<B: Communicator, U: UltItf> VerbsCom<B, U> {
    /// (remote address, rkey) of `len` bytes at `p`, checked as on shm.
    pub(super) fn resolve(&self, p: RemotePtr, len: usize) -> Result<(u64, u32)> {
        let s = self.slots.access(p, len, self.boot.size())?;
        let (addr, rkey) = s.extra.parts.get().expect("a live window has its table")[p.rank()];
        Ok((addr + p.offset(), rkey))
    }

    /// [`VerbsCom::resolve`] for an atomic, which needs an aligned word.
    pub(super) fn resolve_atomic(&self, p: RemotePtr) -> Result<(u64, u32)> {
        check::aligned_word(p)?;
        self.resolve(p, 8)
    }
}

impl<B: Communicator, U: UltItf> Windows for VerbsCom<B, U> {
    fn create_window(&self, bytes: usize) -> Result<WindowId> {
        let mut next = self.next_window.lock();
        let id = *next;
        let (me, n) = (self.rank(), self.size());
        let all = self.boot.allgather(&slots::create_claim(id, bytes))?;
        slots::check_create_claims(&all, me, id, bytes)?;
        self.slots.check_new(id)?;
        let page = crate::sys::page_size();
        let len = crate::sys::round_up(bytes.max(1), page).ok_or_else(|| {
            Error::InvalidArgument(format!("window of {bytes} bytes is too large"))
        })?;
        // Shared (anonymous, zero-filled), as the `Windows` rules require:
        // the DSM maps a window's pages a second time (`mremap` with old
        // size 0 only duplicates shared mappings).
        let mapped = memory::map_anonymous(len, libc::MAP_SHARED, "mmap (window)");
        // Everyone must know whether everyone succeeded before exchanging
        // keys; a failed registration is reported by all.
        let reg = match &mapped {
            // SAFETY: the mapping lives until the window is destroyed or the
            // communicator dropped, after the registration is dropped.
            Ok(base) => unsafe {
                Mr::register(&self.ctx, *base, len, registration::remote_access())
            },
            Err(e) => Err(e.clone()),
        };
        let entry = match (&mapped, &reg) {
            (Ok(base), Ok(mr)) => [*base as u64, u64::from(mr.rkey()), 1],
            _ => [0, 0, 0],
        };
        let all = self.boot.allgather(&entry.map(u64::to_le_bytes).concat())?;
        let failed = (0..n).find(|&r| u64_at(&all, 3 * r + 2) == 0);
        if reg.is_err() || failed.is_some() {
            drop(reg);
            if let Ok(base) = mapped {
                // SAFETY: our mapping, unregistered and unused.
                unsafe { memory::unmap(base, len) };
            }
            return Err(Error::Transport(format!(
                "create_window: rank {} could not register {len} bytes with the RDMA device",
                failed.unwrap_or(me)
            )));
        }
        let (base, mr) = (mapped.expect("checked"), reg.expect("checked"));
        let lkey = mr.lkey();
        let table: Box<[(u64, u32)]> = (0..n)
            .map(|r| (u64_at(&all, 3 * r), u64_at(&all, 3 * r + 1) as u32))
            .collect();
        self.offloader
            .with_device(|d| d.add_window(base as usize, len, lkey));
        let slot = self.slots.slot(id);
        let _ = slot.extra.parts.set(table);
        self.parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Part {
                id,
                base,
                len,
                mr: Some(mr),
            });
        // SAFETY: our registered part of the new window: page-aligned,
        // shared, and replaced by a reservation (not unmapped) on
        // destruction.
        unsafe { slot.publish(base as usize, bytes) };
        *next += 1;
        Ok(WindowId(id))
    }

    fn destroy_window(&self, id: WindowId) -> Result<()> {
        let _next = self.next_window.lock();
        let mine = self.slots.destroy_claim(id);
        let all = self.boot.allgather(&mine.to_le_bytes())?;
        if mine == u64::MAX {
            return Err(Error::UnknownWindow { window: id.0 });
        }
        for r in 0..self.size() {
            let theirs = u64_at(&all, r);
            if theirs != mine {
                return Err(Error::CollectiveMismatch(format!(
                    "destroy_window({id:?}): rank {r} destroys {}",
                    if theirs == u64::MAX {
                        "an unknown window".to_string()
                    } else {
                        format!("window {theirs}")
                    }
                )));
            }
        }
        self.slots.slot(id.0).retire();
        // Every process entered the call, hence finished its RMA to the
        // window; wait for our own operations' completions too.
        self.drain()?;
        let part = {
            let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
            let i = parts
                .iter()
                .position(|p| p.id == id.0)
                .expect("a live window has a part");
            parts.swap_remove(i)
        };
        self.offloader
            .with_device(|d| d.remove_window(part.base as usize));
        part.retire();
        Ok(())
    }

    fn local_window(&self, id: WindowId) -> Result<LocalWindow> {
        self.slots.local_window(id)
    }

    fn window_size(&self, id: WindowId) -> Result<usize> {
        self.slots.window_size(id)
    }
}
