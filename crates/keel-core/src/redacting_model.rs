//! The model behind every agent, with secrets redacted both ways: what the
//! model says (text, streamed deltas, tool call arguments, errors) is
//! clean before the loop sees it, and a request that still carries a
//! secret (a client tool's description, history stored before the secret
//! was known) is cleaned before it leaves.
//!
//! Wrapping the model, rather than redacting at each caller, covers every
//! call at once: the run's turns, reflection, compaction, routing and the
//! summaries written on session reset.

use std::sync::Arc;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use keel_protocol::{
    Message, ModelClient, ModelError, ModelRequest, ModelResponse, Redactor, RequestGate, ToolCall,
};

pub(crate) struct RedactingModel {
    inner: Arc<dyn ModelClient>,
    redactor: Redactor,
}

impl RedactingModel {
    /// `inner` itself when there is nothing to redact.
    pub(crate) fn wrap(inner: Arc<dyn ModelClient>, redactor: &Redactor) -> Arc<dyn ModelClient> {
        if redactor.is_empty() {
            return inner;
        }
        Arc::new(Self {
            inner,
            redactor: redactor.clone(),
        })
    }

    /// The request with every secret replaced, when it has one.
    fn clean_request(&self, request: &ModelRequest) -> Option<ModelRequest> {
        let r = &self.redactor;
        let dirty = request.messages.iter().any(|m| message_has_secret(r, m))
            || request.tools.iter().any(|t| {
                r.contains_secret(&t.name)
                    || r.contains_secret(&t.description)
                    || r.contains_secret(&t.parameters.to_string())
            });
        if !dirty {
            return None;
        }
        let mut clean = request.clone();
        // Only the messages with a secret are copied out of the shared prompt.
        for m in &mut clean.messages {
            if message_has_secret(r, m) {
                redact_message(r, Arc::make_mut(m));
            }
        }
        for t in &mut clean.tools {
            r.redact_string(&mut t.name);
            r.redact_string(&mut t.description);
            r.redact_json(Arc::make_mut(&mut t.parameters));
        }
        Some(clean)
    }

    fn clean_response(&self, response: &mut ModelResponse) {
        let r = &self.redactor;
        r.redact_string(&mut response.text);
        for call in &mut response.tool_calls {
            redact_call(r, call);
        }
        let u = &mut response.understanding;
        for text in [&mut u.intent, &mut u.brief_rationale]
            .into_iter()
            .flatten()
        {
            r.redact_string(text);
        }
    }
}

#[async_trait::async_trait]
impl ModelClient for RedactingModel {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    fn context_window(&self) -> Option<u64> {
        self.inner.context_window()
    }

    fn chars_per_token(&self) -> f64 {
        self.inner.chars_per_token()
    }

    fn estimate_tokens(&self, request: &ModelRequest) -> u64 {
        self.inner.estimate_tokens(request)
    }

    async fn complete_gated(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        gate: &dyn RequestGate,
    ) -> Result<ModelResponse, ModelError> {
        let cleaned = self.clean_request(request);
        if cleaned.is_some() {
            tracing::warn!(
                model = self.inner.model_name(),
                "a model request carried a secret; it was redacted before sending"
            );
        }
        let request = cleaned.as_ref().unwrap_or(request);
        let result = match deltas {
            None => self.inner.complete_gated(request, None, gate).await,
            Some(out) => {
                // The inner model streams into `raw`; what reaches `out` is
                // redacted, with a possible start of a secret held back
                // until the next delta (or the end) shows what it is.
                let (raw_tx, mut raw) = unbounded::<String>();
                let mut stream = self.redactor.stream();
                let call = self.inner.complete_gated(request, Some(raw_tx), gate);
                tokio::pin!(call);
                let result = loop {
                    tokio::select! {
                        r = &mut call => break r,
                        Some(delta) = raw.next() => {
                            send(&out, stream.push(&delta));
                        }
                    }
                };
                while let Ok(delta) = raw.try_recv() {
                    send(&out, stream.push(&delta));
                }
                send(&out, stream.finish());
                result
            }
        };
        match result {
            Ok(mut response) => {
                self.clean_response(&mut response);
                Ok(response)
            }
            Err(e) => Err(redact_error(&self.redactor, e)),
        }
    }
}

fn send(out: &UnboundedSender<String>, text: String) {
    if !text.is_empty() {
        // The receiver gone means the caller stopped listening; the call's
        // result still says how it ended.
        let _ = out.unbounded_send(text);
    }
}

fn message_has_secret(r: &Redactor, m: &Message) -> bool {
    match m {
        Message::System { content } | Message::User { content } => r.contains_secret(content),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            r.contains_secret(content)
                || tool_calls
                    .iter()
                    .any(|c| r.contains_secret(&c.arguments) || r.contains_secret(&c.name))
        }
        Message::Tool { name, content, .. } => {
            r.contains_secret(content) || r.contains_secret(name)
        }
    }
}

pub(crate) fn redact_message(r: &Redactor, m: &mut Message) {
    match m {
        Message::System { content } | Message::User { content } => {
            r.redact_string(content);
        }
        Message::Assistant {
            content,
            tool_calls,
        } => {
            r.redact_string(content);
            for call in tool_calls {
                redact_call(r, call);
            }
        }
        Message::Tool { name, content, .. } => {
            r.redact_string(name);
            r.redact_string(content);
        }
    }
}

