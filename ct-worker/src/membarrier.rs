//! The heavy side of asymmetric memory barriers: Linux `membarrier`.
//!
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` returns only after every
//! other running thread of the process has executed a full memory barrier
//! (threads that are not running get one from the context switch). A hot path
//! can then use a mere compiler fence where a rare path calls [`barrier`].
//! The process must register once; [`available`] does that.

use std::sync::atomic::{AtomicU8, Ordering};

use rustix::thread::{MembarrierCommand, membarrier, membarrier_query};

/// [`available`]'s answer: 0 not known yet, 1 yes, 2 no.
static AVAILABLE: AtomicU8 = AtomicU8::new(0);

/// Whether expedited private barriers can be used (registering the process
/// on first call). `CT_NO_MEMBARRIER=1` (or `true`, `yes`, `on`) forces the
/// symmetric fallback; `0`, `false`, `no`, `off` keep `membarrier`.
///
/// Inlined: after the first call it is one load of a byte, which hot paths
/// (a mutex's unlock) pay on every call.
#[inline]
pub fn available() -> bool {
    match AVAILABLE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => available_slow(),
    }
}

#[cold]
#[inline(never)]
fn available_slow() -> bool {
    use std::sync::OnceLock;
    // Registration happens once, whoever asks first; the answer is then
    // cached in `AVAILABLE`. A thread that sees 1 there may rely on the
    // registration: the `OnceLock` made it happen before the store.
    static ONCE: OnceLock<bool> = OnceLock::new();
    let yes = *ONCE.get_or_init(|| {
        match ct_config::vars::CT_NO_MEMBARRIER.flag() {
            Ok(Some(true)) => return false,
            Ok(_) => {}
            Err(e) => {
                // Called from hot paths that cannot fail: say so once and
                // keep membarrier.
                eprintln!("ct-worker: {e}; using membarrier");
            }
        }
        // An empty set where the kernel lacks the call.
        membarrier_query().contains_command(MembarrierCommand::PrivateExpedited)
            && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
    });
    AVAILABLE.store(if yes { 1 } else { 2 }, Ordering::Release);
    yes
}

/// Makes every running thread of the process execute a full barrier.
///
/// Only valid after [`available`] returned `true`.
#[cold]
pub fn barrier() {
    if let Err(e) = membarrier(MembarrierCommand::PrivateExpedited) {
        // Registration happened, so this cannot fail short of a kernel bug;
        // a plain fence would not give the guarantee, so stop loudly.
        eprintln!("ct-worker: membarrier failed after registration: {e}");
        std::process::abort();
    }
}
