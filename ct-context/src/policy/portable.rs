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
//! - a coroutine that switches writes its [`Request`] in its frame and
//!   suspends to the driver with the request's value; the driver runs the
//!   ontop function (after the coroutine is saved, before the destination
//!   resumes) and resumes the destination.
//!
//! A switch between two coroutines therefore costs two corosensei switches,
//! and one between a coroutine and the root one. What it costs beyond them
//! is kept small by three rules: the switching code of a coroutine is
//! inlined (no returns between its resumption and its next suspension, see
//! [`submit`]); a request is written and read word by word, so the driver's
//! loads are forwarded from the coroutine's stores (see [`RequestWords`]);
//! and the driver's loop keeps the common requests (plain and ontop swaps)
//! in registers and serves the others out of line. Coroutine contexts may
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

/// The portable policy: correct on every architecture `corosensei` supports.
/// A switch between coroutine contexts costs two corosensei switches plus
/// some bookkeeping: on an AMD EPYC of family 0x19 (Zen 3), a round trip
/// between the root and a coroutine took 3.4–4.1 times corosensei's own
/// resume and suspend plain and 3.8–4.4 times ontop (medians of 7,
/// `ctx_switch`, four runs on a busy host; 55–60 ns, 17–20 times, before the
/// switching code was inlined into coroutines). See the module
/// documentation.
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
    SwapInto {
        next: *mut Frame,
        slot: *mut Option<Context<Portable>>,
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

const SWAP: usize = 0;
const SWAP_INTO: usize = 1;
const COND_SWAP: usize = 2;
const RESTORE: usize = 3;
const SAVE: usize = 4;

/// A [`Request`] but its value (`data`): its kind and three words of
/// arguments, which the driver dispatches on directly (kept in registers).
#[derive(Clone, Copy)]
struct Words {
    kind: usize,
    a: usize,
    b: usize,
    c: usize,
}

impl Request {
    /// The request as words, and its value.
    #[inline(always)]
    fn into_words(self) -> (Words, usize) {
        let w = |kind, a, b, c| Words { kind, a, b, c };
        match self {
            Request::Swap { next, f, data } => {
                (w(SWAP, next as usize, f.map_or(0, |f| f as usize), 0), data)
            }
            Request::SwapInto { next, slot, data } => {
                (w(SWAP_INTO, next as usize, slot as usize, 0), data)
            }
            Request::CondSwap { next, f, data } => {
                (w(COND_SWAP, next as usize, f as usize, 0), data)
            }
            Request::Restore { next, f, data } => (
                w(RESTORE, next as usize, f.map_or(0, |f| f as usize), 0),
                data,
            ),
            Request::Save { stack, f, data } => {
                (w(SAVE, stack.bottom(), f as usize, stack.top()), data)
            }
        }
    }
}

/// The [`Words`] of a suspending context's last request, in its [`Frame`]
/// (the request's value travels as the value the coroutine suspends with,
/// in a register).
///
/// Each word is written and read with one volatile access of its own: the
/// driver reads a request right after the coroutine wrote it, and a load
/// that spans two stores (which the compiler's own copies of an enum made:
/// 16-byte loads at 8-byte offsets over 16-byte stores) cannot be forwarded
/// from them and waits until they reach the cache.
struct RequestWords([Cell<usize>; 4]);

impl RequestWords {
    const fn new() -> Self {
        Self([const { Cell::new(0) }; 4])
    }

    /// Records `w`; its last word only for `SAVE`, the one kind that has it
    /// (the kind is a constant where this is inlined).
    #[inline(always)]
    fn write(&self, w: Words) {
        let n = if w.kind == SAVE { 4 } else { 3 };
        for (cell, w) in self.0.iter().zip([w.kind, w.a, w.b, w.c]).take(n) {
            // SAFETY: a `Cell`'s pointer is valid for writes; nothing else
            // accesses the cell meanwhile (the frame's context is running).
            unsafe { ptr::write_volatile(cell.as_ptr(), w) };
        }
    }

    /// The recorded words; the last one is read only for `SAVE`.
    #[inline(always)]
    fn read(&self) -> Words {
        // SAFETY: a `Cell`'s pointer is valid for reads; the frame's context
        // is suspended, so nothing writes the cells meanwhile.
        let r = |i: usize| unsafe { ptr::read_volatile(self.0[i].as_ptr()) };
        let kind = r(0);
        Words {
            kind,
            a: r(1),
            b: r(2),
            c: if kind == SAVE { r(3) } else { 0 },
        }
    }
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

/// A coroutine of this policy: it suspends (or returns) with its request's
/// value, after writing the rest of the request in its frame.
type Coro = Coroutine<usize, usize, usize, RegionStack>;

/// A context: a coroutine (absent for a root), the yielder through which the
/// coroutine suspends, and the request it made when it last switched away.
struct Frame {
    coro: Option<ManuallyDrop<Coro>>,
    yielder: Cell<*const Yielder<usize, usize>>,
    req: RequestWords,
}

thread_local! {
    /// The native stack of this OS thread, as a context.
    static ROOT: UnsafeCell<Frame> = const {
        UnsafeCell::new(Frame {
            coro: None,
            yielder: Cell::new(ptr::null()),
            req: RequestWords::new(),
        })
    };
    /// The context running on this OS thread; null while the root runs.
    static CURRENT: Cell<*mut Frame> = const { Cell::new(ptr::null_mut()) };
}

// Code that may run on a coroutine reads the thread-locals only in functions
// that are never inlined into it (`enter`): a coroutine may suspend on one OS
// thread and resume on another, and a thread-local address the compiler kept
// across the switch would point into the first thread's storage.

/// This thread's root frame. Inlined for the same reason as [`set_current`]:
/// only the root calls it.
#[inline(always)]
fn root_frame() -> *mut Frame {
    ROOT.with(|r| r.get())
}

/// Sets the running context. Inlined: only the driver calls it, on the root
/// stack, which never changes OS thread (the root of another thread cannot
/// be resumed), so a thread-local address the compiler keeps across the
/// driver's switches stays this thread's.
#[inline(always)]
fn set_current(f: *mut Frame) {
    CURRENT.with(|c| c.set(f));
}

#[inline(always)]
fn frame_ctx(f: *mut Frame) -> Context<Portable> {
    // SAFETY: frames are never null; the context token is just their address.
    unsafe { Context::from_raw(NonNull::new_unchecked(f as *mut u8)) }
}

/// Writes a `Frame` holding a coroutine that runs `body` at the top of `stack`.
/// `body` ends by writing the frame's last request (it gets the frame) and
/// returns the request's value.
///
/// # Safety
///
/// `stack` must be unused writable memory that outlives the coroutine; `body`
/// must only capture plain data (it is never dropped if the coroutine never
/// finishes).
unsafe fn new_coroutine<F>(stack: StackRegion, body: F) -> *mut Frame
where
    F: FnOnce(*mut Frame, usize) -> usize,
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
            req: RequestWords::new(),
        });
        // The body records its yielder before doing anything else.
        let coro = Coroutine::with_stack_unchecked(
            RegionStack(rest),
            move |y: &Yielder<usize, usize>, v| {
                (*frame).yielder.set(y as *const _);
                body(frame, v)
            },
        );
        (*frame).coro = Some(ManuallyDrop::new(coro));
    }
    frame
}

