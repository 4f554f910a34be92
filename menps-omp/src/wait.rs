//! Waiting for another thread, possibly in another process: the
//! workspace's one back-off (`ct_sync::Backoff`), spinning, then yielding
//! the user-level thread (other team threads or tasks of this worker run
//! meanwhile) and the processor (another process may need it); once the
//! wait is long, an OS thread parks briefly, while a worker thread keeps
//! yielding (sleeping would stop every user-level thread of the worker).

use core::sync::atomic::{AtomicU32, Ordering};

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
}
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
}
