//! Reassembly of a streamed reply from `chat.completion.chunk` SSE frames.

use std::collections::BTreeMap;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use keel_protocol::{ModelError, ModelResponse, TokenUsage};
use serde::Deserialize;
use serde_json::Value;

use super::wire::{WireUsage, arguments_text, finish_call};
use crate::http::{MAX_REPLY_BYTES, excerpt, transport_error};

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<ChunkChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

/// `reasoning_content` / `reasoning` are not declared: they are dropped on read.
#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// Accumulates chunks into one reply. Kept free of I/O so the fragment rules
/// can be tested on their own.
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    text: String,
    calls: BTreeMap<u64, PartialCall>,
    last_index: Option<u64>,
    usage: Option<TokenUsage>,
    finish_reason: Option<String>,
    done: bool,
    bytes: usize,
}

impl Assembler {
    /// Whether `data: [DONE]` has been seen.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Feeds one SSE `data` payload and returns the text to forward, if any.
    pub(crate) fn feed(&mut self, data: &str) -> Result<Option<String>, ModelError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(None);
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        self.bytes += data.len();
        if self.bytes > MAX_REPLY_BYTES {
            return Err(ModelError::Protocol(format!(
                "streamed reply exceeds {MAX_REPLY_BYTES} bytes"
            )));
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!("malformed stream chunk ({e}): {}", excerpt(data)))
        })?;
        if let Some(error) = chunk.error {
            return Err(ModelError::Protocol(format!(
                "provider reported an error mid-stream: {}",
                excerpt(&error.to_string())
            )));
        }
        // Usage may ride on any chunk, including a last one with no choices.
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.to_usage());
        }
        let mut forwarded = String::new();
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(content) = delta.content {
                forwarded.push_str(&content);
            }
            for fragment in delta.tool_calls.unwrap_or_default() {
                self.add_fragment(fragment)?;
            }
        }
        if forwarded.is_empty() {
            return Ok(None);
        }
        self.text.push_str(&forwarded);
        Ok(Some(forwarded))
    }

    fn add_fragment(&mut self, fragment: ToolCallDelta) -> Result<(), ModelError> {
        let id = fragment.id.filter(|i| !i.is_empty());
        let index = match fragment.index {
            Some(i) => i,
            // Servers that omit `index` start a new call whenever a new id appears.
            None => match (self.last_index, &id) {
                (Some(last), Some(new_id)) => {
                    let same = self
                        .calls
                        .get(&last)
                        .and_then(|c| c.id.as_ref())
                        .is_none_or(|old| old == new_id);
                    if same {
                        last
                    } else {
                        last.checked_add(1).ok_or_else(|| {
                            ModelError::Protocol(format!(
                                "tool call {new_id:?} follows the last possible index"
                            ))
                        })?
                    }
                }
                (Some(last), None) => last,
                (None, _) => 0,
            },
        };
        self.last_index = Some(index);
        let call = self.calls.entry(index).or_default();
        if call.id.is_none() {
            call.id = id;
        }
        if let Some(function) = fragment.function {
            if call.name.is_none() {
                call.name = function.name.filter(|n| !n.is_empty());
            }
            call.arguments
                .push_str(&arguments_text(function.arguments.as_ref()));
        }
        Ok(())
    }

    /// Completes the reply once the stream has ended.
    pub(crate) fn finish(self) -> Result<ModelResponse, ModelError> {
        if !self.done && self.finish_reason.is_none() {
            return Err(ModelError::Connect(
                "stream ended before the reply was complete".into(),
            ));
        }
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (position, call) in self.calls.into_values().enumerate() {
            tool_calls.push(finish_call(position, call.id, call.name, call.arguments)?);
        }
        Ok(ModelResponse {
            text: self.text,
            tool_calls,
            usage: self.usage.unwrap_or_default(),
            finish_reason: self.finish_reason,
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
        if let Some(text) = assembler.feed(&event.data)? {
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
        a.feed(&v.to_string()).unwrap()
    }

    #[test]
    fn fragments_by_index_and_usage_without_choices() {
        let mut a = Assembler::default();
        feed(
            &mut a,
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}),
        );
        assert_eq!(
            feed(
                &mut a,
                json!({"choices":[{"delta":{"content":"Hi","reasoning_content":"hmm"}}]})
            ),
            Some("Hi".into())
        );
        assert_eq!(
            feed(&mut a, json!({"choices":[{"delta":{"reasoning":"more"}}]})),
            None
        );
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":""}}]}}]}),
        );
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\""}}]}}]}),
        );
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}},{"index":1,"id":"","function":{"arguments":"{}"}}]}}]}),
        );
        feed(
            &mut a,
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        );
        feed(
            &mut a,
            json!({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6}}),
        );
        a.feed("[DONE]").unwrap();
        let r = a.finish().unwrap();
        assert_eq!(r.text, "Hi");
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(
            (
                r.tool_calls[0].id.as_str(),
                r.tool_calls[0].name.as_str(),
                r.tool_calls[0].arguments.as_str()
            ),
            ("a", "f", "{\"x\":1}")
        );
        assert_eq!(
            (r.tool_calls[1].id.as_str(), r.tool_calls[1].name.as_str()),
            ("b", "g")
        );
        assert_eq!(
            r.usage,
            TokenUsage {
                prompt_tokens: 5,
                completion_tokens: 6
            }
        );
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn calls_without_index_split_on_new_id() {
        let mut a = Assembler::default();
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{"}}]}}]}),
        );
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"}"}}]}}]}),
        );
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g"}}]}}],"finish_reason":null}),
        );
        feed(
            &mut a,
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        );
        let r = a.finish().unwrap();
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.tool_calls[0].arguments, "{}");
        assert_eq!(r.tool_calls[1].arguments, "{}");
    }

    /// Found with the `openai_sse` fuzz target: a call without `index`
    /// after one at the largest index overflowed the next index.
    #[test]
    fn a_new_call_after_the_last_index_is_an_error() {
        let mut a = Assembler::default();
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"index":u64::MAX,"id":"a","function":{"name":"f"}}]}}]}),
        );
        let err = a
            .feed(
                &json!({"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g"}}]}}]})
                    .to_string(),
            )
            .unwrap_err();
        assert!(
            matches!(&err, ModelError::Protocol(m) if m.contains("last possible index")),
            "{err:?}"
        );
    }

    #[test]
    fn malformed_chunk_missing_name_and_early_end() {
        let mut a = Assembler::default();
        let err = a.feed("{\"choices\": [").unwrap_err();
        assert!(matches!(err, ModelError::Protocol(m) if m.contains("malformed stream chunk")));

        let mut a = Assembler::default();
        feed(
            &mut a,
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}),
        );
        assert!(
            matches!(a.finish(), Err(ModelError::Protocol(m)) if m.contains("no function name"))
        );

        let mut a = Assembler::default();
        feed(&mut a, json!({"choices":[{"delta":{"content":"part"}}]}));
        assert!(matches!(a.finish(), Err(ModelError::Connect(_))));
    }
}
