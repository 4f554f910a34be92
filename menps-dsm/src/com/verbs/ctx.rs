//! Owned verbs objects (device context with its protection domain and
//! completion queue, queue pairs, memory registrations) and the RC queue
//! pair state transitions.
//!
//! Destruction order is enforced by reference counting: every queue pair
//! and registration holds an `Arc<Ctx>`, so the protection domain, the
//! completion queue and the device are released only after them.

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

use rdma_sys::*;

use super::VerbsConfig;
use crate::com::{Error, Result};

/// `IBV_LINK_LAYER_ETHERNET` (RoCE): addresses need a GRH.
const LINK_LAYER_ETHERNET: u8 = 2;

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

fn verbs_error(call: &str, rc: c_int) -> Error {
    // Verbs calls return an errno value (or -1 with errno set).
    let text = if rc > 0 {
        std::io::Error::from_raw_os_error(rc).to_string()
    } else {
        errno_text()
    };
    Error::Transport(format!("{call} failed: {text}"))
}

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

/// What a peer needs to connect to one of our queue pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpInfo {
    pub(crate) lid: u16,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) gid: [u8; 16],
}

/// Bytes of an encoded [`QpInfo`].
pub(crate) const QP_INFO_BYTES: usize = 28;

impl QpInfo {
    pub(crate) fn encode(&self) -> [u8; QP_INFO_BYTES] {
        let mut b = [0u8; QP_INFO_BYTES];
        b[0..2].copy_from_slice(&self.lid.to_le_bytes());
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12..28].copy_from_slice(&self.gid);
        b
    }

    pub(crate) fn decode(b: &[u8]) -> QpInfo {
        QpInfo {
            lid: u16::from_le_bytes([b[0], b[1]]),
            qpn: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            psn: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            gid: b[12..28].try_into().expect("16 bytes"),
        }
    }
}

/// A reliable-connection queue pair.
pub(crate) struct Qp {
    pub(crate) qp: *mut ibv_qp,
    pub(crate) psn: u32,
    ctx: Arc<Ctx>,
}

// SAFETY: a queue pair may be used from any thread; the offloader serialises
// posting on it.
unsafe impl Send for Qp {}

fn initial_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (t ^ std::process::id().wrapping_mul(2_654_435_761)) & 0x00ff_ffff
}

impl Qp {
    /// Creates an RC queue pair on the context's completion queue and moves
    /// it to INIT.
    pub(crate) fn create(ctx: &Arc<Ctx>) -> Result<Qp> {
        // SAFETY: a zeroed C struct, then filled in.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = ctx.cq;
        init.recv_cq = ctx.cq;
        init.cap.max_send_wr = ctx.sq_depth;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: a valid protection domain and attributes.
        let qp = unsafe { ibv_create_qp(ctx.pd, &mut init) };
        if qp.is_null() {
            return Err(Error::Transport(format!(
                "ibv_create_qp failed: {}",
                errno_text()
            )));
        }
        let me = Qp {
            qp,
            psn: initial_psn(),
            ctx: ctx.clone(),
        };
        // SAFETY: a zeroed C struct, then filled in.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = ctx.port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
            .0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        me.modify(&mut a, mask, "INIT")?;
        Ok(me)
    }

    fn modify(&self, a: &mut ibv_qp_attr, mask: ibv_qp_attr_mask, to: &str) -> Result<()> {
        // SAFETY: our queue pair and a filled attribute struct.
        let rc = unsafe { ibv_modify_qp(self.qp, a, mask.0 as c_int) };
        if rc != 0 {
            return Err(verbs_error(&format!("ibv_modify_qp(→{to})"), rc));
        }
        Ok(())
    }

    /// What a peer needs to connect to this queue pair.
    pub(crate) fn info(&self) -> QpInfo {
        QpInfo {
            lid: self.ctx.lid,
            // SAFETY: a live queue pair.
            qpn: unsafe { (*self.qp).qp_num },
            psn: self.psn,
            gid: self.ctx.gid,
        }
    }

    /// Connects this queue pair to `remote`: INIT → RTR → RTS.
    pub(crate) fn connect(&self, remote: &QpInfo) -> Result<()> {
        let c = &self.ctx;
        // SAFETY: a zeroed C struct, then filled in.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = c.mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = c.rd_atomic_resp;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = c.port;
        if c.ethernet || remote.lid == 0 {
            // RoCE (or a routed fabric): address by GID.
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = c.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "RTR")?;

        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = 14; // 4.096 µs × 2^14 ≈ 67 ms per try
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = self.psn;
        a.max_rd_atomic = c.rd_atomic_init;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "RTS")
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: our queue pair; the device drops it only when no work
        // request is outstanding (or the job is ending).
        unsafe { ibv_destroy_qp(self.qp) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_info_round_trip() {
        let i = QpInfo {
            lid: 0x1234,
            qpn: 0xabcdef,
            psn: 0x123456,
            gid: core::array::from_fn(|k| k as u8 * 3),
        };
        assert_eq!(QpInfo::decode(&i.encode()), i);
        assert!(initial_psn() <= 0x00ff_ffff);
    }
}
