#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The guardrail sections: `[policy]`, `[[hooks]]`, `[verify]`.

use keel_config::{
    ConfigErrors, DefaultDecision, HookKind, Loaded, MapEnv, RuleDecision, Severity, load_str,
};
use keel_protocol::Risk;
use serde_json::json;

const BASE: &str = r#"
[[providers]]
name = "main"
kind = "openai"
model = "m"

[[tools.mcp]]
name = "plant"
command = "p"

[[tools.http]]
name = "sql"
description = "d"
url = "http://127.0.0.1:1/"
"#;

fn load_env(text: &str, env: &MapEnv) -> Result<Loaded, ConfigErrors> {
    load_str(&format!("{BASE}{text}"), "keel.toml", env)
}

fn load(text: &str) -> Result<Loaded, ConfigErrors> {
    load_env(text, &MapEnv::new())
}

/// (severity, key, message) of every problem.
fn problems(result: &Result<Loaded, ConfigErrors>) -> Vec<(Severity, String, String)> {
    let list = match result {
        Ok(l) => &l.warnings,
        Err(e) => &e.0,
    };
    list.iter()
        .map(|p| (p.severity, p.key.clone(), p.message.clone()))
        .collect()
}

fn has(result: &Result<Loaded, ConfigErrors>, severity: Severity, key: &str, needle: &str) -> bool {
    problems(result)
        .iter()
        .any(|(s, k, m)| *s == severity && k == key && m.contains(needle))
}

#[test]
fn defaults_when_the_sections_are_absent() {
    let c = load("").unwrap().config;
    assert_eq!(c.policy.default, DefaultDecision::Execute);
    assert_eq!(c.policy.approval_risk, Risk::Dangerous);
    assert_eq!(c.policy.approval_timeout_s, 3600);
    assert!(!c.policy.see_but_ask);
    assert!(c.policy.rules.is_empty());
    assert!(c.hooks.is_empty());
    assert_eq!(c.verify.tenant_field, "tenant_id");
    assert!(c.verify.non_empty);
    assert!(c.verify.required_fields.is_empty());
}

#[test]
fn a_full_guardrail_configuration_loads() {
    let r = load(
        r#"
[policy]
default = "deny"
approval_risk = "exec"
approval_timeout_s = 600
see_but_ask = true

[[policy.rules]]
name = "big_setpoints"
tools = ["plant.*"]
roles = ["operator"]
tenants = ["acme"]
min_risk = "write"
max_calls_per_run = 3
decision = "approve"
reason = "large setpoints need a second pair of eyes"
when_arguments.celsius = { min = 900, max = 1500.5 }
when_arguments.mode = { pattern = "^(eco|full)$", not_one_of = ["off"], one_of = ["eco", "full", 3] }

[[hooks]]
kind = "inject_tenant"
argument = "tenant_id"
tools = ["plant.*"]

[[hooks]]
name = "unit"
kind = "default"
argument = "unit"
value = "celsius"

[[hooks]]
kind = "deny_pattern"
argument = "query"
tools = ["sql"]
pattern = "(?i)\\bdrop\\b"
reason = "no DDL"

[verify]
tenant_field = "org"
non_empty = false

[verify.required_fields]
"plant.*" = ["furnace_id", "temp"]
"#,
    );
    let loaded = r.unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = loaded.config;
    assert_eq!(c.policy.default, DefaultDecision::Deny);
    assert_eq!(c.policy.approval_risk, Risk::Exec);
    assert_eq!(c.policy.approval_timeout_s, 600);
    assert!(c.policy.see_but_ask);
    let rule = &c.policy.rules[0];
    assert_eq!(rule.decision, RuleDecision::Approve);
    assert_eq!(rule.min_risk, Some(Risk::Write));
    assert_eq!(rule.max_calls_per_run, Some(3));
    assert_eq!(rule.when_arguments["celsius"].min, Some(900.0));
    assert_eq!(rule.when_arguments["celsius"].max, Some(1500.5));
    assert_eq!(
        rule.when_arguments["mode"].one_of,
        Some(vec![json!("eco"), json!("full"), json!(3)])
    );
    assert_eq!(c.hooks.len(), 3);
    assert_eq!(c.hooks[0].kind, HookKind::InjectTenant);
    assert_eq!(c.hooks[0].display_name(), "inject_tenant:tenant_id");
    assert_eq!(c.hooks[1].display_name(), "unit");
    assert_eq!(c.hooks[1].value, Some(json!("celsius")));
    assert_eq!(c.hooks[2].pattern.as_deref(), Some("(?i)\\bdrop\\b"));
    assert_eq!(c.verify.tenant_field, "org");
    assert!(!c.verify.non_empty);
    assert_eq!(
        c.verify.required_fields["plant.*"],
        vec!["furnace_id", "temp"]
    );
}

