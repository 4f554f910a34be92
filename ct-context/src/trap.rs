//! The process's `SIGSEGV` handler: stack-overflow reports and fault hooks.
//!
//! A user-level thread that overflows its stack writes into the guard pages
//! below it. Without help the process dies with a bare `Segmentation fault`, or —
//! worse, with stacks that have no guard — silently corrupts whatever lies
//! below. This module installs one `SIGSEGV` handler (on the alternate signal
//! stack, since the overflowed stack has no room for a signal frame) that
//! classifies every fault:
//!
//! 1. **Fault hooks** registered by higher layers run first. The DSM registers
//!    one that resolves misses in its address range ([`add_fault_hook`]).
//! 2. **Guard pages** of stacks registered with [`register_guard`] (every
//!    [`crate::MmapStack`] registers its own): the handler writes
//!    `fatal: stack overflow in user-level thread …` to stderr and aborts.
//!    The report ends with advice: the [overflow hint](set_overflow_hint) a
//!    layer that sizes the stacks registered (ct-worker names `CT_STACK_SIZE`
//!    and `Builder::stack_size`), or `use a larger stack size`.
//! 3. **Anything else** goes to the handler that was installed before ours
//!    (Rust's own, which reports overflows of OS-thread stacks), or to the default
//!    action, so a genuine segfault still crashes as usual.
//!
//! The registry of guard pages is a fixed table of [`GUARD_CAPACITY`] atomic
//! words that the handler scans without locks. A stack created while the table
//! is full still works, but its overflow is reported as a plain segfault
//! ([`crate::MmapStack::overflow_detected`] tells).
//!
//! The handler runs on the thread's alternate signal stack. Rust's runtime gives
//! the main thread and every `std::thread` one; threads created by other means
//! call [`ensure_alt_stack`] before running contexts on guarded stacks.
//!
//! # Resolving a fault on the faulting stack
//!
//! A hook runs on the per-OS-thread alternate stack, so it may only do
//! async-signal-safe work there. A hook that needs ordinary code to resolve a
//! fault — locks, communication, suspending the faulting user-level thread,
//! which may then resume on another OS thread — calls
//! [`run_on_interrupted_stack`] (x86-64 Linux): it relocates the kernel's
//! signal frame onto the faulting thread's own stack, runs a closure there and
//! resumes the faulting code exactly through `rt_sigreturn`, so the faulting
//! instruction runs again. [`fault_is_write`] tells a write fault from a read.
//!
//! ```no_run
//! # #[cfg(all(target_arch = "x86_64", target_os = "linux"))] {
//! use ct_context::trap;
//! use core::sync::atomic::{AtomicUsize, Ordering};
//!
//! /// A page that is made accessible on first touch.
//! static LAZY_PAGE: AtomicUsize = AtomicUsize::new(0);
//!
//! unsafe fn hook(_sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) -> bool {
//!     // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
//!     let addr = unsafe { (*info).si_addr() } as usize;
//!     let page = LAZY_PAGE.load(Ordering::Acquire);
//!     if page == 0 || !(page..page + 4096).contains(&addr) {
//!         return false;
//!     }
//!     let resolve = move || {
//!         // Ordinary code: runs on the faulting stack, may block.
//!         // SAFETY: the page is ours.
//!         unsafe { libc::mprotect(page as *mut libc::c_void, 4096, libc::PROT_READ | libc::PROT_WRITE) };
//!     };
//!     // Returns only if the fault happened on the alternate stack itself (in
//!     // a signal handler): then leave it to the next classifier.
//!     // SAFETY: `uctx` is this handler's; the faulting stack has room;
//!     // nothing here needs dropping.
//!     let trap::InterruptedOnAltStack = unsafe { trap::run_on_interrupted_stack(uctx, resolve) };
//!     false
//! }
//! // SAFETY: the hook only claims faults it made valid.
//! unsafe { trap::add_fault_hook(hook) }.unwrap();
//! # }
//! ```

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char};
use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Once;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub use crate::arch::x86_64_sigframe::{
    InterruptedOnAltStack, fault_is_write, run_on_interrupted_stack, run_on_interrupted_stack_with,
};
use crate::stack::page_size;

/// Number of guard areas that can be registered at once.
pub const GUARD_CAPACITY: usize = 1 << 16;

/// Largest number of guard pages one registered guard area may have.
pub const MAX_GUARD_PAGES: usize = 255;

/// Number of fault hooks that can be registered.
pub const MAX_FAULT_HOOKS: usize = 4;

/// Size of the alternate signal stacks made by [`ensure_alt_stack`].
pub const ALT_STACK_SIZE: usize = 64 * 1024;

