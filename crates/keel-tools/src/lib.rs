//! keel-tools: the tools keel reaches outside itself (SPEC §5): HTTP
//! endpoints described in configuration and MCP servers, run as child
//! processes or reached over streamable HTTP. Both are exposed only through keel-protocol's `Tool` port, so
//! nothing above this crate sees reqwest or rmcp.

mod env;
mod error;
pub mod exec;
pub mod http;
mod load;
pub mod mcp;
mod overrides;
mod trust;
pub mod web_fetch;

pub use error::ToolsError;
pub use load::{LoadedTools, ToolChanges, load_tools};
pub use overrides::apply_override;
pub use trust::{ConfiguredTrust, RiskSource, TrustOrigin, TrustSummary, needs_approval};
