//! ULT-local storage: like `thread_local!`, but per user-level thread, so the
//! value follows the thread when it migrates between workers.

use core::cell::UnsafeCell;
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::worker::current_locals;

/// The values of one thread, indexed by key.
#[derive(Default)]
pub(crate) struct LocalMap(Vec<Option<Box<dyn Any>>>);

static NEXT_KEY: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// ULT-locals of code that runs outside any user-level thread.
    static OS_LOCALS: UnsafeCell<Option<Box<LocalMap>>> = const { UnsafeCell::new(None) };
}

/// A key for ULT-local storage; declare one with [`ult_local!`](crate::ult_local).
///
/// Each user-level thread gets its own value, created by the key's
/// initialiser on first access and dropped when the thread finishes. Code that
/// runs outside user-level threads (plain OS threads) gets one value per OS
/// thread.
pub struct UltLocalKey<T: 'static> {
    init: fn() -> T,
    /// Key index + 1, or 0 before first use.
    id: AtomicUsize,
}

impl<T: 'static> UltLocalKey<T> {
    /// Creates a key with an initialiser. Use [`ult_local!`](crate::ult_local).
    pub const fn new(init: fn() -> T) -> Self {
        UltLocalKey {
            init,
            id: AtomicUsize::new(0),
        }
    }

    fn index(&self) -> usize {
        let id = self.id.load(Ordering::Acquire);
        if id != 0 {
            return id - 1;
        }
        let fresh = NEXT_KEY.fetch_add(1, Ordering::Relaxed) + 1;
        match self
            .id
            .compare_exchange(0, fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => fresh - 1,
            Err(won) => won - 1,
        }
    }

    /// Runs `f` with this thread's value.
    ///
    /// The reference stays valid even if `f` blocks and the thread resumes on
    /// another worker: the value lives with the user-level thread.
    pub fn with<R>(&'static self, f: impl FnOnce(&T) -> R) -> R {
        let idx = self.index();
        let value: *const T = match current_locals() {
            // SAFETY: the running thread's locals are only touched by that
            // thread.
            Some(cell) => unsafe { self.get_or_init(cell.as_ref().get(), idx) },
            // SAFETY: as above, for the OS thread.
            None => OS_LOCALS.with(|cell| unsafe { self.get_or_init(cell.get(), idx) }),
        };
        // SAFETY: values are boxed and live until the thread finishes, which
        // is after `f` returns.
        f(unsafe { &*value })
    }

    /// Returns this key's value in `map`, creating it if needed. No reference
    /// into the map is held while the initialiser runs, since it may use
    /// other keys (and grow the map).
    ///
    /// # Safety
    ///
    /// `map` must belong to the calling thread.
    unsafe fn get_or_init(&self, map: *mut Option<Box<LocalMap>>, idx: usize) -> *const T {
        // SAFETY: short-lived exclusive borrows of the calling thread's map.
        let present = unsafe {
            let m = (*map).get_or_insert_with(Default::default);
            m.0.get(idx).is_some_and(|v| v.is_some())
        };
        if !present {
            let v: Box<dyn Any> = Box::new((self.init)());
            // SAFETY: as above; the initialiser has returned.
            let m = unsafe { (*map).get_or_insert_with(Default::default) };
            if m.0.len() <= idx {
                m.0.resize_with(idx + 1, || None);
            }
            m.0[idx] = Some(v);
        }
        // SAFETY: as above.
        let m = unsafe { (*map).as_ref().expect("created above") };
        let v = m.0[idx].as_ref().expect("initialised above");
        v.downcast_ref::<T>()
            .expect("ULT-local key used with one type") as *const T
    }
}

impl<T: 'static> core::fmt::Debug for UltLocalKey<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UltLocalKey").finish_non_exhaustive()
    }
}

/// Declares ULT-local keys, like `thread_local!`.
///
/// ```
/// use std::cell::Cell;
/// ct_worker::ult_local! {
///     static COUNTER: Cell<u32> = Cell::new(0);
/// }
/// let rt = ct_worker::Runtime::new().unwrap();
/// let n = rt.block_on(|| {
///     COUNTER.with(|c| c.set(c.get() + 1));
///     ct_worker::yield_now();
///     COUNTER.with(|c| c.get())
/// });
/// assert_eq!(n, 1);
/// ```
#[macro_export]
macro_rules! ult_local {
    ($($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr;)+) => {
        $(
            $(#[$attr])*
            $vis static $name: $crate::UltLocalKey<$t> = $crate::UltLocalKey::new({
                fn __ult_local_init() -> $t {
                    $init
                }
                __ult_local_init
            });
        )+
    };
}
