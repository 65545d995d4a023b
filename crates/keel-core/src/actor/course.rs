//! Staying on course in long runs (SPEC §4.12): after each step with tool
//! calls, score drift; reflect on an interval, on drift and on loops; take
//! checkpoints; and when trouble persists after a reflection, reset the
//! context to a brief. Every correction is bounded (one reflection per
//! trigger, `max_context_resets` resets), so correcting can never loop.

use keel_guard::drift::{DriftInput, DriftReport, DriftSettings, assess, window_text};
use keel_protocol::{EventKind, Message, ModelRequest, shared_messages};
use serde_json::Value;

use super::{Exit, Flow, RunActor};
use crate::context::{ContextView, Piece};
use crate::course::{Checkpoint, Progress, SNIPPET_CHARS, SideEffect, snippet};
use keel_guard::drift::StepTrace;

const REFLECTION_PROMPT: &str = "You are keel's reflection step. You review an agent's recent progress \
against the user's goal; you do not act. Reply with one JSON object and nothing else: \
{\"on_track\": true|false, \"note\": \"one sentence on how the run stands\", \"next\": \"the single most useful next step towards the goal\"}. \
Off track means the recent actions do not serve the goal (a sub-goal replaced it, the scope crept, or the agent repeats itself without progress).";

/// Output tokens allowed for a reflection answer.
const REFLECTION_TOKENS: u32 = 200;

/// Why a reflection was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Interval,
    Drift,
    Loop,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Self::Interval => "interval",
            Self::Drift => "drift",
            Self::Loop => "loop",
        }
    }
}

/// A reflection's structured answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reflection {
    pub on_track: bool,
    pub note: String,
    pub next: String,
}

impl RunActor {
    pub(super) fn goal_text(&self) -> String {
        if self.state.course.goals.is_empty() {
            self.input.clone()
        } else {
            self.state.course.goal_text()
        }
    }

    /// Runs after a step whose calls all have results.
    pub(super) async fn after_step(&mut self) -> Result<Flow, Exit> {
        let cfg = self.agent.config.drift.clone();
        if !cfg.enabled {
            return Ok(Flow::Continue);
        }
        let loops = std::mem::take(&mut self.state.course.loop_signals);
        // Scored first, so the checkpoint records whether the run was on track.
        let report = self.assess_drift().await;
        if cfg.checkpoint_interval > 0 && self.steps.is_multiple_of(cfg.checkpoint_interval) {
            Box::pin(self.take_checkpoint()).await?;
        }
        let drifted = report.as_ref().is_some_and(|r| r.drifted);
        if let Some(r) = report.as_ref().filter(|r| r.drifted) {
            let event = EventKind::DriftDetected {
                score: round3(r.score),
                reason: r.reason.clone(),
            };
            self.commit(vec![event], Vec::new()).await?;
            if cfg.restore_on_deep_drift
                && f64::from(r.score) < cfg.deep_drift_threshold
                && let Some(id) = self.last_good_checkpoint()
            {
                Box::pin(self.restore(&id, "deep drift")).await?;
                return Ok(Flow::Continue);
            }
        }
        if (drifted || loops > 0) && self.state.course.watching {
            if cfg.context_reset && self.state.course.resets < cfg.max_context_resets {
                Box::pin(self.context_reset()).await?;
                return Ok(Flow::Continue);
            }
            // Nothing left to correct with; the loop guards still bound the run.
            return Ok(Flow::Continue);
        }
        let trigger = if drifted {
            Some(Trigger::Drift)
        } else if loops > 0 {
            Some(Trigger::Loop)
        } else if cfg.reflection_interval > 0
            && self.steps >= self.state.course.last_reflection_step + cfg.reflection_interval
        {
            Some(Trigger::Interval)
        } else {
            None
        };
        if let Some(t) = trigger {
            Box::pin(self.reflect(t, report.as_ref())).await?;
        }
        Ok(Flow::Continue)
    }

