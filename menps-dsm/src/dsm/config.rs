//! DSM configuration: protocol policies and sizes, from a builder and the
//! environment.
//!
//! Every setting comes from, in this order of precedence: a value given to
//! [`DsmConfigBuilder`] by the program; otherwise its `MENPS_DSM_*`
//! variable (read by `ct-config`'s parser; the README's table lists them);
//! otherwise the default ([`DsmConfig::default`], or the defaults an
//! embedding runtime gives [`DsmConfigBuilder::defaults`]). The environment
//! no longer overrides the program's values.
//!
//! ```
//! use menps_dsm::dsm::{DsmConfig, WriterPolicy};
//! // The program's choice stands whatever MENPS_DSM_WRITER says.
//! let cfg = DsmConfig::builder().writer(WriterPolicy::Fixed).build().unwrap();
//! assert_eq!(cfg.writer, WriterPolicy::Fixed);
//! ```

use ct_config::vars;

use super::error::{DsmError, DsmResult};

/// Smallest block size.
pub const MIN_BLOCK_SIZE: usize = 4096;
/// Largest block size.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

/// What the DSM does when a merge finds a write-write race (two processes
/// changed the same byte since the version both started from: the program
/// is not data-race-free).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RaceAction {
    /// The DSM fails (fail-stop) with the race's report as its error.
    Stop,
    /// Each racing word is reported once on stderr, with where it lies (a
    /// symbol, a heap object, a call stack) and the two processes; the
    /// merging process's value is kept and the run goes on.
    Report,
}

/// Who merges the writes of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriterPolicy {
    /// MENPS's floating home: every transaction migrates the block to the
    /// process that ran it, found through probable-owner links of a
    /// distributed queue lock; the lock-associated data travels with the lock.
    Floating,
    /// A fixed home per block (block-cyclic over the processes): releasers
    /// write their changed runs into the home's copy under the home's lock.
    /// For comparison only: a process that reads a block while its home is
    /// rewriting it can keep a state from the middle of the rewrite, if the
    /// rewrite ends on the values the home had published (nothing is then
    /// announced); the floating home reads what was published.
    Fixed,
}

/// How stale copies are found at acquires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidationPolicy {
    /// MENPS's hybrid: per-block logical leases plus a bounded write-notice
    /// list carried by signatures (truncation raises the minimum write
    /// timestamp).
    Hybrid,
    /// Logical leases only: a signature carries just the largest write
    /// timestamp, and an acquirer drops every copy whose lease is older.
    Timestamp,
    /// A sharer set per block in the lock-associated data; a written release
    /// posts invalidations to the sharers, which apply them at their next
    /// acquire.
    Directory,
}

