//! Schema versions, applied at connect and recorded in `keel_schema_version`.
//!
//! As for SQLite, a migration is never edited once released: a change is a
//! new file. Several keel nodes may start at once against one database, so
//! the whole upgrade runs under a transaction-scoped advisory lock: the first
//! node migrates, the others wait and then find nothing left to do.

use sqlx::{Connection, PgConnection};

use keel_protocol::StoreError;

use super::codec::db;

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/postgres/0001_init.sql"),
    include_str!("../../migrations/postgres/0002_approvals.sql"),
    include_str!("../../migrations/postgres/0003_leases.sql"),
    include_str!("../../migrations/postgres/0004_channel_messages.sql"),
    include_str!("../../migrations/postgres/0005_quotas.sql"),
    include_str!("../../migrations/postgres/0006_run_calls.sql"),
];

/// Key of the advisory lock that serializes migrations ("keel" in ASCII).
const MIGRATION_LOCK: i64 = 0x6b65_656c;

/// The schema version this build writes.
pub(super) fn latest_version() -> i64 {
    // Always a handful of files; the cast cannot truncate.
    MIGRATIONS.len() as i64
}

/// Brings the database up to [`latest_version`] in one transaction: DDL is
/// transactional in PostgreSQL, so a failure leaves the schema untouched.
pub(super) async fn migrate(conn: &mut PgConnection) -> Result<(), StoreError> {
    let mut tx = conn.begin().await.map_err(db("starting migration"))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(db("taking the migration lock"))?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS keel_schema_version (\
           version    BIGINT PRIMARY KEY, \
           applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(&mut *tx)
    .await
    .map_err(db("creating the schema version table"))?;
    let current: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM keel_schema_version")
            .fetch_one(&mut *tx)
            .await
            .map_err(db("reading schema version"))?;
    let latest = latest_version();
    if current > latest {
        return Err(StoreError::Backend(format!(
            "database schema version {current} is newer than this build supports ({latest})"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let target = index as i64 + 1;
        sqlx::raw_sql(*sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| StoreError::Backend(format!("applying migration {target}: {e}")))?;
        sqlx::query("INSERT INTO keel_schema_version (version) VALUES ($1)")
            .bind(target)
            .execute(&mut *tx)
            .await
            .map_err(db("recording schema version"))?;
        tracing::info!(version = target, "applied postgres migration");
    }
    tx.commit().await.map_err(db("committing migrations"))
}
