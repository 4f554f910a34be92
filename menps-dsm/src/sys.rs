//! Thin wrappers over the Linux facilities the shm backend and the launcher
//! use: `memfd_create`, shared mappings, futexes, `SCM_RIGHTS` descriptor
//! passing over Unix sockets, and `pidfd_open`.
//!
//! The calls go through `rustix` (typed flags, owned descriptors, no
//! `errno` juggling), which leaves `unsafe` only where the operation itself
//! is unsafe — creating and removing mappings — and one `fcntl` on a raw
//! descriptor number (see [`set_cloexec`]). The rest of the crate sees owned
//! descriptors and [`Mapping`]s.

use std::ffi::CStr;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::fs::MemfdFlags;
use rustix::io::Errno;
use rustix::mm::{self, MapFlags, ProtFlags};
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, PidfdFlags};
use rustix::thread::futex;
use rustix::time::{ClockId, Timespec};

use crate::com::Error;

/// The calling thread's `errno` as an [`Error::Os`] for `call`.
pub(crate) fn os_error(call: &'static str) -> Error {
    Error::Os {
        call,
        errno: io::Error::last_os_error().raw_os_error().unwrap_or(0),
    }
}

/// [`Error::Os`] from an `io::Error`.
pub(crate) fn io_error(call: &'static str, e: &io::Error) -> Error {
    Error::Os {
        call,
        errno: e.raw_os_error().unwrap_or(0),
    }
}

/// [`Error::Os`] from a `rustix` error.
fn errno_error(call: &'static str, e: Errno) -> Error {
    Error::Os {
        call,
        errno: e.raw_os_error(),
    }
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

/// `x` rounded up to a multiple of `to` (a power of two), or `None` on overflow.
pub(crate) fn round_up(x: usize, to: usize) -> Option<usize> {
    debug_assert!(to.is_power_of_two());
    x.checked_add(to - 1).map(|v| v & !(to - 1))
}

/// Creates an anonymous memory file of `len` bytes (zero-filled, close-on-exec).
/// It has no name in any file system; it disappears with its last descriptor
/// and mapping.
pub(crate) fn memfd(name: &CStr, len: usize) -> Result<OwnedFd, Error> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC)
        .map_err(|e| errno_error("memfd_create", e))?;
    let len = i64::try_from(len)
        .map_err(|_| Error::BadConfig(format!("memory object of {len} bytes is too large")))?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(|e| errno_error("ftruncate", e))?;
    Ok(fd)
}

/// Size in bytes of the file behind `fd`.
pub(crate) fn file_size(fd: BorrowedFd<'_>) -> Result<usize, Error> {
    let st = rustix::fs::fstat(fd).map_err(|e| errno_error("fstat", e))?;
    Ok(st.st_size as usize)
}

/// A `MAP_SHARED` read-write mapping of a memory file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an address range; the memory behind it is shared with
// other processes anyway, and all access to it goes through raw pointers or
// atomics whose users uphold their own synchronisation.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the address and the length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` shared and read-write. `len` must
    /// be non-zero.
    pub(crate) fn shared(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, Error> {
        assert!(len > 0, "empty mapping");
        // SAFETY: a fresh mapping chosen by the kernel (no MAP_FIXED) cannot
        // alias any existing Rust object; `fd` is valid for the call.
        let p = unsafe {
            mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| errno_error("mmap", e))?;
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
        })
    }

    /// First byte of the mapping.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Replaces the mapping with an inaccessible reservation of the same
    /// range and forgets it: the shared memory is released, and any stale
    /// pointer into the range faults instead of reaching memory that was
    /// reused for something else. The address range stays reserved for the
    /// life of the process.
    pub(crate) fn retire(self) {
        // SAFETY: the range is exactly our own mapping; MAP_FIXED replaces it
        // atomically with a PROT_NONE anonymous reservation, which nothing
        // else can be placed into.
        let r = unsafe {
            mm::mmap_anonymous(
                self.ptr.as_ptr().cast(),
                self.len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::FIXED | MapFlags::NORESERVE,
            )
        };
        // Whether or not that worked, never munmap: if the reservation failed,
        // the shared mapping stays (leaked) rather than freeing the range for
        // reuse.
        let _ = r;
        std::mem::forget(self);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; whoever still holds references into it
        // is bound by the lifetime of `&self` of the structure owning us.
        // Unmapping our own valid range cannot fail.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Works across
/// processes on a `MAP_SHARED` mapping (no `FUTEX_PRIVATE_FLAG`). Spurious
/// returns are allowed.
#[inline]
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // Every outcome (woken, value changed, timed out, interrupted) means
    // "look again" to the caller.
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes every thread (of any process) sleeping in [`futex_wait`] on `word`.
#[inline]
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

/// A connected pair of `SOCK_SEQPACKET` Unix sockets (close-on-exec).
pub(crate) fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), Error> {
    net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| errno_error("socketpair", e))
}

