//! A commit's events, numbered after the run's last stored one: the same
//! in both backends, which differ only in how they write them.

use chrono::{DateTime, Utc};
use keel_protocol::{Event, EventKind, StoreError};

/// `kinds` as the run's events `last_seq + 1 …`, all stamped `ts` (the
/// commit's one timestamp).
pub(crate) fn number_events(
    run_id: &str,
    last_seq: u64,
    ts: DateTime<Utc>,
    kinds: Vec<EventKind>,
) -> Result<Vec<Event>, StoreError> {
    let mut seq = last_seq;
    kinds
        .into_iter()
        .map(|kind| {
            seq = seq
                .checked_add(1)
                .ok_or_else(|| StoreError::Backend("event sequence overflow".into()))?;
            Ok(Event::new(run_id, seq, ts, kind))
        })
        .collect()
}

/// An event that would not serialize (it always does: its maps have text keys).
pub(crate) fn event_encoding(e: serde_json::Error) -> StoreError {
    StoreError::Backend(format!("serializing event: {e}"))
}
