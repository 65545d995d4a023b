//! The scripted model keeps its promises: replies in order with fresh call
//! ids, every request recorded, broken requests refused, no silent defaults.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use keel_protocol::{Message, ModelClient, ModelError, ModelRequest, ToolCall, shared_messages};
use keel_test_support::scripted::{
    Gate, ScriptedModel, call_tool, call_tools, last_user_text, reply_text, respond, when_open,
};
use serde_json::json;

fn ask(text: &str) -> ModelRequest {
    ModelRequest {
        messages: shared_messages(vec![Message::system("s"), Message::user(text)]),
        ..ModelRequest::default()
    }
}

fn panics(f: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[tokio::test]
async fn replies_come_in_order_with_fresh_call_ids_and_requests_are_recorded() {
    let model = ScriptedModel::new([
        call_tool("a", json!({"x": 1})),
        call_tools([("b", json!({})), ("c", json!({"y": "z"}))]),
    ])
    .then(respond(|r| {
        reply_text(format!("you said {}", last_user_text(r).unwrap()))
    }));
    let first = model.complete(&ask("one"), None).await.unwrap();
    assert_eq!(
        first.tool_calls,
        [ToolCall {
            id: "call_1".into(),
            name: "a".into(),
            arguments: "{\"x\":1}".into()
        }]
    );
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    let second = model.complete(&ask("two"), None).await.unwrap();
    let ids: Vec<&str> = second.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_2", "call_3"]);
    let third = model.complete(&ask("three"), None).await.unwrap();
    assert_eq!(third.text, "you said three");
    assert_eq!(third.finish_reason.as_deref(), Some("stop"));
    assert_eq!(model.request_count(), 3);
    assert_eq!(last_user_text(&model.request(1).unwrap()), Some("two"));
    assert_eq!(model.remaining(), 0);
    model.assert_clean();
}

#[tokio::test]
async fn a_request_breaking_the_pairing_rules_is_refused_and_recorded() {
    let model = ScriptedModel::new([reply_text("never sent")]);
    let mut request = ask("hi");
    request.messages.push(Arc::new(Message::Assistant {
        content: String::new(),
        tool_calls: vec![ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        }],
    }));
    request.messages.push(Arc::new(Message::user("next")));
    let err = model.complete(&request, None).await.unwrap_err();
    assert!(
        matches!(&err, ModelError::Protocol(m) if m.contains("c1")),
        "{err:?}"
    );
    let violations = model.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].starts_with("request #0"), "{violations:?}");
    assert_eq!(model.remaining(), 1, "a refused request uses no step");
    let message = panics(|| model.assert_clean());
    assert!(message.contains("pairing violation"), "{message}");
}

#[tokio::test]
async fn running_out_of_script_is_an_error_not_a_default() {
    let model = ScriptedModel::new([reply_text("only one")]);
    model.complete(&ask("1"), None).await.unwrap();
    let err = model.complete(&ask("2"), None).await.unwrap_err();
    assert!(matches!(err, ModelError::Protocol(_)), "{err:?}");
    assert_eq!(model.unscripted().len(), 1);
    assert!(model.unscripted()[0].contains("all 1 scripted step"));
    let message = panics(|| model.assert_clean());
    assert!(message.contains("unscripted"), "{message}");
}

#[tokio::test]
async fn a_panicking_responder_fails_the_request_instead_of_the_task() {
    let model = ScriptedModel::new([respond(|_| panic!("no answer for this"))]);
    let err = model.complete(&ask("x"), None).await.unwrap_err();
    assert!(matches!(err, ModelError::Protocol(_)), "{err:?}");
    assert!(model.unscripted()[0].contains("no answer for this"));
}

#[tokio::test]
async fn text_is_sent_as_one_delta_only_when_streaming() {
    for stream in [false, true] {
        let model = ScriptedModel::new([reply_text("hello there")]).streaming(stream);
        let (tx, mut rx) = futures::channel::mpsc::unbounded();
        model.complete(&ask("hi"), Some(tx)).await.unwrap();
        let mut deltas = Vec::new();
        while let Ok(d) = rx.try_recv() {
            deltas.push(d);
        }
        let expected: Vec<String> = if stream {
            vec!["hello there".into()]
        } else {
            vec![]
        };
        assert_eq!(deltas, expected, "stream={stream}");
    }
}

#[tokio::test]
async fn a_gated_step_answers_only_once_the_gate_is_open() {
    let gate = Gate::new();
    let model = ScriptedModel::new([when_open(&gate, reply_text("late"))]);
    let waiting = tokio::spawn({
        let model = model.clone();
        async move { model.complete(&ask("hi"), None).await }
    });
    while model.request_count() == 0 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished(), "answered before the gate opened");
    gate.open();
    assert_eq!(waiting.await.unwrap().unwrap().text, "late");
}
