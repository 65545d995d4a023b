//! Drift detection (SPEC §4.12): after each step, a score says whether the
//! run is still working on the goal it was given.
//!
//! Three signals, each in `[0, 1]`:
//! - *relevance* of the recent window (the last [`DriftSettings::window`]
//!   steps) to the goal: the recency-weighted mean, over those steps, of the
//!   [`lexical_similarity`] of the goal (plus success criterion) to the
//!   step's tool name, arguments and result; or the caller's embedder
//!   similarity when that is higher (see [`DriftInput::semantic`]);
//! - *scope* penalty: calls or distinct tools in the whole run far beyond
//!   what the agent is expected to need;
//! - *repetition* penalty: the share of the window's calls that repeat an
//!   earlier call (same tool and arguments) with the same outcome, i.e.
//!   steps that brought nothing new.
//!
//! They combine as a weighted *geometric* mean,
//! `relevance^wr · (1 − scope)^ws · (1 − repetition)^wp`, not a weighted
//! sum: with a sum and the default weights a window with nothing to do with
//! the goal would still score `1 − wr = 0.4`, above the 0.35 threshold, so
//! wandering off would only be caught when it also happened to be long or
//! repetitive. With the product any signal at its worst makes the run
//! drifted, while moderate penalties only lower the score.
//!
//! Everything is a pure function of the input (ordered collections only),
//! so the same trace always gets the same score and reason: the score is
//! recorded in `drift_detected` events and must be reproducible from the
//! persisted trace. The module only judges; the run loop decides what drift
//! triggers (reflection, checkpoint restore, context reset).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::loop_detect::call_fingerprint;

/// Below this many steps the run is never judged drifted: one call says
/// too little about where a run is heading.
pub const MIN_STEPS: usize = 2;

/// A step whose similarity to the goal is below this is named as unrelated
/// in the reason. One incidental shared word ("week" in a weather
/// forecast) stays below it; a step naming the goal's furnace does not.
const UNRELATED_BELOW: f32 = 0.3;

/// Relevance below this is mentioned in the reason even when the run is
/// not (yet) drifted.
const LOW_RELEVANCE: f32 = 0.5;

/// Goal-term weight that makes a text fully cover the goal: three plain
/// terms, or one identifier and one plain term. Long goals (input plus
/// follow-ups) would otherwise make every single step look unrelated.
const FULL_COVERAGE_WEIGHT: f32 = 3.0;

/// Share of the goal's term weight that makes a text fully cover a short
/// goal (below [`FULL_COVERAGE_WEIGHT`] this is what applies).
const FULL_COVERAGE_SHARE: f32 = 0.5;

/// Weight of coverage (goal terms found in the text) in
/// [`lexical_similarity`]; the rest is the token-set overlap coefficient.
const COVERAGE_BLEND: f32 = 0.8;

/// Goal terms containing a digit (`F2`, `W46`, `B-1041`) name specific
/// things; sharing one says more than sharing a common word.
const IDENTIFIER_WEIGHT: f32 = 2.0;

/// Goal terms that turn up in almost any result (dates, counts, generic
/// nouns) weigh this much: an unrelated forecast "for the week" must not
/// look half relevant to a goal about last week's batches.
const WEAK_WEIGHT: f32 = 0.25;

/// See [`WEAK_WEIGHT`]; compared after stemming.
const WEAK_TERMS: &[&str] = &[
    "count",
    "current",
    "data",
    "date",
    "day",
    "hour",
    "info",
    "item",
    "last",
    "list",
    "minute",
    "month",
    "new",
    "next",
    "number",
    "result",
    "time",
    "today",
    "tomorrow",
    "total",
    "value",
    "week",
    "year",
    "yesterday",
];

static WEAK_STEMS: LazyLock<BTreeSet<String>> =
    LazyLock::new(|| WEAK_TERMS.iter().map(|w| stem(w)).collect());

