//! `exec` with real processes: the allowlist, shell syntax refused, and the
//! Landlock sandbox keeping writes inside the allowed paths.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::Duration;

use keel_protocol::{Risk, Tool, ToolContext, ToolOutput};
use keel_tools::exec::{Exec, ExecSettings, Program};
use regex::Regex;
use serde_json::{Value, json};

fn ctx() -> ToolContext {
    ToolContext {
        tenant: "acme".into(),
        principal: "alice".into(),
        agent: "default".into(),
        session: "s".into(),
        run_id: "r".into(),
        call_id: "c".into(),
    }
}

fn exec(write: &std::path::Path) -> Exec {
    Exec::new(ExecSettings {
        programs: vec![
            Program {
                path: PathBuf::from("/usr/bin/touch"),
                args: vec![Regex::new(r"^/[A-Za-z0-9_./-]+$").unwrap()],
            },
            Program {
                path: PathBuf::from("/usr/bin/cat"),
                args: vec![Regex::new(r"^/[A-Za-z0-9_./-]+$").unwrap()],
            },
        ],
        read_paths: Vec::new(),
        write_paths: vec![write.to_path_buf()],
        cwd: None,
        timeout: Duration::from_secs(10),
        max_output_bytes: 4096,
        requires_approval: true,
        helper: PathBuf::from(env!("CARGO_BIN_EXE_keel-exec-sandbox")),
        helper_args: Vec::new(),
    })
}

async fn run(tool: &Exec, args: Value) -> ToolOutput {
    tool.call(args, &ctx()).await.unwrap()
}

#[tokio::test]
async fn programs_off_the_allowlist_and_shell_syntax_are_refused() {
    let allowed = tempfile::tempdir().unwrap();
    let tool = exec(allowed.path());
    let out = run(&tool, json!({"program": "rm", "args": ["-rf", "/"]})).await;
    assert!(
        out.is_error && out.content.contains("not an allowed program"),
        "{}",
        out.content
    );
    let target = allowed.path().join("x");
    for arg in [
        format!("{};id", target.display()),
        format!("{}|cat", target.display()),
        format!("$(id){}", target.display()),
        format!("`id`{}", target.display()),
    ] {
        let out = run(&tool, json!({"program": "touch", "args": [arg]})).await;
        assert!(
            out.is_error && out.content.contains("shell syntax"),
            "{arg}: {}",
            out.content
        );
    }
    let out = run(
        &tool,
        json!({"program": "touch", "args": ["-d", "2020-01-01"]}),
    )
    .await;
    assert!(
        out.is_error && out.content.contains("not allowed for"),
        "{}",
        out.content
    );
    assert!(!target.exists());
}

#[tokio::test]
async fn writes_stay_inside_the_allowed_paths() {
    let allowed = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let tool = exec(allowed.path());
    let inside = allowed.path().join("ok.txt");
    let out = run(
        &tool,
        json!({"program": "touch", "args": [inside.to_str().unwrap()]}),
    )
    .await;
    assert!(!out.is_error, "{}", out.content);
    assert!(inside.exists(), "the allowed write happened");
    let escaped = outside.path().join("escaped.txt");
    let out = run(
        &tool,
        json!({"program": "touch", "args": [escaped.to_str().unwrap()]}),
    )
    .await;
    assert!(out.is_error, "{}", out.content);
    assert!(out.content.contains("Permission denied"), "{}", out.content);
    assert!(!escaped.exists(), "the sandbox kept the write out");
    // Reading outside the allowed paths is refused too.
    std::fs::write(outside.path().join("secret.txt"), "s3cret").unwrap();
    let secret = outside.path().join("secret.txt");
    let out = run(
        &tool,
        json!({"program": "cat", "args": [secret.to_str().unwrap()]}),
    )
    .await;
    assert!(
        out.is_error && !out.content.contains("s3cret"),
        "{}",
        out.content
    );
}

#[test]
fn exec_is_an_exec_risk_tool_that_needs_approval() {
    let dir = tempfile::tempdir().unwrap();
    let tool = exec(dir.path());
    assert_eq!(tool.spec().risk, Risk::Exec);
    assert!(tool.spec().requires_approval);
    assert_eq!(
        tool.spec().parameters["properties"]["program"]["enum"],
        json!(["touch", "cat"])
    );
}
