//! The Chat Completions wire format: what keel sends and how a whole
//! (non-streamed) reply is read back.

use keel_protocol::{Message, ModelError, ModelRequest, ModelResponse, TokenUsage, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::encoded::{Encoded, KeptTools};
use crate::http::excerpt;

/// Builds the body for `POST {base_url}/chat/completions`, encoding only
/// the messages (and tools) that changed since the conversation's last call.
pub(crate) fn request_body(
    model: &str,
    request: &ModelRequest,
    stream: bool,
) -> Result<Vec<u8>, serde_json::Error> {
    request
        .cache
        .with(|kept: &mut Kept| kept.body(model, request, stream))
}

/// What a Chat Completions client keeps between one conversation's calls.
#[derive(Default)]
pub(crate) struct Kept {
    messages: Encoded<Vec<u8>>,
    tools: KeptTools,
    last_len: usize,
}

impl Kept {
    fn body(
        &mut self,
        model: &str,
        request: &ModelRequest,
        stream: bool,
    ) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = Vec::with_capacity(self.last_len + 512);
        out.extend_from_slice(b"{\"model\":");
        serde_json::to_writer(&mut out, model)?;
        out.extend_from_slice(b",\"messages\":[");
        let messages = self.messages.update(&request.messages, |m| {
            serde_json::to_vec(&SentMessage::of(m))
        })?;
        for (i, m) in messages.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(m);
        }
        out.extend_from_slice(b"],\"stream\":");
        out.extend_from_slice(if stream { b"true" } else { b"false" });
        if stream {
            out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
        }
        if !request.tools.is_empty() {
            out.extend_from_slice(b",\"tools\":");
            out.extend_from_slice(self.tools.json(&request.tools, |tools| {
                let wire: Vec<SentTool<'_>> = tools
                    .iter()
                    .map(|t| SentTool {
                        kind: "function",
                        function: SentFunctionSpec {
                            name: &t.name,
                            description: &t.description,
                            parameters: &t.parameters,
                        },
                    })
                    .collect();
                serde_json::to_vec(&wire)
            })?);
            out.extend_from_slice(b",\"tool_choice\":\"auto\"");
        }
        if let Some(max) = request.max_output_tokens {
            out.extend_from_slice(b",\"max_tokens\":");
            serde_json::to_writer(&mut out, &max)?;
        }
        out.push(b'}');
        self.last_len = out.len();
        Ok(out)
    }
}

/// One message as Chat Completions wants it.
#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum SentMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        /// The API wants `null`, not "", beside tool calls; some servers reject "".
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<SentCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

impl<'a> SentMessage<'a> {
    fn of(message: &'a Message) -> Self {
        match message {
            Message::System { content } => Self::System { content },
            Message::User { content } => Self::User { content },
            Message::Assistant {
                content,
                tool_calls,
            } => Self::Assistant {
                content: (tool_calls.is_empty() || !content.is_empty()).then_some(content.as_str()),
                tool_calls: tool_calls
                    .iter()
                    .map(|c| SentCall {
                        id: &c.id,
                        kind: "function",
                        function: SentFunction {
                            name: &c.name,
                            arguments: &c.arguments,
                        },
                    })
                    .collect(),
            },
            Message::Tool {
                call_id, content, ..
            } => Self::Tool {
                tool_call_id: call_id,
                content,
            },
        }
    }
}

#[derive(Serialize)]
struct SentCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: SentFunction<'a>,
}

#[derive(Serialize)]
struct SentFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct SentTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: SentFunctionSpec<'a>,
}

#[derive(Serialize)]
struct SentFunctionSpec<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

impl WireUsage {
    pub(crate) fn to_usage(&self) -> TokenUsage {
        TokenUsage {
            prompt_tokens: self.prompt_tokens.unwrap_or(0),
            completion_tokens: self.completion_tokens.unwrap_or(0),
        }
    }
}

