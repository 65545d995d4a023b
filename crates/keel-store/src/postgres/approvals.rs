//! Approval records: created inside a run's commit, decided exactly once.

use sqlx::{PgExecutor, PgPool};

use keel_protocol::{ApprovalRecord, ApprovalStatus, StoreError};

use super::codec::{db, from_json, is_unique_violation, to_json};

/// Most approvals one listing returns, and how many when the caller says 0.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;

pub(super) async fn insert(
    executor: impl PgExecutor<'_>,
    a: &ApprovalRecord,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO approvals (id, tenant, run_id, status, created_at, body) \
         VALUES ($1, $2, $3, $4, $5, $6::json)",
    )
    .bind(&a.id)
    .bind(&a.tenant)
    .bind(&a.run_id)
    .bind(a.status.as_str())
    .bind(a.created_at)
    .bind(to_json(a, "approval")?)
    .execute(executor)
    .await
    .map_err(|e| {
        if is_unique_violation(&e) {
            StoreError::Conflict(format!("approval {} already exists", a.id))
        } else {
            StoreError::Backend(format!("inserting approval: {e}"))
        }
    })?;
    Ok(())
}

pub(super) async fn get(
    pool: &PgPool,
    tenant: &str,
    id: &str,
) -> Result<Option<ApprovalRecord>, StoreError> {
    let body: Option<String> =
        sqlx::query_scalar("SELECT body::text FROM approvals WHERE id = $1 AND tenant = $2")
            .bind(id)
            .bind(tenant)
            .fetch_optional(pool)
            .await
            .map_err(db("reading approval"))?;
    body.map(|b| from_json(&b, "approval")).transpose()
}

pub(super) async fn list(
    pool: &PgPool,
    tenant: &str,
    status: Option<ApprovalStatus>,
    limit: u32,
) -> Result<Vec<ApprovalRecord>, StoreError> {
    let limit = if limit == 0 {
        DEFAULT_LIMIT
    } else {
        limit.min(MAX_LIMIT)
    };
    let bodies: Vec<String> = sqlx::query_scalar(
        "SELECT body::text FROM approvals WHERE tenant = $1 AND ($2::text IS NULL OR status = $2) \
         ORDER BY created_at, id LIMIT $3",
    )
    .bind(tenant)
    .bind(status.map(ApprovalStatus::as_str))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await
    .map_err(db("listing approvals"))?;
    bodies.iter().map(|b| from_json(b, "approval")).collect()
}

/// The row lock makes concurrent deciders take turns: the first one decides,
/// the others then read a status that is no longer `pending`.
pub(super) async fn decide(
    pool: &PgPool,
    tenant: &str,
    id: &str,
    decision: ApprovalStatus,
    by: &str,
    reason: &str,
) -> Result<ApprovalRecord, StoreError> {
    let mut tx = pool.begin().await.map_err(db("starting transaction"))?;
    let body: String = sqlx::query_scalar(
        "SELECT body::text FROM approvals WHERE id = $1 AND tenant = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db("locking approval"))?
    .ok_or(StoreError::NotFound)?;
    let mut record: ApprovalRecord = from_json(&body, "approval")?;
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
    let changed = sqlx::query(
        "UPDATE approvals SET status = $3, body = $4::json \
         WHERE id = $1 AND tenant = $2 AND status = 'pending'",
    )
    .bind(id)
    .bind(tenant)
    .bind(decision.as_str())
    .bind(to_json(&record, "approval")?)
    .execute(&mut *tx)
    .await
    .map_err(db("deciding approval"))?
    .rows_affected();
    if changed != 1 {
        return Err(StoreError::Conflict(format!(
            "approval {id} was already decided"
        )));
    }
    tx.commit().await.map_err(db("committing decision"))?;
    Ok(record)
}
