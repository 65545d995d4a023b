#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! MCP annotations are hints, configuration is authority (SPEC §5):
//! `examples/keel.toml`'s tool settings loaded with `load_tools` against the
//! real `mcp-fixture --plant` server, whose tools carry no annotations.

use std::sync::Arc;
use std::time::Duration;

use keel_config::{Config, MapEnv, load_str};
use keel_protocol::{Risk, Tool, ToolContext};
use keel_tools::{LoadedTools, RiskSource, TrustOrigin, TrustSummary, load_tools};
use serde_json::json;

const FIXTURE: &str = env!("CARGO_BIN_EXE_mcp-fixture");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/keel.toml");

fn real_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `examples/keel.toml` after `edit`, with its `plant` server (a Python
/// script there) replaced by the fixture's plant mode.
fn example_config(edit: impl FnOnce(String) -> String) -> Config {
    let original = std::fs::read_to_string(EXAMPLE).unwrap();
    let server = "command = \"python3\"\nargs = [\"plant_server.py\"]\n";
    assert!(
        original.contains(server),
        "examples/keel.toml changed its plant server"
    );
    let text = edit(original).replace(
        server,
        &format!("command = {FIXTURE:?}\nargs = [\"--plant\"]\n"),
    );
    match load_str(&text, "keel.toml", &MapEnv::new()) {
        Ok(loaded) => loaded.config,
        Err(e) => panic!("{e}\n{text}"),
    }
}

/// Adds `lines` to the `[[tools.mcp]]` entry of the plant server.
fn in_plant_server(lines: &str) -> impl FnOnce(String) -> String {
    move |text| {
        text.replace(
            "args = [\"plant_server.py\"]\n",
            &format!("args = [\"plant_server.py\"]\n{lines}"),
        )
    }
}

async fn load(config: &Config) -> LoadedTools {
    let loaded = load_tools(&config.tools, real_env).await.unwrap();
    let mut names: Vec<&str> = loaded
        .tools
        .iter()
        .map(|t| t.spec().name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "furnace_status",
            "plant.batch_output",
            "plant.furnace_temperature",
            "plant.restart_furnace"
        ]
    );
    loaded
}

fn find(tools: &[Arc<dyn Tool>], name: &str) -> Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no tool {name}"))
}

/// (risk, requires_approval) of one tool.
fn trust(loaded: &LoadedTools, name: &str) -> (Risk, bool) {
    let spec = find(&loaded.tools, name).spec().clone();
    (spec.risk, spec.requires_approval)
}

fn origin(loaded: &LoadedTools, name: &str) -> TrustOrigin {
    loaded.origins[name].clone()
}

