//! The configuration schema. Field names are the contract (SPEC §12).

use std::collections::BTreeMap;

use keel_protocol::Risk;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gateway::{ChannelConfig, RoutingConfig};

/// The whole of `keel.toml`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    /// The model endpoints agents use.
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    /// The agents a run can be started with; `default`, or else the first,
    /// serves runs that name none.
    #[serde(default)]
    pub agents: Vec<AgentConfig>,
    #[serde(default)]
    pub tools: ToolsConfig,
    #[serde(default)]
    pub verify: VerifyConfig,
    #[serde(default)]
    pub policy: PolicyConfig,
    /// `before_tool_call` hooks, applied in this order (SPEC §4.5).
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub memory: MemoryConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Chat channels (Telegram, Slack, signed webhooks) whose messages
    /// start runs (docs/gateway.md).
    #[serde(default)]
    pub channels: Vec<ChannelConfig>,
    #[serde(default)]
    pub routing: RoutingConfig,
    /// Per-tenant quotas (docs/quotas.md); a tenant not listed is unlimited.
    #[serde(default)]
    pub tenants: Vec<crate::tenants::TenantConfig>,
}

/// OpenTelemetry traces: one `invoke_agent` span per run, `chat` per model
/// call, `execute_tool` per tool call, guard decisions as span events,
/// after the GenAI semantic conventions (docs/telemetry.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OTLP/HTTP collector base URL; spans are sent (protobuf) to
    /// `<otlp_endpoint>/v1/traces`. Unset: the standard
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` applies, and with neither nothing is
    /// exported.
    #[schemars(example = &"http://127.0.0.1:4318")]
    pub otlp_endpoint: Option<String>,
    /// Put prompts, answers, tool arguments and tool results into spans.
    /// Off: spans carry names, ids, token counts and outcomes only.
    pub capture_content: bool,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            capture_content: false,
            service_name: "keel".to_owned(),
        }
    }
}

/// The HTTP server and where runs are stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the API listens on, `host:port`. Without `[[auth.keys]]`
    /// only a loopback address is accepted.
    pub bind: String,
    /// Directory for the SQLite database and downloaded models.
    pub data_dir: String,
    /// `sqlite://PATH` (default: `keel.db` under `data_dir`) or `postgres://…`.
    #[schemars(example = &"sqlite://./data/keel.db")]
    pub database_url: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// This node's name among the nodes sharing a PostgreSQL database
    /// (default: `<hostname>-<pid>-<random>`, new at every start).
    pub node_id: Option<String>,
    /// Seconds a node keeps a run without renewing its lease; a node that
    /// dies loses its runs to the others after this long.
    pub lease_s: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8780".into(),
            data_dir: "./data".into(),
            database_url: None,
            max_body_bytes: 1024 * 1024,
            node_id: None,
            lease_s: 10,
        }
    }
}

/// The API a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Any OpenAI Chat Completions-compatible endpoint.
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
    /// A GGUF model run in-process by llama.cpp.
    Local,
}

/// How tools are offered to the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    /// The provider's own tool calling.
    #[default]
    Native,
    /// Tools described in the prompt and each action read back as a JSON
    /// object, for models without native tool calling.
    Json,
}

/// One model endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Name agents refer to in their `provider`.
    #[schemars(example = &"main")]
    pub name: String,
    #[schemars(example = ProviderKind::Openai)]
    pub kind: ProviderKind,
    /// Base URL of the API (default: `https://api.openai.com/v1` for
    /// `openai`, `https://api.anthropic.com` for `anthropic`).
    #[serde(default)]
    #[schemars(example = &"http://127.0.0.1:9000/v1")]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key.
    #[serde(default)]
    #[schemars(example = &"OPENAI_API_KEY")]
    pub api_key_env: Option<String>,
    /// The model name sent to the API.
    #[schemars(example = &"qwen-plus")]
    pub model: String,
    /// The model's context window in tokens, which compaction measures
    /// prompts against (default: `default_context_window` of the agent's
    /// `[agents.compaction]`; for `local`, the model's trained context).
    #[serde(default)]
    #[schemars(example = 32768)]
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
    /// Requests to this provider in flight at once; more wait their turn,
    /// in order, before their timeout starts. Each one in flight holds a
    /// connection (about 30 KB of memory); the provider's rate limit caps
    /// how many are worth sending at once anyway.
    #[serde(default = "default_max_concurrent_requests")]
    pub max_concurrent_requests: u32,
    /// `kind = "local"`: the GGUF file to run (else `model` names a known model).
    #[serde(default)]
    pub model_path: Option<String>,
    /// `kind = "local"`: inference threads (default: available cores, at most 4).
    #[serde(default)]
    pub threads: Option<u32>,
    /// `kind = "local"`: run a Q4_1 GGUF from a Q8_0 copy written once
    /// beside it (default true): llama.cpp's CPU kernels are much faster
    /// for Q8_0, at the cost of the copy's disk space and ~25% more memory.
    #[serde(default)]
    pub requantize_q4_1: Option<bool>,
    /// Output token budget per model call when the loop names none.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// What the model costs, for spend limits (docs/spend.md). A model
    /// without a price is refused when a spend limit applies; `local`
    /// models cost nothing unless a price is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<crate::spend::Price>,
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
fn default_max_concurrent_requests() -> u32 {
    256
}

