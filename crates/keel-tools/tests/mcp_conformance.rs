#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The official MCP conformance suite's core client scenarios against
//! `keel-mcp-conformance-client`. The full suite, with the list of expected
//! failures, is `scripts/mcp-conformance.sh`; this keeps the scenarios keel
//! passes in the ordinary test run.

use std::path::PathBuf;
use std::process::Command;

const CLIENT: &str = env!("CARGO_BIN_EXE_keel-mcp-conformance-client");

fn npm_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_MCP_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/keel-npm")
        });
    for needed in [
        "node_modules/node/bin/node",
        "node_modules/@modelcontextprotocol/conformance/dist/index.js",
    ] {
        assert!(
            dir.join(needed).exists(),
            "{} is missing: run scripts/setup-mcp.sh (or set KEEL_MCP_NPM to where it installed)",
            dir.join(needed).display()
        );
    }
    dir
}

fn scenario(name: &str) {
    let dir = npm_dir();
    let results = tempfile_dir();
    let out = Command::new(dir.join("node_modules/node/bin/node"))
        .arg(dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["client", "--command", CLIENT, "--scenario", name, "-o"])
        .arg(&results)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&results);
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.contains("OVERALL: PASSED"),
        "scenario {name} failed ({}):\n{report}",
        out.status
    );
}

fn tempfile_dir() -> PathBuf {
    std::env::temp_dir().join(format!(
        "keel-mcp-conformance-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ))
}

#[test]
fn initialize() {
    scenario("initialize");
}

#[test]
fn tools_call() {
    scenario("tools_call");
}

#[test]
fn sse_retry() {
    scenario("sse-retry");
}
