//! Human approval (SPEC §4.7) in-process: the run waits, the decision is
//! bound to the call, and the call runs at most once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{codes, plant};
use keel_core::CoreError;
use keel_protocol::{ApprovalStatus, Principal, Risk, RunStatus};
use keel_test_support::harness::{is_subsequence, tool};
use keel_test_support::scripted::{ScriptedModel, call_tool, reply_text, tool_messages};
use serde_json::json;

fn shutdown_script(answer: &str) -> ScriptedModel {
    ScriptedModel::new([
        call_tool("shutdown_line", json!({"furnace_id": "F2"})),
        reply_text(answer),
    ])
}

#[tokio::test]
async fn an_approved_dangerous_call_runs_exactly_once() {
    let rt = plant(shutdown_script("Line F2 is shut down."))
        .build()
        .await;
    let id = rt.start("Shut line F2 down").await;
    let approval = rt.pending_approval(&id).await;
    assert_eq!(approval.tool, "shutdown_line");
    assert_eq!(approval.arguments, json!({"furnace_id": "F2"}));
    let run = rt.run(&id).await;
    assert!(
        matches!(run.pending, Some(keel_protocol::Pending::Approval { .. })),
        "{:?}",
        run.pending
    );
    assert_eq!(
        rt.tool_calls_executed("shutdown_line"),
        0,
        "nothing runs before approval"
    );

    let decided = rt.decide(&approval.id, true, "planned").await.unwrap();
    assert_eq!(decided.status, ApprovalStatus::Approved);
    assert_eq!(decided.decided_by.as_deref(), Some("alice"));
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("Line F2 is shut down."));
    assert_eq!(rt.tool_calls_executed("shutdown_line"), 1);
    let types = rt.event_types(&id).await;
    assert!(
        is_subsequence(
            &types,
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
        "{types:?}"
    );
    let required = &rt.events_of(&id, "approval_required").await[0];
    assert_eq!(required["risk"], "dangerous");
    assert_eq!(required["tool"], "shutdown_line");
    assert_eq!(required["approval_id"], approval.id.as_str());
    let resolved = &rt.events_of(&id, "approval_resolved").await[0];
    assert_eq!(resolved["decision"], "approve");
    assert_eq!(resolved["by"], "alice");
    // One decision wins; deciding again changes nothing.
    let again = rt.decide(&approval.id, false, "too late").await;
    assert!(matches!(again, Err(CoreError::Conflict(_))), "{again:?}");
    assert_eq!(rt.tool_calls_executed("shutdown_line"), 1);
    rt.finish();
}

#[tokio::test]
async fn a_denied_call_never_runs_and_the_model_is_told_why() {
    let rt = plant(shutdown_script("The shutdown was not approved."))
        .build()
        .await;
    let id = rt.start("Shut line F2 down").await;
    let approval = rt.pending_approval(&id).await;
    rt.decide(&approval.id, false, "line is busy")
        .await
        .unwrap();
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("The shutdown was not approved.")
    );
    assert_eq!(rt.tool_calls_executed("shutdown_line"), 0);
    assert!(!rt.event_types(&id).await.contains(&"tool_call"));
    assert!(codes(&rt.events_of(&id, "react_feedback").await).contains(&"approval_denied"));
    let second = rt.model().request(1).unwrap();
    let (_, told) = *tool_messages(&second).last().unwrap();
    assert!(told.contains("line is busy"), "{told}");
    rt.finish();
}

#[tokio::test]
async fn only_approvers_of_the_same_tenant_may_decide() {
    // A read-only tool that still asks first: `requires_approval` alone decides.
    let export = tool(
        "export_batches",
        json!({"type": "object", "properties": {}}),
        |_| json!({"exported": 3}),
    )
    .risk(Risk::Read)
    .requires_approval(true);
    let model = ScriptedModel::new([
        call_tool("export_batches", json!({})),
        reply_text("Exported 3 batches."),
    ]);
    let alice = Principal {
        tenant: "acme".into(),
        id: "alice".into(),
        roles: vec!["approver".into()],
    };
    let rt = plant(model)
        .tool(export)
        .config_toml("[auth]\napprover_roles = [\"approver\"]")
        .principal(alice)
        .build()
        .await;
    let id = rt.start("Export our batches").await;
    let approval = rt.pending_approval(&id).await;
    let required = &rt.events_of(&id, "approval_required").await[0];
    assert_eq!(required["risk"], "read");

    let carol = Principal {
        tenant: "acme".into(),
        id: "carol".into(),
        roles: vec!["operator".into()],
    };
    let by_carol = rt
        .runtime()
        .decide_approval(&carol, &approval.id, true, "")
        .await;
    assert!(
        matches!(by_carol, Err(CoreError::Forbidden(_))),
        "{by_carol:?}"
    );
    let bob = Principal {
        tenant: "globex".into(),
        id: "bob".into(),
        roles: vec!["approver".into()],
    };
    let by_bob = rt
        .runtime()
        .decide_approval(&bob, &approval.id, true, "")
        .await;
    assert!(matches!(by_bob, Err(CoreError::NotFound)), "{by_bob:?}");
    assert_eq!(rt.tool_calls_executed("export_batches"), 0);
    assert_eq!(rt.run(&id).await.status, RunStatus::WaitingApproval);

    rt.decide(&approval.id, true, "").await.unwrap();
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.output.as_deref(), Some("Exported 3 batches."));
    assert_eq!(rt.tool_calls_executed("export_batches"), 1);
    rt.finish();
}

#[tokio::test]
async fn an_approved_call_is_judged_again_and_a_tool_gone_meanwhile_does_not_run() {
    use std::sync::Arc;

    use keel_core::ToolSet;
    use keel_protocol::Tool;

    let line = common::shutdown_line();
    let rt = plant(shutdown_script(
        "The line tool is gone; nothing was shut down.",
    ))
    .build()
    .await;
    let id = rt.start("Shut line F2 down").await;
    let approval = rt.pending_approval(&id).await;
    // While the run waits, the tool set changes: only furnace_status is left.
    let remaining: Vec<Arc<dyn Tool>> = vec![Arc::new(common::furnace_status())];
    rt.runtime().replace_tools(ToolSet::new(remaining).unwrap());
    rt.decide(&approval.id, true, "go").await.unwrap();
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(
        run.output.as_deref(),
        Some("The line tool is gone; nothing was shut down.")
    );
    assert_eq!(line.calls().len(), 0);
    assert_eq!(rt.tool_calls_executed("shutdown_line"), 0);
    let feedback = rt.events_of(&id, "react_feedback").await;
    assert_eq!(codes(&feedback), ["unknown_tool"], "{feedback:?}");
    let told = tool_messages(&rt.model().requests()[1])
        .iter()
        .any(|(_, text)| text.contains("unknown tool `shutdown_line`"));
    assert!(told, "the model is told the approved call could not run");
    rt.finish();
}
