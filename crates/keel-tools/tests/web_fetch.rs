//! `web_fetch` against real HTTP servers on this machine's loopback
//! addresses: what it refuses (every address class, a name resolving to a
//! private address, a redirect to any of them, a DNS answer that changes
//! between check and connect) and what it fetches once allowed.
//!
//! Refusals happen before any connection is made, so no test here sends a
//! packet anywhere but 127.0.0.0/8.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use keel_protocol::{Tool, ToolContext, ToolOutput};
use keel_tools::web_fetch::{Resolve, WebFetch, WebFetchSettings};
use serde_json::json;

fn ctx() -> ToolContext {
    ToolContext {
        tenant: "acme".into(),
        principal: "alice".into(),
        agent: "default".into(),
        session: "s".into(),
        run_id: "r".into(),
        call_id: "c".into(),
    }
}

/// A page server on `ip`, counting its hits; `/moved?to=URL` redirects.
async fn serve(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = Router::new()
        .route(
            "/page",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html")],
                    "<html><body><h1>Furnace manual</h1><p>Keep F2 below 1500 &deg;C.</p><script>evil()</script></body></html>",
                )
            }),
        )
        .route("/big", get(|| async { "x".repeat(10_000) }))
        .route(
            "/moved",
            get(|q: axum::extract::Query<std::collections::HashMap<String, String>>| async move {
                let mut headers = HeaderMap::new();
                headers.insert(header::LOCATION, q["to"].parse().unwrap());
                (StatusCode::FOUND, headers)
            }),
        )
        .layer(axum::middleware::from_fn(move |req, next: axum::middleware::Next| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                next.run(req).await.into_response()
            }
        }));
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0"))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, hits)
}

/// Answers from a script, one answer per lookup, and counts lookups.
struct Scripted {
    answers: Mutex<Vec<Vec<SocketAddr>>>,
    lookups: AtomicUsize,
}

#[async_trait::async_trait]
impl Resolve for Scripted {
    async fn resolve(&self, _host: &str, _port: u16) -> std::io::Result<Vec<SocketAddr>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let mut answers = self.answers.lock().unwrap();
        if answers.len() > 1 {
            Ok(answers.remove(0))
        } else {
            Ok(answers[0].clone())
        }
    }
}

fn scripted(answers: Vec<Vec<SocketAddr>>) -> Arc<Scripted> {
    Arc::new(Scripted {
        answers: Mutex::new(answers),
        lookups: AtomicUsize::new(0),
    })
}

fn settings(allow: &[&str]) -> WebFetchSettings {
    WebFetchSettings {
        allow_hosts: allow.iter().map(|s| s.to_string()).collect(),
        timeout: Duration::from_secs(5),
        max_bytes: 4096,
        ..WebFetchSettings::default()
    }
}

async fn fetch(tool: &WebFetch, url: &str) -> ToolOutput {
    tool.call(json!({"url": url}), &ctx()).await.unwrap()
}

fn refused(out: &ToolOutput, why: &str) {
    assert!(out.is_error, "{}", out.content);
    assert!(out.content.contains("refused or failed"), "{}", out.content);
    assert!(
        out.content.contains(why),
        "expected {why:?} in {}",
        out.content
    );
}

#[tokio::test]
async fn loopback_private_link_local_and_metadata_addresses_are_refused() {
    let (addr, hits) = serve("127.0.0.1").await;
    let tool = WebFetch::new(settings(&[]));
    let port = addr.port();
    for (url, why) in [
        (format!("http://127.0.0.1:{port}/page"), "loopback"),
        (format!("http://[::1]:{port}/page"), "loopback"),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "link-local",
        ),
        ("http://10.0.0.1/".to_owned(), "private"),
        ("http://[::ffff:10.0.0.1]/".to_owned(), "non-public"),
        ("http://100.64.0.1/".to_owned(), "non-public"),
        ("file:///etc/passwd".to_owned(), "only http and https"),
    ] {
        refused(&fetch(&tool, &url).await, why);
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing reached the server");
}

