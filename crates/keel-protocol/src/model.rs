//! The model port: one call in, one decision out, text deltas streamed aside.

use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Message, ToolCall};

/// The reserved function through which the model asks the user for the
/// arguments of one tool (SPEC §4.2). Every provider and the loop use this
/// one name.
pub const CLARIFY_TOOL: &str = "clarify";

/// A function offered to the model.
///
/// The parameter schema is shared: the same tools are offered on every
/// turn, so a step's list is made by counting references rather than
/// copying each schema, and a provider that kept the last list it sent
/// finds it unchanged by comparing pointers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    pub name: String,
    pub description: String,
    pub parameters: Arc<Value>,
}

#[derive(Debug, Clone, Default)]
pub struct ModelRequest {
    /// The prompt. Each message is shared, not owned: a run builds a
    /// request from its history at every step, so the request counts
    /// references to the history's messages instead of copying each one,
    /// and a provider that kept the messages it last sent finds the old
    /// ones unchanged by comparing pointers.
    pub messages: Vec<Arc<Message>>,
    /// Functions offered; empty means a tool-less call.
    pub tools: Vec<ToolSchema>,
    pub max_output_tokens: Option<u32>,
    /// What the provider kept from the previous call of the same
    /// conversation (a run passes the same cache to each of its calls).
    /// The default, an empty cache, makes the request be built whole.
    pub cache: WireCache,
}

/// `messages` as a request's prompt, each one shared.
pub fn shared_messages(messages: impl IntoIterator<Item = Message>) -> Vec<Arc<Message>> {
    messages.into_iter().map(Arc::new).collect()
}

/// A slot where a provider keeps, between the calls of one conversation,
/// the wire form of the messages it already sent, so that a call encodes
/// only the messages that are new. Its content is the provider's own
/// business (the caller never reads it); a provider that finds another
/// provider's content there starts afresh.
#[derive(Clone, Default)]
pub struct WireCache(Arc<Mutex<Option<Box<dyn Any + Send>>>>);

impl WireCache {
    /// Runs `f` on the cached `T`, a new one the first time (or when the
    /// slot holds another type).
    pub fn with<T: Default + Send + 'static, R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // A panic while the slot was held leaves at worst a stale cache,
        // which every user checks against the request before using it.
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cached) = slot.as_mut().and_then(|b| b.downcast_mut::<T>()) {
            return f(cached);
        }
        let mut fresh = T::default();
        let out = f(&mut fresh);
        *slot = Some(Box::new(fresh));
        out
    }
}

impl std::fmt::Debug for WireCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WireCache")
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// What the model says about its own decision, when it says it: JSON tool
/// mode asks for it with every action, and `clarify` takes it as optional
/// arguments. Policy rules may act on the confidence (`min_confidence`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Understanding {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    /// 0.0 to 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brief_rationale: Option<String>,
}

impl Understanding {
    /// Reads the fields from an action or argument object, leniently: a
    /// field of the wrong type is left out, a confidence is clamped to
    /// 0..=1, and a percentage (`85`) is read as 0.85.
    pub fn from_object(object: &serde_json::Map<String, Value>) -> Self {
        let text = |k: &str| {
            object
                .get(k)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let confidence = object
            .get("confidence")
            .and_then(|c| match c {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().trim_end_matches('%').parse().ok(),
                _ => None,
            })
            .filter(|c| c.is_finite() && *c >= 0.0)
            .map(|c| {
                if c > 1.0 && c <= 100.0 {
                    c / 100.0
                } else {
                    c.min(1.0)
                }
            });
        Self {
            intent: text("intent"),
            confidence,
            brief_rationale: text("brief_rationale"),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.intent.is_none() && self.confidence.is_none() && self.brief_rationale.is_none()
    }
}

/// The model's whole reply, reassembled. Reasoning text never reaches here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelResponse {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: TokenUsage,
    pub finish_reason: Option<String>,
    /// The model's stated intent and confidence, when it gave them.
    pub understanding: Understanding,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("rate limited by the provider: {message}")]
    RateLimited {
        retry_after: Option<Duration>,
        message: String,
    },
    #[error("provider answered HTTP {status}: {message}")]
    Http { status: u16, message: String },
    #[error("provider did not answer in time")]
    Timeout,
    #[error("could not reach the provider: {0}")]
    Connect(String),
    #[error("provider sent a reply keel cannot read: {0}")]
    Protocol(String),
    #[error("provider failed after {attempts} attempts; last error: {last}")]
    RetriesExhausted {
        attempts: u32,
        last: Box<ModelError>,
    },
    /// The caller's [`RequestGate`] allowed no further request (a spend
    /// limit would be passed), so the failure was not retried or repaired.
    #[error("no further request allowed after {requests}; last error: {last}")]
    NotAllowed {
        requests: u32,
        last: Box<ModelError>,
    },
}

