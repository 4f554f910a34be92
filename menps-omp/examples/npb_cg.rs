//! NAS Parallel Benchmarks' CG kernel (NPB 3.x, classes S and W) on
//! menps-omp: the inverse power method on NPB's random sparse symmetric
//! matrix (`makea`, NPB's generator), 25 conjugate-gradient iterations per
//! outer iteration, one untimed warm-up iteration and `niter` = 15 timed
//! ones; verified against NPB's reference `zeta` (relative error 1e-10),
//! Mop/s in NPB's count.
//!
//! ```text
//! cargo run --release -p menps-omp --example npb_cg -- --class W
//! MENPS_NPROCS=2 OMP_NUM_THREADS=2 cargo run --release -p menps-omp --example npb_cg -- --class S
//! RAYON_NUM_THREADS=2 cargo run --release -p menps-omp --example npb_cg -- --class W --rayon
//! ```
//!
//! `--class S|W` (or `NPB_CLASS`; default W) picks the size; the job has 4
//! processes unless `MENPS_NPROCS` says otherwise, and `OMP_NUM_THREADS`
//! threads in all. `--rayon` runs the same algorithm with rayon in this
//! process instead (no DSM). It prints the time, Mop/s, the verification,
//! the team's shape and every process's DSM statistics, and exits with
//! status 1 if the verification failed.

#[path = "kernels/cg.rs"]
mod cg;
#[path = "kernels/report.rs"]
mod report;

fn main() -> std::process::ExitCode {
    report::example_main("cg", report::Class::W, 4, cg::run_omp, cg::run_rayon)
}
