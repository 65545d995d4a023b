//! Session commands a chat user can type instead of a message.

use serde::{Deserialize, Serialize};

/// A command at the start of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// `/new`: start a fresh session.
    New,
    /// `/reset`: clear the current session.
    Reset,
    /// `/stop`: stop the run in progress.
    Stop,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Reset => "reset",
            Self::Stop => "stop",
        }
    }

    /// The command the text starts with, if any. Telegram appends the
    /// bot's name in groups (`/stop@KeelBot`), so a `@name` suffix is
    /// accepted; which bot it names is not checked, since a group's other
    /// bots' commands never reach this one's webhook. Anything after the
    /// command is left to the caller (it stays in the message text).
    pub fn parse(text: &str) -> Option<Self> {
        let word = text.split_whitespace().next()?;
        let name = word.strip_prefix('/')?;
        let name = name.split_once('@').map_or(name, |(n, _)| n);
        match name.to_ascii_lowercase().as_str() {
            "new" => Some(Self::New),
            "reset" => Some(Self::Reset),
            "stop" => Some(Self::Stop),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_recognized_with_or_without_a_bot_name() {
        assert_eq!(Command::parse("/new"), Some(Command::New));
        assert_eq!(Command::parse("  /reset please"), Some(Command::Reset));
        assert_eq!(Command::parse("/stop@KeelOpsBot"), Some(Command::Stop));
        assert_eq!(Command::parse("/STOP"), Some(Command::Stop));
        assert_eq!(Command::parse("/start"), None);
        assert_eq!(Command::parse("/newer"), None);
        assert_eq!(Command::parse("please /stop"), None);
        assert_eq!(Command::parse("stop"), None);
        assert_eq!(Command::parse(""), None);
        assert_eq!(Command::parse("/"), None);
    }
}
