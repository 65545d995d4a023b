//! Loop detection (SPEC §4.10): before a call runs, the run's call history
//! says whether running it would repeat a loop.
//!
//! Two identities drive every detector. A *call* is the tool plus a hash of
//! its arguments in canonical form, so key order, `null` optionals and
//! `5` versus `5.0` cannot make one call look like another. An *outcome* is
//! a hash of the result with volatile fields (timestamps, request ids,
//! durations) removed, so a result that differs only by its clock still
//! counts as "nothing new". Progress is a change of outcome: repeating a call
//! whose result keeps changing is not a loop, and repeating one whose result
//! never changes is, however the arguments are dressed up.
//!
//! Detectors, all pure functions of the history:
//! - `generic_repeat`: the same call with the same outcome again;
//! - `known_poll_no_progress`: the same for tools marked `poll`, with higher
//!   thresholds, since polling the same status a few times is normal;
//! - `ping_pong`: alternating between two calls;
//! - `global_circuit_breaker`: too many calls, or too many identical
//!   outcomes of one tool, in the run;
//! - `unknown_tool_repeat`: calls to tools that do not exist keep coming;
//! - `error_streak`: one tool keeps failing with the same error while the
//!   model churns its arguments.
//!
//! The module only judges; the run loop decides what a hit does (a warning
//! becomes a note to the model, the first critical blocks the call and
//! gives one recovery turn, a second critical or any critical breaker ends
//! the run with `loop_blocked`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};
use sha2::{Digest, Sha256};

/// Records kept per run. Older ones are dropped (the breaker's counters
/// still cover them): loops live at the tail, and the history is persisted
/// with the run, so it must stay small.
pub const HISTORY_WINDOW: usize = 200;

/// Hex digits kept of each SHA-256 fingerprint: 64 bits is far beyond what
/// one run's few hundred calls could collide on, and keeps the persisted
/// history compact.
const FINGERPRINT_HEX: usize = 16;

/// Distinct (tool, outcome) counters kept for the identical-outcomes
/// breaker before the ones seen only once are forgotten.
const MAX_OUTCOME_KEYS: usize = 512;

/// Result keys that change on every call without saying anything about the
/// work: clocks, per-request ids, timings. Compared after
/// [`normalize_key`], so `requestId`, `request_id` and `Request-ID` are one
/// entry. Deliberately not `id`, `uuid`, `cursor` or `updated_at`: those
/// usually name the data or mark real progress.
const BUILTIN_VOLATILE: &[&str] = &[
    // clocks
    "timestamp",
    "ts",
    "time",
    "now",
    "datetime",
    "servertime",
    "currenttime",
    "generatedat",
    "fetchedat",
    "retrievedat",
    "checkedat",
    "requestedat",
    "respondedat",
    "receivedat",
    "sentat",
    "asof",
    "lastchecked",
    // per-request ids
    "requestid",
    "traceid",
    "spanid",
    "correlationid",
    "messageid",
    "executionid",
    "invocationid",
    "callid",
    "toolcallid",
    "idempotencykey",
    "nonce",
    "etag",
    // timings
    "duration",
    "durationms",
    "durations",
    "elapsed",
    "elapsedms",
    "elapseds",
    "latency",
    "latencyms",
    "took",
    "tookms",
    "responsetime",
    "responsetimems",
    "executiontime",
    "executiontimems",
    "processingtimems",
];

/// The detectors' thresholds are the agent's `[agents.loop_detection]`
/// configuration, used as it is. A threshold of 0 turns that level off.
///
/// Streak thresholds (`repeat_*`, `poll_*`, `ping_pong_*`, `unknown_tool_*`,
/// `error_streak_*`) count calls *including the proposed one*: with
/// `repeat_warning = 3` the third identical call is the first one warned
/// about. A repeat needs a previous call, so thresholds below 2 act as 2
/// (ping-pong: below 3 act as 3, the shortest alternation `A,B,A`).
///
/// Breaker thresholds count what already happened, because the proposed
/// call's outcome is not known yet: with `max_tool_calls_breaker = 30`
/// thirty calls run and the thirty-first is blocked. Each breaker also warns
/// from 80 % of its threshold so the model can wrap up before it trips.
pub use keel_config::LoopDetection;

