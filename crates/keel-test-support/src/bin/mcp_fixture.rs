#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A real MCP server over stdio for keel's tests. Each tool exercises one
//! behaviour of the client: plain text, structured results, tool errors,
//! slowness, a crash, per-process state, environment visibility and
//! annotations. `tools/list` is paginated (three per page) so clients must
//! follow cursors.
//!
//! `mcp-fixture --exit-at-start` exits with code 3 before speaking MCP, to
//! stand for a server that cannot start.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Value, json};

const PAGE_SIZE: usize = 3;

#[derive(Default)]
struct Fixture {
    count_calls: AtomicU64,
}

fn tool(v: Value) -> Tool {
    serde_json::from_value(v).expect("fixture tool definition")
}

fn catalog() -> Vec<Tool> {
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
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
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
        let all = catalog();
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
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
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
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--exit-at-start") {
        eprintln!("mcp-fixture: exiting at start as asked");
        std::process::exit(3);
    }
    let service = Fixture::default()
        .serve(rmcp::transport::stdio())
        .await
        .expect("serve mcp over stdio");
    service.waiting().await.expect("mcp service");
}
