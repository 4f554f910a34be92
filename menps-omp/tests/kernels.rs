//! The examples' kernels (NPB EP, CG and IS, matmul, stencil) pass their
//! verification at class S on 1 process × 2 threads and on 2 processes × 1
//! thread, and so do their rayon versions.
//!
//! Each test drives jobs of this binary (menps-dsm's test driver): the job
//! processes run [`job_entry`] with `MENPS_TEST_SCENARIO` naming the kernel.

#[path = "../../menps-dsm/tests/common/mod.rs"]
mod common;
use common::*;

// The examples' drivers (`report::example_main`) are not used here.
#[allow(dead_code)]
#[path = "../examples/kernels/mod.rs"]
mod kernels;

use kernels::report::Class;

#[test]
fn job_entry() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let r = menps_omp::Builder::new().processes(2).run(|| {
        let name = std::env::var(SCENARIO).unwrap_or_default();
        let r = kernels::run_omp(&name, Class::S).expect("a kernel of the examples");
        (r.verified, r.summary())
    });
    match r {
        Ok((true, summary)) => println!("rank 0: ok {summary}"),
        Ok((false, summary)) => {
            println!("rank 0: verification failed {summary}");
            std::process::exit(2)
        }
        Err(e) => {
            println!("rank 0: {name}: {e}");
            std::process::exit(2)
        }
    }
}

/// Runs kernel `name` at class S on `procs` × `threads`.
fn verified_on(name: &str, procs: usize, threads: usize) {
    let tag = new_tag(name);
    let mut cmd = clean_cmd(std::env::current_exe().unwrap());
    entry_args(&mut cmd);
    cmd.env(SCENARIO, name)
        .env("MENPS_NPROCS", procs.to_string())
        .env("OMP_NUM_THREADS", (procs * threads).to_string())
        .env_remove("OMP_SCHEDULE");
    let run = drive(cmd, &tag, |_, _| false);
    assert!(
        run.status.success() && run.stdout.contains("rank 0: ok"),
        "{name} on {procs}x{threads}: {}",
        run.dump()
    );
    assert!(run.stdout.contains("SUCCESSFUL"), "{}", run.dump());
}

fn kernel(name: &str) {
    verified_on(name, 1, 2);
    verified_on(name, 2, 1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let r = pool.install(|| kernels::run_rayon(name, Class::S).unwrap());
    assert!(r.verified, "rayon {}", r.summary());
}

#[test]
fn ep_verifies() {
    kernel("ep");
}

#[test]
fn cg_verifies() {
    kernel("cg");
}

#[test]
fn is_verifies() {
    kernel("is");
}

#[test]
fn matmul_verifies() {
    kernel("matmul");
}

#[test]
fn stencil_verifies() {
    kernel("stencil");
}
