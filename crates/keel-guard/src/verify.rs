//! Observe, then verify (SPEC §4.8): a tool's raw output is only an
//! observation; these rules decide what the model may conclude from it.
//! Each rule that applies yields one [`Check`]. A tenant-isolation failure
//! withholds the whole result, so no check's detail ever quotes output data
//! then: details name counts and field names, never values.

use keel_config::{VerifyConfig, tool_pattern_matches};
use keel_protocol::ToolSpec;
use serde_json::Value;

use crate::schema::CompiledSchema;

pub const RULE_SCHEMA: &str = "schema";
pub const RULE_TENANT_ISOLATION: &str = "tenant_isolation";
pub const RULE_NON_EMPTY: &str = "non_empty";
pub const RULE_REQUIRED_FIELDS: &str = "required_fields";

/// How many schema violations a failed check spells out.
const MAX_LISTED: usize = 5;
/// How many levels of JSON-inside-a-string are searched for tenant fields:
/// tools often wrap a JSON payload in a text field.
const EMBEDDED_JSON_DEPTH: u32 = 2;

#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub rule: String,
    pub passed: bool,
    pub detail: String,
}

impl Check {
    fn new(rule: &str, passed: bool, detail: impl Into<String>) -> Self {
        Self {
            rule: rule.to_owned(),
            passed,
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    pub checks: Vec<Check>,
    /// tenant_isolation failed: the whole result must be withheld from the
    /// model, events and logs.
    pub withhold: bool,
    /// null/empty result
    pub empty: bool,
}

impl Report {
    /// Whether every applied rule passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    pub fn check(&self, rule: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.rule == rule)
    }
}

/// What one tool call produced, as the verifier sees it.
#[derive(Debug, Clone, Copy)]
pub struct VerifyInput<'a> {
    pub tool: &'a ToolSpec,
    /// The output text, read as JSON by the caller: loop detection's
    /// outcome fingerprint reads the same text, so it is read once for both.
    pub output: &'a ToolText<'a>,
    pub structured: Option<&'a Value>,
    /// false when the tool reported an error.
    pub ok: bool,
    pub caller_tenant: &'a str,
    pub output_schema: Option<&'a CompiledSchema>,
}

/// The verification rules, built once from `[verify]`.
#[derive(Debug, Clone)]
pub struct Verifier {
    tenant_field: String,
    non_empty: bool,
    required_fields: Vec<(String, Vec<String>)>,
}

impl Verifier {
    pub fn new(cfg: &VerifyConfig) -> Verifier {
        Verifier {
            tenant_field: cfg.tenant_field.clone(),
            non_empty: cfg.non_empty,
            required_fields: cfg
                .required_fields
                .iter()
                .map(|(pattern, fields)| (pattern.clone(), fields.clone()))
                .collect(),
        }
    }

    pub fn verify(&self, input: &VerifyInput<'_>) -> Report {
        let parsed = input.output.json();
        // The structured result is what the tool meant; the text is what
        // the model would read. Both are searched for foreign tenants.
        let result = input.structured.or(parsed.and_then(OutputJson::whole));
        let mut report = Report::default();

        if input.ok
            && let Some(schema) = input.output_schema
        {
            report.checks.push(schema_check(schema, result));
        }

        let mut scan = Scan::default();
        let mut scanned = false;
        if let Some(value) = input.structured {
            scan.add(self.scan(value, input.caller_tenant));
            scanned = true;
        }
        if let Some(parsed) = parsed {
            for value in parsed.values() {
                scan.add(self.scan(value, input.caller_tenant));
            }
            scanned = true;
        }
        if scanned {
            let passed = scan.foreign == 0;
            let detail = if !passed {
                format!(
                    "{} of another tenant (field {})",
                    rows(scan.foreign),
                    self.tenant_field
                )
            } else if scan.tagged == 0 {
                format!("no {} field in the result", self.tenant_field)
            } else {
                format!("{} of the caller's tenant", rows(scan.tagged))
            };
            report.withhold = !passed;
            report
                .checks
                .push(Check::new(RULE_TENANT_ISOLATION, passed, detail));
        }

        if input.ok && self.non_empty {
            let empty = match result {
                Some(value) => is_empty(value),
                None => input.output.text().trim().is_empty(),
            };
            report.empty = empty;
            let detail = if empty {
                "empty result"
            } else {
                "result has data"
            };
            report
                .checks
                .push(Check::new(RULE_NON_EMPTY, !empty, detail));
        }

        if input.ok {
            let fields = self.required_for(&input.tool.name);
            if !fields.is_empty() {
                report.checks.push(required_fields_check(&fields, result));
            }
        }

        if report.withhold {
            // Schema messages quote offending values, which may be the
            // foreign tenant's data.
            for check in &mut report.checks {
                if check.rule == RULE_SCHEMA && !check.passed {
                    check.detail =
                        "output does not match the output schema (details withheld)".into();
                }
            }
        }
        report
    }

