//! Turns a stretch of a keel run's event log into a Responses API response:
//! the typed stream events (each with its `sequence_number`) and the
//! response object they build up. Streamed and non-streamed responses both
//! come from here, so they can never disagree.
//!
//! Mapping: `message_delta` → `response.output_text.delta` of an open
//! message item; `final` (and a clarification question) closes it with the
//! authoritative text; a `tool_call` of a client tool becomes a
//! `function_call` item; server-side tool calls stay inside keel.

use keel_protocol::{Event, EventKind, Usage};
use serde_json::{Map, Value, json};

use super::ids;

/// How the response ends.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The run answered, or stopped for the client: its function calls, or
    /// a question for the user.
    Completed,
    Failed {
        code: String,
        message: String,
    },
    Cancelled {
        by: String,
    },
}

struct OpenMessage {
    id: String,
    index: usize,
    text: String,
}

pub struct Encoder {
    run_id: String,
    /// Response fields that do not change while it runs (id, model, echoes).
    base: Map<String, Value>,
    is_client_tool: Box<dyn Fn(&str) -> bool + Send>,
    next_sequence: u64,
    output: Vec<Value>,
    open: Option<OpenMessage>,
    /// The last keel event folded in.
    pub last_seq: u64,
}

impl Encoder {
    pub fn new(
        run_id: &str,
        start: u64,
        base: Map<String, Value>,
        is_client_tool: impl Fn(&str) -> bool + Send + 'static,
    ) -> Self {
        Self {
            run_id: run_id.to_owned(),
            base,
            is_client_tool: Box::new(is_client_tool),
            next_sequence: 0,
            output: Vec::new(),
            open: None,
            last_seq: start,
        }
    }

    /// `response.created` and `response.in_progress`.
    pub fn begin(&mut self) -> Vec<Value> {
        let snapshot = self.response("in_progress", None, None);
        vec![
            self.event("response.created", json!({"response": snapshot.clone()})),
            self.event("response.in_progress", json!({"response": snapshot})),
        ]
    }

    /// Folds one keel event in; returns the stream events it produces.
    pub fn on_event(&mut self, e: &Event) -> Vec<Value> {
        if e.seq <= self.last_seq {
            return Vec::new();
        }
        self.last_seq = e.seq;
        let mut out = Vec::new();
        match &e.kind {
            EventKind::MessageDelta { text } => {
                self.open_message(e.seq, &mut out);
                self.delta(text, &mut out);
            }
            EventKind::Final { answer } => self.whole_message(e.seq, answer, &mut out),
            EventKind::ClarificationNeeded { question, .. }
            | EventKind::HandoffRequested { question, .. } => {
                self.whole_message(e.seq, question, &mut out);
            }
            EventKind::ToolCall {
                call_id,
                tool,
                arguments,
                ..
            } => {
                self.close_message(&mut out);
                if (self.is_client_tool)(tool) {
                    self.function_call(e.seq, call_id, tool, &arguments.to_string(), &mut out);
                }
            }
            _ => {}
        }
        out
    }

    /// Client calls the run waits for that no `tool_call` event announced
    /// (defensive: the run's `pending` is the authority on what it waits for).
    pub fn ensure_calls(&mut self, calls: &[(String, String, String)]) -> Vec<Value> {
        let mut out = Vec::new();
        for (call_id, name, arguments) in calls {
            let known = self
                .output
                .iter()
                .any(|i| i["type"] == "function_call" && i["call_id"] == call_id.as_str());
            if !known {
                self.close_message(&mut out);
                let seq = self.last_seq;
                self.function_call(seq, call_id, name, arguments, &mut out);
            }
        }
        out
    }

    /// Closes the response; `usage` is what this part of the run consumed.
    pub fn finish(&mut self, end: &End, usage: Usage) -> (Vec<Value>, Value) {
        let mut out = Vec::new();
        self.close_message(&mut out);
        let usage = usage_json(usage);
        let (status, kind, error) = match end {
            End::Completed => ("completed", "response.completed", None),
            End::Failed { code, message } => (
                "failed",
                "response.failed",
                Some(json!({"code": "server_error", "message": format!("{code}: {message}")})),
            ),
            End::Cancelled { by } => (
                "cancelled",
                "response.failed",
                Some(
                    json!({"code": "server_error", "message": format!("the run was cancelled by {by}")}),
                ),
            ),
        };
        let response = self.response(status, error, Some(usage));
        out.push(self.event(kind, json!({"response": response.clone()})));
        (out, response)
    }

    fn response(&self, status: &str, error: Option<Value>, usage: Option<Value>) -> Value {
        let mut r = self.base.clone();
        r.insert("status".into(), json!(status));
        r.insert("output".into(), Value::Array(self.output.clone()));
        r.insert("error".into(), error.unwrap_or(Value::Null));
        r.insert("usage".into(), usage.unwrap_or(Value::Null));
        let completed_at = (status != "in_progress").then(|| chrono::Utc::now().timestamp());
        r.insert("completed_at".into(), json!(completed_at));
        Value::Object(r)
    }

