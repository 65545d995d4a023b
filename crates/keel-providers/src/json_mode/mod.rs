//! `tool_mode = "json"` (SPEC §8): tool use for models without native tool
//! calling. The action travels as a JSON object in the reply text; this
//! adapter writes the protocol into the prompt, reads the action back, and
//! hands the loop the same `ModelResponse` a native provider would.

mod action;
mod prompt;

use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use keel_protocol::{
    Message, ModelClient, ModelError, ModelRequest, ModelResponse, PreviousCost, RequestGate,
    ToolCall, shared_messages,
};
use serde_json::{Value, json};

use action::Action;
pub use action::CLARIFY_TOOL;

/// Repair turns after the first invalid reply before giving up.
pub const MAX_REPAIRS: u32 = 2;

/// Wraps any chat model so it can take part in tool use through JSON text.
///
/// Requests without tools pass through (their history, if it holds tool use,
/// is still rendered as text, since the inner model may not accept tool
/// messages). Requests with tools are sent without them, the tools described
/// in the system prompt; the reply must be one action object:
/// `RESPOND` becomes the text answer, `CALL_TOOL` one tool call, `CLARIFY` a
/// call of the reserved [`CLARIFY_TOOL`]. An invalid reply gets up to
/// [`MAX_REPAIRS`] repair turns naming what was wrong, then
/// [`ModelError::Protocol`].
#[derive(Clone)]
pub struct JsonToolMode {
    inner: Arc<dyn ModelClient>,
}

impl std::fmt::Debug for JsonToolMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonToolMode")
            .field("model", &self.inner.model_name())
            .finish()
    }
}

impl JsonToolMode {
    pub fn new(inner: Arc<dyn ModelClient>) -> Self {
        Self { inner }
    }

    /// The wrapped model.
    pub fn inner(&self) -> &Arc<dyn ModelClient> {
        &self.inner
    }
}

#[async_trait::async_trait]
impl ModelClient for JsonToolMode {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    fn context_window(&self) -> Option<u64> {
        self.inner.context_window()
    }

    fn chars_per_token(&self) -> f64 {
        self.inner.chars_per_token()
    }

    /// Each repair turn is one more request: `gate` is asked before it, as
    /// the inner model asks before its own retries.
    async fn complete_gated(
        &self,
        request: &ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        gate: &dyn RequestGate,
    ) -> Result<ModelResponse, ModelError> {
        if request.tools.is_empty() {
            let has_tool_use = request.messages.iter().any(|m| {
                matches!(**m, Message::Tool { .. })
                    || matches!(&**m, Message::Assistant { tool_calls, .. } if !tool_calls.is_empty())
            });
            if !has_tool_use {
                return self.inner.complete_gated(request, deltas, gate).await;
            }
            let rendered = ModelRequest {
                cache: request.cache.clone(),
                messages: shared_messages(prompt::render(&request.messages, None)),
                tools: Vec::new(),
                max_output_tokens: request.max_output_tokens,
            };
            return self.inner.complete_gated(&rendered, deltas, gate).await;
        }

        let protocol = prompt::protocol(&request.tools);
        let mut inner_request = ModelRequest {
            cache: request.cache.clone(),
            messages: shared_messages(prompt::render(&request.messages, Some(&protocol))),
            tools: Vec::new(),
            max_output_tokens: request.max_output_tokens,
        };
        let mut usage = keel_protocol::TokenUsage::default();
        let mut repairs = 0u32;
        loop {
            // The raw JSON is never streamed: users would see the protocol.
            let response = self
                .inner
                .complete_gated(&inner_request, None, gate)
                .await?;
            usage.prompt_tokens = usage
                .prompt_tokens
                .saturating_add(response.usage.prompt_tokens);
            usage.completion_tokens = usage
                .completion_tokens
                .saturating_add(response.usage.completion_tokens);
            let problem = match read_action(
                &response.text,
                usage,
                response.finish_reason.clone(),
                deltas.as_ref(),
            ) {
                Ok((response, action)) => {
                    tracing::debug!(
                        model = %self.inner.model_name(),
                        repairs,
                        action,
                        "json-mode action"
                    );
                    return Ok(response);
                }
                Err(problem) => problem,
            };
            if repairs >= MAX_REPAIRS {
                tracing::warn!(model = %self.inner.model_name(), attempts = repairs + 1, %problem, "json-mode model never produced a valid action");
                return Err(ModelError::Protocol(format!(
                    "model gave no valid JSON action in {} replies; last problem: {problem}",
                    repairs + 1
                )));
            }
            if !gate.another_request(PreviousCost::Reported).await {
                tracing::warn!(model = %self.inner.model_name(), attempts = repairs + 1, %problem, "json-mode reply invalid; no repair allowed");
                return Err(ModelError::NotAllowed {
                    requests: repairs + 1,
                    last: Box::new(ModelError::Protocol(problem)),
                });
            }
            repairs += 1;
            tracing::debug!(model = %self.inner.model_name(), repair = repairs, %problem, "json-mode reply invalid; asking again");
            inner_request.messages.push(Arc::new(Message::Assistant {
                content: response.text,
                tool_calls: Vec::new(),
            }));
            inner_request.messages.push(Arc::new(Message::user(format!(
                "Your last reply was not a valid action: {problem}. Reply again with exactly one \
                 JSON object whose \"action\" is RESPOND, CALL_TOOL or CLARIFY, and nothing else."
            ))));
        }
    }
}

