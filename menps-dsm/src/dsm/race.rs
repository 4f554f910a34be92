//! Write-write races: where a racing address lies, and reporting each
//! racing word once when the run goes on past races
//! ([`RaceAction::Report`](super::RaceAction::Report)).
//!
//! The DSM knows its own memory: the heap (which object holds the address)
//! and the call stacks (whose). A program layer that knows more — the
//! symbols of an executable whose globals it adopted — adds it with
//! [`set_symbolizer`].

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Names what lies at an address (`None`: not known to it).
pub type Symbolizer = fn(usize) -> Option<String>;

static SYMBOLIZER: OnceLock<Symbolizer> = OnceLock::new();

/// Installs the program's symbolizer, asked first when a race is described
/// (once per process; later calls are ignored and return `false`).
pub fn set_symbolizer(f: Symbolizer) -> bool {
    SYMBOLIZER.set(f).is_ok()
}

/// Where `addr` lies, as far as the symbolizer and the running DSM know
/// ("" if neither does).
pub fn describe(addr: usize) -> String {
    if let Some(s) = SYMBOLIZER.get().and_then(|f| f(addr)) {
        return s;
    }
    super::process::with(|d| d.describe(addr)).unwrap_or_default()
}

/// The words this process saw reported (each racing word once).
static SEEN: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Reports the race at `addr` on stderr (the report made by `report`, only
/// then) unless its word was reported already by any process of the job
/// (`claim` asks the job); returns whether it printed.
pub(crate) fn report_once(
    addr: usize,
    report: impl FnOnce() -> super::error::RaceReport,
    claim: impl FnOnce(usize) -> bool,
) -> bool {
    let word = addr & !7;
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.get_or_insert_with(HashSet::new).insert(word) {
        return false;
    }
    drop(seen);
    if !claim(word) {
        return false;
    }
    let r = report();
    super::team::report_line(&format!(
        "menps-dsm: {r}. Process {}'s value is kept and the run goes on \
         (MENPS_DSM_ON_RACE=report; each racing word is reported once)",
        r.local_rank
    ));
    true
}
