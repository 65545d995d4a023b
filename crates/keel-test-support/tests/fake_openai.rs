#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The fake's own wire format, read with a plain HTTP client so that a
//! client bug and a fake bug cannot cancel out.

use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use serde_json::{Value, json};

fn body(stream: bool) -> Value {
    let mut b = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "auto",
    });
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

async fn post(fake: &FakeOpenAi, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", fake.base_url()))
        .json(body)
        .send()
        .await
        .unwrap()
}

fn sse_payloads(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| f.strip_prefix("data: ").unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn streamed_frames_look_like_openai() {
    let reply = Reply::tool_calls(vec![
        ("f", json!({"a": "some long value"})),
        ("g", json!({})),
    ])
    .with_text("Checking both.")
    .with_reasoning("private")
    .with_usage(11, 22);
    let fake = FakeOpenAi::start(Script::queue(vec![reply])).await;
    let response = post(&fake, &body(true)).await;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let payloads = sse_payloads(&response.text().await.unwrap());
    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");

    let content: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(content.len() >= 2);
    assert_eq!(content.concat(), "Checking both.");
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["delta"]["reasoning_content"].is_string())
    );

    let fragments: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    for index in 0..2 {
        let mine: Vec<&&Value> = fragments.iter().filter(|f| f["index"] == index).collect();
        assert!(mine.len() >= 2, "call {index} is split into fragments");
        assert!(mine[0]["id"].is_string() && mine[0]["function"]["name"].is_string());
        assert!(
            mine[1..]
                .iter()
                .all(|f| f.get("id").is_none() && f["function"].get("name").is_none())
        );
        let args: String = mine
            .iter()
            .map(|f| f["function"]["arguments"].as_str().unwrap())
            .collect();
        serde_json::from_str::<Value>(&args).unwrap();
    }
    assert_eq!(fragments[0]["id"], "call_1");

    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 11, "completion_tokens": 22, "total_tokens": 33})
    );
}

#[tokio::test]
async fn whole_object_and_status_replies() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::raw_tool_call("f", "{broken").with_reasoning("private"),
        Reply::status(429, json!({"error": {"message": "slow down"}}))
            .with_header("Retry-After", "2"),
    ]))
    .await;
    let object: Value = post(&fake, &body(false)).await.json().await.unwrap();
    assert_eq!(object["object"], "chat.completion");
    let message = &object["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(message["reasoning_content"], "private");
    assert_eq!(message["tool_calls"][0]["function"]["arguments"], "{broken");
    assert_eq!(object["choices"][0]["finish_reason"], "tool_calls");
    assert!(object["usage"]["prompt_tokens"].as_u64().unwrap() >= 1);

    let limited = post(&fake, &body(false)).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "2");

    // Queue exhausted: plain "done".
    let object: Value = post(&fake, &body(false)).await.json().await.unwrap();
    assert_eq!(object["choices"][0]["message"]["content"], "done");
    assert_eq!(fake.request_count(), 3);
    assert!(fake.violations().is_empty());
}

#[tokio::test]
async fn orphan_tool_message_is_a_recorded_400() {
    let fake = FakeOpenAi::start(Script::queue(vec![])).await;
    let mut b = body(false);
    b["messages"] = json!([
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_x", "content": "result"}
    ]);
    let response = post(&fake, &b).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("call_x")
    );
    assert_eq!(fake.violations().len(), 1);
    assert_eq!(fake.requests()[0]["messages"][1]["tool_call_id"], "call_x");
}
