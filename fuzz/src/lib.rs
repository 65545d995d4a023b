//! What the fuzz targets share: splitting an input into the reads a
//! network body arrives in, and a runtime for the async readers.

use std::future::Future;
use std::sync::OnceLock;

/// The input's first byte is the size of each read of the rest (0: the
/// rest in one read), so the fuzzer also explores where reads split lines,
/// events and UTF-8 sequences.
pub fn reads(data: &[u8]) -> Vec<Vec<u8>> {
    let Some((&size, body)) = data.split_first() else {
        return Vec::new();
    };
    if size == 0 || body.is_empty() {
        return vec![body.to_vec()];
    }
    body.chunks(usize::from(size)).map(<[u8]>::to_vec).collect()
}

/// Runs `future` to completion on one shared single-thread runtime, with
/// the timer the readers' idle timeouts need; `None` only if no runtime
/// can be built.
pub fn block_on<F: Future>(future: F) -> Option<F::Output> {
    static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .ok()
    });
    runtime.as_ref().map(|rt| rt.block_on(future))
}

/// The checks every reply keel hands the loop must pass: a tool call can
/// be routed (it has a name), answered (it has an id) and parsed (its
/// arguments are never empty text).
pub fn check_reply(reply: &keel_protocol::ModelResponse) {
    for call in &reply.tool_calls {
        assert!(!call.name.is_empty(), "tool call without a name: {call:?}");
        assert!(!call.id.is_empty(), "tool call without an id: {call:?}");
        assert!(
            !call.arguments.trim().is_empty(),
            "tool call with empty arguments: {call:?}"
        );
    }
}
