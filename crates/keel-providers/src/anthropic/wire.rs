//! The Messages API wire format: what keel sends and how a whole
//! (non-streamed) reply is read back.
//!
//! Keel's history is a flat list where tool results are their own messages;
//! the Messages API wants strictly alternating `user` / `assistant` turns with
//! tool results as blocks of a user turn. The mapping below bridges the two.

use keel_protocol::{Message, ModelError, ModelRequest, ModelResponse, TokenUsage, ToolCall};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::encoded::{Encoded, KeptTools};
use crate::http::excerpt;

/// Stands in for a user turn the API requires but the history lacks (a
/// conversation must start with `user`, and must not be empty).
const CONTINUE_TEXT: &str = "(continue)";

/// Builds the body for `POST {base_url}/v1/messages`, encoding only the
/// messages (and tools) that changed since the conversation's last call.
pub(crate) fn request_body(
    model: &str,
    request: &ModelRequest,
    stream: bool,
    default_max_tokens: u32,
) -> Result<Vec<u8>, serde_json::Error> {
    request
        .cache
        .with(|kept: &mut Kept| kept.body(model, request, stream, default_max_tokens))
}

/// What a Messages API client keeps between one conversation's calls.
#[derive(Default)]
pub(crate) struct Kept {
    messages: Encoded<Part>,
    tools: KeptTools,
    last_len: usize,
}

/// One history message's share of the body. Turns are assembled from these
/// at every call (merging is a matter of copying bytes), since where a
/// message lands depends on its neighbours.
enum Part {
    /// Joins the top-level system prompt: the API has no system role
    /// inside `messages`, so every system message, wherever it sits, goes there.
    System(String),
    Blocks {
        role: Role,
        blocks: Vec<Block>,
    },
}

struct Block {
    tool_result: bool,
    json: Vec<u8>,
}

impl Block {
    fn of(value: &Value) -> Result<Self, serde_json::Error> {
        Ok(Self {
            tool_result: value["type"] == "tool_result",
            json: serde_json::to_vec(value)?,
        })
    }
}

fn part(message: &Message) -> Result<Part, serde_json::Error> {
    let (role, blocks) = match message {
        Message::System { content } => {
            if content.trim().is_empty() {
                return Ok(Part::Blocks {
                    role: Role::User,
                    blocks: Vec::new(),
                });
            }
            return Ok(Part::System(content.clone()));
        }
        Message::User { content } => (Role::User, text_block(content).into_iter().collect()),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let mut blocks: Vec<Value> = text_block(content).into_iter().collect();
            blocks.extend(tool_calls.iter().map(tool_use_block));
            (Role::Assistant, blocks)
        }
        Message::Tool {
            call_id,
            content,
            is_error,
            ..
        } => {
            let mut block = json!({ "type": "tool_result", "tool_use_id": call_id });
            // An empty result is sent without `content`, which the API
            // accepts, rather than as an empty text it may refuse.
            if !content.is_empty() {
                block["content"] = json!(content);
            }
            if *is_error {
                block["is_error"] = json!(true);
            }
            (Role::User, vec![block])
        }
    };
    Ok(Part::Blocks {
        role,
        blocks: blocks.iter().map(Block::of).collect::<Result<_, _>>()?,
    })
}

