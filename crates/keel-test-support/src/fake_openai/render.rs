#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The honest wire format: `chat.completion` objects and
//! `chat.completion.chunk` SSE frames shaped like OpenAI's.

use serde_json::{Value, json};

/// What one completion contains once ids are assigned.
pub(crate) struct Completion<'a> {
    pub id: String,
    pub model: &'a str,
    pub created: u64,
    pub text: &'a str,
    /// (call id, function name, raw arguments)
    pub calls: Vec<(String, &'a str, &'a str)>,
    pub reasoning: Option<&'a str>,
    pub finish_reason: String,
    pub usage: (u64, u64),
}

fn usage_json((prompt, completion): (u64, u64)) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// A whole `chat.completion` object.
pub(crate) fn completion_object(c: &Completion<'_>) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": if c.text.is_empty() && !c.calls.is_empty() { Value::Null } else { json!(c.text) },
        "refusal": null,
    });
    if let Some(reasoning) = c.reasoning {
        message["reasoning_content"] = json!(reasoning);
    }
    if !c.calls.is_empty() {
        message["tool_calls"] = c
            .calls
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
    }
    json!({
        "id": c.id,
        "object": "chat.completion",
        "created": c.created,
        "model": c.model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": c.finish_reason}],
        "usage": usage_json(c.usage),
        "system_fingerprint": "fp_fake",
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

/// The SSE `data:` payloads of a streamed completion, `[DONE]` excluded.
/// `complete` false stops after the content (for a stream that breaks).
pub(crate) fn chunk_payloads(
    c: &Completion<'_>,
    include_usage: bool,
    complete: bool,
) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": c.id,
            "object": "chat.completion.chunk",
            "created": c.created,
            "model": c.model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
        .to_string()
    };
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(reasoning) = c.reasoning {
        for piece in pieces(reasoning) {
            out.push(chunk(json!({"reasoning_content": piece}), Value::Null));
        }
    }
    for piece in pieces(c.text) {
        out.push(chunk(json!({"content": piece}), Value::Null));
    }
    if !complete {
        return out;
    }
    for (index, (id, name, args)) in c.calls.iter().enumerate() {
        out.push(chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            Value::Null,
        ));
        for piece in pieces(args) {
            out.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                Value::Null,
            ));
        }
    }
    out.push(chunk(json!({}), json!(c.finish_reason)));
    if include_usage {
        out.push(
            json!({
                "id": c.id,
                "object": "chat.completion.chunk",
                "created": c.created,
                "model": c.model,
                "system_fingerprint": "fp_fake",
                "choices": [],
                "usage": usage_json(c.usage),
            })
            .to_string(),
        );
    }
    out
}

/// An OpenAI-style error body.
pub(crate) fn error_body(message: &str, kind: &str, param: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": null}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_text_on_char_boundaries() {
        let text = "héllo wörld ünïcode";
        let parts = pieces(text);
        assert!(parts.len() >= 3);
        assert_eq!(parts.concat(), text);
        assert!(pieces("").is_empty());
        assert_eq!(pieces("a"), vec!["a"]);
    }
}
