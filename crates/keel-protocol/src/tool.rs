//! The tool port: what a tool declares about itself and how it is called.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    #[default]
    Read,
    Write,
    Exec,
    Dangerous,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Exec => "exec",
            Self::Dangerous => "dangerous",
        }
    }
}

/// Whether a tool's output may steer what the run does (SPEC §5): untrusted
/// output is data, and arguments taken from it alone are judged by the
/// provenance policy.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    Trusted,
    #[default]
    Untrusted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolSource {
    Builtin,
    Mcp,
    Http,
    Client,
}

/// Everything keel knows about a tool before calling it. `parameters` is
/// already normalized when a spec reaches the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    pub risk: Risk,
    #[serde(default)]
    pub requires_approval: bool,
    #[serde(default)]
    pub idempotent: bool,
    #[serde(with = "duration_ms")]
    pub timeout: Duration,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub poll: bool,
    pub source: ToolSource,
    /// Result fields ignored when comparing outcomes (timestamps, ids).
    #[serde(default)]
    pub volatile_fields: Vec<String>,
    /// Whether the output is trusted; untrusted unless configured.
    #[serde(default)]
    pub output_trust: Trust,
}

impl ToolSpec {
    /// A spec with safe defaults: read risk, not idempotent, 30 s timeout.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            output_schema: None,
            risk: Risk::Read,
            requires_approval: false,
            idempotent: false,
            timeout: Duration::from_secs(30),
            roles: Vec::new(),
            poll: false,
            source: ToolSource::Builtin,
            volatile_fields: Vec::new(),
            output_trust: Trust::Untrusted,
        }
    }

    /// Names of the required parameters, in schema order.
    pub fn required_params(&self) -> Vec<String> {
        self.parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The description of one parameter, if the schema gives one.
    pub fn param_description(&self, name: &str) -> Option<&str> {
        self.parameters
            .get("properties")?
            .get(name)?
            .get("description")?
            .as_str()
    }
}

mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// On whose behalf a call runs.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub tenant: String,
    pub principal: String,
    /// The agent running the call (memory is scoped by tenant and agent).
    pub agent: String,
    pub session: String,
    pub run_id: String,
    pub call_id: String,
}

/// What a tool returned. `content` is the text the model will see.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    pub content: String,
    /// Structured form of the result, when the tool gives one.
    pub structured: Option<Value>,
    /// The tool itself reported failure (e.g. MCP `isError`).
    pub is_error: bool,
}

impl ToolOutput {
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            structured: None,
            is_error: false,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolError {
    #[error("tool is unavailable: {0}")]
    Unavailable(String),
    #[error("tool failed: {0}")]
    Failed(String),
    #[error("tool did not finish within {0:?}")]
    Timeout(Duration),
}

#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;

    /// Executes with arguments that already passed the schema guard.
    async fn call(&self, arguments: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError>;

    /// For a tool that bounds its calls in flight: waits for a place among
    /// them. The caller takes it before the call and its timeout start, and
    /// holds it until the call has ended, so a call kept waiting is never
    /// one that timed out. `None`: no bound.
    async fn place(&self) -> Option<CallPlace> {
        None
    }
}

/// A place among a tool's calls in flight, given back when dropped.
pub type CallPlace = Box<dyn Send + Sync>;
