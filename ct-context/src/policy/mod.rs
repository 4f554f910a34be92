//! Context policies: the five ontop primitives, implemented per architecture.
//!
//! | policy | where | what it saves |
//! |---|---|---|
//! | [`X86_64`] | x86-64 | callee-saved registers (`rbx`, `rbp`, `r12`–`r15`) and the stack pointer |
//! | [`X86_64Fpu`] | x86-64 | the same plus the floating-point control settings: MXCSR's control bits and the x87 control word (loaded on a switch only where they differ) |
//! | [`Portable`] | every architecture `corosensei` supports | whatever `corosensei` saves |
//!
//! [`DefaultPolicy`] is [`X86_64`] on x86-64 and [`Portable`] elsewhere.
//! Rust code never changes the floating-point control words, so the default
//! does not pay for saving them; code that changes rounding modes or exception
//! masks per thread picks [`X86_64Fpu`]. What the extra work costs depends on
//! the processor (see the `ctx_switch` benchmark, whose lines name it): on
//! an AMD EPYC of family 0x19 (Zen 3), reading MXCSR alone makes a round trip
//! about four times a plain one; on Intel, where loading the words is what
//! is expensive, the policy compares before loading ([`FpuLoads`]), which
//! leaves a plain switch plus two stores and a comparison where the words
//! do not change — still 1.7–1.9 times a plain round trip on an Intel Xeon
//! of family 6, model 207, most of it the store of MXCSR.

mod portable;

pub use portable::Portable;

#[cfg(target_arch = "x86_64")]
pub use crate::arch::x86_64::{FpuLoads, X86_64, X86_64Fpu};

use crate::context::{CondOntopFn, Context, EntryFn, OntopFn, RestoreFn};
use crate::stack::StackRegion;

/// The default policy of this target.
#[cfg(target_arch = "x86_64")]
pub type DefaultPolicy = X86_64;
/// The default policy of this target.
#[cfg(not(target_arch = "x86_64"))]
pub type DefaultPolicy = Portable;