    async fn assess_drift(&mut self) -> Option<DriftReport> {
        let last = self.state.course.trace.last()?;
        if last.step != self.steps {
            // No call ran this step: nothing new to judge.
            return None;
        }
        let settings = DriftSettings::from(&self.agent.config.drift);
        let goal = self.goal_text();
        let from = self.state.course.judged_to_step;
        let steps: Vec<StepTrace> = self
            .state
            .course
            .trace
            .iter()
            .filter(|t| t.step > from)
            .cloned()
            .collect();
        let semantic = match &self.shared.options.similarity {
            Some(sim) if !steps.is_empty() => {
                let text = window_text(&steps, settings.window);
                sim.similarity(&goal, &text).await
            }
            _ => None,
        };
        let baseline_calls = self.baseline_calls().await;
        let criterion = self.agent.config.success_criterion.clone();
        let report = assess(
            &DriftInput {
                goal: &goal,
                criterion: criterion.as_deref(),
                steps: &steps,
                semantic,
                baseline_calls,
            },
            &settings,
        );
        self.state.course.last_score = Some(report.score);
        Some(report)
    }

    /// What similar runs use: the mean tool calls of this agent's recent
    /// completed runs in this tenant, once at least a few exist. Looked up
    /// once per actor; a configured expectation takes precedence anyway.
    async fn baseline_calls(&mut self) -> Option<f32> {
        const RECENT: u32 = 50;
        const ENOUGH: usize = 5;
        if self.agent.config.drift.expected_tool_calls > 0 {
            return None;
        }
        if let Some(known) = self.baseline_calls {
            return known;
        }
        let filter = keel_protocol::RunFilter {
            status: Some(keel_protocol::RunStatus::Completed),
            limit: RECENT,
            ..keel_protocol::RunFilter::default()
        };
        let baseline = match self
            .shared
            .store
            .list_runs(&self.principal.tenant, &filter)
            .await
        {
            Ok(page) => {
                let calls: Vec<f32> = page
                    .runs
                    .iter()
                    .filter(|r| r.agent == self.agent.config.id && r.id != self.run_id)
                    .map(|r| r.usage.tool_calls as f32)
                    .collect();
                // Never below the detector's default: runs that usually need one
                // call do not make a three-call run drift.
                let floor = DriftSettings::default().default_expected_calls as f32;
                (calls.len() >= ENOUGH)
                    .then(|| (calls.iter().sum::<f32>() / calls.len() as f32).max(floor))
            }
            Err(e) => {
                tracing::warn!(run = %self.run_id, error = %e, "drift: past runs unavailable; no baseline");
                None
            }
        };
        self.baseline_calls = Some(baseline);
        baseline
    }

    /// One extra model call (no tools) that judges the course; off track, a
    /// correction goes to the model before its next step.
    async fn reflect(
        &mut self,
        trigger: Trigger,
        report: Option<&DriftReport>,
    ) -> Result<(), Exit> {
        self.state.course.last_reflection_step = self.steps;
        let mut brief = format!("Goal:\n{}\n", self.goal_text());
        if let Some(c) = &self.agent.config.success_criterion {
            brief.push_str(&format!("Done when: {c}\n"));
        }
        brief.push_str(&format!(
            "\nSteps so far: {}. Recent actions (oldest first):\n",
            self.steps
        ));
        let window = usize::try_from(self.agent.config.drift.window.max(1)).unwrap_or(4) * 2;
        let trace = &self.state.course.trace;
        for t in &trace[trace.len().saturating_sub(window)..] {
            brief.push_str(&format!(
                "- step {}: {} {} → {}{}\n",
                t.step,
                t.tool,
                t.arguments,
                if t.ok { "" } else { "error: " },
                t.result
            ));
        }
        match (trigger, report) {
            (Trigger::Drift, Some(r)) => {
                brief.push_str(&format!("\nkeel's drift check flagged: {}\n", r.reason));
            }
            (Trigger::Loop, _) => {
                brief.push_str(
                    "\nkeel's loop detection warned that calls repeat without progress.\n",
                );
            }
            _ => {}
        }
        brief.push_str("\nAre these actions serving the goal? What should happen next?");
        let request = ModelRequest {
            cache: Default::default(),
            messages: shared_messages(vec![
                Message::system(REFLECTION_PROMPT),
                Message::user(brief),
            ]),
            tools: Vec::new(),
            max_output_tokens: Some(REFLECTION_TOKENS),
        };
        let answer = match self.call_model_quiet(request).await {
            Ok((response, _)) => parse_reflection(&response.text),
            Err(Exit::Failed(e)) => {
                tracing::warn!(run = %self.run_id, error = %e.message, "reflection call failed; the run goes on");
                None
            }
            Err(other) => return Err(other),
        };
        // An unreadable answer never makes things worse: the run goes on as it was.
        let r = answer.unwrap_or_else(|| Reflection {
            // No verdict, no correction: an empty correction would only add noise.
            on_track: true,
            note: "the reflection answer could not be read".into(),
            next: String::new(),
        });
        let mut events = vec![EventKind::Reflection {
            on_track: r.on_track,
            note: r.note.clone(),
        }];
        let mut messages = Vec::new();
        if r.on_track && trigger == Trigger::Interval {
            self.state.course.watching = false;
        } else {
            // Drift or loops triggered it, or it judged the run off track:
            // if the trouble persists, the next step resets the context.
            self.state.course.watching = true;
        }
        if !r.on_track || trigger != Trigger::Interval {
            self.state.course.judged_to_step = self.steps;
        }
        if !r.on_track {
            let correction = correction_text(&self.goal_text(), &r);
            events.push(EventKind::ReactFeedback {
                step: self.steps,
                code: keel_protocol::FeedbackCode::DriftCorrection,
                detail: format!("{} (trigger: {})", r.note, trigger.as_str()),
            });
            messages.push(Message::system(correction));
        }
        self.commit(events, messages).await
    }

