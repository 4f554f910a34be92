//! Write notices and release signatures (Endo 2020 §3.4.5, Fig. 3.17).
//!
//! A *write notice* says "block `b` was written by a release at logical time
//! `wr_ts`; that version is readable until `rd_ts`; its data is at process
//! `writer`". A *signature* is a bounded list of write notices plus a
//! minimum write timestamp: when the list is full the oldest notices are
//! dropped and the minimum write timestamp is raised to the largest write
//! timestamp dropped, so an acquirer that invalidates every copy whose lease
//! ends before it still sees every write the dropped notices stood for.
//! A list of length 0 turns the signature into a pure logical timestamp
//! (the `timestamp` invalidation policy).

use core::sync::atomic::{AtomicU64, Ordering};

/// Largest number of processes (the writer is packed into the low bits of a
/// block address, which is at least 4 KiB aligned).
pub const MAX_PROCS: usize = 4096;

/// A write notice: 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteNotice {
    /// Block address (aligned to at least 4 KiB) with the writer's rank in
    /// the low 12 bits.
    key: u64,
    /// Write timestamp of the version.
    pub wr_ts: u64,
    /// Read timestamp (lease end) of the version.
    pub rd_ts: u64,
}

impl WriteNotice {
    /// Serialized size.
    pub const BYTES: usize = 24;

    /// A notice for the block at `block` (4 KiB aligned) written by `writer`.
    pub fn new(block: usize, writer: usize, wr_ts: u64, rd_ts: u64) -> Self {
        debug_assert_eq!(block % 4096, 0);
        debug_assert!(writer < MAX_PROCS);
        WriteNotice {
            key: block as u64 | writer as u64,
            wr_ts,
            rd_ts,
        }
    }

    /// The block's address.
    pub fn block(&self) -> usize {
        (self.key & !0xfff) as usize
    }

    /// The process that holds this version's data.
    pub fn writer(&self) -> usize {
        (self.key & 0xfff) as usize
    }

    fn write_to(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.key.to_le_bytes());
        out[8..16].copy_from_slice(&self.wr_ts.to_le_bytes());
        out[16..24].copy_from_slice(&self.rd_ts.to_le_bytes());
    }

    fn read_from(b: &[u8]) -> Self {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        WriteNotice {
            key: u(0),
            wr_ts: u(8),
            rd_ts: u(16),
        }
    }
}

/// A release signature: a minimum write timestamp and at most `capacity`
/// write notices, at most one per block (the newest), sorted by write
/// timestamp, newest first.
#[derive(Debug, Clone)]
pub struct Signature {
    min_wr_ts: u64,
    wns: Vec<WriteNotice>,
    capacity: usize,
    /// Whether `wns` may hold duplicates or be unsorted.
    dirty: bool,
    /// See [`Signature::stamp`].
    stamp: u64,
}

impl PartialEq for Signature {
    /// The same contents (and capacity), whatever their stamps.
    fn eq(&self, other: &Self) -> bool {
        self.min_wr_ts == other.min_wr_ts
            && self.wns == other.wns
            && self.capacity == other.capacity
            && self.dirty == other.dirty
    }
}

impl Eq for Signature {}

/// The last stamp handed out (see [`Signature::stamp`]).
static STAMPS: AtomicU64 = AtomicU64::new(0);

/// A stamp no signature of this process has had.
fn next_stamp() -> u64 {
    STAMPS.fetch_add(1, Ordering::Relaxed) + 1
}

/// Bytes of the serialized header (minimum write timestamp and count).
pub const HEADER_BYTES: usize = 16;

impl Default for Signature {
    /// An empty signature that keeps no notices (only a minimum write
    /// timestamp) until [`Signature::reset`] gives it a capacity.
    fn default() -> Self {
        Signature::new(0)
    }
}

