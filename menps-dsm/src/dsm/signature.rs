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
use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

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
/// timestamp, newest first (then by block and writer, so that equal
/// contents serialize to equal bytes).
///
/// Kept sorted incrementally. A flush between two barriers publishes the
/// signature of every release since the barrier (up to the capacity,
/// 1 024 notices by default), and each flush that finds a peer's changed
/// merges all of the peer's notices into ours. Sorting the whole list again
/// at each change (twice: by block to keep the newest per block, then by
/// time) made an LU-style pipeline of flushes spend a tenth of its time
/// sorting. Now an index of the newest write timestamp per block turns a
/// notice that is not newer than the one kept into no change at all (most
/// of a merge), and the notices that are newer are sorted among themselves
/// and merged into the sorted list in one pass.
#[derive(Debug, Clone)]
pub struct Signature {
    min_wr_ts: u64,
    /// The notices as last normalized: newest first (see [`newer_first`]),
    /// at most one per block, at most `capacity`.
    wns: Vec<WriteNotice>,
    /// Notices pushed since: each newer than whatever `wns` holds of its
    /// block when it came, in no order; a block may have several (the
    /// index names its newest).
    fresh: Vec<WriteNotice>,
    /// Whether a notice in `fresh` replaced one that may be in `wns`.
    superseded: bool,
    /// While `indexed`: the write timestamp of the newest notice of each
    /// block in `wns` and `fresh`. Built on the first push after a
    /// signature was read from bytes (a peer's signature is only read).
    index: FxHashMap<usize, u64>,
    indexed: bool,
    /// Reused buffer for merging `fresh` into `wns`.
    scratch: Vec<WriteNotice>,
    capacity: usize,
    /// See [`Signature::stamp`].
    stamp: u64,
}

/// The order of a signature's notices: newest write timestamp first, then
/// by block address and writer.
fn newer_first(a: &WriteNotice, b: &WriteNotice) -> core::cmp::Ordering {
    b.wr_ts.cmp(&a.wr_ts).then(a.key.cmp(&b.key))
}

