//! The portable context policy, built on `corosensei`.
//!
//! `corosensei` offers only asymmetric coroutines (resume / suspend) and no way
//! to run a function ontop of a switch. This policy builds the symmetric,
//! ontop primitives from them with a *driver* per OS thread:
//!
//! - every context made by `make_context`/`save_context` is a corosensei
//!   coroutine whose bookkeeping ([`Frame`]) sits at the top of its own stack;
//! - the native stack of each OS thread is that thread's *root* context; when it
//!   switches away, it runs the driver loop;
//! - a coroutine that switches suspends to the driver with a [`Request`]; the
//!   driver runs the ontop function (after the coroutine is saved, before the
//!   destination resumes) and resumes the destination.
//!
//! Each switch therefore costs two corosensei switches. Coroutine contexts may
//! be resumed on any OS thread. A root context can only be resumed on its own OS
//! thread (its stack is the thread's native stack); resuming it elsewhere aborts
//! with a message.

use core::cell::{Cell, UnsafeCell};
use core::mem::ManuallyDrop;
use core::num::NonZeroUsize;
use core::ptr::{self, NonNull};

use corosensei::stack::{Stack as CoroStack, StackPointer};
use corosensei::{Coroutine, CoroutineResult, Yielder};

use crate::context::{CondOntopFn, Context, EntryFn, OntopFn, RestoreFn};
use crate::policy::ContextPolicy;
use crate::stack::StackRegion;

/// The portable policy: correct on every architecture `corosensei` supports,
/// about half as fast as a native policy. See the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Portable;

/// What a suspending context asks its driver to do.
#[derive(Clone, Copy)]
enum Request {
    Swap {
        next: *mut Frame,
        f: Option<OntopFn<Portable>>,
        data: usize,
    },
    CondSwap {
        next: *mut Frame,
        f: CondOntopFn<Portable>,
        data: usize,
    },
    Restore {
        next: *mut Frame,
        f: Option<RestoreFn>,
        data: usize,
    },
    Save {
        stack: StackRegion,
        f: OntopFn<Portable>,
        data: usize,
    },
}

/// The corosensei stack for a region of ours.
struct RegionStack(StackRegion);

// SAFETY: the region is writable memory owned by the context's creator for the
// context's lifetime (the `ContextPolicy` contract). Guard pages, if any, are the
// creator's business: corosensei does not rely on them on Unix.
unsafe impl CoroStack for RegionStack {
    fn base(&self) -> StackPointer {
        NonZeroUsize::new(self.0.top()).expect("non-null stack")
    }
    fn limit(&self) -> StackPointer {
        NonZeroUsize::new(self.0.bottom()).expect("non-null stack")
    }
}

type Coro = Coroutine<usize, Request, Request, RegionStack>;

/// A context: a coroutine (absent for a root) and the yielder through which the
/// coroutine suspends.
struct Frame {
    coro: Option<ManuallyDrop<Coro>>,
    yielder: Cell<*const Yielder<usize, Request>>,
}

thread_local! {
    /// The native stack of this OS thread, as a context.
    static ROOT: UnsafeCell<Frame> = const {
        UnsafeCell::new(Frame { coro: None, yielder: Cell::new(ptr::null()) })
    };
    /// The context running on this OS thread; null while the root runs.
    static CURRENT: Cell<*mut Frame> = const { Cell::new(ptr::null_mut()) };
}

// Accessors are never inlined: a context may suspend on one OS thread and resume
// on another, and a thread-local address cached across the switch would point
// into the first thread's storage.
#[inline(never)]
fn root_frame() -> *mut Frame {
    ROOT.with(|r| r.get())
}

#[inline(never)]
fn current_frame() -> *mut Frame {
    CURRENT.with(|c| c.get())
}

#[inline(never)]
fn set_current(f: *mut Frame) {
    CURRENT.with(|c| c.set(f));
}

fn frame_ctx(f: *mut Frame) -> Context<Portable> {
    // SAFETY: frames are never null; the context token is just their address.
    unsafe { Context::from_raw(NonNull::new_unchecked(f as *mut u8)) }
}

/// Writes a `Frame` holding a coroutine that runs `body` at the top of `stack`.
///
/// # Safety
///
/// `stack` must be unused writable memory that outlives the coroutine; `body`
/// must only capture plain data (it is never dropped if the coroutine never
/// finishes).
unsafe fn new_coroutine<F>(stack: StackRegion, body: F) -> *mut Frame
where
    F: FnOnce(&Yielder<usize, Request>, usize) -> Request,
{
    let (slot, rest) = stack
        .carve_top(size_of::<Frame>(), align_of::<Frame>())
        .filter(|(_, rest)| rest.len() >= corosensei::stack::MIN_STACK_SIZE + 1024)
        .expect("stack too small for a portable context");
    let frame = slot as *mut Frame;
    // SAFETY: `slot` is aligned exclusive memory inside the caller's region.
    unsafe {
        frame.write(Frame {
            coro: None,
            yielder: Cell::new(ptr::null()),
        });
        // The body records its yielder before doing anything else.
        let coro = Coroutine::with_stack_unchecked(
            RegionStack(rest),
            move |y: &Yielder<usize, Request>, v| {
                (*frame).yielder.set(y as *const _);
                body(y, v)
            },
        );
        (*frame).coro = Some(ManuallyDrop::new(coro));
    }
    frame
}

