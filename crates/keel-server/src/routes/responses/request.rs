//! The request body of `POST /v1/responses`, parsed leniently: every field
//! the SDKs send is accepted, the ones keel acts on are checked, and a
//! malformed one is rejected with its name in `param`.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::OaiError;

/// Fields the OpenAI SDKs send. Unknown fields are ignored, as clients of a
/// compatible endpoint expect; sampling settings are echoed but the agent's
/// configured model settings apply.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"model": "default", "input": "Hello"}))]
pub struct CreateResponse {
    /// The keel agent to run (see `GET /v1/models`).
    // Optional here so that its absence gets an error naming it.
    #[schema(value_type = String, required = true, min_length = 1)]
    pub model: Option<String>,
    /// A string (one user message) or an array of input items: messages
    /// (`role` user, assistant, system or developer; `content` a string or
    /// `input_text` parts), `function_call_output`s for the calls the
    /// previous response ended with, and replayed output items. Every
    /// request needs at least one message or output.
    #[schema(value_type = ResponseInput, required = true)]
    pub input: Option<Value>,
    pub instructions: Option<String>,
    /// Client function tools (`{"type": "function", "name", "description",
    /// "parameters", "strict"}`); keel's own tools are configured on the server.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    pub previous_response_id: Option<String>,
    pub stream: Option<bool>,
    /// Type-checked and otherwise ignored (see the module doc of `responses`).
    #[allow(dead_code)]
    pub store: Option<bool>,
    /// `auto`, `none`, `required`, or a tool choice object with a `type`.
    #[schema(value_type = Option<Value>)]
    pub tool_choice: Option<Value>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    pub max_output_tokens: Option<u64>,
    pub max_tool_calls: Option<u64>,
    pub parallel_tool_calls: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub text: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Map<String, Value>>,
    /// `auto` or `disabled`.
    pub truncation: Option<String>,
    pub user: Option<String>,
    /// Type-checked and otherwise ignored (see the module doc of `responses`).
    #[allow(dead_code)]
    pub include: Option<Vec<String>>,
    /// Must not be `true`: keel has no background responses.
    pub background: Option<bool>,
    /// Must be absent or `null`: continue with `previous_response_id`.
    #[schema(value_type = Option<Value>)]
    pub conversation: Option<Value>,
    pub service_tier: Option<String>,
    pub top_logprobs: Option<u32>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    /// Type-checked and otherwise ignored (see the module doc of `responses`).
    #[allow(dead_code)]
    #[schema(value_type = Option<Object>)]
    pub stream_options: Option<Map<String, Value>>,
}

/// What `input` may be, for the OpenAPI document: the handler reads it as
/// JSON (`parse_input`) to name a malformed item's field in its error.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<std::collections::HashMap<String, Value>>),
}

/// Parses the body; a type error names the field in `param`.
pub fn parse_body(bytes: &[u8]) -> Result<CreateResponse, OaiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(OaiError::invalid(
            "",
            "the body must be a JSON object, got an empty body",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            OaiError::invalid("", format!("invalid JSON body: {inner}"))
        } else {
            OaiError::invalid(path, inner.to_string())
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    System,
    Developer,
}

impl Role {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "user" => Self::User,
            "assistant" => Self::Assistant,
            "system" => Self::System,
            "developer" => Self::Developer,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::System => "system",
            Self::Developer => "developer",
        }
    }
}

/// One input item, reduced to what keel uses.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Message {
        role: Role,
        text: String,
        id: Option<String>,
    },
    /// A call the client replays from an earlier response.
    FunctionCall {
        call_id: String,
        id: Option<String>,
    },
    FunctionCallOutput {
        call_id: String,
        output: String,
    },
    /// `item_reference`, or a replayed reasoning item: only its id matters.
    Reference {
        id: Option<String>,
    },
}

impl Item {
    /// The id the client gave the item (replayed output items carry keel's).
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Message { id, .. } | Self::FunctionCall { id, .. } | Self::Reference { id } => {
                id.as_deref()
            }
            Self::FunctionCallOutput { .. } => None,
        }
    }
}

