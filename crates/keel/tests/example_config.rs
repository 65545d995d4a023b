//! `examples/keel.toml` with `examples/plant_server.py`, as its README says
//! to run them: `keel serve` started in `examples/`, the plant server
//! spawned over stdio, the tools listed with the risks the config gives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

#[tokio::test]
async fn the_example_config_serves_the_plant_servers_tools() {
    let data = tempfile::tempdir().unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["check", "--config", "keel.toml"])
        .current_dir(examples())
        .env("OPENAI_API_KEY", "unused")
        .env("KEEL_KEY_ACME", "example-key")
        .env_remove("KEEL_CONFIG")
        .output()
        .await
        .unwrap();
    assert!(check.status.success(), "{check:?}");

    let mut keel = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("serve")
        .current_dir(examples())
        .env("OPENAI_API_KEY", "unused")
        .env("KEEL_KEY_ACME", "example-key")
        .env("KEEL_BIND", "127.0.0.1:0")
        .env("KEEL_DATA_DIR", data.path())
        .env("KEEL_LOG", "warn")
        .env_remove("KEEL_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(keel.stdout.take().unwrap()).lines();
    let base = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(url) = line.trim().strip_prefix("keel listening on ") {
                return url.trim_end_matches('/').to_owned();
            }
        }
        panic!("keel exited before it listened")
    })
    .await
    .expect("keel listens within 60 s");

    let http = reqwest::Client::new();
    let unauthenticated = http.get(format!("{base}/ai/tools")).send().await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    let tools: Value = http
        .get(format!("{base}/ai/tools"))
        .bearer_auth("example-key")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tool = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing from {tools}"))
            .clone()
    };
    for read in [
        "plant.furnace_temperature",
        "plant.list_batches",
        "plant.batch_output",
        "plant.restart_log",
    ] {
        assert_eq!(tool(read)["risk"], "read", "{read}");
        assert_eq!(tool(read)["requires_approval"], false, "{read}");
    }
    assert_eq!(tool("plant.set_furnace_setpoint")["risk"], "write");
    let restart = tool("plant.restart_furnace");
    assert_eq!(restart["risk"], "dangerous");
    assert_eq!(restart["requires_approval"], true);
    assert_eq!(tool("furnace_status")["risk"], "read");
}
