//! What a model without native tool calling is shown: the tools and the
//! action format in the system prompt, and past tool use as plain text.

use std::borrow::Borrow;
use std::fmt::Write as _;

use keel_protocol::{Message, ToolCall, ToolSchema};
use serde_json::{Value, json};

use super::action::CLARIFY_TOOL;

/// The system prompt section that makes any chat model an agent.
pub(crate) fn protocol(tools: &[ToolSchema]) -> String {
    let clarify = tools.iter().find(|t| t.name == CLARIFY_TOOL);
    let mut text = String::from(
        "You can use tools, but not by calling functions: you act by writing exactly one JSON \
         object as your whole reply, with no other text before or after it.\n\nTools:\n",
    );
    for tool in tools.iter().filter(|t| t.name != CLARIFY_TOOL) {
        let _ = write!(
            text,
            "- {}: {}\n  parameters (JSON Schema): {}\n",
            tool.name, tool.description, tool.parameters
        );
    }
    text.push_str(
        "\nReply with one of these actions:\n\
         - Call one tool:\n\
         {\"action\": \"CALL_TOOL\", \"tool_name\": \"<one of the tools above>\", \"arguments\": {<parameters as the tool's schema requires>}, \"intent\": \"<what you are doing>\", \"confidence\": <0.0 to 1.0>, \"brief_rationale\": \"<one sentence>\"}\n",
    );
    if let Some(clarify) = clarify {
        let _ = write!(
            text,
            "- Ask the user ({}):\n\
             {{\"action\": \"CLARIFY\", \"tool_name\": \"<the tool you need to call>\", \"missing_slots\": [\"<required parameter the user has not given>\"], \"clarification_question\": \"<the question to ask the user>\", \"intent\": \"...\", \"confidence\": <0.0 to 1.0>, \"brief_rationale\": \"...\"}}\n",
            clarify.description.trim_end_matches('.')
        );
    }
    text.push_str(
        "- Give the final answer to the user:\n\
         {\"action\": \"RESPOND\", \"answer\": \"<your answer>\", \"intent\": \"...\", \"confidence\": <0.0 to 1.0>, \"brief_rationale\": \"...\"}\n\
         \nCall one tool per reply. After a CALL_TOOL, its result arrives in the next user \
         message as \"Result of <tool> (call <id>): <result>\"; then continue with the next action.",
    );
    text
}

/// The request history rendered for a text-only model: the protocol joins the
/// leading system message (some chat templates refuse a second one), tool
/// calls become the action JSON the model emitted, tool results become user
/// messages, and consecutive same-role messages merge (some templates require
/// alternating roles).
pub(crate) fn render<M: Borrow<Message>>(messages: &[M], protocol: Option<&str>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    if let Some(protocol) = protocol {
        match messages.first().map(Borrow::borrow) {
            Some(Message::System { content }) => {
                out.push(Message::system(format!("{content}\n\n{protocol}")));
                rest = &messages[1..];
            }
            _ => out.push(Message::system(protocol)),
        }
    }
    for message in rest {
        let rendered = match message.borrow() {
            Message::Assistant {
                content,
                tool_calls,
            } if !tool_calls.is_empty() => Message::Assistant {
                content: render_calls(content, tool_calls),
                tool_calls: Vec::new(),
            },
            Message::Tool {
                call_id,
                name,
                content,
                is_error,
            } => {
                let status = if *is_error { " [error]" } else { "" };
                Message::user(format!(
                    "Result of {name} (call {call_id}){status}: {content}"
                ))
            }
            other => other.clone(),
        };
        push_merged(&mut out, rendered);
    }
    out
}

