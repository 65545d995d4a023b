//! Guardrails end to end: verification and tenant isolation, loop
//! detection, the policy gate from configuration, hooks, approval expiry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::sse::types;
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

const FOREIGN: &str = "GLOBEX-SECRET-BATCH";

fn no_tools_offered(req: &serde_json::Value) -> bool {
    req.get("tools")
        .is_none_or(|t| t.as_array().is_some_and(|a| a.is_empty()))
}

#[tokio::test]
async fn another_tenants_rows_are_withheld_from_model_events_and_logs() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("tenant_rows", json!({})),
        Reply::tool_call("tenant_rows", json!({"only": "acme"})),
        Reply::text("Batch A-1 produced 120 kg."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    env.log = "debug".into();
    let keel = Keel::start(&env).await;
    let id = keel
        .start_run("What did our batches produce?", Some(KEY_ACME))
        .await;
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    let verify: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "verify" && f.data["rule"] == "tenant_isolation")
        .collect();
    assert_eq!(verify.len(), 2, "{:?}", types(&frames));
    assert_eq!(verify[0].data["passed"], false);
    assert_eq!(verify[1].data["passed"], true);
    assert!(
        frames
            .iter()
            .any(|f| f.event == "react_feedback" && f.data["code"] == "verify_failed")
    );
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Batch A-1 produced 120 kg.");
    // The foreign rows appear nowhere keel writes: events, model requests, logs.
    for f in &frames {
        assert!(
            !f.data.to_string().contains(FOREIGN),
            "event leaks: {}",
            f.data
        );
    }
    for r in model.requests() {
        assert!(!r.to_string().contains(FOREIGN), "model request leaks");
    }
    let log = keel.log();
    assert!(
        log.contains("DEBUG") || log.contains("debug"),
        "debug logging was on: {log}"
    );
    assert!(!log.contains(FOREIGN), "log leaks");
    let (_, session) = keel
        .get(
            &format!("/ai/sessions/{}", run["session"].as_str().unwrap()),
            Some(KEY_ACME),
        )
        .await;
    assert!(
        !session.to_string().contains(FOREIGN),
        "session history leaks"
    );
    // The clean result reached the model, fenced as data.
    let last = model.requests().last().unwrap().to_string();
    assert!(last.contains("A-1") && last.contains("tool_output"));
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn every_result_is_verified_and_the_model_sees_it_fenced_as_data() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("tenant_rows", json!({"only": "acme"})),
        Reply::text("done"),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    let keel = Keel::start(&env).await;
    let id = keel.start_run("rows?", Some(KEY_ACME)).await;
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    let rules: Vec<&str> = frames
        .iter()
        .filter(|f| f.event == "verify")
        .map(|f| f.data["rule"].as_str().unwrap())
        .collect();
    assert!(
        rules.contains(&"non_empty") && rules.contains(&"tenant_isolation"),
        "{rules:?}"
    );
    let verifies: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "verify")
        .map(|f| f.data.clone())
        .collect();
    assert!(verifies.iter().all(|v| v["passed"] == true), "{verifies:?}");
    let tool_msg = model.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let content = tool_msg["content"].as_str().unwrap();
    assert!(
        content.starts_with("<tool_output tool=\"tenant_rows\""),
        "{content}"
    );
    assert!(content.ends_with("</tool_output>"), "{content}");
}

