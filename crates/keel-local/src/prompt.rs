//! What the local model is shown: the tools and the action format in the
//! system prompt, past tool use as the actions it took and their results as
//! user turns (small models' templates know no tool role), and same-role
//! turns merged (some templates require alternation).

use std::borrow::Borrow;
use std::fmt::Write as _;

use keel_protocol::{Message, ToolCall, ToolSchema};
use serde_json::{Value, json};

use crate::action_schema::{CLARIFY_TOOL, required_params};
use crate::template::Turn;

/// The system prompt section for constrained actions.
pub(crate) fn protocol(tools: &[&ToolSchema], clarify: bool) -> String {
    let mut text = String::from("You act by replying with exactly one JSON object.\n\nTools:\n");
    for tool in tools {
        let _ = writeln!(text, "- {}: {}", tool.name, tool.description.trim());
        let required = required_params(&tool.parameters);
        if let Some(props) = tool.parameters.get("properties").and_then(Value::as_object) {
            for (name, schema) in props {
                let ty = schema.get("type").map_or_else(
                    || "any".to_string(),
                    |t| match t {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                );
                let need = if required.iter().any(|r| r == name) {
                    "required"
                } else {
                    "optional"
                };
                let about = schema
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let _ = writeln!(text, "    {name} ({ty}, {need}) {about}");
            }
        }
    }
    text.push_str(
        "\nReplies:\n\
         {\"action\":\"call_tool\",\"tool_name\":\"<tool>\",\"arguments\":{...}} to use a tool;\n",
    );
    if clarify {
        text.push_str(
            "{\"action\":\"clarify\",\"tool_name\":\"<tool>\",\"missing_slots\":[\"<required argument>\"],\"question\":\"<question>\"} \
             when a tool needs a required argument the user has not given;\n",
        );
    }
    text.push_str(
        "{\"action\":\"respond\",\"answer\":\"<answer>\"} to answer the user directly.\n\
         Tool results arrive as \"Result of <tool>: ...\".",
    );
    text
}

/// Turns for the template; `protocol` joins the first system message.
pub(crate) fn render<M: Borrow<Message>>(messages: &[M], protocol: Option<&str>) -> Vec<Turn> {
    let mut out: Vec<Turn> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    let system = match (messages.first().map(Borrow::borrow), protocol) {
        (Some(Message::System { content }), Some(p)) => {
            rest = &messages[1..];
            Some(format!("{content}\n\n{p}"))
        }
        (Some(Message::System { content }), None) => {
            rest = &messages[1..];
            Some(content.clone())
        }
        (_, Some(p)) => Some(p.to_owned()),
        (_, None) => None,
    };
    if let Some(content) = system {
        out.push(Turn {
            role: "system",
            content,
        });
    }
    for message in rest {
        let turn = match message.borrow() {
            Message::System { content } => Turn {
                role: "system",
                content: content.clone(),
            },
            Message::User { content } => Turn {
                role: "user",
                content: content.clone(),
            },
            Message::Assistant {
                content,
                tool_calls,
            } => Turn {
                role: "assistant",
                content: if tool_calls.is_empty() {
                    content.clone()
                } else {
                    render_calls(tool_calls)
                },
            },
            Message::Tool {
                name,
                content,
                is_error,
                ..
            } => Turn {
                role: "user",
                content: format!(
                    "Result of {name}{}: {content}",
                    if *is_error { " [error]" } else { "" }
                ),
            },
        };
        push_merged(&mut out, turn);
    }
    out
}

/// Past calls as the actions that made them, one per line.
fn render_calls(calls: &[ToolCall]) -> String {
    calls
        .iter()
        .map(|call| {
            let arguments = serde_json::from_str::<Value>(&call.arguments)
                .unwrap_or_else(|_| Value::String(call.arguments.clone()));
            if call.name == CLARIFY_TOOL {
                json!({
                    "action": "clarify",
                    "tool_name": arguments.get("tool_name").cloned().unwrap_or(json!("")),
                    "missing_slots": arguments.get("missing_slots").cloned().unwrap_or(json!([])),
                    "question": arguments.get("question").cloned().unwrap_or(json!("")),
                })
            } else {
                json!({"action": "call_tool", "tool_name": call.name, "arguments": arguments})
            }
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn push_merged(out: &mut Vec<Turn>, turn: Turn) {
    match out.last_mut() {
        Some(last) if last.role == turn.role && turn.role != "system" => {
            last.content.push_str("\n\n");
            last.content.push_str(&turn.content);
        }
        _ => out.push(turn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> ToolSchema {
        ToolSchema {
            name: "furnace_status".into(),
            description: "Status of one furnace.".into(),
            parameters: json!({"type":"object","properties":{"furnace_id":{"type":"string","description":"e.g. F2"}},"required":["furnace_id"]}).into(),
        }
    }

    #[test]
    fn protocol_lists_tools_with_their_parameters() {
        let t = tool();
        let text = protocol(&[&t], true);
        assert!(text.contains("- furnace_status: Status of one furnace."));
        assert!(text.contains("furnace_id (string, required) e.g. F2"));
        assert!(text.contains("\"action\":\"clarify\""));
        assert!(!protocol(&[&t], false).contains("\"action\":\"clarify\""));
    }

    #[test]
    fn history_becomes_turns() {
        let messages = vec![
            Message::system("sys"),
            Message::user("status of F2?"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "furnace_status".into(),
                    arguments: "{\"furnace_id\":\"F2\"}".into(),
                }],
            },
            Message::Tool {
                call_id: "c1".into(),
                name: "furnace_status".into(),
                content: "{\"temp\":900}".into(),
                is_error: false,
            },
            Message::user("thanks"),
        ];
        let turns = render(&messages, Some("PROTO"));
        assert_eq!(turns.len(), 4);
        assert_eq!(turns[0].content, "sys\n\nPROTO");
        assert_eq!(
            turns[2].content,
            "{\"action\":\"call_tool\",\"tool_name\":\"furnace_status\",\"arguments\":{\"furnace_id\":\"F2\"}}"
        );
        assert_eq!(
            turns[3].content,
            "Result of furnace_status: {\"temp\":900}\n\nthanks"
        );
        let plain = render(&[Message::user("hi")], None);
        assert_eq!(
            plain,
            vec![Turn {
                role: "user",
                content: "hi".into()
            }]
        );
    }
}
