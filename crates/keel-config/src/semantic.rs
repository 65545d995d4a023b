//! Checks that need the whole configuration: names that must be unique,
//! references between sections, and values whose type is right but whose
//! content cannot work.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::Value;

use crate::env::{Env, referenced_vars};
use crate::findings::Findings;
use crate::model::{Config, HttpToolConfig, ProviderKind, tool_pattern_matches};
use crate::tree::KeyPath;

/// Tools keel itself provides (SPEC §5); agents may name them without any
/// configuration.
pub const BUILTIN_TOOLS: &[&str] = &["memory_search", "memory_get", "web_fetch", "exec"];

const HTTP_METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"];

mod gateway;
mod guards;

pub(crate) fn check(config: &Config, env: &dyn Env, found: &mut Findings) {
    check_server(config, found);
    check_providers(config, env, found);
    check_tools(config, env, found);
    check_agents(config, found);
    guards::check(config, found);
    check_auth(config, env, found);
    check_memory(config, env, found);
    gateway::check(config, env, found);
    check_tenants(config, found);
    check_spend(config, found);
    if let Some(url) = &config.telemetry.otlp_endpoint {
        check_http_url(found, &root("telemetry").key("otlp_endpoint"), url);
    }
}

fn root(section: &str) -> KeyPath {
    KeyPath::root().key(section)
}

fn check_server(config: &Config, found: &mut Findings) {
    let server = root("server");
    let bind = &config.server.bind;
    if !valid_bind(bind) {
        found.error_at(
            &server.key("bind"),
            format!(
                "{bind:?} is not a listen address (expected host:port, e.g. \"127.0.0.1:8780\")"
            ),
        );
    }
    if let Some(url) = &config.server.database_url {
        let key = server.key("database_url");
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                found.error_at(&key, "sqlite:// URL has no file path".into());
            }
        } else if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            found.error_at(
                &key,
                format!("{url:?} is neither a sqlite:// nor a postgres:// (postgresql://) URL"),
            );
        }
    }
    if config.server.lease_s == 0 {
        found.error_at(
            &server.key("lease_s"),
            "must be at least 1 (seconds)".into(),
        );
    }
    if let Some(node) = &config.server.node_id
        && (node.is_empty() || node.contains(char::is_whitespace))
    {
        found.error_at(
            &server.key("node_id"),
            "must be a non-empty name without spaces".into(),
        );
    }
    if config.server.data_dir.is_empty() {
        found.error_at(&server.key("data_dir"), "must not be empty".into());
    }
}