/// The protocol and size settings of a DSM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsmConfig {
    /// Writer management.
    pub writer: WriterPolicy,
    /// Invalidation method.
    pub invalidation: InvalidationPolicy,
    /// Fast release (floating home only).
    pub fast_release: bool,
    /// Fast read (hybrid invalidation only). It turns idle releases off
    /// (a block unchanged since its last fast release is announced again:
    /// a fast reader, which bypasses the block's lock, may hold a state the
    /// writer overwrote and restored since), so it is off by default.
    pub fast_read: bool,
    /// Sequential prefetch: the most bytes of blocks a read miss that
    /// continues a run of misses in its segment fetches ahead of it (whole
    /// blocks; 0, or less than a segment's block size, turns it off there).
    pub prefetch_bytes: usize,
    /// Partial reads: a read miss that starts no sequential run, on a
    /// clean block of more than one page (at most 64 pages), fetches only
    /// the page it touched; the copy is readable there only, and a miss on
    /// any other page of it fetches the whole block anew (one version, one
    /// lease). A 4 KiB read of a 32 KiB block then moves 4 KiB, not 32.
    pub partial_reads: bool,
    /// Dirty scans: where the kernel keeps a record of writes to the
    /// application view (Linux 6.7 and later: `userfaultfd` asynchronous
    /// write protection and the `PAGEMAP_SCAN` ioctl), a release fence asks
    /// it which listed blocks were written instead of comparing every
    /// idle block with its twin. Elsewhere (and for call stacks) releases
    /// compare, as with this off.
    pub dirty_scan: bool,
    /// The smallest write set (bytes of listed blocks on segments the
    /// kernel tracks) for which a release fence makes dirty scans; a
    /// smaller one is compared. In the cache, comparing an idle block
    /// costs less than the scan's system call, and a scan leaves the pages
    /// it covers write-protected, so the next write to each takes a fault
    /// in the kernel: a code that rewrites a few arrays between frequent
    /// barriers would pay that fault on almost every page at every barrier.
    /// 0: every fence with listed blocks scans.
    pub dirty_scan_min: usize,
    /// Refresh of hot blocks: a block whose copy an acquire dropped and the
    /// program then read again is *hot*; the next this many acquires that
    /// find its copy stale fetch the new version into it in place (all of
    /// an acquire's hot blocks in one batch, the copy staying readable)
    /// instead of dropping it, which saves the fault and the miss. Then it
    /// is dropped once, and becomes hot again only if it is read again. 0:
    /// off.
    pub refreshes: u8,
    /// Pinning of write-shared blocks: a block that this process writes
    /// again, each time after another process wrote it (the boundary block
    /// two processes' halves of an array share, data handed on from phase
    /// to phase), is pinned after a few such rounds — kept writable, the
    /// other processes' changes merged into it in place at acquires — which
    /// saves a write fault and the protection changes around it every
    /// round (a copy found stale again and again before this process
    /// touches it is merged at its next access instead); releases that
    /// find it unchanged for a while unpin it. Floating
    /// writer policy, hybrid or timestamp invalidation; call stacks are
    /// pinned anyway.
    pub pin_shared: bool,
    /// Write-write race detection while merging.
    pub race_detection: bool,
    /// What a detected race does.
    pub on_race: RaceAction,
    /// Default block size of segments.
    pub block_size: usize,
    /// Write notices kept by a signature (hybrid).
    pub wn_list_len: usize,
    /// Logical lease.
    pub lease: u64,
    /// Size of the heap segment (0: no heap).
    pub heap_size: usize,
    /// Block size of the heap segment.
    pub heap_block_size: usize,
    /// Mutexes that can exist at once.
    pub max_mutexes: usize,
    /// Size of one call stack of the stack region (one block).
    pub stack_size: usize,
    /// Call stacks per process (0: no stack region).
    pub stacks_per_process: usize,
    /// Consecutive written transactions after which a writable block is
    /// protected again at release (the original's `WR_COUNT_THRESHOLD`).
    pub wr_count_threshold: u32,
    /// Largest number of consecutive fast releases of a block.
    pub max_fast_releases: u32,
    /// Print this process's protocol counters ([`StatsSnapshot`](super::StatsSnapshot))
    /// to standard error when the DSM is finalized (`MENPS_STATS`).
    pub print_stats: bool,
}

impl Default for DsmConfig {
    fn default() -> Self {
        DsmConfig {
            writer: WriterPolicy::Floating,
            invalidation: InvalidationPolicy::Hybrid,
            fast_release: true,
            fast_read: false,
            prefetch_bytes: 256 * 1024,
            partial_reads: true,
            dirty_scan: true,
            dirty_scan_min: 1 << 20,
            refreshes: 8,
            pin_shared: true,
            race_detection: true,
            on_race: RaceAction::Stop,
            block_size: 32 * 1024,
            wn_list_len: 1024,
            lease: 10,
            heap_size: 1 << 30,
            heap_block_size: 4096,
            max_mutexes: 1024,
            stack_size: 128 * 1024,
            stacks_per_process: 32,
            wr_count_threshold: 2,
            max_fast_releases: 64,
            print_stats: false,
        }
    }
}

/// Largest write-notice list a signature may keep.
pub const MAX_WN_LIST: usize = 1 << 16;
/// Largest number of mutexes.
pub const MAX_MUTEXES: usize = 1 << 16;
/// Largest number of processes the directory policy supports (one bit each).
pub const MAX_DIRECTORY_PROCS: usize = 64;

/// Builds a [`DsmConfig`]: values given here win over the `MENPS_DSM_*`
/// variables, which win over the defaults (see the [module docs](self)).
#[derive(Debug, Clone, Default)]
pub struct DsmConfigBuilder {
    base: DsmConfig,
    writer: Option<WriterPolicy>,
    invalidation: Option<InvalidationPolicy>,
    fast_release: Option<bool>,
    fast_read: Option<bool>,
    prefetch_bytes: Option<usize>,
    partial_reads: Option<bool>,
    dirty_scan: Option<bool>,
    dirty_scan_min: Option<usize>,
    refreshes: Option<u8>,
    pin_shared: Option<bool>,
    race_detection: Option<bool>,
    print_stats: Option<bool>,
    on_race: Option<RaceAction>,
    block_size: Option<usize>,
    wn_list_len: Option<usize>,
    lease: Option<u64>,
    heap_size: Option<usize>,
    heap_block_size: Option<usize>,
    max_mutexes: Option<usize>,
    stack_size: Option<usize>,
    stacks_per_process: Option<usize>,
}