/// Expectation ratio over which the scope penalty grows from 0 to 1.
const CALLS_RAMP: f32 = 2.0;
const TOOLS_RAMP: f32 = 1.5;

/// Slack before the scope penalty starts, as a multiple of the expectation.
/// A configured expectation is the operator's word, so exceeding it counts
/// at once; a learned or default one is only a rough typical value, so the
/// penalty starts at twice it (calls) or one and a half times it (tools).
const CONFIGURED_SLACK: f32 = 1.0;
const TYPICAL_CALLS_SLACK: f32 = 2.0;
const TYPICAL_TOOLS_SLACK: f32 = 1.5;

/// Words that carry no topic: question scaffolding, pronouns, JSON
/// literals. Compared before stemming.
const STOPWORDS: &[&str] = &[
    "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "been", "before", "being", "between", "both", "but", "by", "can", "could", "did", "do",
    "does", "doing", "done", "during", "each", "few", "for", "from", "further", "get", "give",
    "had", "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "however",
    "if", "in", "into", "is", "it", "its", "just", "know", "let", "like", "me", "more", "most",
    "much", "many", "my", "need", "no", "none", "nor", "not", "null", "of", "off", "on", "once",
    "only", "or", "other", "our", "out", "over", "own", "please", "same", "she", "should", "show",
    "so", "some", "such", "tell", "than", "that", "the", "their", "them", "then", "there", "these",
    "they", "this", "those", "through", "to", "too", "true", "false", "under", "until", "up", "us",
    "very", "want", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom",
    "why", "will", "with", "would", "you", "your",
];

/// Thresholds and weights; `Default` = values suited to interactive runs
/// (the defaults of `[agents.drift]`).
///
/// The three weights are exponents of a weighted geometric mean (see the
/// module docs). They are normalized to sum to 1, so only their ratios
/// matter; if they are all zero or not finite the defaults are used.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftSettings {
    /// A score below this is drift.
    pub threshold: f32,
    /// Recent steps that relevance and repetition look at (0 acts as 1).
    pub window: usize,
    /// Tool calls a run is expected to need; 0 = no configured expectation:
    /// scope then uses [`DriftInput::baseline_calls`], else
    /// `default_expected_calls`.
    pub expected_tool_calls: u32,
    /// Distinct tools a run is expected to use; 0 = no configured
    /// expectation: scope then uses `default_expected_tools`.
    pub expected_tools: u32,
    /// Typical calls per run when nothing better is known.
    pub default_expected_calls: u32,
    /// Typical distinct tools per run when nothing better is known.
    pub default_expected_tools: u32,
    pub relevance_weight: f32,
    pub scope_weight: f32,
    pub repetition_weight: f32,
}

impl From<&keel_config::Drift> for DriftSettings {
    /// The agent's `[agents.drift]` settings; the weights and fallbacks the
    /// configuration does not expose keep their defaults.
    fn from(c: &keel_config::Drift) -> Self {
        Self {
            threshold: c.threshold as f32,
            window: usize::try_from(c.window.max(1)).unwrap_or(4),
            expected_tool_calls: c.expected_tool_calls,
            expected_tools: c.expected_tools,
            ..Self::default()
        }
    }
}

impl Default for DriftSettings {
    /// A dozen relevant calls over half a dozen tools is an ordinary
    /// interactive run and scores as fully in scope; relevance dominates
    /// because wandering away from the goal is what drift is about, while
    /// pure repetition is mostly loop detection's business (§4.10).
    fn default() -> Self {
        Self {
            threshold: 0.35,
            window: 4,
            expected_tool_calls: 0,
            expected_tools: 0,
            default_expected_calls: 6,
            default_expected_tools: 5,
            relevance_weight: 0.6,
            scope_weight: 0.2,
            repetition_weight: 0.2,
        }
    }
}