    /// Every field required of this tool's rows by any matching pattern,
    /// in configuration order without repeats.
    fn required_for(&self, tool: &str) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (pattern, fields) in &self.required_fields {
            if tool_pattern_matches(pattern, tool) {
                for f in fields {
                    if !out.contains(&f.as_str()) {
                        out.push(f);
                    }
                }
            }
        }
        out
    }

    fn scan(&self, value: &Value, caller: &str) -> Scan {
        let mut scan = Scan::default();
        scan_tenants(
            value,
            &self.tenant_field,
            caller,
            EMBEDDED_JSON_DEPTH,
            &mut scan,
        );
        scan
    }
}

/// A tool's output text with what it reads as JSON. Only [`ToolText::read`]
/// makes one, so the JSON the verifier scans for other tenants' rows is
/// always that of the text: no caller can hand it text unread.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolText<'a> {
    text: &'a str,
    json: Option<OutputJson>,
}

impl<'a> ToolText<'a> {
    pub fn read(text: &'a str) -> Self {
        Self {
            text,
            json: OutputJson::read(text),
        }
    }

    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The text as JSON, when it is JSON.
    pub fn json(&self) -> Option<&OutputJson> {
        self.json.as_ref()
    }

    /// The text as one JSON document, when it is one.
    pub fn whole(&self) -> Option<&Value> {
        self.json.as_ref().and_then(OutputJson::whole)
    }
}

/// A tool's output text read as JSON: one document, or JSON lines. Made
/// only through [`ToolText::read`].
#[derive(Debug, Clone, PartialEq)]
pub enum OutputJson {
    Whole(Value),
    Lines(Vec<Value>),
}

impl OutputJson {
    /// The text (trimmed) as one JSON document, else its lines that are
    /// JSON objects or arrays; `None` when it is neither. JSON lines count
    /// too, so a tool that streams rows one per line cannot leak another
    /// tenant's rows past the isolation check.
    fn read(output: &str) -> Option<Self> {
        let text = output.trim();
        if text.is_empty() {
            return None;
        }
        if let Ok(value) = serde_json::from_str::<Value>(text) {
            return Some(Self::Whole(value));
        }
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
            .filter(|v| v.is_object() || v.is_array())
            .collect();
        (!lines.is_empty()).then_some(Self::Lines(lines))
    }

    /// The text as one document, when it is one.
    pub fn whole(&self) -> Option<&Value> {
        match self {
            Self::Whole(v) => Some(v),
            Self::Lines(_) => None,
        }
    }

    fn values(&self) -> &[Value] {
        match self {
            Self::Whole(v) => std::slice::from_ref(v),
            Self::Lines(vs) => vs,
        }
    }
}

#[derive(Debug, Default)]
struct Scan {
    /// Objects carrying the tenant field.
    tagged: usize,
    /// Of those, the ones of another tenant.
    foreign: usize,
}

impl Scan {
    /// The same rows may arrive both structured and as text, so the larger
    /// count is kept rather than the sum.
    fn add(&mut self, other: Scan) {
        self.tagged = self.tagged.max(other.tagged);
        self.foreign = self.foreign.max(other.foreign);
    }
}

