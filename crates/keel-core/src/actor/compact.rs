//! The prompt of each step, kept inside the model's context window (SPEC
//! §4.13): past `compaction.threshold` of the window, older turns become one
//! summary written by the model (or, if that call fails, a summary of what
//! was called and how big the results were). The newest turns and every
//! call whose results are still arriving stay verbatim. Whatever happens,
//! the provider is never sent a prompt over its window.

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_protocol::{EventKind, Message, ModelRequest, ToolSchema, shared_messages};

use super::{Exit, RunActor};
use crate::context::{compaction_cut, minimal_tail};
use crate::prompt;
use crate::transcript::{keep_tail, render};

const SUMMARY_PROMPT: &str = "You are keel's compaction step. Summarize the earlier part of an agent's \
run so the agent can continue without it. Keep: the user's goal and every request, facts and numbers \
found (with the identifiers they belong to), decisions made, what failed and why, and what is still open. \
Be brief and factual; do not invent anything; no preamble.";

/// Share of the window the summary request itself may fill.
const SUMMARY_INPUT_SHARE: f64 = 0.6;
/// Share of the window a prompt may take at most, leaving room to answer.
const HARD_SHARE: f64 = 0.9;

impl RunActor {
    pub(super) fn context_window(&self) -> u64 {
        self.agent
            .model
            .context_window()
            .filter(|w| *w > 0)
            .unwrap_or(self.agent.config.compaction.default_context_window)
    }

    /// The request of the next step, compacted when it nears the window.
    pub(super) async fn prepare_request(
        &mut self,
        tools: Vec<ToolSchema>,
    ) -> Result<ModelRequest, Exit> {
        let mut request = self.request_from_view(tools, None);
        let compaction = &self.agent.config.compaction;
        let window = self.context_window();
        let before = self.agent.model.estimate_tokens(&request);
        let mut estimate = before;
        if compaction.enabled && before as f64 > window as f64 * compaction.threshold {
            // The tools are taken back rather than copied up front: most
            // steps never compact, and each copy is every schema, deep.
            let tools = std::mem::take(&mut request.tools);
            if Box::pin(self.compact(before, &tools)).await? {
                request = self.request_from_view(tools, None);
                estimate = self.agent.model.estimate_tokens(&request);
            } else {
                request.tools = tools;
            }
        }
        self.fit_estimated(&mut request, estimate);
        Ok(request)
    }

    pub(super) fn request_from_view(
        &self,
        tools: Vec<ToolSchema>,
        note: Option<&str>,
    ) -> ModelRequest {
        let messages = self.state.course.view.render(&self.history);
        let mut request = prompt::build(&self.system_message, messages, tools, note);
        request.cache = self.wire_cache.clone();
        request
    }

    /// The last line of defence: shrink old tool results until the prompt
    /// fits the window.
    pub(super) fn fit_window(&self, request: &mut ModelRequest) {
        let est = self.agent.model.estimate_tokens(request);
        self.fit_estimated(request, est);
    }

    /// [`Self::fit_window`] for a request whose estimate is known: an
    /// estimate measures every message and schema, so a step makes it once.
    fn fit_estimated(&self, request: &mut ModelRequest, est: u64) {
        let window = self.context_window();
        let hard = (window as f64 * HARD_SHARE) as u64;
        if est <= hard {
            return;
        }
        let chars = prompt::char_len(request) as f64;
        let target = chars * (hard as f64 / est as f64) * 0.95;
        prompt::fit(request, target as usize);
    }

    /// Summarizes the older part of the view. Returns whether it changed.
    async fn compact(&mut self, tokens_before: u64, tools: &[ToolSchema]) -> Result<bool, Exit> {
        let cfg = self.agent.config.compaction.clone();
        let window = self.context_window();
        let rendered = self.state.course.view.render(&self.history);
        let budget = (window as f64 * cfg.threshold / 2.0) as u64;
        let floor = minimal_tail(&rendered);
        let mut keep = usize::try_from(cfg.keep_recent_messages.max(1)).unwrap_or(6);
        let cut = loop {
            let Some(cut) = compaction_cut(&rendered, keep) else {
                break None;
            };
            let tail = prompt::build(
                &self.system_message,
                rendered[cut..].iter().cloned(),
                tools.to_vec(),
                None,
            );
            if self.agent.model.estimate_tokens(&tail) <= budget || keep <= 1 || cut >= floor {
                break Some(cut);
            }
            keep -= 1;
        };
        let Some(cut) = cut else {
            return Ok(false);
        };
        let older = &rendered[..cut];
        let (summary, mode) = match self.summarize(older, window).await {
            Ok(Some(text)) => (text, "summary"),
            Ok(None) => (metadata_summary(older), "metadata"),
            Err(e) => return Err(e),
        };
        let head = Message::user(format!(
            "[Summary of the earlier part of this run, written by keel's compaction]\nGoal:\n{}\n\n{}",
            self.goal_text(),
            summary
        ));
        self.state.course.view = self
            .state
            .course
            .view
            .replace_prefix(&self.history, cut, head);
        self.state.course.compacted_at_call = Some(self.state.calls.records().len());
        let after = self
            .agent
            .model
            .estimate_tokens(&self.request_from_view(tools.to_vec(), None));
        let event = EventKind::Compaction {
            tokens_before,
            tokens_after: after,
            mode: mode.into(),
        };
        self.commit(vec![event], Vec::new()).await?;
        Ok(true)
    }

