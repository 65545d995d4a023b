//! Secret redaction in-process: a secret brought in by the user, a tool,
//! the model or a guard's reason is replaced by `[redacted]` before the
//! run stores, publishes or sends it on. A hook's reason enters no run
//! through an entry point, so it shows that the last check of every
//! commit catches what the entry points do not see.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::plant;
use keel_guard::hooks::{BeforeToolCall, HookAction, HookCall, HookError};
use keel_protocol::{Principal, RunStatus};
use keel_test_support::harness::tool;
use keel_test_support::scripted::{ScriptedModel, call_tool, reply_text};
use serde_json::json;

const SECRET: &str = "sk-core-secret-0123456789";

/// Refuses restarts, quoting a secret in its reason.
struct QuotingHook;

impl BeforeToolCall for QuotingHook {
    fn name(&self) -> &str {
        "quoting_hook"
    }

    fn before_tool_call(&self, call: &HookCall<'_>) -> Result<HookAction, HookError> {
        if call.tool == "restart_furnace" {
            return Ok(HookAction::Block {
                reason: format!("the token {SECRET} may not restart furnaces"),
            });
        }
        Ok(HookAction::Continue)
    }
}

#[tokio::test]
async fn a_secret_from_any_source_never_reaches_events_history_or_the_model() {
    let model = ScriptedModel::new([
        call_tool("leaky_config", json!({})),
        call_tool(
            "furnace_status",
            json!({"furnace_id": format!("F2 {SECRET}")}),
        ),
        call_tool("restart_furnace", json!({"furnace_id": "F2"})),
        reply_text(format!("Done; the token was {SECRET}.")),
    ]);
    let leaky = tool(
        "leaky_config",
        json!({"type": "object"}),
        |_| json!({"api_key": SECRET, "note": format!("Bearer {SECRET}")}),
    )
    .description("Shows the service configuration");
    let rt = plant(model)
        .tool(leaky)
        .hook(Arc::new(QuotingHook))
        .principal(Principal {
            tenant: "acme".into(),
            id: "alice".into(),
            roles: vec!["operator".into()],
        })
        .redact(&[SECRET])
        .build()
        .await;

    let id = rt.start(&format!("My token is {SECRET}; check F2.")).await;
    let run = rt.wait_status(&id, RunStatus::Completed).await;
    assert_eq!(run.input, "My token is [redacted]; check F2.");
    assert_eq!(
        run.output.as_deref(),
        Some("Done; the token was [redacted].")
    );

    let events = rt.events(&id).await;
    let text = serde_json::to_string(&events).unwrap();
    assert!(!text.contains(SECRET), "{text}");
    let refusal = rt.events_of(&id, "policy_decision").await;
    assert!(
        refusal
            .iter()
            .any(|d| d["reason"] == "the token [redacted] may not restart furnaces"),
        "{refusal:?}"
    );
    let results = rt.events_of(&id, "tool_result").await;
    assert!(
        results[0]["output"]
            .as_str()
            .unwrap()
            .contains("[redacted]"),
        "{results:?}"
    );

    let history = serde_json::to_string(&rt.session_messages(&id).await).unwrap();
    assert!(!history.contains(SECRET), "{history}");
    for request in rt.model().requests() {
        let sent = serde_json::to_string(&request.messages).unwrap();
        assert!(!sent.contains(SECRET), "{sent}");
    }
    assert_eq!(
        rt.tool_arguments("furnace_status"),
        vec![json!({"furnace_id": "F2 [redacted]"})],
        "the tool got the redacted argument"
    );
}
