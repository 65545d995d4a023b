//! An agent as the loop uses it: its configuration plus a live model client.

use std::sync::Arc;

use keel_config::{AgentConfig, Price, ProviderConfig, ProviderKind};
use keel_protocol::ModelClient;

#[derive(Clone)]
pub struct AgentRuntime {
    pub config: AgentConfig,
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
            config,
            model,
            price,
            max_output_tokens: provider.and_then(|p| p.max_output_tokens),
        }
    }
}
