//! The JSON schema every constrained reply must match: one branch per tool
//! (with that tool's own argument schema), a `clarify` branch per tool that
//! has required parameters, and `respond`. Free text is bounded everywhere
//! and whitespace is fixed, so the number of tokens an action can take is
//! under control and the reply maps one-to-one onto a loop action.

use keel_protocol::ToolSchema;
use serde_json::{Map, Value, json};

/// The reserved function through which the model asks the user (SPEC §4).
pub use keel_protocol::CLARIFY_TOOL;

/// A string argument without its own bound gets this one.
pub(crate) const ARG_STRING_MAX: u64 = 128;
/// An array argument without its own bound gets this one.
pub(crate) const ARG_ITEMS_MAX: u64 = 8;
pub(crate) const QUESTION_MAX: u64 = 160;
/// Bounds on the answer's length in characters, scaled from the token budget.
const ANSWER_MIN_CHARS: u64 = 32;
const ANSWER_MAX_CHARS: u64 = 2000;
/// Nesting deeper than this is not walked (schemas may be recursive).
const MAX_DEPTH: usize = 24;

/// Tools offered besides the reserved `clarify`, and whether `clarify` is.
pub(crate) fn split_tools(tools: &[ToolSchema]) -> (Vec<&ToolSchema>, bool) {
    let real = tools.iter().filter(|t| t.name != CLARIFY_TOOL).collect();
    (real, tools.iter().any(|t| t.name == CLARIFY_TOOL))
}

/// The action schema for `tools`, with the answer bounded for `budget` tokens.
pub(crate) fn action_schema(tools: &[&ToolSchema], clarify: bool, budget: u32) -> Value {
    let mut branches = Vec::new();
    for tool in tools {
        branches.push(json!({
            "type": "object",
            "properties": {
                "action": {"const": "call_tool"},
                "tool_name": {"const": tool.name},
                "arguments": bounded_arguments(&tool.parameters),
            },
            "required": ["action", "tool_name", "arguments"],
            "additionalProperties": false
        }));
    }
    if clarify {
        for tool in tools {
            let required = required_params(&tool.parameters);
            if required.is_empty() {
                continue;
            }
            let max_items = required.len().min(2);
            branches.push(json!({
                "type": "object",
                "properties": {
                    "action": {"const": "clarify"},
                    "tool_name": {"const": tool.name},
                    "missing_slots": {
                        "type": "array",
                        "items": {"enum": required},
                        "minItems": 1,
                        "maxItems": max_items
                    },
                    "question": {"type": "string", "minLength": 1, "maxLength": QUESTION_MAX},
                },
                "required": ["action", "tool_name", "missing_slots", "question"],
                "additionalProperties": false
            }));
        }
    }
    branches.push(json!({
        "type": "object",
        "properties": {
            "action": {"const": "respond"},
            "answer": {"type": "string", "minLength": 1, "maxLength": answer_max_chars(budget)},
        },
        "required": ["action", "answer"],
        "additionalProperties": false
    }));
    json!({
        "anyOf": branches,
        "x-guidance": {
            "whitespace_flexible": false,
            "item_separator": ",",
            "key_separator": ":",
            "json_allowed_escapes": "nt\"\\",
            // Keywords llguidance cannot enforce are skipped rather than
            // refused; the loop's schema guard still checks every call.
            "lenient": true
        }
    })
}

/// About three characters per token, so a bounded answer rarely needs the
/// forced close at all.
pub(crate) fn answer_max_chars(budget: u32) -> u64 {
    (u64::from(budget) * 3).clamp(ANSWER_MIN_CHARS, ANSWER_MAX_CHARS)
}