// The detectors and levels are part of the event vocabulary (`loop_detected`).
pub use keel_protocol::{LoopDetector as Detector, LoopLevel as Level};

/// A detector that fired for a proposed call.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopHit {
    pub detector: Detector,
    pub level: Level,
    /// The proposed call's tool.
    pub tool: String,
    /// The number compared against the threshold (see [`LoopDetection`]).
    pub count: u32,
    /// Addressed to the model: names the call being repeated and what to
    /// do instead.
    pub message: String,
}

/// What became of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Ran and succeeded.
    Ok,
    /// Ran and failed (tool error or `is_error` result).
    Error,
    /// Named a tool that does not exist; never ran.
    UnknownTool,
    /// Not run: blocked by loop detection, a hook or policy.
    Blocked,
}

/// One call of the run as loop detection sees it.
///
/// `outcome` is what makes a record take part in the repeat detectors:
/// a record without one (a loop block, an unknown tool) is transparent, so
/// a blocked repeat neither resets nor extends the streak that got it
/// blocked, and proposing it again is critical again. A call refused by
/// policy or a hook may carry the fingerprint of the refusal as its outcome,
/// so that asking again and again for the same refused thing is a loop too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub tool: String,
    /// [`call_fingerprint`] of the tool and arguments.
    pub call: String,
    /// [`outcome_fingerprint`] of the result; `None` when nothing ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    pub kind: Outcome,
    /// The tool is marked `poll`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub poll: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl CallRecord {
    fn executed(&self) -> bool {
        matches!(self.kind, Outcome::Ok | Outcome::Error)
    }
}

/// One run's call history. Belongs to a single run (a follow-up or a new
/// run starts from an empty one), and is persisted with it, so detection
/// survives a restart: its two counters as JSON, `{recorded, executed}`,
/// with the run's state, and its records one by one, each once, beside it;
/// the outcome counters are counted again from those records when the run
/// is loaded (see [`persisted`]).
#[derive(Debug, Clone, Default)]
pub struct CallHistory {
    /// The last [`HISTORY_WINDOW`] records, oldest first.
    records: Vec<CallRecord>,
    /// Records ever added, including those dropped from the window.
    recorded: u32,
    /// Calls that ran (`Ok` or `Error`), for the breaker.
    executed: u32,
    /// Runs per `"<outcome> <tool>"`, for the identical-outcomes breaker.
    outcomes: BTreeMap<String, u32>,
    /// Loaded from a state that leaves the outcome counters to the stored
    /// records: [`CallHistory::restore`] counts them again.
    outcomes_unloaded: bool,
    /// The JSON of each record in `records`, made when it was recorded.
    encoded: persisted::EncodedRecords,
    /// Records that left the window before a commit stored them, for the
    /// next one: the outcome counters are rebuilt from every stored record,
    /// so none may be skipped.
    overflow: Vec<keel_protocol::StoredCall>,
    /// Which records in `records` show progress, kept as they come.
    progress: progress::Progress,
    /// Records up to this count (of `recorded`) are in the store; the
    /// others go with the next commit ([`CallHistory::take_unstored`]).
    stored: u32,
}

impl PartialEq for CallHistory {
    /// The encoded records and the progress flags are derived from
    /// `records`, and what is stored is bookkeeping, so they take no part.
    fn eq(&self, other: &Self) -> bool {
        self.records == other.records
            && self.recorded == other.recorded
            && self.executed == other.executed
            && self.outcomes == other.outcomes
    }
}

/// Stable fingerprint of a call: the tool and its arguments in canonical
/// form (object keys sorted, `null` members dropped, integral floats
/// written as integers, top-level `null` as `{}`). SHA-256, hex, truncated;
/// persisted, so the encoding is versioned and must never change silently.
pub fn call_fingerprint(tool: &str, args: &Value) -> String {
    let mut canonical = String::new();
    let empty = Value::Object(serde_json::Map::new());
    let args = if args.is_null() { &empty } else { args };
    write_canonical(args, &mut canonical, &Canon::Call);
    digest(&["keel-call-v1", tool, &canonical])
}

