//! Waiting for another thread, possibly in another process: ct-sync's
//! back-off, yielding the user-level thread (other team threads or tasks of
//! this worker run meanwhile) and then the processor (another process may
//! need it), sleeping briefly once the wait is long.

use core::sync::atomic::{AtomicU32, Ordering};
use core::time::Duration;

use ct_sync::Backoff;
use menps_dsm::dsm::team::TeamConfig;

/// Rounds of yielding before a wait starts to sleep: `OMP_WAIT_POLICY`
/// (`active`: long, `passive`: short; default in between).
static YIELDS_BEFORE_SLEEP: AtomicU32 = AtomicU32::new(DEFAULT_YIELDS);
const DEFAULT_YIELDS: u32 = 256;

/// `OMP_WAIT_POLICY`: how long waiting threads stay awake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Keep yielding long before sleeping (`active`).
    Active,
    /// Sleep soon (`passive`).
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
/// Longest sleep of a waiting thread.
const MAX_SLEEP: Duration = Duration::from_micros(200);

/// One wait loop's state.
#[derive(Debug, Default)]
pub struct Waiter {
    backoff: Backoff,
    rounds: u32,
}

impl Waiter {
    /// A fresh wait.
    pub fn new() -> Self {
        Self::default()
    }

    /// One round of waiting.
    pub fn wait(&mut self) {
        let rounds = &mut self.rounds;
        let awake = YIELDS_BEFORE_SLEEP.load(Ordering::Relaxed);
        self.backoff.snooze(|| {
            *rounds += 1;
            ct_worker::yield_now_in::<TeamConfig>();
            if *rounds < awake {
                std::thread::yield_now();
            } else {
                let us = 1u64 << ((*rounds - awake) / 16).min(8);
                std::thread::sleep(Duration::from_micros(us).min(MAX_SLEEP));
            }
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
