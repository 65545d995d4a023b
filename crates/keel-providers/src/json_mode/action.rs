//! Reading the model's action object out of free text, tolerantly: models
//! wrap JSON in fences, prefix it with chatter and append explanations.

use keel_protocol::Understanding;
use serde_json::{Map, Value};

/// The reserved function the loop treats as "ask the user" (SPEC §4).
pub use keel_protocol::CLARIFY_TOOL;

/// A valid action, as the loop will see it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    Respond {
        answer: String,
    },
    CallTool {
        tool_name: String,
        arguments: Map<String, Value>,
    },
    Clarify {
        tool_name: String,
        missing_slots: Vec<String>,
        question: String,
    },
}

/// At most this many `{` positions are tried as the start of the action, so
/// brace-heavy prose cannot make parsing quadratic in the reply size.
const MAX_CANDIDATES: usize = 32;

/// Parses `text` into an action, or says exactly what is wrong with it, in
/// words meant for the model's repair turn.
#[cfg(test)]
pub(crate) fn parse(text: &str) -> Result<Action, String> {
    parse_with_understanding(text).map(|(action, _)| action)
}

/// The action and what the model said about it (`intent`, `confidence`,
/// `brief_rationale`, all optional).
pub(crate) fn parse_with_understanding(text: &str) -> Result<(Action, Understanding), String> {
    let object = find_object(text).ok_or_else(|| {
        "the reply contains no JSON object; reply with exactly one JSON object".to_string()
    })?;
    let action = validate(&object)?;
    Ok((action, Understanding::from_object(&object)))
}

/// The first balanced `{…}` that parses as a JSON object; a fenced ```json
/// block is preferred when there is one.
fn find_object(text: &str) -> Option<Map<String, Value>> {
    fenced(text)
        .and_then(first_object)
        .or_else(|| first_object(text))
}

fn fenced(text: &str) -> Option<&str> {
    let start = text.find("```")?;
    let rest = &text[start + 3..];
    // Skip the info string (`json`, `JSON`, …) up to the end of its line.
    let body_start = rest.find('\n').map_or(0, |i| i + 1);
    let body = &rest[body_start..];
    let end = body.find("```").unwrap_or(body.len());
    Some(&body[..end])
}

fn first_object(text: &str) -> Option<Map<String, Value>> {
    let mut from = 0;
    for _ in 0..MAX_CANDIDATES {
        let start = from + text[from..].find('{')?;
        if let Some(end) = balanced_end(&text[start..])
            && let Ok(Value::Object(map)) = serde_json::from_str(&text[start..start + end])
        {
            return Some(map);
        }
        from = start + 1;
    }
    None
}

/// Byte length of the balanced `{…}` at the start of `text`, skipping braces
/// inside JSON strings.
fn balanced_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

fn validate(object: &Map<String, Value>) -> Result<Action, String> {
    let action = match object.get("action") {
        Some(Value::String(a)) => a.trim().to_ascii_uppercase(),
        Some(other) => {
            return Err(format!(
                "\"action\" must be a string (RESPOND, CALL_TOOL or CLARIFY), not {other}"
            ));
        }
        None => {
            return Err(
                "the JSON object has no \"action\" field; it must be RESPOND, CALL_TOOL or CLARIFY"
                    .into(),
            );
        }
    };
    match action.as_str() {
        "RESPOND" => match object.get("answer") {
            Some(Value::String(answer)) if !answer.trim().is_empty() => Ok(Action::Respond {
                answer: answer.clone(),
            }),
            Some(Value::String(_)) => Err("RESPOND needs a non-empty \"answer\"".into()),
            Some(_) => Err("RESPOND needs \"answer\" to be a string".into()),
            None => Err("RESPOND needs an \"answer\" string with the reply to the user".into()),
        },
        "CALL_TOOL" => {
            let tool_name = required_name(object, "CALL_TOOL")?;
            let arguments = match object.get("arguments") {
                // A tool without parameters is often called with none given;
                // a missing required parameter is the loop's to ask about.
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(map)) => map.clone(),
                // Some models double-encode the arguments as a string.
                Some(Value::String(s)) => match serde_json::from_str(s) {
                    Ok(Value::Object(map)) => map,
                    _ => {
                        return Err(
                            "CALL_TOOL needs \"arguments\" to be a JSON object, not a string"
                                .into(),
                        );
                    }
                },
                Some(other) => {
                    return Err(format!(
                        "CALL_TOOL needs \"arguments\" to be a JSON object, not {other}"
                    ));
                }
            };
            Ok(Action::CallTool {
                tool_name,
                arguments,
            })
        }
        "CLARIFY" => {
            let tool_name = required_name(object, "CLARIFY")?;
            let missing_slots = match object.get("missing_slots") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::String(s)) => vec![s.clone()],
                Some(Value::Array(items)) => {
                    let mut slots = Vec::with_capacity(items.len());
                    for item in items {
                        match item.as_str() {
                            Some(s) => slots.push(s.to_owned()),
                            None => {
                                return Err(
                                    "CLARIFY needs \"missing_slots\" to be a list of parameter names (strings)".into(),
                                );
                            }
                        }
                    }
                    slots
                }
                Some(_) => {
                    return Err(
                        "CLARIFY needs \"missing_slots\" to be a list of parameter names (strings)"
                            .into(),
                    );
                }
            };
            let question = object
                .get("clarification_question")
                .or_else(|| object.get("question"));
            // Optional: without one the loop phrases the question from the
            // tool's parameter descriptions.
            let question = match question {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(q)) => q.trim().to_owned(),
                Some(_) => {
                    return Err("CLARIFY needs \"clarification_question\" to be a string".into());
                }
            };
            Ok(Action::Clarify {
                tool_name,
                missing_slots,
                question,
            })
        }
        other => Err(format!(
            "\"action\" is {other:?}; it must be one of RESPOND, CALL_TOOL, CLARIFY"
        )),
    }
}

