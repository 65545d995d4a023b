//! Any Chat Completions-compatible endpoint (OpenAI, DashScope, DeepSeek,
//! vLLM, Ollama, llama.cpp server): native tool calling and streaming.

pub(crate) mod stream;
pub(crate) mod wire;

use std::fmt;
use std::time::{Duration, SystemTime};

use futures::channel::mpsc::UnboundedSender;
use keel_protocol::{ModelClient, ModelError, ModelRequest, ModelResponse, RequestGate};
use reqwest::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};

use crate::http::{MAX_ERROR_BODY, MAX_REPLY_BYTES, read_body, transport_error};
use crate::in_flight::{DEFAULT_MAX_CONCURRENT_REQUESTS, InFlight};
use crate::retry::{self, parse_retry_after};

/// How to reach one Chat Completions endpoint.
#[derive(Clone)]
pub struct OpenAiSettings {
    /// Up to but excluding `/chat/completions`, e.g. `https://api.openai.com/v1`.
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
}

impl OpenAiSettings {
    /// Settings with keel's configuration defaults (streaming, 120 s timeout,
    /// 3 retries from 500 ms) and no API key.
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
        }
    }
}

// Hand-written so the API key can never reach a log through `{:?}`.
impl fmt::Debug for OpenAiSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiSettings")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("stream", &self.stream)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("context_window", &self.context_window)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .finish()
    }
}

/// A Chat Completions client. One `reqwest` client (and its connection pool)
/// is shared by every call.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    settings: OpenAiSettings,
    endpoint: reqwest::Url,
    http: reqwest::Client,
    in_flight: InFlight,
}

impl OpenAiClient {
    pub fn new(settings: OpenAiSettings) -> Result<Self, ModelError> {
        let raw = format!(
            "{}/chat/completions",
            settings.base_url.trim_end_matches('/')
        );
        let endpoint = reqwest::Url::parse(&raw).map_err(|e| {
            ModelError::Connect(format!("invalid base_url {:?}: {e}", settings.base_url))
        })?;
        let http = reqwest::Client::builder()
            .connect_timeout(settings.timeout)
            .build()
            .map_err(|e| ModelError::Connect(format!("cannot build HTTP client: {e}")))?;
        Ok(Self {
            endpoint,
            in_flight: InFlight::new(settings.max_concurrent_requests),
            settings,
            http,
        })
    }

    pub fn settings(&self) -> &OpenAiSettings {
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
            .body(body.clone());
        if self.settings.stream {
            request = request.header(ACCEPT, "text/event-stream");
        }
        if let Some(key) = &self.settings.api_key {
            // `bearer_auth` marks the header sensitive, so it is never printed.
            request = request.bearer_auth(key);
        }
        let response = tokio::time::timeout(self.settings.timeout, request.send())
            .await
            .map_err(|_| ModelError::Timeout)?
            .map_err(|e| transport_error(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.status_error(response).await);
        }
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("application/json"));
        // A server may ignore `stream: true` and answer with a whole object.
        if self.settings.stream && !is_json {
            stream::read_stream(response, self.settings.timeout, deltas, forwarded).await
        } else {
            let bytes = read_body(response, self.settings.timeout, MAX_REPLY_BYTES).await?;
            wire::parse_completion(&bytes)
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
impl ModelClient for OpenAiClient {
    fn model_name(&self) -> &str {
        &self.settings.model
    }

    fn context_window(&self) -> Option<u64> {
        self.settings.context_window
    }

    /// OpenAI's documented rule of thumb for its BPE tokenizers.
    fn chars_per_token(&self) -> f64 {
        4.0
    }

    async fn complete_gated(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        gate: &dyn RequestGate,
    ) -> Result<ModelResponse, ModelError> {
        let body = wire::request_body(&self.settings.model, request, self.settings.stream)
            .map_err(|e| ModelError::Protocol(format!("cannot encode request: {e}")))?;
        tracing::debug!(
            model = %self.settings.model,
            endpoint = %self.endpoint,
            messages = request.messages.len(),
            tools = request.tools.len(),
            stream = self.settings.stream,
            bytes = body.len(),
            "chat completion request"
        );
        let policy = retry::RetryPolicy {
            max_retries: self.settings.max_retries,
            backoff_base: self.settings.backoff_base,
        };
        // Shared, so that each attempt sends it without copying it.
        let body = &bytes::Bytes::from(body);
        let deltas = deltas.as_ref();
        retry::with_retries(
            "chat_completions",
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
