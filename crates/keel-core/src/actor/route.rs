//! Pre-routing (SPEC §4.9, `routing = "pre_route"`): one short tool-less
//! call decides whether the input needs tools at all. `CHAT` is answered
//! without tools; `TOOL` and `UNKNOWN` go through the usual loop, so a
//! wrong or unreadable decision costs one small call and nothing else.

use keel_protocol::{
    CompletionReason, Decision, EventKind, Message, ModelRequest, shared_messages,
};

use super::{Answer, Exit, RunActor};

const ROUTE_PROMPT: &str = "Classify the user's message for an assistant with business tools. \
Reply with exactly one word: CHAT if it can be answered from general knowledge or conversation alone, \
TOOL if answering needs live data or an action from the tools listed, UNKNOWN if unsure.";

/// A one-word answer; a little room for models that add punctuation.
const ROUTE_TOKENS: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Chat,
    Tool,
    Unknown,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "CHAT",
            Self::Tool => "TOOL",
            Self::Unknown => "UNKNOWN",
        }
    }
}

/// Reads the decision from the reply's first word that names a mode.
pub(crate) fn parse_mode(text: &str) -> Mode {
    for word in text
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
    {
        match word.to_ascii_uppercase().as_str() {
            "CHAT" => return Mode::Chat,
            "TOOL" | "TOOLS" => return Mode::Tool,
            "UNKNOWN" => return Mode::Unknown,
            _ => {}
        }
    }
    Mode::Unknown
}

impl RunActor {
    /// Decides the mode once per run; `Some` when the run was answered.
    pub(super) async fn pre_route(&mut self) -> Result<Option<Answer>, Exit> {
        self.state.course.routed = true;
        let tools = self.shared.tools().schemas_for(
            &self.agent.config.tools,
            &self.principal,
            &self.shared.guards.policy,
        );
        let (mode, source) = if tools.is_empty() && self.state.client_tools.is_empty() {
            (Mode::Chat, "rule")
        } else {
            let listing: Vec<String> = tools
                .iter()
                .chain(self.state.client_tools.iter())
                .map(|t| format!("- {}: {}", t.name, t.description))
                .collect();
            let request = ModelRequest {
                cache: Default::default(),
                messages: shared_messages(vec![
                    Message::system(format!("{ROUTE_PROMPT}\n\nTools:\n{}", listing.join("\n"))),
                    Message::user(self.input.clone()),
                ]),
                tools: Vec::new(),
                max_output_tokens: Some(ROUTE_TOKENS),
            };
            match self.call_model_quiet(request).await {
                Ok((r, _)) => (parse_mode(&r.text), "model"),
                Err(Exit::Failed(e)) => {
                    tracing::warn!(run = %self.run_id, error = %e.message, "pre-routing call failed; using the full loop");
                    (Mode::Unknown, "error")
                }
                Err(other) => return Err(other),
            }
        };
        let decided = EventKind::ModeDecision {
            mode: mode.as_str().into(),
            source: source.into(),
        };
        if mode != Mode::Chat {
            self.commit(vec![decided], Vec::new()).await?;
            return Ok(None);
        }
        let respond = EventKind::PolicyDecision {
            step: self.steps,
            decision: Decision::Respond,
            reason: "pre-routing judged the message answerable without tools".into(),
            rule: "pre_route".into(),
            call_id: None,
        };
        self.commit(vec![decided, respond], Vec::new()).await?;
        let answer = self
            .answer_without_tools(
                None,
                "Answer the user's message directly and completely. Do not call tools.",
                CompletionReason::Answered,
            )
            .await?;
        Ok(Some(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_read_from_loose_replies() {
        assert_eq!(parse_mode("CHAT"), Mode::Chat);
        assert_eq!(parse_mode("tool."), Mode::Tool);
        assert_eq!(parse_mode("**TOOL**"), Mode::Tool);
        assert_eq!(parse_mode("I think: chat"), Mode::Chat);
        assert_eq!(parse_mode("maybe"), Mode::Unknown);
        assert_eq!(parse_mode(""), Mode::Unknown);
    }
}
