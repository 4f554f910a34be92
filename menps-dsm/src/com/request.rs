//! Completion of asynchronous operations: a [`Request`] that the issuer waits
//! on (parking the calling user-level thread) or attaches a callback to, and
//! the [`Completer`] the backend's progress engine uses to finish it.
//!
//! The state machine on one atomic byte (the original mecom2/meqdc proxy
//! request, `created → waiting → finished`, plus a callback state):
//!
//! - `PENDING` → `WAITING`: the waiter, from inside `wait_with` (after its
//!   context is saved), so a completer that sees `WAITING` may wake it;
//! - `PENDING` → `CALLBACK`: the owner installed a callback;
//! - anything → `DONE`: the completer, after storing the value. It wakes the
//!   waiter if it saw `WAITING` and runs the callback if it saw `CALLBACK`.
//!
//! Exactly one of {waiter cancels its park because the value is there, the
//! completer wakes it} happens, and exactly one side runs a callback.
//!
//! The shm backend completes everything before returning, so it hands out
//! [`Request::ready`] requests, which cost nothing; backends with real
//! asynchrony (MPI requests, verbs completion queues) use [`Request::pending`].

use std::cell::UnsafeCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use ct_worker::{SuspendedThreadItf, UltItf};

use super::RmaRequest;
use super::error::{Error, Result};

const PENDING: u8 = 0;
const WAITING: u8 = 1;
const CALLBACK: u8 = 2;
const DONE: u8 = 3;

type Callback = Box<dyn FnOnce(Result<u64>) + Send>;

struct Completion<U: UltItf> {
    state: AtomicU8,
    /// Written by the completer before `DONE`; read by the owner after it.
    value: UnsafeCell<Option<Result<u64>>>,
    /// Written by the owner before `CALLBACK`; taken by the completer after.
    callback: UnsafeCell<Option<Callback>>,
    waiter: U::SuspendedThread,
}

// SAFETY: the cells are accessed by one side at a time, handed over through
// the release/acquire transitions of `state` described in the module docs;
// the value and the callback are `Send`.
unsafe impl<U: UltItf> Sync for Completion<U> {}
// SAFETY: as above; every field is `Send`.
unsafe impl<U: UltItf> Send for Completion<U> {}

impl<U: UltItf> Completion<U> {
    fn complete(&self, v: Result<u64>) {
        // SAFETY: until we publish DONE, only the (single) completer touches
        // `value`; the owner reads it only after observing DONE.
        unsafe { *self.value.get() = Some(v) };
        match self.state.swap(DONE, Ordering::AcqRel) {
            WAITING => {
                self.waiter.notify();
            }
            CALLBACK => {
                // SAFETY: the owner stored the callback before its release CAS
                // to CALLBACK, which our acquire swap observed; it no longer
                // touches either cell.
                let (f, v) = unsafe {
                    (
                        (*self.callback.get()).take(),
                        (*self.value.get()).take().expect("value set above"),
                    )
                };
                if let Some(f) = f {
                    f(v);
                }
            }
            _ => {}
        }
    }

    /// Takes the value; the state must be `DONE` (acquired).
    fn take_value(&self) -> Result<u64> {
        debug_assert_eq!(self.state.load(Ordering::Acquire), DONE);
        // SAFETY: DONE was observed with acquire ordering, so the completer's
        // write is visible and it will not touch `value` again; the single
        // owner is the only reader.
        unsafe { (*self.value.get()).take() }.expect("completion value taken twice")
    }
}

enum Inner<U: UltItf> {
    Ready(Result<u64>),
    Pending(Arc<Completion<U>>),
}

/// The handle of an asynchronous operation. Wait for it with
/// [`RmaRequest::wait`] (the calling user-level thread parks until the
/// operation completes; an OS thread blocks) or hand it a callback with
/// [`RmaRequest::on_complete`].
///
/// The value is the fetched word for atomics and 0 for reads and writes.
/// Dropping a request does not cancel the operation: use
/// [`Rma::flush`](super::Rma::flush) to wait for everything issued to a process.
pub struct Request<U: UltItf> {
    inner: Inner<U>,
}

impl<U: UltItf> core::fmt::Debug for Request<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Request")
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl<U: UltItf> Request<U> {
    /// A request that is already complete with `v` (what the shm backend
    /// returns: its operations finish before the call returns).
    pub fn ready(v: Result<u64>) -> Self {
        Request {
            inner: Inner::Ready(v),
        }
    }

    /// A pending request and the [`Completer`] that finishes it (for backends
    /// whose operations complete later, in a progress engine).
    pub fn pending() -> (Self, Completer<U>) {
        let c = Arc::new(Completion {
            state: AtomicU8::new(PENDING),
            value: UnsafeCell::new(None),
            callback: UnsafeCell::new(None),
            waiter: U::SuspendedThread::default(),
        });
        (
            Request {
                inner: Inner::Pending(c.clone()),
            },
            Completer { c: Some(c) },
        )
    }
}