impl ModelError {
    /// Whether another attempt may succeed (rate limits, 5xx, timeouts, connection errors).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::RateLimited { .. } | Self::Timeout | Self::Connect(_) => true,
            Self::Http { status, .. } => *status >= 500 || *status == 408,
            Self::Protocol(_) | Self::RetriesExhausted { .. } | Self::NotAllowed { .. } => false,
        }
    }
}

/// What the request before another one may have cost: asked of a
/// [`RequestGate`], which holds the budget of one request at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviousCost {
    /// Nothing: the provider refused it before doing any work (rate
    /// limited).
    Nothing,
    /// Unknown: it may have been processed and billed, and no token counts
    /// came back (a timeout, a server error, a connection that broke: a
    /// transport error does not tell whether the request got through).
    Unknown,
    /// Its reply came back, and its token counts are part of the usage the
    /// call finally reports (a reply the client had to ask again for).
    Reported,
}

impl PreviousCost {
    /// What a failed request may have cost, by how it failed.
    pub fn of_failure(error: &ModelError) -> Self {
        match error {
            ModelError::RateLimited { .. } => Self::Nothing,
            _ => Self::Unknown,
        }
    }
}

/// Asked by a model client before it sends one more request within one
/// call: a retry after a failure, or a repair of an unreadable reply. A
/// caller that reserved the cost of one request (docs/spend.md) reserves
/// the next here, or refuses it.
#[async_trait::async_trait]
pub trait RequestGate: Send + Sync {
    /// Whether another request may be sent after one that cost `previous`.
    async fn another_request(&self, previous: PreviousCost) -> bool;
}

/// The gate of a caller with no budget to keep: every request may go.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ungated;

#[async_trait::async_trait]
impl RequestGate for Ungated {
    async fn another_request(&self, _previous: PreviousCost) -> bool {
        true
    }
}

/// A chat model. Implementations own their wire format, streaming and retries;
/// the loop sees only reassembled decisions. Cancellation is by dropping the future.
#[async_trait::async_trait]
pub trait ModelClient: Send + Sync {
    /// Model name, for logs and metrics.
    fn model_name(&self) -> &str;

    /// The model's context window in tokens, when known.
    fn context_window(&self) -> Option<u64> {
        None
    }

    /// Characters per token this model's tokenizer averages on mixed
    /// English, JSON and identifiers; kept on the low side so estimates
    /// err towards compacting early rather than overflowing.
    fn chars_per_token(&self) -> f64 {
        3.5
    }

    /// Tokens the request is expected to take in the prompt: the text of
    /// every message and tool schema, plus a few tokens of framing each.
    fn estimate_tokens(&self, request: &ModelRequest) -> u64 {
        estimate_tokens(request, self.chars_per_token())
    }

    /// Runs one completion. Text deltas, when the provider streams them, are
    /// sent to `deltas` as they arrive.
    async fn complete(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
    ) -> Result<ModelResponse, ModelError> {
        self.complete_gated(request, deltas, &Ungated).await
    }

