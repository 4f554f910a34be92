//! `libmenps_gomp`: the libgomp interface of menps-omp as a shared and a
//! static library for C programs compiled with `gcc -fopenmp`.
//!
//! The entry points live in `menps_omp::gomp`; this package only builds
//! them into `libmenps_gomp.so` and `libmenps_gomp.a`.

pub use menps_omp::gomp;