// Reasoning fields (`reasoning_content`, `reasoning`) are deliberately not
// declared here or in the stream types: what is not read cannot leak.
#[derive(Debug, Deserialize)]
struct Completion {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    message: Option<WireMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Debug, Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

/// Reads a whole `chat.completion` object.
pub(crate) fn parse_completion(body: &[u8]) -> Result<ModelResponse, ModelError> {
    let completion: Completion = serde_json::from_slice(body).map_err(|e| {
        ModelError::Protocol(format!(
            "completion body is not valid JSON ({e}): {}",
            excerpt(&String::from_utf8_lossy(body))
        ))
    })?;
    if let Some(error) = completion.error {
        return Err(ModelError::Protocol(format!(
            "provider returned an error object: {}",
            error_text(&error)
        )));
    }
    let choice = completion
        .choices
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.index.unwrap_or(0) == 0)
        .ok_or_else(|| ModelError::Protocol("completion has no choices".into()))?;
    let message = choice
        .message
        .ok_or_else(|| ModelError::Protocol("completion choice has no message".into()))?;
    let text = content_text(message.content.as_ref())?;
    let mut tool_calls = Vec::new();
    for (i, call) in message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let (name, arguments) = match call.function {
            Some(f) => (f.name, f.arguments),
            None => (None, None),
        };
        tool_calls.push(finish_call(
            i,
            call.id,
            name,
            arguments_text(arguments.as_ref()),
        )?);
    }
    Ok(ModelResponse {
        text,
        tool_calls,
        usage: completion.usage.map(|u| u.to_usage()).unwrap_or_default(),
        finish_reason: choice.finish_reason,
        understanding: Default::default(),
    })
}

/// `content` is a string, `null`, or (on some compatible servers) a list of parts.
fn content_text(content: Option<&Value>) -> Result<String, ModelError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect()),
        Some(other) => Err(ModelError::Protocol(format!(
            "message content has unexpected type: {}",
            excerpt(&other.to_string())
        ))),
    }
}

