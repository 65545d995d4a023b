//! The configuration reference (`docs/configuration.md`), rendered from the
//! JSON Schema of [`Config`]. Descriptions are the doc comments of the
//! model, defaults are what serde fills in, examples come from the model's
//! `#[schemars(example = …)]` attributes: the reference cannot say anything
//! the code does not, and a test fails when the file falls behind.

use std::fmt::Write as _;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use crate::model::Config;

/// The reference as Markdown, one section per table of `keel.toml`.
pub fn markdown() -> String {
    let root = schema();
    let reference = Reference::new(&root);
    let mut out = String::from(INTRO);
    for section in &reference.sections {
        reference.render_section(section, &mut out);
    }
    out
}

/// Every section's example, in order: together, a complete configuration.
pub fn example() -> String {
    let root = schema();
    let reference = Reference::new(&root);
    let examples: Vec<String> = reference
        .sections
        .iter()
        .filter_map(|s| reference.example(s))
        .collect();
    examples.join("\n")
}

/// Keys without a description, as dotted paths. Every key must say what it
/// is for: the reference has no other source of text.
pub fn undocumented_keys() -> Vec<String> {
    let root = schema();
    let reference = Reference::new(&root);
    let mut missing = Vec::new();
    for section in &reference.sections {
        for (name, field) in properties(section.schema) {
            if reference.field_description(field).is_empty() {
                let mut path = section.path.clone();
                path.push(name.clone());
                missing.push(path.join("."));
            }
        }
    }
    missing
}

fn schema() -> Value {
    schemars::schema_for!(Config).to_value()
}

const INTRO: &str = "\
# Configuration reference

<!-- Generated from crates/keel-config/src/model.rs; do not edit by hand.
     Regenerate with: KEEL_UPDATE_DOCS=1 cargo test -p keel-config reference -->

keel reads one TOML file: `keel.toml` in the working directory, the file
given with `--config FILE`, or the one named by `KEEL_CONFIG`. Every section
and key is optional unless marked *required*, and an unknown key is an
error. `keel check --config FILE` reports every problem at once, each with
its key and line. `examples/keel.toml` is a complete configuration for a
foundry's plant data; the policy rules are explained with examples in
`docs/policies.md`, tool risk and approval in `docs/tools.md`.

Any value can be overridden from the environment: `KEEL_A__B__C` sets
`a.b.c`, and an element of an array of tables is picked by its `name` or
`id`, or by its index (`KEEL_PROVIDERS__MAIN__BASE_URL`,
`KEEL_AGENTS__0__LIMITS__MAX_STEPS`). `KEEL_BIND`, `KEEL_DATA_DIR` and
`KEEL_DATABASE_URL` are short for the `[server]` keys. Secrets never appear
in the file: it names the environment variables that hold them
(`api_key_env`, `key_env`, `${VAR}` in headers and in an MCP server's `env`).

The value of every secret read this way, and the password of
`server.database_url`, is redacted: wherever it occurs, in the user's
input, a tool's output or the model's reply, it is replaced by
`[redacted]` before it reaches a run's events (stored and streamed over
SSE), its messages and record (`/ai/runs`, `/ai/sessions`), the requests
sent to the model, memory (documents, session summaries) and keel's log.
A streamed reply holds back a tail that could be the start of a secret
until the next delta shows whether it is one. Values shorter than 8
characters are not redacted, and a warning at start names them: that
short, a value is too common in ordinary text to be told apart from a
secret, and replacing it would mangle that text. A secret is found as
written and as JSON or Rust escape it; an encoded form (base64, URL
encoding) is not.

Integers are never negative. A default of *unset* means the key has no
value unless one is given; its description says what applies then.
";

/// How a section is written in TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The file itself.
    Root,
    /// `[a.b]`
    Table,
    /// `[[a.b]]`
    Array,
    /// `[a.b."<key>"]`: a table of tables with free-form keys.
    Map,
}

