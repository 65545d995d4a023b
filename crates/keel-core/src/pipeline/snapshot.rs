//! The tool set one step works on: the runtime's tools as they were when
//! the step began, plus the run's client tools, compiled once per run.
//!
//! A step takes one snapshot and passes it down, so an MCP `list_changed`
//! that swaps the runtime's tool set mid-step cannot make a tool vanish
//! between the decision and the execution of a call.

use std::sync::Arc;

use keel_guard::schema::normalize;
use keel_protocol::{Tool, ToolContext, ToolError, ToolOutput, ToolSchema, ToolSource, ToolSpec};

use crate::error::CoreError;
use crate::toolset::{RegisteredTool, ToolSet};

#[derive(Clone, Default)]
pub struct ToolSnapshot {
    /// The runtime's tools (configured, MCP, built-in).
    pub server: Arc<ToolSet>,
    /// Functions the caller executes itself (Responses API).
    pub client: Arc<ToolSet>,
}

impl ToolSnapshot {
    /// The tool a call names, as this agent may use it: a server tool the
    /// agent's patterns allow, else a client tool of the run. A server tool
    /// the agent may not use is not found, even when a client tool has its
    /// name (client tools may not shadow server tools; see [`client_tools`]).
    pub fn lookup(&self, name: &str, agent_patterns: &[String]) -> Option<&RegisteredTool> {
        match self.server.get(name) {
            Some(t) => ToolSet::agent_allows(agent_patterns, name).then_some(t),
            None => self.client.get(name),
        }
    }
}

/// Compiles the caller's function declarations once, for the whole run.
/// A schema that does not compile is an error naming the tool (the API
/// answers 400 before the run starts).
pub fn client_tools(schemas: &[ToolSchema]) -> Result<ToolSet, CoreError> {
    let tools: Vec<Arc<dyn Tool>> = schemas
        .iter()
        .map(|s| Arc::new(ClientTool::new(s)) as Arc<dyn Tool>)
        .collect();
    ToolSet::new(tools)
}

/// A function the caller runs. keel never calls it: the pipeline hands an
/// allowed call to the client and the run waits for its output.
struct ClientTool {
    spec: ToolSpec,
}

impl ClientTool {
    fn new(schema: &ToolSchema) -> Self {
        let mut spec = ToolSpec::new(
            &schema.name,
            &schema.description,
            normalize(&schema.parameters),
        );
        spec.source = ToolSource::Client;
        Self { spec }
    }
}

#[async_trait::async_trait]
impl Tool for ClientTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(
        &self,
        _arguments: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Err(ToolError::Unavailable(format!(
            "`{}` is a client tool: the caller executes it",
            self.spec.name
        )))
    }
}
