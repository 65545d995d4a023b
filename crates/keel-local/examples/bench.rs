//! Throughput of the local model: prompt and generation tokens per second,
//! first-token latency for a ~300-token prompt, and peak RSS.
//!
//! cargo run --release -p keel-local --example bench -- [GGUF] [THREADS...]
//! (GGUF defaults to $KEEL_TEST_GGUF, else the setup script's path; threads to 1 2.)
//! Each thread count runs in its own child process so peak RSS is its own.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use futures::StreamExt;
use keel_local::{LocalModel, LocalSettings};
use keel_protocol::{Message, ModelClient, ModelRequest};

const RUNS: usize = 3;

fn default_gguf() -> PathBuf {
    std::env::var_os("KEEL_TEST_GGUF").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/keel-models/SmolLM2-135M-Instruct.Q4_1.gguf")
        },
        PathBuf::from,
    )
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// About 300 tokens of operations text.
fn prompt_300() -> String {
    let sentence = "Furnace F2 reported a temperature of 1180 degrees at the end of the night shift, \
                    and the operator noted a slight flicker in the burner flame. ";
    let mut text = sentence.repeat(9);
    text.push_str("Summarise the situation in one short paragraph.");
    text
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, path, threads] = args.as_slice()
        && flag == "--child"
    {
        return child(PathBuf::from(path), threads.parse().unwrap_or(1));
    }
    let mut gguf = default_gguf();
    let mut threads = Vec::new();
    for a in &args {
        match a.parse::<u32>() {
            Ok(t) => threads.push(t),
            Err(_) => gguf = PathBuf::from(a),
        }
    }
    if threads.is_empty() {
        threads = vec![1, 2];
    }
    if !gguf.is_file() {
        eprintln!(
            "{} is missing: run scripts/setup-local-model.sh",
            gguf.display()
        );
        return ExitCode::FAILURE;
    }
    println!("model: {}", gguf.display());
    println!(
        "| threads | prompt tok/s | generation tok/s | first token (cold prompt) | peak RSS |"
    );
    println!("|---|---|---|---|---|");
    let Ok(exe) = std::env::current_exe() else {
        return ExitCode::FAILURE;
    };
    for t in threads {
        let status = std::process::Command::new(&exe)
            .arg("--child")
            .arg(&gguf)
            .arg(t.to_string())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("the {t}-thread run failed");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn child(gguf: PathBuf, threads: u32) -> ExitCode {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        return ExitCode::FAILURE;
    };
    let mut settings = LocalSettings::new(gguf, "bench");
    settings.threads = Some(threads);
    settings.context_window = Some(2048);
    settings.repeat_penalty = 1.0;
    let model = match LocalModel::load(settings) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let request = |max: u32| ModelRequest {
        messages: vec![Message::user(prompt_300())],
        tools: Vec::new(),
        max_output_tokens: Some(max),
    };
    rt.block_on(async {
        // Warm-up (page in the weights).
        let _ = model.complete(&request(1), None).await;
        let mut prompt_rates = Vec::new();
        let mut first_token = Vec::new();
        let mut gen_rates = Vec::new();
        let mut prompt_tokens = 0;
        for _ in 0..RUNS {
            // Cold prompt, one token out: prompt evaluation and first-token latency.
            let _ = model.clear_cache();
            let (tx, mut rx) = futures::channel::mpsc::unbounded();
            let start = Instant::now();
            let cold = request(1);
            let fut = model.complete(&cold, Some(tx));
            let (r, _) = futures::join!(fut, rx.next());
            let elapsed = start.elapsed().as_secs_f64();
            if let Ok(r) = r {
                prompt_tokens = r.usage.prompt_tokens;
                prompt_rates.push(r.usage.prompt_tokens as f64 / elapsed);
                first_token.push(elapsed);
            }
            // Warm prompt (cached), 128 tokens out: generation rate.
            let start = Instant::now();
            let (tx, mut rx) = futures::channel::mpsc::unbounded();
            let warm = request(129);
            let fut = model.complete(&warm, Some(tx));
            let (r, first) = futures::join!(fut, async {
                let _ = rx.next().await;
                Instant::now()
            });
            if let Ok(r) = r {
                let gen_time = start.elapsed().as_secs_f64() - (first - start).as_secs_f64();
                let n = r.usage.completion_tokens.saturating_sub(1);
                if n > 8 && gen_time > 0.0 {
                    gen_rates.push(n as f64 / gen_time);
                }
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        println!(
            "| {threads} | {:.0} | {:.1} | {:.0} ms ({prompt_tokens} tokens) | {:.0} MiB |",
            median(prompt_rates),
            median(gen_rates),
            median(first_token) * 1000.0,
            peak_rss_mib()
        );
    });
    ExitCode::SUCCESS
}
