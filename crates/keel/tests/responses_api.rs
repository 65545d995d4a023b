//! SPEC §7: `POST /v1/responses` and `GET /v1/models` through a real
//! `keel serve`, a scripted fake model and a real HTTP tool backend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel};
use futures::StreamExt;
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

fn furnace_tool() -> Value {
    json!({
        "type": "function",
        "name": "get_furnace_temp",
        "description": "Current temperature of a furnace, read by the client",
        "parameters": {
            "type": "object",
            "properties": {"furnace_id": {"type": "string"}},
            "required": ["furnace_id"]
        },
        "strict": true
    })
}

/// The keel run a response id belongs to.
fn run_of(response_id: &str) -> String {
    let rest = response_id.strip_prefix("resp_").unwrap();
    rest.rsplit_once('_').unwrap().0.to_owned()
}

/// The typed events of a streamed response, in order.
async fn stream_events(keel: &Keel, body: Value, key: Option<&str>) -> Vec<Value> {
    let mut r = reqwest::Client::new()
        .post(keel.url("/v1/responses"))
        .json(&body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let resp = r.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Some(chunk) = tokio::time::timeout_at(deadline, body.next())
        .await
        .expect("the stream did not end within 30 s")
    {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(pos) = buf.find("\n\n") {
            let block: String = buf.drain(..pos + 2).collect();
            let mut event = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if data.is_empty() {
                continue; // a heartbeat comment
            }
            let v: Value = serde_json::from_str(&data).unwrap();
            assert_eq!(event.as_deref(), v["type"].as_str(), "event name = type");
            events.push(v);
        }
    }
    events
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn assert_sequenced(events: &[Value]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "{e}");
    }
}

/// The Response object fields the official SDK requires, with their types.
fn assert_response_shape(r: &Value) {
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_run_"), "{r}");
    assert!(r["created_at"].is_i64());
    assert!(r["output"].is_array());
    assert!(r["tools"].is_array());
    assert!(r["parallel_tool_calls"].is_boolean());
    assert!(r["tool_choice"].is_string() || r["tool_choice"].is_object());
    assert_eq!(r["model"], "default");
    let u = &r["usage"];
    for k in ["input_tokens", "output_tokens", "total_tokens"] {
        assert!(u[k].is_u64(), "usage.{k}: {r}");
    }
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());
    assert!(u["output_tokens_details"]["reasoning_tokens"].is_u64());
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
    );
}

async fn start(replies: Vec<Reply>, stream: bool, auth: bool) -> (FakeOpenAi, ToolServer, Keel) {
    let model = FakeOpenAi::start(Script::queue(replies)).await;
    let tools = ToolServer::start().await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.stream = stream;
    env.auth = auth;
    let keel = Keel::start(&env).await;
    (model, tools, keel)
}

#[tokio::test]
async fn non_streamed_client_tool_round_trip_continues_the_same_run() {
    let (model, _tools, keel) = start(
        vec![
            Reply::tool_call("get_furnace_temp", json!({"furnace_id": "F2"})),
            Reply::text("F2 is at 1450 °C."),
        ],
        false,
        false,
    )
    .await;
    let (code, first) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": "How hot is F2?", "tools": [furnace_tool()],
                   "temperature": 0.2, "metadata": {"ticket": "T-1"}, "store": true}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{first}");
    assert_response_shape(&first);
    assert_eq!(first["status"], "completed");
    assert_eq!(first["metadata"]["ticket"], "T-1");
    assert_eq!(first["tools"][0]["name"], "get_furnace_temp");
    let output = first["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{first}");
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_furnace_temp");
    assert_eq!(call["status"], "completed");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"furnace_id": "F2"}));
    let call_id = call["call_id"].as_str().unwrap();
    let run_id = run_of(first["id"].as_str().unwrap());
    let run = keel.wait_status(&run_id, "waiting_input", None).await;
    assert_eq!(run["pending"]["type"], "client_tool");
    // The model was offered the client tool next to keel's own.
    let offered = model.requests()[0]["tools"].to_string();
    assert!(offered.contains("get_furnace_temp") && offered.contains("furnace_status"));

    let (code, second) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"],
                   "input": [{"type": "function_call_output", "call_id": call_id, "output": "1450"}],
                   "tools": [furnace_tool()]}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{second}");
    assert_response_shape(&second);
    assert_eq!(second["status"], "completed");
    assert_eq!(second["previous_response_id"], first["id"]);
    assert_eq!(run_of(second["id"].as_str().unwrap()), run_id, "same run");
    assert_ne!(second["id"], first["id"]);
    let msg = &second["output"][0];
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["role"], "assistant");
    assert_eq!(msg["status"], "completed");
    assert_eq!(msg["content"][0]["type"], "output_text");
    assert_eq!(msg["content"][0]["text"], "F2 is at 1450 °C.");
    assert_eq!(msg["content"][0]["annotations"], json!([]));
    let run = keel.wait_status(&run_id, "completed", None).await;
    assert_eq!(run["output"], "F2 is at 1450 °C.");
    // The output reached the model as a fenced tool result of that call.
    let last = model.last_request().unwrap();
    let tool_msg = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert_eq!(tool_msg["tool_call_id"], call_id);
    assert!(tool_msg["content"].as_str().unwrap().contains("1450"));
    assert!(tool_msg["content"].as_str().unwrap().contains("untrusted"));
    assert!(model.violations().is_empty(), "{:?}", model.violations());
    // Its result went through verification like a server-side tool's.
    let events = keel.events(&run_id, None, None).await;
    let result = events.iter().find(|f| f.event == "tool_result").unwrap();
    assert_eq!(result.data["tool"], "get_furnace_temp");
    assert_eq!(result.data["output"], "1450");

    // The same outputs again: the run no longer waits for them.
    let (code, body) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"],
                   "input": [{"type": "function_call_output", "call_id": call_id, "output": "1450"}]}),
            None,
        )
        .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], "input");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("completed")
    );
}

