//! The borrow table of [`DsmVec`](super::DsmVec)s in this process: which
//! element ranges of which vector are lent out, shared or mutably, through
//! the checked accessors ([`DsmVec::stripe_mut`](super::DsmVec::stripe_mut)
//! and friends).
//!
//! The table is a `static` of this process (process-private memory: never
//! DSM memory, whatever stack the handle lives on) keyed by the vector's
//! address, which is the same in every process and unique among live heap
//! objects. Every thread of the process — OS or user-level — registers its
//! borrows here, so a `&mut` element handed out by the table is aliased by
//! no other reference of this process. Other processes have tables of their
//! own: across processes the DSM's rule applies (see `DsmVec`).
//!
//! Ids (of handles and of borrows) carry the process's rank in their top
//! bits, so an id made in one process never equals one made in another,
//! even if a handle or a guard were reached from another process.

use core::ops::Range;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::dsm::allocator::RuntimeGuard;

/// One borrow of elements of one vector.
#[derive(Debug, Clone)]
struct Borrow {
    /// Address of the vector's first element.
    addr: usize,
    /// The handle it was made through ([`unique_id`]).
    owner: u64,
    /// This borrow ([`unique_id`]).
    token: u64,
    /// The elements.
    range: Range<usize>,
    /// Mutable (exclusive) or shared.
    write: bool,
}

/// The borrows of this process.
static TABLE: Mutex<Vec<Borrow>> = Mutex::new(Vec::new());

/// Next id of this process.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Bits of an id that count (the rank takes the ones above).
const COUNT_BITS: u32 = 40;

/// A new id, unique in the job: `rank` in the top bits, a counter of this
/// process below.
pub(super) fn unique_id(rank: usize) -> u64 {
    let n = NEXT.fetch_add(1, Ordering::Relaxed) & ((1 << COUNT_BITS) - 1);
    ((rank as u64) << COUNT_BITS) | n
}

/// Runs `f` on the table, with allocations from the system allocator (the
/// table is process-private; the DSM heap could block or fault while the
/// lock is held).
fn with_table<R>(f: impl FnOnce(&mut Vec<Borrow>) -> R) -> R {
    let _private = RuntimeGuard::enter();
    let mut t: MutexGuard<'_, Vec<Borrow>> = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut t)
}

/// An existing borrow that a new one would overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Conflict {
    /// Its elements.
    pub range: Range<usize>,
    /// Whether it is mutable.
    pub write: bool,
}

/// Registers a borrow of `range` of the vector at `addr` through handle
/// `owner`; returns its token, or the first borrow it conflicts with (an
/// overlapping one where either is mutable). Empty ranges conflict with
/// nothing and are not registered (token 0).
pub(super) fn borrow(
    rank: usize,
    addr: usize,
    owner: u64,
    range: Range<usize>,
    write: bool,
) -> Result<u64, Conflict> {
    if range.is_empty() {
        return Ok(0);
    }
    let token = unique_id(rank);
    with_table(|t| {
        if let Some(b) = t.iter().find(|b| {
            b.addr == addr
                && (write || b.write)
                && b.range.start < range.end
                && range.start < b.range.end
        }) {
            return Err(Conflict {
                range: b.range.clone(),
                write: b.write,
            });
        }
        t.push(Borrow {
            addr,
            owner,
            token,
            range,
            write,
        });
        Ok(token)
    })
}

/// Ends the borrow `token` (0: nothing registered).
pub(super) fn unborrow(token: u64) {
    if token == 0 {
        return;
    }
    with_table(|t| {
        if let Some(k) = t.iter().position(|b| b.token == token) {
            t.swap_remove(k);
        }
    });
}

/// Forgets the borrows made through handle `owner` of the vector at `addr`
/// (the handle ends; only guards that were leaked can be left, and their
/// elements are unreachable).
pub(super) fn purge(addr: usize, owner: u64) {
    with_table(|t| t.retain(|b| !(b.addr == addr && b.owner == owner)));
}

/// Borrows of the vector at `addr` in this process (tests).
#[cfg(test)]
pub(super) fn count(addr: usize) -> usize {
    with_table(|t| t.iter().filter(|b| b.addr == addr).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each test uses its own fake address: the table is process-wide and
    // tests run in parallel.

    #[test]
    fn shared_borrows_coexist_and_mutable_ones_exclude() {
        let a = 0x1000;
        let owner = unique_id(0);
        let s1 = borrow(0, a, owner, 0..10, false).unwrap();
        let s2 = borrow(0, a, owner, 5..15, false).unwrap();
        assert_eq!(
            borrow(0, a, owner, 9..10, true),
            Err(Conflict {
                range: 0..10,
                write: false
            })
        );
        let m = borrow(0, a, owner, 15..20, true).unwrap();
        assert_eq!(
            borrow(0, a, owner, 19..30, false),
            Err(Conflict {
                range: 15..20,
                write: true
            })
        );
        assert_eq!(
            borrow(0, a, owner, 0..100, true).unwrap_err().range.start,
            0
        );
        // Adjacent ranges do not overlap; empty ones never conflict.
        let m2 = borrow(0, a, owner, 20..21, true).unwrap();
        assert_eq!(borrow(0, a, owner, 17..17, true), Ok(0));
        // Another vector is independent.
        let other = borrow(0, a + 8, owner, 0..100, true).unwrap();
        for t in [s1, s2, m, m2] {
            unborrow(t);
        }
        assert_eq!(count(a), 0);
        let all = borrow(0, a, owner, 0..100, true).unwrap();
        unborrow(all);
        unborrow(other);
        unborrow(0);
    }

    #[test]
    fn purge_forgets_one_handles_borrows() {
        let a = 0x2000;
        let (h1, h2) = (unique_id(0), unique_id(1));
        assert_ne!(h1, h2);
        borrow(0, a, h1, 0..4, true).unwrap();
        let kept = borrow(1, a, h2, 4..8, true).unwrap();
        purge(a, h1);
        assert_eq!(count(a), 1);
        borrow(0, a, h1, 0..4, true).unwrap();
        purge(a, h1);
        unborrow(kept);
        assert_eq!(count(a), 0);
    }

    #[test]
    fn ids_carry_the_rank() {
        let (a, b) = (unique_id(3), unique_id(3));
        assert_ne!(a, b);
        assert_eq!(a >> COUNT_BITS, 3);
        assert_ne!(unique_id(1) >> COUNT_BITS, unique_id(2) >> COUNT_BITS);
    }
}