/// How a run starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// One loop in which the model answers or calls tools.
    #[default]
    SingleLoop,
    /// A first model call decides between chat and tool use; chat is
    /// answered without tools.
    PreRoute,
}

/// What a run does when it would ask the user once more than
/// `max_clarify_rounds` allows (SPEC §4.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnClarifyExhausted {
    /// Answer directly, saying what is missing.
    #[default]
    Fallback,
    /// Stay `waiting_input` with `handoff_requested`, for a person to answer.
    Handoff,
}

/// One agent: a model, a prompt, the tools it may use and its budgets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The name a run asks for (`agent` of `POST /ai/runs`).
    #[schemars(example = &"default")]
    pub id: String,
    /// The `name` of the provider whose model this agent runs.
    #[schemars(example = &"main")]
    pub provider: String,
    /// Instructions put before every conversation; keel adds its own note
    /// that tool output is data, not instructions.
    #[serde(default)]
    #[schemars(example = &"You are the plant operations assistant.")]
    pub system_prompt: String,
    /// Tool name patterns this agent may use; `*` matches any run of characters.
    #[serde(default)]
    #[schemars(example = ["plant.*", "furnace_status"])]
    pub tools: Vec<String>,
    #[serde(default)]
    pub routing: Routing,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub on_clarify_exhausted: OnClarifyExhausted,
    #[serde(default)]
    pub loop_detection: LoopDetection,
    #[serde(default)]
    pub drift: Drift,
    #[serde(default)]
    pub compaction: Compaction,
    /// What a finished run must have achieved; kept with the goal and shown
    /// to reflection, so "done" is judged against it rather than guessed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_criterion: Option<String>,
    /// The agent's model spend per UTC day in USD, over all tenants
    /// (docs/spend.md); a run that would pass it ends with `budget_exhausted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 50.0)]
    pub spend_usd_per_day: Option<f64>,
    /// As `spend_usd_per_day`, per UTC calendar month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(example = 1000.0)]
    pub spend_usd_per_month: Option<f64>,
}

/// A run's budgets. When one is exhausted, no more tools run: the model
/// answers once more, without tools, from what is known so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Model calls per run; at least 1.
    pub max_steps: u32,
    /// Tool calls per run; a call beyond it is not run.
    pub max_tool_calls: u32,
    /// Seconds a run may take from its start.
    pub max_wall_time_s: u64,
    /// Times a run may ask the user for missing arguments; then
    /// `on_clarify_exhausted` applies.
    pub max_clarify_rounds: u32,
    /// Prompt plus completion tokens over the whole run; 0 = unlimited.
    pub max_tokens: u64,
    /// Characters in one prompt; 0 = unlimited.
    pub max_context_chars: u64,
    /// Repair turns allowed per tool in a row after invalid arguments.
    pub max_repairs: u32,
    /// Characters of one tool result shown to the model before truncation.
    pub max_tool_output_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_steps: 12,
            max_tool_calls: 20,
            max_wall_time_s: 300,
            max_clarify_rounds: 2,
            max_tokens: 0,
            max_context_chars: 0,
            max_repairs: 2,
            max_tool_output_chars: 16 * 1024,
        }
    }
}

/// Loop detection thresholds (SPEC §4.10); a threshold of 0 turns that
/// level off. Streak thresholds count the proposed call: `repeat_warning = 3`
/// warns on the third identical call with an unchanged result. Breakers
/// count calls already run: `max_tool_calls_breaker = 30` blocks the 31st.
/// The first block gives the model one turn to recover; a second, or any
/// breaker, ends the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoopDetection {
    /// `false` turns every detector off.
    pub enabled: bool,
    /// The same call (tool and arguments) with the same result: the model
    /// is warned at this many.
    pub repeat_warning: u32,
    /// The same call with the same result: blocked at this many.
    pub repeat_critical: u32,
    /// Calls that may run in one run before the breaker ends it.
    pub max_tool_calls_breaker: u32,
    /// A `poll` tool returning the same status again: warned at this many.
    pub poll_warning: u32,
    /// A `poll` tool returning the same status again: blocked at this many.
    pub poll_critical: u32,
    /// Length of a tail alternating between two calls (`A,B,A,B` is 4)
    /// at which the model is warned.
    pub ping_pong_warning: u32,
    /// Length of an alternating tail at which the call is blocked.
    pub ping_pong_critical: u32,
    /// Times one tool may return the same result in a run, whatever the
    /// arguments, before the breaker ends it.
    pub identical_outcomes_breaker: u32,
    /// Calls in a row to tools that do not exist: warned at this many.
    pub unknown_tool_warning: u32,
    /// Calls in a row to tools that do not exist: blocked at this many.
    pub unknown_tool_critical: u32,
    /// Calls in a row of one tool failing with the same error: warned at
    /// this many.
    pub error_streak_warning: u32,
    /// Calls in a row of one tool failing with the same error: blocked at
    /// this many.
    pub error_streak_critical: u32,
}

