//! Checks on the guardrail sections — `policy`, `hooks`, `verify` — whose
//! types are right but whose content cannot work: regexes that do not
//! compile, hooks missing what their kind needs, bounds that exclude every
//! value. keel-guard compiles the same regexes at startup; catching them here
//! lets `keel check` name the key instead of failing the server later.

use std::collections::BTreeMap;

use crate::findings::Findings;
use crate::model::{ArgMatcher, Config, HookConfig, HookKind};
use crate::tree::KeyPath;

use super::{pattern_is_known, root, unique_names};

pub(super) fn check(config: &Config, found: &mut Findings) {
    check_exec(config, found);
    check_policy(config, found);
    check_hooks(config, found);
    check_verify(config, found);
}

fn check_policy(config: &Config, found: &mut Findings) {
    let policy = root("policy");
    if config.policy.approval_timeout_s == 0 {
        found.error_at(
            &policy.key("approval_timeout_s"),
            "must be at least 1: 0 would time out every approval at once".into(),
        );
    }
    let names: Vec<&str> = config
        .policy
        .rules
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    unique_names(found, "policy.rules", "name", "policy rule name", &names);
    for (i, rule) in config.policy.rules.iter().enumerate() {
        let at = policy.key("rules").index(i);
        tool_patterns(config, found, &at.key("tools"), &rule.tools);
        for (arg, matcher) in &rule.when_arguments {
            check_matcher(found, &at.key("when_arguments").key(arg), matcher);
        }
        if let Some(c) = rule.min_confidence
            && !(0.0..=1.0).contains(&c)
        {
            found.error_at(
                &at.key("min_confidence"),
                format!("must be between 0.0 and 1.0, not {c}"),
            );
        }
    }
}

fn check_exec(config: &Config, found: &mut Findings) {
    let exec = root("tools").key("exec");
    for (i, program) in config.tools.exec.programs.iter().enumerate() {
        let at = exec.key("programs").index(i);
        if !program.path.starts_with('/') {
            found.error_at(
                &at.key("path"),
                format!(
                    "must be an absolute path, not {:?}: no PATH lookup happens",
                    program.path
                ),
            );
        }
        for (j, pattern) in program.args.iter().enumerate() {
            check_regex(found, &at.key("args").index(j), pattern);
        }
    }
    for (key, paths) in [
        ("read_paths", &config.tools.exec.read_paths),
        ("write_paths", &config.tools.exec.write_paths),
    ] {
        for (i, p) in paths.iter().enumerate() {
            if !p.starts_with('/') {
                found.error_at(
                    &exec.key(key).index(i),
                    format!("must be an absolute path, not {p:?}"),
                );
            }
        }
    }
    if config.tools.exec.enabled && config.tools.exec.programs.is_empty() {
        found.warning_at(
            &exec.key("programs"),
            "is empty: exec can run nothing".into(),
        );
    }
}

fn check_matcher(found: &mut Findings, at: &KeyPath, m: &ArgMatcher) {
    for (key, pattern) in [("pattern", &m.pattern), ("not_pattern", &m.not_pattern)] {
        if let Some(pattern) = pattern {
            check_regex(found, &at.key(key), pattern);
        }
    }
    if let (Some(min), Some(max)) = (m.min, m.max)
        && min > max
    {
        found.error_at(
            &at.key("max"),
            format!("max ({max}) is less than min ({min}): no value could match"),
        );
    }
    if m.one_of.as_ref().is_some_and(Vec::is_empty) {
        found.warning_at(
            &at.key("one_of"),
            "is empty, so the rule can never match".into(),
        );
    }
}

fn check_hooks(config: &Config, found: &mut Findings) {
    let mut first: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, hook) in config.hooks.iter().enumerate() {
        let at = root("hooks").index(i);
        if let Some(name) = &hook.name {
            if name.is_empty() {
                found.error_at(&at.key("name"), "must not be empty".into());
            } else if let Some(&j) = first.get(name.as_str()) {
                found.error_at(
                    &at.key("name"),
                    format!("duplicate hook name {name:?} (first at hooks[{j}].name)"),
                );
            } else {
                first.insert(name, i);
            }
        }
        let argument = at.key("argument");
        if hook.argument.is_empty() && !found.is_invalid(&argument) {
            found.error_at(&argument, "must not be empty".into());
        }
        tool_patterns(config, found, &at.key("tools"), &hook.tools);
        check_hook_kind(found, &at, hook);
    }
}

fn check_hook_kind(found: &mut Findings, at: &KeyPath, hook: &HookConfig) {
    if found.is_invalid(&at.key("kind")) {
        return;
    }
    let kind = hook.kind.as_str();
    match hook.kind {
        HookKind::DenyPattern => match &hook.pattern {
            Some(pattern) => check_regex(found, &at.key("pattern"), pattern),
            None => found.error_at(
                &at.key("pattern"),
                "a deny_pattern hook needs pattern (the regex that blocks)".into(),
            ),
        },
        HookKind::Default if hook.value.is_none() => found.error_at(
            &at.key("value"),
            "a default hook needs value (what to fill in)".into(),
        ),
        _ => {}
    }
    let mut ignored = Vec::new();
    if hook.kind != HookKind::Default && hook.value.is_some() {
        ignored.push("value");
    }
    if hook.kind != HookKind::DenyPattern {
        if hook.pattern.is_some() {
            ignored.push("pattern");
        }
        if hook.reason.is_some() {
            ignored.push("reason");
        }
    }
    for key in ignored {
        found.warning_at(&at.key(key), format!("is ignored by a {kind} hook"));
    }
}

fn check_verify(config: &Config, found: &mut Findings) {
    let verify = root("verify");
    let tenant_field = verify.key("tenant_field");
    if config.verify.tenant_field.is_empty() && !found.is_invalid(&tenant_field) {
        found.error_at(&tenant_field, "must not be empty".into());
    }
    for (pattern, fields) in &config.verify.required_fields {
        let at = verify.key("required_fields").key(pattern);
        if !pattern_is_known(config, pattern) {
            found.warning_at(
                &at,
                format!(
                    "pattern {pattern:?} matches no configured http tool, mcp server or built-in tool"
                ),
            );
        }
        for (j, field) in fields.iter().enumerate() {
            if field.is_empty() {
                found.error_at(&at.index(j), "must not be empty".into());
            }
        }
    }
}

/// Patterns naming no tool this configuration can provide are likely typos,
/// and a guard that silently applies to nothing is worse than none.
fn tool_patterns(config: &Config, found: &mut Findings, at: &KeyPath, patterns: &[String]) {
    for (j, pattern) in patterns.iter().enumerate() {
        if !pattern_is_known(config, pattern) {
            found.warning_at(
                &at.index(j),
                format!(
                    "pattern {pattern:?} matches no configured http tool, mcp server or built-in tool"
                ),
            );
        }
    }
}

fn check_regex(found: &mut Findings, key: &KeyPath, pattern: &str) {
    if let Err(e) = regex::Regex::new(pattern) {
        found.error_at(key, format!("invalid regular expression: {}", one_line(&e)));
    }
}

/// A syntax error renders as several lines with a caret under the pattern;
/// a problem report needs just its last line, the cause.
fn one_line(e: &regex::Error) -> String {
    let text = e.to_string();
    match e {
        regex::Error::Syntax(_) => text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().trim_start_matches("error: ").to_string())
            .unwrap_or(text),
        _ => text,
    }
}
