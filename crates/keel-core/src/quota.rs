//! Tenant quotas (docs/quotas.md, OWASP LLM10): the limits of
//! `[[tenants]]`, checked against counters in the store so that they hold
//! across every node sharing it. A run is admitted here; a run in progress
//! spends its tenant's daily tool calls and tokens through the same counters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use keel_config::TenantConfig;
use keel_protocol::{Budget, QuotaKey, QuotaLimit, Store, StoreError};

/// A tenant refused again within this long of its last refusal has not
/// waited for its `Retry-After`.
const REPEAT_WINDOW: Duration = Duration::from_secs(1);

/// How long such a repeat waits for its 429. A client asking in a tight
/// loop is slowed to a few requests a second per connection, at no cost
/// of CPU to keel, instead of taking the machine from other tenants.
const REPEAT_DELAY: Duration = Duration::from_millis(250);

/// The limits of every configured tenant; a tenant not listed is unlimited.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    tenants: HashMap<String, TenantConfig>,
    /// When each tenant was last refused by this node (only configured
    /// tenants can be, so this stays as small as the configuration).
    refused: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Quotas {
    pub fn new(tenants: &[TenantConfig]) -> Self {
        Self {
            tenants: tenants.iter().map(|t| (t.id.clone(), t.clone())).collect(),
            refused: Arc::default(),
        }
    }

    /// Called with every refusal of a new run: a tenant refused again
    /// within [`REPEAT_WINDOW`] gets its answer after [`REPEAT_DELAY`].
    async fn slow_repeat(&self, tenant: &str) {
        let now = Instant::now();
        let last = self
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(tenant.to_owned(), now);
        if last.is_some_and(|at| now.duration_since(at) < REPEAT_WINDOW) {
            tokio::time::sleep(REPEAT_DELAY).await;
        }
    }

    /// The value of `limit` for `tenant`, if one is set.
    pub fn limit(&self, tenant: &str, limit: QuotaLimit) -> Option<u64> {
        let t = self.tenants.get(tenant)?;
        match limit {
            QuotaLimit::MaxConcurrentRuns => t.max_concurrent_runs,
            QuotaLimit::RunsPerMinute => t.runs_per_minute,
            QuotaLimit::ToolCallsPerDay => t.tool_calls_per_day,
            QuotaLimit::TokensPerDay => t.tokens_per_day,
            QuotaLimit::SpendUsdPerDay => t.spend_usd_per_day.map(keel_protocol::usd_to_micros),
            QuotaLimit::SpendUsdPerMonth => t.spend_usd_per_month.map(keel_protocol::usd_to_micros),
            // An agent's limits are the agent's (`crate::spend`).
            QuotaLimit::AgentSpendUsdPerDay | QuotaLimit::AgentSpendUsdPerMonth => None,
        }
    }
}

/// A request refused because its tenant is at a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaRejection {
    pub tenant: String,
    pub limit: QuotaLimit,
    /// The configured value of the limit (micro-USD for a spend limit).
    pub value: u64,
    /// Seconds until the limit can free up.
    pub retry_after_s: u64,
}

impl QuotaRejection {
    fn new(tenant: &str, limit: QuotaLimit, value: u64, at: DateTime<Utc>) -> Self {
        record_rejection(tenant, limit);
        Self {
            tenant: tenant.to_owned(),
            limit,
            value,
            retry_after_s: limit.retry_after_s(at),
        }
    }
}

impl std::fmt::Display for QuotaRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant `{}` is at its quota {} = {}; retry in {} s",
            self.tenant,
            self.limit,
            self.limit.readable_value(self.value),
            self.retry_after_s
        )
    }
}

/// Counts a refusal by quota, by tenant and limit (`/metrics`).
pub(crate) fn record_rejection(tenant: &str, limit: QuotaLimit) {
    metrics::counter!(
        "keel_quota_rejections_total",
        "tenant" => tenant.to_owned(),
        "limit" => limit.as_str(),
    )
    .increment(1);
}

/// What admitting a run took, to give back if the run is not created.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    minute: Option<QuotaKey>,
    slot: bool,
}

/// Admits a new run of `tenant`, or says which limit refuses it. Daily
/// and monthly limits already used up refuse it (it could do nothing); the per-minute
/// count and a concurrency slot are taken, each by one conditional write.
pub(crate) async fn admit(
    quotas: &Quotas,
    store: &dyn Store,
    tenant: &str,
    run_id: &str,
) -> Result<Result<Admitted, QuotaRejection>, StoreError> {
    let verdict = check_admission(quotas, store, tenant, run_id).await?;
    if verdict.is_err() {
        quotas.slow_repeat(tenant).await;
    }
    Ok(verdict)
}

