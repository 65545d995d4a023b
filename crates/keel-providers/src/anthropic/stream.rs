//! Reassembly of a streamed Messages API reply from its SSE events.

use std::collections::BTreeMap;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use keel_protocol::{ModelError, ModelResponse, TokenUsage};
use serde_json::Value;

use super::wire::{WireUsage, event_error, finish_call};
use crate::http::{MAX_REPLY_BYTES, excerpt, transport_error};

/// One content block being streamed. Thinking blocks are tracked only so
/// their deltas can be recognised and dropped.
#[derive(Debug)]
enum Block {
    Text,
    ToolUse {
        id: Option<String>,
        name: Option<String>,
        /// `input` of `content_block_start`, used when no delta follows.
        initial: Option<Value>,
        partial_json: String,
    },
    Hidden,
}

/// Accumulates events into one reply. Kept free of I/O so the event rules can
/// be tested on their own.
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    text: String,
    blocks: BTreeMap<u64, Block>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    stop_reason: Option<String>,
    done: bool,
    bytes: usize,
}

impl Assembler {
    /// Whether `message_stop` has been seen.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Feeds one SSE event and returns the text to forward, if any. The
    /// event's kind is read from `data.type`, which the API always sets,
    /// falling back to the SSE `event:` name.
    pub(crate) fn feed(&mut self, event: &str, data: &str) -> Result<Option<String>, ModelError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(None);
        }
        self.bytes += data.len();
        if self.bytes > MAX_REPLY_BYTES {
            return Err(ModelError::Protocol(format!(
                "streamed reply exceeds {MAX_REPLY_BYTES} bytes"
            )));
        }
        let value: Value = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!("malformed stream event ({e}): {}", excerpt(data)))
        })?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event)
            .to_owned();
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind.as_str() {
            "message_start" => {
                if let Some(usage) = value.pointer("/message/usage") {
                    self.read_usage(usage);
                }
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                let started = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        // A start block may carry initial text (it is "" in practice).
                        let initial = block.get("text").and_then(Value::as_str).unwrap_or("");
                        self.blocks.insert(index, Block::Text);
                        return Ok(self.forward(initial));
                    }
                    Some("tool_use") => Block::ToolUse {
                        id: block.get("id").and_then(Value::as_str).map(str::to_owned),
                        name: block.get("name").and_then(Value::as_str).map(str::to_owned),
                        initial: block.get("input").cloned(),
                        partial_json: String::new(),
                    },
                    _ => Block::Hidden,
                };
                self.blocks.insert(index, started);
            }
            "content_block_delta" => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                match (
                    delta.get("type").and_then(Value::as_str),
                    self.blocks.get_mut(&index),
                ) {
                    (Some("text_delta"), Some(Block::Text)) => {
                        let text = delta.get("text").and_then(Value::as_str).unwrap_or("");
                        return Ok(self.forward(text));
                    }
                    (Some("input_json_delta"), Some(Block::ToolUse { partial_json, .. })) => {
                        if let Some(part) = delta.get("partial_json").and_then(Value::as_str) {
                            partial_json.push_str(part);
                        }
                    }
                    (Some("text_delta" | "input_json_delta"), None) => {
                        return Err(ModelError::Protocol(format!(
                            "delta for content block {index}, which was never started"
                        )));
                    }
                    // thinking_delta, signature_delta, deltas of hidden blocks
                    // (thinking, server tools) and unknown kinds are dropped.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = value.get("usage") {
                    self.read_usage(usage);
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                return Err(event_error(value.get("error").unwrap_or(&Value::Null)));
            }
            // ping, content_block_stop and event kinds added later.
            _ => {}
        }
        Ok(None)
    }

    fn forward(&mut self, text: &str) -> Option<String> {
        if text.is_empty() {
            return None;
        }
        self.text.push_str(text);
        Some(text.to_owned())
    }

    /// `message_start` carries input tokens; `message_delta` the cumulative
    /// output tokens (and, on newer API versions, input tokens again).
    fn read_usage(&mut self, usage: &Value) {
        let Ok(usage) = serde_json::from_value::<WireUsage>(usage.clone()) else {
            return;
        };
        if let Some(prompt) = usage.prompt_tokens() {
            self.prompt_tokens = Some(prompt);
        }
        if let Some(output) = usage.output_tokens {
            self.completion_tokens = Some(output);
        }
    }

    /// Completes the reply once the stream has ended.
    pub(crate) fn finish(self) -> Result<ModelResponse, ModelError> {
        if !self.done && self.stop_reason.is_none() {
            return Err(ModelError::Connect(
                "stream ended before the reply was complete".into(),
            ));
        }
        let mut tool_calls = Vec::new();
        for block in self.blocks.into_values() {
            let Block::ToolUse {
                id,
                name,
                initial,
                partial_json,
            } = block
            else {
                continue;
            };
            let input = if partial_json.trim().is_empty() {
                match initial {
                    Some(v @ Value::Object(_)) => v.to_string(),
                    _ => String::new(),
                }
            } else {
                partial_json
            };
            tool_calls.push(finish_call(tool_calls.len(), id, name, input)?);
        }
        Ok(ModelResponse {
            text: self.text,
            tool_calls,
            usage: TokenUsage {
                prompt_tokens: self.prompt_tokens.unwrap_or(0),
                completion_tokens: self.completion_tokens.unwrap_or(0),
            },
            finish_reason: self.stop_reason,
            understanding: Default::default(),
        })
    }
}

