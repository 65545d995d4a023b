//! Approve and deny buttons: what a button carries, so that a click
//! names the approval and the decision without any state kept in between.

use serde::{Deserialize, Serialize};

/// The most Telegram accepts as a button's `callback_data`, in bytes.
pub const CALLBACK_DATA_MAX: usize = 64;

/// What the person decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Deny,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Deny => "deny",
        }
    }
}

/// Why an approval id cannot go on a button.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ButtonError {
    #[error("approval id {0:?} may hold only letters, digits, '-' and '_'")]
    BadId(String),
    #[error(
        "button data for approval id {id:?} is {len} bytes; Telegram allows {CALLBACK_DATA_MAX}"
    )]
    TooLong { id: String, len: usize },
}

/// The button data for a decision on an approval: `approve:<id>` or
/// `deny:<id>`. keel's ids (`apr_` and 32 hex digits) give 44 bytes at
/// most, inside Telegram's limit; the check keeps it that way.
pub fn button_data(decision: Decision, approval_id: &str) -> Result<String, ButtonError> {
    let valid = !approval_id.is_empty()
        && approval_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(ButtonError::BadId(approval_id.to_owned()));
    }
    let data = format!("{}:{approval_id}", decision.as_str());
    if data.len() > CALLBACK_DATA_MAX {
        return Err(ButtonError::TooLong {
            id: approval_id.to_owned(),
            len: data.len(),
        });
    }
    Ok(data)
}

/// Reads button data back; `None` for data keel did not write.
pub fn parse_button_data(data: &str) -> Option<(Decision, String)> {
    let (decision, id) = data.split_once(':')?;
    let decision = match decision {
        "approve" => Decision::Approve,
        "deny" => Decision::Deny,
        _ => return None,
    };
    let valid = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    valid.then(|| (decision, id.to_owned()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keel_approval_ids_fit_telegram_and_read_back() {
        let id = format!("apr_{}", "0123456789abcdef".repeat(2));
        let approve = button_data(Decision::Approve, &id).unwrap();
        assert_eq!(approve, format!("approve:{id}"));
        assert_eq!(approve.len(), 44);
        assert_eq!(
            parse_button_data(&approve),
            Some((Decision::Approve, id.clone()))
        );
        let deny = button_data(Decision::Deny, &id).unwrap();
        assert_eq!(parse_button_data(&deny), Some((Decision::Deny, id)));
    }

    #[test]
    fn odd_ids_and_foreign_data_are_refused() {
        assert!(matches!(
            button_data(Decision::Approve, &"a".repeat(60)),
            Err(ButtonError::TooLong { len: 68, .. })
        ));
        assert!(matches!(
            button_data(Decision::Deny, "apr:1"),
            Err(ButtonError::BadId(_))
        ));
        assert!(button_data(Decision::Deny, "").is_err());
        assert_eq!(parse_button_data("approve:"), None);
        assert_eq!(parse_button_data("maybe:apr_1"), None);
        assert_eq!(parse_button_data("approve:apr 1"), None);
        assert_eq!(parse_button_data("click_me_123"), None);
    }
}
