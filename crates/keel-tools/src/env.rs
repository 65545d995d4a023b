//! `${VAR}` references in configuration values, so secrets stay in the
//! environment and never in the configuration file.

/// Replaces every `${NAME}` in `template` by `env(NAME)`. Returns the name
/// of the first variable that is not set. A `$` not followed by a complete
/// `${NAME}` (NAME an identifier) is kept as written.
pub(crate) fn expand(
    template: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find('}') {
            Some(end) if is_name(&after[..end]) => {
                let name = &after[..end];
                out.push_str(&env(name).ok_or_else(|| name.to_owned())?);
                rest = &after[end + 1..];
            }
            _ => {
                out.push_str("${");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::expand;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_references() {
        assert_eq!(expand("Bearer ${TOKEN}", &env).unwrap(), "Bearer s3cret");
        assert_eq!(
            expand("${TOKEN}-${EMPTY}-${TOKEN}", &env).unwrap(),
            "s3cret--s3cret"
        );
        assert_eq!(expand("plain", &env).unwrap(), "plain");
    }

    #[test]
    fn incomplete_references_stay_literal() {
        assert_eq!(
            expand("cost $5 ${ and ${}", &env).unwrap(),
            "cost $5 ${ and ${}"
        );
    }

    #[test]
    fn missing_variable_is_named() {
        assert_eq!(expand("a ${NOPE} b", &env).unwrap_err(), "NOPE");
    }
}
