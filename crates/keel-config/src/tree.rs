//! An owned TOML tree in which every value remembers where it came from: a
//! place in the file or an environment variable. Overrides and validation
//! work on this tree so each problem can point at its source.

use std::fmt::Write as _;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};
use toml::value::Datetime;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Origin {
    File { line: usize, col: usize },
    Env(String),
}

impl Origin {
    pub(crate) fn render(&self, file: &str) -> String {
        match self {
            Origin::File { line, col } => format!("{file}:{line}:{col}"),
            Origin::Env(var) => format!("env {var}"),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub value: Val,
    pub origin: Origin,
}

#[derive(Debug, Clone)]
pub(crate) enum Val {
    Str(String),
    Int(i128),
    Float(f64),
    Bool(bool),
    Datetime(Datetime),
    Array(Vec<Node>),
    Table(Vec<Entry>),
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: String,
    pub node: Node,
}

impl Node {
    pub(crate) fn new(value: Val, origin: Origin) -> Self {
        Self { value, origin }
    }

    /// How a value is named in a type-mismatch message.
    pub(crate) fn describe(&self) -> String {
        match &self.value {
            Val::Str(s) => format!("string {s:?}"),
            Val::Int(i) => format!("integer {i}"),
            Val::Float(f) => format!("float {f}"),
            Val::Bool(b) => format!("boolean {b}"),
            Val::Datetime(d) => format!("datetime {d}"),
            Val::Array(_) => "an array".into(),
            Val::Table(_) => "a table".into(),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Val::Table(entries) => entries.iter().find(|e| e.key == key).map(|e| &e.node),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.value {
            Val::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Converts to the plain TOML value serde deserializes the model from.
    pub(crate) fn to_toml(&self) -> toml::Value {
        match &self.value {
            Val::Str(s) => toml::Value::String(s.clone()),
            // Validation keeps only integers that fit the model's fields;
            // anything else has already been reported and removed.
            Val::Int(i) => toml::Value::Integer(i64::try_from(*i).unwrap_or(i64::MAX)),
            Val::Float(f) => toml::Value::Float(*f),
            Val::Bool(b) => toml::Value::Boolean(*b),
            Val::Datetime(d) => toml::Value::Datetime(*d),
            Val::Array(items) => toml::Value::Array(items.iter().map(Node::to_toml).collect()),
            Val::Table(entries) => toml::Value::Table(
                entries
                    .iter()
                    .map(|e| (e.key.clone(), e.node.to_toml()))
                    .collect(),
            ),
        }
    }
}

/// Byte offsets to 1-based line and column (in characters).
pub(crate) struct Lines<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> Lines<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self { text, starts }
    }

    pub(crate) fn origin(&self, offset: usize) -> Origin {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|s| *s <= offset).max(1);
        let start = self.starts.get(line - 1).copied().unwrap_or(0);
        let col = self
            .text
            .get(start..offset)
            .map_or(1, |prefix| prefix.chars().count() + 1);
        Origin::File { line, col }
    }

    fn origin_of(&self, span: Range<usize>) -> Origin {
        self.origin(span.start)
    }
}

/// Builds the owned tree from the parsed document. Table entries take the
/// position of their key, which is where a person looks for them.
pub(crate) fn from_document(doc: &Spanned<DeTable<'_>>, lines: &Lines<'_>) -> Node {
    Node::new(
        Val::Table(table_entries(doc.get_ref(), lines)),
        Origin::File { line: 1, col: 1 },
    )
}

fn table_entries(table: &DeTable<'_>, lines: &Lines<'_>) -> Vec<Entry> {
    let mut entries: Vec<Entry> = table
        .iter()
        .map(|(k, v)| Entry {
            key: k.get_ref().to_string(),
            node: from_value(v, lines.origin_of(k.span()), lines),
        })
        .collect();
    // Keep file order so problems and overrides follow the text.
    entries.sort_by(|a, b| a.node.origin.cmp(&b.node.origin));
    entries
}

fn from_value(value: &Spanned<DeValue<'_>>, origin: Origin, lines: &Lines<'_>) -> Node {
    let val = match value.get_ref() {
        DeValue::String(s) => Val::Str(s.to_string()),
        DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) => Val::Int(n),
            // The parser accepted it, so it is only too large for i128:
            // keep it as a value no field accepts.
            Err(_) => Val::Str(i.to_string()),
        },
        DeValue::Float(f) => Val::Float(f.as_str().parse().unwrap_or(f64::NAN)),
        DeValue::Boolean(b) => Val::Bool(*b),
        DeValue::Datetime(d) => Val::Datetime(*d),
        DeValue::Array(items) => Val::Array(
            items
                .iter()
                .map(|item| from_value(item, lines.origin_of(item.span()), lines))
                .collect(),
        ),
        DeValue::Table(t) => Val::Table(table_entries(t, lines)),
    };
    Node::new(val, origin)
}

