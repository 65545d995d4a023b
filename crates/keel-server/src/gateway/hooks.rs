//! HTTP hooks (`[[routing.hooks]]`): POSTs to the operator's own service at
//! the dispatch steps, in the manner of Kubernetes admission webhooks.
//! `message_received` only observes and never holds a message up;
//! `before_prompt_build` may return `{"context": "..."}`, added to the run's
//! system prompt; both fail open, so the chat keeps working when the hook
//! service does not. `before_tool_call` sees every call the guard pipeline
//! cleared and may refuse it; it fails closed, as a dangerous action must
//! not run because a check could not be made.

use std::time::{Duration, SystemTime};

use keel_config::{Config, DispatchHook, Env, HookPoint, secret_from_env, tool_pattern_matches};
use keel_gateway::Inbound;
use keel_gateway::signature::keel_signature_headers;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

/// A configured hook with its secret, if it signs.
pub(super) struct Hook {
    config: DispatchHook,
    secret: Option<SecretString>,
}

/// Why the hooks cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum HookSetupError {
    #[error("routing.hooks[{index}].secret_env: environment variable {var} is not set")]
    SecretUnset { index: usize, var: String },
}

pub(super) fn load(hooks: &[DispatchHook], env: &dyn Env) -> Result<Vec<Hook>, HookSetupError> {
    hooks
        .iter()
        .enumerate()
        .map(|(index, h)| {
            let secret =
                match &h.secret_env {
                    Some(var) => Some(secret_from_env(env, var).ok_or_else(|| {
                        HookSetupError::SecretUnset {
                            index,
                            var: var.clone(),
                        }
                    })?),
                    None => None,
                };
            Ok(Hook {
                config: h.clone(),
                secret,
            })
        })
        .collect()
}

/// What a hook is told about a message and where it goes.
pub(super) fn payload(point: HookPoint, msg: &Inbound, route: &keel_gateway::Route) -> Value {
    json!({
        "point": point.as_str(),
        "channel": msg.channel,
        "tenant": msg.tenant,
        "sender": msg.sender,
        "person": route.person,
        "chat": msg.chat,
        "chat_type": msg.chat_type.as_str(),
        "thread": msg.thread,
        "text": msg.text,
        "agent": route.agent,
        "session": route.session_key,
        "matched_by": route.matched_by.as_str(),
    })
}

impl Hook {
    fn applies(&self, point: HookPoint, channel: &str) -> bool {
        self.config.point == point
            && (self.config.channels.is_empty()
                || self.config.channels.iter().any(|c| c == channel))
    }

    /// One POST; the answer's JSON, or why there is none.
    async fn call(&self, http: &reqwest::Client, body: &Value) -> Result<Value, String> {
        let bytes = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let mut request = http
            .post(&self.config.url)
            .timeout(Duration::from_millis(self.config.timeout_ms))
            .header("content-type", "application/json");
        if let Some(secret) = &self.secret
            && let Some(headers) =
                keel_signature_headers(secret.expose_secret().as_bytes(), &bytes, SystemTime::now())
        {
            for (k, v) in headers {
                request = request.header(k, v);
            }
        }
        let response = request
            .body(bytes)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        let text = response.text().await.map_err(|e| e.to_string())?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| format!("the answer is not JSON: {e}"))
    }
}

/// Tells every `message_received` hook of the channel, without waiting.
pub(super) fn message_received(
    hooks: &std::sync::Arc<Vec<Hook>>,
    http: &reqwest::Client,
    body: Value,
) {
    let channel = body["channel"].as_str().unwrap_or_default().to_owned();
    if !hooks
        .iter()
        .any(|h| h.applies(HookPoint::MessageReceived, &channel))
    {
        return;
    }
    let (hooks, http) = (hooks.clone(), http.clone());
    tokio::spawn(async move {
        for hook in hooks
            .iter()
            .filter(|h| h.applies(HookPoint::MessageReceived, &channel))
        {
            if let Err(e) = hook.call(&http, &body).await {
                tracing::warn!(url = %hook.config.url, error = %e, "message_received hook failed; ignored");
            }
        }
    });
}

