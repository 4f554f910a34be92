//! A network model over any backend: [`NetCom`], a communicator decorator
//! that delays every remote operation by what it would cost on a network of
//! a given one-way latency and link rate ([`NetModel`]), and counts the
//! operations ([`Traffic`]).
//!
//! It lets a job on one machine (the shm backend, or MPI between processes
//! of one host) behave like one spread over InfiniBand (2 µs, 100 Gb/s) or
//! Ethernet (25 µs, 10 Gb/s), so that a protocol's sensitivity to latency
//! can be measured and tested; over a real network (MPI, verbs) it adds its
//! costs to the network's own.
//!
//! # Enabling it
//!
//! - **Any program joining as [`AnyCom`]** (the DSM examples, `menps-omp`,
//!   the C programs on `menps-gomp`, the benchmarks): set
//!   `MENPS_NET_LATENCY` (a duration with its unit: `2us`, `25us`, `2ms`)
//!   and/or `MENPS_NET_BANDWIDTH` (a link rate: `10Gbit`, `100Gbit`,
//!   `800Mbit`, `2.5Gbit/s`, `25Gbps`; decimal multiples, a unit is
//!   required). [`crate::launch`] then wraps the backend it joined in a
//!   `NetCom` ([`AnyCom::Net`]). `MENPS_STATS=1` wraps it too, with a free
//!   model, for the counters alone. With none of the three set nothing is
//!   wrapped: the backend's calls are as fast as without this module. A
//!   malformed value is an error at join naming the variable.
//! - **In code**, over any backend (`ShmCom`, `MpiCom`, `VerbsCom`, or a
//!   test's communicator): [`NetCom::new`]`(com, NetModel::ethernet())`.
//!
//! # The cost model
//!
//! `L` is the one-way latency, `ser(n)` = `n` bytes × 8 / rate (0 without a
//! rate). Each process has one outgoing and one incoming link: a transfer
//! occupies its link for `ser(n)` and queues behind the transfers of the
//! same process already on it (the other end's links are not modelled).
//! Operations a process addresses to itself cost nothing (they do not leave
//! the machine).
//!
//! | operation | completes at (issued at `t`) | why |
//! |---|---|---|
//! | read `n` bytes | `t + L + ser(n) + L` (`ser` on the incoming link) | the request travels to the target, the data back |
//! | compare-and-swap, fetch-and-add, atomic load | `t + ser(16) + 2L` | a round trip with a word each way |
//! | write `n` bytes | `t + ser(n) + 2L` (outgoing link) | the data arrives after `ser + L`; the writer learns it is complete at the target (what [`Rma`] promises) by the target's acknowledgement, `L` later |
//! | flush of a rank | waits until every operation issued to it has completed by the rules above | a write is charged once: at the wait of its request, or at the flush, whichever comes first; a flush with nothing outstanding is free |
//! | message of `n` bytes | the sender returns at `t + ser(n) + L`, and only then hands the message to the backend | see below |
//! | barrier | `ceil(log2 N)` × `L` after the backend's barrier returned | a dissemination barrier: `ceil(log2 N)` rounds, each one message |
//! | broadcast of `n` bytes | `ceil(log2 N)` × (`L` + `ser(n)`) after the backend returned | a binomial tree |
//! | allgather of `n` bytes each | `ceil(log2 N)` × `L` + `(N - 1)` × `ser(n)` after the backend returned | recursive doubling: log rounds, and every process receives the other `N - 1` parts |
//! | window creation / destruction | `ceil(log2 N)` × `L` after the backend returned | an allgather of registration keys / a barrier |
//!
//! **Messages are delayed at the sender**: the message reaches the backend
//! (and so becomes visible to the receiver) no earlier than `L + ser(n)`
//! after `send` was called, so the receiver's view is exact; the sender is
//! charged the flight time as well, which a real sender (returning once the
//! message is injected) is not — a conservative choice that needs no clock
//! shared between the processes (delaying delivery would stamp each message
//! with its send time, which processes on different machines cannot
//! compare).
//!
//! **Collectives are delayed after the backend's own collective returns**,
//! not from their start: a collective cannot end before its last process
//! entered it, which is when the backend's returns.
//!
//! One-sided operations are delayed from their start: the backend's own
//! time (a `memcpy` on shm) overlaps the modelled wire time, as a real
//! transfer's copy is the wire time.
//!
//! # Waiting
//!
//! A blocking operation waits for its modelled completion in the caller:
//! the last [`SPIN_NS`] (5 µs) by spinning, before that with the
//! workspace's [`Backoff`]: a user-level thread yields to its worker's
//! other threads, an OS thread yields its processor; while more than
//! [`PARK_NS`] (500 µs) are left an OS thread that is not a worker parks
//! for at most 200 µs at a time (a worker never sleeps). So a wait may end
//! later than modelled (on a loaded machine, by the time the processor is
//! elsewhere), never earlier.
//!
//! An asynchronous operation (`read_nb`, …) returns a pending [`Request`]
//! that completes at its modelled time (or when the backend's completes,
//! if later): a timer thread of the `NetCom` (started at the first such
//! operation) holds the backend's request until then, so `is_complete`,
//! `wait` (which parks the user-level thread) and `on_complete` (run on the
//! timer thread) keep their meaning, and several outstanding operations
//! overlap as on a network.
//!
//! # Counters
//!
//! Every operation is counted with relaxed atomic additions ([`Traffic`],
//! read with [`Comm::traffic`]); remote and local operations apart. The DSM
//! prints them at its end under `MENPS_STATS=1` (one `com:` line per
//! process).

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::BinaryHeap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ct_config::vars;
use ct_sync::Backoff;
use ct_worker::{Ult, UltItf};

