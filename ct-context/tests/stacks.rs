//! Stack construction, validation and pooling.

use ct_context::{Error, MmapStack, RawStack, Stack, StackPool, trap};

#[test]
fn mmap_stack_layout_and_guard() {
    let s = MmapStack::new(100 * 1024).unwrap();
    let page = ct_context::stack::page_size();
    let r = s.region();
    assert!(r.len() >= 100 * 1024 && r.len().is_multiple_of(page));
    assert_eq!(r.top() % 16, 0);
    let (g, glen) = s.guard();
    assert_eq!(glen, page);
    assert_eq!(
        g + glen,
        r.bottom(),
        "the guard lies directly below the stack"
    );
    assert!(s.overflow_detected());
    assert_eq!(trap::find_guard(g), Some((g, glen)));
    // Whole stack is writable.
    // SAFETY: the region is our mapping.
    unsafe { std::ptr::write_bytes(r.bottom() as *mut u8, 0xab, r.len()) };
    drop(s);
    assert_eq!(
        trap::find_guard(g),
        None,
        "dropping the stack unregisters its guard"
    );
}

#[test]
fn mmap_stack_rejects_bad_sizes() {
    assert!(matches!(
        MmapStack::new(1024),
        Err(Error::StackTooSmall {
            requested: 1024,
            ..
        })
    ));
    assert!(matches!(
        MmapStack::with_guard_pages(64 * 1024, 0),
        Err(Error::InvalidGuardPages { requested: 0, .. })
    ));
    assert!(matches!(
        MmapStack::new(usize::MAX - 10),
        Err(Error::StackTooLarge { .. })
    ));
    let msg = MmapStack::new(10).unwrap_err().to_string();
    assert!(msg.contains("too small"), "{msg}");
}

#[test]
fn raw_stack_validation() {
    let mut buf = vec![0u8; 64];
    // SAFETY: only validation happens; no context runs on these.
    unsafe {
        assert!(matches!(
            RawStack::new(std::ptr::null_mut(), 1 << 20),
            Err(Error::NullStack)
        ));
        assert!(matches!(
            RawStack::new(buf.as_mut_ptr(), buf.len()),
            Err(Error::StackTooSmall { .. })
        ));
        let mut big = vec![0u8; 10_000];
        let s = RawStack::new(big.as_mut_ptr().add(3), 9_000).unwrap();
        let r = s.region();
        assert_eq!(r.top() % 16, 0);
        assert!(r.bottom() == big.as_ptr() as usize + 3 && r.top() <= r.bottom() + 9_000);
    }
}

#[test]
fn pool_reuses_and_caps() {
    let pool = StackPool::with_options(32 * 1024, 2, 2).unwrap();
    assert_eq!(pool.cached(), 1, "the first stack is mapped eagerly");
    let a = pool.get().unwrap();
    let a_top = a.region().top();
    drop(a);
    let b = pool.get().unwrap();
    assert_eq!(b.region().top(), a_top, "a returned stack is reused");
    let c = pool.get().unwrap();
    let d = pool.get().unwrap();
    drop((b, c, d));
    assert_eq!(pool.cached(), 2, "the pool keeps at most max_cached stacks");
    let e = pool.get().unwrap().into_inner();
    assert_eq!(pool.cached(), 1);
    assert_eq!(e.guard().1, 2 * ct_context::stack::page_size());
    drop(e);
    assert_eq!(
        pool.cached(),
        1,
        "a stack taken out of the pool does not come back"
    );
    assert!(StackPool::new(10).is_err());
}
