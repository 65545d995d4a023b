//! The write operations, each one transaction.
//!
//! Unlike SQLite, writes here run concurrently; what SQLite gets from its
//! single writer, this gets from row locks and constraints.

use serde_json::Value;
use sqlx::{PgPool, Postgres, Row, Transaction};

use keel_protocol::{Commit, Event, NewRun, RunRecord, RunStatus, StoreError, Usage};

use super::approvals;
use super::codec::{RawRun, db, is_unique_violation, now, run_columns, to_i64, to_json, to_u64};

/// The run of this tenant created with this idempotency key, if any.
async fn by_idempotency_key(
    executor: impl sqlx::PgExecutor<'_>,
    tenant: &str,
    key: &str,
) -> Result<Option<RunRecord>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        run_columns!(),
        " FROM runs WHERE tenant = $1 AND idempotency_key = $2"
    ))
    .bind(tenant)
    .bind(key)
    .fetch_optional(executor)
    .await
    .map_err(db("looking up idempotency key"))?;
    row.map(|r| RawRun::from_row(&r)?.decode()).transpose()
}

pub(super) async fn create_run(
    pool: &PgPool,
    run: NewRun,
) -> Result<(RunRecord, bool), StoreError> {
    let tenant = run.principal.tenant.clone();
    if let Some(key) = &run.idempotency_key
        && let Some(existing) = by_idempotency_key(pool, &tenant, key).await?
    {
        return Ok((existing, false));
    }

    let now = now();
    let record = RunRecord {
        id: run.id,
        tenant,
        session: run.session,
        agent: run.agent,
        status: RunStatus::Queued,
        input: run.input,
        output: None,
        pending: None,
        steps: 0,
        usage: Usage::default(),
        error: None,
        metadata: run.metadata,
        created_at: now,
        updated_at: now,
        state: Value::Null,
        principal: Some(run.principal),
        last_seq: 0,
    };

    let mut tx = pool.begin().await.map_err(db("starting transaction"))?;
    sqlx::query(
        "INSERT INTO sessions (tenant, key, created_at) VALUES ($1, $2, $3) \
         ON CONFLICT (tenant, key) DO NOTHING",
    )
    .bind(&record.tenant)
    .bind(&record.session)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(db("inserting session"))?;

    // A concurrent create with the same key makes this insert wait for it,
    // then insert nothing: the key's run is then the other one.
    let inserted = sqlx::query(
        "INSERT INTO runs (id, tenant, session, agent, status, input, steps, usage, \
         metadata, state, principal, idempotency_key, last_seq, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, 0, $7::json, $8::json, $9::json, $10::json, $11, 0, \
         $12, $12) \
         ON CONFLICT (tenant, idempotency_key) DO NOTHING",
    )
    .bind(&record.id)
    .bind(&record.tenant)
    .bind(&record.session)
    .bind(&record.agent)
    .bind(record.status.as_str())
    .bind(&record.input)
    .bind(to_json(&record.usage, "usage")?)
    .bind(to_json(&record.metadata, "metadata")?)
    .bind(to_json(&record.state, "state")?)
    .bind(to_json(&record.principal, "principal")?)
    .bind(&run.idempotency_key)
    .bind(now)
    .execute(&mut *tx)
    .await
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Conflict(format!("run {} already exists", record.id))
        } else {
            StoreError::Backend(format!("inserting run: {e}"))
        }
    })?
    .rows_affected();

    if inserted == 1 {
        tx.commit().await.map_err(db("committing run"))?;
        return Ok((record, true));
    }
    // Nothing of this request may stay, not even its session.
    tx.rollback().await.map_err(db("rolling back run"))?;
    let key = run.idempotency_key.as_deref().unwrap_or_default();
    match by_idempotency_key(pool, &record.tenant, key).await? {
        Some(existing) => Ok((existing, false)),
        None => Err(StoreError::Backend(format!(
            "run {} was neither inserted nor found by its idempotency key",
            record.id
        ))),
    }
}

pub(super) async fn commit(
    pool: &PgPool,
    run_id: &str,
    commit: Commit,
) -> Result<Vec<Event>, StoreError> {
    let mut tx = pool.begin().await.map_err(db("starting transaction"))?;
    let locked = lock_run(&mut tx, run_id).await?;
    let events = apply_commit(&mut tx, run_id, &locked, commit).await?;
    tx.commit().await.map_err(db("committing"))?;
    Ok(events)
}

/// A run's row, locked for a commit: its last event, and who holds its
/// lease.
pub(super) struct LockedRun {
    pub(super) last_seq: i64,
    /// The lease holder, if the lease is live.
    pub(super) owner: Option<String>,
    pub(super) lease_live: bool,
}