impl Default for LoopDetection {
    fn default() -> Self {
        Self {
            enabled: true,
            repeat_warning: 3,
            repeat_critical: 5,
            max_tool_calls_breaker: 30,
            poll_warning: 5,
            poll_critical: 10,
            ping_pong_warning: 4,
            ping_pong_critical: 8,
            identical_outcomes_breaker: 15,
            unknown_tool_warning: 2,
            unknown_tool_critical: 3,
            error_streak_warning: 3,
            error_streak_critical: 5,
        }
    }
}

/// Staying on course (SPEC §4.12). Intervals count model steps; 0 turns
/// that correction off, and `enabled = false` turns all of them off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Drift {
    /// `false` turns reflection, checkpoints and drift scoring off.
    pub enabled: bool,
    /// A reflection call every this many steps (also on drift).
    pub reflection_interval: u32,
    /// A checkpoint every this many steps.
    pub checkpoint_interval: u32,
    /// A drift score (0..1, 1 = on track) below this is drift.
    pub threshold: f64,
    /// Recent steps the score looks at.
    pub window: u32,
    /// Tool calls a run of this agent is expected to need; 0 = learn from past runs.
    pub expected_tool_calls: u32,
    /// Distinct tools a run is expected to use; 0 = no expectation.
    pub expected_tools: u32,
    /// Drift or a loop that persists after a reflection resets the context.
    pub context_reset: bool,
    /// Resets allowed per run, so a correction can never loop.
    pub max_context_resets: u32,
    /// A score below this (deep drift) restores the last checkpoint, when on.
    pub restore_on_deep_drift: bool,
    /// The score below which drift is deep; at most `threshold`.
    pub deep_drift_threshold: f64,
}

impl Default for Drift {
    fn default() -> Self {
        Self {
            enabled: true,
            reflection_interval: 5,
            checkpoint_interval: 5,
            threshold: 0.35,
            window: 4,
            expected_tool_calls: 0,
            expected_tools: 0,
            context_reset: true,
            max_context_resets: 1,
            restore_on_deep_drift: false,
            deep_drift_threshold: 0.15,
        }
    }
}

/// Compaction (SPEC §4.13): older turns are summarized once the prompt
/// nears the model's context window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Compaction {
    /// `false`: older turns are never summarized.
    pub enabled: bool,
    /// Share of the context window at which older turns are summarized.
    pub threshold: f64,
    /// Newest messages always kept verbatim (pending call/result pairs are kept whole in any case).
    pub keep_recent_messages: u32,
    /// Used when the provider declares no `context_window`.
    pub default_context_window: u64,
}

impl Default for Compaction {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: 0.75,
            keep_recent_messages: 6,
            default_context_window: 32_768,
        }
    }
}

/// The tools agents can be given: MCP servers, HTTP endpoints, the
/// built-in tools, and settings over what each tool says of itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    /// MCP servers, whose tools appear as `<name>.<tool>`.
    #[serde(default)]
    pub mcp: Vec<McpServerConfig>,
    /// HTTP endpoints, each one tool.
    #[serde(default)]
    pub http: Vec<HttpToolConfig>,
    /// Per-tool settings by full tool name (e.g. `plant.restart_furnace`) or
    /// by glob (`plant.*`). Every matching key applies, least specific
    /// first (an exact name beats a glob, a longer literal part a shorter
    /// one; docs/tools.md), so a field set by a general glob holds unless a
    /// more specific key sets it too.
    #[serde(default)]
    #[schemars(extend("x-key" = "tool or glob"))]
    #[schemars(example = serde_json::json!({
        "plant.restart_furnace": {"risk": "dangerous", "requires_approval": true, "roles": ["operator"]}
    }))]
    pub overrides: BTreeMap<String, ToolOverride>,
    /// The built-in `web_fetch` tool.
    #[serde(default)]
    pub web_fetch: WebFetchConfig,
    /// The built-in `exec` tool.
    #[serde(default)]
    pub exec: ExecConfig,
}

