//! A safe, asymmetric coroutine on top of the ontop primitives.
//!
//! [`Coroutine`] is for users who want generators or cooperative tasks and never
//! want to write `unsafe`. It is generic over the stack ([`Stack`]) and the
//! context policy ([`ContextPolicy`]), with defaults that pool 256 KiB guarded
//! stacks and use the fastest policy of the target.
//!
//! ```
//! use ct_context::{Coroutine, CoroutineResult};
//!
//! // A coroutine that sums what it is given and reports the running total.
//! let mut acc = Coroutine::new(|yielder, mut x: u64| {
//!     let mut total = 0;
//!     while x != 0 {
//!         total += x;
//!         x = yielder.suspend(total);
//!     }
//!     format!("final total {total}")
//! });
//! assert_eq!(acc.resume(5), CoroutineResult::Yield(5));
//! assert_eq!(acc.resume(7), CoroutineResult::Yield(12));
//! assert_eq!(acc.resume(0), CoroutineResult::Return("final total 12".to_string()));
//! assert!(acc.done());
//! ```
//!
//! Coroutines whose input and return are `()` are iterators:
//!
//! ```
//! use ct_context::Coroutine;
//!
//! let fib = Coroutine::new(|y, ()| {
//!     let (mut a, mut b) = (0u64, 1u64);
//!     loop {
//!         y.suspend(a);
//!         (a, b) = (b, a + b);
//!     }
//! });
//! let first: Vec<u64> = fib.take(10).collect();
//! assert_eq!(first, [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]);
//! ```
//!
//! A panic inside the coroutine is caught at its entry (it never unwinds through
//! the context switch) and raised again from [`Coroutine::resume`]. Dropping a
//! suspended coroutine unwinds its stack, so destructors of its locals run.

use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ptr;
use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use crate::context::{Context, make_context_with, restore_with};
use crate::error::{Error, Result};
use crate::policy::{ContextPolicy, DefaultPolicy};
use crate::stack::{PooledStack, Stack, StackPool};
use crate::trap;

/// What [`Coroutine::resume`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoroutineResult<Y, R> {
    /// The coroutine suspended with this value.
    Yield(Y),
    /// The coroutine finished with this value.
    Return(R),
}

impl<Y, R> CoroutineResult<Y, R> {
    /// The yielded value, if any.
    pub fn as_yield(self) -> Option<Y> {
        match self {
            Self::Yield(y) => Some(y),
            Self::Return(_) => None,
        }
    }

    /// The returned value, if any.
    pub fn as_return(self) -> Option<R> {
        match self {
            Self::Return(r) => Some(r),
            Self::Yield(_) => None,
        }
    }
}

/// Message from the resumer into the coroutine.
enum ToCoro<I> {
    Resume(I),
    Cancel,
}

/// How the coroutine finished, handed to the resumer by pointer.
enum Finish<R> {
    Return(R),
    Panic(Box<dyn Any + Send>),
    Cancelled,
}

/// What one resumption produced.
enum Outcome<Y, R> {
    Yield(Y),
    Finish(Finish<R>),
}

/// Panic payload used to unwind a suspended coroutine that is being dropped.
struct ForcedUnwind;

/// The two contexts, at the top of the coroutine's stack (which never moves,
/// unlike the `Coroutine` value): each side's switch stores its own saved
/// context here as part of the switch (`swap_context_into`), and the other
/// side reads it when it switches back.
struct Header<I, Y, P: ContextPolicy> {
    /// The context that resumed the coroutine; the coroutine switches back to it.
    caller: Option<Context<P>>,
    /// The coroutine's own context while it is suspended (or not started).
    me: Option<Context<P>>,
    _marker: PhantomData<fn(I) -> Y>,
}

/// One resumption's exchange, on the resumer's stack: its address is the
/// value the resumer's switch delivers to the coroutine, so nothing about it
/// is written to the header.
struct Transfer<I, Y> {
    /// The resumer's message, read once by the coroutine.
    input: ManuallyDrop<ToCoro<I>>,
    /// The value the coroutine suspends with (when the value it switches
    /// back with is 0).
    yielded: MaybeUninit<Y>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    NotStarted,
    Suspended,
    Done,
    /// A dropped coroutine swallowed the forced unwind and suspended again: its
    /// stack holds live frames forever and is leaked rather than reused.
    Leaked,
}

