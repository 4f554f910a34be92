//! A 2-D 5-point Jacobi relaxation of Laplace's equation on an
//! `(n+2) × (n+2)` grid of `f64` (class S `n = 256`, class W `n = 1024`;
//! 100 sweeps), the boundary fixed to `x² − y²`, two grids swapped every
//! sweep, all sweeps in one parallel region with the rows shared in static
//! blocks; verified bit for bit against a serial run and against the
//! contraction the Jacobi iteration must achieve towards `x² − y²`.
//!
//! ```text
//! cargo run --release -p menps-omp --example stencil -- --class W
//! MENPS_NPROCS=2 OMP_NUM_THREADS=2 cargo run --release -p menps-omp --example stencil
//! RAYON_NUM_THREADS=2 cargo run --release -p menps-omp --example stencil -- --rayon
//! ```
//!
//! Options: `--class S|W` (or `NPB_CLASS`; default S), `--rayon` (the rayon
//! version in this process, no DSM). The job has 4 processes unless
//! `MENPS_NPROCS` says otherwise; the team has `OMP_NUM_THREADS` threads.
//! The exit status is 1 if the verification failed.

#[path = "kernels/report.rs"]
mod report;
#[path = "kernels/stencil.rs"]
mod stencil;

fn main() -> std::process::ExitCode {
    report::example_main(
        "stencil",
        report::Class::S,
        4,
        stencil::run_omp,
        stencil::run_rayon,
    )
}
