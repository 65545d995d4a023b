//! Redaction of secret values: the API keys, tokens and signing secrets
//! keel reads from its environment must never be shown, stored or sent on,
//! whoever brings them into a run (the user, a tool echoing its auth
//! header, a model repeating what it saw).
//!
//! One [`Redactor`] is built at start from the set of secret values; it
//! replaces every occurrence of any of them with [`REDACTED`]. Values
//! shorter than [`MIN_SECRET_CHARS`] are left out: they are too common as
//! ordinary text to be recognised as a secret, and replacing them would
//! mangle text that only happens to contain them.

use std::borrow::Cow;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What each occurrence of a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Secret values shorter than this many characters are not redacted.
pub const MIN_SECRET_CHARS: usize = 8;

/// The secret set could not be compiled into a matcher.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the secret redactor: {0}")]
pub struct RedactError(String);

/// Replaces every known secret value with [`REDACTED`]. Cheap to clone;
/// the default redacts nothing.
#[derive(Clone, Default)]
pub struct Redactor {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    matcher: AhoCorasick,
    /// What the matcher looks for: each secret as it is, trimmed, and as
    /// JSON and Rust's `Debug` escape it (how it appears inside serialized
    /// events and log fields).
    patterns: Vec<String>,
    /// The secrets themselves, for [`Redactor::union`].
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        write!(f, "Redactor({} secrets)", self.len())
    }
}

impl Redactor {
    /// A redactor for `secrets`; values shorter than [`MIN_SECRET_CHARS`]
    /// (after trimming whitespace) are skipped.
    pub fn new<I, S>(secrets: I) -> Result<Self, RedactError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut kept: Vec<String> = Vec::new();
        for s in secrets {
            let s = s.as_ref();
            if is_redactable(s) && !kept.iter().any(|k| k == s) {
                kept.push(s.to_owned());
            }
        }
        if kept.is_empty() {
            return Ok(Self::default());
        }
        let mut patterns: Vec<String> = Vec::new();
        for s in &kept {
            for variant in variants(s) {
                if variant.chars().count() >= MIN_SECRET_CHARS && !patterns.contains(&variant) {
                    patterns.push(variant);
                }
            }
        }
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|e| RedactError(e.to_string()))?;
        Ok(Self {
            inner: Some(Arc::new(Inner {
                matcher,
                patterns,
                secrets: kept,
            })),
        })
    }

    /// Both sets of secrets.
    pub fn union(&self, other: &Redactor) -> Result<Self, RedactError> {
        let ours = self.inner.iter().flat_map(|i| i.secrets.iter());
        let theirs = other.inner.iter().flat_map(|i| i.secrets.iter());
        Self::new(ours.chain(theirs))
    }

    /// How many secrets are redacted (values too short are not counted).
    pub fn len(&self) -> usize {
        self.inner.as_ref().map_or(0, |i| i.secrets.len())
    }

    /// True when there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }

    /// Whether `text` contains a secret.
    pub fn contains_secret(&self, text: &str) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.matcher.is_match(text))
    }

    /// `text` with every secret replaced; borrowed when there was none.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(inner) = &self.inner else {
            return Cow::Borrowed(text);
        };
        let mut out = String::new();
        let mut last = 0;
        for m in inner.matcher.find_iter(text) {
            out.push_str(&text[last..m.start()]);
            out.push_str(REDACTED);
            last = m.end();
        }
        if last == 0 {
            return Cow::Borrowed(text);
        }
        out.push_str(&text[last..]);
        Cow::Owned(out)
    }

    /// Redacts `text` in place; true when something was replaced.
    pub fn redact_string(&self, text: &mut String) -> bool {
        match self.redact(text) {
            Cow::Borrowed(_) => false,
            Cow::Owned(clean) => {
                *text = clean;
                true
            }
        }
    }

    /// Redacts every string of a JSON value, object keys included; true
    /// when something was replaced.
    pub fn redact_json(&self, value: &mut Value) -> bool {
        if self.is_empty() {
            return false;
        }
        match value {
            Value::String(s) => self.redact_string(s),
            // Every element is visited: no short-circuiting once one changed.
            Value::Array(items) => {
                let mut changed = false;
                for v in items {
                    changed |= self.redact_json(v);
                }
                changed
            }
            Value::Object(map) => {
                let mut changed = false;
                if map.keys().any(|k| self.contains_secret(k)) {
                    let entries = std::mem::take(map);
                    for (k, v) in entries {
                        map.insert(self.redact(&k).into_owned(), v);
                    }
                    changed = true;
                }
                for v in map.values_mut() {
                    changed |= self.redact_json(v);
                }
                changed
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }

    /// Redacts any value that round-trips through JSON (events, messages):
    /// serialized once to look for a secret, rebuilt only when one is
    /// found. Errs when the value does not survive the round trip.
    pub fn redact_serde<T: Serialize + DeserializeOwned>(
        &self,
        value: &mut T,
    ) -> Result<bool, serde_json::Error> {
        if self.is_empty() {
            return Ok(false);
        }
        if !self.contains_secret(&serde_json::to_string(value)?) {
            return Ok(false);
        }
        let mut tree = serde_json::to_value(&*value)?;
        self.redact_json(&mut tree);
        *value = serde_json::from_value(tree)?;
        Ok(true)
    }

    /// A redactor for text that arrives in pieces (a streamed reply).
    pub fn stream(&self) -> StreamRedactor {
        StreamRedactor {
            redactor: self.clone(),
            pending: String::new(),
        }
    }
}

/// Redacts a text that arrives piece by piece, where a secret may be split
/// between two pieces: the tail of what arrived that could be the start of
/// a secret is held back until the next piece shows whether it is one.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Redactor,
    pending: String,
}