/// One executed (or attempted) tool call as drift detection sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepTrace {
    pub step: u32,
    /// E.g. `plant.batches` or `furnace_status`.
    pub tool: String,
    /// The JSON arguments as text (anything that is not JSON is used as is).
    pub arguments: String,
    /// Result text, already truncated by the caller (about 500 chars).
    pub result: String,
    pub ok: bool,
    /// Fingerprint of the result (`loop_detect::outcome_fingerprint`); the
    /// same fingerprint means no new information. `None`: the trimmed
    /// result text stands in for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// What [`assess`] judges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftInput<'a> {
    /// The run's input plus follow-ups.
    pub goal: &'a str,
    /// Success criterion, if configured; counts as goal text.
    pub criterion: Option<&'a str>,
    /// The run's whole trace, oldest first.
    pub steps: &'a [StepTrace],
    /// Semantic similarity in `[0, 1]` of the recent window
    /// ([`window_text`]) to the goal, computed by the caller with an
    /// embedder; `None` => lexical only.
    ///
    /// Relevance is the *higher* of this and the lexical relevance. Each
    /// signal fails in one direction: lexical misses paraphrases ("output"
    /// for "produce"), which the embedder catches; embedders give modest
    /// similarity to JSON-heavy windows full of ids, whereas a window that
    /// names the goal's own furnace is on topic whatever the embedder says.
    /// A false drift alarm costs a reflection call or a context reset, so
    /// either signal vouching for the window is enough; drift needs both to
    /// agree the window is off topic. Values outside `[0, 1]` are clamped,
    /// non-finite ones ignored.
    pub semantic: Option<f32>,
    /// Typical tool calls per run of this agent from past runs, when known:
    /// the scope baseline unless `expected_tool_calls` is configured.
    pub baseline_calls: Option<f32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriftReport {
    /// `0..=1`, 1 = fully on track.
    pub score: f32,
    /// `0..=1`, 1 = the window is about the goal.
    pub relevance: f32,
    /// `0..=1` penalty, 0 = within expectation.
    pub scope: f32,
    /// `0..=1` penalty, 0 = every call in the window brought something new.
    pub repetition: f32,
    /// `score < threshold`, and the run has at least [`MIN_STEPS`] steps.
    pub drifted: bool,
    /// Human-readable; names the causes, dominant first, e.g. "recent
    /// actions (hr.payroll, weather.forecast) share little with the goal
    /// (relevance 0.04); 14 calls vs ~5 expected".
    pub reason: String,
}

