//! The read queries; each is one statement on a pooled connection.

use sqlx::{PgPool, Row};

use keel_protocol::{Event, Message, RunFilter, RunPage, RunRecord, StoreError, StoredCall};

use super::codec::{RawRun, db, from_json, run_columns, to_i64, to_u64};

/// Page size when the caller asks for none, and the most one page may hold.
const DEFAULT_PAGE: u32 = 20;
const MAX_PAGE: u32 = 100;

pub(super) async fn get_run(
    pool: &PgPool,
    tenant: &str,
    id: &str,
) -> Result<Option<RunRecord>, StoreError> {
    sqlx::query(concat!(
        "SELECT ",
        run_columns!(),
        " FROM runs WHERE id = $1 AND tenant = $2"
    ))
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await
    .map_err(db("reading run"))?
    .map(|row| RawRun::from_row(&row)?.decode())
    .transpose()
}

/// Newest first. The cursor is the creation order of the last run of the
/// previous page; it is opaque to callers.
pub(super) async fn list_runs(
    pool: &PgPool,
    tenant: &str,
    filter: &RunFilter,
) -> Result<RunPage, StoreError> {
    let limit = match filter.limit {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    };
    let before = match &filter.cursor {
        None => i64::MAX,
        Some(cursor) => cursor
            .parse::<i64>()
            .ok()
            .filter(|ord| *ord > 0)
            .ok_or_else(|| StoreError::Conflict(format!("invalid cursor {cursor:?}")))?,
    };
    // One statement per filter combination, each able to use its own index.
    let mut query = sqlx::QueryBuilder::new(concat!(
        "SELECT ",
        run_columns!(),
        " FROM runs WHERE tenant = "
    ));
    query.push_bind(tenant);
    for (column, value) in [
        (" AND session = ", filter.session.as_deref()),
        (" AND agent = ", filter.agent.as_deref()),
        (" AND status = ", filter.status.map(|s| s.as_str())),
    ] {
        if let Some(v) = value {
            query.push(column).push_bind(v);
        }
    }
    query.push(" AND ord < ").push_bind(before);
    // One more than asked tells whether another page follows.
    query
        .push(" ORDER BY ord DESC LIMIT ")
        .push_bind(i64::from(limit) + 1);
    let rows = query
        .build()
        .fetch_all(pool)
        .await
        .map_err(db("listing runs"))?;

    let more = rows.len() > limit as usize;
    let mut runs = Vec::with_capacity(rows.len().min(limit as usize));
    let mut last_ord = None;
    for row in rows.iter().take(limit as usize) {
        let raw = RawRun::from_row(row)?;
        last_ord = Some(raw.ord);
        runs.push(raw.decode()?);
    }
    let next_cursor = if more {
        last_ord.map(|o| o.to_string())
    } else {
        None
    };
    Ok(RunPage { runs, next_cursor })
}

pub(super) async fn events_after(
    pool: &PgPool,
    run_id: &str,
    after: u64,
    limit: u32,
) -> Result<Vec<Event>, StoreError> {
    // Every stored seq is below i64::MAX, so clamping keeps the meaning.
    let after = to_i64(after, "seq").unwrap_or(i64::MAX);
    let bodies: Vec<String> = sqlx::query_scalar(
        "SELECT body::text FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(run_id)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await
    .map_err(db("reading events"))?;
    bodies.iter().map(|b| from_json(b, "event")).collect()
}

pub(super) async fn call_records(
    pool: &PgPool,
    run_id: &str,
    limit: u32,
) -> Result<Vec<StoredCall>, StoreError> {
    let rows =
        sqlx::query("SELECT n, record FROM run_calls WHERE run_id = $1 ORDER BY n DESC LIMIT $2")
            .bind(run_id)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await
            .map_err(db("reading call records"))?;
    let mut calls = rows
        .iter()
        .map(|r| {
            Ok(StoredCall {
                n: to_u64(
                    r.try_get(0).map_err(db("reading call record"))?,
                    "call record place",
                )?,
                record: r.try_get(1).map_err(db("reading call record"))?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    calls.reverse();
    Ok(calls)
}

/// Earlier runs' messages first, then the run's own, each in insertion
/// order; runs created after this one are not part of its history.
pub(super) async fn history(pool: &PgPool, run_id: &str) -> Result<Vec<Message>, StoreError> {
    let run = sqlx::query("SELECT tenant, session, ord FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(pool)
        .await
        .map_err(db("reading run"))?
        .ok_or(StoreError::NotFound)?;
    let tenant: String = run.try_get(0).map_err(db("reading run"))?;
    let session: String = run.try_get(1).map_err(db("reading run"))?;
    let ord: i64 = run.try_get(2).map_err(db("reading run"))?;
    let bodies: Vec<String> = sqlx::query_scalar(
        "SELECT m.body::text FROM messages m JOIN runs r ON r.id = m.run_id \
         WHERE m.tenant = $1 AND m.session = $2 AND (r.ord < $3 OR m.run_id = $4) \
         ORDER BY m.run_id = $4, m.id",
    )
    .bind(tenant)
    .bind(session)
    .bind(ord)
    .bind(run_id)
    .fetch_all(pool)
    .await
    .map_err(db("reading history"))?;
    bodies.iter().map(|b| from_json(b, "message")).collect()
}

pub(super) async fn session_messages(
    pool: &PgPool,
    tenant: &str,
    session: &str,
) -> Result<Option<Vec<(String, Message)>>, StoreError> {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sessions WHERE tenant = $1 AND key = $2)")
            .bind(tenant)
            .bind(session)
            .fetch_one(pool)
            .await
            .map_err(db("reading session"))?;
    if !exists {
        return Ok(None);
    }
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT run_id, body::text FROM messages WHERE tenant = $1 AND session = $2 ORDER BY id",
    )
    .bind(tenant)
    .bind(session)
    .fetch_all(pool)
    .await
    .map_err(db("reading session messages"))?;
    rows.into_iter()
        .map(|(run_id, body)| Ok((run_id, from_json(&body, "message")?)))
        .collect::<Result<Vec<_>, StoreError>>()
        .map(Some)
}

pub(super) async fn unfinished_runs(pool: &PgPool) -> Result<Vec<RunRecord>, StoreError> {
    // The condition matches the `runs_unfinished` partial index exactly.
    let rows = sqlx::query(concat!(
        "SELECT ",
        run_columns!(),
        " FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled') ORDER BY ord"
    ))
    .fetch_all(pool)
    .await
    .map_err(db("listing unfinished runs"))?;
    rows.iter()
        .map(|row| RawRun::from_row(row)?.decode())
        .collect()
}

pub(super) async fn ping(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(pool)
        .await
        .map(|_| ())
        .map_err(db("pinging database"))
}