/// Iterative, so a deeply nested result cannot overflow the stack.
fn scan_tenants(value: &Value, field: &str, caller: &str, embedded: u32, scan: &mut Scan) {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                if let Some(tenant) = map.get(field) {
                    scan.tagged += 1;
                    if !same_tenant(tenant, caller) {
                        scan.foreign += 1;
                    }
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            Value::String(s) if embedded > 0 => {
                let t = s.trim_start();
                if (t.starts_with('{') || t.starts_with('['))
                    && let Ok(inner) = serde_json::from_str::<Value>(t)
                {
                    scan_tenants(&inner, field, caller, embedded - 1, scan);
                }
            }
            _ => {}
        }
    }
}

/// A missing or null tenant is not the caller's: isolation fails closed.
fn same_tenant(tenant: &Value, caller: &str) -> bool {
    match tenant {
        Value::String(s) => s == caller,
        Value::Number(n) => n.to_string() == caller,
        _ => false,
    }
}

fn rows(n: usize) -> String {
    if n == 1 {
        "1 row".into()
    } else {
        format!("{n} rows")
    }
}

fn schema_check(schema: &CompiledSchema, result: Option<&Value>) -> Check {
    let Some(value) = result else {
        return Check::new(RULE_SCHEMA, false, "output is not JSON");
    };
    let violations = schema.validate(value);
    if violations.is_empty() {
        return Check::new(RULE_SCHEMA, true, "output matches the output schema");
    }
    let mut detail = violations
        .iter()
        .take(MAX_LISTED)
        .map(|v| v.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if violations.len() > MAX_LISTED {
        detail.push_str(&format!("; and {} more", violations.len() - MAX_LISTED));
    }
    Check::new(RULE_SCHEMA, false, detail)
}

/// Null, blank text, `[]`, `{}`, or a single key holding only those
/// (`{"rows": []}`): shapes that mean "no data" however a tool wraps it.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => match map.len() {
            0 => true,
            1 => map.values().all(is_empty),
            _ => false,
        },
        Value::Bool(_) | Value::Number(_) => false,
    }
}

fn required_fields_check(fields: &[&str], result: Option<&Value>) -> Check {
    let Some(value) = result else {
        return Check::new(RULE_REQUIRED_FIELDS, false, "output is not JSON");
    };
    let rows_checked = result_rows(value, fields);
    let mut lacking_rows = 0;
    let mut lacking: Vec<(&str, usize)> = fields.iter().map(|f| (*f, 0)).collect();
    for row in &rows_checked {
        let mut row_lacks = false;
        for (field, count) in &mut lacking {
            if row.get(*field).is_none_or(Value::is_null) {
                *count += 1;
                row_lacks = true;
            }
        }
        if row_lacks {
            lacking_rows += 1;
        }
    }
    if lacking_rows == 0 {
        return Check::new(
            RULE_REQUIRED_FIELDS,
            true,
            format!("{} with {}", rows(rows_checked.len()), fields.join(", ")),
        );
    }
    let which = lacking
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(f, n)| format!("{f} ({n})"))
        .collect::<Vec<_>>()
        .join(", ");
    Check::new(
        RULE_REQUIRED_FIELDS,
        false,
        format!(
            "{lacking_rows} of {} lack required fields: {which}",
            rows(rows_checked.len())
        ),
    )
}

/// The rows a result holds: a top-level array's elements; an object that
/// has any required field itself; otherwise its first array field's
/// elements (`{"rows": [...]}`); otherwise the object itself.
fn result_rows<'a>(value: &'a Value, fields: &[&str]) -> Vec<&'a Value> {
    match value {
        Value::Array(items) => items.iter().collect(),
        Value::Object(map) => {
            if fields.iter().any(|f| map.contains_key(*f)) {
                return vec![value];
            }
            match map.values().find_map(Value::as_array) {
                Some(items) => items.iter().collect(),
                None => vec![value],
            }
        }
        other => vec![other],
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