/// One action object per call, one per line; text said beside the calls
/// becomes the first one's rationale.
fn render_calls(content: &str, calls: &[ToolCall]) -> String {
    let mut lines = Vec::with_capacity(calls.len());
    for (i, call) in calls.iter().enumerate() {
        let arguments = serde_json::from_str::<Value>(&call.arguments)
            .unwrap_or_else(|_| Value::String(call.arguments.clone()));
        let mut action = if call.name == CLARIFY_TOOL {
            json!({
                "action": "CLARIFY",
                "tool_name": arguments.get("tool_name").cloned().unwrap_or(json!("")),
                "missing_slots": arguments.get("missing_slots").cloned().unwrap_or(json!([])),
                "clarification_question": arguments.get("question").cloned().unwrap_or(json!("")),
            })
        } else {
            json!({ "action": "CALL_TOOL", "tool_name": call.name, "arguments": arguments })
        };
        if i == 0 && !content.trim().is_empty() {
            action["brief_rationale"] = json!(content.trim());
        }
        lines.push(action.to_string());
    }
    lines.join("\n")
}

fn push_merged(out: &mut Vec<Message>, message: Message) {
    match (out.last_mut(), message) {
        (Some(Message::User { content: last }), Message::User { content }) => {
            last.push_str("\n\n");
            last.push_str(&content);
        }
        (
            Some(Message::Assistant {
                content: last,
                tool_calls: last_calls,
            }),
            Message::Assistant {
                content,
                tool_calls,
            },
        ) if last_calls.is_empty() && tool_calls.is_empty() => {
            last.push_str("\n\n");
            last.push_str(&content);
        }
        (_, message) => out.push(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolSchema {
        ToolSchema {
            name: name.into(),
            description: format!("{name} does things."),
            parameters: json!({"type":"object","properties":{"city":{"type":"string"}}}).into(),
        }
    }

    #[test]
    fn protocol_lists_tools_and_offers_clarify_only_when_offered() {
        let text = protocol(&[tool("get_weather")]);
        assert!(text.contains("- get_weather: get_weather does things."));
        assert!(text.contains("\"city\""));
        assert!(text.contains("CALL_TOOL") && text.contains("RESPOND"));
        assert!(!text.contains("CLARIFY"));
        let text = protocol(&[tool("get_weather"), tool(CLARIFY_TOOL)]);
        assert!(text.contains("CLARIFY") && text.contains("clarification_question"));
        assert!(!text.contains("- clarify:"));
    }

    #[test]
    fn history_becomes_text_with_merged_turns() {
        let messages = vec![
            Message::system("sys"),
            Message::user("weather?"),
            Message::Assistant {
                content: "checking".into(),
                tool_calls: vec![
                    ToolCall {
                        id: "c1".into(),
                        name: "get_weather".into(),
                        arguments: "{\"city\":\"Paris\"}".into(),
                    },
                    ToolCall {
                        id: "c2".into(),
                        name: "get_weather".into(),
                        arguments: "{broken".into(),
                    },
                ],
            },
            Message::Tool {
                call_id: "c1".into(),
                name: "get_weather".into(),
                content: "sunny".into(),
                is_error: false,
            },
            Message::Tool {
                call_id: "c2".into(),
                name: "get_weather".into(),
                content: "bad arguments".into(),
                is_error: true,
            },
        ];
        let out = render(&messages, Some("PROTOCOL"));
        assert_eq!(out.len(), 4, "{out:?}");
        assert_eq!(out[0], Message::system("sys\n\nPROTOCOL"));
        let Message::Assistant {
            content,
            tool_calls,
        } = &out[2]
        else {
            panic!("{out:?}")
        };
        assert!(tool_calls.is_empty());
        let lines: Vec<Value> = content
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            json!({"action":"CALL_TOOL","tool_name":"get_weather","arguments":{"city":"Paris"},"brief_rationale":"checking"})
        );
        assert_eq!(lines[1]["arguments"], "{broken");
        assert_eq!(
            out[3],
            Message::user(
                "Result of get_weather (call c1): sunny\n\nResult of get_weather (call c2) [error]: bad arguments"
            )
        );
        let out = render(&[Message::user("x")], Some("P"));
        assert_eq!(out, vec![Message::system("P"), Message::user("x")]);
    }
}
