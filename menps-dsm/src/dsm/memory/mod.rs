//! The memory layer: one address map owns every shared address.
//!
//! Every process of a DSM job reserves the same address range at start-up
//! (from `DSM_BASE` = `0x1000_0000_0000` up); the **address map** hands out regions
//! of it, makes every process take the same decision (a collective check:
//! a region placed differently, or refused, in any process fails the call
//! in all of them before anything is mapped) and refuses overlaps. Its
//! clients:
//!
//! | region | created by | address |
//! |---|---|---|
//! | [`Segment`](RegionKind::Segment) | [`Dsm::alloc_segment`] | the next user slot |
//! | [`Heap`](RegionKind::Heap) | start-up (`heap_size > 0`) | a fixed runtime slot |
//! | [`Globals`](RegionKind::Globals) | start-up, when the program has [`dsm_global!`](crate::dsm_global)s | a fixed runtime slot |
//! | [`Stacks`](RegionKind::Stacks) | [`Dsm::create_stacks`] (by the first [`Team`](super::team::Team)) | a fixed runtime slot |
//! | [`ThreadLocal`](RegionKind::ThreadLocal) | [`Dsm::create_thread_local_blocks`] | a fixed runtime slot |
//! | [`Adopted`](RegionKind::Adopted) | [`Dsm::adopt_range`] | its own address |
//!
//! **Stacks** and **thread-local blocks** are [`SlotRegion`]s: equal slots,
//! each process owning a contiguous share, handed out without
//! communication. Stacks are made of 8 KiB coherence blocks, so a frame
//! that other processes read (`main`'s locals, a region's shared data)
//! moves by the block when it changes, not as a whole stack; below each
//! stack lies a guard of a stack's size that is never made accessible, so
//! an overflow ends the process with a message instead of corrupting the
//! next stack.
//!
//! An **adopted range** is memory the program already has — a `static`, or
//! a C executable's `.data`/`.bss` — kept at its own address: process 0's
//! contents at the time of the call become the shared initial image, every
//! other process's contents are replaced by it, and from then on the range
//! is DSM memory like any segment. After [`Dsm::finalize`] it is ordinary
//! private memory again, holding this process's last copy.
//!
//! ```
//! # // SAFETY: the first statement of a single-threaded program; a hung job
//! # // is killed after 120 s (this is a test).
//! # unsafe { std::env::set_var("MENPS_TIMEOUT_SECS", "120") };
//! use menps_dsm::dsm::Dsm;
//! use menps_dsm::com::ShmCom;
//! use ct_worker::OsThreads;
//!
//! #[repr(C, align(4096))]
//! struct Table([u64; 1024]);
//! static mut TABLE: Table = Table([0; 1024]);
//!
//! let com: ShmCom<OsThreads> = menps_dsm::launch::init_or_relaunch(2)?;
//! let dsm: Dsm<_> = Dsm::new(com)?;
//! let t = &raw mut TABLE;
//! dsm.adopt_range(t.cast(), size_of::<Table>(), 4096)?;
//! if dsm.rank() == 1 {
//!     // SAFETY: adopted DSM memory only process 1 writes before the barrier.
//!     unsafe { (*t).0[7] = 42 };
//! }
//! dsm.barrier()?;
//! // SAFETY: written before the barrier.
//! assert_eq!(unsafe { (*t).0[7] }, 42);
//! dsm.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod adopt;
pub mod map;
pub mod slots;

use std::sync::OnceLock;

use ct_worker::UltItf;

use crate::com::Communicator;

use super::Dsm;
use super::error::{DsmError, DsmResult};
use super::heap::Heap;
use super::space::Init;

pub use map::{MAX_ADOPTED, Region, RegionKind};
pub use slots::SlotRegion;

use map::Request;

/// Coherence block of the call-stack region: a page.
const STACK_BLOCK_BYTES: usize = 8192;

/// The memory-management state a [`Dsm`] holds: its heap, whether the
/// globals segment exists, and its slot regions.
pub(crate) struct MemState<U: UltItf> {
    pub(crate) heap: Option<Heap<U>>,
    pub(crate) globals: bool,
    pub(crate) stacks: OnceLock<SlotRegion>,
    pub(crate) tls: OnceLock<SlotRegion>,
}

impl<U: UltItf> Default for MemState<U> {
    fn default() -> Self {
        MemState {
            heap: None,
            globals: false,
            stacks: OnceLock::new(),
            tls: OnceLock::new(),
        }
    }
}

impl<U: UltItf> MemState<U> {
    /// The heap, or the error that there is none.
    pub(crate) fn heap(&self) -> DsmResult<&Heap<U>> {
        self.heap.as_ref().ok_or_else(|| {
            DsmError::OutOfMemory(
                "the DSM has no heap (heap_size is 0; set MENPS_DSM_HEAP_SIZE)".into(),
            )
        })
    }
}

