//! Saved contexts, the function types the ontop primitives call, and
//! closure-taking wrappers around them.
//!
//! A [`Context`] is a token for a suspended execution context: the stack it runs
//! on and the registers it needs to continue. It is produced by the primitives of
//! a [`ContextPolicy`] and consumed by resuming it. Every primitive is *ontop*: it
//! runs a caller-supplied function after the current context has been saved (or
//! abandoned) and before the destination continues, and hands that function the
//! context that was just saved. Publishing a continuation from inside such a
//! function is race-free: nothing runs on its stack any more.

use core::convert::Infallible;
use core::fmt;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::ptr::{self, NonNull};

use crate::policy::ContextPolicy;
use crate::stack::StackRegion;

/// A suspended execution context of policy `P`.
///
/// A `Context` is move-only: resuming it consumes it, and a context must be
/// resumed at most once. It is `Send` because user-level threads may resume on a
/// different OS thread than the one that suspended them; whether the code that
/// runs in the context tolerates that is the caller's responsibility (see the
/// crate documentation on thread-locals).
#[repr(transparent)]
pub struct Context<P: ContextPolicy> {
    ptr: NonNull<u8>,
    _policy: PhantomData<fn() -> P>,
}

// SAFETY: a context is an opaque token for a suspended stack; moving the token
// between threads moves no data. Resuming it is `unsafe` and its contract makes
// the caller responsible for the code on that stack.
unsafe impl<P: ContextPolicy> Send for Context<P> {}
// SAFETY: `&Context` only allows reading the pointer value.
unsafe impl<P: ContextPolicy> Sync for Context<P> {}

impl<P: ContextPolicy> Context<P> {
    /// Returns the raw pointer that represents this context without consuming it.
    ///
    /// Used to keep a handle on the destination of
    /// [`ContextPolicy::cond_swap_context`], which stays suspended when the ontop
    /// function cancels the switch.
    #[inline]
    pub fn as_raw(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Converts the context into its raw pointer.
    #[inline]
    pub fn into_raw(self) -> NonNull<u8> {
        self.ptr
    }

    /// Rebuilds a context from [`Context::as_raw`] or [`Context::into_raw`].
    ///
    /// # Safety
    ///
    /// `ptr` must have come from a context of the same policy `P` that is still
    /// suspended, and no other `Context` for it may be resumed.
    #[inline]
    pub unsafe fn from_raw(ptr: NonNull<u8>) -> Self {
        Self {
            ptr,
            _policy: PhantomData,
        }
    }
}

impl<P: ContextPolicy> fmt::Debug for Context<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context<{}>({:p})", P::NAME, self.ptr)
    }
}

/// The result of the function run by [`ContextPolicy::cond_swap_context`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CondResult {
    /// The value delivered to whichever context continues.
    pub value: usize,
    /// `true`: continue into the destination. `false`: cancel, and resume the
    /// context that called `cond_swap_context` (which then returns `value`).
    pub proceed: bool,
}

impl CondResult {
    /// Continue into the destination with `value`.
    #[inline]
    pub fn proceed(value: usize) -> Self {
        Self {
            value,
            proceed: true,
        }
    }

    /// Cancel the switch: the caller of `cond_swap_context` continues with `value`.
    #[inline]
    pub fn cancel(value: usize) -> Self {
        Self {
            value,
            proceed: false,
        }
    }
}

/// A function run ontop of a switch: it receives the context that was just saved
/// and the caller's `data`; its result is delivered to the destination.
///
/// It must not panic across its boundary (an `extern "C"` function aborts the
/// process if it unwinds) and must not switch contexts itself.
pub type OntopFn<P> = unsafe extern "C" fn(prev: Context<P>, data: usize) -> usize;

/// The function run by [`ContextPolicy::cond_swap_context`]: like [`OntopFn`], but
/// it decides whether the switch proceeds. When it cancels, `prev` is resumed by
/// the primitive itself, so the function must not have published it.
pub type CondOntopFn<P> = unsafe extern "C" fn(prev: Context<P>, data: usize) -> CondResult;

/// The function run by [`ContextPolicy::restore_context`] on the destination
/// stack. There is no previous context: it was abandoned.
pub type RestoreFn = unsafe extern "C" fn(data: usize) -> usize;

/// The entry function of a context created by [`ContextPolicy::make_context`]:
/// it receives the `arg` given to `make_context` and the value delivered by the
/// switch that first resumed it. It must never return; a thread ends by
/// switching away with [`ContextPolicy::restore_context`].
pub type EntryFn = unsafe extern "C" fn(arg: usize, data: usize) -> !;

// ---------------------------------------------------------------------------
// Closure wrappers.
//
// Each wrapper passes a pointer to the closure (living on the caller's stack) as
// `data`. The trampoline moves the closure onto the destination stack *before*
// calling it: once the closure publishes `prev`, another OS thread may resume it
// and overwrite the caller's frame.
// ---------------------------------------------------------------------------

unsafe extern "C" fn ontop_trampoline<P, F>(prev: Context<P>, data: usize) -> usize
where
    P: ContextPolicy,
    F: FnOnce(Context<P>) -> usize,
{
    // SAFETY: `data` points to a `ManuallyDrop<F>` on the suspended caller's
    // stack, which stays untouched until `prev` is resumed; we read it exactly once.
    let f = unsafe { ptr::read(data as *const F) };
    f(prev)
}

