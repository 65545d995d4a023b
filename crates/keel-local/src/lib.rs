//! keel's embedded local model (SPEC §8, provider `local`): any llama-family
//! or Qwen GGUF run in-process with llama.cpp. When tools are offered the
//! decoder is constrained by llguidance to a JSON schema generated from
//! them, so even a 135M model always emits a valid action; the loop's
//! guardrails then apply as with any other provider.

mod action_schema;
pub mod catalog;
mod client;
mod closing;
mod engine;
mod error;
mod json_state;
mod prompt;
mod settings;
mod template;
mod weights;

pub use action_schema::CLARIFY_TOOL;
pub use catalog::{DEFAULT_MODEL, KNOWN_MODELS, KnownModel};
pub use client::LocalModel;
pub use error::LocalError;
pub use settings::{DEFAULT_MAX_OUTPUT_TOKENS, LocalSettings, MAX_DEFAULT_THREADS};
