//! Secrets never leak, through a real `keel serve`: every kind of secret
//! keel reads from its environment (a provider API key, HTTP API keys, a
//! tool header secret, an MCP server's environment, the chat channels'
//! and a dispatch hook's secrets) is planted in every place text enters a
//! run: the user's input, metadata, clarification answer, steering and
//! follow-up; a tool that echoes its headers, an MCP tool that returns its
//! environment; the model's streamed reply (split between deltas), its
//! tool call arguments, its question, its error, a session summary; a
//! memory document and a channel message. Then every place it could show
//! is read back, and no secret may be anywhere: the events over SSE, the
//! runs and session over the API, every request the model received, what
//! the tool backend, a dispatch hook and the chat service were sent,
//! memory search, the log, and every file of the data dir.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Env, KEY_ACME, KEY_GLOBEX, Keel, mcp_fixture};
use hmac::{Hmac, Mac};
use keel_test_support::fake_chat::FakeChat;
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};
use sha2::Sha256;

const PROVIDER_KEY: &str = "sk-prov-Kx81-secret-0001";
const TOOL_TOKEN: &str = "tool-Hd93-secret-0002";
const MCP_TOKEN: &str = "mcp-Pq27-secret-0003";
const TG_TOKEN: &str = "123456:tg-bot-secret-0004";
const TG_SECRET: &str = "tg-webhook-secret-0005";
/// With a quote and a backslash: JSON and `Debug` escape it, and it must
/// be found in those forms too.
const SLACK_SECRET: &str = "slack\"signing\\secret-0006";
const HOOK_SECRET: &str = "hook-signing-secret-0007";
const DISPATCH_SECRET: &str = "dispatch-secret-0008";
/// Too short to be redacted (the documented minimum is 8 characters).
const SHORT_SECRET: &str = "abc1234";

/// Every secret keel reads in this test, with the variable it is read from.
fn secrets() -> Vec<(&'static str, &'static str)> {
    vec![
        ("TEST_PROVIDER_KEY", PROVIDER_KEY),
        ("TEST_KEY_ACME", KEY_ACME),
        ("TEST_KEY_GLOBEX", KEY_GLOBEX),
        ("TEST_TOOL_TOKEN", TOOL_TOKEN),
        ("TEST_MCP_TOKEN", MCP_TOKEN),
        ("TEST_TG_TOKEN", TG_TOKEN),
        ("TEST_TG_SECRET", TG_SECRET),
        ("TEST_SLACK_SECRET", SLACK_SECRET),
        ("TEST_HOOK_SECRET", HOOK_SECRET),
        ("TEST_DISPATCH_SECRET", DISPATCH_SECRET),
    ]
}