/// The context every `before_prompt_build` hook of the channel adds, in
/// configuration order; hooks that fail add nothing.
pub(super) async fn prompt_context(
    hooks: &[Hook],
    http: &reqwest::Client,
    body: &Value,
) -> Option<String> {
    let channel = body["channel"].as_str().unwrap_or_default();
    let mut parts = Vec::new();
    for hook in hooks
        .iter()
        .filter(|h| h.applies(HookPoint::BeforePromptBuild, channel))
    {
        match hook.call(http, body).await {
            Ok(answer) => match answer.get("context") {
                Some(Value::String(c)) if !c.trim().is_empty() => parts.push(c.trim().to_owned()),
                None | Some(Value::Null) => {}
                Some(Value::String(_)) => {}
                Some(other) => tracing::warn!(
                    url = %hook.config.url,
                    got = %other,
                    "before_prompt_build hook answered a context that is not text; ignored"
                ),
            },
            Err(e) => {
                tracing::warn!(url = %hook.config.url, error = %e, "before_prompt_build hook failed; no context added");
            }
        }
    }
    (!parts.is_empty()).then(|| parts.join("\n\n"))
}

/// The `before_tool_call` hooks, as the runtime's admission check.
pub struct HttpAdmission {
    hooks: Vec<(usize, Hook)>,
    http: reqwest::Client,
}

impl HttpAdmission {
    /// The configuration's `before_tool_call` hooks; `None` when it has none.
    pub fn from_config(
        config: &Config,
        env: &dyn Env,
    ) -> Result<Option<Self>, super::GatewayError> {
        let hooks: Vec<(usize, Hook)> = load(&config.routing.hooks, env)?
            .into_iter()
            .enumerate()
            .filter(|(_, h)| h.config.point == HookPoint::BeforeToolCall)
            .collect();
        if hooks.is_empty() {
            return Ok(None);
        }
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Some(Self { hooks, http }))
    }
}

#[async_trait::async_trait]
impl keel_core::Admission for HttpAdmission {
    async fn admit(&self, call: keel_core::AdmissionCall<'_>) -> Result<(), (String, String)> {
        let body = json!({
            "point": HookPoint::BeforeToolCall.as_str(),
            "tenant": call.tenant,
            "principal": call.principal,
            "agent": call.agent,
            "session": call.session,
            "run_id": call.run_id,
            "call_id": call.call_id,
            "tool": call.tool,
            "arguments": call.arguments,
        });
        for (index, hook) in &self.hooks {
            let patterns = &hook.config.tools;
            if !patterns.is_empty() && !patterns.iter().any(|p| tool_pattern_matches(p, call.tool))
            {
                continue;
            }
            let rule = format!("before_tool_call_hook[{index}]");
            let refused = |why: String| Err((rule.clone(), why));
            match hook.call(&self.http, &body).await {
                Ok(answer) => match answer.get("decision").and_then(Value::as_str) {
                    Some("allow") => {}
                    Some("deny") => {
                        let reason = answer
                            .get("reason")
                            .and_then(Value::as_str)
                            .filter(|r| !r.trim().is_empty())
                            .unwrap_or("the operator's check refused it");
                        return refused(format!("{} was refused: {reason}", call.tool));
                    }
                    _ => {
                        return refused(format!(
                            "{} was not run: the operator's check answered no decision",
                            call.tool
                        ));
                    }
                },
                Err(e) => {
                    tracing::warn!(url = %hook.config.url, error = %e, "before_tool_call hook failed; the call is refused");
                    return refused(format!(
                        "{} was not run: the operator's check could not be reached ({e})",
                        call.tool
                    ));
                }
            }
        }
        Ok(())
    }
}