/// Scores how far the run has drifted from its goal.
pub fn assess(input: &DriftInput<'_>, settings: &DriftSettings) -> DriftReport {
    let steps = input.steps;
    let window = settings.window.max(1);
    let recent = &steps[steps.len().saturating_sub(window)..];

    let mut goal_text = input.goal.to_owned();
    if let Some(criterion) = input.criterion {
        goal_text.push('\n');
        goal_text.push_str(criterion);
    }
    let goal = term_set(&goal_text);

    // Relevance: per-step lexical similarity, then the semantic override.
    let per_step: Vec<f32> = recent
        .iter()
        .map(|s| set_similarity(&goal, &term_set(&step_text(s))))
        .collect();
    let lexical = if goal.is_empty() || per_step.is_empty() {
        // Nothing to compare with: no evidence of drift.
        1.0
    } else {
        recency_mean(&per_step)
    };
    let semantic = input
        .semantic
        .filter(|s| s.is_finite())
        .map(|s| s.clamp(0.0, 1.0));
    let relevance = semantic.map_or(lexical, |s| s.max(lexical)).clamp(0.0, 1.0);

    let scope = scope_penalty(steps, input.baseline_calls, settings);
    let repetition = repetition_penalty(steps, recent.len());

    let (wr, ws, wp) = weights(settings);
    let factors = [
        (wr, relevance),
        (ws, 1.0 - scope.penalty),
        (wp, 1.0 - repetition.penalty),
    ];
    let score = factors
        .iter()
        .map(|&(w, f)| f.max(0.0).powf(w))
        .product::<f32>()
        .clamp(0.0, 1.0);
    let enough = steps.len() >= MIN_STEPS;
    let drifted = enough && score < settings.threshold;

    // Causes, dominant first: a factor's share of the score's loss is
    // -w·ln(f).
    let loss = |(w, f): (f32, f32)| -w * f.max(1e-6).ln();
    let mut causes: Vec<(f32, String)> = Vec::new();
    if scope.penalty > 0.0 {
        causes.push((loss(factors[1]), scope.describe()));
    }
    if repetition.penalty > 0.0 {
        causes.push((loss(factors[2]), repetition.describe(recent.len())));
    }
    // Low relevance is a cause; so is mediocre relevance when nothing else
    // explains a drift verdict.
    if relevance < LOW_RELEVANCE || (drifted && causes.is_empty()) {
        let unrelated: Vec<&str> = dedup(
            recent
                .iter()
                .zip(&per_step)
                .filter(|&(_, &sim)| sim < UNRELATED_BELOW)
                .map(|(s, _)| s.tool.as_str()),
        );
        let mut text = if unrelated.is_empty() {
            "recent actions share little with the goal".to_owned()
        } else {
            format!(
                "recent actions ({}) share little with the goal",
                unrelated.join(", ")
            )
        };
        let _ = write!(text, " (relevance {relevance:.2})");
        causes.insert(0, (loss(factors[0]), text));
    }
    // Stable sort: equal losses keep the order relevance, scope, repetition.
    causes.sort_by(|a, b| b.0.total_cmp(&a.0));

    let causes: Vec<String> = causes.into_iter().map(|(_, text)| text).collect();
    let reason = if !enough {
        let n = steps.len();
        format!("too early to judge: {n} step(s) so far")
    } else if drifted {
        causes.join("; ")
    } else if causes.is_empty() {
        format!(
            "on track (score {score:.2}): recent actions match the goal (relevance {relevance:.2})"
        )
    } else {
        format!("on track (score {score:.2}), but: {}", causes.join("; "))
    };

    DriftReport {
        score,
        relevance,
        scope: scope.penalty,
        repetition: repetition.penalty,
        drifted,
        reason,
    }
}

/// Mean of the window's per-step similarities, the i-th oldest weighing
/// i: drift is about where the run is heading, so three unrelated steps
/// after one on-topic step read as drift, while one on-topic step after
/// three unrelated ones reads as coming back.
fn recency_mean(values: &[f32]) -> f32 {
    let (mut sum, mut total) = (0.0_f32, 0.0_f32);
    for (i, v) in values.iter().enumerate() {
        let w = (i + 1) as f32;
        sum += w * v;
        total += w;
    }
    if total > 0.0 { sum / total } else { 1.0 }
}

/// Text of the recent window, one line per step: the tool name split on
/// `.`, `_` and `-`, the arguments' keys and values, and the result (keys
/// and values when it is JSON). The caller embeds it for
/// [`DriftInput::semantic`]; keys are kept because `employee`, `city` or
/// `furnace id` say what a call is about as much as its values do.
pub fn window_text(steps: &[StepTrace], window: usize) -> String {
    let recent = &steps[steps.len().saturating_sub(window.max(1))..];
    recent.iter().map(step_text).collect::<Vec<_>>().join("\n")
}

