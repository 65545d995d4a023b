//! Spend limits (docs/spend.md) through a real `keel serve`: each model
//! call reserves its worst-case cost before it is sent, so a tenant's or an
//! agent's limit is never passed, on one node or on two sharing PostgreSQL;
//! a model without a price is never called under a limit; `/metrics`
//! shows the spend. The scripted model bills every reply like a provider
//! would: 1,000 prompt and 100 completion tokens, unless told otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use chrono::{Timelike, Utc};
use common::{Env, KEY_ACME, KEY_GLOBEX, Keel, ending, start_at_once, tool_results, user_input};
use keel_test_support::fake_openai::{FakeOpenAi, Reply, Script};
use keel_test_support::pg::TestDb;
use keel_test_support::tool_server::ToolServer;
use serde_json::{Value, json};

/// $1 per million prompt tokens, $2 per million completion tokens: a
/// reply of 1,000 + 100 tokens costs 1,200 micro-USD.
const PRICE: &str = "price = { input_usd_per_mtok = 1.0, output_usd_per_mtok = 2.0 }\n\
                     max_output_tokens = 200\n";
const CALL_MICROS: u64 = 1_200;

/// "read …" reads furnaces F1, F2, … for as long as it is let; "overspend"
/// is answered with a reply billed far beyond its output cap; anything
/// else, and every call without tools, is answered at once.
fn model() -> Script {
    Script::handler(|req| {
        let offered = req["tools"].as_array().is_some_and(|t| !t.is_empty());
        let input = user_input(req);
        let reply = if offered && input.starts_with("read") {
            Reply::tool_call(
                "furnace_status",
                json!({"furnace_id": format!("F{}", tool_results(req) + 1)}),
            )
        } else if input.starts_with("overspend") {
            return Reply::text("A very long answer.").with_usage(1_000, 1_000_000);
        } else {
            Reply::text("All done.")
        };
        reply.with_usage(1_000, 100)
    })
}

fn env(model: &FakeOpenAi, tools: &ToolServer, price: &str, config: &str) -> Env {
    let mut env = Env::new(&model.base_url(), &tools.base_url());
    env.auth = true;
    env.provider_extra = price.to_owned();
    env.agent_extra = "[agents.limits]\nmax_steps = 40\nmax_tool_calls = 40\n".into();
    env.extra_tools = config.to_owned();
    env
}

async fn serve(price: &str, config: &str) -> (FakeOpenAi, ToolServer, Keel) {
    let model = FakeOpenAi::start(model()).await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&env(&model, &tools, price, config)).await;
    (model, tools, keel)
}