impl Signature {
    /// An empty signature keeping at most `capacity` notices.
    pub fn new(capacity: usize) -> Self {
        Signature {
            min_wr_ts: 0,
            wns: Vec::new(),
            capacity,
            dirty: false,
            stamp: next_stamp(),
        }
    }

    /// A number that changes whenever the contents change: every change
    /// takes a new one, unique in this process (a clone shares its
    /// original's until either changes). A signature whose stamp is what it
    /// was serializes to the same bytes as then, so a flush need not
    /// serialize an unchanged one again to compare it with what it last
    /// published.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Serialized size of a signature with `capacity` notices.
    pub fn max_bytes(capacity: usize) -> usize {
        HEADER_BYTES + capacity * WriteNotice::BYTES
    }

    /// The minimum write timestamp: every copy with a lease ending before
    /// it is stale for whoever acquires this signature.
    pub fn min_wr_ts(&self) -> u64 {
        self.min_wr_ts
    }

    /// Raises the minimum write timestamp to at least `ts`.
    pub fn raise_min_wr_ts(&mut self, ts: u64) {
        if ts > self.min_wr_ts {
            self.min_wr_ts = ts;
            self.stamp = next_stamp();
        }
    }

    /// The notices, newest first.
    pub fn notices(&mut self) -> &[WriteNotice] {
        self.normalize();
        &self.wns
    }

    /// Number of notices (after deduplication).
    pub fn len(&mut self) -> usize {
        self.normalize();
        self.wns.len()
    }

    /// Adds a notice.
    pub fn push(&mut self, wn: WriteNotice) {
        self.push_unstamped(wn);
        self.stamp = next_stamp();
    }

    /// [`Signature::push`] without a new stamp (the caller takes one).
    fn push_unstamped(&mut self, wn: WriteNotice) {
        if self.capacity == 0 {
            self.min_wr_ts = self.min_wr_ts.max(wn.wr_ts);
            return;
        }
        self.wns.push(wn);
        self.dirty = true;
        if self.wns.len() >= 2 * self.capacity.max(64) {
            self.normalize();
        }
    }

    /// Merges `other` into `self`: the union of the notices (newest per
    /// block), the larger minimum write timestamp, truncated to capacity.
    pub fn merge(&mut self, other: &Signature) {
        self.min_wr_ts = self.min_wr_ts.max(other.min_wr_ts);
        for wn in &other.wns {
            self.push_unstamped(*wn);
        }
        self.stamp = next_stamp();
    }

    /// Sorts, keeps the newest notice per block, and truncates to capacity,
    /// raising the minimum write timestamp over what it drops.
    fn normalize(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        // Newest notice of each block first, then drop the rest of the block's.
        self.wns
            .sort_unstable_by(|a, b| a.block().cmp(&b.block()).then(b.wr_ts.cmp(&a.wr_ts)));
        self.wns
            .dedup_by(|later, first| later.block() == first.block());
        self.wns
            .sort_unstable_by_key(|w| core::cmp::Reverse(w.wr_ts));
        if self.wns.len() > self.capacity {
            for wn in &self.wns[self.capacity..] {
                self.min_wr_ts = self.min_wr_ts.max(wn.wr_ts);
            }
            self.wns.truncate(self.capacity);
        }
    }

    /// Serialized size.
    pub fn byte_len(&mut self) -> usize {
        HEADER_BYTES + self.len() * WriteNotice::BYTES
    }

    /// Writes the signature into `out`, which must hold [`Self::byte_len`]
    /// bytes; returns the length written.
    pub fn serialize_into(&mut self, out: &mut [u8]) -> usize {
        self.normalize();
        let n = self.wns.len();
        let len = HEADER_BYTES + n * WriteNotice::BYTES;
        out[0..8].copy_from_slice(&self.min_wr_ts.to_le_bytes());
        out[8..16].copy_from_slice(&(n as u64).to_le_bytes());
        for (i, wn) in self.wns.iter().enumerate() {
            let at = HEADER_BYTES + i * WriteNotice::BYTES;
            wn.write_to(&mut out[at..at + WriteNotice::BYTES]);
        }
        len
    }

