//! One JSON-RPC message from an MCP server, and what keel makes of the
//! tool lists and tool results in it.
#![no_main]

use keel_guard::schema::CompiledSchema;
use keel_tools::mcp::fuzzing::{SERVER, server_message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let read = server_message(data);
    for spec in &read.tools {
        // A tool keel offers is named under its server and can be checked.
        assert!(
            spec.name.starts_with(&format!("{SERVER}.")),
            "{}",
            spec.name
        );
        assert!(
            CompiledSchema::compile(&spec.parameters).is_ok(),
            "{}",
            spec.parameters
        );
    }
    for output in &read.outputs {
        if let Some(structured) = &output.structured
            && output.content.is_empty()
        {
            panic!("structured content {structured} was not shown as text");
        }
    }
});
