//! keel's MCP client as the official conformance suite
//! (`@modelcontextprotocol/conformance client`) drives it: the suite starts
//! a scenario server and runs this program with the server's URL as the
//! last argument and the scenario in `MCP_CONFORMANCE_SCENARIO`. It does
//! what keel does with any streamable-HTTP server: connect (negotiating the
//! protocol generation), list the tools, and call each of them with
//! arguments made from its input schema. Exit status 0 means every step
//! worked as far as the client can tell; the suite judges the rest.
//!
//! Run by `scripts/mcp-conformance.sh`.

use std::collections::BTreeMap;
use std::process::ExitCode;

use keel_config::McpServerConfig;
use keel_protocol::ToolContext;
use keel_tools::mcp::McpServer;
use serde_json::{Map, Value, json};

#[tokio::main]
async fn main() -> ExitCode {
    let Some(url) = std::env::args().skip(1).last() else {
        eprintln!("usage: keel-mcp-conformance-client <server-url>");
        return ExitCode::from(2);
    };
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    eprintln!("scenario {scenario:?} against {url}");
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keel-mcp-conformance-client: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<(), String> {
    let cfg = McpServerConfig {
        name: "conformance".into(),
        command: None,
        args: Vec::new(),
        env: BTreeMap::new(),
        url: Some(url.into()),
        timeout_s: 10,
        risk: None,
        requires_approval: None,
        output_trust: None,
    };
    // The environment is irrelevant to an HTTP server.
    let server = McpServer::start(&cfg, |_: &str| None)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!("connected, protocol {}", server.protocol_version());
    let ctx = ToolContext {
        tenant: "conformance".into(),
        principal: "conformance".into(),
        agent: "conformance".into(),
        session: "conformance".into(),
        run_id: "conformance".into(),
        call_id: "conformance".into(),
    };
    let mut failures = Vec::new();
    for tool in server.tools() {
        let spec = tool.spec();
        let args = arguments_for(&spec.parameters);
        eprintln!("calling {} with {args}", spec.name);
        match tool.call(args, &ctx).await {
            Ok(out) if out.is_error => {
                failures.push(format!("{}: tool error: {}", spec.name, out.content));
            }
            Ok(out) => eprintln!("{} -> {}", spec.name, out.content),
            Err(e) => failures.push(format!("{}: {e}", spec.name)),
        }
    }
    server.shutdown().await;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Plausible arguments for an input schema: every required property gets
/// a value of its type (numbers count up so sums are checkable).
fn arguments_for(schema: &Value) -> Value {
    let mut args = Map::new();
    let properties = schema.get("properties").and_then(Value::as_object);
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut next_number = 5;
    for name in required.iter().filter_map(Value::as_str) {
        let property = properties.and_then(|p| p.get(name));
        if let Some(default) = property.and_then(|p| p.get("default")) {
            args.insert(name.to_owned(), default.clone());
            continue;
        }
        if let Some(first) = property
            .and_then(|p| p.get("enum"))
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            args.insert(name.to_owned(), first.clone());
            continue;
        }
        let kind = property
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("string");
        let value = match kind {
            "number" | "integer" => {
                let n = next_number;
                next_number -= 2;
                json!(n)
            }
            "boolean" => json!(true),
            "array" => json!([]),
            "object" => json!({}),
            _ => json!("keel"),
        };
        args.insert(name.to_owned(), value);
    }
    Value::Object(args)
}
