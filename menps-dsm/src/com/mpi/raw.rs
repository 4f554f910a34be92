//! Checked wrappers over the few MPI C calls the backend makes through
//! `mpi::ffi` (rsmpi's safe API has no RMA), and a `Send` wrapper for MPI
//! handles.
//!
//! Every call here is `unsafe` only because it crosses the FFI boundary with
//! raw handles and buffers; the wrappers take Rust references where they can
//! and state in their own `# Safety` sections what the caller must keep
//! valid. The library runs in `MPI_THREAD_MULTIPLE` mode, so any thread may
//! make any of these calls at any time.

use std::os::raw::{c_int, c_void};

use ::mpi::ffi;

use crate::com::{Error, Result};

/// An MPI handle (`MPI_Win`, `MPI_Comm`, `MPI_Request`) that may cross
/// threads. rsmpi's handle types wrap raw pointers and are therefore neither
/// `Send` nor `Sync`; with `MPI_THREAD_MULTIPLE` (checked at start-up) any
/// thread may pass any handle to MPI.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Handle<T: Copy>(pub T);

// SAFETY: MPI handles are opaque names of library objects; the library was
// initialised with MPI_THREAD_MULTIPLE, which allows every thread to use them.
unsafe impl<T: Copy> Send for Handle<T> {}
// SAFETY: as above; a shared handle only lets threads read the name.
unsafe impl<T: Copy> Sync for Handle<T> {}

/// Largest element count of one MPI call (`int` counts).
pub(crate) const MAX_COUNT: usize = 1 << 30;

/// The text of an MPI error code.
pub(crate) fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` has room for MPI_MAX_ERROR_STRING characters and the
    // terminator; `len` is a valid out-parameter.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int || len <= 0 {
        return format!("MPI error code {code}");
    }
    buf.truncate(len as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Turns an MPI return code into a `Result` naming the call.
#[inline]
pub(crate) fn check(call: &str, rc: c_int) -> Result<()> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(mpi_error(call, rc))
    }
}

#[cold]
fn mpi_error(call: &str, rc: c_int) -> Error {
    let text = error_string(rc);
    let hint = if call.starts_with("MPI_Win") || text.contains("MPI_ERR_WIN") {
        " (OpenMPI: one-sided communication needs a working `osc` component; \
         run with OMPI_MCA_osc=sm,ucx)"
    } else {
        ""
    };
    Error::Transport(format!("{call} failed: {text}{hint}"))
}

/// `MPI_COMM_WORLD`.
pub(crate) fn comm_world() -> ffi::MPI_Comm {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_COMM_WORLD }
}

/// The datatype used for bytes (`MPI_UINT8_T`).
pub(crate) fn byte() -> ffi::MPI_Datatype {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_UINT8_T }
}

/// `MPI_UINT64_T`.
pub(crate) fn u64_type() -> ffi::MPI_Datatype {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_UINT64_T }
}

/// `MPI_SUM`.
pub(crate) fn op_sum() -> ffi::MPI_Op {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_SUM }
}

/// `MPI_ANY_SOURCE`.
pub(crate) fn any_source() -> c_int {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_ANY_SOURCE }
}

/// `MPI_REQUEST_NULL`.
pub(crate) fn request_null() -> ffi::MPI_Request {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// `MPI_STATUS_IGNORE`.
pub(crate) fn status_ignore() -> *mut ffi::MPI_Status {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_STATUS_IGNORE }
}

/// `MPI_ERRORS_RETURN`: errors come back as return codes (which the
/// wrappers turn into [`Error::Transport`]) instead of aborting the job.
pub(crate) fn errors_return() -> ffi::MPI_Errhandler {
    // SAFETY: reading an initialised extern constant of the MPI shim.
    unsafe { ffi::RSMPI_ERRORS_RETURN }
}

/// A zeroed status to pass as an out-parameter.
pub(crate) fn empty_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is a plain C struct of integers, valid when zeroed.
    unsafe { std::mem::zeroed() }
}

/// `MPI_Comm_dup` with `MPI_ERRORS_RETURN` installed on the copy.
pub(crate) fn dup_comm(comm: ffi::MPI_Comm) -> Result<ffi::MPI_Comm> {
    let mut out = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
    // SAFETY: `comm` is a valid communicator; `out` is an out-parameter.
    check("MPI_Comm_dup", unsafe {
        ffi::MPI_Comm_dup(comm, out.as_mut_ptr())
    })?;
    // SAFETY: MPI_Comm_dup succeeded, so it wrote the new handle.
    let out = unsafe { out.assume_init() };
    // SAFETY: `out` is the communicator just created.
    check("MPI_Comm_set_errhandler", unsafe {
        ffi::MPI_Comm_set_errhandler(out, errors_return())
    })?;
    Ok(out)
}

/// Rank and size of `comm`.
pub(crate) fn rank_size(comm: ffi::MPI_Comm) -> Result<(usize, usize)> {
    let (mut r, mut n): (c_int, c_int) = (0, 0);
    // SAFETY: valid communicator and out-parameters.
    check("MPI_Comm_rank", unsafe { ffi::MPI_Comm_rank(comm, &mut r) })?;
    // SAFETY: as above.
    check("MPI_Comm_size", unsafe { ffi::MPI_Comm_size(comm, &mut n) })?;
    Ok((r as usize, n as usize))
}

/// Number of processes of `comm` on this machine
/// (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`).
pub(crate) fn node_size(comm: ffi::MPI_Comm) -> Result<usize> {
    let mut node = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
    // SAFETY: a valid communicator; constants of the MPI shim; `node` is an
    // out-parameter.
    check("MPI_Comm_split_type", unsafe {
        ffi::MPI_Comm_split_type(
            comm,
            ffi::RSMPI_COMM_TYPE_SHARED,
            0,
            ffi::RSMPI_INFO_NULL,
            node.as_mut_ptr(),
        )
    })?;
    // SAFETY: the split succeeded and wrote the handle.
    let mut node = unsafe { node.assume_init() };
    let n = rank_size(node).map(|(_, n)| n);
    // SAFETY: our own communicator, no longer used.
    unsafe { ffi::MPI_Comm_free(&mut node) };
    n
}

