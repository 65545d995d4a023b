#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Chat Completions client against the scripted fake server on 127.0.0.1.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use keel_protocol::{
    Message, ModelClient, ModelError, ModelRequest, ModelResponse, PreviousCost, RequestGate,
    TokenUsage, ToolCall, ToolSchema, shared_messages,
};
use keel_providers::openai::{OpenAiClient, OpenAiSettings};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use serde_json::{Value, json};

fn settings(base_url: String, stream: bool) -> OpenAiSettings {
    OpenAiSettings {
        base_url,
        api_key: Some("sk-test-secret".into()),
        model: "gpt-test".into(),
        stream,
        timeout: Duration::from_secs(5),
        max_retries: 2,
        backoff_base: Duration::from_millis(10),
        context_window: Some(8192),
        max_concurrent_requests: 256,
    }
}

fn client(fake: &FakeOpenAi, stream: bool) -> OpenAiClient {
    OpenAiClient::new(settings(fake.base_url(), stream)).unwrap()
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
    client: &OpenAiClient,
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
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::text(
        "Hello there, this is a streamed answer.",
    )]))
    .await;
    let client = client(&fake, true);
    let (result, deltas) = complete(&client, &ask("hi")).await;
    let response = result.unwrap();
    assert_eq!(response.text, "Hello there, this is a streamed answer.");
    assert!(deltas.len() >= 3, "expected several deltas, got {deltas:?}");
    assert_eq!(deltas.concat(), response.text);
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert!(response.tool_calls.is_empty());

    let request = fake.last_request().unwrap();
    assert_eq!(request["stream"], true);
    assert_eq!(request["stream_options"]["include_usage"], true);
    assert_eq!(request["model"], "gpt-test");
    assert!(request.get("tools").is_none() && request.get("tool_choice").is_none());
    assert_eq!(
        request["messages"],
        json!([{"role":"system","content":"be brief"},{"role":"user","content":"hi"}])
    );
    assert_eq!(
        fake.authorizations(),
        vec![Some("Bearer sk-test-secret".to_string())]
    );
    assert_eq!(client.model_name(), "gpt-test");
    assert_eq!(client.context_window(), Some(8192));
    assert!(!format!("{:?}", client.settings()).contains("sk-test-secret"));
    assert!(fake.violations().is_empty());
}

#[tokio::test]
async fn whole_text_reply_without_streaming() {
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::text("Plain answer.")])).await;
    let mut s = settings(fake.base_url(), false);
    s.api_key = None;
    let client = OpenAiClient::new(s).unwrap();
    let mut request = ask("hi");
    request.max_output_tokens = Some(64);
    let (result, deltas) = complete(&client, &request).await;
    let response = result.unwrap();
    assert_eq!(response.text, "Plain answer.");
    assert!(deltas.is_empty());
    let sent = fake.last_request().unwrap();
    assert_eq!(sent["stream"], false);
    assert!(sent.get("stream_options").is_none());
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(fake.authorizations(), vec![None]);
}

