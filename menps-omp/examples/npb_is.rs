//! NAS Parallel Benchmarks' IS kernel (NPB 3.x, classes S and W) on
//! menps-omp: NPB's keys (four uniform numbers of NPB's generator averaged
//! and scaled to the key range), ten iterations that change two keys and
//! rank them all by a counting sort — a histogram per thread in its own
//! page-aligned block of a shared array, then a parallel running sum over
//! blocks of key values with one reduction for the blocks' offsets — and
//! NPB's verification: five test ranks per iteration and the full sort at
//! the end.
//!
//! ```text
//! cargo run --release -p menps-omp --example npb_is -- --class W
//! MENPS_NPROCS=2 OMP_NUM_THREADS=2 cargo run --release -p menps-omp --example npb_is -- --class S
//! RAYON_NUM_THREADS=2 cargo run --release -p menps-omp --example npb_is -- --class W --rayon
//! ```
//!
//! `--class S|W` (or `NPB_CLASS`; default S) picks the size; the job has 4
//! processes unless `MENPS_NPROCS` says otherwise, and `OMP_NUM_THREADS`
//! threads in all. `--rayon` runs the same algorithm with rayon in this
//! process instead (no DSM). It prints the time, Mop/s, the verification,
//! the team's shape and every process's DSM statistics, and exits with
//! status 1 if the verification failed.

#[path = "kernels/is.rs"]
mod is;
#[path = "kernels/report.rs"]
mod report;

fn main() -> std::process::ExitCode {
    report::example_main("is", report::Class::S, 4, is::run_omp, is::run_rayon)
}
