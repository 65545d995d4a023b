//! Argument provenance (SPEC §4.6): which arguments of a proposed call come
//! from untrusted data (tool output, memory, fetched pages) and from no
//! trusted source (the user's words, the configuration).
//!
//! The question is answered in code, on the texts the run has seen, so an
//! instruction injected into a tool result cannot steer a dangerous call by
//! smuggling its own values into the arguments.
//!
//! Matching is for precision; the rules:
//! - Values are normalized before comparison: strings are lower-cased and
//!   their white space collapsed; numbers are compared as numbers, so
//!   `1,200.00`, `1200` and `1200.0` are one value.
//! - Trivial values never count: booleans, null, integers below 100,
//!   strings shorter than 4 characters, and letter-only strings shorter than
//!   8 characters (`"USD"`, `"high"`, `"today"`).
//! - Everything else counts: identifiers with digits (`USR002`, `B-F2-7`),
//!   IBANs, e-mail addresses, URLs and paths (they have digits, `@`, `/`,
//!   `:` or `.`, or are long), amounts (any number of 100 or more, and any
//!   number with a fraction), and long strings.
//! - Identifier arguments count at any length: an argument named `id`,
//!   `user`, `username`, `recipient` or `recipients`, or ending in `_id`,
//!   `_ids`, `Id` or `_user`, names which object or person a call acts on,
//!   so `"13"`, `6` and `"Fred"` count there. Such short values are found
//!   in untrusted text wherever they stand between non-alphanumerics
//!   (`id: 13`, `{"id":13}`, not `313` or `13th`), and a trusted text
//!   vouches for them only as a word of its own (`delete file 13`, not
//!   `2024-05-13`): both ways the doubt goes to caution.
//! - A value is untrusted-derived when it occurs in an untrusted source and
//!   in no trusted one. A long string (32 characters or more) is also
//!   untrusted-derived when a 24-character run of it occurs in an untrusted
//!   source and in no trusted one (runs are tried every 8 characters, so a
//!   shared run of 31 characters is always found): a message body built
//!   around an injected sentence is caught even when the model added words
//!   of its own.
//! - A string of several words is also traced word by word for embedded
//!   identifiers: a word of 6 characters or more with `@`, with `www.`,
//!   with `/` and a `.` or `:` or a leading `/`, or with a digit (an e-mail,
//!   a URL or path, an IBAN, an account number; not `and/or`).
//!   `"Check out www.evil-site.com"` is untrusted-derived when the address
//!   came from a tool result, however short the sentence around it.
//! - Arrays and objects are traced element by element (`to[1]`,
//!   `payment.iban`).
//! - **The choice of a call** is traced too when its arguments carry
//!   nothing to trace (none, or only trivial values and no identifier
//!   argument, so an injected `get_unread_emails()` is not let through for
//!   having no values): the tool's name, less a leading verb (`get`,
//!   `send`, …), read as words (`unread emails`), is looked for in the
//!   sources, singular or plural. The call is untrusted-steered when an
//!   untrusted source names it and no trusted one does. A name whose words
//!   are fewer than 8 letters (`delete_file` → `file`) is read with its
//!   verb (`delete file`); a name still shorter is not traced.

use serde_json::Value;

/// Where a text that entered the run came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The user's input, follow-ups and answers.
    User,
    /// The system prompt and configuration.
    Config,
    /// The output of a tool call.
    Tool { tool: String, call_id: String },
}

/// One text of the run, with its origin and trust.
#[derive(Debug, Clone)]
pub struct Source<'a> {
    pub origin: Origin,
    pub trusted: bool,
    pub text: &'a str,
}

/// An argument whose value came from untrusted data only.
#[derive(Debug, Clone, PartialEq)]
pub struct Tainted {
    /// `iban`, `to[1]`, `payment.iban`.
    pub argument: String,
    /// Where the value was found.
    pub from: Origin,
}

/// Shortest string value that counts.
const MIN_STRING: usize = 4;
/// Letter-only strings shorter than this are words, not identifiers.
const MIN_WORD: usize = 8;
/// Smallest integer that counts (amounts, ids); below are counts and flags.
const MIN_NUMBER: f64 = 100.0;
/// Strings at least this long are also checked by their parts.
const LONG_STRING: usize = 32;
/// Length of the parts of a long string that are looked for.
const WINDOW: usize = 24;