/// Off unless enabled; argv only, an allowlist, a Landlock sandbox, and
/// approval unless `requires_approval = false` (see docs/tools.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    /// Offers the `exec` tool.
    pub enabled: bool,
    /// The programs `exec` may run; nothing else runs.
    pub programs: Vec<ExecProgram>,
    /// Readable (and runnable) beyond what the system needs.
    #[schemars(example = ["/srv/plant/data"])]
    pub read_paths: Vec<String>,
    /// The only places the program may write.
    #[schemars(example = ["/srv/plant/reports"])]
    pub write_paths: Vec<String>,
    /// Seconds before the program is killed.
    pub timeout_s: u64,
    /// Output kept from the program; the rest is cut.
    pub max_output_bytes: usize,
    /// Every `exec` call waits for a person's approval.
    pub requires_approval: bool,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            programs: Vec::new(),
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            timeout_s: 30,
            max_output_bytes: 64 * 1024,
            requires_approval: true,
        }
    }
}

/// One allowlisted program of `[tools.exec]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecProgram {
    /// Absolute path of the program.
    #[schemars(example = &"/usr/bin/touch")]
    pub path: String,
    /// Regular expressions; every argument must match one (none = no arguments).
    #[serde(default)]
    #[schemars(example = ["^/srv/plant/reports/[A-Za-z0-9_.-]+$"])]
    pub args: Vec<String>,
}

/// Off unless enabled; guarded against server-side request forgery (see
/// docs/tools.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WebFetchConfig {
    /// Offers the `web_fetch` tool.
    pub enabled: bool,
    /// Hosts that may resolve to private or loopback addresses
    /// (`docs.internal`, `*.plant.example`, `127.0.0.1`).
    #[schemars(example = ["docs.internal", "*.plant.example"])]
    pub allow_hosts: Vec<String>,
    /// Allow private and loopback addresses for every host.
    pub allow_private: bool,
    /// Largest page read; a larger one is cut, with a note.
    pub max_bytes: usize,
    /// Seconds one fetch may take.
    pub timeout_s: u64,
    /// Redirects followed, each checked like the first request.
    pub max_redirects: u8,
}

impl Default for WebFetchConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            allow_hosts: Vec::new(),
            allow_private: false,
            max_bytes: 2 * 1024 * 1024,
            timeout_s: 15,
            max_redirects: 5,
        }
    }
}

impl ToolsConfig {
    /// The overrides whose key matches `tool`, in the order they apply:
    /// least specific first, so the most specific key has the last word on
    /// every field it sets. See [`OverrideSpecificity`] for the order.
    pub fn overrides_for<'a>(&'a self, tool: &str) -> Vec<(&'a str, &'a ToolOverride)> {
        let mut matching: Vec<(&str, &ToolOverride)> = self
            .overrides
            .iter()
            .filter(|(key, _)| tool_pattern_matches(key, tool))
            .map(|(key, o)| (key.as_str(), o))
            .collect();
        matching.sort_by(|(a, _), (b, _)| {
            OverrideSpecificity::of(a)
                .cmp(&OverrideSpecificity::of(b))
                .then_with(|| a.cmp(b))
        });
        matching
    }
}

/// How specific a `[tools.overrides]` key is; greater is more specific. An
/// exact name beats any glob; among globs the longer literal (non-`*`) part
/// wins, then the one with fewer `*`. Keys equal on all of these apply in
/// the keys' text order, so the outcome never depends on file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct OverrideSpecificity {
    exact: bool,
    literal: usize,
    fewer_stars: std::cmp::Reverse<usize>,
}

impl OverrideSpecificity {
    pub fn of(key: &str) -> Self {
        let stars = key.chars().filter(|c| *c == '*').count();
        Self {
            exact: stars == 0,
            literal: key.chars().count() - stars,
            fewer_stars: std::cmp::Reverse(stars),
        }
    }
}

/// One MCP server: a program keel starts and talks to over stdio
/// (`command`), or a streamable HTTP endpoint (`url`); exactly one of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of the server's tools: `<name>.<tool>`.
    #[schemars(example = &"plant")]
    pub name: String,
    /// Program of a stdio server, found on `PATH`; it runs in keel's
    /// working directory.
    #[serde(default)]
    #[schemars(example = &"python3")]
    pub command: Option<String>,
    /// Arguments of `command`.
    #[serde(default)]
    #[schemars(example = ["plant_server.py"])]
    pub args: Vec<String>,
    /// Extra environment for the server process. Values may reference
    /// variables as `${VAR}`; keel's own environment is not inherited.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// URL of a streamable HTTP server (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// Timeout of one tool call, and of the server's start, in seconds.
    #[serde(default = "d_tool_timeout")]
    pub timeout_s: u64,
    /// Risk of every tool of this server, over what its annotations say;
    /// `[tools.overrides]` still win over it.
    #[serde(default)]
    pub risk: Option<Risk>,
    /// Approval for every tool of this server, over what its annotations
    /// say; `[tools.overrides]` still win over it.
    #[serde(default)]
    pub requires_approval: Option<bool>,
    /// Whether this server's tool output is trusted (default untrusted);
    /// `[tools.overrides]` still win over it.
    #[serde(default)]
    pub output_trust: Option<keel_protocol::Trust>,
}

