//! OpenTelemetry export: a run with two tool calls reaches a real OTLP/HTTP
//! receiver (protobuf decoded with the OpenTelemetry protocol's own types)
//! as one trace: an `invoke_agent` root with `chat` and `execute_tool`
//! children carrying the GenAI attributes, and the guard decisions as
//! span events. Contents stay out unless `capture_content` is on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use common::{Env, Keel};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

/// An OTLP/HTTP traces endpoint that keeps every span it decodes, with the
/// `service.name` of its resource.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    content_types: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let spans: Arc<Mutex<Vec<(String, Span)>>> = Arc::default();
        let content_types: Arc<Mutex<Vec<String>>> = Arc::default();
        let (s, c) = (spans.clone(), content_types.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let (s, c) = (s.clone(), c.clone());
                async move {
                    c.lock().unwrap().push(
                        headers
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned(),
                    );
                    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .and_then(|a| a.value.as_ref())
                            .and_then(|v| match &v.value {
                                Some(Any::StringValue(s)) => Some(s.clone()),
                                _ => None,
                            })
                            .unwrap_or_default();
                        for scope in resource.scope_spans {
                            for span in scope.spans {
                                s.lock().unwrap().push((service.clone(), span));
                            }
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver {
            url,
            spans,
            content_types,
        }
    }

    /// Waits (the exporter sends in batches) until a span named `name` came.
    async fn wait_for(&self, name: &str) -> Vec<(String, Span)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if spans.iter().any(|(_, s)| s.name == name) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no `{name}` span arrived: {:?}",
                spans.iter().map(|(_, s)| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(Any::StringValue(s)) => s.clone(),
        other => panic!("{} has no string {key}: {other:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Any::IntValue(n)) => *n,
        other => panic!(
            "{} has no integer {key}: {other:?} in {:?}",
            span.name, span.attributes
        ),
    }
}

async fn run_with_two_tool_calls(capture_content: bool) -> (Vec<(String, Span)>, String) {
    let receiver = Receiver::start().await;
    let model = FakeOpenAi::start(Script::queue(vec![
        Reply::tool_call("furnace_status", json!({"furnace_id": "F2"})),
        Reply::tool_call("furnace_status", json!({"furnace_id": "F3"})),
        Reply::text("F2 and F3 are running."),
    ]))
    .await;
    let tools = ToolServer::start().await;
    let env = Env::new(&model.base_url(), &tools.base_url());
    let telemetry = format!(
        "\n[telemetry]\notlp_endpoint = \"{}\"\nservice_name = \"keel-under-test\"\ncapture_content = {capture_content}\n",
        receiver.url
    );
    let keel = Keel::start_with(&env, |c| c + &telemetry).await;
    let id = keel.start_run("How are F2 and F3?", None).await;
    keel.wait_status(&id, "completed", None).await;
    let spans = receiver.wait_for("invoke_agent default").await;
    for ct in receiver.content_types.lock().unwrap().iter() {
        assert_eq!(ct, "application/x-protobuf");
    }
    (spans, id)
}

#[tokio::test]
async fn a_run_is_one_trace_of_genai_spans() {
    let (spans, run_id) = run_with_two_tool_calls(false).await;
    let root = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "invoke_agent default")
        .unwrap();
    assert!(root.parent_span_id.is_empty(), "invoke_agent is the root");
    assert!(
        spans
            .iter()
            .all(|(service, _)| service == "keel-under-test")
    );
    assert_eq!(text(root, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(text(root, "gen_ai.agent.name"), "default");
    assert_eq!(text(root, "keel.run_id"), run_id);
    assert_eq!(text(root, "keel.tenant"), "default");
    assert!(!text(root, "keel.session").is_empty());
    assert_eq!(text(root, "keel.completion_reason"), "answered");

    let in_trace: Vec<&Span> = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.trace_id == root.trace_id)
        .collect();
    let chats: Vec<&&Span> = in_trace
        .iter()
        .filter(|s| s.name == "chat fake-model")
        .collect();
    let tools: Vec<&&Span> = in_trace
        .iter()
        .filter(|s| s.name == "execute_tool furnace_status")
        .collect();
    assert_eq!(chats.len(), 3, "three model calls");
    assert_eq!(tools.len(), 2, "two tool calls");
    for chat in &chats {
        assert_eq!(chat.parent_span_id, root.span_id);
        assert_eq!(text(chat, "gen_ai.operation.name"), "chat");
        assert_eq!(text(chat, "gen_ai.request.model"), "fake-model");
        assert!(int(chat, "gen_ai.usage.input_tokens") >= 0);
        assert!(int(chat, "gen_ai.usage.output_tokens") >= 0);
        assert!(text(chat, "gen_ai.response.finish_reasons").starts_with("[\""));
        assert!(attr(chat, "gen_ai.output.messages").is_none(), "no content");
    }
    let mut call_ids = Vec::new();
    for tool in &tools {
        assert_eq!(tool.parent_span_id, root.span_id);
        assert_eq!(text(tool, "gen_ai.operation.name"), "execute_tool");
        assert_eq!(text(tool, "gen_ai.tool.name"), "furnace_status");
        assert_eq!(text(tool, "keel.outcome"), "ok");
        assert!(
            attr(tool, "gen_ai.tool.call.arguments").is_none(),
            "no content"
        );
        call_ids.push(text(tool, "gen_ai.tool.call.id"));
    }
    call_ids.dedup();
    assert_eq!(call_ids.len(), 2, "{call_ids:?}");
    // The guards' decisions, as events of the run's span.
    let decisions: Vec<_> = root
        .events
        .iter()
        .filter(|e| e.name == "policy_decision")
        .collect();
    assert_eq!(decisions.len(), 2, "{:?}", root.events);
    for d in decisions {
        let rule = d.attributes.iter().find(|a| a.key == "keel.rule");
        assert!(rule.is_some(), "{d:?}");
    }
}

#[tokio::test]
async fn contents_are_exported_only_when_asked() {
    let (spans, _) = run_with_two_tool_calls(true).await;
    let tool = spans
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "execute_tool furnace_status")
        .unwrap();
    assert!(text(tool, "gen_ai.tool.call.arguments").contains("furnace_id"));
    assert!(!text(tool, "gen_ai.tool.call.result").is_empty());
    let last_chat = spans
        .iter()
        .map(|(_, s)| s)
        .filter(|s| s.name == "chat fake-model")
        .find(|s| {
            attr(s, "gen_ai.output.messages")
                .is_some_and(|v| matches!(v, Any::StringValue(t) if t.contains("running")))
        });
    assert!(last_chat.is_some(), "the answer is in the last chat span");
}
