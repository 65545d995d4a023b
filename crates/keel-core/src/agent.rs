//! An agent as the loop uses it: its configuration plus a live model client.

use std::sync::Arc;

use keel_config::AgentConfig;
use keel_protocol::ModelClient;

#[derive(Clone)]
pub struct AgentRuntime {
    pub config: AgentConfig,
    pub model: Arc<dyn ModelClient>,
}