macro_rules! setters {
    ($($(#[$doc:meta])* $field:ident: $ty:ty,)*) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, v: $ty) -> Self {
                self.$field = Some(v);
                self
            }
        )*
    };
}

impl DsmConfigBuilder {
    /// The defaults the environment overrides (an embedding runtime's
    /// tuning; [`DsmConfig::default`] without this call). Fields without an
    /// environment variable (`wr_count_threshold`, `max_fast_releases`) are
    /// taken from here as they are.
    pub fn defaults(mut self, base: DsmConfig) -> Self {
        self.base = base;
        self
    }

    setters! {
        /// Writer management (wins over `MENPS_DSM_WRITER`).
        writer: WriterPolicy,
        /// Invalidation method (wins over `MENPS_DSM_INVALIDATION`).
        invalidation: InvalidationPolicy,
        /// Fast release (wins over `MENPS_DSM_FAST_RELEASE`).
        fast_release: bool,
        /// Fast read (wins over `MENPS_DSM_FAST_READ`).
        fast_read: bool,
        /// Sequential prefetch window in bytes, 0: off (wins over
        /// `MENPS_DSM_PREFETCH`).
        prefetch_bytes: usize,
        /// Partial reads of blocks larger than a page (wins over
        /// `MENPS_DSM_PARTIAL_READ`).
        partial_reads: bool,
        /// Dirty scans instead of idle comparisons where the kernel allows
        /// (wins over `MENPS_DSM_DIRTY_SCAN`).
        dirty_scan: bool,
        /// The smallest write set a release fence scans, in bytes (wins
        /// over `MENPS_DSM_DIRTY_SCAN_MIN`).
        dirty_scan_min: usize,
        /// Acquires that refresh a hot block in place, 0: off (wins over
        /// `MENPS_DSM_REFRESH`).
        refreshes: u8,
        /// Pinning of write-shared blocks (wins over `MENPS_DSM_PIN_SHARED`).
        pin_shared: bool,
        /// Race detection (wins over `MENPS_DSM_RACE_DETECTION`).
        race_detection: bool,
        /// Protocol counters printed at the end (wins over `MENPS_STATS`).
        print_stats: bool,
        /// What a detected race does (wins over `MENPS_DSM_ON_RACE`).
        on_race: RaceAction,
        /// Default block size of segments (wins over `MENPS_DSM_BLOCK_SIZE`).
        block_size: usize,
        /// Write notices a signature keeps (wins over `MENPS_DSM_WN_LIST`).
        wn_list_len: usize,
        /// Logical lease (wins over `MENPS_DSM_LEASE`).
        lease: u64,
        /// Heap size (wins over `MENPS_DSM_HEAP_SIZE`).
        heap_size: usize,
        /// Heap block size (wins over `MENPS_DSM_HEAP_BLOCK_SIZE`).
        heap_block_size: usize,
        /// Mutexes that can exist at once (wins over `MENPS_DSM_MUTEXES`).
        max_mutexes: usize,
        /// Size of a call stack (wins over `MENPS_DSM_STACK_SIZE`).
        stack_size: usize,
        /// Call stacks per process (wins over `MENPS_DSM_STACKS`).
        stacks_per_process: usize,
    }

