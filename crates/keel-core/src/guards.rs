//! The guardrails a runtime applies to every call, built once at startup:
//! before_tool_call hooks, the policy gate and the verifier.

use std::sync::Arc;
use std::time::Duration;

use keel_guard::hooks::{BeforeToolCall, HookAction, HookCall};
use keel_guard::policy::Policy;
use keel_guard::verify::Verifier;
use serde_json::Value;

/// A hook that has not answered by then is treated as a failure: the call is blocked.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Guards {
    pub policy: Policy,
    pub hooks: Vec<Arc<dyn BeforeToolCall>>,
    pub hook_timeout: Duration,
    pub verifier: Verifier,
}

impl Guards {
    /// Built-in rules only: roles, approval for `requires_approval` and
    /// dangerous tools, tenant isolation, non-empty results.
    pub fn defaults() -> Result<Self, String> {
        Ok(Self {
            policy: Policy::compile(&keel_config::PolicyConfig::default())
                .map_err(|e| e.to_string())?,
            hooks: Vec::new(),
            hook_timeout: DEFAULT_HOOK_TIMEOUT,
            verifier: Verifier::new(&keel_config::VerifyConfig::default()),
        })
    }
}

/// What the hook chain decided.
#[derive(Debug, Clone, PartialEq)]
pub enum HookOutcome {
    /// Run with these arguments; `rewritten_by` names the hooks that changed them.
    Allowed {
        args: Value,
        rewritten_by: Vec<String>,
    },
    Blocked {
        hook: String,
        reason: String,
    },
}

/// Runs the hooks in order. Each may block or rewrite; a hook that errors
/// or times out fails closed (the call is blocked).
pub async fn run_hooks(
    hooks: &[Arc<dyn BeforeToolCall>],
    timeout: Duration,
    tool: &str,
    args: Value,
    principal: &keel_protocol::Principal,
    run_id: &str,
) -> HookOutcome {
    let mut args = args;
    let mut rewritten_by = Vec::new();
    for hook in hooks {
        let call = HookCall {
            tool,
            args: &args,
            principal,
            run_id,
        };
        let answer = tokio::time::timeout(timeout, hook.before_tool_call(&call)).await;
        match answer {
            Ok(Ok(HookAction::Continue)) => {}
            Ok(Ok(HookAction::Rewrite(new))) => {
                rewritten_by.push(hook.name().to_owned());
                args = new;
            }
            Ok(Ok(HookAction::Block { reason })) => {
                return HookOutcome::Blocked {
                    hook: hook.name().to_owned(),
                    reason,
                };
            }
            Ok(Err(e)) => {
                return HookOutcome::Blocked {
                    hook: hook.name().to_owned(),
                    reason: format!("hook `{}` failed ({e}); the call is blocked", hook.name()),
                };
            }
            Err(_) => {
                return HookOutcome::Blocked {
                    hook: hook.name().to_owned(),
                    reason: format!(
                        "hook `{}` did not answer within {timeout:?}; the call is blocked",
                        hook.name()
                    ),
                };
            }
        }
    }
    HookOutcome::Allowed { args, rewritten_by }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_guard::hooks::HookError;
    use keel_protocol::Principal;
    use serde_json::json;

    struct Fixed(&'static str, Result<HookAction, HookError>, Duration);

    #[async_trait::async_trait]
    impl BeforeToolCall for Fixed {
        fn name(&self) -> &str {
            self.0
        }
        async fn before_tool_call(&self, _call: &HookCall<'_>) -> Result<HookAction, HookError> {
            tokio::time::sleep(self.2).await;
            self.1.clone()
        }
    }

    fn hook(name: &'static str, r: Result<HookAction, HookError>) -> Arc<dyn BeforeToolCall> {
        Arc::new(Fixed(name, r, Duration::ZERO))
    }

    async fn run(hooks: Vec<Arc<dyn BeforeToolCall>>) -> HookOutcome {
        run_hooks(
            &hooks,
            Duration::from_millis(50),
            "t",
            json!({"a": 1}),
            &Principal::local_default(),
            "run_1",
        )
        .await
    }

    #[tokio::test]
    async fn rewrites_chain_in_order_and_blocks_stop() {
        let out = run(vec![
            hook("one", Ok(HookAction::Rewrite(json!({"a": 2})))),
            hook("two", Ok(HookAction::Continue)),
        ])
        .await;
        assert_eq!(
            out,
            HookOutcome::Allowed {
                args: json!({"a": 2}),
                rewritten_by: vec!["one".into()]
            }
        );
        let out = run(vec![
            hook(
                "one",
                Ok(HookAction::Block {
                    reason: "no".into(),
                }),
            ),
            hook("two", Ok(HookAction::Rewrite(json!({})))),
        ])
        .await;
        assert_eq!(
            out,
            HookOutcome::Blocked {
                hook: "one".into(),
                reason: "no".into()
            }
        );
    }

    #[tokio::test]
    async fn errors_and_timeouts_fail_closed() {
        let out = run(vec![hook("bad", Err(HookError::Failed("boom".into())))]).await;
        assert!(
            matches!(out, HookOutcome::Blocked { ref hook, ref reason } if hook == "bad" && reason.contains("boom"))
        );
        let slow: Arc<dyn BeforeToolCall> = Arc::new(Fixed(
            "slow",
            Ok(HookAction::Continue),
            Duration::from_secs(5),
        ));
        let out = run(vec![slow]).await;
        assert!(
            matches!(out, HookOutcome::Blocked { ref reason, .. } if reason.contains("did not answer"))
        );
    }

    #[tokio::test]
    async fn no_hooks_allow_unchanged() {
        assert_eq!(
            run(vec![]).await,
            HookOutcome::Allowed {
                args: json!({"a": 1}),
                rewritten_by: vec![]
            }
        );
    }
}