/// Variance (contravariant in the input, covariant in the outputs) and
/// `!Send`/`!Sync` of [`Coroutine`].
type CoroutineMarker<I, Y, R> = (fn(I) -> (Y, R), *mut ());
/// Variance and `!Send`/`!Sync` of [`Yielder`].
type YielderMarker<I, Y> = (fn(Y) -> I, *mut ());

/// A stackful coroutine: a function that can suspend itself with a value and be
/// resumed with another. See the [module documentation](self).
///
/// `I` is the input of each resumption, `Y` what it yields, `R` what it finally
/// returns. `Coroutine` is not `Send`: code in it may hold references to
/// thread-local data across a suspension.
pub struct Coroutine<I, Y, R, S: Stack = PooledStack, P: ContextPolicy = DefaultPolicy> {
    header: *mut Header<I, Y, P>,
    stack: ManuallyDrop<S>,
    state: State,
    _marker: PhantomData<CoroutineMarker<I, Y, R>>,
}

/// Handle given to a coroutine's function to suspend it.
pub struct Yielder<I, Y, P: ContextPolicy = DefaultPolicy> {
    header: *mut Header<I, Y, P>,
    /// The exchange of the resumption the coroutine runs in.
    transfer: Cell<*mut Transfer<I, Y>>,
    _marker: PhantomData<YielderMarker<I, Y>>,
}

impl<I, Y, R> Coroutine<I, Y, R> {
    /// Creates a coroutine that runs `f` on a stack from the process-wide
    /// [`StackPool::global`] pool (256 KiB, guarded).
    ///
    /// # Panics
    ///
    /// Panics if no stack can be mapped; use [`Coroutine::with_stack`] to handle
    /// that case.
    pub fn new<F>(f: F) -> Self
    where
        F: FnOnce(&Yielder<I, Y>, I) -> R + 'static,
    {
        let stack = StackPool::global()
            .get()
            .unwrap_or_else(|e| panic!("cannot allocate a coroutine stack: {e}"));
        Self::with_stack(stack, f).unwrap_or_else(|e| panic!("cannot create a coroutine: {e}"))
    }
}

impl<I, Y, R, S: Stack, P: ContextPolicy> Coroutine<I, Y, R, S, P> {
    /// Creates a coroutine that runs `f` on `stack`, switching with policy `P`.
    /// Nothing runs until the first [`Coroutine::resume`], whose input becomes
    /// `f`'s second argument.
    ///
    /// # Errors
    ///
    /// [`Error::StackTooSmall`] if the stack cannot hold the coroutine's
    /// bookkeeping, the closure and the policy's minimum stack.
    pub fn with_stack<F>(stack: S, f: F) -> Result<Self>
    where
        F: FnOnce(&Yielder<I, Y, P>, I) -> R + 'static,
    {
        let region = stack.region();
        let too_small = || Error::StackTooSmall {
            requested: region.len(),
            minimum: size_of::<Header<I, Y, P>>() + size_of::<F>() + P::MIN_STACK_SIZE + 64,
        };
        let (slot, rest) = region
            .carve_top(size_of::<Header<I, Y, P>>(), align_of::<Header<I, Y, P>>())
            .ok_or_else(too_small)?;
        let header = slot as *mut Header<I, Y, P>;
        // SAFETY: `slot` is aligned memory at the top of a stack we own.
        unsafe {
            header.write(Header {
                caller: None,
                me: None,
                _marker: PhantomData,
            })
        };
        let entry = move |transfer: usize| -> core::convert::Infallible {
            // SAFETY: this runs on the coroutine's stack, first resumed by
            // `switch_in`, which stored its context in the header and passes
            // its exchange.
            unsafe { coroutine_main::<I, Y, R, P, F>(header, transfer as *mut Transfer<I, Y>, f) }
        };
        // SAFETY: `rest` is the unused part of our stack, below the header.
        let ctx = unsafe { make_context_with::<P, _>(rest, entry) }.ok_or_else(too_small)?;
        // SAFETY: the header was just written; nothing runs on the stack.
        unsafe { (*header).me = Some(ctx) };
        Ok(Self {
            header,
            stack: ManuallyDrop::new(stack),
            state: State::NotStarted,
            _marker: PhantomData,
        })
    }

