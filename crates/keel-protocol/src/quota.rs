//! Tenant quota and spend counters as the store keeps them (docs/quotas.md,
//! docs/spend.md).
//!
//! A counter is a number per (owner, counter, period): the owner is the
//! tenant, or the agent for an agent's spend limits; the period is the UTC
//! minute, day or month it counts in, or empty for a counter that is not
//! per period (runs in progress). The store changes one only with a single
//! conditional statement, so nodes sharing it never together exceed a limit.

use chrono::{DateTime, Datelike, Duration, TimeZone, Timelike, Utc};
use serde::{Deserialize, Serialize};

/// What a tenant limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuotaLimit {
    MaxConcurrentRuns,
    RunsPerMinute,
    ToolCallsPerDay,
    TokensPerDay,
    /// The tenant's model spend per UTC day, counted in micro-USD.
    SpendUsdPerDay,
    /// The tenant's model spend per UTC calendar month, in micro-USD.
    SpendUsdPerMonth,
    /// An agent's model spend per UTC day over all tenants, in micro-USD.
    AgentSpendUsdPerDay,
    /// An agent's model spend per UTC calendar month, in micro-USD.
    AgentSpendUsdPerMonth,
}

impl QuotaLimit {
    /// The config key of the limit, also its name in errors and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxConcurrentRuns => "max_concurrent_runs",
            Self::RunsPerMinute => "runs_per_minute",
            Self::ToolCallsPerDay => "tool_calls_per_day",
            Self::TokensPerDay => "tokens_per_day",
            Self::SpendUsdPerDay => "spend_usd_per_day",
            Self::SpendUsdPerMonth => "spend_usd_per_month",
            Self::AgentSpendUsdPerDay => "agent_spend_usd_per_day",
            Self::AgentSpendUsdPerMonth => "agent_spend_usd_per_month",
        }
    }

    /// Whether the counter holds micro-USD (a spend limit) rather than a count.
    pub fn is_spend(self) -> bool {
        matches!(
            self,
            Self::SpendUsdPerDay
                | Self::SpendUsdPerMonth
                | Self::AgentSpendUsdPerDay
                | Self::AgentSpendUsdPerMonth
        )
    }

    /// A limit's value as people read it: a count, or USD for a spend
    /// limit (stored in micro-USD).
    pub fn readable_value(self, value: u64) -> serde_json::Number {
        if self.is_spend() {
            serde_json::Number::from_f64(value as f64 / MICROS_PER_USD as f64)
                .unwrap_or_else(|| serde_json::Number::from(value))
        } else {
            serde_json::Number::from(value)
        }
    }

    /// The period a count at `at` belongs to, as stored.
    pub fn period(self, at: DateTime<Utc>) -> String {
        match self {
            Self::MaxConcurrentRuns => String::new(),
            Self::RunsPerMinute => at.format("%Y-%m-%dT%H:%M").to_string(),
            Self::ToolCallsPerDay
            | Self::TokensPerDay
            | Self::SpendUsdPerDay
            | Self::AgentSpendUsdPerDay => at.format("%Y-%m-%d").to_string(),
            Self::SpendUsdPerMonth | Self::AgentSpendUsdPerMonth => at.format("%Y-%m").to_string(),
        }
    }

    /// Whole seconds from `at` until the limit can free up: the end of the
    /// minute, of the UTC day or of the UTC month. Runs in progress end at no known time;
    /// a client is told to try again shortly.
    pub fn retry_after_s(self, at: DateTime<Utc>) -> u64 {
        let until = match self {
            Self::MaxConcurrentRuns => return CONCURRENCY_RETRY_S,
            Self::RunsPerMinute => at
                .with_second(0)
                .and_then(|t| t.with_nanosecond(0))
                .map(|t| t + Duration::minutes(1)),
            Self::ToolCallsPerDay
            | Self::TokensPerDay
            | Self::SpendUsdPerDay
            | Self::AgentSpendUsdPerDay => Utc
                .with_ymd_and_hms(at.year(), at.month(), at.day(), 0, 0, 0)
                .single()
                .map(|t| t + Duration::days(1)),
            Self::SpendUsdPerMonth | Self::AgentSpendUsdPerMonth => {
                let (year, month) = if at.month() == 12 {
                    (at.year() + 1, 1)
                } else {
                    (at.year(), at.month() + 1)
                };
                Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0).single()
            }
        };
        let Some(until) = until else {
            return 1;
        };
        // Rounded up, so that a client waiting that long is past the boundary.
        let ms = (until - at).num_milliseconds().max(0);
        u64::try_from((ms + 999) / 1000).unwrap_or(1).max(1)
    }
}

