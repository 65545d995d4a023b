//! Model providers behind keel's `ModelClient` port.
//!
//! Each provider owns its wire format, streaming and retries, so the agent loop
//! only ever sees reassembled decisions.

pub mod openai;
mod retry;