/// The value of `keel_spend_usd_micros_total` for `tenant`, summed.
async fn metered(keel: &Keel, tenant: &str) -> u64 {
    let (_, metrics) = keel.get("/metrics", None).await;
    let text = metrics.as_str().unwrap();
    let label = format!("tenant=\"{tenant}\"");
    text.lines()
        .filter(|l| l.starts_with("keel_spend_usd_micros_total{") && l.contains(&label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[tokio::test]
async fn a_tenant_limit_stops_the_run_before_the_call_that_could_pass_it() {
    let (model, _tools, keel) = serve(
        PRICE,
        "[[tenants]]\nid = \"acme\"\nspend_usd_per_day = 0.01\n",
    )
    .await;
    let id = keel.start_run("read every furnace", Some(KEY_ACME)).await;
    keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    let (reason, feedback) = ending(&keel, &id, Some(KEY_ACME)).await;
    assert_eq!(reason, "budget_exhausted");
    assert_eq!(feedback, vec!["spend_usd_per_day reached".to_owned()]);
    let billed = model.request_count() as u64 * CALL_MICROS;
    assert!(
        model.request_count() >= 3,
        "{} calls",
        model.request_count()
    );
    assert!(billed <= 10_000, "the provider billed {billed} micro-USD");
    // Every call was capped, so that its worst case was known.
    for request in model.requests() {
        assert_eq!(request["max_tokens"], 200, "{request}");
    }
    assert_eq!(metered(&keel, "acme").await, billed);

    // Another tenant is not limited by acme's spend.
    let before = model.request_count();
    let other = keel.start_run("hello", Some(KEY_GLOBEX)).await;
    let run = keel
        .wait_status(&other, "completed", Some(KEY_GLOBEX))
        .await;
    assert_eq!(run["output"], "All done.");
    assert_eq!(model.request_count(), before + 1);
    assert_eq!(metered(&keel, "globex").await, CALL_MICROS);
}

#[tokio::test]
async fn a_reply_billed_beyond_its_bound_counts_whole_and_the_next_run_gets_429() {
    let (model, _tools, keel) = serve(
        PRICE,
        "[[tenants]]\nid = \"acme\"\nspend_usd_per_day = 0.01\n",
    )
    .await;
    let id = keel.start_run("overspend", Some(KEY_ACME)).await;
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "A very long answer.");
    // What the provider says was spent is counted: 1,000 + 2,000,000.
    assert_eq!(metered(&keel, "acme").await, 2_001_000);

    let resp = reqwest::Client::new()
        .post(keel.url("/ai/runs"))
        .bearer_auth(KEY_ACME)
        .json(&json!({"input": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let to_midnight = 86_400 - u64::from(Utc::now().num_seconds_from_midnight());
    assert!(
        retry_after.abs_diff(to_midnight) <= 2,
        "Retry-After {retry_after}, midnight in {to_midnight} s"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    assert_eq!(body["quota"]["limit"], "spend_usd_per_day", "{body}");
    assert_eq!(body["quota"]["value"], 0.01, "{body}");
    assert_eq!(body["quota"]["tenant"], "acme", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spend_usd_per_day = 0.01"),
        "{body}"
    );
    assert_eq!(model.request_count(), 1);
}

/// Output priced so that a call's worst case (200 output tokens) is about
/// 200,000 micro-USD and dwarfs its prompt: under a limit of 300,000 one
/// request fits, two do not.
const DEAR_OUTPUT: &str = "price = { input_usd_per_mtok = 1.0, output_usd_per_mtok = 1000.0 }\n\
                           max_output_tokens = 200\n";
const ROOM_FOR_ONE: &str = "[[tenants]]\nid = \"acme\"\nspend_usd_per_day = 0.3\n";

/// How many requests offered the model tools: the agent's turns.
fn turns(model: &FakeOpenAi) -> usize {
    model
        .requests()
        .iter()
        .filter(|r| r["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .count()
}

#[tokio::test]
async fn a_retry_that_could_pass_the_limit_is_not_sent() {
    // The provider fails the first request in a way that may have billed
    // it; a retry would be a second worst case, which does not fit.
    let model = FakeOpenAi::start(vec![
        Reply::status(500, json!({"error": {"message": "overloaded"}})),
        Reply::text("All done.").with_usage(1_000, 100),
    ])
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&env(&model, &tools, DEAR_OUTPUT, ROOM_FOR_ONE)).await;
    let id = keel.start_run("hello", Some(KEY_ACME)).await;
    keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    let (reason, feedback) = ending(&keel, &id, Some(KEY_ACME)).await;
    assert_eq!(reason, "budget_exhausted");
    assert_eq!(feedback, vec!["spend_usd_per_day reached".to_owned()]);
    // Neither the retry nor the closing call was sent: the failed request
    // stays reserved whole, since the provider may have billed it.
    assert_eq!(model.request_count(), 1);
    assert_eq!(metered(&keel, "acme").await, 0);
}

#[tokio::test]
async fn a_rate_limited_request_hands_its_reservation_to_the_retry() {
    // A 429 is refused before any work, so it cost nothing: the retry
    // goes out under the same reservation, though two would not fit.
    let model = FakeOpenAi::start(vec![
        Reply::status(429, json!({"error": {"message": "slow down"}}))
            .with_header("retry-after", "0"),
        Reply::text("All done.").with_usage(1_000, 100),
    ])
    .await;
    let tools = ToolServer::start().await;
    let keel = Keel::start(&env(&model, &tools, DEAR_OUTPUT, ROOM_FOR_ONE)).await;
    let id = keel.start_run("hello", Some(KEY_ACME)).await;
    let run = keel.wait_status(&id, "completed", Some(KEY_ACME)).await;
    assert_eq!(run["output"], "All done.", "{run}");
    assert_eq!(turns(&model), 2);
    // 1,000 prompt tokens at $1 and 100 completion tokens at $1,000 per million.
    assert_eq!(metered(&keel, "acme").await, 101_000);
    // What is left (199,000) is less than a call's worst case.
    let next = keel.start_run("hello", Some(KEY_ACME)).await;
    keel.wait_status(&next, "completed", Some(KEY_ACME)).await;
    let (reason, _) = ending(&keel, &next, Some(KEY_ACME)).await;
    assert_eq!(reason, "budget_exhausted");
    assert_eq!(model.request_count(), 2);
}

#[tokio::test]
async fn a_model_without_a_price_is_never_called_under_a_spend_limit() {
    let (model, _tools, keel) =
        serve("", "[[tenants]]\nid = \"acme\"\nspend_usd_per_month = 5\n").await;
    let id = keel.start_run("hello", Some(KEY_ACME)).await;
    let run = keel.wait_status(&id, "failed", Some(KEY_ACME)).await;
    assert_eq!(run["error"]["code"], "unpriced_model", "{run}");
    let message = run["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("fake-model") && message.contains("price"),
        "{message}"
    );
    assert_eq!(model.request_count(), 0);

    // A tenant without a spend limit uses the same model as before.
    let other = keel.start_run("hello", Some(KEY_GLOBEX)).await;
    let run = keel
        .wait_status(&other, "completed", Some(KEY_GLOBEX))
        .await;
    assert_eq!(run["output"], "All done.");
}

#[tokio::test]
async fn an_agent_limit_is_shared_by_every_tenant() {
    let model = FakeOpenAi::start(model()).await;
    let tools = ToolServer::start().await;
    let mut env = env(&model, &tools, PRICE, "");
    env.agent_extra = format!("spend_usd_per_day = 0.012\n{}", env.agent_extra);
    let keel = Keel::start(&env).await;
    let mut runs = Vec::new();
    for key in [KEY_ACME, KEY_GLOBEX] {
        let id = keel.start_run("read every furnace", Some(key)).await;
        keel.wait_status(&id, "completed", Some(key)).await;
        runs.push(ending(&keel, &id, Some(key)).await);
    }
    for (reason, feedback) in &runs {
        assert_eq!(reason, "budget_exhausted");
        assert_eq!(
            feedback,
            &vec!["agent_spend_usd_per_day reached".to_owned()]
        );
    }
    let billed = model.request_count() as u64 * CALL_MICROS;
    assert!(billed <= 12_000, "the provider billed {billed} micro-USD");
    assert_eq!(
        metered(&keel, "acme").await + metered(&keel, "globex").await,
        billed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_together_overspend() {
    const LIMIT_MICROS: u64 = 40_000;
    let db = TestDb::create().await;
    let model = FakeOpenAi::start(model()).await;
    let tools = ToolServer::start().await;
    let nodes = common::two_nodes(&db.url, || {
        let mut env = env(
            &model,
            &tools,
            PRICE,
            "[[tenants]]\nid = \"default\"\nspend_usd_per_day = 0.04\n",
        );
        env.auth = false;
        env
    })
    .await;
    let mut ids = Vec::new();
    let mut refused = 0;
    for (status, body) in start_at_once(&nodes, 16, "read every furnace").await {
        match status {
            201 => ids.push(body["id"].as_str().unwrap().to_owned()),
            429 => {
                assert_eq!(body["quota"]["limit"], "spend_usd_per_day", "{body}");
                refused += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    let mut stopped = 0;
    for id in &ids {
        nodes[0].wait_status(id, "completed", None).await;
        let (reason, feedback) = ending(&nodes[0], id, None).await;
        if feedback == vec!["spend_usd_per_day reached".to_owned()] {
            assert_eq!(reason, "budget_exhausted");
            stopped += 1;
        }
    }
    let billed = model.request_count() as u64 * CALL_MICROS;
    println!(
        "{} runs admitted, {refused} refused, {stopped} stopped by the limit; \
         {} model calls, billed {billed} of {LIMIT_MICROS} micro-USD",
        ids.len(),
        model.request_count()
    );
    assert!(billed <= LIMIT_MICROS, "billed {billed} micro-USD");
    assert!(stopped > 0, "the limit stopped no run");
    // The limit, not anything else, is what ended the spending.
    assert!(billed >= LIMIT_MICROS / 2, "billed only {billed} micro-USD");
    let mut metered_total = 0;
    for node in &nodes {
        metered_total += metered(node, "default").await;
    }
    assert_eq!(metered_total, billed);
}
