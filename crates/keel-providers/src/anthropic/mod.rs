//! Anthropic's Messages API: native tool use and streaming.
//!
//! Extended thinking is never requested, so keel never has to hand thinking
//! blocks back; any that arrive are dropped unread, never shown.

pub(crate) mod stream;
pub(crate) mod wire;

use std::fmt;
use std::time::{Duration, SystemTime};

use futures::channel::mpsc::UnboundedSender;
use keel_protocol::{ModelClient, ModelError, ModelRequest, ModelResponse, RequestGate};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue, RETRY_AFTER};

use crate::http::{MAX_ERROR_BODY, MAX_REPLY_BYTES, read_body, transport_error};
use crate::in_flight::{DEFAULT_MAX_CONCURRENT_REQUESTS, InFlight};
use crate::retry::{self, parse_retry_after};

/// The API version keel speaks; the wire format below follows it.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// How to reach the Messages API.
#[derive(Clone)]
pub struct AnthropicSettings {
    /// Up to but excluding `/v1/messages`, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    pub stream: bool,
    /// Bounds connecting plus waiting for the response head, and any idle gap
    /// while reading the body; a long stream that keeps flowing is not cut.
    pub timeout: Duration,
    /// Retries after the first attempt for retryable failures.
    pub max_retries: u32,
    /// First backoff delay; doubled each retry, capped at 30 s.
    pub backoff_base: Duration,
    pub context_window: Option<u64>,
    /// Requests in flight at once; more wait their turn (`InFlight`).
    pub max_concurrent_requests: usize,
    /// `max_tokens` when the request sets no limit: the API requires one.
    pub max_tokens: u32,
}

impl AnthropicSettings {
    /// The public API endpoint.
    pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

    /// Settings with keel's configuration defaults (streaming, 120 s timeout,
    /// 3 retries from 500 ms, `max_tokens` 4096) and no API key.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            stream: true,
            timeout: Duration::from_secs(120),
            max_retries: 3,
            backoff_base: Duration::from_millis(500),
            context_window: None,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_tokens: 4096,
        }
    }
}

// Hand-written so the API key can never reach a log through `{:?}`.
impl fmt::Debug for AnthropicSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicSettings")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("stream", &self.stream)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("context_window", &self.context_window)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

/// A Messages API client. One `reqwest` client (and its connection pool) is
/// shared by every call.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    settings: AnthropicSettings,
    endpoint: reqwest::Url,
    api_key: Option<HeaderValue>,
    http: reqwest::Client,
    in_flight: InFlight,
}

impl AnthropicClient {
    pub fn new(settings: AnthropicSettings) -> Result<Self, ModelError> {
        let raw = format!("{}/v1/messages", settings.base_url.trim_end_matches('/'));
        let endpoint = reqwest::Url::parse(&raw).map_err(|e| {
            ModelError::Connect(format!("invalid base_url {:?}: {e}", settings.base_url))
        })?;
        let api_key = match &settings.api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(key).map_err(|_| {
                    ModelError::Connect("API key is not a valid HTTP header value".into())
                })?;
                // Sensitive headers are never printed by reqwest or `{:?}`.
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(settings.timeout)
            .build()
            .map_err(|e| ModelError::Connect(format!("cannot build HTTP client: {e}")))?;
        Ok(Self {
            endpoint,
            api_key,
            in_flight: InFlight::new(settings.max_concurrent_requests),
            settings,
            http,
        })
    }

    pub fn settings(&self) -> &AnthropicSettings {
        &self.settings
    }

    /// One HTTP exchange. Sets `forwarded` once text has reached `deltas`.
    async fn attempt(
        &self,
        body: &bytes::Bytes,
        deltas: Option<&UnboundedSender<String>>,
        forwarded: &mut bool,
    ) -> Result<ModelResponse, ModelError> {
        let _place = self.in_flight.enter(&self.settings.model).await?;
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("anthropic-version", ANTHROPIC_VERSION)
            .body(body.clone());
        if self.settings.stream {
            request = request.header(ACCEPT, "text/event-stream");
        }
        if let Some(key) = &self.api_key {
            request = request.header("x-api-key", key.clone());
        }
        let response = tokio::time::timeout(self.settings.timeout, request.send())
            .await
            .map_err(|_| ModelError::Timeout)?
            .map_err(|e| transport_error(&e))?;
        if !response.status().is_success() {
            return Err(self.status_error(response).await);
        }
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("application/json"));
        // A proxy may ignore `stream: true` and answer with a whole object.
        if self.settings.stream && !is_json {
            stream::read_stream(response, self.settings.timeout, deltas, forwarded).await
        } else {
            let bytes = read_body(response, self.settings.timeout, MAX_REPLY_BYTES).await?;
            wire::parse_message(&bytes)
        }
    }

    async fn status_error(&self, response: reqwest::Response) -> ModelError {
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let message = match read_body(response, self.settings.timeout, MAX_ERROR_BODY).await {
            Ok(bytes) => wire::error_message(&String::from_utf8_lossy(&bytes)),
            Err(e) => format!("(error body unreadable: {e})"),
        };
        // 529 "overloaded" is a 5xx, so it is retried with backoff like a 500.
        if status == 429 {
            ModelError::RateLimited {
                retry_after,
                message,
            }
        } else {
            ModelError::Http { status, message }
        }
    }
}

#[async_trait::async_trait]
impl ModelClient for AnthropicClient {
    fn model_name(&self) -> &str {
        &self.settings.model
    }

    fn context_window(&self) -> Option<u64> {
        self.settings.context_window
    }

    async fn complete_gated(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        gate: &dyn RequestGate,
    ) -> Result<ModelResponse, ModelError> {
        let body = wire::request_body(
            &self.settings.model,
            request,
            self.settings.stream,
            self.settings.max_tokens,
        )
        .map_err(|e| ModelError::Protocol(format!("cannot encode request: {e}")))?;
        tracing::debug!(
            model = %self.settings.model,
            endpoint = %self.endpoint,
            messages = request.messages.len(),
            tools = request.tools.len(),
            stream = self.settings.stream,
            bytes = body.len(),
            "anthropic messages request"
        );
        let policy = retry::RetryPolicy {
            max_retries: self.settings.max_retries,
            backoff_base: self.settings.backoff_base,
        };
        // Shared, so that each attempt sends it without copying it.
        let body = &bytes::Bytes::from(body);
        let deltas = deltas.as_ref();
        retry::with_retries(
            "anthropic_messages",
            &self.settings.model,
            policy,
            gate,
            move || async move {
                let mut forwarded = false;
                self.attempt(body, deltas, &mut forwarded)
                    .await
                    .map_err(|error| retry::Failed { error, forwarded })
            },
        )
        .await
    }
}
