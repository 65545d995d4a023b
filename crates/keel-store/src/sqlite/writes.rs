//! The write operations, run by the writer thread inside a transaction.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use keel_protocol::{Commit, Event, Message, NewRun, RunRecord, RunStatus, StoreError, Usage};

use super::codec::{RUN_COLUMNS, RawRun, db, to_i64, to_json, to_u64, ts_to_sql};

pub(super) fn create_run(conn: &Connection, run: NewRun) -> Result<(RunRecord, bool), StoreError> {
    let tenant = run.principal.tenant.clone();
    if let Some(key) = &run.idempotency_key {
        let existing = conn
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = ?1 AND idempotency_key = ?2"
            ))
            .map_err(db("preparing idempotency lookup"))?
            .query_row(params![tenant, key], RawRun::from_row)
            .optional()
            .map_err(db("looking up idempotency key"))?;
        if let Some(raw) = existing {
            return Ok((raw.decode()?, false));
        }
    }

    let now = keel_protocol::now();
    let now_text = ts_to_sql(&now);
    conn.prepare_cached(
        "INSERT INTO sessions (tenant, key, created_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (tenant, key) DO NOTHING",
    )
    .map_err(db("preparing session insert"))?
    .execute(params![tenant, run.session, now_text])
    .map_err(db("inserting session"))?;

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
    conn.prepare_cached(
        "INSERT INTO runs (id, ord, tenant, session, agent, status, input, steps, usage, \
         metadata, state, principal, idempotency_key, last_seq, created_at, updated_at) \
         VALUES (?1, (SELECT COALESCE(MAX(ord), 0) + 1 FROM runs), ?2, ?3, ?4, ?5, ?6, 0, ?7, \
         ?8, ?9, ?10, ?11, 0, ?12, ?12)",
    )
    .map_err(db("preparing run insert"))?
    .execute(params![
        record.id,
        record.tenant,
        record.session,
        record.agent,
        record.status.as_str(),
        record.input,
        to_json(&record.usage, "usage")?,
        to_json(&record.metadata, "metadata")?,
        to_json(&record.state, "state")?,
        to_json(&record.principal, "principal")?,
        run.idempotency_key,
        now_text,
    ])
    .map_err(|e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => {
            StoreError::Conflict(format!("run {} already exists", record.id))
        }
        _ => StoreError::Backend(format!("inserting run: {e}")),
    })?;
    Ok((record, true))
}

/// A commit's update of its run's row, with or without its status.
/// SQLite rewrites a row's entries in every index on a column that an
/// UPDATE assigns, even to the value it had, and `status` is in two
/// indexes: naming it only when it changes spares two index pages of the
/// WAL at most commits (of about eleven). Both forms take the same twelve
/// parameters; the one without status leaves `?2` unused.
macro_rules! update_run {
    ($status:literal) => {
        concat!(
            "UPDATE runs SET ",
            $status,
            "output = COALESCE(?3, output), \
             pending = CASE WHEN ?4 THEN ?5 ELSE pending END, \
             steps = COALESCE(?6, steps), \
             usage = COALESCE(?7, usage), \
             error = COALESCE(?8, error), \
             state = COALESCE(?9, state), \
             last_seq = ?10, \
             updated_at = ?11, \
             last_call = COALESCE(?12, last_call) \
             WHERE id = ?1"
        )
    };
}

const UPDATE_RUN_AND_STATUS: &str = update_run!("status = ?2, ");
const UPDATE_RUN: &str = update_run!("");

