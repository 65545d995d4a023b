#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real embedders: the local all-MiniLM-L6-v2 model (installed by
//! `scripts/setup-embedder.sh`), hub-style download against a local
//! server, and the OpenAI-compatible client against a local endpoint.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::extract::Path as UrlPath;
use axum::http::StatusCode;
use axum::routing::{get, post};
use chrono::Utc;
use keel_memory::embed::{MODEL_FILES, download_model, resolve_local};
use keel_memory::{Embedder, LocalEmbedder, MemoryDocument, OpenAiEmbedder, Settings};
use serde_json::{Value, json};

/// Where the setup script installs the model (or `KEEL_MODEL_DIR`).
fn model_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_MODEL_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/keel-models/all-MiniLM-L6-v2")
        },
        PathBuf::from,
    );
    assert!(
        MODEL_FILES.iter().all(|f| dir.join(f).is_file()),
        "the local embedding model is missing from {}: run scripts/setup-embedder.sh first",
        dir.display()
    );
    dir
}

fn load_model() -> LocalEmbedder {
    LocalEmbedder::load(&model_dir()).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test]
async fn local_model_gives_unit_vectors_that_follow_meaning() {
    let model = load_model();
    assert_eq!(model.dim(), 384);
    assert_eq!(model.name(), "local/all-MiniLM-L6-v2");
    let texts: Vec<String> = [
        "The cat sits on the mat.",
        "A kitten is resting on the rug.",
        "Quarterly revenue grew by eight percent.",
    ]
    .map(String::from)
    .to_vec();
    let v = model.embed(&texts).await.unwrap();
    assert_eq!(v.len(), 3);
    for x in &v {
        assert_eq!(x.len(), 384);
        assert!((cosine(x, x) - 1.0).abs() < 1e-4);
    }
    assert!(cosine(&v[0], &v[1]) > cosine(&v[0], &v[2]) + 0.3);
    // Batching and padding do not change a text's vector.
    let alone = model.embed(&texts[..1]).await.unwrap();
    assert!(cosine(&alone[0], &v[0]) > 0.999);
}

