//! `keel serve` with the official MCP reference server `server-everything`,
//! over stdio and over streamable HTTP: its tools are listed in `/ai/tools`
//! and a scripted run calls `echo` and gets its text back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{Env, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Where `scripts/setup-mcp.sh` installed the reference servers and Node 22.
fn npm_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_MCP_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/keel-npm")
        });
    assert!(
        dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
            .exists(),
        "server-everything is missing in {}: run scripts/setup-mcp.sh",
        dir.display()
    );
    dir
}

fn node() -> String {
    npm_dir()
        .join("node_modules/node/bin/node")
        .display()
        .to_string()
}

fn everything() -> String {
    npm_dir()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string()
}

async fn echo_round_trip(mcp_section: String) {
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("everything.echo", json!({"message": "furnace F4 is hot"})),
        Reply::text("The server echoed it."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.extra_tools = mcp_section;
    // The test agent's tool list names its HTTP tools; MCP tools are added by pattern.
    let keel = Keel::start_with(&env, |cfg| {
        cfg.replace(
            "tools = [\"furnace_status\"",
            "tools = [\"everything.*\", \"furnace_status\"",
        )
    })
    .await;
    let (code, listed) = keel.get("/ai/tools", None).await;
    assert_eq!(code, 200);
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"everything.echo"), "{names:?}");
    let echo = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "everything.echo")
        .unwrap();
    assert_eq!(echo["source"], "mcp");

    let id = keel.start_run("Echo 'furnace F4 is hot'", None).await;
    let frames = keel.events(&id, None, None).await;
    let result = frames
        .iter()
        .find(|f| f.event == "tool_result")
        .expect("tool_result");
    assert_eq!(result.data["tool"], "everything.echo");
    assert_eq!(result.data["ok"], true, "{}", result.data);
    assert!(
        result.data["output"]
            .as_str()
            .unwrap()
            .contains("furnace F4 is hot"),
        "{}",
        result.data
    );
    assert_eq!(frames.last().unwrap().data["reason"], "answered");
    let sent = model.requests()[1].to_string();
    assert!(
        sent.contains("furnace F4 is hot"),
        "the echoed text reached the model"
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn server_everything_over_stdio() {
    let section = format!(
        "[[tools.mcp]]\nname = \"everything\"\ncommand = \"{}\"\nargs = [\"{}\", \"stdio\"]\n",
        node(),
        everything()
    );
    echo_round_trip(section).await;
}

#[tokio::test]
async fn server_everything_over_streamable_http() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new(node())
        .arg(everything())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening on port") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "server-everything did not start listening");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let section =
        format!("[[tools.mcp]]\nname = \"everything\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n");
    echo_round_trip(section).await;
    child.kill().await.unwrap();
}
