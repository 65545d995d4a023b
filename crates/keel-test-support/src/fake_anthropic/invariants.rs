#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The request rules the real Messages API enforces with HTTP 400, checked on
//! every request so a client bug fails tests instead of production.

use std::collections::HashSet;

use serde_json::Value;

/// Every rule the request breaks, each as a readable sentence.
pub(crate) fn check(request: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if !request.is_object() {
        return vec!["request body must be a JSON object".into()];
    }
    if request
        .get("model")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        problems.push("model: Field required".into());
    }
    match request.get("max_tokens") {
        None | Some(Value::Null) => problems.push("max_tokens: Field required".into()),
        Some(v) if v.as_u64().is_none_or(|n| n < 1) => {
            problems.push(format!("max_tokens: must be an integer >= 1, got {v}"));
        }
        Some(_) => {}
    }
    if let Some(stream) = request.get("stream")
        && !stream.is_boolean()
    {
        problems.push("stream: Input should be a valid boolean".into());
    }
    check_system(request.get("system"), &mut problems);
    check_tools(request.get("tools"), &mut problems);
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        problems.push("messages: Field required (an array)".into());
        return problems;
    };
    if messages.is_empty() {
        problems.push("messages: at least one message is required".into());
    }
    check_messages(messages, &mut problems);
    problems
}

fn check_system(system: Option<&Value>, problems: &mut Vec<String>) {
    match system {
        None | Some(Value::Null | Value::String(_)) => {}
        Some(Value::Array(blocks)) => {
            for (i, b) in blocks.iter().enumerate() {
                if b.get("type").and_then(Value::as_str) != Some("text")
                    || !b.get("text").is_some_and(Value::is_string)
                {
                    problems.push(format!("system.{i}: must be a text block"));
                }
            }
        }
        Some(_) => problems.push("system: Input should be a valid string or list".into()),
    }
}

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn check_tools(tools: Option<&Value>, problems: &mut Vec<String>) {
    let tools = match tools {
        None | Some(Value::Null) => return,
        Some(Value::Array(tools)) => tools,
        Some(_) => {
            problems.push("tools: Input should be a valid list".into());
            return;
        }
    };
    let mut names = HashSet::new();
    for (i, tool) in tools.iter().enumerate() {
        match tool.get("name").and_then(Value::as_str) {
            Some(name) if valid_tool_name(name) => {
                if !names.insert(name.to_string()) {
                    problems.push(format!("tools: Tool names must be unique ('{name}')"));
                }
            }
            _ => problems.push(format!(
                "tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )),
        }
        match tool.get("input_schema") {
            Some(schema) if schema.is_object() => {
                if schema.get("type").and_then(Value::as_str) != Some("object") {
                    problems.push(format!(
                        "tools.{i}.input_schema.type: Field required ('object')"
                    ));
                }
            }
            _ => problems.push(format!(
                "tools.{i}.input_schema: Field required (an object)"
            )),
        }
        if tool.get("parameters").is_some() || tool.get("function").is_some() {
            problems.push(format!(
                "tools.{i}: Extra inputs are not permitted (this is not the OpenAI format)"
            ));
        }
    }
}

fn check_messages(messages: &[Value], problems: &mut Vec<String>) {
    let mut seen_ids: HashSet<String> = HashSet::new();
    // tool_use ids of the previous message, when it was an assistant message.
    let mut previous_uses: Vec<String> = Vec::new();
    let mut previous_role: Option<&str> = None;
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        match role {
            "user" | "assistant" => {}
            "system" => {
                problems.push(format!(
                    "messages.{i}: Unexpected role \"system\". The Messages API accepts a top-level `system` parameter, not \"system\" as an input message role."
                ));
                continue;
            }
            other => {
                problems.push(format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant', got '{other}'"
                ));
                continue;
            }
        }
        if previous_role.is_none() && role != "user" {
            problems.push("messages: first message must use the \"user\" role".into());
        }
        if previous_role == Some(role) {
            problems.push(format!(
                "messages.{i}: roles must alternate between \"user\" and \"assistant\", but found multiple \"{role}\" roles in a row"
            ));
        }
        let is_last = i + 1 == messages.len();
        let blocks = content_blocks(message, i, role, is_last, problems);
        let mut uses = Vec::new();
        let mut results: Vec<String> = Vec::new();
        let mut other_seen = false;
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            match block.get("type").and_then(Value::as_str).unwrap_or("") {
                "text" => {
                    other_seen = true;
                    match block.get("text").and_then(Value::as_str) {
                        Some(t) if !t.trim().is_empty() => {}
                        Some(_) => problems.push(format!(
                            "{at}: text content blocks must contain non-whitespace text"
                        )),
                        None => problems.push(format!("{at}.text: Field required")),
                    }
                }
                "tool_use" => {
                    other_seen = true;
                    if role != "assistant" {
                        problems.push(format!(
                            "{at}: tool_use blocks are only allowed in assistant messages"
                        ));
                    }
                    if block
                        .get("name")
                        .and_then(Value::as_str)
                        .is_none_or(|n| !valid_tool_name(n))
                    {
                        problems.push(format!(
                            "{at}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
                        ));
                    }
                    if !block.get("input").is_some_and(Value::is_object) {
                        problems.push(format!("{at}.input: Input should be a valid dictionary"));
                    }
                    match block.get("id").and_then(Value::as_str) {
                        Some(id)
                            if !id.is_empty()
                                && id
                                    .chars()
                                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
                        {
                            if !seen_ids.insert(id.to_string()) {
                                problems
                                    .push(format!("{at}: `tool_use` ids must be unique ('{id}')"));
                            }
                            uses.push(id.to_string());
                        }
                        _ => problems.push(format!(
                            "{at}.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
                        )),
                    }
                }
                "tool_result" => {
                    if role != "user" {
                        problems.push(format!(
                            "{at}: tool_result blocks are only allowed in user messages"
                        ));
                    }
                    if other_seen {
                        problems.push(format!("{at}: tool_result blocks must come before any other content in a user message"));
                    }
                    match block.get("content") {
                        None | Some(Value::String(_) | Value::Array(_)) => {}
                        Some(_) => problems.push(format!(
                            "{at}.content: Input should be a valid string or list"
                        )),
                    }
                    if let Some(e) = block.get("is_error")
                        && !e.is_boolean()
                    {
                        problems.push(format!("{at}.is_error: Input should be a valid boolean"));
                    }
                    let Some(id) = block.get("tool_use_id").and_then(Value::as_str) else {
                        problems.push(format!("{at}.tool_use_id: Field required"));
                        continue;
                    };
                    if !previous_uses.iter().any(|u| u == id) {
                        problems.push(format!(
                            "{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                        ));
                    } else if results.iter().any(|r| r == id) {
                        problems.push(format!(
                            "{at}: more than one `tool_result` for `tool_use_id` {id}"
                        ));
                    }
                    results.push(id.to_string());
                }
                "thinking" | "redacted_thinking" => {
                    other_seen = true;
                    if role != "assistant" {
                        problems.push(format!(
                            "{at}: thinking blocks are only allowed in assistant messages"
                        ));
                    }
                }
                "image" | "document" => other_seen = true,
                other => problems.push(format!("{at}.type: unknown content block type '{other}'")),
            }
        }
        let missing: Vec<&str> = previous_uses
            .iter()
            .filter(|u| !results.contains(u))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            problems.push(format!(
                "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                missing.join(", ")
            ));
        }
        if is_last && !uses.is_empty() {
            problems.push(format!(
                "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                uses.join(", ")
            ));
        }
        previous_uses = uses;
        previous_role = Some(role);
    }
}