/// The sources, normalized once for every argument of every call judged
/// against them.
pub struct Corpus<'a> {
    texts: Vec<(Origin, bool, String, Vec<f64>)>,
    _sources: std::marker::PhantomData<&'a ()>,
}

impl<'a> Corpus<'a> {
    pub fn new(sources: &[Source<'a>]) -> Self {
        let texts = sources
            .iter()
            .map(|s| {
                (
                    s.origin.clone(),
                    s.trusted,
                    normalize(s.text),
                    numbers_in(s.text),
                )
            })
            .collect();
        Self {
            texts,
            _sources: std::marker::PhantomData,
        }
    }

    /// The arguments of `args` derived from untrusted data only, in order.
    /// `only` limits the check to these top-level arguments (empty = all).
    pub fn trace(&self, args: &Value, only: &[String]) -> Vec<Tainted> {
        let mut out = Vec::new();
        if let Value::Object(map) = args {
            for (name, value) in map {
                if only.is_empty() || only.contains(name) {
                    let identifier = identifier_argument(name).then_some(name.as_str());
                    self.trace_value(name, value, identifier, &mut out);
                }
            }
        }
        out
    }

    /// `identifier` is the name of the identifier argument `value` belongs
    /// to, if it is one.
    fn trace_value(
        &self,
        path: &str,
        value: &Value,
        identifier: Option<&str>,
        out: &mut Vec<Tainted>,
    ) {
        match value {
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    self.trace_value(&format!("{path}[{i}]"), v, identifier, out);
                }
            }
            Value::Object(map) => {
                for (k, v) in map {
                    let identifier = identifier.or(identifier_argument(k).then_some(k.as_str()));
                    self.trace_value(&format!("{path}.{k}"), v, identifier, out);
                }
            }
            Value::Number(n) => {
                let Some(x) = n.as_f64().filter(|x| x.is_finite()) else {
                    return;
                };
                let from = if significant_number(x) {
                    self.untrusted_only(|_, nums| nums.contains(&x))
                } else if let Some(name) = identifier {
                    self.short_identifier(&n.to_string(), name)
                } else {
                    None
                };
                if let Some(from) = from {
                    out.push(Tainted {
                        argument: path.to_owned(),
                        from,
                    });
                }
            }
            Value::String(s) => {
                if let Some(from) = self.trace_string(s, identifier) {
                    out.push(Tainted {
                        argument: path.to_owned(),
                        from,
                    });
                }
            }
            Value::Bool(_) | Value::Null => {}
        }
    }

    fn trace_string(&self, s: &str, identifier: Option<&str>) -> Option<Origin> {
        let value = normalize(s);
        if let Some(x) = parse_number(s) {
            if significant_number(x) {
                return self.untrusted_only(|_, nums| nums.contains(&x));
            }
            if let Some(name) = identifier {
                return self.short_identifier(&value, name);
            }
            return None;
        }
        if !significant_string(&value) {
            if let Some(name) = identifier.filter(|_| !value.is_empty()) {
                return self.short_identifier(&value, name);
            }
            return None;
        }
        if let Some(from) = self.untrusted_only(|text, _| text.contains(value.as_str())) {
            return Some(from);
        }
        // Words of a sentence that are identifiers of their own.
        if value.contains(' ') {
            for word in value.split(' ').map(trim_punctuation) {
                if embedded_identifier(word)
                    && let Some(from) = self.untrusted_only(|text, _| text.contains(word))
                {
                    return Some(from);
                }
            }
        }
        let chars: Vec<char> = value.chars().collect();
        if chars.len() < LONG_STRING {
            return None;
        }
        // A long value: any part of it that only untrusted data contains.
        for start in (0..=chars.len() - WINDOW).step_by(WINDOW / 3) {
            let part: String = chars[start..start + WINDOW].iter().collect();
            if let Some(from) = self.untrusted_only(|text, _| text.contains(part.as_str())) {
                return Some(from);
            }
        }
        None
    }

    /// Where a short identifier (`13`, `Fred`) of the argument `name` came
    /// from. Matching leans to caution both ways: untrusted text holds it
    /// wherever it stands between non-alphanumerics (`id_: '13'`,
    /// `{"id":13}`), while trusted text vouches for it only as a word of
    /// its own (`invite Fred`), and a number only where it is written as
    /// an identifier: quoted, after `#`, or after `id`, `no`, `number` or a
    /// word of the argument's name (`file 13` for `file_id`). `1 hour`,
    /// `13:00` and `2024-05-13` vouch for nothing.
    fn short_identifier(&self, value: &str, name: &str) -> Option<Origin> {
        let numeric = value.chars().all(|c| c.is_ascii_digit());
        self.untrusted_only_by(
            |text, _| {
                if numeric {
                    has_numeric_id(text, value, name)
                } else {
                    has_word(text, value)
                }
            },
            |text, _| has_token(text, value),
        )
    }

    /// The first untrusted source where `found` holds, unless a trusted
    /// source has it too.
    fn untrusted_only(&self, found: impl Fn(&str, &[f64]) -> bool) -> Option<Origin> {
        self.untrusted_only_by(&found, &found)
    }

    /// Like [`Self::untrusted_only`], with a test of its own for trusted
    /// sources (`vouched`) and for untrusted ones (`held`).
    fn untrusted_only_by(
        &self,
        vouched: impl Fn(&str, &[f64]) -> bool,
        held: impl Fn(&str, &[f64]) -> bool,
    ) -> Option<Origin> {
        let mut untrusted = None;
        for (origin, trusted, text, nums) in &self.texts {
            if *trusted {
                if vouched(text, nums) {
                    return None;
                }
            } else if untrusted.is_none() && held(text, nums) {
                untrusted = Some(origin.clone());
            }
        }
        untrusted
    }
}

