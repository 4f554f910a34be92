//! Window ids and fat remote pointers.

use core::fmt;

/// Identifies a window. Windows are created collectively in the same order by
/// every process, so the same id names the same window everywhere.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowId(pub u32);

impl WindowId {
    /// A pointer to byte `offset` of process `rank`'s part of this window.
    pub const fn at(self, rank: usize, offset: u64) -> RemotePtr {
        RemotePtr::new(rank, self, offset)
    }
}

impl fmt::Debug for WindowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "win{}", self.0)
    }
}

/// A fat pointer to remote (or local) registered memory: the target process,
/// the window and a byte offset into that process's part of the window.
///
/// It is plain data (`Copy`, 16 bytes), valid in every process of the job,
/// so it can be sent in messages. Validity is checked when it is used: a
/// pointer outside the window gives [`Error::OutOfBounds`](crate::com::Error::OutOfBounds),
/// never a stray access.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemotePtr {
    rank: u32,
    window: WindowId,
    offset: u64,
}

impl RemotePtr {
    /// A pointer to byte `offset` of `rank`'s part of `window`.
    pub const fn new(rank: usize, window: WindowId, offset: u64) -> Self {
        RemotePtr {
            rank: if rank > u32::MAX as usize {
                u32::MAX
            } else {
                rank as u32
            },
            window,
            offset,
        }
    }

    /// Target process.
    pub const fn rank(self) -> usize {
        self.rank as usize
    }

    /// Window.
    pub const fn window(self) -> WindowId {
        self.window
    }

    /// Byte offset within the target's part of the window.
    pub const fn offset(self) -> u64 {
        self.offset
    }

    /// The pointer `bytes` further on (wrapping; bounds are checked at use).
    #[must_use]
    pub const fn add(self, bytes: u64) -> Self {
        RemotePtr {
            offset: self.offset.wrapping_add(bytes),
            ..self
        }
    }

    /// The same offset of the same window in another process.
    #[must_use]
    pub const fn with_rank(self, rank: usize) -> Self {
        RemotePtr::new(rank, self.window, self.offset)
    }

    /// Encodes the pointer as 16 bytes (for messages).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.rank.to_le_bytes());
        b[4..8].copy_from_slice(&self.window.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    /// Decodes [`RemotePtr::to_bytes`].
    pub fn from_bytes(b: [u8; 16]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        RemotePtr {
            rank: u32_at(0),
            window: WindowId(u32_at(4)),
            offset: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        }
    }
}

impl fmt::Debug for RemotePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank{}:{:?}+{:#x}", self.rank, self.window, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_encoding() {
        let w = WindowId(3);
        let p = w.at(2, 10).add(6);
        assert_eq!((p.rank(), p.window(), p.offset()), (2, w, 16));
        assert_eq!(p.with_rank(1).rank(), 1);
        assert_eq!(RemotePtr::from_bytes(p.to_bytes()), p);
        assert_eq!(format!("{p:?}"), "rank2:win3+0x10");
        // An absurd rank saturates and is rejected at use, not truncated.
        assert_eq!(RemotePtr::new(usize::MAX, w, 0).rank(), u32::MAX as usize);
    }
}
