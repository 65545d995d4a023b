//! `before_tool_call` hooks (SPEC §4.5): ordered checks that may block a
//! call or rewrite its arguments before the policy gate sees it.
//!
//! Hooks are synchronous and must not do I/O: they run inside the guard
//! pipeline, which is one pure function of the call, the tool set and the
//! run, so that every entry path decides the same way and the decision can
//! be tested without a runtime. Running the chain (order, failing closed)
//! is the pipeline's job.

use keel_config::{HookConfig, HookKind, tool_pattern_matches};
use keel_protocol::Principal;
use regex::Regex;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum HookAction {
    Continue,
    /// Replaces the whole arguments object; the caller re-validates it.
    Rewrite(Value),
    /// The call is not executed; `reason` is what the model is told.
    Block {
        reason: String,
    },
}

/// The proposed call a hook looks at.
#[derive(Debug, Clone, Copy)]
pub struct HookCall<'a> {
    pub tool: &'a str,
    pub args: &'a Value,
    pub principal: &'a Principal,
    pub run_id: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    Failed(String),
}

pub trait BeforeToolCall: Send + Sync {
    fn name(&self) -> &str;
    fn before_tool_call(&self, call: &HookCall<'_>) -> Result<HookAction, HookError>;
}

/// A hook built from one `[[hooks]]` entry.
#[derive(Debug, Clone)]
pub struct ConfigHook {
    name: String,
    tools: Vec<String>,
    argument: String,
    action: Action,
}

#[derive(Debug, Clone)]
enum Action {
    InjectTenant,
    Default(Value),
    DenyPattern { pattern: Regex, reason: String },
}

impl ConfigHook {
    pub fn compile(cfg: &HookConfig) -> Result<ConfigHook, HookError> {
        let name = cfg.display_name();
        if cfg.argument.is_empty() {
            return Err(HookError::Failed(format!(
                "hook {name}: argument must not be empty"
            )));
        }
        let action = match cfg.kind {
            HookKind::InjectTenant => Action::InjectTenant,
            HookKind::Default => match &cfg.value {
                Some(value) => Action::Default(value.clone()),
                None => {
                    return Err(HookError::Failed(format!(
                        "hook {name}: a default hook needs value"
                    )));
                }
            },
            HookKind::DenyPattern => {
                let Some(pattern) = &cfg.pattern else {
                    return Err(HookError::Failed(format!(
                        "hook {name}: a deny_pattern hook needs pattern"
                    )));
                };
                let pattern = Regex::new(pattern).map_err(|e| {
                    HookError::Failed(format!(
                        "hook {name}: invalid regular expression: {}",
                        crate::policy::regex_error(&e)
                    ))
                })?;
                let reason = cfg
                    .reason
                    .clone()
                    .unwrap_or_else(|| format!("the value of {} is not allowed", cfg.argument));
                Action::DenyPattern { pattern, reason }
            }
        };
        Ok(ConfigHook {
            name,
            tools: cfg.tools.clone(),
            argument: cfg.argument.clone(),
            action,
        })
    }

    /// The hook's whole decision; synchronous because configured hooks
    /// only look at the call itself.
    pub fn apply(&self, call: &HookCall<'_>) -> Result<HookAction, HookError> {
        if !self.tools.is_empty()
            && !self
                .tools
                .iter()
                .any(|t| tool_pattern_matches(t, call.tool))
        {
            return Ok(HookAction::Continue);
        }
        let current = call.args.get(&self.argument);
        match &self.action {
            Action::InjectTenant => {
                let tenant = Value::String(call.principal.tenant.clone());
                if current == Some(&tenant) {
                    return Ok(HookAction::Continue);
                }
                self.rewrite(call, tenant)
            }
            Action::Default(value) => {
                if current.is_some_and(|v| !v.is_null()) {
                    return Ok(HookAction::Continue);
                }
                self.rewrite(call, value.clone())
            }
            Action::DenyPattern { pattern, reason } => {
                let blocked = match current {
                    None | Some(Value::Null) => false,
                    Some(Value::String(s)) => pattern.is_match(s),
                    Some(other) => pattern.is_match(&other.to_string()),
                };
                Ok(if blocked {
                    HookAction::Block {
                        reason: reason.clone(),
                    }
                } else {
                    HookAction::Continue
                })
            }
        }
    }

    fn rewrite(&self, call: &HookCall<'_>, value: Value) -> Result<HookAction, HookError> {
        // Arguments that are not an object have nowhere to put the value;
        // failing lets the chain fail closed instead of running the call
        // without the tenant it was meant to carry.
        let Value::Object(map) = call.args else {
            return Err(HookError::Failed(format!(
                "hook {}: arguments of {} are not an object",
                self.name, call.tool
            )));
        };
        let mut map = map.clone();
        map.insert(self.argument.clone(), value);
        Ok(HookAction::Rewrite(Value::Object(map)))
    }
}

impl BeforeToolCall for ConfigHook {
    fn name(&self) -> &str {
        &self.name
    }

    fn before_tool_call(&self, call: &HookCall<'_>) -> Result<HookAction, HookError> {
        self.apply(call)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