fn valid_bind(bind: &str) -> bool {
    if bind.parse::<SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = bind.rsplit_once(':') else {
        return false;
    };
    port.parse::<u16>().is_ok()
        && !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn check_providers(config: &Config, env: &dyn Env, found: &mut Findings) {
    let names: Vec<&str> = config.providers.iter().map(|p| p.name.as_str()).collect();
    unique_names(found, "providers", "name", "provider name", &names);
    for (i, p) in config.providers.iter().enumerate() {
        let at = root("providers").index(i);
        if let Some(url) = &p.base_url {
            check_http_url(found, &at.key("base_url"), url);
        }
        if let Some(var) = &p.api_key_env {
            check_env_var_named(
                found,
                env,
                &at.key("api_key_env"),
                var,
                "the provider's API key",
            );
        }
        if p.model.is_empty() && !found.is_invalid(&at.key("model")) {
            found.error_at(&at.key("model"), "must not be empty".into());
        }
        if p.max_concurrent_requests == 0 {
            found.error_at(
                &at.key("max_concurrent_requests"),
                "must be at least 1: no request could ever be sent".into(),
            );
        }
    }
}

fn check_agents(config: &Config, found: &mut Findings) {
    let ids: Vec<&str> = config.agents.iter().map(|a| a.id.as_str()).collect();
    unique_names(found, "agents", "id", "agent id", &ids);
    let providers: Vec<&str> = config
        .providers
        .iter()
        .map(|p| p.name.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    for (i, agent) in config.agents.iter().enumerate() {
        let at = root("agents").index(i);
        let provider_key = at.key("provider");
        if !found.is_invalid(&provider_key) && !providers.contains(&agent.provider.as_str()) {
            let known = if providers.is_empty() {
                "none are configured".to_string()
            } else {
                format!("known: {}", providers.join(", "))
            };
            found.error_at(
                &provider_key,
                format!("no provider named {:?} ({known})", agent.provider),
            );
        }
        let limits = at.key("limits");
        if agent.limits.max_steps == 0 {
            found.error_at(&limits.key("max_steps"), "must be at least 1".into());
        }
        check_loop_detection(found, &at.key("loop_detection"), &agent.loop_detection);
        check_course(found, &at, agent);
        for (j, pattern) in agent.tools.iter().enumerate() {
            if !pattern_is_known(config, pattern) {
                found.warning_at(
                    &at.key("tools").index(j),
                    format!(
                        "pattern {pattern:?} matches no configured http tool, mcp server or built-in tool"
                    ),
                );
            }
        }
    }
}

/// Each detector's block must not come before its warning; 0 turns a
/// level off, so a critical of 0 is no contradiction.
fn check_loop_detection(found: &mut Findings, at: &KeyPath, ld: &crate::model::LoopDetection) {
    let pairs = [
        ("repeat", ld.repeat_warning, ld.repeat_critical),
        ("poll", ld.poll_warning, ld.poll_critical),
        ("ping_pong", ld.ping_pong_warning, ld.ping_pong_critical),
        (
            "unknown_tool",
            ld.unknown_tool_warning,
            ld.unknown_tool_critical,
        ),
        (
            "error_streak",
            ld.error_streak_warning,
            ld.error_streak_critical,
        ),
    ];
    for (name, warning, critical) in pairs {
        if critical != 0 && critical < warning {
            found.error_at(
                &at.key(&format!("{name}_critical")),
                format!(
                    "{name}_critical ({critical}) is less than {name}_warning ({warning}): the block would come before the warning"
                ),
            );
        }
    }
}

/// Scores and shares are fractions; a compaction threshold of 0 or 1 would
/// compact every step or only once the provider already refuses the prompt.
fn check_course(found: &mut Findings, at: &KeyPath, agent: &crate::model::AgentConfig) {
    let drift = at.key("drift");
    for (name, v) in [
        ("threshold", agent.drift.threshold),
        ("deep_drift_threshold", agent.drift.deep_drift_threshold),
    ] {
        if !(0.0..=1.0).contains(&v) {
            found.error_at(
                &drift.key(name),
                format!("must be between 0 and 1, not {v}"),
            );
        }
    }
    if agent.drift.deep_drift_threshold > agent.drift.threshold {
        found.error_at(
            &drift.key("deep_drift_threshold"),
            format!(
                "deep_drift_threshold ({}) is above threshold ({}): deep drift must be the worse case",
                agent.drift.deep_drift_threshold, agent.drift.threshold
            ),
        );
    }
    let c = agent.compaction.threshold;
    if c.is_nan() || c <= 0.05 || c >= 1.0 {
        found.error_at(
            &at.key("compaction").key("threshold"),
            format!(
                "must be a share of the context window between 0.05 and 1 (exclusive), not {c}"
            ),
        );
    }
    if agent.compaction.default_context_window < 512 {
        found.error_at(
            &at.key("compaction").key("default_context_window"),
            "must be at least 512 tokens".into(),
        );
    }
}

/// Whether a tool pattern can match anything this configuration provides.
/// MCP servers list their tools only at runtime, so any name under a
/// server's prefix counts.
fn pattern_is_known(config: &Config, pattern: &str) -> bool {
    let fixed = config
        .tools
        .http
        .iter()
        .map(|h| h.name.as_str())
        .chain(BUILTIN_TOOLS.iter().copied());
    for name in fixed {
        if tool_pattern_matches(pattern, name) {
            return true;
        }
    }
    config.tools.mcp.iter().any(|server| {
        let prefix = format!("{}.", server.name);
        match pattern.split_once('*') {
            None => pattern.starts_with(&prefix) && pattern.len() > prefix.len(),
            Some((head, _)) => head.starts_with(&prefix) || prefix.starts_with(head),
        }
    })
}

fn check_tools(config: &Config, env: &dyn Env, found: &mut Findings) {
    let tools = root("tools");
    let mcp_names: Vec<&str> = config.tools.mcp.iter().map(|m| m.name.as_str()).collect();
    unique_names(found, "tools.mcp", "name", "mcp server name", &mcp_names);
    for (i, server) in config.tools.mcp.iter().enumerate() {
        let at = tools.key("mcp").index(i);
        if server.name.contains('.') {
            found.error_at(
                &at.key("name"),
                format!(
                    "{:?} contains '.', which separates the server prefix from the tool name",
                    server.name
                ),
            );
        }
        match (&server.command, &server.url) {
            (None, None) => found.error_at(
                &at,
                "needs either command (a stdio server) or url (a streamable HTTP server)".into(),
            ),
            (Some(_), Some(_)) => found.error_at(
                &at.key("url"),
                "has both command and url; set exactly one".into(),
            ),
            (Some(command), None) if command.trim().is_empty() => {
                found.error_at(&at.key("command"), "must not be empty".into());
            }
            (None, Some(url)) => check_http_url(found, &at.key("url"), url),
            _ => {}
        }
        for (name, value) in &server.env {
            check_template(found, env, &at.key("env").key(name), value);
        }
    }

    let http_names: Vec<&str> = config.tools.http.iter().map(|h| h.name.as_str()).collect();
    unique_names(found, "tools.http", "name", "http tool name", &http_names);
    for (i, tool) in config.tools.http.iter().enumerate() {
        check_http_tool(found, env, &tools.key("http").index(i), tool);
    }

    // Keys may be globs. MCP tools are only listed at runtime, so a key (or
    // glob) under a server's prefix counts as known even if no such tool
    // exists yet; only a key that can match nothing configured is reported.
    for key in config.tools.overrides.keys() {
        let at = tools.key("overrides").key(key);
        if key.is_empty() {
            found.error_at(&at, "an override key must name a tool or be a glob".into());
        } else if !pattern_is_known(config, key) {
            found.warning_at(
                &at,
                format!(
                    "{key:?} matches no http tool, built-in tool or tool under an mcp server's prefix"
                ),
            );
        }
    }
}

fn check_http_tool(found: &mut Findings, env: &dyn Env, at: &KeyPath, tool: &HttpToolConfig) {
    if tool.max_concurrent_calls == Some(0) {
        found.error_at(
            &at.key("max_concurrent_calls"),
            "must be at least 1: no call could ever be made".into(),
        );
    }
    if tool.name.contains('.') {
        found.error_at(
            &at.key("name"),
            format!(
                "{:?} contains '.', which is reserved for mcp server prefixes",
                tool.name
            ),
        );
    }
    if !HTTP_METHODS.contains(&tool.method.as_str()) {
        found.error_at(
            &at.key("method"),
            format!(
                "{:?} is not one of {}",
                tool.method,
                HTTP_METHODS.join(", ")
            ),
        );
    }
    let url_key = at.key("url");
    if !found.is_invalid(&url_key) {
        check_http_url(found, &url_key, &tool.url);
    }
    let properties = check_parameters(found, &at.key("parameters"), &tool.parameters);
    if tool.output_schema.as_ref().is_some_and(|s| !s.is_object()) {
        found.error_at(
            &at.key("output_schema"),
            "must be a JSON Schema object (a table)".into(),
        );
    }
    match url_params(&tool.url) {
        Ok(params) => {
            if let Some(properties) = properties {
                for param in params {
                    if !properties.contains_key(param) {
                        found.error_at(
                            &url_key,
                            format!("URL template names {{{param}}}, which is not in parameters.properties"),
                        );
                    }
                }
            }
        }
        Err(message) => found.error_at(&url_key, message),
    }
    for (name, value) in &tool.headers {
        check_template(found, env, &at.key("headers").key(name), value);
    }
}

/// Checks that `parameters` is a JSON Schema for an object and returns its
/// properties, if it has any that can be checked against.
fn check_parameters<'a>(
    found: &mut Findings,
    key: &KeyPath,
    parameters: &'a Value,
) -> Option<&'a serde_json::Map<String, Value>> {
    let Some(schema) = parameters.as_object() else {
        found.error_at(
            key,
            "must be a JSON Schema object (a table with type = \"object\")".into(),
        );
        return None;
    };
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        found.error_at(
            &key.key("type"),
            "tool parameters must be a JSON Schema with type = \"object\"".into(),
        );
    }
    let properties = match schema.get("properties") {
        None => None,
        Some(Value::Object(props)) => {
            for (name, prop) in props {
                if !prop.is_object() {
                    found.error_at(
                        &key.key("properties").key(name),
                        "must be a JSON Schema (a table)".into(),
                    );
                }
            }
            Some(props)
        }
        Some(_) => {
            found.error_at(
                &key.key("properties"),
                "must be a table of JSON Schemas".into(),
            );
            return None;
        }
    };
    match schema.get("required") {
        None => {}
        Some(Value::Array(names)) => {
            for (i, name) in names.iter().enumerate() {
                match name.as_str() {
                    Some(n) if properties.is_some_and(|p| p.contains_key(n)) => {}
                    Some(n) => found.warning_at(
                        &key.key("required").index(i),
                        format!("{n:?} is required but not in properties"),
                    ),
                    None => found.error_at(
                        &key.key("required").index(i),
                        "must be a property name (a string)".into(),
                    ),
                }
            }
        }
        Some(_) => found.error_at(
            &key.key("required"),
            "must be an array of property names".into(),
        ),
    }
    // With no `properties` at all, URL parameters cannot be checked; an
    // empty map makes every `{param}` an error, which is right.
    properties.or(Some(&EMPTY_PROPS))
}