async fn check_admission(
    quotas: &Quotas,
    store: &dyn Store,
    tenant: &str,
    run_id: &str,
) -> Result<Result<Admitted, QuotaRejection>, StoreError> {
    let now = keel_protocol::now();
    for daily in [
        QuotaLimit::ToolCallsPerDay,
        QuotaLimit::TokensPerDay,
        QuotaLimit::SpendUsdPerDay,
        QuotaLimit::SpendUsdPerMonth,
    ] {
        if let Some(value) = quotas.limit(tenant, daily)
            && store.quota_used(&QuotaKey::at(tenant, daily, now)).await? >= value
        {
            return Ok(Err(QuotaRejection::new(tenant, daily, value, now)));
        }
    }
    let mut admitted = Admitted::default();
    if let Some(value) = quotas.limit(tenant, QuotaLimit::RunsPerMinute) {
        let key = QuotaKey::at(tenant, QuotaLimit::RunsPerMinute, now);
        if store.quota_take(&key, 1, value).await?.is_none() {
            return Ok(Err(QuotaRejection::new(
                tenant,
                QuotaLimit::RunsPerMinute,
                value,
                now,
            )));
        }
        admitted.minute = Some(key);
    }
    if let Some(value) = quotas.limit(tenant, QuotaLimit::MaxConcurrentRuns) {
        if !store.take_run_slot(tenant, run_id, value).await? {
            give_back(store, run_id, admitted).await?;
            return Ok(Err(QuotaRejection::new(
                tenant,
                QuotaLimit::MaxConcurrentRuns,
                value,
                now,
            )));
        }
        admitted.slot = true;
    }
    Ok(Ok(admitted))
}

/// Gives back what admitting a run took when the run was not created
/// (a store error, or an idempotent repeat that returned an earlier run).
pub(crate) async fn give_back(
    store: &dyn Store,
    run_id: &str,
    admitted: Admitted,
) -> Result<(), StoreError> {
    if let Some(key) = admitted.minute {
        store.quota_give_back(&key, 1).await?;
    }
    if admitted.slot {
        store.release_run_slot(run_id).await?;
    }
    Ok(())
}

/// Spends one of the tenant's daily tool calls; the budget that ran out
/// when none is left.
pub(crate) async fn spend_tool_call(
    quotas: &Quotas,
    store: &dyn Store,
    tenant: &str,
) -> Result<Result<(), Budget>, StoreError> {
    let Some(value) = quotas.limit(tenant, QuotaLimit::ToolCallsPerDay) else {
        return Ok(Ok(()));
    };
    let key = QuotaKey::at(tenant, QuotaLimit::ToolCallsPerDay, keel_protocol::now());
    if store.quota_take(&key, 1, value).await?.is_some() {
        return Ok(Ok(()));
    }
    record_rejection(tenant, QuotaLimit::ToolCallsPerDay);
    Ok(Err(Budget::Quota(QuotaLimit::ToolCallsPerDay)))
}

/// Before a model call: the budget that ran out when the tenant's tokens
/// for today are used up.
pub(crate) async fn check_tokens(
    quotas: &Quotas,
    store: &dyn Store,
    tenant: &str,
) -> Result<Result<(), Budget>, StoreError> {
    let Some(value) = quotas.limit(tenant, QuotaLimit::TokensPerDay) else {
        return Ok(Ok(()));
    };
    let key = QuotaKey::at(tenant, QuotaLimit::TokensPerDay, keel_protocol::now());
    if store.quota_used(&key).await? < value {
        return Ok(Ok(()));
    }
    record_rejection(tenant, QuotaLimit::TokensPerDay);
    Ok(Err(Budget::Quota(QuotaLimit::TokensPerDay)))
}

/// After a model call: its tokens count against the tenant's day whatever
/// the limit, since they are spent; the next call is refused if they
/// reached it.
pub(crate) async fn spend_tokens(
    quotas: &Quotas,
    store: &dyn Store,
    tenant: &str,
    tokens: u64,
) -> Result<(), StoreError> {
    if tokens == 0 || quotas.limit(tenant, QuotaLimit::TokensPerDay).is_none() {
        return Ok(());
    }
    let key = QuotaKey::at(tenant, QuotaLimit::TokensPerDay, keel_protocol::now());
    store.quota_take(&key, tokens, u64::MAX).await?;
    Ok(())
}
