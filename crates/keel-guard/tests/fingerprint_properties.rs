#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Properties of the loop detector's identities: the call fingerprint does
//! not see how the model wrote the same arguments (key order, `null`
//! members, `5` or `5.0`), the outcome fingerprint does not see volatile
//! fields (clocks, request ids, timings, the tool's own `volatile_fields`)
//! at any depth, and neither is blind to a change of anything else.

use keel_guard::loop_detect::{call_fingerprint, outcome_fingerprint, outcome_fingerprint_json};
use keel_guard::verify::ToolText;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value};

/// Keys of the generated values. None of the built-in volatile names
/// starts with `k`, so no generated member is volatile by accident.
fn key() -> impl Strategy<Value = String> {
    "k[a-z0-9_]{0,4}"
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        (-1.0e9f64..1.0e9)
            .prop_map(|f| { serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number) }),
        "[a-zA-Z é\"\\\\\n]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Spellings of built-in volatile fields, as servers write them.
const VOLATILE: &[&str] = &[
    "timestamp",
    "Timestamp",
    "ts",
    "time",
    "generated_at",
    "fetchedAt",
    "as_of",
    "request_id",
    "requestId",
    "Request-ID",
    "trace_id",
    "correlationId",
    "nonce",
    "ETag",
    "duration_ms",
    "DurationMs",
    "elapsed",
    "latency_ms",
    "took",
];

/// A tool's own volatile field, and spellings of it that must match.
const EXTRA: &str = "job-seq";
const EXTRA_SPELLINGS: &[&str] = &["job_seq", "jobSeq", "JOB-SEQ", "Job Seq"];

/// Decisions for one way of writing a value, from a seed.
struct Writer {
    state: u64,
    /// Add `null` members (same call) or volatile members (same outcome).
    noise: Noise,
}

#[derive(Clone, Copy, PartialEq)]
enum Noise {
    None,
    Nulls,
    Volatile,
}