static EMPTY_PROPS: std::sync::LazyLock<serde_json::Map<String, Value>> =
    std::sync::LazyLock::new(serde_json::Map::new);

/// The `{param}` names in a URL template.
fn url_params(url: &str) -> Result<Vec<&str>, String> {
    let mut params = Vec::new();
    let mut rest = url;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(format!("unclosed '{{' in URL template {url:?}"));
        };
        let name = &after[..close];
        if name.is_empty() || name.contains('{') {
            return Err(format!("malformed {{param}} in URL template {url:?}"));
        }
        params.push(name);
        rest = &after[close + 1..];
    }
    Ok(params)
}

fn check_auth(config: &Config, env: &dyn Env, found: &mut Findings) {
    for (i, key) in config.auth.keys.iter().enumerate() {
        let at = root("auth").key("keys").index(i);
        check_env_var_named(
            found,
            env,
            &at.key("key_env"),
            &key.key_env,
            "a keel API key",
        );
        for field in ["tenant", "principal"] {
            let value = if field == "tenant" {
                &key.tenant
            } else {
                &key.principal
            };
            let k = at.key(field);
            if value.is_empty() && !found.is_invalid(&k) {
                found.error_at(&k, "must not be empty".into());
            }
        }
    }
}

fn check_memory(config: &Config, env: &dyn Env, found: &mut Findings) {
    use crate::model::EmbedderKind;
    let m = &config.memory;
    let at = root("memory");
    if m.chunk_tokens == 0 {
        found.error_at(&at.key("chunk_tokens"), "must be at least 1".into());
    } else if m.chunk_overlap >= m.chunk_tokens {
        found.error_at(
            &at.key("chunk_overlap"),
            format!(
                "{} must be less than chunk_tokens ({})",
                m.chunk_overlap, m.chunk_tokens
            ),
        );
    }
    for (field, value) in [
        ("text_weight", m.text_weight),
        ("vector_weight", m.vector_weight),
        ("time_decay_half_life_days", m.time_decay_half_life_days),
    ] {
        if !value.is_finite() || value < 0.0 {
            found.error_at(&at.key(field), format!("{value} must be zero or more"));
        }
    }
    if m.text_weight + m.vector_weight <= 0.0 {
        found.error_at(
            &at.key("vector_weight"),
            "text_weight and vector_weight must not both be 0".into(),
        );
    }
    if !(0.0..=1.0).contains(&m.mmr_lambda) {
        found.error_at(
            &at.key("mmr_lambda"),
            format!("{} must be between 0 and 1", m.mmr_lambda),
        );
    }
    match m.embedder {
        EmbedderKind::Openai => {
            for (field, value) in [
                ("embeddings_base_url", &m.embeddings_base_url),
                ("embeddings_model", &m.embeddings_model),
            ] {
                if value.as_deref().is_none_or(str::is_empty) {
                    found.error_at(&at.key(field), "required when embedder = \"openai\"".into());
                }
            }
            if let Some(url) = &m.embeddings_base_url
                && !url.is_empty()
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                found.error_at(
                    &at.key("embeddings_base_url"),
                    format!("{url:?} is not an http:// or https:// URL"),
                );
            }
            if let Some(var) = &m.api_key_env {
                check_env_var_named(
                    found,
                    env,
                    &at.key("api_key_env"),
                    var,
                    "the embeddings API key",
                );
            }
        }
        EmbedderKind::Local => {
            if let Some(dir) = &m.model_dir
                && dir.is_empty()
            {
                found.error_at(&at.key("model_dir"), "must not be empty".into());
            }
        }
        EmbedderKind::None => {}
    }
}

