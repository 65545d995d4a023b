//! How keel's values are written to and read back from SQLite columns.
//!
//! Structured fields are JSON text and timestamps RFC 3339 text with
//! nanoseconds, so that a record read back compares equal to the one written.

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::Row;
use serde::Serialize;
use serde::de::DeserializeOwned;

use keel_protocol::{RunRecord, RunStatus, StoreError};

/// Maps a SQLite failure to a backend error that says what was being done.
pub(super) fn db(context: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::Backend(format!("{context}: {e}"))
}

pub(super) fn ts_to_sql(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

pub(super) fn ts_from_sql(s: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| StoreError::Backend(format!("stored timestamp {s:?} is invalid: {e}")))
}

pub(super) fn to_json<T: Serialize + ?Sized>(value: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Backend(format!("serializing {what}: {e}")))
}

pub(super) fn from_json<T: DeserializeOwned>(text: &str, what: &str) -> Result<T, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Backend(format!("stored {what} is invalid: {e}")))
}

/// SQLite integers are signed; keel's counters are not.
pub(super) fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Backend(format!("{what} {value} is out of range")))
}

pub(super) fn to_u64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Backend(format!("stored {what} {value} is negative")))
}

/// The `runs` columns a [`RawRun`] is read from, in order; `ord` comes last
/// so that listing can read it at [`ORD_COLUMN`].
pub(super) const RUN_COLUMNS: &str = "id, tenant, session, agent, status, input, output, pending, \
     steps, usage, error, metadata, state, principal, last_seq, created_at, updated_at, ord";

pub(super) const ORD_COLUMN: usize = 17;

/// A `runs` row as stored. Decoding is separate from reading so that a
/// corrupt JSON column surfaces as a [`StoreError`], not a SQLite error.
pub(super) struct RawRun {
    id: String,
    tenant: String,
    session: String,
    agent: String,
    status: String,
    input: String,
    output: Option<String>,
    pending: Option<String>,
    steps: i64,
    usage: String,
    error: Option<String>,
    metadata: String,
    state: String,
    principal: String,
    last_seq: i64,
    created_at: String,
    updated_at: String,
    pub(super) ord: i64,
}

impl RawRun {
    /// Reads a row selected with [`RUN_COLUMNS`].
    pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            tenant: row.get(1)?,
            session: row.get(2)?,
            agent: row.get(3)?,
            status: row.get(4)?,
            input: row.get(5)?,
            output: row.get(6)?,
            pending: row.get(7)?,
            steps: row.get(8)?,
            usage: row.get(9)?,
            error: row.get(10)?,
            metadata: row.get(11)?,
            state: row.get(12)?,
            principal: row.get(13)?,
            last_seq: row.get(14)?,
            created_at: row.get(15)?,
            updated_at: row.get(16)?,
            ord: row.get(ORD_COLUMN)?,
        })
    }

    pub(super) fn decode(self) -> Result<RunRecord, StoreError> {
        let status = RunStatus::parse(&self.status).ok_or_else(|| {
            StoreError::Backend(format!("stored run status {:?} is unknown", self.status))
        })?;
        let steps = u32::try_from(self.steps).map_err(|_| {
            StoreError::Backend(format!("stored step count {} is out of range", self.steps))
        })?;
        Ok(RunRecord {
            id: self.id,
            tenant: self.tenant,
            session: self.session,
            agent: self.agent,
            status,
            input: self.input,
            output: self.output,
            pending: self
                .pending
                .as_deref()
                .map(|p| from_json(p, "pending"))
                .transpose()?,
            steps,
            usage: from_json(&self.usage, "usage")?,
            error: self
                .error
                .as_deref()
                .map(|e| from_json(e, "error"))
                .transpose()?,
            metadata: from_json(&self.metadata, "metadata")?,
            created_at: ts_from_sql(&self.created_at)?,
            updated_at: ts_from_sql(&self.updated_at)?,
            state: from_json(&self.state, "state")?,
            principal: Some(from_json(&self.principal, "principal")?),
            last_seq: to_u64(self.last_seq, "last_seq")?,
        })
    }
}
