//! Builder values win over `CT_*` variables, which win over the defaults.
//! (One test in its own binary: it sets the process's environment.)

use ct_worker::{DEFAULT_STACK_SIZE, Error, Runtime};

fn set(name: &str, value: &str) {
    // SAFETY: the only test of this binary; no other thread reads the
    // environment while it is changed.
    unsafe { std::env::set_var(name, value) };
}

fn stack_size(rt: &Runtime) -> String {
    format!("{rt:?}")
}

#[test]
fn builder_then_environment_then_default() {
    set("CT_NUM_WORKERS", "3");
    set("CT_STACK_SIZE", "256k");
    let rt = Runtime::builder()
        .workers(2)
        .stack_size(64 * 1024)
        .build()
        .unwrap();
    assert_eq!(rt.num_workers(), 2, "the builder's worker count wins");
    assert!(stack_size(&rt).contains("stack_size: 65536"), "{rt:?}");
    drop(rt);

    let rt = Runtime::builder().build().unwrap();
    assert_eq!(
        rt.num_workers(),
        3,
        "CT_NUM_WORKERS applies without a builder value"
    );
    assert!(stack_size(&rt).contains("stack_size: 262144"), "{rt:?}");
    drop(rt);

    // A malformed variable is an error naming it, unless the builder decides.
    set("CT_NUM_WORKERS", "two");
    let e = Runtime::builder().build().unwrap_err();
    assert!(matches!(e, Error::Env(_)), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("CT_NUM_WORKERS=\"two\" is not valid"),
        "{e}"
    );
    assert_eq!(
        Runtime::builder().workers(1).build().unwrap().num_workers(),
        1
    );
    set("CT_NUM_WORKERS", "");
    let e = Runtime::builder().build().unwrap_err();
    assert!(
        e.to_string().starts_with("CT_NUM_WORKERS is set but empty"),
        "{e}"
    );

    // Unset: the defaults.
    // SAFETY: as in `set`.
    unsafe {
        std::env::remove_var("CT_NUM_WORKERS");
        std::env::remove_var("CT_STACK_SIZE");
    }
    let rt = Runtime::builder().workers(1).build().unwrap();
    assert!(
        stack_size(&rt).contains(&format!("stack_size: {DEFAULT_STACK_SIZE}")),
        "{rt:?}"
    );
}
