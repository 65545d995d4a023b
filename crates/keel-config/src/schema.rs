//! The shape of `keel.toml`, mirrored from `model.rs`, and the walk that
//! checks a tree against it. Walking ourselves, instead of letting serde
//! stop at the first unknown field, is what lets one pass report every
//! unknown key and wrong type in every section. A unit test keeps this
//! mirror and the model in step.

use crate::findings::Findings;
use crate::tree::{Entry, KeyPath, Node, Val};

#[derive(Debug)]
pub(crate) enum Ty {
    Str,
    Bool,
    /// A non-negative integer no larger than the bound.
    UInt(u64),
    Enum(&'static [&'static str]),
    /// An integer or a finite float.
    Number,
    List(&'static Ty),
    Table(&'static [Field]),
    /// An array of tables; `key` is the field that names an element, which
    /// environment overrides may use instead of an index.
    Tables {
        fields: &'static [Field],
        key: Option<&'static str>,
    },
    /// A table with free-form keys.
    Map(&'static Ty),
    /// Any value JSON can hold (JSON Schema documents).
    Json,
}

#[derive(Debug)]
pub(crate) struct Field {
    pub name: &'static str,
    pub ty: Ty,
    pub required: bool,
}

const fn opt(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        required: false,
    }
}

const fn req(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        required: true,
    }
}

const U32: Ty = Ty::UInt(u32::MAX as u64);
const U64: Ty = Ty::UInt(i64::MAX as u64);
const USIZE: Ty = Ty::UInt(if (usize::MAX as u64) < (i64::MAX as u64) {
    usize::MAX as u64
} else {
    i64::MAX as u64
});
const STRS: Ty = Ty::List(&Ty::Str);
const RISK: Ty = Ty::Enum(&["read", "write", "exec", "dangerous"]);

pub(crate) static ROOT: &[Field] = &[
    opt("server", Ty::Table(SERVER)),
    opt(
        "providers",
        Ty::Tables {
            fields: PROVIDER,
            key: Some("name"),
        },
    ),
    opt(
        "agents",
        Ty::Tables {
            fields: AGENT,
            key: Some("id"),
        },
    ),
    opt("tools", Ty::Table(TOOLS)),
    opt("verify", Ty::Table(VERIFY)),
    opt("policy", Ty::Table(POLICY)),
    opt(
        "hooks",
        Ty::Tables {
            fields: HOOK,
            key: Some("name"),
        },
    ),
    opt("auth", Ty::Table(AUTH)),
    opt("memory", Ty::Table(MEMORY)),
    opt("telemetry", Ty::Table(TELEMETRY)),
    opt(
        "channels",
        Ty::Tables {
            fields: CHANNEL,
            key: Some("id"),
        },
    ),
    opt("routing", Ty::Table(ROUTING)),
    opt(
        "tenants",
        Ty::Tables {
            fields: TENANT,
            key: Some("id"),
        },
    ),
];

static TENANT: &[Field] = &[
    req("id", Ty::Str),
    opt("max_concurrent_runs", U64),
    opt("runs_per_minute", U64),
    opt("tool_calls_per_day", U64),
    opt("tokens_per_day", U64),
    opt("spend_usd_per_day", Ty::Number),
    opt("spend_usd_per_month", Ty::Number),
];

static CHANNEL: &[Field] = &[
    req("id", Ty::Str),
    req("kind", Ty::Enum(&["telegram", "slack", "webhook"])),
    opt("tenant", Ty::Str),
    opt("bot_token_env", Ty::Str),
    opt("secret_token_env", Ty::Str),
    opt("signing_secret_env", Ty::Str),
    opt("api_base", Ty::Str),
    opt("approvers_chat", Ty::Str),
    opt("reply_url", Ty::Str),
];

static ROUTING: &[Field] = &[
    opt("default_agent", Ty::Str),
    opt(
        "dm_scope",
        Ty::Enum(&[
            "main",
            "per-peer",
            "per-channel-peer",
            "per-account-channel-peer",
        ]),
    ),
    opt(
        "bindings",
        Ty::Tables {
            fields: BINDING,
            key: None,
        },
    ),
    opt(
        "identity_links",
        Ty::Tables {
            fields: IDENTITY_LINK,
            key: Some("person"),
        },
    ),
    opt(
        "hooks",
        Ty::Tables {
            fields: DISPATCH_HOOK,
            key: None,
        },
    ),
];

