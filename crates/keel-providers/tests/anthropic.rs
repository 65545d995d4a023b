#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Messages API client against the scripted fake Anthropic server on 127.0.0.1.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use keel_protocol::{
    Message, ModelClient, ModelError, ModelRequest, ModelResponse, TokenUsage, ToolCall,
    ToolSchema, shared_messages,
};
use keel_providers::anthropic::{AnthropicClient, AnthropicSettings};
use keel_test_support::fake_anthropic::{FakeAnthropic, Reply, Script};
use serde_json::{Value, json};

fn settings(base_url: String, stream: bool) -> AnthropicSettings {
    AnthropicSettings {
        base_url,
        api_key: Some("sk-ant-test-secret".into()),
        model: "claude-test".into(),
        stream,
        timeout: Duration::from_secs(5),
        max_retries: 2,
        backoff_base: Duration::from_millis(10),
        context_window: Some(200_000),
        max_concurrent_requests: 256,
        max_tokens: 4096,
    }
}

fn client(fake: &FakeAnthropic, stream: bool) -> AnthropicClient {
    AnthropicClient::new(settings(fake.base_url(), stream)).unwrap()
}

fn ask(text: &str) -> ModelRequest {
    ModelRequest {
        cache: Default::default(),
        messages: shared_messages(vec![Message::system("be brief"), Message::user(text)]),
        tools: vec![],
        max_output_tokens: None,
    }
}

async fn complete(
    client: &AnthropicClient,
    request: &ModelRequest,
) -> (Result<ModelResponse, ModelError>, Vec<String>) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let result = client.complete(request, Some(tx)).await;
    (result, rx.collect().await)
}

fn weather_tool() -> ToolSchema {
    ToolSchema {
        name: "get_weather".into(),
        description: "Weather for a city".into(),
        parameters:
            json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})
                .into(),
    }
}

#[tokio::test]
async fn streamed_text_arrives_as_deltas() {
    let fake = FakeAnthropic::start(Script::queue(vec![Reply::text(
        "Hello there, this is a streamed answer.",
    )]))
    .await;
    let client = client(&fake, true);
    let (result, deltas) = complete(&client, &ask("hi")).await;
    let response = result.unwrap();
    assert_eq!(response.text, "Hello there, this is a streamed answer.");
    assert!(deltas.len() >= 3, "expected several deltas, got {deltas:?}");
    assert_eq!(deltas.concat(), response.text);
    assert_eq!(response.finish_reason.as_deref(), Some("end_turn"));
    assert!(response.tool_calls.is_empty());

    let request = fake.last_request().unwrap();
    assert_eq!(request["stream"], true);
    assert_eq!(request["model"], "claude-test");
    assert_eq!(request["max_tokens"], 4096);
    assert_eq!(request["system"], "be brief");
    assert!(request.get("tools").is_none());
    assert_eq!(
        request["messages"],
        json!([{"role":"user","content":[{"type":"text","text":"hi"}]}])
    );
    let headers = fake.headers();
    assert_eq!(headers[0].api_key.as_deref(), Some("sk-ant-test-secret"));
    assert_eq!(headers[0].version.as_deref(), Some("2023-06-01"));
    assert_eq!(headers[0].authorization, None);
    assert_eq!(client.model_name(), "claude-test");
    assert_eq!(client.context_window(), Some(200_000));
    assert!(!format!("{client:?}").contains("sk-ant-test-secret"));
    assert!(fake.violations().is_empty());
}

#[tokio::test]
async fn whole_text_reply_without_streaming() {
    let fake = FakeAnthropic::start(Script::queue(vec![Reply::text("Plain answer.")])).await;
    let mut s = settings(fake.base_url(), false);
    s.api_key = None;
    let client = AnthropicClient::new(s).unwrap();
    let mut request = ask("hi");
    request.max_output_tokens = Some(64);
    let (result, deltas) = complete(&client, &request).await;
    let response = result.unwrap();
    assert_eq!(response.text, "Plain answer.");
    assert!(deltas.is_empty());
    let sent = fake.last_request().unwrap();
    assert_eq!(sent["stream"], false);
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(fake.headers()[0].api_key, None);
    assert!(fake.violations().is_empty());
}

