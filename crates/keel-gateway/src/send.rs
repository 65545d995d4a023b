//! Sending prepared requests: one attempt with a typed result, and a retry
//! loop with exponential backoff that reports every attempt, so each can be
//! recorded as an event.

use std::future::Future;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde::Deserialize;

use crate::outbound::{PreparedRequest, ResponseKind};

/// How much of a response body is read: enough for any API's error, and
/// a bound on what a misbehaving `reply_url` can make keel hold.
const RESPONSE_MAX: usize = 64 * 1024;
/// How much of a response body goes into an error message.
const ERROR_BODY_MAX: usize = 300;

/// One send of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// The HTTP status, if a response came.
    pub status: Option<u16>,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The service accepted it.
    Delivered {
        /// The id of the message posted, when the service returns one
        /// (Telegram `result.message_id`, Slack `ts`).
        message_id: Option<String>,
    },
    Failed {
        /// What went wrong, as the service or the connection said it;
        /// never holds a token.
        error: String,
        /// Whether trying again may help (no connection, timeout, 429,
        /// 5xx, Slack's transient errors).
        retryable: bool,
        /// How long the service asked to wait (429).
        retry_after: Option<Duration>,
    },
}

impl Attempt {
    pub fn is_delivered(&self) -> bool {
        matches!(self.outcome, Outcome::Delivered { .. })
    }

    fn retryable(&self) -> Option<Option<Duration>> {
        match &self.outcome {
            Outcome::Failed {
                retryable: true,
                retry_after,
                ..
            } => Some(*retry_after),
            _ => None,
        }
    }
}

/// How often, and how patiently, a request is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; at least 1.
    pub attempts: u32,
    /// The wait after the first failure; doubled after each further one.
    pub base_delay: Duration,
    /// The longest wait, whatever the backoff or a `Retry-After` says.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `number`: what the service asked for,
    /// else `base_delay * 2^(number-1)`, capped at `max_delay`.
    pub fn delay(&self, number: u32, retry_after: Option<Duration>) -> Duration {
        let backoff = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(number.saturating_sub(1)));
        retry_after.unwrap_or(backoff).min(self.max_delay)
    }
}

/// Runs `attempt` (given the attempt number) until it delivers, fails for
/// good, or `policy.attempts` are spent, waiting between attempts;
/// `on_attempt` sees every attempt as it ends. Returns the last attempt.
pub async fn retry<F, Fut>(
    policy: &RetryPolicy,
    mut on_attempt: impl FnMut(&Attempt),
    mut attempt: F,
) -> Attempt
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Attempt>,
{
    let attempts = policy.attempts.max(1);
    let mut number = 1;
    loop {
        let result = attempt(number).await;
        on_attempt(&result);
        match result.retryable() {
            Some(retry_after) if number < attempts => {
                tokio::time::sleep(policy.delay(number, retry_after)).await;
                number += 1;
            }
            _ => return result,
        }
    }
}

/// Sends prepared requests over one HTTP client.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
}

impl Sender {
    /// A client that gives each request `timeout` and follows no
    /// redirects: a redirect would carry a Telegram token or a signed body
    /// somewhere the configuration never named.
    pub fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self { client })
    }

    pub fn with_client(client: reqwest::Client) -> Self {
        Self { client }
    }

    /// Sends `request` once; `number` is recorded in the result.
    pub async fn send(&self, request: &PreparedRequest, number: u32) -> Attempt {
        let failed = |status: Option<u16>, error: String, retryable: bool| Attempt {
            number,
            status,
            outcome: Outcome::Failed {
                error,
                retryable,
                retry_after: None,
            },
        };
        let mut headers = HeaderMap::new();
        for (name, value) in request.headers_at(SystemTime::now()) {
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) else {
                return failed(None, format!("header {name:?} cannot be sent"), false);
            };
            headers.insert(name, value);
        }
        let response = match self
            .client
            .post(&request.url)
            .headers(headers)
            .body(request.body.clone())
            .send()
            .await
        {
            Ok(response) => response,
            // Without the URL: a Telegram URL holds the bot token.
            Err(e) => return failed(None, e.without_url().to_string(), true),
        };
        let status = response.status().as_u16();
        let retry_after = header_retry_after(response.headers());
        let body = read_capped(response).await;
        interpret(request.response, number, status, retry_after, &body)
    }

    /// Sends with retries; see [`retry`].
    pub async fn send_with_retry(
        &self,
        request: &PreparedRequest,
        policy: &RetryPolicy,
        on_attempt: impl FnMut(&Attempt),
    ) -> Attempt {
        retry(policy, on_attempt, |n| self.send(request, n)).await
    }
}

