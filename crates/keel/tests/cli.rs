//! The CLI as a user meets it: `keel check` and `keel run`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;

use common::{Env, config};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

fn keel() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    c.env("KEEL_LOG", "warn").env_remove("KEEL_CONFIG");
    c
}

#[tokio::test]
async fn check_prints_every_problem_with_key_and_line_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.toml");
    std::fs::write(
        &path,
        r#"[server]
bnd = "127.0.0.1:1"

[[providers]]
name = "main"
kind = "openai"
model = "m"

[[agents]]
id = "default"
provider = "mian"

[agents.limits]
max_steps = "many"
"#,
    )
    .unwrap();
    let out = keel()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("server.bnd") && text.contains(":2:"),
        "{text}"
    );
    assert!(
        text.contains("agents[0].provider") && text.contains("mian"),
        "{text}"
    );
    assert!(text.contains("agents[0].limits.max_steps"), "{text}");
    assert!(text.contains("3 errors"), "{text}");
}

#[tokio::test]
async fn check_accepts_the_example_configuration() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/keel.toml");
    let out = keel()
        .arg("check")
        .arg("--config")
        .arg(example)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("OK"), "{text}");
    // No MCP server is started: what needs approval is what the
    // configuration says, and the plant tools are left to `keel serve`.
    assert!(
        text.contains("\ntools needing approval (from configuration): plant.restart_furnace\n"),
        "{text}"
    );
    assert!(
        text.contains("mcp tools (plant.*) are listed when `keel serve` starts their servers"),
        "{text}"
    );
}

#[tokio::test]
async fn run_prints_a_timeline_and_asks_at_the_terminal() {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({})),
        Reply::text("F6 is running at 1450 °C."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.toml");
    std::fs::write(
        &path,
        config(dir.path(), &Env::new(&model.base_url(), &tools.base_url())),
    )
    .unwrap();
    let mut child = keel()
        .arg("run")
        .arg("How is the furnace?")
        .arg("--config")
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"F6\n").await.unwrap();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("? "), "asked a question: {text}");
    assert!(text.contains("→ furnace_status"), "{text}");
    assert!(text.contains("F6 is running at 1450 °C."), "{text}");
    assert!(text.contains("completed (answered)"), "{text}");
    assert_eq!(
        tools.calls(),
        vec![("furnace".to_owned(), json!({"furnace_id": "F6"}))]
    );
}

#[tokio::test]
async fn run_exits_non_zero_when_the_run_fails() {
    let model = FakeOpenAi::start(Script::handler(|_| {
        Reply::status(400, "{\"error\":{\"message\":\"bad model\"}}")
    }))
    .await;
    let tools = ToolServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.toml");
    std::fs::write(
        &path,
        config(dir.path(), &Env::new(&model.base_url(), &tools.base_url())),
    )
    .unwrap();
    let out = keel()
        .arg("run")
        .arg("hi")
        .arg("--config")
        .arg(&path)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("failed"), "{text}");
}
