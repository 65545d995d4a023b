//! The policy gate (SPEC §4.6): the model proposes a call, code decides
//! whether it runs. Every rule that applies yields a typed [`Verdict`]; the
//! strictest one wins, so no rule can loosen what another tightened.

use keel_config::{
    ArgMatcher, DefaultDecision, PolicyConfig, PolicyRule, RuleDecision, UntrustedArguments,
    tool_pattern_matches,
};
use keel_protocol::{Principal, Risk, ToolSpec};
use regex::Regex;
use serde_json::Value;

/// Ordered by strictness, so `max` is the merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PolicyDecision {
    Execute,
    /// The user confirms first (e.g. the model was not confident enough).
    Clarify,
    Approve,
    Deny,
}

impl PolicyDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Execute => "execute",
            Self::Clarify => "clarify",
            Self::Approve => "approve",
            Self::Deny => "deny",
        }
    }
}

impl From<RuleDecision> for PolicyDecision {
    fn from(d: RuleDecision) -> Self {
        match d {
            RuleDecision::Execute => Self::Execute,
            RuleDecision::Clarify => Self::Clarify,
            RuleDecision::Approve => Self::Approve,
            RuleDecision::Deny => Self::Deny,
        }
    }
}

/// One rule's decision; `rule` goes into `policy_decision` events and
/// `reason` is what the model (or approver) is told.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub decision: PolicyDecision,
    pub rule: String,
    pub reason: String,
}

impl Verdict {
    fn new(decision: PolicyDecision, rule: &str, reason: String) -> Self {
        Self {
            decision,
            rule: rule.to_owned(),
            reason,
        }
    }
}

/// The strictest verdict; among equally strict ones the first is kept, so
/// the rule reported is the earliest that decided.
pub fn strictest(verdicts: impl IntoIterator<Item = Verdict>) -> Option<Verdict> {
    verdicts.into_iter().fold(None, |best, v| match best {
        Some(b) if b.decision >= v.decision => Some(b),
        _ => Some(v),
    })
}

pub const RULE_TOOL_ROLES: &str = "tool_roles";
pub const RULE_REQUIRES_APPROVAL: &str = "requires_approval";
pub const RULE_RISK_LEVEL: &str = "risk_level";
pub const RULE_DEFAULT_ALLOW: &str = "default_allow";
pub const RULE_DEFAULT_DENY: &str = "default_deny";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "policy rule {rule:?}: when_arguments.{argument}.{key}: invalid regular expression: {message}"
    )]
    InvalidPattern {
        rule: String,
        argument: String,
        key: &'static str,
        message: String,
    },
}

/// What the gate looks at for one proposed call.
#[derive(Debug, Clone, Copy)]
pub struct PolicyInput<'a> {
    pub principal: &'a Principal,
    pub tool: &'a ToolSpec,
    pub args: &'a Value,
    /// Calls of this tool already executed in this run.
    pub calls_of_tool: u32,
    /// Calls of any tool already executed in this run.
    pub tool_calls: u32,
    /// The model's stated confidence in this call, when it gave one.
    pub confidence: Option<f64>,
}

/// The configured policy, with every regex compiled once at startup.
#[derive(Debug, Clone)]
pub struct Policy {
    default: DefaultDecision,
    approval_risk: Risk,
    approval_timeout_s: u64,
    see_but_ask: bool,
    untrusted_arguments: UntrustedArguments,
    untrusted_min_risk: Risk,
    rules: Vec<Rule>,
}

/// How the provenance stage treats one call's arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvenanceCheck {
    pub mode: UntrustedArguments,
    /// The arguments that matter (empty = all).
    pub arguments: Vec<String>,
    /// The rule that set it, or `policy` for `[policy] untrusted_arguments`.
    pub source: String,
}

#[derive(Debug, Clone)]
struct Rule {
    name: String,
    tools: Vec<String>,
    roles: Vec<String>,
    tenants: Vec<String>,
    min_risk: Option<Risk>,
    arguments: Vec<(String, Matcher)>,
    max_calls_per_run: Option<u32>,
    min_confidence: Option<f64>,
    decision: PolicyDecision,
    reason: Option<String>,
    untrusted_arguments: Option<UntrustedArguments>,
    /// The arguments whose provenance matters (empty = all).
    provenance_arguments: Vec<String>,
}

#[derive(Debug, Clone)]
struct Matcher {
    pattern: Option<Regex>,
    not_pattern: Option<Regex>,
    one_of: Option<Vec<Value>>,
    not_one_of: Option<Vec<Value>>,
    min: Option<f64>,
    max: Option<f64>,
}