    /// Whether the coroutine has been resumed at least once.
    pub fn started(&self) -> bool {
        self.state != State::NotStarted
    }

    /// Whether the coroutine has finished (returned or panicked).
    pub fn done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Runs the coroutine until it suspends or returns.
    ///
    /// # Panics
    ///
    /// Panics if the coroutine is already done, and re-raises a panic that
    /// escaped the coroutine's function (the coroutine is then done).
    #[inline]
    pub fn resume(&mut self, input: I) -> CoroutineResult<Y, R> {
        if self.state != State::Suspended {
            self.first_resume();
        }
        match self.switch_in(ToCoro::Resume(input)) {
            Outcome::Yield(y) => CoroutineResult::Yield(y),
            Outcome::Finish(Finish::Return(r)) => CoroutineResult::Return(r),
            Outcome::Finish(Finish::Panic(p)) => panic::resume_unwind(p),
            Outcome::Finish(Finish::Cancelled) => {
                unreachable!("coroutine cancelled without a cancel request")
            }
        }
    }

    /// Gives the stack back if the coroutine has not started or has finished.
    /// A suspended coroutine is first unwound (as when dropped).
    pub fn into_stack(mut self) -> Option<S> {
        self.cancel();
        let leaked = self.state == State::Leaked;
        // SAFETY: `self` is forgotten right after, so the stack is taken once.
        let stack = unsafe { ManuallyDrop::take(&mut self.stack) };
        core::mem::forget(self);
        if leaked {
            core::mem::forget(stack);
            None
        } else {
            Some(stack)
        }
    }

    /// What `resume` checks unless the coroutine is suspended: that it is
    /// not done, and before its first run, the alternate signal stack.
    #[cold]
    #[inline(never)]
    fn first_resume(&self) {
        assert!(
            !self.done(),
            "resumed a coroutine that has already finished"
        );
        if self.state == State::NotStarted {
            // A coroutine never changes OS thread (it is not `Send`), so one
            // check covers its whole life.
            trap::ensure_alt_stack();
        }
    }

    #[inline]
    fn switch_in(&mut self, msg: ToCoro<I>) -> Outcome<Y, R> {
        let header = self.header;
        // SAFETY: the coroutine is suspended (not done: checked by the
        // callers), so its context is in the header, and resumed only here.
        // Reading it leaves a stale copy, overwritten by its next switch.
        let ctx = unsafe { ptr::read(&raw const (*header).me) }
            .expect("a suspended coroutine has a context");
        let mut transfer = Transfer {
            input: ManuallyDrop::new(msg),
            yielded: MaybeUninit::<Y>::uninit(),
        };
        // SAFETY: the switch records our saved context as the coroutine's
        // caller (the coroutine reads it only after it has been resumed) and
        // hands it our exchange, which stays put while we are suspended.
        let out = unsafe {
            P::swap_context_into(ctx, &raw mut (*header).caller, &raw mut transfer as usize)
        };
        if out == 0 {
            self.state = State::Suspended;
            // SAFETY: the coroutine suspended (value 0) after writing it.
            Outcome::Yield(unsafe { transfer.yielded.assume_init_read() })
        } else {
            self.state = State::Done;
            // SAFETY: a finished coroutine passes a pointer to a `Finish` on its
            // abandoned but intact stack, to be read exactly once.
            Outcome::Finish(unsafe { ptr::read(out as *const Finish<R>) })
        }
    }

    /// Unwinds a suspended coroutine, or drops the function of one that never ran.
    fn cancel(&mut self) {
        if matches!(self.state, State::Done | State::Leaked) {
            return;
        }
        self.first_resume();
        match self.switch_in(ToCoro::Cancel) {
            Outcome::Yield(y) => {
                drop(y);
                self.state = State::Leaked;
            }
            // A destructor panicked during the forced unwind, or the function
            // caught the unwind and returned: either way the stack is free.
            Outcome::Finish(_) => self.state = State::Done,
        }
    }
}

