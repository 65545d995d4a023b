//! Errors of building tools from configuration. Calls fail with
//! keel-protocol's `ToolError` instead; these are for startup, where the
//! operator has to fix the configuration.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolsError {
    #[error("http tool {tool}: header {header} references ${{{var}}}, which is not set")]
    HeaderEnv {
        tool: String,
        header: String,
        var: String,
    },
    #[error("http tool {tool}: {reason}")]
    InvalidHttpTool { tool: String, reason: String },
    #[error("tool {tool}: invalid parameter schema: {reason}")]
    InvalidSchema { tool: String, reason: String },
    #[error("mcp server {server}: env {key} references ${{{var}}}, which is not set")]
    McpEnv {
        server: String,
        key: String,
        var: String,
    },
    #[error("mcp server {server}: {reason}")]
    McpConfig { server: String, reason: String },
    #[error("mcp server {server} (command `{command}`) failed to start: {reason}")]
    McpStart {
        server: String,
        command: String,
        reason: String,
    },
    #[error("mcp server {server} (url {url}) could not be reached: {reason}")]
    McpConnect {
        server: String,
        url: String,
        reason: String,
    },
    #[error("tool {0} is defined more than once")]
    DuplicateTool(String),
}