/// Stable fingerprint of a result with its volatile fields removed, at any
/// depth: the built-in clocks, request ids and timings, plus the tool's own
/// `volatile_fields` (key names, matched ignoring case, `_` and `-`).
/// `structured` is used when given; otherwise text that parses as JSON is
/// treated as JSON; anything else is hashed as is after trimming.
pub fn outcome_fingerprint(
    output: &str,
    structured: Option<&Value>,
    volatile_fields: &[String],
) -> String {
    let parsed;
    let json = match structured {
        Some(v) => Some(v),
        None => {
            parsed = serde_json::from_str::<Value>(output.trim()).ok();
            parsed.as_ref()
        }
    };
    outcome_fingerprint_json(output, json, volatile_fields)
}

/// [`outcome_fingerprint`] for a caller that has read the output as JSON
/// already: `json` is the structured result, else `output` (trimmed) as one
/// JSON document, else `None`.
pub fn outcome_fingerprint_json(
    output: &str,
    json: Option<&Value>,
    volatile_fields: &[String],
) -> String {
    let extra: Vec<String> = volatile_fields
        .iter()
        .map(|f| normalize_key(f).into_owned())
        .collect();
    let canon = Canon::Outcome { extra: &extra };
    match json {
        Some(v) => {
            let mut canonical = String::with_capacity(output.len());
            write_canonical(v, &mut canonical, &canon);
            digest(&["keel-outcome-v1", "json", &canonical])
        }
        None => digest(&["keel-outcome-v1", "text", output.trim()]),
    }
}

impl CallHistory {
    /// Judges a proposed call (already validated, about to run) against
    /// the history; `None` when it may run without comment. Returns the
    /// strongest hit: critical over warning; among criticals the breaker
    /// first (it ends the run), then ping-pong, repeat, error streak; among
    /// warnings the same but with the breaker last.
    ///
    /// Repeat semantics (`generic_repeat`, and `known_poll_no_progress` with
    /// the `poll_*` thresholds when `poll` is true): let N be the number of
    /// earlier calls with this fingerprint, counted back from the latest one
    /// until the outcome changes, plus one for the proposed call. N is
    /// compared with the thresholds: Warning for `warning <= N < critical`,
    /// Critical for `N >= critical`. So with the defaults (3/5) the 3rd and
    /// 4th identical calls run with a warning and the 5th is blocked: a call
    /// whose outcome never changes runs at most `repeat_critical - 1` times,
    /// which satisfies "ran at most `repeat_critical` times" with one to
    /// spare. The identical calls need not be consecutive (`A,B,C,A,B,C,…`
    /// with stable results is caught too); the count ends at the first
    /// change of outcome, of this call or of any call run in between (that
    /// is progress). Records without an outcome (loop blocks, unknown tools)
    /// neither count nor end it, so proposing a blocked call again is
    /// critical again.
    ///
    /// Ping-pong: N = the length of the tail alternating between exactly
    /// two fingerprints, the proposed call included (`A,B,A` + `B` is 4);
    /// a third fingerprint ends the tail. Critical needs both sides'
    /// outcomes unchanged over the tail; otherwise at most a warning, and
    /// nothing when one side is a `poll` tool whose status changes.
    ///
    /// Error streak: N = the most recent calls that all failed in this tool
    /// with the same error (any arguments), plus the proposed call.
    ///
    /// Breaker: critical once `max_tool_calls_breaker` calls have run, or once this
    /// tool's latest outcome has been seen `identical_outcomes_breaker`
    /// times in the run; a warning from 80 % of either.
    pub fn check(&self, tool: &str, call: &str, poll: bool, s: &LoopDetection) -> Option<LoopHit> {
        if !s.enabled {
            return None;
        }
        let hits = [
            self.breaker(tool, s),
            self.ping_pong(tool, call, s),
            self.repeat(tool, call, poll, s),
            self.error_streak(tool, s),
        ];
        hits.into_iter().flatten().max_by_key(rank)
    }