use super::{
    AnyCom, CasOp, Coll, Comm, Completer, Error, LocalWindow, P2p, RemotePtr, Request, Result, Rma,
    RmaRequest, Source, Tag, WindowId, Windows,
};

/// The last stretch of a modelled wait, in nanoseconds, that is spun
/// instead of yielded (a yield or a park may overshoot by more).
pub const SPIN_NS: u64 = 5_000;

/// Time left, in nanoseconds, below which a modelled wait only yields (a
/// park's wake-up is late by the timer slack, about 50 µs).
pub const PARK_NS: u64 = 500_000;

/// Yield rounds of a waiting OS thread before it parks.
const YIELDS_BEFORE_PARK: u32 = 64;

/// Bytes on the wire of an atomic's request (operands and address).
const ATOMIC_BYTES: usize = 16;

/// A network: one-way latency and link rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetModel {
    /// One-way latency of every message or one-sided access.
    pub latency: Duration,
    /// Link rate in bits per second (`None`: unlimited).
    pub bandwidth: Option<u64>,
}

impl NetModel {
    /// InfiniBand-like: 2 µs, 100 Gb/s.
    pub fn infiniband() -> Self {
        NetModel {
            latency: Duration::from_micros(2),
            bandwidth: Some(100_000_000_000),
        }
    }

    /// Ethernet-like: 25 µs, 10 Gb/s.
    pub fn ethernet() -> Self {
        NetModel {
            latency: Duration::from_micros(25),
            bandwidth: Some(10_000_000_000),
        }
    }

    /// The model the environment asks for: `MENPS_NET_LATENCY` and
    /// `MENPS_NET_BANDWIDTH`; `None` if neither is set. A malformed value
    /// is an error naming the variable.
    pub fn from_env() -> std::result::Result<Option<NetModel>, ct_config::Error> {
        let latency = vars::MENPS_NET_LATENCY.duration()?;
        let bandwidth = vars::MENPS_NET_BANDWIDTH.rate()?;
        if latency.is_none() && bandwidth.is_none() {
            return Ok(None);
        }
        Ok(Some(NetModel {
            latency: latency.unwrap_or_default(),
            bandwidth,
        }))
    }

    /// Whether the model costs nothing (zero latency, no rate cap).
    pub fn is_free(&self) -> bool {
        self.latency.is_zero() && self.bandwidth.is_none()
    }

    /// Nanoseconds `bytes` occupy a link.
    pub fn serialization_ns(&self, bytes: usize) -> u64 {
        match self.bandwidth {
            None => 0,
            Some(bits_per_s) => {
                let ns = (bytes as u128 * 8 * 1_000_000_000).div_ceil(bits_per_s as u128);
                ns.min(u64::MAX as u128) as u64
            }
        }
    }

    /// One-way latency in nanoseconds.
    pub fn latency_ns(&self) -> u64 {
        self.latency.as_nanos().min(u64::MAX as u128) as u64
    }

    /// Rounds of a logarithmic collective among `n` processes
    /// (`ceil(log2 n)`, 0 for one process).
    pub fn rounds(n: usize) -> u64 {
        if n <= 1 {
            0
        } else {
            u64::from(usize::BITS - (n - 1).leading_zeros())
        }
    }
}

impl fmt::Display for NetModel {
    /// `latency_us=25 bandwidth_gbit=10` (`bandwidth_gbit=none` uncapped).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "latency_us={}", self.latency.as_secs_f64() * 1e6)?;
        match self.bandwidth {
            Some(b) => write!(f, " bandwidth_gbit={}", b as f64 / 1e9),
            None => write!(f, " bandwidth_gbit=none"),
        }
    }
}

/// Communication counters of one process, as plain numbers (what
/// [`Comm::traffic`] returns). Byte counts are payload bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// The model the operations were delayed by.
    pub model: NetModel,
    /// One-sided reads of another process's memory.
    pub reads: u64,
    /// Bytes they read.
    pub read_bytes: u64,
    /// One-sided writes to another process's memory.
    pub writes: u64,
    /// Bytes they wrote.
    pub write_bytes: u64,
    /// Remote atomics (compare-and-swap, fetch-and-add, atomic loads).
    pub atomics: u64,
    /// Flushes of another process (`flush_all` counts once).
    pub flushes: u64,
    /// One-sided operations and flushes addressed to this process itself
    /// (not delayed).
    pub local_ops: u64,
    /// Messages sent to other processes.
    pub msgs_sent: u64,
    /// Their payload bytes.
    pub msg_bytes_sent: u64,
    /// Messages received (from any process).
    pub msgs_received: u64,
    /// Their payload bytes.
    pub msg_bytes_received: u64,
    /// Barriers of the communication layer (the DSM's included).
    pub barriers: u64,
    /// Broadcasts.
    pub broadcasts: u64,
    /// Allgathers.
    pub allgathers: u64,
    /// Bytes this process contributed to broadcasts (as root) and
    /// allgathers.
    pub coll_bytes: u64,
    /// Windows created or destroyed.
    pub window_ops: u64,
    /// Waits the model imposed: operations (or batches of operations in
    /// flight together, one wait each) whose modelled cost outlasted the
    /// backend's own time.
    pub waits: u64,
    /// Nanoseconds callers waited for the model (all threads together):
    /// the modelled costs less the backend's own time, which overlaps them.
    pub delay_ns: u64,
}

impl Traffic {
    /// Remote one-sided operations (reads, writes and atomics).
    pub fn rma_ops(&self) -> u64 {
        self.reads + self.writes + self.atomics
    }

