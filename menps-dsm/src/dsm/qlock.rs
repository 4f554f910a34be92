//! The distributed queue lock with probable owners (Endo 2020 §3.5.4,
//! Listing 3.3) that serialises the transactions of a block (and carries DSM
//! mutexes), and the fixed-home spinlock of the comparison policy.
//!
//! Every process has one word per lock in a window. From process `q`'s
//! point of view its word says:
//!
//! - `OWNED`: the lock is free and `q` was its last holder; the
//!   lock-associated data (LAD) is in `q`'s slot;
//! - `LOCKED`: `q` holds the lock (or is about to) and has no successor;
//! - `LINK(p)`: if `q` holds the lock, `p` is its successor; otherwise `p` is
//!   where `q` last sent the lock — a *probable owner*.
//!
//! `lock` takes the lock directly if its own word is `OWNED`; otherwise it
//! marks its word `LOCKED` (it will be the tail) and follows the links with
//! compare-and-swap: an `OWNED` word becomes `LINK(me)` and the LAD is read
//! from that process; a `LOCKED` word becomes `LINK(me)` and the LAD arrives
//! by a point-to-point message when that holder unlocks. `unlock` stores the
//! LAD in its own slot and turns `LOCKED` into `OWNED`, or sends the LAD to
//! its successor. The lock thus floats to whoever used it last.
//!
//! Words are never initialised: raw 0 means `OWNED` at the lock's initial
//! owner and `LINK(initial owner)` everywhere else, and the initial owner
//! writes `OWNED` as 0 while others write it as 1. Every word's `OWNED` has
//! one raw value, so the chase can use a blind compare-and-swap. All accesses
//! to the words, the process's own included, are RMA atomics (as MPI
//! requires for words that remote atomics target).

use crate::com::{CasOp, Communicator, RemotePtr, Source, Tag, WindowId};

use super::error::{DsmError, DsmResult};

const RAW_LOCKED: u64 = 2;
const RAW_LINK0: u64 = 3;

/// A word's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Word {
    Owned,
    Locked,
    Link(usize),
}

/// Where a lock lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockSite {
    /// Window holding every process's word.
    pub win: WindowId,
    /// Offset of the word in each process's part.
    pub word_off: u64,
    /// Process that owns the lock before anyone used it.
    pub init_owner: usize,
    /// Tag of hand-off messages.
    pub tag: Tag,
}

impl LockSite {
    fn word(&self, rank: usize) -> RemotePtr {
        self.win.at(rank, self.word_off)
    }

    fn owned_raw(&self, rank: usize) -> u64 {
        if rank == self.init_owner { 0 } else { 1 }
    }

    fn decode(&self, rank: usize, raw: u64) -> Word {
        match raw {
            0 if rank == self.init_owner => Word::Owned,
            0 => Word::Link(self.init_owner),
            1 => Word::Owned,
            RAW_LOCKED => Word::Locked,
            r => Word::Link((r - RAW_LINK0) as usize),
        }
    }
}

fn link_raw(p: usize) -> u64 {
    RAW_LINK0 + p as u64
}

/// How the lock was obtained.
#[derive(Debug)]
pub(crate) enum Granted {
    /// It was free at this process: the LAD is in this process's slot.
    Local,
    /// It was free at `owner`: read the LAD from `owner`'s slot.
    FromOwner(usize),
    /// `from` handed it over with this LAD.
    HandOff(usize, Vec<u8>),
}

/// How long a chase may find the chain leading back to its own process
/// (see [`try_lock_all`]) before that is an error.
const LOOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Takes the lock.
pub(crate) fn lock<C: Communicator>(com: &C, site: &LockSite) -> DsmResult<Granted> {
    lock_inner(com, site, None)
}

/// Where a lock's LAD is read from with the swap that takes the lock
/// ([`lock_reading`]): the slot at a holder, and the buffer.
pub(crate) struct LadRead<'a> {
    /// The LAD slot at the given process.
    pub at: &'a dyn Fn(usize) -> RemotePtr,
    /// Where the LAD goes.
    pub buf: &'a mut [u8],
    /// A speculative read of the data the lock protects, sent with the
    /// first swap (at the probable owner our word names, if that is where
    /// the read expects the data) and performed after it: if that swap takes the lock, the data is what the lock
    /// protects at that process. See [`LadRead::data_from`].
    pub data: Option<DataRead<'a>>,
    /// Set to the process `data` was read at when the swap in front of it
    /// took the lock (`Granted::FromOwner` of that process); `None` if the
    /// speculative read is void (or there was none).
    pub data_from: Option<usize>,
}