static BINDING: &[Field] = &[
    req("agent", Ty::Str),
    req("channel", Ty::Str),
    opt("account", Ty::Str),
    opt("peer", Ty::Str),
    opt("guild", Ty::Str),
    opt("roles", STRS),
    opt("team", Ty::Str),
];

static IDENTITY_LINK: &[Field] = &[
    req("person", Ty::Str),
    opt("principal", Ty::Str),
    req(
        "identities",
        Ty::Tables {
            fields: CHANNEL_IDENTITY,
            key: None,
        },
    ),
];

static CHANNEL_IDENTITY: &[Field] = &[req("channel", Ty::Str), req("sender", Ty::Str)];

static DISPATCH_HOOK: &[Field] = &[
    req(
        "point",
        Ty::Enum(&[
            "message_received",
            "before_prompt_build",
            "before_tool_call",
        ]),
    ),
    req("url", Ty::Str),
    opt("timeout_ms", Ty::UInt(60_000)),
    opt("secret_env", Ty::Str),
    opt("channels", STRS),
    opt("tools", STRS),
];

static TELEMETRY: &[Field] = &[
    opt("otlp_endpoint", Ty::Str),
    opt("capture_content", Ty::Bool),
    opt("service_name", Ty::Str),
];

static MEMORY: &[Field] = &[
    opt("embedder", Ty::Enum(&["local", "openai", "none"])),
    opt("model_dir", Ty::Str),
    opt("embeddings_base_url", Ty::Str),
    opt("embeddings_model", Ty::Str),
    opt("api_key_env", Ty::Str),
    opt("chunk_tokens", USIZE),
    opt("chunk_overlap", USIZE),
    opt("text_weight", Ty::Number),
    opt("vector_weight", Ty::Number),
    opt("mmr_lambda", Ty::Number),
    opt("time_decay_half_life_days", Ty::Number),
    opt("summary_fallback_messages", USIZE),
];

static SERVER: &[Field] = &[
    opt("bind", Ty::Str),
    opt("data_dir", Ty::Str),
    opt("database_url", Ty::Str),
    opt("max_body_bytes", USIZE),
    opt("node_id", Ty::Str),
    opt("lease_s", U64),
];

static PROVIDER: &[Field] = &[
    req("name", Ty::Str),
    req("kind", Ty::Enum(&["openai", "anthropic", "local"])),
    opt("base_url", Ty::Str),
    opt("api_key_env", Ty::Str),
    req("model", Ty::Str),
    opt("context_window", U64),
    opt("tool_mode", Ty::Enum(&["native", "json"])),
    opt("stream", Ty::Bool),
    opt("timeout_s", U64),
    opt("max_retries", U32),
    opt("backoff_ms", U64),
    opt("max_concurrent_requests", U32),
    opt("model_path", Ty::Str),
    opt("threads", U32),
    opt("requantize_q4_1", Ty::Bool),
    opt("max_output_tokens", U32),
    opt("price", Ty::Table(PRICE)),
];

static PRICE: &[Field] = &[
    req("input_usd_per_mtok", Ty::Number),
    req("output_usd_per_mtok", Ty::Number),
];

static AGENT: &[Field] = &[
    req("id", Ty::Str),
    req("provider", Ty::Str),
    opt("system_prompt", Ty::Str),
    opt("tools", STRS),
    opt("routing", Ty::Enum(&["single_loop", "pre_route"])),
    opt("limits", Ty::Table(LIMITS)),
    opt("on_clarify_exhausted", Ty::Enum(&["fallback", "handoff"])),
    opt("loop_detection", Ty::Table(LOOP_DETECTION)),
    opt("drift", Ty::Table(DRIFT)),
    opt("compaction", Ty::Table(COMPACTION)),
    opt("success_criterion", Ty::Str),
    opt("spend_usd_per_day", Ty::Number),
    opt("spend_usd_per_month", Ty::Number),
];

