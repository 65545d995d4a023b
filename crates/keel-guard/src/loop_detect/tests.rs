use super::*;
use keel_protocol::StoredCall;
use serde_json::json;

/// One past call, as the run loop would record it.
struct Step {
    tool: &'static str,
    args: Value,
    output: String,
    kind: Outcome,
    poll: bool,
}

fn ok(tool: &'static str, args: Value, output: impl Into<String>) -> Step {
    Step {
        tool,
        args,
        output: output.into(),
        kind: Outcome::Ok,
        poll: false,
    }
}

fn err(tool: &'static str, args: Value, output: impl Into<String>) -> Step {
    Step {
        kind: Outcome::Error,
        ..ok(tool, args, output)
    }
}

fn poll(tool: &'static str, args: Value, output: impl Into<String>) -> Step {
    Step {
        poll: true,
        ..ok(tool, args, output)
    }
}

fn unknown(tool: &'static str) -> Step {
    Step {
        kind: Outcome::UnknownTool,
        ..ok(tool, json!({}), "")
    }
}

/// A call stopped by loop detection: nothing ran, so no outcome.
fn loop_blocked(tool: &'static str, args: Value) -> Step {
    Step {
        kind: Outcome::Blocked,
        ..ok(tool, args, "")
    }
}

/// The history as a run stores it (its counters as JSON with the state,
/// its new records handed to `store`) and loads it back.
fn stored_and_loaded(h: &mut CallHistory, store: &mut Vec<StoredCall>) -> CallHistory {
    store.extend(h.take_unstored());
    let text = serde_json::to_string(&*h).unwrap();
    assert!(!text.contains("records"), "{text}");
    let mut loaded: CallHistory = serde_json::from_str(&text).unwrap();
    assert_eq!(loaded.awaits_records(), !h.is_empty());
    if loaded.awaits_records() {
        // What the store answers: its latest records, as many as asked.
        let wanted = loaded.records_to_restore() as usize;
        let last = store.len().saturating_sub(wanted);
        loaded.restore(store[last..].to_vec()).unwrap();
    }
    loaded
}

fn record_of(step: &Step) -> CallRecord {
    let ran = matches!(step.kind, Outcome::Ok | Outcome::Error);
    CallRecord {
        tool: step.tool.to_string(),
        call: call_fingerprint(step.tool, &step.args),
        outcome: ran.then(|| outcome_fingerprint(&step.output, None, &[])),
        kind: step.kind,
        poll: step.poll,
    }
}

fn history(steps: &[Step]) -> CallHistory {
    let mut h = CallHistory::default();
    for step in steps {
        h.record(record_of(step));
    }
    h
}

fn repeat<F: Fn(usize) -> Step>(n: usize, f: F) -> Vec<Step> {
    (0..n).map(f).collect()
}

fn cycle(times: usize, pattern: &[&dyn Fn(usize) -> Step]) -> Vec<Step> {
    let mut out = Vec::new();
    for i in 0..times {
        out.push(pattern[i % pattern.len()](i));
    }
    out
}

type Expect = Option<(Detector, Level)>;

fn probe(h: &CallHistory, tool: &str, args: &Value, is_poll: bool, s: &LoopDetection) -> Expect {
    h.check(tool, &call_fingerprint(tool, args), is_poll, s)
        .map(|hit| (hit.detector, hit.level))
}

use Detector::*;
use Level::*;

