#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What the fake answers to one request.

use std::time::Duration;

use serde_json::{Value, json};

/// One scripted answer. Build with a constructor, then refine with the
/// `with_*` / `after` methods.
#[derive(Debug, Clone)]
pub struct Reply {
    pub(crate) kind: ReplyKind,
    pub(crate) delay: Duration,
    pub(crate) chunk_gap: Duration,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) thinking: Option<String>,
    pub(crate) redacted_thinking: bool,
    pub(crate) usage: Option<(u64, u64)>,
    pub(crate) stop_reason: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) enum ReplyKind {
    /// A well-formed message: text and/or tool uses (name, input).
    Message {
        text: String,
        tool_uses: Vec<(String, Value)>,
    },
    /// Any status with a verbatim body.
    Status { code: u16, body: String },
    /// Never answers; the handler is dropped when the client disconnects.
    Hang,
    /// Streams the text, then drops the connection mid-body.
    BrokenStream { text: String },
    /// Streams the text, then keeps the connection open without another byte.
    StalledStream { text: String },
    /// Streams `message_start` (and the text), then an `error` event; a
    /// non-streaming request gets the matching HTTP error instead.
    ErrorEvent {
        text: String,
        error_type: String,
        message: String,
    },
    /// SSE events `(event, data)` sent verbatim, whatever the request asked.
    RawSse(Vec<(String, String)>),
    /// A 200 `application/json` body sent verbatim, whatever the request asked.
    RawJson(Value),
}

/// An Anthropic-style error body.
pub(crate) fn error_body(error_type: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type, "message": message}})
}

/// The status the real API uses for an error type.
pub(crate) fn error_status(error_type: &str) -> u16 {
    match error_type {
        "overloaded_error" => 529,
        "api_error" => 500,
        "rate_limit_error" => 429,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        _ => 400,
    }
}

impl Reply {
    fn new(kind: ReplyKind) -> Self {
        Self {
            kind,
            delay: Duration::ZERO,
            chunk_gap: Duration::ZERO,
            headers: Vec::new(),
            thinking: None,
            redacted_thinking: false,
            usage: None,
            stop_reason: None,
        }
    }

    /// A plain text answer (`stop_reason: "end_turn"`).
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(ReplyKind::Message {
            text: text.into(),
            tool_uses: Vec::new(),
        })
    }

    /// One tool use with `input` (`stop_reason: "tool_use"`).
    pub fn tool_use(name: impl Into<String>, input: Value) -> Self {
        Self::tool_uses(vec![(name, input)])
    }

    /// Several tool uses in one reply; streamed as `input_json_delta` fragments.
    pub fn tool_uses<N: Into<String>>(uses: Vec<(N, Value)>) -> Self {
        Self::new(ReplyKind::Message {
            text: String::new(),
            tool_uses: uses.into_iter().map(|(n, i)| (n.into(), i)).collect(),
        })
    }

    /// An HTTP status with a verbatim body (JSON bodies get a JSON content type).
    pub fn status(code: u16, body: impl std::fmt::Display) -> Self {
        Self::new(ReplyKind::Status {
            code,
            body: body.to_string(),
        })
    }

    /// 429 `rate_limit_error` with `retry-after: <seconds>`, as the API sends it.
    pub fn rate_limited(retry_after_secs: u64) -> Self {
        Self::status(
            429,
            error_body(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
        )
        .with_header("retry-after", retry_after_secs.to_string())
    }

    /// 529 `overloaded_error`.
    pub fn overloaded() -> Self {
        Self::status(529, error_body("overloaded_error", "Overloaded"))
    }

    /// 500 `api_error`.
    pub fn server_error() -> Self {
        Self::status(500, error_body("api_error", "Internal server error"))
    }

    /// An `error` event in the middle of a stream (after `text`, which may be
    /// empty); the HTTP error of the same type when not streaming.
    pub fn error_event(
        error_type: impl Into<String>,
        message: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Self::new(ReplyKind::ErrorEvent {
            text: text.into(),
            error_type: error_type.into(),
            message: message.into(),
        })
    }

    /// Answers `reply` only after `delay`; other requests are served meanwhile.
    pub fn delay(delay: Duration, reply: Reply) -> Self {
        reply.after(delay)
    }

    /// Never answers, until the client gives up and disconnects.
    pub fn hang() -> Self {
        Self::new(ReplyKind::Hang)
    }

    /// Streams `text`, then cuts the connection before the reply is complete.
    pub fn broken_stream(text: impl Into<String>) -> Self {
        Self::new(ReplyKind::BrokenStream { text: text.into() })
    }

    /// Streams `text`, then goes silent with the connection left open.
    pub fn stalled_stream(text: impl Into<String>) -> Self {
        Self::new(ReplyKind::StalledStream { text: text.into() })
    }

    /// Sends each `(event, data)` pair as an SSE event verbatim.
    pub fn raw_sse<E: Into<String>, D: Into<String>>(events: Vec<(E, D)>) -> Self {
        Self::new(ReplyKind::RawSse(
            events
                .into_iter()
                .map(|(e, d)| (e.into(), d.into()))
                .collect(),
        ))
    }

    /// Sends `body` as a 200 JSON response verbatim, even to a streaming request.
    pub fn raw_json(body: Value) -> Self {
        Self::new(ReplyKind::RawJson(body))
    }

    /// Sleeps `delay` before answering.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay += delay;
        self
    }

    /// Adds a response header (e.g. `retry-after`).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Starts the reply with a `thinking` block (and its signature) that the
    /// client must never show.
    pub fn with_thinking(mut self, text: impl Into<String>) -> Self {
        self.thinking = Some(text.into());
        self
    }

    /// Adds a `redacted_thinking` block before the content.
    pub fn with_redacted_thinking(mut self) -> Self {
        self.redacted_thinking = true;
        self
    }

    /// Reports this usage instead of the default estimate (chars / 4).
    pub fn with_usage(mut self, input_tokens: u64, output_tokens: u64) -> Self {
        self.usage = Some((input_tokens, output_tokens));
        self
    }

    /// Adds text before tool uses (or replaces the text of a text reply).
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        if let ReplyKind::Message { text: t, .. }
        | ReplyKind::BrokenStream { text: t }
        | ReplyKind::StalledStream { text: t }
        | ReplyKind::ErrorEvent { text: t, .. } = &mut self.kind
        {
            *t = text.into();
        }
        self
    }

    /// Overrides the `stop_reason` (default `end_turn`, or `tool_use`).
    pub fn with_stop_reason(mut self, reason: impl Into<String>) -> Self {
        self.stop_reason = Some(reason.into());
        self
    }

    /// Pauses this long before every SSE event of a streamed answer.
    pub fn with_chunk_gap(mut self, gap: Duration) -> Self {
        self.chunk_gap = gap;
        self
    }
}
