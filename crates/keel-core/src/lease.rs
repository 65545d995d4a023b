//! How long this node may still act for a run without asking the store.
//!
//! A commit is fenced by the store (it checks the lease under the run's row
//! lock), but a tool call is a side effect outside the store: a node that
//! was paused (SIGSTOP, a VM migration, a long GC) or cut off from the
//! database past its lease may wake up after another node took the run over.
//! Each run's clock holds the latest moment its lease is known to last, from
//! the last renewal this node *sent* (the store sets `lease_until` no earlier
//! than that plus the lease). Before a tool call starts, an actor whose clock
//! runs low asks the store again instead of trusting it (see
//! `RunActor::hold_lease`), so a node that stalled starts nothing for a run it
//! lost. The clocks are monotonic: they keep counting while the process is
//! stopped.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) struct LeaseClock {
    /// `None`: a lease that never ends (a single node owns every run).
    until: Mutex<Option<Instant>>,
}

impl LeaseClock {
    /// A clock for a lease just acquired (or claimed) at `since`.
    pub(crate) fn new(since: Instant, lease: Duration) -> Self {
        Self {
            until: Mutex::new(since.checked_add(lease)),
        }
    }

    /// A renewal sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant, lease: Duration) {
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        *until = match (*until, sent.checked_add(lease)) {
            (Some(old), Some(new)) => Some(old.max(new)),
            _ => None,
        };
    }

    /// Time left of the lease as this node last knew it; zero once past.
    pub(crate) fn remaining(&self) -> Duration {
        match *self.until.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(until) => until.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_extends_and_never_shortens() {
        let lease = Duration::from_secs(10);
        let start = Instant::now();
        let clock = LeaseClock::new(start, lease);
        assert!(clock.remaining() > Duration::from_secs(9));
        clock.renewed(start - Duration::from_secs(5), lease);
        assert!(
            clock.remaining() > Duration::from_secs(9),
            "an older renewal is ignored"
        );
        let past = LeaseClock::new(start - Duration::from_secs(20), lease);
        assert_eq!(past.remaining(), Duration::ZERO);
        past.renewed(Instant::now(), lease);
        assert!(past.remaining() > Duration::from_secs(9));
        let forever = LeaseClock::new(start, Duration::MAX);
        forever.renewed(Instant::now(), Duration::MAX);
        assert_eq!(
            forever.remaining(),
            Duration::MAX,
            "a single node's lease never ends"
        );
    }
}
