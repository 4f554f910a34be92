//! Waiting for another thread, possibly in another process: the
//! workspace's one back-off (`ct_sync::Backoff`), spinning, then yielding
//! the user-level thread (other team threads or tasks of this worker run
//! meanwhile) and the processor (another process may need it); once the
//! wait is long, an OS thread parks briefly, while a worker thread keeps
//! yielding (sleeping would stop every user-level thread of the worker).

use core::sync::atomic::{AtomicU32, Ordering};
use core::time::Duration;

use ct_sync::Backoff;
use menps_dsm::dsm::team::TeamConfig;

/// Rounds of yielding before a wait parks (off a worker): `OMP_WAIT_POLICY`
/// (`active`: long, `passive`: short; default in between).
static YIELDS_BEFORE_SLEEP: AtomicU32 = AtomicU32::new(DEFAULT_YIELDS);
const DEFAULT_YIELDS: u32 = 256;

/// `OMP_WAIT_POLICY`: how long waiting threads stay awake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Keep yielding long before parking (`active`).
    Active,
    /// Park soon (`passive`; a worker thread yields instead).
    Passive,
    /// The default.
    Default,
}

impl WaitPolicy {
    /// Parses `OMP_WAIT_POLICY` (`active` or `passive`, any case).
    pub(crate) fn parse(v: &str) -> Option<WaitPolicy> {
        match v.trim().to_ascii_lowercase().as_str() {
            "active" => Some(WaitPolicy::Active),
            "passive" => Some(WaitPolicy::Passive),
            _ => None,
        }
    }

    /// Makes every later wait of this process follow the policy.
    pub(crate) fn apply(self) {
        let yields = match self {
            WaitPolicy::Active => 16 * DEFAULT_YIELDS,
            WaitPolicy::Passive => 8,
            WaitPolicy::Default => DEFAULT_YIELDS,
        };
        YIELDS_BEFORE_SLEEP.store(yields, Ordering::Relaxed);
    }

    /// How long the team's idle workers stay awake ([`Team::set_stay_awake`])
    /// with `workers` of them where this process's share of the host has
    /// `cpus` processors: by default only when each worker has a processor
    /// (an oversubscribed host needs every processor its workers can give
    /// up), as libgomp spins only then.
    ///
    /// A worker that slept must be woken when work comes, which takes tens
    /// to hundreds of microseconds on a virtual machine; meanwhile an awake
    /// worker runs the team threads meant for it, and the operating system
    /// may place the woken worker on the waker's processor: a team of two
    /// ran its threads on one processor for milliseconds (CG class S at 1×2:
    /// 0.81–0.86× libgomp with workers sleeping after about 20 µs, against
    /// 0.94–1.0× with 1 ms awake; AMD EPYC, 2 vCPUs).
    ///
    /// [`Team::set_stay_awake`]: menps_dsm::dsm::team::Team::set_stay_awake
    pub(crate) fn stay_awake(self, workers: usize, cpus: usize) -> Duration {
        match self {
            WaitPolicy::Active => ACTIVE_STAY_AWAKE,
            WaitPolicy::Default if workers <= cpus => DEFAULT_STAY_AWAKE,
            _ => Duration::ZERO,
        }
    }
}

/// How long idle workers stay awake by default when each has a processor
/// (of the order of libgomp's default spinning).
const DEFAULT_STAY_AWAKE: Duration = Duration::from_millis(5);
/// How long idle workers stay awake with `OMP_WAIT_POLICY=active`.
const ACTIVE_STAY_AWAKE: Duration = Duration::from_secs(1);

/// One wait loop's state.
#[derive(Debug)]
pub struct Waiter {
    backoff: Backoff,
}

impl Default for Waiter {
    fn default() -> Self {
        Waiter {
            backoff: Backoff::parking(YIELDS_BEFORE_SLEEP.load(Ordering::Relaxed)),
        }
    }
}

impl Waiter {
    /// A fresh wait.
    pub fn new() -> Self {
        Self::default()
    }

    /// One round of waiting.
    #[inline]
    pub fn wait(&mut self) {
        self.backoff.snooze(|| {
            ct_worker::yield_now_in::<TeamConfig>();
            std::thread::yield_now();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_policies_parse_in_any_case() {
        assert_eq!(WaitPolicy::parse(" ACTIVE "), Some(WaitPolicy::Active));
        assert_eq!(WaitPolicy::parse("passive"), Some(WaitPolicy::Passive));
        assert_eq!(WaitPolicy::parse("busy"), None);
    }

    #[test]
    fn idle_workers_stay_awake_by_policy_and_only_with_a_processor_each_by_default() {
        assert_eq!(WaitPolicy::Default.stay_awake(2, 2), DEFAULT_STAY_AWAKE);
        assert_eq!(WaitPolicy::Default.stay_awake(1, 1), DEFAULT_STAY_AWAKE);
        assert_eq!(WaitPolicy::Default.stay_awake(2, 1), Duration::ZERO);
        assert_eq!(WaitPolicy::Default.stay_awake(1, 0), Duration::ZERO);
        assert_eq!(WaitPolicy::Active.stay_awake(4, 1), ACTIVE_STAY_AWAKE);
        assert_eq!(WaitPolicy::Passive.stay_awake(1, 2), Duration::ZERO);
        assert!(DEFAULT_STAY_AWAKE > Duration::ZERO && ACTIVE_STAY_AWAKE > DEFAULT_STAY_AWAKE);
    }
}
