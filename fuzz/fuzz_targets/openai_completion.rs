//! A whole Chat Completions reply body, the same bytes as an error body,
//! and as a `Retry-After` value.
#![no_main]

use std::time::{Duration, SystemTime};

use keel_fuzz::check_reply;
use keel_providers::fuzzing::{openai_completion, openai_error_message, retry_after};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reply) = openai_completion(data) {
        check_reply(&reply);
    }
    let text = String::from_utf8_lossy(data);
    let _ = openai_error_message(&text);
    if let Some(wait) = retry_after(&text, SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 31)) {
        // A provider cannot make a run wait longer than the cap.
        assert!(wait <= Duration::from_secs(60), "{wait:?}");
    }
});
