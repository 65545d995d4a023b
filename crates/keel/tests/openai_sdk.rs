//! SPEC §7 against the real clients: the official `openai` Python SDK and
//! the `openai-agents` SDK, pointed at a real `keel serve` whose (fake)
//! model calls the client tool `get_furnace_temp`, then answers with what
//! the tool returned. Needs the venv made by `scripts/setup-python-sdk.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Env, KEY_ACME, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

/// The venv's python; a missing venv fails the test with the fix.
fn python() -> PathBuf {
    let dir = std::env::var_os("KEEL_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/keel-pyenv")
        });
    let python = dir.join("bin/python");
    assert!(
        python.is_file(),
        "no Python SDK venv at {}: run scripts/setup-python-sdk.sh (it installs the pinned \
         `openai`, `openai-agents` and `openresponses-types` packages)",
        dir.display()
    );
    python
}

/// Calls the client tool unless the conversation already has its result;
/// then answers with the reading the client sent back.
fn furnace_model(req: &Value) -> Reply {
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    if last["role"] == "tool" {
        // The result is fenced: `<tool_output …>\n{reading}\n</tool_output>`.
        let content = last["content"].as_str().unwrap_or_default();
        let reading = content.lines().nth(1).unwrap_or("?");
        return Reply::text(format!("The furnace is at {reading} °C."))
            .with_chunk_gap(Duration::from_millis(2));
    }
    let text = last["content"].as_str().unwrap_or_default();
    let furnace = if text.contains("F1") { "F1" } else { "F2" };
    Reply::tool_call("get_furnace_temp", json!({"furnace_id": furnace}))
}

async fn run_script(keel: &Keel, script: &str, key: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(script);
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python())
            .arg(&path)
            .env("OPENAI_BASE_URL", keel.url("/v1"))
            .env("OPENAI_API_KEY", key)
            .env("OPENAI_AGENTS_DISABLE_TRACING", "1")
            .env_remove("OPENAI_ORG_ID")
            .env_remove("OPENAI_PROJECT_ID")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK script did not finish within 120 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stderr}\n{stdout}\nkeel log:\n{}",
        out.status,
        keel.log()
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{script} printed {stdout:?}: {e}"))
}

async fn keel_for_sdk() -> (FakeOpenAi, ToolServer, Keel) {
    let model = FakeOpenAi::start(Script::handler(furnace_model)).await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    let keel = Keel::start(&env).await;
    (model, tools, keel)
}

#[tokio::test]
async fn openai_sdk_does_a_client_tool_round_trip_streamed_and_not() {
    python();
    let (model, _tools, keel) = keel_for_sdk().await;
    let out = run_script(&keel, "responses_client.py", KEY_ACME).await;
    assert_eq!(out["models"], json!(["default"]));

    let n = &out["non_streamed"];
    assert_eq!(n["first_status"], "completed");
    assert_eq!(n["calls"][0]["name"], "get_furnace_temp");
    assert_eq!(n["calls"][0]["arguments"], json!({"furnace_id": "F2"}));
    assert_eq!(n["second_status"], "completed");
    assert_eq!(n["previous_response_id"], n["first_id"]);
    assert_eq!(n["text"], "The furnace is at 1450 °C.");
    assert!(n["usage_total"].as_u64().unwrap() > 0);
    let run_of = |id: &Value| {
        let rest = id.as_str().unwrap().strip_prefix("resp_").unwrap();
        rest.rsplit_once('_').unwrap().0.to_owned()
    };
    assert_eq!(
        run_of(&n["first_id"]),
        run_of(&n["second_id"]),
        "one keel run"
    );

    let s = &out["streamed"];
    assert_eq!(s["schema_errors"], json!([]), "Open Responses schema");
    assert_eq!(s["calls"][0]["arguments"], json!({"furnace_id": "F1"}));
    assert_eq!(
        s["first_types"],
        json!([
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ])
    );
    let second: Vec<&str> = s["second_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(second.first(), Some(&"response.created"));
    assert_eq!(second.last(), Some(&"response.completed"));
    assert!(second.contains(&"response.output_text.delta"), "{second:?}");
    assert_eq!(s["deltas"], "The furnace is at 1380 °C.");
    assert_eq!(s["text"], s["deltas"]);
    assert_eq!(s["second_status"], "completed");
    assert_eq!(run_of(&s["first_id"]), run_of(&s["second_id"]));
    // Each stream numbers its events from 0.
    let seqs: Vec<u64> = s["sequence_numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let first_len = s["first_types"].as_array().unwrap().len();
    let expect: Vec<u64> = (0..first_len as u64)
        .chain(0..(seqs.len() - first_len) as u64)
        .collect();
    assert_eq!(seqs, expect);
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn openai_agents_sdk_runs_an_agent_with_a_function_tool() {
    python();
    let (model, _tools, keel) = keel_for_sdk().await;
    let out = run_script(&keel, "agents_client.py", KEY_ACME).await;
    for mode in ["run", "run_streamed"] {
        let r = &out[mode];
        assert_eq!(
            r["final_output"], "The furnace is at 1450 °C.",
            "{mode}: {out}"
        );
        assert_eq!(r["tool_calls"], 1, "{mode}: {out}");
        assert_eq!(r["tool_outputs"], json!(["1450"]), "{mode}: {out}");
    }
    assert_eq!(out["calls"], json!(["F2", "F2"]));
    // keel saw the tool result of each run (through verification) and finished them.
    let (_, runs) = keel.get("/ai/runs?status=completed", Some(KEY_ACME)).await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 2, "{runs}");
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}
