//! Reliable-connection queue pairs ([`Qp`]): their creation, the
//! connection data peers exchange ([`QpInfo`]) and the INIT → RTR → RTS
//! transitions. A queue pair holds an `Arc` of its device context, which
//! therefore outlives it.

use std::os::raw::c_int;
use std::sync::Arc;

use rdma_sys::*;

use super::context::Ctx;
use super::error::{errno_text, verbs_error};
use crate::com::{Error, Result};

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