/// Hands `req` to the driver: by suspending the running coroutine, or, on the
/// root, by running the driver loop here. Returns the value the context that
/// made the request is eventually resumed with.
///
/// Always inlined, with corosensei's suspend, into the switching code: a
/// coroutine is resumed by a `call` in the driver (corosensei's resume) and
/// suspends with a `ret` to it, so the processor's return-address predictor
/// stays right only if the coroutine makes no returns of its own between
/// being resumed and suspending again. Out of line, every round trip made
/// two such returns (from `submit` and from the policy method) and
/// mispredicted four.
#[inline(always)]
fn submit(req: Request) -> usize {
    let (w, data) = req.into_words();
    // SAFETY: the words were made by `into_words`.
    let (cur, value) = unsafe { enter(w.kind, w.a, w.b, w.c, data) };
    if cur.is_null() {
        // The root: the request was served.
        value
    } else {
        // SAFETY: `cur` is the running coroutine; its yielder was recorded at
        // start and stays valid while the coroutine lives. The driver reads
        // the request from the frame once we are suspended.
        unsafe {
            (*cur).req.write(w);
            (*(*cur).yielder.get()).suspend(data)
        }
    }
}

/// The out-of-line part of [`submit`], one call either way: on a coroutine,
/// returns its frame at once (the coroutine then suspends, inline); on the
/// root, runs the driver loop with the request's words and returns a null
/// frame and the value the root is resumed with (the root's calls and
/// returns pair up on its own stack).
///
/// It reads the thread-locals inline: on a coroutine it returns before any
/// switch, and the root never changes OS thread, so no thread-local address
/// is kept across a switch to another thread.
///
/// # Safety
///
/// The words were made by [`Request::into_words`].
#[inline(never)]
unsafe fn enter(kind: usize, a: usize, b: usize, c: usize, data: usize) -> (*mut Frame, usize) {
    let cur = CURRENT.with(|c| c.get());
    if !cur.is_null() {
        return (cur, 0);
    }
    // SAFETY: CURRENT is null only while the root runs: we are on the root
    // stack of this thread.
    let v = unsafe { drive(root_frame(), Words { kind, a, b, c }, data) };
    (ptr::null_mut(), v)
}