/// Sets or clears `FD_CLOEXEC` on `fd`.
///
/// Stays on `libc`: `fd` is a raw descriptor number the process does not own
/// yet (one inherited from the launcher), and `rustix` works on borrowed or
/// owned descriptors only.
pub(crate) fn set_cloexec(fd: RawFd, on: bool) -> Result<(), Error> {
    // SAFETY: F_SETFD on any descriptor number has no memory-safety effects.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, if on { libc::FD_CLOEXEC } else { 0 }) };
    if rc != 0 {
        return Err(os_error("fcntl(F_SETFD)"));
    }
    Ok(())
}

/// Sends `payload` and optionally one descriptor (`SCM_RIGHTS`) as one
/// packet. Never raises `SIGPIPE`.
pub(crate) fn send_with_fd(
    sock: BorrowedFd<'_>,
    payload: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        let pushed = control.push(SendAncillaryMessage::ScmRights(&fds));
        assert!(pushed, "room for one descriptor");
    }
    loop {
        match net::sendmsg(
            sock,
            &[IoSlice::new(payload)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// What [`try_recv_with_fd`] got.
pub(crate) enum Received {
    /// Nothing available yet.
    Nothing,
    /// The peer closed its end.
    Closed,
    /// A packet of `len` bytes, with the descriptor it carried, if any.
    Packet { len: usize, fd: Option<OwnedFd> },
}

/// Receives one packet without blocking, taking ownership of a descriptor
/// passed with it (marked close-on-exec).
pub(crate) fn try_recv_with_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    // Room for a few descriptors: a peer that sends more than one gets the
    // extra ones closed rather than truncated away unseen.
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let n = loop {
        match net::recvmsg(
            sock,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r.bytes,
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(Received::Nothing),
            Err(e) => return Err(e.into()),
        }
    };
    let mut fd = None;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for owned in fds {
                if fd.is_none() {
                    fd = Some(owned);
                } // extra descriptors are closed by dropping `owned`
            }
        }
    }
    if n == 0 && fd.is_none() {
        return Ok(Received::Closed);
    }
    Ok(Received::Packet { len: n, fd })
}

/// `pidfd_open(pid)`: a descriptor that becomes readable when `pid` exits,
/// or `None` where the kernel lacks it.
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = Pid::from_raw(i32::try_from(pid).ok()?)?;
    rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok()
}

/// Waits until one of `fds` is readable or `timeout` passes (`None`: no
/// limit). Returns the indices of the readable ones.
pub(crate) fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Vec<usize> {
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    let ts = timeout.map(|t| Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    match rustix::event::poll(&mut pfds, ts.as_ref()) {
        Ok(n) if n > 0 => pfds
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.revents().is_empty())
            .map(|(i, _)| i)
            .collect(),
        _ => Vec::new(),
    }
}

/// Name of a signal number, for messages.
pub(crate) fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every process of the
/// machine.
pub(crate) fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
