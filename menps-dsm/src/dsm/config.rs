//! DSM configuration: protocol policies and sizes, from a builder and the
//! environment.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `MENPS_DSM_WRITER` | writer management: `floating` (home = last releaser) or `fixed` (block-cyclic homes) | `floating` |
//! | `MENPS_DSM_INVALIDATION` | `hybrid` (leases + write notices), `timestamp` (leases only) or `directory` (sharer sets) | `hybrid` |
//! | `MENPS_DSM_FAST_RELEASE` | `1`/`0`: skip the global lock when a block has not migrated | `1` |
//! | `MENPS_DSM_FAST_READ` | `1`/`0`: re-read an invalidated block from its write notice's writer (off by default: with four processes writing neighbouring rows of the same blocks in an LU-style flush pipeline it returned stale data; the cause is not found yet) | `0` |
//! | `MENPS_DSM_RACE_DETECTION` | `1`/`0`: report write-write races found while merging | `1` |
//! | `MENPS_DSM_ON_RACE` | what a detected race does: `stop` (the DSM fails with the report) or `report` (each racing word reported once on stderr; the merging process's value is kept and the run goes on) | `stop` |
//! | `MENPS_DSM_BLOCK_SIZE` | default block size of segments (power of two, 4 KiB .. 1 MiB; `k`/`M` suffixes) | `32k` |
//! | `MENPS_DSM_WN_LIST` | write notices a signature keeps before truncating (hybrid only) | `1024` |
//! | `MENPS_DSM_LEASE` | logical lease added to a block's read timestamp | `10` |
//! | `MENPS_DSM_HEAP_SIZE` | size of the DSM heap (`k`/`M`/`G` suffixes) | `1G` |
//! | `MENPS_DSM_HEAP_BLOCK_SIZE` | coherence block of the DSM heap (power of two, 4 KiB .. 1 MiB; a divisor of the heap size) | `4k` |
//! | `MENPS_DSM_MUTEXES` | number of DSM mutexes that can exist at once | `1024` |
//! | `MENPS_DSM_STACK_SIZE` | size of a call stack in the DSM (power of two, 4 KiB .. 1 MiB; in 8 KiB blocks) | `128k` |
//! | `MENPS_DSM_STACKS` | call stacks each process can have at once (0: no stack region) | `32` |
//!
//! Builder values are defaults; the variables override them.

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
    /// Fast read (hybrid invalidation only). Off by default: with four
    /// processes writing neighbouring rows of the same blocks in an
    /// LU-style pipeline synchronised by flushes it returned stale data
    /// (the cause is not found yet).
    pub fast_read: bool,
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

impl DsmConfig {
    /// The configuration with every `MENPS_DSM_*` variable applied.
    pub fn with_env(mut self) -> DsmResult<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("MENPS_DSM_WRITER") {
            self.writer = match v.trim() {
                "floating" => WriterPolicy::Floating,
                "fixed" => WriterPolicy::Fixed,
                other => {
                    return Err(DsmError::Config(format!(
                        "MENPS_DSM_WRITER={other:?}: expected `floating` or `fixed`"
                    )));
                }
            };
        }
        if let Some(v) = var("MENPS_DSM_INVALIDATION") {
            self.invalidation = match v.trim() {
                "hybrid" => InvalidationPolicy::Hybrid,
                "timestamp" => InvalidationPolicy::Timestamp,
                "directory" => InvalidationPolicy::Directory,
                other => {
                    return Err(DsmError::Config(format!(
                        "MENPS_DSM_INVALIDATION={other:?}: expected `hybrid`, `timestamp` or \
                         `directory`"
                    )));
                }
            };
        }
        if let Some(v) = var("MENPS_DSM_ON_RACE") {
            self.on_race = match v.trim() {
                "stop" => RaceAction::Stop,
                "report" => RaceAction::Report,
                other => {
                    return Err(DsmError::Config(format!(
                        "MENPS_DSM_ON_RACE={other:?}: expected `stop` or `report`"
                    )));
                }
            };
        }
        for (name, slot) in [
            ("MENPS_DSM_FAST_RELEASE", &mut self.fast_release),
            ("MENPS_DSM_FAST_READ", &mut self.fast_read),
            ("MENPS_DSM_RACE_DETECTION", &mut self.race_detection),
            ("MENPS_STATS", &mut self.print_stats),
        ] {
            if let Some(v) = var(name) {
                *slot = parse_bool(name, &v)?;
            }
        }
        if let Some(v) = var("MENPS_DSM_BLOCK_SIZE") {
            self.block_size = parse_size("MENPS_DSM_BLOCK_SIZE", &v)?;
        }
        if let Some(v) = var("MENPS_DSM_WN_LIST") {
            self.wn_list_len = parse_size("MENPS_DSM_WN_LIST", &v)?;
        }
        if let Some(v) = var("MENPS_DSM_LEASE") {
            self.lease = parse_size("MENPS_DSM_LEASE", &v)? as u64;
        }
        if let Some(v) = var("MENPS_DSM_HEAP_SIZE") {
            self.heap_size = parse_size("MENPS_DSM_HEAP_SIZE", &v)?;
        }
        if let Some(v) = var("MENPS_DSM_HEAP_BLOCK_SIZE") {
            self.heap_block_size = parse_size("MENPS_DSM_HEAP_BLOCK_SIZE", &v)?;
        }
        if let Some(v) = var("MENPS_DSM_MUTEXES") {
            self.max_mutexes = parse_size("MENPS_DSM_MUTEXES", &v)?;
        }
        if let Some(v) = var("MENPS_DSM_STACK_SIZE") {
            self.stack_size = parse_size("MENPS_DSM_STACK_SIZE", &v)?;
        }
        if let Some(v) = var("MENPS_DSM_STACKS") {
            self.stacks_per_process = parse_size("MENPS_DSM_STACKS", &v)?;
        }
        Ok(self)
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

fn parse_bool(name: &str, v: &str) -> DsmResult<bool> {
    match v.trim() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        other => Err(DsmError::Config(format!(
            "{name}={other:?}: expected 1 or 0"
        ))),
    }
}

/// Parses `123`, `32k`, `4M`, `1G` (binary multiples).
pub fn parse_size(name: &str, v: &str) -> DsmResult<usize> {
    let t = v.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1usize << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            DsmError::Config(format!(
                "{name}={v:?}: expected a number with an optional k/M/G suffix"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("x", "32k").unwrap(), 32768);
        assert_eq!(parse_size("x", "1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("x", "17").unwrap(), 17);
        assert!(parse_size("x", "12q").is_err());
        assert!(parse_size("x", "").is_err());
    }

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
}