    /// Collectives (barriers, broadcasts and allgathers).
    pub fn collectives(&self) -> u64 {
        self.barriers + self.broadcasts + self.allgathers
    }

    /// The counts of `self` minus those of an earlier snapshot `before`
    /// (the model is `self`'s).
    pub fn since(&self, before: &Traffic) -> Traffic {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Traffic {
            model: self.model,
            reads: d(self.reads, before.reads),
            read_bytes: d(self.read_bytes, before.read_bytes),
            writes: d(self.writes, before.writes),
            write_bytes: d(self.write_bytes, before.write_bytes),
            atomics: d(self.atomics, before.atomics),
            flushes: d(self.flushes, before.flushes),
            local_ops: d(self.local_ops, before.local_ops),
            msgs_sent: d(self.msgs_sent, before.msgs_sent),
            msg_bytes_sent: d(self.msg_bytes_sent, before.msg_bytes_sent),
            msgs_received: d(self.msgs_received, before.msgs_received),
            msg_bytes_received: d(self.msg_bytes_received, before.msg_bytes_received),
            barriers: d(self.barriers, before.barriers),
            broadcasts: d(self.broadcasts, before.broadcasts),
            allgathers: d(self.allgathers, before.allgathers),
            coll_bytes: d(self.coll_bytes, before.coll_bytes),
            window_ops: d(self.window_ops, before.window_ops),
            waits: d(self.waits, before.waits),
            delay_ns: d(self.delay_ns, before.delay_ns),
        }
    }
}

impl fmt::Display for Traffic {
    /// One line of `name=value` pairs, the model's last; times in
    /// milliseconds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reads={} read_bytes={} writes={} write_bytes={} atomics={} flushes={} \
             local_ops={} msgs_sent={} msg_bytes_sent={} msgs_received={} \
             msg_bytes_received={} barriers={} broadcasts={} allgathers={} coll_bytes={} \
             window_ops={} waits={} delay_ms={:.3} {}",
            self.reads,
            self.read_bytes,
            self.writes,
            self.write_bytes,
            self.atomics,
            self.flushes,
            self.local_ops,
            self.msgs_sent,
            self.msg_bytes_sent,
            self.msgs_received,
            self.msg_bytes_received,
            self.barriers,
            self.broadcasts,
            self.allgathers,
            self.coll_bytes,
            self.window_ops,
            self.waits,
            self.delay_ns as f64 / 1e6,
            self.model,
        )
    }
}

/// The live counters (relaxed atomics).
#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    atomics: AtomicU64,
    flushes: AtomicU64,
    local_ops: AtomicU64,
    msgs_sent: AtomicU64,
    msg_bytes_sent: AtomicU64,
    msgs_received: AtomicU64,
    msg_bytes_received: AtomicU64,
    barriers: AtomicU64,
    broadcasts: AtomicU64,
    allgathers: AtomicU64,
    coll_bytes: AtomicU64,
    window_ops: AtomicU64,
    waits: AtomicU64,
    delay_ns: AtomicU64,
}

#[inline]
fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self, model: NetModel) -> Traffic {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Traffic {
            model,
            reads: l(&self.reads),
            read_bytes: l(&self.read_bytes),
            writes: l(&self.writes),
            write_bytes: l(&self.write_bytes),
            atomics: l(&self.atomics),
            flushes: l(&self.flushes),
            local_ops: l(&self.local_ops),
            msgs_sent: l(&self.msgs_sent),
            msg_bytes_sent: l(&self.msg_bytes_sent),
            msgs_received: l(&self.msgs_received),
            msg_bytes_received: l(&self.msg_bytes_received),
            barriers: l(&self.barriers),
            broadcasts: l(&self.broadcasts),
            allgathers: l(&self.allgathers),
            coll_bytes: l(&self.coll_bytes),
            window_ops: l(&self.window_ops),
            waits: l(&self.waits),
            delay_ns: l(&self.delay_ns),
        }
    }
}

/// A monotonic clock in nanoseconds since the decorator was made.
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    #[inline]
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// A link: the time (on the [`Clock`]) at which it is free again.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Link(AtomicU64);

impl Link {
    /// Occupies the link for `ns`, starting at `earliest` or when the
    /// transfers before ours are through; returns the end of our transfer.
    fn reserve(&self, earliest: u64, ns: u64) -> u64 {
        if ns == 0 {
            return earliest;
        }
        let mut free = self.0.load(Ordering::Relaxed);
        loop {
            let end = free.max(earliest).saturating_add(ns);
            match self
                .0
                .compare_exchange_weak(free, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return end,
                Err(f) => free = f,
            }
        }
    }
}

/// A communicator that delays every remote operation of `C` by what it
/// would cost on the network of its [`NetModel`] and counts them; see the
/// [module docs](self) for the cost model.
///
/// `U` is the threading interface of the callers (for yielding while they
/// wait and for the requests of asynchronous operations).
pub struct NetCom<C, U: UltItf = Ult> {
    inner: C,
    model: NetModel,
    lat: u64,
    /// The model costs nothing: operations are only counted.
    free: bool,
    /// Operations to this process itself are delayed too (tests of a
    /// single-process job).
    delay_self: bool,
    clock: Clock,
    tx: Link,
    rx: Link,
    /// Per rank: when the last asynchronous operation issued to it
    /// completes (for flushes).
    outstanding: Box<[AtomicU64]>,
    counters: Counters,
    timer: OnceLock<Timer<U>>,
    _u: PhantomData<fn() -> U>,
}