async fn read_capped(mut response: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = RESPONSE_MAX.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= RESPONSE_MAX {
            break;
        }
    }
    body
}

fn header_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

#[derive(Deserialize)]
struct TelegramReply {
    ok: bool,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<TelegramParameters>,
}

#[derive(Deserialize)]
struct TelegramParameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

#[derive(Deserialize)]
struct SlackReply {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    ts: Option<String>,
}

/// Slack errors worth another try.
const SLACK_TRANSIENT: &[&str] = &[
    "ratelimited",
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];

fn transient_status(status: u16) -> bool {
    status == 429 || status >= 500
}

/// Reads a response the way its service reports success and failure.
fn interpret(
    kind: ResponseKind,
    number: u32,
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> Attempt {
    let success = (200..300).contains(&status);
    let outcome = match kind {
        ResponseKind::TelegramApi => match serde_json::from_slice::<TelegramReply>(body) {
            Ok(reply) if reply.ok && success => Outcome::Delivered {
                message_id: reply
                    .result
                    .as_ref()
                    .and_then(|r| r.get("message_id"))
                    .map(|id| id.to_string()),
            },
            Ok(reply) => Outcome::Failed {
                error: reply
                    .description
                    .unwrap_or_else(|| format!("HTTP {status}")),
                retryable: transient_status(status),
                retry_after: reply
                    .parameters
                    .and_then(|p| p.retry_after)
                    .map(Duration::from_secs)
                    .or(retry_after),
            },
            Err(_) => not_json(status, retry_after, body),
        },
        ResponseKind::SlackApi => match serde_json::from_slice::<SlackReply>(body) {
            Ok(reply) if reply.ok && success => Outcome::Delivered {
                message_id: reply.ts,
            },
            Ok(reply) => {
                let error = reply.error.unwrap_or_else(|| format!("HTTP {status}"));
                Outcome::Failed {
                    retryable: transient_status(status)
                        || SLACK_TRANSIENT.contains(&error.as_str()),
                    error,
                    retry_after,
                }
            }
            Err(_) => not_json(status, retry_after, body),
        },
        ResponseKind::Plain if success => Outcome::Delivered { message_id: None },
        ResponseKind::Plain => Outcome::Failed {
            error: http_error(status, body),
            retryable: transient_status(status),
            retry_after,
        },
    };
    Attempt {
        number,
        status: Some(status),
        outcome,
    }
}

/// An API answered with something other than its JSON: a proxy's error
/// page, most likely.
fn not_json(status: u16, retry_after: Option<Duration>, body: &[u8]) -> Outcome {
    Outcome::Failed {
        error: format!("{} (not the API's JSON)", http_error(status, body)),
        retryable: transient_status(status),
        retry_after,
    }
}

fn http_error(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return format!("HTTP {status}");
    }
    let cut: String = text.chars().take(ERROR_BODY_MAX).collect();
    format!("HTTP {status}: {cut}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_honours_retry_after_and_is_capped() {
        let p = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        assert_eq!(p.delay(1, None), Duration::from_millis(100));
        assert_eq!(p.delay(2, None), Duration::from_millis(200));
        assert_eq!(p.delay(3, None), Duration::from_millis(400));
        assert_eq!(p.delay(5, None), Duration::from_secs(1));
        assert_eq!(p.delay(40, None), Duration::from_secs(1));
        assert_eq!(
            p.delay(1, Some(Duration::from_millis(700))),
            Duration::from_millis(700)
        );
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn telegram_answers_are_read() {
        let ok = interpret(
            ResponseKind::TelegramApi,
            1,
            200,
            None,
            br#"{"ok":true,"result":{"message_id":77,"chat":{"id":1,"type":"private"}}}"#,
        );
        assert_eq!(
            ok.outcome,
            Outcome::Delivered {
                message_id: Some("77".into())
            }
        );
        let limited = interpret(
            ResponseKind::TelegramApi,
            2,
            429,
            None,
            br#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}"#,
        );
        assert_eq!(limited.status, Some(429));
        assert_eq!(
            limited.outcome,
            Outcome::Failed {
                error: "Too Many Requests: retry after 3".into(),
                retryable: true,
                retry_after: Some(Duration::from_secs(3)),
            }
        );
        let bad = interpret(
            ResponseKind::TelegramApi,
            1,
            400,
            None,
            br#"{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}"#,
        );
        assert!(
            matches!(bad.outcome, Outcome::Failed { retryable: false, ref error, .. } if error == "Bad Request: chat not found")
        );
        let proxy = interpret(
            ResponseKind::TelegramApi,
            1,
            502,
            None,
            b"<html>bad gateway</html>",
        );
        assert!(
            matches!(proxy.outcome, Outcome::Failed { retryable: true, ref error, .. } if error.contains("HTTP 502: <html>bad gateway</html>"))
        );
    }

    #[test]
    fn slack_ok_false_is_a_failure_even_with_http_200() {
        let failed = interpret(
            ResponseKind::SlackApi,
            1,
            200,
            None,
            br#"{"ok":false,"error":"channel_not_found"}"#,
        );
        assert_eq!(failed.status, Some(200));
        assert_eq!(
            failed.outcome,
            Outcome::Failed {
                error: "channel_not_found".into(),
                retryable: false,
                retry_after: None
            }
        );
        let limited = interpret(
            ResponseKind::SlackApi,
            1,
            429,
            Some(Duration::from_secs(2)),
            br#"{"ok":false,"error":"ratelimited"}"#,
        );
        assert!(matches!(
            limited.outcome,
            Outcome::Failed { retryable: true, retry_after: Some(d), .. } if d == Duration::from_secs(2)
        ));
        let ok = interpret(
            ResponseKind::SlackApi,
            1,
            200,
            None,
            br#"{"ok":true,"channel":"C1","ts":"1503435956.000247"}"#,
        );
        assert_eq!(
            ok.outcome,
            Outcome::Delivered {
                message_id: Some("1503435956.000247".into())
            }
        );
    }

    #[tokio::test]
    async fn retry_reports_every_attempt_and_stops_at_success_or_a_permanent_failure() {
        let policy = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        };
        let transient = |n| Attempt {
            number: n,
            status: Some(503),
            outcome: Outcome::Failed {
                error: "busy".into(),
                retryable: true,
                retry_after: None,
            },
        };
        let mut seen = Vec::new();
        let last = retry(
            &policy,
            |a| seen.push(a.number),
            |n| async move {
                if n < 3 {
                    transient(n)
                } else {
                    Attempt {
                        number: n,
                        status: Some(200),
                        outcome: Outcome::Delivered { message_id: None },
                    }
                }
            },
        )
        .await;
        assert!(last.is_delivered());
        assert_eq!(seen, vec![1, 2, 3]);

        let mut seen = Vec::new();
        let last = retry(
            &policy,
            |a| seen.push(a.number),
            |n| async move { transient(n) },
        )
        .await;
        assert!(!last.is_delivered());
        assert_eq!(seen, vec![1, 2, 3, 4, 5], "gives up after the attempts");

        let mut seen = Vec::new();
        let last = retry(
            &policy,
            |a| seen.push(a.number),
            |n| async move {
                Attempt {
                    number: n,
                    status: Some(400),
                    outcome: Outcome::Failed {
                        error: "bad".into(),
                        retryable: false,
                        retry_after: None,
                    },
                }
            },
        )
        .await;
        assert_eq!(last.number, 1);
        assert_eq!(seen, vec![1], "a permanent failure is not retried");
    }
}
