//! The `verbs` backend (cargo feature `verbs`): one-sided RMA over
//! InfiniBand / RoCE reliable-connection (RC) queue pairs, through
//! `rdma-sys`.
//!
//! # What is needed
//!
//! An RDMA adapter with its kernel driver and `libibverbs` (Debian:
//! `libibverbs-dev librdmacm-dev` to build; `ibv_devices` lists adapters).
//! Without one, [`VerbsCom::new`] returns [`Error::BackendUnavailable`]
//! ("no RDMA device found …") at once.
//!
//! # How it works
//!
//! [`VerbsCom`] adds RDMA to a *bootstrap* communicator `B` (the shm
//! backend, MPI, or [`AnyCom`](crate::com::AnyCom)), which provides ranks,
//! point-to-point messages and collectives, and exchanges the connection
//! information:
//!
//! ```no_run
//! # #[cfg(feature = "verbs")] {
//! use menps_dsm::com::{AnyCom, Rma, VerbsCom, Windows};
//! let boot: AnyCom<ct_worker::OsThreads> = menps_dsm::launch::init_or_relaunch(2)?;
//! // RMA over RDMA; messages and collectives over the bootstrap:
//! let com: VerbsCom<_, ct_worker::OsThreads> = VerbsCom::new(boot)?;
//! let w = com.create_window(1 << 20)?;
//! com.fetch_add(w.at(0, 0), 1)?;
//! # }
//! # Ok::<(), menps_dsm::com::Error>(())
//! ```
//!
//! - **Connection set-up** (collective): every process opens the device
//!   (`MENPS_VERBS_DEVICE`, default the first; port `MENPS_VERBS_PORT`,
//!   default 1; GID index `MENPS_VERBS_GID_INDEX`, default 0 — RoCE v2
//!   usually needs another), agrees through the bootstrap that everyone
//!   could, creates one RC queue pair per peer — its own included, connected
//!   to a second local queue pair, so that accesses to itself also go
//!   through the adapter and stay atomic with everyone else's — allgathers
//!   (LID, GID, QP number, PSN) tables, moves every queue pair INIT → RTR →
//!   RTS and passes a barrier.
//! - **Windows**: page-aligned anonymous memory registered with remote
//!   read, write and atomic access; (address, rkey) pairs are allgathered.
//!   Destroying a window deregisters it and replaces the memory with an
//!   inaccessible reservation (never reused).
//! - **RMA**: `IBV_WR_RDMA_READ`, `IBV_WR_RDMA_WRITE`,
//!   `IBV_WR_ATOMIC_CMP_AND_SWP`, `IBV_WR_ATOMIC_FETCH_AND_ADD`, all
//!   signalled, behind `ct-delegate`'s [`Offloader`]: the executor thread
//!   posts the work requests of up to a batch of queued operations at a
//!   time, chained, with one `ibv_post_send` per target process; the
//!   completer thread polls the completion queue (up to a batch of
//!   completions per `ibv_poll_cq`) and completes the [`Request`]s (the
//!   issuing user-level thread parks).
//!   Local buffers are used in place when they lie in a registered window,
//!   else through registered staging slots (≤ 64 KiB) or a registration of
//!   the caller's buffer for the operation. A write completes when the
//!   target's adapter acknowledged it; `flush` waits for every operation
//!   issued before it.
//! - **Atomicity**: RDMA atomics are atomic with respect to each other.
//!   Whether CPU atomics on
//!   [`LocalWindow::atomic_u64`](crate::com::LocalWindow::atomic_u64) are
//!   atomic with respect to them depends on the adapter
//!   ([`VerbsCom::cpu_atomics_coherent`],
//!   `IBV_ATOMIC_GLOB`); and some adapters perform atomics on big-endian
//!   words — so keep words that are updated remotely to RDMA atomics only.
//! - **Failures**: a work completion with an error status fails that
//!   operation with [`Error::Transport`] naming the status (after which the
//!   queue pair is in the error state and later operations to that process
//!   fail too); process deaths are reported by the bootstrap's waits.
//!
//! # Environment variables
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `MENPS_VERBS_DEVICE` | adapter name (`ibv_devices`) | the first |
//! | `MENPS_VERBS_PORT` | port number | `1` |
//! | `MENPS_VERBS_GID_INDEX` | GID table index (RoCE) | `0` |

