#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `tool_mode = "json"` over real providers talking to the scripted fakes.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use keel_protocol::{
    Message, ModelClient, ModelError, ModelRequest, ModelResponse, PreviousCost, RequestGate,
    TokenUsage, ToolCall, ToolSchema, shared_messages,
};
use keel_providers::anthropic::{AnthropicClient, AnthropicSettings};
use keel_providers::json_mode::{CLARIFY_TOOL, JsonToolMode};
use keel_providers::openai::{OpenAiClient, OpenAiSettings};
use keel_test_support::fake_anthropic::{self, FakeAnthropic};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use serde_json::{Value, json};

fn json_mode(fake: &FakeOpenAi) -> JsonToolMode {
    let settings = OpenAiSettings {
        base_url: fake.base_url(),
        api_key: None,
        model: "small-chat".into(),
        stream: true,
        timeout: Duration::from_secs(5),
        max_retries: 0,
        backoff_base: Duration::from_millis(10),
        context_window: Some(4096),
        max_concurrent_requests: 256,
    };
    JsonToolMode::new(Arc::new(OpenAiClient::new(settings).unwrap()))
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

fn clarify_tool() -> ToolSchema {
    ToolSchema {
        name: CLARIFY_TOOL.into(),
        description: "Ask the user for required parameters of one tool.".into(),
        parameters: json!({"type":"object","properties":{"tool_name":{"type":"string"},
            "missing_slots":{"type":"array","items":{"type":"string"}},"question":{"type":"string"}}}).into(),
    }
}

fn with_tools(text: &str) -> ModelRequest {
    ModelRequest {
        cache: Default::default(),
        messages: shared_messages(vec![
            Message::system("You are a weather bot."),
            Message::user(text),
        ]),
        tools: vec![weather_tool(), clarify_tool()],
        max_output_tokens: Some(300),
    }
}

async fn complete(
    client: &JsonToolMode,
    request: &ModelRequest,
) -> (Result<ModelResponse, ModelError>, Vec<String>) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let result = client.complete(request, Some(tx)).await;
    (result, rx.collect().await)
}

fn system_text(request: &Value) -> String {
    let messages = request["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    messages[0]["content"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn fenced_respond_with_trailing_text_becomes_the_answer() {
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::text(
        "Sure, here it is:\n```json\n{\"action\": \"RESPOND\", \"answer\": \"Hello! I can check weather {anywhere}.\", \"intent\": \"greet\", \"confidence\": 0.9}\n```\nLet me know if you need more.",
    )]))
    .await;
    let client = json_mode(&fake);
    let (result, deltas) = complete(&client, &with_tools("hi")).await;
    let response = result.unwrap();
    assert_eq!(response.text, "Hello! I can check weather {anywhere}.");
    assert!(response.tool_calls.is_empty());
    // The raw JSON is never streamed; the answer arrives once, whole.
    assert_eq!(deltas, vec![response.text.clone()]);

    let sent = fake.last_request().unwrap();
    assert!(sent.get("tools").is_none() && sent.get("tool_choice").is_none());
    assert_eq!(sent["max_tokens"], 300);
    let system = system_text(&sent);
    assert!(system.starts_with("You are a weather bot.\n\n"), "{system}");
    assert!(
        system.contains("- get_weather: Weather for a city"),
        "{system}"
    );
    assert!(system.contains("\"required\":[\"city\"]"), "{system}");
    assert!(
        system.contains("CLARIFY") && system.contains("CALL_TOOL"),
        "{system}"
    );
    assert_eq!(sent["messages"].as_array().unwrap().len(), 2);
    assert_eq!(client.model_name(), "small-chat");
    assert_eq!(client.context_window(), Some(4096));
    assert!(fake.violations().is_empty());
}

#[tokio::test]
async fn call_tool_becomes_a_tool_call() {
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::text(
        r#"{"action":"CALL_TOOL","tool_name":"get_weather","arguments":{"city":"Paris"},"intent":"weather","confidence":0.8,"brief_rationale":"user asked"}"#,
    )]))
    .await;
    let client = json_mode(&fake);
    let (result, deltas) = complete(&client, &with_tools("weather in Paris?")).await;
    let response = result.unwrap();
    assert!(deltas.is_empty(), "{deltas:?}");
    assert_eq!(response.text, "");
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(response.tool_calls.len(), 1);
    let call = &response.tool_calls[0];
    assert_eq!(call.name, "get_weather");
    assert!(
        call.id.starts_with("call_") && call.id.len() > 10,
        "{}",
        call.id
    );
    let args: Value = serde_json::from_str(&call.arguments).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
}

