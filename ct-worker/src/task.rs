//! Task descriptors: what the scheduler knows about one user-level thread.
//!
//! A descriptor is separate from the thread's stack: the stack goes back to
//! its pool the moment the thread finishes, while the descriptor (holding the
//! result) lives until the thread is joined. A program may therefore keep
//! millions of finished-but-unjoined threads without keeping their stacks.

use core::cell::{Cell, UnsafeCell};
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};
use std::thread;

use ct_context::Context;

use crate::config::Config;
use crate::join_state::JoinState;
use crate::local::LocalMap;
use crate::pool::PoolItem;
use crate::remote_list::Linked;
use crate::stack::StackSource;
use crate::worker::Worker;

/// Bytes of a descriptor reserved for the thread's result; larger results
/// are boxed.
pub(crate) const PACKET_BYTES: usize = 48;

/// Owner tag of descriptors that are not pooled.
pub(crate) const UNPOOLED: usize = usize::MAX - 1;

/// The value delivered to a task that is resumed normally.
pub(crate) const RESUMED: usize = 0;
/// The value delivered to a task whose conditional suspension was cancelled.
pub(crate) const CANCELLED: usize = 1;

/// Starts an unstarted thread on worker `w`: gives it a stack (unless it has
/// one), tells the switch hook it is entered, and returns the fresh context
/// to switch to. The pointer is the thread's closure.
pub(crate) type StartFn<C> =
    unsafe fn(&Worker<C>, TaskRef<C>, *const ()) -> Context<<C as Config>::Policy>;

/// A stack handed out by `C`'s stack source.
pub(crate) type StackOf<C> = <<C as Config>::Stacks as StackSource>::Stack;

/// What a [`JoinHandle`](crate::JoinHandle) needs of its thread's runtime
/// configuration, as functions of the descriptor: a handle (and its type's
/// configuration parameter) may then refer to a thread of any runtime — the
/// free [`spawn`](crate::spawn) hands out default-typed handles to threads
/// of whichever runtime runs the caller.
pub(crate) struct TaskOps {
    /// Parks the caller until the thread has finished.
    pub(crate) wait_finished: unsafe fn(NonNull<TaskHead>),
    /// Frees the finished thread's descriptor.
    pub(crate) free: unsafe fn(NonNull<TaskHead>),
    /// Offset of the descriptor's result packet.
    packet: usize,
    /// Offset of the descriptor's `drop_packet`.
    drop_packet: usize,
}

/// The part of every descriptor whose layout does not depend on the
/// configuration: the first fields of [`TaskDesc`] (both are `repr(C)`), so
/// a descriptor of any configuration can be used through a pointer to it
/// (the rest through the offsets in its [`TaskOps`]).
#[repr(C)]
pub(crate) struct TaskHead {
    /// The functions of the descriptor's configuration.
    pub(crate) ops: &'static TaskOps,
    pub(crate) join: JoinState,
}

/// Drops a result that was stored but never taken (a descriptor's
/// `drop_packet`).
type DropPacket = Cell<Option<unsafe fn(*mut u8)>>;

/// The result packet of the descriptor headed by `head`, and its
/// `drop_packet`.
///
/// # Safety
///
/// `head` heads a live descriptor, and carries the provenance of all of it
/// (it was cast from a pointer to the descriptor).
unsafe fn packet_of<'a>(head: NonNull<TaskHead>) -> (*mut u8, &'a DropPacket) {
    // SAFETY: the contract; the offsets are those of the descriptor's own
    // configuration (`TaskDesc::new_value`).
    unsafe {
        let ops = head.as_ref().ops;
        let base = head.as_ptr().cast::<u8>();
        (
            base.add(ops.packet),
            &*base
                .add(ops.drop_packet)
                .cast::<Cell<Option<unsafe fn(*mut u8)>>>(),
        )
    }
}

/// Stores the result of the running thread whose descriptor `head` heads.
///
/// # Safety
///
/// As for [`TaskDesc::write_packet`]; `head` as for [`packet_of`].
pub(crate) unsafe fn write_packet_at<T>(head: NonNull<TaskHead>, r: thread::Result<T>) {
    // SAFETY: forwarded contract.
    unsafe {
        let (p, d) = packet_of(head);
        write_packet_raw(p, d, r)
    }
}

