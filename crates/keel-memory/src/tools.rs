//! `memory_search` and `memory_get` (SPEC §5, §6): built-in, read-only
//! tools scoped to the calling run's tenant and agent, never to anything
//! the model passes.

use std::sync::Arc;

use async_trait::async_trait;
use keel_protocol::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
use serde_json::{Value, json};

use crate::hybrid::MAX_K;
use crate::{Memory, MemoryError};

/// Hits returned when the model does not say how many.
const DEFAULT_K: usize = 5;

/// Lines returned by `memory_get` when the model does not say how many.
const DEFAULT_LINES: usize = 40;

/// Most lines one `memory_get` returns.
const MAX_LINES: usize = 400;

pub struct MemorySearchTool {
    memory: Arc<dyn Memory>,
    spec: ToolSpec,
}

impl MemorySearchTool {
    pub fn new(memory: Arc<dyn Memory>) -> Self {
        let spec = ToolSpec::new(
            "memory_search",
            "Search long-term memory (summaries of earlier sessions, stored documents and \
             notes) by meaning and keywords. Returns hits with id, source, snippet and score; \
             read more of a hit with memory_get.",
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "description": "What to look for, in natural language."},
                    "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "description": "How many hits to return (default 5)."}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
        );
        Self {
            memory,
            spec: read_only(spec),
        }
    }
}

pub struct MemoryGetTool {
    memory: Arc<dyn Memory>,
    spec: ToolSpec,
}

impl MemoryGetTool {
    pub fn new(memory: Arc<dyn Memory>) -> Self {
        let spec = ToolSpec::new(
            "memory_get",
            "Read a memory item by the id memory_search returned: `lines` lines starting at \
             line `from` (1 = the item's first line).",
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1, "description": "A hit id from memory_search."},
                    "from": {"type": "integer", "minimum": 1, "description": "First line to return, counted from the item's start (default 1)."},
                    "lines": {"type": "integer", "minimum": 1, "maximum": MAX_LINES, "description": "How many lines to return (default 40)."}
                },
                "required": ["id"],
                "additionalProperties": false
            }),
        );
        Self {
            memory,
            spec: read_only(spec),
        }
    }
}

fn read_only(mut spec: ToolSpec) -> ToolSpec {
    spec.idempotent = true;
    spec
}

fn uint(arguments: &Value, name: &str) -> Option<usize> {
    arguments
        .get(name)
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
}

fn tool_error(e: MemoryError) -> ToolError {
    match e {
        MemoryError::Invalid(m) => ToolError::Failed(m),
        other => ToolError::Unavailable(other.to_string()),
    }
}

#[async_trait]
impl Tool for MemorySearchTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let query = arguments
            .get("query")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::Failed("query: a string is required".into()))?;
        let k = uint(&arguments, "k").unwrap_or(DEFAULT_K).clamp(1, MAX_K);
        let hits = self
            .memory
            .search(&ctx.tenant, &ctx.agent, query, k)
            .await
            .map_err(tool_error)?;
        let structured = json!({ "hits": hits });
        Ok(ToolOutput {
            content: structured.to_string(),
            structured: Some(structured),
            is_error: false,
        })
    }
}

#[async_trait]
impl Tool for MemoryGetTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let id = arguments
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::Failed("id: a string is required".into()))?;
        let from = uint(&arguments, "from").unwrap_or(1).max(1);
        let lines = uint(&arguments, "lines")
            .unwrap_or(DEFAULT_LINES)
            .clamp(1, MAX_LINES);
        let text = self
            .memory
            .get(&ctx.tenant, &ctx.agent, id, from, lines)
            .await
            .map_err(tool_error)?;
        match text {
            Some(text) => Ok(ToolOutput {
                content: text.clone(),
                structured: Some(json!({"id": id, "from": from, "text": text})),
                is_error: false,
            }),
            None => Ok(ToolOutput {
                content: format!("no memory item with id {id:?}"),
                structured: None,
                is_error: true,
            }),
        }
    }
}
