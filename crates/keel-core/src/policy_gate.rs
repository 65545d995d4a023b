//! The policy gate as the loop sees it: one verdict per allowed call.

use keel_protocol::{Principal, Risk, ToolSpec};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GateDecision {
    Execute,
    Approve,
    Deny,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    pub decision: GateDecision,
    pub rule: String,
    pub reason: String,
}

/// Decides a call that passed the schema guard and hooks. Tools marked
/// `requires_approval` and dangerous tools need a person.
pub fn decide(spec: &ToolSpec, _principal: &Principal, _args: &Value) -> Gate {
    if spec.requires_approval {
        return Gate {
            decision: GateDecision::Approve,
            rule: "requires_approval".into(),
            reason: format!("`{}` is marked as requiring human approval", spec.name),
        };
    }
    if spec.risk >= Risk::Dangerous {
        return Gate {
            decision: GateDecision::Approve,
            rule: "risk_level".into(),
            reason: format!("`{}` is a {} tool", spec.name, spec.risk.as_str()),
        };
    }
    Gate {
        decision: GateDecision::Execute,
        rule: "default_allow".into(),
        reason: "allowed by the tool's roles and the agent's tool list".into(),
    }
}