/// A speculative read of the data of a run of sites of [`try_lock_all`]
/// (`sites`, indices into its sites).
pub(crate) struct RunRead<'a> {
    /// The sites whose data `data` reads.
    pub sites: core::ops::Range<usize>,
    /// The read, made at the process the sites are tried at.
    pub data: DataRead<'a>,
    /// Set to that process if the read was made.
    pub read_at: Option<usize>,
}

/// A speculative data read ([`LadRead::data`], [`RunRead`]): where,
/// at whichever process it is sent to, and the buffer (which a void read
/// may have filled with anything).
pub(crate) struct DataRead<'a> {
    /// The process the data is expected at (the block's last writer as far
    /// as we know): the read is made only if the lock is tried there, so
    /// that a lock held elsewhere (by a reader) costs no void read.
    pub expect: usize,
    /// The window the data is in, at every process.
    pub win: WindowId,
    /// Its offset in each process's part of the window.
    pub off: u64,
    /// Where it goes.
    pub buf: &'a mut [u8],
}

/// Takes the lock as [`lock`] does, and when it is taken from a free owner
/// (`Granted::FromOwner(p)`) reads its LAD at `p` into `lad.buf` in the
/// same batch as the swap that took it
/// ([`Rma::compare_and_swap_then_read_all`](crate::com::Rma::compare_and_swap_then_read_all),
/// one round trip on the served mpi backend instead of two). The read
/// follows the swap at `p`, so it sees the LAD the lock protects; reads
/// beside swaps that failed are ignored (an empty hand-off, which leaves the
/// LAD at the previous holder, reads it there: also `FromOwner`). The other
/// grants leave `lad.buf` as it was: the LAD is local, or came with the
/// hand-off. A speculative `lad.data` read goes with the first swap if that
/// is tried at the process it expects; `lad.data_from` then says whether
/// the swap took the lock there.
pub(crate) fn lock_reading<C: Communicator>(
    com: &C,
    site: &LockSite,
    lad: &mut LadRead<'_>,
) -> DsmResult<Granted> {
    lad.data_from = None;
    lock_inner(com, site, Some(lad))
}

fn lock_inner<C: Communicator>(
    com: &C,
    site: &LockSite,
    mut lad: Option<&mut LadRead<'_>>,
) -> DsmResult<Granted> {
    let me = com.rank();
    let mine = site.word(me);
    let mut raw = com.atomic_load(mine)?;
    if site.decode(me, raw) == Word::Owned {
        let old = com.compare_and_swap(mine, raw, RAW_LOCKED)?;
        if old == raw {
            return Ok(Granted::Local);
        }
        raw = old;
    }
    // Become the tail-to-be. Only this process changes its word away from a
    // link, so the swap cannot race with anyone but a stale chase (which
    // only touches OWNED and LOCKED words).
    let mut p = loop {
        match site.decode(me, raw) {
            Word::Link(p) => {
                let old = com.compare_and_swap(mine, raw, RAW_LOCKED)?;
                if old == raw {
                    break p;
                }
                raw = old;
            }
            other => {
                return Err(DsmError::Misuse(format!(
                    "queue lock (window {:?}, offset {}) found its own word {other:?} while \
                     not holding the lock (internal error)",
                    site.win, site.word_off
                )));
            }
        }
    };
    let mut backoff = ct_sync::Backoff::new();
    // The process whose word linked to the one we try next, and since when
    // the chain has led back to us.
    let mut via: Option<usize> = None;
    let mut looped: Option<std::time::Instant> = None;
    loop {
        if p == me {
            // A process that has just taken the lock from us with
            // `try_lock_all` still links to us until it marks its word,
            // a moment later (the one transient loop of the chain): try it
            // again. Anything longer is a broken chain.
            let since = *looped.get_or_insert_with(std::time::Instant::now);
            let (Some(v), true) = (via, since.elapsed() < LOOP_LIMIT) else {
                return Err(DsmError::Misuse(format!(
                    "queue lock (window {:?}, offset {}): the probable-owner chain led back to \
                     this process (internal error)",
                    site.win, site.word_off
                )));
            };
            p = v;
            backoff.snooze(std::thread::yield_now);
        }
        let target = site.word(p);
        let owned = site.owned_raw(p);
        let old = match &mut lad {
            None => com.compare_and_swap(target, owned, link_raw(me))?,
            Some(l) => {
                let mut ops = [CasOp::new(target, owned, link_raw(me))];
                // The speculative data read goes with the first swap only:
                // later ones chase a lock that has moved on, where the
                // data is less likely to be.
                match l.data.as_mut().filter(|d| via.is_none() && d.expect == p) {
                    Some(d) => {
                        let mut reads =
                            [((l.at)(p), &mut *l.buf), (d.win.at(p, d.off), &mut *d.buf)];
                        com.compare_and_swap_then_read_all(&mut ops, &mut reads)?;
                        if ops[0].old == owned {
                            l.data_from = Some(p);
                        }
                    }
                    None => {
                        let mut reads = [((l.at)(p), &mut *l.buf)];
                        com.compare_and_swap_then_read_all(&mut ops, &mut reads)?;
                    }
                }
                ops[0].old
            }
        };
        if old == owned {
            return Ok(Granted::FromOwner(p));
        }
        let old = if old == RAW_LOCKED {
            let o = com.compare_and_swap(target, RAW_LOCKED, link_raw(me))?;
            if o == RAW_LOCKED {
                let (_, bytes) = com.recv(Source::Rank(p), site.tag)?;
                // An empty hand-off: the LAD was too large for a message and
                // waits in the previous holder's slot.
                return Ok(if bytes.is_empty() {
                    if let Some(l) = &mut lad {
                        com.read((l.at)(p), l.buf)?;
                    }
                    Granted::FromOwner(p)
                } else {
                    Granted::HandOff(p, bytes)
                });
            }
            o
        } else {
            old
        };
        match site.decode(p, old) {
            Word::Link(q) => {
                via = Some(p);
                p = q;
                if q != me {
                    backoff.reset();
                }
            }
            // The word changed between our two attempts: try the same
            // process again, backing off if it keeps changing.
            Word::Owned | Word::Locked => backoff.snooze(std::thread::yield_now),
        }
    }
}