    /// Judges a call naming a tool that does not exist (before it is
    /// rejected). N = unknown-tool calls since the last call that ran, plus
    /// this one, whatever names they used (a model guessing a different
    /// name each time is looping too). Warning from `unknown_tool_warning`,
    /// Critical from `unknown_tool_critical`.
    pub fn check_unknown_tool(&self, tool: &str, s: &LoopDetection) -> Option<LoopHit> {
        if !s.enabled {
            return None;
        }
        let mut names: Vec<&str> = vec![tool];
        for r in self.records.iter().rev() {
            match r.kind {
                Outcome::Ok | Outcome::Error => break,
                Outcome::UnknownTool => names.push(&r.tool),
                Outcome::Blocked => {}
            }
        }
        let n = count_u32(names.len());
        let level = streak_level(n, s.unknown_tool_warning, s.unknown_tool_critical, 2)?;
        names.sort_unstable();
        names.dedup();
        let tried = names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let message = match level {
            Level::Warning => format!(
                "Loop warning: `{tool}` is not an available tool, and this is call {n} in a row to a tool that does not exist (tried: {tried}). Use only the tools you were given, exactly as named, or answer without a tool."
            ),
            Level::Critical => format!(
                "Loop blocked: `{tool}` does not exist, and this is call {n} in a row to a tool that does not exist (tried: {tried}). Stop guessing tool names: use one of the tools you were given, or answer the user with what you know."
            ),
        };
        Some(LoopHit {
            detector: Detector::UnknownToolRepeat,
            level,
            tool: tool.to_string(),
            count: n,
            message,
        })
    }

    pub fn record(&mut self, rec: CallRecord) {
        self.recorded = self.recorded.saturating_add(1);
        if rec.executed() {
            self.executed = self.executed.saturating_add(1);
        }
        count_outcome(&mut self.outcomes, &rec);
        self.encoded.push(&self.records, &rec);
        self.progress.push(&rec);
        self.records.push(rec);
        if self.records.len() > HISTORY_WINDOW {
            let excess = self.records.len() - HISTORY_WINDOW;
            self.keep_unstored_leaving(excess);
            self.records.drain(..excess);
            self.encoded.drop_oldest(excess);
            self.progress = progress::Progress::of(&self.records);
        }
    }

    /// Calls recorded in the run, including those dropped from the window.
    pub fn len(&self) -> usize {
        self.recorded as usize
    }

    pub fn is_empty(&self) -> bool {
        self.recorded == 0
    }

    /// Calls that ran in the run (`Ok` or `Error`).
    pub fn executed_calls(&self) -> u32 {
        self.executed
    }

    /// The most recent records, oldest first.
    pub fn records(&self) -> &[CallRecord] {
        &self.records
    }

    fn breaker(&self, tool: &str, s: &LoopDetection) -> Option<LoopHit> {
        let calls = breaker_level(self.executed, s.max_tool_calls_breaker).map(|level| {
            let limit = s.max_tool_calls_breaker;
            let done = self.executed;
            let message = match level {
                Level::Critical => format!(
                    "Loop blocked: `{tool}` was not run. This run has already made {done} tool calls, the most allowed ({limit}). Stop calling tools and answer the user now with what you have found so far."
                ),
                Level::Warning => format!(
                    "Loop warning: this run has made {done} of at most {limit} tool calls. Call only what you still need, then answer the user."
                ),
            };
            LoopHit {
                detector: Detector::GlobalCircuitBreaker,
                level,
                tool: tool.to_string(),
                count: done,
                message,
            }
        });
        let identical = self
            .records
            .iter()
            .rev()
            .find(|r| r.tool == tool && r.executed() && r.outcome.is_some())
            .and_then(|r| r.outcome.as_deref())
            .and_then(|outcome| {
                let seen = self
                    .outcomes
                    .get(&outcome_key(outcome, tool))
                    .copied()
                    .unwrap_or(0);
                let level = breaker_level(seen, s.identical_outcomes_breaker)?;
                let message = match level {
                    Level::Critical => format!(
                        "Loop blocked: `{tool}` was not run. It has returned the same result {seen} times in this run, whatever the arguments. Calling it again will not help: answer the user with what you have, or say what is missing."
                    ),
                    Level::Warning => format!(
                        "Loop warning: `{tool}` has returned the same result {seen} times in this run, even with different arguments. Varying the arguments is not producing anything new; use what you have or try a different approach."
                    ),
                };
                Some(LoopHit {
                    detector: Detector::GlobalCircuitBreaker,
                    level,
                    tool: tool.to_string(),
                    count: seen,
                    message,
                })
            });
        [calls, identical]
            .into_iter()
            .flatten()
            .max_by_key(|h| h.level)
    }