#[tokio::test]
async fn two_tool_calls_are_reassembled_and_answered_validly() {
    for stream in [true, false] {
        let fake = FakeOpenAi::start(Script::queue(vec![
            Reply::tool_calls(vec![
                ("get_weather", json!({"city": "Paris", "units": "metric"})),
                ("get_weather", json!({"city": "Tokyo"})),
            ]),
            Reply::text("Paris is mild, Tokyo is warm."),
        ]))
        .await;
        let client = client(&fake, stream);
        let mut request = ask("weather in Paris and Tokyo?");
        request.tools = vec![weather_tool()];
        let (result, _) = complete(&client, &request).await;
        let response = result.unwrap();
        assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(response.tool_calls.len(), 2, "stream={stream}");
        let first = &response.tool_calls[0];
        let second = &response.tool_calls[1];
        assert_eq!(
            (first.id.as_str(), first.name.as_str()),
            ("call_1", "get_weather")
        );
        assert_eq!(
            (second.id.as_str(), second.name.as_str()),
            ("call_2", "get_weather")
        );
        let args: Value = serde_json::from_str(&first.arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris", "units": "metric"}));
        let args: Value = serde_json::from_str(&second.arguments).unwrap();
        assert_eq!(args, json!({"city": "Tokyo"}));

        let sent = fake.last_request().unwrap();
        assert_eq!(sent["tool_choice"], "auto");
        assert_eq!(sent["tools"][0]["type"], "function");
        assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(
            sent["tools"][0]["function"]["parameters"]["required"],
            json!(["city"])
        );

        // Send the calls and their results back: the fake checks the pairing.
        request.messages.push(Arc::new(Message::Assistant {
            content: String::new(),
            tool_calls: response.tool_calls.clone(),
        }));
        for call in &response.tool_calls {
            request.messages.push(Arc::new(Message::Tool {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: "sunny".into(),
                is_error: false,
            }));
        }
        let (result, _) = complete(&client, &request).await;
        assert_eq!(result.unwrap().text, "Paris is mild, Tokyo is warm.");
        assert!(fake.violations().is_empty(), "{:?}", fake.violations());
        let sent = fake.last_request().unwrap();
        assert_eq!(sent["messages"][2]["role"], "assistant");
        assert_eq!(sent["messages"][2]["content"], Value::Null);
        assert_eq!(sent["messages"][2]["tool_calls"][1]["id"], "call_2");
        assert_eq!(
            sent["messages"][3],
            json!({"role":"tool","tool_call_id":"call_1","content":"sunny"})
        );
    }
}

#[tokio::test]
async fn unanswered_tool_call_is_rejected_like_the_real_api() {
    let fake = FakeOpenAi::start(Script::queue(vec![])).await;
    let client = client(&fake, true);
    let mut request = ask("hi");
    request.messages.push(Arc::new(Message::Assistant {
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: "call_9".into(),
            name: "get_weather".into(),
            arguments: "{}".into(),
        }],
    }));
    request.messages.push(Arc::new(Message::user("and?")));
    let (result, _) = complete(&client, &request).await;
    match result {
        Err(ModelError::Http {
            status: 400,
            message,
        }) => {
            assert!(message.contains("call_9"), "{message}")
        }
        other => panic!("expected HTTP 400, got {other:?}"),
    }
    assert_eq!(fake.violations().len(), 1);
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn usage_comes_from_the_final_chunk_without_choices() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::text("counted").with_usage(123, 45),
        Reply::raw_sse(vec![
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"x"},"finish_reason":null}],"usage":null}).to_string(),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}).to_string(),
            json!({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}).to_string(),
            "[DONE]".to_string(),
        ]),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, _) = complete(&client, &ask("a")).await;
    assert_eq!(
        result.unwrap().usage,
        TokenUsage {
            prompt_tokens: 123,
            completion_tokens: 45
        }
    );
    let (result, _) = complete(&client, &ask("b")).await;
    let response = result.unwrap();
    assert_eq!(response.text, "x");
    assert_eq!(
        response.usage,
        TokenUsage {
            prompt_tokens: 7,
            completion_tokens: 3
        }
    );
}

#[tokio::test]
async fn reasoning_never_reaches_text_or_deltas() {
    for stream in [true, false] {
        let fake = FakeOpenAi::start(Script::queue(vec![
            Reply::text("The answer is 4.").with_reasoning("SECRET-THOUGHT: 2+2 is four"),
            Reply::raw_sse(vec![
                json!({"choices":[{"delta":{"reasoning":"SECRET-THOUGHT"}}]}).to_string(),
                json!({"choices":[{"delta":{"content":"ok"},"finish_reason":"stop"}]}).to_string(),
            ]),
        ]))
        .await;
        let client = client(&fake, stream);
        let (result, deltas) = complete(&client, &ask("2+2?")).await;
        let response = result.unwrap();
        assert_eq!(response.text, "The answer is 4.");
        assert!(deltas.iter().all(|d| !d.contains("SECRET")), "{deltas:?}");
        if stream {
            // Also: a stream that ends after finish_reason without [DONE] is complete.
            let (result, deltas) = complete(&client, &ask("again")).await;
            assert_eq!(result.unwrap().text, "ok");
            assert_eq!(deltas, vec!["ok".to_string()]);
        }
    }
}