impl Policy {
    pub fn compile(cfg: &PolicyConfig) -> Result<Policy, PolicyError> {
        let rules = cfg
            .rules
            .iter()
            .map(compile_rule)
            .collect::<Result<_, _>>()?;
        Ok(Policy {
            default: cfg.default,
            approval_risk: cfg.approval_risk,
            approval_timeout_s: cfg.approval_timeout_s,
            see_but_ask: cfg.see_but_ask,
            untrusted_arguments: cfg.untrusted_arguments,
            untrusted_min_risk: cfg.untrusted_arguments_min_risk,
            rules,
        })
    }

    /// The provenance check for calls of `tool` by `principal`: the
    /// strictest setting among the rules for this tool that name one (their
    /// tools, roles, tenants and risk are what counts here), else the
    /// policy's own for tools at or above `untrusted_arguments_min_risk`.
    /// `None` when arguments of any origin are allowed.
    pub fn provenance(&self, principal: &Principal, tool: &ToolSpec) -> Option<ProvenanceCheck> {
        let by_rule = self
            .rules
            .iter()
            .filter(|r| r.untrusted_arguments.is_some() && r.applies_to(principal, tool))
            .max_by_key(|r| r.untrusted_arguments);
        let check = match by_rule {
            Some(rule) => ProvenanceCheck {
                mode: rule.untrusted_arguments.unwrap_or_default(),
                arguments: rule.provenance_arguments.clone(),
                source: rule.name.clone(),
            },
            None if tool.risk >= self.untrusted_min_risk => ProvenanceCheck {
                mode: self.untrusted_arguments,
                arguments: Vec::new(),
                source: "policy".into(),
            },
            None => return None,
        };
        (check.mode != UntrustedArguments::Allow).then_some(check)
    }

    /// Whether every call of `tool` waits for a person, whatever its
    /// arguments: the tool asks for it, or its risk is at or above
    /// `approval_risk`. Rules and provenance may ask for more calls.
    pub fn always_asks(&self, tool: &ToolSpec) -> bool {
        tool.requires_approval || tool.risk >= self.approval_risk
    }

    /// How long an approval may stay pending before it counts as a denial.
    pub fn approval_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.approval_timeout_s)
    }

    /// Every applicable rule is evaluated and the strictest verdict wins.
    /// The default applies only when no configured rule matched: otherwise
    /// `default = "deny"` would outrank every rule that allows a call.
    pub fn decide(&self, input: &PolicyInput<'_>) -> Verdict {
        let tool = input.tool;
        let mut verdicts = Vec::new();
        if !has_required_role(input.principal, tool) {
            let (decision, verb) = if self.see_but_ask {
                (PolicyDecision::Approve, "needs approval")
            } else {
                (PolicyDecision::Deny, "is not allowed")
            };
            verdicts.push(Verdict::new(
                decision,
                RULE_TOOL_ROLES,
                format!(
                    "{} {verb}: it requires one of the roles {}",
                    tool.name,
                    tool.roles.join(", ")
                ),
            ));
        }
        if tool.requires_approval {
            verdicts.push(Verdict::new(
                PolicyDecision::Approve,
                RULE_REQUIRES_APPROVAL,
                format!("{} requires human approval", tool.name),
            ));
        }
        if tool.risk >= self.approval_risk {
            verdicts.push(Verdict::new(
                PolicyDecision::Approve,
                RULE_RISK_LEVEL,
                format!(
                    "{} has risk {}, which needs human approval",
                    tool.name,
                    tool.risk.as_str()
                ),
            ));
        }
        let mut matched = false;
        for rule in self.rules.iter().filter(|r| r.matches(input)) {
            matched = true;
            let reason = rule
                .reason
                .clone()
                .unwrap_or_else(|| format!("policy rule {} applies to {}", rule.name, tool.name));
            verdicts.push(Verdict::new(rule.decision, &rule.name, reason));
        }
        if !matched {
            verdicts.push(match self.default {
                DefaultDecision::Execute => Verdict::new(
                    PolicyDecision::Execute,
                    RULE_DEFAULT_ALLOW,
                    format!("{} is allowed by default", tool.name),
                ),
                DefaultDecision::Deny => Verdict::new(
                    PolicyDecision::Deny,
                    RULE_DEFAULT_DENY,
                    format!("no policy rule allows {}", tool.name),
                ),
            });
        }
        // Never empty: the default or a matched rule is always pushed.
        strictest(verdicts)
            .unwrap_or_else(|| Verdict::new(PolicyDecision::Deny, RULE_DEFAULT_DENY, String::new()))
    }

    /// Whether a principal may see the tool (in /ai/tools and the prompt):
    /// false when its roles forbid it, unless see_but_ask.
    pub fn visible(&self, principal: &Principal, tool: &ToolSpec) -> bool {
        self.see_but_ask || has_required_role(principal, tool)
    }
}