/// `input` as items: a string is one user message.
pub fn parse_input(input: Option<&Value>) -> Result<Vec<Item>, OaiError> {
    match input {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![Item::Message {
            role: Role::User,
            text: s.clone(),
            id: None,
        }]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| parse_item(&format!("input[{i}]"), v))
            .collect(),
        Some(other) => Err(OaiError::invalid(
            "input",
            format!(
                "expected a string or an array of input items, got {}",
                kind(other)
            ),
        )),
    }
}

fn parse_item(at: &str, v: &Value) -> Result<Item, OaiError> {
    let Some(obj) = v.as_object() else {
        return Err(OaiError::invalid(
            at,
            format!("expected an input item object, got {}", kind(v)),
        ));
    };
    let id = optional_str(obj, at, "id")?;
    match obj.get("type").and_then(Value::as_str) {
        None if obj.get("type").is_some_and(|t| !t.is_null()) => {
            Err(OaiError::invalid(format!("{at}.type"), "expected a string"))
        }
        None | Some("message") => {
            let role_v = obj.get("role").and_then(Value::as_str).ok_or_else(|| {
                OaiError::invalid(
                    format!("{at}.role"),
                    "required: one of user, assistant, system, developer",
                )
            })?;
            let role = Role::parse(role_v).ok_or_else(|| {
                OaiError::invalid(
                    format!("{at}.role"),
                    format!("`{role_v}` is not one of user, assistant, system, developer"),
                )
            })?;
            let text = content_text(&format!("{at}.content"), obj.get("content"))?;
            Ok(Item::Message { role, text, id })
        }
        Some("function_call") => Ok(Item::FunctionCall {
            call_id: required_str(obj, at, "call_id")?,
            id,
        }),
        Some("function_call_output") => {
            let call_id = required_str(obj, at, "call_id")?;
            let output = match obj.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(_)) => content_text(&format!("{at}.output"), obj.get("output"))?,
                Some(other) => {
                    return Err(OaiError::invalid(
                        format!("{at}.output"),
                        format!("expected a string or content parts, got {}", kind(other)),
                    ));
                }
                None => {
                    return Err(OaiError::invalid(
                        format!("{at}.output"),
                        "required: the function's result",
                    ));
                }
            };
            Ok(Item::FunctionCallOutput { call_id, output })
        }
        Some("item_reference" | "reasoning") => Ok(Item::Reference { id }),
        Some(other) => Err(OaiError::invalid(
            format!("{at}.type"),
            format!(
                "input items of type `{other}` are not supported by keel \
                 (supported: message, function_call, function_call_output, item_reference, reasoning)"
            ),
        )),
    }
}

/// Text of a message's content: a string, or text parts joined.
fn content_text(at: &str, content: Option<&Value>) -> Result<String, OaiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let here = format!("{at}[{j}]");
                let t = part.get("type").and_then(Value::as_str).unwrap_or("");
                let field = match t {
                    "input_text" | "output_text" | "text" | "summary_text" => "text",
                    "refusal" => "refusal",
                    "" => {
                        return Err(OaiError::invalid(
                            format!("{here}.type"),
                            "required: a content part type such as `input_text`",
                        ));
                    }
                    other => {
                        return Err(OaiError::invalid(
                            format!("{here}.type"),
                            format!(
                                "content parts of type `{other}` are not supported by keel agents, which take text only"
                            ),
                        ));
                    }
                };
                let text = part.get(field).and_then(Value::as_str).ok_or_else(|| {
                    OaiError::invalid(format!("{here}.{field}"), "required: a string")
                })?;
                texts.push(text);
            }
            Ok(texts.join("\n"))
        }
        None | Some(Value::Null) => Err(OaiError::invalid(
            at,
            "required: a string or an array of content parts",
        )),
        Some(other) => Err(OaiError::invalid(
            at,
            format!(
                "expected a string or an array of content parts, got {}",
                kind(other)
            ),
        )),
    }
}