/// Arguments stay raw text; a server that sends an object gets it re-serialised.
pub(crate) fn arguments_text(arguments: Option<&Value>) -> String {
    match arguments {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Completes one tool call: a missing id is generated, a missing name is fatal
/// (the call cannot be routed), and empty arguments mean "no arguments".
pub(crate) fn finish_call(
    position: usize,
    id: Option<String>,
    name: Option<String>,
    arguments: String,
) -> Result<ToolCall, ModelError> {
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
        ModelError::Protocol(format!("tool call #{position} has no function name"))
    })?;
    let id = id
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| format!("call_{}", uuid::Uuid::now_v7().simple()));
    let arguments = if arguments.trim().is_empty() {
        "{}".to_string()
    } else {
        arguments
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

/// Turns an error body into a readable message: the `error.message` of an
/// OpenAI-style body when there is one, else the (shortened) raw text.
pub(crate) fn error_message(body: &str) -> String {
    match serde_json::from_str::<Value>(body) {
        Ok(value) => match value.get("error") {
            Some(error) => error_text(error),
            None => match value.get("message").and_then(Value::as_str) {
                Some(m) => m.to_string(),
                None => excerpt(body),
            },
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
    let mut text = message.to_string();
    let kind = error.get("type").and_then(Value::as_str);
    let code = error.get("code").filter(|c| !c.is_null());
    match (kind, code) {
        (Some(k), Some(c)) => text.push_str(&format!(" (type: {k}, code: {c})")),
        (Some(k), None) => text.push_str(&format!(" (type: {k})")),
        (None, Some(c)) => text.push_str(&format!(" (code: {c})")),
        (None, None) => {}
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{ToolSchema, shared_messages};
    use serde_json::json;

    fn body_value(model: &str, request: &ModelRequest, stream: bool) -> Value {
        serde_json::from_slice(&request_body(model, request, stream).unwrap()).unwrap()
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "lookup".into(),
            arguments: format!("{{\"key\":\"{id}\"}}"),
        }
    }

    #[test]
    fn a_kept_conversation_sends_what_a_fresh_one_does() {
        let tools = vec![ToolSchema {
            name: "lookup".into(),
            description: "d".into(),
            parameters: json!({"type":"object"}).into(),
        }];
        let cache = keel_protocol::WireCache::default();
        let mut messages = vec![Message::system("s"), Message::user("u \"quoted\" \u{e9}")];
        let mut offered = tools.clone();
        for turn in 0..6 {
            if turn == 3 {
                // A compaction rewrites the middle; the tools change too.
                messages[1] = Message::user("summary");
                offered.push(ToolSchema {
                    name: "clarify".into(),
                    description: "ask".into(),
                    parameters: json!({"type":"object","properties":{}}).into(),
                });
            }
            let id = format!("c{turn}");
            messages.push(Message::Assistant {
                content: if turn % 2 == 0 {
                    String::new()
                } else {
                    "thinking".into()
                },
                tool_calls: vec![call(&id)],
            });
            messages.push(Message::Tool {
                call_id: id,
                name: "lookup".into(),
                content: format!("result {turn}"),
                is_error: turn == 2,
            });
            let kept = ModelRequest {
                messages: shared_messages(messages.clone()),
                tools: offered.clone(),
                max_output_tokens: None,
                cache: cache.clone(),
            };
            let fresh = ModelRequest {
                cache: Default::default(),
                ..kept.clone()
            };
            assert_eq!(
                request_body("m", &kept, false).unwrap(),
                request_body("m", &fresh, false).unwrap(),
                "turn {turn}"
            );
        }
        let body = body_value(
            "m",
            &ModelRequest {
                messages: shared_messages(messages.clone()),
                tools: offered,
                max_output_tokens: None,
                cache,
            },
            false,
        );
        assert_eq!(body["messages"].as_array().unwrap().len(), messages.len());
        assert_eq!(body["messages"][1]["content"], "summary");
        assert_eq!(body["messages"][2]["content"], Value::Null);
        assert_eq!(body["messages"][4]["content"], "thinking");
        assert_eq!(body["tools"][1]["function"]["name"], "clarify");
    }

    #[test]
    fn assistant_with_calls_sends_null_content_and_tool_messages_answer_them() {
        let request = ModelRequest {
            messages: shared_messages(vec![
                Message::system("s"),
                Message::user("u"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "f".into(),
                        arguments: "{\"a\":1}".into(),
                    }],
                },
                Message::Tool {
                    call_id: "c1".into(),
                    name: "f".into(),
                    content: "ok".into(),
                    is_error: false,
                },
            ]),
            tools: vec![],
            max_output_tokens: Some(7),
            ..Default::default()
        };
        let body = body_value("m", &request, false);
        assert_eq!(body["messages"][0], json!({"role":"system","content":"s"}));
        assert_eq!(body["messages"][1], json!({"role":"user","content":"u"}));
        assert_eq!(body["max_tokens"], 7);
        assert!(body.get("tools").is_none());
        assert!(body.get("tool_choice").is_none());
        assert!(body.get("stream_options").is_none());
        assert_eq!(body["messages"][2]["content"], Value::Null);
        assert_eq!(
            body["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"a\":1}"
        );
        assert_eq!(
            body["messages"][3],
            json!({"role":"tool","tool_call_id":"c1","content":"ok"})
        );
    }

    #[test]
    fn tools_are_offered_with_auto_choice() {
        let request = ModelRequest {
            messages: shared_messages(vec![Message::user("u")]),
            tools: vec![ToolSchema {
                name: "f".into(),
                description: "d".into(),
                parameters: json!({"type":"object"}).into(),
            }],
            max_output_tokens: None,
            ..Default::default()
        };
        let body = body_value("m", &request, true);
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream"], true);
        assert_eq!(body["tool_choice"], "auto");
        assert_eq!(body["tools"][0]["function"]["name"], "f");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert!(body.get("max_tokens").is_none());
    }

    #[test]
    fn completion_parts_and_object_arguments_are_read() {
        let body = json!({
            "choices": [{"index":0,"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],
              "reasoning_content":"secret",
              "tool_calls":[{"function":{"name":"f","arguments":{"x":1}}}]},"finish_reason":"tool_calls"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4}
        });
        let r = parse_completion(body.to_string().as_bytes()).unwrap();
        assert_eq!(r.text, "ab");
        assert_eq!(r.tool_calls[0].arguments, "{\"x\":1}");
        assert!(r.tool_calls[0].id.starts_with("call_"));
        assert_eq!(r.usage.completion_tokens, 4);
    }

    #[test]
    fn nameless_call_and_error_bodies() {
        let body = json!({"choices":[{"message":{"tool_calls":[{"id":"x","function":{"arguments":"{}"}}]}}]});
        assert!(matches!(
            parse_completion(body.to_string().as_bytes()),
            Err(ModelError::Protocol(m)) if m.contains("no function name")
        ));
        let msg = error_message(
            r#"{"error":{"message":"bad key","type":"auth","code":"invalid_api_key"}}"#,
        );
        assert_eq!(msg, "bad key (type: auth, code: \"invalid_api_key\")");
        assert_eq!(error_message("oops"), "oops");
    }
}
