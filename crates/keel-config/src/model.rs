//! The configuration schema. Field names are the contract (SPEC §12).

use std::collections::BTreeMap;

use keel_protocol::Risk;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    #[serde(default)]
    pub agents: Vec<AgentConfig>,
    #[serde(default)]
    pub tools: ToolsConfig,
    #[serde(default)]
    pub verify: VerifyConfig,
    #[serde(default)]
    pub auth: AuthConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_bind")]
    pub bind: String,
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// `sqlite://PATH` (default: `keel.db` under `data_dir`) or `postgres://…`.
    #[serde(default)]
    pub database_url: Option<String>,
    /// Largest request body accepted, in bytes.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: default_bind(),
            data_dir: default_data_dir(),
            database_url: None,
            max_body_bytes: default_max_body(),
        }
    }
}

fn default_bind() -> String {
    "127.0.0.1:8780".into()
}
fn default_data_dir() -> String {
    "./data".into()
}
fn default_max_body() -> usize {
    1024 * 1024
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    Local,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    #[default]
    Native,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: ProviderKind,
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    pub model: String,
    #[serde(default)]
    pub context_window: Option<u64>,
    #[serde(default)]
    pub tool_mode: ToolMode,
    /// Whether to stream completions (default true).
    #[serde(default = "yes")]
    pub stream: bool,
    /// Per-request timeout in seconds.
    #[serde(default = "default_provider_timeout")]
    pub timeout_s: u64,
    /// Retries after the first attempt for retryable failures.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// First backoff delay in milliseconds; doubled each retry, capped at 30 s.
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
}

fn yes() -> bool {
    true
}
fn default_provider_timeout() -> u64 {
    120
}
fn default_max_retries() -> u32 {
    3
}
fn default_backoff_ms() -> u64 {
    500
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    #[default]
    SingleLoop,
    PreRoute,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub id: String,
    pub provider: String,
    #[serde(default)]
    pub system_prompt: String,
    /// Tool name patterns this agent may use; `*` matches any run of characters.
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub routing: Routing,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub loop_detection: LoopDetection,
    #[serde(default)]
    pub drift: Drift,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "d_max_steps")]
    pub max_steps: u32,
    #[serde(default = "d_max_tool_calls")]
    pub max_tool_calls: u32,
    #[serde(default = "d_max_wall_time")]
    pub max_wall_time_s: u64,
    #[serde(default = "d_max_clarify")]
    pub max_clarify_rounds: u32,
    /// Prompt plus completion tokens over the whole run; 0 = unlimited.
    #[serde(default)]
    pub max_tokens: u64,
    /// Characters in one prompt; 0 = unlimited.
    #[serde(default)]
    pub max_context_chars: u64,
    /// Repair turns allowed per tool in a row after invalid arguments.
    #[serde(default = "d_max_repairs")]
    pub max_repairs: u32,
    /// Characters of one tool result shown to the model before truncation.
    #[serde(default = "d_max_tool_output")]
    pub max_tool_output_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_steps: d_max_steps(),
            max_tool_calls: d_max_tool_calls(),
            max_wall_time_s: d_max_wall_time(),
            max_clarify_rounds: d_max_clarify(),
            max_tokens: 0,
            max_context_chars: 0,
            max_repairs: d_max_repairs(),
            max_tool_output_chars: d_max_tool_output(),
        }
    }
}

fn d_max_steps() -> u32 {
    12
}
fn d_max_tool_calls() -> u32 {
    20
}
fn d_max_wall_time() -> u64 {
    300
}
fn d_max_clarify() -> u32 {
    2
}
fn d_max_repairs() -> u32 {
    2
}
fn d_max_tool_output() -> usize {
    16 * 1024
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopDetection {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "d_repeat_warning")]
    pub repeat_warning: u32,
    #[serde(default = "d_repeat_critical")]
    pub repeat_critical: u32,
    #[serde(default = "d_breaker")]
    pub max_tool_calls_breaker: u32,
}