    /// A record whose call returned something different from that call's
    /// previous run is progress, and progress anywhere excuses repeating a
    /// call that merely waits for it (`wait` between polls, re-reading a
    /// file another call keeps changing).
    fn repeat(&self, tool: &str, call: &str, poll: bool, s: &LoopDetection) -> Option<LoopHit> {
        let changed = self.progress.flags();
        let mut streak: u32 = 0;
        let mut latest: Option<&str> = None;
        for (r, &changed) in self.records.iter().zip(changed).rev() {
            if r.call != call || r.tool != tool {
                if changed {
                    break;
                }
                continue;
            }
            let Some(outcome) = r.outcome.as_deref() else {
                continue;
            };
            match latest {
                None => latest = Some(outcome),
                Some(l) if l != outcome => break,
                Some(_) => {}
            }
            streak = streak.saturating_add(1);
        }
        let n = streak.saturating_add(1);
        let before = streak;
        if poll {
            let level = streak_level(n, s.poll_warning, s.poll_critical, 2)?;
            let message = match level {
                Level::Warning => format!(
                    "Loop warning: polling `{tool}` with the same arguments has returned the same status {before} times in a row; this is poll {n}. Nothing is progressing: wait for a real change, or tell the user the current status instead of polling again."
                ),
                Level::Critical => format!(
                    "Loop blocked: `{tool}` was not run. Polling it with these arguments returned the same status {before} times in a row, so the operation is not progressing. Stop polling; tell the user the current status and that it appears stuck."
                ),
            };
            return Some(LoopHit {
                detector: Detector::KnownPollNoProgress,
                level,
                tool: tool.to_string(),
                count: n,
                message,
            });
        }
        let level = streak_level(n, s.repeat_warning, s.repeat_critical, 2)?;
        let message = match level {
            Level::Warning => format!(
                "Loop warning: this is call {n} of `{tool}` with exactly the same arguments, and the previous {before} returned the same result. Repeating it will not produce anything new: use the result you already have, change the approach (other arguments or another tool), or answer the user."
            ),
            Level::Critical => format!(
                "Loop blocked: `{tool}` was not run. It has already been called {before} times with exactly these arguments and returned the same result every time. Do not call it again with these arguments; answer the user from the results you have, or explain what is missing."
            ),
        };
        Some(LoopHit {
            detector: Detector::GenericRepeat,
            level,
            tool: tool.to_string(),
            count: n,
            message,
        })
    }

