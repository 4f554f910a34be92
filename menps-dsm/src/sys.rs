//! Thin wrappers over the Linux facilities the shm backend and the launcher
//! use: `memfd_create`, shared mappings, futexes, `SCM_RIGHTS` descriptor
//! passing over Unix sockets, and `pidfd_open`.
//!
//! Everything unsafe about these system calls is contained here; the rest of
//! the crate sees owned descriptors and [`Mapping`]s.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

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

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
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
    // SAFETY: `name` is a valid NUL-terminated string; the flags are valid.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_error("memfd_create"));
    }
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len)
        .map_err(|_| Error::BadConfig(format!("memory object of {len} bytes is too large")))?;
    // SAFETY: `fd` is a valid descriptor owned by us.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(os_error("ftruncate"));
    }
    Ok(fd)
}

/// Size in bytes of the file behind `fd`.
pub(crate) fn file_size(fd: BorrowedFd<'_>) -> Result<usize, Error> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is valid for the borrow; `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(os_error("fstat"));
    }
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
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_error("mmap"));
        }
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
        let p = unsafe {
            libc::mmap(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        // Whether or not that worked, never munmap: if the reservation failed,
        // the shared mapping stays (leaked) rather than freeing the range for
        // reuse.
        let _ = p;
        std::mem::forget(self);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; whoever still holds references into it
        // is bound by the lifetime of `&self` of the structure owning us.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Works across
/// processes on a `MAP_SHARED` mapping (no `FUTEX_PRIVATE_FLAG`). Spurious
/// returns are allowed.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned 32-bit word for the duration of the
    // call; the kernel only reads it and `ts`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread (of any process) sleeping in [`futex_wait`] on `word`.
pub(crate) fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned 32-bit word; FUTEX_WAKE does not
    // access memory beyond it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// A connected pair of `SOCK_SEQPACKET` Unix sockets (close-on-exec).
pub(crate) fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), Error> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid out-array of two descriptors.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(os_error("socketpair"));
    }
    // SAFETY: socketpair returned two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets or clears `FD_CLOEXEC` on `fd`.
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
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // Control buffer with room for one descriptor, aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
        assert!(space <= size_of_val(&cbuf));
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` writable, aligned bytes, so the
        // first header and its data fit; we write exactly one descriptor.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
        }
    }
    loop {
        // SAFETY: `msg` and everything it points to are valid for the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
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
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `msg` points at valid buffers of the stated lengths.
        let n = unsafe {
            libc::recvmsg(
                sock.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(Received::Nothing),
            _ => return Err(e),
        }
    };
    let mut fd = None;
    // SAFETY: the kernel filled `msg_control` with well-formed headers up to
    // `msg_controllen`; the CMSG_* macros walk exactly those.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    } // extra descriptors are closed by dropping `owned`
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
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
    // SAFETY: pidfd_open takes two integers and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        None
    } else {
        // SAFETY: the call returned a fresh descriptor we now own.
        Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (`None`: no
/// limit). Returns the indices of the readable ones.
pub(crate) fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Vec<usize> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().clamp(0, i32::MAX as u128) as i32);
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structures.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return Vec::new();
    }
    pfds.iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(i, _)| i)
        .collect()
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
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