#[tokio::test]
async fn repeating_the_same_call_warns_then_blocks_then_ends_the_run() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        if no_tools_offered(req) {
            Reply::text("I kept getting the same status for F1: it is running.")
        } else {
            Reply::tool_call("furnace_status", json!({"furnace_id": "F1"}))
        }
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.agent_extra = "[agents.limits]\nmax_steps = 30\nmax_tool_calls = 30\n".into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("Watch F1", None).await;
    let frames = keel.events(&id, None, None).await;
    let loops: Vec<(String, String)> = frames
        .iter()
        .filter(|f| f.event == "loop_detected")
        .map(|f| {
            (
                f.data["detector"].as_str().unwrap().to_owned(),
                f.data["level"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let g = |l: &str| ("generic_repeat".to_owned(), l.to_owned());
    assert_eq!(
        loops,
        vec![g("warning"), g("warning"), g("critical"), g("critical")],
        "{loops:?}"
    );
    let last = frames.last().unwrap();
    assert_eq!(last.event, "run_completed");
    assert_eq!(last.data["reason"], "loop_blocked");
    // repeat_warning = 3, repeat_critical = 5: four runs, the fifth blocked.
    assert_eq!(tools.count("furnace"), 4);
    assert!(tools.count("furnace") <= 5);
    // The warning reached the model as a system note naming the call.
    let reqs = model.requests();
    let warned = reqs.iter().any(|r| {
        r["messages"].as_array().unwrap().iter().any(|m| {
            m["role"] == "system"
                && m["content"].as_str().unwrap().contains("Loop warning")
                && m["content"].as_str().unwrap().contains("furnace_status")
        })
    });
    assert!(warned, "no loop warning reached the model");
    assert!(
        no_tools_offered(reqs.last().unwrap()),
        "the run ends with a tool-less answer"
    );
    let text = reqwest::get(keel.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("keel_loop_blocks_total{detector=\"generic_repeat\"} 2"),
        "{text}"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn ping_pong_with_unchanged_results_is_blocked() {
    let model = FakeOpenAi::start(Script::handler(|req| {
        if no_tools_offered(req) {
            return Reply::text("F1 and F2 are unchanged.");
        }
        let calls = req["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        let id = if calls % 2 == 0 { "F1" } else { "F2" };
        Reply::tool_call("furnace_status", json!({"furnace_id": id}))
    }))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.agent_extra = "[agents.limits]\nmax_steps = 40\nmax_tool_calls = 40\n[agents.loop_detection]\nrepeat_warning = 20\nrepeat_critical = 30\n".into();
    let keel = Keel::start(&env).await;
    let id = keel
        .start_run("Compare F1 and F2 until they differ", None)
        .await;
    let frames = keel.events(&id, None, None).await;
    let pp: Vec<&str> = frames
        .iter()
        .filter(|f| f.event == "loop_detected" && f.data["detector"] == "ping_pong")
        .map(|f| f.data["level"].as_str().unwrap())
        .collect();
    assert!(
        pp.contains(&"warning") && pp.contains(&"critical"),
        "{pp:?}"
    );
    assert_eq!(frames.last().unwrap().data["reason"], "loop_blocked");
    assert!(
        tools.count("furnace") <= 8,
        "stopped right after the block: {}",
        tools.count("furnace")
    );
}

#[tokio::test]
async fn a_poll_whose_status_changes_is_never_blocked_but_a_stuck_one_is() {
    for (job, expect_block) in [("advancing", false), ("stuck-1", true)] {
        let model = FakeOpenAi::start(Script::handler(move |req| {
            if no_tools_offered(req) {
                return Reply::text("The job is stuck.");
            }
            let polls = req["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .count();
            if polls >= 12 {
                Reply::text("The job finished polling.")
            } else {
                Reply::tool_call("job_status", json!({"job_id": job}))
            }
        }))
        .await;
        let tools = ToolServer::start().await;
        let mut env = Env::new(&model.base_url(), &tools.base_url());
        env.agent_extra = "[agents.limits]\nmax_steps = 40\nmax_tool_calls = 40\n".into();
        let keel = Keel::start(&env).await;
        let id = keel.start_run("Wait for the job", None).await;
        let frames = keel.events(&id, None, None).await;
        let criticals: Vec<_> = frames
            .iter()
            .filter(|f| f.event == "loop_detected" && f.data["level"] == "critical")
            .collect();
        if expect_block {
            assert!(!criticals.is_empty());
            assert_eq!(criticals[0].data["detector"], "known_poll_no_progress");
            assert!(tools.count("job") < 12);
        } else {
            assert!(
                criticals.is_empty(),
                "{:?}",
                criticals.iter().map(|f| f.data.clone()).collect::<Vec<_>>()
            );
            assert_eq!(tools.count("job"), 12);
            assert_eq!(frames.last().unwrap().data["reason"], "answered");
        }
    }
}

#[tokio::test]
async fn configured_policy_rules_and_hooks_decide_in_code() {
    let model = FakeOpenAi::start(Script::queue(vec![
        // default hook fills the missing furnace id: no clarification needed
        Reply::tool_call("furnace_status", json!({})),
        // an argument rule denies F9
        Reply::tool_call("furnace_status", json!({"furnace_id": "F9"})),
        // deny_pattern hook blocks restarting the main furnace
        Reply::tool_call("restart_furnace", json!({"furnace_id": "F0"})),
        // inject_tenant overrides what the model claimed
        Reply::tool_call(
            "tenant_rows",
            json!({"tenant_id": "globex", "only": "acme"}),
        ),
        Reply::text("Done."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    env.extra_tools = r#"
[[policy.rules]]
name = "f9_offline"
tools = ["furnace_status"]
when_arguments = { furnace_id = { pattern = "^F9$" } }
decision = "deny"
reason = "F9 is offline for maintenance"

[[hooks]]
kind = "default"
tools = ["furnace_status"]
argument = "furnace_id"
value = "F1"

[[hooks]]
name = "protect_main_furnace"
kind = "deny_pattern"
tools = ["restart_furnace"]
argument = "furnace_id"
pattern = "^F0$"
reason = "F0 is the main furnace; restart it by hand"

[[hooks]]
kind = "inject_tenant"
tools = ["tenant_rows"]
argument = "tenant_id"
"#
    .into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("Check things", Some(KEY_ACME)).await;
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    let decisions: Vec<(String, String)> = frames
        .iter()
        .filter(|f| f.event == "policy_decision")
        .map(|f| {
            (
                f.data["decision"].as_str().unwrap().to_owned(),
                f.data["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        vec![
            ("execute".to_owned(), "default_allow".to_owned()),
            ("deny".to_owned(), "f9_offline".to_owned()),
            ("deny".to_owned(), "hook:protect_main_furnace".to_owned()),
            ("execute".to_owned(), "default_allow".to_owned()),
        ],
        "{decisions:?}"
    );
    assert!(!frames.iter().any(|f| f.event == "clarification_needed"));
    let calls = tools.calls();
    assert_eq!(
        calls[0],
        ("furnace".to_owned(), json!({"furnace_id": "F1"}))
    );
    assert_eq!(calls[1].0, "tenant_rows");
    assert_eq!(
        calls[1].1["tenant_id"], "acme",
        "the hook injected the caller's tenant"
    );
    assert_eq!(calls.len(), 2, "denied calls never ran: {calls:?}");
    let denial = model.requests()[2]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        denial["content"]
            .as_str()
            .unwrap()
            .contains("F9 is offline"),
        "{denial}"
    );
    let text = reqwest::get(keel.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("keel_policy_decisions_total{decision=\"deny\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("keel_task_success_ratio{agent=\"default\"} 1"),
        "{text}"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn an_undecided_approval_expires_as_a_denial() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"})),
        Reply::text("Nobody approved the shutdown in time."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    env.extra_tools = "[policy]\napproval_timeout_s = 1\n".into();
    let keel = Keel::start(&env).await;
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    keel.wait_status(&id, "waiting_approval", Some(KEY_ACME))
        .await;
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Nobody approved the shutdown in time.");
    assert_eq!(tools.count("restart"), 0);
    let (_, list) = keel
        .get("/ai/approvals?status=expired", Some(KEY_ACME))
        .await;
    assert_eq!(list["approvals"].as_array().unwrap().len(), 1);
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    let res = frames
        .iter()
        .find(|f| f.event == "approval_resolved")
        .unwrap();
    assert_eq!(res.data["decision"], "deny");
    assert_eq!(res.data["by"], "timeout");
}