fn has_required_role(principal: &Principal, tool: &ToolSpec) -> bool {
    tool.roles.is_empty() || principal.roles.iter().any(|r| tool.roles.contains(r))
}

fn compile_rule(rule: &PolicyRule) -> Result<Rule, PolicyError> {
    let mut arguments = Vec::with_capacity(rule.when_arguments.len());
    for (argument, m) in &rule.when_arguments {
        arguments.push((argument.clone(), compile_matcher(&rule.name, argument, m)?));
    }
    Ok(Rule {
        name: rule.name.clone(),
        tools: rule.tools.clone(),
        roles: rule.roles.clone(),
        tenants: rule.tenants.clone(),
        min_risk: rule.min_risk,
        arguments,
        max_calls_per_run: rule.max_calls_per_run,
        min_confidence: rule.min_confidence,
        decision: rule.decision.into(),
        reason: rule.reason.clone(),
        untrusted_arguments: rule.untrusted_arguments,
        provenance_arguments: rule.arguments.clone(),
    })
}

fn compile_matcher(rule: &str, argument: &str, m: &ArgMatcher) -> Result<Matcher, PolicyError> {
    let regex =
        |key: &'static str, pattern: &Option<String>| {
            pattern.as_deref().map(Regex::new).transpose().map_err(|e| {
                PolicyError::InvalidPattern {
                    rule: rule.to_owned(),
                    argument: argument.to_owned(),
                    key,
                    message: regex_error(&e),
                }
            })
        };
    Ok(Matcher {
        pattern: regex("pattern", &m.pattern)?,
        not_pattern: regex("not_pattern", &m.not_pattern)?,
        one_of: m.one_of.clone(),
        not_one_of: m.not_one_of.clone(),
        min: m.min,
        max: m.max,
    })
}

impl Rule {
    /// The rule's conditions on who calls which tool (not on the call).
    fn applies_to(&self, p: &Principal, tool: &ToolSpec) -> bool {
        (self.tools.is_empty()
            || self
                .tools
                .iter()
                .any(|t| tool_pattern_matches(t, &tool.name)))
            && (self.roles.is_empty() || p.roles.iter().any(|r| self.roles.contains(r)))
            && (self.tenants.is_empty() || self.tenants.contains(&p.tenant))
            && self.min_risk.is_none_or(|min| tool.risk >= min)
    }

    fn matches(&self, input: &PolicyInput<'_>) -> bool {
        self.applies_to(input.principal, input.tool)
            && self
                .max_calls_per_run
                .is_none_or(|n| input.calls_of_tool >= n)
            && self
                .min_confidence
                .is_none_or(|min| input.confidence.is_some_and(|c| c < min))
            && self.arguments.iter().all(|(name, m)| {
                input
                    .args
                    .get(name)
                    .filter(|v| !v.is_null())
                    .is_some_and(|v| m.matches(v))
            })
    }
}

impl Matcher {
    fn matches(&self, value: &Value) -> bool {
        let text = text_of(value);
        self.pattern.as_ref().is_none_or(|r| r.is_match(&text))
            && self.not_pattern.as_ref().is_none_or(|r| !r.is_match(&text))
            && self
                .one_of
                .as_ref()
                .is_none_or(|list| list.iter().any(|c| loosely_equal(value, c)))
            && self
                .not_one_of
                .as_ref()
                .is_none_or(|list| !list.iter().any(|c| loosely_equal(value, c)))
            && self.bounds_hold(value)
    }

    fn bounds_hold(&self, value: &Value) -> bool {
        if self.min.is_none() && self.max.is_none() {
            return true;
        }
        let Some(n) = number_of(value) else {
            return false;
        };
        self.min.is_none_or(|min| n >= min) && self.max.is_none_or(|max| n <= max)
    }
}

/// A regex syntax error renders as several lines with a caret under the
/// pattern; an error message needs just its last line, the cause.
pub(crate) fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    match e {
        regex::Error::Syntax(_) => text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().trim_start_matches("error: ").to_owned())
            .unwrap_or(text),
        _ => text,
    }
}

/// Strings as written, anything else as its JSON text, so a rule cannot be
/// slipped by sending `5` where it expects `"5"`.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn number_of(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
        _ => None,
    }
}

fn loosely_equal(value: &Value, candidate: &Value) -> bool {
    match (number_of(value), number_of(candidate)) {
        (Some(a), Some(b)) if value.is_number() || candidate.is_number() => a == b,
        _ => text_of(value) == text_of(candidate),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
