//! The rules a request must follow for any provider to accept it, checked
//! on keel's own message model. They are the rules the fake HTTP servers
//! check on the wire (`fake_openai`, `fake_anthropic`): every tool call is
//! answered by exactly one tool message before the conversation moves on,
//! no answer lacks its call, and no call id is used twice.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use keel_protocol::{Message, ModelRequest};

/// Every rule the request breaks, each as a readable sentence.
pub fn check(request: &ModelRequest) -> Vec<String> {
    let mut problems = Vec::new();
    if request.messages.is_empty() {
        problems.push("the request has no messages".to_owned());
    }
    if request.max_output_tokens == Some(0) {
        problems.push("max_output_tokens must be at least 1".to_owned());
    }
    check_tools(request, &mut problems);
    check_messages(&request.messages, &mut problems);
    problems
}

fn check_tools(request: &ModelRequest, problems: &mut Vec<String>) {
    let mut names = HashSet::new();
    for (i, tool) in request.tools.iter().enumerate() {
        if tool.name.is_empty() {
            problems.push(format!("tools[{i}] has no name"));
        } else if !names.insert(tool.name.as_str()) {
            problems.push(format!(
                "tools[{i}]: the tool `{}` is offered twice",
                tool.name
            ));
        }
        if !tool.parameters.is_object() {
            problems.push(format!(
                "tools[{i}] (`{}`): parameters must be a JSON object",
                tool.name
            ));
        }
    }
}

fn check_messages(messages: &[Arc<Message>], problems: &mut Vec<String>) {
    // Calls of the latest assistant message still waiting for their answer,
    // by id, with the tool each named.
    let mut pending: Vec<(String, String)> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, message) in messages.iter().enumerate() {
        match &**message {
            Message::Assistant { tool_calls, .. } => {
                unanswered(
                    &mut pending,
                    &format!("messages[{i}] (assistant)"),
                    problems,
                );
                for (j, call) in tool_calls.iter().enumerate() {
                    let at = format!("messages[{i}].tool_calls[{j}]");
                    if call.name.is_empty() {
                        problems.push(format!("{at} names no tool"));
                    }
                    if call.id.is_empty() {
                        problems.push(format!("{at} has no id"));
                        continue;
                    }
                    if let Some(first) = seen.insert(call.id.clone(), i) {
                        problems.push(format!(
                            "{at}: duplicate tool call id '{}' (first used in messages[{first}])",
                            call.id
                        ));
                    }
                    pending.push((call.id.clone(), call.name.clone()));
                }
            }
            Message::Tool { call_id, name, .. } => {
                if let Some(at) = pending.iter().position(|(id, _)| id == call_id) {
                    let (id, called) = pending.remove(at);
                    if &called != name {
                        problems.push(format!(
                            "messages[{i}]: the answer to call '{id}' names the tool `{name}`, but the call was to `{called}`"
                        ));
                    }
                    answered.insert(id);
                } else if answered.contains(call_id) {
                    problems.push(format!(
                        "messages[{i}]: tool call '{call_id}' was already answered by an earlier tool message"
                    ));
                } else {
                    problems.push(format!(
                        "messages[{i}]: a tool message for '{call_id}' must answer a call of the assistant message right before it"
                    ));
                }
            }
            Message::User { .. } => {
                unanswered(&mut pending, &format!("messages[{i}] (user)"), problems);
            }
            Message::System { .. } => {
                unanswered(&mut pending, &format!("messages[{i}] (system)"), problems);
            }
        }
    }
    unanswered(&mut pending, "the end of the messages", problems);
}

