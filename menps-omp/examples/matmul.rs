//! Dense matrix multiply `C = A·B` (`f64`, row-major, `n × n`; class S
//! `n = 256`, class W `n = 512`), blocked for the cache, the rows of `C`
//! shared among the team in static blocks; verified against `A·(B·v)` for a
//! random vector `v` and against sampled dot products.
//!
//! ```text
//! cargo run --release -p menps-omp --example matmul -- --class W
//! MENPS_NPROCS=2 OMP_NUM_THREADS=2 cargo run --release -p menps-omp --example matmul
//! RAYON_NUM_THREADS=2 cargo run --release -p menps-omp --example matmul -- --rayon
//! ```
//!
//! Options: `--class S|W` (or `NPB_CLASS`; default S), `--rayon` (the rayon
//! version in this process, no DSM). The job has 4 processes unless
//! `MENPS_NPROCS` says otherwise; the team has `OMP_NUM_THREADS` threads.
//! The exit status is 1 if the verification failed.

#[path = "kernels/matmul.rs"]
mod matmul;
#[path = "kernels/report.rs"]
mod report;

fn main() -> std::process::ExitCode {
    report::example_main(
        "matmul",
        report::Class::S,
        4,
        matmul::run_omp,
        matmul::run_rayon,
    )
}