/// Takes the result of the finished thread whose descriptor `head` heads.
///
/// # Safety
///
/// As for [`TaskDesc::take_packet`]; `head` as for [`packet_of`].
pub(crate) unsafe fn take_packet_at<T>(head: NonNull<TaskHead>) -> thread::Result<T> {
    // SAFETY: forwarded contract.
    unsafe {
        let (p, d) = packet_of(head);
        take_packet_raw(p, d)
    }
}

/// [`TaskDesc::write_packet`] on a packet and its `drop_packet`.
///
/// # Safety
///
/// As for [`TaskDesc::write_packet`].
unsafe fn write_packet_raw<T>(p: *mut u8, drop: &DropPacket, r: thread::Result<T>) {
    // SAFETY: the packet area is ours until the thread is marked finished;
    // `inline_packet` checks size and alignment.
    unsafe {
        if inline_packet::<T>() {
            ptr::write(p as *mut thread::Result<T>, r);
        } else {
            ptr::write(p as *mut Box<thread::Result<T>>, Box::new(r));
        }
    }
    drop.set(Some(drop_packet::<T>));
}

/// [`TaskDesc::take_packet`] on a packet and its `drop_packet`.
///
/// # Safety
///
/// As for [`TaskDesc::take_packet`].
unsafe fn take_packet_raw<T>(p: *mut u8, drop: &DropPacket) -> thread::Result<T> {
    debug_assert!(drop.get().is_some());
    drop.set(None);
    // SAFETY: per the contract, a `T` result was written as below.
    unsafe {
        if inline_packet::<T>() {
            ptr::read(p as *mut thread::Result<T>)
        } else {
            *ptr::read(p as *mut Box<thread::Result<T>>)
        }
    }
}

/// One user-level thread.
#[repr(C, align(16))]
pub(crate) struct TaskDesc<C: Config> {
    /// Must stay first (see [`TaskHead`]).
    head: TaskHead,
    next: *mut TaskDesc<C>,
    owner: usize,
    /// Id of the runtime the thread belongs to (for wake-ups from outside).
    pub(crate) runtime_id: Cell<usize>,
    /// The saved context while the thread is suspended.
    ctx: UnsafeCell<Option<Context<C::Policy>>>,
    /// The worker the thread last parked on (`usize::MAX`: none), where
    /// [`SuspendedThread::notify_home`](crate::SuspendedThread::notify_home)
    /// sends it back.
    pub(crate) home: Cell<usize>,
    /// For a `join`'s second closure queued as a job (not a thread yet):
    /// how to start it as a thread, and its closure. Set before the job is
    /// pushed; taken by whoever takes the job from the deque.
    pub(crate) start: Cell<Option<(StartFn<C>, *const ())>>,
    /// The stack the thread runs on; released when it finishes.
    pub(crate) stack: Cell<Option<StackOf<C>>>,
    /// The switch hook's word for this thread (0 when it starts).
    pub(crate) hook_data: Cell<usize>,
    /// The runtime's word for this thread ([`crate::current_thread_word`];
    /// 0 when it starts).
    pub(crate) user_word: Cell<usize>,
    /// ULT-local storage, created on first use.
    pub(crate) locals: UnsafeCell<Option<Box<LocalMap>>>,
    /// Drops a result that was stored but never taken.
    drop_packet: DropPacket,
    packet: UnsafeCell<MaybeUninit<[u128; PACKET_BYTES / 16]>>,
}

impl<C: Config> core::ops::Deref for TaskDesc<C> {
    type Target = TaskHead;

    #[inline(always)]
    fn deref(&self) -> &TaskHead {
        &self.head
    }
}

// SAFETY: `next` is a field of the descriptor.
unsafe impl<C: Config> Linked for TaskDesc<C> {
    fn link(this: *mut Self) -> *mut *mut Self {
        // SAFETY: `this` is valid per the caller.
        unsafe { &raw mut (*this).next }
    }
}

