//! Hello world of the communication layer: starts 4 processes by itself
//! (`MENPS_NPROCS` overrides the count), then in each: a barrier, a
//! fetch-and-add on rank 0's window, an allgather, and one line of output.
//!
//! ```text
//! cargo run --release -p menps-dsm --example hello_shm
//! ```
//!
//! Built with the `mpi` feature, the same program runs on the MPI backend
//! when started by `mpirun` (it joins as `AnyCom`):
//!
//! ```text
//! cargo build --release -p menps-dsm --features mpi --example hello_shm
//! mpirun -n 4 --oversubscribe target/release/examples/hello_shm
//! ```

use menps_dsm::com::{AnyCom, Coll, Comm, Rma, Windows};

fn main() -> Result<(), menps_dsm::com::Error> {
    // Warnings the libraries report (through `log`) go to stderr.
    ct_worker::log_to_stderr();
    // In the launcher this never returns: it runs the job and exits with its
    // status. In each of the 4 processes it returns the communicator.
    let com: AnyCom<ct_worker::OsThreads> = menps_dsm::launch::init_or_relaunch(4)?;
    let (rank, size) = (com.rank(), com.size());

    let win = com.create_window(4096)?;
    com.barrier()?;

    // Everyone adds rank + 1 to a counter in rank 0's window.
    let counter = win.at(0, 0);
    let before = com.fetch_add(counter, rank as u64 + 1)?;
    com.barrier()?;
    let total = com.atomic_load(counter)?;
    let expected = (size * (size + 1) / 2) as u64;
    assert_eq!(total, expected, "fetch_add total");

    // Gather every rank's pid.
    let pids = com.allgather(&std::process::id().to_le_bytes())?;
    let pids: Vec<u32> = pids
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();

    println!(
        "hello from rank {rank} of {size} on {} (pid {}): counter was {before} before my add, \
         {total} after everyone's; pids {pids:?}",
        com.backend_name(),
        std::process::id()
    );
    com.barrier()?;
    Ok(())
}