    /// Persists where the run stands, so it can be restored later.
    pub(super) async fn take_checkpoint(&mut self) -> Result<String, Exit> {
        let n = self.state.course.checkpoints_taken + 1;
        self.state.course.checkpoints_taken = n;
        let id = format!("cp-{}-{n}", self.steps);
        let threshold = self.agent.config.drift.threshold as f32;
        let checkpoint = Checkpoint {
            id: id.clone(),
            step: self.steps,
            view: self.state.course.view.frozen(self.history.len()),
            on_track: self.state.course.last_score.is_none_or(|s| s >= threshold),
        };
        self.state.course.push_checkpoint(checkpoint);
        let event = EventKind::Checkpoint {
            checkpoint_id: id.clone(),
            step: self.steps,
        };
        self.commit(vec![event], Vec::new()).await?;
        Ok(id)
    }

    /// The newest checkpoint taken on track *before* the window the drift
    /// score judged: a checkpoint inside it may already hold the wandering.
    fn last_good_checkpoint(&self) -> Option<String> {
        let window = self.agent.config.drift.window.max(1);
        let before = self.steps.saturating_sub(window);
        self.state
            .course
            .checkpoints
            .iter()
            .rev()
            .find(|c| c.on_track && c.step <= before)
            .map(|c| c.id.clone())
    }

    /// Keeps the goal, the verified progress, the constraints learned and the
    /// failure patterns; drops every other turn from the prompt.
    async fn context_reset(&mut self) -> Result<(), Exit> {
        let checkpoint_id = self.take_checkpoint().await?;
        let criterion = self.agent.config.success_criterion.clone();
        let course = &mut self.state.course;
        let kept = course.kept(criterion.as_deref());
        let brief = course.brief(criterion.as_deref());
        course.view = ContextView::restart(brief, self.history.len());
        course.resets += 1;
        course.watching = false;
        course.trace.clear();
        let event = EventKind::ContextReset {
            checkpoint_id,
            kept,
        };
        self.commit(vec![event], Vec::new()).await
    }

    /// Returns the model's view to a checkpoint. The world is not rolled
    /// back: actions with side effects taken since are listed for the model
    /// and can never run again in this run.
    pub(super) async fn restore(&mut self, id: &str, why: &str) -> Result<(), Exit> {
        let Some(cp) = self
            .state
            .course
            .checkpoints
            .iter()
            .find(|c| c.id == id)
            .cloned()
        else {
            tracing::warn!(run = %self.run_id, checkpoint = id, "restore of an unknown checkpoint ignored");
            return Ok(());
        };
        let since: Vec<SideEffect> = self
            .state
            .course
            .side_effects
            .iter()
            .filter(|s| s.step > cp.step)
            .cloned()
            .collect();
        let mut note = format!(
            "[Restored by keel to checkpoint {} (step {}) because of {why}. Later turns are hidden from you.]",
            cp.id, cp.step
        );
        if !since.is_empty() {
            note.push_str(
                "\nThese actions already ran after that point and will not run again; their results:\n",
            );
            for s in &since {
                note.push_str(&format!("- {} → {}\n", s.tool, s.result));
            }
        }
        let course = &mut self.state.course;
        for s in since {
            if !course
                .no_repeat
                .iter()
                .any(|n| n.fingerprint == s.fingerprint)
            {
                course.no_repeat.push(s);
            }
        }
        let mut pieces: Vec<Piece> = cp.view.clone();
        pieces.push(Piece::Note {
            message: Message::system(note),
        });
        pieces.push(Piece::Range {
            from: self.history.len(),
            to: None,
        });
        course.view = ContextView { pieces };
        course.trace.retain(|t| t.step <= cp.step);
        course.progress.retain(|p| p.step <= cp.step);
        course.watching = false;
        let event = EventKind::ReactFeedback {
            step: self.steps,
            code: keel_protocol::FeedbackCode::CheckpointRestored,
            detail: format!("restored to {} (step {}): {why}", cp.id, cp.step),
        };
        self.commit(vec![event], Vec::new()).await
    }

