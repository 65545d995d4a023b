//! The tools a runtime offers, each with its parameter schema normalized and
//! compiled once, at registration, so that every call is validated cheaply.

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_config::tool_pattern_matches;
use keel_guard::policy::Policy;
use keel_guard::schema::{CompiledSchema, normalize};
use keel_protocol::{Principal, Tool, ToolSchema, ToolSpec};

use crate::error::CoreError;

/// A tool plus what registration derived from its spec.
pub struct RegisteredTool {
    pub tool: Arc<dyn Tool>,
    pub spec: ToolSpec,
    /// The tool as offered to the model, made once: every turn offers it.
    pub offered: ToolSchema,
    pub schema: CompiledSchema,
    /// The declared output schema, compiled, for the `schema` verify rule.
    pub output_schema: Option<CompiledSchema>,
}

#[derive(Default)]
pub struct ToolSet {
    tools: BTreeMap<String, RegisteredTool>,
}

impl ToolSet {
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Result<Self, CoreError> {
        let mut set = Self::default();
        for t in tools {
            set.register(t)?;
        }
        Ok(set)
    }

    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), CoreError> {
        let mut spec = tool.spec().clone();
        if spec.name == crate::clarify::CLARIFY_TOOL {
            return Err(CoreError::Config(format!(
                "tool name `{}` is reserved",
                spec.name
            )));
        }
        if self.tools.contains_key(&spec.name) {
            return Err(CoreError::Config(format!(
                "two tools are named `{}`",
                spec.name
            )));
        }
        spec.parameters = normalize(&spec.parameters);
        let schema = CompiledSchema::compile(&spec.parameters).map_err(|e| {
            CoreError::Config(format!(
                "tool `{}` has an invalid parameter schema: {e}",
                spec.name
            ))
        })?;
        let output_schema = match &spec.output_schema {
            Some(s) => Some(CompiledSchema::compile(s).map_err(|e| {
                CoreError::Config(format!(
                    "tool `{}` has an invalid output schema: {e}",
                    spec.name
                ))
            })?),
            None => None,
        };
        let offered = ToolSchema {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters: Arc::new(spec.parameters.clone()),
        };
        self.tools.insert(
            spec.name.clone(),
            RegisteredTool {
                tool,
                spec,
                offered,
                schema,
                output_schema,
            },
        );
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&RegisteredTool> {
        self.tools.get(name)
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Whether the agent's patterns include this tool (an empty list means all tools).
    pub fn agent_allows(patterns: &[String], name: &str) -> bool {
        patterns.is_empty() || patterns.iter().any(|p| tool_pattern_matches(p, name))
    }

    /// Tools an agent offers to a principal: the agent's patterns and the
    /// policy both apply, so a tool the principal's roles forbid is never shown
    /// (unless the policy is configured to see-but-ask).
    pub fn visible<'a>(
        &'a self,
        patterns: &'a [String],
        principal: &'a Principal,
        policy: &'a Policy,
    ) -> impl Iterator<Item = &'a RegisteredTool> + 'a {
        self.tools.values().filter(move |t| {
            Self::agent_allows(patterns, &t.spec.name) && policy.visible(principal, &t.spec)
        })
    }

    pub fn schemas_for(
        &self,
        patterns: &[String],
        principal: &Principal,
        policy: &Policy,
    ) -> Vec<ToolSchema> {
        self.visible(patterns, principal, policy)
            .map(|t| t.offered.clone())
            .collect()
    }
}
