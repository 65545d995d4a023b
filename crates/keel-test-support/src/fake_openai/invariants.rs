#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The request rules the real Chat Completions API enforces with HTTP 400,
//! checked on every request so a client bug fails tests instead of production.

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
        problems.push("'model' is required and must be a non-empty string".into());
    }
    check_options(request, &mut problems);
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        problems.push("'messages' is required and must be an array".into());
        return problems;
    };
    if messages.is_empty() {
        problems.push("'messages' must not be empty".into());
    }
    check_messages(messages, &mut problems);
    problems
}

fn check_options(request: &Value, problems: &mut Vec<String>) {
    let streaming = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if request.get("stream_options").is_some_and(|v| !v.is_null()) && !streaming {
        problems.push(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.".into(),
        );
    }
    match request.get("tools") {
        None | Some(Value::Null) => {
            if request.get("tool_choice").is_some_and(|v| !v.is_null()) {
                problems.push("'tool_choice' is only allowed when 'tools' are specified.".into());
            }
        }
        Some(Value::Array(tools)) if tools.is_empty() => {
            problems.push("[] is too short - 'tools'".into());
        }
        Some(Value::Array(tools)) => {
            for (i, tool) in tools.iter().enumerate() {
                if tool.get("type").and_then(Value::as_str) != Some("function") {
                    problems.push(format!("tools[{i}].type must be 'function'"));
                }
                if tool
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    problems.push(format!("tools[{i}].function.name is required"));
                }
                if let Some(p) = tool.pointer("/function/parameters")
                    && !p.is_object()
                {
                    problems.push(format!("tools[{i}].function.parameters must be an object"));
                }
            }
        }
        Some(_) => problems.push("'tools' must be an array".into()),
    }
}

fn check_messages(messages: &[Value], problems: &mut Vec<String>) {
    // Calls of the latest assistant message still waiting for their tool message.
    let mut pending: Vec<String> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut seen: HashSet<String> = HashSet::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        match role {
            "assistant" => {
                unanswered(
                    &mut pending,
                    &format!("messages[{i}] (assistant)"),
                    problems,
                );
                let calls = message.get("tool_calls").filter(|c| !c.is_null());
                if calls.is_none() && !has_content(message) {
                    problems.push(format!(
                        "messages[{i}]: an assistant message needs 'content' or 'tool_calls'"
                    ));
                }
                let Some(calls) = calls else { continue };
                let Some(calls) = calls.as_array() else {
                    problems.push(format!("messages[{i}].tool_calls must be an array"));
                    continue;
                };
                if calls.is_empty() {
                    problems.push(format!("[] is too short - 'messages.{i}.tool_calls'"));
                }
                for (j, call) in calls.iter().enumerate() {
                    let at = format!("messages[{i}].tool_calls[{j}]");
                    if call.get("type").and_then(Value::as_str) != Some("function") {
                        problems.push(format!("{at}.type must be 'function'"));
                    }
                    if call
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        problems.push(format!("{at}.function.name is required"));
                    }
                    if !call
                        .pointer("/function/arguments")
                        .is_some_and(Value::is_string)
                    {
                        problems.push(format!("{at}.function.arguments must be a string"));
                    }
                    match call
                        .get("id")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                    {
                        None => problems.push(format!("{at}.id is required")),
                        Some(id) => {
                            if !seen.insert(id.to_string()) {
                                problems.push(format!("{at}: duplicate tool_call id '{id}'"));
                            }
                            pending.push(id.to_string());
                        }
                    }
                }
            }
            "tool" => {
                if !has_content(message) {
                    problems.push(format!("messages[{i}]: a tool message needs 'content'"));
                }
                let Some(id) = message.get("tool_call_id").and_then(Value::as_str) else {
                    problems.push(format!(
                        "messages[{i}]: a tool message needs 'tool_call_id'"
                    ));
                    continue;
                };
                if let Some(at) = pending.iter().position(|p| p == id) {
                    pending.remove(at);
                    answered.insert(id.to_string());
                } else if answered.contains(id) {
                    problems.push(format!(
                        "messages[{i}]: tool_call_id '{id}' was already answered by an earlier tool message"
                    ));
                } else {
                    problems.push(format!(
                        "Invalid parameter: messages[{i}] with role 'tool' (tool_call_id '{id}') must be a response to a preceding message with 'tool_calls'."
                    ));
                }
            }
            "user" | "system" | "developer" => {
                unanswered(&mut pending, &format!("messages[{i}] ({role})"), problems);
                if !has_content(message) {
                    problems.push(format!("messages[{i}]: a {role} message needs 'content'"));
                }
            }
            other => problems.push(format!("messages[{i}]: unknown role '{other}'")),
        }
    }
    unanswered(&mut pending, "the end of 'messages'", problems);
}

fn unanswered(pending: &mut Vec<String>, before: &str, problems: &mut Vec<String>) {
    if pending.is_empty() {
        return;
    }
    problems.push(format!(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id' (before {before}). The following tool_call_ids did not have response messages: {}",
        pending.join(", ")
    ));
    pending.clear();
}

fn has_content(message: &Value) -> bool {
    matches!(
        message.get("content"),
        Some(Value::String(_) | Value::Array(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}})
    }

    fn req(messages: Value) -> Value {
        json!({"model": "m", "messages": messages})
    }

    #[test]
    fn answered_calls_pass() {
        let r = req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":null,"tool_calls":[call("a"), call("b")]},
            {"role":"tool","tool_call_id":"b","content":"1"},
            {"role":"tool","tool_call_id":"a","content":"2"},
            {"role":"assistant","content":"ok"},
            {"role":"user","content":"more"}
        ]));
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn missing_duplicate_and_orphan_answers_fail() {
        let missing = req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":null,"tool_calls":[call("a"), call("b")]},
            {"role":"tool","tool_call_id":"a","content":"1"},
            {"role":"user","content":"next"}
        ]));
        let p = check(&missing);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("did not have response messages: b"));

        let duplicate = req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":null,"tool_calls":[call("a")]},
            {"role":"tool","tool_call_id":"a","content":"1"},
            {"role":"tool","tool_call_id":"a","content":"1"}
        ]));
        assert!(check(&duplicate)[0].contains("already answered"));

        let orphan = req(json!([
            {"role":"user","content":"hi"},
            {"role":"tool","tool_call_id":"x","content":"1"}
        ]));
        assert!(check(&orphan)[0].contains("must be a response to a preceding message"));

        let trailing = req(json!([
            {"role":"user","content":"hi"},
            {"role":"assistant","content":null,"tool_calls":[call("a")]}
        ]));
        assert!(check(&trailing)[0].contains("end of 'messages'"));
    }

    #[test]
    fn option_rules() {
        let r = json!({"model":"m","messages":[{"role":"user","content":"x"}],
            "stream_options":{"include_usage":true},"tools":[],"tool_choice":"auto"});
        let p = check(&r);
        assert!(p.iter().any(|s| s.contains("stream_options")));
        assert!(p.iter().any(|s| s.contains("'tools'")));
        let r =
            json!({"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"auto"});
        assert!(check(&r)[0].contains("tool_choice"));
    }
}
