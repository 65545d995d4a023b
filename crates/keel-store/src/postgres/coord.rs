//! Run ownership, mailboxes and notices over PostgreSQL. The database is the
//! whole cluster protocol (SPEC §10): a lease is two columns of the run's
//! row, a claim is `FOR UPDATE SKIP LOCKED`, a mailbox is a table, and a
//! notice is a `NOTIFY`: a command's inside the transaction that posts it
//! (delivered only if, and once, that transaction commits), committed
//! events' right after their commit (see `announce`).
//!
//! All times are the database's clock, never a node's: nodes with skewed
//! clocks still agree on whose lease is live.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{PgPool, Row};

use keel_protocol::{
    Commit, Coordination, Event, Notice, Notices, QueuedCommand, RunRecord, StoreError,
};

use super::PostgresStore;
use super::announce::{Announcer, Committed};
use super::codec::{RawRun, db, from_json, run_columns, to_json, to_u64};
use super::writes::{self, Guard, Written};

/// Channel announcing committed events: payload `<run_id> <first> <last>`.
const EVENTS_CHANNEL: &str = "keel_events";

/// Channel announcing posted commands: payload `<run_id> <owner>` (the owner
/// may be empty).
const COMMANDS_CHANNEL: &str = "keel_commands";

/// One node's handle on the shared database.
pub struct PgNode {
    pool: PgPool,
    node_id: String,
    lease: Duration,
    announcer: Announcer,
    last_seqs: LastSeqs,
}

impl PostgresStore {
    /// This store as node `node_id` of a cluster, holding leases for
    /// `lease`. Shares the store's connection pool; listening takes one
    /// connection of its own.
    pub fn node(&self, node_id: impl Into<String>, lease: Duration) -> PgNode {
        PgNode {
            pool: self.pool.clone(),
            node_id: node_id.into(),
            lease,
            announcer: Announcer::new(self.pool.clone(), EVENTS_CHANNEL),
            last_seqs: LastSeqs::default(),
        }
    }
}

impl PgNode {
    fn lease_secs(&self) -> f64 {
        self.lease.as_secs_f64()
    }

    /// After a commit of `run_id` that found its last event at `last_seq`
    /// and added `events`.
    fn committed(&self, run_id: &str, last_seq: u64, events: &[Event], ended: bool) {
        if ended {
            self.last_seqs.forget(run_id);
        } else {
            let last = events.last().map_or(last_seq, |e| e.seq);
            self.last_seqs.set(run_id, last);
        }
        if let (Some(first), Some(last)) = (events.first(), events.last()) {
            self.announcer.announce(Committed {
                run_id: run_id.to_owned(),
                first: first.seq,
                last: last.seq,
            });
        }
    }
}

/// The last event this node wrote of each run it commits to. Only a guess
/// for the next commit's one-statement write, which checks it: a wrong or
/// missing entry costs the locked transaction, never a wrong write.
#[derive(Default)]
struct LastSeqs(Mutex<HashMap<String, u64>>);

impl LastSeqs {
    /// Entries past this are dropped wholesale (runs this node lost keep
    /// theirs otherwise).
    const MAX: usize = 100_000;

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        // A panic elsewhere cannot leave a wrong entry, only a stale one.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, run_id: &str) -> Option<u64> {
        self.map().get(run_id).copied()
    }

    fn set(&self, run_id: &str, last_seq: u64) {
        let mut map = self.map();
        if map.len() >= Self::MAX && !map.contains_key(run_id) {
            map.clear();
        }
        map.insert(run_id.to_owned(), last_seq);
    }

    fn forget(&self, run_id: &str) {
        self.map().remove(run_id);
    }
}

#[async_trait::async_trait]
impl Coordination for PgNode {
    fn node_id(&self) -> &str {
        &self.node_id
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    async fn acquire(&self, run_id: &str) -> Result<bool, StoreError> {
        let taken = sqlx::query(
            "UPDATE runs SET owner = $1, \
               lease_until = clock_timestamp() + make_interval(secs => $3) \
             WHERE id = $2 AND status NOT IN ('completed', 'failed', 'cancelled') \
               AND (owner IS NULL OR owner = $1 OR lease_until < clock_timestamp())",
        )
        .bind(&self.node_id)
        .bind(run_id)
        .bind(self.lease_secs())
        .execute(&self.pool)
        .await
        .map_err(db("acquiring run"))?
        .rows_affected();
        Ok(taken == 1)
    }

    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StoreError> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(
            "UPDATE runs SET lease_until = clock_timestamp() + make_interval(secs => $3) \
             WHERE owner = $1 AND id = ANY($2) \
               AND status NOT IN ('completed', 'failed', 'cancelled') \
             RETURNING id",
        )
        .bind(&self.node_id)
        .bind(run_ids)
        .bind(self.lease_secs())
        .fetch_all(&self.pool)
        .await
        .map_err(db("renewing leases"))
    }

