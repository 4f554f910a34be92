//! Teams of threads across processes: the team barrier.

mod barrier;

pub use barrier::TeamBarrier;