mod config;
mod context;
mod device;
mod error;
mod memory;
mod queue_pair;
mod registration;
mod window;

use std::sync::{Arc, Mutex};

use ct_delegate::Offloader;
use ct_worker::{Ult, UltItf};

use super::outcome::Outcome;
use super::slots::WindowSlots;
use super::{
    Coll, Comm, Communicator, Error, P2p, RemotePtr, Request, Result, Rma, Source, Tag, check,
    offload,
};
pub use config::{VerbsConfig, env};
use context::Ctx;
use device::{Command, Kind, VerbsDevice};
use queue_pair::{QP_INFO_BYTES, Qp, QpInfo};
use window::{Part, Remote};

/// Names of the RDMA adapters of this machine, or
/// [`Error::BackendUnavailable`] if there are none.
pub fn devices() -> Result<Vec<String>> {
    context::device_names()
}

pub use crate::com::slots::MAX_WINDOWS;
/// Communicator of the `verbs` backend over the bootstrap `B`; see the
/// [module docs](self).
pub struct VerbsCom<B: Communicator, U: UltItf = Ult> {
    boot: B,
    offloader: Arc<Offloader<VerbsDevice, U>>,
    slots: WindowSlots<Remote>,
    parts: Mutex<Vec<Part>>,
    next_window: ct_sync::Mutex<u32, U>,
    ctx: Arc<Ctx>,
}

impl<B: Communicator, U: UltItf> core::fmt::Debug for VerbsCom<B, U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsCom")
            .field("rank", &self.boot.rank())
            .field("size", &self.boot.size())
            .field("device", &self.ctx.name)
            .finish_non_exhaustive()
    }
}

impl<B: Communicator, U: UltItf> VerbsCom<B, U> {
    /// Connects every process of `boot`'s job with RC queue pairs
    /// (collective), using the `MENPS_VERBS_*` settings.
    pub fn new(boot: B) -> Result<Self> {
        Self::with_config(boot, VerbsConfig::from_env()?)
    }

    /// [`VerbsCom::new`] with explicit settings.
    pub fn with_config(boot: B, config: VerbsConfig) -> Result<Self> {
        let (me, n) = (boot.rank(), boot.size());
        // Everyone learns whether everyone could open a device before anyone
        // waits for connection data.
        let opened = Ctx::open(&config);
        let ok = boot.allgather(&[u8::from(opened.is_ok())])?;
        let ctx = opened?;
        if let Some(r) = ok.iter().position(|&b| b == 0) {
            return Err(Error::BackendUnavailable(format!(
                "rank {r} could not open an RDMA device (see its error)"
            )));
        }
        let qps = (0..n)
            .map(|_| Qp::create(&ctx))
            .collect::<Result<Vec<_>>>()?;
        let loopback = Qp::create(&ctx)?;
        let mut table = Vec::with_capacity(n * QP_INFO_BYTES);
        for qp in &qps {
            table.extend_from_slice(&qp.info().encode());
        }
        let all = boot.allgather(&table)?;
        let entry = |of: usize, to: usize| {
            let at = (of * n + to) * QP_INFO_BYTES;
            QpInfo::decode(&all[at..at + QP_INFO_BYTES])
        };
        for (r, qp) in qps.iter().enumerate() {
            if r == me {
                qp.connect(&loopback.info())?;
                loopback.connect(&qp.info())?;
            } else {
                qp.connect(&entry(r, me))?;
            }
        }
        // No process sends before every queue pair it targets is ready.
        boot.barrier()?;
        let device = VerbsDevice::new(ctx.clone(), qps, loopback)?;
        Ok(VerbsCom {
            boot,
            offloader: Offloader::new(device, 1024),
            slots: WindowSlots::new(),
            parts: Mutex::new(Vec::new()),
            next_window: ct_sync::Mutex::new_in(0),
            ctx,
        })
    }