/// Takes, without waiting, those of the locks of `sites` that are free —
/// here, or at the process this one's word names as the probable owner —
/// with the compare-and-swaps at the probable owners in flight together,
/// and reads the lock-associated data of each lock taken into `lads` (one
/// buffer per site; `lad_at(site, holder)` says where it is) in the same
/// batch ([`Rma::compare_and_swap_then_read_all`](crate::com::Rma::compare_and_swap_then_read_all)):
/// for a run of blocks last written by one process, one round trip for
/// the locks and their LADs together. A lock that is held, or has moved on
/// from the probable owner, is not waited for (`None`, and its buffer holds
/// nothing meaningful): a caller that can do without it — a prefetch —
/// passes its block over, and nothing of it changed.
///
/// The swap at the owner comes first, and this process's own word becomes
/// `LOCKED` after: a try that fails then leaves no trace (marked `LOCKED`
/// first, the word could meanwhile have gained a successor that waits for
/// a hand-off). A chase that reaches our word in between follows its stale
/// link back to the owner, whose word now links to us, until we are
/// marked; only this process changes its word away from a link, so the
/// marking cannot fail. A LAD read at the owner is performed after our swap
/// there, so it is the one the lock now protects.
///
/// `runs` may add speculative reads, one per run of sites (the data of
/// blocks that lie one after the other, in one read): a run whose sites
/// are all tried at the probable owner `p` it expects its data at is read
/// there, after the swaps (its `read_at` says so); a site of it granted `FromOwner(p)` then had
/// its data read under the lock, the others' data is anything. A run whose
/// sites are tried at several processes, or taken here, is not read.
pub(crate) fn try_lock_all<C: Communicator>(
    com: &C,
    sites: &[LockSite],
    lads: &mut [&mut [u8]],
    lad_at: impl Fn(usize, usize) -> RemotePtr,
    runs: &mut [RunRead<'_>],
) -> DsmResult<Vec<Option<Granted>>> {
    debug_assert_eq!(sites.len(), lads.len());
    let me = com.rank();
    let mut granted: Vec<Option<Granted>> = sites.iter().map(|_| None).collect();
    // (site, our word's raw value, probable owner) of each remote attempt.
    let mut remote = Vec::new();
    let mut ops = Vec::new();
    let mut holders = Vec::with_capacity(sites.len());
    for (i, site) in sites.iter().enumerate() {
        let mine = site.word(me);
        let raw = com.atomic_load(mine)?;
        match site.decode(me, raw) {
            Word::Owned => {
                // A chase may have taken it from us since the load.
                if com.compare_and_swap(mine, raw, RAW_LOCKED)? == raw {
                    granted[i] = Some(Granted::Local);
                    holders.push(Some(me));
                } else {
                    holders.push(None);
                }
            }
            Word::Link(p) if p != me => {
                remote.push((i, raw, p));
                ops.push(CasOp::new(site.word(p), site.owned_raw(p), link_raw(me)));
                holders.push(Some(p));
            }
            other => {
                return Err(DsmError::Misuse(format!(
                    "queue lock (window {:?}, offset {}) found its own word {other:?} while \
                     not holding the lock (internal error)",
                    site.win, site.word_off
                )));
            }
        }
    }
    let mut reads: Vec<(RemotePtr, &mut [u8])> = holders
        .iter()
        .zip(lads.iter_mut())
        .enumerate()
        .filter_map(|(i, (h, buf))| h.map(|p| (lad_at(i, p), &mut **buf)))
        .collect();
    for run in runs.iter_mut() {
        run.read_at = None;
        let first = run.sites.start;
        let Some(&Some(p)) = holders.get(first) else {
            continue;
        };
        let all_there = run
            .sites
            .clone()
            .all(|i| matches!(granted.get(i), Some(None)) && holders.get(i) == Some(&Some(p)));
        if p != me && p == run.data.expect && all_there {
            run.read_at = Some(p);
            reads.push((run.data.win.at(p, run.data.off), &mut *run.data.buf));
        }
    }
    com.compare_and_swap_then_read_all(&mut ops, &mut reads)?;
    drop(reads);
    for ((i, raw, p), op) in remote.into_iter().zip(&ops) {
        if !op.swapped() {
            continue;
        }
        let mine = sites[i].word(me);
        let old = com.compare_and_swap(mine, raw, RAW_LOCKED)?;
        if old != raw {
            return Err(DsmError::Misuse(format!(
                "queue lock (window {:?}, offset {}): our own link changed while we took the \
                 lock (internal error)",
                sites[i].win, sites[i].word_off
            )));
        }
        granted[i] = Some(Granted::FromOwner(p));
    }
    Ok(granted)
}

/// Releases the lock. `store_lad` writes the LAD into this process's slot
/// (called if the lock becomes free here, or if `lad` is too large for a
/// message); otherwise `lad` goes to the successor in a message.
pub(crate) fn unlock<C: Communicator>(
    com: &C,
    site: &LockSite,
    lad: &[u8],
    store_lad: impl Fn() -> DsmResult<()>,
) -> DsmResult<()> {
    let me = com.rank();
    let mine = site.word(me);
    let mut raw = com.atomic_load(mine)?;
    if raw == RAW_LOCKED {
        store_lad()?;
        com.flush(me)?;
        let owned = site.owned_raw(me);
        let old = com.compare_and_swap(mine, RAW_LOCKED, owned)?;
        if old == RAW_LOCKED {
            return Ok(());
        }
        raw = old;
    }
    match site.decode(me, raw) {
        Word::Link(next) => {
            if lad.is_empty() || lad.len() > com.max_message_bytes() {
                // Too large for a message (a release signature with many
                // write notices): the successor reads it from our slot.
                store_lad()?;
                com.flush(me)?;
                com.send(next, site.tag, &[])?;
            } else {
                com.send(next, site.tag, lad)?;
            }
            Ok(())
        }
        other => Err(DsmError::Misuse(format!(
            "queue lock (window {:?}, offset {}) unlocked in state {other:?} (not held)",
            site.win, site.word_off
        ))),
    }
}

/// Whether this process's word says `OWNED` (the lock is free and was last
/// held here): fast release's test that a block has not migrated.
pub(crate) fn owned_here<C: Communicator>(com: &C, site: &LockSite) -> DsmResult<bool> {
    let me = com.rank();
    let raw = com.atomic_load(site.word(me))?;
    Ok(site.decode(me, raw) == Word::Owned)
}

/// The fixed-home lock: a spinlock word at the home (0 free, rank + 1 held)
/// taken by compare-and-swap with backoff.
pub(crate) fn spin_lock<C: Communicator>(com: &C, word: RemotePtr) -> DsmResult<()> {
    let me = com.rank() as u64 + 1;
    // The holder may be descheduled (an oversubscribed machine): an OS thread
    // parks after a while; a worker keeps yielding.
    let mut backoff = ct_sync::Backoff::parking(64);
    loop {
        let old = com.compare_and_swap(word, 0, me)?;
        if old == 0 {
            return Ok(());
        }
        if old == me {
            return Err(DsmError::Misuse(
                "fixed-home lock taken twice by the same process (internal error)".into(),
            ));
        }
        backoff.snooze(std::thread::yield_now);
    }
}

/// Releases a [`spin_lock`].
pub(crate) fn spin_unlock<C: Communicator>(com: &C, word: RemotePtr) -> DsmResult<()> {
    let me = com.rank() as u64 + 1;
    com.flush(word.rank())?;
    let old = com.compare_and_swap(word, me, 0)?;
    if old != me {
        return Err(DsmError::Misuse(format!(
            "fixed-home lock released by process {} but held by {old} (internal error)",
            me - 1
        )));
    }
    Ok(())
}
