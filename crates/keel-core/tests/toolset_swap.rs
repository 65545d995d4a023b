//! A tool list that changes mid-run (an MCP server's `list_changed`): the
//! step that was running keeps the snapshot it took, so every call of its
//! turn is judged and executed against the same tools and gets exactly one
//! result; the next step sees the new list.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, OnceLock};

use keel_core::{Runtime, ToolSet};
use keel_protocol::{EventKind, RunStatus, Tool};
use keel_test_support::harness::{TestRuntime, tool};
use keel_test_support::scripted::{ScriptedModel, Step, call_tools, reply_text, respond};
use serde_json::json;

fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]})
}

#[tokio::test]
async fn a_tool_set_swapped_during_a_turn_changes_the_next_step_only() {
    let runtime: Arc<OnceLock<Runtime>> = Arc::new(OnceLock::new());
    let replacement = tool("line_status_v2", schema(), |_| json!({"status": "ok"}));
    let swap = {
        let runtime = runtime.clone();
        let replacement = replacement.clone();
        tool("reload_tools", schema(), move |_| {
            // The server re-lists its tools while this turn is running:
            // `line_status` is gone, `line_status_v2` is new.
            let set = ToolSet::new(vec![Arc::new(replacement.clone()) as Arc<dyn Tool>]).unwrap();
            runtime.get().expect("runtime set").replace_tools(set);
            json!({"reloaded": true})
        })
    };
    let old = tool("line_status", schema(), |_| json!({"status": "running"}));
    let model = ScriptedModel::new::<Step>([
        call_tools([
            ("reload_tools", json!({"line": "L1"})),
            ("line_status", json!({"line": "L1"})),
        ])
        .into(),
        respond(|request| {
            let offered: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
            assert!(offered.contains(&"line_status_v2"), "{offered:?}");
            assert!(!offered.contains(&"line_status"), "{offered:?}");
            call_tools([("line_status", json!({"line": "L1"}))])
        }),
        reply_text("L1 is running.").into(),
    ]);
    let rt = TestRuntime::builder(model)
        .tool(swap)
        .tool(old.clone())
        .build()
        .await;
    runtime.set(rt.runtime().clone()).ok();
    let id = rt.start("Reload the tools, then how is line L1?").await;
    let run = rt.wait_terminal(&id).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.output.as_deref(), Some("L1 is running."));
    // The turn's second call ran against the snapshot the turn began with.
    assert_eq!(old.calls().len(), 1);
    let events = rt.events(&id).await;
    let results: Vec<(u32, String, bool)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { step, tool, ok, .. } => Some((*step, tool.clone(), *ok)),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![
            (1, "reload_tools".into(), true),
            (1, "line_status".into(), true)
        ]
    );
    // The next step judged against the new list: the old name is unknown now.
    assert!(
        events.iter().any(|e| matches!(
            &e.kind,
            EventKind::ReactFeedback { step: 2, code, detail } if code.as_str() == "unknown_tool" && detail.contains("line_status_v2")
        )),
        "{:?}",
        events.iter().map(|e| e.type_name()).collect::<Vec<_>>()
    );
    assert_eq!(replacement.calls().len(), 0);
    // Every call got exactly one result: the scripted model checked each request.
    rt.finish();
}