#[tokio::test]
async fn streamed_round_trip_has_ordered_typed_events() {
    let (_model, _tools, keel) = start(
        vec![
            Reply::tool_call("get_furnace_temp", json!({"furnace_id": "F1"})),
            // Gaps wide enough that chunks arrive apart even when the
            // machine runs many tests at once: keel sends what has arrived
            // together as one delta, so 5 ms gaps could merge into one.
            Reply::text("F1 is at 1380 °C, within limits.")
                .with_chunk_gap(Duration::from_millis(40)),
        ],
        true,
        false,
    )
    .await;
    let first = stream_events(
        &keel,
        json!({"model": "default", "input": "How hot is F1?", "tools": [furnace_tool()], "stream": true}),
        None,
    )
    .await;
    assert_sequenced(&first);
    assert_eq!(
        types(&first),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(first[0]["response"]["status"], "in_progress");
    let done = first.last().unwrap()["response"].clone();
    assert_response_shape(&done);
    assert_eq!(done["status"], "completed");
    let call = &done["output"][0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(first[5]["item"], *call);
    assert_eq!(first[4]["arguments"], call["arguments"]);
    assert_eq!(first[3]["delta"], call["arguments"]);
    assert_eq!(first[3]["item_id"], call["id"]);

    let second = stream_events(
        &keel,
        json!({"model": "default", "previous_response_id": done["id"], "stream": true,
               "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "1380"}]}),
        None,
    )
    .await;
    assert_sequenced(&second);
    let t = types(&second);
    assert_eq!(
        &t[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        &t[t.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let deltas: Vec<&Value> = second
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .collect();
    assert!(deltas.len() > 1, "text streamed in pieces: {t:?}");
    let joined: String = deltas
        .iter()
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(joined, "F1 is at 1380 °C, within limits.");
    let text_done = second
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .unwrap();
    assert_eq!(text_done["text"], joined);
    let completed = second.last().unwrap()["response"].clone();
    assert_response_shape(&completed);
    assert_eq!(completed["output"][0]["content"][0]["text"], joined);
    assert_eq!(
        run_of(completed["id"].as_str().unwrap()),
        run_of(done["id"].as_str().unwrap())
    );
}

#[tokio::test]
async fn replayed_items_continue_the_run_without_previous_response_id() {
    let (_model, _tools, keel) = start(
        vec![
            Reply::tool_call("get_furnace_temp", json!({"furnace_id": "F3"})),
            Reply::text("F3 is cold."),
            Reply::text("You asked about F3."),
        ],
        false,
        false,
    )
    .await;
    let (_, first) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "instructions": "Answer briefly.",
                   "input": [{"role": "user", "content": "How hot is F3?"}], "tools": [furnace_tool()]}),
            None,
        )
        .await;
    let call = first["output"][0].clone();
    let user = json!({"role": "user", "content": "How hot is F3?"});
    let (code, second) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "instructions": "Answer briefly.", "tools": [furnace_tool()],
                   "input": [user, call,
                             {"type": "function_call_output", "call_id": call["call_id"], "output": "40"}]}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{second}");
    let run_id = run_of(first["id"].as_str().unwrap());
    assert_eq!(run_of(second["id"].as_str().unwrap()), run_id);
    assert_eq!(second["output"][0]["content"][0]["text"], "F3 is cold.");
    // A stateless client's next turn replays everything: the session continues.
    let answer = second["output"][0].clone();
    let (code, third) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": [
                user, call,
                {"type": "function_call_output", "call_id": call["call_id"], "output": "40"},
                answer, {"role": "user", "content": "What did I ask?"}]}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{third}");
    let next_run = run_of(third["id"].as_str().unwrap());
    assert_ne!(next_run, run_id);
    let (_, a) = keel.get(&format!("/ai/runs/{run_id}"), None).await;
    let (_, b) = keel.get(&format!("/ai/runs/{next_run}"), None).await;
    assert_eq!(a["session"], b["session"]);
    assert_eq!(
        b["input"], "What did I ask?",
        "only the new message is the input"
    );
    assert!(
        a["input"]
            .as_str()
            .unwrap()
            .contains("[instructions]\nAnswer briefly.")
    );
}

#[tokio::test]
async fn previous_response_id_continues_the_conversation_in_the_same_session() {
    let (model, _tools, keel) = start(
        vec![
            Reply::text("Nice to meet you, Alice."),
            Reply::text("Your name is Alice."),
        ],
        true,
        false,
    )
    .await;
    let (_, first) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": "My name is Alice."}),
            None,
        )
        .await;
    assert_eq!(
        first["output"][0]["content"][0]["text"],
        "Nice to meet you, Alice."
    );
    let (code, second) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"],
                   "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}]}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(
        second["output"][0]["content"][0]["text"],
        "Your name is Alice."
    );
    let r1 = run_of(first["id"].as_str().unwrap());
    let r2 = run_of(second["id"].as_str().unwrap());
    assert_ne!(r1, r2, "a finished run is continued by a new run");
    let (_, a) = keel.get(&format!("/ai/runs/{r1}"), None).await;
    let (_, b) = keel.get(&format!("/ai/runs/{r2}"), None).await;
    assert_eq!(a["session"], b["session"]);
    // The model saw the earlier turn as history.
    let history = model.last_request().unwrap()["messages"].to_string();
    assert!(history.contains("My name is Alice.") && history.contains("Nice to meet you, Alice."));
}

