//! The OpenAPI document: valid OpenAPI 3.1, listing exactly the routes the
//! router serves, each with the security it really has, and answers that
//! match the schemas it documents.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use keel_protocol::Principal;
use keel_server::{AppState, Auth};
use keel_test_support::harness::TestRuntime;
use keel_test_support::scripted::{ScriptedModel, Step};
use serde_json::{Value, json};
use tower::ServiceExt;

const KEY: &str = "test-key";

/// Every route of the API. A route added without `#[utoipa::path]` cannot
/// be registered at all (see `routes::api`); this list makes adding or
/// dropping one a visible change of the API.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/console/{file}"),
    ("GET", "/ai/approvals"),
    ("GET", "/ai/approvals/{id}"),
    ("POST", "/ai/approvals/{id}"),
    ("POST", "/ai/channels/{channel_id}/webhook"),
    ("POST", "/ai/memory/documents"),
    ("GET", "/ai/memory/search"),
    ("GET", "/ai/runs"),
    ("POST", "/ai/runs"),
    ("GET", "/ai/runs/{id}"),
    ("POST", "/ai/runs/{id}/cancel"),
    ("GET", "/ai/runs/{id}/events"),
    ("POST", "/ai/runs/{id}/follow_up"),
    ("POST", "/ai/runs/{id}/input"),
    ("POST", "/ai/runs/{id}/restore"),
    ("POST", "/ai/runs/{id}/steer"),
    ("GET", "/ai/sessions/{key}"),
    ("POST", "/ai/sessions/{key}/reset"),
    ("GET", "/ai/tools"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/readyz"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{id}"),
];

/// Routes anyone may call, keys or not.
const OPEN: &[&str] = &[
    "/",
    "/console/{file}",
    "/ai/channels/{channel_id}/webhook",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
];

fn document() -> Value {
    serde_json::to_value(keel_server::openapi()).unwrap()
}

/// `(METHOD, path)` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.insert((method.to_uppercase(), path.clone()));
        }
    }
    ops
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    let doc = document();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        doc["openapi"]
    );
    let meta: Value = serde_json::from_str(include_str!("data/openapi-3.1.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&meta).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    // Every reference names a schema the document defines.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected reference {r}"));
        assert!(schemas.contains_key(name), "{r} is not defined");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        json!({"type": "http", "scheme": "bearer", "description": "An API key configured under `[[auth.keys]]`."})
    );
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get("$ref") {
                out.push(r.clone());
            }
            o.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

#[test]
fn the_document_lists_every_route() {
    let doc = document();
    // Client generators name their methods after these.
    let mut ids = BTreeSet::new();
    for (method, path) in operations(&doc) {
        let id = doc["paths"][&path][method.to_lowercase()]["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path} has no operationId"))
            .to_owned();
        assert!(ids.insert(id.clone()), "operationId {id} is used twice");
    }
    let documented = operations(&doc);
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(documented, expected);
}

/// Only `routes!` registers a route: it documents it in the same call.
#[test]
fn routes_are_only_registered_with_their_documentation() {
    let sources = [
        ("src/routes/mod.rs", include_str!("../src/routes/mod.rs")),
        ("src/lib.rs", include_str!("../src/lib.rs")),
    ];
    for (file, text) in sources {
        // Comments may name the calls; code may not.
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        let code = code.join("\n");
        for call in [
            ".route(",
            ".route_service(",
            ".nest(",
            ".nest_service(",
            ".merge(",
        ] {
            assert!(
                !code.contains(call),
                "{file} calls `{call}`: register routes with `.routes(routes!(handler))` so that \
                 /openapi.json documents them"
            );
        }
    }
}

async fn state() -> (AppState, TestRuntime) {
    let rt = TestRuntime::builder(ScriptedModel::new(Vec::<Step>::new()))
        .build()
        .await;
    let principal = Principal {
        tenant: "acme".into(),
        id: "alice".into(),
        roles: vec![],
    };
    let state = AppState {
        runtime: rt.runtime().clone(),
        auth: Arc::new(Auth::with_keys([(KEY.to_owned(), principal)])),
        max_body_bytes: 1 << 20,
        metrics: keel_server::metrics::handle(),
        memory: None,
        gateway: None,
    };
    (state, rt)
}

async fn send(
    state: &AppState,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(path);
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let body = if method == "POST" {
        req = req.header(header::CONTENT_TYPE, "application/json");
        Body::from("{}")
    } else {
        Body::empty()
    };
    let resp = keel_server::router(state.clone())
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, body)
}

