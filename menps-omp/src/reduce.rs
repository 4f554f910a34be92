//! A parallel region that is one reduction loop: [`parallel_reduce`].

use core::ops::Range;

use crate::region::parallel;

/// Folds `range` in parallel (`#pragma omp parallel for reduction`): every
/// thread of a new team folds its iterations (static blocks) starting from
/// `identity` with `fold`, and the values are combined in thread order with
/// the associative `combine`.
///
/// ```no_run
/// # fn f(v: &[f64]) -> f64 {
/// menps_omp::parallel_reduce(0..v.len(), 0.0, |acc, i| acc + v[i] * v[i], |a, b| a + b)
/// # }
/// ```
pub fn parallel_reduce<T, F, C>(range: Range<usize>, identity: T, fold: F, combine: C) -> T
where
    T: Copy + Send + Sync,
    F: Fn(T, usize) -> T + Sync,
    C: Fn(T, T) -> T + Sync,
{
    let mut result = identity;
    let out = crate::SharedMut::new(core::slice::from_mut(&mut result));
    parallel(|t| {
        let v = t
            .for_range(range.clone())
            .nowait()
            .reduce(identity, &fold, &combine);
        // Thread 0 (static block of one iteration) stores the result.
        t.for_range(0..1).each_mut(&out, |_, r| *r = v);
    });
    result
}