static LIMITS: &[Field] = &[
    opt("max_steps", U32),
    opt("max_tool_calls", U32),
    opt("max_wall_time_s", U64),
    opt("max_clarify_rounds", U32),
    opt("max_tokens", U64),
    opt("max_context_chars", U64),
    opt("max_repairs", U32),
    opt("max_tool_output_chars", USIZE),
];

static LOOP_DETECTION: &[Field] = &[
    opt("enabled", Ty::Bool),
    opt("repeat_warning", U32),
    opt("repeat_critical", U32),
    opt("max_tool_calls_breaker", U32),
    opt("poll_warning", U32),
    opt("poll_critical", U32),
    opt("ping_pong_warning", U32),
    opt("ping_pong_critical", U32),
    opt("identical_outcomes_breaker", U32),
    opt("unknown_tool_warning", U32),
    opt("unknown_tool_critical", U32),
    opt("error_streak_warning", U32),
    opt("error_streak_critical", U32),
];

static DRIFT: &[Field] = &[
    opt("enabled", Ty::Bool),
    opt("reflection_interval", U32),
    opt("checkpoint_interval", U32),
    opt("threshold", Ty::Number),
    opt("window", U32),
    opt("expected_tool_calls", U32),
    opt("expected_tools", U32),
    opt("context_reset", Ty::Bool),
    opt("max_context_resets", U32),
    opt("restore_on_deep_drift", Ty::Bool),
    opt("deep_drift_threshold", Ty::Number),
];

static COMPACTION: &[Field] = &[
    opt("enabled", Ty::Bool),
    opt("threshold", Ty::Number),
    opt("keep_recent_messages", U32),
    opt("default_context_window", U64),
];

static TOOLS: &[Field] = &[
    opt(
        "mcp",
        Ty::Tables {
            fields: MCP,
            key: Some("name"),
        },
    ),
    opt(
        "http",
        Ty::Tables {
            fields: HTTP,
            key: Some("name"),
        },
    ),
    opt("overrides", Ty::Map(&Ty::Table(OVERRIDE))),
    opt("web_fetch", Ty::Table(WEB_FETCH)),
    opt("exec", Ty::Table(EXEC)),
];

static EXEC: &[Field] = &[
    opt("enabled", Ty::Bool),
    opt(
        "programs",
        Ty::Tables {
            fields: EXEC_PROGRAM,
            key: Some("path"),
        },
    ),
    opt("read_paths", STRS),
    opt("write_paths", STRS),
    opt("timeout_s", U64),
    opt("max_output_bytes", USIZE),
    opt("requires_approval", Ty::Bool),
];

static EXEC_PROGRAM: &[Field] = &[req("path", Ty::Str), opt("args", STRS)];

static WEB_FETCH: &[Field] = &[
    opt("enabled", Ty::Bool),
    opt("allow_hosts", STRS),
    opt("allow_private", Ty::Bool),
    opt("max_bytes", USIZE),
    opt("timeout_s", U64),
    opt("max_redirects", Ty::UInt(u8::MAX as u64)),
];

static MCP: &[Field] = &[
    req("name", Ty::Str),
    opt("command", Ty::Str),
    opt("args", STRS),
    opt("env", Ty::Map(&Ty::Str)),
    opt("url", Ty::Str),
    opt("timeout_s", U64),
    opt("risk", RISK),
    opt("requires_approval", Ty::Bool),
    opt("output_trust", Ty::Enum(&["trusted", "untrusted"])),
];

static HTTP: &[Field] = &[
    req("name", Ty::Str),
    req("description", Ty::Str),
    opt("method", Ty::Str),
    req("url", Ty::Str),
    opt("parameters", Ty::Json),
    opt("headers", Ty::Map(&Ty::Str)),
    opt("output_schema", Ty::Json),
    opt("risk", RISK),
    opt("requires_approval", Ty::Bool),
    opt("output_trust", Ty::Enum(&["trusted", "untrusted"])),
    opt("idempotent", Ty::Bool),
    opt("timeout_s", U64),
    opt("roles", STRS),
    opt("poll", Ty::Bool),
    opt("max_concurrent_calls", U32),
];

