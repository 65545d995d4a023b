#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! keel-tools' MCP client against the real `mcp-fixture` server process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_config::{McpServerConfig, ToolsConfig};
use keel_protocol::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSource};
use keel_tools::mcp::McpServer;
use keel_tools::{ToolsError, load_tools};
use serde_json::{Value, json};

const FIXTURE: &str = env!("CARGO_BIN_EXE_mcp-fixture");

fn server_config(name: &str, timeout_s: u64) -> McpServerConfig {
    McpServerConfig {
        name: name.into(),
        command: Some(FIXTURE.into()),
        args: Vec::new(),
        env: BTreeMap::new(),
        url: None,
        timeout_s,
        risk: None,
        requires_approval: None,
        output_trust: None,
    }
}

fn real_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn ctx() -> ToolContext {
    ToolContext {
        tenant: "acme".into(),
        principal: "alice".into(),
        agent: "default".into(),
        session: "ses_1".into(),
        run_id: "run_1".into(),
        call_id: "call_1".into(),
    }
}

fn find(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no tool {name}"))
}

async fn call(tools: &[Arc<dyn Tool>], name: &str, args: Value) -> Result<ToolOutput, ToolError> {
    find(tools, name).call(args, &ctx()).await
}

#[tokio::test]
async fn lists_all_pages_with_prefixed_names_and_annotation_risks() {
    let server = McpServer::start(&server_config("plant", 10), real_env)
        .await
        .unwrap();
    let tools = server.tools();
    let mut names: Vec<String> = tools.iter().map(|t| t.spec().name.clone()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "add", "count", "crash", "echo", "env", "fail", "grow", "slow", "wipe"
        ]
        .map(|n| format!("plant.{n}"))
        .to_vec(),
        "all three tools/list pages are followed"
    );

    let echo = find(&tools, "plant.echo");
    let s = echo.spec();
    assert_eq!(
        (s.risk, s.requires_approval, s.idempotent),
        (Risk::Read, false, true)
    );
    assert_eq!(s.source, ToolSource::Mcp);
    assert_eq!(s.timeout, Duration::from_secs(10));
    assert_eq!(s.description, "Returns the text it is given");
    assert_eq!(s.required_params(), vec!["text".to_string()]);
    assert_eq!(s.parameters["additionalProperties"], json!(false));

    let wipe = find(&tools, "plant.wipe");
    assert_eq!(
        (wipe.spec().risk, wipe.spec().requires_approval),
        (Risk::Dangerous, true)
    );
    let crash = find(&tools, "plant.crash");
    assert_eq!(
        (crash.spec().risk, crash.spec().requires_approval),
        (Risk::Write, false),
        "no annotations: write, no approval until the configuration says otherwise"
    );
    let add = find(&tools, "plant.add");
    assert_eq!(
        add.spec().output_schema.as_ref().unwrap()["required"],
        json!(["sum"])
    );
    server.shutdown().await;
}