/// A `*_env` field: the name must be usable, and an unset variable is worth
/// a warning at load time (the server decides whether it is fatal).
fn check_env_var_named(found: &mut Findings, env: &dyn Env, key: &KeyPath, var: &str, what: &str) {
    if found.is_invalid(key) {
        return;
    }
    if var.is_empty() || var.contains('=') || var.contains('\0') {
        found.error_at(key, format!("{var:?} is not an environment variable name"));
        return;
    }
    if env.var(var).is_none_or(|v| v.is_empty()) {
        found.warning_at(
            key,
            format!("environment variable {var} ({what}) is not set"),
        );
    }
}

fn check_template(found: &mut Findings, env: &dyn Env, key: &KeyPath, template: &str) {
    match referenced_vars(template) {
        Err(message) => found.error_at(key, message),
        Ok(vars) => {
            for var in vars {
                if env.var(var).is_none() {
                    found.warning_at(key, format!("references ${{{var}}}, which is not set"));
                }
            }
        }
    }
}

fn check_http_url(found: &mut Findings, key: &KeyPath, url: &str) {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
        found.error_at(key, format!("{url:?} is not an http:// or https:// URL"));
    }
}

fn check_tenants(config: &Config, found: &mut Findings) {
    let ids: Vec<&str> = config.tenants.iter().map(|t| t.id.as_str()).collect();
    unique_names(found, "tenants", "id", "tenant id", &ids);
    for (i, tenant) in config.tenants.iter().enumerate() {
        let at = root("tenants").index(i);
        for (key, value) in tenant.limits() {
            // Zero would refuse everything; leaving the key out means no limit.
            if value == Some(0) && !found.is_invalid(&at.key(key)) {
                found.error_at(
                    &at.key(key),
                    "must be at least 1 (leave it out for no limit)".into(),
                );
            }
        }
    }
}

