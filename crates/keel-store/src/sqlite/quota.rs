//! Tenant quota counters (migration 0005). Run by the writer thread, one
//! statement each: the conditional upsert adds only when the total stays
//! within the limit.

use rusqlite::{Connection, OptionalExtension, params};

use keel_protocol::{QuotaKey, QuotaLimit, StoreError};

use super::codec::{db, to_i64, to_u64, ts_to_sql};

pub(super) fn take(
    conn: &Connection,
    key: &QuotaKey,
    amount: u64,
    limit: u64,
) -> Result<Option<u64>, StoreError> {
    if amount > limit {
        return Ok(None);
    }
    let used: Option<i64> = conn
        .prepare_cached(
            "INSERT INTO quota_counters (tenant, quota, period, used, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?6) \
             ON CONFLICT (tenant, quota, period) DO UPDATE \
               SET used = used + excluded.used, updated_at = excluded.updated_at \
               WHERE used + excluded.used <= ?5 \
             RETURNING used",
        )
        .map_err(db("preparing quota take"))?
        .query_row(
            params![
                key.tenant,
                key.limit.as_str(),
                key.period,
                to_i64(amount, "quota amount")?,
                to_i64(limit.min(i64::MAX as u64), "quota limit")?,
                ts_to_sql(&keel_protocol::now()),
            ],
            |r| r.get(0),
        )
        .optional()
        .map_err(db("taking quota"))?;
    used.map(|u| to_u64(u, "quota counter")).transpose()
}

pub(super) fn give_back(conn: &Connection, key: &QuotaKey, amount: u64) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE quota_counters SET used = MAX(used - ?4, 0), updated_at = ?5 \
         WHERE tenant = ?1 AND quota = ?2 AND period = ?3",
    )
    .map_err(db("preparing quota give-back"))?
    .execute(params![
        key.tenant,
        key.limit.as_str(),
        key.period,
        to_i64(amount, "quota amount")?,
        ts_to_sql(&keel_protocol::now()),
    ])
    .map_err(db("giving back quota"))?;
    Ok(())
}

pub(super) fn used(conn: &Connection, key: &QuotaKey) -> Result<u64, StoreError> {
    let used: Option<i64> = conn
        .prepare_cached(
            "SELECT used FROM quota_counters WHERE tenant = ?1 AND quota = ?2 AND period = ?3",
        )
        .map_err(db("preparing quota read"))?
        .query_row(params![key.tenant, key.limit.as_str(), key.period], |r| {
            r.get(0)
        })
        .optional()
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

/// The counter and the slot row change in the writer's one transaction.
pub(super) fn take_slot(
    conn: &Connection,
    tenant: &str,
    run_id: &str,
    limit: u64,
) -> Result<bool, StoreError> {
    if take(conn, &slots_key(tenant), 1, limit)?.is_none() {
        return Ok(false);
    }
    conn.prepare_cached("INSERT INTO quota_run_slots (run_id, tenant) VALUES (?1, ?2)")
        .map_err(db("preparing run slot insert"))?
        .execute(params![run_id, tenant])
        .map_err(db("recording run slot"))?;
    Ok(true)
}

/// Gives back the run's slot, if it holds one; called inside the commit
/// that ends the run, so a slot is given back exactly once.
///
/// A lookup, then a delete, rather than `DELETE … RETURNING`: SQLite
/// collects a statement's returned rows in a temporary B-tree, built anew
/// at each run's end, and most runs hold no slot at all.
pub(super) fn release_slot(conn: &Connection, run_id: &str) -> Result<(), StoreError> {
    let tenant: Option<String> = conn
        .prepare_cached("SELECT tenant FROM quota_run_slots WHERE run_id = ?1")
        .map_err(db("preparing run slot lookup"))?
        .query_row([run_id], |r| r.get(0))
        .optional()
        .map_err(db("looking up run slot"))?;
    let Some(tenant) = tenant else {
        return Ok(());
    };
    conn.prepare_cached("DELETE FROM quota_run_slots WHERE run_id = ?1")
        .map_err(db("preparing run slot release"))?
        .execute([run_id])
        .map_err(db("releasing run slot"))?;
    give_back(conn, &slots_key(&tenant), 1)
}
