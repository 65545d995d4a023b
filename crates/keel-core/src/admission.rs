//! The operator's last word on a call the guard pipeline cleared
//! (`before_tool_call` HTTP hooks, docs/gateway.md). Asked outside the
//! pipeline because it does I/O; asked from the one step that executes
//! server-side calls, so every entry path reaches it.

use serde_json::Value;

/// A call the guard pipeline cleared, about to run on the server.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionCall<'a> {
    pub tenant: &'a str,
    pub principal: &'a str,
    pub agent: &'a str,
    pub session: &'a str,
    pub run_id: &'a str,
    pub call_id: &'a str,
    pub tool: &'a str,
    pub arguments: &'a Value,
}

/// The operator's last word on a cleared call (`before_tool_call` HTTP
/// hooks): it sees the final arguments and may only refuse. `Err` names
/// the hook that refused and why; a hook that cannot be asked refuses.
#[async_trait::async_trait]
pub trait Admission: Send + Sync {
    async fn admit(&self, call: AdmissionCall<'_>) -> Result<(), (String, String)>;
}
