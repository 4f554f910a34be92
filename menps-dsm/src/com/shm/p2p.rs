//! Point-to-point messages on shm.
//!
//! One byte ring per ordered pair (sender `s`, receiver `r`) in the control
//! memory. Only process `s` writes the ring's head and only process `r` its
//! tail (single producer, single consumer across processes; threads inside a
//! process are serialised by process-local locks). A frame is an 8-byte
//! header (`len | tag << 32`) and the payload padded to 8 bytes; positions
//! are byte counts since the start, taken modulo the power-of-two capacity,
//! and a frame may wrap around the end.
//!
//! The receiver drains its rings into the per-(sender, tag) queues of the
//! shared receive path (`com::mailbox`), so a receive for one tag never
//! consumes a message of another tag, and messages of one (sender, tag)
//! keep their order. No process-local lock is held while waiting, so
//! waiting user-level threads never block others.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use crossbeam_utils::CachePadded;
use ct_worker::UltItf;

use super::ShmCom;
use super::control::Ring;
use crate::com::inbox::Inbox;
use crate::com::mailbox::Mailbox;
use crate::com::wait::Watch;
use crate::com::{MAX_MESSAGE_BYTES, Result, Source, Tag};

const FRAME_HDR: usize = 8;

fn frame_len(len: usize) -> usize {
    FRAME_HDR + len.next_multiple_of(8)
}

impl Ring<'_> {
    /// Copies `len` bytes out of the ring starting at position `pos`.
    ///
    /// # Safety
    /// The bytes must have been published by the producer and not yet
    /// released by the consumer.
    unsafe fn copy_out(&self, pos: u64, dst: *mut u8, len: usize) {
        let at = (pos as usize) & (self.cap - 1);
        let first = len.min(self.cap - at);
        // SAFETY: both pieces lie inside the ring's data; the caller
        // guarantees the producer does not write them concurrently.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.add(at), dst, first);
            std::ptr::copy_nonoverlapping(self.data, dst.add(first), len - first);
        }
    }

    /// Copies `len` bytes into the ring starting at position `pos`.
    ///
    /// # Safety
    /// The bytes must be free (released by the consumer) and owned by the
    /// producer calling this.
    unsafe fn copy_in(&self, pos: u64, src: *const u8, len: usize) {
        let at = (pos as usize) & (self.cap - 1);
        let first = len.min(self.cap - at);
        // SAFETY: both pieces lie inside the ring's data; the caller
        // guarantees the consumer does not read them concurrently.
        unsafe {
            std::ptr::copy_nonoverlapping(src, self.data.add(at), first);
            std::ptr::copy_nonoverlapping(src.add(first), self.data, len - first);
        }
    }

    /// Producer: appends a frame if there is room. The caller is the ring's
    /// only producer (holds the sender-side lock).
    pub(crate) fn try_push(&self, tag: Tag, payload: &[u8]) -> bool {
        let need = frame_len(payload.len()) as u64;
        let head = self.hdr.head.0.load(Ordering::Relaxed);
        let tail = self.hdr.tail.0.load(Ordering::Acquire);
        if self.cap as u64 - (head - tail) < need {
            return false;
        }
        let word = payload.len() as u64 | (u64::from(tag) << 32);
        // SAFETY: [head, head + need) is free: the consumer released
        // everything below `tail` (acquired above) and the ring holds
        // `head - tail` bytes; we are the only producer.
        unsafe {
            self.copy_in(head, word.to_le_bytes().as_ptr(), FRAME_HDR);
            self.copy_in(head + FRAME_HDR as u64, payload.as_ptr(), payload.len());
        }
        self.hdr.head.0.store(head + need, Ordering::Release);
        true
    }

    /// Whether the consumer has nothing to read (a cheap check).
    pub(crate) fn is_empty(&self) -> bool {
        self.hdr.head.0.load(Ordering::Acquire) == self.hdr.tail.0.load(Ordering::Relaxed)
    }

    /// Consumer: takes every published frame, in order. The caller is the
    /// ring's only consumer (holds the receive lock). Returns how many.
    pub(crate) fn drain(&self, mut sink: impl FnMut(Tag, Vec<u8>)) -> usize {
        let mut tail = self.hdr.tail.0.load(Ordering::Relaxed);
        let head = self.hdr.head.0.load(Ordering::Acquire);
        let mut n = 0;
        while tail < head {
            let mut w = [0u8; FRAME_HDR];
            // SAFETY: [tail, head) was published by the producer (acquired
            // above) and is not released until we store the new tail.
            unsafe { self.copy_out(tail, w.as_mut_ptr(), FRAME_HDR) };
            let word = u64::from_le_bytes(w);
            let len = (word & 0xffff_ffff) as usize;
            let tag = (word >> 32) as Tag;
            assert!(
                len <= MAX_MESSAGE_BYTES && tail + frame_len(len) as u64 <= head,
                "corrupt p2p ring (frame of {len} bytes)"
            );
            let mut v = vec![0u8; len];
            // SAFETY: as above; the payload follows its header.
            unsafe { self.copy_out(tail + FRAME_HDR as u64, v.as_mut_ptr(), len) };
            sink(tag, v);
            tail += frame_len(len) as u64;
            n += 1;
        }
        if n > 0 {
            self.hdr.tail.0.store(tail, Ordering::Release);
        }
        n
    }
}