/// Reads the inner model's reply text as one action and maps it to the
/// reply a native provider would give, with the action's name for logs;
/// `Err` says what is wrong, in words for the repair turn.
pub(crate) fn read_action(
    text: &str,
    usage: keel_protocol::TokenUsage,
    finish_reason: Option<String>,
    deltas: Option<&UnboundedSender<String>>,
) -> Result<(ModelResponse, &'static str), String> {
    let (action, understanding) = action::parse_with_understanding(text)?;
    let name = action_name(&action);
    let mut response = into_response(action, usage, finish_reason, deltas);
    response.understanding = understanding;
    Ok((response, name))
}

fn action_name(action: &Action) -> &'static str {
    match action {
        Action::Respond { .. } => "RESPOND",
        Action::CallTool { .. } => "CALL_TOOL",
        Action::Clarify { .. } => "CLARIFY",
    }
}

fn into_response(
    action: Action,
    usage: keel_protocol::TokenUsage,
    finish_reason: Option<String>,
    deltas: Option<&UnboundedSender<String>>,
) -> ModelResponse {
    let call = |name: String, arguments: Value| ToolCall {
        id: format!("call_{}", uuid::Uuid::now_v7().simple()),
        name,
        arguments: arguments.to_string(),
    };
    let (text, tool_calls) = match action {
        Action::Respond { answer } => {
            if let Some(sender) = deltas {
                // A dropped receiver only means nobody is watching the stream.
                let _ = sender.unbounded_send(answer.clone());
            }
            (answer, Vec::new())
        }
        Action::CallTool {
            tool_name,
            arguments,
        } => (
            String::new(),
            vec![call(tool_name, Value::Object(arguments))],
        ),
        Action::Clarify {
            tool_name,
            missing_slots,
            question,
        } => (
            String::new(),
            vec![call(
                CLARIFY_TOOL.to_owned(),
                json!({ "tool_name": tool_name, "missing_slots": missing_slots, "question": question }),
            )],
        ),
    };
    // A call reply reads like a native one, whatever the inner model said.
    let finish_reason = if tool_calls.is_empty() {
        finish_reason
    } else {
        Some("tool_calls".to_owned())
    };
    ModelResponse {
        text,
        tool_calls,
        usage,
        finish_reason,
        understanding: Default::default(),
    }
}