impl StreamRedactor {
    /// Takes the next piece; returns what can be passed on now (possibly
    /// empty).
    pub fn push(&mut self, piece: &str) -> String {
        let Some(inner) = self.redactor.inner.clone() else {
            return piece.to_owned();
        };
        self.pending.push_str(piece);
        let text = &self.pending;
        // No secret can start before `safe` and end after the text: the
        // held tail is the longest one that could still grow into one.
        let mut safe = text.len() - held_tail(text, &inner.patterns);
        while !text.is_char_boundary(safe) {
            safe -= 1;
        }
        let mut out = String::new();
        let mut last = 0;
        for m in inner.matcher.find_iter(text.as_str()) {
            if m.start() >= safe {
                break;
            }
            out.push_str(&text[last..m.start()]);
            out.push_str(REDACTED);
            last = m.end();
        }
        let cut = last.max(safe);
        out.push_str(&text[last..cut]);
        self.pending.drain(..cut);
        out
    }

    /// The end of the text: whatever was held back, redacted.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        self.redactor.redact(&rest).into_owned()
    }
}

/// Bytes at the end of `text` that are a proper prefix of some pattern.
fn held_tail(text: &str, patterns: &[String]) -> usize {
    let bytes = text.as_bytes();
    let Some(&last) = bytes.last() else {
        return 0;
    };
    let mut held = 0;
    for p in patterns {
        let p = p.as_bytes();
        let longest = p.len().saturating_sub(1).min(bytes.len());
        // Longest first: the first prefix that fits is the one held.
        for k in (held + 1..=longest).rev() {
            if p[k - 1] == last && bytes.ends_with(&p[..k]) {
                held = k;
                break;
            }
        }
    }
    held
}

/// Whether a value is long enough to be redacted.
pub fn is_redactable(secret: &str) -> bool {
    secret.trim().chars().count() >= MIN_SECRET_CHARS
}

