//! Worker deques: where runnable continuations wait.
//!
//! The owner pushes and pops at one end (newest first, the work-first order);
//! thieves steal from the other end (oldest first: the outermost, usually
//! largest, pieces of work). The choice of deque is a type parameter of the
//! runtime's [`Config`](crate::Config).

mod asymmetric;

pub use asymmetric::{AsymmetricChaseLev, AsymmetricStealer};

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Result of a steal attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Steal<T> {
    /// The deque was empty.
    Empty,
    /// Got an item.
    Success(T),
    /// Lost a race; trying again may succeed.
    Retry,
}

/// A deque owned by one worker, with [`WorkerDeque::Stealer`] handles for the others.
pub trait WorkerDeque<T: Send>: Sized + Send + 'static {
    /// The thieves' handle.
    type Stealer: DequeStealer<T>;
    /// Creates an empty deque and its stealer.
    fn new() -> (Self, Self::Stealer);
    /// Owner: pushes at the owner end.
    fn push(&self, item: T);
    /// Owner: pops the newest item.
    fn pop(&self) -> Option<T>;
    /// Owner: whether the deque is empty.
    fn is_empty(&self) -> bool;
    /// Owner: how many items the deque holds (a snapshot: thieves may take
    /// some at once).
    fn len(&self) -> usize;
}

/// The thieves' side of a [`WorkerDeque`].
pub trait DequeStealer<T: Send>: Send + Sync + 'static {
    /// Steals the oldest item.
    fn steal(&self) -> Steal<T>;
    /// Whether the deque looks empty (a hint: it may change at once).
    fn is_empty(&self) -> bool;
}

/// The default deque: Chase–Lev, from `crossbeam-deque` (growable, so deep
/// recursion with many suspended parents never overflows it).
#[derive(Debug)]
pub struct ChaseLev<T>(crossbeam_deque::Worker<T>);

/// Stealer of [`ChaseLev`].
#[derive(Debug)]
pub struct ChaseLevStealer<T>(crossbeam_deque::Stealer<T>);

impl<T: Send + 'static> WorkerDeque<T> for ChaseLev<T> {
    type Stealer = ChaseLevStealer<T>;

    fn new() -> (Self, Self::Stealer) {
        let w = crossbeam_deque::Worker::new_lifo();
        let s = w.stealer();
        (ChaseLev(w), ChaseLevStealer(s))
    }

    #[inline]
    fn push(&self, item: T) {
        self.0.push(item);
    }

    #[inline]
    fn pop(&self) -> Option<T> {
        self.0.pop()
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }
}

impl<T: Send + 'static> DequeStealer<T> for ChaseLevStealer<T> {
    #[inline]
    fn steal(&self) -> Steal<T> {
        match self.0.steal() {
            crossbeam_deque::Steal::Empty => Steal::Empty,
            crossbeam_deque::Steal::Success(t) => Steal::Success(t),
            crossbeam_deque::Steal::Retry => Steal::Retry,
        }
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A deque behind a mutex: simple, fair to thieves, and a baseline to compare
/// the lock-free default against.
#[derive(Debug)]
pub struct LockedDeque<T>(Arc<Mutex<VecDeque<T>>>);

/// Stealer of [`LockedDeque`].
#[derive(Debug)]
pub struct LockedStealer<T>(Arc<Mutex<VecDeque<T>>>);

fn lock<T>(m: &Mutex<VecDeque<T>>) -> std::sync::MutexGuard<'_, VecDeque<T>> {
    // A panic cannot happen while the lock is held (only VecDeque operations).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T: Send + 'static> WorkerDeque<T> for LockedDeque<T> {
    type Stealer = LockedStealer<T>;

    fn new() -> (Self, Self::Stealer) {
        let q = Arc::new(Mutex::new(VecDeque::new()));
        (LockedDeque(q.clone()), LockedStealer(q))
    }

    fn push(&self, item: T) {
        lock(&self.0).push_back(item);
    }

    fn pop(&self) -> Option<T> {
        lock(&self.0).pop_back()
    }

    fn is_empty(&self) -> bool {
        lock(&self.0).is_empty()
    }

    fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

impl<T: Send + 'static> DequeStealer<T> for LockedStealer<T> {
    fn steal(&self) -> Steal<T> {
        match self.0.try_lock() {
            Ok(mut q) => q.pop_front().map_or(Steal::Empty, Steal::Success),
            Err(std::sync::TryLockError::WouldBlock) => Steal::Retry,
            Err(std::sync::TryLockError::Poisoned(e)) => e
                .into_inner()
                .pop_front()
                .map_or(Steal::Empty, Steal::Success),
        }
    }

    fn is_empty(&self) -> bool {
        lock(&self.0).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifo_owner_fifo_thief<D: WorkerDeque<u32>>() {
        let (d, s) = D::new();
        assert!(d.is_empty());
        for i in 0..4 {
            d.push(i);
        }
        assert_eq!(d.pop(), Some(3), "owner pops the newest");
        assert_eq!(s.steal(), Steal::Success(0), "thief steals the oldest");
        assert_eq!(d.pop(), Some(2));
        assert_eq!(d.pop(), Some(1));
        assert_eq!(d.pop(), None);
        assert_eq!(s.steal(), Steal::Empty);
    }

    #[test]
    fn chase_lev_order() {
        lifo_owner_fifo_thief::<ChaseLev<u32>>();
    }

    #[test]
    fn locked_order() {
        lifo_owner_fifo_thief::<LockedDeque<u32>>();
    }

    fn concurrent_steal_accounts_everything<D: WorkerDeque<u32>>()
    where
        D::Stealer: Send,
    {
        let (d, s) = D::new();
        let s = Arc::new(s);
        let n = 20_000u32;
        let thieves: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let mut empty = 0;
                    while empty < 10_000 {
                        match s.steal() {
                            Steal::Success(v) => got.push(v),
                            Steal::Retry => {}
                            Steal::Empty => empty += 1,
                        }
                    }
                    got
                })
            })
            .collect();
        let mut mine = Vec::new();
        for i in 0..n {
            d.push(i);
            if i % 3 == 0 {
                mine.extend(d.pop());
            }
        }
        while let Some(v) = d.pop() {
            mine.push(v);
        }
        let mut all: Vec<u32> = thieves
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.extend(mine);
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "every item exactly once");
    }

    #[test]
    fn chase_lev_concurrent() {
        concurrent_steal_accounts_everything::<ChaseLev<u32>>();
    }

    #[test]
    fn asymmetric_order() {
        lifo_owner_fifo_thief::<AsymmetricChaseLev<u32>>();
    }

    #[test]
    fn asymmetric_concurrent() {
        concurrent_steal_accounts_everything::<AsymmetricChaseLev<u32>>();
    }

    #[test]
    fn locked_concurrent() {
        concurrent_steal_accounts_everything::<LockedDeque<u32>>();
    }
}