/// One HTTP endpoint as a tool. Arguments named in the URL template go
/// into the URL; the others go into the query string (`GET`, `DELETE`) or
/// a JSON body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    /// The tool's name, without `.` (reserved for MCP server prefixes).
    #[schemars(example = &"furnace_status")]
    pub name: String,
    /// What the tool does, as the model is told.
    #[schemars(example = &"Current status of one furnace")]
    pub description: String,
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`.
    #[serde(default = "d_method")]
    pub method: String,
    /// URL template; `{param}` is replaced by the URL-encoded argument.
    #[schemars(example = &"http://127.0.0.1:9100/furnaces/{furnace_id}")]
    pub url: String,
    /// JSON Schema of the arguments, `type = "object"`; every `{param}` of
    /// `url` must be one of its properties.
    #[serde(default = "empty_object_schema")]
    #[schemars(example = serde_json::json!({
        "type": "object",
        "properties": {"furnace_id": {"type": "string", "description": "Furnace id, e.g. F2"}},
        "required": ["furnace_id"]
    }))]
    pub parameters: Value,
    /// Header values may reference environment variables as `${VAR}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// JSON Schema every successful result is checked against.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// The tool's risk (default `read`).
    #[serde(default)]
    #[schemars(example = Risk::Read)]
    pub risk: Option<Risk>,
    /// Every call waits for a person's approval (default false).
    #[serde(default)]
    pub requires_approval: Option<bool>,
    /// Whether the tool's output is trusted (default untrusted).
    #[serde(default)]
    pub output_trust: Option<keel_protocol::Trust>,
    /// Calling it twice has no further effect (default false).
    #[serde(default)]
    #[schemars(example = true)]
    pub idempotent: Option<bool>,
    /// Timeout of one call, in seconds (default 30).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Only principals with one of these roles may call it (default: anyone).
    #[serde(default)]
    pub roles: Option<Vec<String>>,
    /// The tool polls a status (default false).
    #[serde(default)]
    pub poll: Option<bool>,
    /// Calls of this tool in flight at once (default 64); more wait their
    /// turn, in order, before their timeout starts, so a burst of runs
    /// does not hit the endpoint with one request each.
    #[serde(default)]
    pub max_concurrent_calls: Option<u32>,
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

/// Settings applied over what a tool declares for itself; a field left
/// unset keeps the tool's own value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    /// The tool's risk; at or above `[policy] approval_risk` it needs
    /// approval.
    #[serde(default)]
    pub risk: Option<Risk>,
    /// Every call waits for a person's approval.
    #[serde(default)]
    pub requires_approval: Option<bool>,
    /// Whether the tool's output is trusted (default untrusted).
    #[serde(default)]
    pub output_trust: Option<keel_protocol::Trust>,
    /// Calling it twice has no further effect, so a call interrupted by a
    /// stopped node may run again, and a call made after a restored
    /// checkpoint may repeat one made before it.
    #[serde(default)]
    pub idempotent: Option<bool>,
    /// Timeout of one call, in seconds.
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Only principals with one of these roles may call it (see `[policy]
    /// see_but_ask`).
    #[serde(default)]
    pub roles: Option<Vec<String>>,
    /// The tool polls a status: loop detection uses the `poll_*`
    /// thresholds for it.
    #[serde(default)]
    pub poll: Option<bool>,
    /// Result fields (timestamps, request ids) ignored when loop detection
    /// compares results.
    #[serde(default)]
    pub volatile_fields: Option<Vec<String>>,
}

/// Checks on every tool result before the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerifyConfig {
    /// A result with this field holding another tenant than the caller's,
    /// at any depth, is withheld from the model.
    pub tenant_field: String,
    /// Mark null and empty results so the model says "no data" instead of
    /// inventing some.
    pub non_empty: bool,
    /// Tool pattern → fields every result row must have.
    #[schemars(example = serde_json::json!({"furnace_status": ["furnace_id"]}))]
    pub required_fields: BTreeMap<String, Vec<String>>,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self {
            tenant_field: "tenant_id".into(),
            non_empty: true,
            required_fields: BTreeMap::new(),
        }
    }
}

/// What the policy gate decides when no configured rule matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DefaultDecision {
    /// Calls no rule matches run (subject to roles, risk and approval).
    #[default]
    Execute,
    /// Calls no rule matches are denied: the rules are an allowlist.
    Deny,
}

/// The outcome a configured policy rule asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleDecision {
    /// Run the call, unless something stricter applies.
    Execute,
    /// Ask the user to confirm (useful with `min_confidence`).
    Clarify,
    /// Wait for a person's approval.
    Approve,
    /// Refuse the call; the model is told `reason`.
    Deny,
}