    /// One tool-less call over a transcript sized to fit the window; `None`
    /// when the model fails or says nothing (the caller falls back).
    async fn summarize(
        &mut self,
        older: &[Arc<Message>],
        window: u64,
    ) -> Result<Option<String>, Exit> {
        let per_token = self.agent.model.chars_per_token();
        let max_chars = (window as f64 * SUMMARY_INPUT_SHARE * per_token) as usize;
        let transcript = transcript(older, max_chars);
        let answer_tokens = u32::try_from((window / 8).clamp(64, 1024)).unwrap_or(1024);
        let request = ModelRequest {
            cache: Default::default(),
            messages: shared_messages(vec![
                Message::system(SUMMARY_PROMPT),
                Message::user(format!("The run so far:\n\n{transcript}")),
            ]),
            tools: Vec::new(),
            max_output_tokens: Some(answer_tokens),
        };
        match self.call_model_quiet(request).await {
            Ok((r, _)) if !r.text.trim().is_empty() => Ok(Some(r.text.trim().to_owned())),
            Ok(_) => Ok(None),
            Err(Exit::Failed(e)) => {
                tracing::warn!(run = %self.run_id, error = %e.message, "compaction summary failed; using a metadata summary");
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }

    /// The post-compaction guard: the same call with the same outcome three
    /// times since the last compaction means the run is spiralling.
    pub(super) fn spiralling_after_compaction(&self) -> bool {
        let Some(at) = self.state.course.compacted_at_call else {
            return false;
        };
        let records = self.state.calls.records();
        let Some(last) = records.last() else {
            return false;
        };
        if last.outcome.is_none() || records.len() <= at {
            return false;
        }
        records[at..]
            .iter()
            .filter(|r| r.call == last.call && r.outcome == last.outcome)
            .count()
            >= 3
    }
}

/// The older messages as plain text, tool results shortened first so the
/// whole fits `max_chars`.
fn transcript(messages: &[Arc<Message>], max_chars: usize) -> String {
    let total: usize = messages.iter().map(|m| m.char_len()).sum();
    let results = messages
        .iter()
        .filter(|m| matches!(***m, Message::Tool { .. }))
        .count()
        .max(1);
    let per_result = if total <= max_chars {
        usize::MAX
    } else {
        (max_chars / 2 / results).max(80)
    };
    keep_tail(
        &render(messages.iter().map(|m| &**m), per_result),
        max_chars,
    )
}

/// What can be said without a model: the requests, the calls and result sizes.
fn metadata_summary(messages: &[Arc<Message>]) -> String {
    let mut calls: BTreeMap<&str, (u32, usize, u32)> = BTreeMap::new();
    let mut requests = Vec::new();
    for m in messages {
        match &**m {
            Message::User { content } => requests.push(crate::course::snippet(content, 200)),
            Message::Tool {
                name,
                content,
                is_error,
                ..
            } => {
                let e = calls.entry(name.as_str()).or_default();
                e.0 += 1;
                e.1 += content.len();
                e.2 += u32::from(*is_error);
            }
            _ => {}
        }
    }
    let mut text = format!(
        "(The model could not summarize; this is what keel recorded.) {} earlier messages were dropped.\n",
        messages.len()
    );
    if !requests.is_empty() {
        text.push_str("User messages:\n");
        for r in requests {
            text.push_str(&format!("- {r}\n"));
        }
    }
    if !calls.is_empty() {
        text.push_str("Tools called:\n");
        for (name, (n, bytes, errors)) in calls {
            text.push_str(&format!(
                "- {name}: {n} call(s), {bytes} bytes of results, {errors} error(s)\n"
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_summary_counts_calls_and_sizes() {
        let m = shared_messages(vec![
            Message::user("status of F2?"),
            Message::Tool {
                call_id: "1".into(),
                name: "furnace_status".into(),
                content: "x".repeat(100),
                is_error: false,
            },
            Message::Tool {
                call_id: "2".into(),
                name: "furnace_status".into(),
                content: "y".repeat(50),
                is_error: true,
            },
        ]);
        let s = metadata_summary(&m);
        assert!(s.contains("furnace_status: 2 call(s), 150 bytes of results, 1 error(s)"));
        assert!(s.contains("status of F2?"));
    }

    #[test]
    fn transcript_fits_its_budget() {
        let m: Vec<Arc<Message>> = (0..50)
            .map(|i| Message::Tool {
                call_id: i.to_string(),
                name: "t".into(),
                content: "z".repeat(2000),
                is_error: false,
            })
            .map(Arc::new)
            .collect();
        let t = transcript(&m, 10_000);
        assert!(t.len() <= 10_000 + 40, "{}", t.len());
    }
}