    /// The tail of calls that have an outcome must alternate between the
    /// proposed call and exactly one other; any third call breaks it.
    fn ping_pong(&self, tool: &str, call: &str, s: &LoopDetection) -> Option<LoopHit> {
        // A blocked call still took its turn in the alternation (it has no
        // outcome, so it does not count for stability): otherwise the block
        // itself would reset the pattern and the model could resume it.
        let mut with_outcome = self
            .records
            .iter()
            .rev()
            .filter(|r| r.outcome.is_some() || r.kind == Outcome::Blocked);
        let last = with_outcome.next()?;
        if last.call == call {
            return None;
        }
        let mut tail: Vec<&CallRecord> = vec![last];
        for r in with_outcome {
            let expected = if tail.len().is_multiple_of(2) {
                last.call.as_str()
            } else {
                call
            };
            if r.call != expected {
                break;
            }
            tail.push(r);
        }
        let n = count_u32(tail.len()).saturating_add(1);
        let side_stable = |fingerprint: &str| {
            let mut outcomes = tail
                .iter()
                .filter(|r| r.call == fingerprint)
                .filter_map(|r| r.outcome.as_deref());
            let first = outcomes.next();
            first.is_some() && outcomes.all(|o| Some(o) == first)
        };
        let stable_a = side_stable(call);
        let stable_b = side_stable(&last.call);
        // Polling next to another call (wait, then poll) is the normal way
        // to poll; while the poll's status changes it is not stuck.
        let poll_progressing = tail.iter().any(|r| r.poll && !side_stable(&r.call));
        if poll_progressing {
            return None;
        }
        let stable = stable_a && stable_b;
        let critical = if stable { s.ping_pong_critical } else { 0 };
        let level = streak_level(n, s.ping_pong_warning, critical, 3)?;
        let other = &last.tool;
        let message = match level {
            Level::Warning if stable => format!(
                "Loop warning: you are alternating between `{tool}` and `{other}` ({n} calls in a row) and their results are not changing. Decide what you need from them and move on: answer the user or try something different."
            ),
            Level::Warning => format!(
                "Loop warning: you are alternating between `{tool}` and `{other}` ({n} calls in a row). If this is not converging, stop switching and answer the user with what you have."
            ),
            Level::Critical => format!(
                "Loop blocked: `{tool}` was not run. You have alternated between `{tool}` and `{other}` for {} calls and their results never changed. Stop switching between them; answer the user from the results you already have.",
                n - 1
            ),
        };
        Some(LoopHit {
            detector: Detector::PingPong,
            level,
            tool: tool.to_string(),
            count: n,
            message,
        })
    }

    /// N = the run of most recent calls (with an outcome) that all failed
    /// in `tool` with the same error, plus the proposed call.
    fn error_streak(&self, tool: &str, s: &LoopDetection) -> Option<LoopHit> {
        let mut streak: u32 = 0;
        let mut error: Option<&str> = None;
        let mut argument_sets: Vec<&str> = Vec::new();
        for r in self.records.iter().rev() {
            let Some(outcome) = r.outcome.as_deref() else {
                continue;
            };
            if r.kind != Outcome::Error || r.tool != tool {
                break;
            }
            match error {
                None => error = Some(outcome),
                Some(e) if e != outcome => break,
                Some(_) => {}
            }
            streak = streak.saturating_add(1);
            if !argument_sets.contains(&r.call.as_str()) {
                argument_sets.push(&r.call);
            }
        }
        let n = streak.saturating_add(1);
        let level = streak_level(n, s.error_streak_warning, s.error_streak_critical, 2)?;
        let variants = argument_sets.len();
        let message = match level {
            Level::Warning => format!(
                "Loop warning: `{tool}` has failed {streak} times in a row with the same error ({variants} different argument sets). Changing the arguments is not fixing it: read the error, fix its cause, or tell the user the tool is failing."
            ),
            Level::Critical => format!(
                "Loop blocked: `{tool}` was not run. It has failed {streak} times in a row with the same error, whatever the arguments. Stop retrying it; tell the user what failed and answer with what you know."
            ),
        };
        Some(LoopHit {
            detector: Detector::ErrorStreak,
            level,
            tool: tool.to_string(),
            count: n,
            message,
        })
    }
}

/// Which hit wins when several fire; see [`CallHistory::check`].
fn rank(hit: &LoopHit) -> (Level, u8) {
    let order = match (hit.level, hit.detector) {
        (Level::Critical, Detector::GlobalCircuitBreaker) => 5,
        (Level::Warning, Detector::GlobalCircuitBreaker) => 0,
        (_, Detector::PingPong) => 4,
        (_, Detector::GenericRepeat | Detector::KnownPollNoProgress) => 3,
        (_, Detector::ErrorStreak) => 2,
        (_, Detector::UnknownToolRepeat) => 1,
    };
    (hit.level, order)
}