#[tokio::test]
async fn rate_limit_honours_retry_after_then_succeeds() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::status(
            429,
            json!({"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}),
        )
        .with_header("Retry-After", "1"),
        Reply::text("finally"),
    ]))
    .await;
    let client = client(&fake, true);
    let started = Instant::now();
    let (result, _) = complete(&client, &ask("hi")).await;
    let waited = started.elapsed();
    assert_eq!(result.unwrap().text, "finally");
    assert_eq!(fake.request_count(), 2);
    // backoff_base is 10 ms, so only Retry-After explains a one-second wait.
    assert!(waited >= Duration::from_millis(950), "waited {waited:?}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

#[tokio::test]
async fn server_errors_exhaust_the_retries() {
    let error = json!({"error":{"message":"The server had an error","type":"server_error"}});
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::status(500, &error),
        Reply::status(502, &error),
        Reply::status(500, &error),
        Reply::text("never reached"),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, _) = complete(&client, &ask("hi")).await;
    match result {
        Err(ModelError::RetriesExhausted { attempts: 3, last }) => match *last {
            ModelError::Http {
                status: 500,
                message,
            } => {
                assert!(message.contains("The server had an error"), "{message}")
            }
            other => panic!("unexpected last error {other:?}"),
        },
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 3);
}

/// Lets `allow` further requests through, and notes what each one after
/// was said to have cost.
struct CountingGate {
    allow: std::sync::atomic::AtomicU32,
    asked: std::sync::Mutex<Vec<PreviousCost>>,
}

impl CountingGate {
    fn new(allow: u32) -> Self {
        Self {
            allow: allow.into(),
            asked: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl RequestGate for CountingGate {
    async fn another_request(&self, previous: PreviousCost) -> bool {
        use std::sync::atomic::Ordering;
        self.asked.lock().unwrap().push(previous);
        self.allow
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[tokio::test]
async fn every_retry_is_asked_of_the_gate_which_may_refuse_it() {
    let error = json!({"error":{"message":"The server had an error","type":"server_error"}});
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::status(
            429,
            json!({"error":{"message":"Rate limit reached","type":"requests"}}),
        ),
        Reply::status(500, &error),
        Reply::text("never reached"),
    ]))
    .await;
    let client = client(&fake, false);
    let gate = CountingGate::new(1);
    let result = client.complete_gated(&ask("hi"), None, &gate).await;
    match result {
        Err(ModelError::NotAllowed { requests: 2, last }) => {
            assert!(
                matches!(*last, ModelError::Http { status: 500, .. }),
                "{last:?}"
            )
        }
        other => panic!("expected NotAllowed after 2 requests, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 2);
    // A 429 did no work; a 500 may have.
    assert_eq!(
        *gate.asked.lock().unwrap(),
        vec![PreviousCost::Nothing, PreviousCost::Unknown]
    );
}

#[tokio::test]
async fn non_retryable_client_error_fails_at_once() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::status(
            400,
            json!({"error":{"message":"Invalid schema for function 'x'","type":"invalid_request_error","param":"tools","code":null}}),
        ),
        Reply::text("never reached"),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, _) = complete(&client, &ask("hi")).await;
    match result {
        Err(ModelError::Http {
            status: 400,
            message,
        }) => {
            assert!(
                message.contains("Invalid schema for function 'x'"),
                "{message}"
            )
        }
        other => panic!("expected Http 400, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn connection_refused_is_retried_then_exhausted() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut s = settings(format!("http://127.0.0.1:{port}/v1"), true);
    s.backoff_base = Duration::from_millis(50);
    let client = OpenAiClient::new(s).unwrap();
    let started = Instant::now();
    let (result, _) = complete(&client, &ask("hi")).await;
    match result {
        Err(ModelError::RetriesExhausted { attempts: 3, last }) => {
            assert!(matches!(*last, ModelError::Connect(_)), "{last:?}")
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    // Two backoffs: 50 ms then 100 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn hanging_server_times_out_and_is_retried() {
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::hang(), Reply::hang()])).await;
    let mut s = settings(fake.base_url(), true);
    s.timeout = Duration::from_millis(300);
    s.max_retries = 1;
    let client = OpenAiClient::new(s).unwrap();
    let started = Instant::now();
    let (result, _) = complete(&client, &ask("hi")).await;
    match result {
        Err(ModelError::RetriesExhausted { attempts: 2, last }) => {
            assert!(matches!(*last, ModelError::Timeout), "{last:?}")
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 2);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn timeout_is_an_idle_gap_not_a_total() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::text("slow but steady stream").with_chunk_gap(Duration::from_millis(150)),
        Reply::stalled_stream("half an ans"),
    ]))
    .await;
    let mut s = settings(fake.base_url(), true);
    s.timeout = Duration::from_millis(500);
    let client = OpenAiClient::new(s).unwrap();
    let started = Instant::now();
    let (result, _) = complete(&client, &ask("a")).await;
    assert_eq!(result.unwrap().text, "slow but steady stream");
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );

    // Text was shown before the stream went silent: a timeout, and no retry.
    let (result, deltas) = complete(&client, &ask("b")).await;
    assert!(matches!(result, Err(ModelError::Timeout)), "{result:?}");
    assert_eq!(deltas.concat(), "half an ans");
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn stream_broken_after_text_is_not_retried() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::broken_stream("partial answer"),
        Reply::text("never reached"),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, deltas) = complete(&client, &ask("hi")).await;
    assert!(
        matches!(
            result,
            Err(ModelError::Connect(_) | ModelError::Protocol(_))
        ),
        "{result:?}"
    );
    assert_eq!(deltas.concat(), "partial answer");
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn broken_json_arguments_pass_through_raw() {
    for stream in [true, false] {
        let raw = r#"{"city": "Par"is",, "#;
        let fake = FakeOpenAi::start(Script::queue(vec![Reply::raw_tool_call(
            "get_weather",
            raw,
        )]))
        .await;
        let client = client(&fake, stream);
        let mut request = ask("weather?");
        request.tools = vec![weather_tool()];
        let (result, _) = complete(&client, &request).await;
        let response = result.unwrap();
        assert_eq!(response.tool_calls.len(), 1);
        assert_eq!(response.tool_calls[0].arguments, raw, "stream={stream}");
    }
}

#[tokio::test]
async fn two_megabyte_text_reply() {
    let text: String = (0..2 * 1024 * 1024 / 16)
        .map(|i| format!("{:015} ", i))
        .collect();
    assert!(text.len() >= 2 * 1024 * 1024);
    for stream in [true, false] {
        let fake = FakeOpenAi::start(Script::queue(vec![Reply::text(text.clone())])).await;
        let client = client(&fake, stream);
        let (result, deltas) = complete(&client, &ask("long")).await;
        let response = result.unwrap();
        assert_eq!(response.text.len(), text.len());
        assert!(response.text == text, "stream={stream}");
        if stream {
            assert!(deltas.len() > 100, "{} deltas", deltas.len());
            assert!(deltas.concat() == text);
        }
    }
}