impl std::fmt::Display for QuotaLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Seconds a client refused for concurrency is told to wait.
pub const CONCURRENCY_RETRY_S: u64 = 5;

/// Spend counters count micro-USD, so that prices and limits add up
/// exactly in integers.
pub const MICROS_PER_USD: u64 = 1_000_000;

/// USD as micro-USD, rounded up (a limit or a cost is never rounded away).
pub fn usd_to_micros(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * MICROS_PER_USD as f64).ceil() as u64
    } else {
        0
    }
}

/// One counter in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey {
    pub tenant: String,
    pub limit: QuotaLimit,
    pub period: String,
}

impl QuotaKey {
    /// The counter of `limit` for the period that holds `at`; `tenant` is
    /// the owner, the agent's id for an agent's spend limits.
    pub fn at(tenant: &str, limit: QuotaLimit, at: DateTime<Utc>) -> Self {
        Self {
            tenant: tenant.to_owned(),
            limit,
            period: limit.period(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn retry_after_reaches_the_boundary() {
        let at = t("2026-03-01T10:15:42.300Z");
        assert_eq!(QuotaLimit::RunsPerMinute.retry_after_s(at), 18);
        assert_eq!(
            QuotaLimit::TokensPerDay.retry_after_s(at),
            13 * 3600 + 44 * 60 + 18
        );
        assert_eq!(
            QuotaLimit::MaxConcurrentRuns.retry_after_s(at),
            CONCURRENCY_RETRY_S
        );
        // Exactly on the boundary the next period is a whole period away.
        assert_eq!(
            QuotaLimit::RunsPerMinute.retry_after_s(t("2026-03-01T10:15:00Z")),
            60
        );
    }

    #[test]
    fn periods() {
        let at = t("2026-12-31T23:59:59Z");
        assert_eq!(QuotaLimit::RunsPerMinute.period(at), "2026-12-31T23:59");
        assert_eq!(QuotaLimit::ToolCallsPerDay.period(at), "2026-12-31");
        assert_eq!(QuotaLimit::MaxConcurrentRuns.period(at), "");
        assert_eq!(QuotaLimit::SpendUsdPerDay.period(at), "2026-12-31");
        assert_eq!(QuotaLimit::AgentSpendUsdPerMonth.period(at), "2026-12");
    }

    #[test]
    fn a_monthly_limit_frees_at_the_next_month_across_the_year() {
        assert_eq!(
            QuotaLimit::SpendUsdPerMonth.retry_after_s(t("2026-12-31T23:59:59Z")),
            1
        );
        assert_eq!(
            QuotaLimit::SpendUsdPerMonth.retry_after_s(t("2026-02-27T00:00:00Z")),
            2 * 86_400
        );
    }

    #[test]
    fn spend_values_read_in_usd_and_round_up() {
        assert_eq!(usd_to_micros(2.5), 2_500_000);
        assert_eq!(usd_to_micros(0.0000001), 1);
        assert_eq!(usd_to_micros(-1.0), 0);
        assert_eq!(
            QuotaLimit::SpendUsdPerDay
                .readable_value(1_500_000)
                .to_string(),
            "1.5"
        );
        assert_eq!(
            QuotaLimit::RunsPerMinute.readable_value(60).to_string(),
            "60"
        );
    }
}