fn unanswered(pending: &mut Vec<(String, String)>, before: &str, problems: &mut Vec<String>) {
    if pending.is_empty() {
        return;
    }
    let ids: Vec<&str> = pending.iter().map(|(id, _)| id.as_str()).collect();
    problems.push(format!(
        "tool calls without an answer before {before}: {}",
        ids.join(", ")
    ));
    pending.clear();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use keel_protocol::{ToolCall, ToolSchema};
    use serde_json::json;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "f".into(),
            arguments: "{}".into(),
        }
    }

    fn calls(ids: &[&str]) -> Message {
        Message::Assistant {
            content: String::new(),
            tool_calls: ids.iter().map(|id| call(id)).collect(),
        }
    }

    fn answer(id: &str) -> Message {
        Message::Tool {
            call_id: id.into(),
            name: "f".into(),
            content: "1".into(),
            is_error: false,
        }
    }

    fn req(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            messages: keel_protocol::shared_messages(messages),
            ..ModelRequest::default()
        }
    }

    #[test]
    fn answered_calls_pass_in_any_order() {
        let r = req(vec![
            Message::system("s"),
            Message::user("hi"),
            calls(&["a", "b"]),
            answer("b"),
            answer("a"),
            Message::system("note"),
            Message::Assistant {
                content: "ok".into(),
                tool_calls: vec![],
            },
            Message::user("more"),
        ]);
        assert_eq!(check(&r), Vec::<String>::new());
    }

    #[test]
    fn missing_duplicate_orphan_and_trailing_answers_fail() {
        let missing = req(vec![
            Message::user("hi"),
            calls(&["a", "b"]),
            answer("a"),
            Message::user("next"),
        ]);
        let p = check(&missing);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("without an answer before messages[3] (user): b"));

        let twice = req(vec![
            Message::user("hi"),
            calls(&["a"]),
            answer("a"),
            answer("a"),
        ]);
        assert!(check(&twice)[0].contains("already answered"));

        let orphan = req(vec![Message::user("hi"), answer("x")]);
        assert!(check(&orphan)[0].contains("must answer a call"));

        let late = req(vec![
            Message::user("hi"),
            calls(&["a"]),
            Message::system("note"),
            answer("a"),
        ]);
        let p = check(&late);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("before messages[2] (system)"));

        let trailing = req(vec![Message::user("hi"), calls(&["a"])]);
        assert!(check(&trailing)[0].contains("the end of the messages"));
    }

    #[test]
    fn ids_must_be_present_and_unique_across_the_request() {
        let reused = req(vec![
            Message::user("hi"),
            calls(&["a"]),
            answer("a"),
            calls(&["a"]),
            answer("a"),
        ]);
        let p = check(&reused);
        assert!(
            p.iter().any(|s| s.contains("duplicate tool call id 'a'")),
            "{p:?}"
        );
        let empty = req(vec![Message::user("hi"), calls(&[""])]);
        assert!(check(&empty)[0].contains("has no id"));
    }

    #[test]
    fn an_answer_names_the_tool_that_was_called() {
        let r = req(vec![
            Message::user("hi"),
            calls(&["a"]),
            Message::Tool {
                call_id: "a".into(),
                name: "g".into(),
                content: "1".into(),
                is_error: false,
            },
        ]);
        assert!(check(&r)[0].contains("was to `f`"));
    }

    #[test]
    fn tools_and_options_are_checked() {
        let schema = |name: &str, parameters| ToolSchema {
            name: name.into(),
            description: String::new(),
            parameters,
        };
        let r = ModelRequest {
            cache: Default::default(),
            messages: vec![],
            tools: vec![
                schema("t", json!({}).into()),
                schema("t", json!({}).into()),
                schema("", json!("x").into()),
            ],
            max_output_tokens: Some(0),
        };
        let p = check(&r);
        assert!(p.iter().any(|s| s.contains("no messages")), "{p:?}");
        assert!(p.iter().any(|s| s.contains("offered twice")), "{p:?}");
        assert!(p.iter().any(|s| s.contains("has no name")), "{p:?}");
        assert!(
            p.iter().any(|s| s.contains("must be a JSON object")),
            "{p:?}"
        );
        assert!(p.iter().any(|s| s.contains("max_output_tokens")), "{p:?}");
    }
}
