#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Memory benchmarks: hybrid search latency over 100,000 chunks,
//! index size per chunk, and the local model's embedding throughput.
//!
//! The index part uses synthetic text (words drawn from a fixed 5,000-word
//! vocabulary, 64-token chunks) and random-but-fixed 384-dimension unit
//! vectors (seeded by the chunk's text), the dimension of all-MiniLM-L6-v2:
//! the search cost depends on the count and dimension of vectors, not on
//! what they mean. Query vectors are made the same way, so the query
//! embedding itself costs nothing here; the searches are then timed again
//! with each query embedded by the real local model (when installed), as
//! keel runs them, and the throughput bench measures that model on chunks.
//!
//! `KEEL_BENCH_CHUNKS` overrides the chunk count (default 100000).
//!
//! Besides criterion's own report, `search` prints (to stderr) p50/p99 over
//! 600 searches, the on-disk index size per chunk, how much the process
//! grew when the first search loaded the scope's vectors, p50/p99 with real
//! query embeddings, and the latency of a search right after a write to
//! the same scope.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keel_memory::{EmbedError, Embedder, LocalEmbedder, Memory, MemoryDocument, Settings};

const DIM: usize = 384;
const CHUNK_TOKENS: usize = 64;
const CHUNKS_PER_DOC: usize = 100;

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random unit vectors, fixed per text.
struct FixedEmbedder;

#[async_trait]
impl Embedder for FixedEmbedder {
    fn name(&self) -> &str {
        "bench/fixed-random-384"
    }

    fn dim(&self) -> usize {
        DIM
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts
            .iter()
            .map(|t| {
                let seed = t.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
                });
                let mut rng = SplitMix(seed);
                let v: Vec<f32> = (0..DIM).map(|_| rng.unit()).collect();
                let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.into_iter().map(|x| x / n).collect()
            })
            .collect())
    }
}

/// The local model embedding each query, under the fixed vectors' name:
/// the vectors it is compared with are random, so the ranking means
/// nothing, but the time is a real search's (the query's embedding, then
/// the search).
struct RealQueries(Arc<LocalEmbedder>);

#[async_trait]
impl Embedder for RealQueries {
    fn name(&self) -> &str {
        FixedEmbedder.name()
    }

    fn dim(&self) -> usize {
        DIM
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.0.embed(texts).await
    }
}

fn model_dir() -> std::path::PathBuf {
    std::env::var_os("KEEL_MODEL_DIR").map_or_else(
        || {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap())
                .join(".cache/keel-models/all-MiniLM-L6-v2")
        },
        std::path::PathBuf::from,
    )
}

fn vocabulary() -> Vec<String> {
    let syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "zu"];
    let mut rng = SplitMix(7);
    (0..5000)
        .map(|i| {
            let n = 2 + (rng.next() % 3) as usize;
            let mut w: String = (0..n)
                .map(|_| syllables[(rng.next() % 10) as usize])
                .collect();
            w.push_str(&(i % 97).to_string());
            w
        })
        .collect()
}

/// A document of `CHUNKS_PER_DOC` chunks; word frequencies are skewed
/// (Zipf-like) as in real text.
fn document(vocab: &[String], rng: &mut SplitMix) -> String {
    let words = CHUNK_TOKENS * CHUNKS_PER_DOC;
    let mut text = String::with_capacity(words * 8);
    for i in 0..words {
        let r = (rng.next() % 1_000_000) as f64 / 1_000_000.0;
        let idx = ((vocab.len() as f64).powf(r) as usize).min(vocab.len() - 1);
        text.push_str(&vocab[idx]);
        text.push(if i % 12 == 11 { '\n' } else { ' ' });
    }
    text
}

/// Chunks of `CHUNK_TOKENS`, no overlap: the bench's chunk count is exact.
fn settings() -> Settings {
    Settings {
        chunk_tokens: CHUNK_TOKENS,
        chunk_overlap: 0,
        ..Settings::default()
    }
}