/// `MPI_Test`: whether `req` has completed (it becomes `MPI_REQUEST_NULL`
/// then).
///
/// # Safety
/// `req` must be an active request or `MPI_REQUEST_NULL`; the buffers of its
/// operation must still be valid.
#[inline]
pub(crate) unsafe fn test(req: &mut ffi::MPI_Request) -> Result<bool> {
    let mut flag: c_int = 0;
    // SAFETY: per the contract; `flag` is an out-parameter.
    check("MPI_Test", unsafe {
        ffi::MPI_Test(req, &mut flag, status_ignore())
    })?;
    Ok(flag != 0)
}

/// `MPI_Win_flush(rank, win)`.
///
/// # Safety
/// `win` must be a live window in a passive-target epoch.
#[inline]
pub(crate) unsafe fn flush(win: ffi::MPI_Win, rank: c_int) -> Result<()> {
    // SAFETY: per the contract.
    check("MPI_Win_flush", unsafe { ffi::MPI_Win_flush(rank, win) })
}

/// `MPI_Win_flush_all(win)`.
///
/// # Safety
/// `win` must be a live window in a passive-target epoch.
pub(crate) unsafe fn flush_all(win: ffi::MPI_Win) -> Result<()> {
    // SAFETY: per the contract.
    check("MPI_Win_flush_all", unsafe { ffi::MPI_Win_flush_all(win) })
}

/// Starts `MPI_Rget` of `len` bytes (`len <= MAX_COUNT`).
///
/// # Safety
/// `dst` valid for writes of `len` bytes until the request completes; `win`
/// live and locked; `disp + len` inside the target's part.
#[inline]
pub(crate) unsafe fn rget(
    win: ffi::MPI_Win,
    rank: c_int,
    disp: ffi::MPI_Aint,
    dst: *mut u8,
    len: usize,
) -> Result<ffi::MPI_Request> {
    debug_assert!(len <= MAX_COUNT);
    let mut req = request_null();
    // SAFETY: per the contract.
    check("MPI_Rget", unsafe {
        ffi::MPI_Rget(
            dst.cast::<c_void>(),
            len as c_int,
            byte(),
            rank,
            disp,
            len as c_int,
            byte(),
            win,
            &mut req,
        )
    })?;
    Ok(req)
}

