#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Q8_0 copy of Q4_1 weights (`LocalSettings::requantize_q4_1`): made
//! once beside the GGUF, loaded instead of it, and the same model.

mod common;

use std::path::{Path, PathBuf};

use keel_local::{LocalModel, LocalSettings};
use keel_protocol::{Message, ModelClient, ModelRequest, shared_messages};

/// A private copy of the test GGUF, so this test makes its own Q8_0 copy.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("keel-local-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(common::gguf(), dir.join("model.gguf")).unwrap();
        Self(dir)
    }

    fn gguf(&self) -> PathBuf {
        self.0.join("model.gguf")
    }

    fn copies(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".q8_0"))
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load(path: &Path, requantize: bool) -> LocalModel {
    let mut settings = LocalSettings::new(path, "smollm2-135m");
    settings.threads = Some(1);
    settings.context_window = Some(1024);
    settings.requantize_q4_1 = requantize;
    LocalModel::load(settings).unwrap()
}

async fn greedy(model: &LocalModel, prompt: &str) -> String {
    let request = ModelRequest {
        cache: Default::default(),
        messages: shared_messages(vec![Message::user(prompt)]),
        tools: Vec::new(),
        max_output_tokens: Some(12),
    };
    model.complete(&request, None).await.unwrap().text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q4_1_weights_run_from_one_q8_0_copy_that_answers_like_them() {
    let scratch = Scratch::new();
    let source_len = std::fs::metadata(scratch.gguf()).unwrap().len();

    let original = load(&scratch.gguf(), false);
    assert!(scratch.copies().is_empty(), "no copy when turned off");

    let copied = load(&scratch.gguf(), true);
    let copies = scratch.copies();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let copy_len = std::fs::metadata(&copies[0]).unwrap().len();
    // Q8_0 takes 34 bytes per 32 weights where Q4_1 takes 20.
    assert!(
        copy_len > source_len * 13 / 10 && copy_len < source_len * 17 / 10,
        "{source_len} -> {copy_len}"
    );
    let modified = std::fs::metadata(&copies[0]).unwrap().modified().unwrap();

    // Greedy decoding: the copy's weights are within a fraction of a Q4_1
    // step of the original's, so the replies start the same.
    let prompts = [
        "What is the capital of France?",
        "Name three colours.",
        "Write one sentence about furnaces.",
    ];
    let mut same_start = 0;
    for prompt in prompts {
        let a = greedy(&original, prompt).await;
        let b = greedy(&copied, prompt).await;
        assert!(
            !b.trim().is_empty(),
            "{prompt:?}: empty reply from the copy"
        );
        let a_words: Vec<&str> = a.split_whitespace().take(3).collect();
        let b_words: Vec<&str> = b.split_whitespace().take(3).collect();
        if a_words == b_words {
            same_start += 1;
        } else {
            eprintln!("{prompt:?}: {a:?} vs {b:?}");
        }
    }
    assert!(
        same_start >= 2,
        "replies diverge: {same_start}/3 start the same"
    );

    // A second load reuses the copy.
    drop(copied);
    let _again = load(&scratch.gguf(), true);
    assert_eq!(scratch.copies(), copies);
    assert_eq!(
        std::fs::metadata(&copies[0]).unwrap().modified().unwrap(),
        modified,
        "the copy was rewritten"
    );
}
