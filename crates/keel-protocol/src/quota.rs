//! Tenant quota counters as the store keeps them (docs/quotas.md).
//!
//! A counter is a number per (tenant, counter, period): the period is the
//! UTC minute or day it counts in, or empty for a counter that is not per
//! period (runs in progress). The store changes one only with a single
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
}

impl QuotaLimit {
    /// The config key of the limit, also its name in errors and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxConcurrentRuns => "max_concurrent_runs",
            Self::RunsPerMinute => "runs_per_minute",
            Self::ToolCallsPerDay => "tool_calls_per_day",
            Self::TokensPerDay => "tokens_per_day",
        }
    }

    /// The period a count at `at` belongs to, as stored.
    pub fn period(self, at: DateTime<Utc>) -> String {
        match self {
            Self::MaxConcurrentRuns => String::new(),
            Self::RunsPerMinute => at.format("%Y-%m-%dT%H:%M").to_string(),
            Self::ToolCallsPerDay | Self::TokensPerDay => at.format("%Y-%m-%d").to_string(),
        }
    }

    /// Whole seconds from `at` until the limit can free up: the end of the
    /// minute or of the UTC day. Runs in progress end at no known time;
    /// a client is told to try again shortly.
    pub fn retry_after_s(self, at: DateTime<Utc>) -> u64 {
        let until = match self {
            Self::MaxConcurrentRuns => return CONCURRENCY_RETRY_S,
            Self::RunsPerMinute => at
                .with_second(0)
                .and_then(|t| t.with_nanosecond(0))
                .map(|t| t + Duration::minutes(1)),
            Self::ToolCallsPerDay | Self::TokensPerDay => Utc
                .with_ymd_and_hms(at.year(), at.month(), at.day(), 0, 0, 0)
                .single()
                .map(|t| t + Duration::days(1)),
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

/// One counter in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey {
    pub tenant: String,
    pub limit: QuotaLimit,
    pub period: String,
}

impl QuotaKey {
    /// The counter of `limit` for the period that holds `at`.
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
    }
}