fn required_name(object: &Map<String, Value>, action: &str) -> Result<String, String> {
    match object.get("tool_name") {
        Some(Value::String(name)) if !name.trim().is_empty() => Ok(name.trim().to_owned()),
        _ => Err(format!(
            "{action} needs \"tool_name\": the name of one of the listed tools"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fenced_json_with_chatter_around_it() {
        let text = "Sure! {not json} here you go:\n```json\n{\"action\": \"RESPOND\", \"answer\": \"a {brace} \\\"quoted\\\"\"}\n```\nHope that helps {x}.";
        assert_eq!(
            parse(text),
            Ok(Action::Respond {
                answer: "a {brace} \"quoted\"".into()
            })
        );
    }

    #[test]
    fn first_parsable_object_without_fence() {
        let text = "I think {maybe} {\"action\":\"call_tool\",\"tool_name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"} and {\"action\":\"RESPOND\"}";
        match parse(text).unwrap() {
            Action::CallTool {
                tool_name,
                arguments,
            } => {
                assert_eq!(tool_name, "f");
                assert_eq!(Value::Object(arguments), json!({"a":1}));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn intent_and_confidence_are_read_when_given() {
        let (_, u) = parse_with_understanding(
            r#"{"action":"CALL_TOOL","tool_name":"f","arguments":{},"intent":"restart F2","confidence":0.4,"brief_rationale":"user asked"}"#,
        )
        .unwrap();
        assert_eq!(u.intent.as_deref(), Some("restart F2"));
        assert_eq!(u.confidence, Some(0.4));
        assert_eq!(u.brief_rationale.as_deref(), Some("user asked"));
        let (_, u) =
            parse_with_understanding(r#"{"action":"RESPOND","answer":"x","confidence":"85%"}"#)
                .unwrap();
        assert_eq!(u.confidence, Some(0.85));
        let (_, u) =
            parse_with_understanding(r#"{"action":"RESPOND","answer":"x","confidence":"high"}"#)
                .unwrap();
        assert!(u.is_empty());
    }

    #[test]
    fn problems_are_named() {
        assert!(
            parse("no json here")
                .unwrap_err()
                .contains("no JSON object")
        );
        assert!(
            parse("{\"answer\":\"x\"}")
                .unwrap_err()
                .contains("no \"action\"")
        );
        assert!(
            parse("{\"action\":\"DANCE\"}")
                .unwrap_err()
                .contains("DANCE")
        );
        assert!(
            parse("{\"action\":\"RESPOND\"}")
                .unwrap_err()
                .contains("answer")
        );
        assert!(
            parse("{\"action\":\"CALL_TOOL\",\"arguments\":{}}")
                .unwrap_err()
                .contains("tool_name")
        );
        assert!(
            parse("{\"action\":\"CALL_TOOL\",\"tool_name\":\"f\",\"arguments\":[1]}")
                .unwrap_err()
                .contains("JSON object")
        );
        assert!(
            parse("{\"action\":\"CLARIFY\",\"tool_name\":\"f\",\"missing_slots\":[1],\"clarification_question\":\"q\"}")
                .unwrap_err()
                .contains("missing_slots")
        );
        assert!(
            parse("{\"action\":\"CLARIFY\",\"tool_name\":\"f\",\"clarification_question\":3}")
                .unwrap_err()
                .contains("clarification_question")
        );
        assert!(parse("{\"action\":\"RESPOND\",\"answer\":\"unclosed\"").is_err());
    }

    #[test]
    fn clarify_accepts_single_slot_and_missing_arguments_mean_none() {
        assert_eq!(
            parse(
                "{\"action\":\"CLARIFY\",\"tool_name\":\"f\",\"missing_slots\":\"city\",\"clarification_question\":\"Which city?\"}"
            ),
            Ok(Action::Clarify {
                tool_name: "f".into(),
                missing_slots: vec!["city".into()],
                question: "Which city?".into()
            })
        );
        assert_eq!(
            parse("{\"action\":\"CALL_TOOL\",\"tool_name\":\"now\"}"),
            Ok(Action::CallTool {
                tool_name: "now".into(),
                arguments: Map::new()
            })
        );
    }
}