/// What a call whose arguments come from untrusted data only gets
/// (SPEC §4.6, provenance).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum UntrustedArguments {
    /// No check.
    Allow,
    /// Wait for a person's approval.
    #[default]
    Approve,
    /// Refuse; the model is told the value must come from the user.
    Deny,
}

/// The policy gate (SPEC §4.6): code, not the prompt, decides whether a
/// call runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Applies only when no configured rule matches, so `deny` turns the
    /// rules into an allowlist.
    pub default: DefaultDecision,
    /// Tools at or above this risk need human approval.
    pub approval_risk: Risk,
    /// How long an approval may stay pending before it counts as denied.
    pub approval_timeout_s: u64,
    /// Show role-restricted tools to everyone and ask for approval instead
    /// of denying; otherwise they are hidden from principals without the role.
    pub see_but_ask: bool,
    /// Calls of tools at or above `untrusted_arguments_min_risk` whose
    /// arguments come from untrusted data (tool output, memory, fetched
    /// pages) and from no trusted source: allowed, sent for approval, or
    /// denied with a fallback the model can follow.
    pub untrusted_arguments: UntrustedArguments,
    /// The lowest risk whose calls `untrusted_arguments` checks.
    pub untrusted_arguments_min_risk: Risk,
    /// Rules; every rule that matches a call gives a verdict and the
    /// strictest wins.
    pub rules: Vec<PolicyRule>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            default: DefaultDecision::default(),
            approval_risk: Risk::Dangerous,
            approval_timeout_s: 3600,
            see_but_ask: false,
            untrusted_arguments: UntrustedArguments::Approve,
            untrusted_arguments_min_risk: Risk::Write,
            rules: Vec::new(),
        }
    }
}

/// One `[[policy.rules]]` entry. Every condition given must hold for the
/// rule to match; an empty list means "any".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Unique; `policy_decision` events name the rule that decided.
    #[schemars(example = &"protect_f9")]
    pub name: String,
    /// Tool name patterns (`*` matches any run of characters).
    #[serde(default)]
    #[schemars(example = ["plant.restart_*"])]
    pub tools: Vec<String>,
    /// Matches when the principal has any of these roles.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Matches when the principal's tenant is one of these.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Matches tools at or above this risk.
    #[serde(default)]
    pub min_risk: Option<Risk>,
    /// Argument name → condition on its value; a missing argument does not match.
    #[serde(default)]
    #[schemars(extend("x-key" = "argument"))]
    #[schemars(example = serde_json::json!({"furnace_id": {"pattern": "^F9$"}}))]
    pub when_arguments: BTreeMap<String, ArgMatcher>,
    /// Matches once the tool has already run this many times in the run.
    #[serde(default)]
    pub max_calls_per_run: Option<u32>,
    /// Matches when the model stated a confidence below this (0.0 to 1.0)
    /// for the call; a call without a stated confidence does not match.
    #[serde(default)]
    pub min_confidence: Option<f64>,
    /// What to do with arguments that come from untrusted data only, for
    /// this rule's tools (over `[policy] untrusted_arguments`).
    #[serde(default)]
    pub untrusted_arguments: Option<UntrustedArguments>,
    /// The arguments whose provenance matters for this rule (empty = all).
    #[serde(default)]
    pub arguments: Vec<String>,
    /// The verdict when the rule matches.
    #[schemars(example = RuleDecision::Deny)]
    pub decision: RuleDecision,
    /// Told to the model when the call is denied.
    #[serde(default)]
    #[schemars(example = &"furnace F9 must not be restarted")]
    pub reason: Option<String>,
}

/// Conditions on one argument's value; all that are given must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArgMatcher {
    /// Regex searched in the value (strings as written, other values as JSON text).
    #[serde(default)]
    pub pattern: Option<String>,
    /// Regex that must not be found in the value.
    #[serde(default)]
    pub not_pattern: Option<String>,
    /// The value equals one of these (numbers compare as numbers, `5`
    /// equals `"5"`).
    #[serde(default)]
    pub one_of: Option<Vec<Value>>,
    /// The value equals none of these.
    #[serde(default)]
    pub not_one_of: Option<Vec<Value>>,
    /// Inclusive lower bound; a value that is not a number (or a string
    /// holding one) does not match.
    #[serde(default)]
    pub min: Option<f64>,
    /// Inclusive upper bound, like `min`.
    #[serde(default)]
    pub max: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookKind {
    /// Sets `argument` to the caller's tenant, whatever the model sent.
    InjectTenant,
    /// Sets `argument` to `value` when it is absent or null.
    Default,
    /// Blocks the call when `argument` matches `pattern`.
    DenyPattern,
}

impl HookKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InjectTenant => "inject_tenant",
            Self::Default => "default",
            Self::DenyPattern => "deny_pattern",
        }
    }
}