fn summary(loaded: &LoadedTools, config: &Config) -> TrustSummary {
    TrustSummary::of(&loaded.tools, &loaded.origins, config.policy.approval_risk)
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

#[tokio::test]
async fn with_the_example_config_unannotated_tools_run_and_restart_furnace_waits() {
    let config = example_config(|t| t);
    let loaded = load(&config).await;

    for read in ["plant.batch_output", "plant.furnace_temperature"] {
        assert_eq!(trust(&loaded, read), (Risk::Write, false), "{read}");
        assert_eq!(
            origin(&loaded, read),
            TrustOrigin {
                risk: RiskSource::NoAnnotations,
                requires_approval: RiskSource::NoAnnotations,
            }
        );
    }
    assert_eq!(
        trust(&loaded, "plant.restart_furnace"),
        (Risk::Dangerous, true)
    );
    let restart = find(&loaded.tools, "plant.restart_furnace");
    assert_eq!(restart.spec().roles, vec!["operator".to_string()]);
    let by_override = RiskSource::Override("plant.restart_furnace".into());
    assert_eq!(
        origin(&loaded, "plant.restart_furnace"),
        TrustOrigin {
            risk: by_override.clone(),
            requires_approval: by_override,
        }
    );
    assert_eq!(trust(&loaded, "furnace_status"), (Risk::Read, false));
    assert_eq!(origin(&loaded, "furnace_status").risk, RiskSource::HttpTool);

    assert_eq!(
        summary(&loaded, &config),
        TrustSummary {
            needs_approval: vec!["plant.restart_furnace".into()],
            unannotated: vec![
                "plant.batch_output".into(),
                "plant.furnace_temperature".into()
            ],
        }
    );

    let out = find(&loaded.tools, "plant.batch_output")
        .call(json!({"line": "L2"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out.content, "line L2: 14 batches cast today");
    loaded.shutdown().await;
}

#[tokio::test]
async fn a_server_with_requires_approval_gates_every_tool_but_overrides_still_win() {
    let config = example_config(in_plant_server("requires_approval = true\n"));
    assert_eq!(config.tools.mcp[0].requires_approval, Some(true));
    let loaded = load(&config).await;
    for name in ["plant.batch_output", "plant.furnace_temperature"] {
        assert_eq!(trust(&loaded, name), (Risk::Write, true), "{name}");
        assert_eq!(
            origin(&loaded, name),
            TrustOrigin {
                risk: RiskSource::NoAnnotations,
                requires_approval: RiskSource::Server,
            }
        );
    }
    assert_eq!(
        trust(&loaded, "plant.restart_furnace"),
        (Risk::Dangerous, true)
    );
    assert_eq!(trust(&loaded, "furnace_status"), (Risk::Read, false));
    let s = summary(&loaded, &config);
    assert_eq!(
        s.needs_approval,
        [
            "plant.batch_output",
            "plant.furnace_temperature",
            "plant.restart_furnace"
        ]
    );
    loaded.shutdown().await;

    // One tool let through by name: a per-tool override beats the server.
    let config = example_config(|t| {
        let t = in_plant_server("requires_approval = true\n")(t);
        format!("{t}\n[tools.overrides.\"plant.batch_output\"]\nrequires_approval = false\n")
    });
    let loaded = load(&config).await;
    assert_eq!(trust(&loaded, "plant.batch_output"), (Risk::Write, false));
    assert_eq!(
        origin(&loaded, "plant.batch_output").requires_approval,
        RiskSource::Override("plant.batch_output".into())
    );
    assert_eq!(
        trust(&loaded, "plant.furnace_temperature"),
        (Risk::Write, true)
    );
    loaded.shutdown().await;
}

#[tokio::test]
async fn a_server_wide_risk_applies_to_every_tool() {
    let config = example_config(in_plant_server("risk = \"dangerous\"\n"));
    let loaded = load(&config).await;
    assert_eq!(
        trust(&loaded, "plant.batch_output"),
        (Risk::Dangerous, false)
    );
    assert_eq!(
        origin(&loaded, "plant.batch_output").risk,
        RiskSource::Server
    );
    let s = summary(&loaded, &config);
    assert_eq!(
        s.needs_approval.len(),
        3,
        "risk dangerous reaches policy.approval_risk: {s:?}"
    );
    assert!(s.unannotated.is_empty(), "{s:?}");
    loaded.shutdown().await;
}

#[tokio::test]
async fn a_glob_override_applies_and_the_exact_key_still_wins() {
    let config = example_config(|t| {
        t.replace(
            "[tools.overrides.\"plant.restart_furnace\"]",
            "[tools.overrides.\"plant.*\"]\nrisk = \"read\"\nidempotent = true\n\n\
             [tools.overrides.\"plant.restart_furnace\"]",
        )
    });
    assert_eq!(config.tools.overrides.len(), 2);
    let loaded = load(&config).await;
    for name in ["plant.batch_output", "plant.furnace_temperature"] {
        assert_eq!(trust(&loaded, name), (Risk::Read, false), "{name}");
        assert!(find(&loaded.tools, name).spec().idempotent);
        assert_eq!(
            origin(&loaded, name).risk,
            RiskSource::Override("plant.*".into())
        );
    }
    let restart = find(&loaded.tools, "plant.restart_furnace");
    assert_eq!(
        (restart.spec().risk, restart.spec().requires_approval),
        (Risk::Dangerous, true),
        "the exact key is more specific than plant.*"
    );
    assert!(
        restart.spec().idempotent,
        "a field only the glob sets still applies"
    );
    assert_eq!(
        origin(&loaded, "plant.restart_furnace").risk,
        RiskSource::Override("plant.restart_furnace".into())
    );
    let s = summary(&loaded, &config);
    assert_eq!(s.needs_approval, ["plant.restart_furnace"]);
    assert!(s.unannotated.is_empty(), "{s:?}");
    loaded.shutdown().await;
}

/// After `notifications/tools/list_changed`, the re-listed tools get the
/// glob overrides too (`LoadedTools::current_tools`).
#[tokio::test]
async fn re_listed_tools_get_glob_overrides() {
    let text = format!(
        r#"
[[tools.mcp]]
name = "plant"
command = {FIXTURE:?}
timeout_s = 10

[tools.overrides."plant.*"]
requires_approval = true
[tools.overrides."plant.extra_*"]
risk = "dangerous"
[tools.overrides."plant.grow"]
requires_approval = false
"#
    );
    let config = load_str(&text, "keel.toml", &MapEnv::new()).unwrap().config;
    let loaded = load_tools(&config.tools, real_env).await.unwrap();
    let mut changes = loaded.changes();
    let grow = find(&loaded.tools, "plant.grow");
    assert!(!grow.spec().requires_approval);
    grow.call(json!({}), &ctx()).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(10), changes.changed())
            .await
            .unwrap()
    );
    let (now, origins) = loaded.current_tools_with_origins();
    let extra = find(&now, "plant.extra_1");
    assert_eq!(
        (extra.spec().risk, extra.spec().requires_approval),
        (Risk::Dangerous, true)
    );
    assert_eq!(
        origins["plant.extra_1"],
        TrustOrigin {
            risk: RiskSource::Override("plant.extra_*".into()),
            requires_approval: RiskSource::Override("plant.*".into()),
        }
    );
    let summary = TrustSummary::of(&now, &origins, config.policy.approval_risk);
    assert!(
        summary
            .needs_approval
            .contains(&"plant.extra_1".to_string())
    );
    assert!(!summary.needs_approval.contains(&"plant.grow".to_string()));
    loaded.shutdown().await;
}
