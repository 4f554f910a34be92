//! Builder values win over the `OMP_*` variables, which win over the
//! defaults. (One test in its own binary: it sets the process's
//! environment.)

use menps_omp::{Builder, Schedule};

fn set(name: &str, value: &str) {
    // SAFETY: the only test of this binary; no other thread reads the
    // environment while it is changed.
    unsafe { std::env::set_var(name, value) };
}

#[test]
fn builder_then_environment_then_default() {
    let s = Builder::new().settings().unwrap();
    assert_eq!((s.num_threads, s.stack_size), (None, None), "defaults");
    assert_eq!(s.schedule, Schedule::Static);

    set("OMP_NUM_THREADS", "6,2");
    set("OMP_SCHEDULE", "dynamic,4");
    set("OMP_STACKSIZE", "256");
    let s = Builder::new().settings().unwrap();
    assert_eq!(s.num_threads, Some(6), "the first of the list");
    assert_eq!(s.schedule, Schedule::Dynamic(4));
    assert_eq!(s.stack_size, Some(256 << 10), "a bare number is KiB");

    let s = Builder::new()
        .num_threads(2)
        .schedule(Schedule::Guided(8))
        .stack_size(64 << 10)
        .settings()
        .unwrap();
    assert_eq!(s.num_threads, Some(2));
    assert_eq!(s.schedule, Schedule::Guided(8));
    assert_eq!(s.stack_size, Some(64 << 10));

    set("OMP_NUM_THREADS", "0");
    let e = Builder::new().settings().unwrap_err().to_string();
    assert!(e.contains("OMP_NUM_THREADS=\"0\" is not valid"), "{e}");
    assert!(Builder::new().num_threads(3).settings().is_ok());
    set("OMP_NUM_THREADS", "2");
    set("OMP_STACKSIZE", "1.5M");
    let e = Builder::new().settings().unwrap_err().to_string();
    assert!(e.contains("OMP_STACKSIZE=\"1.5M\" is not valid"), "{e}");
    set("OMP_STACKSIZE", "1M");
    set("OMP_WAIT_POLICY", "sometimes");
    let e = Builder::new().settings().unwrap_err().to_string();
    assert!(
        e.contains("OMP_WAIT_POLICY=\"sometimes\" is not valid: expected one of active, passive"),
        "{e}"
    );
}
