use keel_config::PolicyConfig;
use keel_protocol::{Principal, Risk, ToolSpec};
use serde_json::{Value, json};

use super::*;

fn policy(cfg: Value) -> Policy {
    let cfg: PolicyConfig = serde_json::from_value(cfg).unwrap();
    Policy::compile(&cfg).unwrap()
}

fn principal(tenant: &str, roles: &[&str]) -> Principal {
    Principal {
        tenant: tenant.into(),
        id: "alice".into(),
        roles: roles.iter().map(|r| (*r).to_string()).collect(),
    }
}

fn tool(name: &str) -> ToolSpec {
    ToolSpec::new(name, "d", json!({"type": "object"}))
}

fn decide(
    p: &Policy,
    who: &Principal,
    tool: &ToolSpec,
    args: Value,
    calls_of_tool: u32,
) -> Verdict {
    p.decide(&PolicyInput {
        principal: who,
        tool,
        args: &args,
        calls_of_tool,
        tool_calls: calls_of_tool,
        confidence: None,
    })
}

fn v(decision: PolicyDecision, rule: &str) -> Verdict {
    Verdict {
        decision,
        rule: rule.into(),
        reason: String::new(),
    }
}

use PolicyDecision::{Approve, Deny, Execute};

#[test]
fn decisions_are_ordered_by_strictness() {
    assert!(Execute < Approve && Approve < Deny);
    assert_eq!(Deny.as_str(), "deny");
}

#[test]
fn strictest_wins_and_ties_keep_the_first() {
    assert_eq!(strictest(Vec::new()), None);
    let got = strictest([v(Execute, "a"), v(Deny, "b"), v(Approve, "c")]).unwrap();
    assert_eq!(got.rule, "b");
    let got = strictest([v(Approve, "first"), v(Approve, "second"), v(Execute, "x")]).unwrap();
    assert_eq!(got.rule, "first");
    let got = strictest([v(Execute, "e1"), v(Execute, "e2")]).unwrap();
    assert_eq!(got.rule, "e1");
    let got = strictest([v(Deny, "d1"), v(Approve, "a"), v(Deny, "d2")]).unwrap();
    assert_eq!(got.rule, "d1");
}

#[test]
fn default_allows_a_plain_read_tool() {
    let p = policy(json!({}));
    let got = decide(
        &p,
        &principal("acme", &[]),
        &tool("furnace_status"),
        json!({}),
        0,
    );
    assert_eq!(got.decision, Execute);
    assert_eq!(got.rule, RULE_DEFAULT_ALLOW);
    assert_eq!(p.approval_timeout(), std::time::Duration::from_secs(3600));
}

#[test]
fn missing_role_denies_and_hides_the_tool() {
    let p = policy(json!({}));
    let mut t = tool("plant.restart_furnace");
    t.roles = vec!["operator".into()];
    let guest = principal("acme", &["viewer"]);
    let got = decide(&p, &guest, &t, json!({}), 0);
    assert_eq!(got.decision, Deny);
    assert_eq!(got.rule, RULE_TOOL_ROLES);
    assert!(got.reason.contains("operator"), "{}", got.reason);
    assert!(!p.visible(&guest, &t));

    let operator = principal("acme", &["viewer", "operator"]);
    assert!(p.visible(&operator, &t));
    assert_eq!(decide(&p, &operator, &t, json!({}), 0).decision, Execute);
    // A tool with no roles is for everyone.
    assert!(p.visible(&guest, &tool("open")));
}

#[test]
fn see_but_ask_turns_a_role_denial_into_approval() {
    let p = policy(json!({"see_but_ask": true}));
    let mut t = tool("plant.restart_furnace");
    t.roles = vec!["operator".into()];
    let guest = principal("acme", &[]);
    assert!(p.visible(&guest, &t));
    let got = decide(&p, &guest, &t, json!({}), 0);
    assert_eq!(
        (got.decision, got.rule.as_str()),
        (Approve, RULE_TOOL_ROLES)
    );
}