static GUARDS: [AtomicUsize; GUARD_CAPACITY] = [const { AtomicUsize::new(0) }; GUARD_CAPACITY];
/// One past the highest slot index ever used; bounds the handler's scan.
static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);
/// Where the next registration starts looking for a free slot.
static NEXT_FREE: AtomicUsize = AtomicUsize::new(0);

static HOOKS: [AtomicUsize; MAX_FAULT_HOOKS] = [const { AtomicUsize::new(0) }; MAX_FAULT_HOOKS];

static INSTALL: Once = Once::new();

/// The advice an overflow report ends with (a `&'static CStr`); null: the
/// generic one.
static OVERFLOW_HINT: AtomicPtr<c_char> = AtomicPtr::new(core::ptr::null_mut());

/// Sets the advice that stack-overflow reports end with, in place of `use a
/// larger stack size`: a layer that creates guarded stacks names the setting
/// that sizes them. ct-worker's default stack source sets one naming
/// `CT_STACK_SIZE` and `Builder::stack_size`. Process-wide; the last call
/// wins.
///
/// ```
/// ct_context::trap::set_overflow_hint(c"raise MY_STACK_SIZE (default 64k)");
/// assert_eq!(
///     ct_context::trap::overflow_hint(),
///     Some(c"raise MY_STACK_SIZE (default 64k)")
/// );
/// ```
pub fn set_overflow_hint(hint: &'static CStr) {
    OVERFLOW_HINT.store(hint.as_ptr().cast_mut(), Ordering::Release);
}

/// The advice set with [`set_overflow_hint`], if any.
pub fn overflow_hint() -> Option<&'static CStr> {
    let p = OVERFLOW_HINT.load(Ordering::Acquire);
    // SAFETY: only pointers of `&'static CStr`s are stored.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) })
}

struct PrevAction(UnsafeCell<core::mem::MaybeUninit<libc::sigaction>>);
// SAFETY: written once inside `INSTALL.call_once`, before our handler can run;
// read-only afterwards.
unsafe impl Sync for PrevAction {}
static PREV: PrevAction = PrevAction(UnsafeCell::new(core::mem::MaybeUninit::zeroed()));

/// A registered guard area; give it back with [`unregister_guard`].
#[derive(Debug)]
pub struct GuardSlot(usize);

/// A fault hook: called from the `SIGSEGV` handler with the handler's own
/// arguments. Return `true` if the fault was resolved (the faulting instruction
/// is then retried), `false` to let the next classifier look at it.
///
/// A hook runs in a signal handler on the alternate signal stack: it must only
/// do async-signal-safe work, or switch to another stack first (see
/// [`run_on_interrupted_stack`]).
pub type FaultHook =
    unsafe fn(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) -> bool;

/// The hook table is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("at most {MAX_FAULT_HOOKS} fault hooks can be registered")]
pub struct HookTableFull;

/// Installs the `SIGSEGV` handler if it is not installed yet. Called by every
/// [`crate::MmapStack`] constructor; idempotent and cheap after the first call.
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: we build a valid `sigaction` and store the previous one in
        // `PREV` before any fault can reach our handler (the store happens inside
        // `sigaction` itself, which writes `PREV` before returning, and our handler
        // only reads `PREV` when chaining).
        unsafe {
            let mut act: libc::sigaction = core::mem::zeroed();
            act.sa_sigaction = handler as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut act.sa_mask);
            let prev = (*PREV.0.get()).as_mut_ptr();
            if libc::sigaction(libc::SIGSEGV, &act, prev) != 0 {
                // Without a handler overflows are still fatal, just less clearly
                // reported; there is nothing better to do than say so.
                eprintln!(
                    "ct-context: warning: cannot install SIGSEGV handler: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
}

/// Registers `start .. start + len` as a guard area: a fault inside it is
/// reported as a stack overflow. `start` must be page-aligned and `len` a
/// positive multiple of the page size of at most [`MAX_GUARD_PAGES`] pages.
///
/// Returns `None` if the table is full or the arguments are invalid.
pub fn register_guard(start: usize, len: usize) -> Option<GuardSlot> {
    let page = page_size();
    let pages = len / page;
    if start == 0
        || !start.is_multiple_of(page)
        || !len.is_multiple_of(page)
        || pages == 0
        || pages > MAX_GUARD_PAGES
    {
        return None;
    }
    install();
    let word = start | pages;
    let first = NEXT_FREE.load(Ordering::Relaxed);
    for i in 0..GUARD_CAPACITY {
        let idx = (first + i) % GUARD_CAPACITY;
        if GUARDS[idx]
            .compare_exchange(0, word, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            NEXT_FREE.store((idx + 1) % GUARD_CAPACITY, Ordering::Relaxed);
            HIGH_WATER.fetch_max(idx + 1, Ordering::Release);
            return Some(GuardSlot(idx));
        }
    }
    None
}

/// Removes a guard area registered with [`register_guard`].
pub fn unregister_guard(slot: GuardSlot) {
    GUARDS[slot.0].store(0, Ordering::Release);
    NEXT_FREE.store(slot.0, Ordering::Relaxed);
}

/// Returns the registered guard area `(start, len)` that contains `addr`.
/// Async-signal-safe.
pub fn find_guard(addr: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let end = HIGH_WATER.load(Ordering::Acquire);
    for slot in &GUARDS[..end] {
        let word = slot.load(Ordering::Acquire);
        if word == 0 {
            continue;
        }
        let start = word & !(page - 1);
        let len = (word & (page - 1)) * page;
        if (start..start + len).contains(&addr) {
            return Some((start, len));
        }
    }
    None
}

/// Registers a fault hook that sees every `SIGSEGV` before the stack-overflow
/// check. Installs the handler if needed.
///
/// # Safety
///
/// `hook` must follow the rules of [`FaultHook`]: return `true` only if it made
/// the faulting access valid, and be safe to run in a signal handler.
pub unsafe fn add_fault_hook(hook: FaultHook) -> Result<(), HookTableFull> {
    install();
    let word = hook as *const () as usize;
    for slot in &HOOKS {
        if slot
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Ok(());
        }
    }
    Err(HookTableFull)
}

