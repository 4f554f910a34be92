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
//!   Whether CPU atomics on [`LocalWindow::atomic_u64`] are atomic with
//!   respect to them depends on the adapter ([`VerbsCom::cpu_atomics_coherent`],
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

mod ctx;
mod device;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ct_config::vars;
use ct_delegate::Offloader;
use ct_worker::{Ult, UltItf};

use super::outcome::Outcome;
use super::{
    Coll, Comm, Communicator, Error, LocalWindow, P2p, RemotePtr, Request, Result, Rma, RmaRequest,
    Source, Tag, WindowId, Windows,
};
use ctx::{Ctx, Mr, QP_INFO_BYTES, Qp, QpInfo};
use device::{Command, Kind, VerbsDevice};

/// Names of the environment variables this backend reads.
pub mod env {
    /// Adapter name.
    pub const DEVICE: &str = ct_config::vars::MENPS_VERBS_DEVICE.name;
    /// Port number.
    pub const PORT: &str = ct_config::vars::MENPS_VERBS_PORT.name;
    /// GID index.
    pub const GID_INDEX: &str = ct_config::vars::MENPS_VERBS_GID_INDEX.name;
}

/// Settings of [`VerbsCom`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Adapter name (`None`: the first).
    pub device: Option<String>,
    /// Port number (from 1).
    pub port: u8,
    /// GID table index.
    pub gid_index: u8,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            device: None,
            port: 1,
            gid_index: 0,
        }
    }
}

impl VerbsConfig {
    /// The defaults with the `MENPS_VERBS_*` variables applied.
    pub fn from_env() -> Result<Self> {
        let d = VerbsConfig::default();
        let bad = |e: ct_config::Error| Error::BadConfig(e.to_string());
        let byte = |v: &ct_config::Var, d: u8| -> Result<u8> {
            // The variables' ranges (1..=255, 0..=255) fit in a byte.
            Ok(v.count()
                .map_err(bad)?
                .map_or(d, |n| u8::try_from(n).unwrap_or(u8::MAX)))
        };
        Ok(VerbsConfig {
            device: vars::MENPS_VERBS_DEVICE.text().map_err(bad)?.or(d.device),
            port: byte(&vars::MENPS_VERBS_PORT, d.port)?,
            gid_index: byte(&vars::MENPS_VERBS_GID_INDEX, d.gid_index)?,
        })
    }
}

/// Names of the RDMA adapters of this machine, or
/// [`Error::BackendUnavailable`] if there are none.
pub fn devices() -> Result<Vec<String>> {
    ctx::device_names()
}

const LIVE: u8 = 1;
const DESTROYED: u8 = 2;

/// Most windows a job can create over its lifetime.
pub const MAX_WINDOWS: usize = 4096;

#[derive(Default)]
struct Slot {
    state: AtomicU8,
    size: AtomicUsize,
    base: AtomicUsize,
    /// (address, rkey) of every process's part.
    remote: OnceLock<Box<[(u64, u32)]>>,
}

/// A registered window part of this process.
struct Part {
    id: u32,
    base: *mut u8,
    len: usize,
    mr: Option<Mr>,
}

// SAFETY: the part is an address range and a registration handle.
unsafe impl Send for Part {}

/// Communicator of the `verbs` backend over the bootstrap `B`; see the
/// [module docs](self).
pub struct VerbsCom<B: Communicator, U: UltItf = Ult> {
    boot: B,
    offloader: Arc<Offloader<VerbsDevice, U>>,
    slots: Box<[Slot]>,
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
            slots: (0..MAX_WINDOWS).map(|_| Slot::default()).collect(),
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

    fn live_slot(&self, id: WindowId) -> Result<&Slot> {
        match self.slots.get(id.0 as usize) {
            Some(s) if s.state.load(Ordering::Acquire) == LIVE => Ok(s),
            _ => Err(Error::UnknownWindow { window: id.0 }),
        }
    }

