//! What a delegator does with delegated requests.

use ct_worker::UltItf;

/// The resource behind a [`Delegator`](crate::Delegator): it executes
/// delegated requests and, while it has outstanding work, makes progress.
///
/// All methods run with the delegator's lock held, so the consumer may use a
/// resource that is not thread-safe (an MPI library, a NIC queue pair, an
/// emulated device).
pub trait Consumer<U: UltItf>: Send + 'static {
    /// A delegated request (owned data: it may wait in a queue).
    type Request: Send + 'static;

    /// Executes a request, or refuses it (e.g. a hardware queue is full) by
    /// returning it: it is then retried after [`Consumer::progress`], never
    /// dropped.
    fn execute(&mut self, request: Self::Request) -> Result<(), Self::Request>;

    /// Makes progress on outstanding work (e.g. polls completions). May
    /// return a parked thread to wake now (e.g. the waiter of a finished
    /// operation); threads can also be woken directly.
    fn progress(&mut self) -> Option<&U::SuspendedThread> {
        None
    }

    /// Whether there is outstanding work that needs [`Consumer::progress`]
    /// even if no request arrives: then the consumer thread keeps the lock and
    /// polls, yielding between polls.
    fn is_active(&self) -> bool {
        false
    }
}
