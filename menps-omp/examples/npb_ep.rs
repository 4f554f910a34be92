//! NAS Parallel Benchmarks' EP kernel (NPB 3.x, classes S and W) on
//! menps-omp: Gaussian deviates from NPB's linear congruential generator by
//! the Marsaglia polar method, their sums and annulus counts, whole batches
//! of 2^16 pairs per thread and one reduction; verified against NPB's
//! reference sums (relative tolerance 1e-8).
//!
//! ```text
//! cargo run --release -p menps-omp --example npb_ep -- --class W
//! MENPS_NPROCS=2 OMP_NUM_THREADS=2 cargo run --release -p menps-omp --example npb_ep -- --class S
//! RAYON_NUM_THREADS=2 cargo run --release -p menps-omp --example npb_ep -- --class W --rayon
//! ```
//!
//! `--class S|W` (or `NPB_CLASS`; default S) picks the size; the job has 4
//! processes unless `MENPS_NPROCS` says otherwise, and `OMP_NUM_THREADS`
//! threads in all. `--rayon` runs the same algorithm with rayon in this
//! process instead (no DSM). It prints the time, Mop/s, the verification,
//! the team's shape and every process's DSM statistics, and exits with
//! status 1 if the verification failed.

#[path = "kernels/ep.rs"]
mod ep;
#[path = "kernels/report.rs"]
mod report;

fn main() -> std::process::ExitCode {
    report::example_main("ep", report::Class::S, 4, ep::run_omp, ep::run_rayon)
}