    async fn claim(&self, limit: u32) -> Result<Vec<RunRecord>, StoreError> {
        // Commands of runs that ended can never be delivered.
        sqlx::query(
            "DELETE FROM run_commands c USING runs r \
             WHERE c.run_id = r.id AND r.status IN ('completed', 'failed', 'cancelled')",
        )
        .execute(&self.pool)
        .await
        .map_err(db("dropping commands of ended runs"))?;
        // A run nobody ever owned is left alone for one lease: its creator
        // may be about to take it.
        let rows = sqlx::query(concat!(
            "WITH c AS ( \
               SELECT id AS claim_id FROM runs \
               WHERE status NOT IN ('completed', 'failed', 'cancelled') \
                 AND (lease_until < clock_timestamp() \
                   OR (owner IS NULL \
                       AND updated_at < clock_timestamp() - make_interval(secs => $3))) \
               ORDER BY ord LIMIT $2 \
               FOR UPDATE SKIP LOCKED) \
             UPDATE runs SET owner = $1, \
               lease_until = clock_timestamp() + make_interval(secs => $3) \
             FROM c WHERE runs.id = c.claim_id \
             RETURNING ",
            run_columns!()
        ))
        .bind(&self.node_id)
        .bind(i64::from(limit))
        .bind(self.lease_secs())
        .fetch_all(&self.pool)
        .await
        .map_err(db("claiming runs"))?;
        let mut runs = rows
            .iter()
            .map(|r| {
                let raw = RawRun::from_row(r)?;
                Ok((raw.ord, raw.decode()?))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        runs.sort_by_key(|(ord, _)| *ord);
        Ok(runs.into_iter().map(|(_, run)| run).collect())
    }

    async fn release_all(&self) -> Result<(), StoreError> {
        // The owner stays for the record; the expired lease makes the runs
        // claimable at once and refuses this node's further commits.
        sqlx::query(
            "UPDATE runs SET lease_until = clock_timestamp() \
             WHERE owner = $1 AND status NOT IN ('completed', 'failed', 'cancelled')",
        )
        .bind(&self.node_id)
        .execute(&self.pool)
        .await
        .map_err(db("releasing runs"))?;
        Ok(())
    }

    async fn owned_count(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE owner = $1 AND lease_until > clock_timestamp() \
             AND status NOT IN ('completed', 'failed', 'cancelled')",
        )
        .bind(&self.node_id)
        .fetch_one(&self.pool)
        .await
        .map_err(db("counting owned runs"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn commit(&self, run_id: &str, mut commit: Commit) -> Result<Vec<Event>, StoreError> {
        let terminal = commit
            .patch
            .as_ref()
            .and_then(|p| p.status)
            .is_some_and(|s| s.is_terminal());
        // Most commits of a run this node holds: one statement that writes
        // only if the run is still as this node last wrote it and the lease
        // is live (the update's row lock is the fence, as below). Anything
        // else, or a refusal, takes the locked transaction, which also tells
        // a lost lease from a run written by someone else meanwhile.
        if !terminal
            && commit.approvals.is_empty()
            && let Some(last_seq) = self.last_seqs.get(run_id)
        {
            let guard = Guard::Current {
                node: &self.node_id,
            };
            let kinds = std::mem::take(&mut commit.events);
            match writes::write_commit(&self.pool, run_id, last_seq, guard, kinds, &commit).await? {
                Written::Applied(events) => {
                    self.committed(run_id, last_seq, &events, false);
                    return Ok(events);
                }
                Written::Refused(kinds) => commit.events = kinds,
            }
        }
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(db("starting transaction"))?;
        // The row lock is the fence: a claim by another node either happened
        // before (and shows here) or waits until this commit is done.
        let locked = writes::lock_run(&mut tx, run_id).await?;
        if !(locked.lease_live && locked.owner.as_deref() == Some(self.node_id.as_str())) {
            self.last_seqs.forget(run_id);
            // Rolled back now, not when the connection is next used: until
            // then the row stays locked, and a claim skips locked rows.
            tx.rollback().await.map_err(db("rolling back"))?;
            return Err(StoreError::LeaseLost(format!(
                "run {run_id}: node {} no longer holds its lease (owner: {})",
                self.node_id,
                locked.owner.as_deref().unwrap_or("none")
            )));
        }
        let last_seq = to_u64(locked.last_seq, "last_seq")?;
        let events = writes::apply_commit(&mut tx, run_id, &locked, commit).await?;
        if terminal {
            sqlx::query("UPDATE runs SET owner = NULL, lease_until = NULL WHERE id = $1")
                .bind(run_id)
                .execute(&mut *tx)
                .await
                .map_err(db("releasing the ended run"))?;
        }
        tx.commit().await.map_err(db("committing"))?;
        self.committed(run_id, last_seq, &events, terminal);
        Ok(events)
    }

    async fn post_command(
        &self,
        run_id: &str,
        tenant: &str,
        body: &Value,
    ) -> Result<(), StoreError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(db("starting transaction"))?;
        let owner: Option<Option<String>> = sqlx::query_scalar(
            "INSERT INTO run_commands (run_id, body) \
             SELECT id, $3::json FROM runs WHERE id = $1 AND tenant = $2 \
             RETURNING (SELECT owner FROM runs \
                        WHERE id = $1 AND lease_until > clock_timestamp())",
        )
        .bind(run_id)
        .bind(tenant)
        .bind(to_json(body, "command")?)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db("posting command"))?;
        let Some(owner) = owner else {
            return Err(StoreError::NotFound);
        };
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(COMMANDS_CHANNEL)
            .bind(format!("{run_id} {}", owner.unwrap_or_default()))
            .execute(&mut *tx)
            .await
            .map_err(db("announcing command"))?;
        tx.commit().await.map_err(db("committing command"))
    }

    async fn take_commands(&self) -> Result<Vec<QueuedCommand>, StoreError> {
        let rows = sqlx::query(
            "DELETE FROM run_commands c USING runs r \
             WHERE c.run_id = r.id AND r.owner = $1 AND r.lease_until > clock_timestamp() \
             RETURNING c.id, c.run_id, r.tenant, c.body::text",
        )
        .bind(&self.node_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db("taking commands"))?;
        let mut commands = rows
            .iter()
            .map(|r| {
                let body: String = r.try_get(3).map_err(db("reading command"))?;
                Ok(QueuedCommand {
                    id: r.try_get(0).map_err(db("reading command"))?,
                    run_id: r.try_get(1).map_err(db("reading command"))?,
                    tenant: r.try_get(2).map_err(db("reading command"))?,
                    body: from_json(&body, "command")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        commands.sort_by_key(|c| c.id);
        Ok(commands)
    }

    async fn listen(&self) -> Result<Box<dyn Notices>, StoreError> {
        // A connection of its own, held for as long as the node listens.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with((*self.pool.connect_options()).clone());
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(db("connecting the listener"))?;
        listener
            .listen_all([EVENTS_CHANNEL, COMMANDS_CHANNEL])
            .await
            .map_err(db("listening"))?;
        Ok(Box::new(PgNotices {
            listener,
            resync: false,
        }))
    }
}

struct PgNotices {
    listener: PgListener,
    /// The last receive failed: the next notice is a resync.
    resync: bool,
}

#[async_trait::async_trait]
impl Notices for PgNotices {
    async fn next(&mut self) -> Result<Notice, StoreError> {
        if std::mem::take(&mut self.resync) {
            return Ok(Notice::Resync);
        }
        loop {
            match self.listener.try_recv().await {
                Ok(Some(n)) => {
                    if let Some(notice) = parse(n.channel(), n.payload()) {
                        return Ok(notice);
                    }
                    tracing::debug!(
                        channel = n.channel(),
                        payload = n.payload(),
                        "ignoring notice"
                    );
                }
                // The connection dropped and was re-established.
                Ok(None) => return Ok(Notice::Resync),
                Err(e) => {
                    self.resync = true;
                    return Err(StoreError::Backend(format!("listening for notices: {e}")));
                }
            }
        }
    }
}

fn parse(channel: &str, payload: &str) -> Option<Notice> {
    let mut parts = payload.split(' ');
    let run_id = parts.next().filter(|s| !s.is_empty())?.to_owned();
    match channel {
        EVENTS_CHANNEL => {
            let first = parts.next()?.parse().ok()?;
            let last = parts.next()?.parse().ok()?;
            Some(Notice::Events {
                run_id,
                first,
                last,
            })
        }
        COMMANDS_CHANNEL => {
            let owner = parts.next().filter(|s| !s.is_empty()).map(str::to_owned);
            Some(Notice::Command { run_id, owner })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse() {
        assert_eq!(
            parse(EVENTS_CHANNEL, "run_1 3 7"),
            Some(Notice::Events {
                run_id: "run_1".into(),
                first: 3,
                last: 7
            })
        );
        assert_eq!(
            parse(COMMANDS_CHANNEL, "run_1 "),
            Some(Notice::Command {
                run_id: "run_1".into(),
                owner: None
            })
        );
        assert_eq!(
            parse(COMMANDS_CHANNEL, "run_1 node-a"),
            Some(Notice::Command {
                run_id: "run_1".into(),
                owner: Some("node-a".into())
            })
        );
        assert_eq!(parse(EVENTS_CHANNEL, "run_1 x 7"), None);
        assert_eq!(parse("other", "run_1 1 2"), None);
    }
}