    /// (remote address, rkey) of `len` bytes at `p`, checked as on shm.
    fn resolve(&self, p: RemotePtr, len: usize) -> Result<(u64, u32)> {
        let w = p.window().0;
        let s = self.live_slot(p.window())?;
        if p.rank() >= self.boot.size() {
            return Err(Error::BadRank {
                rank: p.rank(),
                size: self.boot.size(),
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
        let (addr, rkey) = s.remote.get().expect("a live window has its table")[p.rank()];
        Ok((addr + off, rkey))
    }

    fn resolve_atomic(&self, p: RemotePtr) -> Result<(u64, u32)> {
        if !p.offset().is_multiple_of(8) {
            return Err(Error::UnalignedAtomic {
                window: p.window().0,
                offset: p.offset(),
            });
        }
        self.resolve(p, 8)
    }

    fn submit(&self, rank: usize, (remote_addr, rkey): (u64, u32), kind: Kind) -> Request<U> {
        let out = Outcome::new(0, 0);
        let (req, completer) = Request::<U>::pending();
        let o = out.clone();
        self.offloader.submit(
            Command::Rma {
                rank,
                remote_addr,
                rkey,
                kind,
                out,
            },
            move || completer.complete(o.take()),
        );
        req
    }

    fn drain(&self) -> Result<()> {
        if !self.offloader.is_executor_running() && self.offloader.in_flight() == 0 {
            return Ok(());
        }
        let (req, completer) = Request::<U>::pending();
        self.offloader
            .submit(Command::Flush, move || completer.complete(Ok(0)));
        req.wait().map(drop)
    }
}

impl<B: Communicator, U: UltItf> Drop for VerbsCom<B, U> {
    fn drop(&mut self) {
        let until = Instant::now() + Duration::from_secs(2);
        // The workspace's back-off: it parks an OS thread, never a worker.
        let mut backoff = ct_sync::Backoff::parking(50);
        while (self.offloader.in_flight() > 0 || self.offloader.is_executor_running())
            && Instant::now() < until
        {
            backoff.snooze(U::yield_now);
        }
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        for p in parts.drain(..) {
            drop(p.mr);
            // SAFETY: our window memory, deregistered; the communicator is
            // going away, so no access through it remains.
            unsafe { libc::munmap(p.base.cast(), p.len) };
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

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}

impl<B: Communicator, U: UltItf> Windows for VerbsCom<B, U> {
    fn create_window(&self, bytes: usize) -> Result<WindowId> {
        let mut next = self.next_window.lock();
        let id = *next;
        let (me, n) = (self.rank(), self.size());
        let mine = [u64::from(id), bytes as u64].map(u64::to_le_bytes).concat();
        let all = self.boot.allgather(&mine)?;
        for r in 0..n {
            let (rid, rbytes) = (u64_at(&all, 2 * r), u64_at(&all, 2 * r + 1));
            if rid != u64::from(id) || rbytes != bytes as u64 {
                return Err(Error::CollectiveMismatch(format!(
                    "create_window: rank {r} asked for window {rid} of {rbytes} bytes, rank {me} \
                     for window {id} of {bytes} bytes (every process must create the same \
                     windows in the same order)"
                )));
            }
        }
        if id as usize >= MAX_WINDOWS {
            return Err(Error::BadConfig(format!(
                "too many windows: a job can create at most {MAX_WINDOWS}"
            )));
        }
        let page = crate::sys::page_size();
        let len = crate::sys::round_up(bytes.max(1), page).ok_or_else(|| {
            Error::InvalidArgument(format!("window of {bytes} bytes is too large"))
        })?;
        // Shared (anonymous, zero-filled), as the `Windows` rules require:
        // the DSM maps a window's pages a second time (`mremap` with old
        // size 0 only duplicates shared mappings).
        // SAFETY: a fresh mapping chosen by the kernel.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        // Everyone must know whether everyone succeeded before exchanging
        // keys; a failed registration is reported by all.
        let reg = if base == libc::MAP_FAILED {
            Err(crate::sys::os_error("mmap (window)"))
        } else {
            // SAFETY: the mapping lives until the window is destroyed or the
            // communicator dropped, after the registration is dropped.
            unsafe { Mr::register(&self.ctx, base.cast(), len, ctx::remote_access()) }
        };
        let entry = match &reg {
            Ok(mr) => [base as u64, u64::from(mr.rkey()), 1],
            Err(_) => [0, 0, 0],
        };
        let all = self.boot.allgather(&entry.map(u64::to_le_bytes).concat())?;
        let failed = (0..n).find(|&r| u64_at(&all, 3 * r + 2) == 0);
        if reg.is_err() || failed.is_some() {
            drop(reg);
            if base != libc::MAP_FAILED {
                // SAFETY: our mapping, unregistered and unused.
                unsafe { libc::munmap(base, len) };
            }
            return Err(Error::Transport(format!(
                "create_window: rank {} could not register {len} bytes with the RDMA device",
                failed.unwrap_or(me)
            )));
        }
        let mr = reg.expect("checked");
        let lkey = mr.lkey();
        let table: Box<[(u64, u32)]> = (0..n)
            .map(|r| (u64_at(&all, 3 * r), u64_at(&all, 3 * r + 1) as u32))
            .collect();
        self.offloader
            .with_device(|d| d.add_window(base as usize, len, lkey));
        let slot = &self.slots[id as usize];
        slot.size.store(bytes, Ordering::Relaxed);
        slot.base.store(base as usize, Ordering::Relaxed);
        let _ = slot.remote.set(table);
        self.parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Part {
                id,
                base: base.cast(),
                len,
                mr: Some(mr),
            });
        slot.state.store(LIVE, Ordering::Release);
        *next += 1;
        Ok(WindowId(id))
    }

    fn destroy_window(&self, id: WindowId) -> Result<()> {
        let _next = self.next_window.lock();
        let mine = match self.live_slot(id) {
            Ok(_) => u64::from(id.0),
            Err(_) => u64::MAX,
        };
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
        let slot = &self.slots[id.0 as usize];
        slot.state.store(DESTROYED, Ordering::Release);
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
        drop(part.mr);
        // SAFETY: exactly our window's mapping, now unregistered: replaced
        // by an inaccessible reservation that is never unmapped.
        unsafe {
            libc::mmap(
                part.base.cast(),
                part.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        Ok(())
    }

    fn local_window(&self, id: WindowId) -> Result<LocalWindow> {
        let s = self.live_slot(id)?;
        // SAFETY: our registered, page-aligned part of a live window; it is
        // replaced by a reservation (not unmapped) on destruction.
        Ok(unsafe {
            LocalWindow::from_raw(
                id,
                s.base.load(Ordering::Relaxed) as *mut u8,
                s.size.load(Ordering::Relaxed),
            )
        })
    }

    fn window_size(&self, id: WindowId) -> Result<usize> {
        Ok(self.live_slot(id)?.size.load(Ordering::Relaxed))
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

    fn compare_and_swap_nb(
        &self,
        target: RemotePtr,
        expected: u64,
        new: u64,
    ) -> Result<Request<U>> {
        let t = self.resolve_atomic(target)?;
        Ok(self.submit(target.rank(), t, Kind::Cas { expected, new }))
    }

    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Request<U>> {
        let t = self.resolve_atomic(target)?;
        Ok(self.submit(target.rank(), t, Kind::FetchAdd { delta }))
    }

    fn flush(&self, rank: usize) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::BadRank {
                rank,
                size: self.size(),
            });
        }
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