    /// The bootstrap communicator.
    pub fn bootstrap(&self) -> &B {
        &self.boot
    }

    /// The adapter's name.
    pub fn device_name(&self) -> &str {
        &self.ctx.name
    }

    /// Whether CPU atomics on local window words are atomic with respect to
    /// the adapter's (`IBV_ATOMIC_GLOB`); see the [module docs](self).
    pub fn cpu_atomics_coherent(&self) -> bool {
        self.ctx.global_atomics()
    }

    /// Submits an RMA command for `rank`'s memory at `remote_addr` (with
    /// the window's `rkey` there).
    fn submit(&self, rank: usize, (remote_addr, rkey): (u64, u32), kind: Kind) -> Request<U> {
        let out = Outcome::new(0, 0);
        let command = Command::Rma {
            rank,
            remote_addr,
            rkey,
            kind,
            out: out.clone(),
        };
        offload::submit(&self.offloader, command, out)
    }

    /// Waits until every operation issued so far has completed.
    fn drain(&self) -> Result<()> {
        offload::drain(&self.offloader, Command::Flush)
    }
}

impl<B: Communicator, U: UltItf> Drop for VerbsCom<B, U> {
    fn drop(&mut self) {
        offload::settle(&self.offloader);
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        for p in parts.drain(..) {
            p.release();
        }
    }
}

impl<B: Communicator, U: UltItf> Comm for VerbsCom<B, U> {
    fn rank(&self) -> usize {
        self.boot.rank()
    }
    fn size(&self) -> usize {
        self.boot.size()
    }
}

impl<B: Communicator, U: UltItf> Rma for VerbsCom<B, U> {
    type Request = Request<U>;

    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Request<U>> {
        let t = self.resolve(src, len)?;
        if len == 0 {
            return Ok(Request::ready(Ok(0)));
        }
        Ok(self.submit(src.rank(), t, Kind::Read { dst, len }))
    }

    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Request<U>> {
        let t = self.resolve(dst, len)?;
        if len == 0 {
            return Ok(Request::ready(Ok(0)));
        }
        Ok(self.submit(dst.rank(), t, Kind::Write { src, len }))
    }

    fn compare_and_swap_nb(&self, at: RemotePtr, expected: u64, new: u64) -> Result<Request<U>> {
        let t = self.resolve_atomic(at)?;
        Ok(self.submit(at.rank(), t, Kind::Cas { expected, new }))
    }

    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Request<U>> {
        let t = self.resolve_atomic(target)?;
        Ok(self.submit(target.rank(), t, Kind::FetchAdd { delta }))
    }

    fn flush(&self, rank: usize) -> Result<()> {
        check::rank(rank, self.size())?;
        self.drain()
    }

    fn flush_all(&self) -> Result<()> {
        self.drain()
    }
}

impl<B: Communicator, U: UltItf> P2p for VerbsCom<B, U> {
    fn max_message_bytes(&self) -> usize {
        self.boot.max_message_bytes()
    }
    fn send(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.boot.send(to, tag, data)
    }
    fn try_recv(&self, from: Source, tag: Tag) -> Result<Option<(usize, Vec<u8>)>> {
        self.boot.try_recv(from, tag)
    }
    fn recv(&self, from: Source, tag: Tag) -> Result<(usize, Vec<u8>)> {
        self.boot.recv(from, tag)
    }
    fn recv_into(&self, from: Source, tag: Tag, buf: &mut [u8]) -> Result<(usize, usize)> {
        self.boot.recv_into(from, tag, buf)
    }
}

impl<B: Communicator, U: UltItf> Coll for VerbsCom<B, U> {
    fn barrier(&self) -> Result<()> {
        self.boot.barrier()
    }
    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        self.boot.broadcast(root, buf)
    }
    fn allgather_into(&self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        self.boot.allgather_into(src, dst)
    }
}