/// Reads an SSE reply, forwarding text deltas as they arrive. `forwarded` is
/// set as soon as any text has been sent on, so the caller knows a retry
/// would show the user the same words twice.
pub(crate) async fn read_stream(
    response: reqwest::Response,
    idle: Duration,
    deltas: Option<&UnboundedSender<String>>,
    forwarded: &mut bool,
) -> Result<ModelResponse, ModelError> {
    let mut events = response.bytes_stream().eventsource();
    let mut assembler = Assembler::default();
    loop {
        let next = match tokio::time::timeout(idle, events.next()).await {
            Ok(next) => next,
            Err(_) => return Err(ModelError::Timeout),
        };
        let Some(event) = next else { break };
        let event = event.map_err(|e| match e {
            EventStreamError::Transport(e) => transport_error(&e),
            EventStreamError::Utf8(e) => {
                ModelError::Protocol(format!("stream is not valid UTF-8: {e}"))
            }
            EventStreamError::Parser(e) => {
                ModelError::Protocol(format!("stream is not valid SSE: {e}"))
            }
        })?;
        if let Some(text) = assembler.feed(&event.event, &event.data)? {
            if let Some(sender) = deltas {
                // A dropped receiver only means nobody is watching the stream.
                let _ = sender.unbounded_send(text);
            }
            *forwarded = true;
        }
        if assembler.is_done() {
            break;
        }
    }
    assembler.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn feed(a: &mut Assembler, v: Value) -> Option<String> {
        a.feed("", &v.to_string()).unwrap()
    }

    #[test]
    fn blocks_reassemble_by_index_and_thinking_is_dropped() {
        let mut a = Assembler::default();
        feed(
            &mut a,
            json!({"type":"message_start","message":{"usage":{"input_tokens":7,"output_tokens":1}}}),
        );
        feed(
            &mut a,
            json!({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}),
        );
        assert_eq!(
            feed(
                &mut a,
                json!({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"secret"}})
            ),
            None
        );
        feed(
            &mut a,
            json!({"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}),
        );
        feed(
            &mut a,
            json!({"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}),
        );
        assert_eq!(
            feed(
                &mut a,
                json!({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}})
            ),
            Some("Hi".into())
        );
        feed(
            &mut a,
            json!({"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}),
        );
        feed(
            &mut a,
            json!({"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"t2","name":"g","input":{}}}),
        );
        for (i, part) in [(2, "{\"x\""), (3, ""), (2, ":1}")] {
            feed(
                &mut a,
                json!({"type":"content_block_delta","index":i,"delta":{"type":"input_json_delta","partial_json":part}}),
            );
        }
        feed(&mut a, json!({"type":"ping"}));
        feed(
            &mut a,
            json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}),
        );
        feed(&mut a, json!({"type":"message_stop"}));
        assert!(a.is_done());
        let r = a.finish().unwrap();
        assert_eq!(r.text, "Hi");
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(
            (
                r.tool_calls[0].id.as_str(),
                r.tool_calls[0].arguments.as_str()
            ),
            ("t1", "{\"x\":1}")
        );
        assert_eq!(
            (
                r.tool_calls[1].id.as_str(),
                r.tool_calls[1].arguments.as_str()
            ),
            ("t2", "{}")
        );
        assert_eq!(
            r.usage,
            TokenUsage {
                prompt_tokens: 7,
                completion_tokens: 9
            }
        );
    }

    /// Found with the `anthropic_sse` fuzz target: prompt token counts
    /// whose sum overflows made reading the stream panic.
    #[test]
    fn huge_token_counts_saturate() {
        let mut a = Assembler::default();
        feed(
            &mut a,
            json!({"type":"message_start","message":{"usage":{"input_tokens":u64::MAX,"cache_read_input_tokens":1}}}),
        );
        feed(&mut a, json!({"type":"message_stop"}));
        assert_eq!(a.finish().unwrap().usage.prompt_tokens, u64::MAX);
    }

    #[test]
    fn error_event_early_end_and_malformed() {
        let mut a = Assembler::default();
        let err = a
            .feed(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            )
            .unwrap_err();
        assert!(matches!(err, ModelError::Http { status: 529, .. }));

        let mut a = Assembler::default();
        assert!(matches!(
            a.feed("x", "{nope"),
            Err(ModelError::Protocol(m)) if m.contains("malformed stream event")
        ));

        let mut a = Assembler::default();
        feed(
            &mut a,
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        );
        feed(
            &mut a,
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"part"}}),
        );
        assert!(matches!(a.finish(), Err(ModelError::Connect(_))));
    }
}