fn required_str(obj: &Map<String, Value>, at: &str, field: &str) -> Result<String, OaiError> {
    match obj.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(OaiError::invalid(
            format!("{at}.{field}"),
            "must not be empty",
        )),
        None | Some(Value::Null) => Err(OaiError::invalid(
            format!("{at}.{field}"),
            "required: a string",
        )),
        Some(other) => Err(OaiError::invalid(
            format!("{at}.{field}"),
            format!("expected a string, got {}", kind(other)),
        )),
    }
}

fn optional_str(
    obj: &Map<String, Value>,
    at: &str,
    field: &str,
) -> Result<Option<String>, OaiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(OaiError::invalid(
            format!("{at}.{field}"),
            format!("expected a string, got {}", kind(other)),
        )),
    }
}

/// A client function tool, as declared and as echoed in the response.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub strict: Option<bool>,
}

impl FunctionTool {
    pub fn schema(&self) -> keel_protocol::ToolSchema {
        keel_protocol::ToolSchema {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: std::sync::Arc::new(self.parameters.clone()),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.strict.unwrap_or(false),
        })
    }
}

/// Only function tools are declared by clients; keel's own tools are
/// configured server-side, where they run with every guardrail.
pub fn parse_tools(tools: Option<&[Value]>) -> Result<Vec<FunctionTool>, OaiError> {
    let mut out: Vec<FunctionTool> = Vec::new();
    for (i, t) in tools.unwrap_or_default().iter().enumerate() {
        let at = format!("tools[{i}]");
        let Some(obj) = t.as_object() else {
            return Err(OaiError::invalid(
                at,
                format!("expected a tool object, got {}", kind(t)),
            ));
        };
        match obj.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(OaiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "tools of type `{other}` are not supported by keel: declare client \
                         function tools (`\"type\": \"function\"`), or configure server-side \
                         tools in keel, where they run with all guardrails"
                    ),
                ));
            }
            None => {
                return Err(OaiError::invalid(
                    format!("{at}.type"),
                    "required: `function`",
                ));
            }
        }
        let name = required_str(obj, &at, "name")?;
        let valid_name = name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid_name {
            return Err(OaiError::invalid(
                format!("{at}.name"),
                format!("`{name}` must be 1 to 64 letters, digits, `_` or `-`"),
            ));
        }
        if out.iter().any(|f| f.name == name) {
            return Err(OaiError::invalid(
                format!("{at}.name"),
                format!("`{name}` is declared twice"),
            ));
        }
        let description = optional_str(obj, &at, "description")?.unwrap_or_default();
        let parameters = match obj.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(other) => {
                return Err(OaiError::invalid(
                    format!("{at}.parameters"),
                    format!("expected a JSON Schema object, got {}", kind(other)),
                ));
            }
        };
        let strict = match obj.get("strict") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                return Err(OaiError::invalid(
                    format!("{at}.strict"),
                    format!("expected a boolean, got {}", kind(other)),
                ));
            }
        };
        out.push(FunctionTool {
            name,
            description,
            parameters,
            strict,
        });
    }
    Ok(out)
}

