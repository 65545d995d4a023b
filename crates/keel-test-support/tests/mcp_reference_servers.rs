#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! keel-tools' MCP client against the official reference servers from npm
//! (`@modelcontextprotocol/server-everything` over stdio and streamable
//! HTTP, `@modelcontextprotocol/server-filesystem` over stdio), run with
//! the Node that `scripts/setup-mcp.sh` installs. These servers speak the
//! `initialize` generation, so they also cover keel's fallback from
//! `server/discover`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_config::McpServerConfig;
use keel_protocol::{Risk, Tool, ToolContext, ToolError, ToolOutput};
use keel_tools::mcp::McpServer;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Where `scripts/setup-mcp.sh` installed the packages.
fn npm_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_MCP_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/keel-npm")
        });
    for needed in [
        "node_modules/node/bin/node",
        "node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js",
    ] {
        assert!(
            dir.join(needed).exists(),
            "{} is missing: run scripts/setup-mcp.sh (or set KEEL_MCP_NPM to where it installed)",
            dir.join(needed).display()
        );
    }
    dir
}

fn node() -> String {
    npm_dir()
        .join("node_modules/node/bin/node")
        .display()
        .to_string()
}

fn package_main(package: &str) -> String {
    npm_dir()
        .join("node_modules/@modelcontextprotocol")
        .join(package)
        .join("dist/index.js")
        .display()
        .to_string()
}

fn stdio_config(name: &str, args: Vec<String>) -> McpServerConfig {
    McpServerConfig {
        name: name.into(),
        command: Some(node()),
        args,
        env: BTreeMap::new(),
        url: None,
        timeout_s: 20,
        risk: None,
        requires_approval: None,
        output_trust: None,
    }
}