static OVERRIDE: &[Field] = &[
    opt("risk", RISK),
    opt("requires_approval", Ty::Bool),
    opt("output_trust", Ty::Enum(&["trusted", "untrusted"])),
    opt("idempotent", Ty::Bool),
    opt("timeout_s", U64),
    opt("roles", STRS),
    opt("poll", Ty::Bool),
    opt("volatile_fields", STRS),
];

static VERIFY: &[Field] = &[
    opt("tenant_field", Ty::Str),
    opt("non_empty", Ty::Bool),
    opt("required_fields", Ty::Map(&STRS)),
];

const UNTRUSTED: Ty = Ty::Enum(&["allow", "approve", "deny"]);

const DECISION: Ty = Ty::Enum(&["execute", "clarify", "approve", "deny"]);

static POLICY: &[Field] = &[
    opt("default", Ty::Enum(&["execute", "deny"])),
    opt("approval_risk", RISK),
    opt("approval_timeout_s", U64),
    opt("see_but_ask", Ty::Bool),
    opt("untrusted_arguments", UNTRUSTED),
    opt("untrusted_arguments_min_risk", RISK),
    opt(
        "rules",
        Ty::Tables {
            fields: POLICY_RULE,
            key: Some("name"),
        },
    ),
];

static POLICY_RULE: &[Field] = &[
    req("name", Ty::Str),
    opt("tools", STRS),
    opt("roles", STRS),
    opt("tenants", STRS),
    opt("min_risk", RISK),
    opt("when_arguments", Ty::Map(&Ty::Table(ARG_MATCHER))),
    opt("max_calls_per_run", U32),
    opt("min_confidence", Ty::Number),
    opt("untrusted_arguments", UNTRUSTED),
    opt("arguments", STRS),
    req("decision", DECISION),
    opt("reason", Ty::Str),
];

static ARG_MATCHER: &[Field] = &[
    opt("pattern", Ty::Str),
    opt("not_pattern", Ty::Str),
    opt("one_of", Ty::List(&Ty::Json)),
    opt("not_one_of", Ty::List(&Ty::Json)),
    opt("min", Ty::Number),
    opt("max", Ty::Number),
];

static HOOK: &[Field] = &[
    opt("name", Ty::Str),
    opt("tools", STRS),
    req(
        "kind",
        Ty::Enum(&["inject_tenant", "default", "deny_pattern"]),
    ),
    req("argument", Ty::Str),
    opt("value", Ty::Json),
    opt("pattern", Ty::Str),
    opt("reason", Ty::Str),
];

static AUTH: &[Field] = &[
    opt(
        "keys",
        Ty::Tables {
            fields: API_KEY,
            key: None,
        },
    ),
    opt("approver_roles", STRS),
];

static API_KEY: &[Field] = &[
    req("key_env", Ty::Str),
    req("tenant", Ty::Str),
    req("principal", Ty::Str),
    opt("roles", STRS),
];

impl Ty {
    pub(crate) fn describe(&self) -> String {
        match self {
            Ty::Str => "a string".into(),
            Ty::Bool => "a boolean".into(),
            Ty::UInt(max) => format!("an integer from 0 to {max}"),
            Ty::Number => "a number".into(),
            Ty::Enum(names) => format!(
                "one of {}",
                names
                    .iter()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Ty::List(item) => format!("an array of {}", plural(item)),
            Ty::Table(_) | Ty::Map(_) => "a table".into(),
            Ty::Tables { .. } => "an array of tables".into(),
            Ty::Json => "a JSON value".into(),
        }
    }

    /// Whether an environment override for this type is taken verbatim
    /// rather than parsed as a TOML value.
    pub(crate) fn is_textual(&self) -> bool {
        matches!(self, Ty::Str | Ty::Enum(_))
    }
}

fn plural(ty: &Ty) -> String {
    match ty {
        Ty::Str => "strings".into(),
        other => other.describe(),
    }
}

pub(crate) fn field<'a>(fields: &'a [Field], name: &str) -> Option<&'a Field> {
    fields.iter().find(|f| f.name == name)
}

/// Checks the whole document, reporting every problem and removing what is
/// wrong so that the rest can still be deserialized and cross-checked.
pub(crate) fn check_root(root: &mut Node, found: &mut Findings) {
    let path = KeyPath::root();
    found.record(&path, &root.origin);
    check_table_fields(root, ROOT, &path, found);
}

