//! Conversations as plain text, for the model calls that summarize them
//! (a session reset, a compaction): what was asked, called and returned.

use keel_protocol::Message;

/// One line per message; keel's own notes are left out. Tool results are
/// cut to `result_cap` characters.
pub fn render<'a>(messages: impl Iterator<Item = &'a Message>, result_cap: usize) -> String {
    let mut out = String::new();
    for m in messages {
        let line = match m {
            Message::User { content } => format!("User: {content}"),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let calls: Vec<String> = tool_calls
                    .iter()
                    .map(|c| format!("{}({})", c.name, c.arguments))
                    .collect();
                match (content.is_empty(), calls.is_empty()) {
                    (false, true) => format!("Assistant: {content}"),
                    (true, false) => format!("Assistant called: {}", calls.join(", ")),
                    (false, false) => {
                        format!("Assistant: {content} [called: {}]", calls.join(", "))
                    }
                    (true, true) => continue,
                }
            }
            Message::Tool { name, content, .. } => format!(
                "Result of {name}: {}",
                crate::course::snippet(content, result_cap)
            ),
            Message::System { .. } => continue,
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The last `max` bytes of `s` (the newest part of a transcript), marked as cut.
pub fn keep_tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("[earlier part omitted]\n{}", &s[start..])
}