/// Starts `MPI_Isend` of `buf` (at most `int` bytes) to `to` with `tag`.
///
/// # Safety
/// `buf` must stay valid and unwritten until the request completes (or be
/// leaked); `comm` a valid communicator and `to` a rank of it.
pub(crate) unsafe fn isend(
    buf: &[u8],
    to: c_int,
    tag: c_int,
    comm: ffi::MPI_Comm,
) -> Result<ffi::MPI_Request> {
    let mut req = request_null();
    // SAFETY: per the contract.
    check("MPI_Isend", unsafe {
        ffi::MPI_Isend(
            buf.as_ptr().cast::<c_void>(),
            buf.len() as c_int,
            byte(),
            to,
            tag,
            comm,
            &mut req,
        )
    })?;
    Ok(req)
}

/// Starts `MPI_Irecv` into `len` bytes at `buf` from `from` with `tag`;
/// the bytes may be uninitialised (a receive of `len` bytes initialises
/// them all).
///
/// # Safety
/// `buf` must be `len` (at most `int`) writable bytes that stay valid and
/// otherwise unused until the request completes (or are leaked); `comm` a
/// valid communicator and `from` a rank of it.
pub(crate) unsafe fn irecv_raw(
    buf: *mut u8,
    len: usize,
    from: c_int,
    tag: c_int,
    comm: ffi::MPI_Comm,
) -> Result<ffi::MPI_Request> {
    let mut req = request_null();
    // SAFETY: per the contract.
    check("MPI_Irecv", unsafe {
        ffi::MPI_Irecv(
            buf.cast::<c_void>(),
            len as c_int,
            byte(),
            from,
            tag,
            comm,
            &mut req,
        )
    })?;
    Ok(req)
}

/// Runs `piece(done, n)` over `len` bytes in pieces of at most
/// [`MAX_COUNT`] (`done` bytes before each piece of `n`).
fn in_pieces(len: usize, mut piece: impl FnMut(usize, usize) -> Result<()>) -> Result<()> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(MAX_COUNT);
        piece(done, n)?;
        done += n;
    }
    Ok(())
}

/// `MPI_Get` of `len` bytes in pieces of at most [`MAX_COUNT`]; complete
/// after a flush.
///
/// # Safety
/// As [`rget`], until the flush.
pub(crate) unsafe fn get(
    win: ffi::MPI_Win,
    rank: c_int,
    disp: ffi::MPI_Aint,
    dst: *mut u8,
    len: usize,
) -> Result<()> {
    in_pieces(len, |done, n| {
        let (origin, count, at) = (
            dst.wrapping_add(done),
            n as c_int,
            disp + done as ffi::MPI_Aint,
        );
        // SAFETY: per the contract; the piece lies inside both ranges.
        let rc =
            unsafe { ffi::MPI_Get(origin.cast(), count, byte(), rank, at, count, byte(), win) };
        check("MPI_Get", rc)
    })
}

/// `MPI_Put` of `len` bytes in pieces of at most [`MAX_COUNT`]; complete
/// (at the target) after a flush.
///
/// # Safety
/// `src` valid for reads of `len` bytes and unmodified until the flush; `win`
/// live and locked; `disp + len` inside the target's part.
pub(crate) unsafe fn put(
    win: ffi::MPI_Win,
    rank: c_int,
    disp: ffi::MPI_Aint,
    src: *const u8,
    len: usize,
) -> Result<()> {
    in_pieces(len, |done, n| {
        let (origin, count, at) = (
            src.wrapping_add(done),
            n as c_int,
            disp + done as ffi::MPI_Aint,
        );
        // SAFETY: per the contract; the piece lies inside both ranges.
        let rc =
            unsafe { ffi::MPI_Put(origin.cast(), count, byte(), rank, at, count, byte(), win) };
        check("MPI_Put", rc)
    })
}