#[derive(Debug)]
struct Section<'a> {
    path: Vec<String>,
    kind: Kind,
    /// The object schema of one table (one element, one map entry).
    schema: &'a Value,
    /// The field that holds the section in its parent.
    field: Option<&'a Value>,
}

impl Section<'_> {
    /// Heading level: top-level tables are chapters, nested ones below them.
    fn level(&self) -> &'static str {
        if self.path.len() <= 1 { "##" } else { "###" }
    }

    /// An explicit anchor, since generated heading ids differ between
    /// Markdown renderers and headings here are full of punctuation.
    fn anchor(&self) -> String {
        if self.path.is_empty() {
            "top-level".to_owned()
        } else {
            self.path.join("-")
        }
    }

    /// How the section is written in TOML; a map's key as a placeholder.
    fn header(&self) -> String {
        let dotted = self.path.join(".");
        match self.kind {
            Kind::Root => "Top level".to_owned(),
            Kind::Table => format!("`[{dotted}]`"),
            Kind::Array => format!("`[[{dotted}]]`"),
            Kind::Map => format!("`[{dotted}.\"<{}>\"]`", self.map_key()),
        }
    }

    fn map_key(&self) -> &str {
        self.field
            .and_then(|f| f.get("x-key"))
            .and_then(Value::as_str)
            .unwrap_or("key")
    }
}

struct Reference<'a> {
    defs: Option<&'a Map<String, Value>>,
    sections: Vec<Section<'a>>,
}

impl<'a> Reference<'a> {
    fn new(root: &'a Value) -> Self {
        let mut reference = Reference {
            defs: root.get("$defs").and_then(Value::as_object),
            sections: Vec::new(),
        };
        let mut sections = Vec::new();
        reference.collect(
            Section {
                path: Vec::new(),
                kind: Kind::Root,
                schema: root,
                field: None,
            },
            &mut sections,
        );
        reference.sections = sections;
        reference
    }

    /// Sections in document order: a table, then the tables inside it.
    fn collect(&self, section: Section<'a>, out: &mut Vec<Section<'a>>) {
        let children: Vec<Section<'a>> = properties(section.schema)
            .filter_map(|(name, field)| {
                let (kind, schema) = self.child_kind(field)?;
                let mut path = section.path.clone();
                path.push(name.clone());
                Some(Section {
                    path,
                    kind,
                    schema,
                    field: Some(field),
                })
            })
            .collect();
        out.push(section);
        for child in children {
            self.collect(child, out);
        }
    }