#[test]
fn requires_approval_asks_for_approval() {
    let p = policy(json!({}));
    let mut t = tool("plant.set_point");
    t.requires_approval = true;
    let got = decide(&p, &principal("acme", &[]), &t, json!({}), 0);
    assert_eq!(
        (got.decision, got.rule.as_str()),
        (Approve, RULE_REQUIRES_APPROVAL)
    );
}

#[test]
fn risk_at_or_above_the_threshold_needs_approval() {
    let p = policy(json!({}));
    let who = principal("acme", &[]);
    let mut t = tool("x");
    t.risk = Risk::Exec;
    assert_eq!(decide(&p, &who, &t, json!({}), 0).decision, Execute);
    t.risk = Risk::Dangerous;
    let got = decide(&p, &who, &t, json!({}), 0);
    assert_eq!(
        (got.decision, got.rule.as_str()),
        (Approve, RULE_RISK_LEVEL)
    );
    assert!(got.reason.contains("dangerous"));

    let strict = policy(json!({"approval_risk": "write"}));
    t.risk = Risk::Write;
    assert_eq!(decide(&strict, &who, &t, json!({}), 0).decision, Approve);
    t.risk = Risk::Read;
    assert_eq!(decide(&strict, &who, &t, json!({}), 0).decision, Execute);
}

#[test]
fn role_denial_outranks_approval() {
    let p = policy(json!({}));
    let mut t = tool("plant.restart_furnace");
    t.roles = vec!["operator".into()];
    t.requires_approval = true;
    t.risk = Risk::Dangerous;
    let got = decide(&p, &principal("acme", &[]), &t, json!({}), 0);
    assert_eq!((got.decision, got.rule.as_str()), (Deny, RULE_TOOL_ROLES));
}

#[test]
fn tenant_rule_applies_only_to_its_tenants() {
    let p = policy(json!({"rules": [{
        "name": "globex_no_plant", "tools": ["plant.*"], "tenants": ["globex"],
        "decision": "deny", "reason": "globex may not control plants"
    }]}));
    let t = tool("plant.status");
    let got = decide(&p, &principal("globex", &[]), &t, json!({}), 0);
    assert_eq!(
        got,
        Verdict {
            decision: Deny,
            rule: "globex_no_plant".into(),
            reason: "globex may not control plants".into(),
        }
    );
    let got = decide(&p, &principal("acme", &[]), &t, json!({}), 0);
    assert_eq!(
        (got.decision, got.rule.as_str()),
        (Execute, RULE_DEFAULT_ALLOW)
    );
    // Not a plant tool: the rule's tool pattern does not match.
    let got = decide(&p, &principal("globex", &[]), &tool("plantx"), json!({}), 0);
    assert_eq!(got.decision, Execute);
}

#[test]
fn role_and_risk_conditions_of_a_rule() {
    let p = policy(json!({"rules": [{
        "name": "interns_read_only", "roles": ["intern"], "min_risk": "write",
        "decision": "deny"
    }]}));
    let intern = principal("acme", &["intern"]);
    let mut t = tool("x");
    assert_eq!(decide(&p, &intern, &t, json!({}), 0).decision, Execute);
    t.risk = Risk::Write;
    let got = decide(&p, &intern, &t, json!({}), 0);
    assert_eq!(
        (got.decision, got.rule.as_str()),
        (Deny, "interns_read_only")
    );
    assert!(got.reason.contains("interns_read_only"));
    assert_eq!(
        decide(&p, &principal("acme", &["staff"]), &t, json!({}), 0).decision,
        Execute
    );
}