/// The content as a list of blocks; a plain string is one text block.
fn content_blocks(
    message: &Value,
    i: usize,
    role: &str,
    is_last: bool,
    problems: &mut Vec<String>,
) -> Vec<Value> {
    match message.get("content") {
        Some(Value::String(s)) => {
            // A final assistant message (a prefill) may be empty; nothing else may.
            if s.is_empty() && !(is_last && role == "assistant") {
                problems.push(format!(
                    "messages.{i}: all messages must have non-empty content"
                ));
            }
            vec![serde_json::json!({"type": "text", "text": s})]
                .into_iter()
                .filter(|_| !s.is_empty())
                .collect()
        }
        Some(Value::Array(blocks)) => {
            if blocks.is_empty() && !(is_last && role == "assistant") {
                problems.push(format!(
                    "messages.{i}: all messages must have non-empty content"
                ));
            }
            blocks.clone()
        }
        _ => {
            problems.push(format!(
                "messages.{i}.content: Field required (a string or a list of blocks)"
            ));
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(messages: Value) -> Value {
        json!({"model": "m", "max_tokens": 10, "messages": messages})
    }

    fn tool_use(id: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": "f", "input": {}})
    }

    fn result(id: &str) -> Value {
        json!({"type": "tool_result", "tool_use_id": id, "content": "ok"})
    }

    #[test]
    fn answered_uses_pass() {
        let r = req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"text","text":"ok"}, tool_use("a"), tool_use("b")]},
            {"role":"user","content":[result("b"), result("a"), {"type":"text","text":"go on"}]},
            {"role":"assistant","content":"done"}
        ]));
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn role_and_pairing_rules() {
        let p = check(&req(json!([
            {"role":"system","content":"s"},
            {"role":"user","content":"hi"},
            {"role":"user","content":"again"}
        ])));
        assert!(
            p.iter().any(|s| s.contains("Unexpected role \"system\"")),
            "{p:?}"
        );
        assert!(p.iter().any(|s| s.contains("must alternate")), "{p:?}");

        let p = check(&req(json!([{"role":"assistant","content":"x"}])));
        assert!(p[0].contains("first message"), "{p:?}");

        let p = check(&req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[tool_use("a"), tool_use("b")]},
            {"role":"user","content":[result("a")]},
            {"role":"assistant","content":"x"},
            {"role":"user","content":[result("b")]}
        ])));
        assert!(
            p.iter()
                .any(|s| s.contains("without `tool_result` blocks immediately after: b")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|s| s.contains("unexpected `tool_use_id`")),
            "{p:?}"
        );

        let p = check(&req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":[tool_use("a")]},
            {"role":"user","content":[result("a"), result("a")]}
        ])));
        assert!(p.iter().any(|s| s.contains("more than one")), "{p:?}");

        let p = check(&json!({"model":"m","messages":[{"role":"user","content":"x"}]}));
        assert_eq!(p, vec!["max_tokens: Field required".to_string()]);
    }
}