    /// Feeds an executed call to drift scoring, the verified progress a reset
    /// keeps, and the side effects a restore must not repeat.
    pub(super) fn observe_course(
        &mut self,
        call: &keel_protocol::ToolCall,
        args_text: &str,
        spec: &keel_protocol::ToolSpec,
        ok: bool,
        raw: &str,
        report: &keel_guard::verify::Report,
    ) {
        let shown = if report.withhold { "[withheld]" } else { raw };
        let (fingerprint, outcome) = self
            .state
            .calls
            .records()
            .last()
            .map(|r| (r.call.clone(), r.outcome.clone()))
            .unwrap_or_default();
        if !spec.idempotent {
            self.record_side_effect(&call.name, fingerprint, shown);
        }
        // With drift off, nothing reads the trace, the progress or the
        // failures (scoring, reflection, resets and restores are all off),
        // and the state they would grow is written at every commit.
        if !self.agent.config.drift.enabled {
            return;
        }
        let step = self.steps;
        let course = &mut self.state.course;
        course.push_trace(StepTrace {
            step,
            tool: call.name.clone(),
            arguments: snippet(args_text, 200),
            result: snippet(shown, SNIPPET_CHARS),
            ok,
            outcome,
        });
        let verified = ok
            && !report.withhold
            && report
                .checks
                .iter()
                .all(|c| c.passed || c.rule == "non_empty");
        if verified {
            course.push_progress(Progress {
                step,
                tool: call.name.clone(),
                arguments: snippet(args_text, 200),
                result: snippet(shown, SNIPPET_CHARS),
            });
        } else if !ok {
            course.learn_failure(format!("`{}` failed: {}", call.name, snippet(shown, 160)));
        }
    }

    pub(super) fn record_side_effect(&mut self, tool: &str, fingerprint: String, result: &str) {
        let effect = SideEffect {
            step: self.steps,
            tool: tool.to_owned(),
            fingerprint,
            result: snippet(result, 300),
        };
        self.state.course.push_side_effect(effect);
    }
}

fn round3(x: f32) -> f64 {
    (f64::from(x) * 1000.0).round() / 1000.0
}

fn correction_text(goal: &str, r: &Reflection) -> String {
    let mut text = format!(
        "Course correction from keel: the recent steps have drifted from the user's goal. {}\nThe goal is still:\n{goal}",
        r.note
    );
    if !r.next.trim().is_empty() {
        text.push_str(&format!("\nNext: {}", r.next));
    }
    text.push_str("\nDrop side tasks that do not serve this goal.");
    text
}

/// Reads `{on_track, note, next}` from a reflection reply, tolerating prose
/// or code fences around the object.
pub(crate) fn parse_reflection(text: &str) -> Option<Reflection> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    if end <= start {
        return None;
    }
    let v: Value = serde_json::from_str(&text[start..=end]).ok()?;
    let on_track = match v.get("on_track")? {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(s.trim().to_ascii_lowercase().as_str(), "true" | "yes"),
        _ => return None,
    };
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(|s| snippet(s.trim(), 400))
            .unwrap_or_default()
    };
    Some(Reflection {
        on_track,
        note: field("note"),
        next: field("next"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflections_are_read_through_prose_and_fences() {
        let r = parse_reflection(
            "Sure.\n```json\n{\"on_track\": false, \"note\": \"payroll is unrelated\", \"next\": \"check F2\"}\n```",
        )
        .unwrap();
        assert!(!r.on_track);
        assert_eq!(r.note, "payroll is unrelated");
        assert_eq!(r.next, "check F2");
        assert!(parse_reflection("on track, I think").is_none());
        assert!(parse_reflection("{\"note\": \"x\"}").is_none());
        assert!(
            parse_reflection("{\"on_track\": \"yes\"}")
                .unwrap()
                .on_track
        );
    }
}