#[test]
fn argument_pattern_and_not_pattern() {
    let p = policy(json!({"rules": [
        {"name": "no_drop", "tools": ["sql"], "decision": "deny",
         "when_arguments": {"query": {"pattern": "(?i)\\bdrop\\b"}}},
        {"name": "foreign_host", "tools": ["fetch"], "decision": "approve",
         "when_arguments": {"url": {"not_pattern": "^https://intranet\\."}}}
    ]}));
    let who = principal("acme", &[]);
    let sql = tool("sql");
    assert_eq!(
        decide(&p, &who, &sql, json!({"query": "DROP table x"}), 0).decision,
        Deny
    );
    assert_eq!(
        decide(&p, &who, &sql, json!({"query": "select 1"}), 0).decision,
        Execute
    );
    // A missing argument does not match.
    assert_eq!(decide(&p, &who, &sql, json!({}), 0).decision, Execute);
    assert_eq!(
        decide(&p, &who, &sql, json!({"query": null}), 0).decision,
        Execute
    );

    let fetch = tool("fetch");
    assert_eq!(
        decide(&p, &who, &fetch, json!({"url": "https://evil.com"}), 0).decision,
        Approve
    );
    assert_eq!(
        decide(
            &p,
            &who,
            &fetch,
            json!({"url": "https://intranet.acme/x"}),
            0
        )
        .decision,
        Execute
    );
}

#[test]
fn argument_one_of_and_not_one_of_compare_loosely() {
    let p = policy(json!({"rules": [
        {"name": "safe_modes", "tools": ["set_mode"], "decision": "deny",
         "when_arguments": {"mode": {"not_one_of": ["eco", "full"]}}},
        {"name": "hot_zones", "tools": ["heat"], "decision": "approve",
         "when_arguments": {"zone": {"one_of": [3, "7"]}}}
    ]}));
    let who = principal("acme", &[]);
    let set_mode = tool("set_mode");
    assert_eq!(
        decide(&p, &who, &set_mode, json!({"mode": "eco"}), 0).decision,
        Execute
    );
    assert_eq!(
        decide(&p, &who, &set_mode, json!({"mode": "turbo"}), 0).decision,
        Deny
    );
    let heat = tool("heat");
    assert_eq!(
        decide(&p, &who, &heat, json!({"zone": 3}), 0).decision,
        Approve
    );
    assert_eq!(
        decide(&p, &who, &heat, json!({"zone": "3"}), 0).decision,
        Approve
    );
    assert_eq!(
        decide(&p, &who, &heat, json!({"zone": 3.0}), 0).decision,
        Approve
    );
    assert_eq!(
        decide(&p, &who, &heat, json!({"zone": 7}), 0).decision,
        Approve
    );
    assert_eq!(
        decide(&p, &who, &heat, json!({"zone": 4}), 0).decision,
        Execute
    );
}

#[test]
fn argument_bounds_are_inclusive_and_need_a_number() {
    let p = policy(json!({"rules": [{
        "name": "big_setpoint", "tools": ["set_point"], "decision": "approve",
        "when_arguments": {"celsius": {"min": 900, "max": 1500.5}}
    }]}));
    let who = principal("acme", &[]);
    let t = tool("set_point");
    let d = |args: Value| decide(&p, &who, &t, args, 0).decision;
    assert_eq!(d(json!({"celsius": 899.9})), Execute);
    assert_eq!(d(json!({"celsius": 900})), Approve);
    assert_eq!(d(json!({"celsius": "1200"})), Approve);
    assert_eq!(d(json!({"celsius": 1500.5})), Approve);
    assert_eq!(d(json!({"celsius": 1501})), Execute);
    assert_eq!(d(json!({"celsius": "hot"})), Execute);
}

#[test]
fn all_argument_conditions_must_hold() {
    let p = policy(json!({"rules": [{
        "name": "r", "decision": "deny",
        "when_arguments": {
            "a": {"pattern": "^x", "not_one_of": ["xz"]},
            "b": {"min": 1}
        }
    }]}));
    let who = principal("acme", &[]);
    let t = tool("any");
    let d = |args: Value| decide(&p, &who, &t, args, 0).decision;
    assert_eq!(d(json!({"a": "xy", "b": 2})), Deny);
    assert_eq!(d(json!({"a": "xz", "b": 2})), Execute);
    assert_eq!(d(json!({"a": "xy", "b": 0})), Execute);
    assert_eq!(d(json!({"a": "xy"})), Execute);
}

