//! One tool of an MCP server as a keel `Tool`.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use keel_guard::schema::{CompiledSchema, normalize};
use keel_protocol::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSource, ToolSpec};
use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use serde_json::{Map, Value};

use super::Shared;
use crate::trust::{RiskSource, TrustOrigin};

/// A tool as the server described it, with keel's spec derived from that
/// and the server's `[[tools.mcp]]` settings.
#[derive(Debug, Clone)]
pub(crate) struct RemoteTool {
    /// The name the server knows it by (without the server prefix).
    remote_name: Arc<str>,
    spec: ToolSpec,
    origin: TrustOrigin,
}

/// The `[[tools.mcp]]` settings that apply to every tool of a server.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ServerDefaults {
    pub(crate) risk: Option<Risk>,
    pub(crate) requires_approval: Option<bool>,
    pub(crate) output_trust: Option<keel_protocol::Trust>,
}

impl RemoteTool {
    /// Derives keel's spec; `None` (logged) when the server's input schema
    /// cannot be compiled, since such a tool could never be called safely.
    pub(crate) fn from_mcp(
        server: &str,
        tool: rmcp::model::Tool,
        timeout: Duration,
        defaults: ServerDefaults,
    ) -> Option<RemoteTool> {
        let name = format!("{server}.{}", tool.name);
        let parameters = normalize(&Value::Object((*tool.input_schema).clone()));
        if let Err(e) = CompiledSchema::compile(&parameters) {
            tracing::warn!(tool = %name, error = %e, "mcp tool skipped: invalid input schema");
            return None;
        }
        let annotations = tool.annotations.clone().unwrap_or_default();
        let (mut risk, mut requires_approval, source) =
            default_risk(annotations.read_only_hint, annotations.destructive_hint);
        let mut origin = TrustOrigin::both(source);
        if let Some(r) = defaults.risk {
            risk = r;
            origin.risk = RiskSource::Server;
        }
        if let Some(a) = defaults.requires_approval {
            requires_approval = a;
            origin.requires_approval = RiskSource::Server;
        }
        let description = tool
            .description
            .as_deref()
            .or(tool.title.as_deref())
            .or(annotations.title.as_deref())
            .unwrap_or_default()
            .to_owned();
        let spec = ToolSpec {
            output_schema: tool
                .output_schema
                .as_ref()
                .map(|s| Value::Object((**s).clone())),
            risk,
            requires_approval,
            idempotent: annotations.idempotent_hint.unwrap_or(false),
            timeout,
            source: ToolSource::Mcp,
            output_trust: defaults.output_trust.unwrap_or_default(),
            ..ToolSpec::new(name, description, parameters)
        };
        Some(RemoteTool {
            remote_name: Arc::from(tool.name.as_ref()),
            spec,
            origin,
        })
    }

    /// The derived spec, for the fuzz targets' checks.
    pub(crate) fn into_spec(self) -> ToolSpec {
        self.spec
    }
}

/// keel's default risk from a tool's annotations. Annotations are hints and
/// configuration is authority (SPEC §5), so a hint that is not given is not
/// read with the MCP spec's worst-case default (`destructiveHint: true`):
/// most servers publish no annotations at all, and treating each of their
/// tools as destructive would send every plain query to a human. A tool
/// that says nothing gets `write` without approval; the operator marks what
/// is dangerous (`[tools.overrides]`, or `[[tools.mcp]]` for a whole server).
///
/// | readOnlyHint | destructiveHint | risk        | approval | source          |
/// |--------------|-----------------|-------------|----------|-----------------|
/// | true         | any             | `read`      | no       | annotations     |
/// | false/absent | true            | `dangerous` | yes      | annotations     |
/// | false        | false/absent    | `write`     | no       | annotations     |
/// | absent       | false           | `write`     | no       | annotations     |
/// | absent       | absent          | `write`     | no       | no annotations  |
fn default_risk(read_only: Option<bool>, destructive: Option<bool>) -> (Risk, bool, RiskSource) {
    match (read_only, destructive) {
        (Some(true), _) => (Risk::Read, false, RiskSource::Annotations),
        (_, Some(true)) => (Risk::Dangerous, true, RiskSource::Annotations),
        (None, None) => (Risk::Write, false, RiskSource::NoAnnotations),
        _ => (Risk::Write, false, RiskSource::Annotations),
    }
}

