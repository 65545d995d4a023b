//! Session reset (SPEC §6): the session's history is archived and a summary
//! goes to long-term memory, so the next run starts fresh but can still
//! find what was said through `memory_search`.

use crate::transcript::{keep_tail, render};
use std::sync::Arc;

use keel_protocol::{Message, ModelRequest, Principal, StoreError, shared_messages};
use serde::Serialize;

use crate::error::CoreError;
use crate::runtime::Runtime;

/// Where session summaries go (implemented over keel's memory index).
#[async_trait::async_trait]
pub trait SessionMemory: Send + Sync {
    /// Stores a session summary; returns the memory document id.
    async fn remember_session(
        &self,
        tenant: &str,
        agent: &str,
        session: &str,
        archived_as: &str,
        markdown: &str,
    ) -> Result<String, String>;
}

/// What a reset did.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SessionReset {
    pub session: String,
    pub archived_as: String,
    pub messages: usize,
    /// `model` when the agent's model wrote the summary, `fallback` when the
    /// last messages were kept verbatim instead.
    #[schema(value_type = String, pattern = "^(model|fallback)$")]
    pub summarized_by: &'static str,
    pub summary: String,
    pub memory_id: Option<String>,
}

/// Typed as a run's input, these reset the session instead of asking the model.
pub fn is_reset_command(input: &str) -> bool {
    matches!(input.trim(), "/new" | "/reset")
}

const SUMMARY_PROMPT: &str = "Summarize this conversation for long-term memory. Write Markdown with \
three short sections: Facts, Decisions, Open items. Keep every identifier (furnace ids, batch \
numbers, names, dates, numbers) exactly as written. Do not invent anything.";

/// Transcript characters sent to the summarizer; the newest part is kept.
const MAX_TRANSCRIPT_CHARS: usize = 24_000;

impl Runtime {
    /// Archives the session and writes its summary to memory.
    pub async fn reset_session(
        &self,
        principal: &Principal,
        session: &str,
        agent: Option<&str>,
    ) -> Result<SessionReset, CoreError> {
        let agent_id = agent.unwrap_or(self.default_agent()).to_owned();
        let agent = self
            .agent(&agent_id)
            .ok_or_else(|| CoreError::BadRequest(format!("agent: no agent named `{agent_id}`")))?;
        let (archived_as, messages) = self
            .store()
            .archive_session(&principal.tenant, session)
            .await
            .map_err(|e| match e {
                StoreError::NotFound => CoreError::NotFound,
                StoreError::Conflict(m) => CoreError::Conflict(m),
                other => CoreError::Store(other),
            })?;
        let transcript = render(messages.iter().map(|(_, m)| m), usize::MAX);
        let (summarized_by, summary) = if transcript.is_empty() {
            ("fallback", "(the session had no messages)".to_owned())
        } else {
            let request = ModelRequest {
                cache: Default::default(),
                messages: shared_messages(vec![
                    Message::system(SUMMARY_PROMPT),
                    Message::user(keep_tail(&transcript, MAX_TRANSCRIPT_CHARS)),
                ]),
                tools: Vec::new(),
                max_output_tokens: Some(1024),
            };
            match agent.model.complete(&request, None).await {
                Ok(r) if !r.text.trim().is_empty() => ("model", r.text.trim().to_owned()),
                Ok(_) => (
                    "fallback",
                    verbatim(&messages, self.options().summary_fallback_messages),
                ),
                Err(e) => {
                    tracing::warn!(session, error = %e, "session summary failed; keeping the last messages verbatim");
                    (
                        "fallback",
                        verbatim(&messages, self.options().summary_fallback_messages),
                    )
                }
            }
        };
        let markdown = format!(
            "# Session {session}\n\nArchived as `{archived_as}` on {}, {} messages, agent `{agent_id}`.\n\n{summary}\n",
            keel_protocol::now().format("%Y-%m-%d %H:%M UTC"),
            messages.len()
        );
        // The summary is the model's (already redacted) or stored messages
        // verbatim, which a session older than a secret may still carry.
        let markdown = self.options().redactor.redact(&markdown).into_owned();
        let memory_id = match self.session_memory() {
            Some(memory) => match memory
                .remember_session(
                    &principal.tenant,
                    &agent_id,
                    session,
                    &archived_as,
                    &markdown,
                )
                .await
            {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::warn!(session, error = %e, "could not write the session summary to memory");
                    None
                }
            },
            None => None,
        };
        Ok(SessionReset {
            session: session.to_owned(),
            archived_as,
            messages: messages.len(),
            summarized_by,
            summary: markdown,
            memory_id,
        })
    }
}

fn verbatim(messages: &[(String, Message)], n: usize) -> String {
    let start = messages.len().saturating_sub(n.max(1));
    format!(
        "## Last messages (verbatim)\n\n{}",
        render(messages[start..].iter().map(|(_, m)| m), usize::MAX)
    )
}

/// Shared handle type for the runtime options.
pub type SharedSessionMemory = Arc<dyn SessionMemory>;