/// Locks the run's row: concurrent commits to one run take turns, each
/// seeing the last_seq the previous one wrote, and a claim by another node
/// either happened before (and shows in `owner`) or waits for this commit.
/// One round trip carries both what the commit needs and the lease.
pub(super) async fn lock_run(
    tx: &mut Transaction<'_, Postgres>,
    run_id: &str,
) -> Result<LockedRun, StoreError> {
    let row = sqlx::query(
        "SELECT last_seq, owner, \
         COALESCE(lease_until > clock_timestamp(), false) \
         FROM runs WHERE id = $1 FOR UPDATE",
    )
    .bind(run_id)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db("locking run"))?
    .ok_or(StoreError::NotFound)?;
    Ok(LockedRun {
        last_seq: row.try_get(0).map_err(db("reading run"))?,
        owner: row.try_get(1).map_err(db("reading run"))?,
        lease_live: row.try_get(2).map_err(db("reading run"))?,
    })
}

pub(super) async fn apply_commit(
    tx: &mut Transaction<'_, Postgres>,
    run_id: &str,
    locked: &LockedRun,
    mut commit: Commit,
) -> Result<Vec<Event>, StoreError> {
    for approval in &commit.approvals {
        approvals::insert(&mut **tx, approval).await?;
    }
    let patch_ends_run = commit
        .patch
        .as_ref()
        .and_then(|p| p.status)
        .is_some_and(RunStatus::is_terminal);
    let last = to_u64(locked.last_seq, "last_seq")?;
    let kinds = std::mem::take(&mut commit.events);
    let events = match write_commit(&mut **tx, run_id, last, Guard::Locked, kinds, &commit).await? {
        Written::Applied(events) => events,
        Written::Refused(_) => {
            return Err(StoreError::Backend(format!(
                "run {run_id}: its locked row took no update"
            )));
        }
    };
    if patch_ends_run {
        super::quota::release_slot_in(tx, run_id).await?;
    }
    Ok(events)
}

/// What a commit's statement checks before it writes anything.
pub(super) enum Guard<'a> {
    /// The run's row is locked by the transaction, and checked.
    Locked,
    /// The run's last event is still `last_seq`, and `node` holds its
    /// lease: what the node knew when it last wrote the run.
    Current { node: &'a str },
}

/// The outcome of [`write_commit`].
pub(super) enum Written {
    Applied(Vec<Event>),
    /// The guard did not hold and nothing was written: the events, unnumbered.
    Refused(Vec<keel_protocol::EventKind>),
}

/// Writes a commit's events, messages and run patch in one statement, one
/// round trip: data-modifying CTEs always run, an empty array inserts
/// nothing, and the inserts take their rows from the run's update, so a
/// guard that fails writes nothing at all. Message ids are drawn in the
/// order rows are inserted; ORDER BY keeps that the order of the commit.
/// The commit's approvals are not written here.
pub(super) async fn write_commit(
    executor: impl sqlx::PgExecutor<'_>,
    run_id: &str,
    last_seq: u64,
    guard: Guard<'_>,
    kinds: Vec<keel_protocol::EventKind>,
    commit: &Commit,
) -> Result<Written, StoreError> {
    let ts = now();
    let events = crate::numbering::number_events(run_id, last_seq, ts, kinds)?;
    let seq = events.last().map_or(last_seq, |e| e.seq);
    let mut seqs = Vec::with_capacity(events.len());
    let mut types = Vec::with_capacity(events.len());
    let mut event_bodies = Vec::with_capacity(events.len());
    for event in &events {
        seqs.push(to_i64(event.seq, "seq")?);
        types.push(event.type_name());
        event_bodies.push(
            event
                .json()
                .map_err(crate::numbering::event_encoding)?
                .to_owned(),
        );
    }
    let message_bodies = commit
        .messages
        .iter()
        .map(|m| to_json(m, "message"))
        .collect::<Result<Vec<_>, _>>()?;
    let (call_ns, call_records): (Vec<i64>, Vec<&str>) = commit
        .calls
        .iter()
        .map(|c| Ok((to_i64(c.n, "call record place")?, c.record.as_str())))
        .collect::<Result<Vec<_>, StoreError>>()?
        .into_iter()
        .unzip();
    let patch = commit.patch.as_ref();
    // `pending` has three states (keep, clear, set), hence the flag next to the value.
    let (set_pending, pending) = match patch.and_then(|p| p.pending.as_ref()) {
        None => (false, None),
        Some(None) => (true, None),
        Some(Some(p)) => (true, Some(to_json(p, "pending")?)),
    };
    let (expect_seq, node) = match guard {
        Guard::Locked => (None, None),
        Guard::Current { node } => (Some(to_i64(last_seq, "last_seq")?), Some(node)),
    };
    let updated: i64 = sqlx::query_scalar(
        "WITH run AS ( \
           UPDATE runs SET \
             status = COALESCE($2, status), \
             output = COALESCE($3, output), \
             pending = CASE WHEN $4 THEN $5::json ELSE pending END, \
             steps = COALESCE($6, steps), \
             usage = COALESCE($7::json, usage), \
             error = COALESCE($8::json, error), \
             state = COALESCE($9::json, state), \
             last_seq = $10, \
             updated_at = $11 \
           WHERE id = $1 AND ($16::bigint IS NULL OR \
             (last_seq = $16 AND owner = $17 AND lease_until > clock_timestamp())) \
           RETURNING tenant, session \
         ), new_events AS ( \
           INSERT INTO events (run_id, seq, type, body, ts) \
           SELECT $1, e.seq, e.type, e.body::json, $11 \
           FROM run, UNNEST($12::bigint[], $13::text[], $14::text[]) AS e (seq, type, body) \
         ), new_messages AS ( \
           INSERT INTO messages (tenant, session, run_id, body) \
           SELECT run.tenant, run.session, $1, m.body::json \
           FROM run, UNNEST($15::text[]) WITH ORDINALITY AS m (body, n) ORDER BY m.n \
         ), new_calls AS ( \
           INSERT INTO run_calls (run_id, n, record) \
           SELECT $1, c.n, c.record \
           FROM run, UNNEST($18::bigint[], $19::text[]) AS c (n, record) \
         ) \
         SELECT count(*) FROM run",
    )
    .bind(run_id)
    .bind(patch.and_then(|p| p.status).map(RunStatus::as_str))
    .bind(patch.and_then(|p| p.output.as_deref()))
    .bind(set_pending)
    .bind(pending)
    .bind(patch.and_then(|p| p.steps).map(i64::from))
    .bind(
        patch
            .and_then(|p| p.usage.as_ref())
            .map(|u| to_json(u, "usage"))
            .transpose()?,
    )
    .bind(
        patch
            .and_then(|p| p.error.as_ref())
            .map(|e| to_json(e, "error"))
            .transpose()?,
    )
    .bind(patch.and_then(|p| p.state.as_deref()))
    .bind(to_i64(seq, "last_seq")?)
    .bind(ts)
    .bind(seqs)
    .bind(types)
    .bind(event_bodies)
    .bind(message_bodies)
    .bind(expect_seq)
    .bind(node)
    .bind(call_ns)
    .bind(call_records)
    .fetch_one(executor)
    .await
    .map_err(db("writing the commit"))?;
    Ok(if updated == 1 {
        Written::Applied(events)
    } else {
        Written::Refused(events.into_iter().map(|e| e.kind).collect())
    })
}

