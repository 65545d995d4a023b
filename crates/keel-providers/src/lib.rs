//! Model providers behind keel's `ModelClient` port.
//!
//! Each provider owns its wire format, streaming and retries, so the agent loop
//! only ever sees reassembled decisions. `json_mode` wraps any of them for
//! models without native tool calling.

pub mod anthropic;
mod encoded;
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod in_flight;
pub mod json_mode;
pub mod openai;
mod retry;
