//! The rules for asking the user (SPEC §4.2, §4.3), as pure functions.
//!
//! A clarification is only worth a user's time when it unblocks a concrete
//! tool call; everything else is answered directly.

use keel_guard::schema::{CompiledSchema, ViolationKind};
use keel_protocol::{ToolSchema, ToolSpec, Understanding};
use serde_json::{Map, Value, json};

pub use keel_protocol::CLARIFY_TOOL;

/// At most this many slots are asked for at once.
pub const MAX_SLOTS_ASKED: usize = 2;

/// The `clarify` tool as offered to the model, on every turn: built once.
pub fn clarify_schema() -> ToolSchema {
    static SCHEMA: std::sync::LazyLock<ToolSchema> = std::sync::LazyLock::new(build_schema);
    SCHEMA.clone()
}

fn build_schema() -> ToolSchema {
    ToolSchema {
        name: CLARIFY_TOOL.into(),
        description: "Ask the user for required parameters of one specific tool that you must call \
                      and cannot call without them. Never use this for general questions: answer those directly."
            .into(),
        parameters: std::sync::Arc::new(json!({
            "type": "object",
            "properties": {
                "tool_name": {"type": "string", "description": "The tool you need to call"},
                "missing_slots": {"type": "array", "items": {"type": "string"},
                                   "description": "Required parameters of that tool the user has not given"},
                "question": {"type": "string", "description": "The question to ask the user"},
                "intent": {"type": "string", "description": "Optional: what you are trying to do"},
                "confidence": {"type": "number", "description": "Optional: how sure you are of your understanding, 0.0 to 1.0"}
            },
            "required": ["tool_name", "missing_slots", "question"],
            "additionalProperties": false
        })),
    }
}

/// What the model asked for through `clarify`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClarifyRequest {
    pub tool_name: String,
    pub missing_slots: Vec<String>,
    pub question: String,
    /// The optional `intent` and `confidence` arguments.
    pub understanding: Understanding,
}

impl ClarifyRequest {
    /// Reads the arguments leniently: a malformed request is simply not actionable.
    pub fn parse(raw_arguments: &str) -> Self {
        let v: Value = serde_json::from_str(raw_arguments).unwrap_or(Value::Null);
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        let missing_slots = v
            .get("missing_slots")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        Self {
            tool_name: s("tool_name"),
            missing_slots,
            question: s("question"),
            understanding: v
                .as_object()
                .map(Understanding::from_object)
                .unwrap_or_default(),
        }
    }
}

/// Why a clarification was refused, for the `react_feedback` detail.
#[derive(Debug, Clone, PartialEq)]
pub enum NotActionable {
    NoSuchTool(String),
    NoSlots,
    NotRequired(Vec<String>),
}

impl std::fmt::Display for NotActionable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoSuchTool(t) if t.is_empty() => write!(f, "clarify named no tool"),
            Self::NoSuchTool(t) => write!(
                f,
                "clarify named `{t}`, which is not a tool this caller may use"
            ),
            Self::NoSlots => write!(f, "clarify named no missing parameter"),
            Self::NotRequired(s) => write!(
                f,
                "clarify asked for {} which {} not required parameters of the tool",
                s.join(", "),
                if s.len() == 1 { "is" } else { "are" }
            ),
        }
    }
}

/// Checks SPEC §4.2: the tool must be usable and every slot a required
/// parameter of it. Returns the slots to ask for (at most two, in schema order).
pub fn actionable_slots(
    req: &ClarifyRequest,
    tool: Option<&ToolSpec>,
) -> Result<Vec<String>, NotActionable> {
    let Some(spec) = tool else {
        return Err(NotActionable::NoSuchTool(req.tool_name.clone()));
    };
    if req.missing_slots.is_empty() {
        return Err(NotActionable::NoSlots);
    }
    let required = spec.required_params();
    let not_required: Vec<String> = req
        .missing_slots
        .iter()
        .filter(|s| !required.contains(s))
        .cloned()
        .collect();
    if !not_required.is_empty() {
        return Err(NotActionable::NotRequired(not_required));
    }
    Ok(most_important(spec, &req.missing_slots))
}

/// The slots worth asking for first: schema order of `required`, at most two.
pub fn most_important(spec: &ToolSpec, missing: &[String]) -> Vec<String> {
    spec.required_params()
        .into_iter()
        .filter(|r| missing.contains(r))
        .take(MAX_SLOTS_ASKED)
        .collect()
}

/// The question shown to the user: the model's when it gave one, else built
/// from the parameters' descriptions.
pub fn question_for(spec: &ToolSpec, slots: &[String], model_question: Option<&str>) -> String {
    if let Some(q) = model_question.map(str::trim).filter(|q| !q.is_empty()) {
        return q.to_owned();
    }
    let parts: Vec<String> = slots
        .iter()
        .map(|s| match spec.param_description(s) {
            Some(d) if !d.is_empty() => format!("{s} ({d})"),
            _ => s.clone(),
        })
        .collect();
    format!(
        "To run {} I need: {}. Please provide {}.",
        spec.name,
        parts.join("; "),
        if slots.len() == 1 { "it" } else { "them" }
    )
}

