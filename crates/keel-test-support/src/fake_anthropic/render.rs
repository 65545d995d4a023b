#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The honest wire format: `message` objects and the SSE event sequence
//! (`message_start` … `message_stop`) shaped like Anthropic's.

use serde_json::{Value, json};

/// One content block once ids are assigned.
pub(crate) enum Block<'a> {
    Thinking(&'a str),
    RedactedThinking,
    Text(&'a str),
    ToolUse {
        id: String,
        name: &'a str,
        input: &'a Value,
    },
}

/// What one message contains.
pub(crate) struct Message<'a> {
    pub id: String,
    pub model: &'a str,
    pub blocks: Vec<Block<'a>>,
    pub stop_reason: String,
    pub usage: (u64, u64),
}

const SIGNATURE: &str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds";
const REDACTED: &str = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP";

fn block_json(block: &Block<'_>) -> Value {
    match block {
        Block::Thinking(t) => json!({"type": "thinking", "thinking": t, "signature": SIGNATURE}),
        Block::RedactedThinking => json!({"type": "redacted_thinking", "data": REDACTED}),
        Block::Text(t) => json!({"type": "text", "text": t}),
        Block::ToolUse { id, name, input } => {
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
    }
}

/// A whole `message` object.
pub(crate) fn message_object(m: &Message<'_>) -> Value {
    json!({
        "id": m.id,
        "type": "message",
        "role": "assistant",
        "model": m.model,
        "content": m.blocks.iter().map(block_json).collect::<Vec<_>>(),
        "stop_reason": m.stop_reason,
        "stop_sequence": null,
        "usage": {"input_tokens": m.usage.0, "output_tokens": m.usage.1},
    })
}

/// Splits text into several pieces on char boundaries, like a model's deltas.
pub(crate) fn pieces(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    let size = text.len().div_ceil(4).clamp(1, 8192);
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn event(kind: &str, data: Value) -> (String, String) {
    (kind.to_string(), data.to_string())
}

/// The `message_start` event.
pub(crate) fn start_event(m: &Message<'_>) -> (String, String) {
    event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": m.id, "type": "message", "role": "assistant", "model": m.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": m.usage.0, "output_tokens": 1},
        }}),
    )
}

/// The SSE events of one content block at `index`.
pub(crate) fn block_events(index: usize, block: &Block<'_>) -> Vec<(String, String)> {
    let delta = |d: Value| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": d}),
        )
    };
    let start = |b: Value| {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": b}),
        )
    };
    let mut out = Vec::new();
    match block {
        Block::Thinking(t) => {
            out.push(start(
                json!({"type": "thinking", "thinking": "", "signature": ""}),
            ));
            for piece in pieces(t) {
                out.push(delta(json!({"type": "thinking_delta", "thinking": piece})));
            }
            out.push(delta(
                json!({"type": "signature_delta", "signature": SIGNATURE}),
            ));
        }
        Block::RedactedThinking => out.push(start(block_json(block))),
        Block::Text(t) => {
            out.push(start(json!({"type": "text", "text": ""})));
            for piece in pieces(t) {
                out.push(delta(json!({"type": "text_delta", "text": piece})));
            }
        }
        Block::ToolUse { id, name, input } => {
            out.push(start(
                json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
            ));
            // The real API opens with an empty fragment before the JSON.
            out.push(delta(
                json!({"type": "input_json_delta", "partial_json": ""}),
            ));
            let raw = input.to_string();
            for piece in pieces(&raw) {
                out.push(delta(
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
        }
    }
    out.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    ));
    out
}

/// Every event of a complete streamed message.
pub(crate) fn stream_events(m: &Message<'_>) -> Vec<(String, String)> {
    let mut out = vec![start_event(m), event("ping", json!({"type": "ping"}))];
    for (index, block) in m.blocks.iter().enumerate() {
        out.extend(block_events(index, block));
    }
    out.push(event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": m.stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": m.usage.1}}),
    ));
    out.push(event("message_stop", json!({"type": "message_stop"})));
    out
}

/// An `error` event as sent mid-stream.
pub(crate) fn error_event(error_type: &str, message: &str) -> (String, String) {
    event("error", super::reply::error_body(error_type, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_use_stream_reassembles_to_its_input() {
        let input = json!({"city": "Paris", "days": [1, 2]});
        let events = block_events(
            0,
            &Block::ToolUse {
                id: "toolu_1".into(),
                name: "f",
                input: &input,
            },
        );
        let joined: String = events
            .iter()
            .filter_map(|(_, d)| {
                let v: Value = serde_json::from_str(d).unwrap();
                v.pointer("/delta/partial_json")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(serde_json::from_str::<Value>(&joined).unwrap(), input);
        assert!(events.len() >= 5);
    }
}