/// Process-local p2p state.
pub(crate) struct P2pState {
    /// One lock per destination: serialises this process's producers.
    send_locks: Box<[CachePadded<Mutex<()>>]>,
    inbox: Mutex<Inbox>,
}

impl P2pState {
    pub(crate) fn new(nprocs: usize) -> Self {
        P2pState {
            send_locks: (0..nprocs)
                .map(|_| CachePadded::new(Mutex::new(())))
                .collect(),
            inbox: Mutex::new(Inbox::default()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The protected data stays consistent even if a holder panicked (no
    // user code runs under these locks).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<U: UltItf> Mailbox for ShmCom<U> {
    fn inbox(&self) -> &Mutex<Inbox> {
        &self.p2p.inbox
    }

    /// Moves everything waiting in our rings (from `from`) into the inbox.
    fn collect(&self, inbox: &mut Inbox, from: Source) -> Result<()> {
        let mut take = |s: usize| {
            let ring = self.control.ring(s, self.rank);
            if ring.is_empty() {
                return;
            }
            let n = ring.drain(|tag, v| inbox.push(s, tag, v));
            if n > 0 {
                // The sender may be waiting for room.
                self.control.notify(s);
            }
        };
        match from {
            Source::Rank(s) => take(s),
            Source::Any => (0..self.size).for_each(take),
        }
        Ok(())
    }

    /// Waits for room in our ring to `to`, then rings its doorbell.
    fn transmit(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()> {
        let ring = self.control.ring(self.rank, to);
        let what = || format!("room in the message ring to rank {to}");
        self.wait_until(Watch::Rank(to), Some(&what), || {
            let _g = lock(&self.p2p.send_locks[to]);
            Ok(ring.try_push(tag, data).then_some(()))
        })?;
        self.control.notify(to);
        Ok(())
    }

    fn wait_for<T>(&self, watch: Watch, poll: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        // No watchdog: a receive may wait as long as the program likes.
        self.wait_until(watch, None, poll)
    }

    fn check_usable(&self) -> Result<()> {
        self.check_alive()
    }
}

#[cfg(test)]
mod tests {
    use crate::com::shm::control::{Control, DEFAULT_CHUNK_BYTES, DEFAULT_RING_BYTES};

    use super::*;

    #[test]
    fn ring_wraps_and_keeps_order() {
        let (c, _fd) = Control::create(1, DEFAULT_RING_BYTES, DEFAULT_CHUNK_BYTES).unwrap();
        let ring = c.ring(0, 0);
        let mut sent = 0u32;
        let mut got = 0u32;
        // Odd sizes so frames wrap at every possible alignment.
        for round in 0..2000u32 {
            let len = (round as usize * 7919) % 3000;
            let payload: Vec<u8> = (0..len).map(|i| (i as u32 ^ sent) as u8).collect();
            while !ring.try_push(sent, &payload) {
                ring.drain(|tag, v| {
                    assert_eq!(tag, got);
                    assert!(
                        v.iter()
                            .enumerate()
                            .all(|(i, &b)| b == (i as u32 ^ got) as u8)
                    );
                    got += 1;
                });
            }
            sent += 1;
        }
        ring.drain(|tag, _| {
            assert_eq!(tag, got);
            got += 1;
        });
        assert_eq!(got, sent);
        assert!(ring.is_empty());
        // A full-size message fits, and one more does not while it is queued.
        let big = vec![1u8; MAX_MESSAGE_BYTES];
        assert!(ring.try_push(1, &big));
        assert!(!ring.try_push(2, &vec![0u8; DEFAULT_RING_BYTES - MAX_MESSAGE_BYTES]));
    }
}
