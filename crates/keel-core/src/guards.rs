//! The guardrails a runtime applies to every call, built once at startup:
//! before_tool_call hooks, the policy gate and the verifier. The guard
//! pipeline (`crate::pipeline`) runs them.

use std::sync::Arc;

use keel_guard::hooks::BeforeToolCall;
use keel_guard::policy::Policy;
use keel_guard::verify::Verifier;

#[derive(Clone)]
pub struct Guards {
    pub policy: Policy,
    pub hooks: Vec<Arc<dyn BeforeToolCall>>,
    pub verifier: Verifier,
}

impl Guards {
    /// Built-in rules only: roles, approval for `requires_approval` and
    /// dangerous tools, tenant isolation, non-empty results.
    pub fn defaults() -> Result<Self, String> {
        Ok(Self {
            policy: Policy::compile(&keel_config::PolicyConfig::default())
                .map_err(|e| e.to_string())?,
            hooks: Vec::new(),
            verifier: Verifier::new(&keel_config::VerifyConfig::default()),
        })
    }
}