#[tokio::test]
async fn server_side_tools_run_inside_keel_during_a_response() {
    let (_model, tools, keel) = start(
        vec![
            Reply::tool_call("furnace_status", json!({"furnace_id": "F1"})),
            Reply::text("F1 is running at 1450 °C."),
        ],
        true,
        false,
    )
    .await;
    let events = stream_events(
        &keel,
        json!({"model": "default", "input": "Status of F1?", "stream": true, "tools": [furnace_tool()]}),
        None,
    )
    .await;
    assert_sequenced(&events);
    let t = types(&events);
    assert!(
        !t.contains(&"response.function_call_arguments.delta"),
        "{t:?}"
    );
    let r = &events.last().unwrap()["response"];
    assert_eq!(r["status"], "completed");
    assert_eq!(r["output"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(
        r["output"][0]["content"][0]["text"],
        "F1 is running at 1450 °C."
    );
    assert_eq!(tools.count("furnace"), 1, "{:?}", tools.calls());
    let run_id = run_of(r["id"].as_str().unwrap());
    let frames = keel.events(&run_id, None, None).await;
    let result = frames.iter().find(|f| f.event == "tool_result").unwrap();
    assert_eq!(result.data["tool"], "furnace_status");
    assert_eq!(result.data["ok"], true);
    assert!(frames.iter().any(|f| f.event == "policy_decision"));
}

#[tokio::test]
async fn models_and_errors_in_openai_format() {
    let (_model, _tools, keel) = start(
        vec![
            Reply::tool_call("get_furnace_temp", json!({"furnace_id": "F2"})),
            Reply::text("ok"),
        ],
        false,
        true,
    )
    .await;
    let a = Some(KEY_ACME);
    let (code, models) = keel.get("/v1/models", a).await;
    assert_eq!(code, 200, "{models}");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "default");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["owned_by"], "keel");
    assert!(models["data"][0]["created"].is_i64());
    let (code, _) = keel.get("/v1/models/default", a).await;
    assert_eq!(code, 200);
    let (code, body) = keel.get("/v1/models/gpt-9", a).await;
    assert_eq!(code, 404, "{body}");

    let (code, body) = keel.get("/v1/models", None).await;
    assert_eq!(code, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    assert!(body["error"]["message"].is_string());

    let bad = |body: Value, param: &'static str| (body, param);
    for (body, param) in [
        bad(json!({"model": "gpt-9", "input": "hi"}), "model"),
        bad(json!({"input": "hi"}), "model"),
        bad(json!({"model": "default", "input": 42}), "input"),
        bad(
            json!({"model": "default", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        bad(
            json!({"model": "default", "input": "hi", "stream": "yes"}),
            "stream",
        ),
        bad(
            json!({"model": "default", "input": "hi", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        bad(
            json!({"model": "default", "input": "hi", "tools": [{"type": "function", "name": "furnace_status"}]}),
            "tools",
        ),
        bad(
            json!({"model": "default", "input": "hi", "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        bad(
            json!({"model": "default", "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
            "input",
        ),
        bad(json!({"model": "default", "input": ""}), "input"),
    ] {
        let (code, resp) = keel.post("/v1/responses", body.clone(), a).await;
        assert_eq!(code, 400, "{body}: {resp}");
        assert_eq!(resp["error"]["type"], "invalid_request_error", "{resp}");
        assert_eq!(resp["error"]["param"], param, "{body}: {resp}");
        assert!(
            resp["error"]["message"].as_str().unwrap().contains(param),
            "{resp}"
        );
    }
    let (_, unknown) = keel
        .post("/v1/responses", json!({"model": "gpt-9", "input": "hi"}), a)
        .await;
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("default")
    );
    let (code, _) = keel
        .post_raw("/v1/responses", b"{not json".to_vec(), a)
        .await;
    assert_eq!(code, 400);

    // acme's response: waiting for the client tool.
    let (code, first) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": "How hot is F2?", "tools": [furnace_tool()]}),
            a,
        )
        .await;
    assert_eq!(code, 200, "{first}");
    let call = first["output"][0].clone();
    let output =
        json!([{"type": "function_call_output", "call_id": call["call_id"], "output": "1"}]);
    // Another tenant cannot see or continue it, by id or by replayed items.
    for body in [
        json!({"model": "default", "previous_response_id": first["id"], "input": output}),
        json!({"model": "default", "input": [call, output[0]]}),
    ] {
        let (code, resp) = keel.post("/v1/responses", body, Some(KEY_GLOBEX)).await;
        assert_eq!(code, 404, "{resp}");
        assert!(!resp.to_string().contains("F2"), "{resp}");
    }
    let (code, resp) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": "resp_nope", "input": "x"}),
            a,
        )
        .await;
    assert_eq!(code, 404, "{resp}");
    assert_eq!(resp["error"]["param"], "previous_response_id");
    // Waiting for the call: a plain message is not an answer, a wrong call id is refused.
    let (code, resp) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"], "input": "hello?"}),
            a,
        )
        .await;
    assert_eq!(code, 400, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains(call["call_id"].as_str().unwrap())
    );
    let (code, resp) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"],
              "input": [{"type": "function_call_output", "call_id": "call_999", "output": "1"}]}),
            a,
        )
        .await;
    assert_eq!(code, 400, "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .unwrap()
            .contains("call_999")
    );
    // The owner can.
    let (code, done) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"], "input": output}),
            a,
        )
        .await;
    assert_eq!(code, 200, "{done}");
    assert_eq!(done["output"][0]["content"][0]["text"], "ok");
}

#[tokio::test]
async fn a_question_from_the_run_is_answered_by_the_next_message() {
    let (_model, tools, keel) = start(
        vec![
            Reply::tool_call("furnace_status", json!({})),
            // The answer completes the held call, which then runs.
            Reply::text("F1 is running."),
        ],
        false,
        false,
    )
    .await;
    let (code, first) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "input": "How is the furnace?"}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["status"], "completed");
    let question = first["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(!question.is_empty(), "{first}");
    let run_id = run_of(first["id"].as_str().unwrap());
    let run = keel.wait_status(&run_id, "waiting_input", None).await;
    assert_eq!(run["pending"]["type"], "input");
    let (code, second) = keel
        .post(
            "/v1/responses",
            json!({"model": "default", "previous_response_id": first["id"], "input": "F1"}),
            None,
        )
        .await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(
        run_of(second["id"].as_str().unwrap()),
        run_id,
        "the same run goes on"
    );
    assert_eq!(second["output"][0]["content"][0]["text"], "F1 is running.");
    assert_eq!(tools.count("furnace"), 1);
}