/// Hands `req` to the driver: by suspending the running coroutine, or, on the
/// root, by running the driver loop here. Returns the value the context that
/// made the request is eventually resumed with.
fn submit(req: Request) -> usize {
    let cur = current_frame();
    if cur.is_null() {
        // SAFETY: we are on the root stack of this thread.
        unsafe { drive(root_frame(), req) }
    } else {
        // SAFETY: `cur` is the running coroutine; its yielder was recorded at
        // start and stays valid while the coroutine lives.
        unsafe { (*(*cur).yielder.get()).suspend(req) }
    }
}

/// The driver loop, running on the root stack of this OS thread. `prev` made
/// `req`; the loop serves requests until one resumes the root.
///
/// # Safety
///
/// Must be called on the root stack, with `prev` the context that is suspending.
unsafe fn drive(root: *mut Frame, mut req: Request) -> usize {
    let mut prev = root;
    loop {
        let (target, value) = match req {
            Request::Swap { next, f, data } => {
                // SAFETY: `prev` is saved; the ontop function may publish it.
                (
                    next,
                    f.map_or(data, |f| unsafe { f(frame_ctx(prev), data) }),
                )
            }
            Request::CondSwap { next, f, data } => {
                // SAFETY: as above.
                let r = unsafe { f(frame_ctx(prev), data) };
                (if r.proceed { next } else { prev }, r.value)
            }
            Request::Restore { next, f, data } => {
                // `prev` is abandoned: nothing of it is read after this point, so
                // `f` may free its stack (and the frame on it).
                // SAFETY: forwarded ontop contract.
                (next, f.map_or(data, |f| unsafe { f(data) }))
            }
            Request::Save { stack, f, data } => {
                let saved = prev as usize;
                // SAFETY: `stack` is fresh memory (contract of `save_context`).
                let fresh = unsafe {
                    new_coroutine(stack, move |_, _| {
                        let v = f(frame_ctx(saved as *mut Frame), data);
                        Request::Swap {
                            next: saved as *mut Frame,
                            f: None,
                            data: v,
                        }
                    })
                };
                (fresh, 0)
            }
        };
        if target == root {
            // CURRENT is only reset here: the ontop functions run by this loop
            // may not switch, so nothing reads it in between.
            set_current(ptr::null_mut());
            return value;
        }
        // SAFETY: `target` is a live frame made by this policy.
        let coro = unsafe { (*target).coro.as_mut() };
        let Some(coro) = coro else {
            foreign_root();
        };
        set_current(target);
        let r = coro.resume(value);
        req = match r {
            CoroutineResult::Yield(r) | CoroutineResult::Return(r) => r,
        };
        prev = target;
    }
}

#[cold]
fn foreign_root() -> ! {
    eprintln!(
        "ct-context: the Portable policy cannot resume the root context of another OS thread"
    );
    std::process::abort();
}

fn frame_of(ctx: Context<Portable>) -> *mut Frame {
    ctx.into_raw().as_ptr() as *mut Frame
}

// SAFETY: requests are served by the driver between the save (corosensei
// suspend) and the resume, which gives the ontop functions the required
// ordering; coroutine state lives in frames on the contexts' own stacks.
unsafe impl ContextPolicy for Portable {
    const NAME: &'static str = "portable";
    const MIN_STACK_SIZE: usize = corosensei::stack::MIN_STACK_SIZE + 2048;

    unsafe fn make_context(stack: StackRegion, entry: EntryFn, arg: usize) -> Context<Self> {
        // SAFETY: forwarded contract.
        let frame = unsafe { new_coroutine(stack, move |_, v| entry(arg, v)) };
        frame_ctx(frame)
    }

    unsafe fn save_context(stack: StackRegion, f: OntopFn<Self>, data: usize) -> usize {
        submit(Request::Save { stack, f, data })
    }

    unsafe fn swap_context(next: Context<Self>, f: Option<OntopFn<Self>>, data: usize) -> usize {
        submit(Request::Swap {
            next: frame_of(next),
            f,
            data,
        })
    }

    unsafe fn cond_swap_context(next: Context<Self>, f: CondOntopFn<Self>, data: usize) -> usize {
        submit(Request::CondSwap {
            next: frame_of(next),
            f,
            data,
        })
    }

    unsafe fn restore_context(next: Context<Self>, f: Option<RestoreFn>, data: usize) -> ! {
        submit(Request::Restore {
            next: frame_of(next),
            f,
            data,
        });
        unreachable!("an abandoned context was resumed");
    }
}
