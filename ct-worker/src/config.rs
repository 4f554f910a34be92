//! Compile-time configuration of a runtime: context policy, worker deque,
//! aspect, stack source and switch hook, bundled in one type (the Rust counterpart of cmpth's policy "itf"
//! bundles).

use core::marker::PhantomData;

use ct_context::{ContextPolicy, DefaultPolicy};

use crate::aspect::{Aspect, NoAspect, StatsAspect, TraceAspect};
use crate::deque::{AsymmetricChaseLev, ChaseLev, LockedDeque, WorkerDeque};
use crate::hook::{NoHook, SwitchHook};
use crate::stack::{MmapStacks, StackSource};

/// The components a runtime is built from.
///
/// Everything is monomorphised: the default configuration costs nothing for
/// the aspects it leaves out. Code that wants to work with any configuration is
/// generic over `C: Config` (or over [`UltItf`](crate::UltItf)).
pub trait Config: Send + Sync + Sized + 'static {
    /// How contexts are switched.
    type Policy: ContextPolicy;
    /// The worker deque, for any item type: name it through a
    /// [`DequeKind`] (`<ChaseLevKind as DequeKind>::Deque<T>`); the deque
    /// types themselves are in [`unstable`](crate::unstable).
    type Deque<T: Send + 'static>: WorkerDeque<T>;
    /// Hooks called on scheduler events.
    type Aspect: Aspect;
    /// Where threads' stacks come from ([`MmapStacks`] in the bundled
    /// configurations). The instance is given to
    /// [`Builder::stack_source`](crate::Builder::stack_source), else
    /// default-constructed.
    type Stacks: StackSource;
    /// Told when threads are switched in and out ([`NoHook`], which costs
    /// nothing, in the bundled configurations). The instance is given to
    /// [`Builder::switch_hook`](crate::Builder::switch_hook), else
    /// default-constructed.
    type Hook: SwitchHook;
}

/// Declares the named configurations: each a type of its own (a runtime
/// knows the configuration it was built with by its type) whose [`Config`]
/// is that of the [`Custom`] configuration of the same parts.
macro_rules! named_configs {
    ($($(#[$doc:meta])* $name:ident = $parts:ty;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;

        impl Config for $name {
            type Policy = <$parts as Config>::Policy;
            type Deque<T: Send + 'static> = <$parts as Config>::Deque<T>;
            type Aspect = <$parts as Config>::Aspect;
            type Stacks = <$parts as Config>::Stacks;
            type Hook = <$parts as Config>::Hook;
        }
    )*};
}

named_configs! {
    /// The default: the target's fastest context policy, Chase–Lev deques, no aspect.
    DefaultConfig = Custom<DefaultPolicy, ChaseLevKind, NoAspect, MmapStacks, NoHook>;

    /// The default configuration with [`AsymmetricChaseLev`](crate::unstable::AsymmetricChaseLev)
    /// deques: owner pops
    /// without a memory fence (thieves use `membarrier` instead). The fastest
    /// fork/join on Linux; falls back to fences where `membarrier` is missing.
    AsymmetricConfig = Custom<DefaultPolicy, AsymmetricKind, NoAspect, MmapStacks, NoHook>;

    /// The default configuration with per-worker statistics
    /// ([`StatsAspect`]: forks, steals, switches, idle time).
    StatsConfig = Custom<DefaultPolicy, ChaseLevKind, StatsAspect, MmapStacks, NoHook>;

    /// The default configuration with a Chrome trace-event recorder
    /// ([`TraceAspect`]; the file is named by `CT_TRACE` or the builder).
    TraceConfig = Custom<DefaultPolicy, ChaseLevKind, TraceAspect, MmapStacks, NoHook>;
}

/// A family of deques, to name one in [`Custom`].
pub trait DequeKind: Send + Sync + 'static {
    /// The deque for item type `T`.
    type Deque<T: Send + 'static>: WorkerDeque<T>;
}

/// Chase–Lev deques ([`ChaseLev`](crate::unstable::ChaseLev), on
/// `crossbeam-deque`): the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChaseLevKind;
impl DequeKind for ChaseLevKind {
    type Deque<T: Send + 'static> = ChaseLev<T>;
}

/// Asymmetric Chase–Lev deques
/// ([`AsymmetricChaseLev`](crate::unstable::AsymmetricChaseLev)): fence-free
/// owner operations, `membarrier` on steals.
#[derive(Debug, Clone, Copy, Default)]
pub struct AsymmetricKind;
impl DequeKind for AsymmetricKind {
    type Deque<T: Send + 'static> = AsymmetricChaseLev<T>;
}

/// Mutex-protected deques ([`LockedDeque`](crate::unstable::LockedDeque)),
/// the simplest, for comparison.
#[derive(Debug, Clone, Copy, Default)]
pub struct LockedKind;
impl DequeKind for LockedKind {
    type Deque<T: Send + 'static> = LockedDeque<T>;
}

/// A configuration assembled from its parts, e.g.
/// `Custom<ct_context::Portable, LockedKind, StatsAspect>`, or
/// `Custom<DefaultPolicy, ChaseLevKind, NoAspect, MyStacks, MyHook>` for a
/// runtime whose threads run on stacks of `MyStacks` with `MyHook` told of
/// every switch.
#[derive(Debug)]
pub struct Custom<P = DefaultPolicy, D = ChaseLevKind, A = NoAspect, S = MmapStacks, H = NoHook>(
    PhantomData<Parts<P, D, A, S, H>>,
);

/// The parts of a [`Custom`] configuration, as a type (never constructed).
type Parts<P, D, A, S, H> = fn() -> (P, D, A, S, H);

impl<P: ContextPolicy, D: DequeKind, A: Aspect, S: StackSource, H: SwitchHook> Config
    for Custom<P, D, A, S, H>
{
    type Policy = P;
    type Deque<T: Send + 'static> = D::Deque<T>;
    type Aspect = A;
    type Stacks = S;
    type Hook = H;
}