/// Names of the tool's required parameters.
pub(crate) fn required_params(parameters: &Value) -> Vec<String> {
    parameters
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The tool's parameter schema with every string and array bounded and
/// no parameters beyond the declared ones (the schema guard would refuse
/// them anyway).
pub(crate) fn bounded_arguments(parameters: &Value) -> Value {
    let mut schema = match parameters {
        Value::Object(map) if !map.is_empty() => parameters.clone(),
        _ => json!({"type": "object", "properties": {}}),
    };
    if let Value::Object(map) = &mut schema {
        map.entry("type").or_insert_with(|| json!("object"));
    }
    bound(&mut schema, 0);
    schema
}

fn has_type(map: &Map<String, Value>, ty: &str) -> bool {
    match map.get("type") {
        Some(Value::String(t)) => t == ty,
        Some(Value::Array(ts)) => ts.iter().any(|t| t.as_str() == Some(ty)),
        _ => false,
    }
}

fn bound(schema: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let Value::Object(map) = schema else {
        return;
    };
    let free_text = ["maxLength", "enum", "const", "pattern", "format"]
        .iter()
        .all(|k| !map.contains_key(*k));
    if has_type(map, "string") && free_text {
        map.insert("maxLength".into(), json!(ARG_STRING_MAX));
    }
    if has_type(map, "array") && !map.contains_key("maxItems") {
        let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        map.insert("maxItems".into(), json!(ARG_ITEMS_MAX.max(min)));
    }
    if (has_type(map, "object") || map.contains_key("properties"))
        && !map.contains_key("additionalProperties")
        && !map.contains_key("patternProperties")
    {
        map.insert("additionalProperties".into(), json!(false));
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            for child in children.values_mut() {
                bound(child, depth + 1);
            }
        }
    }
    for key in ["items", "additionalProperties", "not", "if", "then", "else"] {
        if let Some(child) = map.get_mut(key) {
            bound(child, depth + 1);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            for child in children {
                bound(child, depth + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, parameters: Value) -> ToolSchema {
        ToolSchema {
            name: name.into(),
            description: String::new(),
            parameters: parameters.into(),
        }
    }

    #[test]
    fn strings_and_arrays_get_bounds_and_objects_close() {
        let bounded = bounded_arguments(&json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "kind": {"type": "string", "enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"type": ["string", "null"]}},
                "short": {"type": "string", "maxLength": 5},
                "nested": {"type": "object", "properties": {"x": {"type": "string"}}}
            },
            "required": ["id"]
        }));
        assert_eq!(
            bounded["properties"]["id"]["maxLength"],
            json!(ARG_STRING_MAX)
        );
        assert!(bounded["properties"]["kind"].get("maxLength").is_none());
        assert_eq!(
            bounded["properties"]["tags"]["maxItems"],
            json!(ARG_ITEMS_MAX)
        );
        assert_eq!(
            bounded["properties"]["tags"]["items"]["maxLength"],
            json!(ARG_STRING_MAX)
        );
        assert_eq!(bounded["properties"]["short"]["maxLength"], json!(5));
        assert_eq!(bounded["additionalProperties"], json!(false));
        assert_eq!(
            bounded["properties"]["nested"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(
            bounded["properties"]["nested"]["properties"]["x"]["maxLength"],
            json!(ARG_STRING_MAX)
        );
    }

    #[test]
    fn empty_parameters_become_an_empty_object() {
        assert_eq!(
            bounded_arguments(&Value::Null),
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
    }

    #[test]
    fn one_branch_per_tool_clarify_only_for_required_params_and_respond() {
        let a = tool(
            "furnace_status",
            json!({"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}),
        );
        let b = tool("now", json!({"type": "object", "properties": {}}));
        let schema = action_schema(&[&a, &b], true, 100);
        let branches = schema["anyOf"].as_array().unwrap();
        assert_eq!(branches.len(), 4);
        assert_eq!(
            branches[0]["properties"]["tool_name"]["const"],
            json!("furnace_status")
        );
        assert_eq!(
            branches[1]["properties"]["tool_name"]["const"],
            json!("now")
        );
        assert_eq!(
            branches[2]["properties"]["action"]["const"],
            json!("clarify")
        );
        assert_eq!(
            branches[2]["properties"]["missing_slots"]["items"]["enum"],
            json!(["furnace_id"])
        );
        assert_eq!(branches[3]["properties"]["answer"]["maxLength"], json!(300));
        assert_eq!(schema["x-guidance"]["whitespace_flexible"], json!(false));
        let without = action_schema(&[&a], false, 1);
        assert_eq!(without["anyOf"].as_array().unwrap().len(), 2);
        assert_eq!(
            without["anyOf"][1]["properties"]["answer"]["maxLength"],
            json!(ANSWER_MIN_CHARS)
        );
    }

    #[test]
    fn key_order_is_kept_so_the_tool_is_chosen_before_its_arguments() {
        let a = tool("t", json!({}));
        let schema = action_schema(&[&a], false, 10);
        let keys: Vec<&String> = schema["anyOf"][0]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(keys, ["action", "tool_name", "arguments"]);
    }
}
