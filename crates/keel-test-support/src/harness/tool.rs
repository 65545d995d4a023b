//! Tools made from closures, with the spec settings the guards look at and
//! a log of every execution for assertions.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use keel_protocol::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec};
use serde_json::Value;

type Handler =
    dyn Fn(Value, ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + Sync;

/// A tool for tests: a [`ToolSpec`] plus a closure. Clones share the log.
#[derive(Clone)]
pub struct TestTool {
    spec: ToolSpec,
    handler: Arc<Handler>,
    log: Arc<Mutex<Vec<Value>>>,
}

/// A tool answering with `f(arguments)`. `f` may return a [`Value`]
/// (structured), a string, a [`ToolOutput`], or a `Result` of those whose
/// error (a string or a [`ToolError`]) fails the call.
pub fn tool<F, R>(name: &str, parameters: Value, f: F) -> TestTool
where
    F: Fn(&Value) -> R + Send + Sync + 'static,
    R: IntoToolResult,
{
    let f = Arc::new(f);
    TestTool::from_handler(
        name,
        parameters,
        Arc::new(move |args: Value, _ctx: ToolContext| {
            let result = f(&args).into_tool_result();
            Box::pin(async move { result }) as BoxFuture<'static, _>
        }),
    )
}

/// A tool whose body is async and sees on whose behalf it runs: for a tool
/// that must wait (on a [`crate::scripted::Gate`]) or answer by tenant.
pub fn async_tool<F, Fut, R>(name: &str, parameters: Value, f: F) -> TestTool
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: IntoToolResult,
{
    let f = Arc::new(f);
    TestTool::from_handler(
        name,
        parameters,
        Arc::new(move |args: Value, ctx: ToolContext| {
            let fut = f(args, ctx);
            Box::pin(async move { fut.await.into_tool_result() }) as BoxFuture<'static, _>
        }),
    )
}

impl TestTool {
    fn from_handler(name: &str, parameters: Value, handler: Arc<Handler>) -> Self {
        Self {
            spec: ToolSpec::new(name, format!("The test tool {name}"), parameters),
            handler,
            log: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn description(mut self, description: &str) -> Self {
        self.spec.description = description.to_owned();
        self
    }

    pub fn risk(mut self, risk: Risk) -> Self {
        self.spec.risk = risk;
        self
    }

    pub fn requires_approval(mut self, yes: bool) -> Self {
        self.spec.requires_approval = yes;
        self
    }

    pub fn idempotent(mut self, yes: bool) -> Self {
        self.spec.idempotent = yes;
        self
    }

    /// A status check the model is expected to repeat (SPEC §4.10).
    pub fn poll(mut self, yes: bool) -> Self {
        self.spec.poll = yes;
        self
    }

    /// Roles a principal needs to use the tool.
    pub fn roles(mut self, roles: &[&str]) -> Self {
        self.spec.roles = roles.iter().map(|r| (*r).to_owned()).collect();
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout = timeout;
        self
    }

    pub fn output_schema(mut self, schema: Value) -> Self {
        self.spec.output_schema = Some(schema);
        self
    }

    /// Result fields ignored when loop detection compares outcomes.
    pub fn volatile_fields(mut self, fields: &[&str]) -> Self {
        self.spec.volatile_fields = fields.iter().map(|f| (*f).to_owned()).collect();
        self
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The arguments of every execution so far, in order.
    pub fn calls(&self) -> Vec<Value> {
        self.log().clone()
    }

    fn log(&self) -> MutexGuard<'_, Vec<Value>> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl Tool for TestTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        self.log().push(arguments.clone());
        (self.handler)(arguments, ctx.clone()).await
    }
}

/// What a test tool's closure may return.
pub trait IntoToolResult {
    fn into_tool_result(self) -> Result<ToolOutput, ToolError>;
}

impl IntoToolResult for ToolOutput {
    fn into_tool_result(self) -> Result<ToolOutput, ToolError> {
        Ok(self)
    }
}

/// A string is the text the model reads; any other value is also kept as
/// the structured result, as a JSON-speaking tool would give it.
impl IntoToolResult for Value {
    fn into_tool_result(self) -> Result<ToolOutput, ToolError> {
        Ok(match self {
            Value::String(text) => ToolOutput::text(text),
            other => ToolOutput {
                content: other.to_string(),
                structured: Some(other),
                is_error: false,
            },
        })
    }
}

impl IntoToolResult for String {
    fn into_tool_result(self) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text(self))
    }
}

impl IntoToolResult for &str {
    fn into_tool_result(self) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text(self))
    }
}

impl<T: IntoToolResult, E: IntoToolError> IntoToolResult for Result<T, E> {
    fn into_tool_result(self) -> Result<ToolOutput, ToolError> {
        self.map_err(IntoToolError::into_tool_error)
            .and_then(IntoToolResult::into_tool_result)
    }
}

/// What a test tool's closure may fail with.
pub trait IntoToolError {
    fn into_tool_error(self) -> ToolError;
}

impl IntoToolError for ToolError {
    fn into_tool_error(self) -> ToolError {
        self
    }
}

impl IntoToolError for String {
    fn into_tool_error(self) -> ToolError {
        ToolError::Failed(self)
    }
}

impl IntoToolError for &str {
    fn into_tool_error(self) -> ToolError {
        ToolError::Failed(self.to_owned())
    }
}
