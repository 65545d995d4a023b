//! Model spend (docs/spend.md): what a provider's model costs, and the
//! daily and monthly spend limits of tenants and agents that keel enforces
//! before each model call is sent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A model's price in USD per million tokens, as the provider bills it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// USD per million prompt (input) tokens.
    #[schemars(example = 2.5)]
    pub input_usd_per_mtok: f64,
    /// USD per million completion (output) tokens.
    #[schemars(example = 10.0)]
    pub output_usd_per_mtok: f64,
}

impl Price {
    /// What a local model costs: nothing is billed per token.
    pub const FREE: Price = Price {
        input_usd_per_mtok: 0.0,
        output_usd_per_mtok: 0.0,
    };

    /// The cost of `prompt` and `completion` tokens in micro-USD, rounded
    /// up: a token at X USD per million tokens costs exactly X micro-USD.
    pub fn cost_micros(&self, prompt: u64, completion: u64) -> u64 {
        let micros = prompt as f64 * self.input_usd_per_mtok.max(0.0)
            + completion as f64 * self.output_usd_per_mtok.max(0.0);
        if micros.is_finite() {
            micros.ceil() as u64
        } else {
            u64::MAX
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_micro_usd_rounded_up() {
        let price = Price {
            input_usd_per_mtok: 2.5,
            output_usd_per_mtok: 10.0,
        };
        // 1,000 prompt tokens at $2.50/M = $0.0025; 100 completion at $10/M = $0.001.
        assert_eq!(price.cost_micros(1_000, 100), 3_500);
        assert_eq!(price.cost_micros(1, 0), 3);
        assert_eq!(Price::FREE.cost_micros(1_000_000, 1_000_000), 0);
    }
}