    fn event(&mut self, kind: &str, fields: Value) -> Value {
        let mut e = Map::new();
        e.insert("type".into(), json!(kind));
        e.insert("sequence_number".into(), json!(self.next_sequence));
        self.next_sequence += 1;
        if let Value::Object(f) = fields {
            e.extend(f);
        }
        Value::Object(e)
    }

    fn open_message(&mut self, seq: u64, out: &mut Vec<Value>) {
        if self.open.is_some() {
            return;
        }
        let id = ids::message_id(&self.run_id, seq);
        let index = self.output.len();
        let item = message_item(&id, "in_progress", None);
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": text_part("")}),
        ));
        self.open = Some(OpenMessage {
            id,
            index,
            text: String::new(),
        });
    }

    fn delta(&mut self, text: &str, out: &mut Vec<Value>) {
        let Some((id, index)) = self.open.as_mut().map(|m| {
            m.text.push_str(text);
            (m.id.clone(), m.index)
        }) else {
            return;
        };
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "delta": text, "logprobs": []}),
        ));
    }

    /// A complete text: continues a streamed message or sends it as one delta.
    fn whole_message(&mut self, seq: u64, text: &str, out: &mut Vec<Value>) {
        if self.open.is_none() {
            self.open_message(seq, out);
            self.delta(text, out);
        }
        if let Some(m) = self.open.as_mut() {
            m.text = text.to_owned();
        }
        self.close_message(out);
    }

    fn close_message(&mut self, out: &mut Vec<Value>) {
        let Some(m) = self.open.take() else {
            return;
        };
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                   "text": m.text, "logprobs": []}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                   "part": text_part(&m.text)}),
        ));
        let item = message_item(&m.id, "completed", Some(&m.text));
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": m.index, "item": item.clone()}),
        ));
        self.output.push(item);
    }

    fn function_call(
        &mut self,
        seq: u64,
        call_id: &str,
        name: &str,
        arguments: &str,
        out: &mut Vec<Value>,
    ) {
        let id = ids::call_item_id(&self.run_id, seq);
        let index = self.output.len();
        let item = |args: &str, status: &str| {
            json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
                   "arguments": args, "status": status})
        };
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item("", "in_progress")}),
        ));
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
        ));
        out.push(self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
        ));
        let done = item(arguments, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": done.clone()}),
        ));
        self.output.push(done);
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        Some(t) => vec![text_part(t)],
        None => Vec::new(),
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": content})
}

pub fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u64, kind: EventKind) -> Event {
        Event::new("run_ab", seq, chrono::Utc::now(), kind)
    }

    fn enc() -> Encoder {
        let mut base = Map::new();
        base.insert("id".into(), json!("resp_run_ab_0"));
        Encoder::new("run_ab", 0, base, |t| t == "get_temp")
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().filter_map(|e| e["type"].as_str()).collect()
    }

    #[test]
    fn streamed_text_then_final() {
        let mut e = enc();
        let mut all = e.begin();
        all.extend(e.on_event(&ev(1, EventKind::MessageDelta { text: "Hel".into() })));
        all.extend(e.on_event(&ev(2, EventKind::MessageDelta { text: "lo".into() })));
        all.extend(e.on_event(&ev(
            3,
            EventKind::Final {
                answer: "Hello".into(),
            },
        )));
        let (tail, response) = e.finish(&End::Completed, Usage::default());
        all.extend(tail);
        assert_eq!(
            types(&all),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, x) in all.iter().enumerate() {
            assert_eq!(x["sequence_number"], i as u64);
        }
        assert_eq!(response["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(response["output"][0]["id"], "msg_run_ab_1");
        assert_eq!(response["status"], "completed");
    }

    #[test]
    fn client_calls_become_items_and_server_calls_do_not() {
        let mut e = enc();
        e.begin();
        let server = e.on_event(&ev(
            1,
            EventKind::ToolCall {
                step: 1,
                call_id: "c0".into(),
                tool: "furnace_status".into(),
                arguments: json!({}),
            },
        ));
        assert!(server.is_empty());
        let client = e.on_event(&ev(
            2,
            EventKind::ToolCall {
                step: 1,
                call_id: "c1".into(),
                tool: "get_temp".into(),
                arguments: json!({"f": "F1"}),
            },
        ));
        assert_eq!(
            types(&client),
            [
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done"
            ]
        );
        assert!(
            e.ensure_calls(&[("c1".into(), "get_temp".into(), "{}".into())])
                .is_empty()
        );
        let (_, r) = e.finish(&End::Completed, Usage::default());
        assert_eq!(r["output"][0]["type"], "function_call");
        assert_eq!(r["output"][0]["arguments"], r#"{"f":"F1"}"#);
        assert_eq!(r["output"][0]["id"], "fc_run_ab_2");
    }

    #[test]
    fn failure_carries_the_error() {
        let mut e = enc();
        e.begin();
        let (tail, r) = e.finish(
            &End::Failed {
                code: "provider_error".into(),
                message: "down".into(),
            },
            Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                ..Usage::default()
            },
        );
        assert_eq!(tail.last().unwrap()["type"], "response.failed");
        assert_eq!(r["status"], "failed");
        assert!(r["error"]["message"].as_str().unwrap().contains("down"));
        assert_eq!(r["usage"]["total_tokens"], 5);
    }
}