impl<C: fmt::Debug, U: UltItf> fmt::Debug for NetCom<C, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetCom")
            .field("model", &self.model)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<C: Comm, U: UltItf> NetCom<C, U> {
    /// `inner`, delayed by `model`.
    pub fn new(inner: C, model: NetModel) -> Self {
        let outstanding = (0..inner.size()).map(|_| AtomicU64::new(0)).collect();
        NetCom {
            lat: model.latency_ns(),
            free: model.is_free(),
            model,
            delay_self: false,
            clock: Clock(Instant::now()),
            tx: Link::default(),
            rx: Link::default(),
            outstanding,
            counters: Counters::default(),
            timer: OnceLock::new(),
            inner,
            _u: PhantomData,
        }
    }

    /// Delays the operations a process addresses to itself as well, as if
    /// they went through the network (for tests on one process).
    pub fn delaying_self(mut self) -> Self {
        self.delay_self = true;
        self
    }

    /// The model.
    pub fn model(&self) -> NetModel {
        self.model
    }

    /// The decorated communicator.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// The decorated communicator, unwrapped.
    pub fn into_inner(self) -> C {
        self.inner
    }

    /// Whether an operation to `rank` goes through the modelled network.
    #[inline]
    fn remote(&self, rank: usize) -> bool {
        self.delay_self || rank != self.inner.rank()
    }

    /// Waits until the clock reads `deadline` (see "Waiting" in the module
    /// docs), and counts the wait.
    fn wait_until(&self, deadline: u64) {
        if deadline == 0 {
            return;
        }
        let start = self.clock.now();
        if start >= deadline {
            return;
        }
        let mut now = start;
        let mut yielding = Backoff::new();
        let mut parking = Backoff::parking(YIELDS_BEFORE_PARK);
        while now < deadline {
            let left = deadline - now;
            if left <= SPIN_NS {
                core::hint::spin_loop();
            } else if left < PARK_NS {
                yielding.snooze(U::yield_now);
            } else {
                parking.snooze(U::yield_now);
            }
            now = self.clock.now();
        }
        add(&self.counters.waits, 1);
        add(&self.counters.delay_ns, now - start);
    }

    /// Delay of a logarithmic collective among all processes whose every
    /// round moves `bytes`.
    fn collective_rounds(&self, bytes: usize) -> u64 {
        NetModel::rounds(self.inner.size())
            .saturating_mul(self.lat.saturating_add(self.model.serialization_ns(bytes)))
    }

    /// Waits `ns` from now (after a collective of the backend returned).
    fn wait_for(&self, ns: u64) {
        if ns > 0 {
            self.wait_until(self.clock.now().saturating_add(ns));
        }
    }

    /// Completion time of a read of `len` bytes issued now (0 under a free
    /// model: no clock is read, the counters alone cost).
    fn read_deadline(&self, len: usize) -> u64 {
        if self.free {
            return 0;
        }
        let t = self.clock.now();
        let wire = self
            .rx
            .reserve(t.saturating_add(self.lat), self.model.serialization_ns(len));
        wire.saturating_add(self.lat)
    }

    /// Completion time (acknowledged) of a write of `len` bytes issued now
    /// (0 under a free model).
    fn write_deadline(&self, len: usize) -> u64 {
        if self.free {
            return 0;
        }
        let t = self.clock.now();
        let wire = self.tx.reserve(t, self.model.serialization_ns(len));
        wire.saturating_add(2 * self.lat)
    }

    /// Completion time of an atomic issued now.
    fn atomic_deadline(&self) -> u64 {
        self.write_deadline(ATOMIC_BYTES)
    }

    /// An asynchronous operation to `rank` that completes at `deadline`:
    /// noted for flushes, and deferred to the timer unless already due.
    fn defer(&self, rank: usize, inner: Request<U>, deadline: u64) -> Request<U> {
        if deadline == 0 {
            return inner;
        }
        self.outstanding[rank].fetch_max(deadline, Ordering::Relaxed);
        if self.clock.now() >= deadline {
            return inner;
        }
        self.timer
            .get_or_init(|| Timer::start(self.clock))
            .defer(inner, deadline)
    }
}

impl<C: Comm, U: UltItf> Comm for NetCom<C, U> {
    #[inline]
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    #[inline]
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn traffic(&self) -> Option<Traffic> {
        Some(self.counters.snapshot(self.model))
    }
}

impl<C: Windows, U: UltItf> Windows for NetCom<C, U> {
    fn create_window(&self, bytes: usize) -> Result<WindowId> {
        let id = self.inner.create_window(bytes)?;
        add(&self.counters.window_ops, 1);
        self.wait_for(self.collective_rounds(0));
        Ok(id)
    }
    fn destroy_window(&self, id: WindowId) -> Result<()> {
        self.inner.destroy_window(id)?;
        add(&self.counters.window_ops, 1);
        self.wait_for(self.collective_rounds(0));
        Ok(())
    }
    fn local_window(&self, id: WindowId) -> Result<LocalWindow> {
        self.inner.local_window(id)
    }
    fn window_size(&self, id: WindowId) -> Result<usize> {
        self.inner.window_size(id)
    }
}

impl<C: Rma<Request = Request<U>>, U: UltItf> NetCom<C, U> {
    fn count_read(&self, len: usize) {
        add(&self.counters.reads, 1);
        add(&self.counters.read_bytes, len as u64);
    }
    fn count_write(&self, len: usize) {
        add(&self.counters.writes, 1);
        add(&self.counters.write_bytes, len as u64);
    }
    fn count_local(&self) {
        add(&self.counters.local_ops, 1);
    }