    /// The configuration: each setting from this builder, else its
    /// variable, else the default. Errors: a malformed variable (named,
    /// with the accepted forms). [`DsmConfig::validate`] checks the
    /// combination later.
    pub fn build(self) -> DsmResult<DsmConfig> {
        let b = self.base;
        let env = |e: ct_config::Error| DsmError::Config(e.to_string());
        fn pick<T>(
            given: Option<T>,
            read: impl FnOnce() -> Result<Option<T>, ct_config::Error>,
            default: T,
        ) -> DsmResult<T> {
            ct_config::pick(given, read, || default)
                .map(|(v, _)| v)
                .map_err(|e| DsmError::Config(e.to_string()))
        }
        Ok(DsmConfig {
            writer: ct_config::pick(
                self.writer,
                || {
                    Ok(vars::MENPS_DSM_WRITER.choice()?.map(|c| match c {
                        "fixed" => WriterPolicy::Fixed,
                        _ => WriterPolicy::Floating,
                    }))
                },
                || b.writer,
            )
            .map_err(env)?
            .0,
            invalidation: ct_config::pick(
                self.invalidation,
                || {
                    Ok(vars::MENPS_DSM_INVALIDATION.choice()?.map(|c| match c {
                        "timestamp" => InvalidationPolicy::Timestamp,
                        "directory" => InvalidationPolicy::Directory,
                        _ => InvalidationPolicy::Hybrid,
                    }))
                },
                || b.invalidation,
            )
            .map_err(env)?
            .0,
            on_race: ct_config::pick(
                self.on_race,
                || {
                    Ok(vars::MENPS_DSM_ON_RACE.choice()?.map(|c| match c {
                        "report" => RaceAction::Report,
                        _ => RaceAction::Stop,
                    }))
                },
                || b.on_race,
            )
            .map_err(env)?
            .0,
            fast_release: pick(
                self.fast_release,
                || vars::MENPS_DSM_FAST_RELEASE.flag(),
                b.fast_release,
            )?,
            fast_read: pick(
                self.fast_read,
                || vars::MENPS_DSM_FAST_READ.flag(),
                b.fast_read,
            )?,
            prefetch_bytes: pick(
                self.prefetch_bytes,
                || vars::MENPS_DSM_PREFETCH.size(),
                b.prefetch_bytes,
            )?,
            partial_reads: pick(
                self.partial_reads,
                || vars::MENPS_DSM_PARTIAL_READ.flag(),
                b.partial_reads,
            )?,
            dirty_scan: pick(
                self.dirty_scan,
                || vars::MENPS_DSM_DIRTY_SCAN.flag(),
                b.dirty_scan,
            )?,
            dirty_scan_min: pick(
                self.dirty_scan_min,
                || vars::MENPS_DSM_DIRTY_SCAN_MIN.size(),
                b.dirty_scan_min,
            )?,
            refreshes: pick(
                self.refreshes,
                || {
                    vars::MENPS_DSM_REFRESH
                        .count()
                        .map(|v| v.map(|n| u8::try_from(n).unwrap_or(u8::MAX)))
                },
                b.refreshes,
            )?,
            pin_shared: pick(
                self.pin_shared,
                || vars::MENPS_DSM_PIN_SHARED.flag(),
                b.pin_shared,
            )?,
            race_detection: pick(
                self.race_detection,
                || vars::MENPS_DSM_RACE_DETECTION.flag(),
                b.race_detection,
            )?,
            block_size: pick(
                self.block_size,
                || vars::MENPS_DSM_BLOCK_SIZE.size(),
                b.block_size,
            )?,
            wn_list_len: pick(
                self.wn_list_len,
                || vars::MENPS_DSM_WN_LIST.count_usize(),
                b.wn_list_len,
            )?,
            lease: pick(self.lease, || vars::MENPS_DSM_LEASE.count(), b.lease)?,
            heap_size: pick(
                self.heap_size,
                || vars::MENPS_DSM_HEAP_SIZE.size(),
                b.heap_size,
            )?,
            heap_block_size: pick(
                self.heap_block_size,
                || vars::MENPS_DSM_HEAP_BLOCK_SIZE.size(),
                b.heap_block_size,
            )?,
            max_mutexes: pick(
                self.max_mutexes,
                || vars::MENPS_DSM_MUTEXES.count_usize(),
                b.max_mutexes,
            )?,
            stack_size: pick(
                self.stack_size,
                || vars::MENPS_DSM_STACK_SIZE.size(),
                b.stack_size,
            )?,
            stacks_per_process: pick(
                self.stacks_per_process,
                || vars::MENPS_DSM_STACKS.count_usize(),
                b.stacks_per_process,
            )?,
            print_stats: pick(self.print_stats, || vars::MENPS_STATS.flag(), b.print_stats)?,
            wr_count_threshold: b.wr_count_threshold,
            max_fast_releases: b.max_fast_releases,
        })
    }
}

impl DsmConfig {
    /// A builder of the configuration (builder values > `MENPS_DSM_*`
    /// variables > defaults).
    pub fn builder() -> DsmConfigBuilder {
        DsmConfigBuilder::default()
    }

    /// The defaults with the `MENPS_DSM_*` variables applied (the same as
    /// `DsmConfig::builder().build()`).
    pub fn from_env() -> DsmResult<Self> {
        Self::builder().build()
    }

