//! `keel memory add | search | reindex` on a real data dir.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use serde_json::Value;
use tokio::process::Command;

fn keel(config: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    c.env("KEEL_LOG", "warn")
        .env_remove("KEEL_CONFIG")
        .arg("--config")
        .arg(config);
    c
}

async fn run(config: &Path, args: &[&str]) -> (bool, String, String) {
    let out = keel(config).args(args).output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn add_search_reindex_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("keel.toml");
    std::fs::write(
        &config,
        format!(
            r#"[server]
data_dir = "{}"

[[providers]]
name = "main"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "m"

[[agents]]
id = "default"
provider = "main"

[[agents]]
id = "plant"
provider = "main"

[memory]
embedder = "none"
"#,
            data.display()
        ),
    )
    .unwrap();
    let manual = dir.path().join("kiln-manual.md");
    std::fs::write(
        &manual,
        "# Kiln K1 manual\n\nThe burner purge lasts 90 seconds before ignition.\n",
    )
    .unwrap();

    let (ok, out, err) = run(
        &config,
        &[
            "memory",
            "add",
            manual.to_str().unwrap(),
            "--agent",
            "plant",
        ],
    )
    .await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("kiln-manual.md") && out.contains("mem_"),
        "{out}"
    );
    // Said once, clearly: no embedding model, BM25 only.
    assert!(err.contains("BM25 only"), "{err}");
    assert!(data.join("memory.db").is_file());

    let (ok, out, err) = run(
        &config,
        &[
            "memory",
            "search",
            "burner purge",
            "--agent",
            "plant",
            "--json",
        ],
    )
    .await;
    assert!(ok, "{out}{err}");
    let hits: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(hits[0]["source"], "doc:kiln-manual.md");
    assert!(hits[0]["snippet"].as_str().unwrap().contains("90 seconds"));

    // Another agent, or another tenant, does not see it.
    let (ok, out, _) = run(&config, &["memory", "search", "burner purge", "--json"]).await;
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        Value::Array(vec![])
    );
    let (ok, out, _) = run(
        &config,
        &[
            "memory",
            "search",
            "burner purge",
            "--agent",
            "plant",
            "--tenant",
            "globex",
            "--json",
        ],
    )
    .await;
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        Value::Array(vec![])
    );

    let (ok, out, err) = run(&config, &["memory", "reindex"]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("reindexed 1 chunks"), "{out}");

    let (ok, _, err) = run(
        &config,
        &[
            "memory",
            "add",
            manual.to_str().unwrap(),
            "--agent",
            "nobody",
        ],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("nobody"), "{err}");
}