/// A context-switching implementation: the five ontop primitives of
/// ComposableThreads.
///
/// Every primitive that switches runs a function *ontop*: after the current
/// context has been saved (or abandoned) and before the destination continues.
/// The function gets the just-saved context, so it can publish it (push it on a
/// deque, store it in a lock's queue) without any race: nothing runs on that
/// context's stack any more. Its return value is delivered to the destination
/// as the return value of the destination's own pending switch call (or as the
/// `data` argument of a fresh context's entry function).
///
/// Native policies run the function on the destination's stack, below its saved
/// frame; the [`Portable`] policy runs it on the current OS thread's native stack.
/// Either way it runs after the save and before the resume.
///
/// # Safety
///
/// Implementations must follow the semantics documented on each method.
/// Callers of the (unsafe) methods must:
///
/// - resume every [`Context`] at most once, and only with the policy that made it;
/// - keep the stack memory of a suspended context valid until it is resumed or
///   abandoned for good;
/// - never let an ontop function panic across its boundary (it is `extern "C"`:
///   an unwinding panic aborts the process) or switch contexts from inside it.
pub unsafe trait ContextPolicy: Sized + 'static {
    /// Name used in benchmarks and `Debug` output.
    const NAME: &'static str;

    /// The smallest stack region (in bytes) `make_context`/`save_context` accept.
    const MIN_STACK_SIZE: usize;

    /// Builds a context on `stack` that, when first resumed with value `v`, calls
    /// `entry(arg, v)` on that stack. Does not switch.
    ///
    /// # Safety
    ///
    /// `stack` must be unused, writable memory of at least
    /// [`ContextPolicy::MIN_STACK_SIZE`] bytes that outlives the context.
    unsafe fn make_context(stack: StackRegion, entry: EntryFn, arg: usize) -> Context<Self>;

    /// Saves the current context, switches to the fresh `stack` and calls
    /// `f(saved, data)` there. If `f` returns `v`, the saved context resumes and
    /// `save_context` returns `v` — so this doubles as "call on another stack".
    /// Used for work-first thread creation, where `f` publishes the saved parent
    /// and runs the child.
    ///
    /// # Safety
    ///
    /// `stack` as in [`ContextPolicy::make_context`]. `f` may return only if the
    /// saved context it received has not been and will not be resumed by anyone
    /// else.
    unsafe fn save_context(stack: StackRegion, f: OntopFn<Self>, data: usize) -> usize;

    /// Saves the current context and switches to `next`, running `f(saved, data)`
    /// ontop; `next` continues with `f`'s result. With `f = None` the switch is a
    /// plain one and `next` receives `data`.
    ///
    /// Returns the value delivered by whichever switch later resumes the saved
    /// context.
    ///
    /// # Safety
    ///
    /// `next` must be a suspended context of this policy, resumed by nobody else.
    unsafe fn swap_context(next: Context<Self>, f: Option<OntopFn<Self>>, data: usize) -> usize;

    /// Saves the current context and runs `f(saved, data)` ontop, like
    /// [`ContextPolicy::swap_context`]; then, if `f` says
    /// [`CondResult::proceed`](crate::CondResult), `next` continues with the value;
    /// otherwise the saved context continues at once and this call returns the
    /// value (`next` stays suspended: keep its [`Context::as_raw`] to resume it
    /// later).
    ///
    /// # Safety
    ///
    /// As for [`ContextPolicy::swap_context`]. When `f` cancels it must not have
    /// published `saved`.
    unsafe fn cond_swap_context(next: Context<Self>, f: CondOntopFn<Self>, data: usize) -> usize;

    /// Abandons the current context without saving it, switches to `next`, runs
    /// `f(data)` ontop (for example to free the abandoned stack) and continues
    /// `next` with its result (or with `data` if `f` is `None`).
    ///
    /// # Safety
    ///
    /// As for [`ContextPolicy::swap_context`]. Nothing on the abandoned stack is
    /// dropped; everything on it must be dead.
    unsafe fn restore_context(next: Context<Self>, f: Option<RestoreFn>, data: usize) -> !;

    /// Saves the current context, stores it in `*slot`, and switches to
    /// `next`, which continues with `data`: the switch whose ontop function
    /// would only publish the saved context in a known place (a coroutine's
    /// caller link, a scheduler's continuation slot). Native policies store
    /// it as part of the switch, without calling a function, so it costs
    /// about what a plain switch costs; the default runs an ontop function.
    ///
    /// Returns the value delivered by whichever switch later resumes the saved
    /// context.
    ///
    /// # Safety
    ///
    /// As for [`ContextPolicy::swap_context`]. `slot` must be valid for a
    /// write; it is written with a plain store (any old value is overwritten,
    /// not dropped), so it may only be read by code ordered after this switch
    /// — the destination, or threads it synchronizes with.
    unsafe fn swap_context_into(
        next: Context<Self>,
        slot: *mut Option<Context<Self>>,
        data: usize,
    ) -> usize {
        struct Args<P: ContextPolicy> {
            slot: *mut Option<Context<P>>,
            data: usize,
        }
        unsafe extern "C" fn store<P: ContextPolicy>(prev: Context<P>, args: usize) -> usize {
            // SAFETY: `args` points to the `Args` on the suspended caller's
            // stack, read before `prev` is published (after that, whoever
            // reads the slot may resume it and reuse that stack).
            unsafe {
                let a = &*(args as *const Args<P>);
                let data = a.data;
                a.slot.write(Some(prev));
                data
            }
        }
        let args = Args::<Self> { slot, data };
        // SAFETY: forwarded contract; `args` outlives the ontop function,
        // which runs while this context is suspended.
        unsafe {
            Self::swap_context(
                next,
                Some(store::<Self>),
                &args as *const Args<Self> as usize,
            )
        }
    }
}
