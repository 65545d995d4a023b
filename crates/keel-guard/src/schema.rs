//! The schema guard (SPEC §4.4): tool parameter schemas are normalized once
//! at registration, then every call's arguments are checked against them
//! before anything runs.
//!
//! Normalization exists because each provider accepts a slightly different
//! JSON-Schema dialect, and because a lax schema (extra properties allowed,
//! `required` naming ghosts) would let malformed calls through the guard.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::paths::LocationSegment;
use jsonschema::{ValidationError, Validator};
use serde_json::{Map, Value};

/// Keywords whose value is a single subschema.
const SUBSCHEMA_KEYS: &[&str] = &[
    "items",
    "additionalProperties",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];
/// Keywords whose value is a list of subschemas.
const SUBSCHEMA_LIST_KEYS: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems", "items"];
/// Keywords whose value maps names to subschemas.
const SUBSCHEMA_MAP_KEYS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Rewrites a tool's parameter schema into the strict form every provider
/// accepts; see the module docs for why.
///
/// Object levels that declare `properties` and say nothing about
/// `additionalProperties` get `false`, so unknown parameters are rejected.
/// A bare `{"type": "object"}` with no `properties` stays open: it is a
/// free-form map, and closing it would make it unusable.
pub fn normalize(schema: &Value) -> Value {
    let mut root = match schema {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    root.entry("type")
        .or_insert_with(|| Value::String("object".into()));
    if !root.get("properties").is_some_and(Value::is_object) {
        root.insert("properties".into(), Value::Object(Map::new()));
    }
    normalize_level(&mut root);
    Value::Object(root)
}

fn normalize_level(level: &mut Map<String, Value>) {
    level.remove("$schema");
    level.remove("$id");
    apply_nullable(level);

    for key in SUBSCHEMA_MAP_KEYS {
        if let Some(Value::Object(children)) = level.get_mut(*key) {
            for child in children.values_mut() {
                normalize_child(child);
            }
        }
    }
    for key in SUBSCHEMA_KEYS {
        if let Some(child) = level.get_mut(*key)
            && child.is_object()
        {
            normalize_child(child);
        }
    }
    for key in SUBSCHEMA_LIST_KEYS {
        if let Some(Value::Array(children)) = level.get_mut(*key) {
            for child in children {
                normalize_child(child);
            }
        }
    }

    if let Some(Value::Object(props)) = level.get("properties") {
        let names: Vec<String> = props.keys().cloned().collect();
        if let Some(required) = level.get_mut("required") {
            let mut kept: Vec<Value> = Vec::new();
            if let Value::Array(items) = required {
                for item in items.iter() {
                    if let Some(name) = item.as_str()
                        && names.iter().any(|n| n == name)
                        && !kept.contains(item)
                    {
                        kept.push(item.clone());
                    }
                }
            }
            if kept.is_empty() {
                level.remove("required");
            } else {
                level.insert("required".into(), Value::Array(kept));
            }
        }
        level
            .entry("additionalProperties")
            .or_insert(Value::Bool(false));
    } else if level.get("required").is_some_and(|r| !r.is_array()) {
        level.remove("required");
    }
}

fn normalize_child(child: &mut Value) {
    if let Value::Object(map) = child {
        normalize_level(map);
    }
}

/// OpenAPI's `nullable: true` is not JSON Schema; validators ignore it and
/// would reject the nulls the tool author meant to allow.
fn apply_nullable(level: &mut Map<String, Value>) {
    let Some(nullable) = level.remove("nullable") else {
        return;
    };
    if nullable != Value::Bool(true) {
        return;
    }
    let null = Value::String("null".into());
    match level.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = Value::String(std::mem::take(t));
            level.insert("type".into(), Value::Array(vec![t, null.clone()]));
        }
        Some(Value::Array(types)) if !types.contains(&null) => types.push(null.clone()),
        _ => {}
    }
    if let Some(Value::Array(options)) = level.get_mut("enum")
        && !options.contains(&Value::Null)
    {
        options.push(Value::Null);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("invalid JSON schema: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViolationKind {
    MissingRequired { param: String },
    UnknownParameter { param: String },
    WrongType,
    NotInEnum,
    Other,
}

/// One reason a call's arguments were refused; `message` is written for the
/// model, which has to repair the call from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    /// Where in the arguments, as `param.nested[0]`; empty for the whole object.
    pub path: String,
    pub message: String,
}