fn build(rt: &tokio::runtime::Runtime, dir: &std::path::Path, chunks: usize) -> Arc<dyn Memory> {
    let settings = settings();
    let embedder: Arc<dyn Embedder> = Arc::new(FixedEmbedder);
    let memory = rt
        .block_on(keel_memory::open_with(
            "",
            dir,
            Some(embedder),
            settings,
            None,
        ))
        .unwrap();
    let vocab = vocabulary();
    let mut rng = SplitMix(42);
    let started = Instant::now();
    for d in 0..chunks.div_ceil(CHUNKS_PER_DOC) {
        let text = document(&vocab, &mut rng);
        rt.block_on(memory.add_document(MemoryDocument {
            tenant: "bench".into(),
            agent: "ops".into(),
            source: format!("doc:{d}"),
            title: format!("Document {d}"),
            text,
            created_at: Utc::now(),
        }))
        .unwrap();
        // Another tenant's data in the same tables, as in production.
        if d % 10 == 0 {
            rt.block_on(memory.add_document(MemoryDocument {
                tenant: "other".into(),
                agent: "ops".into(),
                source: format!("doc:{d}"),
                title: "noise".into(),
                text: document(&vocab, &mut rng),
                created_at: Utc::now(),
            }))
            .unwrap();
        }
    }
    eprintln!("indexed {chunks} chunks in {:.1?}", started.elapsed());
    memory
}