/// One `[[hooks]]` entry: a `before_tool_call` hook built from configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Defaults to `<kind>:<argument>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Tool name patterns; empty applies to every tool.
    #[serde(default)]
    #[schemars(example = ["plant.*"])]
    pub tools: Vec<String>,
    /// What the hook does.
    #[schemars(example = HookKind::InjectTenant)]
    pub kind: HookKind,
    /// The argument the hook reads or sets.
    #[schemars(example = &"tenant_id")]
    pub argument: String,
    /// For `default`: the value filled in.
    #[serde(default)]
    pub value: Option<Value>,
    /// For `deny_pattern`: the regex that blocks.
    #[serde(default)]
    pub pattern: Option<String>,
    /// For `deny_pattern`: what the model is told.
    #[serde(default)]
    pub reason: Option<String>,
}

impl HookConfig {
    /// The name events and errors use for this hook.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{}:{}", self.kind.as_str(), self.argument))
    }
}

/// Who may call the API. With no keys keel serves one tenant, `default`,
/// and binds only loopback addresses; with keys every request needs
/// `Authorization: Bearer <key>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The API keys.
    #[serde(default)]
    pub keys: Vec<ApiKeyConfig>,
    /// Roles allowed to decide approvals (empty: anyone of the run's tenant).
    #[serde(default)]
    #[schemars(example = ["approver"])]
    pub approver_roles: Vec<String>,
}

/// One API key and who it speaks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Environment variable holding the key's value.
    #[schemars(example = &"KEEL_KEY_ACME")]
    pub key_env: String,
    /// The tenant whose runs the key sees; no other tenant's.
    #[schemars(example = &"acme")]
    pub tenant: String,
    /// Who the caller is; an approval records who decided it.
    #[schemars(example = &"alice")]
    pub principal: String,
    /// The caller's roles, for tool `roles`, policy rules and `approver_roles`.
    #[serde(default)]
    #[schemars(example = ["operator", "approver"])]
    pub roles: Vec<String>,
}

/// Which embedding model memory search uses (SPEC §6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EmbedderKind {
    /// all-MiniLM-L6-v2 run in-process: semantic search offline, no key.
    #[default]
    Local,
    /// An OpenAI-compatible `/v1/embeddings` endpoint.
    Openai,
    /// BM25 only.
    None,
}

/// Long-term memory: chunking, embeddings and hybrid ranking (SPEC §6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// The embedding model memory search uses.
    pub embedder: EmbedderKind,
    /// Directory with `config.json`, `tokenizer.json`, `model.safetensors`
    /// for the local embedder; default: looked up under the data dir, then
    /// `~/.cache/keel-models/`, then downloaded from the model hub.
    pub model_dir: Option<String>,
    /// For `embedder = "openai"`: base URL ending in `/v1`.
    pub embeddings_base_url: Option<String>,
    /// For `embedder = "openai"`: the embedding model name.
    pub embeddings_model: Option<String>,
    /// For `embedder = "openai"`: environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Tokens per chunk (words, or CJK characters).
    pub chunk_tokens: usize,
    /// Tokens each chunk repeats from the previous one; less than `chunk_tokens`.
    pub chunk_overlap: usize,
    /// Weight of BM25 in the fused score.
    pub text_weight: f64,
    /// Weight of vector similarity in the fused score.
    pub vector_weight: f64,
    /// MMR re-ranking: 1.0 = relevance only, lower = more diverse results.
    pub mmr_lambda: f64,
    /// Scores halve every this many days since a note's date; 0 = off.
    pub time_decay_half_life_days: f64,
    /// On session reset, when the model cannot write a summary, this many
    /// last messages are stored verbatim instead.
    pub summary_fallback_messages: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            embedder: EmbedderKind::default(),
            model_dir: None,
            embeddings_base_url: None,
            embeddings_model: None,
            api_key_env: None,
            chunk_tokens: 256,
            chunk_overlap: 32,
            text_weight: 0.3,
            vector_weight: 0.7,
            mmr_lambda: 0.7,
            time_decay_half_life_days: 0.0,
            summary_fallback_messages: 20,
        }
    }
}

/// Whether `name` matches a tool pattern where `*` matches any run of characters.
///
/// Matched left to right, returning only to the last `*` on a mismatch, so
/// the time is at most the product of the two lengths whatever the number
/// of stars (trying every split at every star is exponential in them, and
/// this runs for every tool call a hook, policy rule or verify rule sees).
pub fn tool_pattern_matches(pattern: &str, name: &str) -> bool {
    if !pattern.contains('*') {
        return pattern == name;
    }
    // Tool names and patterns are ASCII in practice: their bytes are their
    // characters, and matching them needs no copy.
    if pattern.is_ascii() && name.is_ascii() {
        return wildcard_matches(pattern.as_bytes(), name.as_bytes(), b'*');
    }
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    wildcard_matches(&pattern, &name, '*')
}

