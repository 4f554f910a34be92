//! The argument checks every backend makes before it touches the network,
//! so that the same misuse gives the same error on every backend: ranks,
//! atomic alignment, message and buffer lengths.
//!
//! The errors are built in `#[cold]` functions: the checks sit on the RMA
//! fast paths, where only the comparison should remain.

use super::{Error, MAX_MESSAGE_BYTES, RemotePtr, Result};

/// `Ok` if `rank` is a rank of a job of `size` processes, else
/// [`Error::BadRank`].
#[inline]
pub(crate) fn rank(rank: usize, size: usize) -> Result<()> {
    if rank < size {
        Ok(())
    } else {
        Err(bad_rank(rank, size))
    }
}

#[cold]
fn bad_rank(rank: usize, size: usize) -> Error {
    Error::BadRank { rank, size }
}

/// `Ok` if an access of `len` bytes at `offset` lies inside a window part of
/// `size` bytes, else [`Error::OutOfBounds`].
#[inline]
pub(crate) fn bounds(window: u32, offset: u64, len: usize, size: usize) -> Result<()> {
    if offset > size as u64 || len > size - offset as usize {
        Err(out_of_bounds(window, offset, len, size))
    } else {
        Ok(())
    }
}

#[cold]
fn out_of_bounds(window: u32, offset: u64, len: usize, size: usize) -> Error {
    Error::OutOfBounds {
        window,
        offset,
        len,
        size,
    }
}

/// `Ok` if `p` addresses an aligned word (the target of an atomic), else
/// [`Error::UnalignedAtomic`].
#[inline]
pub(crate) fn aligned_word(p: RemotePtr) -> Result<()> {
    if p.offset().is_multiple_of(8) {
        Ok(())
    } else {
        Err(unaligned(p))
    }
}

#[cold]
fn unaligned(p: RemotePtr) -> Error {
    Error::UnalignedAtomic {
        window: p.window().0,
        offset: p.offset(),
    }
}

/// `Ok` if a message of `len` bytes may be sent (at most
/// [`MAX_MESSAGE_BYTES`]), else [`Error::MessageTooLarge`].
pub(crate) fn message_len(len: usize) -> Result<()> {
    if len > MAX_MESSAGE_BYTES {
        return Err(Error::MessageTooLarge {
            len,
            max: MAX_MESSAGE_BYTES,
        });
    }
    Ok(())
}

/// `Ok` if a received message of `len` bytes fits a buffer of `capacity`
/// bytes, else [`Error::BufferTooSmall`].
pub(crate) fn fits(len: usize, capacity: usize) -> Result<()> {
    if len <= capacity {
        Ok(())
    } else {
        Err(Error::BufferTooSmall { len, capacity })
    }
}

/// `Ok` if an allgather destination of `dst_len` bytes has room for exactly
/// `size` contributions of `src_len` bytes, else [`Error::InvalidArgument`].
pub(crate) fn allgather_len(size: usize, src_len: usize, dst_len: usize) -> Result<()> {
    if src_len.checked_mul(size) != Some(dst_len) {
        return Err(Error::InvalidArgument(format!(
            "allgather destination has {dst_len} bytes; it must be size ({size}) × {src_len}"
        )));
    }
    Ok(())
}
