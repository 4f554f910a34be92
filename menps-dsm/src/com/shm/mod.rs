//! The embedded `shm` backend: the processes of a job on one machine.
//!
//! - **Windows** are `memfd` objects created by rank 0 and passed to the
//!   others over Unix sockets (`SCM_RIGHTS`); every process maps every
//!   window `MAP_SHARED`, so RMA reads and writes are memory copies on the
//!   mapping and compare-and-swap / fetch-and-add are hardware atomics on it
//!   — truly one-sided, the target's CPU is never involved, as with RDMA.
//! - **Point-to-point** messages go through a byte ring per ordered pair of
//!   processes in the control memory (module `control`); the receiver drains its
//!   rings into per-(sender, tag) queues, which gives tag matching and FIFO
//!   order per (sender, receiver, tag).
//! - **Collectives**: a central or a dissemination barrier
//!   (`MENPS_SHM_BARRIER`) and double-buffered scratch slots (one barrier
//!   per chunk).
//! - **Waiting** polls with short pauses for about 5 µs, then yields (the user-level thread with
//!   `U::yield_now`, and the OS thread), then sleeps on the process's futex
//!   doorbell with a 1 ms timeout, yielding between sleeps — so four
//!   processes on two cores make progress and idle waiting costs no CPU.
//!   A user-level thread on a worker does not sleep its worker: it parks,
//!   and the communicator's doorbell watcher, an OS thread started on first
//!   use that sleeps on the doorbell in its place, wakes it at every ring,
//!   and every 16 ms without one (module `bell`); the worker runs its
//!   other threads meanwhile, and sleeps when it has none. With more processes than processors a wait yields after two polls
//!   (the peer it waits for may be queued on its processor), and yields
//!   longer before it sleeps.
//! - **Failures**: the launcher marks ended processes in the control memory
//!   and rings every doorbell; waits check those marks. Nothing has a name in
//!   any file system, so nothing is left behind however the job ends.
//!
//! Processes join a job through [`crate::launch`]; [`ShmCom::single`] makes a
//! one-process communicator without a launcher (for tests and tools).

mod bell;
pub(crate) mod coll;
pub(crate) mod control;
pub(crate) mod p2p;
mod rma;
mod wait;
pub(crate) mod window;

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use ct_worker::{Ult, UltItf};

use super::{Comm, Error, RemotePtr, Result};
use control::Control;
pub use window::MAX_WINDOWS;

/// Communicator of the shm backend, generic over the threading library the
/// callers run on (`U::yield_now` while waiting; default: `ct-worker`'s
/// user-level threads, [`ct_worker::OsThreads`] for plain threads).
///
/// It is `Send + Sync`: share it (`&` or `Arc`) between threads and
/// user-level threads of the process. At most one joined communicator exists
/// per process.
pub struct ShmCom<U: UltItf = Ult> {
    rank: usize,
    size: usize,
    control: Control,
    windows: window::WindowTable,
    p2p: p2p::P2pState,
    coll: ct_sync::Mutex<coll::CollState, U>,
    /// Polls, then yields, before a wait sleeps (see `wait::rounds`).
    spin_rounds: u32,
    yield_rounds: u32,
    /// The job's barrier algorithm (from the control memory).
    barrier_kind: coll::BarrierKind,
    /// Where user-level threads park instead of sleeping on the doorbell;
    /// stopped in `drop`, before the control memory is unmapped.
    bell: bell::Bell<U>,
    _u: PhantomData<fn() -> U>,
}

impl<U: UltItf> Drop for ShmCom<U> {
    fn drop(&mut self) {
        // The watcher sleeps on our doorbell, in the control memory: it must
        // end before `control` is unmapped (whatever the fields' order).
        self.bell.shutdown();
    }
}