fn queries() -> Vec<String> {
    let vocab = vocabulary();
    let mut rng = SplitMix(99);
    (0..200)
        .map(|_| {
            (0..4)
                .map(|_| {
                    let r = (rng.next() % 1_000_000) as f64 / 1_000_000.0;
                    vocab[((vocab.len() as f64).powf(r) as usize).min(vocab.len() - 1)].clone()
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn search(c: &mut Criterion) {
    let chunks: usize = std::env::var("KEEL_BENCH_CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let memory = build(&rt, dir.path(), chunks);
    let qs = queries();
    // Warm the vector cache (the first search loads the scope's vectors).
    let rss_before = rss_bytes();
    let started = Instant::now();
    rt.block_on(memory.search("bench", "ops", &qs[0], 10))
        .unwrap();
    let elapsed = started.elapsed();
    let grown = rss_bytes().saturating_sub(rss_before);
    eprintln!(
        "first search (loads {chunks} vectors): {elapsed:.1?}; heap grew by {:.1} MiB \
         = {:.0} bytes/chunk (the vector cache)",
        grown as f64 / (1024.0 * 1024.0),
        grown as f64 / chunks as f64
    );

    let mut latencies = Vec::new();
    for round in 0..3 {
        for q in &qs {
            let t = Instant::now();
            let hits = rt.block_on(memory.search("bench", "ops", q, 10)).unwrap();
            latencies.push(t.elapsed());
            assert!(round > 0 || !hits.is_empty());
        }
    }
    latencies.sort();
    eprintln!(
        "hybrid search over {chunks} chunks, k=10, {} queries: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        latencies.len(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );

    let files = ["memory.db", "memory.db-wal"];
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(dir.path().join(f)).ok())
        .map(|m| m.len())
        .sum();
    let total_chunks = chunks + chunks.div_ceil(CHUNKS_PER_DOC).div_ceil(10) * CHUNKS_PER_DOC;
    eprintln!(
        "index size: {:.1} MiB for {total_chunks} chunks = {:.0} bytes/chunk \
         ({DIM}-dim f32 vector = {} bytes of it)",
        bytes as f64 / (1024.0 * 1024.0),
        bytes as f64 / total_chunks as f64,
        DIM * 4
    );

    // The same searches with each query embedded by the local model, as
    // keel runs them; the model's time alone is printed beside them.
    match LocalEmbedder::load(&model_dir()) {
        Ok(model) => {
            let model = Arc::new(model);
            let real = rt
                .block_on(keel_memory::open_with(
                    "",
                    dir.path(),
                    Some(Arc::new(RealQueries(Arc::clone(&model)))),
                    settings(),
                    None,
                ))
                .unwrap();
            rt.block_on(real.search("bench", "ops", &qs[0], 10))
                .unwrap();
            let mut whole = Vec::new();
            for q in qs.iter().chain(&qs) {
                let t = Instant::now();
                rt.block_on(real.search("bench", "ops", q, 10)).unwrap();
                whole.push(t.elapsed());
            }
            whole.sort();
            let mut embed = Vec::new();
            for q in qs.iter().chain(&qs) {
                let t = Instant::now();
                rt.block_on(model.embed(std::slice::from_ref(q))).unwrap();
                embed.push(t.elapsed());
            }
            embed.sort();
            eprintln!(
                "with each query embedded by the local model, {} queries: p50 {:.2?}, p99 {:.2?} \
                 (the query embedding alone: p50 {:.2?}, p99 {:.2?})",
                whole.len(),
                percentile(&whole, 0.50),
                percentile(&whole, 0.99),
                percentile(&embed, 0.50),
                percentile(&embed, 0.99),
            );
        }
        Err(e) => eprintln!(
            "local model not installed ({e}): searches with real query embeddings skipped"
        ),
    }

    let mut i = 0;
    c.bench_function(&format!("hybrid_search_{chunks}_chunks_k10"), |b| {
        b.iter(|| {
            i = (i + 1) % qs.len();
            rt.block_on(memory.search("bench", "ops", &qs[i], 10))
                .unwrap()
        })
    });

    // A write to the scope, then a search: the write must not cost the
    // next search a reload of every vector.
    let vocab = vocabulary();
    let mut rng = SplitMix(4242);
    let mut after_write = Vec::new();
    for (n, q) in qs.iter().enumerate().take(10) {
        rt.block_on(memory.add_document(MemoryDocument {
            tenant: "bench".into(),
            agent: "ops".into(),
            source: format!("doc:late{n}"),
            title: format!("Late document {n}"),
            text: document(&vocab, &mut rng),
            created_at: Utc::now(),
        }))
        .unwrap();
        let t = Instant::now();
        rt.block_on(memory.search("bench", "ops", q, 10)).unwrap();
        after_write.push(t.elapsed());
    }
    after_write.sort();
    eprintln!(
        "search right after adding a {CHUNKS_PER_DOC}-chunk document, 10 times: \
         p50 {:.2?}, max {:.2?}",
        percentile(&after_write, 0.5),
        after_write[after_write.len() - 1]
    );
}

/// The process's anonymous resident memory (heap, not mapped files such as
/// memory.db), from /proc (0 where there is none).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("RssAnon:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn embedding(c: &mut Criterion) {
    let model = LocalEmbedder::load(&model_dir()).unwrap_or_else(|e| {
        panic!("{e}: run scripts/setup-embedder.sh to install the local model")
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // English prose, as session summaries and manuals are: 32 chunks of
    // 64 words (about 80 model tokens each).
    let sentences = [
        "The furnace F2 thermocouple was replaced after it drifted by twelve degrees.",
        "Operators must confirm the burner purge has finished before ignition.",
        "Maria approves invoices above five thousand euros before payment.",
        "The night shift reported bearing noise on pump P3 near the cooling tower.",
        "Spare parts are ordered through the maintenance portal with a work order.",
        "Safety drills take place on the first Monday of every quarter.",
    ];
    let words: Vec<String> = (0..32 * CHUNK_TOKENS)
        .map(|i| {
            let s = sentences[(i / 11) % sentences.len()];
            let w: Vec<&str> = s.split(' ').collect();
            w[i % w.len()].to_owned()
        })
        .collect();
    let batch: Vec<String> = words.chunks(CHUNK_TOKENS).map(|w| w.join(" ")).collect();
    let mut group = c.benchmark_group("embedding");
    group.sample_size(10);
    group.throughput(Throughput::Elements(batch.len() as u64));
    group.bench_function("local_minilm_32_chunks_of_64_english_words", |b| {
        b.iter(|| rt.block_on(model.embed(&batch)).unwrap())
    });
    group.finish();
}

criterion_group!(benches, search, embedding);
criterion_main!(benches);
