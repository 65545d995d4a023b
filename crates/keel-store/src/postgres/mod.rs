//! The PostgreSQL store: the scale-out backend that several keel nodes share
//! (SPEC §10). Same logical schema and semantics as the SQLite store; where
//! SQLite relies on its single writer, this relies on row locks.

mod announce;
mod approvals;
mod codec;
mod coord;
mod migrate;
mod quota;
mod reads;
mod writes;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{Connection, PgPool};

pub use coord::PgNode;

use keel_protocol::{
    ApprovalRecord, ApprovalStatus, ApprovalStore, Commit, Event, Message, NewRun, RunFilter,
    RunPage, RunRecord, Store, StoreError, StoredCall,
};

/// Connections per node; PostgreSQL's default limit is 100 for all nodes.
const MAX_CONNECTIONS: u32 = 10;

/// How long a request waits for a free connection before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection idle for this long is pinged before it is used again.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// [`Store`] over a PostgreSQL database.
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db`),
    /// checks that it answers and brings its schema up to date.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with_stall_limit(url, None).await
    }

    /// Like [`Self::connect`], for a node of a cluster holding leases of
    /// `lease`: the server aborts any transaction of this node left idle for
    /// longer than that. A node paused or cut off in the middle of a commit
    /// holds the run's row lock, and a claim skips locked rows, so without
    /// this limit a node that never comes back would keep its runs from
    /// every other node for as long as its connection looks open.
    pub async fn connect_node(url: &str, lease: Duration) -> Result<Self, StoreError> {
        Self::connect_with_stall_limit(url, Some(lease)).await
    }

    async fn connect_with_stall_limit(
        url: &str,
        stall_limit: Option<Duration>,
    ) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Backend(format!("invalid PostgreSQL URL: {e}")))?;
        // One plain connection first: a server that is down fails here at
        // once, where the pool would keep retrying until its timeout.
        let mut conn = PgConnection::connect_with(&options)
            .await
            .map_err(|e| StoreError::Backend(format!("connecting to PostgreSQL: {e}")))?;
        migrate::migrate(&mut conn).await?;
        conn.close()
            .await
            .map_err(|e| StoreError::Backend(format!("closing migration connection: {e}")))?;
        let options = match stall_limit {
            Some(limit) => options.options([(
                "idle_in_transaction_session_timeout",
                limit.as_millis().max(1).to_string(),
            )]),
            None => options,
        };
        // sqlx pings every connection it hands out, by default: a round trip
        // before each statement, a commit's included. A connection in steady
        // use needs no such proof (a failure still surfaces, on the statement
        // itself); one that sat idle, through a restart or a cut network
        // perhaps, is pinged, and replaced if it does not answer.
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Backend(format!("connecting to PostgreSQL: {e}")))?;
        tracing::debug!("connected to postgres store");
        Ok(Self { pool })
    }

    /// The schema version this build creates and expects.
    pub fn schema_version() -> i64 {
        migrate::latest_version()
    }

    /// Waits for requests in flight, then closes every connection. Dropping
    /// the store closes them too, but without waiting.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn create_run(&self, run: NewRun) -> Result<(RunRecord, bool), StoreError> {
        writes::create_run(&self.pool, run).await
    }

    async fn get_run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError> {
        reads::get_run(&self.pool, tenant, id).await
    }

    async fn list_runs(&self, tenant: &str, filter: &RunFilter) -> Result<RunPage, StoreError> {
        reads::list_runs(&self.pool, tenant, filter).await
    }

    async fn commit(&self, run_id: &str, commit: Commit) -> Result<Vec<Event>, StoreError> {
        writes::commit(&self.pool, run_id, commit).await
    }

    async fn call_records(&self, run_id: &str, limit: u32) -> Result<Vec<StoredCall>, StoreError> {
        reads::call_records(&self.pool, run_id, limit).await
    }

    async fn events_after(
        &self,
        run_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        reads::events_after(&self.pool, run_id, after, limit).await
    }

    async fn history(&self, run_id: &str) -> Result<Vec<Message>, StoreError> {
        reads::history(&self.pool, run_id).await
    }

    async fn session_messages(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<Vec<(String, Message)>>, StoreError> {
        reads::session_messages(&self.pool, tenant, session).await
    }

    async fn archive_session(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<(String, Vec<(String, Message)>), StoreError> {
        writes::archive_session(&self.pool, tenant, session).await
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        reads::unfinished_runs(&self.pool).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        reads::ping(&self.pool).await
    }

    async fn record_inbound(
        &self,
        tenant: &str,
        channel: &str,
        message_id: &str,
    ) -> Result<bool, StoreError> {
        writes::record_inbound(&self.pool, tenant, channel, message_id).await
    }

    async fn quota_take(
        &self,
        key: &keel_protocol::QuotaKey,
        amount: u64,
        limit: u64,
    ) -> Result<Option<u64>, StoreError> {
        quota::take(&self.pool, key, amount, limit).await
    }

    async fn quota_give_back(
        &self,
        key: &keel_protocol::QuotaKey,
        amount: u64,
    ) -> Result<(), StoreError> {
        quota::give_back(&self.pool, key, amount).await
    }

    async fn quota_used(&self, key: &keel_protocol::QuotaKey) -> Result<u64, StoreError> {
        quota::used(&self.pool, key).await
    }

    async fn take_run_slot(
        &self,
        tenant: &str,
        run_id: &str,
        limit: u64,
    ) -> Result<bool, StoreError> {
        quota::take_slot(&self.pool, tenant, run_id, limit).await
    }

    async fn release_run_slot(&self, run_id: &str) -> Result<(), StoreError> {
        quota::release_slot(&self.pool, run_id).await
    }
}

#[async_trait::async_trait]
impl ApprovalStore for PostgresStore {
    async fn get_approval(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        approvals::get(&self.pool, tenant, id).await
    }

    async fn list_approvals(
        &self,
        tenant: &str,
        status: Option<ApprovalStatus>,
        limit: u32,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        approvals::list(&self.pool, tenant, status, limit).await
    }

    async fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        decision: ApprovalStatus,
        by: &str,
        reason: &str,
    ) -> Result<ApprovalRecord, StoreError> {
        approvals::decide(&self.pool, tenant, id, decision, by, reason).await
    }
}