pub(crate) struct McpTool {
    remote: RemoteTool,
    shared: Arc<Shared>,
}

impl McpTool {
    pub(crate) fn new(remote: RemoteTool, shared: Arc<Shared>) -> Self {
        Self { remote, shared }
    }

    /// The spec and where its trust settings came from, to layer
    /// `[tools.overrides]` over them.
    pub(crate) fn trust_mut(&mut self) -> (&mut ToolSpec, &mut TrustOrigin) {
        (&mut self.remote.spec, &mut self.remote.origin)
    }
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.remote.spec
    }

    async fn call(&self, arguments: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let server = &self.shared.name;
        let arguments = match arguments {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            _ => return Err(ToolError::Failed("arguments must be a JSON object".into())),
        };
        let conn = self.shared.connection()?;
        let params = CallToolRequestParams::new(Cow::Owned(self.remote.remote_name.to_string()))
            .with_arguments(arguments);
        let timeout = self.remote.spec.timeout;
        let outcome = tokio::select! {
            biased;
            r = tokio::time::timeout(timeout, conn.peer.call_tool_once(params)) => r,
            () = conn.gone.cancelled() => {
                return Err(ToolError::Unavailable(format!(
                    "mcp server {server} exited during the call"
                )));
            }
        };
        match outcome {
            Err(_) => Err(ToolError::Timeout(timeout)),
            Ok(Ok(CallToolResponse::Complete(result))) => Ok(to_output(result)),
            Ok(Ok(_)) => Err(ToolError::Failed(format!(
                "mcp server {server} asked for interactive input or a task, which keel does not support"
            ))),
            Ok(Err(e)) => Err(service_error(server, e)),
        }
    }
}

fn service_error(server: &str, e: ServiceError) -> ToolError {
    match e {
        ServiceError::McpError(data) => {
            ToolError::Failed(format!("mcp server {server}: {}", data.message))
        }
        ServiceError::TransportSend(_) | ServiceError::TransportClosed => {
            ToolError::Unavailable(format!("mcp server {server} is restarting"))
        }
        ServiceError::Timeout { timeout } => ToolError::Timeout(timeout),
        other => ToolError::Failed(format!("mcp server {server}: {other}")),
    }
}

pub(crate) fn to_output(result: CallToolResult) -> ToolOutput {
    let texts: Vec<String> = result.content.iter().map(describe).collect();
    let mut content = texts.join("\n");
    if content.is_empty()
        && let Some(structured) = &result.structured_content
    {
        content = structured.to_string();
    }
    ToolOutput {
        content,
        structured: result.structured_content,
        is_error: result.is_error == Some(true),
    }
}

