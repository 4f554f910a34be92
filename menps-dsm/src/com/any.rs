//! [`AnyCom`]: whichever backend the job runs on, behind one type.
//!
//! A program (or the DSM, generic over [`Communicator`](super::Communicator))
//! that must run both from `cargo run` (shm, the launcher relaunches the
//! program) and under `mpirun` (feature `mpi`) joins its job as `AnyCom`:
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! use menps_dsm::com::{AnyCom, Coll, Comm};
//! let com: AnyCom<ct_worker::OsThreads> = menps_dsm::launch::init_or_relaunch(4)?;
//! println!("rank {} of {} on {}", com.rank(), com.size(), com.backend_name());
//! com.barrier()?;
//! # Ok::<(), menps_dsm::com::Error>(())
//! ```
//!
//! [`AnyCom::Net`] is one of them inside the [network model](super::netmodel)
//! (`MENPS_NET_LATENCY`, `MENPS_NET_BANDWIDTH` or `MENPS_STATS` set when the
//! process joined).
//!
//! Every call is one `match` on the variant, then the backend's own
//! (monomorphised) code; both backends use the same [`Request`] type, so
//! asynchronous operations need no dispatch at all.

use ct_worker::{Ult, UltItf};

#[cfg(feature = "mpi")]
use super::MpiCom;
use super::{
    CasOp, Coll, Comm, LocalWindow, NetCom, P2p, RemotePtr, Request, Result, Rma, ShmCom, Source,
    Tag, Traffic, WindowId, Windows,
};

/// A communicator of any backend this build supports; see the
/// [module docs](self).
#[derive(Debug)]
#[non_exhaustive]
// The backends stay inline (no indirection on their calls); only the network
// model, which contains an `AnyCom`, is boxed.
#[allow(clippy::large_enum_variant)]
pub enum AnyCom<U: UltItf = Ult> {
    /// The embedded shm backend (job started by a menps launcher).
    Shm(ShmCom<U>),
    /// The MPI backend (job started by `mpirun`).
    #[cfg(feature = "mpi")]
    Mpi(MpiCom<U>),
    /// Another variant delayed and counted by a network model.
    Net(Box<NetCom<AnyCom<U>, U>>),
}

/// Runs `$body` with `$c` bound to the backend inside `$self`.
macro_rules! dispatch {
    ($self:expr, $c:ident => $body:expr) => {
        match $self {
            AnyCom::Shm($c) => $body,
            #[cfg(feature = "mpi")]
            AnyCom::Mpi($c) => $body,
            AnyCom::Net($c) => $body,
        }
    };
}

impl<U: UltItf> AnyCom<U> {
    /// `"shm"` or `"mpi"` (under a network model: the backend's).
    pub fn backend_name(&self) -> &'static str {
        match self {
            AnyCom::Shm(_) => "shm",
            #[cfg(feature = "mpi")]
            AnyCom::Mpi(_) => "mpi",
            AnyCom::Net(c) => c.inner().backend_name(),
        }
    }

    /// The shm communicator, if that is the backend (under a network model
    /// too).
    pub fn as_shm(&self) -> Option<&ShmCom<U>> {
        match self {
            AnyCom::Shm(c) => Some(c),
            AnyCom::Net(c) => c.inner().as_shm(),
            #[cfg(feature = "mpi")]
            _ => None,
        }
    }

    /// The MPI communicator, if that is the backend (under a network model
    /// too).
    #[cfg(feature = "mpi")]
    pub fn as_mpi(&self) -> Option<&MpiCom<U>> {
        match self {
            AnyCom::Mpi(c) => Some(c),
            AnyCom::Net(c) => c.inner().as_mpi(),
            _ => None,
        }
    }

    /// The network model, if the backend runs under one.
    pub fn as_net(&self) -> Option<&NetCom<AnyCom<U>, U>> {
        match self {
            AnyCom::Net(c) => Some(c),
            _ => None,
        }
    }
}

impl<U: UltItf> From<ShmCom<U>> for AnyCom<U> {
    fn from(c: ShmCom<U>) -> Self {
        AnyCom::Shm(c)
    }
}

#[cfg(feature = "mpi")]
impl<U: UltItf> From<MpiCom<U>> for AnyCom<U> {
    fn from(c: MpiCom<U>) -> Self {
        AnyCom::Mpi(c)
    }
}

impl<U: UltItf> Comm for AnyCom<U> {
    #[inline]
    fn rank(&self) -> usize {
        dispatch!(self, c => c.rank())
    }
    #[inline]
    fn size(&self) -> usize {
        dispatch!(self, c => c.size())
    }
    fn traffic(&self) -> Option<Traffic> {
        dispatch!(self, c => c.traffic())
    }
}

impl<U: UltItf> Windows for AnyCom<U> {
    fn create_window(&self, bytes: usize) -> Result<WindowId> {
        dispatch!(self, c => c.create_window(bytes))
    }
    fn destroy_window(&self, id: WindowId) -> Result<()> {
        dispatch!(self, c => c.destroy_window(id))
    }
    fn local_window(&self, id: WindowId) -> Result<LocalWindow> {
        dispatch!(self, c => c.local_window(id))
    }
    fn window_size(&self, id: WindowId) -> Result<usize> {
        dispatch!(self, c => c.window_size(id))
    }
}