impl Corpus<'_> {
    /// The untrusted source that asked for a call of `tool` when the user
    /// did not: see the module's rules. `None` for a name too short to
    /// tell anything by.
    pub fn trace_choice(&self, tool: &str) -> Option<Origin> {
        let phrase = choice_phrase(tool)?;
        // "unread emails" is found as "unread email" and as "unread emails".
        let stem = phrase.strip_suffix('s').unwrap_or(&phrase);
        self.untrusted_only(|text, _| has_phrase(text, stem))
    }
}

/// Whether nothing in `args` could carry a value from a source: no
/// significant value, and no identifier argument with a value.
pub fn carries_nothing(args: &Value) -> bool {
    fn significant(name: Option<&str>, value: &Value) -> bool {
        match value {
            Value::Null | Value::Bool(_) => false,
            _ if name.is_some_and(identifier_argument) => true,
            Value::Number(n) => n.as_f64().is_some_and(significant_number),
            Value::String(s) => match parse_number(s) {
                Some(x) => significant_number(x),
                None => significant_string(&normalize(s)),
            },
            Value::Array(items) => items.iter().any(|v| significant(None, v)),
            Value::Object(map) => map.iter().any(|(k, v)| significant(Some(k), v)),
        }
    }
    !significant(None, args)
}

/// Verbs a tool name may start with; what follows them says what it is about.
const VERBS: &[&str] = &[
    "get", "list", "read", "fetch", "search", "find", "check", "query", "set", "update", "create",
    "add", "delete", "remove", "send", "post", "put", "make", "run", "start", "stop", "mark",
    "cancel", "share", "append", "move", "copy", "write", "download", "upload", "reply", "forward",
];

/// Shortest phrase (in letters, without spaces) a tool name is traced by.
const MIN_CHOICE_LETTERS: usize = 8;

/// The words a call of `tool` would be asked for by: `server.get_unread_emails`
/// → `unread emails`, `delete_file` → `delete file`.
fn choice_phrase(tool: &str) -> Option<String> {
    let name = tool.rsplit('.').next().unwrap_or(tool);
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            words.extend((!word.is_empty()).then(|| std::mem::take(&mut word)));
            previous_lower = false;
            continue;
        }
        // camelCase splits where a capital follows a small letter.
        if c.is_uppercase() && previous_lower {
            words.push(std::mem::take(&mut word));
        }
        previous_lower = c.is_lowercase();
        word.extend(c.to_lowercase());
    }
    words.extend((!word.is_empty()).then_some(word));
    let letters = |ws: &[String]| ws.iter().map(|w| w.chars().count()).sum::<usize>();
    let topic = match words.first() {
        Some(first) if words.len() > 1 && VERBS.contains(&first.as_str()) => &words[1..],
        _ => &words[..],
    };
    let chosen = if letters(topic) >= MIN_CHOICE_LETTERS {
        topic
    } else {
        &words[..]
    };
    (letters(chosen) >= MIN_CHOICE_LETTERS).then(|| chosen.join(" "))
}

