#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A real MCP server over stdio for keel's tests. Each tool exercises one
//! behaviour of the client: plain text, structured results, tool errors,
//! slowness, a crash, per-process state, environment visibility,
//! annotations and a tool list that changes (`grow` adds a tool and sends
//! `notifications/tools/list_changed`, on a `subscriptions/listen` stream
//! for `2026-07-28` sessions, unsolicited for `initialize` ones).
//! `tools/list` is paginated (three per page) so clients must follow cursors.
//!
//! `mcp-fixture --exit-at-start` exits with code 3 before speaking MCP, to
//! stand for a server that cannot start.
//!
//! `mcp-fixture --print-env NAME` first writes `NAME=<value>` to stderr,
//! which keel copies into its log: a server that logs its own secret.
//!
//! `mcp-fixture --plant` serves a plant data server instead, as most MCP
//! servers are written: its tools carry no annotations at all, including
//! `restart_furnace`, which only the operator's configuration can mark as
//! dangerous.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter,
    Tool,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext, SubscriptionSink};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Value, json};

const PAGE_SIZE: usize = 3;

#[derive(Default)]
struct Fixture {
    /// Serve [`plant_catalog`] instead of the behaviour catalog.
    plant: bool,
    count_calls: AtomicU64,
    /// How many `extra_<n>` tools `grow` has added.
    extra: AtomicU64,
    /// Open `subscriptions/listen` streams of modern sessions.
    sinks: Mutex<Vec<SubscriptionSink>>,
}

fn tool(v: Value) -> Tool {
    serde_json::from_value(v).expect("fixture tool definition")
}

fn catalog(extra: u64) -> Vec<Tool> {
    let mut tools = base_catalog();
    tools.extend((1..=extra).map(|n| {
        tool(json!({
            "name": format!("extra_{n}"),
            "description": format!("Tool number {n} added by grow"),
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"readOnlyHint": true}
        }))
    }));
    tools
}