/// Every documented operation is served, and needs a key exactly when the
/// document says so.
#[tokio::test]
async fn every_documented_operation_is_served_with_its_security() {
    let (state, _rt) = state().await;
    let doc = document();
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let open = op["security"] == json!([{}]);
        assert_eq!(
            open,
            OPEN.contains(&path.as_str()),
            "{method} {path}: security"
        );
        // A path parameter is its own name, except where only fixed values exist.
        let concrete = match path.as_str() {
            "/console/{file}" => "/console/app.js".to_owned(),
            other => other.replace(['{', '}'], ""),
        };
        let (status, body) = send(&state, &method, &concrete, None).await;
        if path == "/ai/channels/{channel_id}/webhook" {
            // Open to any caller, but this server has no channels.
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
        } else if open {
            assert_eq!(status, StatusCode::OK, "{method} {path}: {body}");
        } else {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
            let code = op["responses"]["401"]["content"]["application/json"]["schema"].clone();
            assert_ne!(
                code,
                Value::Null,
                "{method} {path} does not document its 401"
            );
            check(&doc, &code, &body, &format!("{method} {path} 401"));
        }
    }
    // Anything else is the API's own 404.
    let (status, body) = send(&state, "GET", "/ai/nothing", Some(KEY)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
}

/// Validates `body` against `schema` (which may refer to the document's
/// components).
fn check(doc: &Value, schema: &Value, body: &Value, what: &str) {
    let mut root = schema.as_object().cloned().unwrap_or_default();
    root.insert("components".into(), doc["components"].clone());
    let validator = jsonschema::validator_for(&Value::Object(root)).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: {body}\n{errors:#?}");
}

fn response_schema(doc: &Value, method: &str, path: &str, status: u16) -> Value {
    let schema =
        doc["paths"][path][method]["responses"][status.to_string()]["content"]["application/json"]
            ["schema"]
            .clone();
    assert_ne!(
        schema,
        Value::Null,
        "{method} {path} documents no JSON {status}"
    );
    schema
}

/// Answers of the JSON routes match what the document says they return.
#[tokio::test]
async fn answers_match_their_documented_schemas() {
    let (state, _rt) = state().await;
    let doc = document();
    let cases = [
        ("get", "/healthz", "/healthz", 200),
        ("get", "/readyz", "/readyz", 200),
        ("get", "/ai/runs", "/ai/runs", 200),
        ("get", "/ai/runs", "/ai/runs?limit=0", 400),
        ("get", "/ai/runs", "/ai/runs?status=nope", 400),
        // axum's own rejections (a repeated key, a path that is not UTF-8)
        // are answered in the API's JSON too.
        ("get", "/ai/runs", "/ai/runs?limit=1&limit=2", 400),
        ("get", "/ai/runs/{id}", "/ai/runs/%FF", 400),
        ("get", "/v1/models/{id}", "/v1/models/%FF", 400),
        ("get", "/ai/runs/{id}", "/ai/runs/run_nope", 404),
        ("get", "/ai/approvals", "/ai/approvals?status=pending", 200),
        ("get", "/ai/approvals/{id}", "/ai/approvals/apr_nope", 404),
        ("get", "/ai/tools", "/ai/tools", 200),
        ("get", "/ai/sessions/{key}", "/ai/sessions/nope", 404),
        ("get", "/ai/memory/search", "/ai/memory/search?q=x", 503),
        ("get", "/v1/models", "/v1/models", 200),
        ("get", "/v1/models/{id}", "/v1/models/default", 200),
        ("get", "/v1/models/{id}", "/v1/models/nope", 404),
        ("post", "/ai/runs", "/ai/runs", 400),
        ("post", "/v1/responses", "/v1/responses", 400),
    ];
    for (method, documented, uri, status) in cases {
        let (got, body) = send(&state, &method.to_uppercase(), uri, Some(KEY)).await;
        assert_eq!(got.as_u16(), status, "{method} {uri}: {body}");
        let schema = response_schema(&doc, method, documented, status);
        check(&doc, &schema, &body, &format!("{method} {uri}"));
    }
    let (got, body) = send(&state, "GET", "/openapi.json", None).await;
    assert_eq!(got, StatusCode::OK);
    assert_eq!(body, doc);
}

/// A run's record, the list it appears in and its event log (each event
/// against the `Event` schema the stream's frames carry).
#[tokio::test]
async fn runs_and_events_match_their_schemas() {
    let (state, rt) = state().await;
    let doc = document();
    let req = Request::post("/ai/runs")
        .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            json!({"input": "hi", "metadata": {"a": 1}}).to_string(),
        ))
        .unwrap();
    let resp = keel_server::router(state.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
        .await
        .unwrap();
    let run: Value = serde_json::from_slice(&bytes).unwrap();
    check(
        &doc,
        &response_schema(&doc, "post", "/ai/runs", 201),
        &run,
        "POST /ai/runs",
    );
    let id = run["id"].as_str().unwrap().to_owned();
    // The scripted model has no reply: the run fails, which ends its log.
    let (_, stopped) = loop {
        let (status, body) = send(&state, "GET", &format!("/ai/runs/{id}"), Some(KEY)).await;
        assert_eq!(status, StatusCode::OK);
        if body["status"] == "failed" {
            break (status, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    check(
        &doc,
        &response_schema(&doc, "get", "/ai/runs/{id}", 200),
        &stopped,
        "GET run",
    );
    let (_, list) = send(&state, "GET", "/ai/runs?limit=1", Some(KEY)).await;
    check(
        &doc,
        &response_schema(&doc, "get", "/ai/runs", 200),
        &list,
        "GET /ai/runs",
    );
    let event = json!({"$ref": "#/components/schemas/Event"});
    let events = rt
        .runtime()
        .store()
        .events_after(&id, 0, 1000)
        .await
        .unwrap();
    assert!(events.len() >= 2, "{events:?}");
    let last = events.last().unwrap().seq;
    for e in events {
        check(
            &doc,
            &event,
            &serde_json::to_value(&e).unwrap(),
            e.type_name(),
        );
    }

    // The stream of the ended run: everything, then closed; after its last
    // event, empty and closed at once (it used to idle on heartbeats
    // forever); past its last event, a 400.
    let stream = |after: u64| {
        let state = state.clone();
        let id = id.clone();
        async move {
            let req = Request::get(format!("/ai/runs/{id}/events?after={after}"))
                .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
                .body(Body::empty())
                .unwrap();
            let resp = keel_server::router(state).oneshot(req).await.unwrap();
            let status = resp.status();
            let kind = resp.headers()[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .to_owned();
            let body = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                axum::body::to_bytes(resp.into_body(), 1 << 24),
            )
            .await
            .expect("the stream of an ended run closes")
            .unwrap();
            (status, kind, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let (status, kind, body) = stream(0).await;
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::OK, "text/event-stream")
    );
    assert_eq!(body.matches("data: ").count() as u64, last, "{body}");
    let (status, kind, body) = stream(last).await;
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::OK, "text/event-stream")
    );
    assert_eq!(body, "");
    let (status, _, body) = stream(last + 1).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// A run refused by a tenant quota: 429 with `Retry-After`, in the shape
/// documented for both run-starting routes.
#[tokio::test]
async fn quota_refusals_match_their_documented_schemas() {
    let rt = TestRuntime::builder(ScriptedModel::new(Vec::<Step>::new()))
        .config_toml("[[tenants]]\nid = \"acme\"\ntokens_per_day = 5\n")
        .build()
        .await;
    // The day's tokens are already spent.
    let key = keel_protocol::QuotaKey::at(
        "acme",
        keel_protocol::QuotaLimit::TokensPerDay,
        keel_protocol::now(),
    );
    rt.runtime()
        .store()
        .quota_take(&key, 10, u64::MAX)
        .await
        .unwrap();
    let principal = Principal {
        tenant: "acme".into(),
        id: "alice".into(),
        roles: vec![],
    };
    let state = AppState {
        runtime: rt.runtime().clone(),
        auth: Arc::new(Auth::with_keys([(KEY.to_owned(), principal)])),
        max_body_bytes: 1 << 20,
        metrics: keel_server::metrics::handle(),
        memory: None,
        gateway: None,
    };
    let doc = document();
    for (path, body) in [
        ("/ai/runs", json!({"input": "hi"})),
        ("/v1/responses", json!({"model": "default", "input": "hi"})),
    ] {
        let req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = keel_server::router(state.clone())
            .oneshot(req)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        let retry_after: u64 = resp.headers()[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=86_400).contains(&retry_after), "{retry_after}");
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            doc["paths"][path]["post"]["responses"]["429"]["headers"]["Retry-After"]["schema"]["type"],
            "integer",
            "{path} documents Retry-After"
        );
        let schema = response_schema(&doc, "post", path, 429);
        check(&doc, &schema, &body, &format!("POST {path}"));
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("tokens_per_day = 5"),
            "{body}"
        );
    }
}
