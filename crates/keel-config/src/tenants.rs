//! Per-tenant quotas (docs/quotas.md): limits on how much one tenant may
//! consume, so that one tenant cannot exhaust the service for the others.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One tenant's quotas; a limit left unset is unlimited. Counters live in
/// the store, so the limits hold across every node sharing it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant, as `[[auth.keys]] tenant` names it (`default` without keys).
    #[schemars(example = &"acme")]
    pub id: String,
    /// Runs of the tenant not yet finished (queued, running or waiting);
    /// a new run beyond it is refused with 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 10)]
    pub max_concurrent_runs: Option<u64>,
    /// Runs started per calendar minute (UTC); beyond it 429 until the
    /// minute ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 60)]
    pub runs_per_minute: Option<u64>,
    /// Server-side tool calls per UTC day; a run that reaches it ends with
    /// `budget_exhausted`, a new run gets 429 until the day ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 5000)]
    pub tool_calls_per_day: Option<u64>,
    /// Model tokens (prompt and completion) per UTC day; as for
    /// `tool_calls_per_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 2000000)]
    pub tokens_per_day: Option<u64>,
    /// Model spend per UTC day in USD, at the prices of `[[providers]]
    /// price` (docs/spend.md); each model call reserves its worst-case cost
    /// first, so the limit is never passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 20.0)]
    pub spend_usd_per_day: Option<f64>,
    /// As `spend_usd_per_day`, per UTC calendar month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 400.0)]
    pub spend_usd_per_month: Option<f64>,
}

impl TenantConfig {
    /// The limits as (key, value) pairs, for checks that treat them alike.
    pub fn limits(&self) -> [(&'static str, Option<u64>); 4] {
        [
            ("max_concurrent_runs", self.max_concurrent_runs),
            ("runs_per_minute", self.runs_per_minute),
            ("tool_calls_per_day", self.tool_calls_per_day),
            ("tokens_per_day", self.tokens_per_day),
        ]
    }

    /// The spend limits in USD as (key, value) pairs.
    pub fn spend_limits(&self) -> [(&'static str, Option<f64>); 2] {
        [
            ("spend_usd_per_day", self.spend_usd_per_day),
            ("spend_usd_per_month", self.spend_usd_per_month),
        ]
    }
}