/// Plant data tools without any `annotations`, so neither
/// `readOnlyHint` nor `destructiveHint` is said.
fn plant_catalog() -> Vec<Tool> {
    vec![
        tool(json!({
            "name": "batch_output",
            "description": "Cast batches of one casting line today",
            "inputSchema": {"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]}
        })),
        tool(json!({
            "name": "furnace_temperature",
            "description": "Current temperature of one furnace",
            "inputSchema": {"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}
        })),
        tool(json!({
            "name": "restart_furnace",
            "description": "Restart a furnace",
            "inputSchema": {"type": "object", "properties": {"furnace_id": {"type": "string"}}, "required": ["furnace_id"]}
        })),
    ]
}

fn base_catalog() -> Vec<Tool> {
    vec![
        tool(json!({
            "name": "echo",
            "description": "Returns the text it is given",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            "annotations": {"readOnlyHint": true, "idempotentHint": true}
        })),
        tool(json!({
            "name": "add",
            "description": "Adds two numbers",
            "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
            "outputSchema": {"type": "object", "properties": {"sum": {"type": "number"}}, "required": ["sum"]},
            "annotations": {"readOnlyHint": true}
        })),
        tool(json!({
            "name": "fail",
            "description": "Always reports a tool error",
            "inputSchema": {"type": "object", "properties": {}}
        })),
        tool(json!({
            "name": "slow",
            "description": "Sleeps for ms milliseconds",
            "inputSchema": {"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]},
            "annotations": {"readOnlyHint": true}
        })),
        tool(json!({
            "name": "crash",
            "description": "Exits the server process with code 1",
            "inputSchema": {"type": "object", "properties": {}}
        })),
        tool(json!({
            "name": "count",
            "description": "How many times count was called in this process",
            "inputSchema": {"type": "object", "properties": {}}
        })),
        tool(json!({
            "name": "env",
            "description": "Value of one environment variable of the server process",
            "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            "annotations": {"readOnlyHint": true}
        })),
        tool(json!({
            "name": "grow",
            "description": "Adds a tool and announces the change",
            "inputSchema": {"type": "object", "properties": {}}
        })),
        tool(json!({
            "name": "wipe",
            "description": "Pretends to delete everything",
            "inputSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}},
            "annotations": {"readOnlyHint": false, "destructiveHint": true}
        })),
    ]
}

fn text(s: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(s)]).into()
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.sinks.lock().unwrap().push(context.sink().clone());
        context.cancelled().await;
        Ok(())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let start: usize = request
            .and_then(|r| r.cursor)
            .map(|c| {
                c.parse()
                    .map_err(|_| ErrorData::invalid_params("bad cursor", None))
            })
            .transpose()?
            .unwrap_or(0);
        let all = if self.plant {
            plant_catalog()
        } else {
            catalog(self.extra.load(Ordering::SeqCst))
        };
        let end = (start + PAGE_SIZE).min(all.len());
        let mut page = ListToolsResult::with_all_items(all[start.min(end)..end].to_vec());
        if end < all.len() {
            page.next_cursor = Some(end.to_string());
        }
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        if self.plant {
            return plant_call(request.name.as_ref(), &args);
        }
        match request.name.as_ref() {
            "echo" => Ok(text(args["text"].as_str().unwrap_or_default())),
            "add" => {
                let sum = args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0);
                Ok(CallToolResult::structured(json!({"sum": sum})).into())
            }
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text(
                "fail: the furnace is on fire",
            )])
            .into()),
            "slow" => {
                let ms = args["ms"].as_u64().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(text(format!("slept {ms} ms")))
            }
            "crash" => std::process::exit(1),
            "count" => {
                let n = self.count_calls.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(text(n.to_string()))
            }
            "env" => {
                let name = args["name"].as_str().unwrap_or_default();
                Ok(text(
                    std::env::var(name).unwrap_or_else(|_| "<unset>".into()),
                ))
            }
            "wipe" => Ok(text("wiped")),
            "grow" => {
                let n = self.extra.fetch_add(1, Ordering::SeqCst) + 1;
                let legacy = context
                    .protocol_version()
                    .is_none_or(|v| v.has_initialize());
                if legacy {
                    context.peer.notify_tool_list_changed().await.unwrap();
                } else {
                    // rmcp acknowledges a subscription before it calls
                    // `listen`; give an acknowledged one time to arrive.
                    for _ in 0..100 {
                        if !self.sinks.lock().unwrap().is_empty() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    let sinks = self.sinks.lock().unwrap().clone();
                    for sink in sinks {
                        let _ = sink.notify_tool_list_changed().await;
                    }
                }
                Ok(text(format!("added extra_{n}")))
            }
            name if name.starts_with("extra_") => Ok(text(name.to_string())),
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}

fn plant_call(name: &str, args: &Value) -> Result<CallToolResponse, ErrorData> {
    match name {
        "batch_output" => {
            let line = args["line"].as_str().unwrap_or_default();
            Ok(text(format!("line {line}: 14 batches cast today")))
        }
        "furnace_temperature" => {
            let id = args["furnace_id"].as_str().unwrap_or_default();
            Ok(text(format!("furnace {id}: 1452 °C")))
        }
        "restart_furnace" => {
            let id = args["furnace_id"].as_str().unwrap_or_default();
            Ok(text(format!("furnace {id} restarted")))
        }
        other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--exit-at-start") {
        eprintln!("mcp-fixture: exiting at start as asked");
        std::process::exit(3);
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--print-env")
        && let Some(name) = args.get(at + 1)
    {
        let value = std::env::var(name).unwrap_or_else(|_| "<unset>".into());
        eprintln!("mcp-fixture: {name}={value}");
    }
    let fixture = Fixture {
        plant: std::env::args().any(|a| a == "--plant"),
        ..Fixture::default()
    };
    let service = fixture
        .serve(rmcp::transport::stdio())
        .await
        .expect("serve mcp over stdio");
    service.waiting().await.expect("mcp service");
}
