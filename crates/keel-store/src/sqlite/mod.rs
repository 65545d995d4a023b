//! The SQLite store: one writer thread with group commit, a pool of
//! read-only connections, WAL so that reads never wait for writes.

mod approvals;
mod call_rows;
mod checkpoint;
mod codec;
mod migrate;
mod pool;
mod quota;
mod reads;
mod row_text;
mod wal_prefill;
mod writer;
mod writes;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;

use keel_protocol::{
    ApprovalRecord, ApprovalStatus, ApprovalStore, Commit, Event, Message, NewRun, QuotaKey,
    RunFilter, RunPage, RunRecord, Store, StoreError, StoredCall,
};

use codec::db;
use pool::ReadPool;
use writer::{WriteOp, Writer};

/// Read connections kept open; reads beyond this many wait for one.
const READERS: usize = 4;

/// Bytes the WAL file is truncated to once it has been checkpointed.
const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// How long a connection waits for a lock held by another process.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes per database page for a new file (SQLite's default is 4096); see
/// `open_writer`.
const PAGE_SIZE: i64 = 2048;

/// [`Store`] over one SQLite file.
///
/// Dropping it waits for writes already submitted, then closes the file.
pub struct SqliteStore {
    writer: Writer,
    readers: Arc<ReadPool>,
}

impl SqliteStore {
    /// Opens (creating it and its directory if needed) and migrates the
    /// database at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Backend(format!("creating directory {}: {e}", dir.display()))
            })?;
        }
        let mut conn = open_writer(path)?;
        migrate::migrate(&mut conn)?;
        // Migrations run with foreign keys enforced, as they were written.
        // After them the writer, the only connection that writes, no longer
        // has SQLite check them: every row that names a run is written in
        // the transaction that first looks that run up (a commit fails with
        // `NotFound` before inserting anything), and runs are never deleted.
        // The checks were 9 of the 21 index seeks of a tool turn's commit.
        conn.pragma_update(None, "foreign_keys", "OFF")
            .map_err(db("disabling foreign key checks after migrating"))?;
        wal_prefill::prefill(&conn, path);
        // Readers open after the writer has switched the file to WAL and
        // created the schema, which a read-only connection could not do.
        let readers = ReadPool::open(path.to_path_buf(), READERS)?;
        let writer = Writer::spawn(conn, path.to_path_buf(), BUSY_TIMEOUT)?;
        tracing::debug!(path = %path.display(), "opened sqlite store");
        Ok(Self { writer, readers })
    }

    /// The schema version this build creates and expects.
    pub fn schema_version() -> i64 {
        migrate::latest_version()
    }
}