/// Prices and spend limits (docs/spend.md): amounts are USD, limits above
/// zero; a model that a spend limit applies to but that has no price would
/// have every call refused, which `keel check` says beforehand.
fn check_spend(config: &Config, found: &mut Findings) {
    for (i, p) in config.providers.iter().enumerate() {
        let Some(price) = p.price else { continue };
        let at = root("providers").index(i).key("price");
        for (key, usd) in [
            ("input_usd_per_mtok", price.input_usd_per_mtok),
            ("output_usd_per_mtok", price.output_usd_per_mtok),
        ] {
            let valid = usd.is_finite() && usd >= 0.0;
            if !valid && !found.is_invalid(&at.key(key)) {
                found.error_at(&at.key(key), "must be a price of 0 or more USD".into());
            }
        }
    }
    let mut limit_at = Vec::new();
    for (i, tenant) in config.tenants.iter().enumerate() {
        for (key, usd) in tenant.spend_limits() {
            limit_at.push((root("tenants").index(i).key(key), usd));
        }
    }
    for (i, agent) in config.agents.iter().enumerate() {
        let at = root("agents").index(i);
        limit_at.push((at.key("spend_usd_per_day"), agent.spend_usd_per_day));
        limit_at.push((at.key("spend_usd_per_month"), agent.spend_usd_per_month));
    }
    let mut any_limit = false;
    for (at, usd) in limit_at {
        let Some(usd) = usd else { continue };
        any_limit = true;
        let valid = usd.is_finite() && usd > 0.0;
        if !valid && !found.is_invalid(&at) {
            found.error_at(
                &at,
                "must be more than 0 USD (leave it out for no limit)".into(),
            );
        }
    }
    if !any_limit {
        return;
    }
    for (i, agent) in config.agents.iter().enumerate() {
        let Some(provider) = config.providers.iter().find(|p| p.name == agent.provider) else {
            continue;
        };
        if provider.price.is_none() && provider.kind != ProviderKind::Local {
            found.warning_at(
                &root("agents").index(i).key("provider"),
                format!(
                    "provider `{}` has no `price`: with a spend limit set, every model call of \
                     agent `{}` that a limit applies to is refused",
                    provider.name, agent.id
                ),
            );
        }
    }
}

