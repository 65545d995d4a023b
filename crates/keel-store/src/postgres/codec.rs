//! How keel's values are written to and read back from PostgreSQL columns.
//!
//! Structured fields travel as JSON text (bound as `text`, cast to `json` in
//! the statement, read back with `::text`), so that a record read back
//! compares equal to the one written.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::postgres::PgRow;

use keel_protocol::{RunRecord, RunStatus, StoreError};

/// Maps a database failure to a backend error that says what was being done.
pub(super) fn db(context: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| StoreError::Backend(format!("{context}: {e}"))
}

/// Whether a failure is a unique-constraint violation.
pub(super) fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

/// The current time at the precision PostgreSQL keeps (microseconds).
///
/// A nanosecond timestamp would read back different from the record this
/// store returned. Rounding down could give a time before the call started,
/// so this rounds up and waits (at most a microsecond) until that time has
/// passed: the value always lies within the call.
pub(super) fn now() -> DateTime<Utc> {
    let t = keel_protocol::now();
    let sub_micro = t.timestamp_subsec_nanos() % 1_000;
    if sub_micro == 0 {
        return t;
    }
    let up = t + Duration::nanoseconds(i64::from(1_000 - sub_micro));
    while keel_protocol::now() < up {
        std::hint::spin_loop();
    }
    up
}

pub(super) fn to_json<T: Serialize + ?Sized>(value: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Backend(format!("serializing {what}: {e}")))
}

pub(super) fn from_json<T: DeserializeOwned>(text: &str, what: &str) -> Result<T, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Backend(format!("stored {what} is invalid: {e}")))
}

/// PostgreSQL integers are signed; keel's counters are not.
pub(super) fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Backend(format!("{what} {value} is out of range")))
}

pub(super) fn to_u64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Backend(format!("stored {what} {value} is negative")))
}

/// The `runs` columns a [`RawRun`] is read from, as a literal so that every
/// statement using it stays a `&'static str` (sqlx's guard against building
/// SQL from data).
macro_rules! run_columns {
    () => {
        "id, tenant, session, agent, status, input, output, pending::text, steps, \
         usage::text, error::text, metadata::text, state::text, principal::text, \
         last_seq, created_at, updated_at, ord"
    };
}
pub(super) use run_columns;

/// A `runs` row as stored. Decoding is separate from reading so that a
/// corrupt JSON column surfaces as a [`StoreError`] that names it.
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
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    pub(super) ord: i64,
}

impl RawRun {
    /// Reads a row selected with [`run_columns!`].
    pub(super) fn from_row(row: &PgRow) -> Result<Self, StoreError> {
        Self::read(row).map_err(db("reading run row"))
    }

    fn read(row: &PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get(0)?,
            tenant: row.try_get(1)?,
            session: row.try_get(2)?,
            agent: row.try_get(3)?,
            status: row.try_get(4)?,
            input: row.try_get(5)?,
            output: row.try_get(6)?,
            pending: row.try_get(7)?,
            steps: row.try_get(8)?,
            usage: row.try_get(9)?,
            error: row.try_get(10)?,
            metadata: row.try_get(11)?,
            state: row.try_get(12)?,
            principal: row.try_get(13)?,
            last_seq: row.try_get(14)?,
            created_at: row.try_get(15)?,
            updated_at: row.try_get(16)?,
            ord: row.try_get(17)?,
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
            created_at: self.created_at,
            updated_at: self.updated_at,
            state: from_json(&self.state, "state")?,
            principal: Some(from_json(&self.principal, "principal")?),
            last_seq: to_u64(self.last_seq, "last_seq")?,
        })
    }
}
