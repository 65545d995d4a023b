//! An SSE body from a streamable-HTTP MCP server: event splitting with the
//! per-event size limit, then each event's data as a JSON-RPC message.
#![no_main]

use keel_fuzz::{block_on, reads};
use keel_tools::mcp::fuzzing::{server_message, sse_body};
use libfuzzer_sys::fuzz_target;

/// Small, so that inputs the fuzzer can reach cross it.
const MAX_EVENT: usize = 512;

fuzz_target!(|data: &[u8]| {
    let Some(events) = block_on(sse_body(reads(data), MAX_EVENT)) else {
        return;
    };
    for data in events.into_iter().flatten().flatten() {
        // No event larger than the limit gets through.
        assert!(data.len() <= MAX_EVENT, "{} bytes", data.len());
        let _ = server_message(data.as_bytes());
    }
});
