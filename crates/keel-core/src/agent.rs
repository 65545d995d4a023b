//! An agent as the loop uses it: its configuration plus a live model client.

use std::sync::Arc;

use keel_config::{AgentConfig, Price, ProviderConfig, ProviderKind};
use keel_protocol::{Message, ModelClient};

#[derive(Clone)]
pub struct AgentRuntime {
    /// Shared by every run of the agent: a run holds the agent for its
    /// whole life, and a deep copy each was memory for thousands of runs.
    pub config: Arc<AgentConfig>,
    /// The system message of the agent's runs (see
    /// [`crate::prompt::system_message`]), built once for all of them; a
    /// run whose hook adds context builds its own.
    pub system_message: Arc<Message>,
    pub model: Arc<dyn ModelClient>,
    /// What the model costs (docs/spend.md); `None` when no price is
    /// known, which a spend limit refuses.
    pub price: Option<Price>,
    /// The output cap of the provider, for calls that name none.
    pub max_output_tokens: Option<u32>,
}

impl AgentRuntime {
    /// The agent running `model` of `provider`: a local model costs nothing
    /// unless the provider gives it a price.
    pub fn new(
        config: AgentConfig,
        model: Arc<dyn ModelClient>,
        provider: Option<&ProviderConfig>,
    ) -> Self {
        let price = provider.and_then(|p| {
            p.price
                .or((p.kind == ProviderKind::Local).then_some(Price::FREE))
        });
        Self {
            system_message: crate::prompt::system_message(&config.system_prompt),
            config: Arc::new(config),
            model,
            price,
            max_output_tokens: provider.and_then(|p| p.max_output_tokens),
        }
    }
}
