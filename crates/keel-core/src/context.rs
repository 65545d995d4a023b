//! Which part of the history the model sees. The stored history only ever
//! grows (it is the audit trail and the replay); compaction, context resets
//! and checkpoint restores change the *view* instead: a short list of
//! pieces, persisted with the run's state, so a restarted node rebuilds the
//! exact prompt the run had.

use std::sync::Arc;

use keel_protocol::Message;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Piece {
    /// History messages `from..to`; open-ended (up to the newest) when `to` is absent.
    Range {
        from: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<usize>,
    },
    /// A message keel wrote for the model (a summary, a reset brief); not in the history.
    Note { message: Message },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextView {
    pub pieces: Vec<Piece>,
}

impl Default for ContextView {
    fn default() -> Self {
        Self {
            pieces: vec![Piece::Range { from: 0, to: None }],
        }
    }
}

impl ContextView {
    /// A clean start: the brief, then whatever the history gains from `from` on.
    pub fn restart(brief: Message, from: usize) -> Self {
        Self {
            pieces: vec![
                Piece::Note { message: brief },
                Piece::Range { from, to: None },
            ],
        }
    }

    /// The messages the model sees, shared with `history` (a note is
    /// copied: notes are few, and only after a compaction or a reset).
    pub fn render(&self, history: &[Arc<Message>]) -> Vec<Arc<Message>> {
        let mut out = Vec::with_capacity(history.len() + 2);
        for piece in &self.pieces {
            match piece {
                Piece::Range { from, to } => {
                    let end = to.unwrap_or(history.len()).min(history.len());
                    if *from < end {
                        out.extend_from_slice(&history[*from..end]);
                    }
                }
                Piece::Note { message } => out.push(Arc::new(message.clone())),
            }
        }
        out
    }

    /// The view frozen as it stood with `len` history messages: open ranges
    /// are closed there, so later history no longer shows through.
    pub fn frozen(&self, len: usize) -> Vec<Piece> {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Range { from, to: None } => Piece::Range {
                    from: *from,
                    to: Some(len),
                },
                other => other.clone(),
            })
            .collect()
    }

    /// The view without its first `skip` rendered messages, led by `head`.
    pub fn replace_prefix(&self, history: &[Arc<Message>], skip: usize, head: Message) -> Self {
        let mut pieces = vec![Piece::Note { message: head }];
        let mut offset = 0usize;
        for piece in &self.pieces {
            let len = match piece {
                Piece::Range { from, to } => {
                    let end = to.unwrap_or(history.len()).min(history.len());
                    end.saturating_sub(*from)
                }
                Piece::Note { .. } => 1,
            };
            let (start, end) = (offset, offset + len);
            offset = end;
            if end <= skip {
                // Open ranges must survive even when empty now: new messages arrive through them.
                if let Piece::Range { to: None, .. } = piece {
                    pieces.push(Piece::Range {
                        from: history.len(),
                        to: None,
                    });
                }
                continue;
            }
            match piece {
                Piece::Range { from, to } if skip > start => pieces.push(Piece::Range {
                    from: from + (skip - start),
                    to: *to,
                }),
                other => pieces.push(other.clone()),
            }
        }
        Self { pieces }
    }
}

/// Where compaction may cut `messages`: the first kept message. The kept
/// tail holds at least the newest `keep` messages, and never begins with a
/// tool result (its call must stay beside it) or in the middle of a turn
/// whose calls are still being answered. `None` when nothing older than
/// the tail exists to summarize.
pub fn compaction_cut(messages: &[Arc<Message>], keep: usize) -> Option<usize> {
    let mut cut = messages.len().saturating_sub(keep.max(1));
    while cut > 0 && matches!(*messages[cut], Message::Tool { .. }) {
        cut -= 1;
    }
    // Keel's own notes (system messages) belong to the turn before them.
    while cut > 0 && matches!(*messages[cut], Message::System { .. }) {
        cut -= 1;
        while cut > 0 && matches!(*messages[cut], Message::Tool { .. }) {
            cut -= 1;
        }
    }
    (cut > 0).then_some(cut)
}

/// The smallest tail that must stay verbatim: from the last user message or
/// the last turn with tool calls, whichever is newer.
pub fn minimal_tail(messages: &[Arc<Message>]) -> usize {
    messages
        .iter()
        .rposition(|m| {
            matches!(**m, Message::User { .. })
                || matches!(&**m, Message::Assistant { tool_calls, .. } if !tool_calls.is_empty())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{ToolCall, shared_messages};

    fn call(id: &str) -> Message {
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "t".into(),
                arguments: "{}".into(),
            }],
        }
    }
    fn result(id: &str) -> Message {
        Message::Tool {
            call_id: id.into(),
            name: "t".into(),
            content: "r".into(),
            is_error: false,
        }
    }

    #[test]
    fn default_view_is_the_whole_history() {
        let h = shared_messages(vec![Message::user("a"), call("1"), result("1")]);
        assert_eq!(ContextView::default().render(&h), h);
    }

    #[test]
    fn restart_shows_the_brief_and_only_newer_messages() {
        let mut h = shared_messages(vec![Message::user("a"), call("1"), result("1")]);
        let v = ContextView::restart(Message::user("brief"), h.len());
        assert_eq!(v.render(&h), shared_messages(vec![Message::user("brief")]));
        h.push(Arc::new(call("2")));
        assert_eq!(
            v.render(&h),
            shared_messages(vec![Message::user("brief"), call("2")])
        );
    }

    #[test]
    fn cut_never_separates_a_call_from_its_result() {
        let h = shared_messages(vec![
            Message::user("goal"),
            call("1"),
            result("1"),
            call("2"),
            result("2"),
            Message::system("note"),
        ]);
        // keep 2 would start at result("2"): moves back to its call.
        assert_eq!(compaction_cut(&h, 2), Some(3));
        assert_eq!(compaction_cut(&h, 1), Some(3));
        assert_eq!(compaction_cut(&h, 6), None);
    }

    #[test]
    fn replacing_a_prefix_keeps_the_tail_and_follows_new_messages() {
        let mut h = shared_messages(vec![
            Message::user("goal"),
            call("1"),
            result("1"),
            call("2"),
            result("2"),
        ]);
        let v = ContextView::default().replace_prefix(&h, 3, Message::user("summary"));
        assert_eq!(
            v.render(&h),
            shared_messages(vec![Message::user("summary"), call("2"), result("2")])
        );
        h.push(Arc::new(call("3")));
        assert_eq!(v.render(&h).last(), Some(&Arc::new(call("3"))));
        // A second compaction over a view that starts with a note.
        let v2 = v.replace_prefix(&h, 3, Message::user("summary 2"));
        assert_eq!(
            v2.render(&h),
            shared_messages(vec![Message::user("summary 2"), call("3")])
        );
        h.push(Arc::new(result("3")));
        assert_eq!(v2.render(&h).last(), Some(&Arc::new(result("3"))));
    }

    #[test]
    fn frozen_view_stops_at_its_length() {
        let mut h = shared_messages(vec![Message::user("goal"), call("1"), result("1")]);
        let frozen = ContextView {
            pieces: ContextView::default().frozen(h.len()),
        };
        h.push(Arc::new(call("2")));
        assert_eq!(frozen.render(&h).len(), 3);
    }
}
