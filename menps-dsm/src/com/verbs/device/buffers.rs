//! Registered local buffers for the device's commands: a command's buffer
//! is used in place when it lies in a registered window of this process;
//! otherwise small transfers go through a staging slot and large ones
//! register the caller's buffer for the operation; atomic results land in
//! registered 8-byte cells.

use std::sync::Arc;

use super::super::context::Ctx;
use super::super::memory;
use super::super::registration::{Mr, local_access};
use super::{SLOT_BYTES, VerbsDevice};
use crate::com::Result;

/// Where a local buffer comes from, and what completion must do with it.
pub(super) enum Local {
    /// Inside a registered window: nothing to do.
    InPlace,
    /// A staging slot: copy out `len` bytes to `dst` (reads), then free it.
    Slot {
        slot: usize,
        copy_to: Option<(*mut u8, usize)>,
    },
    /// A registration of the caller's buffer, dropped at completion.
    Registered {
        /// Kept only to be dropped (deregistered) at completion.
        _mr: Mr,
    },
    /// An atomic result cell.
    Cell(usize),
}

/// Registered, page-aligned anonymous memory.
pub(super) struct Pool {
    /// First byte.
    pub(super) base: *mut u8,
    len: usize,
    mr: Option<Mr>,
    /// Free units.
    pub(super) free: Vec<usize>,
}

impl Pool {
    /// `count` units of `unit` bytes, registered for local access.
    pub(super) fn new(ctx: &Arc<Ctx>, unit: usize, count: usize) -> Result<Pool> {
        let len = unit * count;
        let mut pool = Pool {
            base: memory::map_anonymous(len, libc::MAP_PRIVATE, "mmap (RDMA staging)")?,
            len,
            mr: None,
            free: (0..count).rev().collect(),
        };
        // SAFETY: the mapping lives until the pool is dropped, after the
        // registration (field order in Drop below).
        pool.mr = Some(unsafe { Mr::register(ctx, pool.base, len, local_access()) }?);
        Ok(pool)
    }

    /// The registration's local key.
    pub(super) fn lkey(&self) -> u32 {
        self.mr.as_ref().expect("registered").lkey()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        drop(self.mr.take());
        // SAFETY: our own mapping, no longer registered or referenced.
        unsafe { memory::unmap(self.base, self.len) };
    }
}

impl VerbsDevice {
    /// The local key of the registered window holding `len` bytes at
    /// `addr`, if one does.
    fn in_window(&self, addr: usize, len: usize) -> Option<u32> {
        self.windows
            .iter()
            .find(|&&(b, l, _)| addr >= b && addr.saturating_add(len) <= b + l)
            .map(|w| w.2)
    }

    /// A registered local buffer for `len` bytes at `user`: in place, a
    /// staging slot (filled now for writes), or a new registration.
    /// `Ok(None)`: no slot free now.
    pub(super) fn local_buffer(
        &mut self,
        user: *mut u8,
        len: usize,
        is_read: bool,
    ) -> Result<Option<((u64, u32), Local)>> {
        if let Some(lkey) = self.in_window(user as usize, len) {
            return Ok(Some(((user as u64, lkey), Local::InPlace)));
        }
        if len <= SLOT_BYTES {
            let Some(slot) = self.staging.free.pop() else {
                return Ok(None);
            };
            // SAFETY: slot `slot` of the staging pool has SLOT_BYTES bytes.
            let buf = unsafe { self.staging.base.add(slot * SLOT_BYTES) };
            if !is_read {
                // SAFETY: `user` is valid for `len` bytes (issuer's
                // contract); the slot is ours until completion.
                unsafe { std::ptr::copy_nonoverlapping(user, buf, len) };
            }
            return Ok(Some((
                (buf as u64, self.staging.lkey()),
                Local::Slot {
                    slot,
                    copy_to: is_read.then_some((user, len)),
                },
            )));
        }
        let access = if is_read { local_access() } else { 0 };
        // SAFETY: the buffer stays valid until completion (issuer's
        // contract); the registration is dropped at completion.
        let mr = unsafe { Mr::register(&self.ctx, user, len, access) }?;
        Ok(Some((
            (user as u64, mr.lkey()),
            Local::Registered { _mr: mr },
        )))
    }

    /// A registered cell for an atomic's result, if one is free.
    pub(super) fn cell(&mut self) -> Option<((u64, u32), Local)> {
        let cell = self.cells.free.pop()?;
        let addr = self.cells.base as u64 + 8 * cell as u64;
        Some(((addr, self.cells.lkey()), Local::Cell(cell)))
    }

    /// Frees the staging slot or cell of a finished command.
    pub(super) fn release(&mut self, local: Local) {
        match local {
            Local::Slot { slot, .. } => self.staging.free.push(slot),
            Local::Cell(c) => self.cells.free.push(c),
            Local::InPlace | Local::Registered { .. } => {}
        }
    }
}