/// Words that answer a question without being a value: a one-word reply
/// like these is conversation, never an argument.
const NOT_VALUES: &[&str] = &[
    "yes", "no", "ok", "okay", "sure", "yep", "nope", "maybe", "thanks", "thank", "hi", "hello",
    "idk", "dunno", "what", "why", "how", "which", "help", "hmm", "cancel", "stop", "none",
    "nothing", "unknown", "later", "wait",
];

/// SPEC §4.3: the user's reply fills a missing slot directly only when the
/// whole reply is a bare value the tool's schema accepts; anything else
/// joins the conversation and the model makes the complete call itself.
///
/// A bare value is one of:
/// - a JSON object naming missing slots (`{"furnace_id": "F2"}`);
/// - with exactly one slot asked: a JSON literal (`12`, `true`,
///   `"New York"`), a case-insensitive match of one of the slot's `enum`
///   values, or a single token with no white space and no sentence
///   punctuation (`USR002`, `TeamNotes.txt`) converted to the slot's type.
///
/// A sentence ("Ah I forgot to mention, his user id is USR002.") is never
/// a bare value, and neither is a conversational word ("sure"). The
/// merged arguments must pass the schema (missing slots aside), so a value
/// of the wrong type or outside an enum or pattern is not filled either.
pub fn direct_fill(
    spec: &ToolSpec,
    schema: &CompiledSchema,
    args: &Value,
    slots: &[String],
    reply: &str,
) -> Option<Value> {
    let mut merged: Map<String, Value> = args.as_object().cloned().unwrap_or_default();
    let reply = reply.trim();
    if reply.is_empty() || reply.len() > MAX_BARE_VALUE_BYTES || reply.contains('\n') {
        return None;
    }
    if let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(reply) {
        let mut filled = false;
        for slot in slots {
            if let Some(v) = obj.get(slot) {
                merged.insert(slot.clone(), v.clone());
                filled = true;
            }
        }
        return (filled && accepted(schema, &merged)).then_some(Value::Object(merged));
    }
    let [slot] = slots else {
        return None;
    };
    let param = spec.parameters.get("properties").and_then(|p| p.get(slot));
    let value = bare_value(param, reply)?;
    merged.insert(slot.clone(), value);
    accepted(schema, &merged).then_some(Value::Object(merged))
}

/// Longest reply that can be a bare value.
const MAX_BARE_VALUE_BYTES: usize = 256;

fn accepted(schema: &CompiledSchema, args: &Map<String, Value>) -> bool {
    schema
        .check(&Value::Object(args.clone()))
        .iter()
        .all(|v| matches!(v.kind, ViolationKind::MissingRequired { .. }))
}

fn bare_value(param: Option<&Value>, reply: &str) -> Option<Value> {
    let ty = param
        .and_then(|p| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("string");
    if let Some(options) = param.and_then(|p| p.get("enum")).and_then(Value::as_array) {
        let quoted = serde_json::from_str::<Value>(reply).ok();
        return options
            .iter()
            .find(|o| match o {
                Value::String(s) => s.eq_ignore_ascii_case(reply.trim_matches('"')),
                other => Some(*other) == quoted.as_ref(),
            })
            .cloned();
    }
    match serde_json::from_str::<Value>(reply) {
        Ok(Value::String(s)) => return Some(Value::String(s)),
        Ok(v @ (Value::Number(_) | Value::Bool(_))) if ty != "string" => return Some(v),
        _ => {}
    }
    if !is_token(reply) {
        return None;
    }
    match ty {
        "integer" => reply.parse::<i64>().ok().map(Value::from),
        "number" => reply
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number),
        "boolean" => match reply.to_ascii_lowercase().as_str() {
            "true" | "yes" | "y" => Some(Value::Bool(true)),
            "false" | "no" | "n" => Some(Value::Bool(false)),
            _ => None,
        },
        "string" if !NOT_VALUES.contains(&reply.to_ascii_lowercase().as_str()) => {
            Some(Value::String(reply.to_owned()))
        }
        _ => None,
    }
}