/// All secrets in one text, as a user or a model would paste them.
fn all() -> String {
    secrets()
        .iter()
        .map(|(var, value)| format!("{var}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The forms a secret can take in text keel writes: as it is, and
/// escaped inside a JSON string (events, bodies, the log's fields).
fn forms(secret: &str) -> Vec<String> {
    let json = serde_json::to_string(secret).unwrap();
    let debug = format!("{secret:?}");
    vec![
        secret.to_owned(),
        json[1..json.len() - 1].to_owned(),
        debug[1..debug.len() - 1].to_owned(),
    ]
}

/// Panics naming the secret and where it was found.
fn assert_clean(place: &str, text: &str) {
    for (var, secret) in secrets() {
        for form in forms(secret) {
            assert!(
                !text.contains(&form),
                "the secret of {var} leaked into {place}:\n{text}"
            );
        }
    }
}

/// For binary files (the databases): the secrets are ASCII, which a
/// lossy conversion keeps as it is.
fn assert_clean_bytes(place: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for (var, secret) in secrets() {
        for form in forms(secret) {
            assert!(
                !text.contains(&form),
                "the secret of {var} leaked into {place}"
            );
        }
    }
}

fn config_extra(tools: &ToolServer, chat: &FakeChat) -> String {
    let headers: Vec<String> = [
        ("Authorization", "Bearer ${TEST_TOOL_TOKEN}"),
        ("X-Provider", "${TEST_PROVIDER_KEY}"),
        ("X-Acme", "${TEST_KEY_ACME}"),
        ("X-Globex", "${TEST_KEY_GLOBEX}"),
        ("X-Mcp", "${TEST_MCP_TOKEN}"),
        ("X-Tg-Bot", "${TEST_TG_TOKEN}"),
        ("X-Tg-Secret", "${TEST_TG_SECRET}"),
        ("X-Slack", "${TEST_SLACK_SECRET}"),
        ("X-Hook", "${TEST_HOOK_SECRET}"),
        ("X-Dispatch", "${TEST_DISPATCH_SECRET}"),
        ("X-Short", "${TEST_SHORT_SECRET}"),
    ]
    .iter()
    .map(|(k, v)| format!("{k:?} = {v:?}"))
    .collect();
    format!(
        r#"
[[tools.http]]
name = "echo_secrets"
description = "Echoes the headers it is sent"
method = "GET"
url = "{tools}/echo_headers"
headers = {{ {headers} }}
risk = "read"

[[tools.mcp]]
name = "fixture"
command = {fixture:?}
args = ["--print-env", "FIXTURE_TOKEN"]
env = {{ FIXTURE_TOKEN = "${{TEST_MCP_TOKEN}}" }}

[[channels]]
id = "tg"
kind = "telegram"
tenant = "acme"
bot_token_env = "TEST_TG_TOKEN"
secret_token_env = "TEST_TG_SECRET"
api_base = "{chat}"

[[channels]]
id = "slack"
kind = "slack"
tenant = "acme"
bot_token_env = "TEST_TG_TOKEN"
signing_secret_env = "TEST_SLACK_SECRET"
api_base = "{chat}"

[[channels]]
id = "hook"
kind = "webhook"
tenant = "acme"
signing_secret_env = "TEST_HOOK_SECRET"
reply_url = "{chat}/response"

[[routing.hooks]]
point = "message_received"
url = "{tools}/received"
timeout_ms = 300
secret_env = "TEST_DISPATCH_SECRET"
"#,
        tools = tools.base_url(),
        headers = headers.join(", "),
        fixture = mcp_fixture().display().to_string(),
        chat = chat.base_url(),
    )
}

fn script() -> Script {
    let everything = all();
    Script::queue(vec![
        // The main run: a question carrying every secret...
        Reply::tool_call(
            "clarify",
            json!({"tool_name": "furnace_status", "missing_slots": ["furnace_id"],
                   "question": format!("Which furnace? You wrote {everything}")}),
        ),
        // ...tools whose output echoes them...
        Reply::tool_call("echo_secrets", json!({})),
        Reply::tool_call("fixture.env", json!({"name": "FIXTURE_TOKEN"})),
        // ...arguments carrying them...
        Reply::tool_call(
            "furnace_status",
            json!({"furnace_id": format!("F3 {everything}")}),
        ),
        // ...an answer carrying them, streamed in pieces that split them...
        Reply::text(format!("F3 is running. For the record: {everything}"))
            .with_chunk_gap(Duration::from_millis(150)),
        // ...and the follow-up's answer.
        Reply::text(format!("Follow-up noted: {everything}")),
        // A provider that quotes the key it rejected.
        Reply::status(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {PROVIDER_KEY}"),
                             "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ),
        // A message from a chat channel.
        Reply::text(format!("Channel answer: {everything}")),
        // The summary written when the session is reset.
        Reply::text(format!("## Facts\n- The keys are {everything}")),
    ])
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// POSTs a message to the webhook channel, signed as keel's webhook is.
async fn channel_message(keel: &Keel, text: &str) -> (u16, Value) {
    let body = json!({"id": "msg-1", "sender": "u-1", "text": text}).to_string();
    let ts = unix_now().to_string();
    let mut mac = Hmac::<Sha256>::new_from_slice(HOOK_SECRET.as_bytes()).unwrap();
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let sig: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let resp = reqwest::Client::new()
        .post(keel.url("/ai/channels/hook/webhook"))
        .header("X-Keel-Timestamp", ts)
        .header("X-Keel-Signature", format!("sha256={sig}"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The events of a finished run as its SSE stream delivers them.
async fn events_text(keel: &Keel, id: &str) -> String {
    let frames = keel.events(id, None, Some(KEY_ACME)).await;
    assert!(!frames.is_empty(), "run {id} has no events");
    frames
        .iter()
        .map(|f| format!("{} {}\n", f.event, f.data))
        .collect()
}

/// The streamed answer as a client puts it together from `message_delta`
/// events: a secret split between two deltas shows only here.
async fn streamed_text(keel: &Keel, id: &str) -> String {
    keel.events(id, None, Some(KEY_ACME))
        .await
        .iter()
        .filter(|f| f.event == "message_delta")
        .map(|f| f.data["text"].as_str().unwrap().to_owned())
        .collect()
}

/// Every file under `dir`, read whole.
fn files_under(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
    out
}

#[tokio::test]
async fn no_secret_keel_reads_shows_in_events_logs_requests_history_or_memory() {
    let model = FakeOpenAi::start(script()).await;
    let tools = ToolServer::start().await;
    let chat = FakeChat::start(TG_TOKEN).await;
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    env.log = "debug".into();
    env.agent_tools
        .extend(["echo_secrets", "fixture.env"].map(String::from));
    env.extra_tools = config_extra(&tools, &chat);
    env.vars = secrets()
        .into_iter()
        .filter(|(var, _)| !var.starts_with("TEST_KEY_"))
        .chain([("TEST_SHORT_SECRET", SHORT_SECRET)])
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let keel = Keel::start_with(&env, |c| {
        c.replacen(
            "model = \"fake-model\"",
            "model = \"fake-model\"\napi_key_env = \"TEST_PROVIDER_KEY\"",
            1,
        )
    })
    .await;
    let key = Some(KEY_ACME);
    let everything = all();

    // The user's input and metadata.
    let (code, run) = keel
        .post(
            "/ai/runs",
            json!({"input": format!("How is the furnace? My keys: {everything}"),
                   "session": "ses-secrets", "metadata": {"note": everything}}),
            key,
        )
        .await;
    assert_eq!(code, 201, "{run}");
    let id = run["id"].as_str().unwrap().to_owned();
    let waiting = keel.wait_status(&id, "waiting_input", key).await;
    assert_clean("the pending question", &waiting.to_string());
    assert!(
        waiting["pending"]["question"]
            .as_str()
            .unwrap()
            .contains("[redacted]"),
        "{waiting}"
    );
    // Steering and a follow-up queued while the run waits, then the answer.
    for (action, text) in [
        ("steer", format!("Steer: {everything}")),
        ("follow_up", format!("Then this: {everything}")),
        ("input", format!("F3, and {everything}")),
    ] {
        let (code, body) = keel
            .post(
                &format!("/ai/runs/{id}/{action}"),
                json!({"text": text}),
                key,
            )
            .await;
        assert_eq!(code, 202, "{action}: {body}");
    }
    let done = keel.wait_status(&id, "completed", key).await;
    assert_eq!(
        done["output"].as_str().unwrap(),
        format!(
            "Follow-up noted: {}",
            secrets()
                .iter()
                .map(|(var, _)| format!("{var}=[redacted]"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    );
    assert_eq!(tools.count("echo_headers"), 1, "the echoing tool ran");

    // A provider error quoting the key.
    let failed_id = keel.start_run("Anything at all?", key).await;
    let failed = keel.wait_status(&failed_id, "failed", key).await;
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Incorrect API key provided: [redacted]"),
        "{failed}"
    );

    // A chat channel's message; its answer goes back to the channel.
    let (code, accepted) = channel_message(&keel, &format!("From chat: {everything}")).await;
    assert_eq!(code, 200, "{accepted}");
    let channel_run = accepted["run_id"].as_str().unwrap().to_owned();
    keel.wait_status(&channel_run, "completed", key).await;
    let sent = chat.wait_for("response", 1).await;

    let (code, session) = keel.get("/ai/sessions/ses-secrets", key).await;
    assert_eq!(code, 200, "{session}");
    assert_clean("the session", &session.to_string());
    assert!(session.to_string().contains("[redacted]"), "{session}");

    // A document added to memory, and the session's summary.
    let (code, added) = keel
        .post(
            "/ai/memory/documents",
            json!({"title": format!("Keys {TOOL_TOKEN}"), "text": format!("Ops notes. {everything}")}),
            key,
        )
        .await;
    assert_eq!(code, 201, "{added}");
    let (code, reset) = keel
        .post("/ai/sessions/ses-secrets/reset", json!({}), key)
        .await;
    assert_eq!(code, 200, "{reset}");
    assert_eq!(reset["summarized_by"], "model", "{reset}");

    // Now read everything back.
    for run_id in [&id, &failed_id, &channel_run] {
        let events = events_text(&keel, run_id).await;
        assert_clean(&format!("the events of {run_id}"), &events);
        let (_, record) = keel.get(&format!("/ai/runs/{run_id}"), key).await;
        assert_clean(&format!("run {run_id}"), &record.to_string());
    }
    let streamed = streamed_text(&keel, &id).await;
    assert!(
        streamed.contains("For the record: TEST_PROVIDER_KEY=[redacted]"),
        "{streamed}"
    );
    assert_clean("the streamed answer", &streamed);
    let main_events = events_text(&keel, &id).await;
    for planted in [
        "run_started",
        "clarification_needed",
        "steering_applied",
        "follow_up_started",
        "message_delta",
    ] {
        assert!(
            main_events.contains(planted),
            "no {planted}:\n{main_events}"
        );
    }
    assert!(
        main_events.matches("[redacted]").count() >= 10 * secrets().len(),
        "{main_events}"
    );
    let (_, list) = keel.get("/ai/runs?limit=100", key).await;
    assert_clean("the run list", &list.to_string());
    assert_clean("the reset's summary", &reset.to_string());
    for q in ["Ops notes", "Facts keys"] {
        let (code, hits) = keel
            .get(&format!("/ai/memory/search?q={}", q.replace(' ', "+")), key)
            .await;
        assert_eq!(code, 200, "{hits}");
        assert!(
            hits["hits"].to_string().contains("[redacted]"),
            "memory has what was planted: {hits}"
        );
        assert_clean("memory search", &hits.to_string());
    }

    let requests = model.requests();
    assert!(requests.len() >= 8, "{} model requests", requests.len());
    for (i, request) in requests.iter().enumerate() {
        assert_clean(&format!("model request {i}"), &request.to_string());
    }
    assert!(
        requests
            .iter()
            .any(|r| r.to_string().contains("received_headers")),
        "the echoed headers reached the model, redacted"
    );
    assert_eq!(tools.count("received"), 1, "the dispatch hook was told");
    for (route, args) in tools.calls() {
        assert_clean(
            &format!("the tool backend's {route} call"),
            &args.to_string(),
        );
    }
    for received in &sent {
        assert_clean("the chat answer", &received.body.to_string());
    }

    let log = keel.log();
    assert!(
        log.contains("mcp-fixture: FIXTURE_TOKEN=[redacted]"),
        "the MCP server logged its secret, redacted:\n{log}"
    );
    assert!(
        log.contains(
            "tools.http[6].headers.X-Short (TEST_SHORT_SECRET) is shorter than 8 characters"
        ),
        "a secret too short to redact is named:\n{log}"
    );
    assert!(
        log.contains("Incorrect API key provided: [redacted]"),
        "the provider's error was logged, redacted:\n{log}"
    );
    assert_clean("the log", &log);
    for (path, bytes) in files_under(&keel.dir) {
        assert_clean_bytes(&path, &bytes);
    }
    assert!(model.violations().is_empty(), "{:?}", model.violations());
}