/// Returns whether the node may stay; a `false` node has been reported.
fn check(node: &mut Node, ty: &Ty, path: &KeyPath, found: &mut Findings) -> bool {
    found.record(path, &node.origin);
    let ok = match (ty, &mut node.value) {
        (Ty::Str, Val::Str(_)) | (Ty::Bool, Val::Bool(_)) => true,
        (Ty::UInt(max), Val::Int(n)) => {
            if *n < 0 || *n > i128::from(*max) {
                found.error(
                    path,
                    Some(&node.origin),
                    format!("expected {}, found integer {n}", ty.describe()),
                );
                return false;
            }
            true
        }
        (Ty::Number, Val::Int(n)) => {
            if i64::try_from(*n).is_err() {
                found.error(
                    path,
                    Some(&node.origin),
                    format!("integer {n} is out of range"),
                );
                return false;
            }
            true
        }
        (Ty::Number, Val::Float(f)) => {
            if !f.is_finite() {
                found.error(
                    path,
                    Some(&node.origin),
                    format!("{f} is not a finite number"),
                );
                return false;
            }
            true
        }
        (Ty::Enum(names), Val::Str(s)) => {
            if !names.contains(&s.as_str()) {
                let message = format!("expected {}, found {s:?}", ty.describe());
                found.error(path, Some(&node.origin), message);
                return false;
            }
            true
        }
        (Ty::List(item), Val::Array(items)) => {
            let mut i = 0;
            items.retain_mut(|n| {
                let keep = check(n, item, &path.index(i), found);
                i += 1;
                keep
            });
            true
        }
        (Ty::Table(fields), Val::Table(_)) => {
            check_table_fields(node, fields, path, found);
            true
        }
        (Ty::Tables { fields, .. }, Val::Array(items)) => {
            for (i, item) in items.iter_mut().enumerate() {
                let item_path = path.index(i);
                if matches!(item.value, Val::Table(_)) {
                    found.record(&item_path, &item.origin);
                    check_table_fields(item, fields, &item_path, found);
                } else {
                    let message = format!("expected a table, found {}", item.describe());
                    found.error(&item_path, Some(&item.origin), message);
                    // Keep the element so later indices stay as written.
                    item.value = Val::Table(Vec::new());
                    found.mark_invalid(&item_path);
                    check_table_fields(item, fields, &item_path, found);
                }
            }
            true
        }
        (Ty::Map(value_ty), Val::Table(entries)) => {
            entries.retain_mut(|e| check(&mut e.node, value_ty, &path.key(&e.key), found));
            true
        }
        (Ty::Json, _) => check_json(node, path, found),
        _ => false,
    };
    if !ok && !matches!(ty, Ty::Json) {
        let message = format!("expected {}, found {}", ty.describe(), node.describe());
        found.error(path, Some(&node.origin), message);
    }
    ok
}

fn check_json(node: &Node, path: &KeyPath, found: &mut Findings) -> bool {
    match &node.value {
        Val::Datetime(_) => {
            found.error(
                path,
                Some(&node.origin),
                "a TOML datetime has no JSON form; quote it as a string".into(),
            );
            false
        }
        Val::Float(f) if !f.is_finite() => {
            found.error(path, Some(&node.origin), format!("{f} has no JSON form"));
            false
        }
        Val::Int(n) if i64::try_from(*n).is_err() => {
            found.error(
                path,
                Some(&node.origin),
                format!("integer {n} is out of range"),
            );
            false
        }
        Val::Array(items) => {
            let mut ok = true;
            for (i, item) in items.iter().enumerate() {
                ok &= check_json(item, &path.index(i), found);
            }
            ok
        }
        Val::Table(entries) => {
            let mut ok = true;
            for e in entries {
                ok &= check_json(&e.node, &path.key(&e.key), found);
            }
            ok
        }
        _ => true,
    }
}

