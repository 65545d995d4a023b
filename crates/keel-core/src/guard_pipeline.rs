//! The first stages of the one choke point every proposed call passes:
//! parse → known tool → schema guard. The later stages (hooks, missing
//! slots, loop detection, policy, approval) follow in the run actor; each
//! stage returns a typed decision and the first that refuses decides.

use keel_guard::policy::Policy;
use keel_guard::schema::ViolationKind;
use keel_protocol::{Principal, ToolCall};
use serde_json::Value;

use crate::toolset::ToolSet;

/// Arguments larger than this are refused before parsing.
const MAX_ARGUMENT_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum CallCheck {
    Execute { args: Value },
    UnknownTool { detail: String },
    InvalidArguments { detail: String },
}

pub fn check_call(
    call: &ToolCall,
    tools: &ToolSet,
    agent_patterns: &[String],
    principal: &Principal,
    policy: &Policy,
) -> CallCheck {
    let Some(reg) = tools
        .get(&call.name)
        .filter(|t| ToolSet::agent_allows(agent_patterns, &t.spec.name))
    else {
        let available: Vec<String> = tools
            .visible(agent_patterns, principal, policy)
            .map(|t| t.spec.name.clone())
            .collect();
        return CallCheck::UnknownTool {
            detail: format!(
                "unknown tool `{}`; available tools: {}",
                truncate_name(&call.name),
                if available.is_empty() {
                    "none".to_owned()
                } else {
                    available.join(", ")
                }
            ),
        };
    };
    if call.arguments.len() > MAX_ARGUMENT_BYTES {
        return CallCheck::InvalidArguments {
            detail: format!(
                "arguments of {} bytes exceed the {MAX_ARGUMENT_BYTES}-byte limit",
                call.arguments.len()
            ),
        };
    }
    let args = match parse_arguments(&call.arguments) {
        Ok(v) => v,
        Err(detail) => return CallCheck::InvalidArguments { detail },
    };
    let violations = reg.schema.check(&args);
    // Missing required arguments are not a repair matter: hooks may fill
    // them, and otherwise the user is asked.
    let repairable: Vec<String> = violations
        .iter()
        .filter(|v| !matches!(v.kind, ViolationKind::MissingRequired { .. }))
        .map(|v| v.message.clone())
        .collect();
    if !repairable.is_empty() {
        return CallCheck::InvalidArguments {
            detail: repairable.join("; "),
        };
    }
    CallCheck::Execute { args }
}

/// Model-produced argument text to a JSON object; empty text means no arguments.
pub fn parse_arguments(raw: &str) -> Result<Value, String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(trimmed) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(format!(
            "arguments must be a JSON object, got {}",
            json_kind(&other)
        )),
        Err(e) => Err(format!("arguments are not valid JSON: {e}")),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn truncate_name(name: &str) -> String {
    if name.chars().count() <= 80 {
        name.to_owned()
    } else {
        format!("{}…", name.chars().take(80).collect::<String>())
    }
}
