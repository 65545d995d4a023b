//! The read queries, run on pooled read-only connections.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, params};

use keel_protocol::{Event, Message, RunFilter, RunPage, RunRecord, StoreError};

use super::codec::{RUN_COLUMNS, RawRun, db, from_json, to_i64, to_u64};

/// Page size when the caller asks for none, and the most one page may hold.
const DEFAULT_PAGE: u32 = 20;
const MAX_PAGE: u32 = 100;

pub(super) fn get_run(
    conn: &Connection,
    tenant: &str,
    id: &str,
) -> Result<Option<RunRecord>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1 AND tenant = ?2"
    ))
    .map_err(db("preparing run lookup"))?
    .query_row(params![id, tenant], RawRun::from_row)
    .optional()
    .map_err(db("reading run"))?
    .map(RawRun::decode)
    .transpose()
}

/// Newest first. The cursor is the creation order of the last run of the
/// previous page; it is opaque to callers.
pub(super) fn list_runs(
    conn: &Connection,
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
    let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE tenant = ?");
    let mut args: Vec<rusqlite::types::Value> = vec![tenant.to_owned().into()];
    for (column, value) in [
        ("session", filter.session.as_deref()),
        ("agent", filter.agent.as_deref()),
        ("status", filter.status.map(|s| s.as_str())),
    ] {
        if let Some(v) = value {
            sql.push_str(&format!(" AND {column} = ?"));
            args.push(v.to_owned().into());
        }
    }
    sql.push_str(" AND ord < ? ORDER BY ord DESC LIMIT ?");
    args.push(before.into());
    // One more than asked tells whether another page follows.
    args.push((i64::from(limit) + 1).into());

    let mut stmt = conn
        .prepare_cached(&sql)
        .map_err(db("preparing run listing"))?;
    let raws = stmt
        .query_map(rusqlite::params_from_iter(args), RawRun::from_row)
        .map_err(db("listing runs"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(db("reading listed runs"))?;

    let more = raws.len() > limit as usize;
    let mut runs = Vec::with_capacity(raws.len().min(limit as usize));
    let mut last_ord = None;
    for raw in raws.into_iter().take(limit as usize) {
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

pub(super) fn events_after(
    conn: &Connection,
    run_id: &str,
    after: u64,
    limit: u32,
) -> Result<Vec<Event>, StoreError> {
    // Every stored seq is below i64::MAX, so clamping keeps the meaning.
    let after_sql = to_i64(after, "seq").unwrap_or(i64::MAX);
    // A row holds one commit's events `seq..=last_seq`, one per line (schema
    // v9): the rows whose last event is past the cursor, in order, until
    // `limit` events. Lines at or before the cursor are skipped unparsed.
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, body FROM events WHERE run_id = ?1 AND last_seq > ?2 ORDER BY last_seq",
        )
        .map_err(db("preparing event query"))?;
    let mut rows = stmt
        .query(params![run_id, after_sql])
        .map_err(db("reading events"))?;
    let wanted = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut events = Vec::new();
    while events.len() < wanted {
        let Some(row) = rows.next().map_err(db("reading events"))? else {
            break;
        };
        let first = to_u64(row.get(0).map_err(db("reading event"))?, "seq")?;
        let body = super::row_text::decode(row.get_ref(1).map_err(db("reading event"))?, "events")?;
        // Its lines `first..=after` are behind the cursor.
        let behind = after.checked_sub(first).map_or(0, |d| d.saturating_add(1));
        let skip = usize::try_from(behind).unwrap_or(usize::MAX);
        for line in body.split('\n').skip(skip) {
            events.push(from_json::<Event>(line, "event")?);
            if events.len() == wanted {
                break;
            }
        }
    }
    Ok(events)
}

/// A session's messages from the two places a commit's messages may be,
/// in one order (migration 0012): events rows by id; rows of `messages`
/// after the events row they name, or, written before there was one to
/// name, before all. `$runs` is a condition on each row's run `r`, and
/// `$first` a term to order by before that order. Both queries that read
/// messages are built from this one, so that they cannot disagree on it.
/// Parameters: `?1` tenant, `?2` session; a query may add its own. Each
/// row: the run, the messages' value and, for an events row, its events
/// (the dictionary its messages may be compressed against, `row_text`).
macro_rules! session_messages {
    ($runs:literal, $first:literal) => {
        concat!(
            "SELECT run_id, body, events FROM ( \
               SELECT m.run_id AS run_id, m.body AS body, NULL AS events, \
                      coalesce(m.after_event, -1) AS place, 1 AS after, m.id AS n \
               FROM messages m JOIN runs r ON r.id = m.run_id \
               WHERE m.tenant = ?1 AND m.session = ?2 AND ",
            $runs,
            " UNION ALL \
               SELECT e.run_id, e.messages, e.body, e.id, 0, 0 \
               FROM runs r JOIN events e ON e.run_id = r.id \
               WHERE r.tenant = ?1 AND r.session = ?2 AND e.messages IS NOT NULL AND ",
            $runs,
            " ) ORDER BY ",
            $first,
            "place, after, n"
        )
    };
}

/// `?3` the run's `ord`, `?4` its id: runs created before it, then its own.
const HISTORY: &str = session_messages!("(r.ord < ?3 OR r.id = ?4)", "run_id = ?4, ");
const WITH_THEIR_RUNS: &str = session_messages!("1", "");

/// Earlier runs' messages first, then the run's own, each in the order
/// they were written; runs created after this one are not part of its
/// history.
pub(super) fn history(conn: &Connection, run_id: &str) -> Result<Vec<Message>, StoreError> {
    let (tenant, session, ord): (String, String, i64) = conn
        .prepare_cached("SELECT tenant, session, ord FROM runs WHERE id = ?1")
        .map_err(db("preparing run lookup"))?
        .query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()
        .map_err(db("reading run"))?
        .ok_or(StoreError::NotFound)?;
    let mut stmt = conn
        .prepare_cached(HISTORY)
        .map_err(db("preparing history query"))?;
    let mut rows = stmt
        .query(params![tenant, session, ord, run_id])
        .map_err(db("reading history"))?;
    let mut messages = Vec::new();
    while let Some(row) = rows.next().map_err(db("reading history"))? {
        let body = row.get_ref(1).map_err(db("reading message"))?;
        let events = row.get_ref(2).map_err(db("reading message"))?;
        for_each_message(body, events, |message| messages.push(message))?;
    }
    Ok(messages)
}

pub(super) fn session_messages(
    conn: &Connection,
    tenant: &str,
    session: &str,
) -> Result<Option<Vec<(String, Message)>>, StoreError> {
    let exists = conn
        .prepare_cached("SELECT 1 FROM sessions WHERE tenant = ?1 AND key = ?2")
        .map_err(db("preparing session lookup"))?
        .exists(params![tenant, session])
        .map_err(db("reading session"))?;
    if !exists {
        return Ok(None);
    }
    Ok(Some(with_their_runs(conn, tenant, session)?))
}

/// The session's messages, oldest first, each with the run that wrote it.
pub(super) fn with_their_runs(
    conn: &Connection,
    tenant: &str,
    session: &str,
) -> Result<Vec<(String, Message)>, StoreError> {
    let mut stmt = conn
        .prepare_cached(WITH_THEIR_RUNS)
        .map_err(db("preparing session messages query"))?;
    let mut rows = stmt
        .query(params![tenant, session])
        .map_err(db("reading session messages"))?;
    let mut messages = Vec::new();
    while let Some(row) = rows.next().map_err(db("reading session messages"))? {
        let run_id: String = row.get(0).map_err(db("reading message"))?;
        let body = row.get_ref(1).map_err(db("reading message"))?;
        let events = row.get_ref(2).map_err(db("reading message"))?;
        for_each_message(body, events, |message| {
            messages.push((run_id.clone(), message));
        })?;
    }
    Ok(messages)
}

/// Hands over the messages of one commit in the order they were written:
/// a commit's messages share a value, one per line (`writes::commit`), and
/// rows of `messages` from earlier versions hold one each. `events` is the
/// events row's own events text, when the messages are in one.
fn for_each_message(
    body: ValueRef<'_>,
    events: ValueRef<'_>,
    mut each: impl FnMut(Message),
) -> Result<(), StoreError> {
    let text = super::row_text::decode_against(body, events)?;
    for line in text.split('\n') {
        each(from_json(line, "message")?);
    }
    Ok(())
}

pub(super) fn unfinished_runs(conn: &Connection) -> Result<Vec<RunRecord>, StoreError> {
    // The condition is the `runs_unfinished` partial index's, in the same
    // form (migration 0010): SQLite uses a partial index only for a query
    // whose terms include its condition's.
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs \
             WHERE status <> 'completed' AND status <> 'failed' AND status <> 'cancelled' \
             ORDER BY ord"
        ))
        .map_err(db("preparing unfinished runs query"))?;
    let raws = stmt
        .query_map([], RawRun::from_row)
        .map_err(db("listing unfinished runs"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(db("reading unfinished runs"))?;
    raws.into_iter().map(RawRun::decode).collect()
}

pub(super) fn ping(conn: &Connection) -> Result<(), StoreError> {
    conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))
        .map(|_| ())
        .map_err(db("pinging database"))
}
