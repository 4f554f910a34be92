//! Memory registrations ([`Mr`]) and the access rights they are made
//! with. A registration holds an `Arc` of its device context, which
//! therefore outlives it.

use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use rdma_sys::*;

use super::context::Ctx;
use super::error::errno_text;
use crate::com::{Error, Result};

/// A memory registration.
pub(crate) struct Mr {
    mr: *mut ibv_mr,
    _ctx: Arc<Ctx>,
}

// SAFETY: a registration handle may be used and released from any thread.
unsafe impl Send for Mr {}
// SAFETY: shared access only reads the keys.
unsafe impl Sync for Mr {}

/// Access rights of window registrations.
pub(crate) fn remote_access() -> c_int {
    (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
        .0 as c_int
}

/// Access rights of local buffers (staging, on-the-fly registrations).
pub(crate) fn local_access() -> c_int {
    ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int
}

impl Mr {
    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// The range must stay mapped until the registration is dropped.
    pub(crate) unsafe fn register(
        ctx: &Arc<Ctx>,
        addr: *mut u8,
        len: usize,
        access: c_int,
    ) -> Result<Mr> {
        // SAFETY: a valid protection domain; the range is mapped (contract).
        let mr = unsafe { ibv_reg_mr(ctx.pd, addr.cast::<c_void>(), len.max(1), access) };
        if mr.is_null() {
            return Err(Error::Transport(format!(
                "ibv_reg_mr of {len} bytes failed: {}",
                errno_text()
            )));
        }
        Ok(Mr {
            mr,
            _ctx: ctx.clone(),
        })
    }

    /// Local key.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a live registration.
        unsafe { (*self.mr).lkey }
    }

    /// Remote key.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: a live registration.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: our registration, no longer used by any work request (the
        // owners drop it only after the operations using it completed).
        unsafe { ibv_dereg_mr(self.mr) };
    }
}
