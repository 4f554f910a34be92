//! The open RDMA device ([`Ctx`]): its verbs context with the protection
//! domain and completion queue, what was learned about its port, and the
//! list of the machine's devices.
//!
//! Destruction order is enforced by reference counting: every queue pair
//! and registration holds an `Arc<Ctx>`, so the protection domain, the
//! completion queue and the device are released only after them.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;
use std::sync::Arc;

use rdma_sys::*;

use super::VerbsConfig;
use super::error::{errno_text, verbs_error};
use crate::com::{Error, Result};

/// `IBV_LINK_LAYER_ETHERNET` (RoCE): addresses need a GRH.
const LINK_LAYER_ETHERNET: u8 = 2;

/// An open RDMA device: context, protection domain, completion queue and
/// what was learned about its port.
pub(crate) struct Ctx {
    ctx: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) cq: *mut ibv_cq,
    pub(crate) name: String,
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    pub(crate) mtu: ibv_mtu::Type,
    pub(crate) ethernet: bool,
    pub(crate) max_msg: usize,
    pub(crate) sq_depth: u32,
    /// Completion-queue entries (bounds the work requests in flight).
    pub(crate) cqe: u32,
    /// Outstanding RDMA reads / atomics as initiator.
    pub(crate) rd_atomic_init: u8,
    /// … and as responder.
    pub(crate) rd_atomic_resp: u8,
    pub(crate) atomic_cap: ibv_atomic_cap::Type,
}

// SAFETY: verbs objects may be used from any thread (libibverbs is
// thread-safe); the raw pointers are owned by this value and released only
// in its `Drop`.
unsafe impl Send for Ctx {}
// SAFETY: as above; shared access only passes the handles to verbs calls.
unsafe impl Sync for Ctx {}

/// Names of the RDMA devices present, or the error [`Ctx::open`] would give
/// when there are none.
pub(crate) fn device_names() -> Result<Vec<String>> {
    let mut n: c_int = 0;
    // SAFETY: `n` is an out-parameter; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() || n <= 0 {
        let why = if list.is_null() {
            errno_text()
        } else {
            "the list is empty".into()
        };
        if !list.is_null() {
            // SAFETY: a list returned by ibv_get_device_list.
            unsafe { ibv_free_device_list(list) };
        }
        return Err(Error::BackendUnavailable(format!(
            "no RDMA device found (ibv_get_device_list: {why}); the verbs backend needs an \
             InfiniBand or RoCE adapter with its kernel driver (`ibv_devices` lists them) — use \
             the shm or mpi backend on this machine"
        )));
    }
    let mut names = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // SAFETY: the list has `n` valid device pointers; names are
        // NUL-terminated strings owned by the device.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(*list.add(i))) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: a list returned by ibv_get_device_list, no longer used.
    unsafe { ibv_free_device_list(list) };
    Ok(names)
}

