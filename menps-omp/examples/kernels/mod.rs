//! The kernels of the examples and of the `npb_like` benchmark: each runs
//! with menps-omp (`run_omp`, from `main` of `menps_omp::run`) and with rayon
//! (`run_rayon`), the same algorithm, verified.

pub mod cg;
pub mod ep;
pub mod is;
pub mod matmul;
pub mod report;
pub mod stencil;

use report::{Class, KernelResult};

/// The kernels, by name.
pub const KERNELS: [&str; 5] = ["ep", "cg", "is", "matmul", "stencil"];

/// Runs kernel `name` with menps-omp.
pub fn run_omp(name: &str, class: Class) -> Option<KernelResult> {
    Some(match name {
        "ep" => ep::run_omp(class),
        "cg" => cg::run_omp(class),
        "is" => is::run_omp(class),
        "matmul" => matmul::run_omp(class),
        "stencil" => stencil::run_omp(class),
        _ => return None,
    })
}

/// Runs kernel `name` with rayon on the current pool.
pub fn run_rayon(name: &str, class: Class) -> Option<KernelResult> {
    Some(match name {
        "ep" => ep::run_rayon(class),
        "cg" => cg::run_rayon(class),
        "is" => is::run_rayon(class),
        "matmul" => matmul::run_rayon(class),
        "stencil" => stencil::run_rayon(class),
        _ => return None,
    })
}
