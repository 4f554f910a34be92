//! Ontop context switching for user-level threads.
//!
//! This is the lowest layer of the ComposableThreads design (Endo, 2020, §5.2.1):
//! five context-switching primitives that always run a caller-supplied function
//! *ontop* — after the current context has been saved and before the
//! destination continues — and hand it the context that was just saved.
//!
//! | primitive | does |
//! |---|---|
//! | [`save_context`](ContextPolicy::save_context) | save current, switch to a fresh stack, run `f(saved)` there |
//! | [`swap_context`](ContextPolicy::swap_context) | save current, switch to `next`, run `f(saved)` ontop, continue `next` |
//! | [`cond_swap_context`](ContextPolicy::cond_swap_context) | like swap, but `f` decides: continue into `next`, or go back |
//! | [`restore_context`](ContextPolicy::restore_context) | abandon current, switch to `next`, run `f`, continue `next` |
//! | [`make_context`](ContextPolicy::make_context) | build a context that runs an entry function when first resumed |
//!
//! A sixth, [`swap_context_into`](ContextPolicy::swap_context_into), is the
//! common special case of an ontop function that only stores the saved
//! context somewhere (a coroutine's caller link): native policies do the store
//! as part of the switch, without calling a function, which makes it about as
//! cheap as a plain switch.
//!
//! Why ontop: a scheduler must make a suspended thread visible to other workers
//! (push it on a deque, link it into a lock's queue) *after* its registers are
//! saved, or a thief could resume it while it is still running. Running that
//! publication ontop of the switch makes it race-free without any lock.
//! Values travel both ways: the ontop function's result is what the
//! destination's pending switch call returns.
//!
//! # Layers
//!
//! - [`ContextPolicy`]: the primitives, per architecture — [`X86_64`] (switches
//!   inlined as assembly at each call site), [`X86_64Fpu`] (also keeps each
//!   context's floating-point control words: rounding, precision, exception
//!   masks) and
//!   [`Portable`] (on `corosensei`, for every architecture it supports).
//! - [`Context`] and the closure wrappers [`swap_with`], [`save_with`],
//!   [`cond_swap_with`], [`restore_with`], [`make_context_with`]: unsafe but
//!   typed building blocks for schedulers (`ct-worker` is built on them).
//! - [`Stack`]: [`MmapStack`] (guard page, overflow reported as
//!   `stack overflow in user-level thread`), [`RawStack`] (caller memory, e.g. a
//!   DSM segment) and [`StackPool`].
//! - [`Coroutine`]: a safe coroutine for users who never want `unsafe`.
//! - [`trap`]: the process's `SIGSEGV` handler — stack-overflow reports, fault
//!   hooks for higher layers, and (x86-64 Linux) resolving a fault by running
//!   code on the faulting thread's own stack before resuming it exactly
//!   (`trap::run_on_interrupted_stack`).
//!
//! # Example: a generator with the safe layer
//!
//! ```
//! use ct_context::Coroutine;
//!
//! let squares = Coroutine::new(|y, ()| {
//!     for i in 1..=4u32 {
//!         y.suspend(i * i);
//!     }
//! });
//! assert_eq!(squares.collect::<Vec<_>>(), [1, 4, 9, 16]);
//! ```
//!
//! # Example: the raw primitives
//!
//! ```
//! use ct_context::{Context, ContextPolicy, DefaultPolicy, MmapStack, Stack};
//! use ct_context::{make_context_with, restore_with, swap_with};
//! use std::cell::Cell;
//! use std::convert::Infallible;
//!
//! type P = DefaultPolicy;
//! let stack = MmapStack::new(64 * 1024).unwrap();
//! // Where the main context is kept while the child runs.
//! let main_ctx: Cell<Option<Context<P>>> = Cell::new(None);
//! let main_ref = &main_ctx as *const Cell<Option<Context<P>>> as usize;
//!
//! // SAFETY: the stack outlives the context; the child ends by switching back.
//! let child = unsafe {
//!     make_context_with::<P, _>(stack.region(), move |first: usize| -> Infallible {
//!         let main_ctx = &*(main_ref as *const Cell<Option<Context<P>>>);
//!         // Hand back twice the value we were started with, for good.
//!         restore_with(main_ctx.take().unwrap(), move || first * 2)
//!     })
//! }
//! .unwrap();
//! // SAFETY: `child` is fresh; the ontop closure stores our context for it.
//! let got = unsafe {
//!     swap_with(child, |me| {
//!         main_ctx.set(Some(me));
//!         21
//!     })
//! };
//! assert_eq!(got, 42);
//! ```
//!
//! # Thread-locals and migration
//!
//! A context may be resumed on another OS thread than the one that suspended
//! it. Code that may migrate must not cache the address of a thread-local across
//! a switch; read thread-locals through `#[inline(never)]` accessors.
//!
//! # Panics and unwinding
//!
//! Ontop and entry functions are `extern "C"`: a panic escaping them aborts the
//! process rather than unwinding through the switch's assembly. Catch panics at
//! the entry of a context and re-raise them where it is joined, as
//! [`Coroutine`] does. Backtraces taken inside a context end at its entry
//! function.

#![warn(missing_docs)]

mod arch;
mod context;
pub mod coroutine;
mod error;
pub mod policy;
pub mod stack;
pub mod trap;

pub use context::{
    CondOntopFn, CondResult, Context, EntryFn, OntopFn, RestoreFn, cond_swap_with,
    make_context_with, restore_with, save_with, swap_with,
};
pub use coroutine::{Coroutine, CoroutineResult, Yielder};
pub use error::{Error, Result};
pub use policy::{ContextPolicy, DefaultPolicy, Portable};
#[cfg(target_arch = "x86_64")]
pub use policy::{FpuLoads, X86_64, X86_64Fpu};
pub use stack::{
    DEFAULT_STACK_SIZE, MmapStack, PooledStack, RawStack, Stack, StackPool, StackRegion,
};