#[test]
fn max_calls_per_run_matches_once_the_count_is_reached() {
    let p = policy(json!({"rules": [{
        "name": "three_restarts", "tools": ["restart"], "max_calls_per_run": 3,
        "decision": "deny", "reason": "restart may run at most 3 times per run"
    }]}));
    let who = principal("acme", &[]);
    let t = tool("restart");
    assert_eq!(decide(&p, &who, &t, json!({}), 2).decision, Execute);
    let got = decide(&p, &who, &t, json!({}), 3);
    assert_eq!((got.decision, got.rule.as_str()), (Deny, "three_restarts"));
    assert_eq!(got.reason, "restart may run at most 3 times per run");
}

#[test]
fn default_deny_is_an_allowlist() {
    let p = policy(json!({"default": "deny", "rules": [
        {"name": "reads", "min_risk": "read", "tools": ["furnace_*"], "decision": "execute"}
    ]}));
    let who = principal("acme", &[]);
    let got = decide(&p, &who, &tool("furnace_status"), json!({}), 0);
    assert_eq!((got.decision, got.rule.as_str()), (Execute, "reads"));
    let got = decide(&p, &who, &tool("other"), json!({}), 0);
    assert_eq!((got.decision, got.rule.as_str()), (Deny, RULE_DEFAULT_DENY));
    // An allowing rule cannot loosen a built-in: approval still applies.
    let mut t = tool("furnace_reset");
    t.requires_approval = true;
    let got = decide(&p, &who, &t, json!({}), 0);
    assert_eq!(
        (got.decision, got.rule.as_str()),
        (Approve, RULE_REQUIRES_APPROVAL)
    );
}

#[test]
fn strictest_configured_rule_wins_and_ties_keep_config_order() {
    let p = policy(json!({"rules": [
        {"name": "ask", "decision": "approve"},
        {"name": "ask_too", "decision": "approve"},
        {"name": "fine", "decision": "execute"}
    ]}));
    let got = decide(&p, &principal("acme", &[]), &tool("t"), json!({}), 0);
    assert_eq!((got.decision, got.rule.as_str()), (Approve, "ask"));
    let mut t = tool("t");
    t.requires_approval = true;
    // The built-in comes first, so it is the rule reported on a tie.
    let got = decide(&p, &principal("acme", &[]), &t, json!({}), 0);
    assert_eq!(
        (got.decision, got.rule.as_str()),
        (Approve, RULE_REQUIRES_APPROVAL)
    );
}

#[test]
fn invalid_regex_names_the_rule_and_argument() {
    let cfg: PolicyConfig = serde_json::from_value(json!({"rules": [{
        "name": "bad", "decision": "deny", "when_arguments": {"q": {"not_pattern": "("}}
    }]}))
    .unwrap();
    let err = Policy::compile(&cfg).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("\"bad\"") && text.contains("when_arguments.q.not_pattern"),
        "{text}"
    );
    assert!(
        text.ends_with("invalid regular expression: unclosed group"),
        "{text}"
    );
}

#[test]
fn min_confidence_matches_only_a_stated_confidence_below_it() {
    let p = policy(json!({"rules": [
        {"name": "unsure_restart", "tools": ["restart"], "min_confidence": 0.8, "decision": "clarify"}
    ]}));
    let who = principal("acme", &[]);
    let t = tool("restart");
    let at = |confidence: Option<f64>| {
        p.decide(&PolicyInput {
            principal: &who,
            tool: &t,
            args: &json!({}),
            calls_of_tool: 0,
            tool_calls: 0,
            confidence,
        })
    };
    let low = at(Some(0.5));
    assert_eq!(
        (low.decision, low.rule.as_str()),
        (PolicyDecision::Clarify, "unsure_restart")
    );
    assert_eq!(at(Some(0.9)).decision, PolicyDecision::Execute);
    assert_eq!(
        at(None).decision,
        PolicyDecision::Execute,
        "nothing stated, nothing to judge"
    );
    // Clarify is stricter than execute and looser than approval.
    assert!(PolicyDecision::Execute < PolicyDecision::Clarify);
    assert!(PolicyDecision::Clarify < PolicyDecision::Approve);
}
