//! Several RMA operations at once ([`Rma::compare_and_swap_all`],
//! [`Rma::read_all`]): what one is, and the way every backend can do them —
//! start them all, then wait for each — which a backend whose operations
//! complete one round trip at a time replaces with one that has them in
//! flight together (the served mpi backend).

use super::{RemotePtr, Result, Rma, RmaRequest};

/// One compare-and-swap of [`Rma::compare_and_swap_all`]: the word, its
/// operands, and the old word once done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasOp {
    /// The aligned word.
    pub target: RemotePtr,
    /// The value it must hold to be swapped.
    pub expected: u64,
    /// Its new value.
    pub new: u64,
    /// The word as the operation found it (success iff it equals
    /// `expected`); set when the batch returns.
    pub old: u64,
}

impl CasOp {
    /// A compare-and-swap of `target` from `expected` to `new`.
    pub fn new(target: RemotePtr, expected: u64, new: u64) -> Self {
        CasOp {
            target,
            expected,
            new,
            old: 0,
        }
    }

    /// Whether it swapped.
    pub fn swapped(&self) -> bool {
        self.old == self.expected
    }
}

/// Starts `start(item)` for every item, then waits for each request
/// started and hands its value to `done` — every one, also after an error
/// (their buffers are borrowed until we return); returns the first error.
fn start_then_wait<T, R: RmaRequest>(
    items: &mut [T],
    mut start: impl FnMut(&mut T) -> Result<R>,
    mut done: impl FnMut(&mut T, u64),
) -> Result<()> {
    let mut reqs = Vec::with_capacity(items.len());
    let mut first_err = None;
    for item in items.iter_mut() {
        match start(item) {
            Ok(r) => reqs.push(r),
            Err(e) => {
                first_err = Some(e);
                break;
            }
        }
    }
    for (item, r) in items.iter_mut().zip(reqs) {
        match r.wait() {
            Ok(v) => done(item, v),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// [`Rma::compare_and_swap_all`] by the non-blocking forms: every operation
/// started, then each waited for.
pub fn cas_all_nb<C: Rma + ?Sized>(com: &C, ops: &mut [CasOp]) -> Result<()> {
    start_then_wait(
        ops,
        |op| com.compare_and_swap_nb(op.target, op.expected, op.new),
        |op, old| op.old = old,
    )
}

/// [`Rma::read_all`] by the non-blocking forms, as [`cas_all_nb`].
pub fn read_all_nb<C: Rma + ?Sized>(com: &C, reads: &mut [(RemotePtr, &mut [u8])]) -> Result<()> {
    start_then_wait(
        reads,
        // SAFETY: `dst` is exclusively borrowed until we return, and every
        // request started is waited for before we do.
        |(src, dst)| unsafe { com.read_nb(*src, dst.as_mut_ptr(), dst.len()) },
        |_, _| {},
    )
}