    /// [`complete`](Self::complete), asking `gate` before every request
    /// after the first. A client that sends one request per call has
    /// nothing to ask; one that retries or repairs asks before each further
    /// request, and a wrapper of another client passes the gate on.
    async fn complete_gated(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        gate: &dyn RequestGate,
    ) -> Result<ModelResponse, ModelError>;
}

/// The length of `value` written as compact JSON, counted without building
/// the text: estimates run on every model turn, over every tool schema.
pub fn json_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a `Value` fails only when the writer does, and this one never does.
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => value.to_string().len(),
    }
}

/// Shared parameter schemas measured on this thread, each with its length.
/// A schema is immutable while shared, and its entry's `Weak` keeps its
/// allocation from being reused for another, so the pointer names it.
type Measured = Vec<(Weak<Value>, usize)>;

/// Entries kept before those of dropped schemas are let go.
const MEASURED_KEPT: usize = 256;

/// [`json_len`] of a tool's parameters, measured once per schema and thread:
/// a run estimates its prompt at every step, and each estimate would
/// otherwise serialize the same shared schemas again.
fn parameters_len(parameters: &Arc<Value>) -> usize {
    thread_local! {
        static MEASURED: RefCell<Measured> = const { RefCell::new(Vec::new()) };
    }
    MEASURED.with_borrow_mut(|measured| {
        let ptr = Arc::as_ptr(parameters);
        if let Some((_, len)) = measured.iter().find(|(w, _)| std::ptr::eq(w.as_ptr(), ptr)) {
            return *len;
        }
        if measured.len() >= MEASURED_KEPT {
            measured.retain(|(w, _)| w.strong_count() > 0);
        }
        let len = json_len(parameters);
        if measured.len() < MEASURED_KEPT {
            measured.push((Arc::downgrade(parameters), len));
        }
        len
    })
}

/// A provider-neutral token estimate from the request's characters.
pub fn estimate_tokens(request: &ModelRequest, chars_per_token: f64) -> u64 {
    let message_chars: usize = request.messages.iter().map(|m| m.char_len()).sum();
    let tool_chars: usize = request
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + parameters_len(&t.parameters))
        .sum();
    let framing = 4 * (request.messages.len() + request.tools.len()) as u64;
    let per = if chars_per_token.is_finite() && chars_per_token >= 1.0 {
        chars_per_token
    } else {
        1.0
    };
    ((message_chars + tool_chars) as f64 / per).ceil() as u64 + framing
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_estimate_measures_each_schema_as_it_is_now() {
        let tool = |parameters: Value| ToolSchema {
            name: "lookup".into(),
            description: String::new(),
            parameters: Arc::new(parameters),
        };
        let request = |tools: Vec<ToolSchema>| ModelRequest {
            tools,
            ..ModelRequest::default()
        };
        let small = tool(json!({"type": "object"}));
        let first = estimate_tokens(&request(vec![small.clone()]), 1.0);
        // The same shared schema twice: measured once, counted twice.
        let twice = estimate_tokens(&request(vec![small.clone(), small.clone()]), 1.0);
        assert_eq!(twice, 2 * first);
        // Schemas made and dropped one after another, each of another size,
        // may reuse an address: each is measured as itself.
        for n in 0..300 {
            let schema = json!({"type": "object", "description": "x".repeat(n)});
            // "lookup", the schema's text and four tokens of framing.
            let want = (6 + json_len(&schema) + 4) as u64;
            assert_eq!(
                estimate_tokens(&request(vec![tool(schema)]), 1.0),
                want,
                "{n}"
            );
        }
    }

    #[test]
    fn json_len_is_the_length_of_the_compact_text() {
        for value in [
            json!(null),
            json!("quote \" backslash \\ newline \n tab \t control \u{1} é 漢"),
            json!({"type": "object", "properties": {"key": {"type": "string"}}, "n": [1, 2.5, -3e300]}),
            json!([]),
        ] {
            assert_eq!(json_len(&value), value.to_string().len(), "{value}");
        }
    }
}