    /// Follows a `$ref` and drops the `null` of an optional value.
    fn resolve(&self, schema: &'a Value) -> &'a Value {
        let mut schema = schema;
        // Options are `anyOf: [T, {type: null}]`.
        if let Some(any_of) = schema.get("anyOf").and_then(Value::as_array)
            && let Some(other) = any_of.iter().find(|s| s.get("type") != Some(&null_type()))
        {
            schema = other;
        }
        if let Some(name) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
            && let Some(def) = self.defs.and_then(|d| d.get(name))
        {
            return def;
        }
        schema
    }

    /// A field's doc comment, or its type's: an enum or a table documents
    /// every field of its type at once.
    fn field_description(&self, field: &'a Value) -> String {
        let own = description(field);
        if own.is_empty() {
            description(self.resolve(field))
        } else {
            own
        }
    }

    /// Whether a field is a table of its own, and the schema of one table.
    fn child_kind(&self, field: &'a Value) -> Option<(Kind, &'a Value)> {
        let schema = self.resolve(field);
        if is_table(schema) {
            return Some((Kind::Table, schema));
        }
        if let Some(items) = schema.get("items") {
            let item = self.resolve(items);
            return is_table(item).then_some((Kind::Array, item));
        }
        if let Some(values) = schema.get("additionalProperties")
            && values.is_object()
        {
            let value = self.resolve(values);
            return is_table(value).then_some((Kind::Map, value));
        }
        None
    }

    fn render_section(&self, section: &Section<'a>, out: &mut String) {
        let _ = writeln!(out, "\n<a id=\"{}\"></a>\n", section.anchor());
        let _ = writeln!(out, "{} {}\n", section.level(), section.header());
        let intro = [
            section.field.map(description).unwrap_or_default(),
            description(section.schema),
        ]
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
        if !intro.is_empty() {
            let _ = writeln!(out, "{}\n", wrap(&intro));
        }

        let required = required(section.schema);
        out.push_str("| key | type | default | description |\n|---|---|---|---|\n");
        let mut values = Vec::new();
        for (name, field) in properties(section.schema) {
            let (ty, default, text) = match self.child_kind(field) {
                Some((kind, _)) => {
                    let mut path = section.path.clone();
                    path.push(name.clone());
                    let target = Section {
                        path,
                        kind,
                        schema: field,
                        field: Some(field),
                    };
                    let ty = match kind {
                        Kind::Array => "array of tables",
                        Kind::Map => "table of tables",
                        Kind::Root | Kind::Table => "table",
                    };
                    let see = format!("See [{}](#{}).", target.header(), target.anchor());
                    let own = description(field);
                    let text = if own.is_empty() {
                        see
                    } else {
                        format!("{own} {see}")
                    };
                    (ty.to_owned(), String::new(), text)
                }
                None => {
                    let resolved = self.resolve(field);
                    if let Some(list) = variants(resolved)
                        && list.iter().any(|(_, text)| !text.is_empty())
                    {
                        values.push((name.clone(), list));
                    }
                    let default = if required.contains(&name.as_str()) {
                        "*required*".to_owned()
                    } else {
                        match field.get("default") {
                            None | Some(Value::Null) => "*unset*".to_owned(),
                            Some(v) => toml_inline(v).map_or_else(String::new, |t| code(&t)),
                        }
                    };
                    (
                        self.type_name(field),
                        default,
                        self.field_description(field),
                    )
                }
            };
            let _ = writeln!(
                out,
                "| `{name}` | {} | {} | {} |",
                cell(&ty),
                cell(&default),
                cell(&text)
            );
        }
        for (name, list) in values {
            let _ = writeln!(out, "\n`{name}`:\n");
            for (value, text) in list {
                let _ = writeln!(out, "- `\"{value}\"`: {text}");
            }
        }
        if let Some(example) = self.example(section) {
            let _ = writeln!(out, "\n```toml\n{example}```");
        }
    }

    /// The section's example: keys with an example value, required keys,
    /// and keys whose default says something (not empty, not unset).
    fn example(&self, section: &Section<'a>) -> Option<String> {
        let mut lines = String::new();
        match section.kind {
            Kind::Root => return None,
            Kind::Map => {
                let entries = section
                    .field
                    .and_then(|f| f.get("examples"))
                    .and_then(Value::as_array)
                    .and_then(|e| e.first())
                    .and_then(Value::as_object)?;
                let dotted = section.path.join(".");
                for (key, entry) in entries {
                    if !lines.is_empty() {
                        lines.push('\n');
                    }
                    let _ = writeln!(lines, "[{dotted}.{}]", toml_key(key));
                    for (k, v) in entry.as_object().into_iter().flatten() {
                        if let Some(v) = toml_inline(v) {
                            let _ = writeln!(lines, "{} = {v}", toml_key(k));
                        }
                    }
                }
                return Some(lines);
            }
            Kind::Table | Kind::Array => {}
        }
        for (name, field) in properties(section.schema) {
            if self.child_kind(field).is_some() {
                continue;
            }
            let value = field
                .get("examples")
                .and_then(Value::as_array)
                .and_then(|e| e.first())
                .or_else(|| field.get("default").filter(|d| says_something(d)));
            if let Some(text) = value.and_then(toml_inline) {
                let _ = writeln!(lines, "{} = {text}", toml_key(name));
            }
        }
        if lines.is_empty() {
            return None;
        }
        let dotted = section.path.join(".");
        let header = match section.kind {
            Kind::Array => format!("[[{dotted}]]"),
            _ => format!("[{dotted}]"),
        };
        Some(format!("{header}\n{lines}"))
    }

    fn type_name(&self, field: &'a Value) -> String {
        let schema = self.resolve(field);
        if let Some(list) = variants(schema) {
            return one_of(list.iter().map(|(v, _)| format!("`\"{v}\"`")).collect());
        }
        match primary_type(schema) {
            Some("string") => "string".into(),
            Some("boolean") => "boolean".into(),
            Some("number") => "number".into(),
            Some("integer") => match schema.get("maximum").and_then(Value::as_u64) {
                Some(max) => format!("integer, 0 to {max}"),
                None => "integer".into(),
            },
            Some("array") => match schema.get("items") {
                Some(items) => format!("array of {}", self.plural(items)),
                None => "array".into(),
            },
            Some("object") => match schema.get("additionalProperties") {
                Some(values) if values.is_object() => {
                    format!("table of {}", self.plural(values))
                }
                _ => "table".into(),
            },
            _ => "any value".into(),
        }
    }

    fn plural(&self, schema: &'a Value) -> String {
        let one = self.type_name(schema);
        match one.as_str() {
            "string" | "boolean" | "number" | "integer" | "table" => format!("{one}s"),
            "any value" => "values".into(),
            other if other.starts_with("array of ") => format!("arrays of {}", &other[9..]),
            other => other.to_owned(),
        }
    }
}

fn null_type() -> Value {
    Value::String("null".into())
}

fn is_table(schema: &Value) -> bool {
    schema.get("properties").is_some_and(Value::is_object)
}

fn properties(schema: &Value) -> impl Iterator<Item = (&String, &Value)> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
}

fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The JSON type of a schema, ignoring the `null` of an optional value.
fn primary_type(schema: &Value) -> Option<&str> {
    match schema.get("type")? {
        Value::String(t) => Some(t),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null"),
        _ => None,
    }
}

/// An enum's values with their descriptions (empty when it has none).
fn variants(schema: &Value) -> Option<Vec<(String, String)>> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(
            values
                .iter()
                .filter_map(Value::as_str)
                .map(|v| (v.to_owned(), String::new()))
                .collect(),
        );
    }
    let one_of = schema.get("oneOf").and_then(Value::as_array)?;
    one_of
        .iter()
        .map(|v| {
            let value = v
                .get("const")
                .and_then(Value::as_str)
                .or_else(|| v.get("enum")?.as_array()?.first()?.as_str())?;
            Some((value.to_owned(), description(v)))
        })
        .collect()
}

fn one_of(mut values: Vec<String>) -> String {
    match values.len() {
        0 => String::new(),
        1 => values.remove(0),
        n => {
            let last = values.remove(n - 1);
            format!("{} or {last}", values.join(", "))
        }
    }
}

/// Whether a default is worth showing in an example: unset values and
/// empty lists or tables would only add noise.
fn says_something(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// A doc comment as one paragraph, without references to the design
/// document, which is not part of the published documentation.
fn description(schema: &Value) -> String {
    static SPEC: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"\s*\(SPEC §[^)]*\)").ok());
    let text = schema
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let text = match SPEC.as_ref() {
        Some(spec) => spec.replace_all(text, "").into_owned(),
        None => text.to_owned(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text for a Markdown table cell: one line, no column breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn code(text: &str) -> String {
    format!("`{text}`")
}

/// Wraps a paragraph at about 76 columns, so the file reads well as text.
fn wrap(text: &str) -> String {
    let mut out = String::new();
    let mut line = 0;
    for word in text.split_whitespace() {
        if line > 0 && line + 1 + word.len() > 76 {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += word.len();
    }
    out
}

/// A TOML key, quoted unless it is bare.
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_owned()
    } else {
        toml_string(key)
    }
}

/// A JSON string is a valid TOML basic string: both escape `"`, `\` and
/// control characters the same way.
fn toml_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A value as inline TOML; `None` for `null`, which TOML cannot write.
fn toml_inline(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => toml_string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().filter_map(toml_inline).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let entries: Vec<String> = map
                .iter()
                .filter_map(|(k, v)| Some(format!("{} = {}", toml_key(k), toml_inline(v)?)))
                .collect();
            if entries.is_empty() {
                "{}".to_owned()
            } else {
                format!("{{ {} }}", entries.join(", "))
            }
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::env::MapEnv;
    use crate::load::load_str;

    fn doc_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md")
    }

    /// `KEEL_UPDATE_DOCS=1` rewrites the file instead of comparing.
    #[test]
    fn reference_doc_is_up_to_date() {
        let generated = markdown();
        let path = doc_path();
        if std::env::var_os("KEEL_UPDATE_DOCS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &generated).unwrap();
            return;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "docs/configuration.md is stale: it no longer matches the configuration model. \
             Regenerate it with `KEEL_UPDATE_DOCS=1 cargo test -p keel-config reference` \
             and commit the result."
        );
    }

    #[test]
    fn reference_documents_every_key() {
        let missing = undocumented_keys();
        assert!(
            missing.is_empty(),
            "add a doc comment to these fields in model.rs: {missing:?}"
        );
    }

    /// The examples, read in order, are one configuration; it must load
    /// without a single problem, or the reference teaches something wrong.
    #[test]
    fn reference_examples_load_as_one_configuration() {
        let text = example();
        let env = MapEnv::new()
            .with("OPENAI_API_KEY", "sk-test")
            .with("KEEL_KEY_ACME", "secret")
            .with("TELEGRAM_BOT_TOKEN", "123456:ABC-DEF")
            .with("TELEGRAM_SECRET_TOKEN", "s3cret-token");
        let loaded = load_str(&text, "example", &env);
        let problems: Vec<String> = match &loaded {
            Ok(l) => l.warnings.iter().map(ToString::to_string).collect(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        };
        assert!(problems.is_empty(), "{problems:#?}\n{text}");
    }

    #[test]
    fn reference_covers_every_table() {
        let doc = markdown();
        for header in [
            "`[server]`",
            "`[[providers]]`",
            "`[[agents]]`",
            "`[agents.limits]`",
            "`[agents.loop_detection]`",
            "`[agents.drift]`",
            "`[agents.compaction]`",
            "`[[tools.mcp]]`",
            "`[[tools.http]]`",
            "`[tools.overrides.\"<tool or glob>\"]`",
            "`[tools.web_fetch]`",
            "`[tools.exec]`",
            "`[[tools.exec.programs]]`",
            "`[verify]`",
            "`[policy]`",
            "`[[policy.rules]]`",
            "`[policy.rules.when_arguments.\"<argument>\"]`",
            "`[[hooks]]`",
            "`[auth]`",
            "`[[auth.keys]]`",
            "`[memory]`",
            "`[[channels]]`",
            "`[routing]`",
            "`[[routing.bindings]]`",
            "`[[routing.identity_links]]`",
            "`[[routing.identity_links.identities]]`",
            "`[[tenants]]`",
        ] {
            assert!(doc.contains(&format!(" {header}\n")), "no section {header}");
        }
        assert!(!doc.contains("SPEC"), "design-document references leak");
    }

    #[test]
    fn toml_values() {
        let v = serde_json::json!({"a b": [1, "x\"y"], "c": {"d": true}, "e": null});
        assert_eq!(
            toml_inline(&v).unwrap(),
            r#"{ "a b" = [1, "x\"y"], c = { d = true } }"#
        );
        assert_eq!(toml_inline(&serde_json::json!(0.0)).unwrap(), "0.0");
    }
}