impl Ctx {
    /// Opens the configured device (or the first one) and its port.
    pub(crate) fn open(cfg: &VerbsConfig) -> Result<Arc<Ctx>> {
        let names = device_names()?;
        let index = match &cfg.device {
            None => 0,
            Some(want) => names.iter().position(|n| n == want).ok_or_else(|| {
                Error::BadConfig(format!(
                    "RDMA device {want:?} ({}) not found; present: {names:?}",
                    super::env::DEVICE
                ))
            })?,
        };
        let mut n: c_int = 0;
        // SAFETY: as in `device_names`; the list is freed before returning.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() || index >= n.max(0) as usize {
            return Err(Error::BackendUnavailable(
                "the RDMA device list changed while opening a device".into(),
            ));
        }
        // SAFETY: `index < n`; the device stays valid while the context is
        // open even after the list is freed (verbs reference-counts it).
        let ctx = unsafe { ibv_open_device(*list.add(index)) };
        // SAFETY: a list returned by ibv_get_device_list.
        unsafe { ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(Error::Transport(format!(
                "ibv_open_device({}) failed: {}",
                names[index],
                errno_text()
            )));
        }
        let mut me = Ctx {
            ctx,
            pd: ptr::null_mut(),
            cq: ptr::null_mut(),
            name: names[index].clone(),
            port: cfg.port,
            gid_index: cfg.gid_index,
            lid: 0,
            gid: [0; 16],
            mtu: ibv_mtu::IBV_MTU_1024,
            ethernet: false,
            max_msg: 1 << 30,
            sq_depth: 128,
            cqe: 64,
            rd_atomic_init: 1,
            rd_atomic_resp: 1,
            atomic_cap: ibv_atomic_cap::IBV_ATOMIC_NONE,
        };
        // From here on `me`'s Drop releases whatever was created.
        // SAFETY: zeroed plain C structs are valid out-parameters.
        let mut dev: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: an open context and an out-parameter.
        let rc = unsafe { ibv_query_device(ctx, &mut dev) };
        if rc != 0 {
            return Err(verbs_error("ibv_query_device", rc));
        }
        // SAFETY: as above.
        let mut port: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: an open context and an out-parameter of the full size.
        let rc = unsafe { ___ibv_query_port(ctx, cfg.port, &mut port) };
        if rc != 0 {
            return Err(verbs_error("ibv_query_port", rc));
        }
        if port.state != ibv_port_state::IBV_PORT_ACTIVE {
            return Err(Error::BackendUnavailable(format!(
                "port {} of RDMA device {} is not active (state {}); choose another with {}",
                cfg.port,
                me.name,
                port.state,
                super::env::PORT
            )));
        }
        // SAFETY: zeroed bytes are a valid gid.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: an open context and an out-parameter.
        let rc = unsafe { ibv_query_gid(ctx, cfg.port, c_int::from(cfg.gid_index), &mut gid) };
        if rc != 0 {
            return Err(verbs_error("ibv_query_gid", rc));
        }
        if dev.atomic_cap == ibv_atomic_cap::IBV_ATOMIC_NONE {
            return Err(Error::BackendUnavailable(format!(
                "RDMA device {} does not support atomic operations, which the verbs backend \
                 needs for compare-and-swap and fetch-and-add",
                me.name
            )));
        }
        me.lid = port.lid;
        // SAFETY: both union views are plain bytes.
        me.gid = unsafe { gid.raw };
        me.mtu = port.active_mtu;
        me.ethernet = port.link_layer == LINK_LAYER_ETHERNET;
        me.max_msg = (port.max_msg_sz as usize).clamp(4096, 1 << 30);
        me.sq_depth = (dev.max_qp_wr.max(16) as u32).min(256);
        me.rd_atomic_init = dev.max_qp_init_rd_atom.clamp(1, 16) as u8;
        me.rd_atomic_resp = dev.max_qp_rd_atom.clamp(1, 16) as u8;
        me.atomic_cap = dev.atomic_cap;
        // SAFETY: an open context.
        me.pd = unsafe { ibv_alloc_pd(ctx) };
        if me.pd.is_null() {
            return Err(Error::Transport(format!(
                "ibv_alloc_pd failed: {}",
                errno_text()
            )));
        }
        let cqe = dev.max_cqe.clamp(64, 1 << 16);
        // SAFETY: an open context; no completion channel (we poll).
        me.cq = unsafe { ibv_create_cq(ctx, cqe, ptr::null_mut(), ptr::null_mut(), 0) };
        if me.cq.is_null() {
            return Err(Error::Transport(format!(
                "ibv_create_cq failed: {}",
                errno_text()
            )));
        }
        // SAFETY: a live completion queue; its `cqe` is the real capacity
        // (the adapter may round the request up).
        me.cqe = unsafe { (*me.cq).cqe }.max(1) as u32;
        Ok(Arc::new(me))
    }

    /// Whether local CPU atomics are atomic with respect to the adapter's
    /// (`IBV_ATOMIC_GLOB`).
    pub(crate) fn global_atomics(&self) -> bool {
        self.atomic_cap == ibv_atomic_cap::IBV_ATOMIC_GLOB
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: we own these objects; every queue pair and registration
        // holds an Arc to us, so none is left.
        unsafe {
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            ibv_close_device(self.ctx);
        }
    }
}