impl<U: UltItf> Rma for AnyCom<U> {
    type Request = Request<U>;

    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Request<U>> {
        // SAFETY: forwarded contract.
        dispatch!(self, c => unsafe { c.read_nb(src, dst, len) })
    }
    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Request<U>> {
        // SAFETY: forwarded contract.
        dispatch!(self, c => unsafe { c.write_nb(dst, src, len) })
    }
    fn compare_and_swap_nb(
        &self,
        target: RemotePtr,
        expected: u64,
        new: u64,
    ) -> Result<Request<U>> {
        dispatch!(self, c => c.compare_and_swap_nb(target, expected, new))
    }
    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Request<U>> {
        dispatch!(self, c => c.fetch_add_nb(target, delta))
    }
    fn flush(&self, rank: usize) -> Result<()> {
        dispatch!(self, c => c.flush(rank))
    }
    fn flush_all(&self) -> Result<()> {
        dispatch!(self, c => c.flush_all())
    }
    #[inline]
    fn read(&self, src: RemotePtr, dst: &mut [u8]) -> Result<()> {
        dispatch!(self, c => c.read(src, dst))
    }
    #[inline]
    fn write(&self, dst: RemotePtr, src: &[u8]) -> Result<()> {
        dispatch!(self, c => c.write(dst, src))
    }
    #[inline]
    fn compare_and_swap(&self, target: RemotePtr, expected: u64, new: u64) -> Result<u64> {
        dispatch!(self, c => c.compare_and_swap(target, expected, new))
    }
    #[inline]
    fn fetch_add(&self, target: RemotePtr, delta: u64) -> Result<u64> {
        dispatch!(self, c => c.fetch_add(target, delta))
    }
    #[inline]
    fn atomic_load(&self, target: RemotePtr) -> Result<u64> {
        dispatch!(self, c => c.atomic_load(target))
    }
    fn compare_and_swap_all(&self, ops: &mut [CasOp]) -> Result<()> {
        dispatch!(self, c => c.compare_and_swap_all(ops))
    }
    fn read_all(&self, reads: &mut [(RemotePtr, &mut [u8])]) -> Result<()> {
        dispatch!(self, c => c.read_all(reads))
    }
    fn compare_and_swap_then_read_all(
        &self,
        ops: &mut [CasOp],
        reads: &mut [(RemotePtr, &mut [u8])],
    ) -> Result<()> {
        dispatch!(self, c => c.compare_and_swap_then_read_all(ops, reads))
    }
}

impl<U: UltItf> P2p for AnyCom<U> {
    fn max_message_bytes(&self) -> usize {
        dispatch!(self, c => c.max_message_bytes())
    }
    fn send(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()> {
        dispatch!(self, c => c.send(to, tag, data))
    }
    fn try_recv(&self, from: Source, tag: Tag) -> Result<Option<(usize, Vec<u8>)>> {
        dispatch!(self, c => c.try_recv(from, tag))
    }
    fn recv(&self, from: Source, tag: Tag) -> Result<(usize, Vec<u8>)> {
        dispatch!(self, c => c.recv(from, tag))
    }
    fn recv_into(&self, from: Source, tag: Tag, buf: &mut [u8]) -> Result<(usize, usize)> {
        dispatch!(self, c => c.recv_into(from, tag, buf))
    }
}

impl<U: UltItf> Coll for AnyCom<U> {
    fn barrier(&self) -> Result<()> {
        dispatch!(self, c => c.barrier())
    }
    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        dispatch!(self, c => c.broadcast(root, buf))
    }
    fn allgather_into(&self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        dispatch!(self, c => c.allgather_into(src, dst))
    }
    fn allgather_prefix_into(
        &self,
        src: &[u8],
        head: usize,
        used: &dyn Fn(&[u8]) -> usize,
        dst: &mut [u8],
    ) -> Result<()> {
        dispatch!(self, c => c.allgather_prefix_into(src, head, used, dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::com::RmaRequest;
    use ct_worker::OsThreads;

    #[test]
    fn dispatches_to_shm() {
        let com: AnyCom<OsThreads> = ShmCom::single().unwrap().into();
        assert_eq!((com.rank(), com.size(), com.backend_name()), (0, 1, "shm"));
        assert!(com.as_shm().is_some());
        let w = com.create_window(64).unwrap();
        com.write(w.at(0, 8), b"abc").unwrap();
        let mut b = [0u8; 3];
        com.read(w.at(0, 8), &mut b).unwrap();
        assert_eq!(&b, b"abc");
        assert_eq!(com.fetch_add_nb(w.at(0, 16), 4).unwrap().wait(), Ok(0));
        assert_eq!(com.compare_and_swap(w.at(0, 16), 4, 9), Ok(4));
        assert_eq!(com.atomic_load(w.at(0, 16)), Ok(9));
        com.send(0, 3, b"m").unwrap();
        assert_eq!(com.recv(Source::Rank(0), 3).unwrap(), (0, b"m".to_vec()));
        assert_eq!(com.allgather(&[7]).unwrap(), vec![7]);
        com.destroy_window(w).unwrap();
    }
}