impl<I, Y, R, S: Stack, P: ContextPolicy> Drop for Coroutine<I, Y, R, S, P> {
    fn drop(&mut self) {
        self.cancel();
        if self.state == State::Leaked {
            // Live frames remain on the stack: it must never be reused.
            return;
        }
        // SAFETY: dropped once, here; nothing runs on the stack any more.
        unsafe { ManuallyDrop::drop(&mut self.stack) };
    }
}

impl<Y, S: Stack, P: ContextPolicy> Iterator for Coroutine<(), Y, (), S, P> {
    type Item = Y;

    fn next(&mut self) -> Option<Y> {
        if self.done() {
            return None;
        }
        self.resume(()).as_yield()
    }
}

impl<I, Y, R, S: Stack, P: ContextPolicy> core::fmt::Debug for Coroutine<I, Y, R, S, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Coroutine")
            .field("policy", &P::NAME)
            .field("state", &self.state)
            .finish()
    }
}

impl<I, Y, P: ContextPolicy> Yielder<I, Y, P> {
    /// Suspends the coroutine, handing `value` to the caller of
    /// [`Coroutine::resume`]; returns the input of the next resumption.
    #[inline]
    pub fn suspend(&self, value: Y) -> I {
        let header = self.header;
        // SAFETY: we run inside the coroutine: `transfer` is the exchange of
        // the suspended resumer's `switch_in` frame and `caller` is that
        // resumer (a stale copy stays, overwritten by its next switch). The
        // switch stores our context where the resumer looks for it; the value
        // 0 tells it to take the yielded value. The resumption delivers the
        // next exchange.
        unsafe {
            (*self.transfer.get()).yielded.write(value);
            let caller = ptr::read(&raw const (*header).caller).expect("coroutine has a caller");
            let next = P::swap_context_into(caller, &raw mut (*header).me, 0);
            let next = next as *mut Transfer<I, Y>;
            self.transfer.set(next);
            take_input(next)
        }
    }
}

/// Takes the resumer's message after a switch into the coroutine; a cancel
/// request starts the forced unwind.
///
/// # Safety
///
/// Must run on the coroutine stack right after a resumption, with the
/// exchange that resumption delivered.
#[inline]
unsafe fn take_input<I, Y>(transfer: *mut Transfer<I, Y>) -> I {
    // SAFETY: the resumer's message, read exactly once.
    match unsafe { ManuallyDrop::take(&mut (*transfer).input) } {
        ToCoro::Resume(i) => i,
        ToCoro::Cancel => panic::resume_unwind(Box::new(ForcedUnwind)),
    }
}

/// The body of every coroutine: runs `f` with panics caught, then switches back
/// to the resumer for good.
///
/// # Safety
///
/// Runs on the coroutine stack at first resumption, with `header` filled in
/// and `transfer` the exchange of that resumption.
unsafe fn coroutine_main<I, Y, R, P, F>(
    header: *mut Header<I, Y, P>,
    transfer: *mut Transfer<I, Y>,
    f: F,
) -> !
where
    P: ContextPolicy,
    F: FnOnce(&Yielder<I, Y, P>, I) -> R,
{
    // SAFETY: first resumption; the message is ours to read.
    let first = unsafe { ManuallyDrop::take(&mut (*transfer).input) };
    let out: Finish<R> = match first {
        ToCoro::Cancel => {
            drop(f);
            Finish::Cancelled
        }
        ToCoro::Resume(input) => {
            let yielder = Yielder {
                header,
                transfer: Cell::new(transfer),
                _marker: PhantomData,
            };
            match panic::catch_unwind(AssertUnwindSafe(move || f(&yielder, input))) {
                Ok(r) => Finish::Return(r),
                Err(p) if p.is::<ForcedUnwind>() => Finish::Cancelled,
                Err(p) => Finish::Panic(p),
            }
        }
    };
    let mut out = ManuallyDrop::new(out);
    let out_ptr = &mut *out as *mut Finish<R> as usize;
    // SAFETY: every local with a destructor is gone; `out` is read by the resumer
    // from this abandoned but intact stack before the stack is reused.
    unsafe {
        let caller = (*header).caller.take().expect("coroutine has a caller");
        restore_with(caller, move || out_ptr)
    }
}