/// The acceptance test: a query sharing no word with the stored fact ranks
/// that fact first, with real embeddings, through the full hybrid search.
#[tokio::test]
async fn paraphrase_query_finds_the_fact_first() {
    let dir = tempfile::tempdir().unwrap();
    let embedder: Arc<dyn Embedder> = Arc::new(load_model());
    let memory = keel_memory::open_with("", dir.path(), Some(embedder), Settings::default(), None)
        .await
        .unwrap();
    let facts = [
        (
            "fact",
            "Invoices must be approved by Maria before payment is released.",
        ),
        (
            "d1",
            "The cafeteria serves vegetarian lasagna every Thursday.",
        ),
        (
            "d2",
            "Furnace F2 was restarted after the maintenance window.",
        ),
        (
            "d3",
            "Parking spaces near building C are reserved for visitors.",
        ),
        (
            "d4",
            "The quarterly safety drill is scheduled for next month.",
        ),
        ("d5", "Password resets are handled by the IT help desk."),
    ];
    for (source, text) in facts {
        memory
            .add_document(MemoryDocument {
                tenant: "acme".into(),
                agent: "ops".into(),
                source: format!("note:{source}"),
                title: source.into(),
                text: text.into(),
                created_at: Utc::now(),
            })
            .await
            .unwrap();
    }
    let query = "who signs off on bills so money can go out?";
    let fact = facts[0].1.to_lowercase();
    for word in query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        assert!(
            !fact
                .split(|c: char| !c.is_alphanumeric())
                .any(|f| f == word),
            "the query shares {word:?} with the fact"
        );
    }
    let hits = memory.search("acme", "ops", query, 3).await.unwrap();
    assert_eq!(hits[0].source, "note:fact", "{hits:#?}");
    // Another tenant still sees nothing.
    assert!(
        memory
            .search("globex", "ops", query, 3)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A tiny hub: serves the files of `dir` at `/<org>/<repo>/resolve/main/<file>`.
async fn serve_hub(dir: PathBuf) -> String {
    let app = axum::Router::new().route(
        "/{org}/{repo}/resolve/{rev}/{file}",
        get(
            move |UrlPath((_, _, _, file)): UrlPath<(String, String, String, String)>| {
                let dir = dir.clone();
                async move {
                    match tokio::fs::read(dir.join(&file)).await {
                        Ok(bytes) => Ok(bytes),
                        Err(_) => Err(StatusCode::NOT_FOUND),
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn hub_download_fetches_the_model_files_and_they_load() {
    let source = model_dir();
    let endpoint = serve_hub(source).await;
    let target = tempfile::tempdir().unwrap();
    let dir = target.path().join("all-MiniLM-L6-v2");
    let got = download_model(
        "sentence-transformers/all-MiniLM-L6-v2",
        "main",
        &dir,
        Some(&endpoint),
    )
    .await
    .unwrap();
    assert_eq!(got, dir);
    for f in MODEL_FILES {
        assert!(dir.join(f).is_file(), "{f} missing");
        assert!(!dir.join(format!("{f}.partial")).exists());
    }
    let model = LocalEmbedder::load(&dir).unwrap();
    assert_eq!(model.dim(), 384);
}

#[tokio::test]
async fn unreachable_hub_fails_clearly() {
    let target = tempfile::tempdir().unwrap();
    let err = download_model(
        "org/missing",
        "main",
        target.path(),
        Some("http://127.0.0.1:9"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("127.0.0.1:9") && err.contains("config.json"),
        "{err}"
    );
    // A configured model dir that lacks files names the setup script.
    let err = resolve_local(Some(target.path()), target.path())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("scripts/setup-embedder.sh"), "{err}");
}

#[tokio::test]
async fn a_configured_model_dir_is_used() {
    let data = tempfile::tempdir().unwrap();
    let model = resolve_local(Some(&model_dir()), Path::new(data.path()))
        .await
        .unwrap();
    assert_eq!(model.dim(), 384);
}

/// A local OpenAI-compatible `/v1/embeddings`: vector = [len, vowels, 1],
/// returned out of order to check that `index` is honoured.
async fn serve_embeddings() -> String {
    let app = axum::Router::new().route(
        "/v1/embeddings",
        post(
            |headers: axum::http::HeaderMap, Json(body): Json<Value>| async move {
                if headers.get("authorization").and_then(|v| v.to_str().ok())
                    != Some("Bearer sk-test")
                {
                    return Err(StatusCode::UNAUTHORIZED);
                }
                let inputs = body["input"].as_array().cloned().unwrap_or_default();
                let mut data: Vec<Value> = inputs
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let t = t.as_str().unwrap_or("");
                        let vowels = t.chars().filter(|c| "aeiou".contains(*c)).count();
                        json!({"index": i, "embedding": [t.len() as f32, vowels as f32, 1.0]})
                    })
                    .collect();
                data.reverse();
                Ok(Json(json!({"data": data, "model": body["model"]})))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn openai_compatible_endpoint() {
    let base = serve_embeddings().await;
    let e = OpenAiEmbedder::connect(&base, "emb-small", Some("sk-test".into()))
        .await
        .unwrap();
    assert_eq!(e.dim(), 3);
    assert_eq!(e.name(), "openai/emb-small");
    let v = e.embed(&["aaaa".into(), "b".into()]).await.unwrap();
    // Normalized, and in input order despite the reversed response.
    let expected = [4.0_f32, 4.0, 1.0];
    let n = expected.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((v[0][0] - 4.0 / n).abs() < 1e-6, "{v:?}");
    assert!((v[1][1]).abs() < 1e-6);
    // A wrong key fails at connect, with the status.
    let err = OpenAiEmbedder::connect(&base, "emb-small", Some("wrong".into()))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("401"), "{err}");
}
