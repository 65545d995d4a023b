//! Schema versions, applied at open and tracked with `PRAGMA user_version`.
//!
//! A migration is never edited once released: a change is a new file, so a
//! database opened by any later build reaches the same schema.

use rusqlite::Connection;

use keel_protocol::StoreError;

use super::codec::db;

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/sqlite/0001_init.sql"),
    include_str!("../../migrations/sqlite/0002_approvals.sql"),
    include_str!("../../migrations/sqlite/0003_leases.sql"),
    include_str!("../../migrations/sqlite/0004_channel_messages.sql"),
    include_str!("../../migrations/sqlite/0005_quotas.sql"),
    include_str!("../../migrations/sqlite/0006_message_ids.sql"),
    include_str!("../../migrations/sqlite/0007_events_appended.sql"),
    include_str!("../../migrations/sqlite/0008_run_calls.sql"),
    include_str!("../../migrations/sqlite/0009_event_batches.sql"),
    include_str!("../../migrations/sqlite/0010_unfinished_without_in_list.sql"),
    include_str!("../../migrations/sqlite/0011_rows_per_commit.sql"),
    include_str!("../../migrations/sqlite/0012_messages_in_events.sql"),
    include_str!("../../migrations/sqlite/0013_messages_against_events.sql"),
];

/// The schema version this build writes.
pub(super) fn latest_version() -> i64 {
    // Always a handful of files; the cast cannot truncate.
    MIGRATIONS.len() as i64
}

/// Brings the database up to [`latest_version`], one transaction per step so
/// that a failure leaves it at a well-defined earlier version.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(db("reading schema version"))?;
    let latest = latest_version();
    if current > latest {
        return Err(StoreError::Backend(format!(
            "database schema version {current} is newer than this build supports ({latest})"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let target = index as i64 + 1;
        let tx = conn.transaction().map_err(db("starting migration"))?;
        tx.execute_batch(sql)
            .map_err(|e| StoreError::Backend(format!("applying migration {target}: {e}")))?;
        tx.pragma_update(None, "user_version", target)
            .map_err(db("recording schema version"))?;
        tx.commit().map_err(db("committing migration"))?;
        tracing::info!(version = target, "applied sqlite migration");
    }
    Ok(())
}
