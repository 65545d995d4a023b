#![allow(clippy::unwrap_used, clippy::expect_used)]
//! HTTP tools against a real axum server on 127.0.0.1.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use keel_config::HttpToolConfig;
use keel_protocol::{Risk, Tool, ToolContext, ToolError, ToolSource};
use keel_tools::ToolsError;
use keel_tools::http::{HttpTool, MAX_RESPONSE_BYTES};
use serde_json::{Value, json};

async fn serve() -> SocketAddr {
    let app = Router::new()
        .route(
            "/furnaces/{id}",
            get(
                |Path(id): Path<String>, Query(q): Query<BTreeMap<String, String>>| async move {
                    Json(json!({"id": id, "query": q}))
                },
            ),
        )
        .route(
            "/furnaces/{id}/setpoint",
            post(
                |Path(id): Path<String>, headers: HeaderMap, Json(body): Json<Value>| async move {
                    let ct = headers
                        .get("content-type")
                        .map(|v| v.to_str().unwrap().to_owned());
                    Json(json!({"id": id, "body": body, "content_type": ct}))
                },
            ),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such furnace") }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route(
            "/headers",
            get(|headers: HeaderMap| async move {
                Json(json!({
                    "authorization": headers.get("authorization").map(|v| v.to_str().unwrap().to_owned()),
                    "x-plant": headers.get("x-plant").map(|v| v.to_str().unwrap().to_owned()),
                }))
            }),
        )
        .route("/big", get(|| async { "x".repeat(2 * 1024 * 1024) }))
        .route("/text", get(|| async { "plain words" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn config(v: Value) -> HttpToolConfig {
    serde_json::from_value(v).unwrap()
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn ctx() -> ToolContext {
    ToolContext {
        tenant: "acme".into(),
        principal: "alice".into(),
        agent: "default".into(),
        session: "ses_1".into(),
        run_id: "run_1".into(),
        call_id: "call_1".into(),
    }
}

fn furnace_status(addr: SocketAddr) -> HttpToolConfig {
    config(json!({
        "name": "furnace_status",
        "description": "Current status of one furnace",
        "url": format!("http://{addr}/furnaces/{{furnace_id}}"),
        "parameters": {
            "type": "object",
            "properties": {
                "furnace_id": {"type": "string"},
                "detail": {"type": "string"},
                "limit": {"type": "integer"}
            },
            "required": ["furnace_id"]
        }
    }))
}

#[tokio::test]
async fn spec_comes_from_config_with_defaults() {
    let addr = serve().await;
    let tool = HttpTool::from_config(&furnace_status(addr), no_env).unwrap();
    let spec = tool.spec();
    assert_eq!(spec.name, "furnace_status");
    assert_eq!(spec.source, ToolSource::Http);
    assert_eq!(spec.risk, Risk::Read);
    assert_eq!(spec.timeout, Duration::from_secs(30));
    assert_eq!(spec.parameters["additionalProperties"], json!(false));
    assert_eq!(spec.required_params(), vec!["furnace_id".to_string()]);
}

#[tokio::test]
async fn get_fills_path_param_and_sends_rest_as_query() {
    let addr = serve().await;
    let tool = HttpTool::from_config(&furnace_status(addr), no_env).unwrap();
    let out = tool
        .call(
            json!({"furnace_id": "F 2/b", "detail": "full", "limit": 3}),
            &ctx(),
        )
        .await
        .unwrap();
    assert!(!out.is_error, "{out:?}");
    let structured = out.structured.expect("JSON response is parsed");
    assert_eq!(
        structured["id"], "F 2/b",
        "path param is one encoded segment"
    );
    assert_eq!(structured["query"], json!({"detail": "full", "limit": "3"}));
    assert_eq!(
        serde_json::from_str::<Value>(&out.content).unwrap(),
        structured
    );
}

#[tokio::test]
async fn post_sends_remaining_arguments_as_json_body() {
    let addr = serve().await;
    let cfg = config(json!({
        "name": "set_setpoint",
        "description": "Set a furnace setpoint",
        "method": "POST",
        "url": format!("http://{addr}/furnaces/{{furnace_id}}/setpoint"),
        "parameters": {
            "type": "object",
            "properties": {"furnace_id": {"type": "string"}, "celsius": {"type": "number"}, "note": {"type": "string"}}
        },
        "risk": "write",
        "timeout_s": 7
    }));
    let tool = HttpTool::from_config(&cfg, no_env).unwrap();
    assert_eq!(tool.spec().risk, Risk::Write);
    assert_eq!(tool.spec().timeout, Duration::from_secs(7));
    let out = tool
        .call(
            json!({"furnace_id": "F1", "celsius": 1450.5, "note": "ramp"}),
            &ctx(),
        )
        .await
        .unwrap();
    let s = out.structured.unwrap();
    assert_eq!(s["id"], "F1");
    assert_eq!(s["body"], json!({"celsius": 1450.5, "note": "ramp"}));
    assert_eq!(s["content_type"], "application/json");
}

#[tokio::test]
async fn non_2xx_is_a_model_visible_error_result() {
    let addr = serve().await;
    let cfg = config(json!({
        "name": "missing", "description": "d", "url": format!("http://{addr}/missing")
    }));
    let tool = HttpTool::from_config(&cfg, no_env).unwrap();
    let out = tool.call(json!({}), &ctx()).await.unwrap();
    assert!(out.is_error);
    assert!(out.content.contains("404"), "{}", out.content);
    assert!(out.content.contains("no such furnace"), "{}", out.content);
}

#[tokio::test]
async fn slow_endpoint_times_out() {
    let addr = serve().await;
    let cfg = config(json!({
        "name": "slow", "description": "d", "url": format!("http://{addr}/slow"), "timeout_s": 1
    }));
    let tool = HttpTool::from_config(&cfg, no_env).unwrap();
    let started = Instant::now();
    let err = tool.call(json!({}), &ctx()).await.unwrap_err();
    assert!(
        matches!(err, ToolError::Timeout(d) if d == Duration::from_secs(1)),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn header_values_expand_env_references() {
    let addr = serve().await;
    let cfg = config(json!({
        "name": "headers", "description": "d", "url": format!("http://{addr}/headers"),
        "headers": {"Authorization": "Bearer ${PLANT_TOKEN}", "X-Plant": "north"}
    }));
    let env = |name: &str| (name == "PLANT_TOKEN").then(|| "s3cret".to_string());
    let tool = HttpTool::from_config(&cfg, env).unwrap();
    let out = tool.call(json!({}), &ctx()).await.unwrap();
    let s = out.structured.unwrap();
    assert_eq!(s["authorization"], "Bearer s3cret");
    assert_eq!(s["x-plant"], "north");
}

#[tokio::test]
async fn missing_header_variable_is_a_construction_error() {
    let cfg = config(json!({
        "name": "headers", "description": "d", "url": "http://127.0.0.1:9/h",
        "headers": {"Authorization": "Bearer ${PLANT_TOKEN}"}
    }));
    let err = HttpTool::from_config(&cfg, no_env).unwrap_err();
    assert_eq!(
        err,
        ToolsError::HeaderEnv {
            tool: "headers".into(),
            header: "Authorization".into(),
            var: "PLANT_TOKEN".into()
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("Authorization") && msg.contains("PLANT_TOKEN"),
        "{msg}"
    );
}

#[tokio::test]
async fn large_bodies_are_capped_with_a_note() {
    let addr = serve().await;
    let cfg =
        config(json!({"name": "big", "description": "d", "url": format!("http://{addr}/big")}));
    let tool = HttpTool::from_config(&cfg, no_env).unwrap();
    let out = tool.call(json!({}), &ctx()).await.unwrap();
    assert!(!out.is_error);
    assert!(out.content.starts_with("xxx"));
    assert!(
        out.content
            .ends_with("[response truncated at 1048576 bytes]"),
        "{}",
        &out.content[out.content.len() - 60..]
    );
    assert!(out.content.len() < MAX_RESPONSE_BYTES + 100);
    assert!(out.structured.is_none());
}

#[tokio::test]
async fn plain_text_has_no_structured_form() {
    let addr = serve().await;
    let cfg =
        config(json!({"name": "text", "description": "d", "url": format!("http://{addr}/text")}));
    let tool = HttpTool::from_config(&cfg, no_env).unwrap();
    let out = tool.call(json!({}), &ctx()).await.unwrap();
    assert_eq!(out.content, "plain words");
    assert!(out.structured.is_none());
}

#[tokio::test]
async fn refused_connection_is_a_tool_error() {
    // Bind then drop to get a port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = config(
        json!({"name": "gone", "description": "d", "url": format!("http://127.0.0.1:{port}/x")}),
    );
    let tool = HttpTool::from_config(&cfg, no_env).unwrap();
    let err = tool.call(json!({}), &ctx()).await.unwrap_err();
    assert!(matches!(err, ToolError::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn bad_configuration_is_rejected() {
    let bad = [
        json!({"name": "t", "description": "d", "url": "http://127.0.0.1:9/{nope}"}),
        json!({"name": "t", "description": "d", "url": "not a url"}),
        json!({"name": "t", "description": "d", "url": "http://127.0.0.1:9/", "method": "TRACE"}),
        json!({"name": "t", "description": "d", "url": "http://127.0.0.1:9/", "parameters": {"type": "bogus"}}),
    ];
    for cfg in bad {
        assert!(
            HttpTool::from_config(&config(cfg.clone()), no_env).is_err(),
            "{cfg}"
        );
    }
}

/// A server that takes 400 ms per request and records the most it was
/// answering at once.
async fn serve_counting() -> (SocketAddr, Arc<AtomicUsize>) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let seen = most.clone();
    let app = Router::new().route(
        "/busy",
        get(move || {
            let (in_flight, most) = (in_flight.clone(), most.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(400)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Json(json!({"ok": true}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

#[tokio::test]
async fn calls_past_the_limit_wait_their_turn_outside_their_timeout() {
    let (addr, most) = serve_counting().await;
    // Six calls two at a time end after 1.2 s, past the 1 s timeout, which
    // must only count from each call's sending.
    let tool = HttpTool::from_config(
        &config(json!({
            "name": "busy", "description": "d", "url": format!("http://{addr}/busy"),
            "timeout_s": 1, "max_concurrent_calls": 2
        })),
        no_env,
    )
    .unwrap();
    let ctx = ctx();
    // As the run loop calls a tool: a place first, then the timed call.
    let calls = (0..6).map(|_| async {
        let _place = tool.place().await;
        tool.call(json!({}), &ctx).await
    });
    for result in futures::future::join_all(calls).await {
        assert_eq!(result.unwrap().structured, Some(json!({"ok": true})));
    }
    assert_eq!(most.load(Ordering::SeqCst), 2);
}