/// Lexical similarity in `[0, 1]` of `text` to `goal`: how well the text
/// covers the goal's terms.
///
/// Both are tokenized alike: camelCase split, lowercased, split on
/// anything not alphanumeric (so `.`, `_`, `-` too), stopwords and
/// one-character tokens dropped, lightly stemmed (`batches` → `batch`,
/// `restarted` → `restart`). The result blends
/// - coverage (weight 0.8): the weight of goal terms found in the text,
///   terms with a digit (ids such as `F2`) counting double and generic
///   ones (`week`, `total`, `last`) a quarter, where half the goal's
///   weight, or 3 for long goals, is full coverage (a step rarely touches
///   more than a few of the goal's terms, and a long goal of input plus
///   follow-ups must not make every step look unrelated); with
/// - the overlap coefficient (0.2): the shared weight over the smaller of
///   the two texts' weights, which credits a short text that is all about
///   the goal.
///
/// 0 when either text has no terms. Deterministic.
pub fn lexical_similarity(goal: &str, text: &str) -> f32 {
    set_similarity(&term_set(goal), &term_set(text))
}

fn set_similarity(goal: &BTreeSet<String>, text: &BTreeSet<String>) -> f32 {
    if goal.is_empty() || text.is_empty() {
        return 0.0;
    }
    let total = weight_of(goal.iter());
    let matched = weight_of(goal.intersection(text));
    let full = (total * FULL_COVERAGE_SHARE).clamp(1.0, FULL_COVERAGE_WEIGHT);
    let coverage = (matched / full).min(1.0);
    let text_total = weight_of(text.iter());
    let overlap = (matched / total.min(text_total)).min(1.0);
    (COVERAGE_BLEND * coverage + (1.0 - COVERAGE_BLEND) * overlap).clamp(0.0, 1.0)
}

/// Summed from +0.0: `Iterator::sum` starts at -0.0, which would
/// serialize as `-0.0` in a report.
fn weight_of<'a>(terms: impl Iterator<Item = &'a String>) -> f32 {
    terms.fold(0.0, |acc, t| acc + term_weight(t))
}

fn term_weight(term: &str) -> f32 {
    if term.bytes().any(|b| b.is_ascii_digit()) {
        IDENTIFIER_WEIGHT
    } else if WEAK_STEMS.contains(term) {
        WEAK_WEIGHT
    } else {
        1.0
    }
}

/// The weights normalized to sum to 1; defaults when unusable.
fn weights(s: &DriftSettings) -> (f32, f32, f32) {
    let clean = |w: f32| if w.is_finite() { w.max(0.0) } else { 0.0 };
    let (r, c, p) = (
        clean(s.relevance_weight),
        clean(s.scope_weight),
        clean(s.repetition_weight),
    );
    let sum = r + c + p;
    if sum > 0.0 {
        (r / sum, c / sum, p / sum)
    } else {
        let d = DriftSettings::default();
        (d.relevance_weight, d.scope_weight, d.repetition_weight)
    }
}

struct Scope {
    penalty: f32,
    calls: usize,
    calls_expected: f32,
    calls_penalty: f32,
    tools: usize,
    tools_expected: f32,
    tools_penalty: f32,
}

impl Scope {
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.calls_penalty > 0.0 {
            parts.push(format!(
                "{} calls vs ~{} expected",
                self.calls,
                approx(self.calls_expected)
            ));
        }
        if self.tools_penalty > 0.0 {
            parts.push(format!(
                "{} distinct tools vs ~{} expected",
                self.tools,
                approx(self.tools_expected)
            ));
        }
        parts.join(", ")
    }
}