fn check_table_fields(
    node: &mut Node,
    fields: &'static [Field],
    path: &KeyPath,
    found: &mut Findings,
) {
    let table_origin = node.origin.clone();
    let Val::Table(entries) = &mut node.value else {
        return;
    };
    let mut kept: Vec<Entry> = Vec::with_capacity(entries.len());
    let mut broken: Vec<&'static Field> = Vec::new();
    for mut entry in std::mem::take(entries) {
        let key_path = path.key(&entry.key);
        let Some(field) = field(fields, &entry.key) else {
            let message = unknown_key_message(&entry.key, fields);
            found.error(&key_path, Some(&entry.node.origin), message);
            continue;
        };
        if check(&mut entry.node, &field.ty, &key_path, found) {
            kept.push(entry);
        } else if field.required {
            broken.push(field);
        }
    }
    for field in fields.iter().filter(|f| f.required) {
        let key_path = path.key(field.name);
        let broken_here = broken.iter().any(|b| b.name == field.name);
        if !broken_here && !kept.iter().any(|e| e.key == field.name) {
            found.error(
                &key_path,
                Some(&table_origin),
                format!("missing required key \"{}\"", field.name),
            );
        } else if !broken_here {
            continue;
        }
        // A placeholder lets the element deserialize so its other keys are
        // still cross-checked; the key is marked so nothing reports it twice.
        if let Some(value) = placeholder(&field.ty) {
            found.mark_invalid(&key_path);
            kept.push(Entry {
                key: field.name.to_string(),
                node: Node::new(value, table_origin.clone()),
            });
        }
    }
    *entries = kept;
}

fn placeholder(ty: &Ty) -> Option<Val> {
    match ty {
        Ty::Str => Some(Val::Str(String::new())),
        Ty::Enum(names) => names.first().map(|n| Val::Str((*n).to_string())),
        _ => None,
    }
}

pub(crate) fn unknown_key_message(key: &str, fields: &[Field]) -> String {
    let mut message = format!("unknown key \"{key}\"");
    if looks_secret(key) {
        let env_field = fields
            .iter()
            .find(|f| f.name == format!("{key}_env"))
            .or_else(|| fields.iter().find(|f| f.name.ends_with("_env")));
        match env_field {
            Some(f) => message.push_str(&format!(
                "; secrets are read from env: use {} = \"VAR_NAME\"",
                f.name
            )),
            None => message.push_str(
                "; secrets are read from env: reference them as ${VAR} where a value allows it",
            ),
        }
        return message;
    }
    match closest(key, fields) {
        Some(name) => message.push_str(&format!(" (did you mean \"{name}\"?)")),
        None => message.push_str(&format!(
            " (known: {})",
            fields.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
        )),
    }
    message
}

fn looks_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    !k.ends_with("_env")
        && ["key", "token", "secret", "password", "passwd"]
            .iter()
            .any(|s| k.contains(s))
}