/// Whether `phrase` starts a word of `text` (so that a plural `s` may follow).
fn has_phrase(text: &str, phrase: &str) -> bool {
    text.match_indices(phrase).any(|(at, _)| {
        !text[..at]
            .chars()
            .next_back()
            .is_some_and(char::is_alphanumeric)
            && !text[at + phrase.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() && c != 's')
    })
}

/// An argument that names the object or person a call acts on: its value
/// counts however short it is.
fn identifier_argument(name: &str) -> bool {
    matches!(
        name,
        "id" | "user" | "username" | "recipient" | "recipients"
    ) || name.ends_with("_id")
        || name.ends_with("_ids")
        || name.ends_with("Id")
        || name.ends_with("Ids")
        || name.ends_with("_user")
}

/// Whether `token` occurs in `text` with no letter or digit right before or
/// after it.
fn has_token(text: &str, token: &str) -> bool {
    text.match_indices(token).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + token.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// Whether `word` is one of the white-space separated words of `text`,
/// once quotes, brackets and sentence punctuation around it are taken off.
fn has_word(text: &str, word: &str) -> bool {
    text.split_whitespace().any(|w| trim_punctuation(w) == word)
}

/// Whether `text` writes the number `value` as an identifier of the
/// argument `name`: `'13'`, `#13`, `id 13`, `no. 13`, `file 13` (for
/// `file_id`).
fn has_numeric_id(text: &str, value: &str, name: &str) -> bool {
    let name = name.to_lowercase();
    let stems: Vec<&str> = name.split(['_', '-']).filter(|w| !w.is_empty()).collect();
    let words: Vec<&str> = text.split_whitespace().collect();
    words.iter().enumerate().any(|(i, raw)| {
        if trim_punctuation(raw) != value {
            return false;
        }
        if raw.starts_with(['\'', '"', '#']) {
            return true;
        }
        let Some(before) = i.checked_sub(1).map(|j| trim_punctuation(words[j])) else {
            return false;
        };
        let before = before.trim_end_matches('s');
        matches!(before, "id" | "no" | "number" | "#") || stems.contains(&before)
    })
}

/// A word with the punctuation around it (quotes, brackets, a full stop)
/// taken off.
fn trim_punctuation(word: &str) -> &str {
    word.trim_matches(|c: char| {
        matches!(
            c,
            '.' | ','
                | ';'
                | ':'
                | '!'
                | '?'
                | '('
                | ')'
                | '['
                | ']'
                | '<'
                | '>'
                | '"'
                | '\''
                | '#'
        )
    })
}

/// A word inside a longer text that identifies something by itself: an
/// e-mail, a URL or path, an account number.
fn embedded_identifier(word: &str) -> bool {
    if word.chars().count() < 6 {
        return false;
    }
    let path_or_url =
        word.contains('/') && (word.starts_with('/') || word.contains('.') || word.contains(':'));
    word.contains('@')
        || path_or_url
        || word.starts_with("www.")
        || word.chars().any(|c| c.is_ascii_digit())
}

/// Lower case, white space collapsed to single spaces.
fn normalize(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

fn significant_number(x: f64) -> bool {
    x.is_finite() && (x.abs() >= MIN_NUMBER || x.fract() != 0.0)
}

fn significant_string(value: &str) -> bool {
    let len = value.chars().count();
    if len < MIN_STRING {
        return false;
    }
    let word_like = value
        .chars()
        .all(|c| c.is_alphabetic() || c == ' ' || c == '-');
    !(word_like && len < MIN_WORD)
}

/// A string that is a number as written (`1,200.50`, `-3`, `1200`).
fn parse_number(s: &str) -> Option<f64> {
    let t = s.trim();
    if t.is_empty()
        || !t
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, ',' | '.' | '-' | '+'))
    {
        return None;
    }
    t.replace(',', "").parse::<f64>().ok()
}

/// Every number written in a text, thousands separators allowed.
fn numbers_in(text: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let mut current = String::new();
    let flush = |current: &mut String, out: &mut Vec<f64>| {
        let trimmed = current.trim_matches(|c| c == ',' || c == '.');
        if let Some(x) = parse_number(trimmed) {
            out.push(x);
        }
        current.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() || ((c == ',' || c == '.') && !current.is_empty()) {
            current.push(c);
        } else {
            flush(&mut current, &mut out);
        }
    }
    flush(&mut current, &mut out);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
