//! Approval records: created inside a run's commit, decided exactly once.

use rusqlite::{Connection, OptionalExtension, params};

use keel_protocol::{ApprovalRecord, ApprovalStatus, StoreError};

use super::codec::{db, from_json, to_json, ts_to_sql};

pub(super) fn insert(conn: &Connection, a: &ApprovalRecord) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO approvals (id, tenant, run_id, status, created_at, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .map_err(db("preparing approval insert"))?
    .execute(params![
        a.id,
        a.tenant,
        a.run_id,
        a.status.as_str(),
        ts_to_sql(&a.created_at),
        to_json(a, "approval")?
    ])
    .map_err(db("inserting approval"))?;
    Ok(())
}

pub(super) fn get(
    conn: &Connection,
    tenant: &str,
    id: &str,
) -> Result<Option<ApprovalRecord>, StoreError> {
    let body: Option<String> = conn
        .prepare_cached("SELECT body FROM approvals WHERE id = ?1 AND tenant = ?2")
        .map_err(db("preparing approval lookup"))?
        .query_row(params![id, tenant], |r| r.get(0))
        .optional()
        .map_err(db("reading approval"))?;
    body.map(|b| from_json(&b, "approval")).transpose()
}

pub(super) fn list(
    conn: &Connection,
    tenant: &str,
    status: Option<ApprovalStatus>,
    limit: u32,
) -> Result<Vec<ApprovalRecord>, StoreError> {
    let limit = if limit == 0 { 100 } else { limit.min(1000) };
    let mut stmt = conn
        .prepare_cached(
            "SELECT body FROM approvals WHERE tenant = ?1 AND (?2 IS NULL OR status = ?2) \
             ORDER BY created_at, id LIMIT ?3",
        )
        .map_err(db("preparing approval list"))?;
    let rows = stmt
        .query_map(
            params![tenant, status.map(ApprovalStatus::as_str), limit],
            |r| r.get::<_, String>(0),
        )
        .map_err(db("listing approvals"))?;
    let mut out = Vec::new();
    for row in rows {
        out.push(from_json(
            &row.map_err(db("reading approval row"))?,
            "approval",
        )?);
    }
    Ok(out)
}

pub(super) fn decide(
    conn: &Connection,
    tenant: &str,
    id: &str,
    decision: ApprovalStatus,
    by: &str,
    reason: &str,
) -> Result<ApprovalRecord, StoreError> {
    let mut record = get(conn, tenant, id)?.ok_or(StoreError::NotFound)?;
    if record.status != ApprovalStatus::Pending {
        return Err(StoreError::Conflict(format!(
            "approval {id} was already decided ({})",
            record.status.as_str()
        )));
    }
    if decision == ApprovalStatus::Pending {
        return Err(StoreError::Conflict(
            "a decision cannot be `pending`".into(),
        ));
    }
    record.status = decision;
    record.decided_by = Some(by.to_owned());
    record.decision_reason = Some(reason.to_owned());
    record.decided_at = Some(keel_protocol::now());
    let changed = conn
        .prepare_cached("UPDATE approvals SET status = ?3, body = ?4 WHERE id = ?1 AND tenant = ?2 AND status = 'pending'")
        .map_err(db("preparing approval decision"))?
        .execute(params![id, tenant, decision.as_str(), to_json(&record, "approval")?])
        .map_err(db("deciding approval"))?;
    if changed != 1 {
        return Err(StoreError::Conflict(format!(
            "approval {id} was already decided"
        )));
    }
    Ok(record)
}