fn closest<'a>(key: &str, fields: &'a [Field]) -> Option<&'a str> {
    fields
        .iter()
        .map(|f| (edit_distance(key, f.name), f.name))
        .filter(|(d, name)| *d <= (name.len().max(key.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, name)| name)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::*;
    use crate::model::*;

    /// Every field the model serializes must be in the schema with a type
    /// that accepts its value; together with `deny_unknown_fields` in the
    /// model (which rejects schema fields the model lacks) this keeps the
    /// mirror honest.
    #[test]
    fn schema_matches_model() {
        let config = Config {
            server: ServerConfig {
                database_url: Some("sqlite://x".into()),
                node_id: Some("node-a".into()),
                ..ServerConfig::default()
            },
            providers: vec![ProviderConfig {
                name: "p".into(),
                kind: ProviderKind::Anthropic,
                base_url: Some("http://x".into()),
                api_key_env: Some("K".into()),
                model: "m".into(),
                context_window: Some(1),
                tool_mode: ToolMode::Json,
                stream: false,
                timeout_s: 1,
                max_retries: 1,
                backoff_ms: 1,
                max_concurrent_requests: 1,
                model_path: Some("m.gguf".into()),
                threads: Some(2),
                requantize_q4_1: Some(false),
                max_output_tokens: Some(64),
                price: Some(crate::spend::Price {
                    input_usd_per_mtok: 1.0,
                    output_usd_per_mtok: 2.0,
                }),
            }],
            agents: vec![AgentConfig {
                id: "a".into(),
                provider: "p".into(),
                system_prompt: "s".into(),
                tools: vec!["t".into()],
                routing: Routing::PreRoute,
                limits: Limits::default(),
                on_clarify_exhausted: OnClarifyExhausted::Handoff,
                loop_detection: LoopDetection::default(),
                drift: Drift::default(),
                compaction: Compaction::default(),
                success_criterion: Some("c".into()),
                spend_usd_per_day: Some(1.0),
                spend_usd_per_month: Some(2.0),
            }],
            tools: ToolsConfig {
                mcp: vec![McpServerConfig {
                    name: "m".into(),
                    command: Some("c".into()),
                    args: vec!["a".into()],
                    env: [("A".to_string(), "b".to_string())].into(),
                    url: Some("http://u".into()),
                    timeout_s: 1,
                    risk: Some(keel_protocol::Risk::Read),
                    requires_approval: Some(true),
                    output_trust: Some(keel_protocol::Trust::Trusted),
                }],
                http: vec![HttpToolConfig {
                    name: "h".into(),
                    description: "d".into(),
                    method: "GET".into(),
                    url: "http://u".into(),
                    parameters: serde_json::json!({"type": "object"}),
                    headers: [("A".to_string(), "b".to_string())].into(),
                    output_schema: Some(serde_json::json!({"type": "object"})),
                    risk: Some(keel_protocol::Risk::Exec),
                    requires_approval: Some(true),
                    output_trust: Some(keel_protocol::Trust::Trusted),
                    idempotent: Some(true),
                    timeout_s: Some(1),
                    roles: Some(vec!["r".into()]),
                    poll: Some(true),
                    max_concurrent_calls: Some(1),
                }],
                overrides: [(
                    "x.y".to_string(),
                    ToolOverride {
                        risk: Some(keel_protocol::Risk::Write),
                        requires_approval: Some(true),
                        output_trust: Some(keel_protocol::Trust::Trusted),
                        idempotent: Some(true),
                        timeout_s: Some(1),
                        roles: Some(vec!["r".into()]),
                        poll: Some(true),
                        volatile_fields: Some(vec!["v".into()]),
                    },
                )]
                .into(),
                exec: ExecConfig {
                    enabled: true,
                    programs: vec![ExecProgram {
                        path: "/usr/bin/ls".into(),
                        args: vec!["^-l$".into()],
                    }],
                    read_paths: vec!["/data".into()],
                    write_paths: vec!["/data/out".into()],
                    timeout_s: 1,
                    max_output_bytes: 1,
                    requires_approval: false,
                },
                web_fetch: WebFetchConfig {
                    enabled: true,
                    allow_hosts: vec!["docs.internal".into()],
                    allow_private: true,
                    max_bytes: 1,
                    timeout_s: 1,
                    max_redirects: 1,
                },
            },
            verify: VerifyConfig {
                tenant_field: "org".into(),
                non_empty: false,
                required_fields: [("x.*".to_string(), vec!["id".to_string()])].into(),
            },
            policy: PolicyConfig {
                default: DefaultDecision::Deny,
                approval_risk: keel_protocol::Risk::Write,
                approval_timeout_s: 1,
                see_but_ask: true,
                untrusted_arguments: UntrustedArguments::Deny,
                untrusted_arguments_min_risk: keel_protocol::Risk::Exec,
                rules: vec![PolicyRule {
                    name: "r".into(),
                    tools: vec!["t*".into()],
                    roles: vec!["r".into()],
                    tenants: vec!["t".into()],
                    min_risk: Some(keel_protocol::Risk::Exec),
                    when_arguments: [(
                        "a".to_string(),
                        ArgMatcher {
                            pattern: Some("^x".into()),
                            not_pattern: Some("y$".into()),
                            one_of: Some(vec![serde_json::json!("a"), serde_json::json!(2)]),
                            not_one_of: Some(vec![serde_json::json!("b")]),
                            min: Some(1.5),
                            max: Some(10.0),
                        },
                    )]
                    .into(),
                    max_calls_per_run: Some(3),
                    min_confidence: Some(0.7),
                    untrusted_arguments: Some(UntrustedArguments::Allow),
                    arguments: vec!["a".into()],
                    decision: RuleDecision::Approve,
                    reason: Some("why".into()),
                }],
            },
            hooks: vec![HookConfig {
                name: Some("h".into()),
                tools: vec!["t".into()],
                kind: HookKind::DenyPattern,
                argument: "a".into(),
                value: Some(serde_json::json!({"k": [1, "v"]})),
                pattern: Some("p".into()),
                reason: Some("r".into()),
            }],
            auth: AuthConfig {
                keys: vec![ApiKeyConfig {
                    key_env: "K".into(),
                    tenant: "t".into(),
                    principal: "p".into(),
                    roles: vec!["r".into()],
                }],
                approver_roles: vec!["r".into()],
            },
            memory: MemoryConfig {
                embedder: EmbedderKind::Openai,
                model_dir: Some("/m".into()),
                embeddings_base_url: Some("http://e/v1".into()),
                embeddings_model: Some("e".into()),
                api_key_env: Some("K".into()),
                chunk_tokens: 100,
                chunk_overlap: 10,
                text_weight: 0.5,
                vector_weight: 0.5,
                mmr_lambda: 0.9,
                time_decay_half_life_days: 30.0,
                summary_fallback_messages: 5,
            },
            telemetry: TelemetryConfig {
                otlp_endpoint: Some("http://c:4318".into()),
                capture_content: true,
                service_name: "s".into(),
            },
            channels: vec![ChannelConfig {
                id: "c".into(),
                kind: ChannelKind::Webhook,
                tenant: "t".into(),
                bot_token_env: Some("B".into()),
                secret_token_env: Some("S".into()),
                signing_secret_env: Some("G".into()),
                api_base: Some("http://a".into()),
                approvers_chat: Some("x".into()),
                reply_url: Some("http://r".into()),
            }],
            routing: RoutingConfig {
                default_agent: Some("a".into()),
                dm_scope: DmScope::PerAccountChannelPeer,
                bindings: vec![RouteBinding {
                    agent: "a".into(),
                    channel: "c".into(),
                    account: Some("*".into()),
                    peer: Some("p".into()),
                    guild: Some("g".into()),
                    roles: vec!["r".into()],
                    team: Some("t".into()),
                }],
                identity_links: vec![IdentityLink {
                    person: "alice".into(),
                    principal: Some("alice".into()),
                    identities: vec![ChannelIdentity {
                        channel: "c".into(),
                        sender: "1".into(),
                    }],
                }],
                hooks: vec![DispatchHook {
                    point: HookPoint::BeforePromptBuild,
                    url: "http://127.0.0.1:9/context".into(),
                    timeout_ms: 500,
                    secret_env: Some("HOOK_SECRET".into()),
                    channels: vec!["c".into()],
                    tools: vec!["plant.*".into()],
                }],
            },
            tenants: vec![crate::tenants::TenantConfig {
                id: "t".into(),
                max_concurrent_runs: Some(1),
                runs_per_minute: Some(2),
                tool_calls_per_day: Some(3),
                tokens_per_day: Some(4),
                spend_usd_per_day: Some(5.0),
                spend_usd_per_month: Some(6.0),
            }],
        };
        let text = toml::to_string(&config).unwrap();
        let doc = toml::de::DeTable::parse(&text).unwrap();
        let lines = crate::tree::Lines::new(&text);
        let mut root = crate::tree::from_document(&doc, &lines);
        let mut found = Findings::new("t.toml");
        check_root(&mut root, &mut found);
        let problems = found.into_problems();
        assert!(problems.is_empty(), "{problems:?}\n{text}");
        let back: Config = root.to_toml().try_into().unwrap();
        assert_eq!(back, config);
    }

    #[test]
    fn unknown_key_hints() {
        assert!(unknown_key_message("bnd", SERVER).contains("did you mean \"bind\""));
        assert!(unknown_key_message("zzzzzz", SERVER).contains("known: bind, data_dir"));
        assert!(unknown_key_message("api_key", PROVIDER).contains("use api_key_env"));
        assert!(unknown_key_message("key", API_KEY).contains("use key_env"));
        assert!(unknown_key_message("token", HTTP).contains("${VAR}"));
    }
}