unsafe extern "C" fn cond_trampoline<P, F>(prev: Context<P>, data: usize) -> CondResult
where
    P: ContextPolicy,
    F: FnOnce(Context<P>) -> CondResult,
{
    // SAFETY: as in `ontop_trampoline`.
    let f = unsafe { ptr::read(data as *const F) };
    f(prev)
}

unsafe extern "C" fn restore_trampoline<F>(data: usize) -> usize
where
    F: FnOnce() -> usize,
{
    // SAFETY: `data` points to a `ManuallyDrop<F>` on the abandoned stack. The
    // abandoned stack is only freed by this very closure, after it was moved out.
    let f = unsafe { ptr::read(data as *const F) };
    f()
}

unsafe extern "C" fn entry_trampoline<F>(arg: usize, data: usize) -> !
where
    F: FnOnce(usize) -> Infallible,
{
    // SAFETY: `arg` points to the closure that `make_context_with` wrote at the
    // top of this context's own stack; it is read exactly once, at first resume.
    let f = unsafe { ptr::read(arg as *const F) };
    match f(data) {}
}

/// [`ContextPolicy::swap_context`] with a closure as the ontop function.
///
/// # Safety
///
/// As for [`ContextPolicy::swap_context`]. `f` must not panic (a panic aborts the
/// process) and must not switch contexts.
#[inline]
pub unsafe fn swap_with<P, F>(next: Context<P>, f: F) -> usize
where
    P: ContextPolicy,
    F: FnOnce(Context<P>) -> usize,
{
    let f = ManuallyDrop::new(f);
    // SAFETY: forwarded contract; the trampoline takes `f` by value exactly once.
    unsafe {
        P::swap_context(
            next,
            Some(ontop_trampoline::<P, F>),
            &f as *const ManuallyDrop<F> as usize,
        )
    }
}

/// [`ContextPolicy::save_context`] with a closure as the ontop function.
///
/// # Safety
///
/// As for [`ContextPolicy::save_context`]. `f` must not panic.
#[inline]
pub unsafe fn save_with<P, F>(stack: StackRegion, f: F) -> usize
where
    P: ContextPolicy,
    F: FnOnce(Context<P>) -> usize,
{
    let f = ManuallyDrop::new(f);
    // SAFETY: forwarded contract; the trampoline takes `f` by value exactly once.
    unsafe {
        P::save_context(
            stack,
            ontop_trampoline::<P, F>,
            &f as *const ManuallyDrop<F> as usize,
        )
    }
}

/// [`ContextPolicy::cond_swap_context`] with a closure as the ontop function.
///
/// # Safety
///
/// As for [`ContextPolicy::cond_swap_context`]. `f` must not panic.
#[inline]
pub unsafe fn cond_swap_with<P, F>(next: Context<P>, f: F) -> usize
where
    P: ContextPolicy,
    F: FnOnce(Context<P>) -> CondResult,
{
    let f = ManuallyDrop::new(f);
    // SAFETY: forwarded contract; the trampoline takes `f` by value exactly once.
    unsafe {
        P::cond_swap_context(
            next,
            cond_trampoline::<P, F>,
            &f as *const ManuallyDrop<F> as usize,
        )
    }
}

/// [`ContextPolicy::restore_context`] with a closure as the ontop function.
///
/// Everything still alive on the current stack is abandoned without running
/// destructors; drop what you own before calling this.
///
/// # Safety
///
/// As for [`ContextPolicy::restore_context`]. `f` must not panic.
#[inline]
pub unsafe fn restore_with<P, F>(next: Context<P>, f: F) -> !
where
    P: ContextPolicy,
    F: FnOnce() -> usize,
{
    let f = ManuallyDrop::new(f);
    // SAFETY: forwarded contract; the trampoline takes `f` by value exactly once.
    unsafe {
        P::restore_context(
            next,
            Some(restore_trampoline::<F>),
            &f as *const ManuallyDrop<F> as usize,
        )
    }
}

/// [`ContextPolicy::make_context`] with a closure as the entry function.
///
/// The closure never returns; its return type is [`Infallible`] because the
/// never type `!` cannot be named in closure bounds on stable Rust (a closure
/// whose body ends in [`restore_with`] coerces to it). The closure is stored at the top of `stack` (no allocation); the rest of the
/// region becomes the context's stack. The closure receives the value delivered
/// by the first switch into the context and must end the context by switching
/// away with [`restore_with`] or [`ContextPolicy::restore_context`]. A panic that
/// escapes it aborts the process: catch panics inside it.
///
/// Returns `None` if the stack is too small to hold the closure and the
/// policy's minimum stack.
///
/// # Safety
///
/// As for [`ContextPolicy::make_context`].
pub unsafe fn make_context_with<P, F>(stack: StackRegion, f: F) -> Option<Context<P>>
where
    P: ContextPolicy,
    F: FnOnce(usize) -> Infallible,
{
    let (slot, rest) = stack.carve_top(core::mem::size_of::<F>(), core::mem::align_of::<F>())?;
    if rest.len() < P::MIN_STACK_SIZE {
        return None;
    }
    let slot = slot as *mut F;
    // SAFETY: `carve_top` returned a properly aligned, exclusive slot inside the
    // stack region the caller handed over to us.
    unsafe { slot.write(f) };
    // SAFETY: forwarded contract; `rest` lies below the closure slot.
    Some(unsafe { P::make_context(rest, entry_trampoline::<F>, slot as usize) })
}
