//! Operator settings layered over what a tool says about itself: a remote
//! MCP server's own annotations are hints, the configuration is authority.

use std::time::Duration;

use keel_config::ToolOverride;
use keel_protocol::ToolSpec;

/// Applies every field the override sets; unset fields keep the tool's own value.
pub fn apply_override(spec: &mut ToolSpec, o: &ToolOverride) {
    if let Some(risk) = o.risk {
        spec.risk = risk;
    }
    if let Some(requires_approval) = o.requires_approval {
        spec.requires_approval = requires_approval;
    }
    if let Some(trust) = o.output_trust {
        spec.output_trust = trust;
    }
    if let Some(idempotent) = o.idempotent {
        spec.idempotent = idempotent;
    }
    if let Some(timeout_s) = o.timeout_s {
        spec.timeout = Duration::from_secs(timeout_s);
    }
    if let Some(roles) = &o.roles {
        spec.roles.clone_from(roles);
    }
    if let Some(poll) = o.poll {
        spec.poll = poll;
    }
    if let Some(fields) = &o.volatile_fields {
        spec.volatile_fields.clone_from(fields);
    }
}

#[cfg(test)]
mod tests {
    use keel_protocol::Risk;
    use serde_json::json;

    use super::*;

    #[test]
    fn set_fields_replace_and_unset_fields_keep() {
        let mut spec = ToolSpec::new("plant.restart", "restart", json!({}));
        spec.idempotent = true;
        spec.roles = vec!["viewer".into()];
        let o = ToolOverride {
            risk: Some(Risk::Dangerous),
            requires_approval: Some(true),
            timeout_s: Some(5),
            roles: Some(vec!["operator".into()]),
            poll: Some(true),
            volatile_fields: Some(vec!["ts".into()]),
            ..ToolOverride::default()
        };
        apply_override(&mut spec, &o);
        assert_eq!(spec.risk, Risk::Dangerous);
        assert!(spec.requires_approval);
        assert!(spec.idempotent, "unset field must keep the tool's value");
        assert_eq!(spec.timeout, Duration::from_secs(5));
        assert_eq!(spec.roles, vec!["operator".to_string()]);
        assert!(spec.poll);
        assert_eq!(spec.volatile_fields, vec!["ts".to_string()]);

        let before = spec.clone();
        apply_override(&mut spec, &ToolOverride::default());
        assert_eq!(spec, before);
    }
}