fn open_writer(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)
        .map_err(|e| StoreError::Backend(format!("opening {}: {e}", path.display())))?;
    // Every commit writes each page it touched to the WAL whole. A tool
    // turn touches a few (the run, its events row with its messages and
    // call records, the events' index) and adds hundreds of bytes to them, so
    // the WAL's bytes, their checksums and the checkpoints' copies scale
    // with the page size. It applies only when the file is created; a
    // database made with another size keeps it.
    conn.pragma_update(None, "page_size", PAGE_SIZE)
        .map_err(db("setting page size"))?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(db("enabling WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "{} cannot use WAL (journal mode is {mode})",
            path.display()
        )));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(db("setting synchronous"))?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(db("enabling foreign keys"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(db("setting busy timeout"))?;
    // Checkpoints run on their own thread (see `checkpoint`), not inside a commit.
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(db("disabling automatic checkpoints"))?;
    // After a checkpoint has emptied it, the WAL file shrinks back to this.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)
        .map_err(db("setting WAL size limit"))?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn create_run(&self, run: NewRun) -> Result<(RunRecord, bool), StoreError> {
        self.writer
            .submit(|reply| WriteOp::CreateRun { run, reply })
            .await
    }

    async fn get_run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.readers
            .run(move |c| reads::get_run(c, &tenant, &id))
            .await
    }

    async fn list_runs(&self, tenant: &str, filter: &RunFilter) -> Result<RunPage, StoreError> {
        let (tenant, filter) = (tenant.to_owned(), filter.clone());
        self.readers
            .run(move |c| reads::list_runs(c, &tenant, &filter))
            .await
    }

    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError> {
        let run_id = run_id.to_owned();
        self.writer
            .submit(|reply| WriteOp::Commit {
                run_id,
                commit,
                reply,
            })
            .await
    }

    async fn call_records(&self, run_id: &str, limit: u32) -> Result<Vec<StoredCall>, StoreError> {
        let run_id = run_id.to_owned();
        self.readers
            .run(move |c| call_rows::read(c, &run_id, limit))
            .await
    }

    async fn events_after(
        &self,
        run_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let run_id = run_id.to_owned();
        self.readers
            .run(move |c| reads::events_after(c, &run_id, after, limit))
            .await
    }

    async fn history(&self, run_id: &str) -> Result<Vec<Message>, StoreError> {
        let run_id = run_id.to_owned();
        self.readers.run(move |c| reads::history(c, &run_id)).await
    }

    async fn session_messages(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<Vec<(String, Message)>>, StoreError> {
        let (tenant, session) = (tenant.to_owned(), session.to_owned());
        self.readers
            .run(move |c| reads::session_messages(c, &tenant, &session))
            .await
    }

    async fn archive_session(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<(String, Vec<(String, Message)>), StoreError> {
        let (tenant, session) = (tenant.to_owned(), session.to_owned());
        let value = self
            .writer
            .submit(|reply| WriteOp::Exec {
                run: Box::new(move |conn| writes::archive_session(conn, &tenant, &session)),
                reply,
            })
            .await?;
        serde_json::from_value(value)
            .map_err(|e| StoreError::Backend(format!("decoding archived session: {e}")))
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.readers.run(reads::unfinished_runs).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        if !self.writer.is_running() {
            return Err(StoreError::Backend("store writer has stopped".into()));
        }
        self.readers.run(reads::ping).await
    }

    async fn record_inbound(
        &self,
        tenant: &str,
        channel: &str,
        message_id: &str,
    ) -> Result<bool, StoreError> {
        let (tenant, channel, message_id) =
            (tenant.to_owned(), channel.to_owned(), message_id.to_owned());
        let first = self
            .writer
            .submit(|reply| WriteOp::Exec {
                run: Box::new(move |conn| {
                    writes::record_inbound(conn, &tenant, &channel, &message_id)
                        .map(serde_json::Value::Bool)
                }),
                reply,
            })
            .await?;
        Ok(first == serde_json::Value::Bool(true))
    }

    async fn quota_take(
        &self,
        key: &QuotaKey,
        amount: u64,
        limit: u64,
    ) -> Result<Option<u64>, StoreError> {
        let key = key.clone();
        let used = self
            .exec(move |conn| {
                let used = quota::take(conn, &key, amount, limit)?;
                Ok(serde_json::json!(used))
            })
            .await?;
        Ok(used.as_u64())
    }

    async fn quota_give_back(&self, key: &QuotaKey, amount: u64) -> Result<(), StoreError> {
        let key = key.clone();
        self.exec(move |conn| {
            quota::give_back(conn, &key, amount)?;
            Ok(serde_json::Value::Null)
        })
        .await?;
        Ok(())
    }

    async fn quota_used(&self, key: &QuotaKey) -> Result<u64, StoreError> {
        let key = key.clone();
        self.readers.run(move |conn| quota::used(conn, &key)).await
    }

    async fn take_run_slot(
        &self,
        tenant: &str,
        run_id: &str,
        limit: u64,
    ) -> Result<bool, StoreError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        let taken = self
            .exec(move |conn| {
                quota::take_slot(conn, &tenant, &run_id, limit).map(serde_json::Value::Bool)
            })
            .await?;
        Ok(taken == serde_json::Value::Bool(true))
    }

    async fn release_run_slot(&self, run_id: &str) -> Result<(), StoreError> {
        let run_id = run_id.to_owned();
        self.exec(move |conn| {
            quota::release_slot(conn, &run_id)?;
            Ok(serde_json::Value::Null)
        })
        .await?;
        Ok(())
    }
}

impl SqliteStore {
    /// Runs a write of its own on the writer thread, inside its transaction.
    async fn exec(
        &self,
        run: impl FnOnce(&rusqlite::Connection) -> Result<serde_json::Value, StoreError>
        + Send
        + 'static,
    ) -> Result<serde_json::Value, StoreError> {
        self.writer
            .submit(|reply| WriteOp::Exec {
                run: Box::new(run),
                reply,
            })
            .await
    }
}

#[async_trait::async_trait]
impl ApprovalStore for SqliteStore {
    async fn get_approval(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.readers
            .run(move |conn| approvals::get(conn, &tenant, &id))
            .await
    }

    async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let tenant = tenant.to_owned();
        self.readers
            .run(move |conn| approvals::list(conn, &tenant, status, limit))
            .await
    }

    async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        decision: ApprovalStatus,
        by: &str,
        reason: &str,
    ) -> Result<ApprovalRecord, StoreError> {
        self.writer
            .submit(|reply| WriteOp::Decide {
                tenant: tenant.to_owned(),
                id: id.to_owned(),
                decision,
                by: by.to_owned(),
                reason: reason.to_owned(),
                reply,
            })
            .await
    }
}