    /// A blocking atomic: the backend's, then the model's round trip.
    fn atomic(&self, target: RemotePtr, op: impl FnOnce(&C) -> Result<u64>) -> Result<u64> {
        if !self.remote(target.rank()) {
            self.count_local();
            return op(&self.inner);
        }
        let deadline = self.atomic_deadline();
        let v = op(&self.inner)?;
        add(&self.counters.atomics, 1);
        self.wait_until(deadline);
        Ok(v)
    }
}

impl<C: Rma<Request = Request<U>>, U: UltItf> Rma for NetCom<C, U> {
    type Request = Request<U>;

    unsafe fn read_nb(&self, src: RemotePtr, dst: *mut u8, len: usize) -> Result<Request<U>> {
        if !self.remote(src.rank()) {
            self.count_local();
            // SAFETY: the caller's contract, forwarded.
            return unsafe { self.inner.read_nb(src, dst, len) };
        }
        let deadline = self.read_deadline(len);
        // SAFETY: the caller's contract, forwarded; our request completes
        // no earlier than the backend's, and a flush of the rank waits for
        // both.
        let r = unsafe { self.inner.read_nb(src, dst, len) }?;
        self.count_read(len);
        Ok(self.defer(src.rank(), r, deadline))
    }

    unsafe fn write_nb(&self, dst: RemotePtr, src: *const u8, len: usize) -> Result<Request<U>> {
        if !self.remote(dst.rank()) {
            self.count_local();
            // SAFETY: the caller's contract, forwarded.
            return unsafe { self.inner.write_nb(dst, src, len) };
        }
        let deadline = self.write_deadline(len);
        // SAFETY: the caller's contract, forwarded; our request completes
        // no earlier than the backend's.
        let r = unsafe { self.inner.write_nb(dst, src, len) }?;
        self.count_write(len);
        Ok(self.defer(dst.rank(), r, deadline))
    }

    fn compare_and_swap_nb(
        &self,
        target: RemotePtr,
        expected: u64,
        new: u64,
    ) -> Result<Request<U>> {
        if !self.remote(target.rank()) {
            self.count_local();
            return self.inner.compare_and_swap_nb(target, expected, new);
        }
        let deadline = self.atomic_deadline();
        let r = self.inner.compare_and_swap_nb(target, expected, new)?;
        add(&self.counters.atomics, 1);
        Ok(self.defer(target.rank(), r, deadline))
    }

    fn fetch_add_nb(&self, target: RemotePtr, delta: u64) -> Result<Request<U>> {
        if !self.remote(target.rank()) {
            self.count_local();
            return self.inner.fetch_add_nb(target, delta);
        }
        let deadline = self.atomic_deadline();
        let r = self.inner.fetch_add_nb(target, delta)?;
        add(&self.counters.atomics, 1);
        Ok(self.defer(target.rank(), r, deadline))
    }

    fn flush(&self, rank: usize) -> Result<()> {
        self.inner.flush(rank)?;
        if !self.remote(rank) {
            self.count_local();
            return Ok(());
        }
        add(&self.counters.flushes, 1);
        if let Some(o) = self.outstanding.get(rank) {
            self.wait_until(o.load(Ordering::Relaxed));
        }
        Ok(())
    }

    fn flush_all(&self) -> Result<()> {
        self.inner.flush_all()?;
        add(&self.counters.flushes, 1);
        let last = self
            .outstanding
            .iter()
            .map(|o| o.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        self.wait_until(last);
        Ok(())
    }

    fn read(&self, src: RemotePtr, dst: &mut [u8]) -> Result<()> {
        if !self.remote(src.rank()) {
            self.count_local();
            return self.inner.read(src, dst);
        }
        let deadline = self.read_deadline(dst.len());
        self.inner.read(src, dst)?;
        self.count_read(dst.len());
        self.wait_until(deadline);
        Ok(())
    }

    fn write(&self, dst: RemotePtr, src: &[u8]) -> Result<()> {
        if !self.remote(dst.rank()) {
            self.count_local();
            return self.inner.write(dst, src);
        }
        let deadline = self.write_deadline(src.len());
        self.inner.write(dst, src)?;
        self.count_write(src.len());
        self.wait_until(deadline);
        Ok(())
    }

    fn compare_and_swap(&self, target: RemotePtr, expected: u64, new: u64) -> Result<u64> {
        self.atomic(target, |c| c.compare_and_swap(target, expected, new))
    }

    fn fetch_add(&self, target: RemotePtr, delta: u64) -> Result<u64> {
        self.atomic(target, |c| c.fetch_add(target, delta))
    }

    fn atomic_load(&self, target: RemotePtr) -> Result<u64> {
        self.atomic(target, |c| c.atomic_load(target))
    }

    /// In flight together: each remote operation's model deadline from
    /// now (the link serialises their bytes), the backend's batch, then
    /// the latest deadline.
    fn compare_and_swap_all(&self, ops: &mut [CasOp]) -> Result<()> {
        let last = self.batch_deadline(ops, &[]);
        self.inner.compare_and_swap_all(ops)?;
        self.wait_until(last);
        Ok(())
    }

    /// As [`Self::compare_and_swap_all`], for reads.
    fn read_all(&self, reads: &mut [(RemotePtr, &mut [u8])]) -> Result<()> {
        let last = self.batch_deadline(&[], reads);
        self.inner.read_all(reads)?;
        self.wait_until(last);
        Ok(())
    }

    /// As [`Self::compare_and_swap_all`], for the swaps and the reads
    /// together: a read goes out with the swaps to its process (one round
    /// trip for both, as on the served mpi backend).
    fn compare_and_swap_then_read_all(
        &self,
        ops: &mut [CasOp],
        reads: &mut [(RemotePtr, &mut [u8])],
    ) -> Result<()> {
        let last = self.batch_deadline(ops, reads);
        self.inner.compare_and_swap_then_read_all(ops, reads)?;
        self.wait_until(last);
        Ok(())
    }
}

impl<C: Rma<Request = Request<U>>, U: UltItf> NetCom<C, U> {
    /// Counts a batch of swaps and reads issued now and returns the model
    /// deadline of the last of them (all in flight together).
    fn batch_deadline(&self, ops: &[CasOp], reads: &[(RemotePtr, &mut [u8])]) -> u64 {
        let mut last = 0;
        for op in ops {
            if self.remote(op.target.rank()) {
                last = last.max(self.atomic_deadline());
                add(&self.counters.atomics, 1);
            } else {
                self.count_local();
            }
        }
        for (src, dst) in reads {
            if self.remote(src.rank()) {
                last = last.max(self.read_deadline(dst.len()));
                self.count_read(dst.len());
            } else {
                self.count_local();
            }
        }
        last
    }
}

impl<C: P2p, U: UltItf> NetCom<C, U> {
    fn count_received(&self, len: usize) {
        add(&self.counters.msgs_received, 1);
        add(&self.counters.msg_bytes_received, len as u64);
    }
}

impl<C: P2p, U: UltItf> P2p for NetCom<C, U> {
    fn max_message_bytes(&self) -> usize {
        self.inner.max_message_bytes()
    }

