//! Throughput of the local model: time to the first token (from sending a
//! request to its first generated token, prompt not cached) for 300- and
//! 334-token prompts, plain and with tools; the first request after
//! loading; prompt and generation tokens per second; peak RSS.
//!
//! cargo run --release -p keel-local --example bench -- [GGUF] [THREADS...] [--as-is]
//! (GGUF defaults to $KEEL_TEST_GGUF, else the setup script's path; threads to 1 2;
//! `--as-is` turns off `LocalSettings::requantize_q4_1` to compare.)
//! Each thread count runs in its own child process so peak RSS is its own.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use futures::StreamExt;
use keel_local::{LocalModel, LocalSettings};
use keel_protocol::{Message, ModelClient, ModelRequest, ToolSchema, shared_messages};
use serde_json::json;

/// Measurements per thread count; the table shows medians.
const RUNS: usize = 5;

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

/// Operations text: `sentences` sentences of about 30 tokens and a
/// closing instruction. With SmolLM2's template (it adds its own system
/// prompt) 8 sentences make a 300-token prompt and 9 make 334.
fn operations_text(sentences: usize) -> String {
    let sentence = "Furnace F2 reported a temperature of 1180 degrees at the end of the night shift, \
                    and the operator noted a slight flicker in the burner flame. ";
    let mut text = sentence.repeat(sentences);
    text.push_str("Summarise the situation in one short paragraph.");
    text
}

/// A plain-text request (no tools: free decoding).
fn plain(sentences: usize, max: u32) -> ModelRequest {
    ModelRequest {
        cache: Default::default(),
        messages: shared_messages(vec![Message::user(operations_text(sentences))]),
        tools: Vec::new(),
        max_output_tokens: Some(max),
    }
}

/// A request with tools, as an agent run sends it: the reply is decoded
/// under the action grammar, so this also times the grammar's setup and
/// its first token mask.
fn with_tools(max: u32) -> ModelRequest {
    let tool = |name: &str, description: &str, parameters: serde_json::Value| ToolSchema {
        name: name.into(),
        description: description.into(),
        parameters: parameters.into(),
    };
    ModelRequest {
        cache: Default::default(),
        messages: shared_messages(vec![
            Message::system("You are the plant operations assistant."),
            Message::user(operations_text(5)),
        ]),
        tools: vec![
            tool(
                "furnace_status",
                "Current status of one furnace.",
                json!({"type":"object","properties":{"furnace_id":{"type":"string"}},"required":["furnace_id"]}),
            ),
            tool(
                "set_setpoint",
                "Set a furnace's temperature setpoint.",
                json!({"type":"object","properties":{
                    "furnace_id":{"type":"string"},
                    "temperature":{"type":"number","minimum":0,"maximum":2000}
                },"required":["furnace_id","temperature"]}),
            ),
        ],
        max_output_tokens: Some(max),
    }
}

/// Time from sending `request` (KV cache cleared first) to its first
/// generated token: the request asks for one token, so its completion is
/// that token. Returns milliseconds and the prompt's token count.
async fn first_token(model: &LocalModel, request: &ModelRequest) -> Option<(f64, u64)> {
    let _ = model.clear_cache();
    let start = Instant::now();
    let r = model.complete(request, None).await.ok()?;
    Some((
        start.elapsed().as_secs_f64() * 1000.0,
        r.usage.prompt_tokens,
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, path, threads, as_is] = args.as_slice()
        && flag == "--child"
    {
        return child(
            PathBuf::from(path),
            threads.parse().unwrap_or(1),
            as_is == "as-is",
        );
    }
    let mut gguf = default_gguf();
    let mut threads = Vec::new();
    let mut as_is = false;
    for a in &args {
        match a.parse::<u32>() {
            Ok(t) => threads.push(t),
            Err(_) if a == "--as-is" => as_is = true,
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
    println!(
        "model: {}{}",
        gguf.display(),
        if as_is {
            " (weights as they are)"
        } else {
            " (Q4_1 weights run as Q8_0)"
        }
    );
    println!(
        "| threads | load | first request after load | first token, 300-token prompt | \
         first token, 334-token prompt | first token, with tools | prompt tok/s | \
         generation tok/s | peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let Ok(exe) = std::env::current_exe() else {
        return ExitCode::FAILURE;
    };
    for t in threads {
        let status = std::process::Command::new(&exe)
            .arg("--child")
            .arg(&gguf)
            .arg(t.to_string())
            .arg(if as_is { "as-is" } else { "default" })
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("the {t}-thread run failed");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn child(gguf: PathBuf, threads: u32, as_is: bool) -> ExitCode {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        return ExitCode::FAILURE;
    };
    let mut settings = LocalSettings::new(gguf, "bench");
    settings.threads = Some(threads);
    settings.context_window = Some(2048);
    settings.repeat_penalty = 1.0;
    settings.requantize_q4_1 = !as_is;
    let loading = Instant::now();
    let model = match LocalModel::load(settings) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let load_ms = loading.elapsed().as_secs_f64() * 1000.0;
    rt.block_on(async {
        // What a fresh process sees: the first request right after loading.
        let Some((after_load, _)) = first_token(&model, &plain(9, 1)).await else {
            eprintln!("the first request failed");
            return ExitCode::FAILURE;
        };
        let mut ttft_300 = Vec::new();
        let mut ttft_334 = Vec::new();
        let mut ttft_tools = Vec::new();
        let mut gen_rates = Vec::new();
        let (mut n_300, mut n_334, mut n_tools) = (0, 0, 0);
        for _ in 0..RUNS {
            if let Some((ms, n)) = first_token(&model, &plain(8, 1)).await {
                ttft_300.push(ms);
                n_300 = n;
            }
            if let Some((ms, n)) = first_token(&model, &with_tools(1)).await {
                ttft_tools.push(ms);
                n_tools = n;
            }
            if let Some((ms, n)) = first_token(&model, &plain(9, 1)).await {
                ttft_334.push(ms);
                n_334 = n;
            }
            // Warm prompt (cached), 128 tokens out: generation rate.
            let start = Instant::now();
            let (tx, mut rx) = futures::channel::mpsc::unbounded();
            let warm = plain(9, 129);
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
        let ms_334 = median(ttft_334);
        println!(
            "| {threads} | {load_ms:.0} ms | {after_load:.0} ms | {:.0} ms ({n_300} tokens) | \
             {ms_334:.0} ms ({n_334} tokens) | {:.0} ms ({n_tools} tokens) | {:.0} | {:.1} | {:.0} MiB |",
            median(ttft_300),
            median(ttft_tools),
            n_334 as f64 / ms_334 * 1000.0,
            median(gen_rates),
            peak_rss_mib()
        );
        ExitCode::SUCCESS
    })
}