impl Writer {
    fn new(seed: u64, noise: Noise) -> Self {
        Self {
            state: seed | 1,
            noise,
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64: any deterministic sequence will do.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// JSON text of `v`, object members in a shuffled order, integral
    /// numbers sometimes as floats, and the chosen noise added.
    fn write(&mut self, v: &Value, out: &mut String) {
        match v {
            Value::Number(n) => match n.as_i64() {
                Some(i) if i.unsigned_abs() < (1 << 53) && self.below(2) == 0 => {
                    out.push_str(&format!("{i}.0"));
                }
                _ => out.push_str(&v.to_string()),
            },
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.write(item, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut members: Vec<(String, Option<&Value>)> =
                    map.iter().map(|(k, v)| (k.clone(), Some(v))).collect();
                for i in 0..self.below(3) {
                    match self.noise {
                        Noise::None => {}
                        // Longer than any generated key, so never a duplicate.
                        Noise::Nulls => members.push((format!("knull_{i}_{}", self.next()), None)),
                        Noise::Volatile => {
                            let name = if self.below(4) == 0 {
                                EXTRA_SPELLINGS[self.below(EXTRA_SPELLINGS.len())]
                            } else {
                                VOLATILE[self.below(VOLATILE.len())]
                            };
                            if !members.iter().any(|(k, _)| k == name) {
                                members.push((name.to_owned(), None));
                            }
                        }
                    }
                }
                for i in (1..members.len()).rev() {
                    let j = self.below(i + 1);
                    members.swap(i, j);
                }
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    match v {
                        Some(v) => self.write(v, out),
                        None if self.noise == Noise::Nulls => out.push_str("null"),
                        // A volatile member's value changes every call.
                        None => out.push_str(&format!(
                            "{{\"at\":\"2025-01-0{}T00:00:00Z\",\"n\":{}}}",
                            self.below(9) + 1,
                            self.next()
                        )),
                    }
                }
                out.push('}');
            }
            other => out.push_str(&other.to_string()),
        }
    }

    fn text(seed: u64, noise: Noise, v: &Value) -> String {
        let mut out = String::new();
        Self::new(seed, noise).write(v, &mut out);
        out
    }
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Replaces one leaf of `v` (picked by `at`) with a value it is not.
fn change_one_leaf(v: &mut Value, at: Index) {
    fn leaves(v: &mut Value) -> Vec<&mut Value> {
        let container = match &*v {
            Value::Array(items) => !items.is_empty(),
            Value::Object(map) => !map.is_empty(),
            _ => false,
        };
        if !container {
            return vec![v];
        }
        match v {
            Value::Array(items) => items.iter_mut().flat_map(leaves).collect(),
            Value::Object(map) => map.values_mut().flat_map(leaves).collect(),
            _ => Vec::new(),
        }
    }
    let mut all = leaves(v);
    let leaf = at.get_mut(&mut all);
    let changed = Value::String("\u{1}changed".into());
    **leaf = if **leaf == changed {
        Value::Bool(true)
    } else {
        changed
    };
}

fn extra() -> Vec<String> {
    vec![EXTRA.to_owned()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn call_fingerprint_ignores_key_order_nulls_and_float_spelling(
        args in json(),
        a in any::<u64>(),
        b in any::<u64>(),
    ) {
        let first = Writer::text(a, Noise::None, &args);
        let second = Writer::text(b, Noise::Nulls, &args);
        prop_assert_eq!(
            call_fingerprint("tool", &parse(&first)),
            call_fingerprint("tool", &parse(&second)),
            "{} vs {}", first, second
        );
    }

    #[test]
    fn call_fingerprint_sees_any_changed_value(
        args in json(),
        at in any::<Index>(),
        seed in any::<u64>(),
    ) {
        let mut changed = args.clone();
        change_one_leaf(&mut changed, at);
        let changed_text = Writer::text(seed, Noise::None, &changed);
        prop_assert_ne!(
            call_fingerprint("tool", &args),
            call_fingerprint("tool", &parse(&changed_text)),
            "{} vs {}", args, changed_text
        );
    }

    #[test]
    fn outcome_fingerprint_ignores_key_order_and_volatile_fields(
        result in json(),
        a in any::<u64>(),
        b in any::<u64>(),
    ) {
        let first = Writer::text(a, Noise::Volatile, &result);
        let second = Writer::text(b, Noise::Volatile, &result);
        let plain = outcome_fingerprint(&first, None, &extra());
        prop_assert_eq!(
            &plain,
            &outcome_fingerprint(&second, None, &extra()),
            "{} vs {}", first, second
        );
        // The same result given as structured content.
        prop_assert_eq!(
            &plain,
            &outcome_fingerprint("rendered as prose", Some(&parse(&second)), &extra()),
        );
    }

    #[test]
    fn outcome_fingerprint_sees_any_changed_value(
        result in json(),
        at in any::<Index>(),
        a in any::<u64>(),
        b in any::<u64>(),
    ) {
        let mut changed = result.clone();
        change_one_leaf(&mut changed, at);
        let first = Writer::text(a, Noise::Volatile, &result);
        let second = Writer::text(b, Noise::Volatile, &changed);
        prop_assert_ne!(
            outcome_fingerprint(&first, None, &extra()),
            outcome_fingerprint(&second, None, &extra()),
            "{} vs {}", first, second
        );
    }

    #[test]
    fn outcome_fingerprint_is_the_same_from_text_read_once(
        result in json(),
        second in json(),
        prose in "[a-zA-Z0-9 .:{}\\[\\]\n]{0,40}",
        seed in any::<u64>(),
    ) {
        // A document (padded as servers send it), JSON lines, and prose.
        let document = format!(" \n{}\n", Writer::text(seed, Noise::Volatile, &result));
        let lines = format!("{}\n{}", Value::Array(vec![result]), Value::Array(vec![second]));
        for text in [document.as_str(), lines.as_str(), prose.as_str()] {
            let read = ToolText::read(text);
            prop_assert_eq!(
                outcome_fingerprint_json(text, read.whole(), &extra()),
                outcome_fingerprint(text, None, &extra()),
                "{:?}", text
            );
        }
    }
}
