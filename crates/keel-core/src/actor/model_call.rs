//! One model call: cancellable, bounded by the run's deadline, with text
//! deltas persisted as `message_delta` events while it streams.

use std::time::{Duration, Instant as StdInstant};

use futures::StreamExt;
use keel_protocol::{ErrorBody, EventKind, ModelRequest, ModelResponse, RequestGate, Ungated};
use tokio::time::Instant;

use super::{Exit, RunActor};

/// The longest final answer kept; a runaway reply is cut with a note.
const MAX_ANSWER_BYTES: usize = 256 * 1024;

impl RunActor {
    /// Returns the response and the time spent waiting for the model.
    pub(super) async fn call_model(
        &mut self,
        request: ModelRequest,
        deadline: Option<Instant>,
    ) -> Result<(ModelResponse, Duration), Exit> {
        self.call_model_with(request, deadline, true).await
    }

    /// A call of keel's own (reflection, compaction, routing): it counts
    /// toward the run's budgets, but its text is not the answer, so nothing
    /// of it is streamed as `message_delta`.
    pub(super) async fn call_model_quiet(
        &mut self,
        request: ModelRequest,
    ) -> Result<(ModelResponse, Duration), Exit> {
        let deadline = self.deadline();
        self.call_model_with(request, Some(deadline), false).await
    }

    async fn call_model_with(
        &mut self,
        mut request: ModelRequest,
        deadline: Option<Instant>,
        stream: bool,
    ) -> Result<(ModelResponse, Duration), Exit> {
        if !self.held.0.is_empty() || !self.held.1.is_empty() {
            self.commit(Vec::new(), Vec::new()).await?;
        }
        self.check_behind().await?;
        debug_assert!(
            self.unanswered_calls().is_empty(),
            "every tool call needs a result before the next model call"
        );
        let quotas = &self.shared.options.quotas;
        if let Err(which) =
            crate::quota::check_tokens(quotas, self.shared.store.as_ref(), &self.principal.tenant)
                .await?
        {
            return Err(Exit::Budget(which));
        }
        // Reserved before the request is sent; a call that does not come
        // back with an answer (cancelled, timed out, failed) keeps its
        // worst case reserved, since it may have been billed.
        let reservation = match crate::spend::reserve(
            quotas,
            self.shared.store.as_ref(),
            &self.principal.tenant,
            &self.agent,
            &mut request,
        )
        .await?
        {
            Ok(reservation) => reservation,
            Err(crate::spend::Refusal::Limit(which)) => return Err(Exit::Budget(which)),
            Err(crate::spend::Refusal::Unpriced) => {
                return Err(Exit::Failed(ErrorBody::new(
                    "unpriced_model",
                    format!(
                        "model `{}` of agent `{}` has no price, and a spend limit applies to \
                         this run: set `price` on its provider (docs/spend.md)",
                        self.agent.model.model_name(),
                        self.agent.config.id
                    ),
                )));
            }
        };
        // Under a spend limit, retries and repairs inside the call are
        // reserved by this gate; without one, every request may go.
        let gate = reservation.map(|r| {
            std::sync::Arc::new(crate::spend::SpendGate::new(
                self.shared.store.clone(),
                &self.principal.tenant,
                r,
            ))
        });
        let (tx, mut rx) = futures::channel::mpsc::unbounded::<String>();
        let model = self.agent.model.clone();
        let span = crate::otel::chat(model.model_name(), &self.run_id);
        let call_gate = gate.clone();
        let call = tracing::Instrument::instrument(
            async move {
                let gate: &dyn RequestGate = match &call_gate {
                    Some(gate) => gate.as_ref(),
                    None => &Ungated,
                };
                model
                    .complete_gated(&request, stream.then_some(tx), gate)
                    .await
            },
            span.clone(),
        );
        tokio::pin!(call);
        let sleep = tokio::time::sleep_until(
            deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365)),
        );
        tokio::pin!(sleep);
        let started = StdInstant::now();
        let mut streamed = 0usize;
        let result = loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Exit::Cancelled),
                _ = &mut sleep => return Err(Exit::Budget(keel_protocol::Budget::MaxWallTime)),
                r = &mut call => break r,
                Some(delta) = rx.next() => {
                    let mut text = delta;
                    while let Ok(more) = rx.try_recv() {
                        text.push_str(&more);
                    }
                    streamed += self.emit_delta(text, streamed).await?;
                }
            }
        };
        let mut rest = String::new();
        while let Ok(more) = rx.try_recv() {
            rest.push_str(&more);
        }
        if !rest.is_empty() {
            self.emit_delta(rest, streamed).await?;
        }
        let elapsed = started.elapsed();
        metrics::histogram!("keel_llm_latency_seconds").record(elapsed.as_secs_f64());
        self.usage.llm_calls += 1;
        if result.is_err()
            && let Some(gate) = &gate
            && let Some(refusal) = gate.refusal().await
        {
            // A retry or repair would have passed a spend limit: the run
            // ends as at any limit, not as a provider failure.
            crate::otel::record_error(&span, "budget_exhausted");
            return Err(match refusal {
                Ok(which) => Exit::Budget(which),
                Err(e) => Exit::Store(e),
            });
        }
        let mut response = result.map_err(|e| {
            crate::otel::record_error(&span, "provider_error");
            Exit::Failed(ErrorBody::new("provider_error", e.to_string()))
        })?;
        crate::otel::record_chat(&span, &response);
        let reservation = match &gate {
            Some(gate) => gate.take_reservation().await,
            None => None,
        };
        crate::spend::settle(
            self.shared.store.as_ref(),
            &self.principal.tenant,
            &self.agent,
            reservation,
            &response.usage,
        )
        .await?;
        crate::quota::spend_tokens(
            &self.shared.options.quotas,
            self.shared.store.as_ref(),
            &self.principal.tenant,
            response
                .usage
                .prompt_tokens
                .saturating_add(response.usage.completion_tokens),
        )
        .await?;
        // Counts are the provider's word: they saturate rather than wrap
        // around, which would hide them from the token budget.
        self.usage.prompt_tokens = self
            .usage
            .prompt_tokens
            .saturating_add(response.usage.prompt_tokens);
        self.usage.completion_tokens = self
            .usage
            .completion_tokens
            .saturating_add(response.usage.completion_tokens);
        cap_text(&mut response.text);
        Ok((response, elapsed))
    }

    /// Persists and publishes streamed text, up to the answer cap. Returns bytes emitted.
    async fn emit_delta(&mut self, mut text: String, already: usize) -> Result<usize, Exit> {
        if already >= MAX_ANSWER_BYTES || text.is_empty() {
            return Ok(0);
        }
        let room = MAX_ANSWER_BYTES - already;
        if text.len() > room {
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        let n = text.len();
        self.commit_events(vec![EventKind::MessageDelta { text }])
            .await?;
        Ok(n)
    }
}

fn cap_text(text: &mut String) {
    if text.len() <= MAX_ANSWER_BYTES {
        return;
    }
    let mut cut = MAX_ANSWER_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = text.len() - cut;
    text.truncate(cut);
    text.push_str(&format!("\n[answer truncated: {dropped} more bytes]"));
}