/// Reports every repeat of a name after its first use.
fn unique_names(found: &mut Findings, section: &str, field: &str, what: &str, names: &[&str]) {
    let section_path = section
        .split('.')
        .fold(KeyPath::root(), |p, seg| p.key(seg));
    let mut first: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let key = section_path.index(i).key(field);
        if found.is_invalid(&key) {
            continue;
        }
        if name.is_empty() {
            found.error_at(&key, "must not be empty".into());
            continue;
        }
        match first.get(name) {
            Some(&j) => {
                let first_key = section_path.index(j).key(field);
                let place = found
                    .location_of(&first_key)
                    .map(|l| format!(", {l}"))
                    .unwrap_or_default();
                found.error_at(
                    &key,
                    format!(
                        "duplicate {what} {name:?} (first at {}{place})",
                        first_key.render()
                    ),
                );
            }
            None => {
                first.insert(name, i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses() {
        assert!(valid_bind("127.0.0.1:8780"));
        assert!(valid_bind("[::1]:80"));
        assert!(valid_bind("0.0.0.0:0"));
        assert!(valid_bind("localhost:8780"));
        assert!(!valid_bind("127.0.0.1"));
        assert!(!valid_bind("127.0.0.1:99999"));
        assert!(!valid_bind(":8780"));
        assert!(!valid_bind("bad host:80"));
    }

    #[test]
    fn url_template_params() {
        assert_eq!(
            url_params("http://h/f/{id}/x/{b}").unwrap(),
            vec!["id", "b"]
        );
        assert!(url_params("http://h/f/{id").is_err());
        assert!(url_params("http://h/f/{}").is_err());
    }
}