fn approx(x: f32) -> String {
    let rounded = x.round();
    if (x - rounded).abs() < 0.05 || x >= 10.0 {
        format!("{rounded:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// Penalty in `[0, 1]` for calls or distinct tools in the whole run beyond
/// the expectation (the larger of the two).
fn scope_penalty(steps: &[StepTrace], baseline: Option<f32>, s: &DriftSettings) -> Scope {
    let baseline = baseline.filter(|b| b.is_finite() && *b > 0.0);
    let (calls_expected, calls_slack) = if s.expected_tool_calls > 0 {
        (s.expected_tool_calls as f32, CONFIGURED_SLACK)
    } else if let Some(b) = baseline {
        (b, TYPICAL_CALLS_SLACK)
    } else {
        (s.default_expected_calls.max(1) as f32, TYPICAL_CALLS_SLACK)
    };
    let (tools_expected, tools_slack) = if s.expected_tools > 0 {
        (s.expected_tools as f32, CONFIGURED_SLACK)
    } else {
        (s.default_expected_tools.max(1) as f32, TYPICAL_TOOLS_SLACK)
    };
    let calls = steps.len();
    let tools = steps
        .iter()
        .map(|s| s.tool.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    let ramp = |count: usize, expected: f32, slack: f32, width: f32| {
        ((count as f32 / expected - slack) / width).clamp(0.0, 1.0)
    };
    let calls_penalty = ramp(calls, calls_expected, calls_slack, CALLS_RAMP);
    let tools_penalty = ramp(tools, tools_expected, tools_slack, TOOLS_RAMP);
    Scope {
        penalty: calls_penalty.max(tools_penalty),
        calls,
        calls_expected,
        calls_penalty,
        tools,
        tools_expected,
        tools_penalty,
    }
}

struct Repetition {
    penalty: f32,
    /// Repeats in the window per tool.
    by_tool: BTreeMap<String, usize>,
}

impl Repetition {
    fn describe(&self, window: usize) -> String {
        let repeats: usize = self.by_tool.values().sum();
        let mut tools: Vec<(&String, &usize)> = self.by_tool.iter().collect();
        // Most repeated first; names break ties (the map is sorted by name
        // and the sort is stable).
        tools.sort_by(|a, b| b.1.cmp(a.1));
        let names: Vec<&str> = tools.iter().map(|(t, _)| t.as_str()).collect();
        format!(
            "{repeats} of the last {window} calls repeated earlier calls with the same result ({})",
            names.join(", ")
        )
    }
}

/// Share of the window's steps whose call (tool and canonical arguments)
/// and outcome already occurred earlier in the run: steps that added
/// nothing. A call whose result changes (a poll that progresses) is not a
/// repeat.
fn repetition_penalty(steps: &[StepTrace], window: usize) -> Repetition {
    let start = steps.len().saturating_sub(window);
    let mut seen: BTreeSet<(String, bool, String)> = BTreeSet::new();
    let mut by_tool: BTreeMap<String, usize> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        let key = (call_key(step), step.ok, outcome_key(step));
        let repeated = !seen.insert(key);
        if repeated && i >= start {
            *by_tool.entry(step.tool.clone()).or_default() += 1;
        }
    }
    let repeats: usize = by_tool.values().sum();
    let penalty = if window == 0 {
        0.0
    } else {
        repeats as f32 / window as f32
    };
    Repetition { penalty, by_tool }
}

/// The loop detector's call fingerprint when the arguments are JSON, so
/// key order or a `null` optional cannot disguise a repeat.
fn call_key(step: &StepTrace) -> String {
    let raw = step.arguments.trim();
    if raw.is_empty() {
        return call_fingerprint(&step.tool, &Value::Null);
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(args) => call_fingerprint(&step.tool, &args),
        Err(_) => format!("{}\u{1f}{raw}", step.tool),
    }
}

fn outcome_key(step: &StepTrace) -> String {
    match &step.outcome {
        Some(fingerprint) => format!("fp:{fingerprint}"),
        None => format!("text:{}", step.result.trim()),
    }
}

/// Tools in first-seen order, without repeats.
fn dedup<'a>(tools: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for tool in tools {
        if !out.contains(&tool) {
            out.push(tool);
        }
    }
    out
}

/// One step as text: tool words, argument keys and values, result.
fn step_text(step: &StepTrace) -> String {
    let mut out = split_name(&step.tool);
    let args = step.arguments.trim();
    if !args.is_empty() {
        out.push(' ');
        match serde_json::from_str::<Value>(args) {
            Ok(v) => flatten_json(&v, &mut out),
            Err(_) => out.push_str(args),
        }
    }
    let result = step.result.trim();
    if !result.is_empty() {
        out.push_str(" -> ");
        match serde_json::from_str::<Value>(result) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => flatten_json(&v, &mut out),
            _ => out.push_str(result),
        }
    }
    out.trim_end().to_owned()
}