// SAFETY: descriptors are boxed; `destroy` drops the box after releasing
// whatever the descriptor still holds.
unsafe impl<C: Config> PoolItem for TaskDesc<C> {
    fn owner(this: NonNull<Self>) -> usize {
        // SAFETY: pooled descriptors are valid.
        unsafe { this.as_ref().owner }
    }

    unsafe fn destroy(this: NonNull<Self>) {
        // SAFETY: a free descriptor is owned by the caller; `create` got its
        // memory from the system allocator with this layout.
        unsafe {
            core::ptr::drop_in_place(this.as_ptr());
            std::alloc::GlobalAlloc::dealloc(
                &std::alloc::System,
                this.as_ptr().cast(),
                core::alloc::Layout::new::<Self>(),
            );
        }
    }
}

impl<C: Config> TaskDesc<C> {
    /// Allocates a new descriptor owned by `owner`, from the system
    /// allocator whatever the program's global allocator is: the scheduler
    /// writes descriptors on every switch, so they must not live in memory
    /// a global allocator might hand out with strings attached (a DSM
    /// heap, where a write can fault).
    pub(crate) fn create(owner: usize) -> NonNull<Self> {
        let layout = core::alloc::Layout::new::<Self>();
        // SAFETY: the layout is the descriptor's, of non-zero size.
        let p =
            unsafe { std::alloc::GlobalAlloc::alloc(&std::alloc::System, layout) }.cast::<Self>();
        let Some(p) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: fresh memory of the right layout.
        unsafe { p.as_ptr().write(Self::new_value(owner)) };
        p
    }

    /// A descriptor that lives wherever the caller puts it (e.g. on the
    /// stack of a parent that joins the thread before returning). It never
    /// enters a pool.
    pub(crate) fn new_unpooled(runtime_id: usize) -> Self {
        let d = Self::new_value(UNPOOLED);
        d.runtime_id.set(runtime_id);
        d
    }