/// Text blocks as they are; other blocks as a short note, since the model
/// only sees text here.
fn describe(block: &ContentBlock) -> String {
    if let Some(text) = block.as_text() {
        return text.text.clone();
    }
    let kind = serde_json::to_value(block)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "non-text".to_owned());
    format!("[{kind} content omitted]")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mcp_tool(v: Value) -> rmcp::model::Tool {
        serde_json::from_value(v).unwrap()
    }

    fn remote(tool: Value, defaults: ServerDefaults) -> RemoteTool {
        RemoteTool::from_mcp("plant", mcp_tool(tool), Duration::from_secs(3), defaults).unwrap()
    }

    fn annotated(annotations: Value) -> (ToolSpec, TrustOrigin) {
        let r = remote(
            json!({"name": "t", "inputSchema": {"type": "object"}, "annotations": annotations}),
            ServerDefaults::default(),
        );
        (r.spec, r.origin)
    }

    #[test]
    fn annotations_map_to_risk() {
        use RiskSource::{Annotations, NoAnnotations};
        let (read, origin) = annotated(json!({"readOnlyHint": true, "idempotentHint": true}));
        assert_eq!(
            (read.risk, read.requires_approval, read.idempotent),
            (Risk::Read, false, true)
        );
        assert_eq!(origin, TrustOrigin::both(Annotations));
        let (danger, _) = annotated(json!({"readOnlyHint": false, "destructiveHint": true}));
        assert_eq!(
            (danger.risk, danger.requires_approval),
            (Risk::Dangerous, true)
        );
        let (only_destructive, _) = annotated(json!({"destructiveHint": true}));
        assert_eq!(only_destructive.risk, Risk::Dangerous);
        let (write, origin) = annotated(json!({"readOnlyHint": false, "destructiveHint": false}));
        assert_eq!(
            (write.risk, write.requires_approval, write.idempotent),
            (Risk::Write, false, false)
        );
        assert_eq!(origin.risk, Annotations);
        let (not_read_only, origin) = annotated(json!({"readOnlyHint": false}));
        assert_eq!(
            (
                not_read_only.risk,
                not_read_only.requires_approval,
                origin.risk
            ),
            (Risk::Write, false, Annotations),
            "an unsaid destructiveHint is not read as true"
        );
        for unsaid in [json!({}), json!({"idempotentHint": true, "title": "T"})] {
            let (spec, origin) = annotated(unsaid);
            assert_eq!(
                (spec.risk, spec.requires_approval),
                (Risk::Write, false),
                "a tool that says nothing: write, no approval"
            );
            assert_eq!(origin, TrustOrigin::both(NoAnnotations));
        }
        let bare = remote(
            json!({"name": "t", "inputSchema": {"type": "object"}}),
            ServerDefaults::default(),
        );
        assert_eq!(
            (bare.spec.risk, bare.spec.requires_approval),
            (Risk::Write, false)
        );
        assert_eq!(
            bare.origin,
            TrustOrigin::both(NoAnnotations),
            "no annotations object at all"
        );
        assert_eq!(write.name, "plant.t");
        assert_eq!(write.timeout, Duration::from_secs(3));
        assert_eq!(write.source, ToolSource::Mcp);
        assert_eq!(write.parameters["additionalProperties"], json!(false));
    }

    #[test]
    fn server_defaults_replace_what_annotations_say() {
        let read_only = json!({"name": "t", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}});
        let gated = remote(
            read_only.clone(),
            ServerDefaults {
                risk: None,
                requires_approval: Some(true),
                output_trust: None,
            },
        );
        assert_eq!(
            (gated.spec.risk, gated.spec.requires_approval),
            (Risk::Read, true)
        );
        assert_eq!(
            gated.origin,
            TrustOrigin {
                risk: RiskSource::Annotations,
                requires_approval: RiskSource::Server,
            }
        );
        let exec = remote(
            json!({"name": "t", "inputSchema": {"type": "object"}}),
            ServerDefaults {
                risk: Some(Risk::Exec),
                requires_approval: None,
                output_trust: None,
            },
        );
        assert_eq!(
            (exec.spec.risk, exec.spec.requires_approval),
            (Risk::Exec, false)
        );
        assert_eq!(exec.origin.risk, RiskSource::Server);
        assert_eq!(exec.origin.requires_approval, RiskSource::NoAnnotations);
    }

    #[test]
    fn result_conversion() {
        let r: CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "isError": true
        }))
        .unwrap();
        assert_eq!(
            to_output(r),
            ToolOutput {
                content: "a\nb".into(),
                structured: None,
                is_error: true
            }
        );
        let r: CallToolResult =
            serde_json::from_value(json!({"content": [], "structuredContent": {"sum": 3}}))
                .unwrap();
        let out = to_output(r);
        assert_eq!(out.content, r#"{"sum":3}"#);
        assert_eq!(out.structured, Some(json!({"sum": 3})));
        assert!(!out.is_error);
    }
}