pub(super) fn commit(
    conn: &Connection,
    run_id: &str,
    commit: Commit,
) -> Result<Vec<Event>, StoreError> {
    let (last_seq, last_call): (i64, i64) = conn
        .prepare_cached("SELECT last_seq, last_call FROM runs WHERE id = ?1")
        .map_err(db("preparing run lookup"))?
        .query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(db("looking up run"))?
        .ok_or(StoreError::NotFound)?;
    let last_call = super::call_rows::last_place(last_call, &commit.calls)?;
    // The records and the messages ride in the events row when there is
    // one (schema v11 and v12), the messages compressed against its events
    // (v13, `row_text`).
    let mut calls_column = None;
    let mut messages_text = if commit.messages.is_empty() {
        None
    } else {
        Some(message_lines(&commit.messages)?)
    };

    let ts = keel_protocol::now();
    let ts_text = ts_to_sql(&ts);
    let last = to_u64(last_seq, "last_seq")?;
    let events = crate::numbering::number_events(run_id, last, ts, commit.events)?;
    let seq = events.last().map_or(last, |e| e.seq);
    if let (Some(first), Some(newest)) = (events.first(), events.last()) {
        // One row per commit (schema v9): the events one per line,
        // compressed when that shrinks them (`row_text`).
        let mut body = String::with_capacity(events.len() * 256);
        for event in &events {
            if !body.is_empty() {
                body.push('\n');
            }
            body.push_str(event.json().map_err(crate::numbering::event_encoding)?);
        }
        calls_column = super::call_rows::column(&commit.calls);
        let messages_column = messages_text
            .take()
            .map(|text| super::row_text::encode_against(text, &body));
        conn.prepare_cached(
            "INSERT INTO events (run_id, seq, last_seq, body, ts, calls, messages) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(db("preparing event insert"))?
        .execute(params![
            run_id,
            to_i64(first.seq, "seq")?,
            to_i64(newest.seq, "seq")?,
            super::row_text::encode(body),
            ts_text,
            calls_column,
            messages_column,
        ])
        .map_err(db("inserting events"))?;
    }

    if let Some(text) = messages_text {
        // No events row to ride in: a row of its own, placed after the
        // newest events row so that reads keep the order they were written
        // in (migration 0012).
        let body = super::row_text::encode(text);
        conn.prepare_cached(
            "INSERT INTO messages (tenant, session, run_id, body, after_event) \
             SELECT tenant, session, id, ?2, (SELECT max(id) FROM events) \
             FROM runs WHERE id = ?1",
        )
        .map_err(db("preparing message insert"))?
        .execute(params![run_id, body])
        .map_err(db("inserting messages"))?;
    }

    for approval in &commit.approvals {
        super::approvals::insert(conn, approval)?;
    }

    if calls_column.is_none() && !commit.calls.is_empty() {
        super::call_rows::insert_rows(conn, run_id, &commit.calls)?;
    }

    let patch = commit.patch.unwrap_or_default();
    let patch_ends_run = patch.status.is_some_and(RunStatus::is_terminal);
    // `pending` has three states (keep, clear, set), hence the flag next to the value.
    let (set_pending, pending) = match &patch.pending {
        None => (false, None),
        Some(None) => (true, None),
        Some(Some(p)) => (true, Some(to_json(p, "pending")?)),
    };
    let update = if patch.status.is_some() {
        UPDATE_RUN_AND_STATUS
    } else {
        UPDATE_RUN
    };
    conn.prepare_cached(update)
        .map_err(db("preparing run update"))?
        .execute(params![
            run_id,
            patch.status.map(RunStatus::as_str),
            patch.output,
            set_pending,
            pending,
            patch.steps,
            patch.usage.map(|u| to_json(&u, "usage")).transpose()?,
            patch.error.map(|e| to_json(&e, "error")).transpose()?,
            patch.state,
            to_i64(seq, "last_seq")?,
            ts_text,
            last_call,
        ])
        .map_err(db("updating run"))?;
    if patch_ends_run {
        super::quota::release_slot(conn, run_id)?;
    }
    Ok(events)
}

/// `messages` as compact JSON, one per line.
fn message_lines(messages: &[Message]) -> Result<String, StoreError> {
    let mut text = String::with_capacity(messages.len() * 384);
    for message in messages {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&to_json(message, "message")?);
    }
    Ok(text)
}

/// Moves the session's messages to `<session>~<timestamp>` (a session of its
/// own) and returns them, oldest first, with the run that wrote each.
pub(super) fn archive_session(
    conn: &Connection,
    tenant: &str,
    session: &str,
) -> Result<serde_json::Value, StoreError> {
    let exists = conn
        .prepare_cached("SELECT 1 FROM sessions WHERE tenant = ?1 AND key = ?2")
        .map_err(db("preparing session lookup"))?
        .exists(params![tenant, session])
        .map_err(db("reading session"))?;
    if !exists {
        return Err(StoreError::NotFound);
    }
    let busy = conn
        .prepare_cached(
            "SELECT 1 FROM runs WHERE tenant = ?1 AND session = ?2 \
             AND status NOT IN ('completed', 'failed', 'cancelled')",
        )
        .map_err(db("preparing busy-session check"))?
        .exists(params![tenant, session])
        .map_err(db("checking session runs"))?;
    if busy {
        return Err(StoreError::Conflict(format!(
            "session {session} has a run still going; wait for it or cancel it first"
        )));
    }
    let now = keel_protocol::now();
    let archived = format!("{session}~{}", now.format("%Y%m%dT%H%M%S%.6fZ"));
    let messages = super::reads::with_their_runs(conn, tenant, session)?;
    conn.prepare_cached("INSERT INTO sessions (tenant, key, created_at) VALUES (?1, ?2, ?3)")
        .map_err(db("preparing archived session insert"))?
        .execute(params![tenant, archived, ts_to_sql(&now)])
        .map_err(db("creating archived session"))?;
    // The messages leave both their places (migration 0012) and become
    // rows of `messages` under the archived key, one each, in their order.
    conn.prepare_cached("DELETE FROM messages WHERE tenant = ?1 AND session = ?2")
        .map_err(db("preparing message archive"))?
        .execute(params![tenant, session])
        .map_err(db("archiving messages"))?;
    conn.prepare_cached(
        "UPDATE events SET messages = NULL WHERE messages IS NOT NULL \
         AND run_id IN (SELECT id FROM runs WHERE tenant = ?1 AND session = ?2)",
    )
    .map_err(db("preparing message archive"))?
    .execute(params![tenant, session])
    .map_err(db("archiving messages"))?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO messages (tenant, session, run_id, body) VALUES (?1, ?2, ?3, ?4)",
        )
        .map_err(db("preparing message archive"))?;
    for (run_id, message) in &messages {
        insert
            .execute(params![
                tenant,
                archived,
                run_id,
                to_json(message, "message")?
            ])
            .map_err(db("archiving messages"))?;
    }
    serde_json::to_value((archived, messages))
        .map_err(|e| StoreError::Backend(format!("encoding archived session: {e}")))
}

pub(super) fn record_inbound(
    conn: &Connection,
    tenant: &str,
    channel: &str,
    message_id: &str,
) -> Result<bool, StoreError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO channel_messages (tenant, channel, message_id, received_at) \
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
        )
        .map_err(db("preparing inbound message record"))?
        .execute(params![
            tenant,
            channel,
            message_id,
            ts_to_sql(&keel_protocol::now())
        ])
        .map_err(db("recording inbound message"))?;
    Ok(inserted == 1)
}