    fn new_value(owner: usize) -> Self {
        TaskDesc {
            head: TaskHead {
                ops: &const {
                    TaskOps {
                        wait_finished: crate::handle::wait_finished_erased::<C>,
                        free: crate::handle::free_desc_erased::<C>,
                        packet: core::mem::offset_of!(TaskDesc<C>, packet),
                        drop_packet: core::mem::offset_of!(TaskDesc<C>, drop_packet),
                    }
                },
                join: JoinState::new(),
            },
            next: ptr::null_mut(),
            owner,
            runtime_id: Cell::new(0),
            ctx: UnsafeCell::new(None),
            home: Cell::new(usize::MAX),
            start: Cell::new(None),
            stack: Cell::new(None),
            hook_data: Cell::new(0),
            user_word: Cell::new(0),
            locals: UnsafeCell::new(None),
            drop_packet: Cell::new(None),
            packet: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Prepares a recycled descriptor for a new thread of runtime `runtime_id`.
    pub(crate) fn reset(&self, runtime_id: usize) {
        self.runtime_id.set(runtime_id);
        self.join.reset();
        self.hook_data.set(0);
        self.user_word.set(0);
        debug_assert!(self.stack.get().is_none());
        debug_assert!(self.drop_packet.get().is_none());
    }

    /// Stores the saved context of the (now suspended) thread.
    ///
    /// # Safety
    ///
    /// Only the code that suspends the thread (in an ontop function) may call
    /// this, and the slot must be empty.
    #[inline]
    pub(crate) unsafe fn set_ctx(&self, ctx: Context<C::Policy>) {
        // SAFETY: exclusive access per the contract.
        unsafe {
            debug_assert!((*self.ctx.get()).is_none());
            *self.ctx.get() = Some(ctx);
        }
    }

    /// Address of the saved context, 0 if there is none.
    ///
    /// # Safety
    ///
    /// Nobody may store or take the context meanwhile (the thread is not
    /// being suspended or resumed).
    #[inline]
    pub(crate) unsafe fn saved_ctx_addr(&self) -> usize {
        // SAFETY: no concurrent access per the contract.
        unsafe { (*self.ctx.get()).as_ref() }.map_or(0, |c| c.as_raw().as_ptr() as usize)
    }

    /// Takes the saved context to resume the thread.
    ///
    /// # Safety
    ///
    /// The caller must own the right to resume this thread (it took the task
    /// from a deque, a waiter slot or a join state).
    #[inline]
    pub(crate) unsafe fn take_ctx(&self) -> Context<C::Policy> {
        // SAFETY: exclusive access per the contract.
        unsafe { (*self.ctx.get()).take() }.expect("a suspended thread has a saved context")
    }

    /// Drops anything the descriptor still holds (an untaken result, locals),
    /// so that it can be reused or freed.
    pub(crate) fn clear(&self) {
        if let Some(d) = self.drop_packet.take() {
            // SAFETY: `drop_packet` was set together with the packet's contents.
            unsafe { d(self.packet.get() as *mut u8) };
        }
        // SAFETY: the thread is finished; nobody else touches its locals.
        drop(unsafe { (*self.locals.get()).take() });
    }
}

impl<C: Config> TaskDesc<C> {
    /// The packet area (for a deferred job's closure before it runs).
    pub(crate) fn packet_ptr(&self) -> *mut u8 {
        self.packet.get().cast()
    }

    /// Stores the thread's result.
    ///
    /// # Safety
    ///
    /// Called once per thread, by the thread itself, before it finishes.
    pub(crate) unsafe fn write_packet<T>(&self, r: thread::Result<T>) {
        // SAFETY: forwarded contract.
        unsafe { write_packet_raw(self.packet_ptr(), &self.drop_packet, r) }
    }

    /// Takes the thread's result.
    ///
    /// # Safety
    ///
    /// The thread must have finished (observed with acquire ordering) and its
    /// result, of type `T`, must not have been taken.
    pub(crate) unsafe fn take_packet<T>(&self) -> thread::Result<T> {
        // SAFETY: forwarded contract.
        unsafe { take_packet_raw(self.packet_ptr(), &self.drop_packet) }
    }
}

impl<C: Config> Drop for TaskDesc<C> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Whether a `thread::Result<T>` fits in the descriptor.
const fn inline_packet<T>() -> bool {
    size_of::<thread::Result<T>>() <= PACKET_BYTES && align_of::<thread::Result<T>>() <= 16
}

unsafe fn drop_packet<T>(p: *mut u8) {
    // SAFETY: called only on a packet written by `write_packet::<T>`.
    unsafe {
        if inline_packet::<T>() {
            ptr::drop_in_place(p as *mut thread::Result<T>);
        } else {
            ptr::drop_in_place(p as *mut Box<thread::Result<T>>);
        }
    }
}

/// A pointer to a descriptor that can travel between workers.
pub(crate) struct TaskRef<C: Config>(NonNull<TaskDesc<C>>);

impl<C: Config> Clone for TaskRef<C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C: Config> Copy for TaskRef<C> {}

impl<C: Config> PartialEq for TaskRef<C> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

// SAFETY: descriptors are handed between workers by the scheduler's
// protocols, which give one worker at a time the right to touch them.
unsafe impl<C: Config> Send for TaskRef<C> {}

impl<C: Config> TaskRef<C> {
    #[inline]
    pub(crate) fn new(p: NonNull<TaskDesc<C>>) -> Self {
        TaskRef(p)
    }

    #[inline]
    pub(crate) fn ptr(self) -> NonNull<TaskDesc<C>> {
        self.0
    }

    /// The descriptor. Valid as long as the protocol that handed out this
    /// reference says so.
    #[inline]
    pub(crate) fn desc<'a>(self) -> &'a TaskDesc<C> {
        // SAFETY: a `TaskRef` always points to a live descriptor while it is
        // held (descriptors are freed only after every reference is gone).
        unsafe { self.0.as_ref() }
    }

    /// The address as a waiter word (8-byte aligned, low bit clear).
    #[inline]
    pub(crate) fn word(self) -> usize {
        self.0.as_ptr() as usize
    }

    /// Rebuilds a reference from [`TaskRef::word`].
    ///
    /// # Safety
    ///
    /// `w` must come from `word` of a live descriptor.
    #[inline]
    pub(crate) unsafe fn from_word(w: usize) -> Self {
        // SAFETY: per the contract, non-null.
        TaskRef(unsafe { NonNull::new_unchecked(w as *mut TaskDesc<C>) })
    }
}