impl Default for LoopDetection {
    fn default() -> Self {
        Self {
            enabled: true,
            repeat_warning: d_repeat_warning(),
            repeat_critical: d_repeat_critical(),
            max_tool_calls_breaker: d_breaker(),
        }
    }
}

fn d_repeat_warning() -> u32 {
    3
}
fn d_repeat_critical() -> u32 {
    5
}
fn d_breaker() -> u32 {
    30
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drift {
    #[serde(default = "d_interval")]
    pub reflection_interval: u32,
    #[serde(default = "d_interval")]
    pub checkpoint_interval: u32,
}

impl Default for Drift {
    fn default() -> Self {
        Self {
            reflection_interval: d_interval(),
            checkpoint_interval: d_interval(),
        }
    }
}

fn d_interval() -> u32 {
    5
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    #[serde(default)]
    pub mcp: Vec<McpServerConfig>,
    #[serde(default)]
    pub http: Vec<HttpToolConfig>,
    /// Per-tool settings by full tool name (e.g. `plant.restart_furnace`).
    #[serde(default)]
    pub overrides: BTreeMap<String, ToolOverride>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of the server's tools: `<name>.<tool>`.
    pub name: String,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for the server process. Values may reference
    /// variables as `${VAR}`; keel's own environment is not inherited.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub url: Option<String>,
    /// Timeout of one tool call, in seconds.
    #[serde(default = "d_tool_timeout")]
    pub timeout_s: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    pub name: String,
    pub description: String,
    #[serde(default = "d_method")]
    pub method: String,
    /// URL template; `{param}` is replaced by the URL-encoded argument.
    pub url: String,
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
    /// Header values may reference environment variables as `${VAR}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub output_schema: Option<Value>,
    #[serde(default)]
    pub risk: Option<Risk>,
    #[serde(default)]
    pub requires_approval: Option<bool>,
    #[serde(default)]
    pub idempotent: Option<bool>,
    #[serde(default)]
    pub timeout_s: Option<u64>,
    #[serde(default)]
    pub roles: Option<Vec<String>>,
    #[serde(default)]
    pub poll: Option<bool>,
}

fn d_method() -> String {
    "GET".into()
}
fn d_tool_timeout() -> u64 {
    30
}
fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// Settings applied over what a tool declares for itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    #[serde(default)]
    pub risk: Option<Risk>,
    #[serde(default)]
    pub requires_approval: Option<bool>,
    #[serde(default)]
    pub idempotent: Option<bool>,
    #[serde(default)]
    pub timeout_s: Option<u64>,
    #[serde(default)]
    pub roles: Option<Vec<String>>,
    #[serde(default)]
    pub poll: Option<bool>,
    #[serde(default)]
    pub volatile_fields: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    #[serde(default = "d_tenant_field")]
    pub tenant_field: String,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self {
            tenant_field: d_tenant_field(),
        }
    }
}

fn d_tenant_field() -> String {
    "tenant_id".into()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub keys: Vec<ApiKeyConfig>,
    #[serde(default)]
    pub approver_roles: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Environment variable holding the key's value.
    pub key_env: String,
    pub tenant: String,
    pub principal: String,
    #[serde(default)]
    pub roles: Vec<String>,
}

/// Whether `name` matches a tool pattern where `*` matches any run of characters.
pub fn tool_pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            if rest.is_empty() {
                return true;
            }
            (0..=tail.len())
                .filter(|i| tail.is_char_boundary(*i))
                .any(|i| tool_pattern_matches(rest, &tail[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tool_pattern_matches as m;

    #[test]
    fn patterns() {
        assert!(m("plant.*", "plant.restart"));
        assert!(!m("plant.*", "plantx.restart"));
        assert!(m("*", "anything"));
        assert!(m("furnace_status", "furnace_status"));
        assert!(!m("furnace_status", "furnace_status2"));
        assert!(m("a*c", "abbbc"));
        assert!(!m("a*c", "abbb"));
    }
}
