//! A JSON tool-mode reply: the action object found in free text and the
//! reply it becomes.
#![no_main]

use keel_core::clarify::ClarifyRequest;
use keel_core::pipeline::parse_arguments;
use keel_fuzz::check_reply;
use keel_protocol::CLARIFY_TOOL;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(reply) = keel_providers::fuzzing::json_mode_reply(text) else {
        return;
    };
    check_reply(&reply);
    if let Some(c) = reply.understanding.confidence {
        assert!((0.0..=1.0).contains(&c), "confidence {c}");
    }
    match reply.tool_calls.as_slice() {
        [] => assert!(!reply.text.trim().is_empty(), "an empty answer"),
        [call] => {
            assert!(reply.text.is_empty());
            assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
            // The loop must be able to read what the adapter wrote.
            let parsed = parse_arguments(&call.arguments);
            assert!(parsed.is_ok(), "{parsed:?} from {}", call.arguments);
            if call.name == CLARIFY_TOOL {
                let request = ClarifyRequest::parse(&call.arguments);
                assert!(!request.tool_name.is_empty(), "{}", call.arguments);
            }
        }
        calls => panic!("{} calls from one action", calls.len()),
    }
});