impl<U: UltItf> RmaRequest for Request<U> {
    fn is_complete(&self) -> bool {
        match &self.inner {
            Inner::Ready(_) => true,
            Inner::Pending(c) => c.state.load(Ordering::Acquire) == DONE,
        }
    }

    fn wait(self) -> Result<u64> {
        match self.inner {
            Inner::Ready(v) => v,
            Inner::Pending(c) => {
                if c.state.load(Ordering::Acquire) != DONE {
                    c.waiter.wait_with(|| {
                        c.state
                            .compare_exchange(PENDING, WAITING, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                    });
                    // Parked: the completer woke us after publishing DONE.
                    // Not parked: the CAS failed because the state is DONE.
                    debug_assert_eq!(c.state.load(Ordering::Acquire), DONE);
                }
                c.take_value()
            }
        }
    }

    fn on_complete<F: FnOnce(Result<u64>) + Send + 'static>(self, f: F) {
        match self.inner {
            Inner::Ready(v) => f(v),
            Inner::Pending(c) => {
                // SAFETY: before the CAS below publishes CALLBACK, only we (the
                // single owner) touch `callback`.
                unsafe { *c.callback.get() = Some(Box::new(f)) };
                if c.state
                    .compare_exchange(PENDING, CALLBACK, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // Already DONE: the completer did not look at the callback.
                    // SAFETY: the failed CAS means the completer saw PENDING,
                    // so the callback cell is still ours alone.
                    let f = unsafe { (*c.callback.get()).take() }.expect("callback just stored");
                    f(c.take_value());
                }
            }
        }
    }
}

/// Finishes one pending [`Request`]: wakes its waiter or runs its callback.
/// Dropped without [`Completer::complete`], it completes the request with an
/// `ECANCELED` error so that no waiter hangs.
pub struct Completer<U: UltItf> {
    c: Option<Arc<Completion<U>>>,
}

impl<U: UltItf> core::fmt::Debug for Completer<U> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Completer").finish_non_exhaustive()
    }
}

impl<U: UltItf> Completer<U> {
    /// Completes the request with `v`.
    pub fn complete(mut self, v: Result<u64>) {
        if let Some(c) = self.c.take() {
            c.complete(v);
        }
    }
}

impl<U: UltItf> Drop for Completer<U> {
    fn drop(&mut self) {
        if let Some(c) = self.c.take() {
            c.complete(Err(Error::Os {
                call: "asynchronous operation (abandoned by the backend)",
                errno: libc::ECANCELED,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ct_worker::{OsThreads, Ult};
    use std::sync::atomic::AtomicU64;

    #[test]
    fn ready_and_callbacks() {
        let r = Request::<OsThreads>::ready(Ok(5));
        assert!(r.is_complete());
        assert_eq!(r.wait(), Ok(5));

        let seen = Arc::new(AtomicU64::new(0));
        let (r, c) = Request::<OsThreads>::pending();
        let s = seen.clone();
        r.on_complete(move |v| s.store(v.unwrap(), Ordering::SeqCst));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        c.complete(Ok(7));
        assert_eq!(seen.load(Ordering::SeqCst), 7);

        // Callback installed after completion runs at once.
        let (r, c) = Request::<OsThreads>::pending();
        c.complete(Ok(9));
        let s = seen.clone();
        r.on_complete(move |v| s.store(v.unwrap(), Ordering::SeqCst));
        assert_eq!(seen.load(Ordering::SeqCst), 9);

        // Abandoned completer: the waiter gets an error instead of hanging.
        let (r, c) = Request::<OsThreads>::pending();
        drop(c);
        assert!(matches!(r.wait(), Err(Error::Os { errno, .. }) if errno == libc::ECANCELED));
    }

    #[test]
    fn os_thread_waits_for_completer() {
        for _ in 0..200 {
            let (r, c) = Request::<OsThreads>::pending();
            let t = std::thread::spawn(move || c.complete(Ok(42)));
            assert_eq!(r.wait(), Ok(42));
            t.join().unwrap();
        }
    }

    #[test]
    fn ult_parks_until_completed_by_another_ult() {
        let rt = ct_worker::Runtime::builder().workers(2).build().unwrap();
        let total = rt.block_on(|| {
            let mut hs = Vec::new();
            for i in 0..64u64 {
                let (r, c) = Request::<Ult>::pending();
                let waiter = ct_worker::spawn(move || r.wait().unwrap());
                let completer = ct_worker::spawn(move || {
                    ct_worker::yield_now();
                    c.complete(Ok(i));
                });
                hs.push((waiter, completer));
            }
            hs.into_iter()
                .map(|(w, c)| {
                    c.join();
                    w.join()
                })
                .sum::<u64>()
        });
        assert_eq!(total, (0..64).sum::<u64>());
    }
}