impl<C: Communicator + 'static, U: UltItf> Dsm<C, U> {
    /// Sets up the heap and the globals (collective; called once by
    /// [`Dsm::with_config`]).
    pub(super) fn init_memory(&mut self) -> DsmResult<()> {
        if self.space.cfg.heap_size > 0 {
            self.mem.heap = Some(Heap::create(self.space)?);
        }
        self.mem.globals = super::globals::init(self.space)?;
        Ok(())
    }

    /// Collectively creates a slot region of `per_process` slots of
    /// `slot_size` bytes per process, in blocks of `block_size` bytes (a
    /// divisor of `slot_size`), and a guard of `slot_size` bytes before
    /// each slot if `guarded`.
    fn slot_region(
        &self,
        kind: RegionKind,
        slot_size: usize,
        block_size: usize,
        guarded: bool,
        per_process: usize,
    ) -> DsmResult<SlotRegion> {
        let req = super::config::check_block_size(slot_size)
            .and_then(|()| super::config::check_block_size(block_size))
            .and_then(|()| {
                let size = slot_size
                    .checked_mul(1 + usize::from(guarded))
                    .and_then(|s| s.checked_mul(per_process))
                    .and_then(|s| s.checked_mul(self.nprocs()))
                    .ok_or_else(|| DsmError::InvalidArgument(format!("{kind} too large")))?;
                Ok(Request {
                    kind,
                    size,
                    block_size: block_size.min(slot_size),
                    at: None,
                })
            });
        let region = self.space.create_region(req, Init::Zero)?;
        Ok(SlotRegion::new(
            region,
            slot_size,
            guarded,
            per_process,
            self.rank(),
            self.nprocs(),
        ))
    }

    /// Collectively makes `[addr, addr + len)` — memory this program already
    /// has, mapped readable and writable at the same address in every
    /// process (a `static`, an executable's `.data`/`.bss`) — DSM memory at
    /// that address, with blocks of `block_size` bytes. Process 0's current
    /// contents become everybody's; after [`Dsm::finalize`] the range is
    /// private memory again, holding this process's last copy.
    ///
    /// `addr` and `len` must be page-aligned and `len` a multiple of
    /// `block_size`; the range must not overlap the DSM's range or another
    /// adopted range, and no other thread may access it during the call.
    /// Holding Rust objects that are not plain data (pointers to process-local
    /// memory, locks of the standard library) in an adopted range is a bug.
    pub fn adopt_range(&self, addr: *mut u8, len: usize, block_size: usize) -> DsmResult<()> {
        let req = super::config::check_block_size(block_size).and_then(|()| {
            if !len.is_multiple_of(block_size) {
                return Err(DsmError::InvalidArgument(format!(
                    "an adopted range of {len} bytes is not a multiple of its block size \
                     {block_size}"
                )));
            }
            Ok(Request {
                kind: RegionKind::Adopted,
                size: len,
                block_size,
                at: Some(addr as usize),
            })
        });
        self.space.create_region(req, Init::FromRoot).map(drop)
    }

    /// The regions of the address map, in creation order (the same in
    /// every process).
    pub fn regions(&self) -> Vec<Region> {
        self.space.regions()
    }

    /// The call-stack region, once created ([`Dsm::create_stacks`]).
    pub fn stacks(&self) -> Option<&SlotRegion> {
        self.mem.stacks.get()
    }

    /// Collectively creates the call-stack region (`stacks_per_process`
    /// stacks of `stack_size` bytes per process, `MENPS_DSM_STACKS` and
    /// `MENPS_DSM_STACK_SIZE`), or returns it if it exists. Every process
    /// calls it, from one thread at a time (a [`Team`](super::team::Team)
    /// does, when it is created); programs without user-level threads on DSM
    /// stacks never pay for it.
    pub fn create_stacks(&self) -> DsmResult<&SlotRegion> {
        if let Some(s) = self.mem.stacks.get() {
            return Ok(s);
        }
        let (size, n) = (self.space.cfg.stack_size, self.space.cfg.stacks_per_process);
        let r = if n == 0 {
            // Refused in every process alike (the configuration is agreed).
            Err(DsmError::Config(
                "the DSM is configured without call stacks (MENPS_DSM_STACKS is 0)".into(),
            ))
        } else {
            // Stacks in small blocks: a thread's frame that others read
            // (main's locals, a region's shared data) moves by the page
            // when it changes, not as a whole stack.
            self.slot_region(RegionKind::Stacks, size, STACK_BLOCK_BYTES, true, n)
        }?;
        let stacks = self.mem.stacks.get_or_init(|| r);
        self.space.register_stacks(stacks);
        Ok(stacks)
    }

    /// Collectively creates the region of thread-local blocks: `per_process`
    /// blocks of `block_bytes` (a power of two, 4 KiB .. 1 MiB) per process.
    /// Once per DSM; see [`Dsm::thread_local_blocks`].
    pub fn create_thread_local_blocks(
        &self,
        block_bytes: usize,
        per_process: usize,
    ) -> DsmResult<&SlotRegion> {
        // A second call fails in the address map (the region exists), in
        // every process alike.
        let r = self.slot_region(
            RegionKind::ThreadLocal,
            block_bytes,
            block_bytes,
            false,
            per_process,
        )?;
        Ok(self.mem.tls.get_or_init(|| r))
    }

    /// The thread-local blocks, once created.
    pub fn thread_local_blocks(&self) -> Option<&SlotRegion> {
        self.mem.tls.get()
    }
}