/// `plant.batches_per-day` → `plant batches per day`.
fn split_name(name: &str) -> String {
    name.split(['.', '_', '-'])
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Keys (as words) and scalar values, space separated, in document order.
fn flatten_json(value: &Value, out: &mut String) {
    match value {
        Value::Null => {}
        Value::Bool(b) => push_word(out, if *b { "true" } else { "false" }),
        Value::Number(n) => push_word(out, &n.to_string()),
        Value::String(s) => push_word(out, s.trim()),
        Value::Array(items) => {
            for item in items {
                flatten_json(item, out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                push_word(out, &split_name(key));
                flatten_json(item, out);
            }
        }
    }
}

fn push_word(out: &mut String, word: &str) {
    if word.is_empty() {
        return;
    }
    if !out.is_empty() && !out.ends_with(' ') {
        out.push(' ');
    }
    out.push_str(word);
}

fn term_set(text: &str) -> BTreeSet<String> {
    terms(text).collect()
}

/// Tokens of `text` as compared: see [`lexical_similarity`].
fn terms(text: &str) -> impl Iterator<Item = String> + '_ {
    words(text).into_iter().filter_map(|word| {
        if word.chars().count() < 2 || STOPWORDS.contains(&word.as_str()) {
            return None;
        }
        let stemmed = stem(&word);
        (stemmed.chars().count() >= 2).then_some(stemmed)
    })
}

/// Lowercased alphanumeric runs, also split where a lowercase letter meets
/// an uppercase one (`batchId` → `batch`, `id`).
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut prev_lower = false;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        prev_lower = c.is_lowercase();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Light suffix stripping so that inflections meet: plurals (`batches`,
/// `restarts`, `entries`), `-ing`, `-ed`, then a final `e` (`produce`,
/// `produced`, `producing` all become `produc`). Stems keep at least three
/// characters; all suffixes are ASCII, so byte slicing stays on char
/// boundaries.
fn stem(word: &str) -> String {
    let len = word.len();
    let keeps = |cut: usize| len >= cut + 3;
    let mut w: String = if word.ends_with("ies") && keeps(3) {
        format!("{}y", &word[..len - 3])
    } else if word.ends_with("es")
        && keeps(2)
        && ["s", "x", "z", "ch", "sh"]
            .iter()
            .any(|s| word[..len - 2].ends_with(s))
    {
        word[..len - 2].to_owned()
    } else if word.ends_with('s')
        && !["ss", "us", "is"].iter().any(|s| word.ends_with(s))
        && keeps(1)
    {
        word[..len - 1].to_owned()
    } else {
        word.to_owned()
    };
    let l = w.len();
    let cut = if w.ends_with("ing") && l >= 6 {
        3
    } else if w.ends_with("ed") && !w.ends_with("eed") && l >= 5 {
        2
    } else {
        0
    };
    if cut > 0 {
        w.truncate(l - cut);
        // running → runn → run, stopped → stopp → stop
        let b = w.as_bytes();
        let n = b.len();
        if n >= 4
            && b[n - 1] == b[n - 2]
            && !b"lsz".contains(&b[n - 1])
            && b[n - 1].is_ascii_alphabetic()
        {
            w.truncate(n - 1);
        }
    }
    if w.ends_with('e') && w.len() >= 4 {
        w.truncate(w.len() - 1);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(tool: &str, args: &str, result: &str) -> StepTrace {
        StepTrace {
            step: 0,
            tool: tool.to_owned(),
            arguments: args.to_owned(),
            result: result.to_owned(),
            ok: true,
            outcome: None,
        }
    }

    #[test]
    fn stemming_joins_inflections() {
        for (a, b) in [
            ("batches", "batch"),
            ("restarts", "restart"),
            ("restarted", "restart"),
            ("produce", "produced"),
            ("producing", "produce"),
            ("alarms", "alarm"),
            ("entries", "entry"),
            ("running", "run"),
            ("stopped", "stop"),
            ("addresses", "address"),
        ] {
            assert_eq!(stem(a), stem(b), "{a} vs {b}");
        }
        // Words that only look inflected keep their ending.
        assert_eq!(stem("status"), "status");
        assert_eq!(stem("speed"), "speed");
        assert_eq!(stem("bus"), "bus");
    }

    #[test]
    fn tokenizer_splits_names_camel_case_and_drops_noise() {
        let t: Vec<String> =
            terms("plant.batches_perDay How many of THE F2 a 7 furnace-id").collect();
        assert_eq!(t, ["plant", "batch", "per", "day", "f2", "furnac", "id"]);
    }

    #[test]
    fn identifiers_weigh_more_than_common_words() {
        let goal = "batches of furnace F2 last week";
        let with_id = lexical_similarity(goal, "F2 report");
        let with_word = lexical_similarity(goal, "last report");
        assert!(with_id > with_word, "{with_id} vs {with_word}");
    }

    #[test]
    fn generic_words_weigh_less_than_topic_words() {
        assert_eq!(term_weight(&stem("weeks")), WEAK_WEIGHT);
        assert_eq!(term_weight(&stem("dates")), WEAK_WEIGHT);
        assert_eq!(term_weight("batch"), 1.0);
        assert_eq!(term_weight("w46"), IDENTIFIER_WEIGHT);
        let goal = "batches of furnace F2 last week";
        assert!(lexical_similarity(goal, "batch report") > lexical_similarity(goal, "week report"));
    }

    #[test]
    fn step_text_flattens_json_arguments_and_results() {
        let s = step(
            "plant.batches",
            r#"{"furnace_id":"F2","week":"2026-W46"}"#,
            r#"{"batches":[{"batch_id":"B-1041","tonnes":12.5}],"ok":true}"#,
        );
        let text = step_text(&s);
        for part in [
            "plant batches",
            "furnace id F2",
            "week 2026-W46",
            "batch id B-1041",
            "12.5",
        ] {
            assert!(text.contains(part), "{part:?} missing in {text:?}");
        }
        assert!(!text.contains('{'), "{text}");
    }

    #[test]
    fn non_json_arguments_and_results_are_kept_as_text() {
        let s = step("shell", "ls -la /tmp", "total 0");
        assert_eq!(step_text(&s), "shell ls -la /tmp -> total 0");
    }

    #[test]
    fn repeat_key_ignores_argument_key_order_and_nulls() {
        let a = step("t", r#"{"a":1,"b":"x"}"#, "r");
        let b = step("t", r#"{"b":"x","a":1.0,"c":null}"#, "r");
        assert_eq!(call_key(&a), call_key(&b));
        let c = step("t", r#"{"a":2,"b":"x"}"#, "r");
        assert_ne!(call_key(&a), call_key(&c));
    }

    #[test]
    fn weights_are_normalized_and_fall_back_to_defaults() {
        let mut s = DriftSettings {
            relevance_weight: 3.0,
            scope_weight: 1.0,
            repetition_weight: 1.0,
            ..DriftSettings::default()
        };
        let (r, c, p) = weights(&s);
        assert!((r - 0.6).abs() < 1e-6 && (c - 0.2).abs() < 1e-6 && (p - 0.2).abs() < 1e-6);
        s.relevance_weight = f32::NAN;
        s.scope_weight = 0.0;
        s.repetition_weight = -1.0;
        assert_eq!(weights(&s), (0.6, 0.2, 0.2));
    }
}
