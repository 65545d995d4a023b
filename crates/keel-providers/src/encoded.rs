//! The wire form of a conversation's messages, kept from one model call to
//! the next: a run's history only grows between its calls, so each call
//! encodes just the messages that are new and copies the rest. Each message
//! is kept beside its encoding (shared with the request, so keeping it costs
//! a reference count, and an unchanged message is found by its pointer), so
//! a history that changed anywhere (compaction, a restore, a shrunk old
//! result) is re-encoded from the first message that differs; what is sent
//! never depends on the cache.

use std::sync::Arc;

use keel_protocol::{Message, ToolSchema};

/// Per-message encodings `F` of the messages last sent, by position.
pub(crate) struct Encoded<F> {
    entries: Vec<(Arc<Message>, F)>,
}

impl<F> Default for Encoded<F> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<F> Encoded<F> {
    /// The encodings of `messages`, in order: those of the unchanged
    /// leading messages as kept, the rest made by `encode`.
    pub(crate) fn update<E>(
        &mut self,
        messages: &[Arc<Message>],
        mut encode: impl FnMut(&Message) -> Result<F, E>,
    ) -> Result<impl Iterator<Item = &F>, E> {
        // A kept message is the one sent when it is the same allocation (the
        // cache holds a reference, so its address is never reused while
        // kept) or, built anew, equal to it.
        let keep = self
            .entries
            .iter()
            .zip(messages)
            .take_while(|((kept, _), m)| Arc::ptr_eq(kept, m) || **kept == ***m)
            .count();
        self.entries.truncate(keep);
        for message in &messages[keep..] {
            // On an error the entries so far stay valid for the next call.
            let encoded = encode(message)?;
            self.entries.push((Arc::clone(message), encoded));
        }
        Ok(self.entries.iter().map(|(_, f)| f))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The tools array as last sent: tools change far less often than messages,
/// so the array is encoded again only when the list offered differs.
#[derive(Default)]
pub(crate) struct KeptTools(Option<(Vec<ToolSchema>, Vec<u8>)>);

impl KeptTools {
    /// The JSON array of `tools` as `encode` writes it, encoded again only
    /// when the tools differ from the last call's.
    pub(crate) fn json(
        &mut self,
        tools: &[ToolSchema],
        encode: impl FnOnce(&[ToolSchema]) -> Result<Vec<u8>, serde_json::Error>,
    ) -> Result<&[u8], serde_json::Error> {
        if self.0.as_ref().is_none_or(|(offered, _)| offered != tools) {
            self.0 = Some((tools.to_vec(), encode(tools)?));
        }
        Ok(self.0.as_ref().map_or(&[][..], |(_, json)| json.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_counting<'a>(
        count: &'a mut usize,
    ) -> impl FnMut(&Message) -> Result<String, ()> + 'a {
        move |m| {
            *count += 1;
            serde_json::to_string(m).map_err(|_| ())
        }
    }

    /// What an update gives for `messages`, and how many it encoded.
    fn encode_all(cache: &mut Encoded<String>, messages: &[Arc<Message>]) -> (Vec<String>, usize) {
        let mut n = 0;
        let got = cache
            .update(messages, encode_counting(&mut n))
            .unwrap()
            .cloned()
            .collect();
        (got, n)
    }

    fn whole(messages: &[Arc<Message>]) -> Vec<String> {
        messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap())
            .collect()
    }

    fn shared(messages: Vec<Message>) -> Vec<Arc<Message>> {
        keel_protocol::shared_messages(messages)
    }

    #[test]
    fn only_new_or_changed_messages_are_encoded() {
        let mut cache = Encoded::default();
        let mut history = shared(vec![Message::system("s"), Message::user("u1")]);
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 2));

        history.push(Arc::new(Message::user("u2")));
        history.push(Arc::new(Message::user("u3")));
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 2), "appended: two new");

        history[1] = Arc::new(Message::user("u1, shortened"));
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 3), "changed in the middle");

        history.truncate(2);
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 0), "cut short");
        assert_eq!(cache.len(), 2);

        let (got, n) = encode_all(&mut cache, &[]);
        assert!(got.is_empty() && n == 0);
    }

    #[test]
    fn a_message_built_anew_is_kept_and_one_changed_in_place_is_not() {
        let mut cache = Encoded::default();
        let mut history = shared(vec![
            Message::system("s"),
            Message::user("u1"),
            Message::user("u2"),
        ]);
        encode_all(&mut cache, &history);
        // The system prompt is built again for every request: equal, kept.
        history[0] = Arc::new(Message::system("s"));
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 0));
        // A request's own copy of a message changed (as a prompt shrunk to
        // fit its budget is): the cache shares the original, so the change
        // makes a new message, and it is encoded again.
        if let Message::User { content } = Arc::make_mut(&mut history[1]) {
            content.push_str(", changed");
        }
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 2));
    }

    #[test]
    fn a_failed_encoding_keeps_what_was_valid() {
        let mut cache: Encoded<String> = Encoded::default();
        let history = shared(vec![
            Message::user("a"),
            Message::user("b"),
            Message::user("c"),
        ]);
        let failed = cache
            .update(&history, |m| match m {
                Message::User { content } if content == "c" => Err(()),
                m => Ok(serde_json::to_string(m).unwrap()),
            })
            .is_err();
        assert!(failed);
        assert_eq!(cache.len(), 2);
        let got: Vec<String> = cache
            .update(&history, |m| Ok::<_, ()>(serde_json::to_string(m).unwrap()))
            .unwrap()
            .cloned()
            .collect();
        assert_eq!(got, whole(&history));
    }
}
