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
//! - **Collectives**: a dissemination barrier and double-buffered
//!   scratch slots (one barrier per chunk).
//! - **Waiting** polls with short pauses for about 5 µs, then yields (the user-level thread with
//!   `U::yield_now`, and the OS thread), then sleeps on the process's futex
//!   doorbell with a 1 ms timeout, yielding between sleeps — so four
//!   processes on two cores make progress and idle waiting costs no CPU.
//!   With more processes than processors a wait yields after two polls
//!   (the peer it waits for may be queued on its processor), and yields
//!   longer before it sleeps.
//! - **Failures**: the launcher marks ended processes in the control memory
//!   and rings every doorbell; waits check those marks. Nothing has a name in
//!   any file system, so nothing is left behind however the job ends.
//!
//! Processes join a job through [`crate::launch`]; [`ShmCom::single`] makes a
//! one-process communicator without a launcher (for tests and tools).

pub(crate) mod coll;
pub(crate) mod control;
pub(crate) mod p2p;
pub(crate) mod window;

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::Duration;

use ct_worker::{Ult, UltItf};

use super::wait::{Watch, poll_for};
use super::{Comm, Error, RemotePtr, Request, Result, Rma, check};
use control::{Control, state};
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
    /// Polls, then yields, before a wait sleeps (see [`SPIN_ROUNDS`]).
    spin_rounds: u32,
    yield_rounds: u32,
    _u: PhantomData<fn() -> U>,
}