#[tokio::test]
async fn clarify_becomes_a_call_of_the_reserved_function() {
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::text(
        r#"{"action":"CLARIFY","tool_name":"get_weather","missing_slots":["city"],"clarification_question":"Which city?","intent":"weather","confidence":0.6}"#,
    )]))
    .await;
    let client = json_mode(&fake);
    let (result, _) = complete(&client, &with_tools("what's the weather?")).await;
    let response = result.unwrap();
    assert_eq!(response.tool_calls.len(), 1);
    assert_eq!(response.tool_calls[0].name, "clarify");
    let args: Value = serde_json::from_str(&response.tool_calls[0].arguments).unwrap();
    assert_eq!(
        args,
        json!({"tool_name":"get_weather","missing_slots":["city"],"question":"Which city?"})
    );
}

#[tokio::test]
async fn invalid_reply_is_repaired_and_usage_is_summed() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::text("The weather in Paris is probably nice.").with_usage(100, 10),
        Reply::text(
            r#"{"action":"CALL_TOOL","tool_name":"get_weather","arguments":{"city":"Paris"}}"#,
        )
        .with_usage(130, 20),
    ]))
    .await;
    let client = json_mode(&fake);
    let (result, deltas) = complete(&client, &with_tools("weather in Paris?")).await;
    let response = result.unwrap();
    assert!(deltas.is_empty(), "{deltas:?}");
    assert_eq!(response.tool_calls[0].name, "get_weather");
    assert_eq!(
        response.usage,
        TokenUsage {
            prompt_tokens: 230,
            completion_tokens: 30
        }
    );
    assert_eq!(fake.request_count(), 2);
    let repair = &fake.requests()[1];
    let messages = repair["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert_eq!(
        messages[2],
        json!({"role":"assistant","content":"The weather in Paris is probably nice."})
    );
    assert_eq!(messages[3]["role"], "user");
    let feedback = messages[3]["content"].as_str().unwrap();
    assert!(feedback.contains("no JSON object"), "{feedback}");
    assert!(fake.violations().is_empty());
}

/// Allows no further request, and notes what it was asked.
#[derive(Default)]
struct ClosedGate(std::sync::Mutex<Vec<PreviousCost>>);

#[async_trait::async_trait]
impl RequestGate for ClosedGate {
    async fn another_request(&self, previous: PreviousCost) -> bool {
        self.0.lock().unwrap().push(previous);
        false
    }
}

#[tokio::test]
async fn a_repair_is_a_request_the_gate_may_refuse() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::text("just prose").with_usage(100, 10),
        Reply::text(r#"{"action":"RESPOND","answer":"never asked for"}"#),
    ]))
    .await;
    let client = json_mode(&fake);
    let gate = ClosedGate::default();
    let result = client.complete_gated(&with_tools("hi"), None, &gate).await;
    match result {
        Err(ModelError::NotAllowed { requests: 1, last }) => {
            assert!(matches!(*last, ModelError::Protocol(_)), "{last:?}")
        }
        other => panic!("expected NotAllowed after one reply, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 1);
    // The refused repair followed a reply whose tokens were reported.
    assert_eq!(*gate.0.lock().unwrap(), vec![PreviousCost::Reported]);
}

#[tokio::test]
async fn three_invalid_replies_are_a_protocol_error() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::text("just prose"),
        Reply::text(r#"{"action":"DANCE"}"#),
        Reply::text(r#"{"action":"RESPOND"}"#),
        Reply::text(r#"{"action":"RESPOND","answer":"too late"}"#),
    ]))
    .await;
    let client = json_mode(&fake);
    let (result, deltas) = complete(&client, &with_tools("hi")).await;
    match result {
        Err(ModelError::Protocol(message)) => {
            assert!(message.contains("3 replies"), "{message}");
            assert!(message.contains("answer"), "{message}");
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert!(deltas.is_empty());
    assert_eq!(fake.request_count(), 3);
    // Each repair names the specific problem of the reply before it.
    let requests = fake.requests();
    let last_user = |r: &Value| {
        r["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(last_user(&requests[1]).contains("no JSON object"));
    assert!(last_user(&requests[2]).contains("DANCE"));
}

#[tokio::test]
async fn tool_less_request_passes_through() {
    let text = r#"Plain answer, even with {"action":"CALL_TOOL"} in it."#;
    let fake = FakeOpenAi::start(Script::queue(vec![Reply::text(text)])).await;
    let client = json_mode(&fake);
    let request = ModelRequest {
        cache: Default::default(),
        messages: shared_messages(vec![Message::system("be brief"), Message::user("hi")]),
        tools: vec![],
        max_output_tokens: None,
    };
    let (result, deltas) = complete(&client, &request).await;
    let response = result.unwrap();
    assert_eq!(response.text, text);
    assert!(response.tool_calls.is_empty());
    assert!(
        deltas.len() >= 2,
        "streamed as the provider sends it: {deltas:?}"
    );
    assert_eq!(deltas.concat(), text);
    assert_eq!(
        fake.last_request().unwrap()["messages"],
        json!([{"role":"system","content":"be brief"},{"role":"user","content":"hi"}])
    );
}

fn history_with_tool_use() -> Vec<Message> {
    vec![
        Message::system("You are a weather bot."),
        Message::user("weather in Paris and Oslo?"),
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"town":"Oslo"}"#.into(),
                },
            ],
        },
        Message::Tool {
            call_id: "call_a".into(),
            name: "get_weather".into(),
            content: "18C, sunny".into(),
            is_error: false,
        },
        Message::Tool {
            call_id: "call_b".into(),
            name: "get_weather".into(),
            content: "invalid_arguments: unknown parameter town".into(),
            is_error: true,
        },
    ]
}