#[test]
fn policy_problems_name_their_keys() {
    let r = load(
        r#"
[policy]
approval_timeout_s = 0
default = "approve"

[[policy.rules]]
name = "r"
decision = "deny"
when_arguments.q = { pattern = "(", not_pattern = "[", min = 5, max = 1 }
when_arguments.z = { one_of = [] }

[[policy.rules]]
name = "r"
decision = "maybe"
tools = ["nowhere"]
when_arguments.n = { min = "five", colour = "red" }

[[policy.rules]]
decision = "deny"
"#,
    );
    assert!(r.is_err());
    let e = Severity::Error;
    assert!(
        has(
            &r,
            e,
            "policy.default",
            "expected one of \"execute\", \"deny\""
        ),
        "{:#?}",
        problems(&r)
    );
    assert!(has(&r, e, "policy.approval_timeout_s", "at least 1"));
    assert!(has(
        &r,
        e,
        "policy.rules[0].when_arguments.q.pattern",
        "invalid regular expression"
    ));
    assert!(has(
        &r,
        e,
        "policy.rules[0].when_arguments.q.not_pattern",
        "invalid regular expression"
    ));
    assert!(has(
        &r,
        e,
        "policy.rules[0].when_arguments.q.max",
        "less than min"
    ));
    assert!(has(
        &r,
        Severity::Warning,
        "policy.rules[0].when_arguments.z.one_of",
        "never match"
    ));
    assert!(has(
        &r,
        e,
        "policy.rules[1].name",
        "duplicate policy rule name \"r\""
    ));
    assert!(has(
        &r,
        e,
        "policy.rules[1].decision",
        "expected one of \"execute\", \"clarify\", \"approve\", \"deny\""
    ));
    assert!(has(
        &r,
        Severity::Warning,
        "policy.rules[1].tools[0]",
        "matches no configured"
    ));
    assert!(has(
        &r,
        e,
        "policy.rules[1].when_arguments.n.min",
        "expected a number"
    ));
    assert!(has(
        &r,
        e,
        "policy.rules[1].when_arguments.n.colour",
        "unknown key"
    ));
    assert!(has(
        &r,
        e,
        "policy.rules[2].name",
        "missing required key \"name\""
    ));
}

#[test]
fn hook_problems_name_their_keys() {
    let r = load(
        r#"
[[hooks]]
kind = "deny_pattern"
argument = "q"

[[hooks]]
kind = "deny_pattern"
argument = "q"
pattern = "(unclosed"

[[hooks]]
kind = "default"
argument = "unit"

[[hooks]]
kind = "inject_tenant"

[[hooks]]
name = "h"
kind = "inject_tenant"
argument = ""
value = 1
reason = "r"

[[hooks]]
name = "h"
kind = "rewrite"
argument = "a"
"#,
    );
    assert!(r.is_err());
    let e = Severity::Error;
    let w = Severity::Warning;
    assert!(
        has(&r, e, "hooks[0].pattern", "needs pattern"),
        "{:#?}",
        problems(&r)
    );
    assert!(has(
        &r,
        e,
        "hooks[1].pattern",
        "invalid regular expression: unclosed group"
    ));
    assert!(has(&r, e, "hooks[2].value", "needs value"));
    assert!(has(
        &r,
        e,
        "hooks[3].argument",
        "missing required key \"argument\""
    ));
    assert!(has(&r, e, "hooks[4].argument", "must not be empty"));
    assert!(has(
        &r,
        w,
        "hooks[4].value",
        "ignored by a inject_tenant hook"
    ));
    assert!(has(&r, w, "hooks[4].reason", "ignored"));
    assert!(has(&r, e, "hooks[5].kind", "expected one of"));
    assert!(has(&r, e, "hooks[5].name", "duplicate hook name \"h\""));
}

#[test]
fn verify_problems_name_their_keys() {
    let r = load(
        r#"
[verify]
tenant_field = ""
non_empty = "yes"

[verify.required_fields]
"plant.*" = ["id", ""]
"ghost" = ["id"]
"#,
    );
    assert!(r.is_err());
    let e = Severity::Error;
    assert!(
        has(&r, e, "verify.tenant_field", "must not be empty"),
        "{:#?}",
        problems(&r)
    );
    assert!(has(&r, e, "verify.non_empty", "expected a boolean"));
    assert!(has(
        &r,
        e,
        "verify.required_fields.\"plant.*\"[1]",
        "must not be empty"
    ));
    assert!(has(
        &r,
        Severity::Warning,
        "verify.required_fields.ghost",
        "matches no configured"
    ));
}

#[test]
fn environment_overrides_reach_the_guardrail_sections() {
    let env = MapEnv::new()
        .with("KEEL_POLICY__DEFAULT", "deny")
        .with("KEEL_POLICY__RULES__NO_DROP__DECISION", "approve")
        .with("KEEL_VERIFY__NON_EMPTY", "false");
    let c = load_env(
        r#"
[[policy.rules]]
name = "no_drop"
decision = "deny"
"#,
        &env,
    )
    .unwrap()
    .config;
    assert_eq!(c.policy.default, DefaultDecision::Deny);
    assert_eq!(c.policy.rules[0].decision, RuleDecision::Approve);
    assert!(!c.verify.non_empty);
}