impl PartialEq for Signature {
    /// The same minimum, capacity and notices (those kept and those pushed
    /// since, as they stand: compare normalized signatures to compare
    /// contents), whatever their stamps.
    fn eq(&self, other: &Self) -> bool {
        self.min_wr_ts == other.min_wr_ts
            && self.wns == other.wns
            && self.fresh == other.fresh
            && self.capacity == other.capacity
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
            fresh: Vec::new(),
            superseded: false,
            index: FxHashMap::default(),
            indexed: true,
            scratch: Vec::new(),
            capacity,
            stamp: next_stamp(),
        }
    }

    /// A number that changes whenever the contents change: every change
    /// takes a new one, unique in this process (a clone shares its
    /// original's until either changes). A signature whose stamp is what it
    /// was serializes to the same bytes as then, so a flush need not
    /// serialize an unchanged one again to compare it with what it last
    /// published. Adding a notice that changes nothing (one not newer than
    /// the block's, or one that would be dropped at once, older than all
    /// the kept ones of a full signature and not above its minimum write
    /// timestamp) keeps the stamp.
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
        if self.push_unstamped(wn) {
            self.stamp = next_stamp();
        }
    }

    /// [`Signature::push`] without a new stamp (the caller takes one);
    /// returns whether the contents changed.
    fn push_unstamped(&mut self, wn: WriteNotice) -> bool {
        if self.capacity == 0 {
            if wn.wr_ts > self.min_wr_ts {
                self.min_wr_ts = wn.wr_ts;
                return true;
            }
            return false;
        }
        // Full, and older than every notice kept: normalizing would drop it
        // again and raise the minimum to its write timestamp, which is no
        // change if the minimum is there already (a merge offers back the
        // notices that truncation dropped, as long as the peer keeps them).
        if self.wns.len() >= self.capacity
            && wn.wr_ts <= self.min_wr_ts
            && newer_first(&wn, &self.wns[self.capacity - 1]).is_gt()
        {
            return false;
        }
        self.build_index();
        match self.index.entry(wn.block()) {
            Entry::Occupied(mut e) => {
                if *e.get() >= wn.wr_ts {
                    return false;
                }
                e.insert(wn.wr_ts);
                self.superseded = true;
            }
            Entry::Vacant(e) => {
                e.insert(wn.wr_ts);
            }
        }
        self.fresh.push(wn);
        if self.fresh.len() >= 2 * self.capacity.max(64) {
            self.normalize();
        }
        true
    }

    /// Makes the index describe `wns` (`fresh` is empty when it does not).
    fn build_index(&mut self) {
        if self.indexed {
            return;
        }
        debug_assert!(self.fresh.is_empty());
        self.index.clear();
        for wn in &self.wns {
            let ts = self.index.entry(wn.block()).or_insert(wn.wr_ts);
            *ts = (*ts).max(wn.wr_ts);
        }
        // A read signature in order may still name a block twice (only a
        // corrupt one does): keep its newest notice.
        if self.wns.len() != self.index.len() {
            let index = &self.index;
            self.wns.retain(|w| index.get(&w.block()) == Some(&w.wr_ts));
            self.wns.dedup_by_key(|w| w.block());
        }
        self.indexed = true;
    }

    /// Merges `other` into `self`: the union of the notices (newest per
    /// block), the larger minimum write timestamp, truncated to capacity.
    pub fn merge(&mut self, other: &Signature) {
        let mut changed = other.min_wr_ts > self.min_wr_ts;
        self.min_wr_ts = self.min_wr_ts.max(other.min_wr_ts);
        for wn in other.wns.iter().chain(&other.fresh) {
            changed |= self.push_unstamped(*wn);
        }
        if changed {
            self.stamp = next_stamp();
        }
    }

    /// Puts the pushed notices in order among the kept ones (dropping the
    /// ones a newer notice of their block replaced), and truncates to
    /// capacity, raising the minimum write timestamp over what it drops.
    fn normalize(&mut self) {
        if self.fresh.is_empty() {
            return;
        }
        let index = &self.index;
        // Each block's newest: the one the index names (a later push of the
        // same block with the same timestamp was refused).
        self.fresh
            .retain(|w| index.get(&w.block()) == Some(&w.wr_ts));
        self.fresh.sort_unstable_by(newer_first);
        if self.superseded {
            self.wns.retain(|w| index.get(&w.block()) == Some(&w.wr_ts));
            self.superseded = false;
        }
        let mut out = core::mem::take(&mut self.scratch);
        out.clear();
        out.reserve(self.wns.len() + self.fresh.len());
        let (mut a, mut b) = (self.wns.iter().peekable(), self.fresh.iter().peekable());
        while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
            if newer_first(x, y).is_le() {
                out.push(*a.next().expect("peeked"));
            } else {
                out.push(*b.next().expect("peeked"));
            }
        }
        out.extend(a);
        out.extend(b);
        self.fresh.clear();
        self.scratch = core::mem::replace(&mut self.wns, out);
        if self.wns.len() > self.capacity {
            for wn in &self.wns[self.capacity..] {
                self.min_wr_ts = self.min_wr_ts.max(wn.wr_ts);
                self.index.remove(&wn.block());
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
    /// (its buffers stay).
    pub fn reset(&mut self, capacity: usize) {
        self.min_wr_ts = 0;
        self.wns.clear();
        self.fresh.clear();
        self.superseded = false;
        self.index.clear();
        self.indexed = true;
        self.capacity = capacity;
        self.stamp = next_stamp();
    }

    /// Replaces the signature with the serialized one `b` (with capacity
    /// `capacity`), reusing its buffers; returns `false` (and leaves it
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
        self.adopt_read();
        true
    }

    /// Parses a serialized signature (with capacity `capacity`). Returns
    /// `None` if the bytes are not a signature.
    pub fn from_bytes(b: &[u8], capacity: usize) -> Option<Self> {
        let mut s = Signature::new(capacity);
        s.read_bytes(b, capacity).then_some(s)
    }

    /// The notices of `self` that `old` does not hold (the same notice:
    /// block, writer and timestamps), with `self`'s minimum write timestamp
    /// and capacity: what acquiring `self` adds to having acquired `old`.
    /// A peer's flush signature grows by a few notices at a time, and
    /// applying all of it at each of its flushes took each listed block's
    /// entry lock again.
    pub fn minus(&mut self, old: &mut Signature) -> Signature {
        self.normalize();
        old.normalize();
        let mut rest = old.wns.iter().peekable();
        let mut out = Signature::new(self.capacity);
        out.min_wr_ts = self.min_wr_ts;
        out.wns.extend(self.wns.iter().copied().filter(|wn| {
            while rest.next_if(|o| newer_first(o, wn).is_lt()).is_some() {}
            rest.next_if_eq(&wn).is_none()
        }));
        // In order and within capacity, like `self`; never pushed to.
        out.indexed = false;
        out
    }

    /// Takes the notices just read into `wns`: a signature serialized by
    /// this type is in order already and is used as it is (its index is
    /// built only if something is pushed into it); one out of order, or
    /// longer than the capacity, is normalized as if its notices were
    /// pushed one by one.
    fn adopt_read(&mut self) {
        let in_order = self.wns.len() <= self.capacity
            && self
                .wns
                .windows(2)
                .all(|w| newer_first(&w[0], &w[1]).is_lt());
        if in_order {
            self.indexed = false;
            return;
        }
        let read = core::mem::take(&mut self.wns);
        for wn in &read {
            self.push_unstamped(*wn);
        }
        self.normalize();
        self.scratch = read;
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

    /// The signature as the definition says, recomputed from everything
    /// pushed: the newest notice per block (the first pushed among equal
    /// write timestamps), newest first, truncated to capacity with the
    /// minimum raised over what is dropped.
    #[derive(Default)]
    struct Model {
        min: u64,
        pushed: Vec<WriteNotice>,
        cap: usize,
    }

    impl Model {
        fn normalized(&self) -> (u64, Vec<WriteNotice>) {
            let mut newest: Vec<WriteNotice> = Vec::new();
            for wn in &self.pushed {
                match newest.iter_mut().find(|w| w.block() == wn.block()) {
                    Some(w) if w.wr_ts < wn.wr_ts => *w = *wn,
                    Some(_) => {}
                    None => newest.push(*wn),
                }
            }
            newest.sort_by(newer_first);
            let mut min = self.min;
            for wn in newest.iter().skip(self.cap) {
                min = min.max(wn.wr_ts);
            }
            newest.truncate(self.cap);
            (min, newest)
        }
    }

    /// A small deterministic generator (splitmix64).
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Random pushes, merges, reads back from bytes and normalizations in
    /// between: the notices and the minimum are always the model's (the
    /// incremental order, the index and the refusal of notices that change
    /// nothing agree with sorting everything again), and a kept stamp
    /// always means the same bytes.
    #[test]
    fn incremental_order_matches_a_full_sort() {
        for seed in 0..200u64 {
            let mut rng = seed;
            let cap = [1, 2, 5, 16][(seed % 4) as usize];
            let blocks = 1 + next(&mut rng) % 24;
            let mut s = Signature::new(cap);
            let mut m = Model {
                cap,
                ..Model::default()
            };
            let mut last = (s.stamp(), s.to_bytes());
            for step in 0..300 {
                let wn = |rng: &mut u64| {
                    let b = B + (next(rng) % blocks) as usize * 4096;
                    let ts = next(rng) % 64;
                    WriteNotice::new(b, (next(rng) % 4) as usize, ts, ts + 10)
                };
                match next(&mut rng) % 8 {
                    0..=3 => {
                        let w = wn(&mut rng);
                        s.push(w);
                        m.pushed.push(w);
                    }
                    4 => {
                        let mut o = Signature::new(cap);
                        let mut om = Model {
                            cap,
                            ..Model::default()
                        };
                        for _ in 0..next(&mut rng) % 12 {
                            let w = wn(&mut rng);
                            o.push(w);
                            om.pushed.push(w);
                        }
                        if next(&mut rng).is_multiple_of(2) {
                            let t = next(&mut rng) % 40;
                            o.raise_min_wr_ts(t);
                            om.min = om.min.max(t);
                        }
                        // Merged as it is, or as a peer's read signature.
                        if next(&mut rng).is_multiple_of(2) {
                            o = Signature::from_bytes(&o.to_bytes(), cap).unwrap();
                        }
                        s.merge(&o);
                        let (omin, own) = om.normalized();
                        m.min = m.min.max(omin);
                        m.pushed.extend(own);
                    }
                    5 => {
                        let t = next(&mut rng) % 40;
                        s.raise_min_wr_ts(t);
                        m.min = m.min.max(t);
                    }
                    6 => {
                        // Read back: the same contents, pushed to again later.
                        let bytes = s.to_bytes();
                        assert!(s.read_bytes(&bytes, cap));
                        let (min, n) = m.normalized();
                        m = Model {
                            min,
                            pushed: n,
                            cap,
                        };
                    }
                    _ => {
                        s.notices();
                    }
                }
                let (min, want) = m.normalized();
                let bytes = s.clone().to_bytes();
                if s.stamp() == last.0 {
                    assert_eq!(
                        bytes, last.1,
                        "seed {seed} step {step}: stamp kept, bytes changed"
                    );
                }
                last = (s.stamp(), bytes);
                assert_eq!(s.notices(), &want[..], "seed {seed} step {step}");
                assert_eq!(s.min_wr_ts(), min, "seed {seed} step {step}");
            }
        }
    }

    /// Merging a peer's signature a second time, or notices older than a
    /// full signature's minimum, changes nothing: the stamp stays, so the
    /// flush that follows does not publish again.
    #[test]
    fn merging_known_notices_keeps_the_stamp() {
        let mut peer = Signature::new(4);
        for i in 0..6u64 {
            peer.push(WriteNotice::new(B + i as usize * 4096, 1, 10 + i, 20 + i));
        }
        let peer = Signature::from_bytes(&peer.to_bytes(), 4).unwrap();
        let mut s = Signature::new(4);
        s.push(WriteNotice::new(B + 8 * 4096, 0, 30, 40));
        s.merge(&peer);
        s.notices();
        let kept = s.stamp();
        s.merge(&peer);
        assert_eq!(s.stamp(), kept, "the same notices again");
        // Older than all four kept notices and not above the minimum.
        assert_eq!(s.min_wr_ts(), 12);
        s.push(WriteNotice::new(B + 9 * 4096, 1, 12, 22));
        assert_eq!(s.stamp(), kept, "a notice truncation would drop at once");
        s.push(WriteNotice::new(B + 9 * 4096, 1, 13, 22));
        assert_ne!(s.stamp(), kept, "a notice above the minimum raises it");
        assert_eq!((s.len(), s.min_wr_ts()), (4, 13));
    }

    /// `minus` leaves exactly the notices the old signature lacked, in
    /// order, with the new minimum.
    #[test]
    fn minus_keeps_what_is_new() {
        let mut old = Signature::new(8);
        for i in 0..4u64 {
            old.push(WriteNotice::new(B + i as usize * 4096, 1, 10 + i, 20 + i));
        }
        let mut new = old.clone();
        new.push(WriteNotice::new(B, 1, 30, 40)); // replaces block 0's
        new.push(WriteNotice::new(B + 9 * 4096, 0, 5, 6)); // older, new block
        new.push(WriteNotice::new(B + 4096, 1, 11, 22)); // same ts, longer lease
        new.raise_min_wr_ts(4);
        let d = new.minus(&mut old);
        let got: Vec<_> = d
            .wns
            .iter()
            .map(|w| (w.block(), w.wr_ts, w.rd_ts))
            .collect();
        assert_eq!(got, vec![(B, 30, 40), (B + 9 * 4096, 5, 6)]);
        assert_eq!(d.min_wr_ts(), 4);
        let mut empty = Signature::new(8);
        assert_eq!(new.minus(&mut empty).wns, new.notices());
        assert!(new.clone().minus(&mut new).wns.is_empty());
    }

    /// Bytes not in the serializer's order (or over capacity) are read as
    /// if their notices were pushed one by one: deduplicated, sorted,
    /// truncated with the minimum raised.
    #[test]
    fn out_of_order_bytes_are_normalized() {
        let wns = [
            WriteNotice::new(B, 1, 3, 13),
            WriteNotice::new(B + 4096, 0, 9, 19),
            WriteNotice::new(B, 2, 7, 17),
            WriteNotice::new(B + 8192, 0, 5, 15),
        ];
        let mut bytes = vec![0u8; HEADER_BYTES + wns.len() * WriteNotice::BYTES];
        bytes[0..8].copy_from_slice(&4u64.to_le_bytes());
        bytes[8..16].copy_from_slice(&(wns.len() as u64).to_le_bytes());
        for (i, wn) in wns.iter().enumerate() {
            let at = HEADER_BYTES + i * WriteNotice::BYTES;
            wn.write_to(&mut bytes[at..at + WriteNotice::BYTES]);
        }
        let mut s = Signature::from_bytes(&bytes, 2).unwrap();
        let got: Vec<_> = s.notices().iter().map(|w| (w.block(), w.wr_ts)).collect();
        assert_eq!(got, vec![(B + 4096, 9), (B, 7)]);
        assert_eq!(s.min_wr_ts(), 5, "raised over the dropped notice");
    }
}
