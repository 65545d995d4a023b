//! SPEC §4.7 human approval through a real `keel serve`: persisted, decided
//! once by an approver of the same tenant, restart-safe, bound to the call.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, KEY_ACME_CAROL, KEY_GLOBEX, Keel, assert_gap_free};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;

fn script() -> Script {
    Script::queue(vec![
        Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"})),
        Reply::text("Line F2 is shut down."),
    ])
}

async fn keel(model: &FakeOpenAi, tools: &ToolServer) -> Keel {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    Keel::start(&env).await
}

async fn pending_approval(keel: &Keel, run_id: &str) -> serde_json::Value {
    let run = keel
        .wait_status(run_id, "waiting_approval", Some(KEY_ACME))
        .await;
    assert_eq!(run["pending"]["type"], "approval");
    let (code, list) = keel
        .get("/ai/approvals?status=pending", Some(KEY_ACME))
        .await;
    assert_eq!(code, 200);
    let list = list["approvals"].as_array().unwrap().clone();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["run_id"], run_id);
    assert_eq!(list[0]["arguments"], json!({"furnace_id": "F2"}));
    list[0].clone()
}

#[tokio::test]
async fn approve_runs_the_dangerous_call_exactly_once() {
    let model = FakeOpenAi::start(script()).await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    let approval = pending_approval(&keel, &id).await;
    assert_eq!(tools.count("restart"), 0, "nothing runs before approval");
    let aid = approval["id"].as_str().unwrap();
    let (code, decided) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            json!({"decision": "approve", "reason": "planned"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    assert_eq!(decided["status"], "approved");
    assert_eq!(decided["decided_by"], "alice");
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "Line F2 is shut down.");
    assert_eq!(tools.count("restart"), 1);
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    assert_gap_free(&frames, 1);
    let t = keel_test_support::sse::types(&frames);
    assert!(
        keel_test_support::sse::is_subsequence(
            &t,
            &[
                "policy_decision",
                "approval_required",
                "approval_resolved",
                "policy_decision",
                "tool_call",
                "tool_result",
                "final"
            ]
        ),
        "{t:?}"
    );
    let req = frames
        .iter()
        .find(|f| f.event == "approval_required")
        .unwrap();
    assert_eq!(req.data["risk"], "dangerous");
    assert_eq!(req.data["tool"], "shutdown_line");
    let res = frames
        .iter()
        .find(|f| f.event == "approval_resolved")
        .unwrap();
    assert_eq!(res.data["decision"], "approve");
    assert_eq!(res.data["by"], "alice");
    // Deciding again: 409.
    let (code, _) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            json!({"decision": "deny"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 409);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn deny_never_runs_the_call_and_the_model_is_told() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("shutdown_line", json!({"furnace_id": "F2"})),
        Reply::text("The shutdown was not approved."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    let approval = pending_approval(&keel, &id).await;
    let aid = approval["id"].as_str().unwrap();
    let (code, _) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            json!({"decision": "deny", "reason": "line is busy"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 200);
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "The shutdown was not approved.");
    assert_eq!(tools.count("restart"), 0);
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    assert!(!frames.iter().any(|f| f.event == "tool_call"));
    let fb = frames.iter().find(|f| f.event == "react_feedback").unwrap();
    assert_eq!(fb.data["code"], "approval_denied");
    let last_req = model.requests().last().unwrap().clone();
    let tool_msg = last_req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert!(
        tool_msg["content"]
            .as_str()
            .unwrap()
            .contains("line is busy"),
        "{tool_msg}"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn only_approvers_of_the_same_tenant_may_decide() {
    let model = FakeOpenAi::start(script()).await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    let approval = pending_approval(&keel, &id).await;
    let aid = approval["id"].as_str().unwrap();
    let body = json!({"decision": "approve"});
    let (code, err) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            body.clone(),
            Some(KEY_ACME_CAROL),
        )
        .await;
    assert_eq!(code, 403, "{err}");
    assert_eq!(err["error"]["code"], "forbidden");
    let (code, _) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            body.clone(),
            Some(KEY_GLOBEX),
        )
        .await;
    assert_eq!(code, 404);
    let (code, _) = keel
        .get(&format!("/ai/approvals/{aid}"), Some(KEY_GLOBEX))
        .await;
    assert_eq!(code, 404);
    let (_, list) = keel.get("/ai/approvals", Some(KEY_GLOBEX)).await;
    assert_eq!(list["approvals"].as_array().unwrap().len(), 0);
    let (code, err) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            json!({"decision": "maybe"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 400, "{err}");
    assert_eq!(tools.count("restart"), 0);
    // Still pending and decidable by an approver.
    let (code, _) = keel
        .post(&format!("/ai/approvals/{aid}"), body, Some(KEY_ACME))
        .await;
    assert_eq!(code, 200);
    keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(tools.count("restart"), 1);
}

#[tokio::test]
async fn a_restart_while_waiting_changes_nothing() {
    for approve in [true, false] {
        let model = FakeOpenAi::start(script()).await;
        let tools = ToolServer::start().await;
        let mut keel = keel(&model, &tools).await;
        let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
        let approval = pending_approval(&keel, &id).await;
        keel.kill9().await;
        keel.restart().await;
        let approval2 = pending_approval(&keel, &id).await;
        assert_eq!(approval["id"], approval2["id"]);
        let aid = approval["id"].as_str().unwrap();
        let decision = if approve { "approve" } else { "deny" };
        let (code, _) = keel
            .post(
                &format!("/ai/approvals/{aid}"),
                json!({"decision": decision}),
                Some(KEY_ACME),
            )
            .await;
        assert_eq!(code, 200);
        keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
        assert_eq!(tools.count("restart"), usize::from(approve));
        // And a restart after the decision does not run it again.
        keel.restart().await;
        keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
        assert_eq!(tools.count("restart"), usize::from(approve));
        let frames = keel.events(&id, None, Some(KEY_ACME)).await;
        assert_gap_free(&frames, 1);
        assert!(model.violations().is_empty(), "{:?}", model.violations());
    }
}

#[tokio::test]
async fn the_cli_lists_and_decides_approvals() {
    let model = FakeOpenAi::start(script()).await;
    let tools = ToolServer::start().await;
    let keel = keel(&model, &tools).await;
    let id = keel.start_run("Shut line F2 down", Some(KEY_ACME)).await;
    let approval = pending_approval(&keel, &id).await;
    let aid = approval["id"].as_str().unwrap();
    let cli = |args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_keel"));
        c.args(args)
            .arg("--url")
            .arg(&keel.base)
            .env("KEEL_API_KEY", KEY_ACME)
            .env("KEEL_LOG", "warn");
        c.output().unwrap()
    };
    let out = cli(&["approvals", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(aid) && text.contains("shutdown_line") && text.contains("F2"),
        "{text}"
    );
    let out = cli(&["approvals", "approve", aid, "--reason", "ok from cli"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("approved by alice"), "{text}");
    let out = cli(&["approvals", "deny", aid]);
    assert!(!out.status.success(), "a second decision fails");
    assert!(String::from_utf8_lossy(&out.stderr).contains("409"));
    keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(tools.count("restart"), 1);
}