/// One token: no white space, no sentence punctuation at either end, no
/// question or exclamation mark anywhere.
fn is_token(s: &str) -> bool {
    !s.chars().any(char::is_whitespace)
        && !s.contains(['?', '!'])
        && !s.ends_with(['.', ',', ';', ':'])
        && !s.starts_with(['"', '\'', '(', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ToolSpec {
        ToolSpec::new(
            "furnace_status",
            "status",
            json!({"type":"object","properties":{
                "furnace_id":{"type":"string","description":"Furnace id, e.g. F2"},
                "hours":{"type":"integer"},
                "verbose":{"type":"boolean"}},
                "required":["furnace_id","hours"]}),
        )
    }

    #[test]
    fn clarify_without_tool_is_not_actionable() {
        let r = ClarifyRequest::parse(r#"{"tool_name":"","missing_slots":["x"],"question":"?"}"#);
        assert_eq!(
            actionable_slots(&r, None),
            Err(NotActionable::NoSuchTool(String::new()))
        );
    }

    #[test]
    fn clarify_needs_slots_that_are_required() {
        let s = spec();
        let none = ClarifyRequest {
            tool_name: "furnace_status".into(),
            ..Default::default()
        };
        assert_eq!(
            actionable_slots(&none, Some(&s)),
            Err(NotActionable::NoSlots)
        );
        let wrong = ClarifyRequest {
            tool_name: "furnace_status".into(),
            missing_slots: vec!["verbose".into()],
            ..Default::default()
        };
        assert!(matches!(
            actionable_slots(&wrong, Some(&s)),
            Err(NotActionable::NotRequired(_))
        ));
        let ok = ClarifyRequest {
            tool_name: "furnace_status".into(),
            missing_slots: vec!["hours".into(), "furnace_id".into()],
            ..Default::default()
        };
        assert_eq!(
            actionable_slots(&ok, Some(&s)).unwrap(),
            vec!["furnace_id", "hours"]
        );
    }

    #[test]
    fn malformed_clarify_arguments_parse_to_empty() {
        let r = ClarifyRequest::parse("{not json");
        assert_eq!(r, ClarifyRequest::default());
    }

    #[test]
    fn question_falls_back_to_descriptions() {
        let q = question_for(&spec(), &["furnace_id".into()], None);
        assert!(q.contains("Furnace id, e.g. F2"), "{q}");
        assert_eq!(
            question_for(&spec(), &["furnace_id".into()], Some("Which furnace?")),
            "Which furnace?"
        );
    }

    fn fill(args: Value, slots: &[&str], reply: &str) -> Option<Value> {
        let s = spec();
        let schema = CompiledSchema::compile(&s.parameters).unwrap();
        let slots: Vec<String> = slots.iter().map(|s| s.to_string()).collect();
        direct_fill(&s, &schema, &args, &slots, reply)
    }

    #[test]
    fn a_bare_value_fills_the_one_slot_with_its_type() {
        let args = json!({"furnace_id":"F2"});
        assert_eq!(
            fill(args.clone(), &["hours"], " 12 ").unwrap(),
            json!({"furnace_id":"F2","hours":12})
        );
        assert_eq!(fill(args.clone(), &["hours"], "twelve"), None);
        assert_eq!(fill(args, &["hours"], "12 hours"), None);
        assert_eq!(
            fill(json!({}), &["furnace_id"], "F7").unwrap(),
            json!({"furnace_id":"F7"})
        );
        assert_eq!(
            fill(json!({}), &["furnace_id"], "\"Furnace Seven\"").unwrap(),
            json!({"furnace_id":"Furnace Seven"})
        );
    }

    #[test]
    fn sentences_and_chatter_never_fill_a_slot() {
        for reply in [
            "Ah I forget to mention, his user id is USR002.",
            "The document name should be 'TeamNotes.txt'.",
            "I forgot to tell you, it's in business class, estimated at $1,200",
            "F7.",
            "F7?",
            "sure",
            "OK",
            "F2\nF3",
            "",
        ] {
            assert_eq!(fill(json!({}), &["furnace_id"], reply), None, "{reply:?}");
        }
    }

    #[test]
    fn enum_slots_take_only_their_values() {
        let s = ToolSpec::new(
            "book",
            "",
            json!({"type":"object","properties":{"class":{"type":"string","enum":["economy","business"]}},"required":["class"]}),
        );
        let schema = CompiledSchema::compile(&s.parameters).unwrap();
        let slots = vec!["class".to_string()];
        assert_eq!(
            direct_fill(&s, &schema, &json!({}), &slots, "Business").unwrap(),
            json!({"class":"business"})
        );
        assert_eq!(direct_fill(&s, &schema, &json!({}), &slots, "first"), None);
        assert_eq!(
            direct_fill(&s, &schema, &json!({}), &slots, "it's in business class"),
            None
        );
    }

    #[test]
    fn reply_as_json_object_fills_several_slots() {
        let m = fill(
            json!({}),
            &["furnace_id", "hours"],
            r#"{"furnace_id":"F1","hours":3}"#,
        );
        assert_eq!(m.unwrap(), json!({"furnace_id":"F1","hours":3}));
        assert_eq!(fill(json!({}), &["furnace_id", "hours"], "F1 and 3"), None);
        assert_eq!(
            fill(
                json!({}),
                &["furnace_id", "hours"],
                r#"{"furnace_id":"F1","hours":"three"}"#
            ),
            None,
            "a value the schema refuses is not filled"
        );
    }

    #[test]
    fn at_most_two_slots_are_asked() {
        let s = ToolSpec::new(
            "t",
            "",
            json!({"type":"object","properties":{"a":{},"b":{},"c":{}},"required":["a","b","c"]}),
        );
        assert_eq!(
            most_important(&s, &["c".into(), "b".into(), "a".into()]),
            vec!["a", "b"]
        );
    }
}