fn wildcard_matches<T: Copy + PartialEq>(pattern: &[T], name: &[T], any: T) -> bool {
    let (mut p, mut n) = (0, 0);
    // Just after the last star seen, and where in `name` its run ends now.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(c) if *c == any => {
                p += 1;
                star = Some((p, n));
            }
            Some(c) if *c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                // The last star takes one more character; retry after it.
                Some((after, run_end)) => {
                    p = after;
                    n = run_end + 1;
                    star = Some((after, run_end + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == any)
}

#[cfg(test)]
mod tests {
    use super::tool_pattern_matches as m;
    use super::{OverrideSpecificity as S, ToolOverride, ToolsConfig};

    #[test]
    fn overrides_apply_from_least_to_most_specific() {
        let tools = ToolsConfig {
            overrides: [
                "*",
                "plant.*",
                "plant.restart_*",
                "plant.restart_furnace",
                "other.*",
                "p*t.*",
            ]
            .into_iter()
            .map(|k| (k.to_string(), ToolOverride::default()))
            .collect(),
            ..ToolsConfig::default()
        };
        let keys = |tool: &str| -> Vec<&str> {
            tools
                .overrides_for(tool)
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        assert_eq!(
            keys("plant.restart_furnace"),
            [
                "*",
                "p*t.*",
                "plant.*",
                "plant.restart_*",
                "plant.restart_furnace"
            ]
        );
        assert_eq!(keys("plant.batch_output"), ["*", "p*t.*", "plant.*"]);
        assert_eq!(keys("furnace_status"), ["*"]);

        assert!(
            S::of("a.b") > S::of("a.bbbbbbbbbbbbbbbbbbbb*"),
            "exact beats any glob"
        );
        assert!(S::of("plant.r*") > S::of("plant.*"), "longer literal part");
        assert!(
            S::of("plant.*") > S::of("pla*nt.*"),
            "fewer stars at equal literal"
        );
    }

    #[test]
    fn patterns() {
        assert!(m("plant.*", "plant.restart"));
        assert!(!m("plant.*", "plantx.restart"));
        assert!(m("*", "anything"));
        assert!(m("furnace_status", "furnace_status"));
        assert!(!m("furnace_status", "furnace_status2"));
        assert!(m("a*c", "abbbc"));
        assert!(!m("a*c", "abbb"));
        assert!(m("p*t.*", "plant.restart"));
        assert!(m("*a*b*", "xaxxbx"));
        assert!(!m("*a*b", "xaxxbx"));
        assert!(m("a**b", "ab"));
        assert!(m("**", ""));
        assert!(m("", ""));
        assert!(!m("", "a"));
        assert!(m("é*ü", "éaü"));
        assert!(m("a*", "aé"), "an ASCII pattern, a name that is not");
        assert!(!m("a*b", "aéc"));
        assert!(m("*é", "xxé"));
    }

    /// Found by the `config_toml` fuzz target: a pattern with a few hundred
    /// stars in an agent's `tools` made loading the configuration run for
    /// minutes, trying every way to split the name among the stars.
    #[test]
    fn many_stars_take_no_time() {
        let stars = "*".repeat(300);
        let started = std::time::Instant::now();
        assert!(!m(&format!("memory_{stars}get"), "memory_search"));
        assert!(!m(&format!("a{stars}b"), &"a".repeat(300)));
        assert!(m(&format!("a{stars}b"), &format!("{}b", "a".repeat(300))));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// A pattern and a name: unrelated, or the pattern with every `*`
    /// filled in, so that matches are as common as misses.
    fn pattern_and_name() -> impl proptest::strategy::Strategy<Value = (String, String)> {
        use proptest::prelude::*;
        let fills = proptest::collection::vec("[ab.é]{0,3}", 11);
        ("[ab*.é]{0,10}", "[ab.é]{0,10}", fills, any::<bool>()).prop_map(
            |(pattern, other, fills, related)| {
                if !related {
                    return (pattern, other);
                }
                let mut fills = fills.into_iter();
                let name = pattern
                    .split('*')
                    .enumerate()
                    .map(|(i, part)| {
                        let fill = if i == 0 {
                            String::new()
                        } else {
                            fills.next().unwrap_or_default()
                        };
                        fill + part
                    })
                    .collect();
                (pattern, name)
            },
        )
    }

    proptest::proptest! {
        /// The same answers as the regular expression the pattern stands for.
        #[test]
        fn patterns_match_like_their_regex((pattern, name) in pattern_and_name()) {
            let regex = format!("^{}$", regex::escape(&pattern).replace(r"\*", ".*"));
            let expected = regex::Regex::new(&regex).unwrap().is_match(&name);
            proptest::prop_assert_eq!(m(&pattern, &name), expected, "{} {}", pattern, name);
        }
    }
}
