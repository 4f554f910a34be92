//! Parallel loops by recursive splitting.

use core::ops::Range;

use crate::config::{Config, DefaultConfig};
use crate::handle::join_in;

/// Calls `f(i)` for every `i` in `range`, in parallel: the range is split in
/// halves with [`join`](crate::join) until pieces have at most `grain`
/// indices (`grain` 0 counts as 1), which run sequentially. Outside a runtime
/// the loop runs sequentially.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// let rt = ct_worker::Runtime::new().unwrap();
/// let sum = AtomicU64::new(0);
/// rt.block_on(|| ct_worker::parallel_for(0..1000, 16, |i| {
///     sum.fetch_add(i as u64, Ordering::Relaxed);
/// }));
/// assert_eq!(sum.into_inner(), 999 * 1000 / 2);
/// ```
pub fn parallel_for<F>(range: Range<usize>, grain: usize, f: F)
where
    F: Fn(usize) + Sync,
{
    parallel_for_in::<DefaultConfig, F>(range, grain, f);
}

/// [`parallel_for`] for a runtime of configuration `C`.
pub fn parallel_for_in<C: Config, F>(range: Range<usize>, grain: usize, f: F)
where
    F: Fn(usize) + Sync,
{
    split::<C, F>(range.start, range.end, grain.max(1), &f);
}

fn split<C: Config, F: Fn(usize) + Sync>(lo: usize, hi: usize, grain: usize, f: &F) {
    if hi <= lo {
        return;
    }
    if hi - lo <= grain {
        for i in lo..hi {
            f(i);
        }
        return;
    }
    let mid = lo + (hi - lo) / 2;
    join_in::<C, _, _, _, _>(
        || split::<C, F>(lo, mid, grain, f),
        || split::<C, F>(mid, hi, grain, f),
    );
}
