//! Following a JSON reply byte by byte: where strings open and close (for
//! the repetition penalty and the forced close), when the top-level object
//! is done, and the `respond` answer as it is written (for streaming).

/// Structural position in compact JSON.
#[derive(Debug, Clone, Default)]
pub(crate) struct JsonState {
    depth: usize,
    in_string: bool,
    escaped: bool,
    started: bool,
}

impl JsonState {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth += 1;
                    self.started = true;
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
    }

    pub(crate) fn in_string(&self) -> bool {
        self.in_string
    }

    /// The top-level value has been closed.
    pub(crate) fn complete(&self) -> bool {
        self.started && self.depth == 0 && !self.in_string
    }
}

/// The prefix every `respond` action starts with (keys are in schema order
/// and whitespace is fixed).
pub(crate) const RESPOND_PREFIX: &[u8] = b"{\"action\":\"respond\",\"answer\":\"";

/// Streams the answer of a `respond` action, unescaped, while it is written.
#[derive(Debug, Default)]
pub(crate) struct AnswerStream {
    /// Bytes of the reply seen so far.
    seen: Vec<u8>,
    /// Where unprocessed answer bytes start, once the prefix matched.
    cursor: Option<usize>,
    escaped: bool,
    closed: bool,
    /// Unescaped bytes not yet valid UTF-8 on their own.
    pending: Vec<u8>,
}

impl AnswerStream {
    /// Adds reply bytes; returns answer text ready to show, if any.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Option<String> {
        self.seen.extend_from_slice(bytes);
        if self.closed {
            return None;
        }
        let start = match self.cursor {
            Some(c) => c,
            None => {
                if self.seen.len() < RESPOND_PREFIX.len() {
                    return None;
                }
                if !self.seen.starts_with(RESPOND_PREFIX) {
                    self.closed = true;
                    return None;
                }
                RESPOND_PREFIX.len()
            }
        };
        let mut i = start;
        while i < self.seen.len() {
            let b = self.seen[i];
            i += 1;
            if self.escaped {
                self.escaped = false;
                self.pending.push(match b {
                    b'n' => b'\n',
                    b't' => b'\t',
                    b'r' => b'\r',
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    other => other,
                });
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.closed = true;
                break;
            } else {
                self.pending.push(b);
            }
        }
        self.cursor = Some(i);
        take_utf8(&mut self.pending)
    }
}

/// Removes and returns the longest valid UTF-8 prefix, if non-empty.
pub(crate) fn take_utf8(pending: &mut Vec<u8>) -> Option<String> {
    let valid = match std::str::from_utf8(pending) {
        Ok(_) => pending.len(),
        Err(e) if e.error_len().is_some() => {
            // Invalid bytes (not merely incomplete) are shown lossily.
            let text = String::from_utf8_lossy(pending).into_owned();
            pending.clear();
            return Some(text);
        }
        Err(e) => e.valid_up_to(),
    };
    if valid == 0 {
        return None;
    }
    let rest = pending.split_off(valid);
    let text = String::from_utf8(std::mem::replace(pending, rest)).ok();
    text.filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_strings_and_completion() {
        let mut s = JsonState::default();
        s.feed(b"{\"a\":\"x}\\\"");
        assert!(s.in_string());
        assert!(!s.complete());
        s.feed(b"\",\"b\":[1,{}]");
        assert!(!s.in_string());
        assert!(!s.complete());
        s.feed(b"}");
        assert!(s.complete());
    }

    #[test]
    fn streams_the_answer_unescaped_across_token_boundaries() {
        let mut a = AnswerStream::default();
        let mut out = String::new();
        let reply = "{\"action\":\"respond\",\"answer\":\"Hi \\\"you\\\"\\nçé\"}";
        for chunk in reply.as_bytes().chunks(3) {
            if let Some(t) = a.feed(chunk) {
                out.push_str(&t);
            }
        }
        assert_eq!(out, "Hi \"you\"\nçé");
    }

    #[test]
    fn other_actions_stream_nothing() {
        let mut a = AnswerStream::default();
        let reply = b"{\"action\":\"call_tool\",\"tool_name\":\"respond\",\"arguments\":{}}";
        assert_eq!(a.feed(reply), None);
    }
}