    /// Checks the settings and their combinations.
    pub fn validate(&self, nprocs: usize) -> DsmResult<()> {
        check_block_size(self.block_size)?;
        check_block_size(self.heap_block_size)?;
        if self.stacks_per_process > 0 {
            check_block_size(self.stack_size).map_err(|_| {
                DsmError::Config(format!(
                    "stack size {} is not a power of two between {MIN_BLOCK_SIZE} and \
                     {MAX_BLOCK_SIZE} (DSM call stacks are power-of-two slots)",
                    self.stack_size
                ))
            })?;
        }
        if self.wn_list_len > MAX_WN_LIST {
            return Err(DsmError::Config(format!(
                "write-notice list of {} entries is above the limit of {MAX_WN_LIST}",
                self.wn_list_len
            )));
        }
        if self.lease == 0 {
            return Err(DsmError::Config("the lease must be at least 1".into()));
        }
        if self.max_mutexes == 0 || self.max_mutexes > MAX_MUTEXES {
            return Err(DsmError::Config(format!(
                "number of mutexes must be in 1..={MAX_MUTEXES}, not {}",
                self.max_mutexes
            )));
        }
        if self.invalidation == InvalidationPolicy::Directory && nprocs > MAX_DIRECTORY_PROCS {
            return Err(DsmError::Config(format!(
                "the directory policy supports at most {MAX_DIRECTORY_PROCS} processes, the job \
                 has {nprocs}"
            )));
        }
        if nprocs > super::signature::MAX_PROCS {
            return Err(DsmError::Config(format!(
                "the DSM supports at most {} processes, the job has {nprocs}",
                super::signature::MAX_PROCS
            )));
        }
        if !self.heap_size.is_multiple_of(self.heap_block_size) {
            return Err(DsmError::Config(format!(
                "heap size {} is not a multiple of its block size {}",
                self.heap_size, self.heap_block_size
            )));
        }
        Ok(())
    }

    /// Whether fast release is in effect (it needs the floating home and
    /// leases).
    pub fn fast_release_active(&self) -> bool {
        self.fast_release
            && self.writer == WriterPolicy::Floating
            && self.invalidation != InvalidationPolicy::Directory
    }

    /// Whether fast read is in effect (it needs write notices).
    pub fn fast_read_active(&self) -> bool {
        self.fast_read && self.invalidation == InvalidationPolicy::Hybrid
    }

    /// Blocks of `block_size` bytes a sequential miss may fetch ahead of
    /// itself (0: no prefetch).
    pub fn prefetch_blocks(&self, block_size: usize) -> usize {
        self.prefetch_bytes / block_size
    }

    /// Write notices a signature keeps (0 under the timestamp policy).
    pub fn effective_wn_list_len(&self) -> usize {
        match self.invalidation {
            InvalidationPolicy::Hybrid => self.wn_list_len,
            InvalidationPolicy::Timestamp | InvalidationPolicy::Directory => 0,
        }
    }
}

/// Checks that `bs` is a valid block size.
pub fn check_block_size(bs: usize) -> DsmResult<()> {
    if !bs.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
        return Err(DsmError::Config(format!(
            "block size {bs} is not a power of two between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE}"
        )));
    }
    if bs < crate::sys::page_size() {
        return Err(DsmError::Config(format!(
            "block size {bs} is smaller than the page size {}",
            crate::sys::page_size()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_bad_values() {
        let ok = DsmConfig::default();
        ok.validate(4).unwrap();
        let bad = DsmConfig {
            block_size: 3000,
            ..DsmConfig::default()
        };
        assert!(bad.validate(2).is_err());
        let bad = DsmConfig {
            block_size: 2 << 20,
            ..DsmConfig::default()
        };
        assert!(bad.validate(2).is_err());
        let bad = DsmConfig {
            invalidation: InvalidationPolicy::Directory,
            ..DsmConfig::default()
        };
        assert!(bad.validate(65).is_err());
        let bad = DsmConfig {
            lease: 0,
            ..DsmConfig::default()
        };
        assert!(bad.validate(2).is_err());
    }

    #[test]
    fn policy_switches_combine() {
        let c = DsmConfig {
            writer: WriterPolicy::Fixed,
            fast_read: true,
            ..DsmConfig::default()
        };
        assert!(!c.fast_release_active());
        assert!(c.fast_read_active());
        let c = DsmConfig {
            invalidation: InvalidationPolicy::Timestamp,
            ..DsmConfig::default()
        };
        assert!(!c.fast_read_active());
        assert_eq!(c.effective_wn_list_len(), 0);
    }

    #[test]
    fn prefetch_window_in_blocks() {
        let c = DsmConfig::default();
        assert_eq!(c.prefetch_blocks(4096), 64);
        assert_eq!(c.prefetch_blocks(32 * 1024), 8);
        assert_eq!(c.prefetch_blocks(1 << 20), 0);
        let off = DsmConfig {
            prefetch_bytes: 0,
            ..DsmConfig::default()
        };
        assert_eq!(off.prefetch_blocks(4096), 0);
    }
}