/// Moves the session's messages to `<session>~<timestamp>` (a session of its
/// own) and returns them, oldest first, with the run that wrote each.
pub(super) async fn archive_session(
    pool: &PgPool,
    tenant: &str,
    session: &str,
) -> Result<(String, Vec<(String, keel_protocol::Message)>), StoreError> {
    let mut tx = pool.begin().await.map_err(db("starting transaction"))?;
    let exists: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM sessions WHERE tenant = $1 AND key = $2 FOR UPDATE")
            .bind(tenant)
            .bind(session)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db("locking session"))?;
    if exists.is_none() {
        return Err(StoreError::NotFound);
    }
    let busy: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM runs WHERE tenant = $1 AND session = $2 \
         AND status NOT IN ('completed', 'failed', 'cancelled'))",
    )
    .bind(tenant)
    .bind(session)
    .fetch_one(&mut *tx)
    .await
    .map_err(db("checking session runs"))?;
    if busy {
        return Err(StoreError::Conflict(format!(
            "session {session} has a run still going; wait for it or cancel it first"
        )));
    }
    let ts = now();
    let archived = format!("{session}~{}", ts.format("%Y%m%dT%H%M%S%.6fZ"));
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT run_id, body::text FROM messages WHERE tenant = $1 AND session = $2 ORDER BY id",
    )
    .bind(tenant)
    .bind(session)
    .fetch_all(&mut *tx)
    .await
    .map_err(db("reading session messages"))?;
    let messages = rows
        .into_iter()
        .map(|(run_id, body)| Ok((run_id, super::codec::from_json(&body, "message")?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    sqlx::query("INSERT INTO sessions (tenant, key, created_at) VALUES ($1, $2, $3)")
        .bind(tenant)
        .bind(&archived)
        .bind(ts)
        .execute(&mut *tx)
        .await
        .map_err(db("creating archived session"))?;
    sqlx::query("UPDATE messages SET session = $3 WHERE tenant = $1 AND session = $2")
        .bind(tenant)
        .bind(session)
        .bind(&archived)
        .execute(&mut *tx)
        .await
        .map_err(db("archiving messages"))?;
    tx.commit()
        .await
        .map_err(db("committing session archive"))?;
    Ok((archived, messages))
}

pub(super) async fn record_inbound(
    pool: &PgPool,
    tenant: &str,
    channel: &str,
    message_id: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO channel_messages (tenant, channel, message_id, received_at) \
         VALUES ($1, $2, $3, now()) ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(channel)
    .bind(message_id)
    .execute(pool)
    .await
    .map_err(db("recording inbound message"))?;
    Ok(done.rows_affected() == 1)
}
