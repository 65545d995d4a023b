//! Any Chat Completions-compatible endpoint (OpenAI, DashScope, DeepSeek,
//! vLLM, Ollama, llama.cpp server): native tool calling and streaming.

mod stream;
mod wire;

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use keel_protocol::{ModelClient, ModelError, ModelRequest, ModelResponse};
use reqwest::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER};

use crate::retry::{backoff, parse_retry_after};

/// Largest reply body keel reads; past it the provider is misbehaving and the
/// reply is refused rather than allowed to exhaust memory.
pub(crate) const MAX_REPLY_BYTES: usize = 64 * 1024 * 1024;

/// Largest error body kept for the error message.
const MAX_ERROR_BODY: usize = 64 * 1024;

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
            settings,
            endpoint,
            http,
        })
    }

    pub fn settings(&self) -> &OpenAiSettings {
        &self.settings
    }

    /// One HTTP exchange. Sets `forwarded` once text has reached `deltas`.
    async fn attempt(
        &self,
        body: &[u8],
        deltas: Option<&UnboundedSender<String>>,
        forwarded: &mut bool,
    ) -> Result<ModelResponse, ModelError> {
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
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

    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
    ) -> Result<ModelResponse, ModelError> {
        let body = wire::request_body(&self.settings.model, request, self.settings.stream);
        let body = serde_json::to_vec(&body)
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
        let started = Instant::now();
        let mut retries = 0u32;
        loop {
            let mut forwarded = false;
            let error = match self.attempt(&body, deltas.as_ref(), &mut forwarded).await {
                Ok(response) => {
                    tracing::debug!(
                        model = %self.settings.model,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        retries,
                        text_chars = response.text.len(),
                        tool_calls = response.tool_calls.len(),
                        prompt_tokens = response.usage.prompt_tokens,
                        completion_tokens = response.usage.completion_tokens,
                        finish_reason = response.finish_reason.as_deref().unwrap_or(""),
                        "chat completion response"
                    );
                    return Ok(response);
                }
                Err(error) => error,
            };
            if forwarded {
                // The user already saw part of this reply; a retry would repeat it.
                tracing::warn!(model = %self.settings.model, %error, "stream broke after text was shown; not retrying");
                return Err(error);
            }
            if !error.is_retryable() {
                tracing::debug!(model = %self.settings.model, %error, "chat completion failed");
                return Err(error);
            }
            if retries >= self.settings.max_retries {
                tracing::warn!(model = %self.settings.model, attempts = retries + 1, %error, "chat completion retries exhausted");
                return Err(ModelError::RetriesExhausted {
                    attempts: retries + 1,
                    last: Box::new(error),
                });
            }
            let delay = match &error {
                ModelError::RateLimited {
                    retry_after: Some(wait),
                    ..
                } => *wait,
                _ => backoff(self.settings.backoff_base, retries),
            };
            retries += 1;
            tracing::warn!(
                model = %self.settings.model,
                retry = retries,
                max_retries = self.settings.max_retries,
                delay_ms = delay.as_millis() as u64,
                %error,
                "chat completion failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

/// Reads a whole body, failing on an idle gap longer than `idle` or past `limit` bytes.
async fn read_body(
    response: reqwest::Response,
    idle: Duration,
    limit: usize,
) -> Result<Vec<u8>, ModelError> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    loop {
        let next = tokio::time::timeout(idle, chunks.next())
            .await
            .map_err(|_| ModelError::Timeout)?;
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|e| transport_error(&e))?;
        if body.len() + chunk.len() > limit {
            return Err(ModelError::Protocol(format!(
                "reply body exceeds {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Maps a transport failure, keeping the cause chain (reqwest's own message
/// alone is just "error sending request").
pub(crate) fn transport_error(error: &reqwest::Error) -> ModelError {
    if error.is_timeout() {
        return ModelError::Timeout;
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    ModelError::Connect(text)
}
