//! Entry points for the fuzz targets under `fuzz/`: what keel does with the
//! bytes an MCP server sends, with no server. Not part of the supported API.

use std::time::Duration;

use keel_protocol::{ToolOutput, ToolSpec};
use rmcp::model::{CallToolResult, ListToolsResult, ServerJsonRpcMessage, ServerResult};
use serde_json::Value;

use super::tool::{RemoteTool, ServerDefaults, to_output};

/// The server name the converted tools are prefixed with.
pub const SERVER: &str = "fuzz";

/// What keel made of one message.
#[derive(Debug, Default)]
pub struct Read {
    /// The message as JSON-RPC, or why it is not one.
    pub message: Option<Result<ServerJsonRpcMessage, String>>,
    /// Specs of the tools a `tools/list` result offers.
    pub tools: Vec<ToolSpec>,
    /// The outputs a `tools/call` result becomes.
    pub outputs: Vec<ToolOutput>,
}

/// One JSON-RPC message body as the streamable-HTTP client reads it, then
/// what keel does with the results it acts on: a tool list becomes tool
/// specs, a tool result the output the model sees. The `result` member is
/// also read as each of those types directly, as a client that asked for
/// one would.
pub fn server_message(body: &[u8]) -> Read {
    let mut read = Read {
        message: Some(
            serde_json::from_slice::<ServerJsonRpcMessage>(body).map_err(|e| e.to_string()),
        ),
        ..Read::default()
    };
    if let Some(Ok(ServerJsonRpcMessage::Response(response))) = &read.message {
        match &response.result {
            ServerResult::ListToolsResult(list) => read.tools.extend(specs(list.clone())),
            ServerResult::CallToolResult(result) => read.outputs.push(to_output(result.clone())),
            _ => {}
        }
    }
    let result = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("result").cloned());
    if let Some(result) = result {
        if let Ok(list) = serde_json::from_value::<ListToolsResult>(result.clone()) {
            read.tools.extend(specs(list));
        }
        if let Ok(call) = serde_json::from_value::<CallToolResult>(result) {
            read.outputs.push(to_output(call));
        }
    }
    read
}

fn specs(list: ListToolsResult) -> impl Iterator<Item = ToolSpec> {
    list.tools.into_iter().filter_map(|tool| {
        RemoteTool::from_mcp(
            SERVER,
            tool,
            Duration::from_secs(1),
            ServerDefaults::default(),
        )
        .map(RemoteTool::into_spec)
    })
}