#[tokio::test]
async fn calls_return_text_structured_and_tool_errors() {
    let server = McpServer::start(&server_config("plant", 10), real_env)
        .await
        .unwrap();
    let tools = server.tools();

    let out = call(&tools, "plant.echo", json!({"text": "hello furnace"}))
        .await
        .unwrap();
    assert_eq!(out, ToolOutput::text("hello furnace"));

    let out = call(&tools, "plant.add", json!({"a": 2, "b": 40.5}))
        .await
        .unwrap();
    assert_eq!(out.structured, Some(json!({"sum": 42.5})));
    assert!(!out.is_error);
    assert_eq!(
        serde_json::from_str::<Value>(&out.content).unwrap(),
        json!({"sum": 42.5})
    );

    let out = call(&tools, "plant.fail", json!({})).await.unwrap();
    assert!(out.is_error);
    assert_eq!(out.content, "fail: the furnace is on fire");

    assert_eq!(
        call(&tools, "plant.count", json!({}))
            .await
            .unwrap()
            .content,
        "1"
    );
    assert_eq!(
        call(&tools, "plant.count", Value::Null)
            .await
            .unwrap()
            .content,
        "2"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn slow_call_times_out_and_server_keeps_working() {
    let server = McpServer::start(&server_config("plant", 1), real_env)
        .await
        .unwrap();
    let tools = server.tools();
    let started = Instant::now();
    let err = call(&tools, "plant.slow", json!({"ms": 5000}))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolError::Timeout(d) if d == Duration::from_secs(1)),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let out = call(&tools, "plant.echo", json!({"text": "still here"}))
        .await
        .unwrap();
    assert_eq!(out.content, "still here");
    server.shutdown().await;
}

async fn wait_until_answers(tools: &[Arc<dyn Tool>]) -> ToolOutput {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call(tools, "plant.count", json!({})).await {
            Ok(out) => return out,
            Err(ToolError::Unavailable(msg)) => {
                assert!(Instant::now() < deadline, "server did not come back: {msg}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("unexpected error while restarting: {other:?}"),
        }
    }
}

#[tokio::test]
async fn crashed_server_is_restarted_and_calls_fail_cleanly_meanwhile() {
    let server = McpServer::start(&server_config("plant", 10), real_env)
        .await
        .unwrap();
    let tools = server.tools();
    assert_eq!(
        call(&tools, "plant.count", json!({}))
            .await
            .unwrap()
            .content,
        "1"
    );
    assert_eq!(
        call(&tools, "plant.count", json!({}))
            .await
            .unwrap()
            .content,
        "2"
    );

    let started = Instant::now();
    let err = call(&tools, "plant.crash", json!({})).await.unwrap_err();
    assert!(matches!(err, ToolError::Unavailable(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // Right after the crash the supervisor waits out its first backoff.
    let err = call(&tools, "plant.echo", json!({"text": "x"}))
        .await
        .unwrap_err();
    match err {
        ToolError::Unavailable(msg) => assert_eq!(msg, "mcp server plant is restarting"),
        other => panic!("expected Unavailable, got {other:?}"),
    }

    // A fresh process: its counter starts again.
    let out = wait_until_answers(&tools).await;
    assert_eq!(out.content, "1");
    let out = call(&tools, "plant.echo", json!({"text": "back"}))
        .await
        .unwrap();
    assert_eq!(out.content, "back");

    // And it survives a second crash the same way.
    assert!(call(&tools, "plant.crash", json!({})).await.is_err());
    assert_eq!(wait_until_answers(&tools).await.content, "1");
    server.shutdown().await;
}

#[tokio::test]
async fn call_in_flight_when_the_server_dies_returns_promptly() {
    let server = McpServer::start(&server_config("plant", 30), real_env)
        .await
        .unwrap();
    let tools = server.tools();
    let slow = find(&tools, "plant.slow");
    let in_flight = tokio::spawn(async move { slow.call(json!({"ms": 20000}), &ctx()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let _ = call(&tools, "plant.crash", json!({})).await;
    let result = tokio::time::timeout(Duration::from_secs(3), in_flight)
        .await
        .expect("in-flight call must not hang")
        .unwrap();
    assert!(
        matches!(result, Err(ToolError::Unavailable(_))),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    wait_until_answers(&tools).await;
    server.shutdown().await;
}

#[tokio::test]
async fn server_gets_a_cleared_environment_plus_configured_entries() {
    let present = "CARGO_MANIFEST_DIR";
    assert!(
        std::env::var(present).is_ok(),
        "cargo sets {present} for tests"
    );

    let mut cfg = server_config("plant", 10);
    cfg.env
        .insert("PLANT_MODE".into(), "mode-${PLANT_MODE_SRC}".into());
    let env = |name: &str| match name {
        "PLANT_MODE_SRC" => Some("eco".to_string()),
        "KEEL_SECRET" => Some("hunter2".to_string()),
        other => std::env::var(other).ok(),
    };
    let server = McpServer::start(&cfg, env).await.unwrap();
    let tools = server.tools();
    let read = async |name: &str| {
        call(&tools, "plant.env", json!({"name": name}))
            .await
            .unwrap()
            .content
    };
    assert_eq!(read("PLANT_MODE").await, "mode-eco");
    assert_eq!(
        read(present).await,
        "<unset>",
        "keel's environment is not inherited"
    );
    assert_eq!(read("KEEL_SECRET").await, "<unset>");
    assert_eq!(read("PLANT_MODE_SRC").await, "<unset>");
    match std::env::var("PATH") {
        Ok(path) => assert_eq!(read("PATH").await, path),
        Err(_) => assert_eq!(read("PATH").await, "<unset>"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn missing_env_reference_is_a_start_error() {
    let mut cfg = server_config("plant", 10);
    cfg.env.insert("TOKEN".into(), "${PLANT_TOKEN}".into());
    let err = McpServer::start(&cfg, |_: &str| None).await.unwrap_err();
    assert_eq!(
        err,
        ToolsError::McpEnv {
            server: "plant".into(),
            key: "TOKEN".into(),
            var: "PLANT_TOKEN".into()
        }
    );
}

#[tokio::test]
async fn server_that_cannot_start_is_an_error_naming_it_and_its_command() {
    let mut cfg = server_config("plant", 5);
    cfg.command = Some("/nonexistent/keel-mcp-server".into());
    let err = McpServer::start(&cfg, real_env).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ToolsError::McpStart { .. }), "{err:?}");
    assert!(
        msg.contains("plant") && msg.contains("/nonexistent/keel-mcp-server"),
        "{msg}"
    );

    let mut cfg = server_config("plant", 5);
    cfg.args = vec!["--exit-at-start".into()];
    let started = Instant::now();
    let err = McpServer::start(&cfg, real_env).await.unwrap_err();
    assert!(matches!(err, ToolsError::McpStart { .. }), "{err:?}");
    assert!(err.to_string().contains(FIXTURE), "{err}");
    assert!(started.elapsed() < Duration::from_secs(4));

    // Nothing listens on a port we just bound and released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut cfg = server_config("remote", 5);
    cfg.command = None;
    cfg.url = Some(url.clone());
    let started = Instant::now();
    let err = McpServer::start(&cfg, real_env).await.unwrap_err();
    assert!(matches!(err, ToolsError::McpConnect { .. }), "{err:?}");
    assert!(err.to_string().contains(&url), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );

    let mut cfg = server_config("remote", 5);
    cfg.command = None;
    cfg.url = Some("ftp://127.0.0.1/mcp".into());
    assert!(matches!(
        McpServer::start(&cfg, real_env).await.unwrap_err(),
        ToolsError::McpConfig { .. }
    ));
}

#[tokio::test]
async fn load_tools_builds_everything_and_applies_overrides() {
    let cfg: ToolsConfig = serde_json::from_value(json!({
        "mcp": [{"name": "plant", "command": FIXTURE, "timeout_s": 10}],
        "http": [{
            "name": "furnace_status",
            "description": "Current status of one furnace",
            "url": "http://127.0.0.1:9/furnaces/{furnace_id}",
            "parameters": {"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}
        }],
        "overrides": {
            "plant.crash": {"risk": "dangerous", "requires_approval": true, "roles": ["operator"]},
            "plant.echo": {"timeout_s": 2, "poll": true},
            "furnace_status": {"volatile_fields": ["ts"]},
            "memory_search": {"roles": ["x"]}
        }
    }))
    .unwrap();
    let loaded = load_tools(&cfg, real_env).await.unwrap();
    assert_eq!(loaded.tools.len(), 10);
    assert_eq!(loaded.servers.len(), 1);

    let crash = find(&loaded.tools, "plant.crash");
    assert_eq!(crash.spec().risk, Risk::Dangerous);
    assert!(crash.spec().requires_approval);
    assert_eq!(crash.spec().roles, vec!["operator".to_string()]);
    let echo = find(&loaded.tools, "plant.echo");
    assert_eq!(echo.spec().timeout, Duration::from_secs(2));
    assert!(echo.spec().poll);
    assert_eq!(
        echo.spec().risk,
        Risk::Read,
        "unset override fields keep the tool's own"
    );
    let status = find(&loaded.tools, "furnace_status");
    assert_eq!(status.spec().volatile_fields, vec!["ts".to_string()]);
    assert_eq!(status.spec().source, ToolSource::Http);

    let out = call(
        &loaded.tools,
        "plant.echo",
        json!({"text": "via load_tools"}),
    )
    .await
    .unwrap();
    assert_eq!(out.content, "via load_tools");

    loaded.shutdown().await;
    let err = call(&loaded.tools, "plant.echo", json!({"text": "x"}))
        .await
        .unwrap_err();
    match err {
        ToolError::Unavailable(msg) => assert!(msg.contains("shut down"), "{msg}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn load_tools_fails_naming_the_server_that_cannot_start() {
    let cfg: ToolsConfig = serde_json::from_value(json!({
        "mcp": [
            {"name": "plant", "command": FIXTURE},
            {"name": "broken", "command": FIXTURE, "args": ["--exit-at-start"], "timeout_s": 5}
        ]
    }))
    .unwrap();
    let err = load_tools(&cfg, real_env).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("broken") && msg.contains(FIXTURE), "{msg}");
}

#[tokio::test]
async fn duplicate_tool_names_are_rejected() {
    let cfg: ToolsConfig = serde_json::from_value(json!({
        "http": [
            {"name": "dup", "description": "a", "url": "http://127.0.0.1:9/a"},
            {"name": "dup", "description": "b", "url": "http://127.0.0.1:9/b"}
        ]
    }))
    .unwrap();
    assert_eq!(
        load_tools(&cfg, real_env).await.unwrap_err(),
        ToolsError::DuplicateTool("dup".into())
    );
}

async fn wait_for_change(changes: &mut tokio::sync::watch::Receiver<u64>) -> u64 {
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("no tools/list_changed re-list within 10 s")
        .unwrap();
    *changes.borrow_and_update()
}

#[tokio::test]
async fn fixture_speaks_the_stateless_generation() {
    let server = McpServer::start(&server_config("plant", 10), real_env)
        .await
        .unwrap();
    assert_eq!(
        server.protocol_version(),
        "2026-07-28",
        "an rmcp 3.9 server answers server/discover"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn list_changed_re_lists_and_bumps_changes() {
    let server = McpServer::start(&server_config("plant", 10), real_env)
        .await
        .unwrap();
    let mut changes = server.changes();
    assert_eq!(*changes.borrow_and_update(), 0);
    let tools = server.tools();
    assert!(
        tools
            .iter()
            .all(|t| !t.spec().name.starts_with("plant.extra_"))
    );

    let out = call(&tools, "plant.grow", json!({})).await.unwrap();
    assert_eq!(out.content, "added extra_1");
    assert_eq!(wait_for_change(&mut changes).await, 1);
    let now = server.tools();
    assert_eq!(now.len(), tools.len() + 1);
    let extra = find(&now, "plant.extra_1");
    assert_eq!(extra.spec().risk, Risk::Read);
    assert_eq!(
        extra.call(json!({}), &ctx()).await.unwrap().content,
        "extra_1"
    );

    // Tools handed out before the change still work.
    assert_eq!(
        call(&tools, "plant.echo", json!({"text": "old handle"}))
            .await
            .unwrap()
            .content,
        "old handle"
    );
    call(&now, "plant.grow", json!({})).await.unwrap();
    wait_for_change(&mut changes).await;
    assert!(
        server
            .tools()
            .iter()
            .any(|t| t.spec().name == "plant.extra_2")
    );
    server.shutdown().await;
}

#[tokio::test]
async fn restart_re_lists_the_new_process_tools() {
    let server = McpServer::start(&server_config("plant", 10), real_env)
        .await
        .unwrap();
    let mut changes = server.changes();
    call(&server.tools(), "plant.grow", json!({}))
        .await
        .unwrap();
    wait_for_change(&mut changes).await;
    assert!(
        server
            .tools()
            .iter()
            .any(|t| t.spec().name == "plant.extra_1")
    );

    // The new process starts without the grown tool; the list follows it.
    let _ = call(&server.tools(), "plant.crash", json!({})).await;
    wait_for_change(&mut changes).await;
    let names: Vec<String> = server
        .tools()
        .iter()
        .map(|t| t.spec().name.clone())
        .collect();
    assert_eq!(names.len(), 9, "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("plant.extra_")));
    wait_until_answers(&server.tools()).await;
    server.shutdown().await;
}

#[tokio::test]
async fn loaded_tools_follow_changes_with_overrides() {
    let cfg: ToolsConfig = serde_json::from_value(json!({
        "mcp": [{"name": "plant", "command": FIXTURE, "timeout_s": 10}],
        "http": [{
            "name": "furnace_status",
            "description": "Current status of one furnace",
            "url": "http://127.0.0.1:9/furnaces"
        }],
        "overrides": {
            "plant.extra_1": {"risk": "dangerous", "roles": ["operator"]}
        }
    }))
    .unwrap();
    let loaded = load_tools(&cfg, real_env).await.unwrap();
    let mut changes = loaded.changes();
    assert_eq!(loaded.current_tools().len(), 10);
    call(&loaded.tools, "plant.grow", json!({})).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(10), changes.changed())
            .await
            .unwrap()
    );
    let now = loaded.current_tools();
    assert_eq!(now.len(), 11);
    let extra = find(&now, "plant.extra_1");
    assert_eq!(extra.spec().risk, Risk::Dangerous, "override applied");
    assert_eq!(extra.spec().roles, vec!["operator".to_string()]);
    assert_eq!(find(&now, "furnace_status").spec().source, ToolSource::Http);

    loaded.shutdown().await;
    assert!(
        !tokio::time::timeout(Duration::from_secs(5), changes.changed())
            .await
            .unwrap(),
        "no more changes once every server is shut down"
    );
}
