//! Building scripted replies, and reading requests from inside a responder.

use keel_protocol::{Message, ModelError, ModelRequest, ModelResponse, ToolCall};
use serde_json::Value;

use super::{Gate, Step};

/// A plain answer: the model responds without calling tools.
pub fn reply_text(text: impl Into<String>) -> ModelResponse {
    ModelResponse {
        text: text.into(),
        ..ModelResponse::default()
    }
}

/// One tool call. Its id is left empty and assigned by the model when it
/// answers (`call_1`, `call_2`, … unique per model), as a provider would.
pub fn call_tool(name: &str, arguments: Value) -> ModelResponse {
    call_tools([(name, arguments)])
}

/// Several tool calls in one turn, in this order.
pub fn call_tools<'a>(calls: impl IntoIterator<Item = (&'a str, Value)>) -> ModelResponse {
    ModelResponse {
        tool_calls: calls
            .into_iter()
            .map(|(name, arguments)| ToolCall {
                id: String::new(),
                name: name.to_owned(),
                arguments: arguments.to_string(),
            })
            .collect(),
        ..ModelResponse::default()
    }
}

/// A tool call whose arguments are this exact text, e.g. malformed JSON.
pub fn raw_call(name: &str, raw_arguments: &str) -> ModelResponse {
    ModelResponse {
        tool_calls: vec![ToolCall {
            id: String::new(),
            name: name.to_owned(),
            arguments: raw_arguments.to_owned(),
        }],
        ..ModelResponse::default()
    }
}

/// A step answered from the request, e.g. from the user's last message.
pub fn respond(responder: impl Fn(&ModelRequest) -> ModelResponse + Send + Sync + 'static) -> Step {
    Step::Respond(Box::new(responder))
}

/// A step that fails as a provider would.
pub fn fail(error: ModelError) -> Step {
    Step::Fail(error)
}

/// A step that never answers.
pub fn hang() -> Step {
    Step::Hang
}

/// A step held back until `gate` is open.
pub fn when_open(gate: &Gate, step: impl Into<Step>) -> Step {
    Step::Gated(gate.clone(), Box::new(step.into()))
}

/// The text of the request's last user message.
pub fn last_user_text(request: &ModelRequest) -> Option<&str> {
    request.messages.iter().rev().find_map(|m| match &**m {
        Message::User { content } => Some(content.as_str()),
        _ => None,
    })
}

/// Whether the request offers the model any function (a closing,
/// answer-only call offers none).
pub fn offers_tools(request: &ModelRequest) -> bool {
    !request.tools.is_empty()
}

/// The tool messages of the request, oldest first, as `(call_id, content)`.
pub fn tool_messages(request: &ModelRequest) -> Vec<(&str, &str)> {
    request
        .messages
        .iter()
        .filter_map(|m| match &**m {
            Message::Tool {
                call_id, content, ..
            } => Some((call_id.as_str(), content.as_str())),
            _ => None,
        })
        .collect()
}

/// The text of every system message of the request, in order.
pub fn system_texts(request: &ModelRequest) -> Vec<&str> {
    request
        .messages
        .iter()
        .filter_map(|m| match &**m {
            Message::System { content } => Some(content.as_str()),
            _ => None,
        })
        .collect()
}
