//! Waiting for another thread, possibly in another process: ct-sync's
//! back-off, yielding the user-level thread (other team threads or tasks of
//! this worker run meanwhile) and then the processor (another process may
//! need it), sleeping briefly once the wait is long.

use core::time::Duration;

use ct_sync::Backoff;
use menps_dsm::dsm::team::TeamConfig;

/// Rounds of yielding before a wait starts to sleep.
const YIELDS_BEFORE_SLEEP: u32 = 256;
/// Longest sleep of a waiting thread.
const MAX_SLEEP: Duration = Duration::from_micros(200);

/// One wait loop's state.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    backoff: Backoff,
    rounds: u32,
}

impl Waiter {
    pub fn new() -> Self {
        Self::default()
    }

    /// One round of waiting.
    pub fn wait(&mut self) {
        let rounds = &mut self.rounds;
        self.backoff.snooze(|| {
            *rounds += 1;
            ct_worker::yield_now_in::<TeamConfig>();
            if *rounds < YIELDS_BEFORE_SLEEP {
                std::thread::yield_now();
            } else {
                let us = 1u64 << ((*rounds - YIELDS_BEFORE_SLEEP) / 16).min(8);
                std::thread::sleep(Duration::from_micros(us).min(MAX_SLEEP));
            }
        });
    }
}