/// A matched probe: a message that has arrived on `comm` with `tag`, taken
/// out of MPI's matching (no other probe or receive can match it), if one
/// has. Receive it with [`mrecv`].
pub(crate) fn improbe(
    comm: ffi::MPI_Comm,
    tag: c_int,
) -> Result<Option<(ffi::MPI_Message, ffi::MPI_Status)>> {
    let mut flag: c_int = 0;
    let mut msg = std::mem::MaybeUninit::<ffi::MPI_Message>::uninit();
    let mut st = empty_status();
    // SAFETY: a valid communicator and out-parameters.
    check("MPI_Improbe", unsafe {
        ffi::MPI_Improbe(
            any_source(),
            tag,
            comm,
            &mut flag,
            msg.as_mut_ptr(),
            &mut st,
        )
    })?;
    if flag == 0 {
        return Ok(None);
    }
    // SAFETY: the probe matched a message and wrote its handle.
    Ok(Some((unsafe { msg.assume_init() }, st)))
}

/// The byte count of a received message's status.
pub(crate) fn count(st: &ffi::MPI_Status) -> Result<usize> {
    let mut count: c_int = 0;
    // SAFETY: the status of a completed receive or matched probe.
    check("MPI_Get_count", unsafe {
        ffi::MPI_Get_count(st, byte(), &mut count)
    })?;
    Ok(count.max(0) as usize)
}

/// `MPI_Test` of a receive: its byte count once it has completed.
///
/// # Safety
/// As for [`test`].
#[inline]
pub(crate) unsafe fn test_count(req: &mut ffi::MPI_Request) -> Result<Option<usize>> {
    let mut flag: c_int = 0;
    let mut st = empty_status();
    // SAFETY: per the contract; `flag` and `st` are out-parameters.
    check("MPI_Test", unsafe {
        ffi::MPI_Test(req, &mut flag, &mut st)
    })?;
    if flag == 0 {
        return Ok(None);
    }
    count(&st).map(Some)
}

/// Receives the message `msg` of [`improbe`], of `count` bytes, into `buf`.
pub(crate) fn mrecv(mut msg: ffi::MPI_Message, buf: &mut [u8], count: c_int) -> Result<()> {
    assert!(
        count >= 0 && count as usize <= buf.len(),
        "the buffer is too small"
    );
    // SAFETY: `msg` is a matched message (from `improbe`) of `count` bytes,
    // and `buf` has room for them.
    check("MPI_Mrecv", unsafe {
        ffi::MPI_Mrecv(
            buf.as_mut_ptr().cast::<c_void>(),
            count,
            byte(),
            &mut msg,
            status_ignore(),
        )
    })
}

/// `MPI_Compare_and_swap` on a `u64`; the old value lands in `*result`
/// after a flush.
///
/// # Safety
/// The three pointers valid (and `new`/`expected` unmodified) until the
/// flush; `win` live and locked; the word inside the target's part.
pub(crate) unsafe fn compare_and_swap(
    win: ffi::MPI_Win,
    rank: c_int,
    disp: ffi::MPI_Aint,
    new: *const u64,
    expected: *const u64,
    result: *mut u64,
) -> Result<()> {
    // SAFETY: per the contract.
    check("MPI_Compare_and_swap", unsafe {
        ffi::MPI_Compare_and_swap(
            new.cast(),
            expected.cast(),
            result.cast(),
            u64_type(),
            rank,
            disp,
            win,
        )
    })
}

/// `MPI_Fetch_and_op(MPI_SUM)` on a `u64` (wrapping); the old value lands in
/// `*result` after a flush.
///
/// # Safety
/// As [`compare_and_swap`].
pub(crate) unsafe fn fetch_add(
    win: ffi::MPI_Win,
    rank: c_int,
    disp: ffi::MPI_Aint,
    delta: *const u64,
    result: *mut u64,
) -> Result<()> {
    // SAFETY: per the contract.
    check("MPI_Fetch_and_op", unsafe {
        ffi::MPI_Fetch_and_op(
            delta.cast(),
            result.cast(),
            u64_type(),
            rank,
            disp,
            op_sum(),
            win,
        )
    })
}
