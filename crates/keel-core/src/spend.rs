//! Spend limits (docs/spend.md): a tenant's and an agent's model spend per
//! UTC day and month. Each model call reserves its worst-case cost in the
//! store before it is sent, by the same conditional write the quotas use,
//! and settles to its real cost after; so nodes sharing the store never
//! together pass a limit, whatever they do at the same moment.

use std::sync::Arc;

use keel_config::AgentConfig;
use keel_protocol::{
    Budget, ModelRequest, PreviousCost, QuotaKey, QuotaLimit, RequestGate, Store, StoreError,
    TokenUsage, usd_to_micros,
};

use crate::agent::AgentRuntime;
use crate::quota::{Quotas, record_rejection};

/// The output cap put on a call that names none when a spend limit needs
/// a bound for its worst case (and the provider configures none).
pub(crate) const DEFAULT_OUTPUT_CAP: u32 = 4096;

/// Tokens of framing per message and tool beyond their text (role and
/// call markers of the chat template), generously.
const FRAMING_TOKENS: u64 = 16;

/// What one model call holds against its counters until it settles: the
/// worst case of each request it sent (a client may send more than one:
/// retries, repairs).
#[derive(Debug)]
pub(crate) struct Reservation {
    /// Each counter taken from, with its limit.
    counters: Vec<(QuotaKey, u64)>,
    /// The worst case of one request.
    micros: u64,
    /// Requests reserved, `micros` each.
    requests: u64,
    /// Of those, requests that failed in a way that may have been billed,
    /// with no token counts to show for it: they stay reserved whole.
    unreported: u64,
}

/// Why a model call may not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A spend limit applies, and the model has no price.
    Unpriced,
    /// The worst case of the call does not fit in this limit.
    Limit(Budget),
}

/// The spend counters of `tenant` and `agent` for now, with their limits
/// in micro-USD.
fn counters(quotas: &Quotas, tenant: &str, agent: &AgentConfig) -> Vec<(QuotaKey, u64)> {
    let now = keel_protocol::now();
    let tenant_limits = [QuotaLimit::SpendUsdPerDay, QuotaLimit::SpendUsdPerMonth]
        .into_iter()
        .filter_map(|limit| {
            let value = quotas.limit(tenant, limit)?;
            Some((QuotaKey::at(tenant, limit, now), value))
        });
    let agent_limits = [
        (QuotaLimit::AgentSpendUsdPerDay, agent.spend_usd_per_day),
        (QuotaLimit::AgentSpendUsdPerMonth, agent.spend_usd_per_month),
    ]
    .into_iter()
    // The limit first: a counter's key formats the date, and most agents
    // set no spend limit of their own.
    .filter_map(|(limit, usd)| {
        let micros = usd_to_micros(usd?);
        Some((QuotaKey::at(&agent.id, limit, now), micros))
    });
    tenant_limits.chain(agent_limits).collect()
}

/// An upper bound of the request's prompt tokens: a token is at least one
/// byte of text in every byte-level tokenizer, so the bytes of every
/// message and tool schema, plus framing, are never fewer.
fn worst_prompt_tokens(request: &ModelRequest) -> u64 {
    let items = (request.messages.len() + request.tools.len() + 1) as u64;
    keel_protocol::model::estimate_tokens(request, 1.0).saturating_add(FRAMING_TOKENS * items)
}

/// Before a model call: reserves its worst-case cost against every spend
/// limit of the tenant and the agent, all or none. The call's output is
/// capped so that its worst case is bounded. `None` when no limit applies.
pub(crate) async fn reserve(
    quotas: &Quotas,
    store: &dyn Store,
    tenant: &str,
    agent: &AgentRuntime,
    request: &mut ModelRequest,
) -> Result<Result<Option<Reservation>, Refusal>, StoreError> {
    let counters = counters(quotas, tenant, &agent.config);
    if counters.is_empty() {
        return Ok(Ok(None));
    }
    let Some(price) = agent.price else {
        return Ok(Err(Refusal::Unpriced));
    };
    let cap = request
        .max_output_tokens
        .or(agent.max_output_tokens)
        .unwrap_or(DEFAULT_OUTPUT_CAP);
    request.max_output_tokens = Some(cap);
    let micros = price.cost_micros(worst_prompt_tokens(request), u64::from(cap));
    if micros == 0 {
        return Ok(Ok(None));
    }
    if let Err(which) = take_all(store, tenant, &counters, micros).await? {
        return Ok(Err(Refusal::Limit(which)));
    }
    Ok(Ok(Some(Reservation {
        counters,
        micros,
        requests: 1,
        unreported: 0,
    })))
}

