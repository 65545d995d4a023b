//! Guardrails (SPEC §4.5, 4.6, 4.8, 4.10) in-process: hooks and policy
//! compiled from configuration text, verification, loop detection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{FOREIGN, codes, plant};
use keel_protocol::{Principal, RunStatus};
use keel_test_support::scripted::{
    ScriptedModel, call_tool, call_tools, offers_tools, reply_text, system_texts, tool_messages,
};
use serde_json::{Value, json};

const F9_OFFLINE: &str = r#"
[[policy.rules]]
name = "f9_offline"
tools = ["furnace_status"]
when_arguments = { furnace_id = { pattern = "^F9$" } }
decision = "deny"
reason = "F9 is offline for maintenance"
"#;

const PROTECT_F0: &str = r#"
[[hooks]]
name = "protect_main_furnace"
kind = "deny_pattern"
tools = ["restart_furnace"]
argument = "furnace_id"
pattern = "^F0$"
reason = "F0 is the main furnace; restart it by hand"
"#;

fn operator() -> Principal {
    Principal {
        tenant: "acme".into(),
        id: "alice".into(),
        roles: vec!["operator".into()],
    }
}

/// `(decision, rule)` of each policy decision.
fn decisions(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|d| {
            (
                d["decision"].as_str().unwrap().to_owned(),
                d["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pair(decision: &str, rule: &str) -> (String, String) {
    (decision.to_owned(), rule.to_owned())
}

#[tokio::test]
async fn repeating_the_same_call_warns_then_blocks_then_ends_the_run() {
    let model = ScriptedModel::handler(|request| {
        if offers_tools(request) {
            call_tool("furnace_status", json!({"furnace_id": "F1"}))
        } else {
            reply_text("I kept getting the same status for F1: it is running.")
        }
    });
    let rt = plant(model)
        .agent_toml("[agents.limits]\nmax_steps = 30\nmax_tool_calls = 30")
        .build()
        .await;
    let id = rt.start("Watch F1").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("I kept getting the same status for F1: it is running.")
    );
    let loops: Vec<(String, String)> = rt
        .events_of(&id, "loop_detected")
        .await
        .iter()
        .map(|l| {
            (
                l["detector"].as_str().unwrap().to_owned(),
                l["level"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let repeat = |level: &str| pair("generic_repeat", level);
    assert_eq!(
        loops,
        [
            repeat("warning"),
            repeat("warning"),
            repeat("critical"),
            repeat("critical")
        ]
    );
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "loop_blocked"
    );
    // repeat_warning = 3, repeat_critical = 5: four calls run, the fifth is blocked.
    assert_eq!(rt.tool_calls_executed("furnace_status"), 4);
    let requests = rt.model().requests();
    let warned = requests.iter().any(|r| {
        system_texts(r)
            .iter()
            .any(|t| t.contains("Loop warning") && t.contains("furnace_status"))
    });
    assert!(warned, "no loop warning reached the model");
    assert!(
        !offers_tools(requests.last().unwrap()),
        "the run ends with a tool-less answer"
    );
    rt.finish();
}

#[tokio::test]
async fn the_global_breaker_ends_a_run_that_keeps_calling_tools() {
    // A different furnace each time: no repeat, only the number of calls grows.
    let model = ScriptedModel::handler(|request| {
        if offers_tools(request) {
            let n = tool_messages(request).len();
            call_tool("furnace_status", json!({"furnace_id": format!("F{n}")}))
        } else {
            reply_text("I checked five furnaces; all are running.")
        }
    });
    let rt = plant(model)
        .agent_toml(
            "[agents.limits]\nmax_steps = 30\nmax_tool_calls = 30\n\
             [agents.loop_detection]\nmax_tool_calls_breaker = 5",
        )
        .build()
        .await;
    let id = rt.start("Check every furnace").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("I checked five furnaces; all are running.")
    );
    let loops = rt.events_of(&id, "loop_detected").await;
    assert!(
        loops
            .iter()
            .all(|l| l["detector"] == "global_circuit_breaker"),
        "{loops:?}"
    );
    let last = loops.last().unwrap();
    assert_eq!(last["level"], "critical");
    assert_eq!(last["count"], 5);
    assert!(
        loops.iter().any(|l| l["level"] == "warning"),
        "the breaker warns before it trips: {loops:?}"
    );
    assert_eq!(
        loops.iter().filter(|l| l["level"] == "critical").count(),
        1,
        "one trip of the breaker ends the run"
    );
    assert_eq!(rt.tool_calls_executed("furnace_status"), 5);
    assert_eq!(
        rt.events_of(&id, "run_completed").await[0]["reason"],
        "loop_blocked"
    );
    rt.finish();
}

#[tokio::test]
async fn a_policy_rule_denies_the_call_and_the_model_is_told_why() {
    let model = ScriptedModel::new([
        call_tool("furnace_status", json!({"furnace_id": "F9"})),
        reply_text("F9 cannot be checked right now."),
    ]);
    let rt = plant(model).config_toml(F9_OFFLINE).build().await;
    let id = rt.start("How is F9?").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("F9 cannot be checked right now.")
    );
    assert_eq!(
        decisions(&rt.events_of(&id, "policy_decision").await),
        [pair("deny", "f9_offline")]
    );
    assert_eq!(
        codes(&rt.events_of(&id, "react_feedback").await),
        ["denied_by_policy"]
    );
    assert!(!rt.event_types(&id).await.contains(&"tool_call"));
    assert_eq!(rt.tool_calls_executed("furnace_status"), 0);
    let second = rt.model().request(1).unwrap();
    let (_, told) = *tool_messages(&second).last().unwrap();
    assert!(told.contains("F9 is offline for maintenance"), "{told}");
    rt.finish();
}

#[tokio::test]
async fn a_deny_pattern_hook_blocks_the_call_before_it_runs() {
    let model = ScriptedModel::new([
        call_tool("restart_furnace", json!({"furnace_id": "F0"})),
        call_tool("restart_furnace", json!({"furnace_id": "F3"})),
        reply_text("F3 restarted; F0 must be restarted by hand."),
    ]);
    let rt = plant(model)
        .config_toml(PROTECT_F0)
        .principal(operator())
        .build()
        .await;
    let id = rt.start("Restart F0, or else F3").await;
    rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        decisions(&rt.events_of(&id, "policy_decision").await),
        [
            pair("deny", "hook:protect_main_furnace"),
            pair("execute", "default_allow")
        ]
    );
    assert_eq!(
        rt.tool_arguments("restart_furnace"),
        [json!({"furnace_id": "F3"})],
        "the blocked call never ran"
    );
    let second = rt.model().request(1).unwrap();
    let (_, told) = *tool_messages(&second).last().unwrap();
    assert!(told.contains("restart it by hand"), "{told}");
    rt.finish();
}

#[tokio::test]
async fn hooks_fill_defaults_and_inject_the_callers_tenant() {
    let model = ScriptedModel::new([
        // The default hook fills the missing id: no clarification needed.
        call_tool("furnace_status", json!({})),
        // The model claims another tenant; the hook overrides it.
        call_tool(
            "tenant_rows",
            json!({"tenant_id": "globex", "only": "acme"}),
        ),
        reply_text("Done."),
    ]);
    let rt = plant(model)
        .config_toml(
            r#"
[[hooks]]
kind = "default"
tools = ["furnace_status"]
argument = "furnace_id"
value = "F1"

[[hooks]]
kind = "inject_tenant"
tools = ["tenant_rows"]
argument = "tenant_id"
"#,
        )
        .build()
        .await;
    let id = rt.start("Check things").await;
    rt.wait_status(&id, RunStatus::Completed).await;
    let types = rt.event_types(&id).await;
    assert!(!types.contains(&"clarification_needed"), "{types:?}");
    assert_eq!(
        rt.tool_arguments("furnace_status"),
        [json!({"furnace_id": "F1"})]
    );
    assert_eq!(
        rt.tool_arguments("tenant_rows"),
        [json!({"tenant_id": "acme", "only": "acme"})]
    );
    let calls = rt.events_of(&id, "tool_call").await;
    assert_eq!(
        calls[1]["arguments"]["tenant_id"], "acme",
        "events show what ran"
    );
    assert_eq!(
        decisions(&rt.events_of(&id, "policy_decision").await),
        [
            pair("execute", "default_allow"),
            pair("execute", "default_allow")
        ]
    );
    rt.finish();
}

#[tokio::test]
async fn another_tenants_rows_are_withheld_from_the_model_and_every_event() {
    let model = ScriptedModel::new([
        call_tool("tenant_rows", json!({})),
        call_tool("tenant_rows", json!({"only": "acme"})),
        reply_text("Batch A-1 produced 120 kg."),
    ]);
    let rt = plant(model).build().await;
    let id = rt.start("What did our batches produce?").await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("Batch A-1 produced 120 kg."));
    let isolation: Vec<Value> = rt
        .events_of(&id, "verify")
        .await
        .into_iter()
        .filter(|v| v["rule"] == "tenant_isolation")
        .collect();
    let passed: Vec<&Value> = isolation.iter().map(|v| &v["passed"]).collect();
    assert_eq!(passed, [&json!(false), &json!(true)]);
    assert!(
        codes(&rt.events_of(&id, "react_feedback").await).contains(&"verify_failed"),
        "the model is told the result failed verification"
    );
    for event in rt.events(&id).await {
        let text = serde_json::to_string(&event).unwrap();
        assert!(!text.contains(FOREIGN), "event leaks: {text}");
    }
    for request in rt.model().requests() {
        for message in &request.messages {
            let text = serde_json::to_string(message).unwrap();
            assert!(!text.contains(FOREIGN), "model request leaks: {text}");
        }
    }
    for message in rt.session_messages(&id).await {
        let text = serde_json::to_string(&message).unwrap();
        assert!(!text.contains(FOREIGN), "session history leaks: {text}");
    }
    // The clean result reached the model, fenced as data.
    let third = rt.model().request(2).unwrap();
    let (_, clean) = *tool_messages(&third).last().unwrap();
    assert!(
        clean.contains("A-1") && clean.contains("<tool_output"),
        "{clean}"
    );
    rt.finish();
}

#[tokio::test]
async fn a_tool_the_principals_roles_forbid_is_not_offered_and_a_call_is_denied() {
    let model = ScriptedModel::new([
        call_tool("restart_furnace", json!({"furnace_id": "F1"})),
        reply_text("I may not restart furnaces."),
    ]);
    // The default principal has no roles; restarting needs `operator`.
    let rt = plant(model).build().await;
    let id = rt.start("Restart F1").await;
    rt.wait_status(&id, RunStatus::Completed).await;
    let first = rt.model().request(0).unwrap();
    assert!(
        !first.tools.iter().any(|t| t.name == "restart_furnace"),
        "offered: {:?}",
        first.tools.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    assert_eq!(
        decisions(&rt.events_of(&id, "policy_decision").await),
        [pair("deny", "tool_roles")]
    );
    assert_eq!(rt.tool_calls_executed("restart_furnace"), 0);
    let second = rt.model().request(1).unwrap();
    let (_, told) = *tool_messages(&second).last().unwrap();
    assert!(told.contains("operator"), "{told}");
    rt.finish();
}

#[tokio::test]
async fn every_call_of_a_mixed_turn_gets_exactly_one_result() {
    let model = ScriptedModel::new([
        call_tools([
            ("furnace_status", json!({"furnace_id": "F1"})),
            ("no_such_tool", json!({})),
            ("furnace_status", json!({"furnace_id": 5})),
            ("furnace_status", json!({"furnace_id": "F9"})),
            ("restart_furnace", json!({"furnace_id": "F0"})),
        ]),
        reply_text("Only F1 could be checked."),
    ]);
    let rt = plant(model)
        .config_toml(F9_OFFLINE)
        .config_toml(PROTECT_F0)
        .principal(operator())
        .build()
        .await;
    let id = rt.start("Check everything").await;
    rt.wait_status(&id, RunStatus::Completed).await;
    let plan = &rt.events_of(&id, "react_plan").await[0];
    let planned: Vec<&str> = plan["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call_id"].as_str().unwrap())
        .collect();
    let second = rt.model().request(1).unwrap();
    let answers = tool_messages(&second);
    let answered: Vec<&str> = answers.iter().map(|(id, _)| *id).collect();
    assert_eq!(answered, planned, "{answers:?}");
    assert_eq!(rt.tool_calls_executed("furnace_status"), 1);
    assert_eq!(rt.tool_calls_executed("restart_furnace"), 0);
    assert!(answers[0].1.contains("<tool_output"), "{}", answers[0].1);
    assert!(answers[1].1.contains("unknown_tool"), "{}", answers[1].1);
    assert!(
        answers[2].1.contains("invalid_arguments"),
        "{}",
        answers[2].1
    );
    assert!(answers[3].1.contains("offline"), "{}", answers[3].1);
    assert!(answers[4].1.contains("by hand"), "{}", answers[4].1);
    // The pairing rules were checked on every request.
    rt.finish();
}