    fn send(&self, to: usize, tag: Tag, data: &[u8]) -> Result<()> {
        if !self.free && self.remote(to) && to < self.inner.size() {
            let t = self.clock.now();
            let wire = self.tx.reserve(t, self.model.serialization_ns(data.len()));
            self.wait_until(wire.saturating_add(self.lat));
        }
        self.inner.send(to, tag, data)?;
        add(&self.counters.msgs_sent, 1);
        add(&self.counters.msg_bytes_sent, data.len() as u64);
        Ok(())
    }

    fn try_recv(&self, from: Source, tag: Tag) -> Result<Option<(usize, Vec<u8>)>> {
        let r = self.inner.try_recv(from, tag)?;
        if let Some((_, m)) = &r {
            self.count_received(m.len());
        }
        Ok(r)
    }

    fn recv(&self, from: Source, tag: Tag) -> Result<(usize, Vec<u8>)> {
        let r = self.inner.recv(from, tag)?;
        self.count_received(r.1.len());
        Ok(r)
    }

    fn recv_into(&self, from: Source, tag: Tag, buf: &mut [u8]) -> Result<(usize, usize)> {
        let r = self.inner.recv_into(from, tag, buf)?;
        self.count_received(r.1);
        Ok(r)
    }
}

impl<C: Coll, U: UltItf> Coll for NetCom<C, U> {
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()?;
        add(&self.counters.barriers, 1);
        self.wait_for(self.collective_rounds(0));
        Ok(())
    }

    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        self.inner.broadcast(root, buf)?;
        add(&self.counters.broadcasts, 1);
        if root == self.inner.rank() {
            add(&self.counters.coll_bytes, buf.len() as u64);
        }
        self.wait_for(self.collective_rounds(buf.len()));
        Ok(())
    }

    fn allgather_into(&self, src: &[u8], dst: &mut [u8]) -> Result<()> {
        self.inner.allgather_into(src, dst)?;
        self.allgathered(src.len());
        Ok(())
    }

    fn allgather_prefix_into(
        &self,
        src: &[u8],
        head: usize,
        used: &dyn Fn(&[u8]) -> usize,
        dst: &mut [u8],
    ) -> Result<()> {
        self.inner.allgather_prefix_into(src, head, used, dst)?;
        // Modelled as the whole records travelling, as they would on a
        // network.
        self.allgathered(src.len());
        Ok(())
    }
}

impl<C: Coll, U: UltItf> NetCom<C, U> {
    /// Counts an allgather of records of `len` bytes and waits for its
    /// modelled time.
    fn allgathered(&self, len: usize) {
        add(&self.counters.allgathers, 1);
        add(&self.counters.coll_bytes, len as u64);
        let n = self.inner.size();
        let ns = NetModel::rounds(n)
            .saturating_mul(self.lat)
            .saturating_add((n as u64 - 1).saturating_mul(self.model.serialization_ns(len)));
        self.wait_for(ns);
    }
}

// ---------------------------------------------------------------------------
// The timer of asynchronous operations.

/// A backend request held until its modelled completion.
struct Deferred<U: UltItf> {
    deadline: u64,
    seq: u64,
    inner: Request<U>,
    done: Completer<U>,
}

impl<U: UltItf> PartialEq for Deferred<U> {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl<U: UltItf> Eq for Deferred<U> {}
impl<U: UltItf> PartialOrd for Deferred<U> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl<U: UltItf> Ord for Deferred<U> {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

struct TimerQueue<U: UltItf> {
    heap: BinaryHeap<Reverse<Deferred<U>>>,
    seq: u64,
    closed: bool,
}

struct TimerShared<U: UltItf> {
    queue: Mutex<TimerQueue<U>>,
    wake: Condvar,
    clock: Clock,
}

/// The thread that completes deferred requests at their modelled time
/// (an OS thread of its own, never a worker: it may sleep).
struct Timer<U: UltItf> {
    shared: Arc<TimerShared<U>>,
}

impl<U: UltItf> fmt::Debug for Timer<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timer").finish_non_exhaustive()
    }
}