fn http_config(name: &str, url: &str) -> McpServerConfig {
    McpServerConfig {
        name: name.into(),
        command: None,
        args: Vec::new(),
        env: BTreeMap::new(),
        url: Some(url.into()),
        timeout_s: 20,
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
        .unwrap_or_else(|| {
            let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
            panic!("no tool {name} in {names:?}")
        })
}

async fn call(tools: &[Arc<dyn Tool>], name: &str, args: Value) -> Result<ToolOutput, ToolError> {
    find(tools, name).call(args, &ctx()).await
}

/// `server-everything streamableHttp` on a free loopback port, killed on drop.
struct HttpEverything {
    child: Child,
    port: u16,
}

impl HttpEverything {
    async fn start_on(port: u16) -> HttpEverything {
        let mut child = Command::new(node())
            .arg(package_main("server-everything"))
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
        HttpEverything { child, port }
    }

    async fn start() -> HttpEverything {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_on(port).await
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

async fn check_everything(server: &McpServer) {
    assert_eq!(
        server.protocol_version(),
        "2025-11-25",
        "a reference server takes the initialize fallback"
    );
    let tools = server.tools();
    assert!(tools.len() >= 5, "{}", tools.len());
    let echo = find(&tools, "everything.echo");
    assert_eq!(echo.spec().risk, Risk::Read);
    assert!(!echo.spec().requires_approval);
    assert_eq!(echo.spec().required_params(), vec!["message".to_string()]);

    let out = echo
        .call(json!({"message": "hello furnace"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out, ToolOutput::text("Echo: hello furnace"));

    let weather = find(&tools, "everything.get-structured-content");
    let schema = weather.spec().output_schema.clone().expect("outputSchema");
    assert_eq!(schema["properties"]["humidity"]["type"], "number");
    let out = weather
        .call(json!({"location": "Chicago"}), &ctx())
        .await
        .unwrap();
    assert!(!out.is_error);
    let structured = out.structured.expect("structuredContent");
    assert_eq!(structured["humidity"], 82);
    assert_eq!(structured["conditions"], "Light rain / drizzle");

    let out = call(&tools, "everything.get-sum", json!({"a": 2, "b": 40}))
        .await
        .unwrap();
    assert!(out.content.contains("42"), "{}", out.content);

    // A bad argument is the server's tool error (isError), not a crash.
    let out = call(&tools, "everything.echo", json!({"message": 5})).await;
    match out {
        Ok(out) => assert!(out.is_error, "{out:?}"),
        Err(ToolError::Failed(msg)) => assert!(!msg.is_empty()),
        Err(other) => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn everything_over_stdio() {
    let cfg = stdio_config(
        "everything",
        vec![package_main("server-everything"), "stdio".into()],
    );
    let server = McpServer::start(&cfg, real_env).await.unwrap();
    check_everything(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn everything_over_streamable_http() {
    let http = HttpEverything::start().await;
    let server = McpServer::start(&http_config("everything", &http.url()), real_env)
        .await
        .unwrap();
    assert_eq!(server.endpoint(), http.url());
    check_everything(&server).await;
    server.shutdown().await;
    http.stop().await;
}

#[tokio::test]
async fn http_server_restart_is_reconnected() {
    let http = HttpEverything::start().await;
    let port = http.port;
    let server = McpServer::start(&http_config("everything", &http.url()), real_env)
        .await
        .unwrap();
    let mut changes = server.changes();
    let tools = server.tools();
    let echo = find(&tools, "everything.echo");
    assert_eq!(
        echo.call(json!({"message": "one"}), &ctx())
            .await
            .unwrap()
            .content,
        "Echo: one"
    );

    http.stop().await;
    let err = echo.call(json!({"message": "down"}), &ctx()).await;
    assert!(
        matches!(err, Err(ToolError::Unavailable(_) | ToolError::Failed(_))),
        "{err:?}"
    );

    // A new process on the same port knows nothing of the old session.
    let http = HttpEverything::start_on(port).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match echo.call(json!({"message": "two"}), &ctx()).await {
            Ok(out) => {
                assert_eq!(out.content, "Echo: two");
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "never reconnected: {e:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // The new session's tools were listed again.
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("no re-list after the server restarted")
        .unwrap();
    assert!(server.tools().len() >= 5);
    server.shutdown().await;
    http.stop().await;
}

#[tokio::test]
async fn server_env_is_scrubbed_over_stdio() {
    let mut cfg = stdio_config(
        "everything",
        vec![package_main("server-everything"), "stdio".into()],
    );
    cfg.env
        .insert("PLANT_MODE".into(), "${PLANT_MODE_SRC}".into());
    let env = |name: &str| match name {
        "PLANT_MODE_SRC" => Some("eco".to_string()),
        "OPENAI_API_KEY" => Some("sk-keel-secret".to_string()),
        other => std::env::var(other).ok(),
    };
    let server = McpServer::start(&cfg, env).await.unwrap();
    let out = call(&server.tools(), "everything.get-env", json!({}))
        .await
        .unwrap();
    let vars: Value = serde_json::from_str(&out.content).unwrap();
    assert_eq!(vars["PLANT_MODE"], "eco");
    assert!(vars.get("OPENAI_API_KEY").is_none(), "{vars}");
    assert!(vars.get("PLANT_MODE_SRC").is_none(), "{vars}");
    assert!(vars.get("CARGO_MANIFEST_DIR").is_none(), "{vars}");
    server.shutdown().await;
}

fn filesystem_config(root: &Path) -> McpServerConfig {
    stdio_config(
        "fs",
        vec![
            package_main("server-filesystem"),
            root.display().to_string(),
        ],
    )
}

#[tokio::test]
async fn filesystem_destructive_tools_need_approval_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("notes.txt"), "furnace 3 is hot\n").unwrap();
    let server = McpServer::start(&filesystem_config(&root), real_env)
        .await
        .unwrap();
    let tools = server.tools();

    for read in [
        "fs.read_text_file",
        "fs.list_directory",
        "fs.search_files",
        "fs.get_file_info",
    ] {
        let spec = find(&tools, read).spec().clone();
        assert_eq!(
            (spec.risk, spec.requires_approval),
            (Risk::Read, false),
            "{read}"
        );
    }
    for destructive in ["fs.write_file", "fs.edit_file", "fs.move_file"] {
        let spec = find(&tools, destructive).spec().clone();
        assert_eq!(
            (spec.risk, spec.requires_approval),
            (Risk::Dangerous, true),
            "{destructive}"
        );
    }
    // Annotated as writing but not destructive: write, and (as for a tool
    // with no annotations) approval only if the configuration asks for it.
    let mkdir = find(&tools, "fs.create_directory").spec().clone();
    assert_eq!((mkdir.risk, mkdir.requires_approval), (Risk::Write, false));
    assert!(mkdir.idempotent);

    let path = root.join("notes.txt").display().to_string();
    let out = call(&tools, "fs.read_text_file", json!({"path": path}))
        .await
        .unwrap();
    assert_eq!(out.content, "furnace 3 is hot\n");
    assert!(!out.is_error);

    let new_file = root.join("log.txt").display().to_string();
    let out = call(
        &tools,
        "fs.write_file",
        json!({"path": new_file, "content": "shift change"}),
    )
    .await
    .unwrap();
    assert!(!out.is_error, "{out:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("log.txt")).unwrap(),
        "shift change"
    );

    // Outside the allowed directory: the server's isError result.
    let out = call(
        &tools,
        "fs.read_text_file",
        json!({"path": "/etc/hostname"}),
    )
    .await
    .unwrap();
    assert!(out.is_error, "{out:?}");
    assert!(
        out.content.contains("denied") || out.content.contains("outside"),
        "{}",
        out.content
    );
    server.shutdown().await;
}
