//! MCP annotations are hints, configuration is authority (SPEC §5), through
//! a real `keel serve`: the plant server (`mcp-fixture --plant`) publishes
//! no annotations, and `examples/keel.toml`'s override of
//! `plant.restart_furnace` is what makes that one tool wait for a human.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Env, KEY_ACME, Keel, mcp_fixture};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::sse::Frame;
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/keel.toml");

/// The `[tools.overrides."plant.restart_furnace"]` table of
/// `examples/keel.toml`, as written there.
fn example_restart_override() -> String {
    let example = std::fs::read_to_string(EXAMPLE).unwrap();
    let start = example
        .find("[tools.overrides.\"plant.restart_furnace\"]")
        .expect("examples/keel.toml overrides plant.restart_furnace");
    let table = &example[start..];
    let end = table.find("\n\n").unwrap_or(table.len());
    format!("{}\n", &table[..end])
}

/// The plant server as `[[tools.mcp]]`, plus `server_lines` inside it.
fn plant_server(server_lines: &str) -> String {
    format!(
        "[[tools.mcp]]\nname = \"plant\"\ncommand = {:?}\nargs = [\"--plant\"]\n{server_lines}\n",
        mcp_fixture().display().to_string()
    )
}

async fn start(model: &FakeOpenAi, tools: &ToolServer, extra_tools: String) -> Keel {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    env.log = "info".into();
    env.extra_tools = extra_tools;
    Keel::start_with(&env, |cfg| {
        cfg.replace(
            "tools = [\"furnace_status\"",
            "tools = [\"plant.*\", \"furnace_status\"",
        )
    })
    .await
}

fn frames_of<'a>(frames: &'a [Frame], event: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|f| f.event == event)
        .map(|f| &f.data)
        .collect()
}

#[tokio::test]
async fn plant_reads_run_without_approval_and_restart_furnace_waits() {
    let extra = format!("{}\n{}", plant_server(""), example_restart_override());
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("plant.batch_output", json!({"line": "L2"})),
        Reply::tool_call("plant.furnace_temperature", json!({"furnace_id": "F2"})),
        Reply::tool_call("plant.restart_furnace", json!({"furnace_id": "F2"})),
        Reply::text("F2 was restarted."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = start(&model, &tools, extra).await;

    let log = keel.log();
    assert!(
        log.contains("tools needing approval: plant.restart_furnace, shutdown_line"),
        "{log}"
    );
    assert!(
        log.contains(
            "tools with no MCP annotations (risk write by default): plant.batch_output, plant.furnace_temperature"
        ),
        "{log}"
    );

    let id = keel
        .start_run("How is line L2 doing? Then restart F2.", Some(KEY_ACME))
        .await;
    let before = keel
        .events_until(&id, None, Some(KEY_ACME), |f| {
            f.event == "approval_required"
        })
        .await;
    let results = frames_of(&before, "tool_result");
    assert_eq!(results.len(), 2, "both reads ran before any approval");
    assert_eq!(results[0]["tool"], "plant.batch_output");
    assert_eq!(results[0]["ok"], true, "{}", results[0]);
    assert!(
        results[0]["output"]
            .as_str()
            .unwrap()
            .contains("line L2: 14 batches cast today"),
        "{}",
        results[0]
    );
    assert_eq!(results[1]["tool"], "plant.furnace_temperature");
    assert_eq!(results[1]["ok"], true, "{}", results[1]);
    let asked = frames_of(&before, "approval_required");
    assert_eq!(asked.len(), 1, "only restart_furnace asks");
    assert_eq!(asked[0]["tool"], "plant.restart_furnace");
    assert_eq!(asked[0]["risk"], "dangerous");

    keel.wait_status(&id, "waiting_approval", Some(KEY_ACME))
        .await;
    let aid = asked[0]["approval_id"].as_str().unwrap();
    let (code, decided) = keel
        .post(
            &format!("/ai/approvals/{aid}"),
            json!({"decision": "approve", "reason": "planned restart"}),
            Some(KEY_ACME),
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "F2 was restarted.");
    let frames = keel.events(&id, None, Some(KEY_ACME)).await;
    let restart = frames_of(&frames, "tool_result")
        .into_iter()
        .find(|r| r["tool"] == "plant.restart_furnace")
        .expect("restart_furnace ran once approved");
    assert_eq!(restart["ok"], true, "{restart}");
    assert!(
        restart["output"]
            .as_str()
            .unwrap()
            .contains("furnace F2 restarted")
    );
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}

#[tokio::test]
async fn a_server_with_requires_approval_gates_even_its_reads() {
    let extra = format!(
        "{}\n{}",
        plant_server("requires_approval = true"),
        example_restart_override()
    );
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("plant.batch_output", json!({"line": "L2"})),
        Reply::text("unused"),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let keel = start(&model, &tools, extra).await;
    assert!(
        keel.log().contains(
            "tools needing approval: plant.batch_output, plant.furnace_temperature, plant.restart_furnace, shutdown_line"
        ),
        "{}",
        keel.log()
    );

    let id = keel
        .start_run("How is line L2 doing?", Some(KEY_ACME))
        .await;
    let frames = keel
        .events_until(&id, None, Some(KEY_ACME), |f| {
            f.event == "approval_required"
        })
        .await;
    assert!(frames_of(&frames, "tool_result").is_empty(), "nothing ran");
    let asked = frames_of(&frames, "approval_required");
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["tool"], "plant.batch_output");
    assert_eq!(asked[0]["risk"], "write");
    keel.wait_status(&id, "waiting_approval", Some(KEY_ACME))
        .await;
}

#[tokio::test]
async fn a_glob_override_sets_the_server_and_the_exact_key_still_wins() {
    let extra = format!(
        "{}\n[tools.overrides.\"plant.*\"]\nrisk = \"read\"\n\n{}",
        plant_server(""),
        example_restart_override()
    );
    let model = FakeOpenAi::start(Script::queue(vec![Reply::text("unused")])).await;
    let tools = ToolServer::start().await;
    let keel = start(&model, &tools, extra).await;
    let (code, listed) = keel.get("/ai/tools", Some(KEY_ACME)).await;
    assert_eq!(code, 200, "{listed}");
    let tool = |name: &str| -> (String, bool) {
        let t = listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {listed}"));
        (
            t["risk"].as_str().unwrap().to_owned(),
            t["requires_approval"].as_bool().unwrap(),
        )
    };
    assert_eq!(tool("plant.batch_output"), ("read".into(), false));
    assert_eq!(tool("plant.furnace_temperature"), ("read".into(), false));
    assert_eq!(tool("plant.restart_furnace"), ("dangerous".into(), true));
    assert!(
        keel.log()
            .contains("tools with no MCP annotations (risk write by default): none"),
        "the glob decided their risk: {}",
        keel.log()
    );
}