/// Below this much time left the timer thread stops sleeping on its
/// condition variable (whose wake-ups are late by the timer slack, about
/// 50 µs) and backs off instead.
const TIMER_SLEEP_MARGIN_NS: u64 = 100_000;

impl<U: UltItf> Timer<U> {
    fn start(clock: Clock) -> Self {
        let shared = Arc::new(TimerShared {
            queue: Mutex::new(TimerQueue {
                heap: BinaryHeap::new(),
                seq: 0,
                closed: false,
            }),
            wake: Condvar::new(),
            clock,
        });
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("menps-netmodel".into())
            .spawn(move || Self::run(&s));
        if let Err(e) = spawned {
            // Without the thread, deferred requests complete with an error
            // (their completers are dropped by `defer`).
            log::error!("menps: cannot start the network model's timer thread: {e}");
            shared
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .closed = true;
        }
        Timer { shared }
    }

    fn defer(&self, inner: Request<U>, deadline: u64) -> Request<U> {
        let (outer, done) = Request::pending();
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed {
            // No thread: complete at once rather than never.
            drop(q);
            inner.on_complete(move |v| done.complete(v));
            return outer;
        }
        let seq = q.seq;
        q.seq += 1;
        let first = q.heap.peek().is_none_or(|Reverse(e)| deadline < e.deadline);
        q.heap.push(Reverse(Deferred {
            deadline,
            seq,
            inner,
            done,
        }));
        drop(q);
        if first {
            self.shared.wake.notify_one();
        }
        outer
    }