impl<U: UltItf> core::fmt::Debug for ShmCom<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmCom")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl<U: UltItf> ShmCom<U> {
    pub(crate) fn from_parts(
        rank: usize,
        size: usize,
        control: Control,
        peers: Vec<Option<OwnedFd>>,
    ) -> Self {
        debug_assert_eq!(control.layout().nprocs, size);
        control
            .slot(rank)
            .joined
            .store(1, std::sync::atomic::Ordering::Release);
        let (spin_rounds, yield_rounds) = wait::rounds(size);
        ShmCom {
            rank,
            size,
            spin_rounds,
            yield_rounds,
            barrier_kind: control.barrier_kind(),
            windows: window::WindowTable::new(),
            p2p: p2p::P2pState::new(size),
            coll: ct_sync::Mutex::new_in(coll::CollState::new(peers)),
            control,
            bell: bell::Bell::new(),
            _u: PhantomData,
        }
    }

    /// A communicator for a job of one process, without a launcher: windows,
    /// RMA, messages to itself and collectives all work. Independent of any
    /// joined communicator.
    pub fn single() -> Result<Self> {
        let (control, _fd) =
            Control::create(1, control::DEFAULT_RING_BYTES, control::DEFAULT_CHUNK_BYTES)?;
        Ok(Self::from_parts(0, 1, control, vec![None]))
    }

    /// The barrier algorithm of the job: `"central"` or `"dissemination"`
    /// (`MENPS_SHM_BARRIER`, chosen by the launcher).
    pub fn barrier_algorithm(&self) -> &'static str {
        match self.barrier_kind {
            coll::BarrierKind::Central => "central",
            coll::BarrierKind::Dissemination => "dissemination",
        }
    }

    /// The rank that died first, if a process of the job has died.
    pub fn failed_rank(&self) -> Option<usize> {
        self.control.failed_rank()
    }

    /// The address, in this process, of `len` bytes at `p` (bounds-checked).
    ///
    /// On shm every window of every process is mapped here, so the DSM (and
    /// benchmarks' baselines) can access remote memory directly. Using the
    /// pointer is `unsafe` and subject to the same rules as the window's
    /// memory; it is valid until the window is destroyed.
    pub fn translate(&self, p: RemotePtr, len: usize) -> Result<*mut u8> {
        self.windows.resolve(p, len, self.size)
    }

    #[inline]
    fn check_alive(&self) -> Result<()> {
        match self.control.failed_word().load(Ordering::Relaxed) {
            0 => Ok(()),
            r => Err(Error::PeerDied {
                rank: r as usize - 1,
            }),
        }
    }
}

impl<U: UltItf> Comm for ShmCom<U> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::com::{Coll, P2p, Rma, RmaRequest, Source, WindowId, Windows};
    use ct_worker::OsThreads;

    #[test]
    fn single_process_communicator() {
        let com = ShmCom::<OsThreads>::single().unwrap();
        assert_eq!((com.rank(), com.size()), (0, 1));
        let w = com.create_window(100).unwrap();
        assert_eq!(com.window_size(w), Ok(100));
        com.write(w.at(0, 3), b"hello").unwrap();
        let mut b = [0u8; 5];
        com.read(w.at(0, 3), &mut b).unwrap();
        assert_eq!(&b, b"hello");
        let local = com.local_window(w).unwrap();
        // SAFETY: nothing else accesses the window.
        assert_eq!(&unsafe { local.as_slice() }[3..8], b"hello");
        assert_eq!(com.compare_and_swap(w.at(0, 8), 0, 5), Ok(0));
        assert_eq!(com.compare_and_swap(w.at(0, 8), 0, 6), Ok(5));
        assert_eq!(com.fetch_add_nb(w.at(0, 8), 2).unwrap().wait(), Ok(5));
        assert_eq!(com.atomic_load(w.at(0, 8)), Ok(7));
        assert!(matches!(
            com.read(w.at(0, 98), &mut b),
            Err(Error::OutOfBounds {
                window: 0,
                offset: 98,
                len: 5,
                size: 100
            })
        ));
        assert!(matches!(
            com.fetch_add(w.at(0, 96), 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            com.fetch_add(w.at(0, 1), 1),
            Err(Error::UnalignedAtomic { .. })
        ));
        assert!(matches!(
            com.read(WindowId(7).at(0, 0), &mut b),
            Err(Error::UnknownWindow { window: 7 })
        ));
        assert!(matches!(
            com.read(w.at(1, 0), &mut b),
            Err(Error::BadRank { rank: 1, size: 1 })
        ));
        let p = com.translate(w.at(0, 3), 5).unwrap();
        // SAFETY: 5 bytes inside the live window, nobody writes them.
        assert_eq!(unsafe { std::slice::from_raw_parts(p, 5) }, b"hello");

        com.send(0, 9, b"x").unwrap();
        com.send(0, 8, b"y").unwrap();
        assert_eq!(com.recv(Source::Any, 8).unwrap(), (0, b"y".to_vec()));
        assert_eq!(
            com.try_recv(Source::Rank(0), 9).unwrap(),
            Some((0, b"x".to_vec()))
        );
        assert_eq!(com.try_recv(Source::Rank(0), 9).unwrap(), None);
        assert!(matches!(
            com.recv(Source::Rank(3), 1),
            Err(Error::BadRank { .. })
        ));

        com.barrier().unwrap();
        let mut data = vec![1, 2, 3];
        com.broadcast(0, &mut data).unwrap();
        assert_eq!(com.allgather(&data).unwrap(), vec![1, 2, 3]);
        com.destroy_window(w).unwrap();
        assert!(matches!(
            com.fetch_add(w.at(0, 8), 1),
            Err(Error::UnknownWindow { .. })
        ));
        assert_eq!(com.failed_rank(), None);
    }
}
