//! What a run remembers to stay on course (SPEC §4.12–4.13): its goal, a
//! short trace for drift scoring, the progress and lessons a context reset
//! keeps, its checkpoints and its context view. All of it is persisted with
//! the run's state and bounded in size, since the state is written at
//! every commit.

use keel_guard::drift::StepTrace;
use keel_protocol::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::context::{ContextView, Piece};

/// Steps of trace kept; drift looks at a window of a few recent steps.
const TRACE_KEPT: usize = 16;
const PROGRESS_KEPT: usize = 12;
const LESSONS_KEPT: usize = 10;
const CHECKPOINTS_KEPT: usize = 5;
const SIDE_EFFECTS_KEPT: usize = 50;
/// Characters of a result kept in the trace and in verified progress.
pub const SNIPPET_CHARS: usize = 300;

/// How close two texts are in meaning, in [0, 1]; `None` when it cannot
/// be told (the embedder failed), and drift then falls back to lexical.
#[async_trait::async_trait]
pub trait Similarity: Send + Sync {
    async fn similarity(&self, a: &str, b: &str) -> Option<f32>;
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Course {
    /// The input, then each follow-up: what the run is for.
    #[serde(default)]
    pub goals: Vec<String>,
    #[serde(default)]
    pub trace: Vec<StepTrace>,
    /// Results that passed verification: what a reset keeps as known.
    #[serde(default)]
    pub progress: Vec<Progress>,
    /// What blocks, denials and repairs taught (a reset keeps them).
    #[serde(default)]
    pub constraints: Vec<String>,
    /// Errors and loops seen (a reset keeps them, so they are not repeated).
    #[serde(default)]
    pub failures: Vec<String>,
    #[serde(default)]
    pub view: ContextView,
    #[serde(default)]
    pub checkpoints: Vec<Checkpoint>,
    #[serde(default)]
    pub checkpoints_taken: u32,
    /// The latest drift score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_score: Option<f32>,
    #[serde(default)]
    pub last_reflection_step: u32,
    /// Drift is judged on steps after this one: earlier steps were already
    /// judged and corrected, and must not keep the run flagged.
    #[serde(default)]
    pub judged_to_step: u32,
    /// A reflection found the run off course (or drift/loops triggered it);
    /// the next signal of trouble resets the context.
    #[serde(default)]
    pub watching: bool,
    #[serde(default)]
    pub resets: u32,
    /// Loop warnings or blocks since the last look at the course.
    #[serde(default)]
    pub loop_signals: u32,
    /// Non-idempotent calls already executed (fingerprint, step, result),
    /// so that a restore can never make them run twice.
    #[serde(default)]
    pub side_effects: Vec<SideEffect>,
    /// Fingerprints a restore forbids re-executing, with their earlier result.
    #[serde(default)]
    pub no_repeat: Vec<SideEffect>,
    /// Index into the loop-detection call history where the last compaction happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compacted_at_call: Option<usize>,
    /// Pre-routing already decided for this run.
    #[serde(default)]
    pub routed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    pub step: u32,
    pub tool: String,
    pub arguments: String,
    pub result: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SideEffect {
    pub step: u32,
    pub tool: String,
    pub fingerprint: String,
    pub result: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub id: String,
    pub step: u32,
    /// The context view then, closed at the history's length at the time.
    pub view: Vec<Piece>,
    /// The drift score was fine when it was taken (deep drift restores to such a one).
    pub on_track: bool,
}

impl Course {
    pub fn goal_text(&self) -> String {
        self.goals.join("\n")
    }

    pub fn push_trace(&mut self, t: StepTrace) {
        push_bounded(&mut self.trace, t, TRACE_KEPT);
    }

    /// The same call's result is listed once, as last seen.
    pub fn push_progress(&mut self, p: Progress) {
        self.progress
            .retain(|q| !(q.tool == p.tool && q.arguments == p.arguments));
        push_bounded(&mut self.progress, p, PROGRESS_KEPT);
    }

    pub fn learn_constraint(&mut self, text: String) {
        if !self.constraints.contains(&text) {
            push_bounded(&mut self.constraints, text, LESSONS_KEPT);
        }
    }

    pub fn learn_failure(&mut self, text: String) {
        if !self.failures.contains(&text) {
            push_bounded(&mut self.failures, text, LESSONS_KEPT);
        }
    }

    pub fn push_side_effect(&mut self, e: SideEffect) {
        push_bounded(&mut self.side_effects, e, SIDE_EFFECTS_KEPT);
    }

    pub fn push_checkpoint(&mut self, c: Checkpoint) {
        push_bounded(&mut self.checkpoints, c, CHECKPOINTS_KEPT);
    }

    /// What a context reset keeps, as the `kept` field of its event.
    pub fn kept(&self, criterion: Option<&str>) -> Value {
        json!({
            "goal": self.goals,
            "success_criterion": criterion,
            "verified_progress": self.progress.iter().map(|p| json!({
                "step": p.step, "tool": p.tool, "arguments": p.arguments, "result": p.result,
            })).collect::<Vec<_>>(),
            "constraints": self.constraints,
            "failure_patterns": self.failures,
        })
    }

    /// The clean prompt a reset continues from.
    pub fn brief(&self, criterion: Option<&str>) -> Message {
        let mut text = String::from(
            "[Context reset by keel: earlier turns were dropped because the run drifted or looped. \
             Continue from this brief.]\n\nGoal:\n",
        );
        for g in &self.goals {
            text.push_str(&format!("- {g}\n"));
        }
        if let Some(c) = criterion {
            text.push_str(&format!("\nDone when: {c}\n"));
        }
        if !self.progress.is_empty() {
            text.push_str("\nVerified progress (tool results that passed verification):\n");
            for p in &self.progress {
                text.push_str(&format!(
                    "- {} {} → {}\n",
                    p.tool,
                    p.arguments,
                    one_line(&p.result)
                ));
            }
        }
        if !self.constraints.is_empty() {
            text.push_str("\nConstraints learned (do not break them):\n");
            for c in &self.constraints {
                text.push_str(&format!("- {c}\n"));
            }
        }
        if !self.failures.is_empty() {
            text.push_str("\nWhat failed before (do not repeat it):\n");
            for f in &self.failures {
                text.push_str(&format!("- {f}\n"));
            }
        }
        text.push_str(
            "\nDecide the next step towards the goal; if the verified progress already answers it, answer now.",
        );
        Message::user(text)
    }
}

fn push_bounded<T>(v: &mut Vec<T>, item: T, max: usize) {
    v.push(item);
    if v.len() > max {
        let extra = v.len() - max;
        v.drain(..extra);
    }
}

/// The first `max` characters of `s`, on a character boundary.
pub fn snippet(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
