//! keel-test-support
pub mod fake_anthropic;
pub mod fake_chat;
pub mod fake_openai;
pub mod harness;
pub mod node;
pub mod pg;
pub mod scripted;
pub mod sse;
pub mod store_suite;
pub mod tcp_proxy;
pub mod tool_server;