#[tokio::test]
async fn history_with_tool_results_is_rendered_as_text() {
    let fake = FakeOpenAi::start(Script::queue(vec![
        Reply::text(r#"{"action":"RESPOND","answer":"Paris: 18C and sunny."}"#),
        Reply::text("Paris is 18C; Oslo could not be checked."),
    ]))
    .await;
    let client = json_mode(&fake);
    let request = ModelRequest {
        cache: Default::default(),
        messages: shared_messages(history_with_tool_use()),
        tools: vec![weather_tool(), clarify_tool()],
        max_output_tokens: None,
    };
    let (result, _) = complete(&client, &request).await;
    assert_eq!(result.unwrap().text, "Paris: 18C and sunny.");
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let sent = fake.last_request().unwrap();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert!(
        messages
            .iter()
            .all(|m| m.get("tool_calls").is_none() && m["role"] != "tool")
    );
    let assistant = messages[2]["content"].as_str().unwrap();
    let actions: Vec<Value> = assistant
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        actions,
        vec![
            json!({"action":"CALL_TOOL","tool_name":"get_weather","arguments":{"city":"Paris"}}),
            json!({"action":"CALL_TOOL","tool_name":"get_weather","arguments":{"town":"Oslo"}}),
        ]
    );
    assert_eq!(
        messages[3],
        json!({"role":"user","content":"Result of get_weather (call call_a): 18C, sunny\n\nResult of get_weather (call call_b) [error]: invalid_arguments: unknown parameter town"})
    );

    // The loop's fallback call (no tools offered) over the same history.
    let request = ModelRequest {
        cache: Default::default(),
        messages: shared_messages(history_with_tool_use()),
        tools: vec![],
        max_output_tokens: None,
    };
    let (result, deltas) = complete(&client, &request).await;
    assert_eq!(
        result.unwrap().text,
        "Paris is 18C; Oslo could not be checked."
    );
    assert_eq!(deltas.concat(), "Paris is 18C; Oslo could not be checked.");
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let sent = fake.last_request().unwrap();
    assert!(!system_text(&sent).contains("CALL_TOOL"));
    assert!(
        sent["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["role"] != "tool")
    );
}

#[tokio::test]
async fn json_mode_over_anthropic_keeps_its_role_rules() {
    let fake = FakeAnthropic::start(fake_anthropic::Script::queue(vec![
        fake_anthropic::Reply::text(
            r#"{"action":"CLARIFY","tool_name":"get_weather","missing_slots":["city"],"clarification_question":"Which city?"}"#,
        ),
    ]))
    .await;
    let mut settings = AnthropicSettings::new(fake.base_url(), "claude-test");
    settings.timeout = Duration::from_secs(5);
    let client = JsonToolMode::new(Arc::new(AnthropicClient::new(settings).unwrap()));
    let request = ModelRequest {
        cache: Default::default(),
        messages: shared_messages(history_with_tool_use()),
        tools: vec![weather_tool(), clarify_tool()],
        max_output_tokens: None,
    };
    let (result, _) = complete(&client, &request).await;
    let response = result.unwrap();
    assert_eq!(response.tool_calls[0].name, "clarify");
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let sent = fake.last_request().unwrap();
    assert!(sent.get("tools").is_none());
    assert!(sent["system"].as_str().unwrap().contains("get_weather"));
}