/// Level of a streak of `n` calls (the proposed one included); `floor` is
/// the shortest streak that is a pattern at all.
fn streak_level(n: u32, warning: u32, critical: u32, floor: u32) -> Option<Level> {
    let reached = |threshold: u32| threshold > 0 && n >= threshold.max(floor);
    if reached(critical) {
        Some(Level::Critical)
    } else if reached(warning) {
        Some(Level::Warning)
    } else {
        None
    }
}

/// Level of a breaker that has counted `seen` so far: critical at the
/// limit, a warning from 80 % of it.
fn breaker_level(seen: u32, limit: u32) -> Option<Level> {
    if limit == 0 {
        return None;
    }
    let warn_at = limit.saturating_mul(4) / 5;
    if seen >= limit {
        Some(Level::Critical)
    } else if warn_at > 0 && seen >= warn_at {
        Some(Level::Warning)
    } else {
        None
    }
}

fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Counts an executed call's outcome for the identical-outcomes breaker.
/// Recording and restoring both count through here, so the counters
/// rebuilt from the stored records are the ones the run had.
fn count_outcome(outcomes: &mut BTreeMap<String, u32>, rec: &CallRecord) {
    let Some(outcome) = rec.outcome.as_deref().filter(|_| rec.executed()) else {
        return;
    };
    let counter = outcomes.entry(outcome_key(outcome, &rec.tool)).or_insert(0);
    *counter = counter.saturating_add(1);
    if outcomes.len() > MAX_OUTCOME_KEYS {
        outcomes.retain(|_, n| *n > 1);
    }
}

fn outcome_key(outcome: &str, tool: &str) -> String {
    format!("{outcome} {tool}")
}

fn digest(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        // Length-prefixed so that no two part lists share an encoding.
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    // Every call and result is fingerprinted, so the digits are encoded
    // directly rather than formatted one byte at a time.
    hex::encode(&hasher.finalize()[..FINGERPRINT_HEX / 2])
}

/// Lowercase without `_`, `-` or spaces: how volatile keys are compared.
/// Most keys already are (every key of every result is compared), and are
/// borrowed as they are.
fn normalize_key(key: &str) -> Cow<'_, str> {
    if key
        .bytes()
        .all(|b| b.is_ascii() && !b.is_ascii_uppercase() && !matches!(b, b'_' | b'-' | b' '))
    {
        return Cow::Borrowed(key);
    }
    Cow::Owned(
        key.chars()
            .filter(|c| !matches!(c, '_' | '-' | ' '))
            .flat_map(char::to_lowercase)
            .collect(),
    )
}

enum Canon<'a> {
    /// Arguments: absent and `null` members mean the same call.
    Call,
    /// Results: volatile members are dropped (normalized extra names).
    Outcome { extra: &'a [String] },
}

impl Canon<'_> {
    fn skips(&self, key: &str, value: &Value) -> bool {
        match self {
            Canon::Call => value.is_null(),
            Canon::Outcome { extra } => {
                let key = normalize_key(key);
                BUILTIN_VOLATILE.contains(&key.as_ref()) || extra.iter().any(|e| *e == key)
            }
        }
    }
}

/// Compact JSON with sorted keys, written by hand so that neither
/// serde_json's map order (`preserve_order`) nor its float formatting
/// choices can change a persisted fingerprint.
fn write_canonical(value: &Value, out: &mut String, canon: &Canon<'_>) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out, canon);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> =
                map.iter().filter(|(k, v)| !canon.skips(k, v)).collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(item, out, canon);
            }
            out.push('}');
        }
    }
}

/// Integers as integers; a float with no fractional part (within the range
/// where f64 is exact) as the integer it equals, so `5.0` and `5` agree.
fn write_number(n: &Number, out: &mut String) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < EXACT) {
        let _ = write!(out, "{}", f as i64);
    } else {
        let _ = write!(out, "{n}");
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    // Every result's strings go through here, so the runs between escapes
    // are copied whole rather than char by char. Each byte escaped is
    // ASCII, so the slices end on char boundaries.
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match escape {
            Some(escape) => out.push_str(escape),
            None => {
                let _ = write!(out, "\\u{b:04x}");
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

mod persisted;
pub use persisted::BadRecord;
mod progress;
#[cfg(test)]
mod tests;