/// The forms a secret takes in keel's output: as it is, without the
/// surrounding whitespace an environment file may leave, and escaped as
/// JSON strings and `Debug` output escape it.
fn variants(secret: &str) -> Vec<String> {
    let mut out = Vec::new();
    for s in [secret, secret.trim()] {
        out.push(s.to_owned());
        if let Ok(json) = serde_json::to_string(s) {
            out.push(json[1..json.len() - 1].to_owned());
        }
        let debug = format!("{s:?}");
        out.push(debug[1..debug.len() - 1].to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const KEY: &str = "sk-test-0123456789abcdef";

    fn redactor() -> Redactor {
        Redactor::new([KEY, "tok\"en-with\\quotes", "short"]).unwrap()
    }

    #[test]
    fn replaces_every_occurrence() {
        let r = redactor();
        assert_eq!(
            r.redact(&format!("a {KEY} b {KEY}")),
            "a [redacted] b [redacted]"
        );
        assert!(matches!(r.redact("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn short_values_are_not_redacted() {
        let r = redactor();
        assert_eq!(r.len(), 2);
        assert_eq!(r.redact("short"), "short");
        assert!(Redactor::new(["1234567", "  abc  "]).unwrap().is_empty());
    }

    #[test]
    fn escaped_forms_are_redacted() {
        let r = redactor();
        let json = serde_json::json!({"h": "tok\"en-with\\quotes"}).to_string();
        assert!(!json.contains("tok\"en"));
        assert_eq!(r.redact(&json), r#"{"h":"[redacted]"}"#);
        let debug = format!("{:?}", "x tok\"en-with\\quotes");
        assert_eq!(r.redact(&debug), "\"x [redacted]\"");
    }

    #[test]
    fn json_values_and_keys() {
        let r = redactor();
        let mut v = serde_json::json!({"a": [KEY, 1, {"b": format!("Bearer {KEY}")}], KEY: true});
        assert!(r.redact_json(&mut v));
        assert_eq!(
            v,
            serde_json::json!({"a": ["[redacted]", 1, {"b": "Bearer [redacted]"}], "[redacted]": true})
        );
        assert!(!r.redact_json(&mut v));
    }

    #[test]
    fn typed_values_round_trip() {
        let r = redactor();
        let mut m = crate::Message::user(format!("my key is {KEY}"));
        assert!(r.redact_serde(&mut m).unwrap());
        assert_eq!(m, crate::Message::user("my key is [redacted]"));
        assert!(!r.redact_serde(&mut m).unwrap());
    }

    fn streamed(r: &Redactor, pieces: &[&str]) -> (Vec<String>, String) {
        let mut s = r.stream();
        let mut out: Vec<String> = pieces.iter().map(|p| s.push(p)).collect();
        out.push(s.finish());
        let whole = out.concat();
        (out, whole)
    }

    #[test]
    fn a_secret_split_between_pieces_is_held_back() {
        let r = redactor();
        let (out, whole) = streamed(&r, &["key: sk-test-0123", "456789abcdef, done"]);
        assert_eq!(out[0], "key: ");
        assert_eq!(whole, "key: [redacted], done");
        for piece in &out {
            assert!(!piece.contains("sk-test"), "{piece}");
        }
    }

    #[test]
    fn a_tail_that_is_no_secret_is_released() {
        let r = redactor();
        let (out, whole) = streamed(&r, &["see sk-", "tes", "ted code", ""]);
        assert_eq!(whole, "see sk-tested code");
        assert_eq!(out[0], "see ");
        assert_eq!(out[2], "sk-tested code");
    }

    #[test]
    fn streaming_matches_redacting_the_whole_text() {
        let r = Redactor::new([KEY, "abcabdabcabd", "é-secret-é"]).unwrap();
        let text = format!("x{KEY}y abcabcabdabcabd é-secret-é {KEY}{KEY} sk-test-01 end");
        let expected = r.redact(&text).into_owned();
        let chars: Vec<char> = text.chars().collect();
        for size in 1..8 {
            let pieces: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (out, whole) = streamed(&r, &refs);
            assert_eq!(whole, expected, "pieces of {size}");
            assert!(out.iter().all(|p| !p.contains(KEY)));
        }
    }

    #[test]
    fn a_longer_secret_wins_over_its_prefix() {
        let r = Redactor::new(["abcdefgh", "abcdefghijk"]).unwrap();
        let (_, whole) = streamed(&r, &["xx abcdefgh", "ijk yy"]);
        assert_eq!(whole, "xx [redacted] yy");
    }

    #[test]
    fn union_and_debug_never_show_values() {
        let a = Redactor::new([KEY]).unwrap();
        let b = Redactor::new(["another-secret"]).unwrap();
        let both = a.union(&b).unwrap();
        assert_eq!(both.len(), 2);
        assert!(both.contains_secret("another-secret"));
        assert!(!format!("{both:?}").contains(KEY));
    }

    #[test]
    fn empty_redactor_passes_text_through() {
        let r = Redactor::default();
        let mut s = r.stream();
        assert_eq!(s.push(KEY), KEY);
        assert_eq!(r.redact(KEY), KEY);
    }
}
