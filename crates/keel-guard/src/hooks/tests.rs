use keel_config::HookConfig;
use keel_protocol::Principal;
use serde_json::{Value, json};

use super::*;

fn hook(cfg: Value) -> ConfigHook {
    let cfg: HookConfig = serde_json::from_value(cfg).unwrap();
    ConfigHook::compile(&cfg).unwrap()
}

fn acme() -> Principal {
    Principal {
        tenant: "acme".into(),
        id: "alice".into(),
        roles: Vec::new(),
    }
}

fn apply(h: &ConfigHook, tool: &str, args: Value) -> Result<HookAction, HookError> {
    let principal = acme();
    h.apply(&HookCall {
        tool,
        args: &args,
        principal: &principal,
        run_id: "run-1",
    })
}

#[test]
fn inject_tenant_overwrites_what_the_model_sent() {
    let h = hook(json!({"kind": "inject_tenant", "argument": "tenant_id", "tools": ["crm.*"]}));
    assert_eq!(h.name(), "inject_tenant:tenant_id");
    assert_eq!(
        apply(&h, "crm.orders", json!({"q": "x", "tenant_id": "globex"})).unwrap(),
        HookAction::Rewrite(json!({"q": "x", "tenant_id": "acme"}))
    );
    assert_eq!(
        apply(&h, "crm.orders", json!({"q": "x"})).unwrap(),
        HookAction::Rewrite(json!({"q": "x", "tenant_id": "acme"}))
    );
    // Already right: nothing to rewrite.
    assert_eq!(
        apply(&h, "crm.orders", json!({"tenant_id": "acme"})).unwrap(),
        HookAction::Continue
    );
    // Nowhere to put the tenant: an error, so the chain fails closed.
    assert!(matches!(
        apply(&h, "crm.orders", json!("text")),
        Err(HookError::Failed(m)) if m.contains("not an object")
    ));
}

#[test]
fn default_fills_absent_or_null_only() {
    let h =
        hook(json!({"name": "unit", "kind": "default", "argument": "unit", "value": "celsius"}));
    assert_eq!(h.name(), "unit");
    assert_eq!(
        apply(&h, "furnace_status", json!({"furnace_id": "F2"})).unwrap(),
        HookAction::Rewrite(json!({"furnace_id": "F2", "unit": "celsius"}))
    );
    assert_eq!(
        apply(&h, "furnace_status", json!({"unit": null})).unwrap(),
        HookAction::Rewrite(json!({"unit": "celsius"}))
    );
    assert_eq!(
        apply(&h, "furnace_status", json!({"unit": "kelvin"})).unwrap(),
        HookAction::Continue
    );
    let structured = hook(json!({"kind": "default", "argument": "page", "value": {"size": 10}}));
    assert_eq!(
        apply(&structured, "t", json!({})).unwrap(),
        HookAction::Rewrite(json!({"page": {"size": 10}}))
    );
}

#[test]
fn deny_pattern_blocks_matching_values() {
    let h = hook(json!({
        "kind": "deny_pattern", "argument": "query", "tools": ["sql"],
        "pattern": "(?i)\\b(drop|truncate)\\b", "reason": "destructive SQL is not allowed"
    }));
    assert_eq!(
        apply(&h, "sql", json!({"query": "DROP TABLE users"})).unwrap(),
        HookAction::Block {
            reason: "destructive SQL is not allowed".into()
        }
    );
    assert_eq!(
        apply(&h, "sql", json!({"query": "select 1"})).unwrap(),
        HookAction::Continue
    );
    assert_eq!(apply(&h, "sql", json!({})).unwrap(), HookAction::Continue);
    assert_eq!(
        apply(&h, "sql", json!({"query": null})).unwrap(),
        HookAction::Continue
    );
}

#[test]
fn deny_pattern_matches_non_strings_on_their_json_text() {
    let h = hook(json!({"kind": "deny_pattern", "argument": "ids", "pattern": "\\b13\\b"}));
    assert!(matches!(
        apply(&h, "t", json!({"ids": [1, 13]})).unwrap(),
        HookAction::Block { reason } if reason == "the value of ids is not allowed"
    ));
    assert_eq!(
        apply(&h, "t", json!({"ids": [1, 130]})).unwrap(),
        HookAction::Continue
    );
    let n = hook(json!({"kind": "deny_pattern", "argument": "n", "pattern": "^-"}));
    assert!(matches!(
        apply(&n, "t", json!({"n": -5})).unwrap(),
        HookAction::Block { .. }
    ));
}

#[test]
fn hooks_leave_other_tools_alone() {
    let inject =
        hook(json!({"kind": "inject_tenant", "argument": "tenant_id", "tools": ["crm.*"]}));
    let default = hook(
        json!({"kind": "default", "argument": "unit", "value": "c", "tools": ["furnace_status"]}),
    );
    let deny =
        hook(json!({"kind": "deny_pattern", "argument": "q", "pattern": ".", "tools": ["sql"]}));
    let args = json!({"tenant_id": "globex", "q": "anything"});
    for h in [&inject, &default, &deny] {
        assert_eq!(
            apply(h, "crmx.orders", args.clone()).unwrap(),
            HookAction::Continue
        );
        assert_eq!(
            apply(h, "other", args.clone()).unwrap(),
            HookAction::Continue
        );
    }
}

#[test]
fn the_trait_entry_point_gives_the_same_answer() {
    let h = hook(json!({"kind": "inject_tenant", "argument": "tenant_id"}));
    let principal = acme();
    let args = json!({});
    let call = HookCall {
        tool: "t",
        args: &args,
        principal: &principal,
        run_id: "run-1",
    };
    let hooks: Vec<Box<dyn BeforeToolCall>> = vec![Box::new(h)];
    let got = hooks[0].before_tool_call(&call).unwrap();
    assert_eq!(got, HookAction::Rewrite(json!({"tenant_id": "acme"})));
}

#[test]
fn compile_rejects_what_cannot_work() {
    let compile = |cfg: Value| ConfigHook::compile(&serde_json::from_value(cfg).unwrap());
    let err =
        compile(json!({"kind": "deny_pattern", "argument": "q", "pattern": "("})).unwrap_err();
    assert!(
        err.to_string()
            .contains("deny_pattern:q: invalid regular expression"),
        "{err}"
    );
    assert!(compile(json!({"kind": "deny_pattern", "argument": "q"})).is_err());
    assert!(compile(json!({"kind": "default", "argument": "q"})).is_err());
    assert!(compile(json!({"kind": "inject_tenant", "argument": ""})).is_err());
}
