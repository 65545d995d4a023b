//! The in-process harness keeps its promises: an under-scripted run fails
//! visibly and `finish` reports it, closure tools fail like real ones, and
//! configuration problems name what is wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::panic::AssertUnwindSafe;

use keel_protocol::RunStatus;
use keel_test_support::harness::{TestRuntime, tool};
use keel_test_support::scripted::{ScriptedModel, call_tool, reply_text};
use serde_json::json;

fn panics(f: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[tokio::test]
async fn an_under_scripted_run_fails_visibly_and_finish_reports_it() {
    let model = ScriptedModel::new([call_tool("echo", json!({"text": "hi"}))]);
    let rt = TestRuntime::builder(model)
        .tool(tool(
            "echo",
            json!({"type": "object", "properties": {"text": {"type": "string"}}}),
            |args| args["text"].clone(),
        ))
        .build()
        .await;
    let id = rt.start("Echo hi").await;
    let run = rt.wait_status(&id, RunStatus::Failed).await;
    let error = run.error.unwrap();
    assert_eq!(error.code, "provider_error");
    assert!(error.message.contains("scripted"), "{}", error.message);
    assert_eq!(rt.tool_calls_executed("echo"), 1);
    assert!(
        rt.model().violations().is_empty(),
        "{:?}",
        rt.model().violations()
    );
    let message = panics(move || rt.finish());
    assert!(message.contains("1 unscripted request"), "{message}");
}

#[tokio::test]
async fn a_failing_closure_tool_gives_the_model_an_error_result() {
    let model = ScriptedModel::new([
        call_tool("flaky", json!({})),
        reply_text("The tool failed."),
    ]);
    let rt = TestRuntime::builder(model)
        .tool(tool(
            "flaky",
            json!({"type": "object", "properties": {}}),
            |_| Err::<String, _>("disk on fire"),
        ))
        .build()
        .await;
    let id = rt.start("Try the flaky tool").await;
    let run = rt.wait_terminal(&id).await;
    assert_eq!(run.status, RunStatus::Completed);
    let result = &rt.events_of(&id, "tool_result").await[0];
    assert_eq!(result["ok"], false);
    assert!(
        result["error"].as_str().unwrap().contains("disk on fire"),
        "{result}"
    );
    let feedback = rt.events_of(&id, "react_feedback").await;
    assert_eq!(feedback[0]["code"], "tool_error");
    rt.finish();
}

#[tokio::test]
async fn configuration_problems_are_reported_with_the_text() {
    let err = TestRuntime::builder(ScriptedModel::new([reply_text("unused")]))
        .agent_toml("[agents.limits]\nmax_steps = 0")
        .try_build()
        .await
        .err()
        .expect("max_steps = 0 is rejected");
    let text = format!("{err:#}");
    assert!(text.contains("max_steps"), "{text}");
}
