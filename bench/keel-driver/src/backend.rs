//! The `lookup` tool's backend: keel calls tools over HTTP, so the tool the
//! in-process peers implement as a function is served here, on 127.0.0.1:0.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// Same bytes as `bench_common.py:lookup_payload`: Python's compact
/// `json.dumps` keeps insertion order, so the object is written by hand
/// rather than through a (key-sorting) `serde_json::Map`.
pub fn lookup_payload(key: &str) -> String {
    let key = serde_json::Value::String(key.to_owned()).to_string();
    let value = "x".repeat(160);
    format!(r#"{{"key":{key},"value":"{value}","source":"bench"}}"#)
}

/// Counts requests so the driver can check that keel really called the tool.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

async fn lookup(
    State(count): State<Counter>,
    Query(q): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    count.0.fetch_add(1, Ordering::Relaxed);
    let key = q.get("key").map(String::as_str).unwrap_or("");
    (
        [(header::CONTENT_TYPE, "application/json")],
        lookup_payload(key),
    )
}

/// Binds 127.0.0.1:0 and serves in the background; returns the address.
pub async fn start() -> std::io::Result<(SocketAddr, Counter)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let count = Counter::default();
    let app = Router::new()
        .route("/lookup", get(lookup))
        .with_state(count.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("keel-driver: lookup backend stopped: {e}");
        }
    });
    Ok((addr, count))
}

#[cfg(test)]
mod tests {
    use super::lookup_payload;

    #[test]
    fn payload_matches_python() {
        // python3 -c 'import json; print(json.dumps({"key":"k3","value":"x"*160,"source":"bench"},separators=(",",":")))'
        let want = format!(
            "{{\"key\":\"k3\",\"value\":\"{}\",\"source\":\"bench\"}}",
            "x".repeat(160)
        );
        assert_eq!(lookup_payload("k3"), want);
        assert_eq!(lookup_payload("k3").len(), 200);
    }
}
