//! Backoff arithmetic shared by providers, kept apart so the limits are testable.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use keel_protocol::{ModelError, ModelResponse, PreviousCost, RequestGate};

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

/// How often and how patiently one provider call is retried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    pub max_retries: u32,
    pub backoff_base: Duration,
}

/// Why one attempt failed, and whether text had already reached the user
/// (then a retry would show the same words twice, so none is made).
#[derive(Debug)]
pub(crate) struct Failed {
    pub error: ModelError,
    pub forwarded: bool,
}

/// Runs `attempt` until it succeeds, fails for good, or the retries run out.
/// Retryable failures wait for the provider's `Retry-After` when it gave one,
/// else for exponential backoff. `api` names the wire format in logs.
/// `gate` is asked before each retry, and may refuse it.
pub(crate) async fn with_retries<F, Fut>(
    api: &'static str,
    model: &str,
    policy: RetryPolicy,
    gate: &dyn RequestGate,
    mut attempt: F,
) -> Result<ModelResponse, ModelError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<ModelResponse, Failed>>,
{
    let started = Instant::now();
    let mut retries = 0u32;
    loop {
        let Failed { error, forwarded } = match attempt().await {
            Ok(response) => {
                tracing::debug!(
                    api,
                    model,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    retries,
                    text_chars = response.text.len(),
                    tool_calls = response.tool_calls.len(),
                    prompt_tokens = response.usage.prompt_tokens,
                    completion_tokens = response.usage.completion_tokens,
                    finish_reason = response.finish_reason.as_deref().unwrap_or(""),
                    "model response"
                );
                return Ok(response);
            }
            Err(failed) => failed,
        };
        if forwarded {
            tracing::warn!(api, model, %error, "stream broke after text was shown; not retrying");
            return Err(error);
        }
        if !error.is_retryable() {
            tracing::debug!(api, model, %error, "model call failed");
            return Err(error);
        }
        if retries >= policy.max_retries {
            tracing::warn!(api, model, attempts = retries + 1, %error, "model call retries exhausted");
            return Err(ModelError::RetriesExhausted {
                attempts: retries + 1,
                last: Box::new(error),
            });
        }
        if !gate.another_request(PreviousCost::of_failure(&error)).await {
            tracing::warn!(api, model, attempts = retries + 1, %error, "model call not retried: the caller allowed no further request");
            return Err(ModelError::NotAllowed {
                requests: retries + 1,
                last: Box::new(error),
            });
        }
        let delay = match &error {
            ModelError::RateLimited {
                retry_after: Some(wait),
                ..
            } => *wait,
            _ => backoff(policy.backoff_base, retries),
        };
        retries += 1;
        tracing::warn!(
            api,
            model,
            retry = retries,
            max_retries = policy.max_retries,
            delay_ms = delay.as_millis() as u64,
            %error,
            "model call failed; retrying"
        );
        tokio::time::sleep(delay).await;
    }
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
