//! Every process's DSM statistics, collected from `main`.

use menps_dsm::dsm::StatsSnapshot;
use menps_dsm::dsm::team::TeamThread;

use crate::error::fail;
use crate::runtime::expect_runtime;

/// The DSM statistics of every process (index = rank), collected by a
/// short region of one thread per process: call it from `main` of
/// [`run`](crate::run), outside parallel regions.
///
/// # Panics
///
/// Outside `main` of [`run`](crate::run) or inside a parallel region.
pub fn process_stats() -> Vec<StatsSnapshot> {
    let rt = expect_runtime("menps_omp::process_stats");
    assert!(
        !crate::in_parallel() && rt.dsm.rank() == 0,
        "menps-omp: process_stats is called from main, outside parallel regions"
    );
    let mut all = vec![StatsSnapshot::default(); rt.dsm.nprocs()];
    let out = all.as_mut_ptr() as usize;
    let body = move |t: &TeamThread<'_>| {
        let rt = expect_runtime("process_stats");
        // SAFETY: `all` is in the DSM heap (main allocated it), each process
        // writes its own element, and the fork joins before it is read.
        unsafe {
            (out as *mut StatsSnapshot)
                .add(t.rank())
                .write(rt.dsm.stats())
        };
    };
    // SAFETY: `body` lives in main's frame (DSM memory) and captures only
    // the address of `all`, DSM memory; the fork joins before we return.
    unsafe { rt.team.parallel(1, &body) }.unwrap_or_else(|e| fail("process_stats", e));
    all
}
