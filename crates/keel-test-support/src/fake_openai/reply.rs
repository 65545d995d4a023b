#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What the fake answers to one request.

use std::time::Duration;

use serde_json::Value;

/// One scripted answer. Build with a constructor, then refine with the
/// `with_*` / `after` methods.
#[derive(Debug, Clone)]
pub struct Reply {
    pub(crate) kind: ReplyKind,
    pub(crate) delay: Duration,
    pub(crate) chunk_gap: Duration,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) reasoning: Option<String>,
    pub(crate) usage: Option<(u64, u64)>,
    pub(crate) finish_reason: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) enum ReplyKind {
    /// A well-formed completion: text and/or tool calls (name, raw arguments).
    Completion {
        text: String,
        calls: Vec<(String, String)>,
    },
    /// A non-2xx (or any) status with a verbatim body.
    Status { code: u16, body: String },
    /// Never answers; the handler is dropped when the client disconnects.
    Hang,
    /// Streams the text, then drops the connection mid-body.
    BrokenStream { text: String },
    /// Streams the text, then keeps the connection open without another byte.
    StalledStream { text: String },
    /// SSE `data:` payloads sent verbatim, whatever the request asked.
    RawSse(Vec<String>),
    /// A 200 `application/json` body sent verbatim, whatever the request asked.
    RawJson(Value),
}

impl Reply {
    fn new(kind: ReplyKind) -> Self {
        Self {
            kind,
            delay: Duration::ZERO,
            chunk_gap: Duration::ZERO,
            headers: Vec::new(),
            reasoning: None,
            usage: None,
            finish_reason: None,
        }
    }

    /// A plain text answer (`finish_reason: "stop"`).
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(ReplyKind::Completion {
            text: text.into(),
            calls: Vec::new(),
        })
    }

    /// One tool call whose arguments are the serialised `args`.
    pub fn tool_call(name: impl Into<String>, args: Value) -> Self {
        Self::tool_calls(vec![(name, args)])
    }

    /// Several tool calls in one reply (`finish_reason: "tool_calls"`).
    pub fn tool_calls<N: Into<String>>(calls: Vec<(N, Value)>) -> Self {
        Self::new(ReplyKind::Completion {
            text: String::new(),
            calls: calls
                .into_iter()
                .map(|(n, a)| (n.into(), a.to_string()))
                .collect(),
        })
    }

    /// A tool call with arguments sent verbatim (e.g. broken JSON).
    pub fn raw_tool_call(name: impl Into<String>, raw_arguments: impl Into<String>) -> Self {
        Self::new(ReplyKind::Completion {
            text: String::new(),
            calls: vec![(name.into(), raw_arguments.into())],
        })
    }

    /// An HTTP status with a verbatim body (JSON bodies get a JSON content type).
    pub fn status(code: u16, body: impl std::fmt::Display) -> Self {
        Self::new(ReplyKind::Status {
            code,
            body: body.to_string(),
        })
    }

    /// Answers `reply` only after `delay`; other requests are served meanwhile.
    // Boxed to match the shape tests already use: `Reply::delay(d, Box::new(r))`.
    #[allow(clippy::boxed_local)]
    pub fn delay(delay: Duration, reply: Box<Reply>) -> Self {
        (*reply).after(delay)
    }

    /// Never answers, until the client gives up and disconnects.
    pub fn hang() -> Self {
        Self::new(ReplyKind::Hang)
    }

    /// Streams `text` (or sends nothing useful when not streaming), then cuts
    /// the connection before the reply is complete.
    pub fn broken_stream(text: impl Into<String>) -> Self {
        Self::new(ReplyKind::BrokenStream { text: text.into() })
    }

    /// Streams `text`, then goes silent with the connection left open (for
    /// idle-gap timeouts).
    pub fn stalled_stream(text: impl Into<String>) -> Self {
        Self::new(ReplyKind::StalledStream { text: text.into() })
    }

    /// Sends each item as an SSE `data:` payload verbatim (no `[DONE]` added),
    /// for replies a real server would never produce.
    pub fn raw_sse<S: Into<String>>(payloads: Vec<S>) -> Self {
        Self::new(ReplyKind::RawSse(
            payloads.into_iter().map(Into::into).collect(),
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

    /// Adds a response header (e.g. `Retry-After`).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds `reasoning_content` the client must never show as text.
    pub fn with_reasoning(mut self, text: impl Into<String>) -> Self {
        self.reasoning = Some(text.into());
        self
    }

    /// Reports this usage instead of the default estimate (chars / 4).
    pub fn with_usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        self.usage = Some((prompt_tokens, completion_tokens));
        self
    }

    /// Adds text beside tool calls (or replaces the text of a text reply).
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        if let ReplyKind::Completion { text: t, .. }
        | ReplyKind::BrokenStream { text: t }
        | ReplyKind::StalledStream { text: t } = &mut self.kind
        {
            *t = text.into();
        }
        self
    }

    /// Overrides the `finish_reason` (default `stop`, or `tool_calls`).
    pub fn with_finish_reason(mut self, reason: impl Into<String>) -> Self {
        self.finish_reason = Some(reason.into());
        self
    }

    /// Pauses this long before every SSE frame of a streamed answer.
    pub fn with_chunk_gap(mut self, gap: Duration) -> Self {
        self.chunk_gap = gap;
        self
    }
}