/// The driver loop, running on the root stack of this OS thread: the root
/// made the request `w` with value `data`; the loop serves requests until one
/// resumes the root.
///
/// # Safety
///
/// Must be called on the root stack, by the root, with words made by
/// [`Request::into_words`].
unsafe fn drive(root: *mut Frame, mut w: Words, mut data: usize) -> usize {
    let mut prev = root;
    loop {
        // SAFETY: the words were made by `into_words` from a request of
        // kind `w.kind` (see `serve`). The common kinds are tested first with
        // plain branches, the others served out of line.
        let (target, value) = unsafe {
            if w.kind == SWAP {
                let v = if w.b == 0 {
                    data
                } else {
                    let f = core::mem::transmute::<usize, OntopFn<Portable>>(w.b);
                    f(frame_ctx(prev), data)
                };
                (w.a as *mut Frame, v)
            } else if w.kind == SWAP_INTO {
                (w.b as *mut Option<Context<Portable>>).write(Some(frame_ctx(prev)));
                (w.a as *mut Frame, data)
            } else {
                serve(prev, w.kind, w.a, w.b, w.c, data)
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
        // Whether it suspended or returned, it left its request in its
        // frame, and passed the request's value.
        data = match coro.resume(value) {
            CoroutineResult::Yield(d) | CoroutineResult::Return(d) => d,
        };
        // SAFETY: `target` is suspended (or finished) and wrote its request.
        w = unsafe { (*target).req.read() };
        prev = target;
    }
}

/// Serves the requests of kinds other than `SWAP` and `SWAP_INTO` for
/// [`drive`]: returns the context to resume and its value.
///
/// # Safety
///
/// The words were made by [`Request::into_words`] from a request of kind
/// `kind`, so non-zero function words are functions of the recorded types
/// and pointers are what the request's maker passed under the policy's
/// contract. `prev` made the request and is saved (or abandoned, for a
/// restore), so the ontop functions may publish it.
#[inline(never)]
unsafe fn serve(
    prev: *mut Frame,
    kind: usize,
    a: usize,
    b: usize,
    c: usize,
    data: usize,
) -> (*mut Frame, usize) {
    // In registers rather than as a `Words` in memory.
    let w = Words { kind, a, b, c };
    // SAFETY: see the function's contract.
    unsafe {
        match w.kind {
            COND_SWAP => {
                let f = core::mem::transmute::<usize, CondOntopFn<Portable>>(w.b);
                let r = f(frame_ctx(prev), data);
                (if r.proceed { w.a as *mut Frame } else { prev }, r.value)
            }
            RESTORE => {
                // `prev` is abandoned: nothing of it is read after this
                // point, so `f` may free its stack (and the frame on it).
                let v = if w.b == 0 {
                    data
                } else {
                    core::mem::transmute::<usize, RestoreFn>(w.b)(data)
                };
                (w.a as *mut Frame, v)
            }
            _ => {
                let stack = StackRegion::new(w.a, w.c).expect("a saved stack region");
                let f = core::mem::transmute::<usize, OntopFn<Portable>>(w.b);
                let saved = prev as usize;
                // `stack` is fresh memory (contract of `save_context`).
                let fresh = new_coroutine(stack, move |me, _| {
                    let v = f(frame_ctx(saved as *mut Frame), data);
                    let (w, v) = Request::Swap {
                        next: saved as *mut Frame,
                        f: None,
                        data: v,
                    }
                    .into_words();
                    // SAFETY: `me` is this running coroutine's frame.
                    (*me).req.write(w);
                    v
                });
                (fresh, 0)
            }
        }
    }
}

#[cold]
fn foreign_root() -> ! {
    eprintln!(
        "ct-context: the Portable policy cannot resume the root context of another OS thread"
    );
    std::process::abort();
}

#[inline(always)]
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

    #[inline(always)]
    unsafe fn save_context(stack: StackRegion, f: OntopFn<Self>, data: usize) -> usize {
        submit(Request::Save { stack, f, data })
    }

    #[inline(always)]
    unsafe fn swap_context(next: Context<Self>, f: Option<OntopFn<Self>>, data: usize) -> usize {
        submit(Request::Swap {
            next: frame_of(next),
            f,
            data,
        })
    }

    #[inline(always)]
    unsafe fn swap_context_into(
        next: Context<Self>,
        slot: *mut Option<Context<Self>>,
        data: usize,
    ) -> usize {
        submit(Request::SwapInto {
            next: frame_of(next),
            slot,
            data,
        })
    }

    #[inline(always)]
    unsafe fn cond_swap_context(next: Context<Self>, f: CondOntopFn<Self>, data: usize) -> usize {
        submit(Request::CondSwap {
            next: frame_of(next),
            f,
            data,
        })
    }

    #[inline(always)]
    unsafe fn restore_context(next: Context<Self>, f: Option<RestoreFn>, data: usize) -> ! {
        submit(Request::Restore {
            next: frame_of(next),
            f,
            data,
        });
        unreachable!("an abandoned context was resumed");
    }
}