    /// The signature as bytes.
    #[expect(
        clippy::wrong_self_convention,
        reason = "serialising normalises (deduplicates and truncates) the notices first"
    )]
    pub fn to_bytes(&mut self) -> Vec<u8> {
        let mut v = vec![0u8; self.byte_len()];
        self.serialize_into(&mut v);
        v
    }

    /// Reads the header of a serialized signature: (minimum write timestamp,
    /// number of notices).
    pub fn parse_header(b: &[u8]) -> (u64, usize) {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        (u(0), u(8) as usize)
    }

    /// Empties the signature, which then keeps at most `capacity` notices
    /// (its buffer stays).
    pub fn reset(&mut self, capacity: usize) {
        self.min_wr_ts = 0;
        self.wns.clear();
        self.capacity = capacity;
        self.dirty = false;
        self.stamp = next_stamp();
    }

    /// Replaces the signature with the serialized one `b` (with capacity
    /// `capacity`), reusing its buffer; returns `false` (and leaves it
    /// empty) if the bytes are not a signature.
    pub fn read_bytes(&mut self, b: &[u8], capacity: usize) -> bool {
        self.reset(capacity);
        if b.len() < HEADER_BYTES {
            return false;
        }
        let (min_wr_ts, n) = Self::parse_header(b);
        let Some(need) = n
            .checked_mul(WriteNotice::BYTES)
            .and_then(|x| x.checked_add(HEADER_BYTES))
        else {
            return false;
        };
        if b.len() < need {
            return false;
        }
        self.wns.extend((0..n).map(|i| {
            let at = HEADER_BYTES + i * WriteNotice::BYTES;
            WriteNotice::read_from(&b[at..at + WriteNotice::BYTES])
        }));
        self.min_wr_ts = min_wr_ts;
        self.dirty = true;
        self.stamp = next_stamp();
        true
    }

    /// Parses a serialized signature (with capacity `capacity`). Returns
    /// `None` if the bytes are not a signature.
    pub fn from_bytes(b: &[u8], capacity: usize) -> Option<Self> {
        if b.len() < HEADER_BYTES {
            return None;
        }
        let (min_wr_ts, n) = Self::parse_header(b);
        if b.len() < HEADER_BYTES + n.checked_mul(WriteNotice::BYTES)? {
            return None;
        }
        let wns = (0..n)
            .map(|i| {
                let at = HEADER_BYTES + i * WriteNotice::BYTES;
                WriteNotice::read_from(&b[at..at + WriteNotice::BYTES])
            })
            .collect();
        Some(Signature {
            min_wr_ts,
            wns,
            capacity,
            dirty: true,
            stamp: next_stamp(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = 0x1000_0000;

    /// Every change takes a new stamp; reading and serializing do not, and
    /// a stamp seen again means the same bytes.
    #[test]
    fn stamp_changes_with_the_contents_only() {
        let mut s = Signature::new(2);
        let mut stamps = vec![s.stamp()];
        let mut changed = |s: &Signature, what: &str| {
            assert!(!stamps.contains(&s.stamp()), "{what} kept an old stamp");
            stamps.push(s.stamp());
        };
        s.push(WriteNotice::new(B, 1, 5, 15));
        changed(&s, "push");
        let (stamp, bytes) = (s.stamp(), s.to_bytes());
        assert_eq!(s.notices().len(), 1);
        assert_eq!((s.stamp(), s.to_bytes()), (stamp, bytes.clone()));
        let mut other = Signature::new(2);
        other.push(WriteNotice::new(B + 4096, 0, 7, 17));
        s.merge(&other);
        changed(&s, "merge");
        s.raise_min_wr_ts(3);
        changed(&s, "raise_min_wr_ts");
        let kept = s.stamp();
        s.raise_min_wr_ts(1);
        assert_eq!(s.stamp(), kept, "a lower minimum changes nothing");
        assert!(s.read_bytes(&bytes, 2));
        changed(&s, "read_bytes");
        s.reset(2);
        changed(&s, "reset");
        assert_ne!(Signature::new(2).stamp(), Signature::new(2).stamp());
        assert_eq!(
            Signature::new(2),
            Signature::new(2),
            "equality ignores stamps"
        );
    }

    #[test]
    fn keeps_newest_per_block() {
        let mut s = Signature::new(8);
        s.push(WriteNotice::new(B, 1, 5, 15));
        s.push(WriteNotice::new(B, 2, 16, 26));
        s.push(WriteNotice::new(B + 4096, 0, 3, 13));
        let n = s.notices().to_vec();
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].writer(), 2);
        assert_eq!(n[0].wr_ts, 16);
        assert_eq!(n[1].block(), B + 4096);
        assert_eq!(s.min_wr_ts(), 0);
    }

    #[test]
    fn truncation_raises_min_wr_ts() {
        let mut s = Signature::new(2);
        for i in 0..5 {
            s.push(WriteNotice::new(
                B + i * 4096,
                0,
                10 + i as u64,
                20 + i as u64,
            ));
        }
        let n = s.notices().to_vec();
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].wr_ts, 14);
        assert_eq!(n[1].wr_ts, 13);
        // The dropped notices had write timestamps 10, 11, 12.
        assert_eq!(s.min_wr_ts(), 12);
    }

    #[test]
    fn zero_capacity_is_a_timestamp() {
        let mut s = Signature::new(0);
        s.push(WriteNotice::new(B, 3, 7, 17));
        s.push(WriteNotice::new(B, 3, 4, 17));
        assert_eq!(s.len(), 0);
        assert_eq!(s.min_wr_ts(), 7);
    }

    #[test]
    fn round_trips_through_bytes() {
        let mut s = Signature::new(16);
        s.raise_min_wr_ts(3);
        s.push(WriteNotice::new(B, 7, 9, 19));
        s.push(WriteNotice::new(B + 8192, 4095, 11, 21));
        let bytes = s.to_bytes();
        assert_eq!(bytes.len(), HEADER_BYTES + 2 * WriteNotice::BYTES);
        let mut t = Signature::from_bytes(&bytes, 16).unwrap();
        assert_eq!(t.notices(), s.notices());
        assert_eq!(t.min_wr_ts(), 3);
        assert!(Signature::from_bytes(&bytes[..20], 16).is_none());
        // Into a reused signature: the old notices go.
        let mut r = Signature::new(16);
        r.push(WriteNotice::new(B + 3 * 8192, 1, 2, 3));
        assert!(r.read_bytes(&bytes, 16));
        assert_eq!(r.notices(), s.notices());
        assert_eq!(r.min_wr_ts(), 3);
        assert!(!r.read_bytes(&bytes[..20], 16));
        assert!(r.notices().is_empty(), "a refused record leaves it empty");
        // A count that overflows is refused, not trusted.
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(!r.read_bytes(&huge, 16));
        // Serialized straight into a record.
        let mut rec = [0u8; 256];
        let n = s.clone().serialize_into(&mut rec);
        assert_eq!(&rec[..n], &bytes[..]);
    }

    #[test]
    fn merge_unions_and_keeps_max_min() {
        let mut a = Signature::new(4);
        a.push(WriteNotice::new(B, 0, 5, 15));
        let mut b = Signature::new(4);
        b.raise_min_wr_ts(2);
        b.push(WriteNotice::new(B, 1, 8, 18));
        b.push(WriteNotice::new(B + 4096, 1, 6, 16));
        a.merge(&b);
        assert_eq!(a.min_wr_ts(), 2);
        let n = a.notices().to_vec();
        assert_eq!(n.len(), 2);
        assert_eq!((n[0].writer(), n[0].wr_ts), (1, 8));
    }
}
