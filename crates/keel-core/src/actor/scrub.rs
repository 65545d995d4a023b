//! The last check of everything a run writes. Text enters a run already
//! redacted (user input at the runtime, tool output in `observe`, model
//! output in `redacting_model`); what a run makes of other sources (a
//! hook's reason, an error a delivery or a tool's transport reports)
//! is redacted here, before it is stored, published or shown to the model.

use keel_protocol::{ApprovalRecord, EventKind, Message, Redactor, RunPatch};

use super::RunActor;
use crate::redacting_model::redact_message;

impl RunActor {
    fn redactor(&self) -> &Redactor {
        &self.shared.options.redactor
    }

    /// Before they join the history the model is sent.
    pub(super) fn scrub_messages(&self, messages: &mut [Message]) {
        let r = self.redactor();
        if r.is_empty() {
            return;
        }
        for m in messages {
            redact_message(r, m);
        }
    }

    pub(super) fn scrub_events(&self, events: &mut [EventKind]) {
        let r = self.redactor();
        if r.is_empty() {
            return;
        }
        for e in events {
            scrub(r, e, "an event");
        }
    }

    pub(super) fn scrub_patch(&self, patch: &mut RunPatch) {
        let r = self.redactor();
        if r.is_empty() {
            return;
        }
        if let Some(output) = &mut patch.output {
            r.redact_string(output);
        }
        if let Some(error) = &mut patch.error {
            r.redact_string(&mut error.message);
        }
        if let Some(Some(pending)) = &mut patch.pending {
            scrub(r, pending, "the run's pending request");
        }
    }

    pub(super) fn scrub_approvals(&self, approvals: &mut [ApprovalRecord]) {
        let r = self.redactor();
        if r.is_empty() {
            return;
        }
        for a in approvals {
            r.redact_json(&mut a.arguments);
            r.redact_string(&mut a.reason);
        }
    }

    /// The loop state (goals, learned constraints, queued follow-ups) as
    /// it is about to be stored; true when it had to be cleaned.
    pub(super) fn scrub_state(&mut self, serialized: &str) -> bool {
        let r = self.shared.options.redactor.clone();
        if !r.contains_secret(serialized) {
            return false;
        }
        scrub(&r, &mut self.state, "the loop state");
        true
    }
}

fn scrub<T: serde::Serialize + serde::de::DeserializeOwned>(
    r: &Redactor,
    value: &mut T,
    what: &str,
) {
    if let Err(e) = r.redact_serde(value) {
        // Cannot happen for keel's own types, which are stored as JSON.
        tracing::error!(error = %e, "could not check {what} for secrets");
    }
}
