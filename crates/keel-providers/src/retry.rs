//! Backoff arithmetic shared by providers, kept apart so the limits are testable.

use std::time::{Duration, SystemTime};

/// Longest pause between two attempts that backoff alone may cause.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Longest pause a provider's `Retry-After` may impose; beyond it a stuck run
/// would look hung to the user.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Exponential backoff: `base × 2^attempt`, capped at [`MAX_BACKOFF`].
/// `attempt` counts retries already made, starting at 0.
pub(crate) fn backoff(base: Duration, attempt: u32) -> Duration {
    let factor = 2u32.checked_pow(attempt).unwrap_or(u32::MAX);
    base.checked_mul(factor)
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF)
}

/// Reads a `Retry-After` value, either delta-seconds or an HTTP-date, capped at
/// [`MAX_RETRY_AFTER`]. Unreadable values are ignored so backoff applies instead.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Some(Duration::from_secs_f64(
                secs.min(MAX_RETRY_AFTER.as_secs_f64()),
            ));
        }
        return None;
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let wait = at.duration_since(now).unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps() {
        let base = Duration::from_millis(500);
        assert_eq!(backoff(base, 0), Duration::from_millis(500));
        assert_eq!(backoff(base, 1), Duration::from_secs(1));
        assert_eq!(backoff(base, 3), Duration::from_secs(4));
        assert_eq!(backoff(base, 10), MAX_BACKOFF);
        assert_eq!(backoff(base, 40), MAX_BACKOFF);
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 0.5 ", now),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_retry_after("3600", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(7)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
    }
}