#[tokio::test]
async fn a_name_that_resolves_to_a_private_address_is_refused() {
    let resolver = scripted(vec![vec!["10.20.30.40:80".parse().unwrap()]]);
    let tool = WebFetch::with_resolver(settings(&[]), resolver.clone());
    refused(
        &fetch(&tool, "http://intranet.example/wiki").await,
        "resolves to 10.20.30.40, a private address",
    );
    // One address among several is enough to refuse.
    let resolver = scripted(vec![vec![
        "93.184.216.34:80".parse().unwrap(),
        "127.0.0.1:80".parse().unwrap(),
    ]]);
    let tool = WebFetch::with_resolver(settings(&[]), resolver);
    refused(&fetch(&tool, "http://mixed.example/").await, "loopback");
}

#[tokio::test]
async fn an_allowed_local_server_is_fetched_as_text() {
    let (addr, hits) = serve("127.0.0.1").await;
    let tool = WebFetch::new(settings(&["127.0.0.1"]));
    let out = fetch(&tool, &format!("http://127.0.0.1:{}/page", addr.port())).await;
    assert!(!out.is_error, "{}", out.content);
    assert!(out.content.contains("Furnace manual"), "{}", out.content);
    assert!(
        out.content.contains("Keep F2 below 1500 °C."),
        "{}",
        out.content
    );
    assert!(
        !out.content.contains("<p>"),
        "HTML became text: {}",
        out.content
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // Size cap.
    let out = fetch(&tool, &format!("http://127.0.0.1:{}/big", addr.port())).await;
    assert!(out.content.contains("[truncated"), "{}", out.content);
    assert!(out.content.len() < 4200);
    assert!(tool.spec().output_trust == keel_protocol::Trust::Untrusted);
}

#[tokio::test]
async fn every_redirect_hop_is_checked_again() {
    let (allowed, allowed_hits) = serve("127.0.0.1").await;
    let (other, other_hits) = serve("127.0.0.2").await;
    let tool = WebFetch::new(settings(&["127.0.0.1"]));
    let base = format!("http://127.0.0.1:{}", allowed.port());
    for target in [
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        format!("http://[::1]:{}/page", allowed.port()),
        format!("http://127.0.0.2:{}/page", other.port()),
    ] {
        let out = fetch(&tool, &format!("{base}/moved?to={target}")).await;
        assert!(
            out.is_error,
            "redirect to {target} must be refused: {}",
            out.content
        );
    }
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
    // A redirect that stays on the allowed server is followed.
    let out = fetch(&tool, &format!("{base}/moved?to=/page")).await;
    assert!(out.content.contains("Furnace manual"), "{}", out.content);
    assert!(allowed_hits.load(Ordering::SeqCst) >= 5);
}

#[tokio::test]
async fn a_dns_answer_that_changes_after_the_check_is_not_followed() {
    // docs.test is allowed and first resolves to the real docs server; the
    // next answer points elsewhere. The connection must go to the address
    // that was checked, and the name is resolved once.
    let (docs, docs_hits) = serve("127.0.0.1").await;
    let (elsewhere, elsewhere_hits) = serve("127.0.0.2").await;
    let resolver = scripted(vec![
        vec![SocketAddr::new(docs.ip(), docs.port())],
        vec![SocketAddr::new(elsewhere.ip(), docs.port())],
    ]);
    let tool = WebFetch::with_resolver(settings(&["docs.test"]), resolver.clone());
    let out = fetch(&tool, &format!("http://docs.test:{}/page", docs.port())).await;
    assert!(out.content.contains("Furnace manual"), "{}", out.content);
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 1);
    assert_eq!(docs_hits.load(Ordering::SeqCst), 1);
    assert_eq!(elsewhere_hits.load(Ordering::SeqCst), 0);
    let _ = elsewhere;
}
