//! A whole Messages API reply body, and the same bytes as an error body.
#![no_main]

use keel_fuzz::check_reply;
use keel_providers::fuzzing::{anthropic_error_message, anthropic_message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reply) = anthropic_message(data) {
        check_reply(&reply);
    }
    let _ = anthropic_error_message(&String::from_utf8_lossy(data));
});