/// A call's arguments stay the model's text: redacted as JSON when they
/// parse (a secret with quotes in it is escaped there), else as they are.
fn redact_call(r: &Redactor, call: &mut ToolCall) {
    r.redact_string(&mut call.name);
    if !r.contains_secret(&call.arguments) {
        return;
    }
    match serde_json::from_str::<serde_json::Value>(&call.arguments) {
        Ok(mut args) => {
            r.redact_json(&mut args);
            call.arguments = args.to_string();
        }
        Err(_) => {
            r.redact_string(&mut call.arguments);
        }
    }
}

/// A provider's error may quote what it was sent (a rejected key).
fn redact_error(r: &Redactor, e: ModelError) -> ModelError {
    let clean = |s: String| r.redact(&s).into_owned();
    match e {
        ModelError::RateLimited {
            retry_after,
            message,
        } => ModelError::RateLimited {
            retry_after,
            message: clean(message),
        },
        ModelError::Http { status, message } => ModelError::Http {
            status,
            message: clean(message),
        },
        ModelError::Connect(m) => ModelError::Connect(clean(m)),
        ModelError::Protocol(m) => ModelError::Protocol(clean(m)),
        ModelError::RetriesExhausted { attempts, last } => ModelError::RetriesExhausted {
            attempts,
            last: Box::new(redact_error(r, *last)),
        },
        ModelError::NotAllowed { requests, last } => ModelError::NotAllowed {
            requests,
            last: Box::new(redact_error(r, *last)),
        },
        ModelError::Timeout => ModelError::Timeout,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Mutex;

    use super::*;
    use keel_protocol::shared_messages;

    const SECRET: &str = "sk-live-abcdef0123456789";

    /// Streams `pieces` as deltas, answers with their concatenation and a
    /// tool call carrying the secret; remembers the requests it got.
    struct Echo {
        pieces: Vec<String>,
        seen: Mutex<Vec<ModelRequest>>,
    }

    #[async_trait::async_trait]
    impl ModelClient for Echo {
        fn model_name(&self) -> &str {
            "echo"
        }

        async fn complete_gated(
            &self,
            request: &ModelRequest,
            deltas: Option<UnboundedSender<String>>,
            _gate: &dyn RequestGate,
        ) -> Result<ModelResponse, ModelError> {
            self.seen.lock().unwrap().push(request.clone());
            if let Some(d) = deltas {
                for p in &self.pieces {
                    d.unbounded_send(p.clone()).unwrap();
                    tokio::task::yield_now().await;
                }
            }
            Ok(ModelResponse {
                text: self.pieces.concat(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "login".into(),
                    arguments: serde_json::json!({"token": SECRET}).to_string(),
                }],
                ..Default::default()
            })
        }
    }

    #[tokio::test]
    async fn replies_deltas_and_requests_are_redacted() {
        let echo = Arc::new(Echo {
            pieces: vec!["the key is sk-live-abc".into(), "def0123456789, ok".into()],
            seen: Mutex::new(Vec::new()),
        });
        let redactor = Redactor::new([SECRET]).unwrap();
        let model = RedactingModel::wrap(echo.clone(), &redactor);
        let request = ModelRequest {
            messages: shared_messages(vec![Message::user(format!("use {SECRET}"))]),
            ..Default::default()
        };
        let (tx, rx) = unbounded();
        let response = model.complete(&request, Some(tx)).await.unwrap();
        let deltas: Vec<String> = rx.collect().await;
        assert_eq!(deltas.concat(), "the key is [redacted], ok");
        assert!(deltas.iter().all(|d| !d.contains("sk-live")), "{deltas:?}");
        assert_eq!(response.text, "the key is [redacted], ok");
        assert_eq!(
            response.tool_calls[0].arguments,
            r#"{"token":"[redacted]"}"#
        );
        let seen = echo.seen.lock().unwrap();
        assert_eq!(
            seen[0].messages,
            shared_messages(vec![Message::user("use [redacted]")])
        );
    }

    #[tokio::test]
    async fn errors_are_redacted() {
        struct Failing;
        #[async_trait::async_trait]
        impl ModelClient for Failing {
            fn model_name(&self) -> &str {
                "failing"
            }
            async fn complete_gated(
                &self,
                _: &ModelRequest,
                _: Option<UnboundedSender<String>>,
                _: &dyn RequestGate,
            ) -> Result<ModelResponse, ModelError> {
                Err(ModelError::RetriesExhausted {
                    attempts: 2,
                    last: Box::new(ModelError::Http {
                        status: 401,
                        message: format!("invalid key {SECRET}"),
                    }),
                })
            }
        }
        let redactor = Redactor::new([SECRET]).unwrap();
        let model = RedactingModel::wrap(Arc::new(Failing), &redactor);
        let e = model
            .complete(&ModelRequest::default(), None)
            .await
            .unwrap_err();
        assert!(!e.to_string().contains(SECRET), "{e}");
        assert!(e.to_string().contains("[redacted]"), "{e}");
    }
}