struct Case {
    name: &'static str,
    steps: Vec<Step>,
    propose: (&'static str, Value, bool),
    expect: Expect,
}

fn status(f: &str) -> Value {
    json!({"furnace_id": f})
}

#[test]
fn check_table() {
    let a = |_: usize| ok("furnace_status", status("F1"), r#"{"temp":900}"#);
    let b = |_: usize| ok("furnace_log", status("F1"), r#"{"lines":["idle"]}"#);
    let a_changing = |i: usize| ok("furnace_status", status("F1"), format!(r#"{{"temp":{i}}}"#));
    let b_changing = |i: usize| ok("furnace_log", status("F1"), format!(r#"{{"n":{i}}}"#));
    let c = |_: usize| ok("plant_overview", json!({}), "all fine");
    let wait = |_: usize| ok("wait", json!({"s": 5}), "waited 5s");
    let job = |i: usize| poll("job_status", json!({"job": "j1"}), format!("running {i}%"));
    let cases = vec![
        Case {
            name: "empty history",
            steps: vec![],
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "distinct calls never trip",
            steps: repeat(20, |i| {
                ok(
                    "furnace_status",
                    status(&format!("F{i}")),
                    format!("temp {i}"),
                )
            }),
            propose: ("furnace_status", status("F99"), false),
            expect: None,
        },
        Case {
            name: "distinct calls with a shared answer stay under the breaker",
            steps: repeat(10, |i| {
                ok("search", json!({"q": format!("q{i}")}), "no results")
            }),
            propose: ("search", json!({"q": "other"}), false),
            expect: None,
        },
        Case {
            name: "one earlier identical call is no loop",
            steps: repeat(1, a),
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "third identical call warns",
            steps: repeat(2, a),
            propose: ("furnace_status", status("F1"), false),
            expect: Some((GenericRepeat, Warning)),
        },
        Case {
            name: "fifth identical call is critical",
            steps: repeat(4, a),
            propose: ("furnace_status", status("F1"), false),
            expect: Some((GenericRepeat, Critical)),
        },
        Case {
            name: "key order does not make a new call",
            steps: repeat(4, |_| {
                ok(
                    "query",
                    serde_json::from_str(r#"{"b":{"y":2,"x":1},"a":[1,2]}"#).unwrap(),
                    "same",
                )
            }),
            propose: (
                "query",
                serde_json::from_str(r#"{"a":[1,2],"b":{"x":1,"y":2}}"#).unwrap(),
                false,
            ),
            expect: Some((GenericRepeat, Critical)),
        },
        Case {
            name: "identical calls with changing outcomes are progress",
            steps: repeat(12, a_changing),
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "the count restarts at the last change of outcome",
            steps: {
                let mut s = repeat(4, a);
                s.push(ok("furnace_status", status("F1"), r#"{"temp":901}"#));
                s
            },
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "volatile fields do not count as progress",
            steps: repeat(4, |i| {
                ok(
                    "furnace_status",
                    status("F1"),
                    json!({
                        "temp": 900,
                        "timestamp": format!("2025-01-01T00:00:0{i}Z"),
                        "meta": {"requestId": format!("r{i}"), "duration_ms": i * 7},
                    })
                    .to_string(),
                )
            }),
            propose: ("furnace_status", status("F1"), false),
            expect: Some((GenericRepeat, Critical)),
        },
        Case {
            name: "a 3-cycle with stable results is caught by repeat",
            steps: cycle(6, &[&a, &b, &c]),
            propose: ("furnace_status", status("F1"), false),
            expect: Some((GenericRepeat, Warning)),
        },
        Case {
            name: "poll with changing output never trips",
            steps: repeat(20, job),
            propose: ("job_status", json!({"job": "j1"}), true),
            expect: None,
        },
        Case {
            name: "poll tool is not judged by the generic thresholds",
            steps: repeat(3, |_| poll("job_status", json!({"job": "j1"}), "running")),
            propose: ("job_status", json!({"job": "j1"}), true),
            expect: None,
        },
        Case {
            name: "poll with the same status warns at poll_warning",
            steps: repeat(4, |_| poll("job_status", json!({"job": "j1"}), "running")),
            propose: ("job_status", json!({"job": "j1"}), true),
            expect: Some((KnownPollNoProgress, Warning)),
        },
        Case {
            name: "poll with the same status is critical at poll_critical",
            steps: repeat(9, |_| poll("job_status", json!({"job": "j1"}), "running")),
            propose: ("job_status", json!({"job": "j1"}), true),
            expect: Some((KnownPollNoProgress, Critical)),
        },
        Case {
            name: "wait between polls of a changing status never trips",
            steps: cycle(20, &[&wait, &job]),
            propose: ("wait", json!({"s": 5}), false),
            expect: None,
        },
        Case {
            name: "ping-pong below the warning",
            steps: cycle(2, &[&a, &b]),
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "ping-pong with stable outcomes warns at 4",
            steps: cycle(3, &[&a, &b]),
            propose: ("furnace_log", status("F1"), false),
            expect: Some((PingPong, Warning)),
        },
        Case {
            name: "ping-pong with stable outcomes is critical at 8",
            steps: cycle(7, &[&a, &b]),
            propose: ("furnace_log", status("F1"), false),
            expect: Some((PingPong, Critical)),
        },
        Case {
            name: "ping-pong with changing outcomes only warns",
            steps: cycle(19, &[&a_changing, &b_changing]),
            propose: ("furnace_log", status("F1"), false),
            expect: Some((PingPong, Warning)),
        },
        Case {
            name: "a third call breaks the ping-pong",
            steps: {
                let mut s = cycle(6, &[&a_changing, &b_changing]);
                s.push(c(0));
                s
            },
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "a third proposed call is no ping-pong",
            steps: cycle(6, &[&a_changing, &b_changing]),
            propose: ("plant_overview", json!({}), false),
            expect: None,
        },
        Case {
            name: "same tool, two argument sets, alternating",
            steps: cycle(
                7,
                &[&|_| ok("get", json!({"id": 1}), "x"), &|_| {
                    ok("get", json!({"id": 2}), "y")
                }],
            ),
            propose: ("get", json!({"id": 2}), false),
            expect: Some((PingPong, Critical)),
        },
        Case {
            name: "breaker: 30 calls ran, the 31st is critical",
            steps: repeat(30, |i| ok("t", json!({"i": i}), format!("{i}"))),
            propose: ("t", json!({"i": 1000}), false),
            expect: Some((GlobalCircuitBreaker, Critical)),
        },
        Case {
            name: "breaker: warning from 80 %",
            steps: repeat(24, |i| ok("t", json!({"i": i}), format!("{i}"))),
            propose: ("t", json!({"i": 1000}), false),
            expect: Some((GlobalCircuitBreaker, Warning)),
        },
        Case {
            name: "breaker: under 80 % nothing",
            steps: repeat(23, |i| ok("t", json!({"i": i}), format!("{i}"))),
            propose: ("t", json!({"i": 1000}), false),
            expect: None,
        },
        Case {
            name: "breaker: identical outcomes with churning arguments",
            steps: repeat(15, |i| {
                ok("search", json!({"q": format!("q{i}")}), "no results")
            }),
            propose: ("search", json!({"q": "yet another"}), false),
            expect: Some((GlobalCircuitBreaker, Critical)),
        },
        Case {
            name: "breaker: identical outcomes of another tool do not block this one",
            steps: repeat(15, |i| {
                ok("search", json!({"q": format!("q{i}")}), "no results")
            }),
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "error streak with churning arguments warns at 3",
            steps: repeat(2, |i| {
                err(
                    "restart",
                    json!({"furnace": format!("X{i}")}),
                    "permission denied",
                )
            }),
            propose: ("restart", json!({"furnace": "X9"}), false),
            expect: Some((ErrorStreak, Warning)),
        },
        Case {
            name: "error streak with churning arguments is critical at 5",
            steps: repeat(4, |i| {
                err(
                    "restart",
                    json!({"furnace": format!("X{i}")}),
                    "permission denied",
                )
            }),
            propose: ("restart", json!({"furnace": "X9"}), false),
            expect: Some((ErrorStreak, Critical)),
        },
        Case {
            name: "different errors are no streak",
            steps: repeat(4, |i| {
                err(
                    "restart",
                    json!({"furnace": format!("X{i}")}),
                    format!("no furnace X{i}"),
                )
            }),
            propose: ("restart", json!({"furnace": "X9"}), false),
            expect: None,
        },
        Case {
            name: "a success ends the error streak",
            steps: {
                let mut s = repeat(4, |i| {
                    err(
                        "restart",
                        json!({"furnace": format!("X{i}")}),
                        "permission denied",
                    )
                });
                s.push(ok("furnace_status", status("F1"), "ok"));
                s
            },
            propose: ("restart", json!({"furnace": "X9"}), false),
            expect: None,
        },
        Case {
            name: "another tool's error streak does not block this tool",
            steps: repeat(4, |i| {
                err(
                    "restart",
                    json!({"furnace": format!("X{i}")}),
                    "permission denied",
                )
            }),
            propose: ("furnace_status", status("F1"), false),
            expect: None,
        },
        Case {
            name: "a loop-blocked repeat stays critical",
            steps: {
                let mut s = repeat(4, a);
                s.push(loop_blocked("furnace_status", status("F1")));
                s
            },
            propose: ("furnace_status", status("F1"), false),
            expect: Some((GenericRepeat, Critical)),
        },
    ];
    let s = LoopDetection::default();
    let mut failures = Vec::new();
    for case in &cases {
        let h = history(&case.steps);
        let (tool, args, is_poll) = &case.propose;
        let got = probe(&h, tool, args, *is_poll, &s);
        if got != case.expect {
            failures.push(format!(
                "{}: expected {:?}, got {got:?}",
                case.name, case.expect
            ));
        }
        let off = LoopDetection {
            enabled: false,
            ..LoopDetection::default()
        };
        assert_eq!(probe(&h, tool, args, *is_poll, &off), None, "{}", case.name);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Drives a model that repeats one call forever through the contract the
/// run loop follows: warnings run, criticals are recorded as blocked.
fn drive_identical(s: &LoopDetection, attempts: u32) -> (Vec<Option<Level>>, u32) {
    let mut h = CallHistory::default();
    let args = status("F1");
    let call = call_fingerprint("furnace_status", &args);
    let mut levels = Vec::new();
    let mut ran = 0;
    for _ in 0..attempts {
        let hit = h.check("furnace_status", &call, false, s);
        levels.push(hit.as_ref().map(|h| h.level));
        let step = match hit {
            Some(LoopHit {
                level: Critical, ..
            }) => loop_blocked("furnace_status", args.clone()),
            _ => {
                ran += 1;
                ok("furnace_status", args.clone(), "temp 900")
            }
        };
        h.record(record_of(&step));
    }
    (levels, ran)
}

#[test]
fn identical_calls_hit_exactly_at_the_thresholds() {
    // (warning, critical) → level for attempts 1..=8.
    type Row = ((u32, u32), [Option<Level>; 8]);
    let table: &[Row] = &[
        (
            (3, 5),
            [
                None,
                None,
                Some(Warning),
                Some(Warning),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
            ],
        ),
        (
            (2, 2),
            [
                None,
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
            ],
        ),
        (
            (0, 3),
            [
                None,
                None,
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
            ],
        ),
        (
            (4, 0),
            [
                None,
                None,
                None,
                Some(Warning),
                Some(Warning),
                Some(Warning),
                Some(Warning),
                Some(Warning),
            ],
        ),
        // Thresholds below 2 act as 2: a first call is never a repeat.
        (
            (1, 1),
            [
                None,
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
                Some(Critical),
            ],
        ),
    ];
    for ((warning, critical), expected) in table {
        let s = LoopDetection {
            repeat_warning: *warning,
            repeat_critical: *critical,
            // Keep the breaker out of this table.
            identical_outcomes_breaker: 0,
            max_tool_calls_breaker: 0,
            ..LoopDetection::default()
        };
        let (levels, ran) = drive_identical(&s, 8);
        assert_eq!(levels, expected.to_vec(), "thresholds {warning}/{critical}");
        if *critical > 0 {
            // The promise: the tool ran at most repeat_critical
            // times; precisely, repeat_critical - 1 (floor 2).
            assert!(ran <= *critical, "{warning}/{critical}: ran {ran}");
            assert_eq!(ran, critical.max(&2) - 1, "{warning}/{critical}");
        }
    }
}

#[test]
fn hit_reports_count_and_a_message_naming_the_call() {
    let h = history(&repeat(2, |_| {
        ok("furnace_status", status("F1"), "temp 900")
    }));
    let hit = h
        .check(
            "furnace_status",
            &call_fingerprint("furnace_status", &status("F1")),
            false,
            &LoopDetection::default(),
        )
        .unwrap();
    assert_eq!(hit.count, 3);
    assert_eq!(hit.tool, "furnace_status");
    assert!(hit.message.contains("`furnace_status`"), "{}", hit.message);
    assert!(hit.message.contains("same arguments"), "{}", hit.message);

    let h = history(&repeat(7, |i| {
        if i % 2 == 0 {
            ok("furnace_status", status("F1"), "a")
        } else {
            ok("furnace_log", status("F1"), "b")
        }
    }));
    let hit = h
        .check(
            "furnace_log",
            &call_fingerprint("furnace_log", &status("F1")),
            false,
            &LoopDetection::default(),
        )
        .unwrap();
    assert_eq!(
        (hit.detector, hit.level, hit.count),
        (PingPong, Critical, 8)
    );
    assert!(hit.message.contains("`furnace_log`") && hit.message.contains("`furnace_status`"));
}

#[test]
fn unknown_tool_streak() {
    let s = LoopDetection::default();
    let level = |steps: &[Step], tool: &str| {
        history(steps)
            .check_unknown_tool(tool, &s)
            .map(|h| (h.detector, h.level, h.count))
    };
    type Row = (&'static str, Vec<Step>, Option<(Detector, Level, u32)>);
    let table: Vec<Row> = vec![
        ("first unknown call", vec![], None),
        (
            "second in a row warns",
            vec![unknown("web_search")],
            Some((UnknownToolRepeat, Warning, 2)),
        ),
        (
            "third in a row is critical",
            vec![unknown("web_search"), unknown("web_search")],
            Some((UnknownToolRepeat, Critical, 3)),
        ),
        (
            "guessing other names counts too",
            vec![unknown("search"), unknown("google")],
            Some((UnknownToolRepeat, Critical, 3)),
        ),
        (
            "a call that ran resets it",
            vec![
                unknown("web_search"),
                unknown("web_search"),
                ok("furnace_status", status("F1"), "ok"),
            ],
            None,
        ),
        (
            "a loop block in between does not reset it",
            vec![
                unknown("web_search"),
                loop_blocked("furnace_status", status("F1")),
            ],
            Some((UnknownToolRepeat, Warning, 2)),
        ),
    ];
    for (name, steps, expected) in table {
        assert_eq!(level(&steps, "web_search"), expected, "{name}");
    }
    let hit = history(&[unknown("search")])
        .check_unknown_tool("google", &s)
        .unwrap();
    assert!(hit.message.contains("`google`") && hit.message.contains("`search`"));
    let off = LoopDetection {
        enabled: false,
        ..LoopDetection::default()
    };
    assert_eq!(
        history(&repeat(5, |_| unknown("x"))).check_unknown_tool("x", &off),
        None
    );
}

#[test]
fn unknown_tool_records_are_transparent_to_the_repeat_detectors() {
    let mut steps = Vec::new();
    for _ in 0..2 {
        steps.push(ok("furnace_status", status("F1"), "temp 900"));
        steps.push(unknown("nope"));
    }
    let h = history(&steps);
    assert_eq!(
        probe(
            &h,
            "furnace_status",
            &status("F1"),
            false,
            &LoopDetection::default()
        ),
        Some((GenericRepeat, Warning))
    );
}

#[test]
fn history_is_scoped_to_one_run_and_survives_persistence() {
    let s = LoopDetection::default();
    let looping = history(&repeat(4, |_| {
        ok("furnace_status", status("F1"), "temp 900")
    }));
    assert_eq!(
        probe(&looping, "furnace_status", &status("F1"), false, &s),
        Some((GenericRepeat, Critical))
    );
    // A new run starts with its own, empty history.
    let next_run = CallHistory::default();
    assert!(next_run.is_empty());
    assert_eq!(
        probe(&next_run, "furnace_status", &status("F1"), false, &s),
        None
    );
    // Persisted with the run and restored: same verdicts.
    let mut looping = looping;
    let restored = stored_and_loaded(&mut looping, &mut Vec::new());
    assert_eq!(restored, looping);
    assert_eq!(
        probe(&restored, "furnace_status", &status("F1"), false, &s),
        Some((GenericRepeat, Critical))
    );
    // An old or empty persisted form still loads.
    let empty: CallHistory = serde_json::from_str("{}").unwrap();
    assert!(empty.is_empty());
}

#[test]
fn window_is_capped_but_breaker_counts_everything() {
    let mut h = CallHistory::default();
    for i in 0..(HISTORY_WINDOW + 50) {
        h.record(record_of(&ok("t", json!({"i": i}), format!("{i}"))));
    }
    assert_eq!(h.records().len(), HISTORY_WINDOW);
    assert_eq!(h.len(), HISTORY_WINDOW + 50);
    assert_eq!(h.executed_calls() as usize, HISTORY_WINDOW + 50);
    let s = LoopDetection {
        max_tool_calls_breaker: 240,
        ..LoopDetection::default()
    };
    assert_eq!(
        probe(&h, "t", &json!({"i": -1}), false, &s),
        Some((GlobalCircuitBreaker, Critical))
    );
    // Compact persisted form: fingerprints are short, defaults omitted.
    let text = serde_json::to_string(&h.records()[0]).unwrap();
    assert!(!text.contains("poll"), "{text}");
    assert!(text.len() < 90, "{text}");
}

#[test]
fn the_stored_history_is_its_records_as_they_serialize() {
    // Records encoded when recorded, across the window's cut and a
    // restore, are stored as the records themselves, each once, in order,
    // and the outcome counters come back from them.
    let mut h = CallHistory::default();
    for i in 0..(HISTORY_WINDOW + 3) {
        let mut step = ok("t", json!({"i": i}), format!("{i}"));
        if i % 3 == 0 {
            step.kind = Outcome::UnknownTool;
            step.poll = true;
        }
        h.record(record_of(&step));
    }
    let mut store = Vec::new();
    let mut restored = stored_and_loaded(&mut h, &mut store);
    // The three that left the window before a commit are stored too: the
    // outcome counters are counted again from every stored record.
    assert_eq!(
        store.iter().map(|c| c.n as usize).collect::<Vec<_>>(),
        (1..=HISTORY_WINDOW + 3).collect::<Vec<_>>()
    );
    let texts: Vec<Value> = store[3..]
        .iter()
        .map(|c| serde_json::from_str(&c.record).unwrap())
        .collect();
    assert_eq!(
        Value::Array(texts),
        serde_json::to_value(h.records()).unwrap()
    );
    assert_eq!(restored, h);
    assert!(h.take_unstored().is_empty(), "each record is stored once");
    restored.record(record_of(&ok("u", json!({}), "done")));
    let again = stored_and_loaded(&mut restored, &mut store);
    assert_eq!(store.len(), HISTORY_WINDOW + 4);
    assert_eq!(store[HISTORY_WINDOW + 3].n as usize, HISTORY_WINDOW + 4);
    assert_eq!(again, restored);
    assert_eq!(again.records()[HISTORY_WINDOW - 1].tool, "u");
}

#[test]
fn a_state_that_holds_its_records_loads_and_hands_them_to_the_store() {
    // The form an earlier version stored: records inside the state.
    let mut old = CallHistory::default();
    for i in 0..5 {
        old.record(record_of(&ok("t", json!({"i": i}), format!("{i}"))));
    }
    let inline = json!({
        "records": serde_json::to_value(old.records()).unwrap(),
        "recorded": 5,
        "executed": 5,
        "outcomes": serde_json::to_value(&old).unwrap()["outcomes"].clone(),
    });
    let mut loaded: CallHistory = serde_json::from_value(inline).unwrap();
    assert!(!loaded.awaits_records());
    assert_eq!(loaded, old);
    let moved = loaded.take_unstored();
    assert_eq!(
        moved.iter().map(|c| c.n).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert!(loaded.take_unstored().is_empty());
    // A record that does not read back is an error that names it.
    let mut broken: CallHistory = serde_json::from_value(json!({"recorded": 1})).unwrap();
    assert!(broken.awaits_records());
    let err = broken
        .restore(vec![StoredCall {
            n: 1,
            record: "{\"tool\": 3}".into(),
        }])
        .unwrap_err();
    assert!(err.to_string().contains("call record 1"), "{err}");
}

#[test]
fn breaker_wins_over_other_criticals() {
    let s = LoopDetection {
        max_tool_calls_breaker: 4,
        ..LoopDetection::default()
    };
    let h = history(&repeat(4, |_| {
        ok("furnace_status", status("F1"), "temp 900")
    }));
    assert_eq!(
        probe(&h, "furnace_status", &status("F1"), false, &s),
        Some((GlobalCircuitBreaker, Critical))
    );
}

#[test]
fn a_refusal_with_an_outcome_counts_as_a_repeat() {
    // A call denied by policy may carry the refusal as its outcome, so
    // asking for the same refused thing again and again is a loop.
    let denied = |_: usize| {
        let mut rec = record_of(&ok("restart", json!({"furnace": "F2"}), ""));
        rec.kind = Outcome::Blocked;
        rec.outcome = Some(outcome_fingerprint(
            "denied: operator role required",
            None,
            &[],
        ));
        rec
    };
    let mut h = CallHistory::default();
    for i in 0..4 {
        h.record(denied(i));
    }
    assert_eq!(h.executed_calls(), 0);
    assert_eq!(
        probe(
            &h,
            "restart",
            &json!({"furnace": "F2"}),
            false,
            &LoopDetection::default()
        ),
        Some((GenericRepeat, Critical))
    );
}

#[test]
fn call_fingerprint_normalizes_only_what_means_the_same() {
    let fp = call_fingerprint;
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    let same: &[(&str, &str)] = &[
        (r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#),
        (
            r#"{"o":{"z":[1,{"y":1,"x":2}],"a":null}}"#,
            r#"{"o":{"z":[1,{"x":2,"y":1}]}}"#,
        ),
        (r#"{"n":5}"#, r#"{"n":5.0}"#),
        (r#"{"n":0}"#, r#"{"n":-0.0}"#),
        ("null", "{}"),
        (r#"{"a":1,"b":null}"#, r#"{"a":1}"#),
    ];
    for (x, y) in same {
        assert_eq!(fp("t", &parse(x)), fp("t", &parse(y)), "{x} vs {y}");
    }
    let different: &[(&str, &str)] = &[
        (r#"{"a":1}"#, r#"{"a":2}"#),
        (r#"{"a":"1"}"#, r#"{"a":1}"#),
        (r#"{"n":5.5}"#, r#"{"n":5}"#),
        (r#"{"a":[1,2]}"#, r#"{"a":[2,1]}"#),
        (r#"{"a":"x"}"#, r#"{"a":"X"}"#),
        (r#"{"a":null}"#, r#"{"a":"null"}"#),
        (r#"{"a":{}}"#, r#"{"a":[]}"#),
    ];
    for (x, y) in different {
        assert_ne!(fp("t", &parse(x)), fp("t", &parse(y)), "{x} vs {y}");
    }
    assert_ne!(fp("a", &json!({})), fp("b", &json!({})));
    // The tool name and arguments cannot bleed into each other.
    assert_ne!(fp("ab", &json!("c")), fp("a", &json!("bc")));
}

#[test]
fn fingerprints_are_pinned() {
    // Persisted with runs: a change here breaks loop detection for runs
    // resumed across an upgrade. Values computed independently as
    // sha256 over length-prefixed parts (8-byte big-endian length + bytes).
    assert_eq!(
        call_fingerprint("furnace_status", &json!({"furnace_id": "F2"})),
        "6d8269302fd8364a"
    );
    assert_eq!(
        outcome_fingerprint(r#"{"temp": 900, "ts": 1}"#, None, &[]),
        "fd84d7a7edab03ea"
    );
    assert_eq!(
        outcome_fingerprint("  done \n", None, &[]),
        "289393223bbba278"
    );
    // Escapes, control characters and non-ASCII text, and keys that
    // differ from their volatile-field form only in case and `_`.
    assert_eq!(
        call_fingerprint(
            "x",
            &json!({"b": [1, 2.5, "é\"\n\\\u{1f}ok"], "Run_Id": "q"})
        ),
        "6e4859b4f4741340"
    );
    assert_eq!(
        outcome_fingerprint(
            r#"{"Request_Id": 1, "Temp-C": "9\"0\u0007", "ok": ["a\\b"]}"#,
            None,
            &["temp_c".to_owned()]
        ),
        "2943445db75511f2"
    );
    // Deterministic within a process, too.
    for _ in 0..3 {
        assert_eq!(
            call_fingerprint("x", &json!({"b": [1, 2.5, "é\"\n"], "a": true})),
            call_fingerprint("x", &json!({"a": true, "b": [1, 2.5, "é\"\n"]}))
        );
    }
}

#[test]
fn outcome_fingerprint_drops_volatile_fields() {
    let of = |text: &str, extra: &[&str]| {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        outcome_fingerprint(text, None, &extra)
    };
    let same: &[(&str, &str, &[&str])] = &[
        (
            r#"{"temp":900,"timestamp":"2025-01-01T00:00:00Z"}"#,
            r#"{"timestamp":"2025-01-02T10:00:00Z","temp":900}"#,
            &[],
        ),
        (
            r#"{"data":[{"v":1,"request_id":"a","duration_ms":3}]}"#,
            r#"{"data":[{"v":1,"requestId":"b","DurationMs":40}]}"#,
            &[],
        ),
        (r#"{"v":1,"seq":1}"#, r#"{"v":1,"seq":2}"#, &["seq"]),
        (
            r#"{"v":1,"Job-Seq":1}"#,
            r#"{"v":1,"job_seq":2}"#,
            &["jobSeq"],
        ),
        ("  plain text\n", "plain text", &[]),
        (r#"{"a": 1}"#, r#"{"a":1}"#, &[]),
    ];
    for (x, y, extra) in same {
        assert_eq!(of(x, extra), of(y, extra), "{x} vs {y} with {extra:?}");
    }
    let different: &[(&str, &str, &[&str])] = &[
        (r#"{"v":1,"seq":1}"#, r#"{"v":1,"seq":2}"#, &[]),
        (r#"{"id":"F1","t":1}"#, r#"{"id":"F2","t":1}"#, &[]),
        (r#"{"status":"running"}"#, r#"{"status":"done"}"#, &[]),
        ("plain text", "other text", &[]),
        // JSON null members are results, unlike in arguments.
        (r#"{"a":null}"#, r#"{}"#, &[]),
    ];
    for (x, y, extra) in different {
        assert_ne!(of(x, extra), of(y, extra), "{x} vs {y} with {extra:?}");
    }
    // A structured result wins over its text rendering.
    let structured = json!({"temp": 900, "time": "12:00"});
    assert_eq!(
        outcome_fingerprint("Temperature is 900 at 12:00", Some(&structured), &[]),
        outcome_fingerprint("{\"temp\":900}", None, &[])
    );
}

#[test]
fn names_match_the_event_vocabulary() {
    let all = [
        GenericRepeat,
        KnownPollNoProgress,
        PingPong,
        GlobalCircuitBreaker,
        UnknownToolRepeat,
        ErrorStreak,
    ];
    for d in all {
        assert_eq!(
            serde_json::to_value(d).unwrap(),
            Value::String(d.as_str().into())
        );
    }
    assert!(Critical > Warning);
    assert_eq!(Warning.as_str(), "warning");
    assert_eq!(Critical.as_str(), "critical");
}

#[test]
fn a_blocked_call_keeps_its_place_in_a_ping_pong() {
    let s = LoopDetection::default();
    let mut h = CallHistory::default();
    let a = call_fingerprint("status", &serde_json::json!({"id": "A"}));
    let b = call_fingerprint("status", &serde_json::json!({"id": "B"}));
    let rec = |call: &str, outcome: Option<&str>, kind: Outcome| CallRecord {
        tool: "status".into(),
        call: call.into(),
        outcome: outcome.map(str::to_owned),
        kind,
        poll: false,
    };
    for i in 0..7 {
        let (c, o) = if i % 2 == 0 { (&a, "oa") } else { (&b, "ob") };
        h.record(rec(c, Some(o), Outcome::Ok));
    }
    let hit = h
        .check("status", &b, false, &s)
        .expect("eighth alternating call");
    assert_eq!(
        (hit.detector, hit.level),
        (Detector::PingPong, Level::Critical)
    );
    h.record(rec(&b, None, Outcome::Blocked));
    let again = h
        .check("status", &a, false, &s)
        .expect("resuming the alternation");
    assert_eq!(
        (again.detector, again.level),
        (Detector::PingPong, Level::Critical)
    );
}

/// Progress flags worked out from the whole window, as `repeat` once did
/// on every check.
fn flags_from_scratch(records: &[CallRecord]) -> Vec<bool> {
    let mut last: BTreeMap<&str, &str> = BTreeMap::new();
    records
        .iter()
        .map(|r| match r.outcome.as_deref() {
            Some(outcome) => last
                .insert(r.call.as_str(), outcome)
                .is_some_and(|previous| previous != outcome),
            None => false,
        })
        .collect()
}

#[test]
fn progress_kept_as_records_come_matches_the_whole_window() {
    // Five calls cycling, their outputs changing every few runs, with
    // blocked calls between: past the window's cut and after a restore,
    // the kept flags are those of the window worked out from scratch.
    let mut h = CallHistory::default();
    for i in 0..(HISTORY_WINDOW + 40) {
        let key = i % 5;
        let step = if i % 7 == 0 {
            loop_blocked("read", json!({"k": key}))
        } else {
            ok("read", json!({"k": key}), format!("v{}", i / 11))
        };
        h.record(record_of(&step));
        assert_eq!(
            h.progress.flags(),
            flags_from_scratch(h.records()),
            "after {i}"
        );
    }
    let restored = stored_and_loaded(&mut h, &mut Vec::new());
    assert_eq!(
        restored.progress.flags(),
        flags_from_scratch(restored.records())
    );
    assert!(restored.progress.flags().iter().any(|&c| c));
}

#[test]
fn outcome_counters_come_back_from_the_stored_records() {
    // A lookup keeps finding nothing, its first failures long out of the
    // window by now; meanwhile more distinct results than the counters keep.
    // Committed every few calls, the state stays the same size, and loaded
    // again the breaker counts every earlier failure.
    let s = LoopDetection {
        identical_outcomes_breaker: 5,
        max_tool_calls_breaker: 0,
        ..LoopDetection::default()
    };
    let mut h = CallHistory::default();
    let mut store = Vec::new();
    let mut state_sizes = std::collections::BTreeSet::new();
    let calls = MAX_OUTCOME_KEYS + 300;
    for i in 0..calls {
        let step = if i % 150 == 0 {
            ok("lookup", json!({"key": i}), "not found")
        } else {
            ok("scan", json!({"i": i}), format!("row {i}"))
        };
        h.record(record_of(&step));
        if i % 7 == 0 {
            store.extend(h.take_unstored());
            state_sizes.insert(serde_json::to_string(&h).unwrap().len());
        }
    }
    // Only the digits of the two counters change the state's size.
    assert!(state_sizes.len() <= 4, "{state_sizes:?}");
    // One more failure, now in the window: the breaker names its outcome.
    let fails_again = |mut h: CallHistory| {
        h.record(record_of(&ok("lookup", json!({"key": 0}), "not found")));
        probe(&h, "lookup", &json!({"key": 1}), false, &s)
    };
    let loaded = stored_and_loaded(&mut h, &mut store);
    assert_eq!(loaded, h);
    assert_eq!(loaded.outcomes.len(), h.outcomes.len());
    // Six failures before, the seventh now: past the breaker's five.
    assert_eq!(fails_again(loaded), Some((GlobalCircuitBreaker, Critical)));
    // Counted from the window's records alone (one failure), it would not be.
    let text = serde_json::to_string(&h).unwrap();
    let mut window_only: CallHistory = serde_json::from_str(&text).unwrap();
    window_only
        .restore(store[store.len() - HISTORY_WINDOW..].to_vec())
        .unwrap();
    assert_eq!(fails_again(window_only), None);
}

#[test]
fn a_state_with_its_outcome_counters_loads_them_as_they_are() {
    // An earlier version wrote the counters into the state.
    let mut old = CallHistory::default();
    for i in 0..4 {
        old.record(record_of(&ok("t", json!({"i": i}), "same")));
    }
    let mut store = old.take_unstored();
    let text = json!({
        "recorded": 4,
        "executed": 4,
        "outcomes": {format!("{} t", old.records()[0].outcome.clone().unwrap()): 9},
    });
    let mut loaded: CallHistory = serde_json::from_value(text).unwrap();
    assert_eq!(loaded.records_to_restore() as usize, HISTORY_WINDOW);
    loaded.restore(std::mem::take(&mut store)).unwrap();
    // The state's counter stands, not one counted from the four records.
    assert_eq!(loaded.outcomes.values().copied().collect::<Vec<_>>(), [9]);
}