/// Checks the fields whose values are enumerations.
pub fn check_choices(req: &CreateResponse) -> Result<(), OaiError> {
    match &req.tool_choice {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if matches!(s.as_str(), "auto" | "none" | "required") => {}
        Some(Value::String(s)) => {
            return Err(OaiError::invalid(
                "tool_choice",
                format!("`{s}` is not one of auto, none, required (or a tool choice object)"),
            ));
        }
        Some(Value::Object(o)) if o.get("type").is_some_and(Value::is_string) => {}
        Some(_) => {
            return Err(OaiError::invalid(
                "tool_choice",
                "expected `auto`, `none`, `required` or a tool choice object with a `type`",
            ));
        }
    }
    if let Some(t) = &req.truncation
        && !matches!(t.as_str(), "auto" | "disabled")
    {
        return Err(OaiError::invalid(
            "truncation",
            format!("`{t}` is not one of auto, disabled"),
        ));
    }
    if req.background == Some(true) {
        return Err(OaiError::invalid(
            "background",
            "background responses are not supported by keel; use `stream: true`, or keel's \
             own /ai/runs API to follow a run later",
        ));
    }
    if req.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(OaiError::invalid(
            "conversation",
            "conversations are not supported by keel; continue with `previous_response_id`",
        ));
    }
    if let Some(t) = req.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(OaiError::invalid(
            "temperature",
            format!("{t} is not between 0 and 2"),
        ));
    }
    if let Some(p) = req.top_p
        && !(0.0..=1.0).contains(&p)
    {
        return Err(OaiError::invalid(
            "top_p",
            format!("{p} is not between 0 and 1"),
        ));
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_is_one_user_message() {
        let items = parse_input(Some(&json!("hi"))).unwrap();
        assert_eq!(
            items,
            vec![Item::Message {
                role: Role::User,
                text: "hi".into(),
                id: None
            }]
        );
    }

    #[test]
    fn items_of_every_supported_kind() {
        let input = json!([
            {"role": "user", "content": "a"},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "b"}, {"type": "input_text", "text": "c"}]},
            {"type": "function_call", "id": "fc_run_ab_3", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ]);
        let items = parse_input(Some(&input)).unwrap();
        assert_eq!(items.len(), 5);
        assert_eq!(
            items[1],
            Item::Message {
                role: Role::Developer,
                text: "b\nc".into(),
                id: None
            }
        );
        assert_eq!(items[2].id(), Some("fc_run_ab_3"));
        assert_eq!(
            items[3],
            Item::FunctionCallOutput {
                call_id: "call_1".into(),
                output: "42".into()
            }
        );
    }

    #[test]
    fn malformed_items_name_the_field() {
        let cases = [
            (json!(42), "input"),
            (json!([{"role": "robot", "content": "x"}]), "input[0].role"),
            (json!([{"role": "user", "content": 5}]), "input[0].content"),
            (
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                "input[0].content[0].type",
            ),
            (
                json!([{"type": "function_call_output", "output": "x"}]),
                "input[0].call_id",
            ),
            (
                json!([{"type": "function_call_output", "call_id": "c", "output": 3}]),
                "input[0].output",
            ),
            (json!([{"type": "web_search_call"}]), "input[0].type"),
            (json!(["x"]), "input[0]"),
        ];
        for (input, param) in cases {
            let e = parse_input(Some(&input)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{input}: {}", e.message);
            assert!(e.message.starts_with(param), "{}", e.message);
        }
    }

    #[test]
    fn only_function_tools() {
        let tools = vec![
            json!({"type": "function", "name": "get_temp", "parameters": {"type": "object"}, "strict": true}),
        ];
        let parsed = parse_tools(Some(&tools)).unwrap();
        assert_eq!(parsed[0].name, "get_temp");
        assert_eq!(parsed[0].to_json()["strict"], true);
        let e = parse_tools(Some(&[json!({"type": "web_search"})])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        assert!(e.message.contains("web_search"));
        let e = parse_tools(Some(&[json!({"type": "function", "name": "a b"})])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].name"));
        let twice = [
            json!({"type": "function", "name": "a"}),
            json!({"type": "function", "name": "a"}),
        ];
        assert!(parse_tools(Some(&twice)).is_err());
    }

    #[test]
    fn body_type_errors_name_the_field() {
        let e = parse_body(br#"{"model": "default", "stream": "yes"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream"));
        let e = parse_body(br#"{"model": 3}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("model"));
        let ok = parse_body(
            br#"{"model": "m", "input": "x", "some_future_field": 1, "temperature": null}"#,
        )
        .unwrap();
        assert_eq!(ok.model.as_deref(), Some("m"));
        let e = check_choices(&CreateResponse {
            tool_choice: Some(json!("sometimes")),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }
}