    fn run(s: &TimerShared<U>) {
        let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
        let mut backoff = Backoff::parking(YIELDS_BEFORE_PARK);
        loop {
            let Some(Reverse(first)) = q.heap.peek() else {
                if q.closed {
                    return;
                }
                q = s.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                continue;
            };
            let now = s.clock.now();
            if first.deadline <= now {
                let Reverse(e) = q.heap.pop().expect("peeked");
                drop(q);
                let done = e.done;
                e.inner.on_complete(move |v| done.complete(v));
                backoff.reset();
                q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let left = first.deadline - now;
            if left > TIMER_SLEEP_MARGIN_NS {
                let sleep = Duration::from_nanos(left - TIMER_SLEEP_MARGIN_NS);
                q = s
                    .wake
                    .wait_timeout(q, sleep)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            } else {
                drop(q);
                if left <= SPIN_NS {
                    core::hint::spin_loop();
                } else {
                    backoff.snooze(std::thread::yield_now);
                }
                q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

impl<U: UltItf> Drop for Timer<U> {
    fn drop(&mut self) {
        // The thread completes what it holds at the modelled times, then
        // ends.
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed = true;
        self.shared.wake.notify_one();
    }
}

// ---------------------------------------------------------------------------
// Switching it on from the environment.

impl<U: UltItf> AnyCom<U> {
    /// `self` wrapped in a [`NetCom`] if the environment asks for it:
    /// `MENPS_NET_LATENCY` or `MENPS_NET_BANDWIDTH` set (the model), or
    /// `MENPS_STATS` true (a free model, for the counters); `self` as it is
    /// otherwise. A malformed variable is [`Error::BadConfig`] naming it.
    pub fn with_env_net_model(self) -> Result<Self> {
        if matches!(self, AnyCom::Net(_)) {
            return Ok(self);
        }
        let bad = |e: ct_config::Error| Error::BadConfig(e.to_string());
        let model = NetModel::from_env().map_err(bad)?;
        let stats = vars::MENPS_STATS.flag().map_err(bad)?.unwrap_or(false);
        Ok(match model {
            Some(m) => AnyCom::Net(Box::new(NetCom::new(self, m))),
            None if stats => AnyCom::Net(Box::new(NetCom::new(self, NetModel::default()))),
            None => self,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::com::ShmCom;
    use ct_worker::OsThreads;

    type Net = NetCom<ShmCom<OsThreads>, OsThreads>;

    fn single(model: NetModel) -> Net {
        NetCom::new(ShmCom::single().unwrap(), model).delaying_self()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn costs() {
        let m = NetModel {
            latency: Duration::from_micros(25),
            bandwidth: Some(10_000_000_000),
        };
        // 1 MiB at 10 Gb/s: 838861 ns (rounded up).
        assert_eq!(m.serialization_ns(1 << 20), 838_861);
        assert_eq!(m.serialization_ns(0), 0);
        assert_eq!(NetModel::default().serialization_ns(1 << 30), 0);
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9].map(NetModel::rounds),
            [0, 1, 2, 2, 3, 3, 4]
        );
        assert!(NetModel::default().is_free());
        assert!(!m.is_free());
        assert_eq!(m.to_string(), "latency_us=25 bandwidth_gbit=10");
    }

    #[test]
    fn links_queue_transfers() {
        let l = Link::default();
        assert_eq!(l.reserve(100, 50), 150);
        // Busy until 150: the next transfer starts then.
        assert_eq!(l.reserve(120, 50), 200);
        // Idle again later.
        assert_eq!(l.reserve(1000, 10), 1010);
        assert_eq!(l.reserve(5, 0), 5);
    }

    #[test]
    fn blocking_operations_take_their_modelled_time() {
        let com = single(NetModel {
            latency: ms(2),
            bandwidth: None,
        });
        let w = com.create_window(4096).unwrap();
        let t = Instant::now();
        com.write(w.at(0, 0), b"hello").unwrap();
        assert!(t.elapsed() >= ms(4), "write: {:?}", t.elapsed());
        let t = Instant::now();
        let mut b = [0u8; 5];
        com.read(w.at(0, 0), &mut b).unwrap();
        assert!(t.elapsed() >= ms(4), "read: {:?}", t.elapsed());
        assert_eq!(&b, b"hello");
        let t = Instant::now();
        assert_eq!(com.fetch_add(w.at(0, 8), 3), Ok(0));
        assert_eq!(com.compare_and_swap(w.at(0, 8), 3, 5), Ok(3));
        assert!(t.elapsed() >= ms(8), "2 atomics: {:?}", t.elapsed());
        let t = Instant::now();
        com.send(0, 1, b"m").unwrap();
        assert!(t.elapsed() >= ms(2), "send: {:?}", t.elapsed());
        assert_eq!(com.recv(Source::Any, 1).unwrap(), (0, b"m".to_vec()));
        // One process: collectives have no rounds.
        let before = com.traffic().unwrap();
        com.barrier().unwrap();
        assert_eq!(com.traffic().unwrap().since(&before).delay_ns, 0);
        let tr = com.traffic().unwrap();
        assert_eq!(
            (
                tr.reads,
                tr.read_bytes,
                tr.writes,
                tr.write_bytes,
                tr.atomics
            ),
            (1, 5, 1, 5, 2)
        );
        assert_eq!((tr.msgs_sent, tr.msgs_received, tr.barriers), (1, 1, 1));
        // 18 ms modelled, less the time of the backend's own operations,
        // which overlaps (well under 1 ms on shm).
        assert!(tr.delay_ns >= 17_000_000, "{tr}");
        com.destroy_window(w).unwrap();
    }

    #[test]
    fn without_delaying_self_local_operations_are_free() {
        let com: Net = NetCom::new(
            ShmCom::single().unwrap(),
            NetModel {
                latency: Duration::from_secs(10),
                bandwidth: None,
            },
        );
        let w = com.create_window(4096).unwrap();
        com.write(w.at(0, 0), b"x").unwrap();
        com.fetch_add(w.at(0, 8), 1).unwrap();
        com.flush(0).unwrap();
        let tr = com.traffic().unwrap();
        assert_eq!((tr.writes, tr.atomics, tr.local_ops), (0, 0, 3));
        assert_eq!(tr.delay_ns, 0);
    }

    #[test]
    fn bandwidth_caps_transfers() {
        // 800 Mbit/s: 1 MiB takes 10.49 ms.
        let com = single(NetModel {
            latency: Duration::ZERO,
            bandwidth: Some(800_000_000),
        });
        let w = com.create_window(1 << 20).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let t = Instant::now();
        com.read(w.at(0, 0), &mut buf).unwrap();
        assert!(
            t.elapsed() >= Duration::from_micros(10_485),
            "{:?}",
            t.elapsed()
        );
        // Two writes queue on the outgoing link: 2 x 10.49 ms.
        let t = Instant::now();
        // SAFETY: `buf` outlives the requests, which are waited for.
        let (a, b) = unsafe {
            (
                com.write_nb(w.at(0, 0), buf.as_ptr(), buf.len()).unwrap(),
                com.write_nb(w.at(0, 0), buf.as_ptr(), buf.len()).unwrap(),
            )
        };
        a.wait().unwrap();
        b.wait().unwrap();
        assert!(
            t.elapsed() >= Duration::from_micros(20_971),
            "{:?}",
            t.elapsed()
        );
        com.destroy_window(w).unwrap();
    }

    #[test]
    fn asynchronous_operations_complete_at_their_modelled_time() {
        let com = single(NetModel {
            latency: ms(3),
            bandwidth: None,
        });
        let w = com.create_window(4096).unwrap();
        let t = Instant::now();
        let r = com.fetch_add_nb(w.at(0, 0), 7).unwrap();
        // The request is not complete before its 6 ms.
        // (Completion looked at first: if it was complete, at least 6 ms
        // had passed, and so have they when `early` is computed.)
        let complete = r.is_complete();
        let early = t.elapsed() < ms(5);
        assert!(!(early && complete), "complete after {:?}", t.elapsed());
        assert_eq!(r.wait(), Ok(0));
        assert!(t.elapsed() >= ms(6), "{:?}", t.elapsed());
        // Several outstanding operations overlap.
        let t = Instant::now();
        let rs: Vec<_> = (0..4)
            .map(|_| com.fetch_add_nb(w.at(0, 0), 1).unwrap())
            .collect();
        for r in rs {
            r.wait().unwrap();
        }
        assert!(t.elapsed() >= ms(6), "{:?}", t.elapsed());
        // A callback runs once the modelled time is up.
        let (tx, rx) = std::sync::mpsc::channel();
        let t = Instant::now();
        com.fetch_add_nb(w.at(0, 0), 1)
            .unwrap()
            .on_complete(move |v| tx.send((v, t.elapsed())).unwrap());
        let (v, took) = rx.recv().unwrap();
        assert_eq!(v, Ok(11));
        assert!(took >= ms(6), "{took:?}");
        // A write is complete at the flush, and charged once.
        let t = Instant::now();
        // SAFETY: a static source, complete after the flush.
        let r = unsafe { com.write_nb(w.at(0, 16), b"abc".as_ptr(), 3) }.unwrap();
        com.flush(0).unwrap();
        assert!(t.elapsed() >= ms(6), "{:?}", t.elapsed());
        assert_eq!(r.wait(), Ok(0));
        // Nothing outstanding: flushes wait for nothing.
        let before = com.traffic().unwrap();
        com.flush(0).unwrap();
        com.flush_all().unwrap();
        let d = com.traffic().unwrap().since(&before);
        assert_eq!((d.flushes, d.delay_ns), (2, 0));
        com.destroy_window(w).unwrap();
    }
}