impl Kept {
    fn body(
        &mut self,
        model: &str,
        request: &ModelRequest,
        stream: bool,
        default_max_tokens: u32,
    ) -> Result<Vec<u8>, serde_json::Error> {
        let mut system: Vec<&str> = Vec::new();
        let mut turns: Vec<(Role, Vec<&Block>)> = Vec::new();
        for part in self.messages.update(&request.messages, part)? {
            match part {
                Part::System(text) => system.push(text),
                Part::Blocks { blocks, .. } if blocks.is_empty() => {}
                // The API requires roles to alternate: same-role messages
                // share one turn.
                Part::Blocks { role, blocks } => match turns.last_mut() {
                    Some((last, merged)) if last == role => merged.extend(blocks),
                    _ => turns.push((*role, blocks.iter().collect())),
                },
            }
        }
        let mut out = Vec::with_capacity(self.last_len + 512);
        out.extend_from_slice(b"{\"model\":");
        serde_json::to_writer(&mut out, model)?;
        out.extend_from_slice(b",\"max_tokens\":");
        serde_json::to_writer(
            &mut out,
            &request.max_output_tokens.unwrap_or(default_max_tokens),
        )?;
        out.extend_from_slice(b",\"messages\":[");
        // A conversation must start with `user`, and must not be empty.
        if turns.first().is_none_or(|(role, _)| *role != Role::User) {
            out.extend_from_slice(b"{\"role\":\"user\",\"content\":[");
            serde_json::to_writer(&mut out, &json!({ "type": "text", "text": CONTINUE_TEXT }))?;
            out.extend_from_slice(b"]}");
            if !turns.is_empty() {
                out.push(b',');
            }
        }
        for (i, (role, blocks)) in turns.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(match role {
                Role::User => b"{\"role\":\"user\",\"content\":[",
                Role::Assistant => b"{\"role\":\"assistant\",\"content\":[",
            });
            // Within a user turn, tool results go first: the API wants them
            // before any text that follows a tool use.
            let ordered: Vec<&&Block> = match role {
                Role::User => blocks
                    .iter()
                    .filter(|b| b.tool_result)
                    .chain(blocks.iter().filter(|b| !b.tool_result))
                    .collect(),
                Role::Assistant => blocks.iter().collect(),
            };
            for (j, block) in ordered.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&block.json);
            }
            out.extend_from_slice(b"]}");
        }
        out.extend_from_slice(b"],\"stream\":");
        out.extend_from_slice(if stream { b"true" } else { b"false" });
        if !system.is_empty() {
            out.extend_from_slice(b",\"system\":");
            serde_json::to_writer(&mut out, &system.join("\n\n"))?;
        }
        if !request.tools.is_empty() {
            out.extend_from_slice(b",\"tools\":");
            out.extend_from_slice(self.tools.json(&request.tools, |tools| {
                let wire: Vec<Value> = tools
                    .iter()
                    .map(|t| {
                        // `input_schema` must be an object schema; a tool
                        // without parameters still needs one.
                        let schema = if t.parameters.is_object() {
                            Value::clone(&t.parameters)
                        } else {
                            json!({ "type": "object", "properties": {} })
                        };
                        json!({ "name": t.name, "description": t.description, "input_schema": schema })
                    })
                    .collect();
                serde_json::to_vec(&wire)
            })?);
        }
        out.push(b'}');
        self.last_len = out.len();
        Ok(out)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    User,
    Assistant,
}

/// The API refuses empty text blocks, so empty text contributes none.
fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({ "type": "text", "text": text }))
}

/// `input` must be a JSON object. Arguments that are not one (the model wrote
/// broken JSON, which the loop reports back as a tool error) are sent as
/// `{"_raw_arguments": "<text>"}`, so the model still sees what it wrote
/// beside the error instead of a silently emptied call.
fn tool_use_block(call: &ToolCall) -> Value {
    let input = match serde_json::from_str::<Value>(&call.arguments) {
        Ok(Value::Object(map)) => Value::Object(map),
        _ if call.arguments.trim().is_empty() => Value::Object(Map::new()),
        _ => json!({ "_raw_arguments": call.arguments }),
    };
    json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": input })
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub input_tokens: Option<u64>,
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    pub output_tokens: Option<u64>,
}

impl WireUsage {
    /// Prompt tokens, cached ones included: they fill the context window too.
    /// The sum saturates: counts are the provider's word, and no count may
    /// make reading the reply fail.
    pub(crate) fn prompt_tokens(&self) -> Option<u64> {
        let parts = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ];
        if parts.iter().all(Option::is_none) {
            return None;
        }
        Some(
            parts
                .iter()
                .map(|p| p.unwrap_or(0))
                .fold(0, u64::saturating_add),
        )
    }
}

/// Thinking blocks are read only to be skipped: their text is never kept.
#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    content: Option<Vec<Value>>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

/// Reads a whole `message` object.
pub(crate) fn parse_message(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let message: WireMessage = serde_json::from_slice(body).map_err(|e| {
        ModelError::Protocol(format!(
            "message body is not valid JSON ({e}): {}",
            excerpt(&String::from_utf8_lossy(body))
        ))
    })?;
    if message.kind.as_deref() == Some("error") || message.error.is_some() {
        let error = message.error.unwrap_or(Value::Null);
        return Err(event_error(&error));
    }
    let content = message
        .content
        .ok_or_else(|| ModelError::Protocol("message has no content".into()))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(t) = block.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
            Some("tool_use") => {
                let id = block.get("id").and_then(Value::as_str).map(str::to_owned);
                let name = block.get("name").and_then(Value::as_str).map(str::to_owned);
                let input = match block.get("input") {
                    None | Some(Value::Null) => String::new(),
                    Some(v) => v.to_string(),
                };
                tool_calls.push(finish_call(tool_calls.len(), id, name, input)?);
            }
            // thinking, redacted_thinking and server-side blocks are not for users.
            _ => {}
        }
    }
    let usage = message.usage.unwrap_or_default();
    Ok(ModelResponse {
        text,
        tool_calls,
        usage: TokenUsage {
            prompt_tokens: usage.prompt_tokens().unwrap_or(0),
            completion_tokens: usage.output_tokens.unwrap_or(0),
        },
        finish_reason: message.stop_reason,
        understanding: Default::default(),
    })
}