impl<U: UltItf> core::fmt::Debug for ShmCom<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmCom")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Polls with a short pause in between (about 5 µs in all on this kind of
/// machine), so that a peer running on another core is seen at once.
const SPIN_ROUNDS: u32 = 128;
/// Then yields (each returns at once when nobody else waits for the
/// processor) for up to about a millisecond before sleeping: a peer a few
/// tens of microseconds behind — a barrier after uneven work, the next
/// fork of a short region — is met without a futex wake-up, whose latency
/// on a virtual machine is tens of microseconds.
const YIELD_ROUNDS: u32 = 1024;
/// The same when the job has more processes than the machine has
/// processors: the peer we wait for may be queued behind us on our own
/// processor, so the processor is given up almost at once, and for longer
/// before sleeping (a yield with nobody else runnable returns at once, so
/// this costs no latency when the peer runs elsewhere).
const SPIN_ROUNDS_OVERSUBSCRIBED: u32 = 2;
const YIELD_ROUNDS_OVERSUBSCRIBED: u32 = 256;
const SLEEP: Duration = Duration::from_millis(1);

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
        // More processes than processors (all of the job's processes run on
        // this machine).
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (spin_rounds, yield_rounds) = if size > cpus {
            (SPIN_ROUNDS_OVERSUBSCRIBED, YIELD_ROUNDS_OVERSUBSCRIBED)
        } else {
            (SPIN_ROUNDS, YIELD_ROUNDS)
        };
        ShmCom {
            rank,
            size,
            spin_rounds,
            yield_rounds,
            windows: window::WindowTable::new(),
            p2p: p2p::P2pState::new(size),
            coll: ct_sync::Mutex::new_in(coll::CollState::new(peers)),
            control,
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

    /// The error a wait must return now, if any (every wait also watches
    /// for the job's first death).
    fn failure(&self, watch: Watch) -> Option<Error> {
        if let Some(rank) = self.control.failed_rank() {
            return Some(Error::PeerDied { rank });
        }
        // A process that passed the barrier a wait is in has sent every
        // signal of it: only one that left before counts.
        let before = match watch {
            Watch::AllOthers(barrier) => barrier,
            Watch::Rank(_) | Watch::AnyOther => None,
        };
        let exited = watch
            .departed(self.rank, self.size, |r| {
                let slot = self.control.slot(r);
                let left = slot.state.load(Ordering::Acquire) != state::RUNNING
                    && before.is_none_or(|epoch| {
                        let passed = slot.passed.load(Ordering::Acquire);
                        (passed.wrapping_sub(epoch) as i32) < 0
                    });
                left.then(|| u64::from(slot.ended_seq.load(Ordering::Acquire)))
            })
            .map(|rank| Error::PeerExited { rank });
        // The launcher records a death (the `failed` word) before the
        // process's state: having seen the state, re-read the word, which
        // the first read above may have missed.
        exited.map(|e| match self.control.failed_rank() {
            Some(rank) => Error::PeerDied { rank },
            None => e,
        })
    }

    /// The error for a peer whose socket closed: the process has ended, and
    /// the launcher records how (death or exit) moments later; wait up to a
    /// second for that verdict.
    pub(crate) fn departure_of(&self, rank: usize) -> Error {
        poll_for::<U, _>(Duration::from_secs(1), 0, || {
            self.failure(Watch::Rank(rank))
        })
        .unwrap_or(Error::PeerExited { rank })
    }

    /// Polls until `poll` gives a value, an error, or `watch` (or a death in
    /// the job) says it never will. Backs off: spin, yield, doorbell sleep.
    /// A wait longer than the watchdog period (`MENPS_WATCHDOG_SECS`) is
    /// reported once, naming `what` is awaited and any stopped peer (`None`:
    /// a wait that may last as long as the program likes, such as a server
    /// waiting for its next request).
    pub(crate) fn wait_until<T>(
        &self,
        watch: Watch,
        what: Option<&dyn Fn() -> String>,
        mut poll: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let mut round = 0u32;
        let mut asleep_since: Option<std::time::Instant> = None;
        let mut reported = false;
        loop {
            if let Some(v) = poll()? {
                return Ok(v);
            }
            if let Some(e) = self.failure(watch) {
                // What we wait for may have happened just before the peer left.
                return poll()?.ok_or(e);
            }
            if round < self.spin_rounds {
                std::hint::spin_loop();
            } else if round < self.spin_rounds + self.yield_rounds {
                U::yield_now();
                // On OS threads `U::yield_now` was the processor's yield.
                if core::any::TypeId::of::<U>() != core::any::TypeId::of::<ct_worker::OsThreads>() {
                    std::thread::yield_now();
                }
            } else {
                let since = *asleep_since.get_or_insert_with(std::time::Instant::now);
                if !reported
                    && let Some(what) = what
                    && let Some(period) = crate::launch::watchdog_period()
                    && since.elapsed() >= period
                {
                    let msg = self.report_long_wait(watch, what, period);
                    reported = true;
                    if crate::launch::watchdog_fails() {
                        return Err(Error::Stalled(msg));
                    }
                }
                // Peers are watched here too, not only by the launcher (which
                // may be stopped or descheduled): every 64 sleeps, about
                // every 64 ms.
                if (round - self.spin_rounds - self.yield_rounds).is_multiple_of(64) {
                    self.watch_peers();
                }
                let slot = self.control.slot(self.rank);
                slot.sleepers.fetch_add(1, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                let bell = slot.doorbell.load(Ordering::SeqCst);
                let r = poll();
                if matches!(r, Ok(None)) && self.failure(watch).is_none() {
                    crate::sys::futex_wait(&slot.doorbell, bell, SLEEP);
                }
                slot.sleepers.fetch_sub(1, Ordering::SeqCst);
                if let Some(v) = r? {
                    return Ok(v);
                }
                // Let other user-level threads of this worker run between
                // sleeps.
                U::yield_now();
            }
            round = round.saturating_add(1);
        }
    }

    /// Records peers that have ended (gone, or zombies their launcher has
    /// not reaped), from `/proc`, with their exit status: a dead peer is
    /// detected even when the launcher cannot run.
    #[cold]
    fn watch_peers(&self) {
        for r in (0..self.size).filter(|&r| r != self.rank) {
            let slot = self.control.slot(r);
            let pid = slot.pid.load(Ordering::Relaxed);
            if pid == 0 || slot.state.load(Ordering::Acquire) != state::RUNNING {
                continue;
            }
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                // Gone: reaped by our launcher, which records how it ended a
                // moment later (a process that exited well after its last
                // barrier was taken for dead when we looked in between), or
                // by someone else — then it did not end well.
                Err(_) => {
                    if !self.verdict_within(r, Duration::from_secs(1)) {
                        self.control.mark_ended(r, false);
                    }
                }
                Ok(stat) => {
                    let Some((_, rest)) = stat.rsplit_once(')') else {
                        continue;
                    };
                    let fields: Vec<&str> = rest.split_whitespace().collect();
                    if matches!(fields.first(), Some(&"Z" | &"X")) {
                        // Field 52, the wait status (field 3 is fields[0]).
                        let ok = fields.get(49).and_then(|v| v.parse::<i32>().ok()) == Some(0);
                        self.control.mark_ended(r, ok);
                    }
                }
            }
        }
    }

    /// Waits up to `limit` for the launcher to record that rank `r` ended;
    /// whether it did.
    #[cold]
    fn verdict_within(&self, r: usize, limit: Duration) -> bool {
        let slot = self.control.slot(r);
        poll_for::<U, _>(limit, 0, || {
            (slot.state.load(Ordering::Acquire) != state::RUNNING).then_some(())
        })
        .is_some()
    }

    /// The watchdog's report: this process has waited `period` for `what`
    /// from the peers of `watch`; peers that are stopped (`SIGSTOP`, a
    /// debugger) are named, since they are the usual reason.
    #[cold]
    fn report_long_wait(
        &self,
        watch: Watch,
        what: &dyn Fn() -> String,
        period: Duration,
    ) -> String {
        let peers: Vec<usize> = match watch {
            Watch::Rank(r) => vec![r],
            Watch::AllOthers(_) | Watch::AnyOther => {
                (0..self.size).filter(|&r| r != self.rank).collect()
            }
        };
        let stopped: Vec<String> = peers
            .iter()
            .filter_map(|&r| {
                let pid = self.control.slot(r).pid.load(Ordering::Relaxed);
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // The state follows the command name's closing parenthesis.
                let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
                matches!(state, 'T' | 't').then(|| format!("rank {r} (pid {pid}) is stopped"))
            })
            .collect();
        let whom = match watch {
            Watch::Rank(r) => format!("rank {r}"),
            Watch::AllOthers(_) => "every other rank".to_string(),
            Watch::AnyOther => "any other rank".to_string(),
        };
        let mut msg = format!(
            "rank {} has waited {:.0} s for {whom} ({})",
            self.rank,
            period.as_secs_f64(),
            what()
        );
        if !stopped.is_empty() {
            msg.push_str(": ");
            msg.push_str(&stopped.join(", "));
        }
        let going_on = if crate::launch::watchdog_fails() {
            "giving up"
        } else {
            "still waiting"
        };
        // One write, so that other processes' output cannot split the line.
        let line = format!("menps: {msg}; {going_on}\n");
        use std::io::Write;
        let _ = std::io::stderr().write_all(line.as_bytes());
        msg
    }

    #[inline]
    fn atomic_at(&self, p: RemotePtr) -> Result<&AtomicU64> {
        self.check_alive()?;
        check::aligned_word(p)?;
        let a = self.windows.resolve(p, 8, self.size)?;
        // SAFETY: `resolve` checked that the 8 bytes lie inside a live
        // window mapping; window bases are page-aligned and the offset is a
        // multiple of 8, so the word is aligned; any bit pattern is a valid
        // AtomicU64, and the mapping outlives `&self` (destroyed windows stay
        // reserved).
        Ok(unsafe { &*(a as *const AtomicU64) })
    }

    /// Blocking read (the hot path, without a request).
    #[inline]
    fn do_read(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<()> {
        self.check_alive()?;
        let s = self.windows.resolve(src, len, self.size)?;
        // SAFETY: `s..s+len` is inside a live mapping (checked); the caller
        // guarantees `dst` is valid for `len` bytes. `copy` tolerates overlap
        // (a read from one's own window into itself). Concurrent conflicting
        // remote writes give unspecified bytes, as with RDMA; the DSM's
        // protocol excludes them.
        unsafe { copy_bytes(s, dst, len) };
        Ok(())
    }

    /// Blocking write (the hot path, without a request).
    #[inline]
    fn do_write(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<()> {
        self.check_alive()?;
        let d = self.windows.resolve(dst, len, self.size)?;
        // SAFETY: as in `do_read`, with the roles swapped.
        unsafe { copy_bytes(src, d, len) };
        Ok(())
    }
}

/// `memmove` with a fast path for word-sized copies.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes.
#[inline(always)]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: per the contract; unaligned accesses are allowed by
    // read/write_unaligned, and a single load-then-store is overlap-safe.
    unsafe {
        match len {
            8 => ptr::write_unaligned(dst.cast::<u64>(), ptr::read_unaligned(src.cast::<u64>())),
            4 => ptr::write_unaligned(dst.cast::<u32>(), ptr::read_unaligned(src.cast::<u32>())),
            16 => ptr::write_unaligned(dst.cast::<u128>(), ptr::read_unaligned(src.cast::<u128>())),
            _ => ptr::copy(src, dst, len),
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

impl<U: UltItf> Rma for ShmCom<U> {
    type Request = Request<U>;

    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Request<U>> {
        self.do_read(src, dst, len)?;
        Ok(Request::ready(Ok(0)))
    }

    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Request<U>> {
        self.do_write(dst, src, len)?;
        Ok(Request::ready(Ok(0)))
    }

    fn compare_and_swap_nb(&self, at: RemotePtr, expected: u64, new: u64) -> Result<Request<U>> {
        self.compare_and_swap(at, expected, new)
            .map(|v| Request::ready(Ok(v)))
    }

    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Request<U>> {
        self.fetch_add(target, delta).map(|v| Request::ready(Ok(v)))
    }

    fn flush(&self, rank: usize) -> Result<()> {
        check::rank(rank, self.size)?;
        fence(Ordering::SeqCst);
        self.check_alive()
    }

    fn flush_all(&self) -> Result<()> {
        fence(Ordering::SeqCst);
        self.check_alive()
    }

    #[inline]
    fn read(&self, src: RemotePtr, dst: &mut [u8]) -> Result<()> {
        self.do_read(src, dst.as_mut_ptr(), dst.len())
    }

    #[inline]
    fn write(&self, dst: RemotePtr, src: &[u8]) -> Result<()> {
        self.do_write(dst, src.as_ptr(), src.len())
    }

    #[inline]
    fn compare_and_swap(&self, target: RemotePtr, expected: u64, new: u64) -> Result<u64> {
        let w = self.atomic_at(target)?;
        Ok(
            match w.compare_exchange(expected, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    #[inline]
    fn fetch_add(&self, target: RemotePtr, delta: u64) -> Result<u64> {
        Ok(self.atomic_at(target)?.fetch_add(delta, Ordering::SeqCst))
    }

    #[inline]
    fn atomic_load(&self, target: RemotePtr) -> Result<u64> {
        Ok(self.atomic_at(target)?.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::com::{Coll, P2p, RmaRequest, Source, WindowId, Windows};
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
