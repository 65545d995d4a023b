//! Tenant quota counters (migration 0005). Nodes write concurrently: each
//! change is one statement whose row lock and condition decide, so two
//! nodes never together pass a limit (no read-then-write).

use sqlx::{PgPool, Postgres, Transaction};

use keel_protocol::{QuotaKey, QuotaLimit, StoreError};

use super::codec::{db, to_i64, to_u64};

async fn take_in(
    executor: impl sqlx::PgExecutor<'_>,
    key: &QuotaKey,
    amount: u64,
    limit: u64,
) -> Result<Option<u64>, StoreError> {
    if amount > limit {
        return Ok(None);
    }
    // ON CONFLICT DO UPDATE locks the row; a concurrent take waits and then
    // evaluates the condition against the total the first one wrote.
    let used: Option<i64> = sqlx::query_scalar(
        "INSERT INTO quota_counters (tenant, quota, period, used, updated_at) \
         VALUES ($1, $2, $3, $4, now()) \
         ON CONFLICT (tenant, quota, period) DO UPDATE \
           SET used = quota_counters.used + EXCLUDED.used, updated_at = now() \
           WHERE quota_counters.used + EXCLUDED.used <= $5 \
         RETURNING used",
    )
    .bind(&key.tenant)
    .bind(key.limit.as_str())
    .bind(&key.period)
    .bind(to_i64(amount, "quota amount")?)
    .bind(to_i64(limit.min(i64::MAX as u64), "quota limit")?)
    .fetch_optional(executor)
    .await
    .map_err(db("taking quota"))?;
    used.map(|u| to_u64(u, "quota counter")).transpose()
}

async fn give_back_in(
    executor: impl sqlx::PgExecutor<'_>,
    key: &QuotaKey,
    amount: u64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE quota_counters SET used = GREATEST(used - $4, 0), updated_at = now() \
         WHERE tenant = $1 AND quota = $2 AND period = $3",
    )
    .bind(&key.tenant)
    .bind(key.limit.as_str())
    .bind(&key.period)
    .bind(to_i64(amount, "quota amount")?)
    .execute(executor)
    .await
    .map_err(db("giving back quota"))?;
    Ok(())
}

pub(super) async fn take(
    pool: &PgPool,
    key: &QuotaKey,
    amount: u64,
    limit: u64,
) -> Result<Option<u64>, StoreError> {
    take_in(pool, key, amount, limit).await
}

pub(super) async fn give_back(
    pool: &PgPool,
    key: &QuotaKey,
    amount: u64,
) -> Result<(), StoreError> {
    give_back_in(pool, key, amount).await
}

pub(super) async fn used(pool: &PgPool, key: &QuotaKey) -> Result<u64, StoreError> {
    let used: Option<i64> = sqlx::query_scalar(
        "SELECT used FROM quota_counters WHERE tenant = $1 AND quota = $2 AND period = $3",
    )
    .bind(&key.tenant)
    .bind(key.limit.as_str())
    .bind(&key.period)
    .fetch_optional(pool)
    .await
    .map_err(db("reading quota"))?;
    to_u64(used.unwrap_or(0), "quota counter")
}

fn slots_key(tenant: &str) -> QuotaKey {
    QuotaKey {
        tenant: tenant.to_owned(),
        limit: QuotaLimit::MaxConcurrentRuns,
        period: String::new(),
    }
}

/// The counter and the slot row change in one transaction.
pub(super) async fn take_slot(
    pool: &PgPool,
    tenant: &str,
    run_id: &str,
    limit: u64,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await.map_err(db("starting transaction"))?;
    if take_in(&mut *tx, &slots_key(tenant), 1, limit)
        .await?
        .is_none()
    {
        tx.rollback().await.map_err(db("rolling back run slot"))?;
        return Ok(false);
    }
    sqlx::query("INSERT INTO quota_run_slots (run_id, tenant) VALUES ($1, $2)")
        .bind(run_id)
        .bind(tenant)
        .execute(&mut *tx)
        .await
        .map_err(db("recording run slot"))?;
    tx.commit().await.map_err(db("committing run slot"))?;
    Ok(true)
}

/// Gives back the run's slot, if it holds one, inside `tx`: the commit that
/// ends the run, so a slot is given back exactly once.
pub(super) async fn release_slot_in(
    tx: &mut Transaction<'_, Postgres>,
    run_id: &str,
) -> Result<(), StoreError> {
    let tenant: Option<String> =
        sqlx::query_scalar("DELETE FROM quota_run_slots WHERE run_id = $1 RETURNING tenant")
            .bind(run_id)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db("releasing run slot"))?;
    match tenant {
        Some(tenant) => give_back_in(&mut **tx, &slots_key(&tenant), 1).await,
        None => Ok(()),
    }
}

pub(super) async fn release_slot(pool: &PgPool, run_id: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(db("starting transaction"))?;
    release_slot_in(&mut tx, run_id).await?;
    tx.commit()
        .await
        .map_err(db("committing run slot release"))?;
    Ok(())
}
