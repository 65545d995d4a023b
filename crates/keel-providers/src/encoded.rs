//! The wire form of a conversation's messages, kept from one model call to
//! the next: a run's history only grows between its calls, so each call
//! encodes just the messages that are new and copies the rest. Each message
//! is kept with a hash of what it was, so a history that changed anywhere
//! (compaction, a restore, a shrunk old result) is re-encoded from the
//! first message that differs; what is sent never depends on the cache.

use std::hash::BuildHasher;

use keel_protocol::{Message, ToolSchema};

/// Per-message encodings `F` of the messages last sent, by position.
pub(crate) struct Encoded<F> {
    hasher: foldhash::fast::RandomState,
    entries: Vec<(u64, F)>,
}

impl<F> Default for Encoded<F> {
    fn default() -> Self {
        Self {
            hasher: foldhash::fast::RandomState::default(),
            entries: Vec::new(),
        }
    }
}

impl<F> Encoded<F> {
    /// The encodings of `messages`, in order: those of the unchanged
    /// leading messages as kept, the rest made by `encode`.
    pub(crate) fn update<E>(
        &mut self,
        messages: &[Message],
        mut encode: impl FnMut(&Message) -> Result<F, E>,
    ) -> Result<impl Iterator<Item = &F>, E> {
        let mut keep = 0;
        let mut hashes = messages.iter().map(|m| self.hasher.hash_one(m));
        let mut pending = None;
        for (kept, _) in &self.entries {
            match hashes.next() {
                Some(h) if h == *kept => keep += 1,
                other => {
                    pending = other;
                    break;
                }
            }
        }
        self.entries.truncate(keep);
        // The hash already taken for the first changed message, then the rest.
        let fresh: Vec<u64> = pending.into_iter().chain(hashes).collect();
        for (message, hash) in messages[keep..].iter().zip(fresh) {
            // On an error the entries so far stay valid for the next call.
            let encoded = encode(message)?;
            self.entries.push((hash, encoded));
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
    fn encode_all(cache: &mut Encoded<String>, messages: &[Message]) -> (Vec<String>, usize) {
        let mut n = 0;
        let got = cache
            .update(messages, encode_counting(&mut n))
            .unwrap()
            .cloned()
            .collect();
        (got, n)
    }

    fn whole(messages: &[Message]) -> Vec<String> {
        messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap())
            .collect()
    }

    #[test]
    fn only_new_or_changed_messages_are_encoded() {
        let mut cache = Encoded::default();
        let mut history = vec![Message::system("s"), Message::user("u1")];
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 2));

        history.push(Message::user("u2"));
        history.push(Message::user("u3"));
        let (got, n) = encode_all(&mut cache, &history);
        assert_eq!((got, n), (whole(&history), 2), "appended: two new");

        history[1] = Message::user("u1, shortened");
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
    fn a_failed_encoding_keeps_what_was_valid() {
        let mut cache: Encoded<String> = Encoded::default();
        let history = vec![Message::user("a"), Message::user("b"), Message::user("c")];
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