/// Removes a hook added with [`add_fault_hook`]. Returns whether it was present.
pub fn remove_fault_hook(hook: FaultHook) -> bool {
    let word = hook as *const () as usize;
    HOOKS.iter().any(|slot| {
        slot.compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// Makes sure the calling OS thread has an alternate signal stack, so that the
/// overflow report can run when the thread's current stack is exhausted.
///
/// Threads started by `std::thread` and the main thread already have one; this
/// creates (and frees at thread exit) a [`ALT_STACK_SIZE`] stack for other
/// threads. Returns `false` if none could be set up.
pub fn ensure_alt_stack() -> bool {
    thread_local! {
        static OWNED: AltStack = AltStack::new();
        static CHECKED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
    }
    if CHECKED.with(|c| c.get()) {
        return true;
    }
    let ok = alt_stack_present() || OWNED.with(|a| a.installed);
    CHECKED.with(|c| c.set(ok));
    ok
}

fn alt_stack_present() -> bool {
    // SAFETY: querying the current alternate stack has no preconditions.
    let mut cur: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: `cur` is a valid out-pointer.
    (unsafe { libc::sigaltstack(core::ptr::null(), &mut cur) } == 0)
        && cur.ss_flags & libc::SS_DISABLE == 0
}

struct AltStack {
    base: usize,
    len: usize,
    installed: bool,
}

impl AltStack {
    fn new() -> Self {
        let page = page_size();
        let len = ALT_STACK_SIZE + page;
        // SAFETY: fresh anonymous mapping.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Self {
                base: 0,
                len: 0,
                installed: false,
            };
        }
        // SAFETY: the lowest page of our own mapping becomes a guard page.
        unsafe { libc::mprotect(base, page, libc::PROT_NONE) };
        let st = libc::stack_t {
            ss_sp: (base as usize + page) as *mut libc::c_void,
            ss_flags: 0,
            ss_size: ALT_STACK_SIZE,
        };
        // SAFETY: `st` describes memory we own until `drop`.
        let installed = unsafe { libc::sigaltstack(&st, core::ptr::null_mut()) } == 0;
        Self {
            base: base as usize,
            len,
            installed,
        }
    }
}

impl Drop for AltStack {
    fn drop(&mut self) {
        if self.base == 0 {
            return;
        }
        if self.installed {
            let st = libc::stack_t {
                ss_sp: core::ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            };
            // SAFETY: disabling the alternate stack before unmapping it.
            unsafe { libc::sigaltstack(&st, core::ptr::null_mut()) };
        }
        // SAFETY: unmapping our own mapping, no longer the signal stack.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

unsafe extern "C" fn handler(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    for slot in &HOOKS {
        let word = slot.load(Ordering::Acquire);
        if word != 0 {
            // SAFETY: only `FaultHook` values are stored in `HOOKS`.
            let hook: FaultHook = unsafe { core::mem::transmute::<usize, FaultHook>(word) };
            // SAFETY: the hook's contract covers being called from this handler.
            if unsafe { hook(sig, info, uctx) } {
                return;
            }
        }
    }
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some((start, len)) = find_guard(addr) {
        report_overflow(addr, start, len);
    }
    // SAFETY: chaining with the kernel's arguments to the handler that was
    // installed before ours.
    unsafe { chain(sig, info, uctx) }
}

unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: `PREV` was fully written before our handler was installed.
    let prev = unsafe { (*PREV.0.get()).assume_init_ref() };
    let action = prev.sa_sigaction;
    if action == libc::SIG_DFL || action == libc::SIG_IGN {
        // Restore the default action and return: the faulting instruction runs
        // again and the kernel ends the process with SIGSEGV as usual.
        // SAFETY: `signal` is async-signal-safe.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler declared the three-argument form.
        let f: unsafe extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { core::mem::transmute(action) };
        // SAFETY: forwarding the kernel's arguments.
        unsafe { f(sig, info, uctx) }
    } else {
        // SAFETY: the previous handler declared the one-argument form.
        let f: unsafe extern "C" fn(libc::c_int) = unsafe { core::mem::transmute(action) };
        // SAFETY: forwarding the signal number.
        unsafe { f(sig) }
    }
}

fn report_overflow(addr: usize, start: usize, len: usize) -> ! {
    let mut buf = [0u8; 512];
    let mut w = BufWriter::new(&mut buf);
    w.put(b"\nfatal: stack overflow in user-level thread (fault at ");
    w.hex(addr);
    w.put(b", guard page ");
    w.hex(start);
    w.put(b"..");
    w.hex(start + len);
    w.put(b"); ");
    // `CStr::to_bytes` only scans for the terminator: async-signal-safe.
    match overflow_hint() {
        Some(hint) => w.put(hint.to_bytes()),
        None => w.put(b"use a larger stack size"),
    }
    w.put(b"\n");
    w.write_to_stderr();
    // SAFETY: `abort` is async-signal-safe.
    unsafe { libc::abort() }
}

/// A message built without allocating, for signal handlers (here and in the
/// DSM's fault hook): bytes and hex numbers into a fixed buffer, then one
/// `write(2)` to stderr. Output beyond the buffer is cut.
pub struct BufWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> BufWriter<'a> {
    /// A writer filling `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        BufWriter { buf, len: 0 }
    }

    /// Writes the message so far to stderr (async-signal-safe).
    pub fn write_to_stderr(&self) {
        // SAFETY: `write` is async-signal-safe; `buf[..len]` is initialised.
        unsafe { libc::write(2, self.buf.as_ptr() as *const libc::c_void, self.len) };
    }

    /// Appends `s`.
    pub fn put(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }

    /// Appends `v` as `0x` and 16 hex digits.
    pub fn hex(&mut self, v: usize) {
        let mut digits = [0u8; 18];
        digits[0] = b'0';
        digits[1] = b'x';
        for (i, d) in digits[2..].iter_mut().enumerate() {
            let nibble = (v >> ((15 - i) * 4)) & 0xf;
            *d = b"0123456789abcdef"[nibble];
        }
        self.put(&digits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_finds_and_forgets_guards() {
        let page = page_size();
        let start = 0x7000_0000_0000usize;
        let slot = register_guard(start, 2 * page).expect("registry has room");
        assert_eq!(find_guard(start), Some((start, 2 * page)));
        assert_eq!(find_guard(start + 2 * page - 1), Some((start, 2 * page)));
        assert_eq!(find_guard(start + 2 * page), None);
        assert_eq!(find_guard(start - 1), None);
        unregister_guard(slot);
        assert_eq!(find_guard(start), None);
    }

    #[test]
    fn registry_rejects_bad_arguments() {
        let page = page_size();
        assert!(register_guard(0, page).is_none());
        assert!(register_guard(page + 1, page).is_none());
        assert!(register_guard(page, 0).is_none());
        assert!(register_guard(page, (MAX_GUARD_PAGES + 1) * page).is_none());
    }

    #[test]
    fn hex_formatting() {
        let mut buf = [0u8; 32];
        let mut w = BufWriter::new(&mut buf);
        w.hex(0xdead_beef);
        assert_eq!(&buf[..18], b"0x00000000deadbeef");
    }

    #[test]
    fn alt_stack_is_created_when_missing() {
        std::thread::spawn(|| {
            let off = libc::stack_t {
                ss_sp: core::ptr::null_mut(),
                ss_flags: libc::SS_DISABLE,
                ss_size: 0,
            };
            // SAFETY: disabling this thread's alternate stack (std unmaps its own
            // at thread exit regardless).
            assert_eq!(unsafe { libc::sigaltstack(&off, core::ptr::null_mut()) }, 0);
            assert!(!alt_stack_present());
            assert!(ensure_alt_stack());
            // SAFETY: `stack_t` is plain data; all-zero is a valid value.
            let mut cur: libc::stack_t = unsafe { core::mem::zeroed() };
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { libc::sigaltstack(core::ptr::null(), &mut cur) }, 0);
            assert_eq!(cur.ss_flags & libc::SS_DISABLE, 0);
            assert_eq!(cur.ss_size, ALT_STACK_SIZE);
        })
        .join()
        .unwrap();
    }
}
