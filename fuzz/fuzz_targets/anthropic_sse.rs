//! A streamed Messages API reply: SSE decoding and event reassembly.
#![no_main]

use keel_fuzz::{block_on, check_reply, reads};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(streamed) = block_on(keel_providers::fuzzing::anthropic_stream(reads(data))) else {
        return;
    };
    if let Ok(reply) = &streamed.result {
        check_reply(reply);
        // What the user saw while it streamed is exactly the answer.
        assert_eq!(streamed.forwarded, reply.text);
    }
});
