//! The plant the scenarios run against: the same tools the end-to-end
//! suite serves over HTTP, here as closures in the same process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use keel_protocol::Risk;
use keel_test_support::harness::{TestRuntime, TestRuntimeBuilder, TestTool, async_tool, tool};
use keel_test_support::scripted::{Gate, ScriptedModel};
use serde_json::{Value, json};

/// A batch of another tenant that must never reach acme's model or events.
pub const FOREIGN: &str = "GLOBEX-SECRET-BATCH";

fn furnace_id_schema(description: Option<&str>) -> Value {
    let mut furnace_id = json!({"type": "string"});
    if let Some(d) = description {
        furnace_id["description"] = json!(d);
    }
    json!({
        "type": "object",
        "properties": {"furnace_id": furnace_id},
        "required": ["furnace_id"]
    })
}

/// Read-only, idempotent status of one furnace.
pub fn furnace_status() -> TestTool {
    tool(
        "furnace_status",
        furnace_id_schema(Some("Furnace id, e.g. F2")),
        |args| {
            let id = args["furnace_id"].as_str().unwrap_or_default().to_owned();
            json!({"furnace_id": id, "status": "running", "temperature_c": 1450, "batch": format!("B-{id}-7")})
        },
    )
    .description("Current status of one furnace")
    .idempotent(true)
}

/// A write that only operators may use.
pub fn restart_furnace() -> TestTool {
    tool(
        "restart_furnace",
        furnace_id_schema(None),
        |args| json!({"restarted": args["furnace_id"]}),
    )
    .description("Restart a furnace")
    .risk(Risk::Write)
    .roles(&["operator"])
}

/// Dangerous: the policy asks a person before it runs.
pub fn shutdown_line() -> TestTool {
    tool(
        "shutdown_line",
        furnace_id_schema(None),
        |args| json!({"shut_down": args["furnace_id"]}),
    )
    .description("Shut a casting line down")
    .risk(Risk::Dangerous)
}

/// A backend that forgets to filter by tenant unless told `only`.
pub fn tenant_rows() -> TestTool {
    tool(
        "tenant_rows",
        json!({"type": "object", "properties": {"tenant_id": {"type": "string"}, "only": {"type": "string"}}}),
        |args| {
            let mut rows = vec![json!({"tenant_id": "acme", "batch": "A-1", "output_kg": 120})];
            if args["only"] != "acme" {
                rows.push(json!({"tenant_id": "globex", "batch": FOREIGN, "output_kg": 999}));
            }
            json!({"rows": rows})
        },
    )
    .description("Production rows of the caller's plant")
}

/// A slow operation that finishes only once `gate` is open.
pub fn gated_op(gate: &Gate) -> TestTool {
    let gate = gate.clone();
    async_tool(
        "slow_op",
        json!({"type": "object", "properties": {"label": {"type": "string"}}}),
        move |_args, _ctx| {
            let gate = gate.clone();
            async move {
                gate.wait().await;
                json!({"done": true})
            }
        },
    )
    .description("A slow operation that is not safe to repeat")
}

/// The plant's standard tools around `model`.
pub fn plant(model: ScriptedModel) -> TestRuntimeBuilder {
    TestRuntime::builder(model)
        .tool(furnace_status())
        .tool(restart_furnace())
        .tool(shutdown_line())
        .tool(tenant_rows())
}

/// The `code` of each `react_feedback` payload, in order.
pub fn codes(feedback: &[Value]) -> Vec<&str> {
    feedback
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect()
}