/// A parameter schema ready to check arguments against, compiled once per tool.
#[derive(Debug)]
pub struct CompiledSchema {
    schema: Value,
    validator: Validator,
}

/// Longest rendering of an offending value in a message; the model needs to
/// recognise it, not to read it back in full.
const MAX_VALUE_CHARS: usize = 80;

impl CompiledSchema {
    /// Compiles a (normalized) schema. References are resolved locally only:
    /// a schema can never make keel fetch anything.
    pub fn compile(schema: &Value) -> Result<CompiledSchema, SchemaError> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| SchemaError::Invalid(e.to_string()))?;
        Ok(CompiledSchema {
            schema: schema.clone(),
            validator,
        })
    }

    /// Every violation in `args`; empty when the call may proceed.
    pub fn check(&self, args: &Value) -> Vec<Violation> {
        if !args.is_object() {
            return vec![Violation {
                kind: ViolationKind::WrongType,
                path: String::new(),
                message: "arguments must be a JSON object".into(),
            }];
        }
        self.validate(args)
    }

    /// Every violation in any JSON value; unlike [`Self::check`] it accepts
    /// non-objects, because a tool's output may be an array or a scalar.
    pub fn validate(&self, value: &Value) -> Vec<Violation> {
        let mut out = Vec::new();
        for error in self.validator.iter_errors(value) {
            translate(&error, &mut out);
        }
        out
    }

    /// Top-level required parameters that are absent or null, in schema
    /// order; a null counts as missing because models emit it for "unknown".
    pub fn missing_required(&self, args: &Value) -> Vec<String> {
        let Some(required) = self.schema.get("required").and_then(Value::as_array) else {
            return Vec::new();
        };
        required
            .iter()
            .filter_map(Value::as_str)
            .filter(|name| args.get(*name).is_none_or(Value::is_null))
            .map(str::to_owned)
            .collect()
    }
}

fn translate(error: &ValidationError<'_>, out: &mut Vec<Violation>) {
    let path = readable_path(error);
    match error.kind() {
        ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_owned);
            let param = join(&path, &name);
            out.push(Violation {
                message: format!("{param}: required parameter is missing"),
                kind: ViolationKind::MissingRequired {
                    param: param.clone(),
                },
                path: param,
            });
        }
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            for name in unexpected {
                let param = join(&path, name);
                out.push(Violation {
                    message: format!("{param}: unknown parameter"),
                    kind: ViolationKind::UnknownParameter {
                        param: param.clone(),
                    },
                    path: param,
                });
            }
        }
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            out.push(Violation {
                message: format!(
                    "{}: expected {expected}, got {}",
                    subject(&path),
                    short(error.instance())
                ),
                kind: ViolationKind::WrongType,
                path,
            });
        }
        ValidationErrorKind::Enum { options } => {
            out.push(Violation {
                message: format!(
                    "{}: {} is not one of {}",
                    subject(&path),
                    short(error.instance()),
                    short(options)
                ),
                kind: ViolationKind::NotInEnum,
                path,
            });
        }
        _ => out.push(Violation {
            message: format!("{}: {error}", subject(&path)),
            kind: ViolationKind::Other,
            path,
        }),
    }
}

fn readable_path(error: &ValidationError<'_>) -> String {
    let mut path = String::new();
    for segment in error.instance_path().iter() {
        match segment {
            LocationSegment::Property(name) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&name);
            }
            LocationSegment::Index(i) => path.push_str(&format!("[{i}]")),
        }
    }
    path
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

fn subject(path: &str) -> &str {
    if path.is_empty() { "arguments" } else { path }
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_VALUE_CHARS {
        text
    } else {
        let cut: String = text.chars().take(MAX_VALUE_CHARS).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