/// Takes `micros` from every counter within its limit, all or none.
async fn take_all(
    store: &dyn Store,
    tenant: &str,
    counters: &[(QuotaKey, u64)],
    micros: u64,
) -> Result<Result<(), Budget>, StoreError> {
    for (i, (key, limit)) in counters.iter().enumerate() {
        if store.quota_take(key, micros, *limit).await?.is_none() {
            for (taken, _) in &counters[..i] {
                store.quota_give_back(taken, micros).await?;
            }
            record_rejection(tenant, key.limit);
            return Ok(Err(Budget::Quota(key.limit)));
        }
    }
    Ok(Ok(()))
}

/// The [`RequestGate`] of one model call under spend limits: each further
/// request the client would send (a retry, a repair) is reserved like the
/// first, or refused when its worst case no longer fits. A request the
/// provider refused unprocessed (rate limited) hands its reservation on.
pub(crate) struct SpendGate {
    store: Arc<dyn Store>,
    tenant: String,
    state: tokio::sync::Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    reservation: Option<Reservation>,
    refused: Option<Result<Budget, StoreError>>,
}

impl SpendGate {
    pub(crate) fn new(store: Arc<dyn Store>, tenant: &str, reservation: Reservation) -> Self {
        Self {
            store,
            tenant: tenant.to_owned(),
            state: tokio::sync::Mutex::new(GateState {
                reservation: Some(reservation),
                refused: None,
            }),
        }
    }

    /// Why a further request was refused, if one was: the limit it would
    /// have passed, or the store's failure to say.
    pub(crate) async fn refusal(&self) -> Option<Result<Budget, StoreError>> {
        self.state.lock().await.refused.take()
    }

    /// What the call holds, to settle once it answered.
    pub(crate) async fn take_reservation(&self) -> Option<Reservation> {
        self.state.lock().await.reservation.take()
    }
}

#[async_trait::async_trait]
impl RequestGate for SpendGate {
    async fn another_request(&self, previous: PreviousCost) -> bool {
        let mut state = self.state.lock().await;
        let GateState {
            reservation,
            refused,
        } = &mut *state;
        let Some(r) = reservation else {
            return true;
        };
        match previous {
            PreviousCost::Nothing => return true,
            PreviousCost::Unknown => r.unreported += 1,
            PreviousCost::Reported => {}
        }
        match take_all(self.store.as_ref(), &self.tenant, &r.counters, r.micros).await {
            Ok(Ok(())) => {
                r.requests += 1;
                true
            }
            Ok(Err(which)) => {
                *refused = Some(Ok(which));
                false
            }
            Err(e) => {
                *refused = Some(Err(e));
                false
            }
        }
    }
}

/// After a model call that answered: its cost replaces what was reserved
/// and is counted on `/metrics`. A reply without token counts is charged
/// its worst case, since nothing shows it cost less.
pub(crate) async fn settle(
    store: &dyn Store,
    tenant: &str,
    agent: &AgentRuntime,
    reservation: Option<Reservation>,
    usage: &TokenUsage,
) -> Result<(), StoreError> {
    let Some(price) = agent.price else {
        return Ok(());
    };
    let counted = usage.prompt_tokens > 0 || usage.completion_tokens > 0;
    // The requests that answered are in `usage`; one without counts is
    // charged its worst case, since nothing shows it cost less.
    let actual = match &reservation {
        Some(r) if !counted => r.micros.saturating_mul(r.requests - r.unreported),
        _ => price.cost_micros(usage.prompt_tokens, usage.completion_tokens),
    };
    metrics::counter!(
        "keel_spend_usd_micros_total",
        "tenant" => tenant.to_owned(),
        "agent" => agent.config.id.clone(),
        "model" => agent.model.model_name().to_owned(),
    )
    .increment(actual);
    let Some(r) = reservation else {
        return Ok(());
    };
    // Requests that may have been billed without counts stay reserved.
    let kept = actual.saturating_add(r.micros.saturating_mul(r.unreported));
    let reserved = r.micros.saturating_mul(r.requests);
    for (key, _) in &r.counters {
        if kept <= reserved {
            store.quota_give_back(key, reserved - kept).await?;
        } else {
            // Spent is spent: a reply that cost more than its bound is
            // counted whole, and the next call finds less left.
            store.quota_take(key, kept - reserved, u64::MAX).await?;
        }
    }
    Ok(())
}