/// Completes one tool use: an id is required to pair the result with it, so a
/// missing one is generated; a missing name is fatal (the call cannot be routed).
pub(crate) fn finish_call(
    position: usize,
    id: Option<String>,
    name: Option<String>,
    input: String,
) -> Result<ToolCall, ModelError> {
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ModelError::Protocol(format!("tool use #{position} has no name")))?;
    let id = id
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| format!("toolu_{}", uuid::Uuid::now_v7().simple()));
    let arguments = if input.trim().is_empty() {
        "{}".to_string()
    } else {
        input
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

/// Maps an `error` object (from an error body or a mid-stream `error` event)
/// to the failure it stands for, so overload and rate limits stay retryable.
pub(crate) fn event_error(error: &Value) -> ModelError {
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    let message = error_text(error);
    match kind {
        "overloaded_error" => ModelError::Http {
            status: 529,
            message,
        },
        "api_error" => ModelError::Http {
            status: 500,
            message,
        },
        "rate_limit_error" => ModelError::RateLimited {
            retry_after: None,
            message,
        },
        "timeout_error" => ModelError::Timeout,
        _ => ModelError::Protocol(format!("provider reported an error: {message}")),
    }
}

/// Turns an error body into a readable message: `error.message (type)` of an
/// Anthropic-style body when there is one, else the (shortened) raw text.
pub(crate) fn error_message(body: &str) -> String {
    match serde_json::from_str::<Value>(body) {
        Ok(value) => match value.get("error") {
            Some(error) => error_text(error),
            None => excerpt(body),
        },
        Err(_) if body.trim().is_empty() => "(empty body)".to_string(),
        Err(_) => excerpt(body),
    }
}

fn error_text(error: &Value) -> String {
    let Some(message) = error.get("message").and_then(Value::as_str) else {
        return match error.as_str() {
            Some(s) => s.to_string(),
            None => excerpt(&error.to_string()),
        };
    };
    match error.get("type").and_then(Value::as_str) {
        Some(kind) => format!("{message} (type: {kind})"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{ToolSchema, shared_messages};

    fn body_value(request: &ModelRequest, stream: bool) -> Value {
        serde_json::from_slice(&request_body("claude", request, stream, 4096).unwrap()).unwrap()
    }

    fn call(id: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "f".into(),
            arguments: args.into(),
        }
    }

    fn result(id: &str, content: &str, is_error: bool) -> Message {
        Message::Tool {
            call_id: id.into(),
            name: "f".into(),
            content: content.into(),
            is_error,
        }
    }

    #[test]
    fn history_maps_to_alternating_turns() {
        let request = ModelRequest {
            messages: shared_messages(vec![
                Message::system("one"),
                Message::user("u"),
                Message::Assistant {
                    content: "let me look".into(),
                    tool_calls: vec![call("a", "{\"x\":1}"), call("b", "{broken")],
                },
                result("a", "1", false),
                result("b", "", true),
                Message::system("two"),
                Message::user("and?"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![],
                },
                Message::user("hello?"),
            ]),
            tools: vec![ToolSchema {
                name: "f".into(),
                description: "d".into(),
                parameters: Value::Null.into(),
            }],
            max_output_tokens: None,
            ..Default::default()
        };
        let body = body_value(&request, false);
        assert_eq!(body["model"], "claude");
        assert_eq!(body["stream"], false);
        assert_eq!(body["system"], "one\n\ntwo");
        assert_eq!(body["max_tokens"], 4096);
        assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(
            m[0],
            json!({"role":"user","content":[{"type":"text","text":"u"}]})
        );
        assert_eq!(m[1]["content"][1]["input"], json!({"x":1}));
        assert_eq!(
            m[1]["content"][2]["input"],
            json!({"_raw_arguments":"{broken"})
        );
        assert_eq!(
            m[2]["content"],
            json!([
                {"type":"tool_result","tool_use_id":"a","content":"1"},
                {"type":"tool_result","tool_use_id":"b","is_error":true},
                {"type":"text","text":"and?"},
                {"type":"text","text":"hello?"}
            ])
        );
    }

    #[test]
    fn a_kept_conversation_sends_what_a_fresh_one_does() {
        let cache = keel_protocol::WireCache::default();
        let mut messages = vec![Message::system("one"), Message::user("u")];
        let mut tools = vec![ToolSchema {
            name: "f".into(),
            description: "d".into(),
            parameters: json!({"type":"object"}).into(),
        }];
        for turn in 0..6 {
            if turn == 3 {
                messages[1] = Message::user("summary of the first turns");
                tools.truncate(0);
            }
            let id = format!("c{turn}");
            messages.push(Message::Assistant {
                content: if turn % 2 == 0 {
                    String::new()
                } else {
                    "looking".into()
                },
                tool_calls: vec![call(&id, "{\"x\":1}")],
            });
            messages.push(result(&id, &format!("r{turn}"), turn == 1));
            if turn == 4 {
                messages.push(Message::system("a note"));
                messages.push(Message::user("and F4?"));
            }
            let kept = ModelRequest {
                messages: shared_messages(messages.clone()),
                tools: tools.clone(),
                max_output_tokens: None,
                cache: cache.clone(),
            };
            let fresh = ModelRequest {
                cache: Default::default(),
                ..kept.clone()
            };
            assert_eq!(
                request_body("claude", &kept, true, 99).unwrap(),
                request_body("claude", &fresh, true, 99).unwrap(),
                "turn {turn}"
            );
        }
        let body = body_value(
            &ModelRequest {
                messages: shared_messages(messages),
                tools,
                max_output_tokens: None,
                cache,
            },
            false,
        );
        assert_eq!(body["system"], "one\n\na note");
        let turns = body["messages"].as_array().unwrap();
        assert_eq!(turns.len(), 13, "{turns:?}");
        assert_eq!(turns[0]["content"][0]["text"], "summary of the first turns");
        // The results of turn 4 come before the user's text in the same turn.
        assert_eq!(turns[10]["content"][0]["type"], "tool_result");
        assert_eq!(turns[10]["content"][1]["text"], "and F4?");
        assert!(body.get("tools").is_none());
    }

    #[test]
    fn an_empty_conversation_is_one_placeholder_turn() {
        let body = body_value(&ModelRequest::default(), false);
        assert_eq!(
            body["messages"],
            json!([{"role":"user","content":[{"type":"text","text":"(continue)"}]}])
        );
    }

    #[test]
    fn conversation_not_starting_with_user_gets_a_placeholder() {
        let request = ModelRequest {
            messages: shared_messages(vec![Message::Assistant {
                content: "hi".into(),
                tool_calls: vec![],
            }]),
            tools: vec![],
            max_output_tokens: Some(9),
            ..Default::default()
        };
        let body = body_value(&request, true);
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(body["messages"][1]["role"], "assistant");
        assert_eq!(body["max_tokens"], 9);
        assert!(body.get("system").is_none() && body.get("tools").is_none());
    }

    /// Found with the `anthropic_message` fuzz target: prompt token counts
    /// whose sum overflows made reading the reply panic.
    #[test]
    fn huge_token_counts_saturate() {
        let body = br#"{"type":"message","content":[],"usage":{"input_tokens":18446744073709551615,"cache_creation_input_tokens":5}}"#;
        let r = parse_message(body).unwrap();
        assert_eq!(r.usage.prompt_tokens, u64::MAX);
    }

    #[test]
    fn whole_message_skips_thinking() {
        let body = json!({
            "type":"message","role":"assistant",
            "content":[{"type":"thinking","thinking":"secret","signature":"s"},
                       {"type":"redacted_thinking","data":"xx"},
                       {"type":"text","text":"Hi"},
                       {"type":"tool_use","id":"t1","name":"f","input":{"a":1}}],
            "stop_reason":"tool_use",
            "usage":{"input_tokens":3,"cache_read_input_tokens":2,"output_tokens":4}
        });
        let r = parse_message(body.to_string().as_bytes()).unwrap();
        assert_eq!(r.text, "Hi");
        assert_eq!(r.tool_calls[0].arguments, "{\"a\":1}");
        assert_eq!(r.usage.prompt_tokens, 5);
        assert_eq!(r.finish_reason.as_deref(), Some("tool_use"));
    }

    #[test]
    fn error_bodies_and_events() {
        let body = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(error_message(body), "Overloaded (type: overloaded_error)");
        assert!(matches!(
            parse_message(body.as_bytes()),
            Err(ModelError::Http { status: 529, .. })
        ));
        assert!(matches!(
            event_error(&json!({"type":"invalid_request_error","message":"x"})),
            ModelError::Protocol(_)
        ));
    }
}