#[tokio::test]
async fn malformed_and_nameless_chunks_are_protocol_errors() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::raw_sse(vec!["{\"choices\": [{\"delta\": {\"content\": \"x\"".to_string()]),
        Reply::raw_sse(vec![
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"arguments":"{}"}}]}}]}).to_string(),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}).to_string(),
            "[DONE]".to_string(),
        ]),
        Reply::raw_sse(vec![
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"get_weather","arguments":""}}]}}]}).to_string(),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}).to_string(),
            "[DONE]".to_string(),
        ]),
    ]))
    .await;
    let client = client(&fake, true);
    let (result, _) = complete(&client, &ask("a")).await;
    assert!(
        matches!(&result, Err(ModelError::Protocol(m)) if m.contains("malformed stream chunk")),
        "{result:?}"
    );
    let (result, _) = complete(&client, &ask("b")).await;
    assert!(
        matches!(&result, Err(ModelError::Protocol(m)) if m.contains("no function name")),
        "{result:?}"
    );
    // A missing id is generated; empty arguments mean none.
    let (result, _) = complete(&client, &ask("c")).await;
    let call = &result.unwrap().tool_calls[0];
    assert!(
        call.id.starts_with("call_") && call.id.len() > 5,
        "{call:?}"
    );
    assert_eq!(call.arguments, "{}");
    assert_eq!(fake.request_count(), 3, "protocol errors are not retried");
}

#[tokio::test]
async fn whole_object_answer_to_a_streaming_request_is_accepted() {
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::raw_json(json!({
        "id": "x", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "not streamed"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2}
    }))]))
    .await;
    let client = client(&fake, true);
    let (result, _) = complete(&client, &ask("a")).await;
    assert_eq!(result.unwrap().text, "not streamed");
}

#[tokio::test]
async fn a_slow_reply_does_not_block_others_and_cancel_is_by_drop() {
    let fake = FakeOpenAi::start(Script::handler(|request: &Value| {
        let last = request["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        match last.as_str() {
            "slow" => Reply::delay(Duration::from_secs(3), Box::new(Reply::text("slow done"))),
            "hang" => Reply::hang(),
            other => Reply::text(format!("echo {other}")),
        }
    }))
    .await;
    let client = client(&fake, true);
    let (slow_request, fast_request, hang_request) = (ask("slow"), ask("fast"), ask("hang"));
    let slow = client.complete(&slow_request, None);
    let fast = async {
        let started = Instant::now();
        let r = client.complete(&fast_request, None).await.unwrap();
        (r, started.elapsed())
    };
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        client.complete(&hang_request, None),
    );
    let (slow, (fast, took), cancelled) = tokio::join!(slow, fast, cancelled);
    assert_eq!(fast.text, "echo fast");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(cancelled.is_err(), "dropping the future cancels the call");
    assert_eq!(slow.unwrap().text, "slow done");
    assert_eq!(fake.request_count(), 3);
}

#[tokio::test]
async fn requests_past_the_limit_wait_their_turn_outside_their_timeout() {
    // Each reply takes 400 ms: six requests two at a time end after 1.2 s,
    // past the 1 s timeout, which must only count from each one's sending.
    let fake = FakeOpenAi::start(Script::handler(|_: &Value| {
        Reply::text("ok").after(Duration::from_millis(400))
    }))
    .await;
    let mut s = settings(fake.base_url(), false);
    s.timeout = Duration::from_secs(1);
    s.max_retries = 0;
    s.max_concurrent_requests = 2;
    let client = OpenAiClient::new(s).unwrap();
    // A clone shares its original's limit: the limit is the provider's.
    let twin = client.clone();
    let request = ask("hi");
    let calls = (0..6).map(|i| {
        let c = if i % 2 == 0 { &client } else { &twin };
        c.complete(&request, None)
    });
    let results = futures::future::join_all(calls).await;
    for result in results {
        assert_eq!(result.unwrap().text, "ok");
    }
    assert_eq!(fake.request_count(), 6);
    assert_eq!(fake.most_in_flight(), 2);
}