/// A value parsed from an environment variable: every part of it points at
/// the variable.
pub(crate) fn from_env_value(value: &Spanned<DeValue<'_>>, origin: &Origin) -> Node {
    let lines = Lines::new("");
    let mut node = from_value(value, origin.clone(), &lines);
    set_origin(&mut node, origin);
    node
}

fn set_origin(node: &mut Node, origin: &Origin) {
    node.origin = origin.clone();
    match &mut node.value {
        Val::Array(items) => items.iter_mut().for_each(|n| set_origin(n, origin)),
        Val::Table(entries) => entries
            .iter_mut()
            .for_each(|e| set_origin(&mut e.node, origin)),
        _ => {}
    }
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A dotted key path as shown to people: `agents[0].limits.max_steps`,
/// `tools.overrides."plant.restart_furnace".risk`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(pub Vec<Seg>);

impl KeyPath {
    pub(crate) fn root() -> Self {
        Self(Vec::new())
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(key.to_string()));
        p
    }

    pub(crate) fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }

    pub(crate) fn parent(&self) -> Option<Self> {
        let mut p = self.clone();
        p.0.pop().map(|_| p)
    }

    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        for seg in &self.0 {
            match seg {
                Seg::Index(i) => {
                    let _ = write!(out, "[{i}]");
                }
                Seg::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    if is_bare_key(k) {
                        out.push_str(k);
                    } else {
                        let _ = write!(out, "{k:?}");
                    }
                }
            }
        }
        out
    }
}

fn is_bare_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_render_like_toml() {
        let p = KeyPath::root()
            .key("agents")
            .index(0)
            .key("limits")
            .key("max_steps");
        assert_eq!(p.render(), "agents[0].limits.max_steps");
        let q = KeyPath::root()
            .key("tools")
            .key("overrides")
            .key("plant.restart_furnace")
            .key("risk");
        assert_eq!(q.render(), "tools.overrides.\"plant.restart_furnace\".risk");
        assert_eq!(
            q.parent().map(|p| p.render()).as_deref(),
            Some("tools.overrides.\"plant.restart_furnace\"")
        );
    }

    #[test]
    fn offsets_map_to_lines_and_columns() {
        let lines = Lines::new("a = 1\nbb = 2\n\nc = 3");
        assert_eq!(lines.origin(0), Origin::File { line: 1, col: 1 });
        assert_eq!(lines.origin(6), Origin::File { line: 2, col: 1 });
        assert_eq!(lines.origin(9), Origin::File { line: 2, col: 4 });
        assert_eq!(lines.origin(13), Origin::File { line: 3, col: 1 });
        assert_eq!(lines.origin(14), Origin::File { line: 4, col: 1 });
    }

    #[test]
    fn tree_keeps_key_positions() {
        let text =
            "[server]\nbind = \"x\"\n\n[[agents]]\nid = \"a\"\n[agents.limits]\nmax_steps = 3\n";
        let doc = DeTable::parse(text).unwrap();
        let lines = Lines::new(text);
        let root = from_document(&doc, &lines);
        let bind = root.get("server").and_then(|s| s.get("bind")).unwrap();
        assert_eq!(bind.origin, Origin::File { line: 2, col: 1 });
        let Val::Array(agents) = &root.get("agents").unwrap().value else {
            panic!("agents is not an array")
        };
        let max_steps = agents[0]
            .get("limits")
            .and_then(|l| l.get("max_steps"))
            .unwrap();
        assert_eq!(max_steps.origin, Origin::File { line: 7, col: 1 });
        assert!(matches!(max_steps.value, Val::Int(3)));
    }
}