#[tokio::test]
async fn two_tool_uses_are_reassembled_and_their_results_merge_into_one_turn() {
    for stream in [true, false] {
        let fake = FakeAnthropic::start(Script::queue(vec![
            Reply::tool_uses(vec![
                ("get_weather", json!({"city": "Paris", "units": "metric"})),
                ("get_weather", json!({"city": "Tokyo"})),
            ])
            .with_text("Let me check both.")
            .with_usage(120, 45),
            Reply::text("Paris is mild, Tokyo is warm."),
        ]))
        .await;
        let client = client(&fake, stream);
        let mut request = ask("weather in Paris and Tokyo?");
        request.tools = vec![weather_tool()];
        let (result, deltas) = complete(&client, &request).await;
        let response = result.unwrap();
        assert_eq!(response.finish_reason.as_deref(), Some("tool_use"));
        assert_eq!(response.text, "Let me check both.");
        if stream {
            assert_eq!(deltas.concat(), "Let me check both.");
        }
        assert_eq!(
            response.usage,
            TokenUsage {
                prompt_tokens: 120,
                completion_tokens: 45
            }
        );
        assert_eq!(response.tool_calls.len(), 2, "stream={stream}");
        let (first, second) = (&response.tool_calls[0], &response.tool_calls[1]);
        assert_eq!(
            (first.id.as_str(), first.name.as_str()),
            ("toolu_fake0001", "get_weather")
        );
        assert_eq!(second.id, "toolu_fake0002");
        let args: Value = serde_json::from_str(&first.arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris", "units": "metric"}));
        let args: Value = serde_json::from_str(&second.arguments).unwrap();
        assert_eq!(args, json!({"city": "Tokyo"}));

        let sent_tools = &fake.last_request().unwrap()["tools"];
        assert_eq!(
            sent_tools,
            &json!([{"name":"get_weather","description":"Weather for a city",
                "input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}])
        );

        // Answer both calls; the two results must travel as one user turn.
        request.messages.push(Arc::new(Message::Assistant {
            content: response.text.clone(),
            tool_calls: response.tool_calls.clone(),
        }));
        for (call, out) in response.tool_calls.iter().zip(["18C", "27C"]) {
            request.messages.push(Arc::new(Message::Tool {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: out.into(),
                is_error: false,
            }));
        }
        let (result, _) = complete(&client, &request).await;
        assert_eq!(result.unwrap().text, "Paris is mild, Tokyo is warm.");
        assert!(fake.violations().is_empty(), "{:?}", fake.violations());
        let sent = fake.last_request().unwrap();
        let messages = sent["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert_eq!(
            messages[1]["content"][1],
            json!({"type":"tool_use","id":"toolu_fake0001","name":"get_weather",
                   "input":{"city":"Paris","units":"metric"}})
        );
        assert_eq!(
            messages[2],
            json!({"role":"user","content":[
                {"type":"tool_result","tool_use_id":"toolu_fake0001","content":"18C"},
                {"type":"tool_result","tool_use_id":"toolu_fake0002","content":"27C"}]})
        );
    }
}

#[tokio::test]
async fn results_sent_as_separate_turns_would_be_rejected() {
    // The fake's rule is what the merge test relies on: prove it bites.
    let fake = FakeAnthropic::start(Script::queue(vec![])).await;
    let http = reqwest::Client::new();
    let body = json!({"model":"m","max_tokens":10,"messages":[
        {"role":"user","content":"hi"},
        {"role":"assistant","content":[
            {"type":"tool_use","id":"a","name":"f","input":{}},
            {"type":"tool_use","id":"b","name":"f","input":{}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"1"}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"b","content":"2"}]}
    ]});
    let response = http
        .post(format!("{}/v1/messages", fake.base_url()))
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let violations = fake.violations();
    assert!(
        violations.iter().any(|v| v.contains("must alternate")),
        "{violations:?}"
    );
    assert!(
        violations
            .iter()
            .any(|v| v.contains("immediately after: b")),
        "{violations:?}"
    );
}

#[tokio::test]
async fn client_error_from_the_api_is_not_retried() {
    let fake = FakeAnthropic::start(Script::queue(vec![])).await;
    let client = client(&fake, true);
    // A call left unanswered: the fake rejects it with 400, like the real API.
    let request = ModelRequest {
        cache: Default::default(),
        messages: shared_messages(vec![
            Message::user("hi"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "toolu_x".into(),
                    name: "get_weather".into(),
                    arguments: "{}".into(),
                }],
            },
            Message::user("well?"),
        ]),
        tools: vec![weather_tool()],
        max_output_tokens: None,
    };
    let (result, _) = complete(&client, &request).await;
    match result {
        Err(ModelError::Http {
            status: 400,
            message,
        }) => assert!(message.contains("invalid_request_error"), "{message}"),
        other => panic!("expected Http 400, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 1);
    assert_eq!(fake.violations().len(), 1);
}

#[tokio::test]
async fn thinking_never_reaches_text_or_deltas() {
    for stream in [true, false] {
        let fake = FakeAnthropic::start(Script::queue(vec![
            Reply::text("The answer is 4.")
                .with_thinking("SECRET chain of thought about 2+2")
                .with_redacted_thinking(),
            Reply::tool_use("get_weather", json!({"city":"Oslo"}))
                .with_thinking("SECRET plan to call a tool"),
        ]))
        .await;
        let client = client(&fake, stream);
        let (result, deltas) = complete(&client, &ask("2+2?")).await;
        let response = result.unwrap();
        assert_eq!(response.text, "The answer is 4.");
        assert!(deltas.iter().all(|d| !d.contains("SECRET")), "{deltas:?}");
        let (result, deltas) = complete(&client, &ask("weather")).await;
        let response = result.unwrap();
        assert_eq!(response.text, "");
        assert!(deltas.is_empty(), "{deltas:?}");
        assert_eq!(response.tool_calls.len(), 1);
        assert!(!response.tool_calls[0].arguments.contains("SECRET"));
    }
}

#[tokio::test]
async fn rate_limit_honours_retry_after_then_succeeds() {
    let fake = FakeAnthropic::start(Script::queue(vec![
        Reply::rate_limited(1),
        Reply::text("finally"),
    ]))
    .await;
    let client = client(&fake, true);
    let started = Instant::now();
    let (result, _) = complete(&client, &ask("hi")).await;
    let waited = started.elapsed();
    assert_eq!(result.unwrap().text, "finally");
    assert_eq!(fake.request_count(), 2);
    // backoff_base is 10 ms, so only retry-after explains a one-second wait.
    assert!(waited >= Duration::from_millis(950), "waited {waited:?}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

#[tokio::test]
async fn overloaded_and_server_errors_are_retried() {
    for stream in [true, false] {
        let fake = FakeAnthropic::start(Script::queue(vec![
            Reply::overloaded(),
            Reply::server_error(),
            Reply::text("made it"),
        ]))
        .await;
        let client = client(&fake, stream);
        let (result, _) = complete(&client, &ask("hi")).await;
        assert_eq!(result.unwrap().text, "made it");
        assert_eq!(fake.request_count(), 3);
    }

    let fake = FakeAnthropic::start(Script::queue(vec![
        Reply::overloaded(),
        Reply::overloaded(),
        Reply::overloaded(),
        Reply::text("never reached"),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, _) = complete(&client, &ask("hi")).await;
    match result {
        Err(ModelError::RetriesExhausted { attempts: 3, last }) => match *last {
            ModelError::Http {
                status: 529,
                message,
            } => assert!(message.contains("Overloaded"), "{message}"),
            other => panic!("unexpected last error {other:?}"),
        },
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 3);
}

#[tokio::test]
async fn mid_stream_overload_is_retried_only_before_text_was_shown() {
    let fake = FakeAnthropic::start(Script::queue(vec![
        Reply::error_event("overloaded_error", "Overloaded", ""),
        Reply::text("second try"),
        Reply::error_event("overloaded_error", "Overloaded", "half an answer"),
        Reply::text("never reached"),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, deltas) = complete(&client, &ask("a")).await;
    assert_eq!(result.unwrap().text, "second try");
    assert_eq!(deltas.concat(), "second try");
    assert_eq!(fake.request_count(), 2);

    let (result, deltas) = complete(&client, &ask("b")).await;
    assert!(
        matches!(result, Err(ModelError::Http { status: 529, .. })),
        "{result:?}"
    );
    assert_eq!(deltas.concat(), "half an answer");
    assert_eq!(fake.request_count(), 3);
}

#[tokio::test]
async fn hanging_server_times_out_and_is_retried() {
    let fake = FakeAnthropic::start(Script::queue(vec![Reply::hang(), Reply::text("awake")])).await;
    let mut s = settings(fake.base_url(), true);
    s.timeout = Duration::from_millis(300);
    let client = AnthropicClient::new(s).unwrap();
    let started = Instant::now();
    let (result, _) = complete(&client, &ask("hi")).await;
    assert_eq!(result.unwrap().text, "awake");
    assert_eq!(fake.request_count(), 2);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn stream_broken_after_text_is_not_retried() {
    let fake = FakeAnthropic::start(Script::queue(vec![
        Reply::broken_stream("partial answer"),
        Reply::text("never reached"),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, deltas) = complete(&client, &ask("hi")).await;
    assert!(matches!(result, Err(ModelError::Connect(_))), "{result:?}");
    assert_eq!(deltas.concat(), "partial answer");
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn connection_refused_is_retried_then_exhausted() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = AnthropicClient::new(settings(format!("http://127.0.0.1:{port}"), true)).unwrap();
    let (result, _) = complete(&client, &ask("hi")).await;
    match result {
        Err(ModelError::RetriesExhausted { attempts: 3, last }) => {
            assert!(matches!(*last, ModelError::Connect(_)), "{last:?}")
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
}

#[tokio::test]
async fn raw_events_with_unknown_kinds_and_a_nameless_tool_use() {
    let fake = FakeAnthropic::start(Script::queue(vec![
        Reply::raw_sse(vec![
            ("message_start", r#"{"type":"message_start","message":{"usage":{"input_tokens":3}}}"#),
            ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"s","name":"web_search","input":{}}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#),
            ("content_block_start", r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"ok"}}"#),
            ("some_future_event", r#"{"type":"some_future_event"}"#),
            ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ]),
        Reply::raw_sse(vec![
            ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","input":{}}}"#),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ]),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, _) = complete(&client, &ask("hi")).await;
    let response = result.unwrap();
    assert_eq!(response.text, "ok");
    assert!(response.tool_calls.is_empty());
    assert_eq!(
        response.usage,
        TokenUsage {
            prompt_tokens: 3,
            completion_tokens: 2
        }
    );
    let (result, _) = complete(&client, &ask("hi")).await;
    assert!(
        matches!(result, Err(ModelError::Protocol(ref m)) if m.contains("no name")),
        "{result:?}"
    );
}
